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

#include "codexec.h"

/* Parses CONTENT_LENGTH: CX_ERR_INVALID unless a plain decimal number. */
enum cx_err cx_http_content_length(const char *s, uint64_t *out) CX_MUSTCHECK;

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
