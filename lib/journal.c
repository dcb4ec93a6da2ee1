#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "db.h"
#include "journal.h"
#include "lane.h"
#include "log.h"
#include "util.h"

#define JOURNAL_EVENTS_MAX 100000
#define JOURNAL_SLACK      (1024 * 1024) /* beyond max_output_bytes: statuses, displays */

CX_SQL(q_event_add, 4,
       "INSERT INTO run_events (run_id, seq, event, data) VALUES ($1::uuid, $2::int, $3, $4)");

static bool
journal_event(void *ctx, const char *name, json_t *data, unsigned id)
{
    struct cx_journal *j = ctx;
    unsigned seq = 0;
    (void)id;

    if (name) {
        char *text = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
        size_t n = text ? strlen(text) + strlen(name) : 0;

        seq = ++j->seq;
        if (!j->full && (j->seq > JOURNAL_EVENTS_MAX ||
                         j->bytes + n > j->cx->cfg->max_output_bytes + JOURNAL_SLACK)) {
            j->full = true;
            cx_log_info("run %s: its events past %u are told, not kept", j->run_id, seq - 1);
        }
        if (text && !j->full) {
            char seq_s[16];
            const char *p[4] = {j->run_id, seq_s, name, text};

            snprintf(seq_s, sizeof(seq_s), "%u", seq);
            /* the run's end (a durable COMMIT) makes them durable */
            if (cx_db_exec_all(j->cx->db, &(struct cx_db_call){&q_event_add, p, NULL}, 1, false))
                cx_log_warn(0, "run %s: event %u could not be kept", j->run_id, seq);
            else {
                j->bytes += n;
                j->kept++;
            }
        }
        free(text);
    }
    if (j->inner && !j->inner->fn(j->inner->ctx, name, data, seq))
        j->inner = NULL; /* the client is gone; the events are still kept */
    return true;
}

void
cx_journal_open(struct cx_journal *j, struct cx_ctx *cx, const char *run_id,
                const struct cx_run_sink *inner)
{
    *j = (struct cx_journal){.cx = cx, .inner = inner};
    snprintf(j->run_id, sizeof(j->run_id), "%s", run_id);
    j->sink = (struct cx_run_sink){.fn = journal_event, .ctx = j};
}

/* ------------------------------------------------------------------------ */
/* Followers                                                                */

/* Followers hold a request thread each for as long as their run: at most
 * half the workers at once, and per user as many as the user may have
 * runs in progress (lane.h, cx_lane_follow). */
static volatile int followers_stop;

void
cx_run_events_stop(void)
{
    followers_stop = 1;
}

static enum cx_err
follower_enter(const struct cx_config *cfg, const char *user, char *msg, size_t msglen)
{
    struct cx_lane_limits lim;
    enum cx_err rc;

    cx_lane_limits(cfg, &lim);
    rc = cx_lane_follow(cfg, user, lim.per_user);
    if (rc == CX_ERR_TOO_MANY_RUNS)
        snprintf(msg, msglen, "this user already follows %u runs' events, the most at once",
                 lim.per_user);
    else if (rc)
        snprintf(msg, msglen, "every thread for event streams is busy; retry shortly");
    return rc;
}

static void
follower_leave(const char *user)
{
    cx_lane_unfollow(user);
}

#define FOLLOW_BATCH   100
#define FOLLOW_POLL_US (250 * 1000)

CX_SQL(q_events_after, 3,
       "SELECT r.status, e.seq, e.event, e.data FROM runs r LEFT JOIN LATERAL"
       " (SELECT seq, event, data FROM run_events WHERE run_id = r.id AND seq > $3::int"
       " ORDER BY seq LIMIT 100) e ON true WHERE r.id = $1::uuid AND r.user_id = $2"
       " ORDER BY e.seq");

/* Tells the events of one batch; how many, or -1 when the client is gone. */
static int
tell_batch(PGresult *r, const struct cx_run_sink *sink, unsigned *after)
{
    int told = 0;

    for (int i = 0; i < PQntuples(r); i++) {
        json_t *data;
        unsigned seq;

        if (PQgetisnull(r, i, 1))
            continue;
        seq = (unsigned)strtoul(PQgetvalue(r, i, 1), NULL, 10);
        data = json_loads(PQgetvalue(r, i, 3), JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (data && !sink->fn(sink->ctx, PQgetvalue(r, i, 2), data, seq)) {
            json_decref(data);
            return -1;
        }
        json_decref(data);
        *after = seq;
        told++;
    }
    return told;
}

static enum cx_err
tell_result(struct cx_ctx *cx, const char *user, const char *run_id, const struct cx_run_sink *sink,
            unsigned id)
{
    json_t *result = NULL;
    enum cx_err rc = cx_run_get(cx, user, run_id, &result);

    if (rc == CX_OK)
        sink->fn(sink->ctx, "result", result, id);
    json_decref(result);
    return rc;
}

/* Waits before the next poll, with a heartbeat when one is due; false
 * when the client is gone. */
static bool
wait_poll(const struct cx_run_sink *sink, int64_t *said)
{
    if (cx_now_us() - *said >= CX_RUN_HEARTBEAT_MS * 1000LL) {
        if (!sink->fn(sink->ctx, NULL, NULL, 0))
            return false;
        *said = cx_now_us();
    }
    usleep(FOLLOW_POLL_US);
    return true;
}

enum cx_err
cx_run_events(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id, unsigned after,
              const struct cx_run_sink *sink, char *msg, size_t msglen)
{
    const struct cx_config *cfg = cx->cfg;
    /* as long as a run can last, as the sweep of abandoned runs counts */
    int64_t deadline =
        cx_now_us() + (int64_t)(cfg->max_timeout + cfg->interrupt_grace + 600) * 1000000;
    int64_t said = cx_now_us();
    bool found = false;
    enum cx_err rc;

    snprintf(msg, msglen, "no such run");
    if (!cx_uuid_valid(run_id))
        return CX_ERR_NOT_FOUND;
    rc = follower_enter(cfg, who->user, msg, msglen);
    if (rc)
        return rc;
    while (!followers_stop) {
        char after_s[16];
        const char *p[3] = {run_id, who->user, after_s};
        PGresult *r = NULL;
        bool ended;
        int told;

        snprintf(after_s, sizeof(after_s), "%u", after);
        rc = cx_db_exec(cx->db, &q_events_after, p, &r);
        if (rc == CX_OK && PQntuples(r) == 0)
            rc = found ? CX_OK : CX_ERR_NOT_FOUND; /* (deleted meanwhile: the end) */
        if (rc || PQntuples(r) == 0) {
            PQclear(r);
            break;
        }
        /* one snapshot: a run that ended there has all its events in it */
        ended = strcmp(PQgetvalue(r, 0, 0), "running") &&
                strcmp(PQgetvalue(r, 0, 0), "pending_approval");
        told = tell_batch(r, sink, &after);
        PQclear(r);
        if (told == 0 && !ended && !found && !sink->fn(sink->ctx, NULL, NULL, 0))
            told = -1; /* (the stream begins now, not at the first event) */
        found = true;
        if (told < 0)
            break; /* the client is gone */
        if (told > 0)
            said = cx_now_us();
        if (told == FOLLOW_BATCH)
            continue;
        if (ended) {
            rc = tell_result(cx, who->user, run_id, sink, after + 1);
            break;
        }
        if (cx_now_us() >= deadline || !wait_poll(sink, &said))
            break; /* (at the deadline the client resumes with Last-Event-ID) */
    }
    follower_leave(who->user);
    return rc;
}
