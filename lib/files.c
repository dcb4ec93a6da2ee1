#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "capture.h"
#include "digest.h"
#include "files.h"
#include "gateway.h"
#include "http.h"
#include "kernel.h"
#include "mime.h"
#include "session.h"
#include "util.h"

extern const char cx_files_helper_py[];

#define FILES_MIME   "application/vnd.codexec.file+json"
#define FILES_CHUNK  (4u << 20) /* one write message's buffer */
#define READ_CHUNK   (1u << 20) /* one read message's buffer */
#define FILES_WINDOW 4          /* write chunks in flight */
#define READ_WINDOW  (8u << 20) /* bytes asked of the kernel at once */
#define READ_MIN_BPS (1u << 20) /* the slowest a read may go, after its first window's wait */
#define LIST_MAX     10000      /* entries of one listing */
#define LIST_BYTES   (8u << 20) /* about the listing's JSON, under the message cap */
#define OP_WAIT_US   (120LL * 1000000) /* one window's wait */

/* Compiles the helper once per kernel process (kept in sys under its
 * source's SHA-256), then runs it on the request's metadata. */
static const char files_cell[] =
    "(lambda s, ip: (s._codexec_files if getattr(s, '_codexec_files_v', None) =="
    " ip.kernel.get_parent('shell')['metadata']['codexec_file']['version'] else"
    " (lambda m, d: (exec(m['src'], d), setattr(s, '_codexec_files', d['run']),"
    " setattr(s, '_codexec_files_v', m['version']), d['run'])[3])("
    "ip.kernel.get_parent('shell')['metadata']['codexec_file'], {'__name__': '__codexec__'}))(ip))"
    "(__import__('sys'), __import__('IPython').get_ipython())\n";

static struct cx_sha256_kept helper_sha = CX_SHA256_KEPT_INIT;

/* --- Paths ---------------------------------------------------------------- */

static enum cx_err
bad_path(char *msg, size_t msglen, const char *why)
{
    snprintf(msg, msglen, "invalid path: %s", why);
    return CX_ERR_INVALID_PATH;
}

/* Each segment: not empty, not "." or "..", at most 255 bytes, not the
 * helper's own upload names. */
static enum cx_err
check_segments(const char *p, size_t n, char *msg, size_t msglen)
{
    const char *seg = p;

    for (const char *q = p;; q++) {
        if (q == p + n || *q == '/') {
            size_t len = (size_t)(q - seg);
            if (len == 0)
                return bad_path(msg, msglen, "empty segment (a leading, trailing or double /)");
            if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
                return bad_path(msg, msglen, "a . or .. segment");
            if (len > CX_FILE_SEGMENT_MAX)
                return bad_path(msg, msglen, "a segment longer than 255 bytes");
            if (len >= 12 && !memcmp(seg, ".codexec-up-", 12))
                return bad_path(msg, msglen, "the name is reserved");
            if (q == p + n)
                return CX_OK;
            seg = q + 1;
        }
    }
}

enum cx_err
cx_files_path(const char *raw, bool encoded, bool empty_ok, char out[CX_FILE_PATH_MAX + 1],
              char *msg, size_t msglen)
{
    size_t n = 0;
    json_t *utf8;

    for (const char *p = raw; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '%' && encoded) {
            int hi = cx_hex_digit(p[1]), lo = hi < 0 ? -1 : cx_hex_digit(p[2]);
            if (lo < 0)
                return bad_path(msg, msglen, "a malformed %-escape");
            c = hi * 16 + lo;
            p += 2;
        }
        if (c < 0x20 || c == 0x7f)
            return bad_path(msg, msglen, "a NUL or control character");
        if (n >= CX_FILE_PATH_MAX)
            return bad_path(msg, msglen, "longer than 4096 bytes");
        out[n++] = (char)c;
    }
    out[n] = '\0';
    if (n == 0)
        return empty_ok ? CX_OK : bad_path(msg, msglen, "empty");
    utf8 = json_stringn(out, n);
    if (!utf8)
        return bad_path(msg, msglen, "not UTF-8");
    json_decref(utf8);
    return check_segments(out, n, msg, msglen);
}

/* --- An operation: the conversation's lock and a connection ---------------- */

struct fileop {
    struct cx_ctx *cx;
    struct cx_session s;
    struct cx_kernel_conn *conn;
    bool broken; /* the connection is not to be pooled */
    /* what the kernel answered for the request being waited for */
    json_t *answer;
    enum cx_err rc;
    /* a read's: the file's header ({"op": "file"}), its bytes */
    json_t *file;
    json_t *list; /* a listing's entries, as the pages come */
    size_t list_bytes;
    bool (*data)(void *ctx, const void *data, size_t len);
    void *data_ctx;
};

static enum cx_err
connect_kernel(struct fileop *o, char *msg, size_t msglen)
{
    const char *url = cx_gateway_url(o->s.gw), *token = cx_gateway_token(o->s.gw);
    enum cx_err rc = cx_kernel_conn_get(url, token, o->s.kernel_id, &o->conn, msg, msglen);

    if (rc == CX_OK) {
        rc = cx_session_confirm(&o->s, o->conn, cx_now_us() + OP_WAIT_US);
        if (rc == CX_ERR_NOT_FOUND) {
            cx_kernel_conn_free(o->conn); /* pooled before its kernel was deleted */
            o->conn = NULL;
        }
    }
    if (rc == CX_ERR_NOT_FOUND) {
        /* the gateway forgot it: a new kernel, an empty workspace */
        rc = cx_session_replace_kernel(o->cx, &o->s, msg, msglen);
        if (rc == CX_OK)
            rc = cx_kernel_conn_get(url, token, o->s.kernel_id, &o->conn, msg, msglen);
        if (rc == CX_OK)
            rc = cx_session_confirm(&o->s, o->conn, cx_now_us() + OP_WAIT_US);
    }
    if (rc && rc != CX_ERR_CAPACITY && rc != CX_ERR_NOMEM) {
        snprintf(msg, msglen, "the conversation's kernel can't be reached");
        rc = CX_ERR_GATEWAY;
    }
    return rc;
}

static enum cx_err
op_begin(struct fileop *o, struct cx_ctx *cx, const char *user, const char *cid, bool create,
         char *msg, size_t msglen)
{
    enum cx_err rc;

    memset(o, 0, sizeof(*o));
    o->cx = cx;
    if (!cx_conversation_id_valid(cid)) {
        snprintf(msg, msglen, "%s", CX_CONVERSATION_RULE);
        return CX_ERR_INVALID;
    }
    rc = create ? cx_session_acquire(cx, user, cid, cx->cfg->default_ttl, CX_LANG_ANY, &o->s, msg,
                                     msglen)
                : cx_session_attach(cx, user, cid, cx->cfg->default_ttl, CX_LANG_ANY, &o->s, msg,
                                    msglen);
    if (rc)
        return rc;
    rc = connect_kernel(o, msg, msglen);
    if (rc)
        cx_session_release(cx, &o->s);
    return rc;
}

static void
op_end(struct fileop *o)
{
    if (o->conn && (o->broken || cx_kernel_drain(o->conn, 0) != CX_DRAIN_QUIET))
        cx_kernel_conn_free(o->conn);
    else if (o->conn)
        cx_kernel_conn_put(o->conn);
    o->conn = NULL;
    json_decref(o->answer);
    json_decref(o->file);
    o->answer = o->file = NULL;
    cx_session_release(o->cx, &o->s);
}

/* The request's metadata: params with the helper's source and version, and
 * the capture's record (its file: lib/capture.c). */
static json_t *
op_meta(struct fileop *o, json_t *params)
{
    const char *sha = cx_sha256_kept(&helper_sha, cx_files_helper_py);
    json_t *m = params ? json_pack("{s:O}", "codexec_file", params) : NULL;
    json_t *state = json_string(cx_capture_state_path(o->s.kernel_id));

    if (!m || !sha || !state || json_object_set_new(params, "state", state) ||
        json_object_set_new(params, "version", json_string(sha)) ||
        json_object_set_new(params, "src", json_string(cx_files_helper_py))) {
        json_decref(m);
        m = NULL;
    }
    json_decref(params);
    return m;
}

static enum cx_err
op_send(struct fileop *o, struct cx_exec *e, json_t *params, const void *buf, size_t len)
{
    json_t *meta = op_meta(o, params);
    enum cx_err rc;

    *e = (struct cx_exec){.code = files_cell,
                          .role = CX_EXEC_OWN,
                          .silent = true,
                          .stop_on_error = true,
                          .metadata = meta,
                          .buffer = buf ? buf : "",
                          .buffer_len = len};
    if (!buf)
        e->buffer = NULL;
    rc = meta ? cx_kernel_execute(o->conn, e) : CX_ERR_NOMEM;
    e->metadata = NULL;
    json_decref(meta);
    if (rc)
        o->broken = true;
    return rc;
}

/* One entry of the kernel's listing, rebuilt from its checked fields. */
static json_t *
list_entry(const json_t *e)
{
    const char *path = json_string_value(json_object_get(e, "path"));
    const char *type = json_string_value(json_object_get(e, "type"));
    const char *mtime = json_string_value(json_object_get(e, "mtime"));
    json_t *size = json_object_get(e, "size");

    if (!path || strlen(path) > CX_FILE_PATH_MAX || !type ||
        (strcmp(type, "file") != 0 && strcmp(type, "dir") != 0) || !mtime || strlen(mtime) > 32 ||
        !json_is_integer(size) || json_integer_value(size) < 0)
        return NULL;
    return json_pack("{s:s,s:s,s:I,s:s}", "path", path, "type", type, "size",
                     json_integer_value(size), "mtime", mtime);
}

/* A page of the listing into list: each entry checked (its path held to
 * the rules of a path), at most LIST_MAX entries and about LIST_BYTES of
 * paths in all (*bytes: so far), whatever the kernel says. */
static enum cx_err
list_page(json_t *list, const json_t *files, size_t *bytes)
{
    char path[CX_FILE_PATH_MAX + 1], msg[CX_MSG_MAX];

    if (!json_is_array(files) || json_array_size(list) + json_array_size(files) > LIST_MAX)
        return CX_ERR_PROTOCOL;
    for (size_t i = 0; i < json_array_size(files); i++) {
        json_t *e = list_entry(json_array_get(files, i));
        const char *p = json_string_value(json_object_get(e, "path"));

        if (!e || cx_files_path(p, false, false, path, msg, sizeof(msg)) ||
            (*bytes += strlen(p) + 96) > LIST_BYTES) {
            json_decref(e);
            return CX_ERR_PROTOCOL;
        }
        if (json_array_append_new(list, e))
            return CX_ERR_NOMEM;
    }
    return CX_OK;
}

/* The helper's answers: {"ok": ...} or {"error": code}; a read's chunks. */
static enum cx_err
on_message(void *ctx, int index, const char *type, json_t *content,
           const struct cx_kernel_buffers *bufs)
{
    struct fileop *o = ctx;
    json_t *a;

    (void)index;
    if (strcmp(type, "display_data") != 0) {
        if (!strcmp(type, "error") || !strcmp(type, "oversized"))
            o->rc = o->rc ? o->rc : CX_ERR_PROTOCOL;
        return CX_OK;
    }
    a = json_object_get(json_object_get(content, "data"), FILES_MIME);
    if (!json_is_object(a))
        return CX_OK; /* the user's own display: not ours */
    if (json_is_string(json_object_get(a, "op")) &&
        !strcmp(json_string_value(json_object_get(a, "op")), "chunk")) {
        if (!o->data || bufs->n != 1) {
            o->rc = o->rc ? o->rc : CX_ERR_PROTOCOL;
            return CX_OK;
        }
        if (!o->data(o->data_ctx, bufs->data[0], bufs->len[0]))
            return CX_DONE;
        return CX_OK;
    }
    if (o->list && json_is_string(json_object_get(a, "op")) &&
        !strcmp(json_string_value(json_object_get(a, "op")), "page")) {
        if (list_page(o->list, json_object_get(a, "files"), &o->list_bytes))
            o->rc = o->rc ? o->rc : CX_ERR_PROTOCOL;
        return CX_OK;
    }
    if (json_is_string(json_object_get(a, "op")) &&
        !strcmp(json_string_value(json_object_get(a, "op")), "file")) {
        json_decref(o->file);
        o->file = json_incref(a);
        return CX_OK;
    }
    if (json_object_get(o->answer, "error"))
        return CX_OK; /* the first error of a window is the one to tell */
    json_decref(o->answer);
    o->answer = json_incref(a);
    return CX_OK;
}

/* Waits for the first need of reqs[0..n) to end (the others' messages
 * are taken on the way); CX_OK with o->answer the last one's. */
static enum cx_err
op_wait_some(struct fileop *o, struct cx_exec *reqs, int n, int need)
{
    enum cx_err rc;

    o->rc = CX_OK;
    json_decref(o->answer);
    o->answer = NULL;
    rc = cx_kernel_wait(o->conn, reqs, n, need, cx_now_us() + OP_WAIT_US, on_message, o);
    for (int i = 0; rc == CX_OK && i < need; i++) {
        const char *st = json_string_value(json_object_get(reqs[i].reply, "status"));
        if (!st || strcmp(st, "ok") != 0)
            rc = CX_ERR_PROTOCOL;
    }
    if (rc == CX_OK)
        rc = o->rc;
    if (rc)
        o->broken = true;
    return rc;
}

static enum cx_err
op_wait(struct fileop *o, struct cx_exec *reqs, int n)
{
    return op_wait_some(o, reqs, n, n);
}

/* The helper's {"error": code} as an error; CX_OK for {"ok": true}. */
static enum cx_err
answer_err(const json_t *a, char *msg, size_t msglen)
{
    const char *code = json_string_value(json_object_get(a, "error"));
    static const struct {
        const char *code;
        enum cx_err err;
        const char *say;
    } map[] = {
        {"not_found", CX_ERR_NOT_FOUND, "no such file in the workspace"},
        {"not_a_file", CX_ERR_NOT_A_FILE,
         "the path goes through a symlink or names no regular file"},
        {"no_space", CX_ERR_TOO_LARGE, "the workspace has no room for it (max_workspace_bytes)"},
        {"changed", CX_ERR_CONFLICT, "the file changed while it was being read or written"},
    };

    if (json_is_true(json_object_get(a, "ok")))
        return CX_OK;
    for (size_t i = 0; code && i < sizeof(map) / sizeof(map[0]); i++) {
        if (!strcmp(code, map[i].code)) {
            const char *m = json_string_value(json_object_get(a, "message"));
            /* the helper's sentence names the path, which the caller sent */
            snprintf(msg, msglen, "%s", map[i].err == CX_ERR_NOT_A_FILE && m ? m : map[i].say);
            return map[i].err;
        }
    }
    snprintf(msg, msglen, "the workspace operation failed in the kernel");
    return CX_ERR_GATEWAY;
}

/* One request, waited for; its answer's error. */
static enum cx_err
op_call(struct fileop *o, json_t *params, json_t **answer, char *msg, size_t msglen)
{
    struct cx_exec e;
    enum cx_err rc = op_send(o, &e, params, NULL, 0);

    if (rc == CX_OK)
        rc = op_wait(o, &e, 1);
    cx_exec_cleanup(&e, 1);
    if (rc) {
        snprintf(msg, msglen, "the conversation's kernel did not answer");
        return rc == CX_ERR_NOMEM ? rc : CX_ERR_GATEWAY;
    }
    if (!o->answer) {
        snprintf(msg, msglen, "the conversation's kernel did not answer");
        return CX_ERR_GATEWAY;
    }
    rc = answer_err(o->answer, msg, msglen);
    if (rc == CX_OK && answer)
        *answer = json_incref(o->answer);
    return rc;
}

/* --- Writing --------------------------------------------------------------- */

struct writing {
    struct fileop *o;
    const char *path;
    char tmp[33];
    struct cx_sha256 sha;
    uint64_t total, sent, taken; /* the body's size; bytes sent on; bytes read */
    bool short_body;
    char hex[65]; /* the SHA-256 of what was sent, once all was */
    unsigned char *buf;
    struct cx_exec reqs[FILES_WINDOW];
    int n;
};

/* Sends buf[0..len) as the next chunk; waits for the window when full. */
static enum cx_err
write_chunk(struct writing *w, size_t len, const char *sha_hex, char *msg, size_t msglen)
{
    bool last = w->sent + len == w->total;
    json_t *p =
        json_pack("{s:s,s:s,s:s,s:b,s:b,s:I}", "op", "write", "path", w->path, "tmp", w->tmp,
                  "first", w->sent == 0, "last", last, "size", (json_int_t)w->total);
    enum cx_err rc;

    if (p && last)
        json_object_set_new(p, "sha256", json_string(sha_hex));
    rc = op_send(w->o, &w->reqs[w->n], p, w->buf, len);
    if (rc == CX_OK)
        w->n++;
    w->sent += len;
    if (rc == CX_OK && (w->n == FILES_WINDOW || last)) {
        /* a sliding window: the older half waited for while the newer
         * half is written, so the kernel never idles while the next body
         * bytes are read (the last: all of them) */
        int need = last ? w->n : FILES_WINDOW / 2;
        rc = op_wait_some(w->o, w->reqs, w->n, need);
        cx_exec_cleanup(w->reqs, need);
        memmove(w->reqs, w->reqs + need, (size_t)(w->n - need) * sizeof(w->reqs[0]));
        w->n -= need;
        if (rc == CX_OK && w->o->answer)
            rc = answer_err(w->o->answer, msg, msglen);
        else if (rc)
            snprintf(msg, msglen, "the conversation's kernel did not answer");
    }
    return rc;
}

/* The rest of a body that will not be written (the kernel refused it):
 * read and dropped, so the client that is still sending gets the answer. */
static void
drain_body(struct writing *w, cx_http_read_fn read_fn, void *rctx)
{
    while (!w->short_body && w->taken < w->total) {
        uint64_t left = w->total - w->taken;
        ssize_t n = read_fn(rctx, w->buf, left < FILES_CHUNK ? (size_t)left : FILES_CHUNK);
        if (n <= 0)
            break;
        w->taken += (uint64_t)n;
    }
}

static enum cx_err
write_stream(struct writing *w, cx_http_read_fn read_fn, void *rctx, char *msg, size_t msglen)
{
    enum cx_err rc = CX_OK;

    do {
        size_t len = 0;
        unsigned char d[CX_SHA256_BYTES];

        while (len < FILES_CHUNK && w->sent + len < w->total) {
            uint64_t left = w->total - w->sent - len;
            size_t want = FILES_CHUNK - len < left ? FILES_CHUNK - len : (size_t)left;
            ssize_t n = read_fn(rctx, w->buf + len, want);
            if (n <= 0) {
                w->short_body = true;
                snprintf(msg, msglen, "the request body ended early");
                return CX_ERR_INVALID;
            }
            w->taken += (uint64_t)n;
            cx_sha256_update(&w->sha, w->buf + len, (size_t)n);
            len += (size_t)n;
        }
        if (w->sent + len == w->total) {
            if (cx_sha256_final(&w->sha, d))
                return CX_ERR_NOMEM;
            sodium_bin2hex(w->hex, sizeof(w->hex), d, sizeof(d));
        }
        rc = write_chunk(w, len, w->hex, msg, msglen);
    } while (rc == CX_OK && w->sent < w->total);
    return rc;
}

enum cx_err
cx_files_write(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
               const char *content_length, cx_http_read_fn read_fn, void *rctx, json_t **out,
               char *msg, size_t msglen)
{
    struct fileop o;
    struct writing w = {.o = &o, .path = path};
    enum cx_err rc;

    *out = NULL;
    if (!content_length || cx_http_content_length(content_length, &w.total)) {
        snprintf(msg, msglen, "Content-Length is required");
        return CX_ERR_INVALID;
    }
    if (w.total > cx->cfg->max_artifact_bytes) {
        snprintf(msg, msglen, "the file exceeds max_artifact_bytes (%llu)",
                 (unsigned long long)cx->cfg->max_artifact_bytes);
        return CX_ERR_TOO_LARGE;
    }
    w.buf = malloc(FILES_CHUNK);
    if (!w.buf || cx_sha256_init(&w.sha)) {
        free(w.buf);
        return CX_ERR_NOMEM;
    }
    cx_random_id(w.tmp);
    rc = op_begin(&o, cx, user, cid, true, msg, msglen);
    if (rc == CX_OK) {
        rc = write_stream(&w, read_fn, rctx, msg, msglen);
        if (w.n) {
            (void)op_wait(&o, w.reqs, w.n);
            cx_exec_cleanup(w.reqs, w.n);
        }
        if (rc && !o.broken) {
            /* what the failed write left: its temporary file */
            json_t *p = json_pack("{s:s,s:s,s:s}", "op", "abort", "path", path, "tmp", w.tmp);
            char m2[CX_MSG_MAX];
            (void)op_call(&o, p, NULL, m2, sizeof(m2));
        }
        op_end(&o);
    }
    if (rc)
        drain_body(&w, read_fn, rctx);
    if (rc == CX_OK) {
        *out =
            json_pack("{s:s,s:I,s:s}", "path", path, "size", (json_int_t)w.total, "sha256", w.hex);
        rc = *out ? CX_OK : CX_ERR_NOMEM;
    }
    cx_sha256_cleanup(&w.sha);
    free(w.buf);
    return rc;
}

/* --- Reading --------------------------------------------------------------- */

struct reading {
    struct fileop *o;
    const struct cx_files_reader *rd;
    const char *path;
    uint64_t size, off, window_got;
    int64_t client_us; /* spent handing bytes to the client, not waiting for the kernel */
    char sha256[65];
    bool headed, stopped, failed;
};

/* The header the kernel sent first: size and SHA-256 of a regular file. */
static bool
take_header(struct reading *g)
{
    json_t *f = g->o->file;
    json_t *size = json_object_get(f, "size");
    const char *sha = json_string_value(json_object_get(f, "sha256"));

    if (!json_is_integer(size) || json_integer_value(size) < 0 || !sha || strlen(sha) != 64 ||
        strspn(sha, "0123456789abcdef") != 64)
        return false;
    g->size = (uint64_t)json_integer_value(size);
    snprintf(g->sha256, sizeof(g->sha256), "%s", sha);
    return true;
}

static bool
send_head(struct reading *g, const void *first, size_t len)
{
    char mime[128];
    const char *base = strrchr(g->path, '/');

    g->headed = true;
    if (cx_mime_detect(first, len < 65536 ? len : 65536, base ? base + 1 : g->path, mime,
                       sizeof(mime)))
        snprintf(mime, sizeof(mime), "application/octet-stream");
    if (!g->rd->head(g->rd->ctx, g->size, g->sha256, mime)) {
        g->stopped = true;
        return false;
    }
    return true;
}

static bool
on_read_bytes(void *ctx, const void *data, size_t len)
{
    struct reading *g = ctx;

    if (!g->headed && (!g->o->file || !take_header(g))) {
        g->failed = true;
        return false;
    }
    if (len > g->size - g->off - g->window_got) {
        g->failed = true; /* more than the file holds: not this file */
        return false;
    }
    if (!g->headed && !send_head(g, data, len))
        return false;
    g->window_got += len;
    if (g->rd->body) {
        int64_t t = cx_now_us();
        bool ok = g->rd->data(g->rd->ctx, data, len);
        g->client_us += cx_now_us() - t;
        if (!ok) {
            g->stopped = true;
            return false;
        }
    }
    return true;
}

/* One window from g->off; the first also brings the header. */
static enum cx_err
read_window(struct reading *g, bool first, json_t *expect, char *msg, size_t msglen)
{
    uint64_t count = g->rd->body ? READ_WINDOW : 65536;
    json_t *p = json_pack("{s:s,s:s,s:b,s:I,s:I,s:I}", "op", "read", "path", g->path, "first",
                          first, "offset", (json_int_t)g->off, "count", (json_int_t)count, "chunk",
                          (json_int_t)READ_CHUNK);
    enum cx_err rc;

    if (p && expect)
        json_object_set(p, "expect", expect);
    g->window_got = 0;
    rc = op_call(g->o, p, NULL, msg, msglen);
    if (g->stopped)
        return CX_DONE;
    if (g->failed) {
        g->o->broken = true;
        snprintf(msg, msglen, "the kernel sent something else than the file");
        return CX_ERR_PROTOCOL;
    }
    if (rc == CX_OK && first && !g->headed && (!g->o->file || !take_header(g))) {
        snprintf(msg, msglen, "the kernel sent no file header");
        return CX_ERR_PROTOCOL;
    }
    if (rc == CX_OK) {
        uint64_t want = g->size - g->off < count ? g->size - g->off : count;
        if (g->window_got != want) {
            snprintf(msg, msglen, "the file changed while it was read");
            return CX_ERR_CONFLICT;
        }
        g->off += want;
    }
    return rc;
}

enum cx_err
cx_files_read(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
              const struct cx_files_reader *rd, char *msg, size_t msglen)
{
    struct fileop o;
    struct reading g = {.o = &o, .rd = rd, .path = path};
    int64_t t0 = cx_now_us();
    enum cx_err rc = op_begin(&o, cx, user, cid, false, msg, msglen);

    if (rc) {
        if (rc == CX_ERR_NOT_FOUND)
            snprintf(msg, msglen,
                     "no such file in the workspace (the conversation has no session)");
        return rc;
    }
    o.data = on_read_bytes;
    o.data_ctx = &g;
    rc = read_window(&g, true, NULL, msg, msglen);
    if (rc == CX_OK && !g.headed && !send_head(&g, "", 0))
        rc = CX_DONE;
    while (rc == CX_OK && rd->body && g.off < g.size) {
        json_t *expect;
        /* a kernel that trickles a file (whatever size it claims) never
         * holds the run thread for longer than what it sent could take at
         * 1 MiB/s, the time a slow client took not counted */
        if (cx_now_us() - t0 - g.client_us >
            OP_WAIT_US + (int64_t)(g.off / READ_MIN_BPS) * 1000000) {
            snprintf(msg, msglen, "the kernel sent the file too slowly");
            o.broken = true;
            rc = CX_ERR_TIMEOUT;
            break;
        }
        expect = json_incref(json_object_get(o.file, "expect"));
        rc = read_window(&g, false, expect, msg, msglen);
        json_decref(expect);
    }
    if (rc == CX_DONE || (!rd->body && rc == CX_OK)) {
        /* stopped early: what the kernel still sends is not read */
        o.broken = o.broken || (rd->body && g.off < g.size);
        rc = CX_OK;
    }
    op_end(&o);
    return rc;
}

/* --- Listing and deleting -------------------------------------------------- */

enum cx_err
cx_files_list(struct cx_ctx *cx, const char *user, const char *cid, const char *dir, bool recursive,
              json_t **out, char *msg, size_t msglen)
{
    struct fileop o;
    json_t *a = NULL;
    enum cx_err rc = op_begin(&o, cx, user, cid, false, msg, msglen);

    *out = NULL;
    if (rc)
        return rc;
    o.list = json_array();
    rc = o.list ? op_call(&o,
                          json_pack("{s:s,s:s,s:b,s:i,s:i}", "op", "list", "path", dir, "recursive",
                                    recursive, "max", LIST_MAX, "max_bytes", (int)LIST_BYTES),
                          &a, msg, msglen)
                : CX_ERR_NOMEM;
    if (rc == CX_OK)
        *out = json_pack("{s:O,s:b}", "files", o.list, "truncated",
                         json_is_true(json_object_get(a, "truncated")));
    if (rc == CX_OK && !*out)
        rc = CX_ERR_NOMEM;
    json_decref(o.list);
    json_decref(a);
    op_end(&o);
    return rc;
}

enum cx_err
cx_files_delete(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
                bool recursive, char *msg, size_t msglen)
{
    struct fileop o;
    enum cx_err rc = op_begin(&o, cx, user, cid, false, msg, msglen);

    if (rc)
        return rc;
    rc = op_call(&o,
                 json_pack("{s:s,s:s,s:b}", "op", "delete", "path", path, "recursive", recursive),
                 NULL, msg, msglen);
    op_end(&o);
    return rc;
}
