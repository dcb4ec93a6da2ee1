#include "lane.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "codexec.h"
#include "log.h"

/* Users with jobs in the lane: never more entries than jobs, and never
 * more jobs than threads and queue together. */
struct user_jobs {
    char user[CX_USER_MAX + 1];
    unsigned jobs;
};

struct job {
    cx_lane_fn fn;
    void *arg;
    unsigned user;     /* its entry in users */
    bool user_counted; /* until cx_lane_answered() or the job's end */
};

/* The job this run thread is calling, for cx_lane_answered(). */
static __thread struct job *current;

/* A run thread waiting for work: handed one directly (LIFO, so the
 * threads that just ran stay the warm ones, their PostgreSQL backends and
 * kernel connections with them). */
struct idle {
    pthread_cond_t cond;
    bool has_job;
    struct job job;
};

static struct {
    pthread_mutex_t lock;
    const struct cx_config *cfg;
    const struct cx_auth *auth;
    struct cx_lane_limits lim;
    pthread_t *threads;
    unsigned nthreads;
    struct idle **idle; /* lim.threads slots, a stack */
    unsigned nidle;
    struct job *queue; /* lim.queue slots, a ring */
    unsigned head, queued;
    struct user_jobs *users; /* lim.threads + lim.queue slots */
    unsigned jobs;
    bool stopping;
} lane = {.lock = PTHREAD_MUTEX_INITIALIZER};

void
cx_lane_limits(const struct cx_config *cfg, struct cx_lane_limits *out)
{
    out->threads = cfg->run_workers ? cfg->run_workers : cfg->workers;
    /* a burst of many users' runs waits rather than fails: each waiting
     * one holds its connection and a few bytes, never a thread */
    out->queue = out->threads * 8 < 64 ? 64 : out->threads * 8 > 1024 ? 1024 : out->threads * 8;
    out->per_user = cfg->max_concurrent_runs_per_user ? cfg->max_concurrent_runs_per_user
                    : cfg->workers / 4                ? cfg->workers / 4
                                                      : 1;
}

/* Under lock: the user's entry, else a free one made the user's. */
static unsigned
user_slot_locked(const char *user)
{
    unsigned n = lane.lim.threads + lane.lim.queue, free_slot = n;

    for (unsigned i = 0; i < n; i++) {
        if (lane.users[i].jobs && !strcmp(lane.users[i].user, user))
            return i;
        if (!lane.users[i].jobs && free_slot == n)
            free_slot = i;
    }
    /* (jobs < n whenever this is called: a free entry exists) */
    snprintf(lane.users[free_slot].user, sizeof(lane.users[free_slot].user), "%s", user);
    return free_slot;
}

static unsigned
user_jobs_locked(const char *user)
{
    unsigned n = lane.lim.threads + lane.lim.queue;

    for (unsigned i = 0; i < n; i++)
        if (lane.users[i].jobs && !strcmp(lane.users[i].user, user))
            return lane.users[i].jobs;
    return 0;
}

enum cx_err
cx_lane_submit(const char *user, cx_lane_fn fn, void *arg, char *msg, size_t msglen)
{
    struct job j = {.fn = fn, .arg = arg};
    enum cx_err rc = CX_OK;

    pthread_mutex_lock(&lane.lock);
    if (!lane.users || lane.stopping) {
        snprintf(msg, msglen, "the server is stopping; retry shortly");
        rc = CX_ERR_BUSY;
    } else if (user_jobs_locked(user) >= lane.lim.per_user) {
        snprintf(msg, msglen,
                 "this user already has %u runs in progress, the most at once; retry when one "
                 "ends",
                 lane.lim.per_user);
        rc = CX_ERR_TOO_MANY_RUNS;
    } else if (!lane.nidle && lane.queued == lane.lim.queue) {
        snprintf(msg, msglen, "every run thread of this server is busy; retry shortly");
        rc = CX_ERR_BUSY;
    } else {
        j.user = user_slot_locked(user);
        j.user_counted = true;
        lane.users[j.user].jobs++;
        lane.jobs++;
        if (lane.nidle) {
            struct idle *t = lane.idle[--lane.nidle];
            t->job = j;
            t->has_job = true;
            pthread_cond_signal(&t->cond);
        } else {
            lane.queue[(lane.head + lane.queued++) % lane.lim.queue] = j;
        }
    }
    pthread_mutex_unlock(&lane.lock);
    return rc;
}

/* Waits for the next job; false when stopping with nothing left. */
static bool
next_job(struct idle *me, struct job *out)
{
    bool got = false;

    pthread_mutex_lock(&lane.lock);
    if (lane.queued) {
        *out = lane.queue[lane.head];
        lane.head = (lane.head + 1) % lane.lim.queue;
        lane.queued--;
        got = true;
    } else if (!lane.stopping) {
        me->has_job = false;
        lane.idle[lane.nidle++] = me;
        while (!me->has_job && !lane.stopping)
            pthread_cond_wait(&me->cond, &lane.lock);
        if (me->has_job) {
            *out = me->job;
            got = true;
        } else {
            for (unsigned i = 0; i < lane.nidle; i++)
                if (lane.idle[i] == me) {
                    lane.idle[i] = lane.idle[--lane.nidle];
                    break;
                }
        }
    }
    pthread_mutex_unlock(&lane.lock);
    return got;
}

/* Under lock: the job no longer counts as its user's. */
static void
user_done_locked(struct job *j)
{
    if (j->user_counted) {
        lane.users[j->user].jobs--;
        j->user_counted = false;
    }
}

void
cx_lane_answered(void)
{
    if (!current)
        return;
    pthread_mutex_lock(&lane.lock);
    user_done_locked(current);
    pthread_mutex_unlock(&lane.lock);
}

static void
job_done(struct job *j)
{
    pthread_mutex_lock(&lane.lock);
    user_done_locked(j);
    lane.jobs--;
    pthread_mutex_unlock(&lane.lock);
}

static void *
run_thread(void *arg)
{
    struct cx_ctx cx;
    struct idle me = {.has_job = false};
    struct job j;
    bool ok;
    (void)arg;

    pthread_cond_init(&me.cond, NULL);
    ok = cx_host_ctx_open(&cx, lane.cfg, lane.auth) == CX_OK;
    if (!ok)
        cx_log_err(0, "run thread start-up failed: out of memory");
    while (next_job(&me, &j)) {
        /* (a thread without its context still calls the job: its answer
         * is the job's to give, an error) */
        current = &j;
        j.fn(ok ? &cx : NULL, j.arg);
        current = NULL;
        cx_log_set_request_id(NULL);
        job_done(&j);
    }
    cx_host_ctx_close(&cx);
    pthread_cond_destroy(&me.cond);
    return NULL;
}

enum cx_err
cx_lane_start(const struct cx_config *cfg, const struct cx_auth *auth)
{
    struct cx_lane_limits lim;

    cx_lane_limits(cfg, &lim);
    pthread_mutex_lock(&lane.lock);
    lane.cfg = cfg;
    lane.auth = auth;
    lane.lim = lim;
    lane.stopping = false;
    lane.threads = calloc(lim.threads, sizeof(*lane.threads));
    lane.idle = calloc(lim.threads, sizeof(*lane.idle));
    lane.queue = calloc(lim.queue, sizeof(*lane.queue));
    lane.users = calloc(lim.threads + lim.queue, sizeof(*lane.users));
    pthread_mutex_unlock(&lane.lock);
    if (!lane.threads || !lane.idle || !lane.queue || !lane.users)
        return CX_ERR_NOMEM;
    for (; lane.nthreads < lim.threads; lane.nthreads++)
        if (pthread_create(&lane.threads[lane.nthreads], NULL, run_thread, NULL) != 0) {
            cx_log_err(0, "pthread_create() of a run thread failed");
            return lane.nthreads ? CX_OK : CX_ERR_NOMEM;
        }
    return CX_OK;
}

void
cx_lane_stop(void)
{
    pthread_mutex_lock(&lane.lock);
    lane.stopping = true;
    for (unsigned i = 0; i < lane.nidle; i++)
        pthread_cond_signal(&lane.idle[i]->cond);
    pthread_mutex_unlock(&lane.lock);
    for (unsigned i = 0; i < lane.nthreads; i++)
        pthread_join(lane.threads[i], NULL);
    pthread_mutex_lock(&lane.lock);
    free(lane.threads);
    free(lane.idle);
    free(lane.queue);
    free(lane.users);
    lane.threads = NULL;
    lane.idle = NULL;
    lane.queue = NULL;
    lane.users = NULL;
    lane.nthreads = lane.nidle = lane.queued = lane.head = lane.jobs = 0;
    pthread_mutex_unlock(&lane.lock);
}

unsigned
cx_lane_jobs(void)
{
    unsigned n;

    pthread_mutex_lock(&lane.lock);
    n = lane.jobs;
    pthread_mutex_unlock(&lane.lock);
    return n;
}

/* ------------------------------------------------------------------------ */
/* Slots per user                                                           */

struct cx_user_slot {
    char user[CX_USER_MAX + 1];
    unsigned n;
};

enum cx_err
cx_user_slots_enter(struct cx_user_slots *s, const char *user, unsigned per_user, unsigned max)
{
    struct cx_user_slot *mine = NULL;
    unsigned total = 0;
    enum cx_err rc = CX_OK;

    pthread_mutex_lock(&s->lock);
    if (!s->v) {
        s->v = calloc(max ? max : 1, sizeof(*s->v));
        s->cap = s->v ? (max ? max : 1) : 0;
    }
    for (unsigned i = 0; i < s->n; i++) {
        total += s->v[i].n;
        if (!strcmp(s->v[i].user, user))
            mine = &s->v[i];
    }
    if (mine && mine->n >= per_user)
        rc = CX_ERR_TOO_MANY_RUNS;
    else if (total >= s->cap || (!mine && s->n >= s->cap))
        rc = CX_ERR_BUSY;
    else {
        if (!mine) {
            mine = &s->v[s->n++];
            snprintf(mine->user, sizeof(mine->user), "%s", user);
            mine->n = 0;
        }
        mine->n++;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void
cx_user_slots_leave(struct cx_user_slots *s, const char *user)
{
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].user, user)) {
            if (--s->v[i].n == 0)
                s->v[i] = s->v[--s->n];
            break;
        }
    pthread_mutex_unlock(&s->lock);
}

/* Request threads held for long: followers of a run's events
 * (lib/journal.c), half of workers at most, per user as many as its runs;
 * request bodies being read, per owner a quarter of workers (one key's
 * slow bodies never take the threads of the others; many keys' together
 * are the web server's to bound, docs/web-servers.md). */
static struct cx_user_slots followers = CX_USER_SLOTS_INIT, bodies = CX_USER_SLOTS_INIT;

enum cx_err
cx_lane_follow(const struct cx_config *cfg, const char *user, unsigned per_user)
{
    return cx_user_slots_enter(&followers, user, per_user, cfg->workers / 2 ? cfg->workers / 2 : 1);
}

void
cx_lane_unfollow(const char *user)
{
    cx_user_slots_leave(&followers, user);
}

enum cx_err
cx_lane_body_enter(const struct cx_config *cfg, const char *owner, char *msg, size_t msglen)
{
    unsigned per_owner = cfg->workers / 4 ? cfg->workers / 4 : 1;
    enum cx_err rc = cx_user_slots_enter(&bodies, owner, per_owner, cfg->workers);

    if (rc == CX_ERR_TOO_MANY_RUNS)
        snprintf(msg, msglen,
                 "this key already sends %u request bodies, the most at once; "
                 "retry shortly",
                 per_owner);
    else if (rc)
        snprintf(msg, msglen, "every thread for request bodies is busy; retry shortly");
    return rc ? CX_ERR_BUSY : CX_OK;
}

void
cx_lane_body_leave(const char *owner)
{
    cx_user_slots_leave(&bodies, owner);
}
