/* Downloads: who may read which bytes (signed links, REMOTE_USER, API
 * keys), with every way a link can be forged, moved or outlived. Real
 * PostgreSQL and storage. */
#include <ctype.h>
#include <sodium.h>
#include <time.h>
#include <unistd.h>

#include "../../lib/auth.h"
#include "../../lib/db.h"
#include "../../lib/dlcache.h"
#include "../../lib/download.h"
#include "../../lib/http.h"
#include "../../lib/metrics.h"
#include "cxtest.h"

/* The query part of a signed link. */
static void
link_query(struct cxtest *t, const struct cx_principal *who, const char *id, int version,
           long long expires_in, char *out, size_t outlen)
{
    struct cx_download d;
    json_t *l = cx_download_resolve(&t->cx, who->user, id, version, &d) == CX_OK
                    ? cx_link_sign(&t->cx, who, &d, expires_in)
                    : NULL;
    const char *url = json_string_value(json_object_get(l, "url"));
    const char *q = url ? strchr(url, '?') : NULL;

    snprintf(out, outlen, "%s", q ? q + 1 : "");
    json_decref(l);
}

/* query with the value of name replaced by value. */
static void
with_param(const char *query, const char *name, const char *value, char *out, size_t outlen)
{
    char want[32];
    const char *p, *end;

    snprintf(want, sizeof(want), "%s=", name);
    p = strstr(query, want);
    if (!p) {
        snprintf(out, outlen, "%s", query);
        return;
    }
    end = strchr(p, '&');
    snprintf(out, outlen, "%.*s%s%s%s", (int)(p - query), query, want, value, end ? end : "");
}

static enum cx_err
verify(struct cxtest *t, const char *query, const char *id)
{
    char user[CX_USER_MAX + 1];
    int version = 0;
    return cx_link_verify(&t->cx, query, id, user, &version);
}

/* One parameter of a genuine link changed. */
static const struct {
    const char *name, *value, *what;
} tampered[] = {
    {"version", "2", "another version"},
    {"version", "-1", "a negative version"},
    {"version", "1x", "a version with a tail"},
    {"u", "alice", "another user"},
    {"u", "bob%00", "a NUL after the user"},
    {"exp", "99999999999", "a longer life"},
    {"exp", "-5", "a negative expiry"},
    {"k", "", "the key dropped"},
    {"k", "00000000-0000-0000-0000-000000000000", "another key"},
    {"sig", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "another signature"},
    {"sig", "%00", "a NUL in the signature"},
    {"sig", "", "an empty signature"},
    {"m", "", "the web server's part emptied"},
    {"m", "YXJ0aWZhY3RzL2V2ZS94CnRleHQvaHRtbAp4CngK", "the web server's part replaced"},
};

/* v2's MAC, computed here from its definition: HMAC-SHA-256 with the edge
 * key over the fields (what nginx's njs computes too). */
static void
v2_mac_by_definition(struct cxtest *t, const struct cx_principal *bob, const char *id,
                     const char *query)
{
    char exp[32], meta[8192], sig[64], want[64], msg[9000], v1hex[65];
    const char *key = cx_auth_edge_key(t->cx.auth);
    unsigned char tag[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256_state st;

    ok(cx_http_query_get(query, "exp", exp, sizeof(exp)) == CX_OK &&
           cx_http_query_get(query, "m", meta, sizeof(meta)) == CX_OK &&
           cx_http_query_get(query, "sig", sig, sizeof(sig)) == CX_OK,
       "a link carries exp, m and sig");
    snprintf(msg, sizeof(msg), "codexec-link-v2\n%s\n%s\n1\n%s\n%s\n%s", bob->user, id, exp,
             bob->key_id, meta);
    is_int((int)strlen(key), 64, "the edge key: 64 characters");
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)key, strlen(key));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)msg, strlen(msg));
    crypto_auth_hmacsha256_final(&st, tag);
    sodium_bin2base64(want, sizeof(want), tag, sizeof(tag),
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    is_str(sig, want, "sig is HMAC-SHA-256 of the fields keyed with the edge key's characters");
    sodium_bin2hex(v1hex, sizeof(v1hex), cx_auth_link_key(t->cx.auth), 32);
    ok(strcmp(cx_auth_edge_key(t->cx.auth), v1hex) != 0, "the edge key is not the v1 link key");
}

/* A link made before v2 (HMAC-SHA-512-256 with the link key, no m) still
 * verifies while it lives. */
static void
v1_link(struct cxtest *t, const struct cx_principal *bob, const char *id)
{
    char msg[512], sig[64], q[1024], user[CX_USER_MAX + 1];
    unsigned char tag[crypto_auth_BYTES];
    long long exp = (long long)time(NULL) + 300;
    int version = 0;

    snprintf(msg, sizeof(msg), "codexec-link-v1\n%s\n%s\n1\n%lld\n%s", bob->user, id, exp,
             bob->key_id);
    crypto_auth(tag, (const unsigned char *)msg, strlen(msg), cx_auth_link_key(t->cx.auth));
    sodium_bin2base64(sig, sizeof(sig), tag, sizeof(tag), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    snprintf(q, sizeof(q), "version=1&u=%s&k=%s&exp=%lld&sig=%s", bob->user, bob->key_id, exp, sig);
    is_int(cx_link_verify(&t->cx, q, id, user, &version), CX_OK, "a v1 link verifies");
    snprintf(q, sizeof(q), "version=1&u=%s&k=%s&exp=%lld&m=&sig=%s", bob->user, bob->key_id, exp,
             sig);
    is_int(verify(t, q, id), CX_ERR_FORBIDDEN, "a v1 signature with an m: forbidden");
}

static void
links(struct cxtest *t, const struct cx_principal *bob, const char *id, const char *other)
{
    char q[4096], bad[4200], user[CX_USER_MAX + 1];
    int version = 0;

    link_query(t, bob, id, 1, 300, q, sizeof(q));
    ok(cx_link_verify(&t->cx, q, id, user, &version) == CX_OK, "a fresh link verifies");
    is_str(user, "bob", "for bob");
    is_int(version, 1, "for version 1");
    v2_mac_by_definition(t, bob, id, q);
    v1_link(t, bob, id);
    is_int(verify(t, q, other), CX_ERR_FORBIDDEN, "moved to another artifact: forbidden");
    for (size_t i = 0; i < sizeof(tampered) / sizeof(tampered[0]); i++) {
        with_param(q, tampered[i].name, tampered[i].value, bad, sizeof(bad));
        is_int(verify(t, bad, id), CX_ERR_FORBIDDEN, "%s: forbidden", tampered[i].what);
    }
    snprintf(bad, sizeof(bad), "u=alice&%s", q);
    is_int(verify(t, bad, id), CX_ERR_FORBIDDEN, "a user parameter put first: forbidden");
    is_int(verify(t, "version=1", id), CX_ERR_NOT_FOUND, "no signature: not a link");
    is_int(verify(t, q, "../../etc"), CX_ERR_FORBIDDEN, "a malformed id: forbidden");

    link_query(t, bob, id, 1, -10, q, sizeof(q));
    is_int(verify(t, q, id), CX_ERR_EXPIRED, "an old link: expired");
    with_param(q, "sig", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", bad, sizeof(bad));
    is_int(verify(t, bad, id), CX_ERR_FORBIDDEN, "only a genuine link learns it expired");
}

static void
revoked(struct cxtest *t, const char *id)
{
    struct cx_principal p = cxtest_principal(t, "bob");
    char q[4096];

    link_query(t, &p, id, 1, 300, q, sizeof(q));
    is_int(verify(t, q, id), CX_OK, "a link of a live key verifies");
    ok(cx_auth_key_revoke(t->cx.db, p.key_id) == CX_OK, "its key revoked");
    is_int(verify(t, q, id), CX_ERR_FORBIDDEN, "then its link is forbidden");
}

static enum cx_err
authorize(struct cxtest *t, const char *id, const char *query, const char *remote_user,
          const char *authorization, struct cx_download *d)
{
    struct cx_download_request q = {id, query, remote_user, authorization};
    struct cx_principal who;
    char msg[CX_MSG_MAX];
    return cx_download_authorize(&t->cx, &q, &who, d, msg, sizeof(msg));
}

static void
requests(struct cxtest *t, const struct cx_principal *bob, const char *id, const char *bearer)
{
    struct cx_download d;
    char q[4096], buf[16];
    int fd = -1;
    ssize_t n;

    link_query(t, bob, id, 1, 300, q, sizeof(q));
    ok(authorize(t, id, q, NULL, NULL, &d) == CX_OK && d.version == 1 && d.size == 5,
       "a link alone downloads version 1");
    ok(cx_download_open(&t->cx, &d, &fd) == CX_OK && fd >= 0, "its bytes open");
    n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;
    ok(n == 5 && !memcmp(buf, "first", 5), "and are version 1's");
    if (fd >= 0)
        close(fd);
    ok(authorize(t, id, "", "bob", NULL, &d) == CX_OK && d.version == 2,
       "REMOTE_USER bob gets the current version");
    is_int(authorize(t, id, "", "eve", NULL, &d), CX_ERR_NOT_FOUND,
           "REMOTE_USER eve: not found, as if missing");
    ok(authorize(t, id, "version=1", NULL, bearer, &d) == CX_OK && d.version == 1,
       "bob's key with ?version=1");
    is_int(authorize(t, id, "version=3", NULL, bearer, &d), CX_ERR_NOT_FOUND,
           "a version that does not exist: not found");
    is_int(authorize(t, id, "version=x", NULL, bearer, &d), CX_ERR_INVALID, "?version=x: invalid");
    is_int(authorize(t, id, "version=x", NULL, NULL, &d), CX_ERR_UNAUTHORIZED,
           "without credentials a bad version is still 401");
    is_int(authorize(t, id, "", NULL, "Bearer cx_nope", &d), CX_ERR_UNAUTHORIZED, "a bad key: 401");
    is_int(authorize(t, id, "", NULL, NULL, &d), CX_ERR_UNAUTHORIZED, "nothing: 401");
    is_int(authorize(t, "not-a-uuid", "", NULL, bearer, &d), CX_ERR_NOT_FOUND,
           "a malformed id: not found");
    ok(cx_download_resolve(&t->cx, "bob", id, 0, &d) == CX_OK && d.version == 2,
       "resolve version 0 is the current one");
    is_int(cx_download_resolve(&t->cx, "alice", id, 0, &d), CX_ERR_NOT_FOUND,
           "resolve for another user: not found");
}

/* A lookup that began before a forgetting keeps nothing: what it read may
 * be what was just forgotten. */
static void
epoch_race(struct cxtest *t, const char *key, const char *id)
{
    unsigned char hash[32];
    struct cx_principal who;
    struct cx_download d;
    uint64_t epoch, later;

    cx_auth_key_hash(t->cx.auth, key, strlen(key), hash);
    ok(!cx_dlcache_get(hash, id, 7, &who, &d, &epoch), "a miss");
    memset(&who, 0, sizeof(who));
    memset(&d, 0, sizeof(d));
    cx_dlcache_forget_artifact("00000000-0000-0000-0000-000000000000");
    cx_dlcache_put(hash, id, 7, &who, &d, epoch);
    ok(!cx_dlcache_get(hash, id, 7, &who, &d, &later), "what it read is not kept");
    cx_dlcache_put(hash, id, 7, &who, &d, later);
    ok(cx_dlcache_get(hash, id, 7, &who, &d, &later), "with nothing forgotten between, it is");
    cx_dlcache_forget_artifact(id);
}

/* The cache test's key revoked (or live again) in the database alone, as
 * another process would change it, without telling the cache. */
static void
behind_the_cache(struct cxtest *t, bool revoked, const char *what)
{
    ok(cx_db_run(t->cx.db,
                 revoked ? "UPDATE api_keys SET revoked_at = now() WHERE label = 'cache'"
                         : "UPDATE api_keys SET revoked_at = NULL WHERE label = 'cache'") == CX_OK,
       "%s", what);
}

/* An id asked in capitals is the same artifact, and forgotten with it. */
static void
upper_case_id(struct cxtest *t, const char *key, const char *id)
{
    struct cx_principal who;
    struct cx_download d;
    char upper[37];

    for (size_t i = 0; i <= strlen(id); i++)
        upper[i] = (char)toupper((unsigned char)id[i]);
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), upper, 1, &who, &d) == CX_OK &&
           !strcmp(d.artifact_id, id),
       "asked in capitals: the artifact, named as PostgreSQL names it");
    behind_the_cache(t, true, "revoked");
    cx_dlcache_forget_artifact(id);
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), upper, 1, &who, &d),
           CX_ERR_UNAUTHORIZED, "forgotten with the artifact's announcement");
    behind_the_cache(t, false, "(live again)");
}

/* A key's own check (every request's but a download's) from the same
 * table: kept while live, forgotten when its key is, never a download's
 * answer, and a download's entry never a key check's. */
static void
key_checks(struct cxtest *t, const char *key, const char *kid, const char *id)
{
    struct cx_principal who;
    struct cx_download d;
    uint64_t hits = cx_metrics_counter(CX_COUNT_KEYCACHE_HITS);

    ok(cx_auth_check_key(t->auth, t->cx.db, key, strlen(key), &who) == CX_OK &&
           !strcmp(who.key_id, kid) && !strcmp(who.user, "bob"),
       "a key checked by the database, while live");
    behind_the_cache(t, true, "the key revoked behind the cache's back");
    memset(&who, 0, sizeof(who));
    ok(cx_auth_check_key(t->auth, t->cx.db, key, strlen(key), &who) == CX_OK &&
           !strcmp(who.key_id, kid) && !strcmp(who.user, "bob"),
       "the kept check stands (the proof it was kept)");
    is_int((int)(cx_metrics_counter(CX_COUNT_KEYCACHE_HITS) - hits), 1, "counted as a hit");
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d),
           CX_ERR_UNAUTHORIZED, "a download's lookup does not take the key's entry");
    cx_dlcache_forget_artifact(id);
    ok(cx_auth_check_key(t->auth, t->cx.db, key, strlen(key), &who) == CX_OK,
       "forgetting an artifact leaves the key's check");
    cx_dlcache_forget_key(kid);
    is_int(cx_auth_check_key(t->auth, t->cx.db, key, strlen(key), &who), CX_ERR_UNAUTHORIZED,
           "told of the key: forgotten, refused");
    is_int(cx_auth_check_key(t->auth, t->cx.db, "cx_nope", 7, &who), CX_ERR_UNAUTHORIZED,
           "a malformed key: refused, nothing asked");
    behind_the_cache(t, false, "(live again)");
    ok(cx_auth_check_key(t->auth, t->cx.db, key, strlen(key), &who) == CX_OK, "kept again");
    cx_dlcache_set_live(false);
    behind_the_cache(t, true, "revoked");
    is_int(cx_auth_check_key(t->auth, t->cx.db, key, strlen(key), &who), CX_ERR_UNAUTHORIZED,
           "no longer live: the database answers");
    behind_the_cache(t, false, "(live again)");
    cx_dlcache_set_live(true);
}

/* The download cache: answers from memory while live, forgets at once when
 * told (what the watcher does on PostgreSQL's announcements), never keeps
 * what was read across a forgetting. */
static void
cache(struct cxtest *t, const char *id)
{
    struct cx_principal who;
    struct cx_download d;
    char key[CX_KEY_CHARS + 1], kid[37], msg[CX_MSG_MAX];
    json_t *a = NULL;

    ok(cx_auth_key_create(t->auth, t->cx.db, "bob", "cache", false, key, kid) == CX_OK, "a key");
    ok(cx_dlcache_init(8) == CX_OK, "a cache of 8");
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d), CX_OK,
           "not live yet: the database answers");
    behind_the_cache(t, true, "the key revoked behind the cache's back");
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d),
           CX_ERR_UNAUTHORIZED, "not live: nothing was kept");
    behind_the_cache(t, false, "(live again)");
    cx_dlcache_set_live(true);
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d) == CX_OK &&
           d.version == 1 && !strcmp(who.user, "bob") && !strcmp(who.key_id, kid),
       "live: the database answers, and the answer is kept");
    behind_the_cache(t, true, "revoked behind its back again");
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d) == CX_OK &&
           d.version == 1 && d.size == 5,
       "so the kept answer stands (the proof it was kept)");
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 2, &who, &d),
           CX_ERR_UNAUTHORIZED, "another version asked: the database, which refuses");
    cx_dlcache_forget_artifact("00000000-0000-0000-0000-000000000000");
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d) == CX_OK,
       "forgetting another artifact leaves this answer");
    cx_dlcache_forget_key(kid);
    behind_the_cache(t, false, "(live again)");
    epoch_race(t, key, id);
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d) == CX_OK, "kept");
    behind_the_cache(t, true, "revoked");
    cx_dlcache_forget_key(kid);
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 1, &who, &d),
           CX_ERR_UNAUTHORIZED, "told of the key: forgotten, refused");
    behind_the_cache(t, false, "(live again)");
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 0, &who, &d) == CX_OK &&
           d.version == 2,
       "the current version, kept");
    ok(cxtest_upload(t, "bob", "c1", "f.txt", "third", 5, &a, msg, sizeof(msg)) == CX_OK,
       "a third version");
    json_decref(a);
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 0, &who, &d) == CX_OK &&
           d.version == 2,
       "not told yet: the kept answer (version 2)");
    cx_dlcache_forget_artifact(id);
    ok(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 0, &who, &d) == CX_OK &&
           d.version == 3,
       "told of the artifact: version 3");
    upper_case_id(t, key, id);
    key_checks(t, key, kid, id);
    is_int(cx_download_resolve_for_key(&t->cx, "cx_nope", 7, id, 0, &who, &d), CX_ERR_UNAUTHORIZED,
           "a bad key: refused as ever");
    cx_dlcache_set_live(false);
    behind_the_cache(t, true, "revoked");
    is_int(cx_download_resolve_for_key(&t->cx, key, strlen(key), id, 0, &who, &d),
           CX_ERR_UNAUTHORIZED, "no longer live: everything forgotten");
    cx_dlcache_shutdown();
}

int
main(void)
{
    struct cxtest t;
    struct cx_principal bob;
    char msg[CX_MSG_MAX], id[37], other[37], key[CX_KEY_CHARS + 1], bearer[64];
    json_t *a = NULL, *b = NULL;

    cxtest_open(&t, "download", "");
    bob = cxtest_principal(&t, "bob");
    ok(cxtest_upload(&t, "bob", "c1", "f.txt", "first", 5, &a, msg, sizeof(msg)) == CX_OK &&
           cxtest_upload(&t, "bob", "c1", "f.txt", "second", 6, &b, msg, sizeof(msg)) == CX_OK,
       "two versions uploaded");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(a, "artifact_id")));
    json_decref(a);
    json_decref(b);
    ok(cxtest_upload(&t, "bob", "c1", "g.txt", "other", 5, &a, msg, sizeof(msg)) == CX_OK,
       "another artifact");
    snprintf(other, sizeof(other), "%s", json_string_value(json_object_get(a, "artifact_id")));
    json_decref(a);
    ok(cx_auth_key_create(t.auth, t.cx.db, "bob", "dl", false, key, bob.key_id) == CX_OK,
       "bob's key");
    snprintf(bearer, sizeof(bearer), "Bearer %s", key);

    links(&t, &bob, id, other);
    revoked(&t, id);
    requests(&t, &bob, id, bearer);
    cache(&t, id);
    cxtest_close(&t);
    return tap_done();
}
