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

#include <pthread.h>
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

/* A shared resource's slots counted per user: at most per_user of one
 * user's and max in all at once, in a table of max users made at the
 * first enter (max the same at every call). */
struct cx_user_slot;
struct cx_user_slots {
    pthread_mutex_t lock;
    struct cx_user_slot *v;
    unsigned n, cap;
};
#define CX_USER_SLOTS_INIT                                                                         \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0                                                      \
    }

/* CX_OK (a slot taken: leave it), CX_ERR_TOO_MANY_RUNS (the user's are at
 * per_user) or CX_ERR_BUSY (all max are taken, or no table). */
enum cx_err cx_user_slots_enter(struct cx_user_slots *s, const char *user, unsigned per_user,
                                unsigned max);
/* Gives one of user's back (nothing when user held none). */
void cx_user_slots_leave(struct cx_user_slots *s, const char *user);

/* A request thread held by a follower of a run's events: per_user of the
 * user's, half of workers in all; cx_user_slots_enter's answers.
 * cx_lane_unfollow() gives it back. */
enum cx_err cx_lane_follow(const struct cx_config *cfg, const char *user, unsigned per_user);
void cx_lane_unfollow(const char *user);

#endif
