#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "metrics.h"

#define MAX_STATEMENTS     256
#define LOCK_NOT_AVAILABLE "55P03" /* SQLSTATE: a lock wait ran out lock_timeout */

struct cx_db {
    char *conninfo;
    PGconn *conn;
    bool in_tx;
    unsigned pins;       /* cx_db_pin() depth */
    bool lost;           /* the connection broke while pinned */
    bool commit_unknown; /* the last COMMIT's outcome */
    char sqlstate[6];
    unsigned char prepared[MAX_STATEMENTS / 8];
};

struct cx_migration {
    int version;
    const char *name;
    const char *sql;
};
/* Generated from the sql/ migrations by the build (tools/embed-sql.sh). */
extern const struct cx_migration cx_migrations[];
extern const int cx_migrations_count;

static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;
static int next_id = 1;

enum cx_err
cx_db_new(const char *conninfo, struct cx_db **out)
{
    struct cx_db *db = calloc(1, sizeof(*db));

    if (!db)
        return CX_ERR_NOMEM;
    db->conninfo = strdup(conninfo);
    if (!db->conninfo) {
        free(db);
        return CX_ERR_NOMEM;
    }
    *out = db;
    return CX_OK;
}

static void
disconnect(struct cx_db *db)
{
    if (db->conn)
        PQfinish(db->conn);
    db->conn = NULL;
    db->in_tx = false;
    memset(db->prepared, 0, sizeof(db->prepared));
}

void
cx_db_free(struct cx_db *db)
{
    if (!db)
        return;
    disconnect(db);
    free(db->conninfo);
    free(db);
}

static void
log_conn_error(struct cx_db *db, const char *what)
{
    char msg[CX_MSG_MAX];
    const char *e = db->conn ? PQerrorMessage(db->conn) : "out of memory";

    /* libpq's connection messages name hosts and sockets, never user data. */
    snprintf(msg, sizeof(msg), "%s", e);
    msg[strcspn(msg, "\n")] = '\0';
    cx_log_err(0, "%s: %s", what, msg);
}

/* What names this connection for as long as it lives (CX_SQL_OWNER): its
 * backend's start, read once here. A statement that reads it from
 * pg_stat_activity instead copies every backend's status (~0.5 ms of the
 * server's CPU with a hundred connections, at every run). Written in UTC
 * to the microsecond, ISO 8601: read back as the same instant whatever the
 * session's DateStyle and TimeZone (a zone's abbreviation would not be).
 * And its isolation, whatever the server's or role's default: READ
 * COMMITTED, on which a pipeline's statement after a lock relies to see
 * what the lock's last holder committed (each statement its own
 * snapshot; lib/session.c). And no lock_timeout but the ones codexec sets
 * on its own lock waits (busy_wait), which reset it to none (as the first
 * of them did before): a lock wait that times out is a busy answer, not a
 * database error (result_error()). */
static bool
name_connection(PGconn *conn)
{
    static const char sql[] = "SELECT set_config('codexec.backend_start', " CX_SQL_UTC_US(
        "backend_start") ", false),"
                         " set_config('default_transaction_isolation', 'read committed', false),"
                         " set_config('lock_timeout', '0', false)"
                         " FROM pg_stat_activity WHERE pid = pg_backend_pid()";
    PGresult *r = PQexec(conn, sql);
    bool ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;

    PQclear(r);
    return ok;
}

static enum cx_err
ensure_connected(struct cx_db *db)
{
    if (db->conn && PQstatus(db->conn) == CONNECTION_OK && !db->lost)
        return CX_OK;
    if (db->pins) {
        if (!db->lost)
            cx_log_err(0, "PostgreSQL connection lost with the locks it held");
        db->lost = true;
        return CX_ERR_DB; /* a new connection would not hold them */
    }
    disconnect(db);
    db->conn = PQconnectdb(db->conninfo);
    if (!db->conn || PQstatus(db->conn) != CONNECTION_OK || !name_connection(db->conn)) {
        cx_metrics_count(CX_COUNT_DATABASE_ERRORS);
        log_conn_error(db, "connection to PostgreSQL failed");
        disconnect(db);
        return CX_ERR_DB;
    }
    return CX_OK;
}

static int
stmt_id(struct cx_sql *q)
{
    int id = __atomic_load_n(&q->id, __ATOMIC_ACQUIRE);

    if (id)
        return id;
    pthread_mutex_lock(&id_lock);
    if (!q->id) {
        if (next_id >= MAX_STATEMENTS) {
            pthread_mutex_unlock(&id_lock);
            return -1;
        }
        __atomic_store_n(&q->id, next_id++, __ATOMIC_RELEASE);
    }
    id = q->id;
    pthread_mutex_unlock(&id_lock);
    return id;
}

/* Maps a failed result to an error and remembers the SQLSTATE. Only the
 * SQLSTATE is logged: PostgreSQL messages can quote parameter values. */
static enum cx_err
result_error(struct cx_db *db, PGresult *r, int id)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;

    snprintf(db->sqlstate, sizeof(db->sqlstate), "%s", state ? state : "");
    /* lock_not_available: a wait for a lock ran out its lock_timeout, which
     * codexec sets on its own lock waits (busy_wait): a busy answer the
     * caller gives (409), counted among the refusals, not a failure of the
     * database that its counter and the operators' alert on it should see */
    if (state && strcmp(state, LOCK_NOT_AVAILABLE) == 0) {
        cx_log_info("statement s%d: a lock wait timed out", id);
        return CX_ERR_DB;
    }
    cx_metrics_count(CX_COUNT_DATABASE_ERRORS);
    if (state && strcmp(state, "23505") == 0)
        return CX_ERR_CONFLICT;
    if (!db->conn || PQstatus(db->conn) != CONNECTION_OK)
        log_conn_error(db, "PostgreSQL connection lost");
    else
        cx_log_err(0, "statement s%d failed with SQLSTATE %s", id, db->sqlstate);
    return CX_ERR_DB;
}

static bool
retriable(struct cx_db *db, bool was_in_tx)
{
    if (db->conn && PQstatus(db->conn) == CONNECTION_BAD && db->pins)
        db->lost = true;
    return !was_in_tx && !db->pins && db->conn && PQstatus(db->conn) == CONNECTION_BAD;
}

void
cx_db_pin(struct cx_db *db)
{
    db->pins++;
}

void
cx_db_unpin(struct cx_db *db)
{
    if (db->pins && --db->pins == 0 && db->lost) {
        disconnect(db); /* the next call starts afresh */
        db->lost = false;
    }
}

/* Reads what the server sent without waiting. A terminated backend sends
 * its FATAL message, then closes: the first read takes the message, the
 * second meets the end. */
static bool
still_up(PGconn *c)
{
    for (int i = 0; i < 2; i++) {
        if (!PQconsumeInput(c))
            return false;
        (void)PQisBusy(c); /* parses what was read */
    }
    return PQstatus(c) == CONNECTION_OK;
}

bool
cx_db_connection_ok(struct cx_db *db)
{
    if (!db->conn || db->lost)
        return false;
    if (!still_up(db->conn)) {
        if (db->pins)
            db->lost = true;
        return false;
    }
    return true;
}

bool
cx_db_commit_unknown(const struct cx_db *db)
{
    return db->commit_unknown;
}

/* After a failed call (r is cleared): true to try once more (the
 * connection dropped outside a transaction, on the first attempt), else
 * false with the error in *rc. */
static bool
retry_after(struct cx_db *db, PGresult *r, int id, bool was_in_tx, int attempt, enum cx_err *rc)
{
    *rc = result_error(db, r, id);
    PQclear(r);
    if (retriable(db, was_in_tx) && attempt == 0) {
        disconnect(db);
        return true;
    }
    return false;
}

/* Prepares q on this connection unless it is; its statement name in name. */
static enum cx_err
prepare(struct cx_db *db, struct cx_sql *q, int id, char name[16], PGresult **fail)
{
    PGresult *r;

    snprintf(name, 16, "s%d", id);
    *fail = NULL;
    if (db->prepared[id / 8] & (1u << (id % 8)))
        return CX_OK;
    r = PQprepare(db->conn, name, q->text, q->nparams, NULL);
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) {
        *fail = r;
        return CX_ERR_DB;
    }
    PQclear(r);
    db->prepared[id / 8] |= (unsigned char)(1u << (id % 8));
    return CX_OK;
}

enum cx_err
cx_db_exec(struct cx_db *db, struct cx_sql *q, const char *const *params, PGresult **res)
{
    char name[16];
    PGresult *r = NULL;
    int id = stmt_id(q);
    enum cx_err rc;
    bool was_in_tx = db->in_tx;

    if (res)
        *res = NULL;
    if (id < 0)
        return CX_ERR_INTERNAL;
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = ensure_connected(db);
        if (rc)
            return rc;
        if (prepare(db, q, id, name, &r)) {
            if (retry_after(db, r, id, was_in_tx, attempt, &rc))
                continue;
            return rc;
        }
        r = PQexecPrepared(db->conn, name, q->nparams, params, NULL, NULL, 0);
        if (r && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK))
            break;
        if (retry_after(db, r, id, was_in_tx, attempt, &rc)) {
            r = NULL;
            continue;
        }
        r = NULL;
        if (db->in_tx && PQstatus(db->conn) != CONNECTION_OK)
            disconnect(db);
        return rc;
    }
    if (!r)
        return CX_ERR_DB;
    db->sqlstate[0] = '\0';
    if (res)
        *res = r;
    else
        PQclear(r);
    return CX_OK;
}

enum cx_err
cx_db_run(struct cx_db *db, const char *sql)
{
    PGresult *r;
    enum cx_err rc;

    for (int attempt = 0; attempt < 2; attempt++) {
        bool was_in_tx = db->in_tx;

        rc = ensure_connected(db);
        if (rc)
            return rc;
        r = PQexec(db->conn, sql);
        if (r && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK)) {
            PQclear(r);
            db->sqlstate[0] = '\0';
            return CX_OK;
        }
        rc = result_error(db, r, 0);
        PQclear(r);
        if (retriable(db, was_in_tx) && attempt == 0) {
            disconnect(db);
            continue;
        }
        return rc;
    }
    return CX_ERR_DB;
}

enum cx_err
cx_db_begin(struct cx_db *db)
{
    enum cx_err rc = cx_db_run(db, "BEGIN");

    if (rc == CX_OK)
        db->in_tx = true;
    return rc;
}

#ifdef CX_TEST_HOOKS
/* Test builds only, a stand-in for a fault that cannot be produced on
 * demand: with CODEXEC_TEST_LOSE_COMMIT_REPLY=1 a COMMIT that succeeded
 * is reported as if its reply was lost with the connection. */
static bool
lose_commit_reply(void)
{
    const char *v = getenv("CODEXEC_TEST_LOSE_COMMIT_REPLY");
    return v && !strcmp(v, "1");
}
#endif

enum cx_err
cx_db_commit(struct cx_db *db)
{
    enum cx_err rc;
    PGresult *r;

    db->commit_unknown = false;
    if (!db->conn)
        return CX_ERR_DB;
    /* Never retried: whether a COMMIT that lost its connection took effect
     * is unknown; the caller is told so. */
    r = PQexec(db->conn, "COMMIT");
    db->in_tx = false;
#ifdef CX_TEST_HOOKS
    if (r && PQresultStatus(r) == PGRES_COMMAND_OK && lose_commit_reply()) {
        PQclear(r); /* as if the reply was lost with the connection */
        db->commit_unknown = true;
        if (db->pins)
            db->lost = true;
        else
            disconnect(db);
        return CX_ERR_DB;
    }
#endif
    if (r && PQresultStatus(r) == PGRES_COMMAND_OK) {
        PQclear(r);
        return CX_OK;
    }
    db->commit_unknown = !r || PQstatus(db->conn) != CONNECTION_OK;
    rc = result_error(db, r, 0);
    PQclear(r);
    if (PQstatus(db->conn) != CONNECTION_OK) {
        if (db->pins)
            db->lost = true;
        else
            disconnect(db);
    }
    return rc == CX_OK ? CX_ERR_DB : rc;
}

void
cx_db_rollback(struct cx_db *db)
{
    PGresult *r;

    if (!db->conn) {
        db->in_tx = false;
        return;
    }
    r = PQexec(db->conn, "ROLLBACK");
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK)
        disconnect(db);
    PQclear(r);
    db->in_tx = false;
}

enum cx_err
cx_db_ping(struct cx_db *db)
{
    return cx_db_run(db, "SELECT 1");
}

const char *
cx_db_sqlstate(const struct cx_db *db)
{
    return db->sqlstate;
}

bool
cx_db_lock_timed_out(const struct cx_db *db)
{
    return !strcmp(db->sqlstate, LOCK_NOT_AVAILABLE);
}

CX_SQL(q_applied, 1, "SELECT 1 FROM schema_migrations WHERE version = $1::int");
CX_SQL(q_record, 2, "INSERT INTO schema_migrations (version, name) VALUES ($1::int, $2)");

enum cx_err
cx_db_migrate(struct cx_db *db, int *applied)
{
    enum cx_err rc;
    PGresult *r = NULL;
    char ver[16];

    *applied = 0;
    rc = cx_db_run(db, "CREATE TABLE IF NOT EXISTS schema_migrations ("
                       " version int PRIMARY KEY, name text NOT NULL,"
                       " applied_at timestamptz NOT NULL DEFAULT now())");
    if (rc && rc != CX_ERR_CONFLICT)
        return rc;
    for (int i = 0; i < cx_migrations_count; i++) {
        const struct cx_migration *m = &cx_migrations[i];
        const char *p[2] = {ver, m->name};

        snprintf(ver, sizeof(ver), "%d", m->version);
        rc = cx_db_begin(db);
        if (rc)
            return rc;
        rc = cx_db_run(db, "SELECT pg_advisory_xact_lock(7243010)");
        if (rc)
            goto fail;
        rc = cx_db_exec(db, &q_applied, p, &r);
        if (rc)
            goto fail;
        if (PQntuples(r) > 0) {
            PQclear(r);
            r = NULL;
            cx_db_rollback(db);
            continue;
        }
        PQclear(r);
        r = NULL;
        rc = cx_db_run(db, m->sql);
        if (rc) {
            cx_log_err(0, "migration %d (%s) failed", m->version, m->name);
            goto fail;
        }
        rc = cx_db_exec(db, &q_record, p, NULL);
        if (rc)
            goto fail;
        rc = cx_db_commit(db);
        if (rc)
            return rc;
        cx_log_info("applied migration %d (%s)", m->version, m->name);
        (*applied)++;
    }
    return CX_OK;
fail:
    cx_db_rollback(db);
    return rc;
}

enum cx_err
cx_db_rows(struct cx_db *db, struct cx_sql *q, const char *const *params, const char *columns,
           json_t **out)
{
    PGresult *r = NULL;
    json_t *rows;
    enum cx_err rc = cx_db_exec(db, q, params, &r);

    *out = NULL;
    if (rc)
        return rc;
    rows = json_array();
    for (int i = 0; rows && i < PQntuples(r); i++) {
        json_t *row = json_object();
        const char *name = columns;
        for (int c = 0; row && *name && c < PQnfields(r); c++) {
            char key[64];
            size_t n = strcspn(name, " ");
            snprintf(key, sizeof(key), "%.*s", (int)n, name);
            name += n + (name[n] == ' ');
            json_object_set_new(
                row, key, PQgetisnull(r, i, c) ? json_null() : json_string(PQgetvalue(r, i, c)));
        }
        if (!row || json_array_append_new(rows, row)) {
            json_decref(rows);
            rows = NULL;
        }
    }
    PQclear(r);
    *out = rows;
    return rows ? CX_OK : CX_ERR_NOMEM;
}

/* A result of the pipeline: the first failure is kept in *fail (rc
 * CX_ERR_DB), a call's first result in its res, any other freed. */
static void
take_result(PGresult *r, struct cx_db_call *call, int id, enum cx_err *rc, PGresult **fail,
            int *fail_id)
{
    ExecStatusType st = PQresultStatus(r);
    bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;

    if (ok && *rc == CX_OK && call && call->res && !*call->res) {
        *call->res = r;
        return;
    }
    if (!ok && *rc == CX_OK) {
        *rc = CX_ERR_DB;
        *fail = r;
        *fail_id = id;
        return;
    }
    PQclear(r);
}

/* Sends the calls and their sync; reads every result up to the sync. The
 * first failure's result in *fail (with its statement's id in *fail_id);
 * *synced: the sync was sent, so the server may have committed (without
 * it, the server rolls the implicit transaction back when the connection
 * goes). */
static enum cx_err
pipeline(struct cx_db *db, struct cx_db_call *calls, const int *ids, size_t n, PGresult **fail,
         int *fail_id, bool *synced)
{
    PGconn *c = db->conn;
    char name[16];
    size_t sent = 0;
    enum cx_err rc = CX_OK;
    bool done = false;
    PGresult *r;

    *fail = NULL;
    *synced = false;
    if (!PQenterPipelineMode(c))
        return CX_ERR_DB;
    for (; sent < n; sent++) {
        snprintf(name, sizeof(name), "s%d", ids[sent]);
        if (!PQsendQueryPrepared(c, name, calls[sent].q->nparams, calls[sent].params, NULL, NULL,
                                 0))
            break;
    }
    /* the sync even after a failed send: the server answers nothing
     * queued without one (left in pipeline mode, the caller drops it) */
    if (!PQpipelineSync(c))
        return CX_ERR_DB;
    *synced = true;
    if (sent < n)
        rc = CX_ERR_DB;
    /* each statement's results end with a NULL */
    for (size_t i = 0; i < sent && PQstatus(c) == CONNECTION_OK; i++)
        while ((r = PQgetResult(c)) != NULL)
            take_result(r, &calls[i], ids[i], &rc, fail, fail_id);
    /* then the sync's; an error before it is the COMMIT's */
    while (!done && PQstatus(c) == CONNECTION_OK && (r = PQgetResult(c)) != NULL) {
        done = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
        if (done)
            PQclear(r);
        else
            take_result(r, NULL, ids[n - 1], &rc, fail, fail_id);
    }
    if (!done && rc == CX_OK)
        rc = CX_ERR_DB; /* the COMMIT's outcome is unknown */
    if (!PQexitPipelineMode(c) && rc == CX_OK)
        rc = CX_ERR_DB;
    return rc;
}

/* A connection, made again when it died while idle (the server ended it):
 * nothing is sent on a dead one, as nothing sent after a sync could be
 * sent again. */
static enum cx_err
connect_live(struct cx_db *db)
{
    enum cx_err rc = ensure_connected(db);

    if (rc || still_up(db->conn))
        return rc;
    if (db->pins)
        db->lost = true;
    else
        disconnect(db);
    return ensure_connected(db);
}

static void
clear_results(struct cx_db_call *calls, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (calls[i].res) {
            PQclear(*calls[i].res);
            *calls[i].res = NULL;
        }
}

CX_SQL(q_async_commit, 0, "SELECT set_config('synchronous_commit', 'off', true)");

enum cx_err
cx_db_exec_all(struct cx_db *db, struct cx_db_call *given, size_t n, bool durable)
{
    struct cx_db_call calls[16];
    int ids[16];
    char name[16];
    PGresult *fail = NULL;
    int fail_id = 0;
    enum cx_err rc = CX_ERR_INTERNAL;

    bool synced = false;

    db->sqlstate[0] = '\0'; /* no earlier failure's state read as this one's */
    if (n == 0 || n >= sizeof(ids) / sizeof(ids[0]) || db->in_tx)
        return n == 0 ? CX_OK : CX_ERR_INTERNAL;
    if (!durable)
        calls[0] = (struct cx_db_call){&q_async_commit, NULL, NULL};
    memcpy(calls + !durable, given, n * sizeof(*given));
    n += !durable;
    for (size_t i = 0; i < n; i++) {
        if ((ids[i] = stmt_id(calls[i].q)) < 0)
            return CX_ERR_INTERNAL;
        if (calls[i].res)
            *calls[i].res = NULL;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = connect_live(db);
        if (rc)
            return rc;
        for (size_t i = 0; i < n && rc == CX_OK; i++) {
            rc = prepare(db, calls[i].q, ids[i], name, &fail);
            fail_id = ids[i];
        }
        if (rc == CX_OK)
            rc = pipeline(db, calls, ids, n, &fail, &fail_id, &synced);
        if (rc == CX_OK)
            break;
        clear_results(calls, n);
        /* (retry_after clears fail) Once the sync went, the server may
         * have committed: not again. */
        if (retry_after(db, fail, fail_id, false, synced ? 1 : attempt, &rc))
            continue;
        if (PQstatus(db->conn) != CONNECTION_OK || PQpipelineStatus(db->conn) != PQ_PIPELINE_OFF) {
            if (db->pins)
                db->lost = true; /* its locks go with it */
            disconnect(db);
        }
        return rc;
    }
    db->sqlstate[0] = '\0';
    return rc;
}

enum cx_err
cx_db_exec_row(struct cx_db *db, struct cx_sql *q, const char *const *params, PGresult **res)
{
    enum cx_err rc = cx_db_exec(db, q, params, res);

    if (rc == CX_OK && PQntuples(*res) != 1) {
        PQclear(*res);
        *res = NULL;
        rc = CX_ERR_NOT_FOUND;
    }
    return rc;
}
