/* Storing a run's captured files (or an upload) as artifact versions: the
 * write order of docs/internals/storage.md, as named steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "artifact.h"
#include "capture.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "metrics.h"
#include "mime.h"
#include "storage.h"

CX_SQL(q_key_known, 1, "SELECT 1 FROM artifact_versions WHERE storage_key = $1");
/* Held (shared) from the first rename into place until COMMIT; fsck takes
 * it exclusively before it removes a file no row names, so a file between
 * its rename and its COMMIT is never taken for an orphan. */
CX_SQL(q_storage_lock_shared, 0, "SELECT pg_advisory_xact_lock_shared(" CX_STORAGE_LOCK ")");
CX_SQL(q_storage_lock, 0, "SELECT pg_advisory_lock(" CX_STORAGE_LOCK ")");
CX_SQL(q_storage_unlock, 0, "SELECT pg_advisory_unlock(" CX_STORAGE_LOCK ")");
CX_SQL(q_xid, 0, "SELECT pg_current_xact_id()::text");
CX_SQL(q_xact_status, 1, "SELECT coalesce(pg_xact_status($1::xid8), '')");
CX_SQL(q_quota_lock, 1,
       "SELECT pg_advisory_xact_lock(hashtextextended('quota' || E'\\n' || $1, 2))");
CX_SQL(q_usage, 1,
       "SELECT v.bytes, (SELECT count(*) FROM artifacts WHERE user_id = $1 AND deleted_at IS NULL),"
       "       v.versions"
       " FROM (SELECT coalesce(sum(v.size), 0) AS bytes, count(*) AS versions"
       "       FROM artifact_versions v JOIN artifacts a ON a.id = v.artifact_id"
       "       WHERE a.user_id = $1) v");
CX_SQL(q_current, 3,
       "SELECT v.sha256 FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.user_id = $1 AND a.conversation_id = $2 AND a.path = $3 AND a.deleted_at IS NULL");
CX_SQL(q_upsert, 4,
       "INSERT INTO artifacts (user_id, conversation_id, path, kind, current_version)"
       " VALUES ($1, $2, $3, $4, 1)"
       " ON CONFLICT (user_id, conversation_id, path) WHERE deleted_at IS NULL"
       " DO UPDATE SET current_version = artifacts.current_version + 1, kind = EXCLUDED.kind,"
       " updated_at = now() RETURNING id, current_version");
CX_SQL(q_version, 8,
       "INSERT INTO artifact_versions (artifact_id, version, filename, mime_type, size, sha256,"
       " storage_key, produced_by) VALUES ($1::uuid, $2::int, $3, $4, $5::bigint, $6, $7,"
       " $8::jsonb)");

#ifdef CX_TEST_HOOKS
static bool crash_before_commit;

void
cx_artifact_test_hooks(void)
{
    const char *v = getenv("CODEXEC_TEST_CRASH_BEFORE_COMMIT");

    crash_before_commit = v && !strcmp(v, "1");
    if (crash_before_commit)
        cx_log_warn(0, "test hook: exiting before the next artifact COMMIT");
}
#endif

/* A file on its way to becoming a version. */
struct pending {
    struct cx_captured *f;
    char key[1024];
    char id[37];
    char safe[256];
    int version;
    bool renamed;
};

struct commit {
    struct cx_ctx *cx;
    const char *user, *cid, *run_id;
    struct cx_capture *cap;
    struct pending *p;
    size_t np;
    unsigned long long used_bytes, used_count, used_versions;
    char *produced; /* the produced_by JSON */
    bool begun;     /* inside the transaction */
    char xid[32];   /* the transaction's id, for its status after a lost reply */
};

/* After a failed commit: removes the files it renamed into place that no
 * row names, under the storage lock taken exclusively, so that another
 * commit that reused a key (after this one rolled back) keeps its file.
 * Without the database nothing is removed: fsck finds the files. */
static void
remove_unclaimed(struct commit *c)
{
    struct cx_db *db = c->cx->db;
    size_t left = 0;

    cx_db_pin(db);
    if (cx_db_exec(db, &q_storage_lock, NULL, NULL) == CX_OK) {
        for (size_t i = 0; i < c->np; i++) {
            const char *p[1] = {c->p[i].key};
            PGresult *r = NULL;
            bool named;

            if (!c->p[i].renamed)
                continue;
            named = cx_db_exec(db, &q_key_known, p, &r) != CX_OK || PQntuples(r) > 0;
            PQclear(r);
            if (named || cx_storage_remove(c->cx->store, c->p[i].key))
                left++;
        }
        if (cx_db_exec(db, &q_storage_unlock, NULL, NULL))
            cx_log_warn(0, "the storage lock ends with the connection");
    } else {
        left = c->np;
    }
    cx_db_unpin(db);
    if (left)
        cx_log_warn(0, "after a failed commit, %zu file(s) stay for fsck", left);
}

/* The COMMIT's reply was lost with its connection: the transaction's
 * status says whether it took effect. Files are removed only when it was
 * aborted; when that can't be told (the connection held the
 * conversation's lock and can't be replaced yet, or it is still in
 * progress), they stay for fsck, which finds them either way. */
static enum cx_err
commit_outcome(struct commit *c)
{
    const char *p[1] = {c->xid};
    PGresult *r = NULL;
    enum cx_err rc = c->xid[0] ? cx_db_exec_row(c->cx->db, &q_xact_status, p, &r) : CX_ERR_DB;
    const char *status = rc == CX_OK ? PQgetvalue(r, 0, 0) : "";

    if (!strcmp(status, "committed")) {
        cx_log_warn(0, "a COMMIT's reply was lost; it committed: stored");
        rc = CX_OK;
    } else if (!strcmp(status, "aborted")) {
        remove_unclaimed(c);
        rc = CX_ERR_DB;
    } else {
        cx_log_warn(0, "a COMMIT's outcome is unknown; its %zu file(s) stay for fsck", c->np);
        rc = CX_ERR_DB;
    }
    PQclear(r);
    return rc;
}

/* The transaction's id, asked just before COMMIT. */
static enum cx_err
commit_xid(struct commit *c)
{
    PGresult *r = NULL;
    enum cx_err rc = c->np ? cx_db_exec_row(c->cx->db, &q_xid, NULL, &r) : CX_OK;

    if (rc == CX_OK && r)
        snprintf(c->xid, sizeof(c->xid), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

enum cx_err
cx_artifact_usage(struct cx_ctx *cx, const char *user, uint64_t *bytes, uint64_t *count)
{
    const char *u[1] = {user};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_usage, u, &r);

    *bytes = rc == CX_OK ? strtoull(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    *count = rc == CX_OK ? strtoull(PQgetvalue(r, 0, 1), NULL, 10) : 0;
    PQclear(r);
    return rc;
}

/* Allocations, BEGIN, and the user's usage under the quota lock. */
static enum cx_err
commit_begin(struct commit *c, size_t n)
{
    const char *u[1] = {c->user};
    json_t *pb = c->run_id ? json_pack("{s:s,s:s,s:s}", "tool", "code_executor", "action",
                                       "run_code", "run_id", c->run_id)
                           : json_pack("{s:s,s:s}", "tool", "upload", "action", "upload_artifact");
    PGresult *r = NULL;
    enum cx_err rc;

    c->produced = pb ? json_dumps(pb, JSON_COMPACT) : NULL;
    json_decref(pb);
    c->p = calloc(n, sizeof(*c->p));
    if (!c->p || !c->produced)
        return CX_ERR_NOMEM;
    rc = cx_db_begin(c->cx->db);
    if (rc)
        return rc;
    c->begun = true;
    rc = cx_db_exec(c->cx->db, &q_quota_lock, u, NULL);
    if (rc == CX_OK)
        rc = cx_db_exec(c->cx->db, &q_usage, u, &r);
    if (rc == CX_OK) {
        c->used_bytes = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
        c->used_count = strtoull(PQgetvalue(r, 0, 1), NULL, 10);
        c->used_versions = strtoull(PQgetvalue(r, 0, 2), NULL, 10);
    }
    PQclear(r);
    return rc;
}

/* The rows of one file: a new version unless its bytes are the current
 * version's; over quota it goes to the skipped list instead. */
static enum cx_err
commit_file(struct commit *c, struct cx_captured *f)
{
    const char *cur[3] = {c->user, c->cid, f->path};
    const char *up[4] = {c->user, c->cid, f->path, cx_mime_kind(f->mime)};
    struct pending *p = &c->p[c->np];
    char ver[16], size[24];
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(c->cx->db, &q_current, cur, &r);
    bool is_new = rc == CX_OK && PQntuples(r) == 0;

    if (rc == CX_OK && !is_new && !strcmp(PQgetvalue(r, 0, 0), f->sha256)) {
        PQclear(r);
        return CX_OK; /* same bytes as the current version: nothing new */
    }
    PQclear(r);
    if (rc)
        return rc;
    /* versions too: each is a file of its own and a row, and the bytes
     * alone would let one user fill the disk's inodes with 1-byte ones */
    if (c->used_bytes + f->size > c->cx->cfg->user_quota_bytes ||
        (is_new && c->used_count + 1 > c->cx->cfg->user_quota_artifacts) ||
        c->used_versions + 1 > c->cx->cfg->user_quota_versions) {
        cx_capture_skip(c->cap, f->path, "quota_exceeded");
        return CX_OK;
    }
    rc = cx_db_exec(c->cx->db, &q_upsert, up, &r);
    if (rc)
        return rc;
    p->f = f;
    snprintf(p->id, sizeof(p->id), "%s", PQgetvalue(r, 0, 0));
    p->version = (int)strtol(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    cx_storage_safe_filename(f->path, strlen(f->path), p->safe);
    rc = cx_storage_key(c->user, p->id, p->version, p->safe, p->key, sizeof(p->key));
    if (rc)
        return rc;
    snprintf(ver, sizeof(ver), "%d", p->version);
    snprintf(size, sizeof(size), "%llu", (unsigned long long)f->size);
    const char *vp[8] = {p->id, ver, p->safe, f->mime, size, f->sha256, p->key, c->produced};
    rc = cx_db_exec(c->cx->db, &q_version, vp, NULL);
    if (rc)
        return rc;
    c->used_bytes += f->size;
    c->used_count += is_new;
    c->used_versions++;
    c->np++;
    return CX_OK;
}

/* Bytes into place (renamed and synced) before the rows become visible. */
static enum cx_err
commit_bytes(struct commit *c)
{
    enum cx_err rc = c->np ? cx_db_exec(c->cx->db, &q_storage_lock_shared, NULL, NULL) : CX_OK;

    if (rc)
        return rc;
    for (size_t i = 0; i < c->np; i++) {
        rc = cx_storage_writer_commit(c->p[i].f->w, c->p[i].key);
        c->p[i].f->w = NULL;
        if (rc)
            return rc;
        c->p[i].renamed = true;
    }
#ifdef CX_TEST_HOOKS
    if (crash_before_commit)
        _exit(99); /* see cx_artifact_test_hooks() */
#endif
    return CX_OK;
}

static void
commit_answer(struct commit *c, json_t *artifacts)
{
    for (size_t i = 0; i < c->np; i++) {
        struct pending *p = &c->p[i];
        char url[CX_CONTENT_URL_MAX];

        cx_artifact_content_url(p->id, p->version, url);
        json_array_append_new(artifacts,
                              json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:I,s:s,s:s}", "artifact_id",
                                        p->id, "version", p->version, "filename", p->safe, "path",
                                        p->f->path, "mime_type", p->f->mime, "kind",
                                        cx_mime_kind(p->f->mime), "size", (json_int_t)p->f->size,
                                        "sha256", p->f->sha256, "download_url", url));
    }
    if (c->run_id)
        for (size_t i = 0; i < c->np; i++)
            cx_metrics_add(CX_COUNT_CAPTURE_BYTES, c->p[i].f->size);
    cx_log_info("%s %s: %zu artifact version(s) stored", c->run_id ? "run" : "upload",
                c->run_id ? c->run_id : "-", c->np);
}

enum cx_err
cx_artifact_commit_capture(struct cx_ctx *cx, const char *user, const char *cid, const char *run_id,
                           struct cx_capture *cap, json_t *artifacts)
{
    struct commit c = {.cx = cx, .user = user, .cid = cid, .run_id = run_id, .cap = cap};
    size_t n = cx_capture_count(cap);
    enum cx_err rc;

    if (n == 0)
        return CX_OK;
    rc = commit_begin(&c, n);
    for (size_t i = 0; rc == CX_OK && i < n; i++)
        rc = commit_file(&c, cx_capture_file(cap, i));
    if (rc == CX_OK)
        rc = commit_bytes(&c);
    if (rc == CX_OK)
        rc = commit_xid(&c);
    if (rc == CX_OK) {
        rc = cx_db_commit(cx->db);
        if (rc && cx_db_commit_unknown(cx->db))
            rc = commit_outcome(&c);
        else if (rc)
            remove_unclaimed(&c); /* the rows are gone with the transaction */
        if (rc == CX_OK)
            commit_answer(&c, artifacts);
    } else if (c.begun) {
        cx_db_rollback(cx->db);
        remove_unclaimed(&c);
        for (size_t i = 0; i < n; i++)
            cx_capture_skip(cap, cx_capture_file(cap, i)->path, "storage_error");
    }
    free(c.p);
    free(c.produced);
    return rc;
}
