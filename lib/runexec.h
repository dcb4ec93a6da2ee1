/* codexec: executing one run in a kernel (the part of lib/run.c that talks
 * Jupyter): the pipelined requests, the output, the epilogue, the waiting.
 *
 * A run's cells go out without waiting in between: the inputs' staging
 * chunks, the user's cell, the main() call with arguments. The epilogue
 * (a restart check, the reaping of leftover processes and the capture)
 * rides on the last of them as user expressions; a separate silent request
 * carries it only when that cell failed. See docs/internals/runs.md. */
#ifndef CX_RUNEXEC_H
#define CX_RUNEXEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codexec.h"

struct cx_capture;
struct cx_db_call;
struct cx_exec;
struct cx_inputs;
struct cx_kernel_conn;
struct cx_run_request;
struct cx_session;
struct cx_cancel;

/* The pipelined requests of a run, in the order the kernel runs them. */
enum { CX_REQ_USER, CX_REQ_CALL, CX_REQ_EPILOGUE, CX_REQ_MAX };

/* What happened to a run besides what its code did, least serious first;
 * the most serious event decides the answer (lib/run.c's table). */
enum cx_outcome {
    CX_OUTCOME_OK = 0,       /* ran to its end (its code may have raised) */
    CX_OUTCOME_OUTPUT_LIMIT, /* interrupted past max_output_bytes */
    CX_OUTCOME_OUTPUT_LOST,  /* replies came, the idle statuses never did */
    CX_OUTCOME_STAGE_FAILED, /* an input could not be written */
    CX_OUTCOME_DIED,         /* the kernel exited or vanished during the run */
    CX_OUTCOME_TIMEOUT,      /* the deadline passed */
    CX_OUTCOME_CANCELLED,    /* POST /v1/runs/{id}/cancel */
};
/* The run was stopped from outside its code (interrupted, maybe restarted):
 * nothing of it is captured. */
#define CX_EVENTS_STOPPED (CX_EVENT(CX_OUTCOME_TIMEOUT) | CX_EVENT(CX_OUTCOME_CANCELLED))
#define CX_EVENT(o)       (1u << (o))

struct cx_runexec; /* private to runexec.c */

/* What an execution found out, for run.c to settle the session and answer
 * the run: read-only outside runexec.c. */
struct cx_runexec_facts {
    unsigned events;       /* CX_EVENT() bits of enum cx_outcome */
    bool truncated;        /* output past max_output_bytes was dropped */
    bool interrupted;      /* the kernel was interrupted for its output */
    bool abandoned;        /* stopped reading mid-output: never pool the connection */
    bool any_message;      /* something for one of the requests arrived */
    bool have_result;      /* result is set */
    uint64_t output_bytes; /* counted, also past the limit */
    json_t *error;         /* {"ename","evalue","traceback"} of the user or call cell */
    json_t *result;        /* a JSON value */
};

/* A run's execution: its requests sized for in, a capture when capture,
 * events for sink (NULL: none). Free with cx_runexec_free(). */
enum cx_err cx_runexec_new(struct cx_ctx *cx, const struct cx_inputs *in, bool capture, bool full,
                           const struct cx_run_sink *sink, struct cx_runexec **out) CX_MUSTCHECK;
void cx_runexec_free(struct cx_runexec *st);
/* The run's cancel flag (lib/cancel.h; borrowed): once it is set, the run
 * is interrupted (then restarted, as at a timeout) and ends Cancelled. */
void cx_runexec_cancel_by(struct cx_runexec *st, const struct cx_cancel *c);

/* The facts so far (none for a NULL st: a run whose allocation failed). */
const struct cx_runexec_facts *cx_runexec_facts(const struct cx_runexec *st);
/* The capture, NULL without one (borrowed). */
struct cx_capture *cx_runexec_capture(const struct cx_runexec *st);
/* The last tail_chars characters of stdout / stderr as a new JSON string;
 * stderr's NULL when the run wrote none. */
json_t *cx_runexec_stdout(struct cx_runexec *st);
json_t *cx_runexec_stderr(struct cx_runexec *st);
/* With full (output "full"): stdout or stderr whole, a new JSON string;
 * else NULL. */
json_t *cx_runexec_full(struct cx_runexec *st, bool err);
/* The user cell's execute_result and display_data bundles in order, each
 * {"type", "data": {mime: value}}, captured binary outputs named by their
 * artifacts (a new array). */
json_t *cx_runexec_results(struct cx_runexec *st, const json_t *artifacts);

/* Tells the sink an event (data: taken, may be NULL for {}), after the
 * stream text that waits; nothing when nobody listens. */
void cx_runexec_say(struct cx_runexec *st, const char *name, json_t *data);
/* A "status" event of state. */
void cx_runexec_status(struct cx_runexec *st, const char *state);
/* The "capturing" status, once per run. */
void cx_runexec_capturing(struct cx_runexec *st);
/* Tells the sink the stream text that waits. */
void cx_runexec_flush(struct cx_runexec *st);

/* Sends the run on conn (borrowed) to the session's kernel and waits for
 * it until req->timeout, then for the grace period after an interrupt
 * (restarting the kernel when it ignores it). CX_OK also when the code
 * raised or timed out (see the facts); CX_ERR_NOT_FOUND when the kernel
 * vanished, CX_ERR_KERNEL_DIED when it died, CX_ERR_IO when the
 * connection failed. */
enum cx_err cx_runexec_execute(struct cx_runexec *st, struct cx_kernel_conn *conn,
                               struct cx_session *s, const struct cx_run_request *req,
                               const struct cx_inputs *in, char *msg, size_t msglen) CX_MUSTCHECK;
/* Forgets the requests' replies before another attempt (nothing of ours
 * ran). */
void cx_runexec_retry(struct cx_runexec *st);

/* What the replies add once the run is over: the error of a cell whose
 * iopub copy was not read (reading stopped past the output limit), and
 * the output limit as the outcome of a cell interrupted for its output. */
void cx_runexec_conclude(struct cx_runexec *st);
/* An event of the run's end that the session saw (CX_OUTCOME_DIED). */
void cx_runexec_note(struct cx_runexec *st, enum cx_outcome o);
/* Whether the epilogue said the kernel had not run it before (restarted
 * since the last run); false when it did not come back. */
bool cx_runexec_says_fresh(const struct cx_runexec *st);

enum cx_outcome cx_runexec_outcome(const struct cx_runexec *st);

#endif
