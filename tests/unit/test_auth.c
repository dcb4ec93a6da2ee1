#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>

#include "../../lib/auth.h"
#include "../../lib/db.h"
#include "../../lib/log.h"
#include "pgtest.h"

int
main(void)
{
    const char *conninfo = pgtest_create("auth");
    char secret[] = "/tmp/cx-test-secret-XXXXXX";
    char key[CX_KEY_CHARS + 1], key2[CX_KEY_CHARS + 1], id[37], id2[37];
    struct cx_principal p;
    struct cx_auth *a = NULL, *other = NULL;
    struct cx_db *db;
    struct stat st;
    const char *tok;
    size_t len;
    int applied, fd;

    if (cx_log_open(NULL, CX_LOG_ERR) || sodium_init() < 0)
        return 1;
    fd = mkstemp(secret);
    close(fd);
    unlink(secret);
    ok(cx_auth_secret_create(secret) == CX_OK, "secret created");
    ok(stat(secret, &st) == 0 && (st.st_mode & 0777) == 0600, "secret file is 0600");
    is_int(cx_auth_secret_create(secret), CX_ERR_CONFLICT,
           "an existing secret is never overwritten");
    enum cx_err loaded = cx_auth_new(secret, &a);
    unlink(secret); /* loaded: no file is left behind, whatever follows */
    need(loaded == CX_OK, "secret loads");

    ok(cx_auth_parse_bearer("Bearer abc", &tok, &len) == CX_OK && len == 3 &&
           !memcmp(tok, "abc", 3),
       "bearer parsed");
    ok(cx_auth_parse_bearer("bearer   abc  ", &tok, &len) == CX_OK && len == 3,
       "scheme case, spaces");
    is_int(cx_auth_parse_bearer("Basic abc", &tok, &len), CX_ERR_UNAUTHORIZED, "other scheme");
    is_int(cx_auth_parse_bearer("Bearer ", &tok, &len), CX_ERR_UNAUTHORIZED, "empty token");
    is_int(cx_auth_parse_bearer(NULL, &tok, &len), CX_ERR_UNAUTHORIZED, "no header");
    is_int(cx_auth_parse_bearer("Bearer", &tok, &len), CX_ERR_UNAUTHORIZED, "scheme only");

    ok(cx_auth_user_valid("bob"), "user bob");
    ok(cx_auth_user_valid("j\xc3\xbcrgen@example.com"), "non-ASCII user");
    ok(!cx_auth_user_valid(""), "empty user");
    ok(!cx_auth_user_valid("a\nb"), "newline in user");
    ok(!cx_auth_user_valid("\xff"), "invalid UTF-8 user");

    need(cx_db_new(conninfo, &db) == CX_OK && cx_db_migrate(db, &applied) == CX_OK, "db ready");
    ok(cx_auth_key_create(a, db, "bob", "test", false, key, id) == CX_OK, "key created");
    is_int(strlen(key), CX_KEY_CHARS, "key length");
    ok(strncmp(key, "cx_", 3) == 0, "key prefix");
    ok(cx_auth_key_create(a, db, "alice", NULL, true, key2, id2) == CX_OK, "second key");
    ok(strcmp(key, key2) != 0, "keys differ");

    ok(cx_auth_check_key(a, db, key, strlen(key), &p) == CX_OK, "key authenticates");
    is_str(p.user, "bob", "as bob");
    is_str(p.key_id, id, "with its id");
    ok(!p.require_approval, "no approval flag");
    ok(cx_auth_check_key(a, db, key2, strlen(key2), &p) == CX_OK && p.require_approval &&
           !strcmp(p.user, "alice"),
       "approval flag carried");
    {
        char wrong[CX_KEY_CHARS + 1];
        memcpy(wrong, key, sizeof(wrong));
        wrong[10] = wrong[10] == 'A' ? 'B' : 'A';
        is_int(cx_auth_check_key(a, db, wrong, strlen(wrong), &p), CX_ERR_UNAUTHORIZED,
               "one char off");
    }
    is_int(cx_auth_check_key(a, db, "cx_' OR '1'='1", 14, &p), CX_ERR_UNAUTHORIZED, "SQL in key");
    is_int(cx_auth_check_key(a, db, key, strlen(key) - 1, &p), CX_ERR_UNAUTHORIZED,
           "truncated key");
    {
        PGconn *c = PQconnectdb(conninfo);
        PGresult *r = PQexec(c, "SELECT encode(key_hash, 'hex') FROM api_keys");
        int leaked = 0;
        for (int i = 0; i < PQntuples(r); i++)
            leaked |= strstr(PQgetvalue(r, i, 0), key + 3) != NULL;
        ok(PQntuples(r) == 2 && !leaked, "only hashes are stored");
        PQclear(r);
        r = PQexec(c, "SELECT count(*) FROM api_keys WHERE key_prefix = substr(key_prefix, 1, 8)");
        ok(strcmp(PQgetvalue(r, 0, 0), "2") == 0, "prefix is short");
        PQclear(r);
        PQfinish(c);
    }
    /* A different server secret must not accept the same key. */
    {
        char secret2[] = "/tmp/cx-test-secret2-XXXXXX";
        fd = mkstemp(secret2);
        close(fd);
        unlink(secret2);
        ok(cx_auth_secret_create(secret2) == CX_OK && cx_auth_new(secret2, &other) == CX_OK,
           "second secret");
        is_int(cx_auth_check_key(other, db, key, strlen(key), &p), CX_ERR_UNAUTHORIZED,
               "hash is keyed by the server secret");
        cx_auth_free(other);
        unlink(secret2);
    }

    ok(cx_auth_request(a, db, true, "carol", NULL, &p) == CX_OK && !strcmp(p.user, "carol") &&
           p.key_id[0] == '\0',
       "REMOTE_USER trusted when configured");
    ok(cx_auth_request(a, db, false, "carol", NULL, &p) == CX_ERR_UNAUTHORIZED,
       "REMOTE_USER ignored when not configured");
    {
        char hdr[80];
        snprintf(hdr, sizeof(hdr), "Bearer %s", key);
        ok(cx_auth_request(a, db, false, "carol", hdr, &p) == CX_OK && !strcmp(p.user, "bob"),
           "Bearer used when REMOTE_USER is not trusted");
        ok(cx_auth_request(a, db, true, "", hdr, &p) == CX_OK && !strcmp(p.user, "bob"),
           "an empty REMOTE_USER falls back to the key");
    }
    is_int(cx_auth_request(a, db, true, "a\rb", NULL, &p), CX_ERR_UNAUTHORIZED,
           "control characters in REMOTE_USER refused");

    ok(cx_auth_key_revoke(db, id) == CX_OK, "revoke");
    is_int(cx_auth_check_key(a, db, key, strlen(key), &p), CX_ERR_UNAUTHORIZED,
           "revoked key refused");
    is_int(cx_auth_key_revoke(db, id), CX_ERR_NOT_FOUND, "revoking twice is not found");
    is_int(cx_auth_key_revoke(db, "nope"), CX_ERR_NOT_FOUND, "malformed id is not found");
    is_int(cx_auth_key_create(a, db, "", NULL, false, key, id), CX_ERR_INVALID,
           "empty user refused");
    /* "svc:a" acting for "b" would be "svc" acting for "a:b" */
    is_int(cx_auth_key_create(a, db, "svc:a", NULL, CX_KEY_ON_BEHALF, key, id), CX_ERR_INVALID,
           "an on-behalf key for a user with ':' refused");
    ok(cx_auth_key_create(a, db, "svc:a", NULL, 0, key, id) == CX_OK,
       "a plain key for a user with ':' (an end user's own key)");

    cx_db_free(db);
    cx_auth_free(a);
    pgtest_drop();
    /* On-Behalf-Of: only an on-behalf key, a well-formed id, applied once */
    {
        struct cx_principal svc = {.user = "svc", .key_id = "k", .on_behalf = true}, plain = svc;
        struct cx_principal web = {.user = "web"};
        char m[CX_MSG_MAX], big[140];

        plain.on_behalf = false;
        ok(cx_auth_act_for(&svc, NULL, m, sizeof(m)) == CX_OK && !strcmp(svc.user, "svc"),
           "no header: the key's own user");
        ok(cx_auth_act_for(&svc, "alice@example.org", m, sizeof(m)) == CX_OK &&
               !strcmp(svc.user, "svc:alice@example.org"),
           "the end user: svc:alice@example.org");
        ok(cx_auth_act_for(&svc, "bob", m, sizeof(m)) == CX_ERR_FORBIDDEN, "applied once only");
        is_int(svc.owner_len, 3, "the key's own user is named (svc, for its share of threads)");
        ok(cx_auth_act_for(&plain, "bob", m, sizeof(m)) == CX_ERR_FORBIDDEN, "a plain key: 403");
        ok(cx_auth_act_for(&web, "bob", m, sizeof(m)) == CX_ERR_FORBIDDEN, "REMOTE_USER: 403");
        struct cx_principal old = {.user = "svc:a", .key_id = "k", .on_behalf = true};
        ok(cx_auth_act_for(&old, "b", m, sizeof(m)) == CX_ERR_FORBIDDEN &&
               !strcmp(old.user, "svc:a"),
           "an older on-behalf key whose user holds ':': 403, not svc acting for a:b");
        memset(big, 'x', 129);
        big[129] = '\0';
        static const char *const bad[] = {"", "a b", "a/b", "\xc3\xa9", "a\tb"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            struct cx_principal q = {.user = "svc", .key_id = "k", .on_behalf = true};
            ok(cx_auth_act_for(&q, bad[i], m, sizeof(m)) == CX_ERR_INVALID &&
                   !strcmp(q.user, "svc"),
               "malformed id %zu refused, the user unchanged", i);
        }
        struct cx_principal q = {.user = "svc", .key_id = "k", .on_behalf = true};
        ok(cx_auth_act_for(&q, big, m, sizeof(m)) == CX_ERR_INVALID, "129 characters refused");
        big[128] = '\0';
        ok(cx_auth_act_for(&q, big, m, sizeof(m)) == CX_OK, "128 accepted");
    }
    return tap_done();
}
