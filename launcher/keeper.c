#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "keeper.h"

#define SOCK_NAME  ".codexec-keeper.sock"
#define LOCK_NAME  ".codexec-keeper.lock"
#define ROOT_NAME  ".codexec-ws"
#define HOLDERS    65536 /* kernels of one Jupyter server */
#define SWEEP_MS   5000
#define REQ_MAX    (CX_SANDBOX_PATH_MAX + 512)
#define NAME_MAX_K 200

/* --- The keeper process ----------------------------------------------------- */

struct held {
    char base[NAME_MAX_K + 1];
    char conn[CX_SANDBOX_PATH_MAX];
    int holders;
};

struct keeper {
    int listen_fd, server_fd, root_fd, ns[3]; /* user, mount, a pidfd of the keeper */
    const char *runtime; /* the runtime directory, by name: a descriptor would name the old mount */
    struct held *ws;
    int nws;
    struct pollfd *p; /* [0] listen, [1] server, then connections */
    int *conn_ws;     /* the workspace each connection holds (-1: none yet) */
    int *conn_guard;  /* a pidfd of the connection's kernel, ended with it (-1: none) */
    int np, cap;
};

static bool
name_ok(const char *s)
{
    size_t n = strlen(s);

    return n > 0 && n <= NAME_MAX_K && s[0] != '.' &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

/* Into a user and mount namespace of our own, the gateway's user mapped to
 * itself, with a small tmpfs over the runtime directory's ROOT_NAME that
 * holds the workspaces' mount points (seen only here). */
/* Writes text to a file of /proc/self. */
static bool
write_proc(const char *name, const char *text)
{
    char path[64];
    int fd;

    snprintf(path, sizeof(path), "/proc/self/%s", name);
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        close(fd);
        return false;
    }
    return close(fd) == 0;
}

/* Into a user and mount namespace of our own, the gateway's user mapped to
 * itself, with a small tmpfs over the runtime directory's ROOT_NAME that
 * holds the workspaces' mount points (seen only here). NULL, or the step
 * that failed (errno says why). */
static const char *
keeper_namespaces(struct keeper *kp)
{
    char umap[64], gmap[64], root[CX_SANDBOX_PATH_MAX + 32];

    snprintf(umap, sizeof(umap), "%u %u 1\n", (unsigned)getuid(), (unsigned)getuid());
    snprintf(gmap, sizeof(gmap), "%u %u 1\n", (unsigned)getgid(), (unsigned)getgid());
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
        return "unshare";
    /* /proc/self of a process that is not dumpable (the launcher that
     * forked this made itself so) is root's: its maps can't be written */
    if (prctl(PR_SET_DUMPABLE, 1) != 0 || !write_proc("setgroups", "deny") ||
        !write_proc("uid_map", umap) || !write_proc("gid_map", gmap) ||
        prctl(PR_SET_DUMPABLE, 0) != 0)
        return "the user namespace's maps";
    /* the host's mounts still reach us; ours never reach it */
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        return "making / a slave";
    snprintf(root, sizeof(root), "%s/" ROOT_NAME, kp->runtime);
    if (mount("codexec-ws", root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=4m,nr_inodes=200000,mode=0700") != 0)
        return "mounting the workspaces' root";
    kp->root_fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return kp->root_fd >= 0 ? NULL : "opening the workspaces' root";
}

static int
find_ws(const struct keeper *kp, const char *base)
{
    for (int i = 0; i < kp->nws; i++)
        if (!strcmp(kp->ws[i].base, base))
            return i;
    return -1;
}

/* A new workspace: its tmpfs, then "files" (the kernel's) and "state". */
static bool
mount_ws(struct keeper *kp, const char *base, unsigned long long size)
{
    char path[NAME_MAX_K + 32], opts[96];
    int fd;

    if (mkdirat(kp->root_fd, base, 0700) != 0 && errno != EEXIST)
        return false;
    snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", kp->root_fd, base);
    /* inodes too: empty files cost no size but kernel memory that outlives
     * a restart of the kernel that made them */
    snprintf(opts, sizeof(opts), "size=%llu,nr_inodes=%llu,mode=0700", size,
             size / 16384 < 4096        ? 4096ULL
             : size / 16384 > (1 << 20) ? 1ULL << 20
                                        : size / 16384);
    if (mount("codexec-workspace", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0)
        return false;
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || mkdirat(fd, "files", 0755) != 0 || mkdirat(fd, "state", 0700) != 0) {
        if (fd >= 0)
            close(fd);
        (void)umount2(path, MNT_DETACH);
        return false;
    }
    close(fd);
    return true;
}

static void
unmount_ws(struct keeper *kp, int i)
{
    char path[NAME_MAX_K + 32];

    snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", kp->root_fd, kp->ws[i].base);
    if (umount2(path, MNT_DETACH) != 0)
        fprintf(stderr, "codexec-kernel-launcher: keeper: could not unmount a workspace: %s\n",
                strerror(errno));
    (void)unlinkat(kp->root_fd, kp->ws[i].base, AT_REMOVEDIR);
    kp->ws[i] = kp->ws[--kp->nws];
    for (int c = 2; c < kp->np; c++)
        if (kp->conn_ws[c] == kp->nws)
            kp->conn_ws[c] = i; /* the one moved into i's place */
}

/* "H<size>\0<base>\0<connection file>\0": hold (and make) the workspace.
 * The answer: "0" and the namespaces' descriptors with a pidfd of the
 * keeper, or "1" and why. */
static const char *
on_hold(struct keeper *kp, int c, const char *req, size_t n)
{
    const char *base, *conn;
    unsigned long long size;
    char *end;
    int i;

    if (n < 4 || req[0] != 'H' || req[n - 1] != '\0' || kp->conn_ws[c] >= 0)
        return "a malformed request";
    size = strtoull(req + 1, &end, 10);
    base = end + 1;
    conn = base + strlen(base) + 1;
    if (*end != '\0' || size < (1u << 20) || size > (1ULL << 50) || conn >= req + n ||
        !name_ok(base) || conn[0] != '/' || strlen(conn) >= CX_SANDBOX_PATH_MAX)
        return "a malformed request";
    i = find_ws(kp, base);
    if (i < 0) {
        if (kp->nws >= HOLDERS)
            return "too many workspaces";
        if (!mount_ws(kp, base, size))
            return "cannot mount the workspace";
        i = kp->nws++;
        snprintf(kp->ws[i].base, sizeof(kp->ws[i].base), "%s", base);
        snprintf(kp->ws[i].conn, sizeof(kp->ws[i].conn), "%s", conn);
        kp->ws[i].holders = 0;
    }
    kp->ws[i].holders++;
    kp->conn_ws[c] = i;
    return NULL;
}

static void
answer(int fd, const char *why, const int ns[3])
{
    char buf[CMSG_SPACE(3 * sizeof(int))];
    char text[128];
    struct iovec iov = {.iov_base = text};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};

    snprintf(text, sizeof(text), "%c%s", why ? '1' : '0', why ? why : "");
    iov.iov_len = strlen(text);
    if (!why) {
        struct cmsghdr *h;
        memset(buf, 0, sizeof(buf));
        m.msg_control = buf;
        m.msg_controllen = sizeof(buf);
        h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(3 * sizeof(int));
        memcpy(CMSG_DATA(h), ns, 3 * sizeof(int));
    }
    (void)sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* "P" with a pidfd (SCM_RIGHTS), once, after the hold: the connection's
 * kernel, not the launcher's child (a kernel forked from the template,
 * launcher/template.c), which the keeper ends when the connection does.
 * A launcher killed (Jupyter kills one that does not end in time) leaves
 * no kernel running. false for anything else. */
static bool
on_guard(struct keeper *kp, int c, const char *req, ssize_t n, struct msghdr *m)
{
    struct cmsghdr *h = CMSG_FIRSTHDR(m);
    int fd = -1;

    if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
        h->cmsg_len >= CMSG_LEN(sizeof(int))) {
        memcpy(&fd, CMSG_DATA(h), sizeof(int));
        for (size_t i = 1; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int extra;
            memcpy(&extra, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
            close(extra);
        }
    }
    if (n != 1 || req[0] != 'P' || kp->conn_ws[c] < 0 || kp->conn_guard[c] >= 0 || fd < 0 ||
        (m->msg_flags & MSG_CTRUNC)) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    kp->conn_guard[c] = fd;
    return true;
}

static void
drop_conn(struct keeper *kp, int c)
{
    int i = kp->conn_ws[c];

    if (i >= 0 && i < kp->nws)
        kp->ws[i].holders--;
    if (kp->conn_guard[c] >= 0) {
        (void)pidfd_send_signal(kp->conn_guard[c], SIGKILL, NULL, 0);
        close(kp->conn_guard[c]);
    }
    close(kp->p[c].fd);
    kp->p[c] = kp->p[kp->np - 1];
    kp->conn_ws[c] = kp->conn_ws[kp->np - 1];
    kp->conn_guard[c] = kp->conn_guard[kp->np - 1];
    kp->np--;
}

static void
on_conn(struct keeper *kp, int c)
{
    char req[REQ_MAX], cbuf[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {.iov_base = req, .iov_len = sizeof(req)};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t n = recvmsg(kp->p[c].fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    const char *why;

    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        drop_conn(kp, c); /* the launcher ended: its kernel is gone or restarting */
        return;
    }
    if (kp->conn_ws[c] >= 0) { /* held: the kernel's pidfd, or a broken rule */
        if (!on_guard(kp, c, req, n, &m))
            drop_conn(kp, c);
        return;
    }
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
            for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int extra;
                memcpy(&extra, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
                close(extra); /* a hold carries none */
            }
    why = on_hold(kp, c, req, (size_t)n);
    answer(kp->p[c].fd, why, kp->ns);
    if (why)
        drop_conn(kp, c);
}

static void
on_accept(struct keeper *kp)
{
    int fd = accept4(kp->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

    if (fd < 0)
        return;
    if (kp->np >= kp->cap) {
        close(fd); /* at the cap: that kernel does not start */
        return;
    }
    kp->p[kp->np] = (struct pollfd){.fd = fd, .events = POLLIN};
    kp->conn_guard[kp->np] = -1;
    kp->conn_ws[kp->np++] = -1;
}

/* Workspaces nobody holds whose kernel Jupyter has forgotten. */
static void
sweep(struct keeper *kp)
{
    for (int i = kp->nws - 1; i >= 0; i--) {
        struct stat st;
        if (kp->ws[i].holders == 0 && lstat(kp->ws[i].conn, &st) != 0 && errno == ENOENT)
            unmount_ws(kp, i);
    }
}

static long long
mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
keeper_loop(struct keeper *kp)
{
    long long next = mono_ms() + SWEEP_MS;

    for (;;) {
        long long left = next - mono_ms();
        int n = poll(kp->p, (nfds_t)kp->np, left > 0 ? (int)left : 0);

        if (n < 0 && errno != EINTR)
            return;
        if (n > 0 && kp->p[1].revents) {
            /* the Jupyter server ended: its kernels and workspaces with it,
             * also a kernel whose launcher did not end (one a flood of its
             * output kept from its SIGTERM, say) */
            for (int c = 2; c < kp->np; c++)
                if (kp->conn_guard[c] >= 0)
                    (void)pidfd_send_signal(kp->conn_guard[c], SIGKILL, NULL, 0);
            return;
        }
        if (n > 0 && kp->p[0].revents & POLLIN)
            on_accept(kp);
        for (int c = kp->np - 1; n > 0 && c >= 2; c--)
            if (kp->p[c].revents)
                on_conn(kp, c);
        if (mono_ms() >= next) {
            sweep(kp);
            next = mono_ms() + SWEEP_MS;
        }
    }
}

/* Limits, namespaces, the poll set; "0" on the ready pipe. The listening
 * socket is 3, the server's pidfd 4, the ready pipe 5. */
static bool
keeper_setup(struct keeper *kp, int ready, const char **step)
{
    struct rlimit rl;
    sigset_t none;

    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    kp->cap = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < HOLDERS + 64
                  ? (int)rl.rlim_cur - 64
                  : HOLDERS;
    kp->ws = calloc(HOLDERS, sizeof(*kp->ws));
    kp->p = calloc((size_t)kp->cap, sizeof(*kp->p));
    kp->conn_ws = calloc((size_t)kp->cap, sizeof(*kp->conn_ws));
    kp->conn_guard = calloc((size_t)kp->cap, sizeof(*kp->conn_guard));
    if (kp->cap < 8 || !kp->ws || !kp->p || !kp->conn_ws || !kp->conn_guard) {
        *step = "memory";
        return false;
    }
    if ((*step = keeper_namespaces(kp)) != NULL)
        return false;
    *step = "the namespaces' descriptors";
    kp->ns[0] = open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
    kp->ns[1] = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    kp->ns[2] = pidfd_open(getpid(), 0);
    kp->p[0] = (struct pollfd){.fd = kp->listen_fd, .events = POLLIN};
    kp->p[1] = (struct pollfd){.fd = kp->server_fd, .events = POLLIN};
    kp->np = 2;
    return kp->ns[0] >= 0 && kp->ns[1] >= 0 && kp->ns[2] >= 0 && write(ready, "0", 1) == 1;
}

/* --- The launcher's side ------------------------------------------------------ */

int
cx_keeper_unix_at(int dirfd, const char *name, bool listening)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

    snprintf(a.sun_path, sizeof(a.sun_path), "/proc/self/fd/%d/%s", dirfd, name);
    if (fd < 0)
        return -1;
    if (listening ? bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 128) != 0
                  : connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The keeper: its own session, the four descriptors it needs, the rest
 * closed. Never returns. */
static void
keeper_main(int listen_fd, int server_fd, const char *runtime, int ready)
{
    struct keeper kp = {.listen_fd = 3, .server_fd = 4, .runtime = runtime};
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);

    if (setsid() < 0 || null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0)
        _exit(1);
    if (fork() != 0)
        _exit(0); /* not the launcher's child: Jupyter ends launchers, not this */
    /* in order, never onto one still needed */
    int fds[3] = {listen_fd, server_fd, ready}, hi = 64;
    for (int i = 0; i < 3; i++)
        if ((fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, hi + i)) < 0)
            _exit(1);
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], 3 + i) < 0)
            _exit(1);
    close_range(6, ~0U, 0);
    const char *step = NULL;
    if (!keeper_setup(&kp, 5, &step)) {
        char why[128];
        snprintf(why, sizeof(why), "1%s: %s", step ? step : "setup", strerror(errno));
        (void)!write(5, why, strlen(why));
        _exit(1);
    }
    close(5);
    keeper_loop(&kp);
    _exit(0);
}

/* Under the lock: a keeper that answers, else a new one. */
static enum cx_err
start_keeper(int rfd, const char *runtime, pid_t server, char *msg, size_t msglen)
{
    int pipefd[2], lfd, sfd = pidfd_open(server, 0), st;

    if (sfd >= 0 && getppid() != server) { /* it died and its pid went to another */
        close(sfd);
        sfd = -1;
        errno = ESRCH;
    }
    char why[128] = "";
    ssize_t n;
    pid_t pid;

    if (sfd < 0 || pipe2(pipefd, O_CLOEXEC) != 0) {
        snprintf(msg, msglen, "workspace keeper: no pidfd or pipe: %s", strerror(errno));
        if (sfd >= 0)
            close(sfd);
        return CX_ERR_IO;
    }
    (void)unlinkat(rfd, SOCK_NAME, 0); /* a dead keeper's */
    if ((mkdirat(rfd, ROOT_NAME, 0700) != 0 && errno != EEXIST) ||
        (lfd = cx_keeper_unix_at(rfd, SOCK_NAME, true)) < 0) {
        snprintf(msg, msglen, "workspace keeper: cannot listen: %s", strerror(errno));
        close(sfd);
        close(pipefd[0]);
        close(pipefd[1]);
        return CX_ERR_IO;
    }
    pid = fork();
    if (pid == 0)
        keeper_main(lfd, sfd, runtime, pipefd[1]);
    close(lfd);
    close(sfd);
    close(pipefd[1]);
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    n = read(pipefd[0], why, sizeof(why) - 1);
    close(pipefd[0]);
    if (n >= 1 && why[0] == '0')
        return CX_OK;
    why[n > 0 ? n : 0] = '\0';
    snprintf(msg, msglen, "the workspace keeper did not start (%s)", n > 1 ? why + 1 : "no answer");
    return CX_ERR_IO;
}

/* A connection to the runtime directory's keeper, started if need be. */
static int
keeper_connect(int rfd, const char *runtime, pid_t server, char *msg, size_t msglen)
{
    int lock = openat(rfd, LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    int fd = -1;

    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        snprintf(msg, msglen, "workspace keeper: cannot lock: %s", strerror(errno));
        if (lock >= 0)
            close(lock);
        return -1;
    }
    fd = cx_keeper_unix_at(rfd, SOCK_NAME, false);
    if (fd < 0 && start_keeper(rfd, runtime, server, msg, msglen) == CX_OK)
        fd = cx_keeper_unix_at(rfd, SOCK_NAME, false);
    if (fd < 0 && !*msg)
        snprintf(msg, msglen, "workspace keeper: cannot connect: %s", strerror(errno));
    close(lock);
    return fd;
}

/* The keeper's answer to our hold: "0" with three descriptors. */
static enum cx_err
hold_answer(struct cx_keeper *k, char *msg, size_t msglen)
{
    char text[128], buf[CMSG_SPACE(3 * sizeof(int))];
    struct iovec iov = {.iov_base = text, .iov_len = sizeof(text) - 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf, .msg_controllen = sizeof(buf)};
    struct cmsghdr *h;
    ssize_t n = recvmsg(k->sock, &m, MSG_CMSG_CLOEXEC);

    h = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
    /* a keeper of the launcher before the template sends no pidfd of its
     * own: kernels start with bwrap until the gateway restarts */
    if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
        (h->cmsg_len == CMSG_LEN(3 * sizeof(int)) || h->cmsg_len == CMSG_LEN(2 * sizeof(int)))) {
        int ns[3] = {-1, -1, -1}, got = h->cmsg_len == CMSG_LEN(3 * sizeof(int)) ? 3 : 2;
        memcpy(ns, CMSG_DATA(h), (size_t)got * sizeof(int));
        if (text[0] == '0') {
            k->userns = ns[0];
            k->mntns = ns[1];
            k->pidfd = ns[2];
            return CX_OK;
        }
        for (int i = 0; i < got; i++)
            close(ns[i]);
    }
    text[n > 0 ? n : 0] = '\0';
    snprintf(msg, msglen, "the workspace keeper refused: %s", n > 1 ? text + 1 : "no answer");
    return CX_ERR_IO;
}

enum cx_err
cx_keeper_hold(const struct cx_sandbox_conn *c, uint64_t size, pid_t server, struct cx_keeper *k,
               char *msg, size_t msglen)
{
    char req[REQ_MAX];
    int rfd = open(c->runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int n;
    enum cx_err rc = CX_ERR_IO;

    *k = (struct cx_keeper){.sock = -1, .userns = -1, .mntns = -1, .pidfd = -1};
    msg[0] = '\0';
    if (rfd < 0 || !name_ok(c->base)) {
        snprintf(msg, msglen, "workspace keeper: no runtime directory, or an odd kernel name");
        goto out;
    }
    k->sock = keeper_connect(rfd, c->runtime, server, msg, msglen);
    if (k->sock >= 0) {
        /* a keeper that stopped answering fails the start, never hangs it */
        struct timeval tv = {.tv_sec = 10};
        (void)setsockopt(k->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        (void)setsockopt(k->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    n = snprintf(req, sizeof(req), "H%llu%c%s%c%s", (unsigned long long)size, 0, c->base, 0,
                 c->path);
    if (k->sock >= 0 && n > 0 && (size_t)n < sizeof(req) &&
        send(k->sock, req, (size_t)n + 1, MSG_NOSIGNAL) == n + 1)
        rc = hold_answer(k, msg, msglen);
    else if (k->sock >= 0)
        snprintf(msg, msglen, "workspace keeper: the request failed");
    snprintf(k->files, sizeof(k->files), "%s/" ROOT_NAME "/%s/files", c->runtime, c->base);
    snprintf(k->state, sizeof(k->state), "%s/" ROOT_NAME "/%s/state", c->runtime, c->base);
out:
    if (rfd >= 0)
        close(rfd);
    if (rc)
        cx_keeper_release(k);
    return rc;
}

enum cx_err
cx_keeper_enter(const struct cx_keeper *k)
{
    return setns(k->userns, CLONE_NEWUSER) == 0 && setns(k->mntns, CLONE_NEWNS) == 0 ? CX_OK
                                                                                     : CX_ERR_IO;
}

enum cx_err
cx_keeper_guard(const struct cx_keeper *k, int pidfd)
{
    char buf[CMSG_SPACE(sizeof(int))], word[1] = {'P'};
    struct iovec iov = {.iov_base = word, .iov_len = 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf, .msg_controllen = sizeof(buf)};
    struct cmsghdr *h;

    memset(buf, 0, sizeof(buf));
    h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &pidfd, sizeof(int));
    return sendmsg(k->sock, &m, MSG_NOSIGNAL) == 1 ? CX_OK : CX_ERR_IO;
}

void
cx_keeper_release(struct cx_keeper *k)
{
    if (k->sock >= 0)
        close(k->sock);
    if (k->userns >= 0)
        close(k->userns);
    if (k->mntns >= 0)
        close(k->mntns);
    if (k->pidfd >= 0)
        close(k->pidfd);
    k->sock = k->userns = k->mntns = k->pidfd = -1;
}
