/* The kernel pool against the suite's PostgreSQL and Jupyter server: fill,
 * claim once only, a pooled kernel that vanished is replaced, drain. */
#include "../../lib/db.h"
#include "../../lib/gateway.h"
#include "../../lib/prestart.h"
#include "cxtest.h"

CX_SQL(q_pooled, 0, "SELECT kernel_id FROM prestarted_kernels ORDER BY created_at");

/* The pooled kernel ids, or the count only (ids NULL). */
static int
pooled(struct cxtest *t, char first[64])
{
    PGresult *r = NULL;
    int n = -1;

    if (cx_db_exec(t->cx.db, &q_pooled, NULL, &r) == CX_OK) {
        n = PQntuples(r);
        if (first)
            snprintf(first, 64, "%s", n ? PQgetvalue(r, 0, 0) : "");
    }
    PQclear(r);
    return n;
}

/* 1: a kernel, 0: none ready, -1: an error. */
static int
claim(struct cxtest *t, char id[37], char kernel[64])
{
    bool got = false;

    if (cx_db_begin(t->cx.db) ||
        cx_prestart_claim(&t->cx, t->cfg.gateways[0].url, t->cfg.kernel_name, id, kernel, &got)) {
        cx_db_rollback(t->cx.db);
        return -1;
    }
    return cx_db_commit(t->cx.db) ? -1 : got;
}

int
main(void)
{
    struct cxtest t;
    char id[37], kid[64], first[64], again[64];
    int started = -1, deleted = -1;

    cxtest_open(&t, "prestart", "kernel_name = python3-sandbox\nkernel_pool_size = 2\n");
    ok(cx_prestart_fill(&t.cx, &started) == CX_OK && started == 2, "fill starts 2 kernels (%d)",
       started);
    is_int(pooled(&t, first), 2, "two pooled rows");
    ok(cx_gateway_kernel_get(t.cx.gw, first, NULL) == CX_OK, "their kernels run");
    ok(cx_prestart_fill(&t.cx, &started) == CX_OK && started == 0, "a full pool starts nothing");

    is_int(claim(&t, id, kid), 1, "a claim gets a kernel");
    is_str(kid, first, "the oldest");
    is_int(pooled(&t, NULL), 1, "its row is gone: it can never be handed out twice");
    ok(cx_gateway_kernel_delete(t.cx.gw, kid) == CX_OK,
       "the claimed kernel deleted (a session's now)");

    ok(pooled(&t, again) == 1 && cx_gateway_kernel_delete(t.cx.gw, again) == CX_OK,
       "the remaining pooled kernel vanishes behind the pool's back");
    ok(cx_prestart_fill(&t.cx, &started) == CX_OK && started == 2,
       "fill drops the vanished one and starts 2 (%d)", started);
    ok(pooled(&t, first) == 2 && strcmp(first, again) != 0, "the vanished one is not pooled");

    ok(cx_prestart_drain(&t.cx, &deleted) == CX_OK && deleted == 2, "drain deletes both (%d)",
       deleted);
    is_int(pooled(&t, NULL), 0, "the pool is empty");
    is_int(cx_gateway_kernel_get(t.cx.gw, first, NULL), CX_ERR_NOT_FOUND,
           "and its kernels are gone");
    is_int(claim(&t, id, kid), 0, "an empty pool: no kernel, not an error");
    cxtest_close(&t);
    return tap_done();
}
