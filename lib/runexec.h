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

#include "buf.h"
#include "codexec.h"

struct cx_capture;
struct cx_db_call;
struct cx_exec;
struct cx_inputs;
struct cx_kernel_conn;
struct cx_run_request;
struct cx_session;

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
};
#define CX_EVENT(o) (1u << (o))

/* The last characters of stdout or stderr, in bounded memory. */
struct cx_tail {
    struct cx_buf b;
    size_t keep; /* bytes to keep at least: 4 × tail_chars */
};
void cx_tail_init(struct cx_tail *t, unsigned chars);
/* The last chars code points, starting on a character boundary: a new
 * JSON string. */
json_t *cx_tail_json(struct cx_tail *t, unsigned chars);

struct cx_gateway;
struct cx_run_sink;

struct cx_runexec {
    struct cx_ctx *cx;
    struct cx_kernel_conn *conn; /* owned while set */
    const char *kernel_id;       /* borrowed from the session */
    struct cx_gateway *gw;       /* the session's gateway (borrowed) */
    struct cx_tail out, err;
    uint64_t output_bytes;
    unsigned events;     /* CX_EVENT() bits of enum cx_outcome */
    bool truncated;      /* output past max_output_bytes was dropped */
    bool interrupted;    /* the kernel was interrupted for its output */
    bool abandoned;      /* stopped reading mid-output: never pool the connection */
    bool any_message;    /* something for one of the requests arrived */
    bool have_result;    /* result is set */
    json_t *error;       /* {"ename","evalue","traceback"} of the user or call cell */
    json_t *result;      /* a JSON value */
    struct cx_exec *all; /* the staging requests, then CX_REQ_MAX of the run's */
    struct cx_exec *reqs;
    size_t base; /* staging requests before reqs */
    int nreq;
    int carrier;            /* the request carrying the epilogue's expressions */
    struct cx_capture *cap; /* NULL without capture */
    /* a streaming run's listener (run.h), NULL for none */
    const struct cx_run_sink *sink;
    struct cx_buf pend;    /* stream text not yet told, of one stream: */
    bool pend_err;         /* stderr's */
    int64_t pend_since_us; /* when it began to wait (0: nothing waits) */
    int64_t said_us;       /* when the sink last heard from us */
    bool capturing;        /* "capturing" was said */
    unsigned displays;     /* "display" events said */
};

/* Tells st's sink an event (data: taken, may be NULL for {}), after the
 * stream text that waits; nothing when nobody listens. */
void cx_runexec_say(struct cx_runexec *st, const char *name, json_t *data);
/* A "status" event of state. */
void cx_runexec_status(struct cx_runexec *st, const char *state);
/* The "capturing" status, once per run. */
void cx_runexec_capturing(struct cx_runexec *st);
/* Tells the sink the stream text that waits. */
void cx_runexec_flush(struct cx_runexec *st);

/* Sizes the requests for in and, with capture, makes the capture. Clean up
 * with cx_runexec_cleanup() on any return. */
enum cx_err cx_runexec_init(struct cx_runexec *st, struct cx_ctx *cx, const struct cx_inputs *in,
                            bool capture) CX_MUSTCHECK;
void cx_runexec_cleanup(struct cx_runexec *st);
/* Frees the connection (broken, or of a replaced kernel). */
void cx_runexec_drop_conn(struct cx_runexec *st);

/* Sends the run on st->conn and waits for it until req->timeout, then for
 * the grace period after an interrupt (restarting the kernel when it
 * ignores it). CX_OK also when the code raised or timed out (see events);
 * CX_ERR_NOT_FOUND when the kernel vanished, CX_ERR_KERNEL_DIED when it
 * died, CX_ERR_IO when the connection failed. */
enum cx_err cx_runexec_execute(struct cx_runexec *st, struct cx_session *s,
                               const struct cx_run_request *req, const struct cx_inputs *in,
                               char *msg, size_t msglen) CX_MUSTCHECK;

enum cx_outcome cx_runexec_outcome(const struct cx_runexec *st);

#endif
