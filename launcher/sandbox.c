#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <linux/netlink.h>
#include <linux/nsfs.h>
#include <seccomp.h>

#include "../lib/codexec.h"

#define O(f)  offsetof(struct cx_sandbox_conf, f)
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

/* Defaults fit a 2-core, 24 GiB machine with 100 kernels: most idle at
 * about 55 MiB, a busy one bounded at 2 GiB (processes and its tmpfs
 * together) and one core; the parent cgroup bounds them all together. */
static const struct cx_conf_key keys[] = {
    {"python_env", CX_CONF_PATH, O(python_env), "", 0, 0},
    {"r", CX_CONF_PATH, O(r), "/usr/bin/R", 0, 0},
    {"deno", CX_CONF_PATH, O(deno), "/usr/local/lib/codexec-deno/deno", 0, 0},
    {"cache_dir", CX_CONF_PATH, O(cache_dir), "", 0, 0},
    {"cgroup", CX_CONF_STR, O(cgroup), "", 0, 0},
    {"bwrap", CX_CONF_PATH, O(bwrap), "/usr/bin/bwrap", 0, 0},
    {"memory", CX_CONF_SIZE, O(memory), "2G", 64ULL << 20, 1ULL << 50},
    {"max_workspace_bytes", CX_CONF_SIZE, O(max_workspace_bytes), "1G", 1ULL << 20, 1ULL << 50},
    {"tmp_bytes", CX_CONF_SIZE, O(tmp_bytes), "256M", 1ULL << 20, 1ULL << 50},
    {"shm_bytes", CX_CONF_SIZE, O(shm_bytes), "64M", 1ULL << 20, 1ULL << 50},
    {"address_space", CX_CONF_SIZE, O(address_space), "4G", 256ULL << 20, 1ULL << 50},
    {"file_size", CX_CONF_SIZE, O(file_size), "1G", 1ULL << 20, 1ULL << 50},
    {"pids", CX_CONF_UINT, O(pids), "256", 16, 1 << 20},
    {"processes", CX_CONF_UINT, O(processes), "512", 16, 1 << 20},
    {"open_files", CX_CONF_UINT, O(open_files), "1024", 64, 1 << 20},
    {"cpu_percent", CX_CONF_UINT, O(cpu_percent), "100", 1, 100000},
    {"cpu_weight", CX_CONF_UINT, O(cpu_weight), "100", 1, 10000},
    {"threads", CX_CONF_UINT, O(threads), "1", 1, 1024},
    {"template", CX_CONF_BOOL, O(template), "true", 0, 0},
    {"template_preload", CX_CONF_MODULES, O(template_preload), "", 0, 0},
};

/* ------------------------------------------------------------------------ */
/* sandbox.conf                                                             */

static bool
cgroup_name_valid(const char *s)
{
    /* A relative path of [A-Za-z0-9._-] components, never "." or "..". */
    const char *p = s;

    if (strlen(s) > 255)
        return false;
    while (*p) {
        const char *start = p;
        p += strcspn(p, "/");
        if (!cx_name_chars(start, (size_t)(p - start), "._-"))
            return false;
        if (p == start || (p - start == 1 && start[0] == '.') ||
            (p - start == 2 && start[0] == '.' && start[1] == '.'))
            return false;
        if (*p == '/' && !*++p)
            return false;
    }
    return true;
}

static enum cx_err
check_conf(struct cx_sandbox_conf *sc, const char *name, char *errbuf, size_t errlen)
{
    const char *what = NULL;

    if (*sc->cgroup && !cgroup_name_valid(sc->cgroup))
        what = "cgroup: expected a relative path such as codexec-kernels";
    else if (!*sc->bwrap)
        what = "bwrap: expected the path of bubblewrap";
    else if (sc->max_workspace_bytes + sc->tmp_bytes + sc->shm_bytes > sc->memory)
        what = "max_workspace_bytes + tmp_bytes + shm_bytes are above memory";
    if (!what)
        return CX_OK;
    snprintf(errbuf, errlen, "%s: %s", name, what);
    cx_sandbox_conf_cleanup(sc);
    return CX_ERR_INVALID;
}

enum cx_err
cx_sandbox_conf_parse(struct cx_sandbox_conf *sc, const char *name, const char *text, char *errbuf,
                      size_t errlen)
{
    enum cx_err rc;

    memset(sc, 0, sizeof(*sc));
    rc = cx_conf_parse(keys, NKEYS, sc, name, text, errbuf, errlen);
    return rc ? rc : check_conf(sc, name, errbuf, errlen);
}

enum cx_err
cx_sandbox_conf_load(struct cx_sandbox_conf *sc, const char *path, char *errbuf, size_t errlen)
{
    enum cx_err rc;

    memset(sc, 0, sizeof(*sc));
    if (!path)
        return cx_conf_defaults(keys, NKEYS, sc);
    rc = cx_conf_load(keys, NKEYS, sc, path, errbuf, errlen);
    return rc ? rc : check_conf(sc, path, errbuf, errlen);
}

void
cx_sandbox_conf_cleanup(struct cx_sandbox_conf *sc)
{
    cx_conf_cleanup(keys, NKEYS, sc);
}

/* ------------------------------------------------------------------------ */
/* The connection file                                                      */

static bool
name_valid(const char *s, size_t n)
{
    return n > 0 && n < 200 && s[0] != '.' && cx_name_chars(s, n, "._-");
}

/* Reads at most max bytes of a regular file, never through a symlink. */
static enum cx_err
read_small(int dirfd, const char *path, size_t max, char **out, size_t *len)
{
    int fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    char *buf = NULL;
    size_t got = 0;
    enum cx_err rc = CX_OK;

    if (fd < 0)
        return errno == ENOENT ? CX_ERR_NOT_FOUND : CX_ERR_IO;
    /* Up to EOF, not st_size: cgroupfs and procfs files say 0. */
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        rc = CX_ERR_INVALID;
        goto out;
    }
    buf = malloc(max + 1);
    if (!buf) {
        rc = CX_ERR_NOMEM;
        goto out;
    }
    for (;;) {
        ssize_t n = read(fd, buf + got, max + 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = CX_ERR_IO;
            goto out;
        }
        if (n == 0)
            break;
        got += (size_t)n;
        if (got > max) {
            rc = CX_ERR_INVALID;
            goto out;
        }
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

static const char *const port_names[CX_SANDBOX_PORTS] = {"shell_port", "iopub_port", "stdin_port",
                                                         "control_port", "hb_port"};

static enum cx_err
conn_fields(struct cx_sandbox_conn *c, json_t *root, char *msg, size_t msglen)
{
    const char *transport = json_string_value(json_object_get(root, "transport"));
    const char *ip = json_string_value(json_object_get(root, "ip"));
    const char *slash;
    size_t rlen = strlen(c->runtime);

    if (!transport || strcmp(transport, "ipc") != 0) {
        snprintf(msg, msglen,
                 "transport is not ipc; the sandbox has no network: run the server with "
                 "--KernelManager.transport=ipc");
        return CX_ERR_INVALID;
    }
    if (!ip)
        ip = "";
    if (ip[0] == '/') {
        if (strncmp(ip, c->runtime, rlen) != 0 || ip[rlen] != '/') {
            snprintf(msg, msglen, "ipc sockets must live in the connection file's directory");
            return CX_ERR_INVALID;
        }
        ip += rlen + 1;
    }
    slash = strchr(ip, '/');
    if (slash || !name_valid(ip, strlen(ip))) {
        snprintf(msg, msglen, "the ipc endpoint name is not a plain file name");
        return CX_ERR_INVALID;
    }
    snprintf(c->ip_name, sizeof(c->ip_name), "%s", ip);
    c->nports = 0;
    for (int i = 0; i < CX_SANDBOX_PORTS; i++) {
        json_t *v = json_object_get(root, port_names[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535) {
            snprintf(msg, msglen, "%s is missing or out of range", port_names[i]);
            return CX_ERR_INVALID;
        }
        c->ports[c->nports++] = (int)json_integer_value(v);
    }
    return CX_OK;
}

enum cx_err
cx_sandbox_conn_read(const char *path, const char *cwd, struct cx_sandbox_conn *c, char *msg,
                     size_t msglen)
{
    char *text = NULL, *slash;
    size_t len = 0, blen;
    json_t *root;
    enum cx_err rc;
    int n;

    memset(c, 0, sizeof(*c));
    n = path[0] == '/' ? snprintf(c->path, sizeof(c->path), "%s", path)
                       : snprintf(c->path, sizeof(c->path), "%s/%s", cwd, path);
    if (n < 0 || (size_t)n >= sizeof(c->path) || strstr(c->path, "/../") ||
        strstr(c->path, "/./")) {
        snprintf(msg, msglen, "the connection file's path is not usable");
        return CX_ERR_INVALID;
    }
    slash = strrchr(c->path, '/');
    snprintf(c->runtime, sizeof(c->runtime), "%.*s", (int)(slash - c->path), c->path);
    blen = strlen(slash + 1);
    if (blen <= 5 || strcmp(slash + 1 + blen - 5, ".json") != 0 ||
        !name_valid(slash + 1, blen - 5) || !c->runtime[0]) {
        snprintf(msg, msglen, "the connection file must be a plain *.json name in a directory");
        return CX_ERR_INVALID;
    }
    snprintf(c->base, sizeof(c->base), "%.*s", (int)(blen - 5), slash + 1);
    rc = read_small(AT_FDCWD, c->path, 64 * 1024, &text, &len);
    if (rc) {
        snprintf(msg, msglen, "cannot read the connection file (%s)", cx_strerror(rc));
        return rc;
    }
    root = json_loadb(text, len, 0, NULL);
    free(text);
    if (!json_is_object(root)) {
        json_decref(root);
        snprintf(msg, msglen, "the connection file is not a JSON object");
        return CX_ERR_INVALID;
    }
    rc = conn_fields(c, root, msg, msglen);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Removing what a kernel left                                              */

#define REMOVE_MAX_DEPTH 64

/* Opens a directory entry of dirfd without following it; a directory the
 * kernel made unreadable to its owner (us) gets its owner bits back first,
 * through an O_PATH descriptor, never through a name that could be swapped. */
static int
open_dir_nofollow(int dirfd, const char *name, dev_t dev)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;

    if (fd < 0 && errno == EACCES) {
        int pfd = openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        char proc[64];

        if (pfd < 0)
            return -1;
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
        if (fstat(pfd, &st) == 0 && st.st_uid == geteuid())
            (void)chmod(proc, 0700);
        close(pfd);
        fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd >= 0 && (fstat(fd, &st) || st.st_dev != dev)) {
        close(fd);
        errno = EXDEV; /* never cross into another filesystem */
        return -1;
    }
    return fd;
}

static enum cx_err
remove_in(int parent, const char *name, dev_t dev, int depth)
{
    struct dirent *e;
    enum cx_err rc = CX_OK;
    DIR *d;
    int fd;

    if (unlinkat(parent, name, 0) == 0 || errno == ENOENT)
        return CX_OK;
    if (errno == EACCES) {
        /* the kernel took write permission from the directory (ours) */
        if (fchmod(parent, 0700) != 0)
            return CX_ERR_IO;
        if (unlinkat(parent, name, 0) == 0 || errno == ENOENT)
            return CX_OK;
    }
    if (errno != EISDIR && errno != EPERM)
        return CX_ERR_IO;
    if (depth >= REMOVE_MAX_DEPTH)
        return CX_ERR_TOO_LARGE;
    fd = open_dir_nofollow(parent, name, dev);
    if (fd < 0)
        return errno == ENOENT ? CX_OK : CX_ERR_IO;
    d = fdopendir(fd);
    if (!d) {
        close(fd);
        return CX_ERR_NOMEM;
    }
    while (rc == CX_OK && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        rc = remove_in(dirfd(d), e->d_name, dev, depth + 1);
    }
    closedir(d);
    if (rc == CX_OK && unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = CX_ERR_IO;
    return rc;
}

enum cx_err
cx_sandbox_remove_tree(int dirfd, const char *name)
{
    struct stat st;

    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? CX_OK : CX_ERR_IO;
    return remove_in(dirfd, name, st.st_dev, 0);
}

/* ------------------------------------------------------------------------ */
/* The runtime directory                                                    */

/* "sbx-<base>.XXXXXX" (or the old "sbx-<base>") -> base, in out. */
static bool
private_owner(const char *name, char *out, size_t outlen)
{
    size_t n;
    const char *dot;

    if (strncmp(name, "sbx-", 4) != 0)
        return false;
    name += 4;
    n = strlen(name);
    dot = strrchr(name, '.');
    if (dot && strlen(dot) == 7)
        n = (size_t)(dot - name);
    if (n == 0 || n >= outlen)
        return false;
    memcpy(out, name, n);
    out[n] = '\0';
    return true;
}

/* Private directories of earlier launches of this kernel, and of kernels
 * whose connection file is gone. */
static void
sweep_private(int rfd, const char *base)
{
    int fd = dup(rfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    char owner[256], conn[300];

    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (!private_owner(e->d_name, owner, sizeof(owner)))
            continue;
        snprintf(conn, sizeof(conn), "%s.json", owner);
        if (strcmp(owner, base) != 0 && fstatat(rfd, conn, &st, AT_SYMLINK_NOFOLLOW) == 0)
            continue;
        if (cx_sandbox_remove_tree(rfd, e->d_name))
            fprintf(stderr, "codexec-kernel-launcher: could not remove %s\n", e->d_name);
    }
    closedir(d);
}

enum cx_err
cx_sandbox_runtime_prepare(const struct cx_sandbox_conn *c, char *private_out, size_t outlen,
                           char *msg, size_t msglen)
{
    char *text = NULL, name[300];
    size_t len = 0;
    int rfd, pfd = -1, fd = -1, n;
    enum cx_err rc = CX_ERR_IO;

    rfd = open(c->runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) {
        snprintf(msg, msglen, "cannot open the runtime directory");
        return CX_ERR_IO;
    }
    sweep_private(rfd, c->base);
    n = snprintf(private_out, outlen, "%s/sbx-%s.XXXXXX", c->runtime, c->base);
    if (n < 0 || (size_t)n >= outlen || !mkdtemp(private_out)) {
        snprintf(msg, msglen, "cannot create a private directory");
        goto out;
    }
    pfd = open(private_out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0) {
        snprintf(msg, msglen, "cannot open the private directory");
        goto out;
    }
    /* The kernel rewrites (and at exit deletes) its connection file: it gets
     * its own copy, at the path the server chose as seen inside. */
    rc = read_small(rfd, strrchr(c->path, '/') + 1, 64 * 1024, &text, &len);
    if (rc) {
        snprintf(msg, msglen, "cannot read the connection file again");
        goto out;
    }
    snprintf(name, sizeof(name), "%s.json", c->base);
    fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || close(fd) != 0) {
        fd = -1;
        rc = CX_ERR_IO;
        snprintf(msg, msglen, "cannot write the kernel's connection file");
        goto out;
    }
    fd = -1;
    rc = CX_OK;
out:
    free(text);
    if (fd >= 0)
        close(fd);
    if (pfd >= 0)
        close(pfd);
    close(rfd);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Sealing: the private directory becomes read-only inside the sandbox      */

/* A bind remount replaces the mount's flags: these it keeps (statvfs's
 * flag, mount's flag). */
static const unsigned long kept_flags[][2] = {
    {ST_NOSUID, MS_NOSUID},   {ST_NODEV, MS_NODEV},           {ST_NOEXEC, MS_NOEXEC},
    {ST_NOATIME, MS_NOATIME}, {ST_NODIRATIME, MS_NODIRATIME}, {ST_RELATIME, MS_RELATIME},
};

enum cx_err
cx_sandbox_seal(int pid, const char *runtime, const struct stat *expect, char *msg, size_t msglen)
{
    char path[64];
    int mnt = -1, user = -1;
    struct statvfs sv;
    struct stat st;
    unsigned long flags;
    enum cx_err rc = CX_ERR_IO;

    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", pid);
    mnt = open(path, O_RDONLY | O_CLOEXEC);
    if (mnt < 0) {
        snprintf(msg, msglen, "cannot open the sandbox's mount namespace");
        goto out;
    }
    /* The user namespace that owns the mounts: bwrap may nest another one
     * below it (--disable-userns), which would hold no power over them. */
    user = ioctl(mnt, NS_GET_USERNS);
    if (user < 0 || setns(user, CLONE_NEWUSER) != 0 || setns(mnt, CLONE_NEWNS) != 0) {
        snprintf(msg, msglen, "cannot enter the sandbox's namespaces");
        goto out;
    }
    /* The pid could have been reused by now: the directory must be ours. */
    if (stat(runtime, &st) != 0 || st.st_dev != expect->st_dev || st.st_ino != expect->st_ino ||
        statvfs(runtime, &sv) != 0) {
        snprintf(msg, msglen, "the sandbox's runtime directory is not this kernel's");
        goto out;
    }
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY;
    for (size_t i = 0; i < sizeof(kept_flags) / sizeof(kept_flags[0]); i++)
        if (sv.f_flag & kept_flags[i][0])
            flags |= kept_flags[i][1];
    if (mount(NULL, runtime, NULL, flags, NULL) != 0) {
        snprintf(msg, msglen, "cannot make the runtime directory read-only inside the sandbox");
        goto out;
    }
    /* A devpts remount resets every option it is not given (the mode of
     * ptmx with them): all of bwrap's, and the max. */
    flags = MS_REMOUNT;
    if (statvfs("/dev/pts", &sv) == 0)
        for (size_t i = 0; i < sizeof(kept_flags) / sizeof(kept_flags[0]); i++)
            if (sv.f_flag & kept_flags[i][0])
                flags |= kept_flags[i][1];
    if (mount(NULL, "/dev/pts", NULL, flags, CX_SANDBOX_PTS_OPTIONS) != 0) {
        snprintf(msg, msglen, "cannot bound the sandbox's pty instance");
        goto out;
    }
    rc = CX_OK;
out:
    if (user >= 0)
        close(user);
    if (mnt >= 0)
        close(mnt);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* cgroups                                                                  */

static const char *const controllers[] = {"memory", "pids", "cpu"};
#define NCTRL 3

struct hierarchy {
    char mount[CX_SANDBOX_PATH_MAX];
    bool v2;
};

/* Whether a comma-separated option list holds word. */
static bool
has_option(const char *opts, const char *word)
{
    size_t wl = strlen(word);

    for (const char *o = opts; o; o = strchr(o, ',') ? strchr(o, ',') + 1 : NULL)
        if (!strncmp(o, word, wl) && (o[wl] == ',' || o[wl] == '\0'))
            return true;
    return false;
}

/* One line of /proc/self/mountinfo: "id parent maj:min root mountpoint
 * options [optional fields] - fstype source superoptions". */
static void
mountinfo_line(char *line, struct hierarchy h[NCTRL], char *v2mount, size_t v2len)
{
    char *f[64], *save = NULL;
    int nf = 0, dash = -1;

    for (char *t = strtok_r(line, " \n", &save); t && nf < 64; t = strtok_r(NULL, " \n", &save)) {
        if (dash < 0 && nf >= 6 && !strcmp(t, "-"))
            dash = nf;
        f[nf++] = t;
    }
    if (dash < 0 || dash + 3 >= nf || strchr(f[4], '\\'))
        return; /* malformed, or a mount point with escaped characters */
    if (!strcmp(f[dash + 1], "cgroup2")) {
        snprintf(v2mount, v2len, "%s", f[4]);
        return;
    }
    if (strcmp(f[dash + 1], "cgroup") != 0)
        return;
    for (int k = 0; k < NCTRL; k++)
        if (has_option(f[dash + 3], controllers[k]))
            snprintf(h[k].mount, sizeof(h[k].mount), "%s", f[4]);
}

/* Finds where each controller lives: a cgroup (v1) mount naming it, else
 * the cgroup2 mount. */
static enum cx_err
find_hierarchies(struct hierarchy h[NCTRL])
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096], v2mount[CX_SANDBOX_PATH_MAX] = "";

    if (!f)
        return CX_ERR_IO;
    memset(h, 0, sizeof(*h) * NCTRL);
    while (fgets(line, sizeof(line), f))
        mountinfo_line(line, h, v2mount, sizeof(v2mount));
    fclose(f);
    for (int i = 0; i < NCTRL; i++)
        if (!h[i].mount[0] && v2mount[0]) {
            snprintf(h[i].mount, sizeof(h[i].mount), "%s", v2mount);
            h[i].v2 = true;
        }
    return CX_OK;
}

static enum cx_err
write_value(const char *dir, const char *file, const char *value, bool optional)
{
    char path[CX_SANDBOX_PATH_MAX + 64];
    size_t len = strlen(value);
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return optional && errno == ENOENT ? CX_OK : CX_ERR_IO;
    n = write(fd, value, len);
    if (close(fd) != 0 || n != (ssize_t)len)
        return CX_ERR_IO;
    return CX_OK;
}

/* The limits of one kernel, written into its cgroup directory dir, which
 * holds the controllers in mask (bits of controllers[]). */
static enum cx_err
write_limits(const struct cx_sandbox_conf *sc, const char *dir, bool v2, unsigned mask)
{
    char v[64];
    enum cx_err rc = CX_OK;
    unsigned shares = sc->cpu_weight * 1024u / 100u;

    if (mask & 1u) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)sc->memory);
        rc = write_value(dir, v2 ? "memory.max" : "memory.limit_in_bytes", v, false);
        /* v2: an out-of-memory kill takes the whole sandbox, whose end
         * frees its tmpfs pages too (no process's score counts them) */
        if (rc == CX_OK && v2)
            rc = write_value(dir, "memory.oom.group", "1", true);
        /* no swap beyond the limit, where swap accounting exists */
        if (rc == CX_OK)
            rc = v2 ? write_value(dir, "memory.swap.max", "0", true)
                    : write_value(dir, "memory.memsw.limit_in_bytes", v, true);
    }
    if (rc == CX_OK && (mask & 2u)) {
        snprintf(v, sizeof(v), "%u", sc->pids);
        rc = write_value(dir, "pids.max", v, false);
    }
    if (rc == CX_OK && (mask & 4u)) {
        if (v2) {
            snprintf(v, sizeof(v), "%u 100000", sc->cpu_percent * 1000u);
            rc = write_value(dir, "cpu.max", v, false);
            snprintf(v, sizeof(v), "%u", sc->cpu_weight);
            if (rc == CX_OK)
                rc = write_value(dir, "cpu.weight", v, false);
        } else {
            rc = write_value(dir, "cpu.cfs_period_us", "100000", false);
            snprintf(v, sizeof(v), "%u", sc->cpu_percent * 1000u);
            if (rc == CX_OK)
                rc = write_value(dir, "cpu.cfs_quota_us", v, false);
            snprintf(v, sizeof(v), "%u", shares < 2 ? 2 : shares);
            if (rc == CX_OK)
                rc = write_value(dir, "cpu.shares", v, false);
        }
    }
    return rc;
}

/* Removes the empty "k-*" cgroups of kernels that ended: those older than
 * a minute, so that another launcher's cgroup, made but not yet joined, is
 * left alone. */
static void
sweep_cgroups(const char *parent)
{
    DIR *d = opendir(parent);
    struct dirent *e;
    time_t now = time(NULL);
    int fd;

    if (!d)
        return;
    fd = dirfd(d);
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (!strncmp(e->d_name, "k-", 2) && e->d_type == DT_DIR &&
            fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && now - st.st_mtime > 60)
            (void)unlinkat(fd, e->d_name, AT_REMOVEDIR); /* EBUSY while in use */
    }
    closedir(d);
}

/* In v2, the parent must pass the controllers down. */
static bool
v2_enabled(const char *parent)
{
    char *text = NULL;
    size_t len;
    bool ok;
    int dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (dfd < 0 || read_small(dfd, "cgroup.subtree_control", 4096, &text, &len)) {
        if (dfd >= 0)
            close(dfd);
        return false;
    }
    close(dfd);
    ok = true;
    for (int k = 0; k < NCTRL; k++) {
        bool found = false;
        for (char *w = text; *w;) {
            size_t n = strcspn(w, " \n");
            found = found || (n == strlen(controllers[k]) && !strncmp(w, controllers[k], n));
            w += n;
            w += strspn(w, " \n");
        }
        ok = ok && found;
    }
    free(text);
    return ok;
}

/* Controllers sharing a hierarchy share one directory: whether k's
 * hierarchy is an earlier controller's (whose directory then takes k's
 * mask too). */
static bool
shared_hierarchy(const struct hierarchy *h, int k, struct cx_sandbox_cgroup *cg)
{
    int j;

    for (j = 0; j < k && strcmp(h[j].mount, h[k].mount) != 0; j++)
        ;
    if (j == k)
        return false;
    for (int i = 0; i < cg->n; i++)
        if (!strncmp(cg->dirs[i], h[k].mount, strlen(h[k].mount)))
            cg->mask[i] |= 1u << k;
    return true;
}

/* The kernel's directory below parent, cg->dirs[cg->n]: a new unique name
 * in the first hierarchy (its suffix kept), the same name in the others. */
static bool
make_cgroup_dir(struct cx_sandbox_cgroup *cg, const char *parent, const char *name, char suffix[16],
                char *msg, size_t msglen)
{
    char *dir = cg->dirs[cg->n];

    if (!suffix[0]) {
        snprintf(dir, sizeof(cg->dirs[0]), "%s/k-%s-XXXXXX", parent, name);
        if (mkdtemp(dir)) {
            snprintf(suffix, 16, "%s", strrchr(dir, '-') + 1);
            return true;
        }
    } else {
        snprintf(dir, sizeof(cg->dirs[0]), "%s/k-%s-%s", parent, name, suffix);
        if (mkdir(dir, 0755) == 0)
            return true;
    }
    snprintf(msg, msglen, "cannot create a cgroup below %s", parent);
    return false;
}

/* The parent cgroup in hierarchy hk: it exists and, on cgroup v2, gives
 * its children the controllers; the kernels' leftovers in it swept. */
static bool
parent_ready(const struct hierarchy *hk, const char *cgroup, char *parent, size_t len, char *msg,
             size_t msglen)
{
    struct stat st;

    if ((size_t)snprintf(parent, len, "%s/%s", hk->mount, cgroup) >= len ||
        stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(msg, msglen, "the parent cgroup %s does not exist", parent);
        return false;
    }
    if (hk->v2 && !v2_enabled(parent)) {
        snprintf(msg, msglen, "%s does not enable memory, pids and cpu for its children", parent);
        return false;
    }
    sweep_cgroups(parent);
    return true;
}

enum cx_err
cx_sandbox_cgroup_create(const struct cx_sandbox_conf *sc, const char *name,
                         struct cx_sandbox_cgroup *cg, char *msg, size_t msglen)
{
    struct hierarchy h[NCTRL];
    char suffix[16] = "";

    memset(cg, 0, sizeof(*cg));
    if (!*sc->cgroup)
        return CX_OK;
    if (find_hierarchies(h)) {
        snprintf(msg, msglen, "cannot read /proc/self/mountinfo");
        return CX_ERR_IO;
    }
    for (int k = 0; k < NCTRL; k++) {
        char parent[CX_SANDBOX_PATH_MAX + 260];

        if (!h[k].mount[0]) {
            snprintf(msg, msglen, "no cgroup hierarchy has the %s controller", controllers[k]);
            goto fail;
        }
        if (shared_hierarchy(h, k, cg))
            continue;
        if (!parent_ready(&h[k], sc->cgroup, parent, sizeof(parent), msg, msglen) ||
            !make_cgroup_dir(cg, parent, name, suffix, msg, msglen))
            goto fail;
        cg->v2[cg->n] = h[k].v2;
        cg->mask[cg->n++] = h[k].v2 ? 7u : 1u << k;
    }
    for (int i = 0; i < cg->n; i++)
        if (write_limits(sc, cg->dirs[i], cg->v2[i], cg->mask[i])) {
            snprintf(msg, msglen, "cannot write the limits of %s", cg->dirs[i]);
            goto fail;
        }
    return CX_OK;
fail:
    cx_sandbox_cgroup_remove(cg);
    return CX_ERR_IO;
}

enum cx_err
cx_sandbox_cgroup_attach(const struct cx_sandbox_cgroup *cg, pid_t pid)
{
    char text[32];

    snprintf(text, sizeof(text), "%ld", (long)pid);
    for (int i = 0; i < cg->n; i++)
        if (write_value(cg->dirs[i], "cgroup.procs", text, false))
            return CX_ERR_IO;
    return CX_OK;
}

enum cx_err
cx_sandbox_cgroup_join(const struct cx_sandbox_cgroup *cg)
{
    return cx_sandbox_cgroup_attach(cg, getpid());
}

void
cx_sandbox_cgroup_remove(struct cx_sandbox_cgroup *cg)
{
    for (int i = 0; i < cg->n; i++) {
        /* v2: whatever is left ends at once, all together (cgroup.kill,
         * Linux 5.14; older kernels have no such file) */
        if (cg->v2[i])
            (void)write_value(cg->dirs[i], "cgroup.kill", "1", true);
        for (int tries = 0; rmdir(cg->dirs[i]) != 0 && errno == EBUSY && tries < 50; tries++)
            usleep(20000); /* the sandbox's last processes are still exiting */
    }
    cg->n = 0;
}

/* ------------------------------------------------------------------------ */
/* The run's end: the sandbox's other processes                             */

/* A /proc file (at most size - 1 bytes) into buf, NUL-terminated; its
 * length or -1. */
static ssize_t
read_proc(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n, got = 0;

    if (fd < 0)
        return -1;
    while ((size_t)got < size - 1 && (n = read(fd, buf + got, size - 1 - (size_t)got)) > 0)
        got += n;
    close(fd);
    buf[got] = '\0';
    return got;
}

int
cx_sandbox_kernel_pid(int init_pid)
{
    char path[64], buf[256], *end;
    long pid;

    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", init_pid, init_pid);
    if (read_proc(path, buf, sizeof(buf)) <= 0)
        return -1;
    errno = 0;
    pid = strtol(buf, &end, 10);
    /* exactly one: the command bwrap's init runs (a second is an orphan
     * of the kernel's, which can't be told from it) */
    if (errno || end == buf || pid <= 0 || pid > INT_MAX || strspn(end, " \n") != strlen(end))
        return -1;
    return (int)pid;
}

/* Whether the process of the pidfd fd has ended (every thread of it: one
 * whose main thread alone ended runs on). */
static bool
ended(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};

    return poll(&p, 1, 0) == 1;
}

/* Whether pid's process is in the pid namespace ns (as readlink gives it:
 * "pid:[N]"), told by any of its threads (a main thread that ended has no
 * namespace to show). */
static bool
in_namespace(int pid, const char *ns)
{
    char path[64], link[64];
    ssize_t n;
    DIR *d;
    struct dirent *e;
    bool in = false;

    snprintf(path, sizeof(path), "/proc/%d/ns/pid", pid);
    n = readlink(path, link, sizeof(link) - 1);
    if (n > 0) {
        link[n] = '\0';
        return !strcmp(link, ns);
    }
    snprintf(path, sizeof(path), "/proc/%d/task", pid);
    if (!(d = opendir(path)))
        return false;
    while (!in && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) > 10)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/ns/pid", pid, e->d_name);
        n = readlink(path, link, sizeof(link) - 1);
        if (n > 0) {
            link[n] = '\0';
            in = !strcmp(link, ns);
            break;
        }
    }
    closedir(d);
    return in;
}

/* The sandbox's processes, from the cgroup's cgroup.procs, into pids. */
static size_t
list_cgroup(const struct cx_sandbox_cgroup *cg, int *pids, size_t max)
{
    char path[CX_SANDBOX_PATH_MAX + 340];
    size_t n = 0;
    FILE *f;
    long pid;

    snprintf(path, sizeof(path), "%s/cgroup.procs", cg->dirs[0]);
    f = fopen(path, "re");
    if (!f)
        return 0;
    while (n < max && fscanf(f, "%ld", &pid) == 1)
        if (pid > 0 && pid <= INT_MAX)
            pids[n++] = (int)pid;
    fclose(f);
    return n;
}

/* The children of pid (every thread's), appended to pids. */
static size_t
list_children(int pid, int *pids, size_t n, size_t max, char *buf, size_t size)
{
    char path[64];
    DIR *d;
    struct dirent *e;

    snprintf(path, sizeof(path), "/proc/%d/task", pid);
    if (!(d = opendir(path)))
        return n;
    while (n < max && (e = readdir(d))) {
        char file[96], *p, *end;

        if (e->d_name[0] == '.' || strlen(e->d_name) > 10)
            continue;
        snprintf(file, sizeof(file), "/proc/%d/task/%s/children", pid, e->d_name);
        if (read_proc(file, buf, size) <= 0)
            continue;
        for (p = buf; n < max; p = end) {
            long child = strtol(p, &end, 10);
            if (end == p || child <= 0 || child > INT_MAX)
                break;
            pids[n++] = (int)child;
        }
    }
    closedir(d);
    return n;
}

/* The descendants of pid, into pids, breadth first (the list is its own
 * queue: no recursion however deep the tree). */
static size_t
list_descendants(int pid, int *pids, size_t max)
{
    size_t n, size = 65536; /* a pid list of thousands */
    char *buf = malloc(size);

    if (!buf)
        return 0;
    n = list_children(pid, pids, 0, max, buf, size);
    for (size_t i = 0; i < n && n < max; i++)
        n = list_children(pids[i], pids, n, max, buf, size);
    free(buf);
    return n;
}

/* cgroup v2's freezer over the kernel's cgroup dir: on, the listing
 * of a reaping round is the whole truth (no process forks while frozen,
 * and a SIGKILL still ends a frozen one). Waits, up to until_us, for
 * cgroup.events to say so; a process that can't be frozen yet (in the
 * middle of a system call that must finish) only costs the wait. Whether
 * the write took. */
static bool
freeze(const char *dir, bool on, int64_t until_us)
{
    char path[CX_SANDBOX_PATH_MAX + 340], buf[512];

    if (write_value(dir, "cgroup.freeze", on ? "1" : "0", false))
        return false;
    snprintf(path, sizeof(path), "%s/cgroup.events", dir);
    while (on && read_proc(path, buf, sizeof(buf)) > 0 && !strstr(buf, "frozen 1") &&
           cx_now_us() < until_us)
        usleep(1000);
    return true;
}

#define REAP_MAX      4096
#define REAP_WAIT_FDS 256 /* the killed whose end a round waits for */
#define REAP_ROUND_MS 20
#define REAP_TOTAL_MS 500

/* Waits until the processes of the pidfds in p have ended, or until_us;
 * then closes the pidfds. An ended one's fd is kept as -1 - fd meanwhile
 * (poll() skips a negative one). */
static void
wait_ended(struct pollfd *p, int n, int64_t until_us)
{
    for (int left = n; left > 0;) {
        int64_t ms = (until_us - cx_now_us()) / 1000;

        if (ms <= 0 || poll(p, (nfds_t)n, (int)ms) <= 0)
            break;
        for (int i = 0; i < n; i++)
            if (p[i].fd >= 0 && p[i].revents)
                p[i].fd = -1 - p[i].fd, left--;
    }
    for (int i = 0; i < n; i++)
        close(p[i].fd >= 0 ? p[i].fd : -1 - p[i].fd);
}

/* One round: SIGKILL for every listed process but the spared (init, the
 * kernel and an inner kernel) that is alive in ns, through a pidfd opened before the check (so the
 * check is about the process the signal goes to: a pid reused since the
 * listing fails it). The first REAP_WAIT_FDS pidfds are left in wait. */
static int
reap_round(const int *pids, size_t n, const int spare[3], const char *ns, struct pollfd *wait,
           int *nwait)
{
    int hit = 0;

    *nwait = 0;
    for (size_t i = 0; i < n; i++) {
        int fd;

        if (pids[i] == spare[0] || pids[i] == spare[1] || pids[i] == spare[2])
            continue;
        fd = pidfd_open(pids[i], 0);
        if (fd < 0)
            continue;
        if (!ended(fd) && in_namespace(pids[i], ns) &&
            pidfd_send_signal(fd, SIGKILL, NULL, 0) == 0) {
            hit++;
            if (*nwait < REAP_WAIT_FDS) {
                wait[(*nwait)++] = (struct pollfd){.fd = fd, .events = POLLIN};
                continue;
            }
        }
        close(fd);
    }
    return hit;
}

enum cx_err
cx_sandbox_reap(const struct cx_sandbox_cgroup *cg, int init_pid, int kernel_pid, int inner_pid,
                int *killed)
{
    const int spare[3] = {init_pid, kernel_pid, inner_pid > 0 ? inner_pid : init_pid};
    char path[64], ns[64], mine[64];
    int *pids = malloc(REAP_MAX * sizeof(*pids));
    struct pollfd wait[REAP_WAIT_FDS];
    int64_t until = cx_now_us() + REAP_TOTAL_MS * 1000;
    ssize_t len;
    bool frozen;
    size_t alone;

    *killed = 0;
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", init_pid);
    len = readlink(path, ns, sizeof(ns) - 1);
    if (!pids || len <= 0 || kernel_pid <= 0) {
        free(pids);
        return pids ? CX_ERR_INVALID : CX_ERR_NOMEM;
    }
    ns[len] = '\0';
    /* an init that died and whose pid names another process now: never
     * the launcher's own namespace (the host's) */
    len = readlink("/proc/self/ns/pid", mine, sizeof(mine) - 1);
    if (len <= 0 || ((mine[len] = '\0'), !strcmp(mine, ns))) {
        free(pids);
        return CX_ERR_INVALID;
    }
    /* rounds until none is left (a fork bomb), each waiting a moment for
     * the killed to end; a process still ending when time is up has a
     * SIGKILL pending: it runs no more code of its own, nor forks. On
     * cgroup v2 the rounds run frozen, the first one seeing them all,
     * unless bwrap, its init and the kernel (a template's kernel: the init
     * itself) and its inner kernel are alone (most runs' end: nothing to
     * freeze for) */
    alone = (init_pid == kernel_pid ? 1u : 3u) + (inner_pid > 0 ? 1u : 0u);
    frozen = cg && cg->n && cg->v2[0] && list_cgroup(cg, pids, REAP_MAX) > alone &&
             freeze(cg->dirs[0], true, cx_now_us() + 100000);
    for (int round = 0; round < 64 && cx_now_us() < until; round++) {
        size_t n = cg && cg->n ? list_cgroup(cg, pids, REAP_MAX)
                               : list_descendants(init_pid, pids, REAP_MAX);
        int nwait, hit = reap_round(pids, n, spare, ns, wait, &nwait);
        int64_t round_until = cx_now_us() + REAP_ROUND_MS * 1000;

        wait_ended(wait, nwait, round_until < until ? round_until : until);
        *killed += hit;
        if (!hit)
            break;
    }
    free(pids);
    /* the kernel runs on: a cgroup left frozen would hang its next run,
     * so one that can't be thawed is ended (the next run says so) */
    if (frozen && !freeze(cg->dirs[0], false, 0) && !freeze(cg->dirs[0], false, 0)) {
        (void)write_value(cg->dirs[0], "cgroup.kill", "1", true);
        return CX_ERR_IO;
    }
    return CX_OK;
}

/* ------------------------------------------------------------------------ */
/* seccomp                                                                  */

/* Refused with EPERM: what a tenant's code never needs and what kernel
 * exploits and escapes are made of (Docker's default profile refuses the
 * same families). */
static const int denied[] = {
    SCMP_SYS(unshare),
    SCMP_SYS(setns),
    SCMP_SYS(mount),
    SCMP_SYS(umount2),
    SCMP_SYS(pivot_root),
    SCMP_SYS(chroot),
    SCMP_SYS(move_mount),
    SCMP_SYS(open_tree),
    SCMP_SYS(fsopen),
    SCMP_SYS(fsconfig),
    SCMP_SYS(fsmount),
    SCMP_SYS(fspick),
    SCMP_SYS(mount_setattr),
    SCMP_SYS(ptrace),
    SCMP_SYS(process_vm_readv),
    SCMP_SYS(process_vm_writev),
    SCMP_SYS(pidfd_getfd),
    SCMP_SYS(kcmp),
    SCMP_SYS(bpf),
    SCMP_SYS(perf_event_open),
    SCMP_SYS(keyctl),
    SCMP_SYS(add_key),
    SCMP_SYS(request_key),
    SCMP_SYS(userfaultfd),
    /* Linux AIO's contexts are counted host-wide (fs.aio-max-nr, 65536):
     * one io_setup(65536) would take them all for the session's life (the
     * C library's aio_* are threads, not this) */
    SCMP_SYS(io_setup),
    SCMP_SYS(io_uring_setup),
    SCMP_SYS(io_uring_enter),
    SCMP_SYS(io_uring_register),
    SCMP_SYS(init_module),
    SCMP_SYS(finit_module),
    SCMP_SYS(delete_module),
    SCMP_SYS(kexec_load),
    SCMP_SYS(kexec_file_load),
    SCMP_SYS(reboot),
    SCMP_SYS(swapon),
    SCMP_SYS(swapoff),
    SCMP_SYS(acct),
    SCMP_SYS(quotactl),
    SCMP_SYS(open_by_handle_at),
    SCMP_SYS(name_to_handle_at),
    SCMP_SYS(syslog),
    SCMP_SYS(lookup_dcookie),
    SCMP_SYS(fanotify_init),
    /* inotify's instances and watches are counted per user up to the
     * host's: every kernel is the gateway's user there, and so is every
     * launcher, which needs one to start a kernel (an attacker's review:
     * a thousand instances held by one tenant stopped every kernel start
     * on the gateway) */
    SCMP_SYS(inotify_init),
    SCMP_SYS(inotify_init1),
    SCMP_SYS(inotify_add_watch),
    SCMP_SYS(inotify_rm_watch),
    SCMP_SYS(iopl),
    SCMP_SYS(ioperm),
    SCMP_SYS(settimeofday),
    SCMP_SYS(clock_settime),
    SCMP_SYS(clock_adjtime),
    SCMP_SYS(adjtimex),
    SCMP_SYS(sethostname),
    SCMP_SYS(setdomainname),
    SCMP_SYS(uselib),
    SCMP_SYS(ustat),
    SCMP_SYS(sysfs),
    SCMP_SYS(vhangup),
    SCMP_SYS(nfsservctl),
    SCMP_SYS(modify_ldt),
};

/* What a kernel may call: everything else answers ENOSYS (the C library
 * falls back from a call it is told is missing, as from clone3), and the
 * refused calls above EPERM. The system calls of the data stack (Python,
 * numpy, pandas, matplotlib, scipy, scikit-learn, subprocesses, threads,
 * multiprocessing, ZeroMQ), as Docker's default profile allows them, less
 * the refused ones; names this libseccomp does not know are skipped. clone,
 * clone3, socket, socketpair and ioctl have rules of their own below. */
static const char *const allowed[] = {
    "accept",
    "accept4",
    "access",
    "alarm",
    "arch_prctl",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_requeue",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "get_mempolicy",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "ioprio_get",
    "ioprio_set",
    "io_submit",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "membarrier",
    "memfd_create",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_tid_address",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync_file_range",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
};

/* clone() flags that make namespaces. */
static const unsigned long ns_flags[] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,   CLONE_NEWNET,
                                         CLONE_NEWUTS,  CLONE_NEWIPC, CLONE_NEWCGROUP};

/* The terminal-input ioctls (TIOCSTI, TIOCLINUX) refused; every other
 * request allowed. A filter can't say "not these two" in one rule, so the
 * allowed requests are the union of rules on the low 32 bits the kernel
 * reads (the high ones never count): those that differ from both in a bit
 * where the two agree, and the six other patterns of the three bits where
 * they differ. */
static int
ioctl_rules(scmp_filter_ctx ctx)
{
    const uint32_t a = 0x5412u, b = 0x541cu, differ = a ^ b;
    int rc = 0;

    for (int bit = 0; rc == 0 && bit < 32; bit++)
        if (!(differ & (1u << bit)))
            rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
                                  SCMP_A1(SCMP_CMP_MASKED_EQ, 1u << bit, ~a & (1u << bit)));
    for (uint32_t v = 0; rc == 0 && v <= differ; v++) {
        uint32_t x = (a & ~differ) | (v & differ);
        if ((v & ~differ) || x == a || x == b)
            continue;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, x));
    }
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, a));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, b));
    return rc;
}

/* clone without a namespace flag (refused with one). clone3 is not
 * allowed, so it is told missing: its flags are in memory, out of a
 * filter's reach, and the C library falls back to clone. */
static int
clone_rules(scmp_filter_ctx ctx)
{
    unsigned long all = 0;
    int rc = 0;

    for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]); i++)
        all |= ns_flags[i];
    for (size_t i = 0; rc == 0 && i < sizeof(ns_flags) / sizeof(ns_flags[0]); i++)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, all, 0));
    return rc;
}

/* Sockets: unix; inet and inet6, which in the kernel's empty network
 * namespace reach only its own loopback (ipykernel's output pipe from
 * forked processes binds tcp://127.0.0.1: without it the kernel does not
 * start); and netlink's route protocol alone, to list that namespace's
 * interfaces (ZeroMQ resolves an address with getifaddrs, and aborts when
 * it fails). Every other family and netlink protocol is refused: each is a
 * way into the host's kernel (vsock reaches a virtual machine's host). A
 * family with high bits set is refused too (the kernel reads an int). */
static int
socket_rules(scmp_filter_ctx ctx)
{
    static const int families[] = {AF_UNIX, AF_INET, AF_INET6};
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < sizeof(families) / sizeof(families[0]); i++)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)families[i]));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 2,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)AF_NETLINK),
                              SCMP_A2(SCMP_CMP_EQ, (scmp_datum_t)NETLINK_ROUTE));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), SCMP_SYS(socket), 2,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)AF_NETLINK),
                              SCMP_A2(SCMP_CMP_NE, (scmp_datum_t)NETLINK_ROUTE));
    for (int fam = 0; rc == 0 && fam < AF_NETLINK; fam++)
        if (fam != AF_UNIX && fam != AF_INET && fam != AF_INET6)
            rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                                  SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)fam));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                              SCMP_A0(SCMP_CMP_GT, (scmp_datum_t)AF_NETLINK));
    /* (socketpair makes unix sockets alone) */
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socketpair), 1,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)AF_UNIX));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socketpair), 1,
                              SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)AF_UNIX));
    return rc;
}

/* The template's filter is the kernels' but for unshare: its child makes
 * the kernel's namespaces (template.py). No tenant code runs under it
 * alone: each kernel loads the kernels' filter over it. */
static int
build_filter(scmp_filter_ctx ctx, bool template)
{
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);

    for (size_t i = 0; rc == 0 && i < sizeof(allowed) / sizeof(allowed[0]); i++) {
        int nr = seccomp_syscall_resolve_name(allowed[i]);
        if (nr != __NR_SCMP_ERROR && nr >= 0) /* unknown here, or not on this architecture */
            rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
    }
    for (size_t i = 0; rc == 0 && i < sizeof(denied) / sizeof(denied[0]); i++)
        if (denied[i] >= 0) /* a call this architecture lacks is negative */
            rc = seccomp_rule_add(
                ctx,
                template && denied[i] == SCMP_SYS(unshare) ? SCMP_ACT_ALLOW : SCMP_ACT_ERRNO(EPERM),
                denied[i], 0);
    /* sync and syncfs write back every file system of the host (the
     * database's among them): they succeed and do nothing; fsync of the
     * kernel's own files, all on tmpfs, stays */
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(0), SCMP_SYS(sync), 0);
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(0), SCMP_SYS(syncfs), 0);
    if (rc == 0)
        rc = clone_rules(ctx);
    if (rc == 0)
        rc = socket_rules(ctx);
    if (rc == 0)
        rc = ioctl_rules(ctx);
    return rc;
}

static enum cx_err
seccomp_fd(bool template, int *fd_out, char *msg, size_t msglen)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(ENOSYS)); /* what is not allowed */
    int fd = -1;

    if (!ctx) {
        snprintf(msg, msglen, "seccomp_init failed");
        return CX_ERR_NOMEM;
    }
    fd = memfd_create("codexec-seccomp", 0); /* inherited by bwrap */
    if (fd < 0 || build_filter(ctx, template) != 0 || seccomp_export_bpf(ctx, fd) != 0 ||
        lseek(fd, 0, SEEK_SET) != 0) {
        snprintf(msg, msglen, "cannot build the seccomp filter");
        if (fd >= 0)
            close(fd);
        seccomp_release(ctx);
        return CX_ERR_INTERNAL;
    }
    seccomp_release(ctx);
    *fd_out = fd;
    return CX_OK;
}

enum cx_err
cx_sandbox_seccomp_fd(int *fd_out, char *msg, size_t msglen)
{
    return seccomp_fd(false, fd_out, msg, msglen);
}

enum cx_err
cx_sandbox_template_seccomp_fd(int *fd_out, char *msg, size_t msglen)
{
    return seccomp_fd(true, fd_out, msg, msglen);
}

/* ------------------------------------------------------------------------ */
/* The bwrap command line                                                   */

struct argv {
    char **v;
    size_t n, alloc;
    bool failed;
};

static void
add(struct argv *a, const char *s)
{
    if (!s)
        a->failed = true; /* a setting that never loaded: no command line */
    if (a->failed)
        return;
    if (a->n + 2 > a->alloc) {
        size_t na = a->alloc ? a->alloc * 2 : 128;
        char **nv = realloc(a->v, na * sizeof(*nv));
        if (!nv) {
            a->failed = true;
            return;
        }
        a->v = nv;
        a->alloc = na;
    }
    a->v[a->n] = strdup(s);
    if (!a->v[a->n]) {
        a->failed = true;
        return;
    }
    a->v[++a->n] = NULL;
}

/* prefix followed by a number: "--as=" 4294967296 */
static void
addn(struct argv *a, const char *prefix, unsigned long long v)
{
    char buf[64];

    snprintf(buf, sizeof(buf), "%s%llu", prefix, v);
    add(a, buf);
}

static void
add3(struct argv *a, const char *x, const char *y, const char *z)
{
    add(a, x);
    add(a, y);
    if (z)
        add(a, z);
}

/* What of /etc a kernel sees: what the C library, Python and the kernel
 * image read, nothing of other services' configuration or secrets. */
static const char *const etc_files[] = {"ld.so.cache",
                                        "ld.so.conf",
                                        "ld.so.conf.d",
                                        "nsswitch.conf",
                                        "passwd",
                                        "group",
                                        "hosts",
                                        "host.conf",
                                        "gai.conf",
                                        "localtime",
                                        "timezone",
                                        "os-release",
                                        "debian_version",
                                        "ssl/certs",
                                        "ca-certificates",
                                        "fonts",
                                        "mime.types",
                                        "mailcap",
                                        "magic",
                                        "magic.mime",
                                        "protocols",
                                        "services",
                                        "python3",
                                        "python3.11",
                                        "alternatives",
                                        "matplotlibrc",
                                        "locale.alias",
                                        "R",
                                        NULL};

static void
add_env(struct argv *a, const struct cx_sandbox_conf *sc)
{
    static const char *const thread_vars[] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                              "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                                              "NUMEXPR_MAX_THREADS"};
    char threads[16];

    snprintf(threads, sizeof(threads), "%u", sc->threads);
    add(a, "--clearenv");
    add3(a, "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin");
    add3(a, "--setenv", "HOME", "/tmp");
    add3(a, "--setenv", "LANG", "C.UTF-8");
    add3(a, "--setenv", "IPYTHONDIR", "/tmp/.ipython");
    add3(a, "--setenv", "MPLCONFIGDIR", "/tmp/.matplotlib");
    add3(a, "--setenv", "PYTHONNOUSERSITE", "1");
    add3(a, "--setenv", "CODEXEC_SANDBOX", "1");
    for (size_t i = 0; i < sizeof(thread_vars) / sizeof(thread_vars[0]); i++)
        add3(a, "--setenv", thread_vars[i], threads);
}

/* Read-only caches: matplotlib's font list, bound into its directory. */
static void
add_caches(struct argv *a, const struct cx_sandbox_conf *sc)
{
    char dir[CX_SANDBOX_PATH_MAX + 16], src[CX_SANDBOX_PATH_MAX * 2], dst[320];
    struct dirent *e;
    DIR *d;

    if (!*sc->cache_dir)
        return;
    snprintf(dir, sizeof(dir), "%s/matplotlib", sc->cache_dir);
    d = opendir(dir);
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "fontlist-", 9) != 0 || n < 6 ||
            strcmp(e->d_name + n - 5, ".json") != 0 || !name_valid(e->d_name, n))
            continue;
        snprintf(src, sizeof(src), "%s/%s", dir, e->d_name);
        snprintf(dst, sizeof(dst), "/tmp/.matplotlib/%s", e->d_name);
        add3(a, "--ro-bind", src, dst);
    }
    closedir(d);
}

static void
add_tmpfs(struct argv *a, uint64_t size, const char *where)
{
    add(a, "--size");
    addn(a, "", (unsigned long long)size);
    add3(a, "--tmpfs", where, NULL);
}

/* Namespaces, the user, capabilities and the environment. */
static void
add_identity(struct argv *a, const struct cx_sandbox_conf *sc)
{
    struct statvfs sv;

    add(a, sc->bwrap);
    add(a, "--unshare-all");
    add(a, "--unshare-user");
    /* bwrap does this by writing /proc/sys/user/max_user_namespaces in the
     * sandbox; where /proc/sys is read-only (a container) it can't, and the
     * seccomp filter alone refuses new namespaces. */
    if (statvfs("/proc/sys/user", &sv) == 0 && !(sv.f_flag & ST_RDONLY))
        add(a, "--disable-userns");
    add3(a, "--uid", "65534", NULL);
    add3(a, "--gid", "65534", NULL);
    add(a, "--die-with-parent");
    add(a, "--new-session");
    add3(a, "--cap-drop", "ALL", NULL);
    add_env(a, sc);
}

/* Deno's binary outside /usr (installed elsewhere), bound read-only at
 * its own path (R is under /usr: the launcher refuses another place). */
static void
add_language(struct argv *a, const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang)
{
    if (lang == CX_SANDBOX_JAVASCRIPT && strncmp(sc->deno, "/usr/", 5) != 0)
        add3(a, "--ro-bind", sc->deno, sc->deno);
}

/* The system, read-only (/usr, a few files of /etc, the usual links),
 * with a /proc and a /dev of the sandbox's own: a kernel's and the
 * template's. */
static void
add_system(struct argv *a)
{
    add3(a, "--ro-bind", "/usr", "/usr");
    for (size_t i = 0; etc_files[i]; i++) {
        char etc[128];
        snprintf(etc, sizeof(etc), "/etc/%s", etc_files[i]);
        add3(a, "--ro-bind-try", etc, etc);
    }
    add3(a, "--symlink", "usr/bin", "/bin");
    add3(a, "--symlink", "usr/sbin", "/sbin");
    add3(a, "--symlink", "usr/lib", "/lib");
    add3(a, "--symlink", "usr/lib64", "/lib64");
    add3(a, "--proc", "/proc", NULL);
    add3(a, "--dev", "/dev", NULL);
}

/* The sandbox's file system: the system read-only, sized tmpfs where it
 * writes, its private directory, the root and /dev read-only once built. */
static void
add_filesystem(struct argv *a, const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang,
               const struct cx_sandbox_conn *c, const char *private_dir, const char *workspace,
               const char *state)
{
    add_system(a);
    /* Every place a kernel can write is memory of its own cgroup, sized:
     * nothing it writes reaches a disk. */
    add_tmpfs(a, sc->shm_bytes, "/dev/shm");
    add_tmpfs(a, sc->tmp_bytes, "/tmp");
    add3(a, "--dir", "/tmp/.matplotlib", NULL);
    add_caches(a, sc);
    if (workspace) {
        /* the keeper's tmpfs (keeper.h), sized max_workspace_bytes: it
         * outlives this sandbox; codexec's state (the capture's record)
         * beside it, out of the kernel's listing */
        add3(a, "--bind", workspace, "/workspace");
        add3(a, "--bind", state, "/run/codexec");
    } else {
        add_tmpfs(a, sc->max_workspace_bytes, "/workspace");
    }
    /* where models trained on other code interpreters write */
    add3(a, "--symlink", "/workspace", "/mnt/data");
    if (*sc->python_env && strncmp(sc->python_env, "/usr/", 5) != 0)
        add3(a, "--ro-bind", sc->python_env, sc->python_env);
    add_language(a, sc, lang);
    /* Its sockets and connection file: the private directory, sealed
     * read-only by the launcher once the kernel has bound them. */
    add3(a, "--bind", private_dir, c->runtime);
    /* The sandbox's root and /dev are unsized tmpfs: read-only once built. */
    add3(a, "--remount-ro", "/dev", NULL);
    add3(a, "--remount-ro", "/", NULL);
    add3(a, "--chdir", "/workspace", NULL);
}

/* Run at the kernel's start (IPython's exec_lines; it leaves no name in
 * the user's namespace), its last step: the workspace joins sys.path, at
 * its end. plt.show() displays every open figure as a PNG
 * whatever backend the code selected (matplotlib.use("Agg") included),
 * where the inline backend would, so the run captures it (SPEC §10.3).
 * The inline backend's own show() is left to itself. pyplot is patched
 * when it is first imported, by a finder that removes itself. */
static const char show_hook[] =
    "--IPKernelApp.exec_lines="
    "def _codexec_show_hook():\n"
    "    import importlib.abc, importlib.util, sys\n"
    "\n"
    "    def patch(m):\n"
    "        orig = m.show\n"
    "        if getattr(orig, \"_codexec\", False):\n"
    "            return\n"
    "        def show(*args, **kwargs):\n"
    "            import matplotlib\n"
    "            if \"inline\" in str(matplotlib.get_backend()).lower():\n"
    "                return orig(*args, **kwargs)\n"
    "            import io\n"
    "            from IPython.display import Image, display\n"
    "            for n in m.get_fignums():\n"
    "                b = io.BytesIO()\n"
    "                m.figure(n).savefig(b, format=\"png\")\n"
    "                display(Image(data=b.getvalue(), format=\"png\"))\n"
    "            m.close(\"all\")\n"
    "        show._codexec = True\n"
    "        show.__doc__, show.__wrapped__ = orig.__doc__, orig\n"
    "        m.show = show\n"
    "\n"
    "    class Finder(importlib.abc.MetaPathFinder):\n"
    "        def find_spec(self, name, path, target=None):\n"
    "            if name != \"matplotlib.pyplot\":\n"
    "                return None\n"
    "            sys.meta_path.remove(self)\n"
    "            spec = importlib.util.find_spec(name)\n"
    "            if spec is None or spec.loader is None:\n"
    "                return spec\n"
    "            run = spec.loader.exec_module\n"
    "            def exec_module(module):\n"
    "                run(module)\n"
    "                patch(module)\n"
    "            spec.loader.exec_module = exec_module\n"
    "            return spec\n"
    "\n"
    "    if \"matplotlib.pyplot\" in sys.modules:\n"
    "        patch(sys.modules[\"matplotlib.pyplot\"])\n"
    "    else:\n"
    "        sys.meta_path.insert(0, Finder())\n"
    "    sys.path.append('')  # the workspace's own modules, after every installed one\n"
    "_codexec_show_hook()\n"
    "del _codexec_show_hook\n";

/* The front kernel's source (front.py, embedded at build time). */
extern const char cx_front_py[];
/* The kernel template's (template.py). */
extern const char cx_template_py[];

/* ipykernel's options, but the connection file. */
static void
add_kernel_options(struct argv *a, enum cx_sandbox_language lang)
{
    /* IPython's history in memory, not in an SQLite file of the sandbox's
     * tmpfs that goes with it anyway: a file journalled and fdatasync'd at
     * every run was a sixth of the kernel's CPU a run (docs/performance.md) */
    add(a, "--HistoryManager.hist_file=:memory:");
    /* nor does IPython put it there before site-packages while the kernel
     * starts (an extension it imports by a top-level name, say): the
     * Python kernel's exec_lines append it last, once the kernel is up */
    add(a, "--IPKernelApp.ignore_cwd=True");
    if (lang == CX_SANDBOX_PYTHON)
        add(a, show_hook);
}

int
cx_sandbox_language_parse(const char *s)
{
    if (!strcmp(s, "python"))
        return CX_SANDBOX_PYTHON;
    if (!strcmp(s, "javascript"))
        return CX_SANDBOX_JAVASCRIPT;
    if (!strcmp(s, "r"))
        return CX_SANDBOX_R;
    return -1;
}

/* The kernel's command: its rlimits (they apply inside the user
 * namespace, so RLIMIT_NPROC counts this sandbox's processes only), then
 * ipykernel on the connection file; for JavaScript and R the front
 * kernel, an ipykernel that runs the language's kernel as its child.
 * Python runs with -P: the workspace (its cwd), which the tenant writes,
 * is not on sys.path while the kernel imports its own modules. */
static void
add_kernel(struct argv *a, const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang,
           const struct cx_sandbox_conn *c)
{
    char python[CX_SANDBOX_PATH_MAX + 16];

    add(a, "--");
    add(a, "/usr/bin/prlimit");
    /* V8 reserves tens of GiB of address space for its heap cage (none of
     * it writable until used): a JavaScript sandbox's processes are held
     * to the same bytes by RLIMIT_DATA, which counts writable memory only */
    addn(a, lang == CX_SANDBOX_JAVASCRIPT ? "--data=" : "--as=",
         (unsigned long long)sc->address_space);
    addn(a, "--nproc=", sc->processes);
    addn(a, "--fsize=", (unsigned long long)sc->file_size);
    addn(a, "--nofile=", sc->open_files);
    /* no core file; a helper a piped core_pattern starts (systemd-coredump)
     * stores nothing for 0 (docs/sandbox.md, "Host settings") */
    add(a, "--core=0");
    add(a, "--");
    snprintf(python, sizeof(python), "%s/bin/python3", *sc->python_env ? sc->python_env : "/usr");
    add(a, python);
    add(a, "-P");
    if (lang == CX_SANDBOX_PYTHON) {
        add3(a, "-m", "ipykernel_launcher", NULL);
    } else {
        add3(a, "-c", cx_front_py, NULL);
        add3(a, "--inner", lang == CX_SANDBOX_R ? "r" : "javascript", NULL);
        add3(a, "--path", lang == CX_SANDBOX_R ? sc->r : sc->deno, NULL);
    }
    add3(a, "-f", c->path, NULL);
    add_kernel_options(a, lang);
}

enum cx_err
cx_sandbox_argv(const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang,
                const struct cx_sandbox_conn *c, const char *private_dir, const char *workspace,
                const char *state, int seccomp_fd, int info_fd, char ***argv_out)
{
    struct argv a = {0};

    add_identity(&a, sc);
    add_filesystem(&a, sc, lang, c, private_dir, workspace, state);
    if (seccomp_fd >= 0) {
        add(&a, "--seccomp");
        addn(&a, "", (unsigned long long)seccomp_fd);
    }
    if (info_fd >= 0) {
        add(&a, "--info-fd");
        addn(&a, "", (unsigned long long)info_fd);
    }
    add_kernel(&a, sc, lang, c);
    if (a.failed) {
        cx_sandbox_argv_free(a.v);
        return CX_ERR_NOMEM;
    }
    *argv_out = a.v;
    return CX_OK;
}

const char *const *
cx_sandbox_etc_files(void)
{
    return etc_files;
}

/* The template's sandbox (template.h): a kernel's, but the user namespace
 * may nest others (each kernel's, made by its child), no pid namespace of
 * its own (a template that ends takes no kernel with it: each has its
 * own), and nothing of any kernel's: no workspace, no runtime directory.
 * Its kernels' root is built at /newroot. */
static void
add_template_identity(struct argv *a, const struct cx_sandbox_conf *sc)
{
    add(a, sc->bwrap);
    add(a, "--unshare-user");
    add(a, "--unshare-ipc");
    add(a, "--unshare-net");
    add(a, "--unshare-uts");
    add(a, "--unshare-cgroup-try");
    add3(a, "--uid", "65534", NULL);
    add3(a, "--gid", "65534", NULL);
    add(a, "--new-session");
    add3(a, "--cap-drop", "ALL", NULL);
    add_env(a, sc);
}

static void
add_template_filesystem(struct argv *a, const struct cx_sandbox_conf *sc)
{
    add_system(a);
    add_tmpfs(a, sc->tmp_bytes, "/tmp");
    add3(a, "--dir", "/tmp/.matplotlib", NULL);
    add_caches(a, sc);
    if (*sc->python_env && strncmp(sc->python_env, "/usr/", 5) != 0)
        add3(a, "--ro-bind", sc->python_env, sc->python_env);
    add3(a, "--dir", "/newroot", NULL);
    add3(a, "--remount-ro", "/dev", NULL);
    add3(a, "--remount-ro", "/", NULL);
    add3(a, "--chdir", "/", NULL);
}

enum cx_err
cx_sandbox_template_argv(const struct cx_sandbox_conf *sc, int seccomp_fd, const int fds[4],
                         char ***argv_out)
{
    struct argv a = {0};
    char python[CX_SANDBOX_PATH_MAX + 16], list[64];

    add_template_identity(&a, sc);
    add_template_filesystem(&a, sc);
    add(&a, "--seccomp");
    addn(&a, "", (unsigned long long)seccomp_fd);
    add(&a, "--");
    snprintf(python, sizeof(python), "%s/bin/python3", *sc->python_env ? sc->python_env : "/usr");
    add(&a, python);
    add(&a, "-P");
    add3(&a, "-c", cx_template_py, NULL);
    snprintf(list, sizeof(list), "%d,%d,%d,%d", fds[0], fds[1], fds[2], fds[3]);
    add3(&a, "--fds", list, NULL);
    add3(&a, "--preload", sc->template_preload, NULL);
    /* what codexec's requests would have each kernel compile, compiled
     * once (lib/codexec.h cx_kernel_source) */
    add3(&a, "--epilogue", cx_kernel_source("epilogue"), NULL);
    add3(&a, "--capture", cx_kernel_source("capture"), NULL);
    add3(&a, "--files", cx_kernel_source("files"), NULL);
    add(&a, "--");
    add_kernel_options(&a, CX_SANDBOX_PYTHON);
    if (a.failed) {
        cx_sandbox_argv_free(a.v);
        return CX_ERR_NOMEM;
    }
    *argv_out = a.v;
    return CX_OK;
}

void
cx_sandbox_argv_free(char **argv)
{
    if (!argv)
        return;
    for (char **p = argv; *p; p++)
        free(*p);
    free(argv);
}
