#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/artifact.h"
#include "../lib/config.h"
#include "../lib/download.h"
#include "../lib/page.h"
#include "../lib/storage.h"
#include "../lib/health.h"
#include "../lib/log.h"
#include "../lib/metrics.h"
#include "../lib/http.h"
#include "../lib/run.h"
#include "../lib/session.h"
#include "handlers.h"

void
cx_h_health(struct cx_req *r)
{
    json_t *body = NULL;
    bool ok =
        cx_health_check(r->w->db, r->w->gw, r->w->cfg->kernel_name, r->w->cfg->storage_dir, &body);

    if (!ok) {
        json_object_set_new(body, "error",
                            json_pack("{s:s,s:s}", "code", "unavailable", "message",
                                      "a health check failed; see checks"));
        cx_req_header(r, "Retry-After", "5");
    }
    cx_req_send_json(r, ok ? 200 : 503, body);
    json_decref(body);
}

void
cx_h_metrics(struct cx_req *r)
{
    struct cx_buf b;

    cx_buf_init(&b, 4 * 1024 * 1024);
    cx_metrics_render(&b);
    if (cx_buf_err(&b))
        cx_req_send_lib_error(r, cx_buf_err(&b));
    else
        cx_req_send_text(r, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    cx_buf_cleanup(&b);
}

void
cx_h_runs_get(struct cx_req *r)
{
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_run_get(r->w->db, r->who.user, r->captures[0], &out);
    if (rc == CX_ERR_NOT_FOUND) {
        cx_req_send_error(r, 404, "not_found", "no such run");
        return;
    }
    if (rc) {
        cx_req_send_lib_error(r, rc);
        return;
    }
    cx_req_send_json(r, 200, out);
    json_decref(out);
}

static void
send_run_result(struct cx_req *r, enum cx_err rc, int status, json_t *out, const char *msg)
{
    if (rc == CX_OK) {
        cx_req_send_json(r, status, out);
        return;
    }
    switch (status) {
    case 400: cx_req_send_error(r, 400, "invalid_request", msg); break;
    case 403:
        cx_req_send_error(r, 403, "forbidden",
                          "a key that requires approval can't approve or reject runs");
        break;
    case 404:
        if (!strncmp(msg, "input artifact ", 15))
            cx_req_send_error(r, 404, "input_not_found", msg);
        else
            cx_req_send_error(r, 404, "not_found", "no such pending run");
        break;
    case 409: cx_req_send_error(r, 409, "conversation_busy", msg); break;
    case 410: cx_req_send_error(r, 410, "expired", "the run waited too long for approval"); break;
    case 429: cx_req_send_error(r, 429, "quota_exceeded", msg); break;
    case 502:
        cx_req_send_error(r, 502, "gateway_error", msg[0] ? msg : "the gateway failed");
        break;
    default: cx_req_send_lib_error(r, rc); break;
    }
}

void
cx_h_runs_create(struct cx_req *r)
{
    struct cx_run_request req;
    char msg[256] = "";
    json_t *body, *out = NULL;
    int status = 500;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    body = cx_req_json_body(r, r->w->cfg->max_body_bytes);
    if (!body)
        return;
    rc = cx_run_request_parse(r->w->cfg, body, &req, msg, sizeof(msg));
    json_decref(body);
    if (rc == CX_ERR_TOO_LARGE) {
        cx_req_send_error(r, 413, "payload_too_large", msg);
        return;
    }
    if (rc) {
        cx_req_send_error(r, 400, "invalid_request", msg);
        return;
    }
    rc = cx_run_submit(r->w, &r->who, &req, &status, &out, msg, sizeof(msg));
    send_run_result(r, rc, status, out, msg);
    json_decref(out);
    cx_run_request_cleanup(&req);
}

void
cx_h_runs_approve(struct cx_req *r)
{
    char msg[256] = "";
    json_t *out = NULL;
    int status = 500;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_run_approve(r->w, &r->who, r->captures[0], &status, &out, msg, sizeof(msg));
    send_run_result(r, rc, status, out, msg);
    json_decref(out);
}

void
cx_h_runs_reject(struct cx_req *r)
{
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_run_reject(r->w, &r->who, r->captures[0], &out);
    send_run_result(r, rc, cx_http_status_for(rc), out, "");
    json_decref(out);
}

void
cx_h_session_delete(struct cx_req *r)
{
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    if (!cx_run_conversation_id_valid(r->captures[0])) {
        cx_req_send_error(r, 404, "not_found", "no such session");
        return;
    }
    rc = cx_session_close(r->w, r->who.user, r->captures[0]);
    if (rc == CX_OK)
        cx_req_send_empty(r, 204);
    else if (rc == CX_ERR_NOT_FOUND)
        cx_req_send_error(r, 404, "not_found", "no such session");
    else if (rc == CX_ERR_CONFLICT)
        cx_req_send_error(r, 409, "conversation_busy", "a run holds this conversation");
    else
        cx_req_send_lib_error(r, rc);
}

void
cx_h_artifacts_list(struct cx_req *r)
{
    char cid[CX_CONVERSATION_MAX + 2];
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    if (cx_http_query_get(r->query, "conversation_id", cid, sizeof(cid)) ||
        !cx_run_conversation_id_valid(cid)) {
        cx_req_send_error(
            r, 400, "invalid_request",
            "conversation_id is required: 1 to 128 characters of A-Z a-z 0-9 . _ : -");
        return;
    }
    rc = cx_artifact_list(r->w, r->who.user, cid, &out);
    if (rc)
        cx_req_send_lib_error(r, rc);
    else
        cx_req_send_json(r, 200, out);
    json_decref(out);
}

void
cx_h_artifacts_get(struct cx_req *r)
{
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_artifact_get(r->w, r->who.user, r->captures[0], &out);
    if (rc == CX_ERR_NOT_FOUND)
        cx_req_send_error(r, 404, "not_found", "no such artifact");
    else if (rc)
        cx_req_send_lib_error(r, rc);
    else
        cx_req_send_json(r, 200, out);
    json_decref(out);
}

void
cx_h_artifacts_delete(struct cx_req *r)
{
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_artifact_delete(r->w, r->who.user, r->captures[0]);
    if (rc == CX_OK)
        cx_req_send_empty(r, 204);
    else if (rc == CX_ERR_NOT_FOUND)
        cx_req_send_error(r, 404, "not_found", "no such artifact");
    else
        cx_req_send_lib_error(r, rc);
}

void
cx_h_artifacts_upload(struct cx_req *r)
{
    char msg[200] = "";
    json_t *out = NULL;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    rc = cx_artifact_upload(r->w, r->who.user, r->query, cx_req_param(r, "CONTENT_TYPE"),
                            cx_req_param(r, "CONTENT_LENGTH"), cx_req_read, r->fr->in, &out, msg,
                            sizeof(msg));
    if (rc == CX_OK)
        cx_req_send_json(r, 201, out);
    else if (rc == CX_ERR_INVALID)
        cx_req_send_error(r, 400, "invalid_request", msg);
    else if (rc == CX_ERR_TOO_LARGE)
        cx_req_send_error(r, 413, "payload_too_large", msg);
    else if (rc == CX_ERR_QUOTA)
        cx_req_send_error(r, 429, "quota_exceeded", msg);
    else
        cx_req_send_lib_error(r, rc);
    json_decref(out);
}

static bool
query_version(struct cx_req *r, int *version)
{
    char v[16], *end;
    long n;

    *version = 0;
    switch (cx_http_query_get(r->query, "version", v, sizeof(v))) {
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

/* Who may read what: a valid signed link, else REMOTE_USER, else a key, the
 * key checked in the same statement that finds the artifact (one round trip
 * per download). Sends the error itself and returns false when no one may. */
static bool
content_resolve(struct cx_req *r, struct cx_download *d)
{
    char user[CX_USER_MAX + 1];
    const char *remote = cx_req_remote_user(r), *key;
    int version = 0;
    size_t len;
    enum cx_err rc = cx_link_verify(r->w, r->query, r->captures[0], user, &version);

    if (rc == CX_ERR_FORBIDDEN) {
        cx_req_send_error(r, 403, "forbidden", "this link is not valid");
        return false;
    }
    if (rc == CX_ERR_EXPIRED) {
        cx_req_send_error(r, 410, "expired", "this link has expired");
        return false;
    }
    if (rc != CX_OK && rc != CX_ERR_NOT_FOUND) {
        cx_req_send_lib_error(r, rc);
        return false;
    }
    if (rc == CX_ERR_NOT_FOUND && !query_version(r, &version)) {
        /* Credentials first: a 401 must not depend on the query. */
        if (cx_req_authenticate(r))
            cx_req_send_error(r, 400, "invalid_request", "version must be a positive integer");
        return false;
    }
    if (rc == CX_OK) {
        rc = cx_download_resolve(r->w, user, r->captures[0], version, d);
    } else if (remote) {
        if (!cx_req_authenticate(r))
            return false;
        rc = cx_download_resolve(r->w, r->who.user, r->captures[0], version, d);
    } else {
        rc = cx_auth_parse_bearer(cx_req_param(r, "HTTP_AUTHORIZATION"), &key, &len);
        if (rc == CX_OK)
            rc = cx_download_resolve_for_key(r->w, key, len, r->captures[0], version, &r->who, d);
        if (rc == CX_ERR_UNAUTHORIZED)
            return cx_req_auth_result(r, rc);
    }
    if (rc == CX_ERR_NOT_FOUND) {
        cx_req_send_error(r, 404, "not_found", "no such artifact");
        return false;
    }
    if (rc) {
        cx_req_send_lib_error(r, rc);
        return false;
    }
    return true;
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

static void
send_direct(struct cx_req *r, const struct cx_download *d, const char *path)
{
    uint64_t first = 0, last = d->size ? d->size - 1 : 0;
    enum cx_range range = cx_http_range(cx_req_param(r, "HTTP_RANGE"), d->size, &first, &last);
    char cr[96];
    int fd;

    if (range == CX_RANGE_UNSATISFIABLE) {
        snprintf(cr, sizeof(cr), "bytes */%llu", (unsigned long long)d->size);
        cx_req_header(r, "Content-Range", cr);
        cx_req_send_error(r, 416, "range_not_satisfiable", "the range is outside the file");
        return;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cx_log_err(errno, "open() of artifact %s version %d failed", d->artifact_id, d->version);
        cx_req_send_error(r, 500, "internal_error", "the artifact's bytes are missing");
        return;
    }
    if (range == CX_RANGE_ONE) {
        snprintf(cr, sizeof(cr), "bytes %llu-%llu/%llu", (unsigned long long)first,
                 (unsigned long long)last, (unsigned long long)d->size);
        cx_req_header(r, "Content-Range", cr);
        cx_req_send_head(r, 206, d->mime, (long long)(last - first + 1));
    } else {
        cx_req_send_head(r, 200, d->mime, (long long)d->size);
    }
    if (strcmp(r->method, "HEAD") != 0 && d->size > 0)
        (void)cx_req_send_file(r, fd, first, last); /* a short body tells the client */
    close(fd);
}

void
cx_h_artifacts_content(struct cx_req *r)
{
    const struct cx_config *cfg = r->w->cfg;
    struct cx_download d;
    char disp[1400], etag[70], date[32], path[4096];

    if (!content_resolve(r, &d))
        return;
    snprintf(etag, sizeof(etag), "\"%s\"", d.sha256);
    cx_http_date(d.created, date);
    cx_http_content_disposition(d.filename, disp, sizeof(disp));
    cx_req_header(r, "ETag", etag);
    cx_req_header(r, "Last-Modified", date);
    if (cfg->delivery != CX_DELIVERY_X_ACCEL)
        cx_req_header(r, "Accept-Ranges", "bytes"); /* nginx adds its own */
    cx_req_header(r, "Content-Disposition", disp);
    cx_req_header(r, "Content-Security-Policy", "sandbox; default-src 'none'");
    cx_req_header(r, "Cache-Control", "private");
    if (cx_http_etag_matches(cx_req_param(r, "HTTP_IF_NONE_MATCH"), d.sha256)) {
        cx_req_send_empty(r, 304);
        return;
    }
    if (cfg->delivery == CX_DELIVERY_X_ACCEL) {
        send_redirect(r, cfg->x_accel_prefix, d.key, d.mime); /* nginx sends it */
        return;
    }
    if (cx_storage_path(cfg->storage_dir, d.key, path, sizeof(path))) {
        cx_req_send_lib_error(r, CX_ERR_INTERNAL);
        return;
    }
    if (cfg->delivery == CX_DELIVERY_X_SENDFILE) {
        cx_req_header(r, "X-Sendfile", path); /* Apache mod_xsendfile, lighttpd */
        cx_req_send_head(r, 200, d.mime, -1);
        return;
    }
    send_direct(r, &d, path);
}

void
cx_h_artifacts_links(struct cx_req *r)
{
    const char *cl = cx_req_param(r, "CONTENT_LENGTH");
    char msg[160] = "";
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
    rc = cx_link_create(r->w, &r->who, r->captures[0], body, &out, msg, sizeof(msg));
    json_decref(body);
    if (rc == CX_OK)
        cx_req_send_json(r, 201, out);
    else if (rc == CX_ERR_INVALID)
        cx_req_send_error(r, 400, "invalid_request", msg);
    else if (rc == CX_ERR_NOT_FOUND)
        cx_req_send_error(r, 404, "not_found", "no such artifact");
    else
        cx_req_send_lib_error(r, rc);
    json_decref(out);
}

void
cx_h_artifacts_page(struct cx_req *r)
{
    struct cx_buf b;
    enum cx_err rc;

    if (!cx_req_authenticate(r))
        return;
    if (!cx_run_conversation_id_valid(r->captures[0])) {
        cx_req_send_error(r, 404, "not_found", "no such conversation");
        return;
    }
    cx_buf_init(&b, 16u << 20);
    rc = cx_page_artifacts(r->w, &r->who, r->captures[0], &b);
    if (rc) {
        cx_req_send_lib_error(r, rc);
    } else {
        cx_req_header(r, "Content-Security-Policy", CX_PAGE_CSP);
        cx_req_header(r, "Referrer-Policy", "no-referrer");
        cx_req_send_text(r, 200, "text/html; charset=utf-8", b.data, b.len);
    }
    cx_buf_cleanup(&b);
}
