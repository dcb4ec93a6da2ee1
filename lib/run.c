#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "auth.h"
#include "buf.h"
#include "cancel.h"
#include "capture.h"
#include "config.h"
#include "db.h"
#include "digest.h"
#include "runend.h"
#include "gateway.h"
#include "journal.h"
#include "kernel.h"
#include "log.h"
#include "metrics.h"
#include "run.h"
#include "runexec.h"
#include "sessdb.h"
#include "session.h"
#include "stage.h"
#include "util.h"

CX_SQL(q_run_get, 2,
       "SELECT id, conversation_id, status, code_length, code_sha256, error_name, truncated,"
       " session_reset,"
       " " CX_SQL_UTC_MS(
           "created_at") ","
                         " " CX_SQL_UTC_MS(
                             "started_at") ","
                                           " " CX_SQL_UTC_MS(
                                               "finished_at") ","
                                                              " execution_ms, answer"
                                                              " FROM runs WHERE id = $1::uuid AND "
                                                              "user_id = $2");

static json_t *
text_or_null(PGresult *r, int col)
{
    return PQgetisnull(r, 0, col) ? json_null() : json_string(PQgetvalue(r, 0, col));
}

enum cx_err
cx_run_get(struct cx_ctx *cx, const char *user, const char *run_id, json_t **out)
{
    const char *params[2] = {run_id, user};
    PGresult *r = NULL;
    enum cx_err rc;

    rc = cx_uuid_valid(run_id) ? cx_db_exec_row(cx->db, &q_run_get, params, &r) : CX_ERR_NOT_FOUND;
    if (rc)
        return rc;
    *out = json_pack(
        "{s:s,s:s,s:s,s:I,s:s,s:o,s:b,s:b,s:o,s:o,s:o,s:o}", "run_id", PQgetvalue(r, 0, 0),
        "conversation_id", PQgetvalue(r, 0, 1), "status", PQgetvalue(r, 0, 2), "code_length",
        (json_int_t)strtoll(PQgetvalue(r, 0, 3), NULL, 10), "code_sha256", PQgetvalue(r, 0, 4),
        "error_name", text_or_null(r, 5), "truncated", PQgetvalue(r, 0, 6)[0] == 't',
        "session_reset", PQgetvalue(r, 0, 7)[0] == 't', "created_at", text_or_null(r, 8),
        "started_at", text_or_null(r, 9), "finished_at", text_or_null(r, 10), "execution_ms",
        PQgetisnull(r, 0, 11) ? json_null()
                              : json_integer(strtoll(PQgetvalue(r, 0, 11), NULL, 10)));
    if (*out && !PQgetisnull(r, 0, 12)) {
        /* the answer's fields the record does not have (its own agree) */
        json_t *answer = json_loads(PQgetvalue(r, 0, 12), JSON_ALLOW_NUL, NULL);
        if (json_is_object(answer))
            json_object_update_missing(*out, answer);
        json_decref(answer);
    }
    PQclear(r);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

CX_SQL(q_run_status, 2,
       "UPDATE runs SET status = $2, started_at = CASE WHEN $2 = 'running'"
       " THEN now() ELSE started_at END, finished_at = CASE WHEN $2 <> 'running'"
       " THEN now() ELSE finished_at END WHERE id = $1::uuid");

/* owner_*: this connection, whose end (a crash) ends the run (cx_run_expire) */
CX_SQL(q_run_insert, 6,
       "INSERT INTO runs (id, user_id, conversation_id, api_key_id, status, code_length,"
       " code_sha256, started_at, owner_pid, owner_started) VALUES ($1::uuid, $2, $3,"
       " nullif($4, '')::uuid, 'running', $5::int, $6, now(), " CX_SQL_OWNER ")");
/* The run's end; its kept bytes (the answer and $8, its kept events') added
 * to its user's, less what a sweep that took it for abandoned counted (o:
 * the row before, in the statement's snapshot): their new sum. */
CX_SQL(q_run_finish, 8,
       "WITH o AS (SELECT kept_bytes AS old FROM runs WHERE id = $1::uuid),"
       " f AS (UPDATE runs SET status = $2, error_name = $3, truncated = $4::boolean,"
       " session_reset = $5::boolean, execution_ms = $6::int, finished_at = now(),"
       " answer = $7::text, kept_bytes = CASE WHEN $7::text IS NULL THEN 0"
       " ELSE $8::bigint + octet_length($7::text) END WHERE id = $1::uuid"
       " RETURNING user_id, kept_bytes - coalesce((SELECT old FROM o), 0) AS delta)"
       " INSERT INTO user_kept_answers (user_id, bytes) SELECT user_id, delta FROM f"
       " WHERE delta <> 0 ON CONFLICT (user_id) DO UPDATE"
       " SET bytes = greatest(user_kept_answers.bytes + EXCLUDED.bytes, 0) RETURNING bytes");
/* The user's ($1) oldest kept answers but run $2's, $3 bytes of them at
 * least, forgotten early (a bounded batch: the next run's end goes on).
 * Only those are locked, skipping any another end is forgetting. */
CX_SQL(q_evict_answers, 3,
       "WITH o AS (SELECT id, kept_bytes, sum(kept_bytes) OVER (ORDER BY finished_at, id) AS c"
       " FROM (SELECT id, kept_bytes, finished_at FROM runs WHERE user_id = $1"
       " AND answer IS NOT NULL AND id <> $2::uuid ORDER BY finished_at LIMIT 1000) s),"
       " l AS (SELECT r.id, r.kept_bytes FROM runs r WHERE r.id IN (SELECT id FROM o"
       " WHERE c - kept_bytes < $3::bigint) AND r.answer IS NOT NULL FOR UPDATE SKIP LOCKED),"
       " f AS (UPDATE runs r SET answer = NULL, kept_bytes = 0 FROM l WHERE r.id = l.id"
       " RETURNING r.id, l.kept_bytes),"
       " e AS (DELETE FROM run_events WHERE run_id IN (SELECT id FROM f))"
       " UPDATE user_kept_answers SET bytes = greatest(bytes"
       " - (SELECT coalesce(sum(kept_bytes), 0) FROM f), 0) WHERE user_id = $1");

/* A kept answer's size at most: the parts a run's code makes long (its
 * value, error, traceback, tails, skipped list) give way first, then all
 * but the short fields; the answer says so. */
#define ANSWER_KEEP_MAX (256 * 1024)

static char *
answer_text(json_t *payload)
{
    static const char *const long_parts[] = {"result",      "error",       "traceback",
                                             "stdout_tail", "stderr_tail", "skipped",
                                             "stdout",      "stderr",      "results"};
    char *text = json_dumps(payload, JSON_COMPACT);
    json_t *copy;

    if (!text || strlen(text) <= ANSWER_KEEP_MAX)
        return text;
    free(text);
    copy = json_copy(payload);
    for (size_t i = 0; copy && i < sizeof(long_parts) / sizeof(long_parts[0]); i++)
        json_object_del(copy, long_parts[i]);
    if (copy)
        json_object_set_new(copy, "answer_truncated", json_true());
    text = copy ? json_dumps(copy, JSON_COMPACT) : NULL;
    json_decref(copy);
    if (!text || strlen(text) <= ANSWER_KEEP_MAX)
        return text;
    free(text);
    copy = json_pack("{s:O?,s:O?,s:O?,s:b}", "run_id", json_object_get(payload, "run_id"), "status",
                     json_object_get(payload, "status"), "truncated",
                     json_object_get(payload, "truncated"), "answer_truncated", 1);
    text = copy ? json_dumps(copy, JSON_COMPACT) : NULL;
    json_decref(copy);
    return text;
}

/* An exception's name as answered and recorded (runs.error_name): its
 * class name is the code's to choose, so whole characters up to 128 bytes. */
static void
clip_name(const char *ename, char *out, size_t outlen)
{
    size_t n = strlen(ename);

    if (n >= outlen) {
        n = outlen - 1;
        while (n > 0 && ((unsigned char)ename[n] & 0xc0) == 0x80)
            n--; /* never inside a character */
    }
    memcpy(out, ename, n);
    out[n] = '\0';
}

/* Strips ANSI escape sequences (CSI and OSC) in place. */
static void
strip_ansi(char *s)
{
    char *w = s;

    for (char *r = s; *r;) {
        if (r[0] == '\x1b' && r[1] == '[') {
            r += 2;
            while (*r && !(*r >= 0x40 && *r <= 0x7e))
                r++;
            if (*r)
                r++;
        } else if (r[0] == '\x1b' && r[1] == ']') {
            r += 2;
            while (*r && *r != '\x07' && !(r[0] == '\x1b' && r[1] == '\\'))
                r++;
            r += *r == '\x07' ? 1 : (*r ? 2 : 0);
        } else if (r[0] == '\x1b') {
            r += r[1] ? 2 : 1;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

static void
set_error(json_t *payload, const char *ename_in, const char *evalue, json_t *tb)
{
    char ename[129], *text = NULL;
    size_t n;

    clip_name(ename_in, ename, sizeof(ename));
    n = strlen(ename) + strlen(evalue) + 3;

    text = malloc(n);
    if (!text)
        return;
    snprintf(text, n, "%s: %s", ename, evalue);
    strip_ansi(text);
    json_object_set_new(payload, "status", json_string("error"));
    json_object_set_new(payload, "error", json_string(text));
    json_object_set_new(payload, "error_name", json_string(ename));
    free(text);
    if (tb) {
        struct cx_buf b;
        size_t i;
        json_t *line;

        cx_buf_init(&b, 4u << 20);
        json_array_foreach(tb, i, line)
        {
            if (json_is_string(line))
                cx_buf_addf(&b, "%s%s", i ? "\n" : "", json_string_value(line));
        }
        if (!cx_buf_err(&b) && b.data) {
            strip_ansi(b.data);
            json_object_set_new(payload, "traceback", json_string(b.data));
        }
        cx_buf_cleanup(&b);
    }
}

/* ------------------------------------------------------------------------ */
/* A run in its session, as named steps                                     */

/* The error of a run that its code did not raise, by outcome. */
static const struct {
    const char *name;
    const char *value; /* NULL: formatted by run_payload */
} outcome_errors[] = {
    [CX_OUTCOME_OUTPUT_LIMIT] = {"OutputLimitExceeded", NULL},
    [CX_OUTCOME_OUTPUT_LOST] = {"OutputLost", "the kernel's output channel was lost during the "
                                              "run; output may be incomplete"},
    [CX_OUTCOME_STAGE_FAILED] = {"InputStagingFailed",
                                 "the inputs could not be written to inputs/"},
    [CX_OUTCOME_DIED] = {"KernelDied", "the kernel exited during the run; its state was lost"},
    [CX_OUTCOME_TIMEOUT] = {"TimeoutError", NULL},
    [CX_OUTCOME_CANCELLED] = {"Cancelled", "the run was cancelled"},
};

struct run {
    struct cx_ctx *cx;
    const struct cx_principal *who;
    const struct cx_run_request *req;
    const struct cx_inputs *in;
    const char *id;
    struct cx_runexec *st;
    struct cx_kernel_conn *conn; /* to the session's kernel, owned while set */
    struct cx_session s;
    int64_t ms;
    json_t *artifacts;
    const struct cx_cancel *cancel;
    const struct cx_journal *journal; /* its kept events, or NULL */
};

/* Frees the connection (broken, or of a replaced kernel). */
static void
drop_conn(struct run *r)
{
    cx_kernel_conn_free(r->conn);
    r->conn = NULL;
}

/* The kernel vanished: a new one in the same workspace (the run says reset). */
static enum cx_err
replace_kernel(struct run *r, char *msg, size_t msglen)
{
    drop_conn(r);
    cx_log_info("session %s: kernel %s vanished; replacing it", r->s.id, r->s.kernel_id);
    return cx_session_replace_kernel(r->cx, &r->s, msg, msglen);
}

/* A connection to the session's kernel, replacing a kernel the gateway
 * forgot. */
static enum cx_err
connect_kernel(struct run *r, char *msg, size_t msglen)
{
    const char *url = cx_gateway_url(r->s.gw), *token = cx_gateway_token(r->s.gw);
    enum cx_err rc = cx_kernel_conn_get(url, token, r->s.kernel_id, &r->conn, msg, msglen);

    if (rc == CX_ERR_NOT_FOUND) {
        rc = replace_kernel(r, msg, msglen);
        if (rc == CX_OK)
            rc = cx_kernel_conn_get(url, token, r->s.kernel_id, &r->conn, msg, msglen);
    } else if (rc && !cx_gateway_recheck(r->s.gw)) {
        /* the gateway went away since its last probe: elsewhere, reset */
        rc = cx_session_move_kernel(r->cx, &r->s, msg, msglen);
        if (rc == CX_OK) {
            url = cx_gateway_url(r->s.gw);
            token = cx_gateway_token(r->s.gw);
            rc = cx_kernel_conn_get(url, token, r->s.kernel_id, &r->conn, msg, msglen);
        }
    }
    return rc == CX_OK || rc == CX_ERR_CAPACITY ? rc : CX_ERR_GATEWAY;
}

/* Connects and executes; a kernel that vanished before running anything
 * of ours, or a pooled connection the server had closed, gets a second
 * attempt. */
static enum cx_err
run_execute(struct run *r, char *msg, size_t msglen)
{
    enum cx_err rc = CX_OK;
    int64_t t0 = 0;

    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused;

        rc = connect_kernel(r, msg, msglen);
        if (rc)
            return rc;
        reused = cx_kernel_conn_messages(r->conn) > 0;
        uint64_t notices = cx_kernel_conn_notices(r->conn);
        if (attempt == 0)
            cx_runexec_say(r->st, "status",
                           json_pack("{s:s,s:{s:s,s:b,s:b,s:s}}", "state", "executing", "session",
                                     "conversation_id", r->req->conversation_id, "created",
                                     r->s.created, "reset", r->s.reset, "expires_at",
                                     r->s.expires_at));
        t0 = cx_now_us();
        rc = cx_runexec_execute(r->st, r->conn, &r->s, r->req, r->in, msg, msglen);
        const struct cx_runexec_facts *f = cx_runexec_facts(r->st);
        /* (not after a notice of the kernel's restart: what was sent may
         * still reach the new process) */
        bool again = (rc == CX_ERR_NOT_FOUND && !(f->events & CX_EVENTS_STOPPED)) ||
                     (rc == CX_ERR_IO && reused && !f->any_message &&
                      cx_kernel_conn_notices(r->conn) == notices);
        if (!again || attempt == 1)
            break;
        cx_runexec_retry(r->st);
        if (rc == CX_ERR_NOT_FOUND && replace_kernel(r, msg, msglen))
            return CX_ERR_GATEWAY;
        drop_conn(r);
    }
    r->ms = (cx_now_us() - t0) / 1000;
    if (rc == CX_ERR_NOT_FOUND) {
        /* It vanished while the code ran: what ran is lost with it. */
        if (replace_kernel(r, msg, msglen))
            return CX_ERR_GATEWAY;
        rc = CX_ERR_KERNEL_DIED;
    }
    return rc;
}

/* From the execution's facts to the session's state: a dead kernel (the
 * gateway restarts it), a restart behind our back, a connection not to be
 * pooled. CX_ERR_GATEWAY when the connection failed mid-run. */
static enum cx_err
run_settle(struct run *r, enum cx_err rc, char *msg, size_t msglen)
{
    const struct cx_runexec_facts *f = cx_runexec_facts(r->st);

    if (rc == CX_ERR_KERNEL_DIED) {
        cx_runexec_note(r->st, CX_OUTCOME_DIED);
        r->s.reset = r->s.kernel_fresh = true;
        r->s.from_pool = false; /* restarted: nothing of the warm cell */
        drop_conn(r);
    } else if (rc == CX_ERR_DB) {
        /* The conversation's lock went with the connection: the cell is
         * interrupted, as it may no longer run unguarded. */
        snprintf(msg, msglen, "the database connection was lost during the run; retry later");
        if (cx_gateway_kernel_interrupt(r->s.gw, r->s.kernel_id))
            cx_log_warn(0, "run %s: interrupt after losing the lock failed", r->id);
        drop_conn(r);
        return CX_ERR_DB;
    } else if (rc) {
        cx_log_warn(0, "run %s: kernel connection failed: %s", r->id, cx_strerror(rc));
        snprintf(msg, msglen, "the connection to the kernel failed during the run");
        drop_conn(r); /* broken, or through a server going away: not for the next run */
        return CX_ERR_GATEWAY;
    }
    if (f->events & CX_EVENT(CX_OUTCOME_OUTPUT_LOST))
        cx_log_warn(0, "run %s: replies arrived without their idle status; output lost", r->id);
    if (f->events & CX_EVENT(CX_OUTCOME_OUTPUT_LOST) || f->abandoned)
        drop_conn(r);
    cx_runexec_conclude(r->st);
    bool died = f->events & CX_EVENT(CX_OUTCOME_DIED);
    if (!died && cx_runexec_says_fresh(r->st) && !r->s.kernel_fresh)
        r->s.reset = true; /* restarted behind our back since the last run */
    if (!died && !(f->events & CX_EVENTS_STOPPED))
        r->s.kernel_fresh = false;
    return CX_OK;
}

/* A timed-out (or cancelled) run captures nothing; the next one rescans everything, so
 * what it wrote before the deadline is not lost. Nor is what a run that lost
 * output may have lost of the capture's messages (its helper counts those
 * files sent). */
static void
run_capture(struct run *r)
{
    unsigned events = cx_runexec_facts(r->st)->events;
    bool timed_out = events & CX_EVENTS_STOPPED;
    struct cx_capture *cap = cx_runexec_capture(r->st);

    r->artifacts = json_array();
    if (!cap)
        return;
    cx_runexec_capturing(r->st);
    r->s.capture_rescan = timed_out || r->s.reset || (events & CX_EVENT(CX_OUTCOME_OUTPUT_LOST)) ||
                          !cx_capture_done(cap);
    if (!r->s.reset && !timed_out && r->artifacts &&
        cx_artifact_commit_capture(r->cx, r->who->user, r->req->conversation_id, r->id, cap,
                                   r->artifacts))
        cx_log_warn(0, "run %s: captured files could not be stored", r->id);
}

/* The error fields of the answer: the outcome's, else the code's. */
static void
run_error(struct run *r, json_t *payload)
{
    enum cx_outcome o = cx_runexec_outcome(r->st);
    const json_t *error = cx_runexec_facts(r->st)->error;
    char ev[96];

    if (o == CX_OUTCOME_OK && error) {
        const char *en = json_string_value(json_object_get(error, "ename"));
        const char *v = json_string_value(json_object_get(error, "evalue"));
        set_error(payload, en ? en : "Error", v ? v : "", json_object_get(error, "traceback"));
        return;
    }
    if (o == CX_OUTCOME_OK)
        return;
    if (o == CX_OUTCOME_TIMEOUT)
        snprintf(ev, sizeof(ev), "execution exceeded %gs", r->req->timeout);
    else if (o == CX_OUTCOME_OUTPUT_LIMIT)
        snprintf(ev, sizeof(ev), "output exceeded %llu bytes",
                 (unsigned long long)r->cx->cfg->max_output_bytes);
    set_error(payload, outcome_errors[o].name,
              outcome_errors[o].value ? outcome_errors[o].value : ev, NULL);
}

static enum cx_err
run_payload(struct run *r, json_t **out)
{
    const struct cx_runexec_facts *f = cx_runexec_facts(r->st);
    struct cx_capture *cap = cx_runexec_capture(r->st);
    json_t *loaded = json_array(), *payload, *err;

    for (size_t i = 0; loaded && i < r->in->n; i++)
        json_array_append_new(loaded, json_string(r->in->v[i].path));
    payload = json_pack(
        "{s:s,s:s,s:o,s:O,s:o,s:O?,s:b,s:I,s:{s:s,s:b,s:b,s:s}}", "run_id", r->id, "status", "ok",
        "stdout_tail", cx_runexec_stdout(r->st), "artifacts", r->artifacts, "inputs_loaded", loaded,
        "result", f->have_result ? f->result : NULL, "truncated", f->truncated, "execution_ms",
        (json_int_t)r->ms, "session", "conversation_id", r->req->conversation_id, "created",
        r->s.created, "reset", r->s.reset, "expires_at", r->s.expires_at);
    if (!payload)
        return CX_ERR_NOMEM;
    if (cap && json_array_size(cx_capture_skipped(cap)))
        json_object_set(payload, "skipped", cx_capture_skipped(cap));
    if ((err = cx_runexec_stderr(r->st)))
        json_object_set_new(payload, "stderr_tail", err);
    if (r->req->output_full) {
        json_object_set_new(payload, "stdout", cx_runexec_full(r->st, false));
        json_object_set_new(payload, "stderr", cx_runexec_full(r->st, true));
    }
    json_object_set_new(payload, "result_present", json_boolean(f->have_result));
    json_object_set_new(payload, "results", cx_runexec_results(r->st, r->artifacts));
    run_error(r, payload);
    *out = payload;
    return CX_OK;
}

CX_SQL(q_events_forget, 1, "DELETE FROM run_events WHERE run_id = $1::uuid");

static void
forget_events(struct cx_ctx *cx, const char *run_id)
{
    const char *p[1] = {run_id};

    if (cx_db_exec(cx->db, &q_events_forget, p, NULL))
        cx_log_warn(0, "run %s: its kept events could not be forgotten", run_id);
}

/* The user's kept answers past user_quota_answer_bytes (sum, from the
 * run's end): the oldest forgotten early, but this run's. */
static void
evict_answers(struct run *r, PGresult *sum)
{
    uint64_t total, cap = r->cx->cfg->user_quota_answer_bytes;
    char excess[24];
    const char *p[3] = {r->who->user, r->id, excess};

    if (!sum || PQntuples(sum) != 1)
        return;
    total = strtoull(PQgetvalue(sum, 0, 0), NULL, 10);
    if (total <= cap)
        return;
    snprintf(excess, sizeof(excess), "%llu", (unsigned long long)(total - cap));
    if (cx_db_exec(r->cx->db, &q_evict_answers, p, NULL))
        cx_log_warn(0, "run %s: its user's oldest answers could not be forgotten", r->id);
}

/* The session's kernel connection back to the pool (or closed), the
 * session released, the run's record finished. */
static void
run_end(struct run *r, json_t *payload, const char *failure)
{
    const char *status = payload ? json_string_value(json_object_get(payload, "status")) : "error";
    const char *en = payload ? json_string_value(json_object_get(payload, "error_name")) : NULL;
    char ms[24];
    json_t *failed = payload ? NULL : json_pack("{s:s}", "error", failure ? failure : "");
    char *answer = r->cx->cfg->run_answer_ttl ? answer_text(payload ? payload : failed) : NULL;
    char events[24];
    const char *p[8] = {r->id, status, en ? en : (payload ? NULL : "RequestFailed"),
                        cx_runexec_facts(r->st)->truncated ? "true" : "false",
                        r->s.reset ? "true" : "false", ms,
                        /* (no answer kept, run_answer_ttl 0: an empty one, so
                         * that the reaper forgets the kept events with it) */
                        answer       ? answer
                        : r->journal ? ""
                                     : NULL,
                        events};
    PGresult *sum = NULL;
    struct cx_db_call finish = {&q_run_finish, p, &sum};

    if (r->s.locked) {
        if (!r->s.reset)
            cx_kernel_conn_put(r->conn); /* kept open for the next run */
        else
            cx_kernel_conn_free(r->conn);
        r->conn = NULL;
    }
    snprintf(ms, sizeof(ms), "%lld", (long long)r->ms);
    /* (an event's row and index entries: about 64 bytes besides its text) */
    snprintf(events, sizeof(events), "%llu",
             r->journal ? (unsigned long long)r->journal->bytes + 64ULL * r->journal->kept : 0ULL);
    /* one round trip and one COMMIT: the session's state, the run's end */
    cx_session_release_with(r->cx, &r->s, &finish);
    evict_answers(r, sum);
    PQclear(sum);
    free(answer);
    json_decref(failed);
    /* static label values only: ok, error (the code raised), timeout,
     * failed (the request failed: no answer of the code's) */
    cx_metrics_count_by(CX_FAMILY_RUNS, !payload                            ? "failed"
                                        : status && !strcmp(status, "ok")   ? "ok"
                                        : en && !strcmp(en, "TimeoutError") ? "timeout"
                                                                            : "error");
    cx_metrics_run_duration(r->ms * 1000);
    cx_log_run(r->id, status && !strcmp(status, "ok") ? "ok" : "error", (long long)r->ms,
               (unsigned long long)cx_runexec_facts(r->st)->output_bytes, r->s.reset);
}

/* The capture's staging bound: what the user has left of the quota. */
static enum cx_err
quota_left(void *ctx, const char *user, uint64_t *left)
{
    struct cx_ctx *cx = ctx;
    uint64_t used, n;
    enum cx_err rc = cx_artifact_usage(cx, user, &used, &n);

    if (rc == CX_OK)
        *left = used < cx->cfg->user_quota_bytes ? cx->cfg->user_quota_bytes - used : 0;
    return rc;
}

/* The run's record: inserted before the run when anyone may be told its id
 * before its answer (a stream, a detached run, an Idempotency-Key's row, an
 * approved run's own), else in the round trip that takes its
 * conversation's lock (not while it waits for the lock: no one could ask
 * for it then), or on its own before the run's failure is recorded. */
struct record {
    struct cx_db_call insert;
    bool done;
};

/* The record inserted, if it is not yet: durable, or made so by the run's
 * end (its durable COMMIT flushes the WAL written before it). */
static enum cx_err
record_run(struct cx_ctx *cx, struct record *rec, bool durable)
{
    enum cx_err rc = rec->done ? CX_OK : cx_db_exec_all(cx->db, &rec->insert, 1, durable);

    if (rc == CX_OK)
        rec->done = true;
    else
        cx_log_warn(0, "a run's record could not be made");
    return rc;
}

static enum cx_err
run_in_session(struct cx_ctx *cx, const struct cx_principal *who, struct cx_run_request *req,
               const struct cx_inputs *in, const char *run_id, struct record *rec,
               const struct cx_journal *journal, const struct cx_run_sink *sink,
               const struct cx_cancel *cancel, json_t **out, char *msg, size_t msglen)
{
    struct run r = {.cx = cx,
                    .who = who,
                    .req = req,
                    .in = in,
                    .id = run_id,
                    .cancel = cancel,
                    .journal = journal};
    enum cx_err rc;

    *out = NULL;
    rc = cx_runexec_new(cx, in, req->capture_artifacts, req->output_full, sink, &r.st);
    if (rc == CX_OK && cx_runexec_capture(r.st))
        cx_capture_set_owner(cx_runexec_capture(r.st), who->user, quota_left, cx);
    if (rc == CX_OK) {
        cx_runexec_cancel_by(r.st, cancel);
        bool inserted = false;

        cx_runexec_status(r.st, "queued"); /* for the conversation and its kernel */
        rc = cx_session_acquire_with(cx, who->user, req->conversation_id, req->ttl, req->lang,
                                     rec->done ? NULL : &rec->insert, &inserted, &r.s, msg, msglen);
        rec->done = rec->done || inserted;
    }
    if (!rec->done) {
        /* (not with the lock: refused, failed, or the lock taken another way) */
        enum cx_err rec_rc = record_run(cx, rec, false);

        rc = rc ? rc : rec_rc;
    }
    if (rc == CX_OK && cx_cancel_requested(cancel))
        cx_runexec_note(r.st, CX_OUTCOME_CANCELLED); /* cancelled while it waited */
    else if (rc == CX_OK)
        rc = run_settle(&r, run_execute(&r, msg, msglen), msg, msglen);
    if (rc == CX_OK) {
        run_capture(&r);
        cx_runexec_flush(r.st);
        rc = run_payload(&r, out);
    }
    run_end(&r, *out, msg);
    json_decref(r.artifacts);
    drop_conn(&r);
    cx_runexec_free(r.st);
    return rc;
}

/* Loads the inputs (again: they may be gone since the request was checked)
 * and runs. A missing input now fails the run as a 404. A run with a
 * listener, or detached, keeps its events (lib/journal.h). */
static enum cx_err
run_with_inputs(struct cx_ctx *cx, const struct cx_principal *who, struct cx_run_request *req,
                const char *run_id, struct record *rec, const struct cx_run_sink *sink,
                const struct cx_cancel *cancel, json_t **out, char *msg, size_t msglen)
{
    struct cx_journal journal, *kept = NULL;
    struct cx_inputs in;
    enum cx_err rc;

    if ((sink && !sink->unkept) || req->detach) {
        cx_journal_open(&journal, cx, run_id, sink);
        sink = &journal.sink;
        kept = &journal;
    }
    if (sink) {
        json_t *ev =
            json_pack("{s:s,s:s}", "run_id", run_id, "conversation_id", req->conversation_id);
        if (ev && !sink->fn(sink->ctx, "run", ev, 0))
            sink = NULL; /* gone already: the run goes on */
        json_decref(ev);
    }
    rc = cx_stage_load(cx, who->user, req, &in, msg, msglen);

    if (rc) {
        const char *p[2] = {run_id, "error"};
        if (record_run(cx, rec, false) == CX_OK && cx_db_exec(cx->db, &q_run_status, p, NULL))
            cx_log_warn(0, "could not fail run %s", run_id);
        if (kept)
            forget_events(cx, run_id); /* (its record keeps no answer) */
    } else {
        rc = run_in_session(cx, who, req, &in, run_id, rec, kept, sink, cancel, out, msg, msglen);
    }
    cx_stage_cleanup(&in);
    return rc;
}

/* At most $9 pending runs per user: the user's transaction lock makes the
 * count and the insert one step. */
CX_SQL(q_pending_lock, 1,
       "SELECT pg_advisory_xact_lock(hashtextextended('pending' || E'\\n' || $1, 2))");
CX_SQL(q_pending_insert, 9,
       "WITH n AS (SELECT count(*) AS c FROM runs WHERE user_id = $2"
       " AND status = 'pending_approval'),"
       " r AS (INSERT INTO runs (id, user_id, conversation_id, api_key_id, status,"
       " code_length, code_sha256) SELECT $1::uuid, $2, $3, nullif($4, '')::uuid,"
       " 'pending_approval', $5::int, $6 FROM n WHERE n.c < $9::int RETURNING id)"
       " INSERT INTO pending_runs (run_id, request, expires_at)"
       " SELECT id, $7::jsonb, now() + make_interval(secs => $8::int) FROM r RETURNING run_id");

/* Records a run that waits for approval, within the user's cap. */
static enum cx_err
submit_pending(struct cx_ctx *cx, const struct cx_run_request *req, const char **p, char *msg,
               size_t msglen)
{
    char ttl[16], max[16], *request = json_dumps(req->root, JSON_COMPACT);
    PGresult *r = NULL;
    enum cx_err rc;

    if (!request)
        return CX_ERR_NOMEM;
    snprintf(ttl, sizeof(ttl), "%u", cx->cfg->approval_ttl);
    snprintf(max, sizeof(max), "%u", cx->cfg->max_pending_runs_per_user);
    p[6] = request;
    p[7] = ttl;
    p[8] = max;
    rc = cx_db_begin(cx->db);
    if (rc == CX_OK)
        rc = cx_db_exec(cx->db, &q_pending_lock, p + 1, NULL);
    if (rc == CX_OK)
        rc = cx_db_exec(cx->db, &q_pending_insert, p, &r);
    if (rc == CX_OK && PQntuples(r) == 0) {
        snprintf(msg, msglen, "%u runs of this user already wait for approval",
                 cx->cfg->max_pending_runs_per_user);
        rc = CX_ERR_QUOTA;
    }
    PQclear(r);
    if (rc == CX_OK)
        rc = cx_db_commit(cx->db);
    else
        cx_db_rollback(cx->db);
    free(request);
    return rc;
}

enum cx_err
cx_run_submit_stream(struct cx_ctx *cx, const struct cx_principal *who, struct cx_run_request *req,
                     const struct cx_run_sink *sink, json_t **out, bool *pending, char *msg,
                     size_t msglen)
{
    char run_id[37], len_s[24], sha[65];
    const char *p[9] = {run_id, who->user, req->conversation_id, who->key_id, len_s, sha};
    struct cx_inputs in;
    enum cx_err rc;

    *out = NULL;
    *pending = false;
    /* Inputs are checked first: a foreign one is a 404 and nothing runs. */
    rc = cx_stage_load(cx, who->user, req, &in, msg, msglen);
    cx_stage_cleanup(&in);
    if (rc)
        return rc;
    cx_uuid_generate(run_id);
    snprintf(len_s, sizeof(len_s), "%zu", req->code_len);
    rc = cx_sha256_hex(req->code, req->code_len, sha);
    if (rc)
        return rc;
    cx_log_info("run %s requested: code_len=%zu code_sha256=%s", run_id, req->code_len, sha);
    if (cx->cfg->require_approval || who->require_approval) {
        rc = submit_pending(cx, req, p, msg, msglen);
        if (rc)
            return rc;
        *out = json_pack("{s:s,s:s}", "run_id", run_id, "status", "pending_approval");
        *pending = true;
        return *out ? CX_OK : CX_ERR_NOMEM;
    }
    /* A cancel that finds the record finds the run here. */
    struct cx_cancel cancel;
    struct record rec = {{&q_run_insert, p, NULL}, false};
    cx_cancel_register(&cancel, run_id);
    /* Not waiting for the disk, unless its id is told before the end (a
     * stream, a detached run): a client that heard of it finds it after a
     * crash. A run whose id no one hears of before its answer is recorded
     * with its conversation's lock (one round trip less). */
    rc = sink || req->detach ? record_run(cx, &rec, (sink && !sink->unkept) || req->detach) : CX_OK;
    if (rc == CX_OK)
        rc = run_with_inputs(cx, who, req, run_id, &rec, sink, &cancel, out, msg, msglen);
    cx_cancel_unregister(&cancel);
    return rc;
}

CX_SQL(q_pending_take, 2,
       "WITH p AS (DELETE FROM pending_runs WHERE run_id = $1::uuid AND run_id IN"
       " (SELECT id FROM runs WHERE id = $1::uuid AND user_id = $2 AND status = 'pending_approval')"
       " RETURNING request, expires_at < now() AS expired)"
       " SELECT request::text, expired FROM p");

/* Whether the deciding key submitted the pending run: one REMOTE_USER
 * request ("") can't tell itself from another. */
CX_SQL(q_pending_submitter, 3,
       "SELECT coalesce(api_key_id::text, '') = $3 FROM runs WHERE id = $1::uuid AND user_id = $2"
       " AND status = 'pending_approval' FOR UPDATE");

/* Takes the pending request of a run (deleting it) and sets the run's new
 * status in one transaction. *request: new reference. An approval is
 * never by the key that submitted the run (CX_ERR_FORBIDDEN); withdrawing
 * it (rejected) is. */
static enum cx_err
take_pending(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
             const char *new_status, json_t **request, char *msg, size_t msglen)
{
    const char *p[3] = {run_id, who->user, who->key_id};
    const char *u[2] = {run_id, new_status};
    PGresult *r = NULL;
    enum cx_err rc;
    bool expired;

    *request = NULL;
    snprintf(msg, msglen, "no such pending run");
    if (!cx_uuid_valid(run_id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_begin(cx->db);
    if (rc)
        return rc;
    rc = cx_db_exec_row(cx->db, &q_pending_submitter, p, &r);
    if (rc == CX_OK && PQgetvalue(r, 0, 0)[0] == 't' && !strcmp(new_status, "running")) {
        snprintf(msg, msglen, "a run can't be approved by the key that submitted it");
        rc = CX_ERR_FORBIDDEN;
    }
    PQclear(r);
    r = NULL;
    if (rc)
        goto fail;
    rc = cx_db_exec_row(cx->db, &q_pending_take, p, &r);
    if (rc)
        goto fail;
    expired = PQgetvalue(r, 0, 1)[0] == 't';
    if (expired)
        u[1] = "expired";
    rc = cx_db_exec(cx->db, &q_run_status, u, NULL);
    if (rc)
        goto fail;
    if (!expired) {
        *request = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
        if (!*request) {
            rc = CX_ERR_INTERNAL;
            goto fail;
        }
    }
    PQclear(r);
    rc = cx_db_commit(cx->db);
    if (rc) {
        json_decref(*request);
        *request = NULL;
        return rc;
    }
    if (expired)
        snprintf(msg, msglen, "the run waited too long for approval");
    return expired ? CX_ERR_EXPIRED : CX_OK;
fail:
    PQclear(r);
    cx_db_rollback(cx->db);
    return rc;
}

/* A decision on a pending run: never by a key that itself waits for
 * approval (its runs wait for someone else). *request: new reference. */
static enum cx_err
decide(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
       const char *new_status, json_t **request, char *msg, size_t msglen)
{
    *request = NULL;
    if (who->require_approval) {
        snprintf(msg, msglen, "a key that requires approval can't approve or reject runs");
        return CX_ERR_FORBIDDEN;
    }
    return take_pending(cx, who, run_id, new_status, request, msg, msglen);
}

enum cx_err
cx_run_approve(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id, json_t **out,
               char *msg, size_t msglen)
{
    return cx_run_approve_stream(cx, who, run_id, NULL, out, msg, msglen);
}

enum cx_err
cx_run_approve_stream(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
                      const struct cx_run_sink *sink, json_t **out, char *msg, size_t msglen)
{
    struct cx_run_request req;
    struct cx_cancel cancel;
    json_t *request = NULL;
    enum cx_err rc;

    *out = NULL;
    if (!cx_uuid_valid(run_id))
        return CX_ERR_NOT_FOUND;
    cx_cancel_register(&cancel, run_id);
    rc = decide(cx, who, run_id, "running", &request, msg, msglen);
    /* Validated again: the limits may have changed while it waited. */
    if (rc == CX_OK) {
        rc = cx_run_request_parse(cx->cfg, request, &req, msg, msglen);
        if (rc) {
            const char *p[2] = {run_id, "error"};
            if (cx_db_exec(cx->db, &q_run_status, p, NULL))
                cx_log_warn(0, "could not fail run %s", run_id);
        }
    }
    json_decref(request);
    if (rc == CX_OK) {
        struct record rec = {.done = true}; /* (its record's since it was submitted) */

        req.detach = false; /* the approver waits for it, as it always has */
        rc = run_with_inputs(cx, who, &req, run_id, &rec, sink, &cancel, out, msg, msglen);
        cx_run_request_cleanup(&req);
    }
    cx_cancel_unregister(&cancel);
    return rc;
}

enum cx_err
cx_run_reject(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id, json_t **out,
              char *msg, size_t msglen)
{
    json_t *request = NULL;
    enum cx_err rc;

    *out = NULL;
    rc = decide(cx, who, run_id, "rejected", &request, msg, msglen);
    json_decref(request);
    if (rc)
        return rc;
    *out = json_pack("{s:s,s:s}", "run_id", run_id, "status", "rejected");
    return *out ? CX_OK : CX_ERR_NOMEM;
}

CX_SQL(q_expire_pending, 0,
       "WITH p AS (DELETE FROM pending_runs WHERE expires_at < now() RETURNING run_id)"
       " UPDATE runs SET status = 'expired', finished_at = now() FROM p WHERE runs.id = p.run_id");
/* (a run's kept events go with its answer; its bytes off its user's sum.
 * The users' rows are locked in their order, as the sweep of abandoned
 * runs does: another process's sweep at the same time never deadlocks) */
CX_SQL(q_forget_answers, 1,
       "WITH o AS (SELECT id, user_id, kept_bytes FROM runs WHERE answer IS NOT NULL"
       " AND finished_at < now() - make_interval(secs => $1::int) LIMIT 1000"
       " FOR UPDATE SKIP LOCKED),"
       " f AS (UPDATE runs r SET answer = NULL, kept_bytes = 0 FROM o WHERE r.id = o.id"
       " RETURNING r.id, o.user_id, o.kept_bytes),"
       " e AS (DELETE FROM run_events WHERE run_id IN (SELECT id FROM f)),"
       " k AS (INSERT INTO user_kept_answers (user_id, bytes) SELECT user_id, -sum(kept_bytes)"
       " FROM f GROUP BY user_id HAVING sum(kept_bytes) > 0 ORDER BY user_id"
       " ON CONFLICT (user_id) DO UPDATE"
       " SET bytes = greatest(user_kept_answers.bytes + EXCLUDED.bytes, 0))"
       " SELECT count(*) FROM f");
/* A run whose connection is gone lost its process; one older than any run
 * can last too (its record from before owners were kept, or a connection
 * that lingers). A connection whose start another role may not see (NULL)
 * counts as alive by its pid alone. */
CX_SQL(q_abandon, 1,
       "WITH lost AS (UPDATE runs SET status = 'error', error_name = CASE WHEN cancel_requested"
       " THEN 'Cancelled' ELSE 'Abandoned' END, finished_at = now(),"
       " answer = '{\"error\":\"the run was lost with the process that ran it\"}',"
       " kept_bytes = 64 + coalesce((SELECT sum(octet_length(e.event) + octet_length(e.data) + 64)"
       " FROM run_events e WHERE e.run_id = runs.id), 0)"
       " WHERE status = 'running' AND (started_at < now() - make_interval(secs => $1::int)"
       " OR (owner_pid IS NOT NULL AND started_at < now() - interval '1 second'"
       " AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = runs.owner_pid"
       " AND (a.backend_start IS NULL OR a.backend_start = runs.owner_started))))"
       " RETURNING user_id, kept_bytes),"
       " k AS (INSERT INTO user_kept_answers (user_id, bytes) SELECT user_id, sum(kept_bytes)"
       " FROM lost GROUP BY user_id ORDER BY user_id ON CONFLICT (user_id) DO UPDATE"
       " SET bytes = user_kept_answers.bytes + EXCLUDED.bytes)"
       " SELECT count(*) FROM lost");

/* One snapshot: the status before, a running run marked (and announced to
 * the process that runs it), a pending one ended. */
CX_SQL(q_run_cancel, 2,
       "WITH c AS (UPDATE runs SET cancel_requested = true WHERE id = $1::uuid AND user_id = $2"
       " AND status = 'running' RETURNING id),"
       " p AS (DELETE FROM pending_runs WHERE run_id IN (SELECT id FROM runs WHERE id = $1::uuid"
       " AND user_id = $2 AND status = 'pending_approval') RETURNING run_id),"
       " u AS (UPDATE runs SET status = 'error', error_name = 'Cancelled', finished_at = now(),"
       " answer = '{\"error\":\"the run was cancelled\"}' FROM p WHERE runs.id = p.run_id"
       " RETURNING runs.id)"
       " SELECT (SELECT status FROM runs WHERE id = $1::uuid AND user_id = $2),"
       " (SELECT count(pg_notify('codexec_changes', 'cancel ' || id::text)) FROM c),"
       " (SELECT count(*) FROM u)");

enum cx_err
cx_run_cancel(struct cx_ctx *cx, const char *user, const char *run_id, json_t **out, char *msg,
              size_t msglen)
{
    const char *p[2] = {run_id, user};
    PGresult *r = NULL;
    enum cx_err rc;
    bool running;

    *out = NULL;
    snprintf(msg, msglen, "no such run");
    if (!cx_uuid_valid(run_id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_exec_row(cx->db, &q_run_cancel, p, &r);
    if (rc)
        return rc;
    if (PQgetisnull(r, 0, 0)) {
        PQclear(r);
        return CX_ERR_NOT_FOUND;
    }
    running = PQgetvalue(r, 0, 1)[0] != '0';
    if (!running && PQgetvalue(r, 0, 2)[0] == '0') {
        snprintf(msg, msglen, "the run already ended (%s)", PQgetvalue(r, 0, 0));
        PQclear(r);
        return CX_ERR_RUN_ENDED;
    }
    PQclear(r);
    if (running)
        cx_cancel_note(run_id); /* here at once; elsewhere by the notice */
    cx_log_info("run %s: cancel requested", run_id);
    *out = json_pack("{s:s,s:s}", "run_id", run_id, "status", running ? "running" : "error");
    return *out ? CX_OK : CX_ERR_NOMEM;
}

/* Idempotency-Keys past their day, a bounded batch per sweep; their kept
 * answers off their users' sums, the users' rows locked in order. */
CX_SQL(q_forget_idem, 0,
       "WITH d AS (DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid FROM idempotency_keys"
       " WHERE created_at < now() - interval '24 hours' LIMIT 1000) RETURNING user_id, kept_bytes),"
       " k AS (INSERT INTO user_kept_answers (user_id, bytes) SELECT user_id, -sum(kept_bytes)"
       " FROM d GROUP BY user_id HAVING sum(kept_bytes) > 0 ORDER BY user_id"
       " ON CONFLICT (user_id) DO UPDATE"
       " SET bytes = greatest(user_kept_answers.bytes + EXCLUDED.bytes, 0))"
       " SELECT count(*) FROM d");

#define FORGET_BATCHES 20

static enum cx_err
forget_batches(struct cx_ctx *cx, struct cx_sql *q, const char *const *p)
{
    enum cx_err rc = CX_OK;
    bool full = true;

    for (int i = 0; rc == CX_OK && full && i < FORGET_BATCHES; i++) {
        PGresult *r = NULL;

        rc = cx_db_exec(cx->db, q, p, &r);
        full = rc == CX_OK && strtol(PQgetvalue(r, 0, 0), NULL, 10) >= 1000;
        PQclear(r);
    }
    return rc;
}

enum cx_err
cx_run_expire(struct cx_ctx *cx, int *changed)
{
    char secs[16];
    const char *p[1] = {secs};
    PGresult *r = NULL;
    enum cx_err rc;

    *changed = 0;
    rc = cx_db_exec(cx->db, &q_expire_pending, NULL, &r);
    if (rc)
        return rc;
    *changed += (int)strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    /* Longer than any run can last: its process died. */
    snprintf(secs, sizeof(secs), "%u", cx->cfg->max_timeout + cx->cfg->interrupt_grace + 600);
    rc = cx_db_exec(cx->db, &q_abandon, p, &r);
    if (rc)
        return rc;
    *changed += (int)strtol(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    /* answers past run_answer_ttl and Idempotency-Keys past their day, in
     * batches of 1,000 while batches are full, at most FORGET_BATCHES */
    snprintf(secs, sizeof(secs), "%u", cx->cfg->run_answer_ttl);
    rc = forget_batches(cx, &q_forget_answers, p);
    if (rc == CX_OK)
        rc = forget_batches(cx, &q_forget_idem, NULL);
    return rc;
}
