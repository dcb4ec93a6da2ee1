/* The run lane: a user's runs in progress at their limit are refused, a
 * full queue is refused, a job that says it answered no longer counts as
 * its user's, and stopping runs what was queued, each job exactly once.
 * The run threads open real contexts (the suite's PostgreSQL and Jupyter
 * server); the jobs themselves only wait for the test. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/lane.h"
#include "cxtest.h"
#include "tap.h"

#define JOBS_MAX 128

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool go;           /* the blocked jobs may end */
    unsigned started;  /* jobs called */
    unsigned answered; /* jobs past cx_lane_answered() */
    unsigned calls[JOBS_MAX];
} st = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

struct arg {
    unsigned id;
    bool answer_first; /* calls cx_lane_answered() before it waits */
};

static void
job(struct cx_ctx *cx, void *p)
{
    struct arg *a = p;

    (void)cx;
    pthread_mutex_lock(&st.lock);
    st.started++;
    st.calls[a->id]++;
    pthread_cond_broadcast(&st.cond);
    pthread_mutex_unlock(&st.lock);
    if (a->answer_first) {
        cx_lane_answered();
        pthread_mutex_lock(&st.lock);
        st.answered++;
        pthread_cond_broadcast(&st.cond);
        pthread_mutex_unlock(&st.lock);
    }
    pthread_mutex_lock(&st.lock);
    while (!st.go)
        pthread_cond_wait(&st.cond, &st.lock);
    pthread_mutex_unlock(&st.lock);
}

/* Waits until *counter reaches n (the jobs are on their threads). */
static void
wait_for(unsigned *counter, unsigned n)
{
    pthread_mutex_lock(&st.lock);
    while (*counter < n)
        pthread_cond_wait(&st.cond, &st.lock);
    pthread_mutex_unlock(&st.lock);
}

static enum cx_err
submit(const char *user, struct arg *a, char *msg)
{
    return cx_lane_submit(user, job, a, msg, CX_MSG_MAX);
}

/* Slots per user (followers of run events, request bodies): per user, in
 * all, and given back. */
static void
user_slots(const struct cx_config *cfg)
{
    struct cx_user_slots s = CX_USER_SLOTS_INIT;
    char msg[CX_MSG_MAX];

    is_int(cx_user_slots_enter(&s, "a", 2, 3), CX_OK, "a's first slot");
    is_int(cx_user_slots_enter(&s, "a", 2, 3), CX_OK, "a's second");
    is_int(cx_user_slots_enter(&s, "a", 2, 3), CX_ERR_TOO_MANY_RUNS, "a's third: past per_user");
    is_int(cx_user_slots_enter(&s, "b", 2, 3), CX_OK, "b's first");
    is_int(cx_user_slots_enter(&s, "c", 2, 3), CX_ERR_BUSY, "c's: all three are taken");
    cx_user_slots_leave(&s, "a");
    is_int(cx_user_slots_enter(&s, "c", 2, 3), CX_OK, "c's once one of a's is given back");
    cx_user_slots_leave(&s, "x"); /* (none: nothing happens) */
    is_int(cx_user_slots_enter(&s, "d", 2, 3), CX_ERR_BUSY, "d's: still all taken");
    cx_user_slots_leave(&s, "a");
    cx_user_slots_leave(&s, "b");
    cx_user_slots_leave(&s, "c");
    is_int(s.n, 0, "every user gone from the table");
    is_int(cx_user_slots_enter(&s, "a", 2, 3), CX_OK, "and a slot to be had again");
    cx_user_slots_leave(&s, "a");
    free(s.v);

    /* request bodies: a quarter of the 8 workers per key's owner */
    is_int(cx_lane_body_enter(cfg, "a", msg, sizeof(msg)), CX_OK, "a's first body");
    is_int(cx_lane_body_enter(cfg, "a", msg, sizeof(msg)), CX_OK, "a's second body");
    is_int(cx_lane_body_enter(cfg, "a", msg, sizeof(msg)), CX_ERR_BUSY, "a's third: refused");
    ok(strstr(msg, "2 request bodies") != NULL, "the message says the key's limit: %s", msg);
    for (unsigned i = 0; i < 6; i++) {
        char u[8];

        snprintf(u, sizeof(u), "u%u", i);
        is_int(cx_lane_body_enter(cfg, u, msg, sizeof(msg)), CX_OK, "%s's body beside a's", u);
    }
    is_int(cx_lane_body_enter(cfg, "b", msg, sizeof(msg)), CX_ERR_BUSY, "b's: all 8 threads read");
    ok(strstr(msg, "busy") != NULL, "as busy: %s", msg);
    is_int(cx_lane_follow(cfg, "e", 2), CX_OK, "a follower of a run's events has its own table");
    cx_lane_unfollow("e");
    cx_lane_body_leave("a");
    is_int(cx_lane_body_enter(cfg, "a", msg, sizeof(msg)), CX_OK, "a's again once one is done");
    cx_lane_body_leave("a");
    cx_lane_body_leave("a");
    for (unsigned i = 0; i < 6; i++) {
        char u[8];

        snprintf(u, sizeof(u), "u%u", i);
        cx_lane_body_leave(u);
    }
    is_int(cx_lane_body_enter(cfg, "b", msg, sizeof(msg)), CX_OK, "b's once they are done");
    cx_lane_body_leave("b");
}

int
main(void)
{
    struct cxtest t;
    struct cx_lane_limits lim;
    static struct arg args[JOBS_MAX];
    char msg[CX_MSG_MAX], user[32];
    unsigned n = 0, queued;

    cxtest_open(&t, "lane", "workers = 8\nrun_workers = 2\nmax_concurrent_runs_per_user = 2\n");
    user_slots(&t.cfg);
    cx_lane_limits(&t.cfg, &lim);
    is_int(lim.threads, 2, "run_workers run threads");
    is_int(lim.queue, 64, "a queue of at least 64");
    is_int(lim.per_user, 2, "max_concurrent_runs_per_user");
    need(cx_lane_start(&t.cfg, t.auth) == CX_OK, "the lane starts");
    for (unsigned i = 0; i < JOBS_MAX; i++)
        args[i].id = i;

    /* alice's two runs take both threads; her third is refused */
    is_int(submit("alice", &args[n++], msg), CX_OK, "alice's first run");
    is_int(submit("alice", &args[n++], msg), CX_OK, "alice's second run");
    wait_for(&st.started, 2);
    is_int(submit("alice", &args[n], msg), CX_ERR_TOO_MANY_RUNS, "alice's third is refused");
    ok(strstr(msg, "2 runs in progress") != NULL, "and the message says the limit: %s", msg);
    /* bob's waits in the queue rather than fail */
    args[n].answer_first = true;
    is_int(submit("bob", &args[n++], msg), CX_OK, "bob's run queues behind alice's");
    is_int(cx_lane_jobs(), 3, "three jobs in the lane");

    /* the queue fills with other users' runs, and then refuses */
    queued = 1;
    for (unsigned u = 0; queued < lim.queue && n < JOBS_MAX; u++, queued++) {
        snprintf(user, sizeof(user), "user-%u", u);
        if (submit(user, &args[n++], msg) != CX_OK)
            break;
    }
    is_int(queued, lim.queue, "the queue takes %u jobs", lim.queue);
    is_int(submit("carol", &args[n], msg), CX_ERR_BUSY, "a full queue refuses");
    ok(strstr(msg, "busy") != NULL, "as busy: %s", msg);
    is_int(submit("alice", &args[n], msg), CX_ERR_TOO_MANY_RUNS,
           "alice is still at her limit (it is checked first)");

    /* the jobs end: every one is called exactly once, bob's says it
     * answered before it waits */
    pthread_mutex_lock(&st.lock);
    st.go = true;
    pthread_cond_broadcast(&st.cond);
    pthread_mutex_unlock(&st.lock);
    wait_for(&st.started, n);
    wait_for(&st.answered, 1);
    cx_lane_stop();
    {
        unsigned once = 0;
        for (unsigned i = 0; i < n; i++)
            once += st.calls[i] == 1;
        is_int(once, n, "each of the %u jobs was called exactly once", n);
    }
    is_int(cx_lane_jobs(), 0, "no job left after the stop");
    is_int(submit("alice", &args[0], msg), CX_ERR_BUSY, "a stopped lane refuses");

    /* A job that answered no longer counts as its user's: the user's next
     * run is taken while the first still holds its thread. */
    memset(st.calls, 0, sizeof(st.calls));
    st.go = false;
    st.started = st.answered = 0;
    need(cx_lane_start(&t.cfg, t.auth) == CX_OK, "the lane starts again");
    args[0].answer_first = args[1].answer_first = true;
    args[2].answer_first = false;
    is_int(submit("dave", &args[0], msg), CX_OK, "dave's first run");
    is_int(submit("dave", &args[1], msg), CX_OK, "dave's second run");
    wait_for(&st.answered, 2);
    is_int(cx_lane_jobs(), 2, "both still hold their threads");
    is_int(submit("dave", &args[2], msg), CX_OK,
           "dave's third is taken: the first two were answered");
    is_int(submit("dave", &args[3], msg), CX_OK, "and a fourth (queued)");
    is_int(submit("dave", &args[4], msg), CX_ERR_TOO_MANY_RUNS,
           "a fifth is refused: two unanswered ones are his limit");
    cx_lane_answered(); /* off a run thread: nothing happens */
    is_int(submit("dave", &args[4], msg), CX_ERR_TOO_MANY_RUNS, "still refused");
    pthread_mutex_lock(&st.lock);
    st.go = true;
    pthread_cond_broadcast(&st.cond);
    pthread_mutex_unlock(&st.lock);
    cx_lane_stop();
    is_int(st.calls[0] + st.calls[1] + st.calls[2] + st.calls[3], 4, "the four were called");
    is_int(st.calls[4], 0, "the refused one was not");

    cxtest_close(&t);
    return tap_done();
}
