#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/artifact.h"
#include "../lib/config.h"
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
