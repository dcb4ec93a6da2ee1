#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "artifact.h"
#include "authdb.h"
#include "buf.h"
#include "config.h"
#include "db.h"
#include "digest.h"
#include "dlcache.h"
#include "download.h"
#include "http.h"
#include "log.h"
#include "s3.h"
#include "storage.h"
#include "util.h"

#define VERSION_COLS                                                                               \
    "v.version, v.filename, v.mime_type, v.size, v.sha256, v.storage_key,"                         \
    " extract(epoch FROM v.created_at)::bigint"
/* A v2 link's m, raw and in base64url (link_meta). */
#define LINK_META_MAX     4096
#define LINK_META_B64_MAX (LINK_META_MAX / 3 * 4 + 8)
/* What a link's u keeps unencoded (RFC 3986 unreserved). */
#define LINK_USER_KEEP "-_.~"

#define PICK_VERSION "v.version = CASE WHEN $3::int > 0 THEN $3::int ELSE a.current_version END"

CX_SQL(q_resolve, 3,
       "SELECT " VERSION_COLS " FROM artifacts a JOIN artifact_versions v ON v.artifact_id = a.id"
       " AND " PICK_VERSION " WHERE a.id = $1::uuid AND a.user_id = $2 AND a.deleted_at IS NULL");
/* The key's row always (when it is valid), the version's columns NULL when
 * the key's user has no such artifact or version. */
CX_SQL(q_resolve_for_key, 3,
       "SELECT " CX_AUTH_KEY_COLUMNS ", " VERSION_COLS " FROM api_keys k"
       " LEFT JOIN artifacts a ON a.id = $2::uuid AND a.user_id = k.user_id"
       " AND a.deleted_at IS NULL"
       " LEFT JOIN artifact_versions v ON v.artifact_id = a.id AND " PICK_VERSION
       " WHERE " CX_AUTH_KEY_MATCH);

/* Fills d from VERSION_COLS at column c of r's row; CX_ERR_NOT_FOUND when
 * there is none or it is NULL (an outer join that found nothing). */
static enum cx_err
from_row(PGresult *r, int c, const char *id, struct cx_download *d)
{
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, c))
        return CX_ERR_NOT_FOUND;
    snprintf(d->artifact_id, sizeof(d->artifact_id), "%s", id);
    d->version = (int)strtol(PQgetvalue(r, 0, c), NULL, 10);
    snprintf(d->filename, sizeof(d->filename), "%s", PQgetvalue(r, 0, c + 1));
    snprintf(d->mime, sizeof(d->mime), "%s", PQgetvalue(r, 0, c + 2));
    d->size = strtoull(PQgetvalue(r, 0, c + 3), NULL, 10);
    snprintf(d->sha256, sizeof(d->sha256), "%s", PQgetvalue(r, 0, c + 4));
    snprintf(d->key, sizeof(d->key), "%s", PQgetvalue(r, 0, c + 5));
    d->created = strtoll(PQgetvalue(r, 0, c + 6), NULL, 10);
    return CX_OK;
}

enum cx_err
cx_download_resolve(struct cx_ctx *cx, const char *user, const char *id, int version,
                    struct cx_download *d)
{
    char ver[16];
    const char *p[3] = {id, user, ver};
    PGresult *r = NULL;
    enum cx_err rc;

    memset(d, 0, sizeof(*d));
    if (!cx_uuid_valid(id) || version < 0)
        return CX_ERR_NOT_FOUND;
    snprintf(ver, sizeof(ver), "%d", version);
    rc = cx_db_exec(cx->db, &q_resolve, p, &r);
    if (rc)
        return rc;
    rc = from_row(r, 0, id, d);
    PQclear(r);
    return rc;
}

enum cx_err
cx_download_resolve_for_key(struct cx_ctx *cx, const char *key, size_t len, const char *id,
                            int version, struct cx_principal *who, struct cx_download *d)
{
    char ver[16], lower[37];
    const char *more[2] = {id, ver};
    unsigned char hash[32];
    PGresult *r = NULL;
    uint64_t epoch;
    enum cx_err rc;

    memset(d, 0, sizeof(*d));
    if (!cx_uuid_valid(id) || version < 0) {
        /* Still a 401 for a bad key before a 404 for a bad id. */
        rc = cx_auth_check_key(cx->auth, cx->db, key, len, who);
        return rc ? rc : CX_ERR_NOT_FOUND;
    }
    /* as PostgreSQL writes it (and announces it: the cache compares) */
    for (size_t i = 0; i < sizeof(lower) - 1; i++)
        lower[i] = (char)tolower((unsigned char)id[i]);
    lower[sizeof(lower) - 1] = '\0';
    id = lower;
    more[0] = id;
    /* the cache (download.h) answers for the same key, artifact and
     * version asked within the minute, unless something changed */
    cx_auth_key_hash(cx->auth, key, len, hash);
    if (cx_dlcache_get(hash, id, version, who, d, &epoch)) {
        sodium_memzero(hash, sizeof(hash));
        return CX_OK;
    }
    snprintf(ver, sizeof(ver), "%d", version);
    rc = cx_auth_check_key_with(cx->auth, cx->db, key, len, &q_resolve_for_key, more, 2, who, &r);
    if (rc == CX_OK) {
        rc = from_row(r, CX_AUTH_KEY_NCOLS, id, d);
        PQclear(r);
    }
    if (rc == CX_OK)
        cx_dlcache_put(hash, id, version, who, d, epoch);
    sodium_memzero(hash, sizeof(hash));
    return rc;
}

/* What a link's MAC covers: every field a link could be moved along. v1
 * links (HMAC-SHA-512-256 with the link key) are still verified; links are
 * made v2: HMAC-SHA-256 with the edge key, and m, which tells the web
 * server how to serve the version by itself (link_meta). */
static void
link_message(struct cx_buf *m, const char *user, const char *id, long version, long long exp,
             const char *key_id, const char *meta)
{
    cx_buf_init(m, 16384);
    if (meta) {
        /* the user as the link's u has it, so that nginx can take the raw
         * parameter ($arg_u) without decoding it */
        cx_buf_adds(m, "codexec-link-v2\n");
        cx_http_pct_encode(m, user, LINK_USER_KEEP);
        cx_buf_addf(m, "\n%s\n%ld\n%lld\n%s\n%s", id, version, exp, key_id, meta);
    } else
        cx_buf_addf(m, "codexec-link-v1\n%s\n%s\n%ld\n%lld\n%s", user, id, version, exp, key_id);
}

/* v2's MAC: HMAC-SHA-256 keyed with the edge key's 64 characters. */
static enum cx_err
edge_mac(struct cx_ctx *cx, const struct cx_buf *m, unsigned char out[CX_MAC_BYTES])
{
    const char *key = cx_auth_edge_key(cx->auth);

    return cx_hmac_sha256(key, strlen(key), m->data, m->len, out);
}

/* A v2 link's m: the storage key, MIME type, sha256 and Content-Disposition
 * of the version, one per line, base64url. Empty (the web server then
 * leaves the link to codexec) when a field could not be carried. */
static void
link_meta(const struct cx_download *d, char *out, size_t outlen)
{
    char disp[1400];
    struct cx_buf raw;

    out[0] = '\0';
    cx_http_content_disposition(d->filename, disp, sizeof(disp));
    cx_buf_init(&raw, LINK_META_MAX);
    cx_buf_addf(&raw, "%s\n%s\n%s\n%s", d->key, d->mime, d->sha256, disp);
    if (!cx_buf_err(&raw) && strchr(d->key, '\n') == NULL && strchr(d->mime, '\n') == NULL &&
        strchr(d->mime, '\r') == NULL &&
        sodium_base64_ENCODED_LEN(raw.len, sodium_base64_VARIANT_URLSAFE_NO_PADDING) <= outlen)
        sodium_bin2base64(out, outlen, (const unsigned char *)raw.data, raw.len,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    cx_buf_cleanup(&raw);
}

/* An optional positive integer member: *out keeps its default when the
 * member is absent or null; false when it is anything but a positive
 * integer. */
static bool
positive_field(json_t *body, const char *name, json_int_t *out)
{
    json_t *v = json_object_get(body, name);

    if (!v || json_is_null(v))
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT_MAX)
        return false;
    *out = json_integer_value(v);
    return true;
}

enum cx_err
cx_link_create(struct cx_ctx *cx, const struct cx_principal *who, const char *id, json_t *body,
               json_t **out, char *msg, size_t msglen)
{
    struct cx_download d;
    json_int_t version = 0, expires_in = cx->cfg->link_default_expiry;
    enum cx_err rc;

    *out = NULL;
    if (!positive_field(body, "version", &version)) {
        snprintf(msg, msglen, "version must be a positive integer");
        return CX_ERR_INVALID;
    }
    if (!positive_field(body, "expires_in", &expires_in)) {
        snprintf(msg, msglen, "expires_in must be a positive integer number of seconds");
        return CX_ERR_INVALID;
    }
    if (expires_in > (json_int_t)cx->cfg->link_max_expiry)
        expires_in = cx->cfg->link_max_expiry;
    rc = cx_download_resolve(cx, who->user, id, (int)version, &d);
    if (rc)
        return rc;
    *out = cx_link_sign(cx, who, &d, (long long)expires_in);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

json_t *
cx_link_sign(struct cx_ctx *cx, const struct cx_principal *who, const struct cx_download *d,
             long long expires_in)
{
    unsigned char tag[CX_MAC_BYTES];
    char sig[64], when[32], path[CX_CONTENT_URL_MAX], *meta = malloc(LINK_META_B64_MAX);
    long long exp = (long long)time(NULL) + expires_in;
    struct cx_buf m, url;
    json_t *out = NULL;
    time_t t = (time_t)exp;
    struct tm tm;

    if (!meta)
        return NULL;
    link_meta(d, meta, LINK_META_B64_MAX);
    link_message(&m, who->user, d->artifact_id, d->version, exp, who->key_id, meta);
    if (cx_buf_err(&m) || edge_mac(cx, &m, tag)) {
        cx_buf_cleanup(&m);
        free(meta);
        return NULL;
    }
    cx_buf_cleanup(&m);
    sodium_bin2base64(sig, sizeof(sig), tag, sizeof(tag), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    cx_buf_init(&url, 16384);
    cx_artifact_content_url(d->artifact_id, d->version, path);
    cx_buf_addf(&url, "%s&u=", path);
    cx_http_pct_encode(&url, who->user, LINK_USER_KEEP);
    cx_buf_addf(&url, "&k=%s&exp=%lld&m=%s&sig=%s", who->key_id, exp, meta, sig);
    free(meta);
    gmtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (!cx_buf_err(&url))
        out =
            json_pack("{s:s,s:s,s:i}", "url", url.data, "expires_at", when, "version", d->version);
    cx_buf_cleanup(&url);
    return out;
}

/* Whether tag is the MAC of the link's fields: v2 with meta, else v1. */
static bool
signature_ok(struct cx_ctx *cx, const unsigned char *tag, size_t taglen, const char *user,
             const char *id, int version, long long exp, const char *key_id, const char *meta)
{
    struct cx_buf m;
    bool good = false;

    unsigned char want[CX_MAC_BYTES];

    link_message(&m, user, id, version, exp, key_id, meta);
    if (!cx_buf_err(&m) && meta && taglen == CX_MAC_BYTES)
        good = edge_mac(cx, &m, want) == CX_OK && sodium_memcmp(want, tag, sizeof(want)) == 0;
    else if (!cx_buf_err(&m) && !meta && taglen == CX_MAC_BYTES)
        good = cx_hmac_sha512_256(cx_auth_link_key(cx->auth), 32, m.data, m.len, want) == CX_OK &&
               sodium_memcmp(want, tag, sizeof(want)) == 0;
    cx_buf_cleanup(&m);
    return good;
}

CX_SQL(q_link_key, 1,
       "SELECT user_id, on_behalf FROM api_keys WHERE id = $1::uuid AND revoked_at IS NULL");

/* Whether the key that made a link (key_id, "" for a link of a user the
 * web server authenticated) is still live and the user's: CX_OK, else
 * CX_ERR_FORBIDDEN, or CX_ERR_DB. */
static enum cx_err
link_key_live(struct cx_ctx *cx, const char *key_id, const char *user)
{
    const char *p[1] = {key_id};
    PGresult *r = NULL;
    enum cx_err rc;
    bool live;

    if (!key_id[0])
        return CX_OK;
    if (!cx_uuid_valid(key_id))
        return CX_ERR_FORBIDDEN;
    rc = cx_db_exec(cx->db, &q_link_key, p, &r);
    if (rc)
        return rc;
    /* the key's own user, or one of its end users (On-Behalf-Of) */
    live =
        PQntuples(r) == 1 && (!strcmp(PQgetvalue(r, 0, 0), user) ||
                              (PQgetvalue(r, 0, 1)[0] == 't' &&
                               !strncmp(PQgetvalue(r, 0, 0), user, strlen(PQgetvalue(r, 0, 0))) &&
                               user[strlen(PQgetvalue(r, 0, 0))] == ':'));
    PQclear(r);
    return live ? CX_OK : CX_ERR_FORBIDDEN; /* the key that made it was revoked */
}

/* Whether tag is the link's signature, over its meta (the "m" parameter)
 * when it has one. */
static enum cx_err
link_signed(struct cx_ctx *cx, const char *query, const unsigned char *tag, size_t taglen,
            const char *user, const char *id, int v, long long exp, const char *key_id)
{
    char *meta = malloc(LINK_META_B64_MAX);
    bool good;

    if (!meta)
        return CX_ERR_NOMEM;
    switch (cx_http_query_get(query, "m", meta, LINK_META_B64_MAX)) {
    case CX_OK: good = signature_ok(cx, tag, taglen, user, id, v, exp, key_id, meta); break;
    case CX_ERR_NOT_FOUND:
        good = signature_ok(cx, tag, taglen, user, id, v, exp, key_id, NULL);
        break;
    default: good = false;
    }
    free(meta);
    return good ? CX_OK : CX_ERR_FORBIDDEN;
}

enum cx_err
cx_link_verify(struct cx_ctx *cx, const char *query, const char *id, char user[CX_USER_MAX + 1],
               int *version)
{
    char sig[128], ver[16], exps[32], key_id[64] = "";
    unsigned char tag[CX_MAC_BYTES + 8];
    size_t taglen = 0;
    long long exp;
    char *end;
    long v;
    enum cx_err rc;

    switch (cx_http_query_get(query, "sig", sig, sizeof(sig))) {
    case CX_OK: break;
    case CX_ERR_NOT_FOUND: return CX_ERR_NOT_FOUND; /* not a link */
    default: return CX_ERR_FORBIDDEN;               /* a signature, but a broken one */
    }
    if (cx_http_query_get(query, "u", user, CX_USER_MAX + 1) ||
        cx_http_query_get(query, "version", ver, sizeof(ver)) ||
        cx_http_query_get(query, "exp", exps, sizeof(exps)) ||
        (cx_http_query_get(query, "k", key_id, sizeof(key_id)) == CX_ERR_INVALID) ||
        !cx_uuid_valid(id))
        return CX_ERR_FORBIDDEN;
    errno = 0;
    v = strtol(ver, &end, 10);
    if (errno || *end || v < 1 || v > 1000000000)
        return CX_ERR_FORBIDDEN;
    errno = 0;
    exp = strtoll(exps, &end, 10);
    if (errno || *end || exp <= 0)
        return CX_ERR_FORBIDDEN;
    if (sodium_base642bin(tag, sizeof(tag), sig, strlen(sig), NULL, &taglen, NULL,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0)
        return CX_ERR_FORBIDDEN;
    rc = link_signed(cx, query, tag, taglen, user, id, (int)v, exp, key_id);
    if (rc)
        return rc;
    /* Only a genuine link learns that it expired. */
    if (exp < (long long)time(NULL))
        return CX_ERR_EXPIRED;
    rc = link_key_live(cx, key_id, user);
    if (rc == CX_OK)
        *version = (int)v;
    return rc;
}

/* ?version=N: 0 when absent. */
static bool
query_version(const char *query, int *version)
{
    char v[16], *end;
    long n;

    *version = 0;
    switch (cx_http_query_get(query, "version", v, sizeof(v))) {
    case CX_ERR_NOT_FOUND: return true;
    case CX_OK: break;
    default: return false;
    }
    errno = 0;
    n = strtol(v, &end, 10);
    if (errno || *end || n < 1 || n > 1000000000)
        return false;
    *version = (int)n;
    return true;
}

/* REMOTE_USER, else a key: the principal, or CX_ERR_UNAUTHORIZED. */
static enum cx_err
credentials(struct cx_ctx *cx, const struct cx_download_request *q, struct cx_principal *who)
{
    return cx_auth_request(cx->auth, cx->db, q->remote_user != NULL, q->remote_user,
                           q->authorization, who);
}

enum cx_err
cx_download_authorize(struct cx_ctx *cx, const struct cx_download_request *q,
                      struct cx_principal *who, struct cx_download *d, char *msg, size_t msglen)
{
    char user[CX_USER_MAX + 1];
    const char *key;
    size_t len;
    int version = 0;
    enum cx_err rc = cx_link_verify(cx, q->query, q->id, user, &version);

    memset(who, 0, sizeof(*who));
    snprintf(msg, msglen, "%s",
             rc == CX_ERR_FORBIDDEN ? "this link is not valid"
             : rc == CX_ERR_EXPIRED ? "this link has expired"
                                    : "no such artifact");
    if (rc == CX_OK)
        return cx_download_resolve(cx, user, q->id, version, d);
    if (rc != CX_ERR_NOT_FOUND)
        return rc;
    if (!query_version(q->query, &version)) {
        rc = credentials(cx, q, who);
        snprintf(msg, msglen, "version must be a positive integer");
        return rc ? rc : CX_ERR_INVALID;
    }
    if (q->remote_user || q->on_behalf) {
        /* the principal first, then the artifact by its user */
        rc = credentials(cx, q, who);
        if (rc == CX_OK)
            rc = cx_auth_act_for(who, q->on_behalf, msg, msglen);
        return rc ? rc : cx_download_resolve(cx, who->user, q->id, version, d);
    }
    rc = cx_auth_parse_bearer(q->authorization, &key, &len);
    return rc ? rc : cx_download_resolve_for_key(cx, key, len, q->id, version, who, d);
}

enum cx_err
cx_download_open(struct cx_ctx *cx, const struct cx_download *d, int *fd)
{
    char path[4096];
    enum cx_err rc = cx_storage_path(cx->store, d->key, path, sizeof(path));

    *fd = -1;
    if (rc)
        return rc;
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (*fd < 0) {
        cx_log_err(errno, "open() of artifact %s version %d failed", d->artifact_id, d->version);
        return CX_ERR_IO;
    }
    return CX_OK;
}

bool
cx_download_from_store(struct cx_ctx *cx)
{
    return cx_storage_s3(cx->store) != NULL;
}

enum cx_err
cx_download_read(struct cx_ctx *cx, const struct cx_download *d, uint64_t first, uint64_t last,
                 bool (*sink)(void *ctx, const void *data, size_t len), void *ctx)
{
    return cx_storage_read(cx->store, d->key, first, last, sink, ctx);
}

enum cx_err
cx_download_presign(struct cx_ctx *cx, const struct cx_download *d, bool for_browser, char *out,
                    size_t outlen)
{
    struct cx_s3 *s3 = cx_storage_s3(cx->store);
    struct cx_buf extra;
    char disp[1400];
    enum cx_err rc;

    if (!s3)
        return CX_ERR_INTERNAL;
    cx_buf_init(&extra, 8192);
    if (for_browser) {
        /* the store answers with the headers a download has (what else
         * docs/api.md's "Downloads" promises it can't send is said in its
         * "Object storage (S3)") */
        cx_http_content_disposition(d->filename, disp, sizeof(disp));
        cx_buf_adds(&extra, "response-cache-control=private&response-content-disposition=");
        cx_http_pct_encode(&extra, disp, "-_.~");
        cx_buf_adds(&extra, "&response-content-type=");
        cx_http_pct_encode(&extra, d->mime, "-_.~");
    }
    rc = cx_buf_err(&extra);
    if (rc == CX_OK)
        rc = cx_s3_presign(s3, d->key, time(NULL), cx->cfg->s3_url_expiry,
                           extra.data ? extra.data : "", !for_browser, out, outlen);
    cx_buf_cleanup(&extra);
    return rc;
}
