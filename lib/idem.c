#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "digest.h"
#include "log.h"
#include "util.h"

/* An answer kept whole up to this size; a run's longer one is its record's. */
#define IDEM_ANSWER_MAX (1024 * 1024)
#define IDEM_POLL_US    (250 * 1000)

/* The key, new or taken over from a first request that expired (a day)
 * or whose connection is gone before it named a run (its process died);
 * with what the row held before, in the same snapshot. */
CX_SQL(q_idem_claim, 3,
       "WITH c AS (INSERT INTO idempotency_keys (user_id, key, fingerprint, owner_pid,"
       " owner_started) VALUES ($1, $2, $3, " CX_SQL_OWNER ") ON CONFLICT (user_id, key) DO UPDATE"
       " SET fingerprint = EXCLUDED.fingerprint, body_sha256 = NULL, run_id = NULL,"
       " status = NULL, answer = NULL, kept_bytes = 0, owner_pid = EXCLUDED.owner_pid,"
       " owner_started = EXCLUDED.owner_started, created_at = now()"
       " WHERE idempotency_keys.created_at < now() - interval '24 hours'"
       " OR (idempotency_keys.status IS NULL AND idempotency_keys.run_id IS NULL"
       " AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a"
       " WHERE a.pid = idempotency_keys.owner_pid AND (a.backend_start IS NULL"
       " OR a.backend_start = idempotency_keys.owner_started))) RETURNING xmax <> 0 AS taken),"
       /* (a key taken over: its old answer off the user's sum) */
       " d AS (UPDATE user_kept_answers SET bytes = greatest(bytes - (SELECT kept_bytes"
       " FROM idempotency_keys WHERE user_id = $1 AND key = $2), 0) WHERE user_id = $1"
       " AND EXISTS (SELECT 1 FROM c WHERE taken) AND (SELECT kept_bytes FROM idempotency_keys"
       " WHERE user_id = $1 AND key = $2) > 0)"
       " SELECT (SELECT count(*) FROM c), k.fingerprint, k.body_sha256, k.run_id, k.status,"
       " k.answer, (SELECT r.status FROM runs r WHERE r.id = k.run_id)"
       " FROM (SELECT 1) one LEFT JOIN idempotency_keys k ON k.user_id = $1 AND k.key = $2");
CX_SQL(q_idem_run, 3,
       "UPDATE idempotency_keys SET run_id = $3::uuid WHERE user_id = $1 AND key = $2");
/* The answer kept and counted in the user's kept answers (sql/014); a
 * run's, past the user's quota ($6), is its record's instead (what a run's
 * longer answer always is). */
CX_SQL(q_idem_done, 6,
       "WITH k AS (SELECT CASE WHEN run_id IS NOT NULL AND coalesce((SELECT bytes"
       " FROM user_kept_answers WHERE user_id = $1), 0) + coalesce(octet_length($4::text), 0)"
       " > $6::bigint THEN NULL ELSE $4::text END AS answer FROM idempotency_keys"
       " WHERE user_id = $1 AND key = $2),"
       " u AS (UPDATE idempotency_keys SET status = $3::int, body_sha256 = $5,"
       " answer = (SELECT answer FROM k), kept_bytes = coalesce((SELECT octet_length(answer)"
       " FROM k), 0) WHERE user_id = $1 AND key = $2 RETURNING user_id, kept_bytes)"
       " INSERT INTO user_kept_answers (user_id, bytes) SELECT user_id, kept_bytes FROM u"
       " WHERE kept_bytes > 0 ON CONFLICT (user_id) DO UPDATE"
       " SET bytes = user_kept_answers.bytes + EXCLUDED.bytes");
CX_SQL(q_idem_release, 2,
       "DELETE FROM idempotency_keys WHERE user_id = $1 AND key = $2 AND status IS NULL");

static bool
key_valid(const char *key)
{
    size_t n = strlen(key);

    if (n == 0 || n > CX_IDEM_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e)
            return false;
    return true;
}

/* The first's answer from the row r (claimed by another): a replay, or
 * CX_AGAIN while it is in progress. */
static enum cx_err
replay_of(struct cx_idem *id, PGresult *r, const char *fingerprint, char *msg, size_t msglen)
{
    const char *run_status = PQgetisnull(r, 0, 6) ? NULL : PQgetvalue(r, 0, 6);
    bool run_ended =
        run_status && strcmp(run_status, "running") && strcmp(run_status, "pending_approval");

    if (PQgetisnull(r, 0, 1))
        return CX_AGAIN; /* gone meanwhile (released): claim it again */
    if (strcmp(PQgetvalue(r, 0, 1), fingerprint)) {
        snprintf(msg, msglen, "this Idempotency-Key was used for another request");
        return CX_ERR_IDEMPOTENCY;
    }
    if (PQgetisnull(r, 0, 4) && !run_ended)
        return CX_ERR_IN_PROGRESS;
    id->replay = true;
    id->status = PQgetisnull(r, 0, 4) ? 200 : (int)strtol(PQgetvalue(r, 0, 4), NULL, 10);
    if (!PQgetisnull(r, 0, 2))
        snprintf(id->body_sha256, sizeof(id->body_sha256), "%s", PQgetvalue(r, 0, 2));
    if (!PQgetisnull(r, 0, 5))
        id->answer = json_loads(PQgetvalue(r, 0, 5), JSON_ALLOW_NUL, NULL);
    else if (!PQgetisnull(r, 0, 3) &&
             cx_run_get(id->cx, id->user, PQgetvalue(r, 0, 3), &id->answer))
        id->answer = NULL;
    return id->answer ? CX_OK : CX_ERR_INTERNAL;
}

enum cx_err
cx_idem_begin(struct cx_ctx *cx, const char *user, const char *key, const char *what, size_t len,
              unsigned wait_s, struct cx_idem *id, char *msg, size_t msglen)
{
    int64_t deadline = cx_now_us() + (int64_t)wait_s * 1000000;
    char fingerprint[65];
    enum cx_err rc;

    memset(id, 0, sizeof(*id));
    id->cx = cx;
    if (!key || !*key)
        return CX_OK;
    if (!key_valid(key)) {
        snprintf(msg, msglen, "Idempotency-Key must be 1 to 128 printable ASCII characters");
        return CX_ERR_INVALID;
    }
    snprintf(id->user, sizeof(id->user), "%s", user);
    snprintf(id->key, sizeof(id->key), "%s", key);
    rc = cx_sha256_hex(what, len, fingerprint);
    for (;;) {
        const char *p[3] = {id->user, id->key, fingerprint};
        PGresult *r = NULL;

        if (rc == CX_OK)
            rc = cx_db_exec_row(cx->db, &q_idem_claim, p, &r);
        if (rc == CX_OK && PQgetvalue(r, 0, 0)[0] != '0')
            id->owner = true;
        else if (rc == CX_OK)
            rc = replay_of(id, r, fingerprint, msg, msglen);
        PQclear(r);
        if (rc == CX_ERR_IN_PROGRESS && cx_now_us() < deadline) {
            usleep(IDEM_POLL_US); /* the first is a run: its answer comes */
            rc = CX_OK;
            continue;
        }
        if (rc != CX_AGAIN)
            break;
        rc = CX_OK;
    }
    if (rc == CX_ERR_IN_PROGRESS)
        snprintf(msg, msglen, "the first request with this Idempotency-Key is still in progress");
    if (rc)
        id->key[0] = '\0'; /* nothing of it is ours */
    return rc;
}

void
cx_idem_reader(struct cx_idem *id, cx_http_read_fn inner, void *ctx)
{
    struct cx_sha256 *h = NULL;

    id->inner = inner;
    id->inner_ctx = ctx;
    if (id->owner && (h = malloc(sizeof(*h))) && cx_sha256_init(h)) {
        free(h);
        h = NULL;
    }
    id->hash = h; /* (without it, the body's hash is not kept: a replay can't match) */
}

ssize_t
cx_idem_read(void *arg, void *buf, size_t n)
{
    struct cx_idem *id = arg;
    ssize_t got = id->inner(id->inner_ctx, buf, n);

    if (got > 0 && id->hash)
        cx_sha256_update(id->hash, buf, (size_t)got);
    return got;
}

static void
hex_of(const unsigned char d[CX_SHA256_BYTES], char out[65])
{
    for (int i = 0; i < CX_SHA256_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

enum cx_err
cx_idem_check_body(struct cx_idem *id, cx_http_read_fn fn, void *ctx, uint64_t max)
{
    uint64_t total = 0;
    unsigned char d[CX_SHA256_BYTES], *buf = malloc(65536);
    struct cx_sha256 h;
    char hex[65];
    ssize_t got;
    enum cx_err rc = buf ? cx_sha256_init(&h) : CX_ERR_NOMEM;

    if (rc) {
        free(buf);
        return rc;
    }
    while ((got = fn(ctx, buf, 65536)) > 0 && (total += (uint64_t)got) <= max)
        cx_sha256_update(&h, buf, (size_t)got);
    free(buf);
    rc = got < 0 ? CX_ERR_IO : total > max ? CX_ERR_TOO_LARGE : cx_sha256_final(&h, d);
    cx_sha256_cleanup(&h);
    if (rc)
        return rc;
    hex_of(d, hex);
    return strcmp(hex, id->body_sha256) ? CX_ERR_IDEMPOTENCY : CX_OK;
}

void
cx_idem_run(struct cx_idem *id, const char *run_id)
{
    const char *p[3] = {id->user, id->key, run_id};

    if (id->owner && cx_db_exec(id->cx->db, &q_idem_run, p, NULL))
        cx_log_warn(0, "run %s: its Idempotency-Key could not name it", run_id);
}

void
cx_idem_finish(struct cx_idem *id, int status, const json_t *answer)
{
    char status_s[16], hex[65] = "", quota[24], *text = NULL;
    unsigned char d[CX_SHA256_BYTES];
    const char *p[6] = {id->user, id->key, status_s, NULL, NULL, quota};

    if (!id->owner)
        return;
    id->owner = false;
    if (status == 0) {
        if (cx_db_exec(id->cx->db, &q_idem_release, p, NULL))
            cx_log_warn(0, "an Idempotency-Key could not be released");
        return;
    }
    snprintf(status_s, sizeof(status_s), "%d", status);
    snprintf(quota, sizeof(quota), "%llu",
             (unsigned long long)id->cx->cfg->user_quota_answer_bytes);
    text = answer ? json_dumps(answer, JSON_COMPACT) : NULL;
    if (text && strlen(text) <= IDEM_ANSWER_MAX)
        p[3] = text; /* (longer: a run's record answers) */
    if (id->hash && cx_sha256_final(id->hash, d) == CX_OK) {
        hex_of(d, hex);
        p[4] = hex;
    }
    if (cx_db_exec(id->cx->db, &q_idem_done, p, NULL))
        cx_log_warn(0, "the answer of an Idempotency-Key could not be kept");
    free(text);
}

void
cx_idem_cleanup(struct cx_idem *id)
{
    if (id->owner)
        cx_idem_finish(id, 0, NULL);
    if (id->hash) {
        cx_sha256_cleanup(id->hash);
        free(id->hash);
    }
    json_decref(id->answer);
    memset(id, 0, sizeof(*id));
}
