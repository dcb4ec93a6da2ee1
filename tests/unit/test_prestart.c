/* The kernel pool against the suite's PostgreSQL and Jupyter server: fill,
 * claim once only (saying how many it left), a session made of a pooled
 * kernel in the same statement, a pooled kernel that vanished
 * is replaced, drain; the refilling thread's wait: a refill put off is not
 * started early, a refill asked for now is. */
#include "../../lib/db.h"
#include "../../lib/gateway.h"
#include "../../lib/prestart.h"
#include "../../lib/session.h"
#include "cxtest.h"

CX_SQL(q_pooled, 0, "SELECT kernel_id FROM prestarted_kernels ORDER BY created_at");
/* The claim's CTEs alone, unconditional (the sessions' statement adds
 * the row and the cap). */
CX_SQL(q_claim, 2,
       "WITH " CX_PRESTART_CLAIM_CTES("true") " SELECT claim.id, claim.kernel_id, pool.ready"
                                              " FROM claim, pool");
CX_SQL(q_oldest_row, 0, "SELECT id FROM prestarted_kernels ORDER BY created_at LIMIT 1");
CX_SQL(q_session, 1,
       "SELECT kernel_id, workspace, kernel_fresh, gateway_url, language, user_id, conversation_id"
       " FROM sessions WHERE id = $1::uuid");

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
claim(struct cxtest *t, char id[37], char kernel[64], long *left)
{
    const char *p[2] = {t->cfg.gateways[0].url, t->cfg.kernel_name};
    PGresult *r = NULL;
    int got;

    if (cx_db_exec(t->cx.db, &q_claim, p, &r))
        return -1;
    got = PQntuples(r) == 1;
    *left = 0;
    if (got) {
        snprintf(id, 37, "%s", PQgetvalue(r, 0, 0));
        snprintf(kernel, 64, "%s", PQgetvalue(r, 0, 1));
        *left = strtol(PQgetvalue(r, 0, 2), NULL, 10) - 1;
    }
    PQclear(r);
    return got;
}

/* A new conversation's session takes the oldest pooled kernel, its row's
 * id and so its workspace, in the statement that claims it. (No bail on a
 * failure: the pool's drain below must still run.) */
static void
session_of_pooled(struct cxtest *t)
{
    struct cx_session s;
    char msg[CX_MSG_MAX] = "", first[64] = "", row[37] = "", ws[CX_WORKSPACE_MAX];
    const char *p[1] = {s.id};
    PGresult *r = NULL;
    enum cx_err rc;

    pooled(t, first);
    if (cx_db_exec(t->cx.db, &q_oldest_row, NULL, &r) == CX_OK && PQntuples(r) == 1)
        snprintf(row, sizeof(row), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    rc = cx_session_acquire(&t->cx, "bob", "pooled", 60, CX_LANG_PYTHON, &s, msg, sizeof(msg));
    ok(rc == CX_OK, "a new conversation's session (%s)", msg);
    if (rc)
        return;
    ok(s.created && s.from_pool && s.kernel_fresh, "made of a pooled kernel");
    is_str(s.kernel_id, first, "the oldest");
    is_str(s.id, row, "its id is the pooled row's");
    is_int(pooled(t, NULL), 1, "its pooled row is gone");
    cx_session_workspace_name(s.id, ws);
    is_str(s.workspace, ws, "its workspace is named after that id");
    ok(s.expires_at[0] != '\0', "and it expires");
    r = NULL;
    ok(cx_db_exec(t->cx.db, &q_session, p, &r) == CX_OK && PQntuples(r) == 1 &&
           !strcmp(PQgetvalue(r, 0, 0), first) && !strcmp(PQgetvalue(r, 0, 1), ws) &&
           PQgetvalue(r, 0, 2)[0] == 't' && !strcmp(PQgetvalue(r, 0, 3), t->cfg.gateways[0].url) &&
           !strcmp(PQgetvalue(r, 0, 4), "python") && !strcmp(PQgetvalue(r, 0, 5), "bob") &&
           !strcmp(PQgetvalue(r, 0, 6), "pooled"),
       "its row: the kernel, workspace, a fresh kernel, gateway, language, owner");
    PQclear(r);
    cx_session_release(&t->cx, &s);
    ok(cx_session_close(&t->cx, "bob", "pooled") == CX_OK, "closed: its kernel goes");
    is_int(cx_gateway_kernel_get(t->cx.gw, first, NULL), CX_ERR_NOT_FOUND, "it is gone");
}

/* Milliseconds cx_prestart_wait(seconds) waited. */
static long
waited(unsigned seconds, bool *go)
{
    int64_t t0 = cx_now_us();

    *go = cx_prestart_wait(seconds);
    return (long)((cx_now_us() - t0) / 1000);
}

/* The refilling thread's wait, alone: lower bounds are what must hold
 * (a refill put off is not started early); the upper ones are generous,
 * for a loaded machine. */
static void
test_wait(void)
{
    bool go = false;
    long ms;

    cx_prestart_kick();
    ms = waited(30, &go);
    ok(go && ms < 5000, "a kick: the wait ends at once (%ld ms)", ms);

    cx_prestart_kick_after(400);
    ms = waited(30, &go);
    ok(go && ms >= 390 && ms < 10000, "a refill put off 400 ms: waited %ld ms", ms);

    cx_prestart_kick_after(1500);
    ms = waited(1, &go);
    ok(go && ms >= 1490, "a refill put off holds off the periodic one (%ld ms, not 1000)", ms);

    cx_prestart_kick_after(400);
    cx_prestart_kick_after(5000);
    ms = waited(30, &go);
    ok(go && ms < 4000, "a later ask does not put off an earlier one (%ld ms)", ms);

    cx_prestart_kick_after(20000);
    cx_prestart_kick();
    ms = waited(30, &go);
    ok(go && ms < 5000, "a kick overrides a refill put off (%ld ms)", ms);

    ms = waited(1, &go);
    ok(go && ms >= 990 && ms < 10000, "nothing asked: the periodic wait (%ld ms)", ms);

    cx_prestart_kick_after(20000);
    cx_prestart_shutdown();
    ms = waited(30, &go);
    ok(!go && ms < 5000, "shut down: the wait ends, false (%ld ms)", ms);
}

int
main(void)
{
    struct cxtest t;
    char id[37], kid[64], first[64], again[64];
    int started = -1, deleted = -1;
    long left = -1;

    cxtest_open(&t, "prestart", "kernel_name = python3-sandbox\nkernel_pool_size = 2\n");
    ok(cx_prestart_fill(&t.cx, &started) == CX_OK && started == 2, "fill starts 2 kernels (%d)",
       started);
    is_int(pooled(&t, first), 2, "two pooled rows");
    ok(cx_gateway_kernel_get(t.cx.gw, first, NULL) == CX_OK, "their kernels run");
    ok(cx_prestart_fill(&t.cx, &started) == CX_OK && started == 0, "a full pool starts nothing");

    is_int(claim(&t, id, kid, &left), 1, "a claim gets a kernel");
    is_int(left, 1, "and says it left one");
    is_str(kid, first, "the oldest");
    is_int(pooled(&t, NULL), 1, "its row is gone: it can never be handed out twice");
    ok(cx_gateway_kernel_delete(t.cx.gw, kid) == CX_OK,
       "the claimed kernel deleted (a session's now)");

    ok(cx_prestart_fill(&t.cx, &started) == CX_OK && started == 1, "fill makes it 2 again (%d)",
       started);
    session_of_pooled(&t);
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
    is_int(claim(&t, id, kid, &left), 0, "an empty pool: no kernel, not an error");
    is_int(left, 0, "none left");
    cxtest_close(&t);
    test_wait(); /* last: it ends with the shutdown */
    return tap_done();
}
