/* codexec: a client of the S3 API (AWS S3 and compatible stores: Ceph RGW,
 * MinIO, Garage, R2) for the object-storage backend (storage.h).
 *
 * Requests are signed by libcurl (CURLOPT_AWS_SIGV4) with the payload's
 * sha256 in x-amz-content-sha256 (libcurl 7.88 signs the header's value as
 * the payload hash and computes none itself for uploads). Only presigned
 * URLs are signed here (cx_s3_presign, libsodium's HMAC-SHA256), checked
 * against botocore in the tests. One handle per thread: it keeps its
 * connection to the store. docs/internals/storage.md. */
#ifndef CX_S3_H
#define CX_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "codexec.h"

struct cx_s3;
struct cx_s3_upload;

/* Where the bucket is and who we are; the strings are copied. */
struct cx_s3_conf {
    const char *endpoint; /* "https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:9000" */
    const char *region;
    const char *bucket;
    const char *prefix; /* "" or "codexec/": put before every key */
    bool virtual_host;  /* bucket.host/key, else host/bucket/key */
    const char *key_id;
    const char *secret;
    const char *token; /* a session token, or "" */
};

/* CX_ERR_INVALID when the endpoint is not an http(s) URL without a path. */
enum cx_err cx_s3_new(const struct cx_s3_conf *c, struct cx_s3 **out) CX_MUSTCHECK;
/* Wipes the credentials. NULL is a no-op. */
void cx_s3_free(struct cx_s3 *s3);

/* Every call below answers CX_ERR_NOT_FOUND for a missing object,
 * CX_ERR_IO when the store is unreachable or refuses (logged with the S3
 * error code, never with the key). Keys are relative to the prefix. */

/* sha256: the data's, in hex, if the caller has it (else NULL: hashed
 * here when the signature needs it). */
enum cx_err cx_s3_put(struct cx_s3 *s3, const char *key, const void *data, size_t len,
                      const char *sha256) CX_MUSTCHECK;
/* What a request's x-amz-content-sha256 (and its signature) carries for
 * body: EMPTY's hash without one; known if given; for an object's bytes
 * (bulk) over https with libcurl 7.87 or later (which signs with the
 * header's value), UNSIGNED-PAYLOAD, as the AWS SDKs send them (TLS
 * keeps them whole, and the server hashes each byte once, for the
 * artifact's sha256); else the body's SHA-256. */
enum cx_err cx_s3_payload_sha(const struct cx_s3 *s3, const void *body, size_t len, bool bulk,
                              const char *known, char out[65]) CX_MUSTCHECK;

/* A server-side copy (objects up to 5 GiB). */
enum cx_err cx_s3_copy(struct cx_s3 *s3, const char *from, const char *to) CX_MUSTCHECK;
/* Missing is fine. */
enum cx_err cx_s3_delete(struct cx_s3 *s3, const char *key) CX_MUSTCHECK;
enum cx_err cx_s3_head(struct cx_s3 *s3, const char *key, uint64_t *size) CX_MUSTCHECK;

/* Reads bytes first..last (inclusive; last UINT64_MAX: to the end) into
 * sink as they arrive; a false return of sink stops the transfer
 * (CX_ERR_IO, not logged: the reader went). */
typedef bool (*cx_s3_sink)(void *ctx, const void *data, size_t len);
enum cx_err cx_s3_get(struct cx_s3 *s3, const char *key, uint64_t first, uint64_t last,
                      cx_s3_sink sink, void *ctx) CX_MUSTCHECK;

/* A multipart upload of key: parts of at least 5 MiB but the last, at
 * most 10000 of them. _complete and _abort free up. */
enum cx_err cx_s3_upload_begin(struct cx_s3 *s3, const char *key,
                               struct cx_s3_upload **up) CX_MUSTCHECK;
enum cx_err cx_s3_upload_part(struct cx_s3 *s3, struct cx_s3_upload *up, const void *data,
                              size_t len) CX_MUSTCHECK;
enum cx_err cx_s3_upload_complete(struct cx_s3 *s3, struct cx_s3_upload *up) CX_MUSTCHECK;
/* Best effort (the store's own lifecycle, or fsck, ends what is left). */
void cx_s3_upload_abort(struct cx_s3 *s3, struct cx_s3_upload *up);

/* Every object under the prefix whose key starts with under, in pages of
 * 1000: fn gets its key, last modification and size; a non-OK return
 * stops the walk. */
typedef enum cx_err (*cx_s3_list_fn)(void *ctx, const char *key, time_t modified, uint64_t size);
enum cx_err cx_s3_list(struct cx_s3 *s3, const char *under, cx_s3_list_fn fn,
                       void *ctx) CX_MUSTCHECK;

/* Multipart uploads begun before `before` and never completed whose key
 * starts with under: fn(ctx, key, initiated, 0) for each (a page of 1000
 * per call). CX_ERR_INVALID when the store can't list them. */
enum cx_err cx_s3_list_uploads(struct cx_s3 *s3, const char *under, time_t before, cx_s3_list_fn fn,
                               void *ctx) CX_MUSTCHECK;
/* Aborts every multipart upload of key (CX_ERR_INVALID as above). */
enum cx_err cx_s3_abort_uploads(struct cx_s3 *s3, const char *key) CX_MUSTCHECK;

/* A presigned GET URL (SigV4 query authentication) valid for expires
 * seconds from now; extra is "" or more query parameters, already encoded
 * and sorted among themselves ("response-content-type=..."), that the
 * signature covers. With path_only, out gets the path and query without
 * scheme and host (for a proxy's internal location). */
enum cx_err cx_s3_presign(const struct cx_s3 *s3, const char *key, time_t now, unsigned expires,
                          const char *extra, bool path_only, char *out, size_t outlen) CX_MUSTCHECK;

/* The store's base URL (scheme and host, the bucket's with virtual-host
 * addressing): what a proxy in front of it must name. */
const char *cx_s3_origin(const struct cx_s3 *s3);

#endif
