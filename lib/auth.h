/* codexec: API keys, Bearer parsing, REMOTE_USER trust, the server secret.
 *
 * An API key is "cx_" + 43 base64url characters (32 random bytes from
 * libsodium). Only its keyed BLAKE2b hash (crypto_generichash, keyed with a
 * subkey of the server secret) is stored, so a database dump yields no keys.
 * The server secret is 32 random bytes, hex in a 0600 file; subkeys for key
 * hashing and link signing are derived from it with crypto_kdf. */
#ifndef CX_AUTH_H
#define CX_AUTH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "codexec.h"

struct cx_db;
struct cx_auth;

/* Borrowed 32-byte subkey of the first signed links (v1, HMAC-SHA-512-256),
 * still verified while such links live. */
const unsigned char *cx_auth_link_key(const struct cx_auth *a);

/* Extracts the token of "Bearer <token>" (scheme case-insensitive); the token
 * points into header. CX_ERR_UNAUTHORIZED if absent or malformed. */
enum cx_err cx_auth_parse_bearer(const char *header, const char **token, size_t *len) CX_MUSTCHECK;

/* Computes the stored hash of a key. */
void cx_auth_key_hash(const struct cx_auth *a, const char *key, size_t len, unsigned char hash[32]);

/* Looks the key up: CX_OK fills *p; CX_ERR_UNAUTHORIZED for a malformed,
 * unknown or revoked key; CX_ERR_DB when PostgreSQL failed. */
enum cx_err cx_auth_check_key(const struct cx_auth *a, struct cx_db *db, const char *key,
                              size_t len, struct cx_principal *p) CX_MUSTCHECK;

#endif
