#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "config.h"
#include "digest.h"
#include "log.h"
#include "metrics.h"
#include "mime.h"
#include "storage.h"
#include "util.h"

#define CHUNK       (1u << 20)
#define MAGIC_BYTES 65536

extern const char cx_capture_helper_py[];

struct cx_capture {
    const struct cx_config *cfg;
    struct cx_storage *store;
    /* the file being received */
    bool receiving;
    long n;
    struct cx_captured cur;
    unsigned char *head; /* the file's first bytes, MAGIC_BYTES, made on first use */
    size_t head_len;
    unsigned char *chunk; /* base64 decode buffer, CHUNK bytes, made on first use */
    /* results */
    struct cx_captured *files;
    size_t nfiles, cap;
    json_t *skipped;
    bool done;
    int outputs;
    char output_path[48]; /* the last rich output's name */
    /* What a run's kernel can make us hold, counted here: a record user
     * code forges in its own cell is as welcome as the helper's, so the
     * caps apply to what arrives, not to what the helper promised. */
    size_t max_files;   /* files and rich outputs: max_captured_files */
    size_t max_skipped; /* then one "too_many_skipped" entry */
    bool skipped_full;
    uint64_t output_bytes; /* rich outputs, within max_output_bytes */
    uint64_t staged;       /* bytes of files held, within user_quota_bytes */
    /* the owner's share of the staging ledger (cx_capture_set_owner) */
    int slot; /* in the ledger, -1 without an owner */
    char user[257];
    cx_capture_left_fn left_fn;
    void *left_ctx;
    bool asked;
    uint64_t left;         /* what the user had left when asked */
    uint64_t reserved;     /* of this capture, in the ledger */
    uint64_t cur_reserved; /* ... of them, the file being received */
};

/* What this process's captures stage for each user, together bounded by
 * what the user has left: eight parallel runs of one user no longer stage
 * eight quotas. One entry per user with a capture (at most one capture per
 * run thread: 1024). */
#define LEDGER_MAX 1024
static struct {
    char user[257];
    unsigned captures;
    uint64_t bytes;
} ledger[LEDGER_MAX];
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;

void
cx_capture_set_owner(struct cx_capture *c, const char *user, cx_capture_left_fn left_fn, void *ctx)
{
    int free_slot = -1;

    if (c->slot >= 0 || strlen(user) >= sizeof(c->user))
        return;
    pthread_mutex_lock(&ledger_lock);
    for (int i = 0; i < LEDGER_MAX && c->slot < 0; i++) {
        if (ledger[i].captures && !strcmp(ledger[i].user, user))
            c->slot = i;
        else if (!ledger[i].captures && free_slot < 0)
            free_slot = i;
    }
    if (c->slot < 0 && free_slot >= 0) {
        c->slot = free_slot;
        snprintf(ledger[free_slot].user, sizeof(ledger[free_slot].user), "%s", user);
        ledger[free_slot].bytes = 0;
    }
    if (c->slot >= 0)
        ledger[c->slot].captures++;
    pthread_mutex_unlock(&ledger_lock);
    snprintf(c->user, sizeof(c->user), "%s", user);
    c->left_fn = left_fn;
    c->left_ctx = ctx;
}

uint64_t
cx_capture_staged_for(const char *user)
{
    uint64_t n = 0;

    pthread_mutex_lock(&ledger_lock);
    for (int i = 0; i < LEDGER_MAX; i++)
        if (ledger[i].captures && !strcmp(ledger[i].user, user))
            n = ledger[i].bytes;
    pthread_mutex_unlock(&ledger_lock);
    return n;
}

/* Room for len more bytes: within the per-run bound, and for an owned
 * capture within what its user has left, less what the user's other
 * captures hold. Taken from the ledger when there is. */
static bool
reserve(struct cx_capture *c, uint64_t held, uint64_t len)
{
    bool ok;

    if (held + len > c->cfg->user_quota_bytes)
        return false; /* no run stages more than a user may keep */
    if (c->slot < 0)
        return true;
    if (!c->asked) {
        c->asked = true;
        if (!c->left_fn || c->left_fn(c->left_ctx, c->user, &c->left))
            c->left = c->cfg->user_quota_bytes;
    }
    pthread_mutex_lock(&ledger_lock);
    ok = ledger[c->slot].bytes + len <= c->left;
    if (ok)
        ledger[c->slot].bytes += len;
    pthread_mutex_unlock(&ledger_lock);
    if (ok)
        c->reserved += len;
    return ok;
}

static void
release(struct cx_capture *c, uint64_t len)
{
    if (c->slot < 0 || !len)
        return;
    pthread_mutex_lock(&ledger_lock);
    ledger[c->slot].bytes -= len;
    pthread_mutex_unlock(&ledger_lock);
    c->reserved -= len;
}

/* Entries of the skipped list beyond max_captured_files: enough for a
 * workspace of thousands of files to be listed whole (nothing is
 * dropped silently), bounded (at most a few MiB) against forged records. */
#define SKIPPED_EXTRA 4096

enum cx_err
cx_capture_new(const struct cx_config *cfg, struct cx_storage *store, struct cx_capture **out)
{
    struct cx_capture *c = calloc(1, sizeof(*c));

    if (!c)
        return CX_ERR_NOMEM;
    c->cfg = cfg;
    c->store = store;
    c->slot = -1;
    c->max_files = cfg->max_captured_files;
    c->max_skipped = cfg->max_captured_files + SKIPPED_EXTRA;
    c->skipped = json_array();
    if (!c->skipped) {
        cx_capture_free(c);
        return CX_ERR_NOMEM;
    }
    *out = c;
    return CX_OK;
}

void
cx_capture_free(struct cx_capture *c)
{
    if (!c)
        return;
    cx_storage_writer_abort(c->cur.w);
    for (size_t i = 0; i < c->nfiles; i++)
        cx_storage_writer_abort(c->files[i].w);
    if (c->slot >= 0) {
        pthread_mutex_lock(&ledger_lock);
        ledger[c->slot].bytes -= c->reserved;
        ledger[c->slot].captures--;
        pthread_mutex_unlock(&ledger_lock);
    }
    free(c->files);
    free(c->head);
    free(c->chunk);
    json_decref(c->skipped);
    free(c);
}

static struct cx_sha256_kept helper_sha = CX_SHA256_KEPT_INIT;

void
cx_capture_on_result(struct cx_capture *c, json_t *done)
{
    const char *op = json_string_value(json_object_get(done, "op"));

    if (json_is_object(done) && op && !strcmp(op, "done"))
        cx_capture_on_message(c, done, NULL, 0);
}

const char *
cx_capture_state_path(const char *kernel_id)
{
    static __thread char state[128];

    /* The sandbox's /run/codexec, beside the workspace in the keeper's
     * tmpfs: it outlives a restart of the kernel, as the files do (the
     * helpers fall back to /tmp/.codexec where it is missing, an
     * unsandboxed kernel's); the kernel id keeps unsandboxed kernels that
     * share a /tmp apart. */
    snprintf(state, sizeof(state), "/run/codexec/%s.json", kernel_id);
    return state;
}

json_t *
cx_capture_metadata(const struct cx_config *cfg, const char *kernel_id, json_t *outputs,
                    bool rescan, bool with_source)
{
    const char *sha = cx_sha256_kept(&helper_sha, cx_capture_helper_py);
    const char *state = cx_capture_state_path(kernel_id);
    json_t *m;

    if (!sha)
        return NULL;
    m = json_pack("{s:{s:s,s:b,s:I,s:I,s:I,s:O?,s:s}}", "codexec_capture", "state", state, "rescan",
                  rescan, "max_files", (json_int_t)cfg->max_captured_files, "max_bytes",
                  (json_int_t)cfg->max_artifact_bytes, "chunk", (json_int_t)CHUNK, "outputs",
                  outputs, "sha256", sha);
    if (m && with_source &&
        json_object_set_new(json_object_get(m, "codexec_capture"), "src",
                            json_string(cx_capture_helper_py))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

void
cx_capture_skip(struct cx_capture *c, const char *path, const char *reason)
{
    if (c->skipped_full)
        return;
    if (json_array_size(c->skipped) >= c->max_skipped) {
        c->skipped_full = true; /* said once, never silently */
        path = "";
        reason = "too_many_skipped";
    }
    json_array_append_new(c->skipped, json_pack("{s:s,s:s}", "path", path, "reason", reason));
}

/* Whether another file or output may be held. */
static bool
room_for_file(const struct cx_capture *c)
{
    return c->nfiles < c->max_files;
}

static void
drop_current(struct cx_capture *c, const char *reason)
{
    if (reason)
        cx_capture_skip(c, c->cur.path, reason);
    cx_storage_writer_abort(c->cur.w);
    memset(&c->cur, 0, sizeof(c->cur));
    c->receiving = false;
    release(c, c->cur_reserved);
    c->cur_reserved = 0;
}

static bool
keep(struct cx_capture *c, const struct cx_captured *f)
{
    if (c->nfiles == c->cap) {
        size_t n = c->cap ? c->cap * 2 : 16;
        struct cx_captured *p = realloc(c->files, n * sizeof(*p));
        if (!p)
            return false;
        c->files = p;
        c->cap = n;
    }
    c->files[c->nfiles++] = *f;
    return true;
}

static bool
path_ok(const char *p)
{
    /* The kernel is not trusted: a relative path without tricks. Control
     * characters may stay (the path is data in JSON and SQL); the storage
     * key and filename are sanitised separately. */
    size_t n = strlen(p);

    if (n == 0 || n >= sizeof(((struct cx_captured *)0)->path) || p[0] == '/' ||
        !cx_utf8_valid(p, n))
        return false;
    return strcmp(p, "..") && strncmp(p, "../", 3) && !strstr(p, "/../") &&
           !(n >= 3 && !strcmp(p + n - 3, "/.."));
}

static void
finish_current(struct cx_capture *c, json_t *msg)
{
    const char *sha = json_string_value(json_object_get(msg, "sha256"));
    json_int_t size = json_integer_value(json_object_get(msg, "size"));
    uint64_t got = 0;
    char mine[65];

    if (json_object_get(msg, "error") || !sha) {
        drop_current(c, "unreadable");
        return;
    }
    if (cx_storage_writer_finish(c->cur.w, &got, mine)) {
        drop_current(c, "storage_error");
        return;
    }
    /* What we stored must be what the kernel says it sent. */
    if ((uint64_t)size != got || strcmp(sha, mine) != 0) {
        cx_log_warn(0, "capture: size or sha256 mismatch (%llu bytes)", (unsigned long long)got);
        drop_current(c, "corrupt_transfer");
        return;
    }
    c->cur.size = got;
    memcpy(c->cur.sha256, mine, sizeof(mine));
    if (cx_mime_detect(c->head, c->head_len, c->cur.path, c->cur.mime, sizeof(c->cur.mime)))
        snprintf(c->cur.mime, sizeof(c->cur.mime), "application/octet-stream");
    if (!keep(c, &c->cur)) {
        drop_current(c, "internal_error");
        return;
    }
    c->staged += got;
    c->cur_reserved = 0; /* held by the kept file now */
    memset(&c->cur, 0, sizeof(c->cur));
    c->receiving = false;
}

static enum cx_err
add_bytes(struct cx_capture *c, const unsigned char *data, size_t len)
{
    if (c->head_len < MAGIC_BYTES) {
        size_t n = len < MAGIC_BYTES - c->head_len ? len : MAGIC_BYTES - c->head_len;
        memcpy(c->head + c->head_len, data, n);
        c->head_len += n;
    }
    return cx_storage_writer_write(c->cur.w, data, len);
}

/* A chunk's bytes: the message's buffer, or its base64 "data" decoded
 * into c->chunk. NULL when it has neither or they don't decode. */
static const unsigned char *
chunk_bytes(struct cx_capture *c, json_t *msg, const void *buf, size_t *len)
{
    const char *b64 = json_string_value(json_object_get(msg, "data"));

    if (!b64)
        return buf;
    if (!c->chunk && !(c->chunk = malloc(CHUNK)))
        return NULL;
    if (sodium_base642bin(c->chunk, CHUNK, b64, strlen(b64), NULL, len, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0)
        return NULL;
    cx_metrics_add(CX_COUNT_CAPTURE_BASE64, *len);
    return c->chunk;
}

/* "file": a file's transfer begins (ending one left incomplete). */
static void
on_file(struct cx_capture *c, json_t *msg, json_int_t n)
{
    const char *path = json_string_value(json_object_get(msg, "path"));

    if (c->receiving)
        drop_current(c, "incomplete_transfer");
    if (!path || !path_ok(path)) {
        if (path && strlen(path) < 1024 && cx_utf8_valid(path, strlen(path)))
            cx_capture_skip(c, path, "invalid_name");
        return;
    }
    if (!room_for_file(c)) {
        cx_capture_skip(c, path, "too_many_files");
        return;
    }
    /* (most runs make no file: no 64 KiB zeroed and freed each run) */
    if (!c->head && !(c->head = malloc(MAGIC_BYTES))) {
        cx_capture_skip(c, path, "internal_error");
        return;
    }
    memset(&c->cur, 0, sizeof(c->cur));
    snprintf(c->cur.path, sizeof(c->cur.path), "%s", path);
    c->n = (long)n;
    c->head_len = 0;
    if (cx_storage_writer_new(c->store, &c->cur.w)) {
        cx_capture_skip(c, path, "storage_error");
        return;
    }
    c->receiving = true;
}

/* "chunk": bytes of the file being received, within its caps. */
static void
on_chunk(struct cx_capture *c, json_t *msg, const void *buf, size_t buflen)
{
    size_t len = buflen;
    const unsigned char *bytes = chunk_bytes(c, msg, buf, &len);

    if (!bytes) {
        drop_current(c, "corrupt_transfer");
        return;
    }
    if (cx_storage_writer_size(c->cur.w) + len > c->cfg->max_artifact_bytes) {
        drop_current(c, "too_large"); /* it grew while being read */
        return;
    }
    if (!reserve(c, c->staged + cx_storage_writer_size(c->cur.w), len)) {
        drop_current(c, "quota_exceeded");
        return;
    }
    c->cur_reserved += c->slot >= 0 ? len : 0;
    if (add_bytes(c, bytes, len))
        drop_current(c, "storage_error");
}

/* "done": the walk is over; what the helper skipped is told. */
static void
on_done(struct cx_capture *c, json_t *msg)
{
    json_t *sk = json_object_get(msg, "skipped"), *e;
    size_t i;

    if (c->receiving)
        drop_current(c, "incomplete_transfer");
    json_array_foreach(sk, i, e)
    {
        const char *p = json_string_value(json_object_get(e, "path"));
        const char *r = json_string_value(json_object_get(e, "reason"));
        if (p && r && path_ok(p) && strlen(r) < 32)
            cx_capture_skip(c, p, r);
    }
    c->done = true;
}

void
cx_capture_on_message(struct cx_capture *c, json_t *msg, const void *buf, size_t buflen)
{
    const char *op = json_string_value(json_object_get(msg, "op"));
    json_int_t n = json_integer_value(json_object_get(msg, "n"));

    if (!op)
        return;
    if (!strcmp(op, "file"))
        on_file(c, msg, n);
    else if (!strcmp(op, "chunk") && c->receiving && n == c->n)
        on_chunk(c, msg, buf, buflen);
    else if (!strcmp(op, "end") && c->receiving && n == c->n)
        finish_current(c, msg);
    else if (!strcmp(op, "done"))
        on_done(c, msg);
}

static const char *
ext_for(const char *mime)
{
    static const char *const exts[][2] = {
        {"image/png", "png"},     {"image/jpeg", "jpg"},      {"image/gif", "gif"},
        {"image/svg+xml", "svg"}, {"application/pdf", "pdf"}, {"text/html", "html"},
    };

    for (size_t i = 0; i < sizeof(exts) / sizeof(exts[0]); i++)
        if (!strcmp(mime, exts[i][0]))
            return exts[i][1];
    return "bin";
}

const char *
cx_capture_add_output(struct cx_capture *c, const char *mime, const void *data, size_t len)
{
    struct cx_captured f;
    uint64_t got;

    if (c->receiving)
        return NULL; /* not between a file's chunks; outputs come from the user's cell */
    memset(&f, 0, sizeof(f));
    c->outputs++;
    snprintf(f.path, sizeof(f.path), "output-%d.%s", c->outputs, ext_for(mime));
    snprintf(c->output_path, sizeof(c->output_path), "output-%d.%s", c->outputs, ext_for(mime));
    if (len > c->cfg->max_artifact_bytes) {
        cx_capture_skip(c, f.path, "too_large");
        return NULL;
    }
    if (!room_for_file(c)) {
        cx_capture_skip(c, f.path, "too_many_files");
        return NULL;
    }
    if (c->output_bytes + len > c->cfg->max_output_bytes) {
        cx_capture_skip(c, f.path, "output_limit");
        return NULL;
    }
    if (!reserve(c, c->staged, len)) {
        cx_capture_skip(c, f.path, "quota_exceeded");
        return NULL;
    }
    c->output_bytes += len;
    c->staged += len;
    if (cx_storage_writer_new(c->store, &f.w) || cx_storage_writer_write(f.w, data, len) ||
        cx_storage_writer_finish(f.w, &got, f.sha256)) {
        cx_storage_writer_abort(f.w);
        cx_capture_skip(c, f.path, "storage_error");
        c->staged -= len;
        release(c, c->slot >= 0 ? len : 0);
        return NULL;
    }
    f.size = got;
    if (cx_mime_detect(data, len < MAGIC_BYTES ? len : MAGIC_BYTES, f.path, f.mime, sizeof(f.mime)))
        snprintf(f.mime, sizeof(f.mime), "%s", mime);
    if (!keep(c, &f)) {
        cx_storage_writer_abort(f.w);
        cx_capture_skip(c, f.path, "internal_error");
        return NULL;
    }
    return c->output_path;
}

void
cx_capture_add_file(struct cx_capture *c, const char *path, struct cx_storage_writer *w,
                    uint64_t size, const char sha256[65], const char *mime)
{
    struct cx_captured f;

    memset(&f, 0, sizeof(f));
    snprintf(f.path, sizeof(f.path), "%s", path);
    snprintf(f.sha256, sizeof(f.sha256), "%s", sha256);
    snprintf(f.mime, sizeof(f.mime), "%s", mime);
    f.size = size;
    f.w = w;
    if (!keep(c, &f)) {
        cx_storage_writer_abort(w);
        cx_capture_skip(c, path, "internal_error");
    }
}

size_t
cx_capture_count(const struct cx_capture *c)
{
    return c->nfiles;
}

struct cx_captured *
cx_capture_file(struct cx_capture *c, size_t i)
{
    return i < c->nfiles ? &c->files[i] : NULL;
}

json_t *
cx_capture_skipped(struct cx_capture *c)
{
    return c->skipped;
}

bool
cx_capture_done(const struct cx_capture *c)
{
    return c->done;
}
