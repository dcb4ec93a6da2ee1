/* POST /v1/artifacts: a body streamed into storage, then stored like a
 * captured file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "artifact.h"
#include "capture.h"
#include "config.h"
#include "http.h"
#include "mime.h"
#include "storage.h"
#include "util.h"

#define UPLOAD_READ 65536

struct upload {
    const struct cx_config *cfg;
    struct cx_storage *store;
    struct cx_storage_writer *w;
    char filename[1024];
    char cid[CX_CONVERSATION_MAX + 2];
    unsigned char head[65536];
    size_t head_len;
    enum { PART_NONE, PART_FILE, PART_CID, PART_OTHER } part;
    size_t field_len;
    bool have_file;
    enum cx_err why; /* the cause of a callback failure */
    struct cx_multipart *mp;
    uint64_t total;
    char buf[UPLOAD_READ];
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
        return cx_storage_writer_new(u->store, &u->w);
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

/* Raw (query names conversation and file) or multipart/form-data. */
static enum cx_err
upload_open(struct upload *u, const char *query, const char *ctype, const char *content_length,
            char *msg, size_t msglen)
{
    char boundary[80];

    if (!content_length || cx_http_content_length(content_length, &u->total)) {
        snprintf(msg, msglen, "Content-Length is required");
        return CX_ERR_INVALID;
    }
    if (u->total > u->cfg->max_body_bytes) {
        snprintf(msg, msglen, "the request body exceeds %llu bytes",
                 (unsigned long long)u->cfg->max_body_bytes);
        return CX_ERR_TOO_LARGE;
    }
    if (cx_http_multipart_boundary(ctype, boundary, sizeof(boundary)) == CX_OK) {
        static const struct cx_multipart_cb cb = {mp_begin, mp_data, mp_end};
        return cx_http_multipart_new(boundary, &cb, u, &u->mp);
    }
    if (ctype && !strncasecmp(ctype, "multipart/", 10)) {
        snprintf(msg, msglen, "multipart bodies must be multipart/form-data with a boundary");
        return CX_ERR_INVALID;
    }
    if (cx_http_query_get(query, "conversation_id", u->cid, sizeof(u->cid)) ||
        cx_http_query_get(query, "filename", u->filename, sizeof(u->filename))) {
        snprintf(msg, msglen, "conversation_id and filename are required in the query");
        return CX_ERR_INVALID;
    }
    u->have_file = true;
    u->part = PART_FILE;
    return cx_storage_writer_new(u->store, &u->w);
}

/* Streams the body: nothing larger than one read is ever held. */
static enum cx_err
upload_stream(struct upload *u, ssize_t (*read_fn)(void *, void *, size_t), void *read_ctx,
              char *msg, size_t msglen)
{
    uint64_t got = 0;
    enum cx_err rc;

    while (got < u->total) {
        size_t want = u->total - got < UPLOAD_READ ? (size_t)(u->total - got) : UPLOAD_READ;
        ssize_t n = read_fn(read_ctx, u->buf, want);
        if (n <= 0) {
            snprintf(msg, msglen, "the request body ended early");
            return CX_ERR_INVALID;
        }
        got += (uint64_t)n;
        rc = u->mp ? cx_http_multipart_feed(u->mp, u->buf, (size_t)n)
                   : file_bytes(u, u->buf, (size_t)n);
        if (rc) {
            rc = u->why ? u->why : rc;
            snprintf(msg, msglen, "%s",
                     rc == CX_ERR_TOO_LARGE ? "the file exceeds max_artifact_bytes"
                                            : "malformed multipart body");
            return rc;
        }
    }
    if (u->mp && cx_http_multipart_finish(u->mp)) {
        snprintf(msg, msglen, "malformed multipart body (no closing boundary)");
        return CX_ERR_INVALID;
    }
    if (!u->have_file || !u->w) {
        snprintf(msg, msglen, "a file part named \"file\" with a filename is required");
        return CX_ERR_INVALID;
    }
    if (!cx_conversation_id_valid(u->cid)) {
        snprintf(msg, msglen, "%s", CX_CONVERSATION_RULE);
        return CX_ERR_INVALID;
    }
    return CX_OK;
}

/* The bytes as an artifact version: a new one, or the current one when
 * they are the same. */
static enum cx_err
upload_store(struct cx_ctx *cx, const char *user, struct upload *u, json_t **out, char *msg,
             size_t msglen)
{
    char safe[256], sha[65], mime[128];
    struct cx_capture *cap = NULL;
    json_t *arr = json_array();
    uint64_t size = 0;
    enum cx_err rc;

    cx_storage_safe_filename(u->filename, strlen(u->filename), safe);
    rc = arr ? cx_storage_writer_finish(u->w, &size, sha) : CX_ERR_NOMEM;
    if (rc == CX_OK && cx_mime_detect(u->head, u->head_len, safe, mime, sizeof(mime)))
        snprintf(mime, sizeof(mime), "application/octet-stream");
    if (rc == CX_OK)
        rc = cx_capture_new(cx->cfg, cx->store, &cap);
    if (rc == CX_OK) {
        cx_capture_add_file(cap, safe, u->w, size, sha, mime);
        u->w = NULL;
        rc = cx_artifact_commit_capture(cx, user, u->cid, NULL, cap, arr);
    }
    if (rc == CX_OK && json_array_size(cx_capture_skipped(cap))) {
        snprintf(msg, msglen, "the user's artifact quota is exhausted");
        rc = CX_ERR_QUOTA;
    }
    if (rc == CX_OK && json_array_size(arr))
        *out = json_incref(json_array_get(arr, 0));
    else if (rc == CX_OK)
        rc = cx_artifact_current(cx, user, u->cid, safe, out);
    cx_capture_free(cap);
    json_decref(arr);
    return rc;
}

enum cx_err
cx_artifact_upload(struct cx_ctx *cx, const char *user, const char *query, const char *ctype,
                   const char *content_length, ssize_t (*read_fn)(void *, void *, size_t),
                   void *read_ctx, json_t **out, char *msg, size_t msglen)
{
    struct upload *u = calloc(1, sizeof(*u));
    enum cx_err rc = u ? CX_OK : CX_ERR_NOMEM;

    *out = NULL;
    if (rc == CX_OK) {
        u->cfg = cx->cfg;
        u->store = cx->store;
        rc = upload_open(u, query, ctype, content_length, msg, msglen);
    }
    if (rc == CX_OK)
        rc = upload_stream(u, read_fn, read_ctx, msg, msglen);
    if (rc == CX_OK)
        rc = upload_store(cx, user, u, out, msg, msglen);
    if (u) {
        cx_storage_writer_abort(u->w);
        cx_http_multipart_free(u->mp);
        free(u);
    }
    return rc;
}
