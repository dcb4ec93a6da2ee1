/* codexec: PostgreSQL access.
 *
 * One struct cx_db per worker thread (libpq connections are not shared).
 * Statements are declared where they are used with CX_SQL() and prepared
 * lazily on each connection. When the connection breaks (PostgreSQL
 * restarted, a network cut), the next call reconnects and re-prepares; a
 * statement that failed because the connection was already dead is retried
 * once when no transaction is open. Inside a transaction the error is
 * returned: the transaction is gone and the caller must start over. While
 * the caller holds session state on the connection (cx_db_pin()), nothing
 * reconnects: the error is returned. */
#ifndef CX_DB_H
#define CX_DB_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "codexec.h"

struct cx_db;

struct cx_sql {
    const char *text;
    int nparams;
    int id; /* assigned on first use */
};

#define CX_SQL(var, nparams_, text_) static struct cx_sql var = {(text_), (nparams_), 0}

/* The connection's owner columns (a run's, an idempotency key's): its
 * backend's pid and start, which the sweep looks for in pg_stat_activity
 * (the start is read once per connection, lib/db.c). */
#define CX_SQL_OWNER "pg_backend_pid(), current_setting('codexec.backend_start')::timestamptz"

/* A timestamp column as the API writes it: "2026-11-29T15:10:00Z", and
 * with milliseconds. */
#define CX_SQL_UTC(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
#define CX_SQL_UTC_MS(col)                                                                         \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
#define CX_SQL_UTC_US(col)                                                                         \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* Creates a handle; connects on first use. Free with cx_db_free(). */
enum cx_err cx_db_new(const char *conninfo, struct cx_db **out) CX_MUSTCHECK;
void cx_db_free(struct cx_db *db);

/* Runs a prepared statement with text parameters (NULL = SQL NULL).
 * On CX_OK, *res (if res is not NULL) holds the result: PQclear() it.
 * CX_ERR_CONFLICT for a unique violation, CX_ERR_DB otherwise. */
enum cx_err cx_db_exec(struct cx_db *db, struct cx_sql *q, const char *const *params,
                       PGresult **res) CX_MUSTCHECK;

/* One statement of cx_db_exec_all(). */
struct cx_db_call {
    struct cx_sql *q;
    const char *const *params;
    PGresult **res; /* where its result goes (PQclear() it), or NULL */
};

/* Runs the statements in one round trip and one transaction (libpq's
 * pipeline mode, one sync): all of them, or none when one fails (the
 * others' results are not kept). Not inside cx_db_begin(). A connection
 * that was already dead is replaced and the whole tried again, as by
 * cx_db_exec(); CX_ERR_CONFLICT for a unique violation, CX_ERR_DB
 * otherwise. At most 15 statements.
 *
 * durable = false: the COMMIT does not wait for the WAL to reach the disk
 * (synchronous_commit off for this transaction). Its effects are durable
 * once any later synchronous COMMIT on the server is (the WAL is written
 * in order), or within about 0.6 s; a crash of PostgreSQL before that
 * loses them. For what a later durable COMMIT of the same request makes
 * durable anyway (a run's first records, made durable by its end). */
enum cx_err cx_db_exec_all(struct cx_db *db, struct cx_db_call *calls, size_t n,
                           bool durable) CX_MUSTCHECK;

/* cx_db_exec() for a statement that finds one row: CX_ERR_NOT_FOUND (and
 * *res NULL) when it found none, or more than one. */
enum cx_err cx_db_exec_row(struct cx_db *db, struct cx_sql *q, const char *const *params,
                           PGresult **res) CX_MUSTCHECK;

/* Runs q and turns its rows into objects {name: text or null}, the names
 * space-separated in columns, one per column. *out: new reference to the
 * array. */
enum cx_err cx_db_rows(struct cx_db *db, struct cx_sql *q, const char *const *params,
                       const char *columns, json_t **out) CX_MUSTCHECK;

/* Plain SQL without parameters (DDL, BEGIN, migrations). */
enum cx_err cx_db_run(struct cx_db *db, const char *sql) CX_MUSTCHECK;

enum cx_err cx_db_begin(struct cx_db *db) CX_MUSTCHECK;
enum cx_err cx_db_commit(struct cx_db *db) CX_MUSTCHECK;
/* Never fails from the caller's view: a failed rollback drops the connection. */
void cx_db_rollback(struct cx_db *db);

/* COMMIT. When the connection broke during it, whether it took effect is
 * unknown: CX_ERR_DB, and cx_db_commit_unknown() is true until the next
 * commit (the caller finds out from the data it wrote). */
bool cx_db_commit_unknown(const struct cx_db *db);

/* Session state the connection carries (advisory locks): while pinned, a
 * broken connection is not replaced behind the caller's back, as a new one
 * would silently lack the locks. Calls fail with CX_ERR_DB until the last
 * unpin; the next call after it reconnects. Pins nest. */
void cx_db_pin(struct cx_db *db);
void cx_db_unpin(struct cx_db *db);

/* Without waiting: reads what the server sent (a termination notice) and
 * tells whether the connection is still up, and, pinned, never was lost
 * meanwhile. */
bool cx_db_connection_ok(struct cx_db *db);

/* SELECT 1, reconnecting if needed. */
enum cx_err cx_db_ping(struct cx_db *db) CX_MUSTCHECK;

/* SQLSTATE of the last failed statement ("" if none). */
const char *cx_db_sqlstate(const struct cx_db *db);

/* Whether the last failed statement was a lock wait that ran out its
 * lock_timeout (55P03: codexec's own busy_wait, a busy answer, not a
 * failure of the database). */
bool cx_db_lock_timed_out(const struct cx_db *db);

/* Applies the embedded migrations from sql/ that are not applied yet, each in
 * its own transaction under an advisory lock (safe to run concurrently).
 * *applied counts the ones applied now. */
enum cx_err cx_db_migrate(struct cx_db *db, int *applied) CX_MUSTCHECK;

#endif
