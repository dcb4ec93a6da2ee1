/* codexec-fcgi: /mcp, the Model Context Protocol's Streamable HTTP
 * transport (SPEC §10.6; docs/mcp.md). One JSON-RPC message a POST,
 * answered as application/json, or as text/event-stream when a run_code
 * call reports progress; notifications and responses 202; DELETE ends the
 * session; GET has no stream to give (the router answers 405). What the
 * messages mean is the library's (lib/mcp.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/codexec.h"
#include "handlers.h"

/* What a request carries from the worker to a run thread. */
struct mcp_state {
    struct cx_mcp_msg m;
    struct cx_mcp_session s;
};

static void
state_free(void *p)
{
    struct mcp_state *st = p;

    cx_mcp_msg_cleanup(&st->m);
    free(st);
}

/* A JSON-RPC error with HTTP status: the transport's own (no message, no
 * id) or a call's (m's id). */
static void
send_rpc_error(struct cx_req *r, int status, const struct cx_mcp_msg *m, enum cx_err rc,
               const char *msg)
{
    json_t *data = cx_req_error_data(rc, NULL);
    json_t *e = cx_mcp_error(m, rc, msg, data);

    if (status == 401)
        cx_req_header(r, "WWW-Authenticate", "Bearer");
    cx_req_retry_after(r, rc);
    if (e)
        cx_req_send_json(r, status, e);
    else
        cx_req_send_lib_error(r, CX_ERR_NOMEM, NULL);
    json_decref(e);
    json_decref(data);
}

/* What links start with: public_url, else the request's own scheme and
 * Host (a client's Host misleads only that client). */
static void
base_url(struct cx_req *r, char *out, size_t outlen)
{
    const char *host = cx_req_param(r, "HTTP_HOST"), *https = cx_req_param(r, "HTTPS");
    const char *scheme = cx_req_param(r, "REQUEST_SCHEME"), *port;

    if (r->cx->cfg->public_url[0]) {
        snprintf(out, outlen, "%s", r->cx->cfg->public_url);
        return;
    }
    if (!host || !*host || strlen(host) > 255 || !cx_name_chars(host, strlen(host), ".-:[]"))
        host = "localhost";
    if (https && (!strcmp(https, "on") || !strcmp(https, "1")))
        scheme = "https";
    if (!scheme || (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
        scheme = "http";
    /* nginx passes $host, without the port: the port it listens on, then */
    port = cx_req_param(r, "SERVER_PORT");
    if (strchr(host, ':') || !port || strspn(port, "0123456789") != strlen(port) ||
        strlen(port) > 5 || !strcmp(port, !strcmp(scheme, "https") ? "443" : "80"))
        port = NULL;
    snprintf(out, outlen, "%s://%s%s%s", scheme, host, port ? ":" : "", port ? port : "");
}

/* A call's notifications as events of the answer's stream. */
static bool
to_stream(void *ctx, json_t *message)
{
    const struct cx_run_sink *sse = ctx;

    return sse->fn(sse->ctx, message ? "message" : NULL, message, 0);
}

/* Answers the request: its result (or error) as JSON, or as the last
 * event of a stream its progress began. */
static void
answer(struct cx_req *r, struct mcp_state *st)
{
    char msg[CX_MSG_MAX] = "", base[600];
    struct cx_sse sse = {.r = r};
    struct cx_run_sink events;
    struct cx_mcp_sink sink = {.fn = to_stream, .ctx = &events};
    bool streams = cx_mcp_streams(&st->m) && cx_req_wants_events(r);
    json_t *out = NULL;
    enum cx_err rc;

    base_url(r, base, sizeof(base));
    if (streams)
        cx_req_sse_sink(r, &sse, &events);
    rc = cx_mcp_request(r->cx, &r->who, &st->s, &st->m, base, streams ? &sink : NULL, &out, msg,
                        sizeof(msg));
    if (rc) {
        json_t *data = cx_req_error_data(rc, NULL);
        out = cx_mcp_error(&st->m, rc, msg, data);
        json_decref(data);
    }
    if (!strcmp(st->m.method, "initialize") && rc == CX_OK)
        cx_req_header(r, "Mcp-Session-Id", st->s.id);
    cx_lane_answered();
    if (!out && sse.started)
        cx_req_cut(r); /* nothing valid can end the stream */
    else if (!out)
        cx_req_send_lib_error(r, CX_ERR_NOMEM, NULL);
    else if (sse.started)
        (void)events.fn(events.ctx, "message", out, 0);
    else
        cx_req_send_json(r, 200, out);
    json_decref(out);
}

/* On a run thread: a call that works a conversation's kernel. */
static void
answer_on_lane(struct cx_req *r)
{
    answer(r, r->state);
}

/* The session the request names: found, or none for initialize (which
 * must not name one). False when answered (400, 404, 503). */
static bool
session_of(struct cx_req *r, struct mcp_state *st)
{
    const char *sid = cx_req_param(r, "HTTP_MCP_SESSION_ID");
    bool init = st->m.method && !strcmp(st->m.method, "initialize");
    enum cx_err rc;

    if (init && sid) {
        send_rpc_error(r, 400, NULL, CX_ERR_INVALID,
                       "initialize starts a session: send it without Mcp-Session-Id");
        return false;
    }
    if (init)
        return true;
    if (!sid || !*sid) {
        send_rpc_error(r, 400, NULL, CX_ERR_INVALID,
                       "Mcp-Session-Id is required (initialize first)");
        return false;
    }
    rc = cx_mcp_session_find(r->cx, &r->who, sid, &st->s);
    if (rc == CX_ERR_NOT_FOUND)
        send_rpc_error(r, 404, NULL, rc,
                       "no such MCP session (it ended or expired): initialize again");
    else if (rc)
        send_rpc_error(r, 503, NULL, rc, NULL);
    return rc == CX_OK;
}

/* A browser's request from an allowed Origin: what CORS lets it read. */
static void
cors(struct cx_req *r, const char *origin)
{
    if (!origin)
        return;
    cx_req_header(r, "Access-Control-Allow-Origin", origin);
    cx_req_header(r, "Access-Control-Expose-Headers", "Mcp-Session-Id");
    cx_req_header(r, "Vary", "Origin");
}

/* The checks every /mcp request passes first: Origin, then the key. */
static bool
admitted(struct cx_req *r)
{
    const char *origin = cx_req_param(r, "HTTP_ORIGIN");

    if (!cx_mcp_origin_allowed(r->cx->cfg, origin)) {
        send_rpc_error(r, 403, NULL, CX_ERR_FORBIDDEN,
                       "this Origin may not use /mcp (mcp_allowed_origins)");
        return false;
    }
    cors(r, origin);
    return cx_req_authenticate(r);
}

/* A browser's preflight, from an allowed Origin (no key: browsers send
 * none with it). */
void
cx_h_mcp_options(struct cx_req *r)
{
    const char *origin = cx_req_param(r, "HTTP_ORIGIN");

    if (!origin || !cx_mcp_origin_allowed(r->cx->cfg, origin)) {
        send_rpc_error(r, 403, NULL, CX_ERR_FORBIDDEN,
                       "this Origin may not use /mcp (mcp_allowed_origins)");
        return;
    }
    cors(r, origin);
    cx_req_header(r, "Access-Control-Allow-Methods", "POST, DELETE");
    cx_req_header(r, "Access-Control-Allow-Headers",
                  "Authorization, Content-Type, Accept, Mcp-Session-Id, MCP-Protocol-Version, "
                  "Last-Event-ID, On-Behalf-Of");
    cx_req_header(r, "Access-Control-Max-Age", "600");
    cx_req_send_empty(r, 204);
}

/* The body, read and parsed; false when answered. */
static bool
read_message(struct cx_req *r, struct mcp_state *st)
{
    uint64_t max = r->cx->cfg->max_run_body_bytes;
    char *body = NULL;
    size_t len = 0;
    json_t *error = NULL;
    char busy[CX_MSG_MAX] = "";
    enum cx_err rc;

    if (!cx_req_json_type(r))
        return false;
    rc = cx_req_body_begin(r, busy, sizeof(busy));
    if (rc) {
        send_rpc_error(r, 503, NULL, rc, busy); /* (the transport's: no call read) */
        return false;
    }
    rc = cx_http_read_body(cx_req_read, r->fr->in, cx_req_param(r, "CONTENT_LENGTH"), max, &body,
                           &len);
    cx_req_body_done(r);
    if (rc) {
        send_rpc_error(r, rc == CX_ERR_TOO_LARGE ? 413 : 400, NULL, rc,
                       rc == CX_ERR_TOO_LARGE ? "the message exceeds max_run_body_bytes"
                                              : "the message could not be read");
        free(body);
        return false;
    }
    rc = cx_mcp_parse(body, len, &st->m, &error);
    free(body);
    if (rc) {
        if (error)
            cx_req_send_json(r, 400, error);
        else
            cx_req_send_lib_error(r, CX_ERR_NOMEM, NULL);
        json_decref(error);
        return false;
    }
    return true;
}

/* The run lane refused the call (the user's runs at their limit, the
 * lane full, a wait too long): the call's JSON-RPC error, answered 200 as
 * the other problems of a call are (docs/mcp.md; its data has the HTTP
 * status, and Retry-After is sent), not the API's error object, which an
 * MCP client reads as a broken transport. */
static void
refuse_on_lane(struct cx_req *r, int status, enum cx_err rc, const char *msg)
{
    const struct mcp_state *st = r->state;

    (void)status;
    send_rpc_error(r, 200, st ? &st->m : NULL, rc, msg);
}

void
cx_h_mcp_post(struct cx_req *r)
{
    struct mcp_state *st;

    if (!admitted(r))
        return;
    if (!cx_mcp_version_ok(cx_req_param(r, "HTTP_MCP_PROTOCOL_VERSION"))) {
        send_rpc_error(r, 400, NULL, CX_ERR_INVALID,
                       "unsupported MCP-Protocol-Version (2025-11-25, 2025-06-18, 2025-03-26)");
        return;
    }
    st = calloc(1, sizeof(*st));
    if (!st) {
        cx_req_send_lib_error(r, CX_ERR_NOMEM, NULL);
        return;
    }
    r->state = st;
    r->state_free = state_free;
    if (!read_message(r, st) || !session_of(r, st))
        return;
    if (st->s.version[0] && cx_req_param(r, "HTTP_MCP_PROTOCOL_VERSION") &&
        strcmp(cx_req_param(r, "HTTP_MCP_PROTOCOL_VERSION"), st->s.version) != 0) {
        send_rpc_error(r, 400, NULL, CX_ERR_INVALID,
                       "MCP-Protocol-Version is not the version this session agreed on");
        return;
    }
    if (!st->m.method || !st->m.id) {
        /* a notification (cancelled: its call's run ends) or a response */
        if (st->m.method)
            cx_mcp_notify(r->cx, &r->who, &st->s, &st->m);
        cx_req_send_empty(r, 202);
    } else if (cx_mcp_on_lane(&st->m)) {
        r->refuse = refuse_on_lane;
        (void)cx_req_defer(r, answer_on_lane);
    } else {
        answer(r, st);
    }
}

void
cx_h_mcp_delete(struct cx_req *r)
{
    const char *sid = cx_req_param(r, "HTTP_MCP_SESSION_ID");
    enum cx_err rc;

    if (!admitted(r))
        return;
    if (!sid || !*sid) {
        send_rpc_error(r, 400, NULL, CX_ERR_INVALID, "Mcp-Session-Id is required");
        return;
    }
    rc = cx_mcp_session_end(r->cx, &r->who, sid);
    if (rc == CX_OK)
        cx_req_send_empty(r, 204);
    else if (rc == CX_ERR_NOT_FOUND)
        send_rpc_error(r, 404, NULL, rc, "no such MCP session");
    else
        send_rpc_error(r, 503, NULL, rc, NULL);
}
