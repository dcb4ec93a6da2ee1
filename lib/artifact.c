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
#include "storage.h"
#include "util.h"

#define ARTIFACT_COLS                                                                              \
    "a.id, a.path, a.kind, a.current_version, v.filename, v.mime_type, v.size, "                   \
    "v.sha256, " CX_SQL_UTC("a.created_at") ", " CX_SQL_UTC("a.updated_at") ", v.storage_key"

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
       "SELECT version, filename, mime_type, size, sha256, produced_by::text, " CX_SQL_UTC(
           "created_at") " FROM artifact_versions WHERE artifact_id = $1::uuid ORDER BY version");

static json_t *
artifact_json(PGresult *r, int i)
{
    char url[CX_CONTENT_URL_MAX];

    cx_artifact_content_url(PQgetvalue(r, i, 0), (int)strtol(PQgetvalue(r, i, 3), NULL, 10), url);
    return json_pack("{s:s,s:s,s:s,s:I,s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "artifact_id",
                     PQgetvalue(r, i, 0), "path", PQgetvalue(r, i, 1), "kind", PQgetvalue(r, i, 2),
                     "current_version", (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10),
                     "filename", PQgetvalue(r, i, 4), "mime_type", PQgetvalue(r, i, 5), "size",
                     (json_int_t)strtoll(PQgetvalue(r, i, 6), NULL, 10), "sha256",
                     PQgetvalue(r, i, 7), "created_at", PQgetvalue(r, i, 8), "updated_at",
                     PQgetvalue(r, i, 9), "download_url", url);
}

/* The listing; with keys, each artifact also has its current version's
 * "storage_key" (for the server's own use, never an answer). */
static enum cx_err
list(struct cx_ctx *cx, const char *user, const char *cid, bool keys, json_t **out)
{
    const char *p[2] = {user, cid};
    PGresult *r = NULL;
    json_t *arr;
    enum cx_err rc;

    *out = NULL;
    if (!cx_conversation_id_valid(cid))
        return CX_ERR_INVALID;
    rc = cx_db_exec(cx->db, &q_list, p, &r);
    if (rc)
        return rc;
    arr = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *a = artifact_json(r, i);
        if (keys)
            json_object_set_new(a, "storage_key", json_string(PQgetvalue(r, i, 10)));
        json_array_append_new(arr, a);
    }
    PQclear(r);
    *out = json_pack("{s:s,s:o}", "conversation_id", cid, "artifacts", arr);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

enum cx_err
cx_artifact_list(struct cx_ctx *cx, const char *user, const char *cid, json_t **out)
{
    return list(cx, user, cid, false, out);
}

enum cx_err
cx_artifact_list_with_keys(struct cx_ctx *cx, const char *user, const char *cid, json_t **out)
{
    return list(cx, user, cid, true, out);
}

enum cx_err
cx_artifact_get(struct cx_ctx *cx, const char *user, const char *id, json_t **out)
{
    const char *p[2] = {id, user};
    PGresult *r = NULL, *v = NULL;
    json_t *a, *versions;
    enum cx_err rc;

    rc = cx_uuid_valid(id) ? cx_db_exec_row(cx->db, &q_get, p, &r) : CX_ERR_NOT_FOUND;
    if (rc)
        return rc;
    a = artifact_json(r, 0);
    json_object_set_new(a, "conversation_id", json_string(PQgetvalue(r, 0, 11)));
    PQclear(r);
    rc = cx_db_exec(cx->db, &q_versions, p, &v);
    if (rc) {
        json_decref(a);
        return rc;
    }
    versions = json_array();
    for (int i = 0; i < PQntuples(v); i++) {
        char url[CX_CONTENT_URL_MAX];
        cx_artifact_content_url(id, (int)strtol(PQgetvalue(v, i, 0), NULL, 10), url);
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

    rc = cx_uuid_valid(id) ? cx_db_begin(cx->db) : CX_ERR_NOT_FOUND;
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
            if (cx_storage_remove(cx->store, PQgetvalue(r, i, 0)))
                cx_log_warn(0, "could not remove a deleted version of %s; fsck will", id);
    PQclear(r);
    return rc;
}

CX_SQL(q_by_path, 3,
       "SELECT " ARTIFACT_COLS " FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.user_id = $1 AND a.conversation_id = $2 AND a.path = $3 AND a.deleted_at IS NULL");

enum cx_err
cx_artifact_current(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
                    json_t **out)
{
    const char *p[3] = {user, cid, path};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_by_path, p, &r);

    *out = NULL;
    if (rc == CX_OK && PQntuples(r) != 1)
        rc = CX_ERR_NOT_FOUND;
    if (rc == CX_OK) {
        *out = artifact_json(r, 0);
        json_object_set_new(*out, "version", json_integer(strtoll(PQgetvalue(r, 0, 3), NULL, 10)));
    }
    PQclear(r);
    return rc == CX_OK && !*out ? CX_ERR_NOMEM : rc;
}

void
cx_artifact_content_url(const char *id, int version, char out[CX_CONTENT_URL_MAX])
{
    snprintf(out, CX_CONTENT_URL_MAX, "/v1/artifacts/%s/content?version=%d", id, version);
}
