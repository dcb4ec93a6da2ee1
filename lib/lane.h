/* codexec: the run lane, the threads that execute runs.
 *
 * A run takes a thread for as long as its code runs. On the threads that
 * answer requests, one API key's sleeping runs could take them all, and
 * every other user's runs, downloads and health checks would wait behind
 * them. So a host hands each run (a job) to the lane: a pool of run
 * threads of its own, each with its own library context, and a bounded
 * queue in front of them. At most max_concurrent_runs_per_user jobs of one
 * user are queued or running at once; past that, and when the queue is
 * full, the job is refused at once, and the request threads stay free. */
#ifndef CX_LANE_H
#define CX_LANE_H

#include <stdbool.h>

#include "config.h"
#include "ctx.h"
#include "err.h"

struct cx_auth;

/* A job: called once on a run thread, with that thread's context. */
typedef void (*cx_lane_fn)(struct cx_ctx *cx, void *arg);

struct cx_lane_limits {
    unsigned threads;  /* run_workers, else workers */
    unsigned queue;    /* jobs waiting for a thread: 8 per thread, 64 to 1024 */
    unsigned per_user; /* max_concurrent_runs_per_user, else a quarter of workers, at least 1 */
};
void cx_lane_limits(const struct cx_config *cfg, struct cx_lane_limits *out);

/* Starts the run threads (each opens its context over cfg and auth, which
 * must outlive cx_lane_stop()). */
enum cx_err cx_lane_start(const struct cx_config *cfg, const struct cx_auth *auth) CX_MUSTCHECK;

/* Takes no more jobs, lets those queued and running finish, and joins the
 * threads. Safe without a start. */
void cx_lane_stop(void);

/* Queues fn(cx, arg) for user. CX_ERR_TOO_MANY_RUNS when the user has
 * per_user jobs queued or running, CX_ERR_BUSY when the queue is full or
 * the lane stopping; msg says which. On CX_OK fn is called exactly once. */
enum cx_err cx_lane_submit(const char *user, cx_lane_fn fn, void *arg, char *msg,
                           size_t msglen) CX_MUSTCHECK;

/* Called by a job before its answer goes out (before the last event of a
 * streamed one): from then on the job no longer counts as one of its
 * user's runs in progress (the client, told the run's end, may send the
 * next one at once; the thread still finishes the job). No-op off a run
 * thread and when called again; the job's end does it otherwise. */
void cx_lane_answered(void);

/* Jobs queued or running now. */
unsigned cx_lane_jobs(void);

#endif
