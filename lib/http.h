/* codexec: HTTP helpers that know nothing of FastCGI.
 *
 * Error bodies per docs/openapi.yaml, request bodies read through a callback with a
 * hard cap, JSON parsing with UTF-8 validation, query strings. */
#ifndef CX_HTTP_H
#define CX_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

/* Reason phrase of a status ("Not Found"); "Unknown" for others. */
const char *cx_http_reason(int status);

/* New reference: {"error": {"code": code, "message": message}}. NULL on OOM. */
json_t *cx_http_error_json(const char *code, const char *message);

/* Reads a request body of content_length bytes (the CONTENT_LENGTH param,
 * NULL or "" = none) through read_fn, refusing more than max bytes, whether
 * announced or actually sent (CX_ERR_TOO_LARGE). A short body is CX_ERR_IO.
 * On CX_OK *body is malloc'ed, NUL-terminated, and the caller frees it. */
typedef ssize_t (*cx_http_read_fn)(void *ctx, void *buf, size_t n);
enum cx_err cx_http_read_body(cx_http_read_fn read_fn, void *ctx, const char *content_length,
                              uint64_t max, char **body, size_t *len) CX_MUSTCHECK;

/* Parses CONTENT_LENGTH: CX_ERR_INVALID unless a plain decimal number. */
enum cx_err cx_http_content_length(const char *s, uint64_t *out) CX_MUSTCHECK;

/* Parses a JSON object from a body. Rejects invalid UTF-8, NUL bytes,
 * duplicate keys, trailing data and non-objects; msg receives a sentence
 * fit for the client. On CX_OK *out is a new reference. */
enum cx_err cx_http_parse_json_object(const char *body, size_t len, json_t **out, char *msg,
                                      size_t msglen) CX_MUSTCHECK;

/* Finds name in a query string and percent-decodes its value into out.
 * CX_ERR_NOT_FOUND if absent, CX_ERR_INVALID if malformed (bad escape, NUL,
 * invalid UTF-8), CX_ERR_TOO_LARGE if it does not fit. */
enum cx_err cx_http_query_get(const char *query, const char *name, char *out,
                              size_t outlen) CX_MUSTCHECK;

/* Content-Disposition for a download: attachment; filename="<ASCII>";
 * filename*=UTF-8''<percent-encoded>. Quotes, backslashes, CR, LF and other
 * control characters never reach the header. out: 1200 bytes suffice. */
void cx_http_content_disposition(const char *filename, char *out, size_t outlen);

/* Appends s percent-encoded: ALPHA and DIGIT and the characters in keep
 * stay, every other byte becomes %XX. */
struct cx_buf;
void cx_http_pct_encode(struct cx_buf *b, const char *s, const char *keep);

/* IMF-fixdate (RFC 9110), e.g. "Sun, 06 Nov 1994 08:49:37 GMT". out: 32 bytes. */
void cx_http_date(long long unix_seconds, char out[32]);

enum cx_range { CX_RANGE_NONE, CX_RANGE_ONE, CX_RANGE_UNSATISFIABLE };

/* Interprets a Range header against a body of size bytes. One range
 * ("a-b", "a-", "-n") gives CX_RANGE_ONE and [*first, *last]; an absent,
 * malformed, non-bytes or multi-range header gives CX_RANGE_NONE (the
 * whole body); a range past the end, CX_RANGE_UNSATISFIABLE. */
enum cx_range cx_http_range(const char *header, uint64_t size, uint64_t *first, uint64_t *last);

/* Whether an If-None-Match header matches the entity tag "\"<etag>\"". */
bool cx_http_etag_matches(const char *if_none_match, const char *etag);

/* A streaming multipart/form-data parser: bytes in, callbacks out; memory
 * bounded by a part's header block (8 KiB), not by the body. */
struct cx_multipart;
struct cx_multipart_cb {
    /* a part begins; filename NULL when the part has none */
    enum cx_err (*begin)(void *ctx, const char *name, const char *filename);
    enum cx_err (*data)(void *ctx, const char *data, size_t len);
    enum cx_err (*end)(void *ctx);
};

/* The boundary parameter of a multipart/form-data Content-Type. */
enum cx_err cx_http_multipart_boundary(const char *content_type, char *out,
                                       size_t outlen) CX_MUSTCHECK;
enum cx_err cx_http_multipart_new(const char *boundary, const struct cx_multipart_cb *cb, void *ctx,
                                  struct cx_multipart **out) CX_MUSTCHECK;
/* CX_ERR_INVALID for a malformed body; callback errors are passed on. */
enum cx_err cx_http_multipart_feed(struct cx_multipart *m, const char *data,
                                   size_t len) CX_MUSTCHECK;
/* CX_OK only when the closing boundary was seen. */
enum cx_err cx_http_multipart_finish(struct cx_multipart *m) CX_MUSTCHECK;
void cx_http_multipart_free(struct cx_multipart *m);

#endif
