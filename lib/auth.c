#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sodium.h>
#include <unistd.h>

#include "auth.h"
#include "authdb.h"
#include "db.h"
#include "dlcache.h"
#include "log.h"
#include "util.h"

#define SECRET_BYTES 32

struct cx_auth {
    unsigned char key_hash_key[32];
    unsigned char link_key[32];
    char edge_key[65];  /* hex: the key is these 64 characters */
    char web_key[65];   /* hex: the web server's proof of the FastCGI params */
    char ops_token[65]; /* hex: /metrics and health's details */
};

enum cx_err
cx_auth_secret_create(const char *path)
{
    unsigned char raw[SECRET_BYTES];
    char hex[SECRET_BYTES * 2 + 2];
    enum cx_err rc = CX_OK;
    int fd;

    if (sodium_init() < 0)
        return CX_ERR_INTERNAL;
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == EEXIST ? CX_ERR_CONFLICT : CX_ERR_IO;
    randombytes_buf(raw, sizeof(raw));
    sodium_bin2hex(hex, sizeof(hex), raw, sizeof(raw));
    hex[SECRET_BYTES * 2] = '\n';
    if (cx_write_all(fd, hex, SECRET_BYTES * 2 + 1) || fsync(fd))
        rc = CX_ERR_IO;
    if (close(fd))
        rc = CX_ERR_IO;
    sodium_memzero(raw, sizeof(raw));
    sodium_memzero(hex, sizeof(hex));
    if (rc)
        unlink(path);
    return rc;
}

enum cx_err
cx_auth_new(const char *secret_file, struct cx_auth **out)
{
    unsigned char master[SECRET_BYTES], edge[32];
    char hex[SECRET_BYTES * 2 + 8];
    struct cx_auth *a = NULL;
    enum cx_err rc = CX_ERR_INVALID;
    ssize_t n;
    size_t bin_len = 0;
    int fd = -1;

    if (sodium_init() < 0)
        return CX_ERR_INTERNAL;
    fd = open(secret_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cx_log_err(errno, "open() of secret file \"%s\" failed", secret_file);
        return CX_ERR_IO;
    }
    n = read(fd, hex, sizeof(hex) - 1);
    if (n < SECRET_BYTES * 2)
        goto bad;
    hex[n] = '\0';
    if (sodium_hex2bin(master, sizeof(master), hex, (size_t)n, "\r\n", &bin_len, NULL) != 0 ||
        bin_len != SECRET_BYTES)
        goto bad;
    a = sodium_malloc(sizeof(*a));
    if (!a) {
        rc = CX_ERR_NOMEM;
        goto out;
    }
    crypto_kdf_derive_from_key(a->key_hash_key, sizeof(a->key_hash_key), 1, "cx-keys_", master);
    crypto_kdf_derive_from_key(a->link_key, sizeof(a->link_key), 2, "cx-links", master);
    crypto_kdf_derive_from_key(edge, sizeof(edge), 3, "cx-links", master);
    sodium_bin2hex(a->edge_key, sizeof(a->edge_key), edge, sizeof(edge));
    crypto_kdf_derive_from_key(edge, sizeof(edge), 4, "cx-webkv", master);
    sodium_bin2hex(a->web_key, sizeof(a->web_key), edge, sizeof(edge));
    crypto_kdf_derive_from_key(edge, sizeof(edge), 5, "cx-ops__", master);
    sodium_bin2hex(a->ops_token, sizeof(a->ops_token), edge, sizeof(edge));
    *out = a;
    a = NULL;
    rc = CX_OK;
    goto out;
bad:
    cx_log_err(0, "secret file \"%s\" must hold 64 hex characters", secret_file);
out:
    if (fd >= 0)
        close(fd);
    sodium_memzero(master, sizeof(master));
    sodium_memzero(edge, sizeof(edge));
    sodium_memzero(hex, sizeof(hex));
    if (a)
        sodium_free(a);
    return rc;
}

void
cx_auth_free(struct cx_auth *a)
{
    if (a)
        sodium_free(a); /* zeroes the memory */
}

const unsigned char *
cx_auth_link_key(const struct cx_auth *a)
{
    return a->link_key;
}

const char *
cx_auth_edge_key(const struct cx_auth *a)
{
    return a->edge_key;
}

const char *
cx_auth_web_key(const struct cx_auth *a)
{
    return a->web_key;
}

const char *
cx_auth_ops_token(const struct cx_auth *a)
{
    return a->ops_token;
}

bool
cx_auth_hex_equal(const char *given, const char *want)
{
    size_t n = strlen(want);

    return given && strlen(given) == n && sodium_memcmp(given, want, n) == 0;
}

enum cx_err
cx_auth_parse_bearer(const char *header, const char **token, size_t *len)
{
    const char *p, *end;

    if (!header || strncasecmp(header, "Bearer ", 7) != 0)
        return CX_ERR_UNAUTHORIZED;
    p = header + 7;
    while (*p == ' ')
        p++;
    end = p + strlen(p);
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (end == p)
        return CX_ERR_UNAUTHORIZED;
    *token = p;
    *len = (size_t)(end - p);
    return CX_OK;
}

bool
cx_auth_user_valid(const char *user)
{
    size_t n;

    if (!user)
        return false;
    n = strlen(user);
    if (n < 1 || n > CX_USER_MAX || !cx_utf8_valid(user, n))
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)user[i] < 0x20 || user[i] == 0x7f)
            return false;
    return true;
}

void
cx_auth_key_hash(const struct cx_auth *a, const char *key, size_t len, unsigned char hash[32])
{
    crypto_generichash(hash, 32, (const unsigned char *)key, len, a->key_hash_key,
                       sizeof(a->key_hash_key));
}

static bool
key_shape_ok(const char *key, size_t len)
{
    if (len != CX_KEY_CHARS || memcmp(key, "cx_", 3) != 0)
        return false;
    for (size_t i = 3; i < len; i++) {
        char c = key[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return true;
}

CX_SQL(q_key_lookup, 1, "SELECT " CX_AUTH_KEY_COLUMNS " FROM api_keys k WHERE " CX_AUTH_KEY_MATCH);
CX_SQL(q_key_touch, 1, "UPDATE api_keys SET last_used_at = now() WHERE id = $1::uuid");

static void
hash_param(const unsigned char hash[32], char out[2 + 64 + 1])
{
    out[0] = '\\';
    out[1] = 'x';
    sodium_bin2hex(out + 2, 65, hash, 32);
}

#define MAX_MORE 8

/* Answered from the process's cache (lib/dlcache.h) when it holds the key:
 * an entry lives a minute at most, and every process forgets a key the
 * moment it is revoked (PostgreSQL's announcement); while the announcements
 * can't be heard, every check asks the database. */
enum cx_err
cx_auth_check_key(const struct cx_auth *a, struct cx_db *db, const char *key, size_t len,
                  struct cx_principal *p)
{
    unsigned char hash[32];
    uint64_t epoch;
    enum cx_err rc;

    if (!key_shape_ok(key, len))
        return CX_ERR_UNAUTHORIZED;
    cx_auth_key_hash(a, key, len, hash);
    if (cx_dlcache_key_get(hash, p, &epoch)) {
        sodium_memzero(hash, sizeof(hash));
        return CX_OK;
    }
    rc = cx_auth_check_key_with(a, db, key, len, &q_key_lookup, NULL, 0, p, NULL);
    if (rc == CX_OK)
        cx_dlcache_key_put(hash, p, epoch);
    sodium_memzero(hash, sizeof(hash));
    return rc;
}

enum cx_err
cx_auth_check_key_with(const struct cx_auth *a, struct cx_db *db, const char *key, size_t len,
                       struct cx_sql *q, const char *const *more, int nmore, struct cx_principal *p,
                       PGresult **res)
{
    unsigned char hash[32], stored[32];
    char hexparam[2 + 64 + 1];
    const char *params[1 + MAX_MORE] = {hexparam};
    PGresult *r = NULL;
    enum cx_err rc;
    size_t stored_len = 0;

    if (res)
        *res = NULL;
    if (nmore < 0 || nmore > MAX_MORE)
        return CX_ERR_INTERNAL;
    if (!key_shape_ok(key, len))
        return CX_ERR_UNAUTHORIZED;
    for (int i = 0; i < nmore; i++)
        params[1 + i] = more[i];
    cx_auth_key_hash(a, key, len, hash);
    hash_param(hash, hexparam);
    rc = cx_db_exec(db, q, params, &r);
    if (rc)
        goto out;
    rc = CX_ERR_UNAUTHORIZED;
    if (PQntuples(r) != 1)
        goto out;
    /* The row was found by its hash; compare again in constant time so a
     * lookup quirk (collation, a future index change) can never let a
     * different key through. */
    if (sodium_hex2bin(stored, sizeof(stored), PQgetvalue(r, 0, 3) + 2,
                       strlen(PQgetvalue(r, 0, 3) + 2), NULL, &stored_len, NULL) != 0 ||
        stored_len != 32 || sodium_memcmp(stored, hash, 32) != 0)
        goto out;
    snprintf(p->key_id, sizeof(p->key_id), "%s", PQgetvalue(r, 0, 0));
    snprintf(p->user, sizeof(p->user), "%s", PQgetvalue(r, 0, 1));
    p->require_approval = PQgetvalue(r, 0, 2)[0] == 't';
    p->on_behalf = PQgetvalue(r, 0, 5)[0] == 't';
    if (PQgetvalue(r, 0, 4)[0] == 't') {
        const char *id[1] = {p->key_id};
        if (cx_db_exec(db, &q_key_touch, id, NULL))
            cx_log_warn(0, "could not record last use of key %s", p->key_id);
    }
    rc = CX_OK;
    if (res) {
        *res = r;
        r = NULL;
    }
out:
    PQclear(r);
    sodium_memzero(hash, sizeof(hash));
    return rc;
}

enum cx_err
cx_auth_request(const struct cx_auth *a, struct cx_db *db, bool trust_remote_user,
                const char *remote_user, const char *authorization, struct cx_principal *p)
{
    const char *token;
    size_t len;
    enum cx_err rc;

    memset(p, 0, sizeof(*p));
    if (trust_remote_user && remote_user && *remote_user) {
        if (!cx_auth_user_valid(remote_user))
            return CX_ERR_UNAUTHORIZED;
        snprintf(p->user, sizeof(p->user), "%s", remote_user);
        return CX_OK;
    }
    rc = cx_auth_parse_bearer(authorization, &token, &len);
    if (rc)
        return rc;
    return cx_auth_check_key(a, db, token, len, p);
}

CX_SQL(q_key_insert, 6,
       "INSERT INTO api_keys (user_id, label, key_hash, key_prefix, require_approval, on_behalf)"
       " VALUES ($1, $2, $3::bytea, $4, $5::boolean, $6::boolean) RETURNING id");

enum cx_err
cx_auth_key_create(const struct cx_auth *a, struct cx_db *db, const char *user, const char *label,
                   unsigned flags, char *key_out, char *id_out)
{
    unsigned char raw[32], hash[32];
    char hexparam[2 + 64 + 1], prefix[12];
    const char *params[6];
    PGresult *r = NULL;
    enum cx_err rc;

    if (!cx_auth_user_valid(user) || (label && !cx_utf8_valid(label, strlen(label))) ||
        ((flags & CX_KEY_ON_BEHALF) && strchr(user, ':')))
        return CX_ERR_INVALID;
    randombytes_buf(raw, sizeof(raw));
    memcpy(key_out, "cx_", 3);
    sodium_bin2base64(key_out + 3, CX_KEY_CHARS - 3 + 1, raw, sizeof(raw),
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    cx_auth_key_hash(a, key_out, CX_KEY_CHARS, hash);
    hash_param(hash, hexparam);
    snprintf(prefix, sizeof(prefix), "%.8s", key_out);
    params[0] = user;
    params[1] = label;
    params[2] = hexparam;
    params[3] = prefix;
    params[4] = flags & CX_KEY_APPROVAL ? "true" : "false";
    params[5] = flags & CX_KEY_ON_BEHALF ? "true" : "false";
    rc = cx_db_exec(db, &q_key_insert, params, &r);
    if (rc == CX_OK)
        snprintf(id_out, 37, "%s", PQgetvalue(r, 0, 0));
    else
        sodium_memzero(key_out, CX_KEY_CHARS + 1);
    PQclear(r);
    sodium_memzero(raw, sizeof(raw));
    return rc;
}

CX_SQL(q_key_revoke, 1,
       "UPDATE api_keys SET revoked_at = now() WHERE id = $1::uuid AND revoked_at IS NULL"
       " RETURNING id");

enum cx_err
cx_auth_key_revoke(struct cx_db *db, const char *id)
{
    const char *params[1] = {id};
    PGresult *r = NULL;
    enum cx_err rc;

    if (!cx_uuid_valid(id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_exec(db, &q_key_revoke, params, &r);
    if (rc == CX_OK && PQntuples(r) == 0)
        rc = CX_ERR_NOT_FOUND;
    PQclear(r);
    return rc;
}

CX_SQL(q_key_list, 1,
       "SELECT id, user_id, coalesce(label, ''), key_prefix,"
       " CASE WHEN require_approval THEN 'yes' ELSE 'no' END, " CX_SQL_UTC(
           "created_at") ", " CX_SQL_UTC("revoked_at") " FROM api_keys WHERE $1::text IS NULL OR "
                                                       "user_id = $1 ORDER BY created_at");

enum cx_err
cx_auth_key_list(struct cx_db *db, const char *user, json_t **out)
{
    const char *p[1] = {user};

    return cx_db_rows(db, &q_key_list, p, CX_AUTH_KEY_LIST_COLUMNS, out);
}

enum cx_err
cx_auth_act_for(struct cx_principal *p, const char *header, char *msg, size_t msglen)
{
    size_t n = header ? strlen(header) : 0;

    if (!header)
        return CX_OK;
    if (!p->key_id[0] || !p->on_behalf) {
        snprintf(msg, msglen, "On-Behalf-Of needs a key made with --on-behalf");
        return CX_ERR_FORBIDDEN;
    }
    /* "svc:a" acting for "b" would be "svc" acting for "a:b": the key's own
     * user ends at the first ':' (refused at creation; a key made before) */
    if (strchr(p->user, ':')) {
        snprintf(msg, msglen, "On-Behalf-Of needs a key whose user id has no ':'");
        return CX_ERR_FORBIDDEN;
    }
    if (n < 1 || n > CX_ON_BEHALF_MAX || !cx_name_chars(header, n, "._:@-") ||
        strlen(p->user) + 1 + n > CX_USER_MAX) {
        snprintf(msg, msglen, "On-Behalf-Of must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -");
        return CX_ERR_INVALID;
    }
    /* (the principal keeps its key: links and revocation follow the key) */
    p->owner_len = strlen(p->user);
    snprintf(p->user + strlen(p->user), sizeof(p->user) - strlen(p->user), ":%s", header);
    p->on_behalf = false; /* applied once */
    return CX_OK;
}
