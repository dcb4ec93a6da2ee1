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

#include "log.h"
#include "storage.h"
#include "util.h"

struct cx_storage_writer {
    char root[4096];
    char tmp[4096];
    int fd;
    uint64_t size;
    crypto_hash_sha256_state sha;
    bool finished;
};

enum cx_err
cx_storage_check_writable(const char *dir, char *msg, size_t msglen)
{
    char path[4096];
    int fd, n;

    n = snprintf(path, sizeof(path), "%s/.health-XXXXXX", dir);
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
cx_storage_path(const char *root, const char *key, char *out, size_t outlen)
{
    int n;

    if (!key_safe(key))
        return CX_ERR_INVALID;
    n = snprintf(out, outlen, "%s/%s", root, key);
    return n < 0 || (size_t)n >= outlen ? CX_ERR_TOO_LARGE : CX_OK;
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

enum cx_err
cx_storage_writer_new(const char *root, struct cx_storage_writer **out)
{
    struct cx_storage_writer *w = calloc(1, sizeof(*w));
    int n;

    if (!w)
        return CX_ERR_NOMEM;
    w->fd = -1;
    snprintf(w->root, sizeof(w->root), "%s", root);
    /* Staged on the same filesystem as the objects, so the final rename is
     * atomic; fsck removes staging files left by a crash. */
    n = snprintf(w->tmp, sizeof(w->tmp), "%s/.staging/", root);
    if (n < 0 || (size_t)n >= sizeof(w->tmp) - 16) {
        free(w);
        return CX_ERR_TOO_LARGE;
    }
    if (mkdir(w->tmp, 0750) != 0 && errno != EEXIST) {
        cx_log_err(errno, "mkdir() of the staging directory failed");
        free(w);
        return CX_ERR_IO;
    }
    snprintf(w->tmp + n, sizeof(w->tmp) - (size_t)n, "w-XXXXXX");
    w->fd = mkostemp(w->tmp, O_CLOEXEC);
    if (w->fd < 0) {
        cx_log_err(errno, "mkostemp() in storage failed");
        free(w);
        return CX_ERR_IO;
    }
    fchmod(w->fd, 0640);
    crypto_hash_sha256_init(&w->sha);
    *out = w;
    return CX_OK;
}

enum cx_err
cx_storage_writer_write(struct cx_storage_writer *w, const void *data, size_t len)
{
    if (cx_write_all(w->fd, data, len)) {
        cx_log_err(errno, "write() to storage failed");
        return CX_ERR_IO;
    }
    crypto_hash_sha256_update(&w->sha, data, len);
    w->size += len;
    return CX_OK;
}

uint64_t
cx_storage_writer_size(const struct cx_storage_writer *w)
{
    return w->size;
}

enum cx_err
cx_storage_writer_finish(struct cx_storage_writer *w, uint64_t *size, char sha256[65])
{
    unsigned char h[crypto_hash_sha256_BYTES];

    if (fsync(w->fd) != 0) {
        cx_log_err(errno, "fsync() in storage failed");
        return CX_ERR_IO;
    }
    /* A finished writer holds no descriptor: a run may finish many before
     * they commit, and descriptors are the process's to run out of. */
    close(w->fd);
    w->fd = -1;
    crypto_hash_sha256_final(&w->sha, h);
    sodium_bin2hex(sha256, 65, h, sizeof(h));
    *size = w->size;
    w->finished = true;
    return CX_OK;
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
    rc = cx_storage_path(w->root, key, final, sizeof(final));
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
    free(w);
    return rc;
}

void
cx_storage_writer_abort(struct cx_storage_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp);
    free(w);
}

enum cx_err
cx_storage_remove(const char *root, const char *key)
{
    char path[4096];
    size_t rootlen = strlen(root);
    enum cx_err rc = cx_storage_path(root, key, path, sizeof(path));

    if (rc)
        return rc;
    if (unlink(path) != 0 && errno != ENOENT) {
        cx_log_err(errno, "unlink() in storage failed");
        return CX_ERR_IO;
    }
    /* Empty parents go too (v<N>/, <artifact>/, <user>/), never root. */
    for (char *slash = strrchr(path, '/'); slash && (size_t)(slash - path) > rootlen;
         slash = strrchr(path, '/')) {
        *slash = '\0';
        if (rmdir(path) != 0)
            break;
    }
    return CX_OK;
}

static enum cx_err
walk_dir(const char *root, const char *rel, bool prune, cx_storage_walk_fn fn, void *ctx)
{
    char dir[4096];
    DIR *d;
    struct dirent *e;
    enum cx_err rc = CX_OK;

    snprintf(dir, sizeof(dir), "%s/%s", root, rel);
    d = opendir(dir);
    if (!d)
        return errno == ENOENT ? CX_OK : CX_ERR_IO;
    while (rc == CX_OK && (e = readdir(d))) {
        char key[4096];
        struct stat st;

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((size_t)snprintf(key, sizeof(key), "%s/%s", rel, e->d_name) >= sizeof(key) ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            rc = walk_dir(root, key, prune, fn, ctx);
            if (prune)
                (void)unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR); /* empty ones only */
        } else {
            rc = fn(ctx, key, false);
        }
    }
    closedir(d);
    return rc;
}

static enum cx_err
walk_staging(const char *root, long stale_seconds, cx_storage_walk_fn fn, void *ctx)
{
    char dir[4096];
    DIR *d;
    struct dirent *e;
    time_t now = time(NULL);
    enum cx_err rc = CX_OK;

    snprintf(dir, sizeof(dir), "%s/.staging", root);
    d = opendir(dir);
    if (!d)
        return CX_OK;
    while (rc == CX_OK && (e = readdir(d))) {
        char key[300];
        struct stat st;

        if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            now - st.st_mtime < stale_seconds)
            continue; /* a write in progress */
        snprintf(key, sizeof(key), ".staging/%s", e->d_name);
        rc = fn(ctx, key, true);
    }
    closedir(d);
    return rc;
}

enum cx_err
cx_storage_walk(const char *root, long stale_seconds, bool prune, cx_storage_walk_fn fn, void *ctx)
{
    enum cx_err rc = walk_dir(root, "artifacts", prune, fn, ctx);

    if (rc == CX_OK && stale_seconds > 0)
        rc = walk_staging(root, stale_seconds, fn, ctx);
    return rc;
}

enum cx_err
cx_storage_digest(const char *root, const char *key, uint64_t *size, char sha256[65])
{
    unsigned char buf[65536], h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_state s;
    char path[4096];
    struct stat st;
    ssize_t n;
    int fd;

    if (cx_storage_path(root, key, path, sizeof(path)))
        return CX_ERR_INVALID;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT || errno == ELOOP ? CX_ERR_NOT_FOUND : CX_ERR_IO;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return CX_ERR_NOT_FOUND;
    }
    crypto_hash_sha256_init(&s);
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        crypto_hash_sha256_update(&s, buf, (size_t)n);
    close(fd);
    if (n < 0)
        return CX_ERR_IO;
    crypto_hash_sha256_final(&s, h);
    sodium_bin2hex(sha256, 65, h, sizeof(h));
    *size = (uint64_t)st.st_size;
    return CX_OK;
}
