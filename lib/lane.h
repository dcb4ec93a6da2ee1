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
#include "codexec.h"

struct cx_auth;

struct cx_lane_limits {
    unsigned threads;  /* run_workers, else workers */
    unsigned queue;    /* jobs waiting for a thread: 8 per thread, 64 to 1024 */
    unsigned per_user; /* max_concurrent_runs_per_user, else a quarter of workers, at least 1 */
};
void cx_lane_limits(const struct cx_config *cfg, struct cx_lane_limits *out);

/* Jobs queued or running now. */
unsigned cx_lane_jobs(void);

#endif
