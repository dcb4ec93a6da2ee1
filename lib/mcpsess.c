/* MCP sessions and the run_code calls in progress, in PostgreSQL (every
 * codexec-fcgi process serves every session): sql/012_mcp.sql. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "mcp.h"
#include "session.h"
#include "util.h"

/* Live sessions a user may hold; an initialize beyond it ends the least
 * recently used (an agent host that never says DELETE loses its oldest
 * sessions, not its new ones). */
#define MCP_SESSIONS_PER_USER "999" /* + the one made: 1000 */
/* ... and a key, whatever end users it acts for (On-Behalf-Of makes a user
 * per id the service names) */
#define MCP_SESSIONS_PER_KEY "9999"

CX_SQL(q_begin, 5,
       "WITH s AS (INSERT INTO mcp_sessions (id, user_id, key_id, protocol_version, expires_at)"
       " VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::int)) RETURNING id)"
       " DELETE FROM mcp_sessions WHERE id IN (SELECT id FROM mcp_sessions WHERE user_id = $2"
       " ORDER BY expires_at DESC OFFSET " MCP_SESSIONS_PER_USER ")"
       " OR id IN (SELECT id FROM mcp_sessions WHERE key_id = $3 AND $3 <> ''"
       " ORDER BY expires_at DESC OFFSET " MCP_SESSIONS_PER_KEY ")");
/* The session, its expiry moved on when it is a minute or more behind
 * (most calls write nothing). */
CX_SQL(q_find, 4,
       "WITH s AS (SELECT protocol_version, expires_at FROM mcp_sessions"
       " WHERE id = $1 AND user_id = $2 AND key_id = $3 AND expires_at > now()),"
       " u AS (UPDATE mcp_sessions SET expires_at = now() + make_interval(secs => $4::int)"
       " WHERE id = $1 AND EXISTS (SELECT 1 FROM s WHERE s.expires_at <"
       " now() + make_interval(secs => $4::int) - interval '60 seconds'))"
       " SELECT protocol_version FROM s");
CX_SQL(q_end, 3,
       "DELETE FROM mcp_sessions WHERE id = $1 AND user_id = $2 AND key_id = $3"
       " AND expires_at > now() RETURNING id");
CX_SQL(q_expire, 0,
       "DELETE FROM mcp_sessions WHERE id IN (SELECT id FROM mcp_sessions"
       " WHERE expires_at < now() LIMIT 1000)");
CX_SQL(q_call_begin, 2,
       "INSERT INTO mcp_calls (session_id, request_id) VALUES ($1, $2)"
       " ON CONFLICT (session_id, request_id) DO UPDATE SET run_id = NULL, cancelled = false");
CX_SQL(q_call_run, 3,
       "UPDATE mcp_calls SET run_id = $3::uuid WHERE session_id = $1 AND request_id = $2"
       " RETURNING cancelled");
/* (a cancel that comes before its call's row is lost: MCP allows that race) */
CX_SQL(q_call_cancel, 2,
       "UPDATE mcp_calls SET cancelled = true WHERE session_id = $1 AND request_id = $2"
       " RETURNING run_id");
CX_SQL(q_call_end, 2, "DELETE FROM mcp_calls WHERE session_id = $1 AND request_id = $2");

/* One statement, its COMMIT not waiting for the disk: these rows are a
 * session's use and its calls in progress, which a crash of PostgreSQL
 * may lose (a client then initializes again) without harm. *r holds the
 * result (PQclear it); CX_ERR_NOT_FOUND when it has no row. */
static enum cx_err
exec_fast(struct cx_ctx *cx, struct cx_sql *q, const char *const *p, PGresult **r)
{
    PGresult *res = NULL;
    enum cx_err rc = cx_db_exec_all(cx->db, &(struct cx_db_call){q, p, &res}, 1, false);

    if (rc == CX_OK && PQntuples(res) == 0 && PQnfields(res) > 0)
        rc = CX_ERR_NOT_FOUND;
    if (r && rc == CX_OK)
        *r = res;
    else
        PQclear(res);
    return rc;
}

static bool
id_valid(const char *id)
{
    return id && strlen(id) == CX_MCP_SESSION_CHARS &&
           strspn(id, "0123456789abcdef") == CX_MCP_SESSION_CHARS;
}

static void
fill(struct cx_mcp_session *s, const char *id, const char *version)
{
    snprintf(s->id, sizeof(s->id), "%s", id);
    snprintf(s->conversation, sizeof(s->conversation), "mcp-%s", id);
    snprintf(s->version, sizeof(s->version), "%s", version);
}

enum cx_err
cx_mcp_session_begin(struct cx_ctx *cx, const struct cx_principal *who, const char *version,
                     struct cx_mcp_session *s)
{
    char id[33], ttl[16];
    const char *p[5] = {id, who->user, who->key_id, version, ttl};

    cx_random_id(id);
    snprintf(ttl, sizeof(ttl), "%u", cx->cfg->default_ttl);
    fill(s, id, version);
    return cx_db_exec(cx->db, &q_begin, p, NULL);
}

enum cx_err
cx_mcp_session_find(struct cx_ctx *cx, const struct cx_principal *who, const char *header,
                    struct cx_mcp_session *s)
{
    char ttl[16];
    const char *p[4] = {header, who->user, who->key_id, ttl};
    PGresult *r = NULL;
    enum cx_err rc;

    if (!id_valid(header))
        return CX_ERR_NOT_FOUND;
    snprintf(ttl, sizeof(ttl), "%u", cx->cfg->default_ttl);
    rc = exec_fast(cx, &q_find, p, &r);
    if (rc == CX_OK)
        fill(s, header, PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

enum cx_err
cx_mcp_session_end(struct cx_ctx *cx, const struct cx_principal *who, const char *header)
{
    const char *p[3] = {header, who->user, who->key_id};
    struct cx_mcp_session s;
    PGresult *r = NULL;
    enum cx_err rc;

    if (!id_valid(header))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_exec_row(cx->db, &q_end, p, &r);
    PQclear(r);
    if (rc)
        return rc;
    /* its sandbox: closed now unless a run holds it (then its TTL ends it) */
    fill(&s, header, "");
    rc = cx_session_close(cx, who->user, s.conversation);
    return rc == CX_ERR_NOT_FOUND || rc == CX_ERR_CONFLICT ? CX_OK : rc;
}

/* Batches of a thousand, while they come full (at most 20 a sweep). */
enum cx_err
cx_mcp_expire(struct cx_ctx *cx, int *ended)
{
    enum cx_err rc = CX_OK;
    int n = 1000;

    *ended = 0;
    for (int i = 0; rc == CX_OK && n == 1000 && i < 20; i++) {
        PGresult *r = NULL;
        rc = cx_db_exec(cx->db, &q_expire, NULL, &r);
        n = rc == CX_OK ? (int)strtol(PQcmdTuples(r), NULL, 10) : 0;
        *ended += n;
        PQclear(r);
    }
    return rc;
}

enum cx_err
cx_mcp_call_begin(struct cx_ctx *cx, const struct cx_mcp_session *s, const char *request_id)
{
    const char *p[2] = {s->id, request_id};

    return exec_fast(cx, &q_call_begin, p, NULL);
}

enum cx_err
cx_mcp_call_run(struct cx_ctx *cx, const struct cx_mcp_session *s, const char *request_id,
                const char *run_id, bool *cancelled)
{
    const char *p[3] = {s->id, request_id, run_id};
    PGresult *r = NULL;
    enum cx_err rc = exec_fast(cx, &q_call_run, p, &r);

    *cancelled = rc == CX_OK && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return rc;
}

enum cx_err
cx_mcp_call_cancel(struct cx_ctx *cx, const struct cx_mcp_session *s, const char *request_id,
                   char run_id[37])
{
    const char *p[2] = {s->id, request_id};
    PGresult *r = NULL;
    enum cx_err rc = exec_fast(cx, &q_call_cancel, p, &r);

    run_id[0] = '\0';
    if (rc == CX_OK && !PQgetisnull(r, 0, 0))
        snprintf(run_id, 37, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

void
cx_mcp_call_end(struct cx_ctx *cx, const struct cx_mcp_session *s, const char *request_id)
{
    const char *p[2] = {s->id, request_id};

    if (exec_fast(cx, &q_call_end, p, NULL))
        cx_log_warn(0, "mcp: a call's row was not removed (the session's expiry removes it)");
}
