#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "s3.h"
#include "digest.h"
#include "storage.h"
#include "util.h"

struct cx_storage {
    char root[4096];  /* local */
    struct cx_s3 *s3; /* else a store */
    size_t part_size; /* the store's multipart threshold and part size */
};

struct cx_storage_writer {
    struct cx_storage *st;
    char tmp[4096]; /* local: the staging file; a store: the staging key */
    int fd;
    unsigned char *buf; /* a store: bytes not yet sent (up to part_size) */
    size_t blen, bcap;
    struct cx_s3_upload *up; /* a store: begun once a part was full */
    bool stored;             /* a store: the staging object exists */
    uint64_t size;
    uint64_t flushed; /* local: bytes handed to writeback so far */
    struct cx_sha256 sha;
    bool finished;
};

/* A local writer starts the disk's writeback every FLUSH_STEP bytes, so that
 * the sync at its end waits for the last few MiB, not the whole file: a
 * large capture's disk writes overlap its transfer. */
#define FLUSH_STEP (8u << 20)

enum cx_err
cx_storage_new_local(const char *root, struct cx_storage **out)
{
    struct cx_storage *st = calloc(1, sizeof(*st));

    *out = NULL;
    if (!st)
        return CX_ERR_NOMEM;
    if ((size_t)snprintf(st->root, sizeof(st->root), "%s", root) >= sizeof(st->root) - 512) {
        free(st);
        return CX_ERR_TOO_LARGE;
    }
    *out = st;
    return CX_OK;
}

enum cx_err
cx_storage_new(const struct cx_config *cfg, struct cx_storage **out)
{
    struct cx_s3_conf c = {.endpoint = cfg->s3_endpoint,
                           .region = cfg->s3_region,
                           .bucket = cfg->s3_bucket,
                           .prefix = cfg->s3_prefix,
                           .virtual_host = cfg->s3_addressing == 1,
                           .key_id = cfg->s3_key_id,
                           .secret = cfg->s3_secret,
                           .token = cfg->s3_token};
    enum cx_err rc = cx_storage_new_local(cfg->storage_dir, out);

    if (rc || cfg->storage != CX_STORAGE_S3)
        return rc;
    (*out)->part_size = (size_t)cfg->s3_part_size;
    rc = cx_s3_new(&c, &(*out)->s3);
    if (rc) {
        cx_storage_free(*out);
        *out = NULL;
    }
    return rc;
}

void
cx_storage_free(struct cx_storage *st)
{
    if (!st)
        return;
    cx_s3_free(st->s3);
    free(st);
}

struct cx_s3 *
cx_storage_s3(struct cx_storage *st)
{
    return st->s3;
}

/* "<dir>/<what>-<32 hex>": a store's staging or probe key, unguessable
 * and unique. */
static void
random_key(const char *dir, const char *what, char *out, size_t outlen)
{
    unsigned char r[16];
    char hex[33];

    randombytes_buf(r, sizeof(r));
    sodium_bin2hex(hex, sizeof(hex), r, sizeof(r));
    snprintf(out, outlen, "%s/%s-%s", dir, what, hex);
}

static enum cx_err
s3_check_writable(struct cx_storage *st, char *msg, size_t msglen)
{
    char key[96];
    enum cx_err rc;

    random_key(".health", "probe", key, sizeof(key));
    rc = cx_s3_put(st->s3, key, "ok\n", 3, NULL);
    if (rc == CX_OK)
        rc = cx_s3_delete(st->s3, key);
    if (rc)
        snprintf(msg, msglen, "the object store does not take writes (see the log)");
    return rc;
}

enum cx_err
cx_storage_check_writable(struct cx_storage *st, char *msg, size_t msglen)
{
    char path[4096];
    int fd, n;

    if (st->s3)
        return s3_check_writable(st, msg, msglen);
    n = snprintf(path, sizeof(path), "%s/.health-XXXXXX", st->root);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        snprintf(msg, msglen, "storage path too long");
        return CX_ERR_INVALID;
    }
    fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, msglen, "cannot create a file in storage: %s", strerror(errno));
        return CX_ERR_IO;
    }
    if (cx_write_all(fd, "ok\n", 3) || fsync(fd)) {
        snprintf(msg, msglen, "cannot write to storage: %s", strerror(errno));
        close(fd);
        unlink(path);
        return CX_ERR_IO;
    }
    close(fd);
    unlink(path);
    return CX_OK;
}

static bool
user_key_plain(const char *user)
{
    size_t n = strlen(user);

    return n >= 1 && n <= 64 && strcmp(user, ".") != 0 && strcmp(user, "..") != 0 &&
           cx_name_chars(user, n, "_.-");
}

void
cx_storage_safe_filename(const char *name, size_t len, char out[256])
{
    const char *base = name;
    size_t o = 0;

    for (size_t i = 0; i < len; i++)
        if (name[i] == '/' || name[i] == '\\')
            base = name + i + 1;
    len -= (size_t)(base - name);
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)base[i];
        size_t n = 1;

        if (c >= 0x80) {
            n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            if (i + n > len || !cx_utf8_valid(base + i, n)) {
                c = '_';
                n = 1;
                if (o + 1 > 255)
                    break;
                out[o++] = '_';
                i++;
                continue;
            }
            if (o + n > 255)
                break;
            memcpy(out + o, base + i, n);
            o += n;
            i += n;
            continue;
        }
        i++;
        if (c < 0x20 || c == 0x7f || c == '"' || (c == '.' && o == 0))
            continue; /* control characters, quotes, leading dots go */
        if (o + 1 > 255)
            break;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    if (o == 0)
        snprintf(out, 256, "file");
}

enum cx_err
cx_storage_key(const char *user, const char *artifact_id, int version, const char *filename,
               char *out, size_t outlen)
{
    char ukey[70], safe[256];
    int n;

    if (!cx_uuid_valid(artifact_id) || version < 1)
        return CX_ERR_INVALID;
    if (user_key_plain(user)) {
        snprintf(ukey, sizeof(ukey), "%s", user);
    } else {
        unsigned char h[16];
        char hex[33];
        crypto_generichash(h, sizeof(h), (const unsigned char *)user, strlen(user), NULL, 0);
        sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
        snprintf(ukey, sizeof(ukey), "h-%s", hex);
    }
    cx_storage_safe_filename(filename, strlen(filename), safe);
    n = snprintf(out, outlen, "artifacts/%s/%s/v%d/%s", ukey, artifact_id, version, safe);
    return n < 0 || (size_t)n >= outlen ? CX_ERR_TOO_LARGE : CX_OK;
}

/* A relative key whose components are neither empty, "." nor "..": a
 * name such as "john..doe" is fine, only a step up is not. */
static bool
key_safe(const char *key)
{
    const char *c = key;

    if (!*key)
        return false;
    for (;;) {
        size_t n = strcspn(c, "/");
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        if (!c[n])
            return true;
        c += n + 1;
    }
}

enum cx_err
cx_storage_path(const struct cx_storage *st, const char *key, char *out, size_t outlen)
{
    int n;

    if (!key_safe(key) || st->s3)
        return CX_ERR_INVALID;
    n = snprintf(out, outlen, "%s/%s", st->root, key);
    return n < 0 || (size_t)n >= outlen ? CX_ERR_TOO_LARGE : CX_OK;
}

/* The directories a key names, opened one by one from the root without
 * following a link (O_NOFOLLOW on each): a storage tree someone changed
 * under a process that runs as root (fsck --repair) never leads it out. */
#define KEY_DEPTH 16
struct key_dirs {
    int fd[KEY_DEPTH];           /* fd[0] the root, fd[n - 1] the last component's directory */
    const char *name[KEY_DEPTH]; /* the component each fd[i > 0] is in its parent */
    size_t len[KEY_DEPTH];
    int n;
    const char *last; /* the key's last component */
};

static void
close_dirs(struct key_dirs *k)
{
    for (int i = 0; i < k->n; i++)
        close(k->fd[i]);
    k->n = 0;
}

/* CX_ERR_NOT_FOUND when a directory is missing, or is a link. */
static enum cx_err
open_dirs(const struct cx_storage *st, const char *key, struct key_dirs *k)
{
    const char *c = key;

    k->n = 0;
    if (!key_safe(key) || st->s3)
        return CX_ERR_INVALID;
    k->fd[0] = open(st->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (k->fd[0] < 0)
        return CX_ERR_IO;
    k->n = 1;
    for (size_t len; c[len = strcspn(c, "/")]; c += len + 1) {
        char comp[256];

        if (k->n == KEY_DEPTH || len >= sizeof(comp)) {
            close_dirs(k);
            return CX_ERR_INVALID;
        }
        memcpy(comp, c, len);
        comp[len] = '\0';
        k->fd[k->n] =
            openat(k->fd[k->n - 1], comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (k->fd[k->n] < 0) {
            enum cx_err rc = errno == ENOENT || errno == ELOOP || errno == ENOTDIR
                                 ? CX_ERR_NOT_FOUND
                                 : CX_ERR_IO;
            close_dirs(k);
            return rc;
        }
        k->name[k->n] = c;
        k->len[k->n] = len;
        k->n++;
    }
    k->last = c;
    return CX_OK;
}

static enum cx_err
mkdirs(char *path, size_t upto)
{
    for (size_t i = 1; i < upto; i++) {
        if (path[i] != '/')
            continue;
        path[i] = '\0';
        if (mkdir(path, 0750) != 0 && errno != EEXIST) {
            path[i] = '/';
            return CX_ERR_IO;
        }
        path[i] = '/';
    }
    return CX_OK;
}

/* A writer's memory, its hash's state with it. */
static void
writer_free(struct cx_storage_writer *w)
{
    cx_sha256_cleanup(&w->sha);
    free(w);
}

enum cx_err
cx_storage_writer_new(struct cx_storage *st, struct cx_storage_writer **out)
{
    struct cx_storage_writer *w = calloc(1, sizeof(*w));
    int n;

    if (!w)
        return CX_ERR_NOMEM;
    w->fd = -1;
    w->st = st;
    if (cx_sha256_init(&w->sha)) {
        free(w);
        return CX_ERR_NOMEM;
    }
    if (st->s3) {
        /* the buffer grows as bytes come: most files are small */
        random_key(".staging", "w", w->tmp, sizeof(w->tmp));
        *out = w;
        return CX_OK;
    }
    /* Staged on the same filesystem as the objects, so the final rename is
     * atomic; fsck removes staging files left by a crash. */
    n = snprintf(w->tmp, sizeof(w->tmp), "%s/.staging/", st->root);
    if (n < 0 || (size_t)n >= sizeof(w->tmp) - 16) {
        writer_free(w);
        return CX_ERR_TOO_LARGE;
    }
    if (mkdir(w->tmp, 0750) != 0 && errno != EEXIST) {
        cx_log_err(errno, "mkdir() of the staging directory failed");
        writer_free(w);
        return CX_ERR_IO;
    }
    snprintf(w->tmp + n, sizeof(w->tmp) - (size_t)n, "w-XXXXXX");
    w->fd = mkostemp(w->tmp, O_CLOEXEC);
    if (w->fd < 0) {
        cx_log_err(errno, "mkostemp() in storage failed");
        writer_free(w);
        return CX_ERR_IO;
    }
    fchmod(w->fd, 0640);
    *out = w;
    return CX_OK;
}

/* A store: the buffered bytes go up as the next part. */
static enum cx_err
s3_flush_part(struct cx_storage_writer *w)
{
    enum cx_err rc = CX_OK;

    if (!w->up)
        rc = cx_s3_upload_begin(w->st->s3, w->tmp, &w->up);
    if (rc == CX_OK)
        rc = cx_s3_upload_part(w->st->s3, w->up, w->buf, w->blen);
    w->blen = 0;
    return rc;
}

static enum cx_err
s3_write(struct cx_storage_writer *w, const unsigned char *data, size_t len)
{
    size_t part = w->st->part_size;

    while (len > 0) {
        size_t n = part - w->blen < len ? part - w->blen : len;

        if (w->blen + n > w->bcap) {
            size_t want = w->bcap ? w->bcap * 2 : 65536;
            unsigned char *b;
            while (want < w->blen + n)
                want *= 2;
            want = want > part ? part : want;
            b = realloc(w->buf, want);
            if (!b)
                return CX_ERR_NOMEM;
            w->buf = b;
            w->bcap = want;
        }
        memcpy(w->buf + w->blen, data, n);
        w->blen += n;
        data += n;
        len -= n;
        if (w->blen == part) {
            enum cx_err rc = s3_flush_part(w);
            if (rc)
                return rc;
        }
    }
    return CX_OK;
}

enum cx_err
cx_storage_writer_write(struct cx_storage_writer *w, const void *data, size_t len)
{
    if (w->st->s3) {
        enum cx_err rc = s3_write(w, data, len);
        if (rc)
            return rc;
    } else if (cx_write_all(w->fd, data, len)) {
        cx_log_err(errno, "write() to storage failed");
        return CX_ERR_IO;
    }
    cx_sha256_update(&w->sha, data, len);
    w->size += len;
#ifdef SYNC_FILE_RANGE_WRITE
    if (!w->st->s3 && w->size - w->flushed >= FLUSH_STEP) {
        /* a hint: the sync at the end is what counts */
        (void)sync_file_range(w->fd, (off_t)w->flushed, (off_t)(w->size - w->flushed),
                              SYNC_FILE_RANGE_WRITE);
        w->flushed = w->size;
    }
#endif
    return CX_OK;
}

uint64_t
cx_storage_writer_size(const struct cx_storage_writer *w)
{
    return w->size;
}

/* A store: the staging object, in one PUT (signed with the object's
 * sha256, hashed already) or as the last part. */
static enum cx_err
s3_finish(struct cx_storage_writer *w, const char *sha256)
{
    enum cx_err rc;

    if (w->up) {
        rc = w->blen ? s3_flush_part(w) : CX_OK;
        if (rc == CX_OK) {
            rc = cx_s3_upload_complete(w->st->s3, w->up); /* (frees it either way) */
            w->up = NULL;
        }
    } else {
        rc = cx_s3_put(w->st->s3, w->tmp, w->buf, w->blen, sha256);
    }
    /* A finished writer holds no buffer: a run may finish many before they
     * commit. */
    free(w->buf);
    w->buf = NULL;
    w->blen = w->bcap = 0;
    w->stored = rc == CX_OK;
    return rc == CX_ERR_NOT_FOUND ? CX_ERR_IO : rc; /* (an upload the store lost) */
}

enum cx_err
cx_storage_writer_finish(struct cx_storage_writer *w, uint64_t *size, char sha256[65])
{
    unsigned char h[CX_SHA256_BYTES];

    if (cx_sha256_final(&w->sha, h))
        return CX_ERR_NOMEM;
    sodium_bin2hex(sha256, 65, h, sizeof(h));
    if (w->st->s3) {
        enum cx_err rc = s3_finish(w, sha256);
        if (rc)
            return rc;
    } else if (fsync(w->fd) != 0) {
        cx_log_err(errno, "fsync() in storage failed");
        return CX_ERR_IO;
    }
    /* A finished writer holds no descriptor: a run may finish many before
     * they commit, and descriptors are the process's to run out of. */
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    *size = w->size;
    w->finished = true;
    return CX_OK;
}

/* A store: a server-side copy into place; the staging object goes (if
 * that fails, fsck finds it stale later). */
static enum cx_err
s3_commit(struct cx_storage_writer *w, const char *key)
{
    enum cx_err rc = key_safe(key) ? cx_s3_copy(w->st->s3, w->tmp, key) : CX_ERR_INVALID;

    if (rc == CX_ERR_NOT_FOUND)
        rc = CX_ERR_IO; /* the staging object went (a lifecycle rule, fsck) */
    if (cx_s3_delete(w->st->s3, w->tmp))
        cx_log_warn(0, "a staging object stays behind (fsck removes it)");
    writer_free(w);
    return rc;
}

enum cx_err
cx_storage_writer_commit(struct cx_storage_writer *w, const char *key)
{
    char final[4096], *slash;
    enum cx_err rc;
    int dfd;

    if (!w->finished) {
        cx_storage_writer_abort(w);
        return CX_ERR_INTERNAL;
    }
    if (w->st->s3)
        return s3_commit(w, key);
    rc = cx_storage_path(w->st, key, final, sizeof(final));
    if (rc) {
        cx_storage_writer_abort(w);
        return rc;
    }
    slash = strrchr(final, '/');
    /* An empty parent may be pruned (a removal, fsck) between mkdir and
     * rename: then once more. */
    for (int attempt = 0;; attempt++) {
        if (mkdirs(final, (size_t)(slash - final) + 1)) {
            cx_log_err(errno, "mkdir() under storage failed");
            cx_storage_writer_abort(w);
            return CX_ERR_IO;
        }
        if (rename(w->tmp, final) == 0)
            break;
        if (errno != ENOENT || attempt > 0) {
            cx_log_err(errno, "rename() in storage failed");
            cx_storage_writer_abort(w);
            return CX_ERR_IO;
        }
    }
    *slash = '\0';
    dfd = open(final, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        cx_log_err(errno, "fsync() of a storage directory failed");
        rc = CX_ERR_IO;
    }
    if (dfd >= 0)
        close(dfd);
    writer_free(w);
    return rc;
}

void
cx_storage_writer_abort(struct cx_storage_writer *w)
{
    if (!w)
        return;
    if (w->st->s3) {
        cx_s3_upload_abort(w->st->s3, w->up);
        if (w->stored && cx_s3_delete(w->st->s3, w->tmp))
            cx_log_warn(0, "a staging object stays behind (fsck removes it)");
        free(w->buf);
        writer_free(w);
        return;
    }
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp);
    writer_free(w);
}

static enum cx_err
s3_remove(struct cx_storage *st, const char *key)
{
    enum cx_err rc;

    if (!key_safe(key))
        return CX_ERR_INVALID;
    rc = cx_s3_delete(st->s3, key);
    if (rc == CX_OK && !strncmp(key, ".staging/", 9)) {
        rc = cx_s3_abort_uploads(st->s3, key);
        if (rc == CX_ERR_INVALID)
            rc = CX_OK; /* the store can't list uploads: its lifecycle rules end them */
    }
    return rc;
}

enum cx_err
cx_storage_remove(struct cx_storage *st, const char *key)
{
    struct key_dirs k;
    enum cx_err rc;

    if (st->s3)
        return s3_remove(st, key);
    rc = open_dirs(st, key, &k);
    if (rc)
        return rc == CX_ERR_NOT_FOUND ? CX_OK : rc; /* nothing there to remove */
    if (unlinkat(k.fd[k.n - 1], k.last, 0) != 0 && errno != ENOENT) {
        cx_log_err(errno, "unlink() in storage failed");
        close_dirs(&k);
        return CX_ERR_IO;
    }
    /* Empty parents go too (v<N>/, <artifact>/, <user>/), never the top
     * ones (artifacts/, .staging/: a writer makes its file there right
     * after making sure the directory exists) nor root. */
    for (int i = k.n - 1; i > 1; i--) {
        char comp[256];

        memcpy(comp, k.name[i], k.len[i]);
        comp[k.len[i]] = '\0';
        if (unlinkat(k.fd[i - 1], comp, AT_REMOVEDIR) != 0)
            break;
    }
    close_dirs(&k);
    return CX_OK;
}

/* Opens name in the directory dfd as a directory, never through a link;
 * a DIR that owns the descriptor, or NULL. */
static DIR *
open_subdir(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

    if (!d && fd >= 0)
        close(fd);
    return d;
}

/* The objects under the directory d (its key rel), depth first, every
 * directory entered through its parent's descriptor (a link is never
 * entered, and is reported to fn like any non-directory: fsck finds it). */
static enum cx_err
walk_dir(DIR *d, const char *rel, bool prune, cx_storage_walk_fn fn, void *ctx, int depth)
{
    struct dirent *e;
    enum cx_err rc = CX_OK;

    while (rc == CX_OK && (e = readdir(d))) {
        char key[4096];
        struct stat st;

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((size_t)snprintf(key, sizeof(key), "%s/%s", rel, e->d_name) >= sizeof(key) ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            DIR *sub = depth < KEY_DEPTH ? open_subdir(dirfd(d), e->d_name) : NULL;

            if (sub) {
                rc = walk_dir(sub, key, prune, fn, ctx, depth + 1);
                closedir(sub);
            }
            if (prune)
                (void)unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR); /* empty ones only */
        } else {
            rc = fn(ctx, key, false);
        }
    }
    return rc;
}

/* The root's directory name (artifacts, .staging), or NULL (and errno). */
static DIR *
open_top(const struct cx_storage *st, const char *name)
{
    int root = open(st->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = root >= 0 ? open_subdir(root, name) : NULL;
    int saved = errno;

    if (root >= 0)
        close(root);
    errno = saved;
    return d;
}

static enum cx_err
walk_staging(const struct cx_storage *st, long stale_seconds, cx_storage_walk_fn fn, void *ctx)
{
    DIR *d = open_top(st, ".staging");
    struct dirent *e;
    time_t now = time(NULL);
    enum cx_err rc = CX_OK;

    if (!d)
        return CX_OK;
    while (rc == CX_OK && (e = readdir(d))) {
        char key[300];
        struct stat sb;

        if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
            now - sb.st_mtime < stale_seconds)
            continue; /* a write in progress */
        snprintf(key, sizeof(key), ".staging/%s", e->d_name);
        rc = fn(ctx, key, true);
    }
    closedir(d);
    return rc;
}

struct s3_walk {
    cx_storage_walk_fn fn;
    void *ctx;
    bool staging;
    time_t before;
    char last[2048]; /* an upload's key: reported once, however many it has */
};

static enum cx_err
on_s3_object(void *ctx, const char *key, time_t modified, uint64_t size)
{
    struct s3_walk *w = ctx;

    (void)size;
    if (w->staging && (modified >= w->before || !strcmp(key, w->last)))
        return CX_OK;
    snprintf(w->last, sizeof(w->last), "%s", key);
    return key_safe(key) ? w->fn(w->ctx, key, w->staging) : CX_OK;
}

/* A store's staging objects and multipart uploads older than stale_seconds. */
static enum cx_err
s3_walk_staging(struct cx_storage *st, long stale_seconds, cx_storage_walk_fn fn, void *ctx)
{
    struct s3_walk w = {
        .fn = fn, .ctx = ctx, .staging = true, .before = time(NULL) - stale_seconds};
    enum cx_err rc = cx_s3_list(st->s3, ".staging/", on_s3_object, &w);

    if (rc == CX_OK) {
        /* an upload is dated by its start, and a big one on a slow link
         * may take hours: a day */
        w.last[0] = '\0';
        w.before = time(NULL) - (stale_seconds > 86400 ? stale_seconds : 86400);
        rc = cx_s3_list_uploads(st->s3, ".staging/", w.before, on_s3_object, &w);
        if (rc == CX_ERR_INVALID) {
            cx_log_info("the object store can't list multipart uploads: its lifecycle rules "
                        "must end those left behind");
            rc = CX_OK;
        }
    }
    return rc;
}

static enum cx_err
s3_walk(struct cx_storage *st, long stale_seconds, cx_storage_walk_fn fn, void *ctx)
{
    struct s3_walk w = {.fn = fn, .ctx = ctx};
    enum cx_err rc = cx_s3_list(st->s3, "artifacts/", on_s3_object, &w);

    if (rc || stale_seconds <= 0)
        return rc;
    return s3_walk_staging(st, stale_seconds, fn, ctx);
}

struct sweep {
    struct cx_storage *st;
    int removed;
};

static enum cx_err
sweep_one(void *ctx, const char *key, bool staging)
{
    struct sweep *sw = ctx;

    if (staging && cx_storage_remove(sw->st, key) == CX_OK)
        sw->removed++;
    return CX_OK; /* one that can't be removed does not stop the others */
}

enum cx_err
cx_storage_sweep_staging(struct cx_storage *st, long stale_seconds, int *removed)
{
    struct sweep sw = {.st = st};
    enum cx_err rc = st->s3 ? s3_walk_staging(st, stale_seconds, sweep_one, &sw)
                            : walk_staging(st, stale_seconds, sweep_one, &sw);

    *removed = sw.removed;
    return rc;
}

enum cx_err
cx_storage_walk(struct cx_storage *st, long stale_seconds, bool prune, cx_storage_walk_fn fn,
                void *ctx)
{
    enum cx_err rc;

    if (st->s3)
        return s3_walk(st, stale_seconds, fn, ctx);
    DIR *d = open_top(st, "artifacts");
    if (!d && errno != ENOENT)
        return CX_ERR_IO;
    rc = d ? walk_dir(d, "artifacts", prune, fn, ctx, 1) : CX_OK;
    if (d)
        closedir(d);
    if (rc == CX_OK && stale_seconds > 0)
        rc = walk_staging(st, stale_seconds, fn, ctx);
    return rc;
}

struct hashing {
    struct cx_sha256 s;
    uint64_t size;
};

static bool
on_hash(void *ctx, const void *data, size_t len)
{
    struct hashing *h = ctx;

    cx_sha256_update(&h->s, data, len);
    h->size += len;
    return true;
}

/* Both backends: the object read through, as downloads read it. */
enum cx_err
cx_storage_digest(struct cx_storage *st, const char *key, uint64_t *size, char sha256[65])
{
    unsigned char h[CX_SHA256_BYTES];
    struct hashing hs = {0};
    enum cx_err rc = cx_sha256_init(&hs.s);

    if (rc)
        return rc;
    rc = cx_storage_read(st, key, 0, UINT64_MAX, on_hash, &hs);
    if (rc == CX_OK)
        rc = cx_sha256_final(&hs.s, h);
    cx_sha256_cleanup(&hs.s);
    if (rc)
        return rc;
    sodium_bin2hex(sha256, 65, h, sizeof(h));
    *size = hs.size;
    return CX_OK;
}

enum cx_err
cx_storage_read(struct cx_storage *st, const char *key, uint64_t first, uint64_t last,
                cx_storage_sink sink, void *ctx)
{
    unsigned char buf[65536];
    struct key_dirs k;
    struct stat sb;
    enum cx_err rc = CX_OK;
    int fd;

    if (st->s3)
        return key_safe(key) ? cx_s3_get(st->s3, key, first, last, sink, ctx) : CX_ERR_INVALID;
    rc = open_dirs(st, key, &k);
    if (rc)
        return rc;
    fd = openat(k.fd[k.n - 1], k.last, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    close_dirs(&k);
    if (fd < 0)
        return errno == ENOENT || errno == ELOOP ? CX_ERR_NOT_FOUND : CX_ERR_IO;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return CX_ERR_NOT_FOUND; /* (a FIFO would block) */
    }
    while (rc == CX_OK && first <= last) {
        uint64_t left = last - first; /* one less than what is left: last may be UINT64_MAX */
        size_t want = left < sizeof(buf) ? (size_t)left + 1 : sizeof(buf);
        ssize_t n = pread(fd, buf, want, (off_t)first);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n == 0 && last == UINT64_MAX ? CX_OK : CX_ERR_IO;
            break;
        }
        if (!sink(ctx, buf, (size_t)n))
            rc = CX_ERR_IO;
        first += (uint64_t)n;
    }
    close(fd);
    return rc;
}
