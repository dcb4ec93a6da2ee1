/* codexec-fcgi: one request's view of FastCGI, and the response writers. */
#ifndef CX_FCGI_REQUEST_H
#define CX_FCGI_REQUEST_H

#include <fcgiapp.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "../lib/codexec.h"

#define CX_MAX_CAPTURES 2

struct cx_req {
    FCGX_Request *fr;
    struct cx_ctx *cx; /* the worker thread's library context */
    const char *method;
    char path[16384];  /* as sent (percent-encoded): a workspace path is up to 4096 bytes */
    const char *query; /* "" when absent */
    const char *route; /* metrics label, a static string */
    char captures[CX_MAX_CAPTURES][160];
    size_t rest; /* where a route's "{**}" begins in path (an offset: r is copied) */
    struct cx_principal who;
    char id[33];
    int status;            /* once a response is written */
    struct cx_buf headers; /* extra headers for the response */
    int64_t t0_us;         /* when it was accepted */
    bool deferred;         /* handed to the run lane: no longer the worker's */
    bool ended;            /* answered and given back before its job ended */
    bool body_slot;        /* reading its body on a request thread (cx_req_body_begin) */
    void *state;           /* a handler's, carried to the lane; freed at the end */
    void (*state_free)(void *state);
    /* how the lane's refusal (429 too_many_runs, 503) is answered when not
     * as the API's errors: MCP's JSON-RPC error (status, err, message) */
    void (*refuse)(struct cx_req *r, int status, enum cx_err err, const char *msg);
};

/* Hands the rest of the request to the run lane (lib/lane.h): fn(r) runs on
 * a run thread, with r->cx that thread's context, and the request ends
 * there (cx_req_finish, then the connection is given back). False when
 * the lane refused it: the answer (429 too_many_runs, 503; r->refuse's
 * when set) is sent and the request is still the caller's. On true, r is
 * no longer the caller's: its worker needs a new FCGX_Request for the next
 * connection. */
bool cx_req_defer(struct cx_req *r, void (*fn)(struct cx_req *r));

/* On a run thread, after its answer: ends the request now (the log line,
 * the connection given back) while the job goes on, still counted as its
 * user's run (a detached run). Nothing of r but its copies may be used
 * after. */
void cx_req_end_early(struct cx_req *r);

/* The end of every request: a 500 if nothing was answered, the metrics,
 * the access log line, the request's buffers. */
void cx_req_finish(struct cx_req *r);

const char *cx_req_param(struct cx_req *r, const char *name);

/* Before a request thread reads a request's body: one of the body slots
 * (codexec.h, cx_lane_body_enter), so that slow bodies of one user never
 * hold every request thread. A job of the lane (a run's body) reads
 * without one: the lane bounds it. CX_OK, or CX_ERR_BUSY (msg says why:
 * the caller answers, 503 with Retry-After); cx_req_body_done() gives the
 * slot back (cx_req_finish() too). */
enum cx_err cx_req_body_begin(struct cx_req *r, char *msg, size_t msglen);
void cx_req_body_done(struct cx_req *r);

/* Adds "Name: value\r\n" to the response; refuses CR/LF in either. */
void cx_req_header(struct cx_req *r, const char *name, const char *value);

/* Writes a complete response. json is borrowed. */
void cx_req_send_json(struct cx_req *r, int status, json_t *json);
void cx_req_send_error(struct cx_req *r, int status, const char *code, const char *message);
void cx_req_send_text(struct cx_req *r, int status, const char *content_type, const char *body,
                      size_t len);
/* Status and headers only (Content-Length when len >= 0); the caller writes
 * the body to r->fr->out. */
void cx_req_send_head(struct cx_req *r, int status, const char *content_type, long long len);

/* After cx_req_send_head(): bytes [first, last] of fd as the body, moved
 * by sendfile(2) in 64 KiB FastCGI records straight onto the connection.
 * False when the file or the connection failed mid-way; the connection is
 * then cut, so the web server sees a short response, never a wrong one. */
bool cx_req_send_file(struct cx_req *r, int fd, uint64_t first, uint64_t last);
/* More of the body after cx_req_send_head(); false once the client went. */
bool cx_req_send_bytes(struct cx_req *r, const void *data, size_t len);
/* Ends the connection now: a body that was promised will not come whole,
 * and nothing valid can follow it on this connection. */
void cx_req_cut(struct cx_req *r);
/* Drops the headers added so far (a download's, before an error answer). */
void cx_req_forget_headers(struct cx_req *r);

/* 204 or another status without a body. */
void cx_req_send_empty(struct cx_req *r, int status);

/* Answers a library error: the one table of status, error code, default
 * message, Retry-After and refusal count (docs/openapi.yaml); msg (NULL or
 * "" for the default) is the library's sentence for the client. Every 503
 * and 429 goes through it. */
void cx_req_send_lib_error(struct cx_req *r, enum cx_err err, const char *msg);
/* The Retry-After header the error table gives err, if any (for an answer
 * of the handler's own making). */
void cx_req_retry_after(struct cx_req *r, enum cx_err err);
/* What the error table says of err, for an answer of another protocol's
 * making (MCP's JSON-RPC errors): {"code", "status", "retry_after"?}.
 * The status, also as *status when not NULL. New reference. */
json_t *cx_req_error_data(enum cx_err err, int *status);

/* A response of Server-Sent Events (a streaming run): it begins, 200
 * text/event-stream, with the first event the library tells the sink, and
 * every event is flushed to the web server as it is written (nginx is told
 * not to buffer). */
struct cx_sse {
    struct cx_req *r;
    bool started;       /* the head was sent */
    bool gone;          /* a write failed: the client went away */
    int64_t stalled_ms; /* spent waiting for the connection to take events */
    unsigned last_id;   /* of the last event with one: the result's is the next */
};

/* Whether the client asked for a stream (Accept: text/event-stream). */
bool cx_req_wants_events(struct cx_req *r);
/* Fills sink to write events of r through sse. */
void cx_req_sse_sink(struct cx_req *r, struct cx_sse *sse, struct cx_run_sink *sink);
/* The end of a streaming call: when the stream began, its final "result"
 * event, whose data is what the call would have answered (out on CX_OK,
 * else the error's body); when it did not, the ordinary answer (status on
 * CX_OK). out is borrowed. */
void cx_req_sse_end(struct cx_sse *sse, enum cx_err rc, int status, json_t *out, const char *msg);

/* True for a Content-Type of application/json; else sends 415. */
bool cx_req_json_type(struct cx_req *r);

/* Reads the body (capped at max) and parses a JSON object; on failure the
 * error response has been sent and NULL is returned. The Content-Type must
 * be application/json (415 otherwise, also when it is missing). */
json_t *cx_req_json_body(struct cx_req *r, uint64_t max);

/* Reads request body bytes; ctx is r->fr->in. */
ssize_t cx_req_read(void *ctx, void *buf, size_t n);

/* Whether the FastCGI params can be trusted: always, unless
 * web_server_key is on; then only when the web server sent its key
 * (CODEXEC_WEB_KEY). */
bool cx_req_vouched(struct cx_req *r);

/* Whether the request may read what only operators should: /metrics and
 * health's details. With metrics_token, the operators' Bearer token;
 * else a (vouched) REMOTE_ADDR in metrics_allow. */
bool cx_req_operator(struct cx_req *r);

/* The user the web server authenticated, or NULL. REMOTE_USER counts only
 * with trust_remote_user, when the server also set AUTH_TYPE (Apache does
 * after authenticating; nginx only where the operator's config passes it,
 * because nginx fills $remote_user from a client's own Basic header even
 * without auth_basic), when it was sent exactly once, and when the
 * params are vouched for (cx_req_vouched). */
const char *cx_req_remote_user(struct cx_req *r);

/* Authenticates; on failure sends 401 (or 503) and returns false. A
 * state-changing request authenticated by the web server (not by a key)
 * that a browser sent from another site is refused with 403. */
bool cx_req_authenticate(struct cx_req *r);

/* The answer to an authentication's outcome: true for CX_OK, else a 401
 * (with WWW-Authenticate) or the library error is sent and false. */
bool cx_req_auth_result(struct cx_req *r, enum cx_err rc);

#endif
