#include <stdio.h>
#include <string.h>

#include "artifact.h"
#include "buf.h"
#include "config.h"
#include "db.h"
#include "gateway.h"
#include "log.h"
#include "maint.h"
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
