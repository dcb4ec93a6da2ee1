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

#include "err.h"

struct cx_db;
struct cx_auth;

#define CX_KEY_CHARS 46 /* "cx_" + 43 */
#define CX_USER_MAX  256

struct cx_principal {
    char user[CX_USER_MAX + 1];
    char key_id[37]; /* "" when authenticated by REMOTE_USER */
    bool require_approval;
};

/* Writes a new secret file (mode 0600, fails if it exists). */
enum cx_err cx_auth_secret_create(const char *path) CX_MUSTCHECK;

/* Loads the secret. Free with cx_auth_free() (wipes the keys). */
enum cx_err cx_auth_new(const char *secret_file, struct cx_auth **out) CX_MUSTCHECK;
void cx_auth_free(struct cx_auth *a);

/* Borrowed 32-byte subkey of the first signed links (v1, HMAC-SHA-512-256),
 * still verified while such links live. */
const unsigned char *cx_auth_link_key(const struct cx_auth *a);

/* The key of today's signed links (v2, HMAC-SHA-256), borrowed: 64 hex
 * characters of a 32-byte subkey, and those characters are the HMAC key
 * (as nginx's njs takes it, without decoding). The one key the web server
 * may hold to check links itself: it signs links and nothing else, and the
 * server secret can't be had from it. */
const char *cx_auth_edge_key(const struct cx_auth *a);

/* The web server's key (web_server_key), borrowed, 64 hex characters: the
 * web server sends it as the FastCGI param CODEXEC_WEB_KEY from a
 * configuration only root reads, and only a request that carries it may
 * set REMOTE_USER, AUTH_TYPE and a REMOTE_ADDR codexec trusts. Any other
 * process that can reach the socket (a PHP app in www-data) is then an
 * HTTP client like any other. */
const char *cx_auth_web_key(const struct cx_auth *a);

/* The operators' token (metrics_token), borrowed, 64 hex characters: a
 * Bearer token for /metrics and health's details. */
const char *cx_auth_ops_token(const struct cx_auth *a);

/* Whether given (may be NULL) is want, compared in constant time. */
bool cx_auth_hex_equal(const char *given, const char *want);

/* Extracts the token of "Bearer <token>" (scheme case-insensitive); the token
 * points into header. CX_ERR_UNAUTHORIZED if absent or malformed. */
enum cx_err cx_auth_parse_bearer(const char *header, const char **token, size_t *len) CX_MUSTCHECK;

/* Checks that a user name is acceptable (1..256 bytes of valid UTF-8, no
 * control characters). Used for key creation and REMOTE_USER. */
bool cx_auth_user_valid(const char *user);

/* Computes the stored hash of a key. */
void cx_auth_key_hash(const struct cx_auth *a, const char *key, size_t len, unsigned char hash[32]);

/* Looks the key up: CX_OK fills *p; CX_ERR_UNAUTHORIZED for a malformed,
 * unknown or revoked key; CX_ERR_DB when PostgreSQL failed. */
enum cx_err cx_auth_check_key(const struct cx_auth *a, struct cx_db *db, const char *key,
                              size_t len, struct cx_principal *p) CX_MUSTCHECK;

/* Authenticates a request: the REMOTE_USER value when trust_remote_user is
 * on and it is set, else the Authorization header. */
enum cx_err cx_auth_request(const struct cx_auth *a, struct cx_db *db, bool trust_remote_user,
                            const char *remote_user, const char *authorization,
                            struct cx_principal *p) CX_MUSTCHECK;

/* Creates a key for user; key_out receives the key (CX_KEY_CHARS + 1 bytes)
 * and id_out its row id (37 bytes). */
enum cx_err cx_auth_key_create(const struct cx_auth *a, struct cx_db *db, const char *user,
                               const char *label, bool require_approval, char *key_out,
                               char *id_out) CX_MUSTCHECK;

/* Revokes by row id. CX_ERR_NOT_FOUND if no active key has that id. */
enum cx_err cx_auth_key_revoke(struct cx_db *db, const char *id) CX_MUSTCHECK;

/* The keys (of user, or all with NULL), oldest first, as objects with these
 * members ("approval" is "yes" or "no", "revoked" null while valid); never
 * a key or its hash. */
#define CX_AUTH_KEY_LIST_COLUMNS "id user label prefix approval created revoked"
enum cx_err cx_auth_key_list(struct cx_db *db, const char *user, json_t **out) CX_MUSTCHECK;

#endif
