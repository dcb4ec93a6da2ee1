/* The sessions API (SPEC §10.2): create or warm, read, list. A session's
 * object: {"conversation_id", "created", "language", "expires_at",
 * "state"}, "created" true only in the answer of the request that made
 * it (as a run's session.created), "state" "busy" while a run or a file
 * operation holds the conversation's lock. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "db.h"
#include "gateway.h"
#include "kernel.h"
#include "session.h"
#include "util.h"

#define WARM_WAIT_US (120LL * 1000000)

/* busy: a connection holds the conversation's advisory lock (session.c's
 * CONV_KEY, a bigint: pg_locks splits it into classid and objid). */
#define SESSION_COLUMNS                                                                            \
    "SELECT s.conversation_id, " CX_SQL_UTC(                                                       \
        "s.expires_at") ", EXISTS (SELECT 1 FROM pg_locks l"                                       \
                        " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"          \
                        " AND (l.classid::bigint << 32 | l.objid::bigint)"                         \
                        " = hashtextextended(s.user_id || E'\\n' || s.conversation_id, 0)),"       \
                        " s.language FROM sessions s WHERE s.user_id = $1 AND s.kernel_id IS NOT " \
                        "NULL AND "                                                                \
                        "s.expires_at > now()"

CX_SQL(q_one, 2, SESSION_COLUMNS " AND s.conversation_id = $2");
CX_SQL(q_all, 1, SESSION_COLUMNS " ORDER BY s.last_used_at DESC LIMIT 10000");

static json_t *
session_object(PGresult *r, int i, bool created)
{
    return json_pack("{s:s,s:b,s:s,s:s,s:s}", "conversation_id", PQgetvalue(r, i, 0), "created",
                     created, "language", PQgetvalue(r, i, 3), "expires_at", PQgetvalue(r, i, 1),
                     "state", PQgetvalue(r, i, 2)[0] == 't' ? "busy" : "idle");
}

enum cx_err
cx_session_get(struct cx_ctx *cx, const char *user, const char *cid, json_t **out)
{
    const char *p[2] = {user, cid};
    PGresult *r = NULL;
    enum cx_err rc;

    *out = NULL;
    if (!cx_conversation_id_valid(cid))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_exec_row(cx->db, &q_one, p, &r);
    if (rc == CX_OK)
        *out = session_object(r, 0, false);
    PQclear(r);
    return rc == CX_OK && !*out ? CX_ERR_NOMEM : rc;
}

enum cx_err
cx_session_list_live(struct cx_ctx *cx, const char *user, json_t **out)
{
    const char *p[1] = {user};
    PGresult *r = NULL;
    json_t *list;
    enum cx_err rc = cx_db_exec(cx->db, &q_all, p, &r);

    *out = NULL;
    if (rc)
        return rc;
    list = json_array();
    for (int i = 0; list && i < PQntuples(r); i++)
        if (json_array_append_new(list, session_object(r, i, false))) {
            json_decref(list);
            list = NULL;
        }
    PQclear(r);
    *out = list ? json_pack("{s:o}", "conversations", list) : NULL;
    return *out ? CX_OK : CX_ERR_NOMEM;
}

/* The body's ttl (seconds, clamped to [1, max_ttl]) and language (absent:
 * the session's, python for a new one). */
static enum cx_err
open_body(const struct cx_config *cfg, json_t *body, unsigned *ttl, enum cx_lang *lang_out,
          char *msg, size_t msglen)
{
    json_t *t = json_object_get(body, "ttl"), *lang = json_object_get(body, "language");
    const char *key;
    json_t *v;

    *ttl = cfg->default_ttl;
    json_object_foreach(body, key, v)
    {
        if (strcmp(key, "ttl") != 0 && strcmp(key, "language") != 0) {
            snprintf(msg, msglen, "unknown field in the request body (ttl and language are known)");
            return CX_ERR_INVALID;
        }
    }
    if (t && !json_is_integer(t)) {
        snprintf(msg, msglen, "ttl must be an integer number of seconds");
        return CX_ERR_INVALID;
    }
    if (t) {
        json_int_t s = json_integer_value(t);
        *ttl = s < 1 ? 1 : s > (json_int_t)cfg->max_ttl ? cfg->max_ttl : (unsigned)s;
    }
    *lang_out = CX_LANG_ANY;
    return lang ? cx_config_language(cfg, lang, lang_out, msg, msglen) : CX_OK;
}

/* A kernel just started answers before the call returns. */
static enum cx_err
warm(struct cx_session *s, char *msg, size_t msglen)
{
    struct cx_kernel_conn *c = NULL;
    enum cx_err rc = cx_kernel_conn_get(cx_gateway_url(s->gw), cx_gateway_token(s->gw),
                                        s->kernel_id, &c, msg, msglen);

    if (rc == CX_OK)
        rc = cx_session_confirm(s, c, cx_now_us() + WARM_WAIT_US);
    if (rc == CX_OK && cx_kernel_drain(c, 0) == CX_DRAIN_QUIET)
        cx_kernel_conn_put(c);
    else
        cx_kernel_conn_free(c);
    if (rc && rc != CX_ERR_NOMEM) {
        snprintf(msg, msglen, "the session's kernel did not become ready");
        rc = CX_ERR_GATEWAY;
    }
    return rc;
}

enum cx_err
cx_session_open(struct cx_ctx *cx, const char *user, const char *cid, json_t *body, json_t **out,
                bool *created, char *msg, size_t msglen)
{
    struct cx_session s;
    enum cx_lang lang;
    unsigned ttl;
    enum cx_err rc;

    *out = NULL;
    *created = false;
    if (!cx_conversation_id_valid(cid)) {
        snprintf(msg, msglen, "%s", CX_CONVERSATION_RULE);
        return CX_ERR_INVALID;
    }
    rc = open_body(cx->cfg, body, &ttl, &lang, msg, msglen);
    if (rc == CX_OK)
        rc = cx_session_acquire(cx, user, cid, ttl, lang, &s, msg, msglen);
    if (rc)
        return rc;
    if (s.kernel_fresh)
        rc = warm(&s, msg, msglen);
    *created = s.created;
    if (rc == CX_OK)
        *out = json_pack("{s:s,s:b,s:s,s:s,s:s}", "conversation_id", cid, "created", s.created,
                         "language", cx_lang_name(s.lang), "expires_at", s.expires_at, "state",
                         "idle");
    cx_session_release(cx, &s);
    return rc == CX_OK && !*out ? CX_ERR_NOMEM : rc;
}
