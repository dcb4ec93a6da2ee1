#include "template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/nsfs.h>

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef MOUNT_ATTR_NOSUID
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV  0x00000004
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif

/* struct mount_attr of linux/mount.h (MOUNT_ATTR_SIZE_VER0), which glibc's
 * <sys/mount.h> and the kernel's headers can't both declare */
struct mount_attr_v0 {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};

#define LOCK_NAME        ".codexec-template.lock"
#define RETRY_SECONDS    60
#define READY_TIMEOUT_MS (120 * 1000)
#define STEP_TIMEOUT_S   30 /* each answer of the template's child */
#define NEWROOT          "/newroot"
#define TEMPLATE_VERSION "1"

/* The template's source (template.py, embedded at build time). */
extern const char cx_template_py[];

static long long
mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --- Which template ---------------------------------------------------------- */

static uint64_t
fnv(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL; /* a field's end: "ab","c" is not "a","bc" */
}

/* What the template's own state depends on: one template per value, so a
 * changed sandbox.conf (or launcher) starts a new one, never a kernel from
 * an old one. */
static uint64_t
template_id(const struct cx_sandbox_conf *sc)
{
    char n[96];
    uint64_t h = 1469598103934665603ULL;

    snprintf(n, sizeof(n), "%u %llu", sc->threads, (unsigned long long)sc->tmp_bytes);
    h = fnv(h, TEMPLATE_VERSION);
    h = fnv(h, sc->python_env);
    h = fnv(h, sc->cache_dir);
    h = fnv(h, sc->bwrap);
    h = fnv(h, sc->template_preload);
    h = fnv(h, n);
    h = fnv(h, cx_kernel_source("epilogue"));
    h = fnv(h, cx_kernel_source("capture"));
    h = fnv(h, cx_kernel_source("files"));
    return fnv(h, cx_template_py);
}

static void
name_of(char *out, size_t len, const struct cx_sandbox_conf *sc, const char *what)
{
    snprintf(out, len, ".codexec-template-%016llx.%s", (unsigned long long)template_id(sc), what);
}

/* Whether the template failed for this Jupyter server within the last
 * RETRY_SECONDS (its marker, in the runtime directory rfd). */
static bool
failed_lately(int rfd, const struct cx_sandbox_conf *sc, pid_t server)
{
    char failed[96], text[32] = "";
    struct stat st;
    int fd;
    ssize_t n = 0;
    bool recent = false;

    name_of(failed, sizeof(failed), sc, "failed");
    fd = openat(rfd, failed, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &st) == 0 && time(NULL) - st.st_mtime <= RETRY_SECONDS &&
        (n = read(fd, text, sizeof(text) - 1)) > 0) {
        text[n] = '\0';
        recent = strtol(text, NULL, 10) == (long)server; /* this server's, not a former one's */
    }
    if (fd >= 0)
        close(fd);
    return recent;
}

bool
cx_template_wanted(const struct cx_sandbox_conf *sc, enum cx_sandbox_language lang,
                   const struct cx_sandbox_conn *c, pid_t server)
{
    int rfd;
    bool recent;

    if (!sc->template || lang != CX_SANDBOX_PYTHON)
        return false;
    rfd = open(c->runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    recent = rfd >= 0 && failed_lately(rfd, sc, server);
    if (rfd >= 0)
        close(rfd);
    return !recent;
}

/* A failure, remembered for RETRY_SECONDS (with the Jupyter server's
 * pid: a server started since tries at once): its launches and the next
 * ones start kernels with bwrap meanwhile, instead of each waiting for a
 * template that does not come. */
static void
remember_failure(int rfd, const struct cx_sandbox_conf *sc, pid_t server)
{
    char failed[96], text[32];
    int fd, n = snprintf(text, sizeof(text), "%ld\n", (long)server);

    name_of(failed, sizeof(failed), sc, "failed");
    fd = openat(rfd, failed, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        (void)!write(fd, text, (size_t)n);
        close(fd);
    }
}

/* --- The template process ---------------------------------------------------- */

/* The template, in its sandbox, in the keeper's namespaces (so that its
 * user namespace, and its kernels', are the keeper's children: the
 * launcher that enters the keeper's holds power over them, template.py).
 * Descriptors 3-6 are what template.py's --fds names, 7 its seccomp
 * filter. Never returns. */
static void
template_exec(const struct cx_sandbox_conf *sc, const struct cx_keeper *k, int fds[5])
{
    static const int want[4] = {3, 4, 5, 6};
    char **argv = NULL;
    int null = open("/dev/null", O_RDWR | O_CLOEXEC), hi = 64;
    sigset_t none;

    /* the launcher's blocked signals (its signalfd's) would be every
     * kernel's: an interrupt would never arrive */
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) != 0 || setsid() < 0 || null < 0 ||
        dup2(null, 0) < 0 || dup2(2, 1) < 0)
        _exit(127);
    if (fork() != 0)
        _exit(0); /* not the launcher's child: Jupyter ends launchers, not this */
    if (cx_keeper_enter(k) != CX_OK)
        _exit(127);
    /* in order, never onto one still needed */
    for (int i = 0; i < 5; i++)
        if ((fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, hi + i)) < 0)
            _exit(127);
    for (int i = 0; i < 5; i++)
        if (dup2(fds[i], 3 + i) < 0) /* (dup2 clears close-on-exec) */
            _exit(127);
    close_range(8, ~0U, 0);
    if (cx_sandbox_template_argv(sc, 7, want, &argv) != CX_OK)
        _exit(127);
    execv(argv[0], argv);
    _exit(127);
}

/* The template's answer on its ready pipe: "0", or "1" and why. */
static enum cx_err
template_ready(int fd, char *msg, size_t msglen)
{
    char why[256] = "";
    size_t n = 0;
    long long deadline = mono_ms() + READY_TIMEOUT_MS;

    while (n < sizeof(why) - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = deadline - mono_ms();
        ssize_t got;

        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            break;
        got = read(fd, why + n, sizeof(why) - 1 - n);
        if (got <= 0)
            break;
        n += (size_t)got;
        if (why[0] == '0')
            return CX_OK;
    }
    why[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)why[i] < 0x20 || why[i] == 0x7f)
            why[i] = '?';
    snprintf(msg, msglen, "the kernel template did not start (%s)",
             n > 1 ? why + 1 : "no answer in time");
    return CX_ERR_IO;
}

/* Under the lock: a new template, listening on sock_name. */
static enum cx_err
template_spawn(int rfd, const char *sock_name, const struct cx_sandbox_conf *sc,
               const struct cx_keeper *k, pid_t server, char *msg, size_t msglen)
{
    int ready[2] = {-1, -1}, fds[5] = {-1, -1, -1, -1, -1}, st;
    enum cx_err rc = CX_ERR_IO;
    pid_t pid;

    fds[1] = pidfd_open(server, 0);
    if (fds[1] >= 0 && getppid() != server) { /* it died and its pid went to another */
        close(fds[1]);
        fds[1] = -1;
    }
    (void)unlinkat(rfd, sock_name, 0); /* a dead template's */
    fds[0] = cx_keeper_unix_at(rfd, sock_name, true);
    fds[2] = dup(k->pidfd);
    if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0 || pipe2(ready, O_CLOEXEC) != 0 ||
        cx_sandbox_template_seccomp_fd(&fds[4], msg, msglen) != CX_OK) {
        if (!*msg)
            snprintf(msg, msglen, "kernel template: cannot listen: %s", strerror(errno));
        goto out;
    }
    fds[3] = ready[1];
    pid = fork();
    if (pid == 0)
        template_exec(sc, k, fds);
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    close(ready[1]);
    ready[1] = fds[3] = -1;
    rc = pid > 0 ? template_ready(ready[0], msg, msglen) : CX_ERR_IO;
out:
    for (int i = 0; i < 5; i++)
        if (fds[i] >= 0 && i != 3)
            close(fds[i]);
    for (int i = 0; i < 2; i++)
        if (ready[i] >= 0)
            close(ready[i]);
    if (rc != CX_OK)
        (void)unlinkat(rfd, sock_name, 0);
    return rc;
}

/* A connection to the runtime directory's template, started if need be. */
static int
template_connect(int rfd, const struct cx_sandbox_conf *sc, const struct cx_keeper *k, pid_t server,
                 char *msg, size_t msglen)
{
    char sock_name[96];
    int lock = openat(rfd, LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    int fd = -1;

    name_of(sock_name, sizeof(sock_name), sc, "sock");
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        snprintf(msg, msglen, "kernel template: cannot lock: %s", strerror(errno));
        if (lock >= 0)
            close(lock);
        return -1;
    }
    fd = cx_keeper_unix_at(rfd, sock_name, false);
    /* launchers queued behind a start that failed start no other for a
     * minute either */
    if (fd < 0 && failed_lately(rfd, sc, server))
        snprintf(msg, msglen, "kernel template: its start failed a moment ago");
    else if (fd < 0 && template_spawn(rfd, sock_name, sc, k, server, msg, msglen) == CX_OK)
        fd = cx_keeper_unix_at(rfd, sock_name, false);
    if (fd < 0 && !*msg)
        snprintf(msg, msglen, "kernel template: cannot connect: %s", strerror(errno));
    close(lock);
    return fd;
}

/* --- Talking to the template's child ----------------------------------------- */

static enum cx_err
send_request(int fd, const struct cx_sandbox_conf *sc, const struct cx_sandbox_conn *c, int out_fd,
             int seccomp_fd)
{
    char req[CX_SANDBOX_PATH_MAX + 512], buf[CMSG_SPACE(2 * sizeof(int))];
    int fds[2] = {out_fd, seccomp_fd};
    int n = snprintf(req, sizeof(req),
                     "F1%cconnection_file=%s%caddress_space=%llu%cdata=%d%cprocesses=%u%c"
                     "file_size=%llu%copen_files=%u%c",
                     0, c->path, 0, (unsigned long long)sc->address_space, 0, 0, 0, sc->processes,
                     0, (unsigned long long)sc->file_size, 0, sc->open_files, 0);
    struct iovec iov = {.iov_base = req, .iov_len = (size_t)n};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf, .msg_controllen = sizeof(buf)};
    struct cmsghdr *h;

    if (n <= 0 || (size_t)n >= sizeof(req))
        return CX_ERR_INVALID;
    memset(buf, 0, sizeof(buf));
    h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(h), fds, sizeof(fds));
    return sendmsg(fd, &m, MSG_NOSIGNAL) == n ? CX_OK : CX_ERR_IO;
}

/* One answer of the template's child: its first byte, a descriptor and
 * credentials when it sent them (*fd_out -1 and cred->pid 0 otherwise).
 * "E" answers carry why in msg. */
static char
receive(int fd, int *fd_out, struct ucred *cred, char *msg, size_t msglen)
{
    char text[600], buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {.iov_base = text, .iov_len = sizeof(text) - 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf, .msg_controllen = sizeof(buf)};
    ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);

    *fd_out = -1;
    memset(cred, 0, sizeof(*cred));
    for (struct cmsghdr *h = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_CREDENTIALS &&
            h->cmsg_len == CMSG_LEN(sizeof(struct ucred)))
            memcpy(cred, CMSG_DATA(h), sizeof(*cred));
        else if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
            for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int got;
                memcpy(&got, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
                if (*fd_out < 0)
                    *fd_out = got;
                else
                    close(got);
            }
    }
    if (n <= 0) {
        snprintf(msg, msglen, "the kernel template did not answer");
        return 0;
    }
    text[n] = '\0';
    if (text[0] == 'E') {
        for (ssize_t i = 1; i < n; i++)
            if ((unsigned char)text[i] < 0x20 || text[i] == 0x7f)
                text[i] = '?';
        snprintf(msg, msglen, "the kernel template's child failed: %s", text + 1);
    }
    return n == 1 || text[0] == 'E' ? text[0] : 0;
}

/* The pid a pidfd names, in our pid namespace (-1: none, or ended). */
static pid_t
pidfd_pid(int pidfd)
{
    char path[64], buf[256];
    FILE *f;
    long pid = -1;

    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
    f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(buf, sizeof(buf), f))
        if (!strncmp(buf, "Pid:", 4)) {
            char *end;
            errno = 0;
            pid = strtol(buf + 4, &end, 10);
            if (errno || end == buf + 4 || pid <= 0 || pid > INT_MAX)
                pid = -1;
        }
    fclose(f);
    return (pid_t)pid;
}

/* The pid a pidfd names, in our pid namespace, and whether it is the init
 * of a pid namespace below ours: "NSpid: <ours> ... 1". */
static pid_t
kernel_pid(int pidfd)
{
    char path[64], buf[2048], *p, *end;
    FILE *f;
    long ours = -1, last = -1;

    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
    f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(buf, sizeof(buf), f)) {
        if (strncmp(buf, "NSpid:", 6) != 0)
            continue;
        int fields = 0;
        for (p = buf + 6;; p = end, fields++) {
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno)
                break;
            if (fields == 0)
                ours = v;
            last = v;
        }
        if (fields < 2)
            ours = -1;
    }
    fclose(f);
    return ours > 0 && ours <= INT_MAX && last == 1 ? (pid_t)ours : -1;
}

/* --- The kernel's root, built from outside ------------------------------------- */

/* What the builder (a child of the launcher) holds. */
struct builder {
    const struct cx_sandbox_conf *sc;
    const struct cx_sandbox_conn *c;
    const struct cx_keeper *k;
    const char *private_dir;
    pid_t pid;
    int pidfd;
    int ns[4];    /* the kernel's user, mount, pid and network namespaces */
    int trees[3]; /* detached copies of the workspace, its state, the private directory */
};

static bool
mkdir_p(const char *path, mode_t mode)
{
    char buf[CX_SANDBOX_PATH_MAX + 64];

    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return false;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return false;
        *p = '/';
    }
    return mkdir(buf, mode) == 0 || errno == EEXIST;
}

/* path under the new root: NEWROOT + path. */
static const char *
under(char *buf, size_t len, const char *path)
{
    if (snprintf(buf, len, NEWROOT "%s", path) >= (int)len)
        return NEWROOT "/.too-long"; /* fails where used: never a shorter path */
    return buf;
}

/* A bind of src (a file or a directory of the template's view) at the
 * same path under the new root; read-only unless it is a device (the
 * template's own binds of the system are read-only and locked so). */
static bool
bind_same(const char *src, bool recursive, bool device)
{
    char dst[CX_SANDBOX_PATH_MAX + 64];
    struct stat st;
    int fd;

    if (lstat(src, &st) != 0)
        return errno == ENOENT; /* what the host lacks is left out, as bwrap --ro-bind-try */
    under(dst, sizeof(dst), src);
    if (S_ISDIR(st.st_mode)) {
        if (!mkdir_p(dst, 0755))
            return false;
    } else {
        char parent[CX_SANDBOX_PATH_MAX + 64];
        snprintf(parent, sizeof(parent), "%s", dst);
        *strrchr(parent, '/') = '\0';
        fd = (mkdir_p(parent, 0755) ? open(dst, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644)
                                    : -1);
        if (fd < 0)
            return false;
        close(fd);
    }
    if (mount(src, dst, NULL, MS_BIND | (recursive ? MS_REC : 0), NULL) != 0)
        return false;
    if (device)
        return true;
    if (mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) == 0)
        return true;
    /* a bind of the template's, locked with flags of its own: read-only
     * already, or refused */
    struct statvfs sv;
    return errno == EPERM && statvfs(dst, &sv) == 0 && (sv.f_flag & ST_RDONLY);
}

/* /dev as bwrap --dev makes it: a small tmpfs with the harmless devices
 * bound from the template's, a pty instance and a /dev/shm of the
 * kernel's own, read-only once made. */
static const char *
build_dev(const struct builder *b)
{
    static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    static const char *const links[][2] = {{"/proc/self/fd", "fd"},
                                           {"/proc/self/fd/0", "stdin"},
                                           {"/proc/self/fd/1", "stdout"},
                                           {"/proc/self/fd/2", "stderr"},
                                           {"pts/ptmx", "ptmx"}};
    char opts[64], path[128];

    if (mkdir(NEWROOT "/dev", 0755) != 0 ||
        mount("tmpfs", NEWROOT "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755") != 0)
        return "/dev";
    for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
        char src[64];
        snprintf(src, sizeof(src), "/dev/%s", nodes[i]);
        if (!bind_same(src, false, true))
            return "a device of /dev";
    }
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        snprintf(path, sizeof(path), NEWROOT "/dev/%s", links[i][1]);
        if (symlink(links[i][0], path) != 0)
            return "/dev's links";
    }
    snprintf(opts, sizeof(opts), "size=%llu,mode=1777", (unsigned long long)b->sc->shm_bytes);
    if (mkdir(NEWROOT "/dev/pts", 0755) != 0 || mkdir(NEWROOT "/dev/shm", 01777) != 0 ||
        mount("devpts", NEWROOT "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance," CX_SANDBOX_PTS_OPTIONS) != 0 ||
        mount("tmpfs", NEWROOT "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0 ||
        mount(NULL, NEWROOT "/dev", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
              NULL) != 0)
        return "/dev's pty instance or /dev/shm";
    return NULL;
}

/* The kernel's own /tmp, sized, with matplotlib's font list bound
 * read-only from the template's (bwrap's binds of sandbox.conf's
 * cache_dir). */
static const char *
build_tmp(const struct builder *b)
{
    char opts[64];
    DIR *d;
    struct dirent *e;

    snprintf(opts, sizeof(opts), "size=%llu,mode=0755", (unsigned long long)b->sc->tmp_bytes);
    if (mkdir(NEWROOT "/tmp", 0755) != 0 ||
        mount("tmpfs", NEWROOT "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0 ||
        mkdir(NEWROOT "/tmp/.matplotlib", 0755) != 0)
        return "/tmp";
    d = opendir("/tmp/.matplotlib");
    while (d && (e = readdir(d)) != NULL) {
        char src[300];
        if (strncmp(e->d_name, "fontlist-", 9) != 0 || strchr(e->d_name, '/'))
            continue;
        snprintf(src, sizeof(src), "/tmp/.matplotlib/%s", e->d_name);
        if (!bind_same(src, false, false)) {
            closedir(d);
            return "the font list";
        }
    }
    if (d)
        closedir(d);
    return NULL;
}

/* /proc: mounted by a process of the kernel's pid namespace (a child of
 * ours, after entering it), while the template's /proc is still in the
 * mount namespace (the kernel lets a user namespace mount a /proc only
 * where one is fully visible already). */
static const char *
build_proc(const struct builder *b)
{
    pid_t pid;
    int st;

    if (mkdir(NEWROOT "/proc", 0555) != 0 || setns(b->ns[2], CLONE_NEWPID) != 0)
        return "/proc";
    pid = fork();
    if (pid == 0)
        _exit(mount("proc", NEWROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0
                  ? 0
                  : 1);
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? NULL : "/proc";
}

/* The keeper's workspace and state, and the private directory, moved
 * into place from their detached copies. */
static const char *
build_binds(const struct builder *b)
{
    char path[CX_SANDBOX_PATH_MAX + 64];
    const char *where[3] = {"/workspace", "/run/codexec", b->c->runtime};

    for (int i = 0; i < 3; i++) {
        under(path, sizeof(path), where[i]);
        if (!mkdir_p(path, 0755) ||
            syscall(SYS_move_mount, b->trees[i], "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) != 0)
            return i == 0   ? "the workspace"
                   : i == 1 ? "the workspace's state"
                            : "the runtime directory";
    }
    return mkdir(NEWROOT "/mnt", 0755) == 0 && symlink("/workspace", NEWROOT "/mnt/data") == 0
               ? NULL
               : "/mnt/data";
}

static const char *
build_system(const struct builder *b)
{
    static const char *const links[][2] = {
        {"usr/bin", "bin"}, {"usr/sbin", "sbin"}, {"usr/lib", "lib"}, {"usr/lib64", "lib64"}};
    const char *const *etc = cx_sandbox_etc_files();
    char path[CX_SANDBOX_PATH_MAX + 64];

    if (!bind_same("/usr", true, false))
        return "/usr";
    for (size_t i = 0; etc[i]; i++) {
        snprintf(path, sizeof(path), "/etc/%s", etc[i]);
        if (!bind_same(path, true, false))
            return "/etc";
    }
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        snprintf(path, sizeof(path), NEWROOT "/%s", links[i][1]);
        if (symlink(links[i][0], path) != 0)
            return "the system's links";
    }
    if (*b->sc->python_env && strncmp(b->sc->python_env, "/usr/", 5) != 0 &&
        !bind_same(b->sc->python_env, true, false))
        return "python_env";
    return NULL;
}

/* The new root in place of the template's (which the kernel never sees:
 * it leaves with the old root), read-only. Every process of the mount
 * namespace whose root was the old one (the kernel, waiting) moves with
 * it. */
static const char *
pivot(void)
{
    if (chdir(NEWROOT) != 0 || syscall(SYS_pivot_root, ".", ".") != 0 ||
        umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
        return "pivot_root";
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0)
        return "a read-only root";
    return NULL;
}

/* The loopback interface of the kernel's network namespace (its only
 * one), up, as bwrap --unshare-net leaves it. */
static const char *
loopback(const struct builder *b)
{
    struct ifreq ifr = {.ifr_name = "lo"};
    int s;

    if (setns(b->ns[3], CLONE_NEWNET) != 0)
        return "the network namespace";
    s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
        if (s >= 0)
            close(s);
        return "loopback";
    }
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) {
        close(s);
        return "loopback";
    }
    close(s);
    return NULL;
}

/* No namespace of any kind can be made in the kernel's user namespace
 * (besides the seccomp filter's refusal), as bwrap --disable-userns does
 * for user namespaces. */
static const char *
no_namespaces(void)
{
    static const char *const kinds[] = {"user", "mnt", "pid",    "net",
                                        "ipc",  "uts", "cgroup", "time"};

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        char path[64];
        int fd;
        snprintf(path, sizeof(path), "/proc/sys/user/max_%s_namespaces", kinds[i]);
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT && i >= 2)
            continue; /* an older kernel: the filter still refuses */
        if (fd < 0 || write(fd, "0", 1) != 1) {
            if (fd >= 0)
                close(fd);
            return "the namespace limits";
        }
        close(fd);
    }
    return NULL;
}

/* Opens the kernel's namespaces while its pid is surely its own (the
 * pidfd answers after the opens). The user namespace is the one that owns
 * its mounts (its child's: the kernel sits in a nested one that owns
 * nothing, template.py). */
static const char *
open_namespaces(struct builder *b)
{
    static const char *const kinds[] = {"mnt", "pid", "net"};

    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)b->pid, kinds[i]);
        if ((b->ns[i + 1] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return "the kernel's namespaces";
    }
    if ((b->ns[0] = ioctl(b->ns[1], NS_GET_USERNS)) < 0)
        return "the user namespace of the kernel's mounts";
    return pidfd_send_signal(b->pidfd, 0, NULL, 0) == 0 ? NULL : "the kernel (it ended)";
}

/* In the keeper's namespaces: detached copies of the workspace, its
 * state and the private directory, to move into the kernel's. */
static const char *
open_trees(struct builder *b)
{
    const char *paths[3] = {b->k->files, b->k->state, b->private_dir};

    if (cx_keeper_enter(b->k) != CX_OK)
        return "the keeper's namespaces";
    for (int i = 0; i < 3; i++) {
        /* nosuid and nodev, as bwrap's binds: the private directory is a
         * copy of the host's mount */
        struct mount_attr_v0 attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
        if ((b->trees[i] = (int)syscall(SYS_open_tree, AT_FDCWD, paths[i],
                                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)) < 0)
            return "a copy of the workspace (open_tree)";
        if (syscall(SYS_mount_setattr, b->trees[i], "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
                    sizeof(attr)) != 0)
            return "nosuid and nodev on a copy of the workspace (mount_setattr)";
    }
    return NULL;
}

/* The builder's steps, in order; NULL, or the one that failed. */
static const char *
build(struct builder *b)
{
    const char *why;

    if ((why = open_namespaces(b)) || (why = open_trees(b)))
        return why;
    if (setns(b->ns[0], CLONE_NEWUSER) != 0 || setns(b->ns[1], CLONE_NEWNS) != 0)
        return "the kernel's namespaces (setns)";
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV,
              "size=1m,nr_inodes=4096,mode=0755") != 0)
        return "the new root";
    if ((why = build_system(b)) || (why = build_dev(b)) || (why = build_tmp(b)) ||
        (why = build_binds(b)) || (why = build_proc(b)) || (why = pivot()) || (why = loopback(b)) ||
        (why = no_namespaces()))
        return why;
    return NULL;
}

/* Builds the kernel's root in a child (entering namespaces changes the
 * process that does it); its failing step, written to a pipe, in msg. */
static enum cx_err
build_root(struct builder *b, char *msg, size_t msglen)
{
    int p[2], st;
    char why[96] = "";
    ssize_t n;
    pid_t pid;

    if (pipe2(p, O_CLOEXEC) != 0)
        return CX_ERR_IO;
    pid = fork();
    if (pid == 0) {
        const char *failed;
        close(p[0]);
        failed = build(b);
        if (failed) {
            char text[200];
            snprintf(text, sizeof(text), "%s: %s", failed, strerror(errno));
            (void)!write(p[1], text, strlen(text));
        }
        _exit(failed ? 1 : 0);
    }
    close(p[1]);
    n = pid > 0 ? read(p[0], why, sizeof(why) - 1) : -1;
    close(p[0]);
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return CX_OK;
    why[n > 0 ? n : 0] = '\0';
    snprintf(msg, msglen, "cannot build the kernel's root: %s", *why ? why : "the builder died");
    return CX_ERR_IO;
}

/* --- One kernel ---------------------------------------------------------------- */

/* The conversation with the template's child, from the request to the
 * kernel's pidfd; on failure nothing of it runs (an unfinished child
 * ends when the connection does). */
static enum cx_err
fork_kernel(int fd, const struct cx_sandbox_conf *sc, const struct cx_sandbox_conn *c,
            const struct cx_sandbox_cgroup *cg, int seccomp_fd, int out_fd,
            struct cx_template_kernel *tk, char *msg, size_t msglen)
{
    struct timeval tv = {.tv_sec = STEP_TIMEOUT_S};
    struct ucred cred;
    int one = 1, got = -1;
    char word;

    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0 ||
        send_request(fd, sc, c, out_fd, seccomp_fd) != CX_OK) {
        snprintf(msg, msglen, "kernel template: the request failed");
        return CX_ERR_IO;
    }
    word = receive(fd, &got, &cred, msg, msglen);
    if (word != 'U' || cred.pid <= 0 || got < 0 || pidfd_pid(got) != cred.pid) {
        if (got >= 0)
            close(got);
        if (word != 'E' && !*msg)
            snprintf(msg, msglen, "kernel template: an unexpected answer");
        return CX_ERR_IO;
    }
    /* the child, single-threaded, into the kernel's cgroup: the kernel,
     * its fork, is charged there from its first page. Its pid, while its
     * pidfd says it is still the child's (it waits for "G": only a kill
     * ends it sooner) */
    if (pidfd_send_signal(got, 0, NULL, 0) != 0 ||
        cx_sandbox_cgroup_attach(cg, cred.pid) != CX_OK ||
        pidfd_send_signal(got, 0, NULL, 0) != 0) {
        snprintf(msg, msglen, "cannot move the kernel into its cgroup: %s", strerror(errno));
        close(got);
        return CX_ERR_IO;
    }
    close(got);
    if (send(fd, "G", 1, MSG_NOSIGNAL) != 1)
        return CX_ERR_IO;
    word = receive(fd, &tk->pidfd, &cred, msg, msglen);
    if (word != 'K' || tk->pidfd < 0 || (tk->pid = kernel_pid(tk->pidfd)) <= 0) {
        if (tk->pidfd >= 0)
            close(tk->pidfd);
        tk->pidfd = -1;
        if (word != 'E')
            snprintf(msg, msglen, "kernel template: no kernel came");
        return CX_ERR_IO;
    }
    return CX_OK;
}

enum cx_err
cx_template_start(const struct cx_sandbox_conf *sc, const struct cx_sandbox_conn *c,
                  const char *private_dir, const struct cx_keeper *k,
                  const struct cx_sandbox_cgroup *cg, int seccomp_fd, int out_fd, pid_t server,
                  struct cx_template_kernel *tk, char *msg, size_t msglen)
{
    struct builder b = {.sc = sc,
                        .c = c,
                        .k = k,
                        .private_dir = private_dir,
                        .ns = {-1, -1, -1, -1},
                        .trees = {-1, -1, -1}};
    int rfd = open(c->runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC), fd = -1;
    enum cx_err rc = CX_ERR_IO;

    *tk = (struct cx_template_kernel){.pidfd = -1, .pid = -1};
    msg[0] = '\0';
    if (rfd < 0 || k->pidfd < 0) {
        snprintf(msg, msglen, "kernel template: no runtime directory, or no keeper");
        goto out;
    }
    fd = template_connect(rfd, sc, k, server, msg, msglen);
    if (fd < 0 || fork_kernel(fd, sc, c, cg, seccomp_fd, out_fd, tk, msg, msglen) != CX_OK)
        goto out;
    b.pid = tk->pid;
    b.pidfd = tk->pidfd;
    if (cx_keeper_guard(k, tk->pidfd) != CX_OK) {
        snprintf(msg, msglen, "the workspace keeper did not take the kernel's guard");
        goto out;
    }
    if (build_root(&b, msg, msglen) != CX_OK)
        goto out;
    rc = send(fd, "S", 1, MSG_NOSIGNAL) == 1 ? CX_OK : CX_ERR_IO;
out:
    if (rc != CX_OK && tk->pidfd >= 0) {
        (void)pidfd_send_signal(tk->pidfd, SIGKILL, NULL, 0);
        close(tk->pidfd);
        tk->pidfd = -1;
    }
    if (rc != CX_OK && rfd >= 0)
        remember_failure(rfd, sc, server);
    if (fd >= 0)
        close(fd);
    if (rfd >= 0)
        close(rfd);
    return rc;
}
