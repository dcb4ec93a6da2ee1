/* RAGFlow's executor-manager protocol (SPEC §10.7, docs/integrations.md):
 * POST /compat/ragflow/run runs main(**arguments) in a fresh conversation,
 * answers RAGFlow's result fields mapped from codexec's outcome, returns
 * the files the code left in artifacts/ within RAGFlow's limits, and
 * closes the conversation. Each step is one call of the API's library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <sodium.h>

#include "config.h"
#include "mcp.h"
#include "util.h"

#define ART_MAX_FILES 10          /* RAGFlow's MAX_ARTIFACT_COUNT */
#define ART_MAX_BYTES (10u << 20) /* ... and MAX_ARTIFACT_SIZE */
#define ART_ALL_BYTES (32u << 20) /* what one answer carries in all */

static const struct {
    const char *ext, *mime;
} art_types[] = {
    {".png", "image/png"},         {".jpg", "image/jpeg"},      {".jpeg", "image/jpeg"},
    {".svg", "image/svg+xml"},     {".pdf", "application/pdf"}, {".csv", "text/csv"},
    {".json", "application/json"}, {".html", "text/html"},
};

/* The request: the code (base64 of UTF-8), its language, the arguments. */
struct rf_req {
    char *code;
    bool nodejs;
    json_t *arguments; /* borrowed */
};

static enum cx_err
bad(char *msg, size_t msglen, const char *why)
{
    snprintf(msg, msglen, "%s", why);
    return CX_ERR_INVALID;
}

static enum cx_err
parse(const struct cx_config *cfg, json_t *body, struct rf_req *q, char *msg, size_t msglen)
{
    const char *b64 = json_string_value(json_object_get(body, "code_b64"));
    const char *lang = json_string_value(json_object_get(body, "language"));
    json_t *args = json_object_get(body, "arguments"), *utf8;
    size_t n, cap;
    bool ok;

    if (!b64)
        return bad(msg, msglen, "code_b64 is required: the code, base64 of UTF-8");
    if (json_object_get(body, "language") && !lang)
        return bad(msg, msglen, "language must be python or nodejs");
    if (lang && strcmp(lang, "python") && strcmp(lang, "python3") && strcmp(lang, "nodejs") &&
        strcmp(lang, "javascript"))
        return bad(msg, msglen, "language must be python or nodejs");
    if (args && !json_is_null(args) && !json_is_object(args))
        return bad(msg, msglen, "arguments must be an object");
    q->nodejs = lang && (!strcmp(lang, "nodejs") || !strcmp(lang, "javascript"));
    q->arguments = json_is_object(args) ? args : NULL;
    cap = strlen(b64) / 4 * 3 + 3;
    if (cap > cfg->max_code_bytes + 3)
        return bad(msg, msglen, "the code is larger than max_code_bytes");
    q->code = malloc(cap + 1);
    if (!q->code)
        return CX_ERR_NOMEM;
    if (sodium_base642bin((unsigned char *)q->code, cap, b64, strlen(b64), NULL, &n, NULL,
                          sodium_base64_VARIANT_ORIGINAL))
        return bad(msg, msglen, "code_b64 is not base64");
    q->code[n] = '\0';
    utf8 = json_stringn(q->code, n); /* (which takes a NUL: checked apart) */
    ok = utf8 && !memchr(q->code, 0, n);
    json_decref(utf8);
    return ok ? CX_OK : bad(msg, msglen, "the code is not UTF-8 text");
}

/* --- The outcome in RAGFlow's words ----------------------------------------- */

static json_t *
answer_of(const char *status, const char *out, const char *err, int exit_code, const char *detail,
          json_t *time_ms)
{
    json_t *a = json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:n,s:[],s:n}", "status", status, "stdout", out,
                          "stderr", err, "exit_code", exit_code, "detail",
                          detail ? json_string(detail) : json_null(), "time_used_ms",
                          time_ms ? time_ms : json_null(), "memory_used_kb", "artifacts", "result");
    return a;
}

static const char *
str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));

    return s ? s : "";
}

/* A run that failed: RAGFlow's status, exit code and stderr. RAGFlow keeps
 * no stdout of a failed run (its tool takes any stdout for success). */
static json_t *
failed(const json_t *run, json_t *time_ms)
{
    const char *name = str(run, "error_name");
    struct cx_buf err;
    json_t *a;

    cx_buf_init(&err, 16u << 20);
    cx_buf_adds(&err, str(run, "stderr"));
    if (err.len && err.data[err.len - 1] != '\n')
        cx_buf_adds(&err, "\n");
    if (*str(run, "traceback"))
        cx_buf_addf(&err, "%s\n", str(run, "traceback"));
    else if (*str(run, "error"))
        cx_buf_addf(&err, "%s\n", str(run, "error"));
    if (!strcmp(name, "TimeoutError"))
        a = answer_of("resource_limit_exceeded", "", "Execution timeout", -124, "time", time_ms);
    else if (!strcmp(name, "MemoryError") || !strcmp(name, "KernelDied"))
        a = answer_of("resource_limit_exceeded", "", err.data ? err.data : "", -137, "memory",
                      time_ms);
    else if (!strcmp(name, "OutputLimitExceeded"))
        a = answer_of("resource_limit_exceeded", "", err.data ? err.data : "", 1, "output",
                      time_ms);
    else if (!strcmp(name, "Cancelled") || !strcmp(name, "Abandoned") ||
             !strcmp(name, "OutputLost") || !strcmp(name, "InputStagingFailed"))
        a = answer_of("runtime_error", "", err.data ? err.data : "", -1, name, time_ms);
    else
        a = answer_of("program_error", "", err.data ? err.data : "", 1, NULL, time_ms);
    cx_buf_cleanup(&err);
    return a;
}

static json_t *
outcome(const json_t *run)
{
    json_t *ms = json_object_get(run, "execution_ms"), *a;
    json_t *time_ms = json_is_integer(ms) ? json_real((double)json_integer_value(ms)) : NULL;

    if (strcmp(str(run, "status"), "ok") != 0)
        return failed(run, time_ms);
    a = answer_of("success", str(run, "stdout"), str(run, "stderr"), 0, NULL, time_ms);
    if (a && json_is_true(json_object_get(run, "result_present")))
        json_object_set_new(
            a, "result",
            json_pack("{s:b,s:O,s:s}", "present", 1, "value",
                      json_object_get(run, "result") ? json_object_get(run, "result") : json_null(),
                      "type", "json"));
    return a;
}

/* --- artifacts/ --------------------------------------------------------------- */

static const char *
art_mime(const char *name)
{
    const char *dot = strrchr(name, '.');

    for (size_t i = 0; dot && i < sizeof(art_types) / sizeof(art_types[0]); i++)
        if (!strcasecmp(dot, art_types[i].ext))
            return art_types[i].mime;
    return NULL;
}

struct grab {
    unsigned char *data;
    size_t len, cap;
    size_t budget; /* what the answer may still carry */
};

static bool
grab_head(void *ctx, uint64_t size, const char *sha256, const char *mime)
{
    struct grab *g = ctx;

    (void)sha256;
    (void)mime;
    /* the size the read says (the listing's may be stale, or a hostile
     * kernel's): RAGFlow leaves empty and large files out */
    if (size == 0 || size > ART_MAX_BYTES || size > g->budget)
        return false;
    g->data = malloc(size);
    g->cap = g->data ? (size_t)size : 0;
    return g->data != NULL;
}

static bool
grab_data(void *ctx, const void *data, size_t len)
{
    struct grab *g = ctx;

    if (len > g->cap - g->len)
        return false;
    memcpy(g->data + g->len, data, len);
    g->len += len;
    return true;
}

/* One file of artifacts/ as RAGFlow's artifact, or NULL to leave it out.
 * The listing is the kernel's: its paths are checked again here. */
static json_t *
artifact(struct cx_ctx *cx, const char *user, const char *cid, const json_t *e, size_t *budget)
{
    const char *path = str(e, "path"), *name = path + strlen("artifacts/"), *mime;
    struct grab g = {.budget = *budget};
    struct cx_files_reader rd = {grab_head, grab_data, &g, true};
    json_t *size = json_object_get(e, "size"), *a = NULL;
    char msg[CX_MSG_MAX];

    if (strncmp(path, "artifacts/", strlen("artifacts/")) != 0 || !*name || strchr(name, '/'))
        return NULL;
    mime = art_mime(name);
    if (!mime || name[0] == '.' || strcmp(str(e, "type"), "file") != 0 || !json_is_integer(size) ||
        json_integer_value(size) <= 0 || (uint64_t)json_integer_value(size) > ART_MAX_BYTES ||
        (uint64_t)json_integer_value(size) > *budget)
        return NULL;
    if (cx_files_read(cx, user, cid, path, &rd, msg, sizeof(msg)) == CX_OK && g.data &&
        g.len == g.cap) {
        a = json_pack("{s:s,s:s,s:I,s:o}", "name", name, "mime_type", mime, "size",
                      (json_int_t)g.len, "content_b64", cx_mcp_base64(g.data, g.len));
        *budget -= g.len; /* (g.len <= g.budget = *budget) */
    }
    free(g.data);
    return a;
}

/* The regular files directly in artifacts/, by name: the first ten, of
 * RAGFlow's types, each at most 10 MiB, 32 MiB in all, read within
 * ragflow_timeout (a kernel that trickles them holds no thread longer). */
static json_t *
artifacts(struct cx_ctx *cx, const char *user, const char *cid)
{
    json_t *list = NULL, *files, *out = json_array();
    size_t budget = ART_ALL_BYTES, seen = 0;
    int64_t until = cx_now_us() + (int64_t)cx->cfg->ragflow_timeout * 1000000;
    char msg[CX_MSG_MAX];

    if (!out || cx_files_list(cx, user, cid, "artifacts", false, &list, msg, sizeof(msg)))
        return out; /* no artifacts/: none */
    files = json_object_get(list, "files");
    for (size_t i = 0; i < json_array_size(files) && seen < ART_MAX_FILES && cx_now_us() < until;
         i++) {
        const json_t *e = json_array_get(files, i);
        json_t *a;

        if (strcmp(str(e, "type"), "file") != 0)
            continue;
        seen++;
        a = artifact(cx, user, cid, e, &budget);
        if (a)
            json_array_append_new(out, a);
    }
    json_decref(list);
    return out;
}

/* --- The call -------------------------------------------------------------- */

static json_t *
unavailable(const char *why, const char *detail)
{
    return answer_of("runtime_error", "", why, -1, detail, NULL);
}

/* main(**arguments) in Python, main(arguments) in JavaScript. */
static enum cx_err
run_main(struct cx_ctx *cx, const struct cx_principal *who, const struct rf_req *q, const char *cid,
         json_t **run, char *msg, size_t msglen)
{
    struct cx_run_request req;
    /* (a session close that finds it held leaves it to this TTL) */
    json_t *body = json_pack(
        "{s:s,s:s,s:s,s:b,s:s,s:o,s:i,s:i}", "conversation_id", cid, "code", q->code, "language",
        q->nodejs ? "javascript" : "python", "capture_artifacts", 0, "output", "full", "arguments",
        q->arguments ? json_incref(q->arguments) : json_object(), "timeout",
        (int)cx->cfg->ragflow_timeout, "ttl", (int)cx->cfg->ragflow_timeout + 60);
    bool pending = false;
    enum cx_err rc;

    if (!body)
        return CX_ERR_NOMEM;
    rc = cx_run_request_parse(cx->cfg, body, &req, msg, msglen);
    json_decref(body);
    if (rc == CX_OK) {
        rc = cx_run_submit_stream(cx, who, &req, NULL, run, &pending, msg, msglen);
        cx_run_request_cleanup(&req);
    }
    if (rc == CX_OK && pending) {
        snprintf(msg, msglen, "the run waits for approval (this key requires it)");
        json_decref(*run);
        *run = NULL;
        rc = CX_ERR_FORBIDDEN;
    }
    return rc;
}

enum cx_err
cx_compat_ragflow_run(struct cx_ctx *cx, const struct cx_principal *who, json_t *body, json_t **out,
                      char *msg, size_t msglen)
{
    struct rf_req q = {0};
    char cid[64], id[33];
    json_t *run = NULL;
    enum cx_err rc;

    *out = NULL;
    rc = parse(cx->cfg, body, &q, msg, msglen);
    if (rc == CX_OK && q.nodejs && !cx_config_kernel_name(cx->cfg, CX_LANG_JAVASCRIPT))
        *out = unavailable("nodejs is not available on this codexec server "
                           "(kernel_name_javascript is not set)",
                           "language_unavailable");
    else if (rc == CX_OK) {
        cx_random_id(id);
        snprintf(cid, sizeof(cid), "ragflow-run-%s", id);
        rc = run_main(cx, who, &q, cid, &run, msg, msglen);
        if (rc == CX_OK && (*out = outcome(run)) && !strcmp(str(*out, "status"), "success"))
            json_object_set_new(*out, "artifacts", artifacts(cx, who->user, cid));
        if (cx_session_close(cx, who->user, cid) == CX_ERR_CONFLICT)
            cx_log_warn(0, "ragflow: a run's conversation is still held; its TTL ends it");
    }
    free(q.code);
    json_decref(run);
    if (rc == CX_OK && !*out)
        rc = CX_ERR_NOMEM;
    return rc;
}

bool
cx_compat_ragflow_health(struct cx_ctx *cx, json_t **out)
{
    json_t *h = NULL;
    bool ok = cx_health_check(cx, &h);

    json_decref(h);
    *out = json_pack("{s:s}", "status", ok ? "ok" : "unavailable");
    return ok;
}
