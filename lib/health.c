#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "db.h"
#include "gateway.h"
#include "health.h"
#include "storage.h"
#include "util.h"

static void
record(json_t *checks, const char *name, int failed, const char *msg, int *all_ok)
{
    char text[320];

    if (!failed) {
        json_object_set_new(checks, name, json_string("ok"));
        return;
    }
    *all_ok = 0;
    snprintf(text, sizeof(text), "failed: %s", msg);
    json_object_set_new(checks, name, json_string(text));
}

/* One gateway: reachable, takes our token, has the kernelspec of every
 * language the server offers. msg says what failed. One call: GET
 * /api/kernelspecs, 3 s at most (a hung gateway is a failed check, soon). */
static enum cx_err
check_gateway(struct cx_gateway *gw, const struct cx_config *cfg, char *msg, size_t msglen)
{
    json_t *specs = NULL;
    enum cx_err rc;

    cx_gateway_timeout(gw, 3000);
    rc = cx_gateway_kernelspecs(gw, &specs);
    cx_gateway_timeout(gw, 0);
    if (rc)
        snprintf(msg, msglen, "GET /api/kernelspecs failed (gateway down, or our token refused)");
    for (int i = 0; rc == CX_OK && i < CX_LANG__COUNT; i++) {
        const char *name = cx_config_kernel_name(cfg, (enum cx_lang)i);

        if (name && !json_object_get(json_object_get(specs, "kernelspecs"), name)) {
            snprintf(msg, msglen, "kernelspec \"%.64s\" (%s) not found on the gateway", name,
                     cx_lang_name((enum cx_lang)i));
            rc = CX_ERR_NOT_FOUND;
        }
    }
    json_decref(specs);
    return rc;
}

/* "gateway": ok while at least one gateway can take kernels; "gateways":
 * each one's answer, by URL. */
static void
check_gateways(struct cx_ctx *cx, json_t *checks, int *ok)
{
    json_t *each = json_object();
    char msg[CX_MSG_MAX], first[CX_MSG_MAX] = "";
    unsigned usable = 0;

    for (unsigned i = 0; i < cx->ngws; i++) {
        int this_ok = 1;
        msg[0] = '\0';
        enum cx_err rc = check_gateway(cx->gws[i], cx->cfg, msg, sizeof(msg));
        record(each, cx->cfg->gateways[i].url, rc != 0, msg, &this_ok);
        usable += this_ok;
        if (rc && !first[0])
            snprintf(first, sizeof(first), "%s", msg);
    }
    record(checks, "gateway", usable == 0, first, ok);
    json_object_set_new(checks, "gateways", each);
}

/* The languages the server runs (those with a kernelspec configured). */
static json_t *
languages(const struct cx_config *cfg)
{
    json_t *list = json_array();

    for (int i = 0; list && i < CX_LANG__COUNT; i++)
        if (cx_config_kernel_name(cfg, (enum cx_lang)i))
            json_array_append_new(list, json_string(cx_lang_name((enum cx_lang)i)));
    return list;
}

static bool
check_now(struct cx_ctx *cx, json_t **out)
{
    char msg[CX_MSG_MAX];
    json_t *checks = json_object();
    int ok = 1, rc;

    rc = cx_db_ping(cx->db);
    record(checks, "postgresql", rc != 0, "cannot query PostgreSQL", &ok);
    check_gateways(cx, checks, &ok);
    msg[0] = '\0';
    rc = cx_storage_check_writable(cx->store, msg, sizeof(msg));
    record(checks, "storage", rc != 0, msg, &ok);
    *out = json_pack("{s:s,s:o,s:o}", "status", ok ? "ok" : "unavailable", "checks", checks,
                     "languages", languages(cx->cfg));
    return ok;
}

/* The last result, shared by every thread: a check costs a PostgreSQL
 * query, two gateway calls and a synced file, so it runs at most once a
 * second however often it is asked; while one thread refreshes it the
 * others answer the previous result rather than queue behind a slow
 * service. */
#define FRESH_MS 1000
#define STUCK_MS 10000

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cache_cond = PTHREAD_COND_INITIALIZER;
static json_t *cached;
static bool cached_ok, refreshing;
static int64_t cached_at, refresh_started;

bool
cx_health_check(struct cx_ctx *cx, json_t **out)
{
    json_t *fresh = NULL;
    bool ok;

    pthread_mutex_lock(&cache_lock);
    if (!refreshing && (!cached || cx_now_ms() - cached_at >= FRESH_MS)) {
        refreshing = true;
        refresh_started = cx_now_ms();
        pthread_mutex_unlock(&cache_lock);
        ok = check_now(cx, &fresh);
        pthread_mutex_lock(&cache_lock);
        if (fresh) {
            json_decref(cached);
            cached = fresh;
            cached_ok = ok;
            cached_at = cx_now_ms();
        }
        refreshing = false;
        pthread_cond_broadcast(&cache_cond);
    }
    while (!cached && refreshing)
        pthread_cond_wait(&cache_cond, &cache_lock); /* the very first check */
    if (refreshing && cx_now_ms() - refresh_started > STUCK_MS) {
        /* A refresh that does not come back (a service that hangs) is a
         * failure too: the old answer is not reported for ever. */
        pthread_mutex_unlock(&cache_lock);
        *out = json_pack("{s:s,s:{s:s}}", "status", "unavailable", "checks", "health",
                         "failed: the checks are not answering");
        return false;
    }
    ok = cached && cached_ok;
    *out = cached ? json_deep_copy(cached) : NULL;
    pthread_mutex_unlock(&cache_lock);
    return ok && *out;
}

void
cx_health_forget(void)
{
    pthread_mutex_lock(&cache_lock);
    json_decref(cached);
    cached = NULL;
    pthread_mutex_unlock(&cache_lock);
}

void
cx_health_redact(json_t *answer)
{
    json_t *checks = json_object_get(answer, "checks"), *v;
    const char *name;
    void *tmp;

    json_object_del(checks, "gateways");
    json_object_foreach_safe(checks, tmp, name, v)
    {
        const char *text = json_string_value(v);
        if (text && strncmp(text, "ok", 2))
            json_object_set_new(checks, name, json_string("failed"));
    }
}
