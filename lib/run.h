/* codexec: runs, the whole story of POST /v1/runs with no HTTP in it. */
#ifndef CX_RUN_H
#define CX_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"
#include "util.h"

struct cx_config;
struct cx_ctx;

/* A validated POST /v1/runs body. Strings and arrays are borrowed from
 * root, which the struct holds a reference to: cx_run_request_cleanup(). */
struct cx_run_request {
    json_t *root;
    char conversation_id[CX_CONVERSATION_MAX + 1];
    const char *code;
    size_t code_len;
    json_t *inputs;  /* array of uuid strings, or NULL */
    json_t *outputs; /* array of glob strings, or NULL */
    bool capture_artifacts;
    double timeout;    /* seconds, clamped to (0, max_timeout] */
    unsigned ttl;      /* seconds, clamped to [1, max_ttl] */
    json_t *arguments; /* object, or NULL */
};

/* Validates body (a JSON object) against docs/openapi.yaml and the limits in cfg.
 * On failure returns CX_ERR_INVALID or CX_ERR_TOO_LARGE and msg holds a
 * sentence for the client naming the field. On success *req takes a new
 * reference to body. */
enum cx_err cx_run_request_parse(const struct cx_config *cfg, json_t *body,
                                 struct cx_run_request *req, char *msg, size_t msglen) CX_MUSTCHECK;
void cx_run_request_cleanup(struct cx_run_request *req);

/* The user's run record (never the code): with, once the run ended, the
 * fields of its answer (as POST /v1/runs answered or streamed it, kept for
 * run_answer_ttl). CX_ERR_NOT_FOUND for a missing
 * run, another user's run and a malformed id alike. *out: new reference. */
enum cx_err cx_run_get(struct cx_ctx *cx, const char *user, const char *run_id,
                       json_t **out) CX_MUSTCHECK;

struct cx_principal;

/* POST /v1/runs: runs the request in the caller's conversation, or, when
 * approval is required (config or key), records it as pending (*pending).
 * On CX_OK *out is the payload (new reference): the run's answer, also
 * when its code raised or timed out. Request-level failures:
 * CX_ERR_INPUT_NOT_FOUND, CX_ERR_CONFLICT (the conversation is busy),
 * CX_ERR_QUOTA (at the session cap, all busy), CX_ERR_GATEWAY, CX_ERR_DB;
 * msg says what failed. */
enum cx_err cx_run_submit(struct cx_ctx *cx, const struct cx_principal *who,
                          struct cx_run_request *req, json_t **out, bool *pending, char *msg,
                          size_t msglen) CX_MUSTCHECK;

/* A streaming run's events, as they happen (Server-Sent Events in
 * codexec-fcgi). name: "run" {run_id, conversation_id} first, then
 * "status" {state: "queued" | "executing" | "capturing"}, "stdout" and
 * "stderr" {text} (coalesced over CX_RUN_COALESCE_MS, whole characters),
 * "display" {mime_type, path} for a rich output that becomes an artifact
 * under path; NULL name when nothing was said for CX_RUN_HEARTBEAT_MS (a
 * heartbeat is due). data is borrowed. The final answer is not an event:
 * it is the call's *out, or its error. Returns false once the client is
 * gone: the run goes on to its end and its record, and fn is not called
 * again. */
#define CX_RUN_COALESCE_MS  25
#define CX_RUN_HEARTBEAT_MS 15000
struct cx_run_sink {
    bool (*fn)(void *ctx, const char *name, json_t *data);
    void *ctx;
};

/* cx_run_submit() telling sink (NULL: nobody) what happens while it runs.
 * An error after the "run" event is still the return value. */
enum cx_err cx_run_submit_stream(struct cx_ctx *cx, const struct cx_principal *who,
                                 struct cx_run_request *req, const struct cx_run_sink *sink,
                                 json_t **out, bool *pending, char *msg,
                                 size_t msglen) CX_MUSTCHECK;

/* POST /v1/runs/{id}/approve and /reject. CX_ERR_FORBIDDEN for a key that
 * itself requires approval (whatever the run), CX_ERR_NOT_FOUND for a run
 * that is not this user's or not pending, CX_ERR_EXPIRED when it waited too
 * long. */
enum cx_err cx_run_approve(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
                           json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;
/* cx_run_approve() with the approved run's events told to sink. */
enum cx_err cx_run_approve_stream(struct cx_ctx *cx, const struct cx_principal *who,
                                  const char *run_id, const struct cx_run_sink *sink, json_t **out,
                                  char *msg, size_t msglen) CX_MUSTCHECK;
enum cx_err cx_run_reject(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
                          json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* Marks pending runs past approval_ttl expired and runs left "running" by a
 * crashed process failed; *changed counts them. */
enum cx_err cx_run_expire(struct cx_ctx *cx, int *changed) CX_MUSTCHECK;

/* Strips ANSI escape sequences (CSI and OSC) in place. */
void cx_run_strip_ansi(char *s);

#endif
