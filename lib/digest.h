/* codexec: SHA-256 and HMAC, through OpenSSL's EVP API.
 *
 * libcrypto is linked already (libcurl's TLS, the WebSocket handshake's
 * SHA-1) and hashes at the CPU's speed (SHA extensions, AVX2): the one
 * implementation for every digest the server computes: artifacts' sha256,
 * S3's request signatures, signed links' MACs. A failure (out of memory)
 * is an error, never a digest of something else. */
#ifndef CX_DIGEST_H
#define CX_DIGEST_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "codexec.h"

#define CX_SHA256_BYTES 32
#define CX_MAC_BYTES    32 /* HMAC-SHA-256, and HMAC-SHA-512 cut to 256 bits */

struct evp_md_ctx_st;

/* A SHA-256 over bytes given in pieces. init before anything else; then
 * update any number of times; final gives the digest and frees the state;
 * cleanup frees it without one (safe after final, and twice). */
struct cx_sha256 {
    struct evp_md_ctx_st *ctx;
    bool failed;
};
enum cx_err cx_sha256_init(struct cx_sha256 *s) CX_MUSTCHECK;
void cx_sha256_update(struct cx_sha256 *s, const void *data, size_t len);
enum cx_err cx_sha256_final(struct cx_sha256 *s, unsigned char out[CX_SHA256_BYTES]) CX_MUSTCHECK;
void cx_sha256_cleanup(struct cx_sha256 *s);

/* The SHA-256 of data, as bytes or as 64 lowercase hex digits. */
enum cx_err cx_sha256(const void *data, size_t len,
                      unsigned char out[CX_SHA256_BYTES]) CX_MUSTCHECK;
enum cx_err cx_sha256_hex(const void *data, size_t len, char out[65]) CX_MUSTCHECK;

/* The hex SHA-256 of a constant text (an embedded helper's source),
 * computed on first use and kept; NULL on a failure, tried again at the
 * next call. */
struct cx_sha256_kept {
    pthread_mutex_t lock;
    char hex[65];
};
#define CX_SHA256_KEPT_INIT                                                                        \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, ""                                                              \
    }
const char *cx_sha256_kept(struct cx_sha256_kept *k, const char *text);

/* HMAC-SHA-256 of msg under key (any length). */
enum cx_err cx_hmac_sha256(const void *key, size_t keylen, const void *msg, size_t len,
                           unsigned char out[CX_MAC_BYTES]) CX_MUSTCHECK;

/* HMAC-SHA-512 cut to its first 256 bits: libsodium's crypto_auth, which
 * signed the first links (v1), computed the same way as the others. */
enum cx_err cx_hmac_sha512_256(const void *key, size_t keylen, const void *msg, size_t len,
                               unsigned char out[CX_MAC_BYTES]) CX_MUSTCHECK;

#endif
