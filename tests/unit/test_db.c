#include "../../lib/db.h"
#include "../../lib/log.h"
#include "../../lib/metrics.h"
#include "pgtest.h"

CX_SQL(q_insert, 2, "INSERT INTO t (k, v) VALUES ($1, $2)");
CX_SQL(q_select, 1, "SELECT v FROM t WHERE k = $1");
CX_SQL(q_pid, 0, "SELECT pg_backend_pid()");
CX_SQL(q_owner, 0,
       "SELECT (" CX_SQL_OWNER ") = (pid, backend_start) FROM pg_stat_activity"
       " WHERE pid = pg_backend_pid()");

static void
kill_backend(const char *pid)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%s)", pid);
    pgtest_admin(sql);
    usleep(100 * 1000);
}

CX_SQL(q_isolation, 0, "SELECT current_setting('transaction_isolation')");
CX_SQL(q_lock_timeout, 0, "SELECT current_setting('lock_timeout')");
CX_SQL(q_hold, 0, "SELECT pg_advisory_lock(42)");
CX_SQL(q_wait, 0, "SELECT set_config('lock_timeout', '100ms', false), pg_advisory_lock(42)");
CX_SQL(q_divide, 0, "SELECT 1 / (SELECT count(*) FROM pg_database WHERE false)");
CX_SQL(q_runs_key_fks, 0,
       "SELECT count(*) FROM pg_constraint WHERE conrelid = 'runs'::regclass"
       " AND confrelid = 'api_keys'::regclass AND contype = 'f'");

/* A handle on conninfo whose connections start with these server
 * options, or NULL. */
static struct cx_db *
with_options(const char *conninfo, const char *options)
{
    char ci[1200];
    struct cx_db *db = NULL;

    snprintf(ci, sizeof(ci), "%s options='%s'", conninfo, options);
    return cx_db_new(ci, &db) == CX_OK ? db : NULL;
}

/* Whether q's one row has want as its one value. */
static bool
value_is(struct cx_db *db, struct cx_sql *q, const char *want)
{
    PGresult *r = NULL;
    bool is = cx_db_exec(db, q, NULL, &r) == CX_OK && PQntuples(r) == 1 &&
              !strcmp(PQgetvalue(r, 0, 0), want);

    PQclear(r);
    return is;
}

/* Every connection reads in READ COMMITTED, whatever the server's or the
 * role's default: a pipeline's count after a lock (lib/session.c) must see
 * what the lock's last holder committed, which one snapshot for the whole
 * pipeline would not. */
static void
isolation(const char *conninfo)
{
    struct cx_db *db = with_options(conninfo, "-c default_transaction_isolation=serializable");

    need(db != NULL, "a handle whose server default is SERIALIZABLE");
    ok(value_is(db, &q_isolation, "read committed"), "its statements run in READ COMMITTED");
    cx_db_free(db);
}

/* A lock wait that runs out its timeout (codexec's own, busy_wait) is a
 * busy answer: its SQLSTATE kept for the caller, and not counted among
 * the database's errors (the operators' alert on them). Another failure
 * is. No lock_timeout of the role's applies to codexec's statements. */
static void
lock_waits(const char *conninfo)
{
    struct cx_db *a = with_options(conninfo, "-c lock_timeout=50ms"), *b = NULL;
    uint64_t before;

    need(a != NULL && cx_db_new(conninfo, &b) == CX_OK, "two handles, one with a lock_timeout");
    ok(value_is(a, &q_lock_timeout, "0"), "the role's or server's lock_timeout is not codexec's");
    ok(cx_db_exec(b, &q_hold, NULL, NULL) == CX_OK, "a lock held on one connection");
    before = cx_metrics_counter(CX_COUNT_DATABASE_ERRORS);
    is_int(cx_db_exec(a, &q_wait, NULL, NULL), CX_ERR_DB, "a wait for it that times out fails");
    is_str(cx_db_sqlstate(a), "55P03", "as lock_not_available");
    ok(cx_db_lock_timed_out(a), "a lock wait that timed out");
    ok(cx_metrics_counter(CX_COUNT_DATABASE_ERRORS) == before, "not counted as a database error");
    is_int(cx_db_exec(a, &q_divide, NULL, NULL), CX_ERR_DB, "a division by zero fails");
    ok(cx_metrics_counter(CX_COUNT_DATABASE_ERRORS) == before + 1, "counted");
    cx_db_free(a);
    cx_db_free(b);
}

/* The connection's owner columns are its backend's, as the sweep compares
 * them with pg_stat_activity: also under a DateStyle whose text names the
 * zone by an abbreviation that reads back as another offset. */
static void
owner_names(const char *conninfo)
{
    struct cx_db *db = with_options(conninfo, "-c DateStyle=SQL,DMY -c TimeZone=Asia/Kolkata");
    PGresult *r = NULL;

    need(db != NULL, "a handle with DateStyle SQL, zone Asia/Kolkata (IST)");
    ok(value_is(db, &q_owner, "t"), "the owner columns are the backend's pid and start");
    ok(cx_db_exec(db, &q_pid, NULL, &r) == CX_OK, "its pid");
    kill_backend(PQgetvalue(r, 0, 0));
    PQclear(r);
    ok(value_is(db, &q_owner, "t"), "and the new connection's after a reconnect");
    cx_db_free(db);
}

static int
count_rows(struct cx_db *db, const char *k)
{
    const char *p[1] = {k};
    PGresult *r = NULL;
    int n = cx_db_exec(db, &q_select, p, &r) == CX_OK ? PQntuples(r) : -1;

    PQclear(r);
    return n;
}

/* Statements in one round trip: one transaction, all or none, results where
 * asked; a connection found dead is replaced and the whole sent again. */
static void
pipelined(struct cx_db *db)
{
    const char *pd[2] = {"d", "1"}, *pe[2] = {"e", "2"}, *sd[1] = {"d"};
    PGresult *r = NULL, *none = NULL;
    struct cx_db_call two[3] = {{&q_insert, pd, NULL}, {&q_insert, pe, NULL}, {&q_select, sd, &r}};
    char pid[32];

    ok(cx_db_exec_all(db, two, 3, true) == CX_OK, "pipeline: two inserts and a select");
    ok(r && PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "1"),
       "pipeline: the select sees the insert before it");
    PQclear(r);
    ok(count_rows(db, "d") == 1 && count_rows(db, "e") == 1, "pipeline: both committed");
    {
        const char *pf[2] = {"f", "3"};
        struct cx_db_call clash[3] = {
            {&q_insert, pf, NULL}, {&q_insert, pd, NULL}, {&q_select, sd, &none}};
        is_int(cx_db_exec_all(db, clash, 3, false), CX_ERR_CONFLICT,
               "pipeline: a unique violation");
        ok(none == NULL, "pipeline: no result kept from a failed one");
        is_int(count_rows(db, "f"), 0, "pipeline: the statement before it rolled back");
    }
    ok(cx_db_ping(db) == CX_OK, "pipeline: the connection works on");
    {
        CX_SQL(q_sync, 0, "SELECT current_setting('synchronous_commit')");
        CX_SQL(q_sync_on, 0, "SELECT set_config('synchronous_commit', 'on', false)");
        const char *ph[2] = {"h", "5"};
        struct cx_db_call quick[2] = {{&q_insert, ph, NULL}, {&q_sync, NULL, &r}};
        /* (the test cluster may run with it off: on for this connection) */
        ok(cx_db_exec(db, &q_sync_on, NULL, NULL) == CX_OK, "synchronous_commit on");
        ok(cx_db_exec_all(db, quick, 2, false) == CX_OK && !strcmp(PQgetvalue(r, 0, 0), "off"),
           "pipeline: not durable, its transaction commits without waiting");
        PQclear(r);
        ok(count_rows(db, "h") == 1, "pipeline: and commits");
        ok(cx_db_exec(db, &q_sync, NULL, &r) == CX_OK && !strcmp(PQgetvalue(r, 0, 0), "on"),
           "pipeline: the setting ended with it");
        PQclear(r);
    }
    ok(cx_db_exec(db, &q_pid, NULL, &r) == CX_OK, "backend pid");
    snprintf(pid, sizeof(pid), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    kill_backend(pid);
    {
        const char *pg[2] = {"g", "4"};
        struct cx_db_call again[1] = {{&q_insert, pg, NULL}};
        ok(cx_db_exec_all(db, again, 1, true) == CX_OK && count_rows(db, "g") == 1,
           "pipeline: a dead connection is replaced and the whole sent again");
    }
    ok(cx_db_begin(db) == CX_OK, "begin");
    {
        struct cx_db_call in_tx[1] = {{&q_select, sd, NULL}};
        is_int(cx_db_exec_all(db, in_tx, 1, true), CX_ERR_INTERNAL,
               "pipeline: not inside a transaction");
    }
    cx_db_rollback(db);
}

int
main(void)
{
    const char *conninfo = pgtest_create("db");
    struct cx_db *db, *bad;
    PGresult *r = NULL;
    int applied = -1;
    char pid[32];

    if (cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    need(cx_db_new(conninfo, &db) == CX_OK, "handle created");
    ok(cx_db_migrate(db, &applied) == CX_OK && applied >= 1, "migrations apply (%d)", applied);
    ok(cx_db_migrate(db, &applied) == CX_OK && applied == 0, "a second migrate applies nothing");
    ok(cx_db_run(db,
                 "SELECT 1 FROM api_keys, sessions, runs, artifacts, artifact_versions LIMIT 0") ==
           CX_OK,
       "the spec's tables exist");
    /* 015: a run's insert locks no key row (its FOREIGN KEY's check did) */
    ok(cx_db_exec_row(db, &q_runs_key_fks, NULL, &r) == CX_OK && !strcmp(PQgetvalue(r, 0, 0), "0"),
       "runs.api_key_id has no foreign key to api_keys");
    PQclear(r);
    r = NULL;
    ok(cx_db_run(db, "CREATE TABLE t (k text PRIMARY KEY, v text)") == CX_OK, "create table");
    {
        const char *p[2] = {"a", "it's; DROP TABLE t; --"};
        ok(cx_db_exec(db, &q_insert, p, NULL) == CX_OK, "parameterised insert");
        is_int(cx_db_exec(db, &q_insert, p, NULL), CX_ERR_CONFLICT,
               "unique violation is a conflict");
        is_str(cx_db_sqlstate(db), "23505", "SQLSTATE kept");
        ok(!cx_db_lock_timed_out(db), "a unique violation is no lock wait");
    }
    {
        const char *p[1] = {"a"};
        ok(cx_db_exec(db, &q_select, p, &r) == CX_OK && PQntuples(r) == 1 &&
               strcmp(PQgetvalue(r, 0, 0), "it's; DROP TABLE t; --") == 0,
           "SQL metacharacters are data");
        PQclear(r);
    }
    ok(cx_db_ping(db) == CX_OK, "ping");

    /* The server ends our backend (as a PostgreSQL restart does): the next
     * call must succeed on a new connection, prepared statements and all. */
    ok(cx_db_exec(db, &q_pid, NULL, &r) == CX_OK, "backend pid");
    snprintf(pid, sizeof(pid), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    kill_backend(pid);
    {
        const char *p[1] = {"a"};
        ok(cx_db_exec(db, &q_select, p, &r) == CX_OK && PQntuples(r) == 1,
           "reconnects transparently after the backend is terminated");
        PQclear(r);
    }
    ok(cx_db_exec(db, &q_pid, NULL, &r) == CX_OK && strcmp(PQgetvalue(r, 0, 0), pid) != 0,
       "on a new backend");
    snprintf(pid, sizeof(pid), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);

    /* Inside a transaction the loss is reported, not papered over. */
    ok(cx_db_begin(db) == CX_OK, "begin");
    kill_backend(pid);
    {
        const char *p[2] = {"b", "x"};
        is_int(cx_db_exec(db, &q_insert, p, NULL), CX_ERR_DB, "a broken transaction fails");
    }
    cx_db_rollback(db);
    ok(cx_db_ping(db) == CX_OK, "and the handle works again afterwards");

    /* Pinned (advisory locks on the connection): no silent reconnect. */
    ok(cx_db_exec(db, &q_pid, NULL, &r) == CX_OK, "backend pid");
    snprintf(pid, sizeof(pid), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    cx_db_pin(db);
    ok(cx_db_connection_ok(db), "a pinned connection is up");
    kill_backend(pid);
    ok(!cx_db_connection_ok(db), "its termination is seen without a query");
    is_int(cx_db_ping(db), CX_ERR_DB, "pinned, a lost connection is an error, not a new one");
    is_int(cx_db_ping(db), CX_ERR_DB, "and stays one while pinned");
    cx_db_unpin(db);
    ok(cx_db_ping(db) == CX_OK, "unpinned, the next call reconnects");
    ok(cx_db_begin(db) == CX_OK, "begin");
    {
        const char *p[2] = {"c", "y"};
        ok(cx_db_exec(db, &q_insert, p, NULL) == CX_OK, "insert in transaction");
    }
    cx_db_rollback(db);
    {
        const char *p[1] = {"c"};
        ok(cx_db_exec(db, &q_select, p, &r) == CX_OK && PQntuples(r) == 0, "rollback undoes it");
        PQclear(r);
    }
    pipelined(db);
    cx_db_free(db);
    owner_names(conninfo);
    isolation(conninfo);
    lock_waits(conninfo);

    need(cx_db_new("host=/nonexistent dbname=x connect_timeout=2", &bad) == CX_OK, "bad handle");
    is_int(cx_db_ping(bad), CX_ERR_DB, "an unreachable server is a db error");
    cx_db_free(bad);
    cx_db_free(NULL);
    pgtest_drop();
    return tap_done();
}
