/* The route handlers: each authenticates, parses what the request carries,
 * makes one library call and answers. Decisions (who may read what, which
 * error it is) are the library's; the answer's status comes from one table
 * (cx_req_send_lib_error). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/codexec.h"
#include "handlers.h"

/* Answers a library call: status (201, 204, ...) with out on CX_OK, else
 * the error, with what for a plain "not found". */
static void
answer(struct cx_req *r, enum cx_err rc, int status, json_t *out, const char *msg, const char *what)
{
    if (rc == CX_OK && status == 204)
        cx_req_send_empty(r, 204);
    else if (rc == CX_OK)
        cx_req_send_json(r, status, out);
    else
        cx_req_send_lib_error(r, rc, msg && *msg ? msg : rc == CX_ERR_NOT_FOUND ? what : NULL);
    json_decref(out);
}

void
cx_h_health(struct cx_req *r)
{
    json_t *body = NULL;
    bool ok = cx_health_check(r->cx, &body);

    if (!body) {
        cx_req_send_lib_error(r, CX_ERR_NOMEM, NULL);
        return;
    }
    /* what failed and where (gateway URLs, storage errors) for operators
     * only; everyone else learns ok or failed */
    if (!cx_req_operator(r))
        cx_health_redact(body);
    if (!ok) {
        json_object_set_new(body, "error",
                            json_pack("{s:s,s:s}", "code", "unavailable", "message",
                                      "a health check failed; see checks"));
        cx_req_retry_after(r, CX_ERR_DB); /* as for a service that failed */
    }
    cx_req_send_json(r, ok ? 200 : 503, body);
    json_decref(body);
}

void
cx_h_metrics(struct cx_req *r)
{
    struct cx_buf b;

    if (!cx_req_operator(r)) {
        cx_req_send_error(r, 403, "forbidden",
                          r->cx->cfg->metrics_token
                              ? "metrics are served only with the operators' token"
                              : "metrics are served only to the addresses in metrics_allow");
        return;
    }
    cx_buf_init(&b, 4 * 1024 * 1024);
    cx_metrics_render(&b);
    cx_budget_metrics(r->cx, &b);
    if (cx_buf_err(&b))
        cx_req_send_lib_error(r, cx_buf_err(&b), NULL);
    else
        cx_req_send_text(r, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    cx_buf_cleanup(&b);
}

/* GET of the user's object named by the path: 200, or 404 saying what. */
static void
get_named(struct cx_req *r,
          enum cx_err (*fn)(struct cx_ctx *, const char *, const char *, json_t **),
          const char *what)
{
    json_t *out = NULL;

    if (cx_req_authenticate(r)) {
        enum cx_err rc = fn(r->cx, r->who.user, r->captures[0], &out); /* before out is read */
        answer(r, rc, 200, out, NULL, what);
    }
}

void
cx_h_runs_get(struct cx_req *r)
{
    get_named(r, cx_run_get, "no such run");
}

/* What a run's events do before its client hears them: a detached run is
 * answered 202 at its first event, which names it (after its
 * Idempotency-Key keeps that answer); a keyed one names its run to the
 * key; the rest go to the streaming client, if any. */
struct front {
    struct cx_req *r;
    struct cx_idem *idem;
    const struct cx_run_sink *inner; /* the stream's, or NULL */
    bool detach;
    bool named;    /* the run event was seen */
    bool answered; /* a detached run's 202 went out */
};

/* The 202 of a detached run (or its replay). */
static void
send_accepted(struct cx_req *r, const json_t *body)
{
    const char *run_id = json_string_value(json_object_get(body, "run_id"));
    const char *status = json_string_value(json_object_get(body, "status"));
    char location[64];

    if (run_id && status && !strcmp(status, "running") && strlen(run_id) < 40) {
        snprintf(location, sizeof(location), "/v1/runs/%s", run_id);
        cx_req_header(r, "Location", location);
    }
    cx_req_send_json(r, 202, (json_t *)body);
}

static bool
front_event(void *ctx, const char *name, json_t *data, unsigned id)
{
    struct front *f = ctx;
    const char *run_id = json_string_value(json_object_get(data, "run_id"));

    if (name && !strcmp(name, "run") && run_id && !f->named) {
        f->named = true;
        if (f->detach) {
            json_t *body = json_pack("{s:s,s:s}", "run_id", run_id, "status", "running");
            cx_idem_finish(f->idem, body ? 202 : 0, body);
            if (body)
                send_accepted(f->r, body);
            else
                cx_req_send_lib_error(f->r, CX_ERR_NOMEM, NULL); /* (the run goes on) */
            json_decref(body);
            cx_req_end_early(f->r);
            f->answered = true;
            return false;
        }
        cx_idem_run(f->idem, run_id);
    }
    return f->inner && f->inner->fn(f->inner->ctx, name, data, id);
}

/* The run's Idempotency-Key, its fingerprint the canonical body: a retry
 * of a run in progress waits for it as long as it may last. False when
 * answered (a replay, a refusal). */
static bool
run_idem(struct cx_req *r, const struct cx_run_request *req, struct cx_idem *id)
{
    const struct cx_config *cfg = r->cx->cfg;
    char msg[CX_MSG_MAX] = "", *body = json_dumps(req->root, JSON_SORT_KEYS | JSON_COMPACT);
    struct cx_buf what;
    enum cx_err rc;

    cx_buf_init(&what, 6 * (size_t)cfg->max_body_bytes + 64); /* (escapes grow it) */
    cx_buf_addf(&what, "POST /v1/runs\n%s", body ? body : "");
    free(body);
    rc = body ? cx_buf_err(&what) : CX_ERR_NOMEM;
    if (rc == CX_OK)
        rc = cx_idem_begin(r->cx, r->who.user, cx_req_param(r, "HTTP_IDEMPOTENCY_KEY"), what.data,
                           what.len, cfg->max_timeout + cfg->interrupt_grace + 60, id, msg,
                           sizeof(msg));
    cx_buf_cleanup(&what);
    if (rc)
        cx_req_send_lib_error(r, rc, msg);
    else if (id->replay && id->status == 202)
        send_accepted(r, id->answer);
    else if (id->replay)
        cx_req_send_json(r, id->status, id->answer);
    return rc == CX_OK && !id->replay;
}

/* On a run thread (cx_req_defer): the body, then the run: answered when
 * it ends, streamed (Accept: text/event-stream), or detached (wait false). */
static void
runs_create_run(struct cx_req *r)
{
    struct cx_run_request req;
    char msg[CX_MSG_MAX] = "";
    json_t *body, *out = NULL;
    struct cx_idem idem;
    struct cx_sse sse;
    struct cx_run_sink sse_sink, sink;
    struct front f = {.r = r, .idem = &idem};
    bool pending = false, streaming;
    enum cx_err rc;

    body = cx_req_json_body(r, r->cx->cfg->max_run_body_bytes < r->cx->cfg->max_body_bytes
                                   ? r->cx->cfg->max_run_body_bytes
                                   : r->cx->cfg->max_body_bytes);
    if (!body)
        return;
    rc = cx_run_request_parse(r->cx->cfg, body, &req, msg, sizeof(msg));
    json_decref(body);
    if (rc) {
        answer(r, rc, 200, NULL, msg, NULL);
        return;
    }
    if (!run_idem(r, &req, &idem)) {
        cx_idem_cleanup(&idem);
        cx_run_request_cleanup(&req);
        return;
    }
    f.detach = req.detach;
    streaming = !req.detach && cx_req_wants_events(r);
    if (streaming) {
        /* one run thread per stream, as for any run: it writes the events
         * itself while it waits for the kernel */
        cx_req_sse_sink(r, &sse, &sse_sink);
        f.inner = &sse_sink;
    }
    sink = (struct cx_run_sink){.fn = front_event, .ctx = &f};
    rc = cx_run_submit_stream(r->cx, &r->who, &req,
                              streaming || req.detach || idem.owner ? &sink : NULL, &out, &pending,
                              msg, sizeof(msg));
    cx_run_request_cleanup(&req);
    cx_idem_finish(&idem, rc ? 0 : pending ? 202 : 200, out);
    cx_idem_cleanup(&idem);
    if (f.answered)
        json_decref(out); /* (detached: its end is its record's) */
    else if (streaming) {
        cx_req_sse_end(&sse, rc, pending ? 202 : 200, out, msg);
        json_decref(out);
    } else
        answer(r, rc, pending ? 202 : 200, out, msg, NULL);
}

/* Runs take a run thread (lib/lane.h): the worker only authenticates, so
 * a user at max_concurrent_runs_per_user is told at once and the workers
 * stay free for everything else. */
void
cx_h_runs_create(struct cx_req *r)
{
    if (cx_req_authenticate(r))
        cx_req_defer(r, runs_create_run);
}

/* approve and reject: the same call shape, the run's id in the path. */
typedef enum cx_err (*decision_fn)(struct cx_ctx *, const struct cx_principal *, const char *,
                                   json_t **, char *, size_t);

static void
decide(struct cx_req *r, decision_fn fn)
{
    char msg[CX_MSG_MAX] = "";
    json_t *out = NULL;

    if (cx_req_authenticate(r)) {
        enum cx_err rc = fn(r->cx, &r->who, r->captures[0], &out, msg, sizeof(msg));
        answer(r, rc, 200, out, msg, NULL);
    }
}

/* On a run thread: the approved run. */
static void
runs_approve_run(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "";
    struct cx_sse sse;
    struct cx_run_sink sink;
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_wants_events(r)) {
        rc = cx_run_approve(r->cx, &r->who, r->captures[0], &out, msg, sizeof(msg));
        answer(r, rc, 200, out, msg, NULL);
        return;
    }
    cx_req_sse_sink(r, &sse, &sink);
    rc = cx_run_approve_stream(r->cx, &r->who, r->captures[0], &sink, &out, msg, sizeof(msg));
    cx_req_sse_end(&sse, rc, 200, out, msg);
    json_decref(out);
}

void
cx_h_runs_approve(struct cx_req *r)
{
    if (cx_req_authenticate(r))
        cx_req_defer(r, runs_approve_run);
}

void
cx_h_runs_reject(struct cx_req *r)
{
    decide(r, cx_run_reject);
}

void
cx_h_runs_cancel(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "";
    json_t *out = NULL;

    if (cx_req_authenticate(r)) {
        enum cx_err rc = cx_run_cancel(r->cx, r->who.user, r->captures[0], &out, msg, sizeof(msg));
        answer(r, rc, 202, out, msg, NULL);
    }
}

/* Last-Event-ID: the id of the last event the client has (digits), or
 * none. False (answered 400) when it is something else. */
static bool
last_event_id(struct cx_req *r, unsigned *after)
{
    const char *v = cx_req_param(r, "HTTP_LAST_EVENT_ID");
    size_t n = v ? strlen(v) : 0;

    *after = 0;
    if (!v || !*v)
        return true;
    if (n > 9 || strspn(v, "0123456789") != n) {
        cx_req_send_error(r, 400, "invalid_request", "Last-Event-ID must be an event's id");
        return false;
    }
    *after = (unsigned)strtoul(v, NULL, 10);
    return true;
}

/* The run's events from the start (or after Last-Event-ID), live while it
 * runs, its result last: on this request thread, bounded by the library. */
void
cx_h_runs_events(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "";
    struct cx_sse sse;
    struct cx_run_sink sink;
    unsigned after;
    enum cx_err rc;

    if (!cx_req_authenticate(r) || !last_event_id(r, &after))
        return;
    cx_req_sse_sink(r, &sse, &sink);
    rc = cx_run_events(r->cx, &r->who, r->captures[0], after, &sink, msg, sizeof(msg));
    if (rc == CX_OK && !sse.started) {
        rc = CX_ERR_BUSY; /* stopping before the stream began */
        snprintf(msg, sizeof(msg), "the server is stopping; retry shortly");
    }
    if (rc)
        cx_req_sse_end(&sse, rc, 200, NULL, msg);
}

/* DELETE of the user's object named by the path: 204, or 404 saying what. */
static void
delete_named(struct cx_req *r, enum cx_err (*fn)(struct cx_ctx *, const char *, const char *),
             const char *what)
{
    if (cx_req_authenticate(r))
        answer(r, fn(r->cx, r->who.user, r->captures[0]), 204, NULL, NULL, what);
}

void
cx_h_session_delete(struct cx_req *r)
{
    delete_named(r, cx_session_close, "no such session");
}

void
cx_h_artifacts_list(struct cx_req *r)
{
    char cid[CX_CONVERSATION_MAX + 2] = "";
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    if (cx_http_query_get(r->query, "conversation_id", cid, sizeof(cid)))
        cid[0] = '\0'; /* missing or malformed: the library says so */
    rc = cx_artifact_list(r->cx, r->who.user, cid, &out);
    answer(r, rc, 200, out, rc == CX_ERR_INVALID ? CX_CONVERSATION_RULE : NULL, NULL);
}

void
cx_h_artifacts_get(struct cx_req *r)
{
    get_named(r, cx_artifact_get, "no such artifact");
}

void
cx_h_artifacts_delete(struct cx_req *r)
{
    delete_named(r, cx_artifact_delete, "no such artifact");
}

/* The Idempotency-Key of a request with a streamed body: its fingerprint
 * the method, path, query, type and length, and then the body itself as
 * read (cx_idem_read, through which the caller reads it). False when
 * answered: a replay (whose body must be the first's), a refusal. */
static bool
streamed_idem(struct cx_req *r, struct cx_idem *id)
{
    const char *ctype = cx_req_param(r, "CONTENT_TYPE"), *clen = cx_req_param(r, "CONTENT_LENGTH");
    char msg[CX_MSG_MAX] = "";
    struct cx_buf what;
    enum cx_err rc;

    cx_buf_init(&what, sizeof(r->path) + 8192);
    cx_buf_addf(&what, "%s %s?%s\n%s\n%s", r->method, r->path, r->query, ctype ? ctype : "",
                clen ? clen : "");
    rc = cx_buf_err(&what);
    if (rc == CX_OK)
        rc = cx_idem_begin(r->cx, r->who.user, cx_req_param(r, "HTTP_IDEMPOTENCY_KEY"), what.data,
                           what.len, 0, id, msg, sizeof(msg));
    cx_buf_cleanup(&what);
    if (rc == CX_OK && id->replay)
        rc = cx_idem_check_body(id, cx_req_read, r->fr->in, r->cx->cfg->max_artifact_bytes);
    if (rc)
        cx_req_send_lib_error(r, rc, msg);
    else if (id->replay)
        cx_req_send_json(r, id->status, id->answer);
    cx_idem_reader(id, cx_req_read, r->fr->in);
    return rc == CX_OK && !id->replay;
}

/* The answer of a keyed request with a streamed body: kept, then sent. */
static void
streamed_answer(struct cx_req *r, struct cx_idem *id, enum cx_err rc, json_t *out, const char *msg,
                const char *what)
{
    cx_idem_finish(id, rc ? 0 : 201, out);
    cx_idem_cleanup(id);
    answer(r, rc, 201, out, msg, what);
}

void
cx_h_artifacts_upload(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "";
    struct cx_idem id;
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_req_body_begin(r, msg, sizeof(msg));
    if (rc) {
        cx_req_send_lib_error(r, rc, msg);
        return;
    }
    if (!streamed_idem(r, &id)) {
        cx_idem_cleanup(&id);
        return;
    }
    rc = cx_artifact_upload(r->cx, r->who.user, r->query, cx_req_param(r, "CONTENT_TYPE"),
                            cx_req_param(r, "CONTENT_LENGTH"), cx_idem_read, &id, &out, msg,
                            sizeof(msg));
    cx_req_body_done(r);
    streamed_answer(r, &id, rc, out, msg, NULL);
}

static void
send_redirect(struct cx_req *r, const char *prefix, const char *key, const char *mime)
{
    struct cx_buf loc;

    cx_buf_init(&loc, 8192);
    cx_buf_adds(&loc, prefix);
    cx_http_pct_encode(&loc, key, "-_.~/");
    if (!cx_buf_err(&loc))
        cx_req_header(r, "X-Accel-Redirect", loc.data);
    cx_buf_cleanup(&loc);
    cx_req_send_head(r, 200, mime, -1);
}

/* A direct download from an object store: the head goes out with the
 * first bytes, so a store that fails at once still gets a clean answer. */
struct from_store {
    struct cx_req *r;
    const struct cx_download *d;
    int status;
    uint64_t len, sent;
    bool sent_head, client_gone;
};

static bool
on_store_bytes(void *ctx, const void *data, size_t len)
{
    struct from_store *f = ctx;

    if (len > f->len - f->sent)
        return false; /* more than the object has (a store that ignored its size) */
    if (!f->sent_head) {
        cx_req_send_head(f->r, f->status, f->d->mime, (long long)f->len);
        f->sent_head = true;
    }
    if (!cx_req_send_bytes(f->r, data, len)) {
        f->client_gone = true;
        return false;
    }
    f->sent += len;
    return true;
}

static void
send_from_store(struct cx_req *r, const struct cx_download *d, int status, uint64_t first,
                uint64_t last)
{
    struct from_store f = {.r = r, .d = d, .status = status, .len = last - first + 1};
    enum cx_err rc;

    if (d->size == 0 || !strcmp(r->method, "HEAD")) {
        cx_req_send_head(r, status, d->mime, (long long)(d->size ? f.len : 0));
        return;
    }
    /* the whole object without a Range (a store may ignore one that
     * covers everything), a part with one */
    rc = cx_download_read(r->cx, d, first, status == 206 ? last : UINT64_MAX, on_store_bytes, &f);
    cx_metrics_add(CX_COUNT_DOWNLOAD_BYTES, f.sent);
    if (f.sent_head && (rc || f.sent != f.len))
        cx_req_cut(r); /* the head promised bytes that will not come */
    else if (f.sent_head)
        return;
    cx_req_forget_headers(r); /* not a download's: an error */
    if (rc == CX_ERR_NOT_FOUND)
        cx_req_send_lib_error(r, CX_ERR_IO, "the artifact's bytes are missing");
    else
        cx_req_send_lib_error(r, CX_ERR_TIMEOUT,
                              "the artifact storage is unavailable; retry later");
}

/* The request's Range against the version (docs/api.md, "Downloads"): CX_RANGE_ONE with
 * first..last, or the whole; an unsatisfiable one is answered here (416),
 * and false returned. */
static bool
want_range(struct cx_req *r, const struct cx_download *d, enum cx_range *range, uint64_t *first,
           uint64_t *last)
{
    char cr[96];

    *first = 0;
    *last = d->size ? d->size - 1 : 0;
    *range = cx_http_range(cx_req_param(r, "HTTP_RANGE"), d->size, first, last);
    if (*range == CX_RANGE_UNSATISFIABLE) {
        cx_req_forget_headers(r); /* an error's, not the download's */
        snprintf(cr, sizeof(cr), "bytes */%llu", (unsigned long long)d->size);
        cx_req_header(r, "Content-Range", cr);
        cx_req_send_error(r, 416, "range_not_satisfiable", "the range is outside the file");
        return false;
    }
    return true;
}

static void
send_direct(struct cx_req *r, const struct cx_download *d)
{
    uint64_t first, last;
    enum cx_range range;
    char cr[96];
    int fd;

    if (!want_range(r, d, &range, &first, &last))
        return;
    if (range == CX_RANGE_ONE) {
        snprintf(cr, sizeof(cr), "bytes %llu-%llu/%llu", (unsigned long long)first,
                 (unsigned long long)last, (unsigned long long)d->size);
        cx_req_header(r, "Content-Range", cr);
    }
    if (cx_download_from_store(r->cx)) {
        send_from_store(r, d, range == CX_RANGE_ONE ? 206 : 200, first, last);
        return;
    }
    if (cx_download_open(r->cx, d, &fd)) {
        cx_req_forget_headers(r);
        cx_req_send_lib_error(r, CX_ERR_IO, "the artifact's bytes are missing");
        return;
    }
    if (range == CX_RANGE_ONE) {
        cx_req_send_head(r, 206, d->mime, (long long)(last - first + 1));
    } else {
        cx_req_send_head(r, 200, d->mime, (long long)d->size);
    }
    if (strcmp(r->method, "HEAD") != 0 && d->size > 0 &&
        cx_req_send_file(r, fd, first, last)) /* a short body tells the client */
        cx_metrics_add(CX_COUNT_DOWNLOAD_BYTES, last - first + 1);
    close(fd);
}

/* A presigned URL of the object: a 302 for the browser (it is a bearer
 * token until it expires: never cached), or X-Accel-Redirect to nginx's
 * internal location that proxies to the store. */
static void
send_presigned(struct cx_req *r, const struct cx_download *d, bool for_browser)
{
    uint64_t first, last;
    enum cx_range range;
    char url[16384];
    const char *prefix = r->cx->cfg->x_accel_prefix;

    if (cx_download_presign(r->cx, d, for_browser, url, sizeof(url))) {
        cx_req_forget_headers(r);
        cx_req_send_lib_error(r, CX_ERR_INTERNAL, NULL);
        return;
    }
    if (for_browser) {
        cx_req_header(r, "Location", url);
        cx_req_send_empty(r, 302);
        return;
    }
    /* The exact path and query that were signed, for proxy_pass to use as
     * they are (nginx would decode an X-Accel-Redirect URI and encode it
     * again its own way), and the range as docs/api.md, "Downloads" reads the request's
     * (several ranges: the whole; unsatisfiable: 416 from here), not as
     * the store would: nginx/codexec-storage-s3.conf. */
    if (!want_range(r, d, &range, &first, &last))
        return;
    if (range == CX_RANGE_ONE) {
        char bytes[64];
        snprintf(bytes, sizeof(bytes), "bytes=%llu-%llu", (unsigned long long)first,
                 (unsigned long long)last);
        cx_req_header(r, "X-Codexec-S3-Range", bytes);
    }
    cx_req_header(r, "X-Codexec-S3-Path", url);
    cx_req_header(r, "X-Accel-Redirect", prefix);
    cx_req_send_head(r, 200, d->mime, -1);
}

/* The headers docs/api.md's Downloads promises. proxied: nginx fetches the bytes from the store and
 * puts the disposition on a success only (codexec-storage-s3.conf), as
 * the store's failure must not come as an attachment. */
static void
download_headers(struct cx_req *r, const struct cx_download *d, bool proxied)
{
    char disp[1400], etag[70], date[32];

    snprintf(etag, sizeof(etag), "\"%s\"", d->sha256);
    cx_http_date(d->created, date);
    cx_http_content_disposition(d->filename, disp, sizeof(disp));
    cx_req_header(r, "ETag", etag);
    cx_req_header(r, "Last-Modified", date);
    if (r->cx->cfg->delivery != CX_DELIVERY_X_ACCEL || cx_download_from_store(r->cx))
        cx_req_header(r, "Accept-Ranges", "bytes"); /* nginx adds its own to a file */
    cx_req_header(r, proxied ? "X-Codexec-S3-Disposition" : "Content-Disposition", disp);
    cx_req_header(r, "Content-Security-Policy", "sandbox; default-src 'none'");
    cx_req_header(r, "Cache-Control", "private");
}

void
cx_h_artifacts_content(struct cx_req *r)
{
    const struct cx_config *cfg = r->cx->cfg;
    struct cx_download_request q = {.id = r->captures[0],
                                    .query = r->query,
                                    .remote_user = cx_req_remote_user(r),
                                    .authorization = cx_req_param(r, "HTTP_AUTHORIZATION"),
                                    .on_behalf = cx_req_param(r, "HTTP_ON_BEHALF_OF")};
    struct cx_download d;
    char msg[CX_MSG_MAX] = "", path[4096];
    bool hit;
    enum cx_err rc = cx_download_authorize(r->cx, &q, &r->who, &d, msg, sizeof(msg));

    if (rc) {
        cx_req_send_lib_error(r, rc, msg);
        return;
    }
    if (cfg->delivery == CX_DELIVERY_REDIRECT && strcmp(r->method, "HEAD") != 0) {
        send_presigned(r, &d, true);
        return;
    }
    hit = cx_http_etag_matches(cx_req_param(r, "HTTP_IF_NONE_MATCH"), d.sha256);
    download_headers(r, &d,
                     !hit && cfg->delivery == CX_DELIVERY_X_ACCEL &&
                         cx_download_from_store(r->cx) && strcmp(r->method, "HEAD") != 0);
    if (hit)
        cx_req_send_empty(r, 304);
    else if (cx_download_from_store(r->cx) && !strcmp(r->method, "HEAD"))
        send_direct(r, &d); /* headers only (a presigned GET can't be a HEAD) */
    else if (cfg->delivery == CX_DELIVERY_X_ACCEL && cx_download_from_store(r->cx)) {
        send_presigned(r, &d, false); /* nginx fetches it from the store */
        cx_metrics_add(CX_COUNT_DOWNLOAD_BYTES, d.size);
    } else if (cfg->delivery == CX_DELIVERY_X_ACCEL) {
        send_redirect(r, cfg->x_accel_prefix, d.key, d.mime); /* nginx sends it */
        if (strcmp(r->method, "HEAD") != 0) /* (the whole file: nginx serves ranges itself) */
            cx_metrics_add(CX_COUNT_DOWNLOAD_BYTES, d.size);
    } else if (cfg->delivery == CX_DELIVERY_DIRECT)
        send_direct(r, &d);
    else if (cx_storage_path(r->cx->store, d.key, path, sizeof(path)))
        cx_req_send_lib_error(r, CX_ERR_INTERNAL, NULL);
    else {
        cx_req_header(r, "X-Sendfile", path); /* Apache mod_xsendfile, lighttpd */
        cx_req_send_head(r, 200, d.mime, -1);
        if (strcmp(r->method, "HEAD") != 0)
            cx_metrics_add(CX_COUNT_DOWNLOAD_BYTES, d.size);
    }
}

void
cx_h_artifacts_links(struct cx_req *r)
{
    const char *cl = cx_req_param(r, "CONTENT_LENGTH");
    char msg[CX_MSG_MAX] = "";
    json_t *body = NULL, *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    if (cl && cl[0] && strcmp(cl, "0") != 0) {
        body = cx_req_json_body(r, 65536);
        if (!body)
            return;
    } else if (!cx_req_json_type(r)) {
        return; /* an empty body too: the endpoint takes JSON */
    }
    rc = cx_link_create(r->cx, &r->who, r->captures[0], body, &out, msg, sizeof(msg));
    json_decref(body);
    answer(r, rc, 201, out, msg, "no such artifact");
}

void
cx_h_artifacts_page(struct cx_req *r)
{
    struct cx_buf b;
    enum cx_err rc;

    cx_buf_init(&b, 16u << 20);
    rc = cx_page_artifacts(r->cx, &r->who, r->captures[0], &b);
    if (rc) {
        cx_req_send_lib_error(r, rc, rc == CX_ERR_NOT_FOUND ? "no such conversation" : NULL);
    } else {
        cx_req_header(r, "Content-Security-Policy", CX_PAGE_CSP);
        cx_req_header(r, "Referrer-Policy", "no-referrer");
        cx_req_send_text(r, 200, "text/html; charset=utf-8", b.data, b.len);
    }
    cx_buf_cleanup(&b);
}

/* --- A conversation's files ------------------------------------------------ */

/* The workspace path of a files route (its "{**}"), decoded and checked;
 * false once the 400 is sent. */
static bool
file_path(struct cx_req *r, char path[CX_FILE_PATH_MAX + 1])
{
    char msg[CX_MSG_MAX] = "";
    enum cx_err rc = cx_files_path(r->path + r->rest, true, false, path, msg, sizeof(msg));

    if (rc)
        cx_req_send_lib_error(r, rc, msg);
    return rc == CX_OK;
}

void
cx_h_files_put(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "", path[CX_FILE_PATH_MAX + 1];
    json_t *out = NULL;
    enum cx_err rc;

    struct cx_idem id;

    if (!file_path(r, path))
        return;
    rc = cx_req_body_begin(r, msg, sizeof(msg)); /* (on a run thread: its stall timeout) */
    if (rc) {
        cx_req_send_lib_error(r, rc, msg);
        return;
    }
    if (!streamed_idem(r, &id)) {
        cx_idem_cleanup(&id);
        return;
    }
    rc = cx_files_write(r->cx, r->who.user, r->captures[0], path, cx_req_param(r, "CONTENT_LENGTH"),
                        cx_idem_read, &id, &out, msg, sizeof(msg));
    streamed_answer(r, &id, rc, out, msg, "no such conversation");
}

struct file_out {
    struct cx_req *r;
    bool not_modified;
};

static bool
file_head(void *ctx, uint64_t size, const char *sha256, const char *mime)
{
    struct file_out *f = ctx;
    char etag[70];

    snprintf(etag, sizeof(etag), "\"%s\"", sha256);
    cx_req_header(f->r, "ETag", etag);
    cx_req_header(f->r, "Content-Security-Policy", "sandbox; default-src 'none'");
    cx_req_header(f->r, "Cache-Control", "private, no-cache");
    if (cx_http_etag_matches(cx_req_param(f->r, "HTTP_IF_NONE_MATCH"), sha256)) {
        f->not_modified = true;
        cx_req_send_empty(f->r, 304);
        return false;
    }
    cx_req_send_head(f->r, 200, mime, (long long)size);
    return true;
}

static bool
file_data(void *ctx, const void *data, size_t len)
{
    return cx_req_send_bytes(((struct file_out *)ctx)->r, data, len);
}

void
cx_h_files_get(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "", path[CX_FILE_PATH_MAX + 1];
    struct file_out f = {.r = r};
    struct cx_files_reader rd = {file_head, file_data, &f, strcmp(r->method, "HEAD") != 0};
    enum cx_err rc;

    if (!file_path(r, path))
        return;
    rc = cx_files_read(r->cx, r->who.user, r->captures[0], path, &rd, msg, sizeof(msg));
    if (rc && r->status)
        cx_req_cut(r); /* the head promised bytes that will not come */
    else if (rc)
        cx_req_send_lib_error(r, rc, msg);
}

void
cx_h_files_delete(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "", path[CX_FILE_PATH_MAX + 1], rec[8] = "";
    enum cx_err rc;

    if (!file_path(r, path))
        return;
    if (cx_http_query_get(r->query, "recursive", rec, sizeof(rec)))
        rec[0] = '\0';
    rc = cx_files_delete(r->cx, r->who.user, r->captures[0], path, !strcmp(rec, "true"), msg,
                         sizeof(msg));
    answer(r, rc, 204, NULL, msg, "no such file");
}

void
cx_h_files_list(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "", raw[3 * CX_FILE_PATH_MAX + 1] = "", rec[8] = "";
    char dir[CX_FILE_PATH_MAX + 1];
    json_t *out = NULL;
    enum cx_err rc;

    /* the query's value is decoded once here: kept encoded for the check */
    rc = cx_http_query_get(r->query, "path", raw, sizeof(raw));
    if (rc == CX_OK || rc == CX_ERR_NOT_FOUND)
        rc = cx_files_path(rc == CX_OK ? raw : "", false, true, dir, msg, sizeof(msg));
    else
        rc = CX_ERR_INVALID_PATH;
    if (rc) {
        cx_req_send_lib_error(r, rc, msg);
        return;
    }
    if (cx_http_query_get(r->query, "recursive", rec, sizeof(rec)))
        rec[0] = '\0';
    rc = cx_files_list(r->cx, r->who.user, r->captures[0], dir, !strcmp(rec, "true"), &out, msg,
                       sizeof(msg));
    answer(r, rc, 200, out, msg, "no such directory");
}

/* --- Sessions ---------------------------------------------------------------- */

/* On a run thread (the router's lane): starting a kernel is a run's kind of work. */
void
cx_h_session_open(struct cx_req *r)
{
    const char *cl = cx_req_param(r, "CONTENT_LENGTH");
    char msg[CX_MSG_MAX] = "";
    json_t *body = NULL, *out = NULL;
    bool created = false;
    enum cx_err rc;

    if (cl && *cl && strcmp(cl, "0") != 0) {
        body = cx_req_json_body(r, r->cx->cfg->max_run_body_bytes);
        if (!body)
            return;
    }
    rc =
        cx_session_open(r->cx, r->who.user, r->captures[0], body, &out, &created, msg, sizeof(msg));
    json_decref(body);
    answer(r, rc, created ? 201 : 200, out, msg, NULL);
}

void
cx_h_session_get(struct cx_req *r)
{
    get_named(r, cx_session_get, "this conversation has no session");
}

void
cx_h_conversations_list(struct cx_req *r)
{
    json_t *out = NULL;

    if (cx_req_authenticate(r)) {
        enum cx_err rc = cx_session_list_live(r->cx, r->who.user, &out);
        answer(r, rc, 200, out, NULL, NULL);
    }
}

/* RAGFlow's executor manager answers its health without a key; codexec
 * wants the API's (the listener for RAGFlow adds it: codexec-ragflow.conf). */
void
cx_h_compat_ragflow_healthz(struct cx_req *r)
{
    json_t *out = NULL;
    bool ok;

    if (!cx_req_authenticate(r))
        return;
    ok = cx_compat_ragflow_health(r->cx, &out);
    if (!ok)
        cx_req_retry_after(r, CX_ERR_DB);
    answer(r, out ? CX_OK : CX_ERR_NOMEM, ok ? 200 : 503, out, NULL, NULL);
}

/* On a run thread (a lane route): the body, then the run. */
void
cx_h_compat_ragflow_run(struct cx_req *r)
{
    char msg[CX_MSG_MAX] = "";
    json_t *body = cx_req_json_body(r, r->cx->cfg->max_run_body_bytes), *out = NULL;
    enum cx_err rc;

    if (!body)
        return;
    rc = cx_compat_ragflow_run(r->cx, &r->who, body, &out, msg, sizeof(msg));
    json_decref(body);
    answer(r, rc, 200, out, msg, NULL);
}
