/* codexec-admin fsck and gc: storage against the database. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "s3.h"
#include "storage.h"

CX_SQL(q_key_known, 1, "SELECT 1 FROM artifact_versions WHERE storage_key = $1");
/* commit.c holds it shared from a file's rename to its COMMIT. */
CX_SQL(q_storage_lock, 0, "SELECT pg_advisory_lock(" CX_STORAGE_LOCK ")");
CX_SQL(q_storage_unlock, 0, "SELECT pg_advisory_unlock(" CX_STORAGE_LOCK ")");
CX_SQL(q_all_versions, 0,
       "SELECT artifact_id, version, storage_key, size, sha256 FROM artifact_versions"
       " ORDER BY artifact_id, version");

struct fsck {
    struct cx_ctx *cx;
    bool repair;
    FILE *report;
    int problems;
};

static enum cx_err
key_known(struct fsck *f, const char *const *p, bool *known)
{
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(f->cx->db, &q_key_known, p, &r);

    *known = rc == CX_OK && PQntuples(r) == 1;
    PQclear(r);
    return rc;
}

/* A file in storage: known to a row, else an orphan (removed with repair). */
static enum cx_err
check_file(void *ctx, const char *key, bool staging)
{
    struct fsck *f = ctx;
    const char *p[1] = {key};
    enum cx_err rc = CX_OK;
    bool known = false, removed = false;

    if (!staging) {
        rc = key_known(f, p, &known);
        if (rc == CX_OK && !known) {
            /* No row: perhaps one whose COMMIT is under way. Ask again
             * once no commit is between rename and COMMIT. */
            cx_db_pin(f->cx->db);
            rc = cx_db_exec(f->cx->db, &q_storage_lock, NULL, NULL);
            if (rc == CX_OK)
                rc = key_known(f, p, &known);
            if (rc == CX_OK && !known && f->repair)
                removed = cx_storage_remove(f->cx->store, key) == CX_OK;
            if (cx_db_exec(f->cx->db, &q_storage_unlock, NULL, NULL))
                cx_log_warn(0, "fsck: the storage lock ends with the connection");
            cx_db_unpin(f->cx->db);
        }
    } else if (f->repair) {
        removed = cx_storage_remove(f->cx->store, key) == CX_OK;
    }
    if (rc || known)
        return rc;
    if (removed) {
        fprintf(f->report, "removed %s %s\n", staging ? "stale staging file" : "orphan file", key);
    } else {
        fprintf(f->report, "%s %s\n", staging ? "stale staging file" : "orphan file", key);
        f->problems++;
    }
    return CX_OK;
}

/* Every row's bytes: present, of its size and sha256. */
static enum cx_err
check_rows(struct fsck *f)
{
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(f->cx->db, &q_all_versions, NULL, &r);

    for (int i = 0; rc == CX_OK && i < PQntuples(r); i++) {
        uint64_t size = 0;
        char sha[65] = "";
        const char *what = NULL;
        enum cx_err d = cx_storage_digest(f->cx->store, PQgetvalue(r, i, 2), &size, sha);

        if (d == CX_ERR_INVALID)
            what = "bad storage key";
        else if (d == CX_ERR_NOT_FOUND)
            what = "missing file";
        else if (d)
            what = "unreadable file";
        else if (size != strtoull(PQgetvalue(r, i, 3), NULL, 10))
            what = "size mismatch";
        else if (strcmp(sha, PQgetvalue(r, i, 4)) != 0)
            what = "sha256 mismatch";
        if (what) {
            fprintf(f->report, "%s: artifact %s version %s\n", what, PQgetvalue(r, i, 0),
                    PQgetvalue(r, i, 1));
            f->problems++;
        }
    }
    PQclear(r);
    return rc;
}

enum cx_err
cx_artifact_fsck(struct cx_ctx *cx, bool repair, FILE *report, int *problems)
{
    struct fsck f = {.cx = cx, .repair = repair, .report = report};
    /* An hour: a staging file younger than that may be a write in progress. */
    enum cx_err rc = cx_storage_walk(cx->store, 3600, repair, check_file, &f);

    if (rc == CX_OK)
        rc = check_rows(&f);
    *problems = f.problems;
    return rc;
}

/* One version into the store: through a writer (staged, hashed, copied
 * into place), its bytes read from the local file. */
struct migrating {
    struct cx_storage_writer *w;
    enum cx_err rc;
};

static bool
on_local_bytes(void *ctx, const void *data, size_t len)
{
    struct migrating *m = ctx;

    m->rc = cx_storage_writer_write(m->w, data, len);
    return m->rc == CX_OK;
}

static const char *
migrate_one(struct cx_ctx *cx, struct cx_storage *local, const char *key, uint64_t want_size,
            const char *want_sha)
{
    struct migrating m = {0};
    uint64_t size = 0;
    char sha[65];
    enum cx_err rc = cx_storage_writer_new(cx->store, &m.w);

    if (rc)
        return "could not start a write to the store";
    rc = cx_storage_read(local, key, 0, UINT64_MAX, on_local_bytes, &m);
    if (rc == CX_OK && m.rc == CX_OK)
        rc = cx_storage_writer_finish(m.w, &size, sha);
    if (rc || m.rc) {
        cx_storage_writer_abort(m.w);
        return rc == CX_ERR_NOT_FOUND ? "missing file" : "could not copy";
    }
    if (size != want_size || strcmp(sha, want_sha) != 0) {
        cx_storage_writer_abort(m.w);
        return size != want_size ? "size mismatch" : "sha256 mismatch";
    }
    return cx_storage_writer_commit(m.w, key) ? "could not store" : NULL;
}

enum cx_err
cx_artifact_storage_migrate(struct cx_ctx *cx, FILE *report, int *copied, int *problems)
{
    struct cx_s3 *s3 = cx_storage_s3(cx->store);
    struct cx_storage *local = NULL;
    PGresult *r = NULL;
    enum cx_err rc;

    *copied = *problems = 0;
    if (!s3)
        return CX_ERR_INVALID;
    rc = cx_storage_new_local(cx->cfg->storage_dir, &local);
    if (rc == CX_OK)
        rc = cx_db_exec(cx->db, &q_all_versions, NULL, &r);
    for (int i = 0; rc == CX_OK && i < PQntuples(r); i++) {
        const char *key = PQgetvalue(r, i, 2), *why;
        uint64_t want = strtoull(PQgetvalue(r, i, 3), NULL, 10), have = 0;
        enum cx_err h = cx_s3_head(s3, key, &have);

        if (h == CX_OK && have == want)
            continue; /* there already (a migration that stopped) */
        if (h != CX_OK && h != CX_ERR_NOT_FOUND) {
            rc = h; /* the store is failing: stop, run it again later */
            break;
        }
        why = migrate_one(cx, local, key, want, PQgetvalue(r, i, 4));
        if (why) {
            fprintf(report, "%s: artifact %s version %s\n", why, PQgetvalue(r, i, 0),
                    PQgetvalue(r, i, 1));
            (*problems)++;
        } else {
            (*copied)++;
        }
    }
    PQclear(r);
    cx_storage_free(local);
    return rc;
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
