#include <dirent.h>
#include <errno.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "artifact.h"
#include "capture.h"
#include "config.h"
#include "db.h"
#include "http.h"
#include "log.h"
#include "mime.h"
#include "run.h"
#include "storage.h"
#include "util.h"

#define TS(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"

CX_SQL(q_quota_lock, 1,
       "SELECT pg_advisory_xact_lock(hashtextextended('quota' || E'\\n' || $1, 2))");
CX_SQL(q_usage, 1,
       "SELECT (SELECT coalesce(sum(v.size), 0) FROM artifact_versions v JOIN artifacts a"
       "        ON a.id = v.artifact_id WHERE a.user_id = $1),"
       "       (SELECT count(*) FROM artifacts WHERE user_id = $1 AND deleted_at IS NULL)");
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

static bool crash_before_commit;

void
cx_artifact_test_hooks(void)
{
    const char *v = getenv("CODEXEC_TEST_CRASH_BEFORE_COMMIT");

    crash_before_commit = v && !strcmp(v, "1");
    if (crash_before_commit)
        cx_log_warn(0, "test hook: exiting before the next artifact COMMIT");
}

struct pending {
    struct cx_captured *f;
    char key[1024];
    char id[37];
    int version;
    bool renamed;
};

static void
remove_files(struct cx_ctx *cx, struct pending *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i].renamed && cx_storage_remove(cx->cfg->storage_dir, p[i].key))
            cx_log_warn(0, "could not remove %s after a failed commit; fsck will", p[i].id);
}

enum cx_err
cx_artifact_commit_capture(struct cx_ctx *cx, const char *user, const char *cid, const char *run_id,
                           struct cx_capture *cap, json_t *artifacts)
{
    size_t n = cx_capture_count(cap), np = 0;
    struct pending *p = NULL;
    PGresult *r = NULL;
    unsigned long long used_bytes, used_count;
    char *produced = NULL;
    enum cx_err rc;

    if (n == 0)
        return CX_OK;
    p = calloc(n, sizeof(*p));
    {
        json_t *pb = run_id ? json_pack("{s:s,s:s,s:s}", "tool", "code_executor", "action",
                                        "run_code", "run_id", run_id)
                            : json_pack("{s:s,s:s}", "tool", "upload", "action", "upload_artifact");
        produced = pb ? json_dumps(pb, JSON_COMPACT) : NULL;
        json_decref(pb);
    }
    if (!p || !produced) {
        rc = CX_ERR_NOMEM;
        goto out;
    }
    rc = cx_db_begin(cx->db);
    if (rc)
        goto out;
    {
        const char *u[1] = {user};
        rc = cx_db_exec(cx->db, &q_quota_lock, u, NULL);
        if (rc == CX_OK)
            rc = cx_db_exec(cx->db, &q_usage, u, &r);
        if (rc)
            goto fail;
        used_bytes = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
        used_count = strtoull(PQgetvalue(r, 0, 1), NULL, 10);
        PQclear(r);
        r = NULL;
    }
    for (size_t i = 0; i < n; i++) {
        struct cx_captured *f = cx_capture_file(cap, i);
        const char *cur[3] = {user, cid, f->path};
        char safe[256], ver[16], size[24];
        bool is_new;

        rc = cx_db_exec(cx->db, &q_current, cur, &r);
        if (rc)
            goto fail;
        is_new = PQntuples(r) == 0;
        if (!is_new && !strcmp(PQgetvalue(r, 0, 0), f->sha256)) {
            PQclear(r);
            r = NULL;
            continue; /* same bytes as the current version: nothing new */
        }
        PQclear(r);
        r = NULL;
        if (used_bytes + f->size > cx->cfg->user_quota_bytes ||
            (is_new && used_count + 1 > cx->cfg->user_quota_artifacts)) {
            cx_capture_skip(cap, f->path, "quota_exceeded");
            continue;
        }
        {
            const char *up[4] = {user, cid, f->path, cx_mime_kind(f->mime)};
            rc = cx_db_exec(cx->db, &q_upsert, up, &r);
            if (rc)
                goto fail;
        }
        p[np].f = f;
        snprintf(p[np].id, sizeof(p[np].id), "%s", PQgetvalue(r, 0, 0));
        p[np].version = (int)strtol(PQgetvalue(r, 0, 1), NULL, 10);
        PQclear(r);
        r = NULL;
        cx_storage_safe_filename(f->path, strlen(f->path), safe);
        rc = cx_storage_key(user, p[np].id, p[np].version, safe, p[np].key, sizeof(p[np].key));
        if (rc)
            goto fail;
        snprintf(ver, sizeof(ver), "%d", p[np].version);
        snprintf(size, sizeof(size), "%llu", (unsigned long long)f->size);
        {
            const char *vp[8] = {p[np].id, ver,       safe,      f->mime,
                                 size,     f->sha256, p[np].key, produced};
            rc = cx_db_exec(cx->db, &q_version, vp, NULL);
            if (rc)
                goto fail;
        }
        used_bytes += f->size;
        used_count += is_new;
        np++;
    }
    /* Bytes into place before the rows become visible. */
    for (size_t i = 0; i < np; i++) {
        rc = cx_storage_writer_commit(p[i].f->w, p[i].key);
        p[i].f->w = NULL;
        if (rc)
            goto fail;
        p[i].renamed = true;
    }
    if (crash_before_commit)
        _exit(99); /* test hook: see cx_artifact_test_hooks() */
    rc = cx_db_commit(cx->db);
    if (rc) {
        remove_files(cx, p, np);
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        char url[128], safe[256];
        cx_storage_safe_filename(p[i].f->path, strlen(p[i].f->path), safe);
        snprintf(url, sizeof(url), "/v1/artifacts/%s/content?version=%d", p[i].id, p[i].version);
        json_array_append_new(
            artifacts,
            json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:I,s:s,s:s}", "artifact_id", p[i].id, "version",
                      p[i].version, "filename", safe, "path", p[i].f->path, "mime_type",
                      p[i].f->mime, "kind", cx_mime_kind(p[i].f->mime), "size",
                      (json_int_t)p[i].f->size, "sha256", p[i].f->sha256, "download_url", url));
    }
    cx_log_info("%s %s: %zu artifact version(s) stored", run_id ? "run" : "upload",
                run_id ? run_id : "-", np);
    goto out;
fail:
    PQclear(r);
    r = NULL;
    cx_db_rollback(cx->db);
    remove_files(cx, p, np);
    for (size_t i = 0; i < n; i++)
        cx_capture_skip(cap, cx_capture_file(cap, i)->path, "storage_error");
out:
    PQclear(r);
    free(p);
    free(produced);
    return rc;
}

#define ARTIFACT_COLS                                                                              \
    "a.id, a.path, a.kind, a.current_version, v.filename, v.mime_type, v.size, v.sha256, " TS(     \
        "a.created_at") ", " TS("a.updated_at")

CX_SQL(q_list, 2,
       "SELECT " ARTIFACT_COLS " FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.user_id = $1 AND a.conversation_id = $2 AND a.deleted_at IS NULL"
       " ORDER BY a.path LIMIT 10000");
CX_SQL(q_get, 2,
       "SELECT " ARTIFACT_COLS ", a.conversation_id FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.id = $1::uuid AND a.user_id = $2 AND a.deleted_at IS NULL");
CX_SQL(q_versions, 1,
       "SELECT version, filename, mime_type, size, sha256, produced_by::text, " TS(
           "created_at") " FROM artifact_versions WHERE artifact_id = $1::uuid ORDER BY version");

static json_t *
artifact_json(PGresult *r, int i)
{
    char url[128];

    snprintf(url, sizeof(url), "/v1/artifacts/%s/content?version=%s", PQgetvalue(r, i, 0),
             PQgetvalue(r, i, 3));
    return json_pack("{s:s,s:s,s:s,s:I,s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "artifact_id",
                     PQgetvalue(r, i, 0), "path", PQgetvalue(r, i, 1), "kind", PQgetvalue(r, i, 2),
                     "current_version", (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10),
                     "filename", PQgetvalue(r, i, 4), "mime_type", PQgetvalue(r, i, 5), "size",
                     (json_int_t)strtoll(PQgetvalue(r, i, 6), NULL, 10), "sha256",
                     PQgetvalue(r, i, 7), "created_at", PQgetvalue(r, i, 8), "updated_at",
                     PQgetvalue(r, i, 9), "download_url", url);
}

enum cx_err
cx_artifact_list(struct cx_ctx *cx, const char *user, const char *cid, json_t **out)
{
    const char *p[2] = {user, cid};
    PGresult *r = NULL;
    json_t *arr;
    enum cx_err rc;

    rc = cx_db_exec(cx->db, &q_list, p, &r);
    if (rc)
        return rc;
    arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, artifact_json(r, i));
    PQclear(r);
    *out = json_pack("{s:s,s:o}", "conversation_id", cid, "artifacts", arr);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

enum cx_err
cx_artifact_get(struct cx_ctx *cx, const char *user, const char *id, json_t **out)
{
    const char *p[2] = {id, user};
    PGresult *r = NULL, *v = NULL;
    json_t *a, *versions;
    enum cx_err rc;

    if (!cx_uuid_valid(id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_exec(cx->db, &q_get, p, &r);
    if (rc)
        return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return CX_ERR_NOT_FOUND;
    }
    a = artifact_json(r, 0);
    json_object_set_new(a, "conversation_id", json_string(PQgetvalue(r, 0, 10)));
    PQclear(r);
    rc = cx_db_exec(cx->db, &q_versions, p, &v);
    if (rc) {
        json_decref(a);
        return rc;
    }
    versions = json_array();
    for (int i = 0; i < PQntuples(v); i++) {
        char url[128];
        snprintf(url, sizeof(url), "/v1/artifacts/%s/content?version=%s", id, PQgetvalue(v, i, 0));
        json_array_append_new(
            versions,
            json_pack("{s:I,s:s,s:s,s:I,s:s,s:o,s:s,s:s}", "version",
                      (json_int_t)strtoll(PQgetvalue(v, i, 0), NULL, 10), "filename",
                      PQgetvalue(v, i, 1), "mime_type", PQgetvalue(v, i, 2), "size",
                      (json_int_t)strtoll(PQgetvalue(v, i, 3), NULL, 10), "sha256",
                      PQgetvalue(v, i, 4), "produced_by", json_loads(PQgetvalue(v, i, 5), 0, NULL),
                      "created_at", PQgetvalue(v, i, 6), "download_url", url));
    }
    PQclear(v);
    json_object_set_new(a, "versions", versions);
    *out = a;
    return CX_OK;
}

CX_SQL(q_delete_mark, 2,
       "UPDATE artifacts SET deleted_at = now() WHERE id = $1::uuid AND user_id = $2"
       " AND deleted_at IS NULL RETURNING id");
CX_SQL(q_delete_versions, 1,
       "DELETE FROM artifact_versions WHERE artifact_id = $1::uuid RETURNING storage_key");

enum cx_err
cx_artifact_delete(struct cx_ctx *cx, const char *user, const char *id)
{
    const char *p[2] = {id, user};
    PGresult *r = NULL;
    enum cx_err rc;

    if (!cx_uuid_valid(id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_begin(cx->db);
    if (rc)
        return rc;
    rc = cx_db_exec(cx->db, &q_delete_mark, p, &r);
    if (rc == CX_OK && PQntuples(r) != 1)
        rc = CX_ERR_NOT_FOUND;
    PQclear(r);
    r = NULL;
    if (rc == CX_OK)
        rc = cx_db_exec(cx->db, &q_delete_versions, p, &r);
    if (rc) {
        PQclear(r);
        cx_db_rollback(cx->db);
        return rc;
    }
    rc = cx_db_commit(cx->db);
    if (rc == CX_OK)
        for (int i = 0; i < PQntuples(r); i++)
            if (cx_storage_remove(cx->cfg->storage_dir, PQgetvalue(r, i, 0)))
                cx_log_warn(0, "could not remove a deleted version of %s; fsck will", id);
    PQclear(r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Uploads                                                                   */

#define UPLOAD_READ 65536

struct upload {
    const struct cx_config *cfg;
    struct cx_storage_writer *w;
    char filename[1024];
    char cid[CX_CONVERSATION_MAX + 2];
    unsigned char head[65536];
    size_t head_len;
    enum { PART_NONE, PART_FILE, PART_CID, PART_OTHER } part;
    size_t field_len;
    bool have_file;
    enum cx_err why; /* the cause of a callback failure */
};

static enum cx_err
file_bytes(struct upload *u, const char *data, size_t len)
{
    if (u->head_len < sizeof(u->head)) {
        size_t n = len < sizeof(u->head) - u->head_len ? len : sizeof(u->head) - u->head_len;
        memcpy(u->head + u->head_len, data, n);
        u->head_len += n;
    }
    if (cx_storage_writer_size(u->w) + len > u->cfg->max_artifact_bytes) {
        u->why = CX_ERR_TOO_LARGE;
        return CX_ERR_TOO_LARGE;
    }
    return cx_storage_writer_write(u->w, data, len);
}

static enum cx_err
mp_begin(void *ctx, const char *name, const char *filename)
{
    struct upload *u = ctx;

    u->field_len = 0;
    if (!strcmp(name, "file") && filename) {
        if (u->have_file) {
            u->why = CX_ERR_INVALID;
            return CX_ERR_INVALID; /* one file per request */
        }
        u->have_file = true;
        snprintf(u->filename, sizeof(u->filename), "%s", filename);
        u->part = PART_FILE;
        return cx_storage_writer_new(u->cfg->storage_dir, &u->w);
    }
    u->part = !strcmp(name, "conversation_id") ? PART_CID : PART_OTHER;
    if (u->part == PART_CID)
        u->cid[0] = '\0';
    return CX_OK;
}

static enum cx_err
mp_data(void *ctx, const char *data, size_t len)
{
    struct upload *u = ctx;

    switch (u->part) {
    case PART_FILE: return file_bytes(u, data, len);
    case PART_CID:
        if (u->field_len + len >= sizeof(u->cid)) {
            u->why = CX_ERR_INVALID;
            return CX_ERR_INVALID;
        }
        memcpy(u->cid + u->field_len, data, len);
        u->field_len += len;
        u->cid[u->field_len] = '\0';
        return CX_OK;
    case PART_OTHER:
        u->field_len += len; /* ignored fields stay small */
        return u->field_len > 65536 ? CX_ERR_INVALID : CX_OK;
    default: return CX_OK;
    }
}

static enum cx_err
mp_end(void *ctx)
{
    ((struct upload *)ctx)->part = PART_NONE;
    return CX_OK;
}

CX_SQL(q_by_path, 3,
       "SELECT " ARTIFACT_COLS " FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.user_id = $1 AND a.conversation_id = $2 AND a.path = $3 AND a.deleted_at IS NULL");

enum cx_err
cx_artifact_upload(struct cx_ctx *cx, const char *user, const char *query, const char *ctype,
                   const char *content_length, ssize_t (*read_fn)(void *, void *, size_t),
                   void *read_ctx, json_t **out, char *msg, size_t msglen)
{
    struct upload *u = calloc(1, sizeof(*u));
    struct cx_multipart *mp = NULL;
    struct cx_capture *cap = NULL;
    char boundary[80], *buf = malloc(UPLOAD_READ), safe[256], sha[65], mime[128];
    uint64_t total = 0, got = 0, size = 0;
    json_t *arr = NULL;
    enum cx_err rc = CX_OK;

    *out = NULL;
    if (!u || !buf) {
        rc = CX_ERR_NOMEM;
        goto out;
    }
    u->cfg = cx->cfg;
    if (!content_length || cx_http_content_length(content_length, &total)) {
        snprintf(msg, msglen, "Content-Length is required");
        rc = CX_ERR_INVALID;
        goto out;
    }
    if (total > cx->cfg->max_body_bytes) {
        snprintf(msg, msglen, "the request body exceeds %llu bytes",
                 (unsigned long long)cx->cfg->max_body_bytes);
        rc = CX_ERR_TOO_LARGE;
        goto out;
    }
    if (cx_http_multipart_boundary(ctype, boundary, sizeof(boundary)) == CX_OK) {
        static const struct cx_multipart_cb cb = {mp_begin, mp_data, mp_end};
        rc = cx_http_multipart_new(boundary, &cb, u, &mp);
        if (rc)
            goto out;
    } else if (ctype && !strncasecmp(ctype, "multipart/", 10)) {
        snprintf(msg, msglen, "multipart bodies must be multipart/form-data with a boundary");
        rc = CX_ERR_INVALID;
        goto out;
    } else {
        if (cx_http_query_get(query, "conversation_id", u->cid, sizeof(u->cid)) ||
            cx_http_query_get(query, "filename", u->filename, sizeof(u->filename))) {
            snprintf(msg, msglen, "conversation_id and filename are required in the query");
            rc = CX_ERR_INVALID;
            goto out;
        }
        u->have_file = true;
        u->part = PART_FILE;
        rc = cx_storage_writer_new(cx->cfg->storage_dir, &u->w);
        if (rc)
            goto out;
    }
    /* Stream: nothing larger than one read is ever held. */
    while (got < total) {
        size_t want = total - got < UPLOAD_READ ? (size_t)(total - got) : UPLOAD_READ;
        ssize_t n = read_fn(read_ctx, buf, want);
        if (n <= 0) {
            snprintf(msg, msglen, "the request body ended early");
            rc = CX_ERR_INVALID;
            goto out;
        }
        got += (uint64_t)n;
        rc = mp ? cx_http_multipart_feed(mp, buf, (size_t)n) : file_bytes(u, buf, (size_t)n);
        if (rc) {
            if (u->why)
                rc = u->why;
            snprintf(msg, msglen,
                     rc == CX_ERR_TOO_LARGE ? "the file exceeds max_artifact_bytes"
                                            : "malformed multipart body");
            goto out;
        }
    }
    if (mp && cx_http_multipart_finish(mp)) {
        snprintf(msg, msglen, "malformed multipart body (no closing boundary)");
        rc = CX_ERR_INVALID;
        goto out;
    }
    if (!u->have_file || !u->w) {
        snprintf(msg, msglen, "a file part named \"file\" with a filename is required");
        rc = CX_ERR_INVALID;
        goto out;
    }
    if (!cx_run_conversation_id_valid(u->cid)) {
        snprintf(msg, msglen, "conversation_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -");
        rc = CX_ERR_INVALID;
        goto out;
    }
    cx_storage_safe_filename(u->filename, strlen(u->filename), safe);
    rc = cx_storage_writer_finish(u->w, &size, sha);
    if (rc)
        goto out;
    if (cx_mime_detect(u->head, u->head_len, safe, mime, sizeof(mime)))
        snprintf(mime, sizeof(mime), "application/octet-stream");
    rc = cx_capture_new(cx->cfg, &cap);
    if (rc)
        goto out;
    cx_capture_add_file(cap, safe, u->w, size, sha, mime);
    u->w = NULL;
    arr = json_array();
    rc = cx_artifact_commit_capture(cx, user, u->cid, NULL, cap, arr);
    if (rc)
        goto out;
    if (json_array_size(cx_capture_skipped(cap))) {
        snprintf(msg, msglen, "the user's artifact quota is exhausted");
        rc = CX_ERR_QUOTA;
        goto out;
    }
    if (json_array_size(arr)) {
        *out = json_incref(json_array_get(arr, 0));
    } else {
        /* The same bytes as the current version: that version it is. */
        const char *p[3] = {user, u->cid, safe};
        PGresult *r = NULL;
        rc = cx_db_exec(cx->db, &q_by_path, p, &r);
        if (rc == CX_OK && PQntuples(r) == 1) {
            *out = artifact_json(r, 0);
            json_object_set_new(
                *out, "version",
                json_integer(json_integer_value(json_object_get(*out, "current_version"))));
        } else if (rc == CX_OK) {
            rc = CX_ERR_INTERNAL;
        }
        PQclear(r);
    }
out:
    if (u)
        cx_storage_writer_abort(u->w);
    cx_http_multipart_free(mp);
    cx_capture_free(cap);
    json_decref(arr);
    free(buf);
    free(u);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* fsck and gc                                                               */

CX_SQL(q_key_known, 1, "SELECT 1 FROM artifact_versions WHERE storage_key = $1");
CX_SQL(q_all_versions, 0,
       "SELECT artifact_id, version, storage_key, size, sha256 FROM artifact_versions"
       " ORDER BY artifact_id, version");

static enum cx_err
walk(struct cx_ctx *cx, const char *dir, size_t rootlen, bool repair, FILE *report, int *problems)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    enum cx_err rc = CX_OK;

    if (!d)
        return errno == ENOENT ? CX_OK : CX_ERR_IO;
    while (rc == CX_OK && (e = readdir(d))) {
        char path[4096 + 260];
        struct stat st;

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (lstat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            rc = walk(cx, path, rootlen, repair, report, problems);
            if (repair)
                rmdir(path); /* empty ones only */
            continue;
        }
        {
            const char *key = path + rootlen + 1;
            const char *p[1] = {key};
            PGresult *r = NULL;
            bool known;

            rc = cx_db_exec(cx->db, &q_key_known, p, &r);
            if (rc)
                break;
            known = PQntuples(r) == 1;
            PQclear(r);
            if (known)
                continue;
            if (repair && unlink(path) == 0) {
                fprintf(report, "removed orphan file %s\n", key);
            } else {
                fprintf(report, "orphan file %s\n", key);
                (*problems)++;
            }
        }
    }
    closedir(d);
    return rc;
}

static void
sweep_staging(const char *root, bool repair, FILE *report, int *problems)
{
    char dir[4096];
    DIR *d;
    struct dirent *e;
    time_t now = time(NULL);

    snprintf(dir, sizeof(dir), "%s/.staging", root);
    d = opendir(dir);
    if (!d)
        return;
    while ((e = readdir(d))) {
        char path[4096 + 260];
        struct stat st;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (lstat(path, &st) != 0 || now - st.st_mtime < 3600)
            continue; /* a write in progress */
        if (repair && unlink(path) == 0) {
            fprintf(report, "removed stale staging file .staging/%s\n", e->d_name);
        } else {
            fprintf(report, "stale staging file .staging/%s\n", e->d_name);
            (*problems)++;
        }
    }
    closedir(d);
}

static bool
file_matches(const char *path, uint64_t size, const char *sha, const char **what)
{
    unsigned char buf[65536], h[crypto_hash_sha256_BYTES];
    char hex[65];
    crypto_hash_sha256_state s;
    struct stat st;
    FILE *f;
    size_t n;

    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        *what = "missing file";
        return false;
    }
    if ((uint64_t)st.st_size != size) {
        *what = "size mismatch";
        return false;
    }
    f = fopen(path, "rbe");
    if (!f) {
        *what = "unreadable file";
        return false;
    }
    crypto_hash_sha256_init(&s);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        crypto_hash_sha256_update(&s, buf, n);
    fclose(f);
    crypto_hash_sha256_final(&s, h);
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    if (strcmp(hex, sha) != 0) {
        *what = "sha256 mismatch";
        return false;
    }
    return true;
}

enum cx_err
cx_artifact_fsck(struct cx_ctx *cx, bool repair, FILE *report, int *problems)
{
    const char *root = cx->cfg->storage_dir;
    char dir[4096];
    PGresult *r = NULL;
    enum cx_err rc;

    *problems = 0;
    snprintf(dir, sizeof(dir), "%s/artifacts", root);
    rc = walk(cx, dir, strlen(root), repair, report, problems);
    if (rc)
        return rc;
    sweep_staging(root, repair, report, problems);
    rc = cx_db_exec(cx->db, &q_all_versions, NULL, &r);
    if (rc)
        return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        char path[4096];
        const char *what = NULL;

        if (cx_storage_path(root, PQgetvalue(r, i, 2), path, sizeof(path)) ||
            !file_matches(path, strtoull(PQgetvalue(r, i, 3), NULL, 10), PQgetvalue(r, i, 4),
                          &what)) {
            fprintf(report, "%s: artifact %s version %s\n", what ? what : "bad storage key",
                    PQgetvalue(r, i, 0), PQgetvalue(r, i, 1));
            (*problems)++;
        }
    }
    PQclear(r);
    return CX_OK;
}

CX_SQL(q_gc_tombstones, 0,
       "DELETE FROM artifacts a WHERE deleted_at IS NOT NULL"
       " AND NOT EXISTS (SELECT 1 FROM artifact_versions v WHERE v.artifact_id = a.id)");

enum cx_err
cx_artifact_gc(struct cx_ctx *cx, int *removed)
{
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_gc_tombstones, NULL, &r);

    *removed = rc ? 0 : (int)strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return rc;
}
