#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "artifact.h"
#include "buf.h"
#include "config.h"
#include "db.h"
#include "gateway.h"
#include "log.h"
#include "mcp.h"
#include "codexec.h"
#include "run.h"
#include "session.h"
#include "storage.h"
#include "util.h"

/* Of the gateway's kernels ($1, a text[]), those no row names. */
CX_SQL(q_unnamed, 1,
       "SELECT k FROM unnest($1::text[]) AS k"
       " WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.kernel_id = k)"
       " AND NOT EXISTS (SELECT 1 FROM prestarted_kernels p WHERE p.kernel_id = k)");
/* Notes the unnamed ones ($2) of gateway $1, forgets the others, and
 * answers those unnamed for longer than $3 seconds. */
CX_SQL(q_note_unnamed, 3,
       "WITH cur AS (SELECT unnest($2::text[]) AS k),"
       " gone AS (DELETE FROM unowned_kernels u WHERE u.gateway_url = $1"
       "  AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.k = u.kernel_id)),"
       " seen AS (INSERT INTO unowned_kernels (gateway_url, kernel_id) SELECT $1, k FROM cur"
       "  ON CONFLICT DO NOTHING)"
       " SELECT kernel_id FROM unowned_kernels WHERE gateway_url = $1"
       " AND kernel_id = ANY($2::text[]) AND first_seen < now() - make_interval(secs => $3::int)");
CX_SQL(q_forget_unnamed, 2,
       "DELETE FROM unowned_kernels WHERE gateway_url = $1 AND kernel_id = $2");

/* A text[] literal of the ids in models (or in a one-column result). Ids
 * that are not plain names are left out: they are never ours. */
static void
id_array(struct cx_buf *b, json_t *models, PGresult *r)
{
    size_t n = models ? json_array_size(models) : (size_t)PQntuples(r);

    cx_buf_adds(b, "{");
    for (size_t i = 0; i < n; i++) {
        const char *id = models
                             ? json_string_value(json_object_get(json_array_get(models, i), "id"))
                             : PQgetvalue(r, (int)i, 0);
        if (!id || !*id || strlen(id) >= 64 || !cx_name_chars(id, strlen(id), "-_."))
            continue;
        cx_buf_addf(b, "%s\"%s\"", b->len > 1 ? "," : "", id);
    }
    cx_buf_adds(b, "}");
}

/* Kernels that talk with no run and no connection of ours to drain them
 * (the pooled one expired): the server records each message as the
 * kernel's last_activity. A session kernel active within the last 2 s at
 * two sweeps in a row, with no run of its session since the first, keeps
 * producing output while idle: it is restarted (the drain catches the
 * ones we are connected to within a second). A session used (or its
 * kernel restarted as a talker) within IDLE_AT_LEAST s is not idle
 * whatever the sweeps' interval: a restart's start-up messages, seen at
 * two sweeps a second apart (last_activity is read to the second), would
 * otherwise restart it again, and again, by turns in two processes. */
#define ACTIVE_WITHIN 2
#define IDLE_AT_LEAST (ACTIVE_WITHIN + 3u)
#define SEEN_MAX      1024
static struct {
    char kernel_id[64];
    int64_t at;
} seen[SEEN_MAX];
static int nseen;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

CX_SQL(q_idle_sessions, 2,
       "SELECT k FROM unnest($1::text[]) AS k JOIN sessions s ON s.kernel_id = k"
       " WHERE s.last_used_at < now() - make_interval(secs => $2::int)");

/* Whether an ISO 8601 UTC time (the server's last_activity) is within
 * ACTIVE_WITHIN seconds of now. */
static bool
recent(const char *iso)
{
    struct tm tm = {0};
    const char *end = iso ? strptime(iso, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    time_t t;

    if (!end)
        return false;
    t = timegm(&tm);
    return t != (time_t)-1 && time(NULL) - t <= ACTIVE_WITHIN;
}

/* Notes kid as active now; true when it was at the last sweep too (within
 * two sweeps' time). */
static bool
active_again(const char *kid, int64_t window_us)
{
    int64_t now = cx_now_us();
    bool again = false;
    int w = 0;

    pthread_mutex_lock(&seen_lock);
    for (int i = 0; i < nseen; i++) {
        if (now - seen[i].at > window_us)
            continue; /* forgotten */
        if (!strcmp(seen[i].kernel_id, kid))
            again = true;
        else
            seen[w++] = seen[i];
    }
    nseen = w;
    if (!again && nseen < SEEN_MAX) {
        snprintf(seen[nseen].kernel_id, sizeof(seen[nseen].kernel_id), "%s", kid);
        seen[nseen++].at = now;
    }
    pthread_mutex_unlock(&seen_lock);
    return again;
}

static void
idle_talkers(struct cx_ctx *cx, json_t *models)
{
    struct cx_buf ids;
    json_t *m;
    size_t i;
    PGresult *r = NULL;
    char secs[16];
    const char *p[2] = {NULL, secs};
    unsigned idle = 2 * cx->cfg->reaper_interval;

    cx_buf_init(&ids, 1 << 20);
    cx_buf_adds(&ids, "{");
    json_array_foreach(models, i, m)
    {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (id && strlen(id) < 64 && cx_name_chars(id, strlen(id), "-_.") &&
            recent(json_string_value(json_object_get(m, "last_activity"))))
            cx_buf_addf(&ids, "%s\"%s\"", ids.len > 1 ? "," : "", id);
    }
    cx_buf_adds(&ids, "}");
    snprintf(secs, sizeof(secs), "%u", idle > IDLE_AT_LEAST ? idle : IDLE_AT_LEAST);
    p[0] = ids.data;
    if (ids.len > 2 && !cx_buf_err(&ids) && cx_db_exec(cx->db, &q_idle_sessions, p, &r) == CX_OK)
        for (int k = 0; k < PQntuples(r); k++)
            if (active_again(PQgetvalue(r, k, 0),
                             (int64_t)(2 * cx->cfg->reaper_interval + 5) * 1000000))
                cx_session_restart_talker(cx, cx_gateway_url(cx->gw), PQgetvalue(r, k, 0));
    PQclear(r);
    cx_buf_cleanup(&ids);
}

/* The kernels of the gateway that no row has named for the grace period:
 * deleted. Every kernel is recorded within milliseconds of its start (a
 * session's, or a pooled one's while it warms), so a minute's grace covers
 * it, and a crash's kernels go within two minutes. */
static enum cx_err
reconcile(struct cx_ctx *cx, int *deleted)
{
    char grace[16];
    struct cx_buf all, unnamed;
    json_t *models = NULL;
    PGresult *r = NULL, *due = NULL;
    enum cx_err rc = cx_gateway_kernel_list(cx->gw, &models);

    *deleted = 0;
    if (rc)
        return rc;
    idle_talkers(cx, models);
    cx_buf_init(&all, 1 << 20);
    cx_buf_init(&unnamed, 1 << 20);
    id_array(&all, models, NULL);
    json_decref(models);
    rc = cx_buf_err(&all);
    if (rc == CX_OK) {
        const char *p[1] = {all.data};
        rc = cx_db_exec(cx->db, &q_unnamed, p, &r);
    }
    if (rc == CX_OK) {
        const char *p[3] = {cx_gateway_url(cx->gw), unnamed.data, grace};
        id_array(&unnamed, NULL, r);
        snprintf(grace, sizeof(grace), "%u", cx->cfg->kernel_orphan_grace);
        p[1] = unnamed.data;
        rc = cx_buf_err(&unnamed) ? cx_buf_err(&unnamed)
                                  : cx_db_exec(cx->db, &q_note_unnamed, p, &due);
    }
    for (int i = 0; rc == CX_OK && i < PQntuples(due); i++) {
        const char *p[2] = {cx_gateway_url(cx->gw), PQgetvalue(due, i, 0)};
        cx_log_warn(0, "kernel %s on the gateway is named by no session or pool row: deleting it",
                    p[1]);
        if (cx_gateway_kernel_delete(cx->gw, p[1]) == CX_OK &&
            cx_db_exec(cx->db, &q_forget_unnamed, p, NULL) == CX_OK)
            (*deleted)++;
    }
    PQclear(r);
    PQclear(due);
    cx_buf_cleanup(&all);
    cx_buf_cleanup(&unnamed);
    return rc;
}

#define MAINT_TIMEOUT_MS 15000

enum cx_err
cx_maint_sweep(struct cx_ctx *cx, int limit, bool artifacts, struct cx_maint *done)
{
    enum cx_err rc, rc2;

    memset(done, 0, sizeof(*done));
    /* Maintenance only deletes and lists: a gateway that hangs holds the
     * sweep (its other gateways, the runs' expiry) MAINT_TIMEOUT_MS per
     * call, not a kernel start's two minutes. */
    for (unsigned i = 0; i < cx->ngws; i++)
        cx_gateway_default_timeout(cx->gws[i], MAINT_TIMEOUT_MS);
    rc = cx_session_reap(cx, limit, &done->sessions);
    /* each part goes on after another failed: they share nothing */
    rc2 = cx_run_expire(cx, &done->runs);
    if (rc == CX_OK)
        rc = rc2;
    for (unsigned i = 0; i < cx->ngws; i++) {
        struct cx_gateway *first = cx->gw;
        int n = 0;

        cx->gw = cx->gws[i]; /* the gateway reconcile() is about */
        rc2 = cx_gateway_usable(cx->gw) ? reconcile(cx, &n) : CX_OK;
        cx->gw = first;
        done->kernels += n;
        if (rc == CX_OK)
            rc = rc2;
    }
    rc2 = cx_mcp_expire(cx, &done->mcp);
    if (rc == CX_OK)
        rc = rc2;
    rc2 = cx_storage_sweep_staging(cx->store, CX_MAINT_STAGING_GRACE(cx->cfg), &done->staging);
    if (rc == CX_OK)
        rc = rc2;
    if (artifacts) {
        rc2 = cx_artifact_gc(cx, &done->artifacts);
        if (rc == CX_OK)
            rc = rc2;
    }
    return rc;
}

void
cx_maint_reap(struct cx_ctx *cx, int64_t *next_sweep)
{
    int64_t now = cx_now_us();
    struct cx_maint done;
    enum cx_err rc;

    /* the gateways' probes, so that no run waits for one */
    for (unsigned i = 0; i < cx->ngws; i++)
        cx_gateway_refresh(cx->gws[i]);
    cx_session_restart_talkers(cx); /* found by the ticker's drain */
    if (now < *next_sweep)
        return;
    rc = cx_maint_sweep(cx, CX_MAINT_REAP_BATCH, false, &done);
    if (rc)
        cx_log_warn(0, "reaper: sweep failed: %s", cx_strerror(rc));
    if (done.sessions > 0 || done.runs > 0 || done.kernels > 0 || done.staging > 0)
        cx_log_info("reaper: %d session(s) closed, %d run(s) expired, %d unowned "
                    "kernel(s) deleted, %d stale staged write(s) removed",
                    done.sessions, done.runs, done.kernels, done.staging);
    /* more to do: come back soon */
    *next_sweep =
        now +
        (done.sessions == CX_MAINT_REAP_BATCH ? 1 : (int64_t)cx->cfg->reaper_interval) * 1000000;
}
