/* A whole library context for a unit test: the suite's PostgreSQL (a fresh
 * database), its Jupyter server, a fresh storage directory and secret, the
 * schema migrated. The parts are real; nothing is mocked. */
#ifndef CX_CXTEST_H
#define CX_CXTEST_H

#include <sodium.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../../lib/artifact.h"
#include "../../lib/auth.h"
#include "../../lib/config.h"
#include "../../lib/codexec.h"
#include "../../lib/log.h"
#include "pgtest.h"

struct cxtest {
    struct cx_config cfg;
    struct cx_auth *auth;
    struct cx_ctx cx;
    char dir[64]; /* storage and secret live here */
    char storage[96];
};

/* The gateway is not optional either: a missing URL is a failure. */
static inline const char *
cxtest_env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        printf("Bail out! %s is not set: run through packaging/quickstart test\n", name);
        tap_bail();
    }
    return v;
}

/* extra: more codexec.conf lines ("" for none). Bails out on any failure. */
static inline void
cxtest_open(struct cxtest *t, const char *tag, const char *extra)
{
    const char *conninfo = pgtest_create(tag);
    char conf[4096], secret[128], err[256];
    int applied = 0;

    memset(t, 0, sizeof(*t));
    if (cx_log_open(NULL, CX_LOG_ERR) || sodium_init() < 0) {
        printf("Bail out! log or libsodium\n");
        tap_bail();
    }
    snprintf(t->dir, sizeof(t->dir), "/tmp/cx-unit-%s-XXXXXX", tag);
    if (!mkdtemp(t->dir)) {
        printf("Bail out! mkdtemp\n");
        tap_bail();
    }
    snprintf(t->storage, sizeof(t->storage), "%s/storage", t->dir);
    snprintf(secret, sizeof(secret), "%s/secret", t->dir);
    mkdir(t->storage, 0700);
    snprintf(conf, sizeof(conf),
             "database = %s\ngateway_url = %s\ngateway_token = %s\nstorage_dir = %s\n"
             "secret_file = %s\n%s",
             conninfo, cxtest_env("CODEXEC_TEST_GATEWAY_URL"),
             cxtest_env("CODEXEC_TEST_GATEWAY_TOKEN"), t->storage, secret, extra);
    if (cx_config_parse(&t->cfg, "unit", conf, err, sizeof(err)) || cx_auth_secret_create(secret) ||
        cx_auth_new(secret, &t->auth) || cx_host_ctx_open(&t->cx, &t->cfg, t->auth) ||
        cx_host_migrate(&t->cx, &applied)) {
        printf("Bail out! the library context does not open: %s\n", err);
        tap_bail();
    }
}

static inline void
cxtest_close(struct cxtest *t)
{
    char cmd[128];

    cx_host_ctx_close(&t->cx);
    cx_host_shutdown();
    cx_auth_free(t->auth);
    cx_config_cleanup(&t->cfg);
    pgtest_drop();
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0)
        printf("# could not remove %s\n", t->dir);
    cx_log_close();
}

/* A principal as an API key would give it. */
static inline struct cx_principal
cxtest_principal(struct cxtest *t, const char *user)
{
    struct cx_principal p;
    char key[CX_KEY_CHARS + 1];

    memset(&p, 0, sizeof(p));
    if (cx_auth_key_create(t->auth, t->cx.db, user, "unit", false, key, p.key_id)) {
        printf("Bail out! key for %s\n", user);
        tap_bail();
    }
    snprintf(p.user, sizeof(p.user), "%s", user);
    return p;
}

/* A request body in memory, read in pieces of at most step bytes. */
struct cxtest_body {
    const char *data;
    size_t len, off, step;
};

static inline ssize_t
cxtest_read(void *ctx, void *buf, size_t want)
{
    struct cxtest_body *b = ctx;
    size_t n = b->len - b->off;

    if (n > want)
        n = want;
    if (b->step && n > b->step)
        n = b->step;
    memcpy(buf, b->data + b->off, n);
    b->off += n;
    return (ssize_t)n;
}

/* A raw upload of len bytes as filename into conversation cid. */
static inline enum cx_err
cxtest_upload(struct cxtest *t, const char *user, const char *cid, const char *filename,
              const char *data, size_t len, json_t **out, char *msg, size_t msglen)
{
    struct cxtest_body b = {data, len, 0, 7};
    char query[512], clen[32];

    snprintf(query, sizeof(query), "conversation_id=%s&filename=%s", cid, filename);
    snprintf(clen, sizeof(clen), "%zu", len);
    return cx_artifact_upload(&t->cx, user, query, "application/octet-stream", clen, cxtest_read,
                              &b, out, msg, msglen);
}

#endif
