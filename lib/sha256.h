/* codexec: SHA-256 of captured and uploaded bytes, at the CPU's speed.
 *
 * libsodium's SHA-256 is portable C (about 270 MB/s here): a 100 MiB file
 * spent 0.4 s of the server's time in it. Where the CPU has the SHA
 * extensions (x86-64 SHA-NI: Intel since Ice Lake and Goldmont, AMD since
 * Zen) the compression function runs on them, several times faster; else
 * libsodium does the work. Either way the digest is SHA-256's: the unit
 * test holds this to libsodium's on every length and split it tries. */
#ifndef CX_SHA256_H
#define CX_SHA256_H

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CX_SHA256_BYTES 32

struct cx_sha256 {
    bool ni;
    /* the SHA extensions' state */
    uint32_t h[8];
    uint64_t len; /* bytes hashed */
    unsigned char block[64];
    size_t blen; /* bytes waiting in block */
    /* otherwise */
    crypto_hash_sha256_state sodium;
};

void cx_sha256_init(struct cx_sha256 *s);
void cx_sha256_update(struct cx_sha256 *s, const void *data, size_t len);
void cx_sha256_final(struct cx_sha256 *s, unsigned char out[CX_SHA256_BYTES]);

/* Whether this CPU hashes with the SHA extensions (for tests and the
 * benchmark). */
bool cx_sha256_accelerated(void);

#endif
