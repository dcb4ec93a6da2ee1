/* Sessions against the suite's PostgreSQL and Jupyter server: creation and
 * reuse, the conversation lock between two processes' connections, the
 * per-user cap and its eviction, a vanished kernel, close and reap. */
#include <pthread.h>
#include <unistd.h>

#include "../../lib/db.h"
#include "../../lib/gateway.h"
#include "../../lib/session.h"
#include "cxtest.h"

/* lib/session.c's lock on a user's session creations, held from outside. */
#define USER_KEY "hashtextextended('user' || E'\\n' || $1, 1)"
CX_SQL(q_hold_user, 1, "SELECT pg_advisory_lock(" USER_KEY ")");
CX_SQL(q_free_user, 1, "SELECT pg_advisory_unlock(" USER_KEY ")");

/* A session of the user's with a kernel, made as another process's
 * creation makes it (the kernel's id names none: its delete is a 404). */
CX_SQL(q_fake_session, 3,
       "INSERT INTO sessions (id, user_id, conversation_id, gateway_url, expires_at, workspace,"
       " language, kernel_id) SELECT gen_random_uuid(), $1, $2, $3, now() + interval '1 hour',"
       " 'w-fake-' || $2, 'python', '00000000-0000-4000-8000-' || lpad(md5($2), 12, '0')");

CX_SQL(q_waiting, 0,
       "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
       " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())");

#define CONF "kernel_name = python3-sandbox\nbusy_wait = 1\nmax_sessions_per_user = 2\n"

static enum cx_err
acquire(struct cx_ctx *cx, const char *cid, unsigned ttl, struct cx_session *s)
{
    char msg[CX_MSG_MAX] = "";
    enum cx_err rc = cx_session_acquire(cx, "bob", cid, ttl, CX_LANG_PYTHON, s, msg, sizeof(msg));

    if (rc)
        printf("# acquire %s: %d %s\n", cid, rc, msg);
    return rc;
}

static void
create_and_reuse(struct cxtest *t, struct cx_ctx *other)
{
    struct cx_session s, again, busy;
    char ws[CX_WORKSPACE_MAX], id[37], kid[64];

    ok(acquire(&t->cx, "c1", 60, &s) == CX_OK, "a first acquire");
    ok(s.created && s.locked && !s.reset && s.kernel_id[0],
       "creates a locked session with a kernel");
    cx_session_workspace_name(s.id, ws);
    is_str(s.workspace, ws, "its workspace is named after it");
    ok(cx_gateway_kernel_get(t->cx.gw, s.kernel_id, NULL) == CX_OK, "its kernel runs");
    is_int(acquire(other, "c1", 60, &busy), CX_ERR_CONFLICT,
           "another connection waits busy_wait, then: conflict");
    is_int(cx_session_close(other, "bob", "c1"), CX_ERR_CONFLICT,
           "closing a held session: conflict");
    snprintf(id, sizeof(id), "%s", s.id);
    snprintf(kid, sizeof(kid), "%s", s.kernel_id);
    cx_session_release(&t->cx, &s);
    cx_session_release(&t->cx, &s);
    ok(!s.locked, "released (twice is safe)");
    ok(acquire(other, "c1", 60, &again) == CX_OK, "then the other connection gets it");
    ok(!again.created && !strcmp(again.id, id) && !strcmp(again.kernel_id, kid),
       "the same session and kernel");
    cx_session_release(other, &again);
}

static void
vanished(struct cxtest *t)
{
    struct cx_session s;
    char msg[CX_MSG_MAX], old[64];

    ok(acquire(&t->cx, "c1", 60, &s) == CX_OK, "acquire c1");
    snprintf(old, sizeof(old), "%s", s.kernel_id);
    ok(cx_gateway_kernel_delete(t->cx.gw, s.kernel_id) == CX_OK, "its kernel deleted behind it");
    ok(cx_session_replace_kernel(&t->cx, &s, msg, sizeof(msg)) == CX_OK && s.reset &&
           strcmp(s.kernel_id, old) != 0,
       "replaced: a new kernel, and the session says reset");
    cx_session_release(&t->cx, &s);
}

/* The user's sessions that have a kernel, as the cap counts them. */
static int
with_kernels(struct cx_ctx *cx, const char *user)
{
    json_t *l = NULL, *row;
    size_t i;
    int n = 0;

    if (cx_session_list(cx, user, &l) != CX_OK)
        return -1;
    json_array_foreach(l, i, row)
    {
        n += json_is_string(json_object_get(row, "kernel"));
    }
    json_decref(l);
    return n;
}

/* An advisory lock is re-entrant on its own connection, so the holders of
 * the two busy sessions are two other connections (as two workers are). */
static void
cap_and_eviction(struct cxtest *t, struct cx_ctx *other, struct cx_ctx *third)
{
    struct cx_session a, b, c;

    ok(acquire(&t->cx, "c2", 60, &a) == CX_OK, "a second conversation (at the cap of 2)");
    cx_session_release(&t->cx, &a);
    ok(acquire(&t->cx, "c3", 60, &a) == CX_OK && a.created, "a third evicts the least recent");
    cx_session_release(&t->cx, &a);
    ok(acquire(other, "c1", 60, &b) == CX_OK && b.reset,
       "the evicted conversation comes back reset (its state is gone)");
    is_int(with_kernels(&t->cx, "bob"), 2,
           "never more kernels than the cap, evicted ones coming back too");
    ok(acquire(third, "c3", 60, &c) == CX_OK, "c3 held by a third connection");
    is_int(acquire(&t->cx, "c4", 60, &a), CX_ERR_QUOTA, "all sessions busy: quota");
    cx_session_release(third, &c);
    cx_session_release(other, &b);
}

/* A creation that waits busy_wait for the user's creation lock: a
 * conflict (409), and the lock is not left behind. */
static void
creation_busy(struct cxtest *t, struct cx_ctx *other)
{
    const char *u[1] = {"bob"};
    struct cx_session s;

    need(cx_db_exec(other->db, &q_hold_user, u, NULL) == CX_OK, "bob's creation lock held");
    is_int(acquire(&t->cx, "c9", 60, &s), CX_ERR_CONFLICT,
           "a new conversation meanwhile: conflict after busy_wait");
    ok(cx_db_exec(other->db, &q_free_user, u, NULL) == CX_OK, "let go");
    ok(acquire(&t->cx, "c9", 60, &s) == CX_OK && s.created, "then it is created");
    cx_session_release(&t->cx, &s);
    ok(cx_session_close(&t->cx, "bob", "c9") == CX_OK, "and closed");
}

struct waiter {
    struct cx_ctx *cx;
    const char *user;
    struct cx_session s;
    enum cx_err rc;
};

static void *
acquire_waiting(void *arg)
{
    struct waiter *w = arg;
    char msg[CX_MSG_MAX] = "";

    w->rc =
        cx_session_acquire(w->cx, w->user, "k-new", 60, CX_LANG_PYTHON, &w->s, msg, sizeof(msg));
    return NULL;
}

/* Whether a backend waits for an advisory lock, within half a second. */
static bool
waiting_for_a_lock(struct cx_ctx *cx)
{
    for (int i = 0; i < 50; i++) {
        PGresult *r = NULL;
        bool waits = cx_db_exec(cx->db, &q_waiting, NULL, &r) == CX_OK &&
                     strcmp(PQgetvalue(r, 0, 0), "0") != 0;

        PQclear(r);
        if (waits)
            return true;
        usleep(10 * 1000);
    }
    return false;
}

/* A creation that waited for the user's creation lock counts what its
 * holder committed before letting go: the count is read after the lock
 * is taken (the same round trip, a statement of its own), never from a
 * snapshot older than the lock. Counted before, the user would hold three
 * kernels under a cap of two. cx: the creation's context (pooled: it
 * claims a pooled kernel, the lock then its claim's transaction's). */
static void
creation_counts_after_the_lock(struct cxtest *t, struct cx_ctx *other, struct cx_ctx *cx,
                               const char *user, bool pooled)
{
    const char *u[1] = {user};
    const char *f1[3] = {user, "fake-1", t->cfg.gateways[0].url};
    const char *f2[3] = {user, "fake-2", t->cfg.gateways[0].url};
    struct waiter w = {.cx = cx, .user = user};
    pthread_t th;

    need(cx_db_exec(other->db, &q_hold_user, u, NULL) == CX_OK, "%s's creation lock held", user);
    need(pthread_create(&th, NULL, acquire_waiting, &w) == 0, "a creation of %s's starts", user);
    need(waiting_for_a_lock(other), "and waits for the lock (busy_wait is 1 s)");
    ok(cx_db_exec(other->db, &q_fake_session, f1, NULL) == CX_OK &&
           cx_db_exec(other->db, &q_fake_session, f2, NULL) == CX_OK,
       "meanwhile the holder makes two sessions with kernels (the cap), committed");
    ok(cx_db_exec(other->db, &q_free_user, u, NULL) == CX_OK, "and lets go");
    pthread_join(th, NULL);
    ok(w.rc == CX_OK && w.s.created && w.s.from_pool == pooled, "the waiting creation goes on (%s)",
       pooled ? "a pooled kernel" : "a kernel started");
    is_int(with_kernels(&t->cx, user), 2, "having evicted one: never more kernels than the cap");
    if (w.rc == CX_OK)
        cx_session_release(cx, &w.s);
    for (const char *const *c = (const char *const[]){"k-new", "fake-1", "fake-2", NULL}; *c; c++)
        if (cx_session_close(&t->cx, user, *c) != CX_OK)
            printf("# %s's %s: not closed (evicted, or never made)\n", user, *c);
}

/* A pooled creation whose wait for the user's lock (busy_wait) times out:
 * a conflict, the pooled kernel left in the pool, no lock left held. */
static void
busy_claim(struct cx_ctx *other, struct cx_ctx *cx)
{
    const char *u[1] = {"dave"};
    struct cx_session s;
    char msg[CX_MSG_MAX] = "";
    int started = -1;

    need(cx_db_exec(other->db, &q_hold_user, u, NULL) == CX_OK, "dave's creation lock held");
    is_int(cx_session_acquire(cx, "dave", "k-busy", 60, CX_LANG_PYTHON, &s, msg, sizeof(msg)),
           CX_ERR_CONFLICT, "a pooled creation meanwhile: conflict after busy_wait (%s)", msg);
    ok(cx_db_exec(other->db, &q_free_user, u, NULL) == CX_OK, "let go");
    ok(cx_prestart_fill(cx, &started) == CX_OK && started == 0, "the pooled kernel is still there");
    ok(cx_session_acquire(cx, "dave", "k-busy", 60, CX_LANG_PYTHON, &s, msg, sizeof(msg)) ==
               CX_OK &&
           s.from_pool,
       "then the creation takes it (%s)", msg);
    cx_session_release(cx, &s);
    ok(cx_session_close(cx, "dave", "k-busy") == CX_OK, "and closes");
    ok(cx_prestart_fill(cx, &started) == CX_OK && started == 1, "the pool filled again (%d)",
       started);
}

/* The same with a pool: a new conversation's claim takes the user's lock
 * for its own transaction, in the round trip of the claim, whose count is
 * a statement after the lock's. */
static void
pooled_creation_counts_after_the_lock(struct cxtest *t, struct cx_ctx *other)
{
    struct cx_config cfg = t->cfg;
    struct cx_ctx cx;
    int started = -1, deleted = -1;

    cfg.kernel_pool_size = 1;
    need(cx_host_ctx_open(&cx, &cfg, t->auth) == CX_OK, "a context with a pool of 1");
    ok(cx_prestart_fill(&cx, &started) == CX_OK && started == 1, "its pool filled (%d)", started);
    busy_claim(other, &cx);
    creation_counts_after_the_lock(t, other, &cx, "dave", true);
    ok(cx_prestart_drain(&cx, &deleted) == CX_OK && deleted == 0, "the pooled kernel was taken");
    cx_host_ctx_close(&cx);
}

static void
list_close_reap(struct cxtest *t)
{
    struct cx_session s;
    json_t *l = NULL;
    int closed = -1;

    ok(cx_session_list(&t->cx, "bob", &l) == CX_OK && json_array_size(l) >= 2,
       "bob's sessions listed");
    ok(json_object_get(json_array_get(l, 0), "workspace") != NULL, "with the documented columns");
    json_decref(l);
    ok(cx_session_list(&t->cx, "eve", &l) == CX_OK && json_array_size(l) == 0, "eve has none");
    json_decref(l);
    ok(cx_session_close(&t->cx, "bob", "c1") == CX_OK, "close c1");
    is_int(cx_session_close(&t->cx, "bob", "c1"), CX_ERR_NOT_FOUND, "closing it again: not found");
    is_int(cx_session_close(&t->cx, "eve", "c3"), CX_ERR_NOT_FOUND, "eve cannot close bob's");
    ok(acquire(&t->cx, "short", 1, &s) == CX_OK, "a session with a 1 s ttl");
    cx_session_release(&t->cx, &s);
    sleep(3); /* its expiry passes; the ttl of acquire only ever extends */
    ok(cx_session_reap(&t->cx, 10, &closed) == CX_OK && closed >= 1, "the reaper closes it (%d)",
       closed);
    is_int(cx_gateway_kernel_get(t->cx.gw, s.kernel_id, NULL), CX_ERR_NOT_FOUND,
           "and its kernel is gone");
}

int
main(void)
{
    struct cxtest t;
    struct cx_ctx other, third;

    cxtest_open(&t, "session", CONF);
    need(cx_host_ctx_open(&other, &t.cfg, t.auth) == CX_OK &&
             cx_host_ctx_open(&third, &t.cfg, t.auth) == CX_OK,
         "a second and a third context");
    create_and_reuse(&t, &other);
    vanished(&t);
    cap_and_eviction(&t, &other, &third);
    list_close_reap(&t);
    creation_busy(&t, &other);
    creation_counts_after_the_lock(&t, &other, &t.cx, "carol", false);
    pooled_creation_counts_after_the_lock(&t, &other);
    /* leave nothing running on the suite's gateway */
    {
        json_t *l = NULL;
        size_t i;
        json_t *row;
        if (cx_session_list(&t.cx, NULL, &l) == CX_OK)
            json_array_foreach(l, i, row)
            {
                const char *cid = json_string_value(json_object_get(row, "conversation"));
                if (cid && cx_session_close(&t.cx, "bob", cid))
                    printf("# could not close %s\n", cid);
            }
        json_decref(l);
    }
    cx_host_ctx_close(&other);
    cx_host_ctx_close(&third);
    cxtest_close(&t);
    return tap_done();
}
