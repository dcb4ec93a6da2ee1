/* codexec: runs, the whole story of POST /v1/runs with no HTTP in it. */
#ifndef CX_RUN_H
#define CX_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"
#include "runreq.h"
#include "util.h"

struct cx_config;
struct cx_ctx;

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
