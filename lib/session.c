#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "config.h"
#include "db.h"
#include "gateway.h"
#include "kernel.h"
#include "log.h"
#include "metrics.h"
#include "budget.h"
#include "prestart.h"
#include "sessdb.h"
#include "session.h"
#include "util.h"

/* Advisory lock keys: one per conversation, one per user (creation). The
 * separator cannot occur in either part (users have no control characters,
 * conversation ids are [A-Za-z0-9._:-]). */
#define CONV_KEY "hashtextextended($1 || E'\\n' || $2, 0)"
#define USER_KEY "hashtextextended('user' || E'\\n' || $1, 1)"

/* The timeout goes back to none once the lock is taken; when the wait
 * fails, the statement's transaction rolls back, and the setting with it. */
CX_SQL(q_lock_wait, 3,
       "SELECT set_config('lock_timeout', $3, false), pg_advisory_lock(" CONV_KEY "),"
       " set_config('lock_timeout', '0', false)");
CX_SQL(q_lock_try, 2, "SELECT pg_try_advisory_lock(" CONV_KEY ")");
CX_SQL(q_unlock, 2, "SELECT pg_advisory_unlock(" CONV_KEY ")");
CX_SQL(q_user_lock, 2,
       "SELECT set_config('lock_timeout', $2, false), pg_advisory_lock(" USER_KEY "),"
       " set_config('lock_timeout', '0', false)");
CX_SQL(q_user_unlock, 1, "SELECT pg_advisory_unlock(" USER_KEY ")");
/* The same lock for a transaction: let go at its end, once what it made
 * is visible. The timeout is the lock's only. */
CX_SQL(q_user_xact_lock, 2,
       "SELECT set_config('lock_timeout', $2, true), pg_advisory_xact_lock(" USER_KEY "),"
       " set_config('lock_timeout', '0', true)");

#define EXPIRES CX_SQL_UTC("expires_at")

CX_SQL(q_touch, 3,
       "UPDATE sessions SET last_used_at = now(), cleanup_failures = 0, cleanup_after = NULL,"
       " expires_at = greatest(expires_at, now() + make_interval(secs => $3::int))"
       " WHERE user_id = $1 AND conversation_id = $2"
       " RETURNING id, coalesce(kernel_id, ''), workspace, kernel_fresh, gateway_url, " EXPIRES
       ", capture_rescan, language");
/* Sessions with a kernel count toward the cap; an evicted one keeps its row
 * (without a kernel) so its next run can say session.reset. */
#define COUNT(user)                                                                                \
    "(SELECT count(*) FROM sessions WHERE user_id = " user " AND kernel_id IS NOT NULL)"
CX_SQL(q_count, 1, "SELECT " COUNT("$1"));
CX_SQL(q_lru, 2,
       "SELECT conversation_id FROM sessions WHERE user_id = $1 AND conversation_id <> $2"
       " AND kernel_id IS NOT NULL ORDER BY last_used_at LIMIT 64");
CX_SQL(q_evicted, 1, "UPDATE sessions SET kernel_id = NULL WHERE id = $1::uuid");
CX_SQL(q_insert, 7,
       "INSERT INTO sessions (id, user_id, conversation_id, gateway_url, expires_at, workspace,"
       " language) VALUES ($1::uuid, $2, $3, $4, now() + make_interval(secs => $5::int), $6, $7)"
       " RETURNING " EXPIRES);
/* A pooled kernel claimed and the session's row made of it, in one
 * statement: one round trip, one commit, and a failure leaves the kernel
 * pooled. No row: the pool had none ready, or the user's sessions with a
 * kernel are at the cap ($7), counted in this statement's own snapshot (so
 * after the user's lock, taken by an earlier one). $1 and $2 are the
 * claim's (lib/prestart.h), then user, conversation, ttl, language. */
#define CLAIM_UNDER_THE_CAP CX_PRESTART_CLAIM_CTES(COUNT("$3") " < $7::int")
CX_SQL(q_insert_pooled, 7,
       "WITH " CLAIM_UNDER_THE_CAP ", s AS (INSERT INTO sessions (id, user_id,"
       " conversation_id, gateway_url, expires_at, workspace, language, kernel_id, kernel_fresh)"
       " SELECT claim.id, $3, $4, $1, now() + make_interval(secs => $5::int),"
       " '" CX_WORKSPACE_PREFIX "' || claim.id, $6, claim.kernel_id, true FROM claim"
       " RETURNING id, kernel_id, workspace, " EXPIRES " AS expires)"
       " SELECT s.id, s.kernel_id, s.workspace, s.expires, pool.ready FROM s, pool");
CX_SQL(q_set_kernel, 3,
       "UPDATE sessions SET kernel_id = $2, gateway_url = $3, kernel_fresh = true"
       " WHERE id = $1::uuid");
CX_SQL(q_gw_lock, 1,
       "SELECT pg_advisory_xact_lock(hashtextextended('gateway' || E'\\n' || $1, 4))");
CX_SQL(q_reserve, 2, "UPDATE sessions SET kernel_id = '', gateway_url = $2 WHERE id = $1::uuid");
CX_SQL(q_idle_any, 2,
       "SELECT user_id, conversation_id FROM sessions WHERE gateway_url = $1"
       " AND kernel_id IS NOT NULL AND kernel_id <> '' AND id <> $2::uuid"
       " ORDER BY last_used_at LIMIT 64");
CX_SQL(q_release, 3,
       "UPDATE sessions SET kernel_fresh = $2::boolean, capture_rescan = $3::boolean,"
       " last_used_at = now() WHERE id = $1::uuid");
CX_SQL(q_get, 2,
       "SELECT id, coalesce(kernel_id, ''), gateway_url FROM sessions"
       " WHERE user_id = $1 AND conversation_id = $2");
CX_SQL(q_delete, 1, "DELETE FROM sessions WHERE id = $1::uuid");
CX_SQL(q_expired, 1,
       "SELECT id, user_id, conversation_id, coalesce(kernel_id, ''), gateway_url FROM sessions"
       " WHERE expires_at < now() AND (cleanup_after IS NULL OR cleanup_after < now())"
       " ORDER BY expires_at LIMIT $1::int");

void
cx_session_workspace_name(const char *id, char out[CX_WORKSPACE_MAX])
{
    snprintf(out, CX_WORKSPACE_MAX, CX_WORKSPACE_PREFIX "%s", id);
}

/* Takes the conversation's lock if no one holds it; never waits. */
static enum cx_err
try_lock(struct cx_ctx *cx, const char *user, const char *cid, bool *got)
{
    const char *p[2] = {user, cid};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_lock_try, p, &r);

    *got = rc == CX_OK && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (*got)
        cx_db_pin(cx->db); /* the lock lives on this connection */
    return rc;
}

/* After a failed statement that waits for a lock (q_lock_wait, q_user_lock
 * and what follows them): true when the wait timed out, busy (the
 * lock_timeout it set went with the statement's rollback). Otherwise the
 * lock may have been granted before the failure, and a session-level lock
 * outlives the statement: it is let go (p: the unlock's parameters). */
static bool
lock_wait_timed_out(struct cx_ctx *cx, struct cx_sql *unlock, const char *const *p)
{
    if (cx_db_lock_timed_out(cx->db))
        return true;
    if (cx_db_connection_ok(cx->db) && cx_db_exec(cx->db, unlock, p, NULL))
        cx_log_warn(0, "advisory unlock failed; the lock ends with the connection");
    return false;
}

static enum cx_err
lock_conversation(struct cx_ctx *cx, const char *user, const char *cid, bool *got)
{
    char wait[32];
    const char *p[3] = {user, cid, wait};
    enum cx_err rc;

    *got = false;
    if (cx->cfg->busy_wait == 0)
        return try_lock(cx, user, cid, got);
    snprintf(wait, sizeof(wait), "%us", cx->cfg->busy_wait);
    rc = cx_db_exec(cx->db, &q_lock_wait, p, NULL);
    if (rc == CX_OK) {
        *got = true;
        cx_db_pin(cx->db);
    } else if (lock_wait_timed_out(cx, &q_unlock, p)) {
        rc = CX_OK; /* busy */
    }
    return rc;
}

/* The conversation's lock and its session row touched (*r: the row, or no
 * row), in one round trip when runs wait for the lock; also (or NULL) after
 * them in that round trip (*also_done). *got: the lock is held (also when
 * the touch then failed). */
static enum cx_err
lock_and_touch(struct cx_ctx *cx, struct cx_session *s, const char *ttl,
               const struct cx_db_call *also, bool *also_done, bool *got, PGresult **r)
{
    char wait[32];
    const char *pl[3] = {s->user, s->conversation_id, wait};
    const char *pt[3] = {s->user, s->conversation_id, ttl};
    struct cx_db_call calls[3] = {{&q_lock_wait, pl, NULL}, {&q_touch, pt, r}};
    size_t n = 2;
    enum cx_err rc;

    *got = false;
    *also_done = false;
    *r = NULL;
    if (cx->cfg->busy_wait == 0) {
        rc = try_lock(cx, s->user, s->conversation_id, got);
        return rc || !*got ? rc : cx_db_exec(cx->db, &q_touch, pt, r);
    }
    if (also)
        calls[n++] = *also;
    snprintf(wait, sizeof(wait), "%us", cx->cfg->busy_wait);
    rc = cx_db_exec_all(cx->db, calls, n, false); /* the run's end makes it durable */
    if (rc == CX_OK) {
        *got = true;
        *also_done = also != NULL;
        cx_db_pin(cx->db); /* the lock lives on this connection */
        return CX_OK;
    }
    return lock_wait_timed_out(cx, &q_unlock, pl) ? CX_OK : rc; /* busy, or the failure */
}

static void
unlock_conversation(struct cx_ctx *cx, const char *user, const char *cid)
{
    const char *p[2] = {user, cid};

    if (cx_db_exec(cx->db, &q_unlock, p, NULL))
        cx_log_warn(0, "advisory unlock failed; the lock ends with the connection");
    cx_db_unpin(cx->db);
}

/* A cleanup that failed (the gateway could not delete the kernel) is tried
 * again later, each time later still (30 s, 1 min, 2 min, ... an hour), so
 * that no session holds up the reaping of the others. The row stays, due
 * for the reaper. */
CX_SQL(q_defer, 1,
       "UPDATE sessions SET"
       " expires_at = least(expires_at, now()), cleanup_failures = cleanup_failures + 1,"
       " cleanup_after = now() + make_interval(secs => least(3600,"
       " 30 * power(2, least(cleanup_failures, 7)))::int) WHERE id = $1::uuid");

static enum cx_err
defer(struct cx_ctx *cx, const char *id, enum cx_err why)
{
    const char *p[1] = {id};

    cx_log_warn(0, "session %s: deleting its kernel failed (%s); retried later", id,
                cx_strerror(why));
    if (cx_db_exec(cx->db, &q_defer, p, NULL))
        cx_log_warn(0, "session %s: could not record the failed cleanup", id);
    return why;
}

/* Deletes the kernel and (unless keep_row) the row of a session whose lock
 * we hold. Nothing runs in the session's kernel: the sandbox's workspace is
 * a tmpfs that goes with it. When the gateway fails, the row stays (due for
 * the reaper) and the cleanup is retried later. */
static enum cx_err
close_locked(struct cx_ctx *cx, const char *id, const char *kernel_id, const char *gateway_url,
             bool keep_row)
{
    struct cx_gateway *gw = cx_ctx_gateway(cx, gateway_url);
    const char *p[1] = {id};
    enum cx_err rc;

    /* (A gateway the configuration no longer lists: its kernels are not
     * codexec's to reach any more.) */
    if (kernel_id && *kernel_id && gw) {
        cx_kernel_pool_forget(kernel_id);
        rc = cx_gateway_kernel_delete(gw, kernel_id);
        /* An eviction goes on when the kernel's gateway went away (the
         * call failed, not timed out, and so does a probe): no row names
         * the kernel from now on, and the reconciler deletes it once the
         * gateway is back (kernel_orphan_grace). The run that needed the
         * room does not fail for a gateway it does not use. A gateway that
         * is only slow keeps the row: its kernel still counts. */
        if (rc && !(keep_row && rc == CX_ERR_GATEWAY && !cx_gateway_recheck(gw)))
            return defer(cx, id, rc);
    }
    rc = cx_db_exec(cx->db, keep_row ? &q_evicted : &q_delete, p, NULL);
    if (rc == CX_OK)
        cx_log_info("session %s %s", id, keep_row ? "evicted" : "closed");
    return rc;
}

static enum cx_err
close_by_conversation(struct cx_ctx *cx, const char *user, const char *cid, bool keep_row)
{
    const char *p[2] = {user, cid};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec_row(cx->db, &q_get, p, &r);

    if (rc == CX_OK)
        rc = close_locked(cx, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2),
                          keep_row);
    PQclear(r);
    return rc;
}

/* At the cap (n: the user's sessions with a kernel): close the least
 * recently used session that no run holds. */
static enum cx_err
make_room(struct cx_ctx *cx, const char *user, const char *cid, long n)
{
    const char *p[2] = {user, cid};
    PGresult *r = NULL;
    enum cx_err rc;

    if (n < (long)cx->cfg->max_sessions_per_user)
        return CX_OK;
    rc = cx_db_exec(cx->db, &q_lru, p, &r);
    if (rc)
        return rc;
    rc = CX_ERR_QUOTA;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *other = PQgetvalue(r, i, 0);
        bool got;

        if (try_lock(cx, user, other, &got))
            break;
        if (!got)
            continue; /* a run holds it */
        rc = close_by_conversation(cx, user, other, true);
        unlock_conversation(cx, user, other);
        if (rc == CX_ERR_NOT_FOUND)
            continue;
        if (rc == CX_OK) {
            cx_log_info("closed the least recently used session to make room");
            cx_metrics_count_by(CX_FAMILY_EVICTIONS, "user_sessions");
        }
        break;
    }
    PQclear(r);
    return rc;
}

static enum cx_err
start_kernel(struct cx_ctx *cx, struct cx_session *s, char *msg, size_t msglen)
{
    const char *p[3] = {s->id, NULL, s->gateway_url};
    const char *name = cx_config_kernel_name(cx->cfg, s->lang);
    char kid[64];
    enum cx_err rc;

    if (!name) {
        snprintf(msg, msglen, "this server no longer runs %s", cx_lang_name(s->lang));
        return CX_ERR_INVALID;
    }
    rc = cx_gateway_kernel_start(s->gw, name, kid, msg, msglen);
    if (rc)
        return rc;
    p[1] = kid;
    rc = cx_db_exec(cx->db, &q_set_kernel, p, NULL);
    if (rc) {
        if (cx_gateway_kernel_delete(s->gw, kid))
            cx_log_warn(0, "could not delete kernel %s after a database error", kid);
        return rc;
    }
    snprintf(s->kernel_id, sizeof(s->kernel_id), "%s", kid);
    s->kernel_fresh = true;
    s->from_pool = false; /* a kernel of its own now, never warmed */
    cx_log_info("session %s: kernel %s started", s->id, kid);
    return CX_OK;
}

/* Inserts the session's row (s->id set; p[5] is s->workspace, p[6] its
 * language): its workspace and expiry. */
static enum cx_err
insert_row(struct cx_ctx *cx, struct cx_session *s, const char *const *p)
{
    PGresult *r = NULL;
    enum cx_err rc;

    cx_session_workspace_name(s->id, s->workspace);
    rc = cx_db_exec(cx->db, &q_insert, p, &r);
    if (rc)
        return rc;
    snprintf(s->expires_at, sizeof(s->expires_at), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return CX_OK;
}

/* How long a creation waits for the user's creation lock ("<n>s"): as a
 * run waits for its conversation (busy_wait), never for ever, as another
 * creation of this user's may take a while. */
static void
user_wait(const struct cx_ctx *cx, char wait[32])
{
    snprintf(wait, 32, "%us", cx->cfg->busy_wait ? cx->cfg->busy_wait : 1);
}

/* Takes a pre-started kernel and makes the session's row of it, in one
 * statement: a failure leaves the kernel pooled. *got is false when the
 * pool has none ready or the user is at the cap; *left is how many ready
 * kernels the claim left (as far as it saw: a claim at the same moment
 * counts as not yet taken).
 *
 * lock: the caller does not hold the user's creation lock (room_begin());
 * the claim then takes it for its own transaction, in the same round trip,
 * and a wait for it that times out is CX_ERR_CONFLICT. Otherwise the
 * caller made room (make_room()), which the claim does not count again: a
 * user above the cap (lowered since) takes a pooled kernel after one
 * eviction, as a started one would. */
static enum cx_err
create_from_pool(struct cx_ctx *cx, struct cx_session *s, const char *ttl, bool lock, bool *got,
                 long *left, char *msg, size_t msglen)
{
    char cap[16], wait[32];
    const char *p[7] = {s->gateway_url,
                        cx_config_kernel_name(cx->cfg, s->lang),
                        s->user,
                        s->conversation_id,
                        ttl,
                        cx_lang_name(s->lang),
                        cap};
    const char *ul[2] = {s->user, wait};
    PGresult *r = NULL;
    /* the count in the claim's statement reads a snapshot taken once the
     * lock is held: the last holder's sessions committed */
    struct cx_db_call calls[2] = {{&q_user_xact_lock, ul, NULL}, {&q_insert_pooled, p, &r}};
    enum cx_err rc;

    *got = false;
    *left = 0;
    if (!p[1])
        return CX_OK;
    snprintf(cap, sizeof(cap), "%u", lock ? cx->cfg->max_sessions_per_user : INT_MAX);
    user_wait(cx, wait);
    rc =
        lock ? cx_db_exec_all(cx->db, calls, 2, true) : cx_db_exec(cx->db, &q_insert_pooled, p, &r);
    if (rc && lock && cx_db_lock_timed_out(cx->db)) {
        snprintf(msg, msglen, "another session of this user is being started; retry later");
        return CX_ERR_CONFLICT;
    }
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        snprintf(s->id, sizeof(s->id), "%s", PQgetvalue(r, 0, 0));
        snprintf(s->kernel_id, sizeof(s->kernel_id), "%s", PQgetvalue(r, 0, 1));
        snprintf(s->workspace, sizeof(s->workspace), "%s", PQgetvalue(r, 0, 2));
        snprintf(s->expires_at, sizeof(s->expires_at), "%s", PQgetvalue(r, 0, 3));
        *left = strtol(PQgetvalue(r, 0, 4), NULL, 10) - 1;
        *got = true;
    }
    PQclear(r);
    if (!*got)
        return CX_OK;
    s->kernel_fresh = true;
    s->from_pool = true;
    s->created = true;
    cx_log_info("session %s created with pooled kernel %s", s->id, s->kernel_id);
    return CX_OK;
}

/* Ends room_begin(). */
static void
room_end(struct cx_ctx *cx, const struct cx_session *s)
{
    const char *ul[1] = {s->user};

    if (cx_db_exec(cx->db, &q_user_unlock, ul, NULL))
        cx_log_warn(0, "user advisory unlock failed");
    cx_db_unpin(cx->db);
}

/* Before a session of the user gets a kernel: takes the user's lock (so
 * two creations can't both see room) and makes room under the cap. On
 * CX_OK the caller ends with room_end(). */
static enum cx_err
room_begin(struct cx_ctx *cx, const struct cx_session *s, char *msg, size_t msglen)
{
    char wait[32];
    const char *ul[2] = {s->user, wait};
    PGresult *r = NULL;
    /* the count after the lock, in the same round trip: each statement of
     * the pipeline reads a snapshot of its own, taken once the lock is
     * held (the last holder's session committed) */
    struct cx_db_call calls[2] = {{&q_user_lock, ul, NULL}, {&q_count, ul, &r}};
    enum cx_err rc;
    long n;

    user_wait(cx, wait);
    rc = cx_db_exec_all(cx->db, calls, 2, true);
    if (rc && lock_wait_timed_out(cx, &q_user_unlock, ul)) {
        snprintf(msg, msglen, "another session of this user is being started; retry later");
        return CX_ERR_CONFLICT;
    }
    if (rc)
        return rc;
    cx_db_pin(cx->db);
    n = strtol(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    rc = make_room(cx, s->user, s->conversation_id, n);
    if (rc == CX_ERR_QUOTA)
        snprintf(msg, msglen, "all %u sessions of this user are busy",
                 cx->cfg->max_sessions_per_user);
    if (rc)
        room_end(cx, s);
    return rc;
}

/* The usable gateway with the most room in its budget (lib/budget.h: by
 * its memory, or a count), into s; *room is that room (0 or less: full),
 * *at its index. CX_ERR_GATEWAY when none is usable. */
static enum cx_err
pick_gateway(struct cx_ctx *cx, struct cx_session *s, long *room, unsigned *at_out)
{
    int at = -1;

    for (unsigned i = 0; i < cx->ngws; i++) {
        long used, free_;

        if (!cx_gateway_usable(cx->gws[i]))
            continue;
        if (cx_budget_kernels(cx, cx->cfg->gateways[i].url, &used))
            return CX_ERR_DB;
        free_ = cx_budget_room(cx, i, used);
        if (at < 0 || free_ > *room) {
            at = (int)i;
            *room = free_;
        }
    }
    if (at < 0)
        return CX_ERR_GATEWAY;
    s->gw = cx->gws[at];
    *at_out = (unsigned)at;
    snprintf(s->gateway_url, sizeof(s->gateway_url), "%s", cx->cfg->gateways[at].url);
    return CX_OK;
}

/* The gateway to claim a pooled kernel on (its pooled kernels are counted
 * in its budget already): the only usable one without asking its count
 * (one round trip less for a new conversation), else pick_gateway()'s. */
static enum cx_err
pool_gateway(struct cx_ctx *cx, struct cx_session *s)
{
    unsigned at = 0, usable = 0;
    long room = 0;

    for (unsigned i = 0; i < cx->ngws; i++)
        if (cx_gateway_usable(cx->gws[i])) {
            usable++;
            at = i;
        }
    if (usable != 1)
        return pick_gateway(cx, s, &room, &at);
    s->gw = cx->gws[at];
    snprintf(s->gateway_url, sizeof(s->gateway_url), "%s", cx->cfg->gateways[at].url);
    return CX_OK;
}

/* Counts the gateway's kernels and, while it has room, marks the session
 * as starting one there (an empty kernel_id counts): one step under the
 * gateway's lock, so no two starts take the last place. */
static enum cx_err
reserve(struct cx_ctx *cx, struct cx_session *s, unsigned at, bool *got)
{
    const char *g[1] = {s->gateway_url}, *u[2] = {s->id, s->gateway_url};
    enum cx_err rc = cx_db_begin(cx->db);
    long used = 0;

    *got = false;
    if (rc == CX_OK)
        rc = cx_db_exec(cx->db, &q_gw_lock, g, NULL);
    if (rc == CX_OK)
        rc = cx_budget_kernels(cx, s->gateway_url, &used);
    if (rc == CX_OK && cx_budget_room(cx, at, used) > 0) {
        *got = true;
        rc = cx_db_exec(cx->db, &q_reserve, u, NULL);
    }
    if (rc == CX_OK && *got)
        return cx_db_commit(cx->db);
    cx_db_rollback(cx->db);
    return rc;
}

/* At the gateway's budget: closes its least recently used idle session, of
 * any user (its owner's next run says session.reset). CX_ERR_CAPACITY when
 * every session there is busy. */
static enum cx_err
evict_any(struct cx_ctx *cx, const struct cx_session *s)
{
    const char *p[2] = {s->gateway_url, s->id};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_idle_any, p, &r);

    if (rc)
        return rc;
    rc = CX_ERR_CAPACITY;
    for (int i = 0; i < PQntuples(r) && rc == CX_ERR_CAPACITY; i++) {
        const char *user = PQgetvalue(r, i, 0), *cid = PQgetvalue(r, i, 1);
        bool got;

        if (try_lock(cx, user, cid, &got) || !got)
            continue; /* a run holds it */
        if (close_by_conversation(cx, user, cid, true) == CX_OK) {
            cx_log_info("a gateway at its kernel budget: closed the least recently used idle "
                        "session");
            cx_metrics_count_by(CX_FAMILY_EVICTIONS, "gateway_budget");
            rc = CX_OK;
        }
        unlock_conversation(cx, user, cid);
    }
    PQclear(r);
    return rc;
}

/* A place for a new kernel of s (whose row exists): a usable gateway with
 * room, made by evicting idle sessions when every budget is spent. */
static enum cx_err
place(struct cx_ctx *cx, struct cx_session *s, char *msg, size_t msglen)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        long room = 0;
        unsigned at = 0;
        bool got = false;
        enum cx_err rc = pick_gateway(cx, s, &room, &at);

        if (rc == CX_ERR_GATEWAY)
            snprintf(msg, msglen, "no gateway is usable; retry later");
        if (rc)
            return rc;
        if (room > 0) {
            rc = reserve(cx, s, at, &got);
            if (rc || got)
                return rc;
        }
        rc = evict_any(cx, s);
        if (rc == CX_ERR_CAPACITY)
            snprintf(msg, msglen,
                     "every gateway is at its kernel budget (its memory, or "
                     "max_kernels) and no session is idle; retry later");
        if (rc)
            return rc;
    }
    snprintf(msg, msglen, "no room for a kernel now; retry later");
    return CX_ERR_CAPACITY;
}

/* Probes every gateway now; whether one is usable. */
static bool
recheck_all(struct cx_ctx *cx)
{
    bool any = false;

    for (unsigned i = 0; i < cx->ngws; i++)
        any |= cx_gateway_recheck(cx->gws[i]);
    return any;
}

/* place() and start_kernel(), once more when the answer they went by was
 * stale: the start failed because its gateway just went away (its probe
 * had not noticed yet), or no gateway was usable by their last probes and
 * one is back now (a busy gateway can miss a probe). */
static enum cx_err
place_and_start(struct cx_ctx *cx, struct cx_session *s, char *msg, size_t msglen)
{
    enum cx_err rc = place(cx, s, msg, msglen);
    bool placed = rc == CX_OK;

    if (placed)
        rc = start_kernel(cx, s, msg, msglen);
    if (rc != CX_ERR_GATEWAY && rc != CX_ERR_TIMEOUT)
        return rc;
    if (placed ? cx_gateway_recheck(s->gw) : !recheck_all(cx))
        return rc;
    if (placed)
        cx_log_warn(0, "session %s: gateway %s went away; placing its kernel elsewhere", s->id,
                    s->gateway_url);
    rc = place(cx, s, msg, msglen);
    if (rc == CX_OK)
        rc = start_kernel(cx, s, msg, msglen);
    return rc;
}

/* create_from_pool() on the pool's gateway, and the pool's refill asked
 * for: a kernel taken, or wanted (lock: not yet wanted, the caller tries
 * again under the lock). */
static enum cx_err
claim_pooled(struct cx_ctx *cx, struct cx_session *s, const char *ttl, bool lock, bool *got,
             char *msg, size_t msglen)
{
    long left = 0;
    enum cx_err rc;

    *got = false;
    if (pool_gateway(cx, s) != CX_OK)
        return CX_OK;
    rc = create_from_pool(cx, s, ttl, lock, got, &left, msg, msglen);
    /* after the new conversation's first runs while the pool still holds
     * a kernel */
    if (*got && left > 0)
        cx_prestart_kick_after(CX_POOL_REFILL_DELAY_MS);
    else if (*got || !lock)
        cx_prestart_kick();
    return rc;
}

/* A new conversation's session. With a pool, the common case (room under
 * the cap, a kernel ready) is one round trip: the claim under the user's
 * lock for its transaction. Otherwise, under the lock held throughout
 * (room_begin()): room made by evicting, then a pooled kernel or one
 * started. */
static enum cx_err
create_session(struct cx_ctx *cx, struct cx_session *s, unsigned ttl, char *msg, size_t msglen)
{
    char ttl_s[16];
    const char *p[7] = {s->id, s->user,      s->conversation_id,   s->gateway_url,
                        ttl_s, s->workspace, cx_lang_name(s->lang)};
    bool pooled = cx_config_pool_size(cx->cfg, s->lang) > 0, got = false;
    enum cx_err rc;

    snprintf(ttl_s, sizeof(ttl_s), "%u", ttl);
    if (pooled) {
        rc = claim_pooled(cx, s, ttl_s, true, &got, msg, msglen);
        if (rc || got)
            return rc;
    }
    rc = room_begin(cx, s, msg, msglen);
    if (rc)
        return rc;
    if (pooled) {
        rc = claim_pooled(cx, s, ttl_s, false, &got, msg, msglen);
        if (rc || got)
            goto out;
    }
    cx_uuid_generate(s->id);
    snprintf(s->gateway_url, sizeof(s->gateway_url), "%s", cx->cfg->gateways[0].url);
    rc = insert_row(cx, s, p);
    if (rc)
        goto out;
    rc = place_and_start(cx, s, msg, msglen);
    if (rc) {
        const char *d[1] = {s->id};
        if (cx_db_exec(cx->db, &q_delete, d, NULL))
            cx_log_warn(0, "cleanup of session %s after a failed start failed", s->id);
        goto out;
    }
    s->created = true;
    cx_log_info("session %s created", s->id);
out:
    room_end(cx, s);
    return rc;
}

enum cx_err
cx_session_move_kernel(struct cx_ctx *cx, struct cx_session *s, char *msg, size_t msglen)
{
    struct cx_gateway *old_gw = s->gw;
    char old[64];
    enum cx_err rc = room_begin(cx, s, msg, msglen);

    if (rc)
        return rc;
    snprintf(old, sizeof(old), "%s", s->kernel_id);
    if (old[0] && old_gw) {
        cx_kernel_pool_forget(old);
        /* (unusable: its reconciler deletes it once it is back) */
        if (cx_gateway_usable(old_gw) && cx_gateway_kernel_delete(old_gw, old))
            cx_log_warn(0, "could not delete the kernel %s left behind", old);
    }
    s->kernel_id[0] = '\0';
    rc = place_and_start(cx, s, msg, msglen);
    if (rc == CX_OK) {
        s->reset = true;
        cx_log_info("session %s: kernel started again", s->id);
    }
    room_end(cx, s);
    return rc;
}

static enum cx_err
acquire(struct cx_ctx *cx, const char *user, const char *cid, unsigned ttl, enum cx_lang lang,
        bool create, const struct cx_db_call *also, bool *also_done, struct cx_session *s,
        char *msg, size_t msglen)
{
    char ttl_s[16];
    PGresult *r = NULL;
    enum cx_err rc;
    bool got;

    memset(s, 0, sizeof(*s));
    snprintf(s->user, sizeof(s->user), "%s", user);
    snprintf(s->conversation_id, sizeof(s->conversation_id), "%s", cid);
    s->lang = lang == CX_LANG_ANY ? CX_LANG_PYTHON : lang;
    snprintf(ttl_s, sizeof(ttl_s), "%u", ttl);
    rc = lock_and_touch(cx, s, ttl_s, also, also_done, &got, &r);
    s->locked = got;
    if (rc)
        goto fail;
    if (!got) {
        snprintf(msg, msglen, "another run holds this conversation; retry later");
        return CX_ERR_CONFLICT;
    }
    if (PQntuples(r) == 0) {
        PQclear(r);
        if (!create) {
            cx_session_release(cx, s);
            snprintf(msg, msglen, "this conversation has no session");
            return CX_ERR_NOT_FOUND;
        }
        rc = create_session(cx, s, ttl, msg, msglen);
        if (rc)
            goto fail;
        return CX_OK;
    }
    snprintf(s->id, sizeof(s->id), "%s", PQgetvalue(r, 0, 0));
    snprintf(s->kernel_id, sizeof(s->kernel_id), "%s", PQgetvalue(r, 0, 1));
    snprintf(s->workspace, sizeof(s->workspace), "%s", PQgetvalue(r, 0, 2));
    s->kernel_fresh = PQgetvalue(r, 0, 3)[0] == 't';
    s->capture_rescan = PQgetvalue(r, 0, 6)[0] == 't';
    snprintf(s->expires_at, sizeof(s->expires_at), "%s", PQgetvalue(r, 0, 5));
    snprintf(s->gateway_url, sizeof(s->gateway_url), "%s", PQgetvalue(r, 0, 4));
    if (!cx_lang_parse(PQgetvalue(r, 0, 7), &s->lang))
        s->lang = CX_LANG_PYTHON;
    PQclear(r);
    if (lang != CX_LANG_ANY && lang != s->lang) {
        snprintf(msg, msglen,
                 "this conversation's session runs %s: %s runs need another conversation (or "
                 "this one's session closed first)",
                 cx_lang_name(s->lang), cx_lang_name(lang));
        rc = CX_ERR_LANGUAGE_MISMATCH;
        goto fail;
    }
    s->gw = cx_ctx_gateway(cx, s->gateway_url);
    /* moving the kernel loses the session's state: worth a fresh probe */
    if (!s->kernel_id[0] || !s->gw || (!cx_gateway_usable(s->gw) && !cx_gateway_recheck(s->gw))) {
        rc = cx_session_move_kernel(cx, s, msg, msglen);
        if (rc)
            goto fail;
    }
    return CX_OK;
fail:
    cx_session_release(cx, s);
    return rc;
}

enum cx_err
cx_session_acquire(struct cx_ctx *cx, const char *user, const char *cid, unsigned ttl,
                   enum cx_lang lang, struct cx_session *s, char *msg, size_t msglen)
{
    bool done;

    return acquire(cx, user, cid, ttl, lang, true, NULL, &done, s, msg, msglen);
}

enum cx_err
cx_session_acquire_with(struct cx_ctx *cx, const char *user, const char *cid, unsigned ttl,
                        enum cx_lang lang, const struct cx_db_call *also, bool *also_done,
                        struct cx_session *s, char *msg, size_t msglen)
{
    return acquire(cx, user, cid, ttl, lang, true, also, also_done, s, msg, msglen);
}

enum cx_err
cx_session_attach(struct cx_ctx *cx, const char *user, const char *cid, unsigned ttl,
                  enum cx_lang lang, struct cx_session *s, char *msg, size_t msglen)
{
    bool done;

    return acquire(cx, user, cid, ttl, lang, false, NULL, &done, s, msg, msglen);
}

void
cx_session_release(struct cx_ctx *cx, struct cx_session *s)
{
    cx_session_release_with(cx, s, NULL);
}

void
cx_session_release_with(struct cx_ctx *cx, struct cx_session *s, struct cx_db_call *also)
{
    const char *p[3] = {s->id, s->kernel_fresh ? "true" : "false",
                        s->capture_rescan ? "true" : "false"};
    const char *u[2] = {s->user, s->conversation_id};
    struct cx_db_call calls[3];
    size_t n = 0;

    if (s->locked) {
        /* The unlock comes before the COMMIT: the next run's touch of the
         * row waits for it, and then reads what this one wrote. */
        if (s->id[0])
            calls[n++] = (struct cx_db_call){&q_release, p, NULL};
        if (also)
            calls[n++] = *also;
        calls[n++] = (struct cx_db_call){&q_unlock, u, NULL};
        if (cx_db_exec_all(cx->db, calls, n, true) == CX_OK) {
            cx_db_unpin(cx->db);
            s->locked = false;
            return;
        }
        /* one failed and took the others with it: each on its own, the
         * unlock before the caller's (it unpins: a lost connection is
         * replaced only then) */
        if (s->id[0] && cx_db_exec(cx->db, &q_release, p, NULL))
            cx_log_warn(0, "could not record the state of session %s", s->id);
        unlock_conversation(cx, s->user, s->conversation_id);
        s->locked = false;
    }
    if (also && cx_db_exec(cx->db, also->q, also->params, also->res))
        cx_log_warn(0, "the statement after a run's session failed");
}

enum cx_err
cx_session_replace_kernel(struct cx_ctx *cx, struct cx_session *s, char *msg, size_t msglen)
{
    char old[64];
    enum cx_err rc;

    snprintf(old, sizeof(old), "%s", s->kernel_id);
    if (old[0]) {
        cx_kernel_pool_forget(old);
        if (cx_gateway_kernel_delete(s->gw, old))
            cx_log_warn(0, "could not delete replaced kernel %s", old);
    }
    rc = start_kernel(cx, s, msg, msglen);
    if (rc == CX_OK) {
        s->reset = !s->created;
        cx_log_info("session %s: kernel replaced", s->id);
    }
    return rc;
}

#define CONFIRM_ASK_US 2000000

enum cx_err
cx_session_confirm(struct cx_session *s, struct cx_kernel_conn *c, int64_t deadline_us)
{
    /* A pooled kernel's connection that warmed it heard it answer: its
     * output channel is live (the handshake cost a first run 12-25 ms). */
    bool fresh = s->kernel_fresh && !(s->from_pool && cx_kernel_conn_live(c));

    for (;;) {
        int64_t step = cx_now_us() + CONFIRM_ASK_US;
        enum cx_err rc = cx_kernel_confirm(c, fresh, step < deadline_us ? step : deadline_us);

        if (rc == CX_ERR_KERNEL_DIED)
            return CX_ERR_NOT_FOUND;
        if (rc != CX_ERR_TIMEOUT || cx_now_us() >= deadline_us)
            return rc;
        if (cx_gateway_kernel_get(s->gw, s->kernel_id, NULL) == CX_ERR_NOT_FOUND)
            return CX_ERR_NOT_FOUND;
    }
}

enum cx_err
cx_session_restart_kernel(struct cx_ctx *cx, struct cx_session *s)
{
    enum cx_err rc;

    cx_kernel_pool_forget(s->kernel_id);
    rc = cx_gateway_kernel_restart(s->gw, s->kernel_id);
    if (rc == CX_OK) {
        s->reset = true;
        s->kernel_fresh = true;
        s->from_pool = false; /* a new process: nothing of the warm cell */
        cx_metrics_count_by(CX_FAMILY_KERNEL_RESTARTS, "timeout");
        cx_log_info("session %s: kernel %s restarted", s->id, s->kernel_id);
    }
    return rc;
}

/* The session of a kernel, and whether a run or file operation ended on
 * it within the last 3 s (its output may still be arriving). */
CX_SQL(q_by_kernel, 2,
       "SELECT user_id, conversation_id, id, last_used_at > now() - interval '3 seconds'"
       " FROM sessions WHERE kernel_id = $1 AND gateway_url = $2");
/* A restarted talker's start-up (its status messages, the server's
 * last_activity) is no talk: marked as a use, every process's sweep leaves
 * it alone for a while (lib/maint.c, q_idle_sessions). */
CX_SQL(q_restarted, 1, "UPDATE sessions SET last_used_at = now() WHERE id = $1::uuid");

/* A kernel a pooled connection found talking, heard out under its
 * conversation's lock (no run or file operation can be using it) on that
 * same connection: what was already waiting is read, then it must send
 * more than 64 messages or 1 MiB in each of two windows of 0.3 s. What was
 * in flight for a run or a file read that just ended (read late, or
 * broadcast to this process's other connections), or a drain the
 * machine's load held past its time budget, is not talk; a thread that
 * prints on is (a flood, even one the server's rate limit thins out to
 * 16 MiB/s, sends megabytes a window). A kernel not confirmed keeps the
 * connection in the pool, so it is heard again if it goes on; one that
 * trickles below this is the sweep's to find (maint.c, idle_talkers). */
#define TALK_LISTEN_MS     300
#define TALK_BACKLOG_READS 16 /* of 4 MiB at most (cx_kernel_drain) */
#define TALK_MESSAGES      64
#define TALK_BYTES         (1u << 20)

static bool
heard_talking(struct cx_gateway *gw, const char *kernel_id)
{
    struct cx_kernel_conn *c = NULL;
    char msg[256];
    enum cx_drain d = CX_DRAIN_TALKING;
    bool talking;

    /* the pooled connection when there is one (a run since may have put
     * one back): a kernel has one connection of each process at most */
    if (cx_kernel_conn_get(cx_gateway_url(gw), cx_gateway_token(gw), kernel_id, &c, msg,
                           sizeof(msg)))
        return false; /* nothing to hear it with: a run will find out */
    /* first what the server already holds for the connection (output of
     * a run another process served, broadcast to it: 32 MiB at most, the
     * server's guard); a backlog not read through says nothing yet */
    for (int i = 0; i < TALK_BACKLOG_READS && d == CX_DRAIN_TALKING; i++)
        d = cx_kernel_drain(c, 0);
    talking = d == CX_DRAIN_QUIET &&
              cx_kernel_listen(c, TALK_LISTEN_MS, TALK_MESSAGES, TALK_BYTES) == CX_DRAIN_TALKING &&
              cx_kernel_listen(c, TALK_LISTEN_MS, TALK_MESSAGES, TALK_BYTES) == CX_DRAIN_TALKING;
    if (talking)
        cx_kernel_conn_free(c);
    else
        cx_kernel_conn_put(c);
    return talking;
}

/* One talker, under its conversation's lock: restarted when heard talking
 * (heard = true: found by a pooled connection's drain) or at once (the
 * sweep, which saw it active twice seconds apart while its session was
 * idle). The session's row is left as it is (kernel_fresh false): its next
 * run finds the kernel restarted behind it and says session.reset. */
static bool
restart_talker(struct cx_ctx *cx, const struct cx_kernel_talker *t, bool heard)
{
    const char *p[2] = {t->kernel_id, t->gateway_url};
    struct cx_gateway *gw = cx_ctx_gateway(cx, t->gateway_url);
    PGresult *r = NULL;
    const char *sid[1];
    bool got = false, done = false, ok;

    if (!gw || cx_db_exec(cx->db, &q_by_kernel, p, &r) || PQntuples(r) != 1)
        goto out; /* a pooled kernel (no tenant code), or gone */
    sid[0] = PQgetvalue(r, 0, 2);
    /* Just used: what it sent may be that use's. (The sweep's sightings
     * can fall within a long file read, whose session's last use is its
     * start; a kernel that goes on talking is found again.) */
    if (PQgetvalue(r, 0, 3)[0] == 't')
        goto out;
    if (try_lock(cx, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), &got) || !got)
        goto out; /* a run reads it now: the run ends its output */
    if (heard && !heard_talking(gw, t->kernel_id)) {
        cx_log_info("session %s: kernel %s not heard talking; kept", PQgetvalue(r, 0, 2),
                    t->kernel_id);
        unlock_conversation(cx, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
        goto out;
    }
    cx_kernel_pool_forget(t->kernel_id);
    ok = cx_gateway_kernel_restart(gw, t->kernel_id) == CX_OK;
    /* also when the call failed: a restart that timed out here may still
     * finish on the server, and its start-up is no talk either */
    if (cx_db_exec(cx->db, &q_restarted, sid, NULL))
        cx_log_warn(0, "session %s: could not note its kernel's restart", sid[0]);
    if (ok) {
        cx_metrics_count_by(CX_FAMILY_KERNEL_RESTARTS, "idle_output");
        cx_log_warn(0, "session %s: kernel %s kept sending output with no run; restarted",
                    PQgetvalue(r, 0, 2), t->kernel_id);
        done = true;
    } else {
        cx_log_warn(0, "session %s: kernel %s kept sending output; its restart failed",
                    PQgetvalue(r, 0, 2), t->kernel_id);
    }
    unlock_conversation(cx, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
out:
    PQclear(r);
    return done;
}

bool
cx_session_restart_talker(struct cx_ctx *cx, const char *gateway_url, const char *kernel_id)
{
    struct cx_kernel_talker t;

    snprintf(t.gateway_url, sizeof(t.gateway_url), "%s", gateway_url);
    snprintf(t.kernel_id, sizeof(t.kernel_id), "%s", kernel_id);
    return restart_talker(cx, &t, false);
}

/* Two a pass: each is heard for up to 0.6 s (and its backlog read), and a
 * tenant whose kernel talks in bursts (found talking, quiet when heard)
 * must not hold the reaper's other work for long; the rest wait for the
 * next pass. */
#define TALKERS_A_PASS 2

int
cx_session_restart_talkers(struct cx_ctx *cx)
{
    struct cx_kernel_talker t[TALKERS_A_PASS];
    int n = cx_kernel_pool_talkers(t, TALKERS_A_PASS), restarted = 0;

    for (int i = 0; i < n; i++)
        restarted += restart_talker(cx, &t[i], true);
    return restarted;
}

enum cx_err
cx_session_close(struct cx_ctx *cx, const char *user, const char *cid)
{
    bool got;
    enum cx_err rc;

    if (!cx_conversation_id_valid(cid))
        return CX_ERR_NOT_FOUND;
    rc = lock_conversation(cx, user, cid, &got);
    if (rc)
        return rc;
    if (!got)
        return CX_ERR_CONFLICT;
    rc = close_by_conversation(cx, user, cid, false);
    unlock_conversation(cx, user, cid);
    return rc;
}

/* Whether the session is still expired, asked under its lock: a run may
 * have extended it since the sweep listed it. */
CX_SQL(q_still_expired, 1,
       "SELECT 1 FROM sessions WHERE id = $1::uuid AND expires_at < now()"
       " AND (cleanup_after IS NULL OR cleanup_after < now())");

/* One expired session, under its lock. */
static bool
reap_one(struct cx_ctx *cx, PGresult *r, int i)
{
    const char *who[2] = {PQgetvalue(r, i, 1), PQgetvalue(r, i, 2)};
    const char *id[1] = {PQgetvalue(r, i, 0)};
    PGresult *q = NULL;
    bool got, done = false;

    if (try_lock(cx, who[0], who[1], &got) || !got)
        return false; /* a run is using it; it extended the expiry anyway */
    if (cx_db_exec_row(cx->db, &q_still_expired, id, &q) == CX_OK)
        done = close_locked(cx, id[0], PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), false) == CX_OK;
    PQclear(q);
    unlock_conversation(cx, who[0], who[1]);
    return done;
}

/* No transaction around the sweep: each session is closed under its own
 * lock, so a statement that fails for one neither holds a lock nor aborts
 * the others. Several processes may list the same rows; the lock and the
 * second look under it decide. */
enum cx_err
cx_session_reap(struct cx_ctx *cx, int limit, int *closed)
{
    char lim[16];
    const char *p[1] = {lim};
    PGresult *r = NULL;
    enum cx_err rc;

    *closed = 0;
    snprintf(lim, sizeof(lim), "%d", limit);
    rc = cx_db_exec(cx->db, &q_expired, p, &r);
    for (int i = 0; rc == CX_OK && i < PQntuples(r); i++)
        *closed += reap_one(cx, r, i);
    PQclear(r);
    return rc;
}

CX_SQL(q_list, 1,
       "SELECT id, user_id, conversation_id, kernel_id, workspace, " CX_SQL_UTC(
           "last_used_at") ", " EXPIRES " FROM sessions WHERE $1::text IS NULL OR user_id = $1"
                           " ORDER BY last_used_at DESC");

enum cx_err
cx_session_list(struct cx_ctx *cx, const char *user, json_t **out)
{
    const char *p[1] = {user};

    return cx_db_rows(cx->db, &q_list, p, CX_SESSION_LIST_COLUMNS, out);
}
