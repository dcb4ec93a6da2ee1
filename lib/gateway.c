#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "gateway.h"
#include "log.h"
#include "metrics.h"
#include "util.h"

#define MAX_REST_BODY (16 * 1024 * 1024)

struct cx_gateway {
    CURL *curl;
    char *base;
    char *token;
    struct curl_slist *headers;
    struct cx_buf body;
    long timeout_ms; /* of the next calls */
    long base_ms;    /* what cx_gateway_timeout(gw, 0) comes back to */
};

static size_t
on_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    struct cx_buf *b = userdata;

    cx_buf_add(b, ptr, size * nmemb);
    return cx_buf_err(b) ? 0 : size * nmemb;
}

enum cx_err
cx_gateway_new(const char *url, const char *token, struct cx_gateway **out)
{
    struct cx_gateway *gw = NULL;
    char *auth = NULL;
    size_t n;

    gw = calloc(1, sizeof(*gw));
    if (!gw)
        return CX_ERR_NOMEM;
    cx_buf_init(&gw->body, MAX_REST_BODY);
    gw->timeout_ms = gw->base_ms = 120000;
    gw->base = strdup(url);
    if (!gw->base)
        goto fail;
    n = strlen(gw->base);
    while (n > 0 && gw->base[n - 1] == '/')
        gw->base[--n] = '\0';
    gw->curl = curl_easy_init();
    if (!gw->curl)
        goto fail;
    gw->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (!gw->headers)
        goto fail;
    gw->token = strdup(token ? token : "");
    if (!gw->token)
        goto fail;
    if (token && *token) {
        n = strlen(token) + sizeof("Authorization: token ");
        auth = malloc(n);
        if (!auth)
            goto fail;
        snprintf(auth, n, "Authorization: token %s", token);
        struct curl_slist *h = curl_slist_append(gw->headers, auth);
        memset(auth, 0, n);
        free(auth);
        if (!h)
            goto fail;
        gw->headers = h;
    }
    *out = gw;
    return CX_OK;
fail:
    cx_gateway_free(gw);
    return CX_ERR_NOMEM;
}

void
cx_gateway_free(struct cx_gateway *gw)
{
    if (!gw)
        return;
    if (gw->curl)
        curl_easy_cleanup(gw->curl);
    curl_slist_free_all(gw->headers); /* holds the token: libcurl frees it */
    free(gw->base);
    if (gw->token) {
        memset(gw->token, 0, strlen(gw->token));
        free(gw->token);
    }
    cx_buf_cleanup(&gw->body);
    free(gw);
}

enum cx_err
cx_gateway_call(struct cx_gateway *gw, const char *method, const char *path, json_t *body,
                long *status, json_t **resp, char *msg, size_t msglen)
{
    char url[2048];
    char *payload = NULL;
    CURLcode cc;
    CURL *c = gw->curl;
    enum cx_err rc = CX_OK;
    int n;

    *status = 0;
    if (resp)
        *resp = NULL;
    n = snprintf(url, sizeof(url), "%s%s", gw->base, path);
    if (n < 0 || (size_t)n >= sizeof(url))
        return CX_ERR_INVALID;
    if (body) {
        payload = json_dumps(body, JSON_COMPACT);
        if (!payload)
            return CX_ERR_NOMEM;
    }
    cx_buf_reset(&gw->body);
    cx_metrics_count(CX_COUNT_GATEWAY_REST);
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, gw->headers);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, gw->timeout_ms < 5000 ? gw->timeout_ms : 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, gw->timeout_ms);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &gw->body);
    if (payload) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
    } else if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 0L);
    }
    cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        if (msg)
            snprintf(msg, msglen, "gateway %s %s failed: %s", method, path, curl_easy_strerror(cc));
        cx_log_warn(0, "gateway %s %s failed: %s", method, path, curl_easy_strerror(cc));
        cx_metrics_count(CX_COUNT_GATEWAY_ERRORS);
        rc = cc == CURLE_OPERATION_TIMEDOUT ? CX_ERR_TIMEOUT : CX_ERR_GATEWAY;
        goto out;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    if (*status >= 500)
        cx_metrics_count(CX_COUNT_GATEWAY_ERRORS);
    if (resp && gw->body.len > 0)
        *resp = json_loadb(gw->body.data, gw->body.len, 0, NULL);
    if (msg && (*status < 200 || *status >= 300))
        snprintf(msg, msglen, "gateway %s %s answered %ld", method, path, *status);
out:
    free(payload);
    return rc;
}

enum cx_err
cx_gateway_ping(struct cx_gateway *gw, char *msg, size_t msglen)
{
    json_t *resp = NULL;
    long status;
    enum cx_err rc;

    /* Not GET /api (Jupyter Server answers it to anyone, a Kernel Gateway
     * behind a proxy may not serve it): the kernelspecs prove the gateway
     * and our token both. */
    rc = cx_gateway_call(gw, "GET", "/api/kernelspecs", NULL, &status, &resp, msg, msglen);
    if (rc)
        return rc;
    if (status == 401 || status == 403)
        snprintf(msg, msglen, "gateway refused our token (HTTP %ld)", status);
    else if (status == 200 && !json_is_object(json_object_get(resp, "kernelspecs")))
        snprintf(msg, msglen, "gateway GET /api/kernelspecs answered without kernelspecs");
    if (status != 200 || !json_is_object(json_object_get(resp, "kernelspecs")))
        rc = CX_ERR_GATEWAY;
    json_decref(resp);
    return rc;
}

const char *
cx_gateway_url(const struct cx_gateway *gw)
{
    return gw->base;
}

const char *
cx_gateway_token(const struct cx_gateway *gw)
{
    return gw->token;
}

/* Ids and paths we put in URLs are our own (uuids, "w-<uuid>"); refuse
 * anything else rather than escape it. */
static bool
url_safe(const char *s)
{
    if (!*s || strlen(s) > 200 || strstr(s, ".."))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == '.'))
            return false;
    return true;
}

/* method prefix<id>suffix */
static enum cx_err
simple(struct cx_gateway *gw, const char *method, const char *prefix, const char *id,
       const char *suffix, json_t *body, long *status, json_t **resp, char *msg, size_t msglen)
{
    char path[512];

    if (!url_safe(id))
        return CX_ERR_INVALID;
    snprintf(path, sizeof(path), "%s%s%s", prefix, id, suffix);
    return cx_gateway_call(gw, method, path, body, status, resp, msg, msglen);
}

enum cx_err
cx_gateway_kernel_start(struct cx_gateway *gw, const char *name, char id_out[64], char *msg,
                        size_t msglen)
{
    /* No "path": a kernel's workspace is the sandbox's own (a tmpfs), and
     * gateways other than Jupyter Server have no file system to name. */
    json_t *body = json_pack("{s:s}", "name", name), *resp = NULL;
    const char *id;
    long status = 0;
    enum cx_err rc;

    if (!body)
        return CX_ERR_NOMEM;
    rc = cx_gateway_call(gw, "POST", "/api/kernels", body, &status, &resp, msg, msglen);
    json_decref(body);
    if (rc == CX_OK && status != 201 && status != 200)
        rc = CX_ERR_GATEWAY;
    id = json_string_value(json_object_get(resp, "id"));
    if (rc == CX_OK && (!id || !url_safe(id) || strlen(id) >= 64)) {
        snprintf(msg, msglen, "gateway POST /api/kernels answered without a kernel id");
        rc = CX_ERR_GATEWAY;
    }
    if (rc == CX_OK)
        snprintf(id_out, 64, "%s", id);
    json_decref(resp);
    return rc;
}

/* DELETE prefix<id>: what is already gone is not an error. */
static enum cx_err
delete_gone_ok(struct cx_gateway *gw, const char *prefix, const char *id)
{
    long status = 0;
    enum cx_err rc = simple(gw, "DELETE", prefix, id, "", NULL, &status, NULL, NULL, 0);

    if (rc)
        return rc;
    return status == 204 || status == 200 || status == 404 ? CX_OK : CX_ERR_GATEWAY;
}

enum cx_err
cx_gateway_kernel_delete(struct cx_gateway *gw, const char *id)
{
    return delete_gone_ok(gw, "/api/kernels/", id);
}

static enum cx_err
kernel_post(struct cx_gateway *gw, const char *id, const char *action)
{
    long status = 0;
    enum cx_err rc = simple(gw, "POST", "/api/kernels/", id, action, NULL, &status, NULL, NULL, 0);

    if (rc)
        return rc;
    if (status == 404)
        return CX_ERR_NOT_FOUND;
    return status >= 200 && status < 300 ? CX_OK : CX_ERR_GATEWAY;
}

enum cx_err
cx_gateway_kernel_interrupt(struct cx_gateway *gw, const char *id)
{
    return kernel_post(gw, id, "/interrupt");
}

/* Jupyter Server answers 500, not 404, to a restart of a kernel it does not
 * know: a GET tells the two apart. */
enum cx_err
cx_gateway_kernel_restart(struct cx_gateway *gw, const char *id)
{
    enum cx_err rc = kernel_post(gw, id, "/restart");

    if (rc == CX_ERR_GATEWAY && cx_gateway_kernel_get(gw, id, NULL) == CX_ERR_NOT_FOUND)
        rc = CX_ERR_NOT_FOUND;
    return rc;
}

enum cx_err
cx_gateway_kernel_get(struct cx_gateway *gw, const char *id, json_t **model)
{
    long status = 0;
    enum cx_err rc = simple(gw, "GET", "/api/kernels/", id, "", NULL, &status, model, NULL, 0);

    if (rc)
        return rc;
    if (status == 404)
        rc = CX_ERR_NOT_FOUND;
    else if (status != 200)
        rc = CX_ERR_GATEWAY;
    if (rc && model) {
        json_decref(*model);
        *model = NULL;
    }
    return rc;
}

enum cx_err
cx_gateway_kernel_list(struct cx_gateway *gw, json_t **out)
{
    long status = 0;
    enum cx_err rc = cx_gateway_call(gw, "GET", "/api/kernels", NULL, &status, out, NULL, 0);

    if (rc == CX_OK && (status != 200 || !json_is_array(*out))) {
        json_decref(*out);
        *out = NULL;
        rc = CX_ERR_GATEWAY;
    }
    return rc;
}

enum cx_err
cx_gateway_kernelspecs(struct cx_gateway *gw, json_t **out)
{
    long status = 0;
    enum cx_err rc = cx_gateway_call(gw, "GET", "/api/kernelspecs", NULL, &status, out, NULL, 0);

    if (rc == CX_OK && status != 200) {
        json_decref(*out);
        *out = NULL;
        rc = CX_ERR_GATEWAY;
    }
    return rc;
}

void
cx_gateway_timeout(struct cx_gateway *gw, long ms)
{
    gw->timeout_ms = ms > 0 ? ms : gw->base_ms;
}

void
cx_gateway_default_timeout(struct cx_gateway *gw, long ms)
{
    gw->timeout_ms = gw->base_ms = ms > 0 ? ms : 120000;
}

/* Every process's view of each gateway's health: one probe at most every
 * PROBE_EVERY_MS per gateway, shared by the threads; while one thread
 * probes, the others take the last answer, except a recheck (a call that
 * just failed), which waits for the probe under way. */
#define PROBE_EVERY_MS   2000
#define PROBE_STALE_MS   4000 /* a caller probes itself past this: the refresher is late */
#define PROBE_TIMEOUT_MS 3000
#define MEMORY_FRESH_MS  10000 /* a memory report older than this says nothing */
#define MEMORY_ABSENT_MS 60000 /* a gateway without one is asked again after this */

static struct {
    char url[512];
    bool ok, probing;
    int64_t at;
    struct cx_gateway_memory mem; /* its last memory report */
    int64_t mem_at;               /* when it came (0: none) */
    int64_t mem_absent_at;        /* when the gateway said it has none (404) */
} probes[32];
static pthread_mutex_t probes_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t probes_done = PTHREAD_COND_INITIALIZER;

static int
probe_slot(const char *url)
{
    for (int i = 0; i < (int)(sizeof(probes) / sizeof(probes[0])); i++) {
        if (!strcmp(probes[i].url, url))
            return i;
        if (!probes[i].url[0]) {
            snprintf(probes[i].url, sizeof(probes[i].url), "%s", url);
            probes[i].ok = true; /* until a probe says otherwise */
            return i;
        }
    }
    return -1;
}

/* A JSON number as bytes: -1 for null or anything not a non-negative
 * integer below 2^62. */
static int64_t
json_bytes(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);

    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= (json_int_t)1 << 62)
        return -1;
    return (int64_t)json_integer_value(v);
}

/* GET /api/codexec/memory (codexec's gateway configuration): 1 with a
 * report, 0 when the gateway has none (404), -1 when it could not say. */
static int
ask_memory(struct cx_gateway *gw, struct cx_gateway_memory *m)
{
    json_t *r = NULL;
    long status = 0;
    int got = -1;

    if (cx_gateway_call(gw, "GET", "/api/codexec/memory", NULL, &status, &r, NULL, 0) == CX_OK) {
        if (status == 404)
            got = 0;
        else if (status == 200 && json_is_object(r) && json_bytes(r, "kernels") >= 0 &&
                 json_bytes(r, "available_bytes") >= 0) {
            m->kernels = (long)json_bytes(r, "kernels");
            m->kernels_bytes = json_bytes(r, "kernels_bytes");
            m->own_bytes = json_bytes(r, "kernels_own_bytes");
            m->limit_bytes = json_bytes(r, "kernels_limit_bytes");
            m->available_bytes = json_bytes(r, "available_bytes");
            m->total_bytes = json_bytes(r, "total_bytes");
            got = 1;
        }
    }
    json_decref(r);
    return got;
}

/* After a good probe: the gateway's memory report, unless it said lately
 * that it has none. */
static void
probe_memory(struct cx_gateway *gw, int i)
{
    struct cx_gateway_memory m;
    int64_t now = cx_now_ms();
    bool ask;
    int got;

    pthread_mutex_lock(&probes_lock);
    ask = !probes[i].mem_absent_at || now - probes[i].mem_absent_at >= MEMORY_ABSENT_MS;
    pthread_mutex_unlock(&probes_lock);
    if (!ask)
        return;
    got = ask_memory(gw, &m);
    pthread_mutex_lock(&probes_lock);
    if (got == 1) {
        probes[i].mem = m;
        probes[i].mem_at = cx_now_ms();
        probes[i].mem_absent_at = 0;
    } else if (got == 0) {
        probes[i].mem_at = 0;
        probes[i].mem_absent_at = cx_now_ms();
    }
    pthread_mutex_unlock(&probes_lock);
}

bool
cx_gateway_memory(struct cx_gateway *gw, struct cx_gateway_memory *out)
{
    bool fresh = false;
    int i;

    pthread_mutex_lock(&probes_lock);
    i = probe_slot(gw->base);
    if (i >= 0 && probes[i].ok && probes[i].mem_at &&
        cx_now_ms() - probes[i].mem_at < MEMORY_FRESH_MS) {
        *out = probes[i].mem;
        fresh = true;
    }
    pthread_mutex_unlock(&probes_lock);
    return fresh;
}

/* The shared answer for gw, probing first when it is older than max_age_ms
 * and no other thread is probing. */
static bool
usable(struct cx_gateway *gw, int64_t max_age_ms)
{
    json_t *specs = NULL;
    int64_t now = cx_now_ms();
    bool ok, probe;
    int i;

    pthread_mutex_lock(&probes_lock);
    i = probe_slot(gw->base);
    if (max_age_ms == 0)
        while (i >= 0 && probes[i].probing) /* its answer is as fresh as ours would be */
            pthread_cond_wait(&probes_done, &probes_lock);
    probe = i >= 0 && !probes[i].probing && now - probes[i].at >= max_age_ms;
    if (probe)
        probes[i].probing = true;
    ok = i < 0 || probes[i].ok;
    pthread_mutex_unlock(&probes_lock);
    if (!probe)
        return ok;
    cx_gateway_timeout(gw, PROBE_TIMEOUT_MS);
    ok = cx_gateway_kernelspecs(gw, &specs) == CX_OK; /* reachable, and takes our token */
    if (ok)
        probe_memory(gw, i);
    cx_gateway_timeout(gw, 0);
    json_decref(specs);
    pthread_mutex_lock(&probes_lock);
    if (probes[i].ok != ok)
        cx_log_warn(0, "gateway %s is %s", gw->base, ok ? "usable again" : "not usable");
    probes[i].ok = ok;
    probes[i].at = cx_now_ms();
    probes[i].probing = false;
    pthread_cond_broadcast(&probes_done);
    pthread_mutex_unlock(&probes_lock);
    return ok;
}

bool
cx_gateway_usable(struct cx_gateway *gw)
{
    return usable(gw, PROBE_STALE_MS);
}

void
cx_gateway_refresh(struct cx_gateway *gw)
{
    (void)usable(gw, PROBE_EVERY_MS);
}

bool
cx_gateway_recheck(struct cx_gateway *gw)
{
    return usable(gw, 0);
}

struct cx_gateway *
cx_ctx_gateway(const struct cx_ctx *cx, const char *url)
{
    for (unsigned i = 0; i < cx->ngws; i++)
        if (!strcmp(cx->gws[i]->base, url))
            return cx->gws[i];
    return NULL;
}
