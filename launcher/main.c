/* codexec-kernel-launcher [--config SANDBOX_CONF] [--language L] CONNECTION_FILE
 *
 * The sandboxed kernelspec's argv: the Jupyter server runs it, as the
 * gateway's user, for every start and restart of a kernel. It prepares a
 * fresh private runtime directory and a cgroup (sandbox.c), starts
 * ipykernel inside bubblewrap with a seccomp filter (in the workspace
 * keeper's namespaces, keeper.c: the workspace outlives the kernel's
 * process), waits until the kernel
 * has bound its sockets and written its connection file, seals that
 * directory read-only inside the sandbox, then points the server's endpoint
 * names at it. It stays as the kernel's supervisor: signals go to bwrap,
 * and when the kernel ends its cgroup and private directory are removed and
 * its exit status is passed on. With --language javascript or r the
 * kernel is the front kernel (front.py), whose child, the language's own
 * kernel, is spared by a run's end as the kernel is. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "keeper.h"
#include "relay.h"
#include "sandbox.h"
#include "template.h"

#define READY_TIMEOUT_MS (120 * 1000)

static void
say(const char *what, const char *detail)
{
    fprintf(stderr, "codexec-kernel-launcher: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
}

static long long
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What the launcher holds while the kernel runs. */
struct launch {
    struct cx_sandbox_conf sc;
    enum cx_sandbox_language lang;
    struct cx_sandbox_conn conn;
    struct cx_sandbox_cgroup cg;
    struct cx_keeper keeper; /* the workspace, kept across the kernel's restarts */
    char private_dir[CX_SANDBOX_PATH_MAX + 64];
    int seccomp_fd, inotify_fd, signal_fd;
    pid_t bwrap;   /* our child (a kernel from the template: none) */
    bool template; /* the kernel was forked from the template (template.h) */
    struct cx_template_kernel tk;
    int sandbox;            /* the sandbox's first process (bwrap's info) */
    int kernel;             /* the kernel process, once sealed (-1: unknown) */
    int inner;              /* a front kernel's child, once sealed (-1: none) */
    int init_fd, kernel_fd; /* pidfds of the sandbox's first process and the kernel */
    int inner_fd;           /* ... and of the inner kernel */
    struct cx_relay *relay; /* the server's connections to the kernel (relay.h) */
    int out_fd;             /* the read end of the kernel's stdout and stderr */
    size_t out_logged;
    int64_t out_window; /* the second (cx_now_us) out_read counts in */
    size_t out_read;
    unsigned ready; /* bits: sockets bound (0-4), connection file written (5) */
    int status;     /* of bwrap, once reaped */
    bool reaped;
};

#define READY_ALL ((1u << (CX_SANDBOX_PORTS + 1)) - 1)

/* The child: into the cgroup, then bwrap, with /dev/null as stdin and a
 * pipe to the launcher as stdout and stderr (never the server's log: that
 * would let a kernel read and truncate it). Never returns. */
static void
exec_bwrap(struct launch *l, int info_fd, int out_fd, sigset_t *old)
{
    char **argv = NULL;
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

    sigprocmask(SIG_SETMASK, old, NULL);
    if (null < 0 || dup2(null, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0)
        _exit(127);
    if (cx_sandbox_cgroup_join(&l->cg)) {
        say("cannot join the kernel's cgroup", NULL);
        _exit(127);
    }
    /* bwrap's mount namespace is then a copy of the keeper's: the
     * workspace is there to bind */
    if (cx_keeper_enter(&l->keeper)) {
        say("cannot enter the workspace keeper's namespaces", strerror(errno));
        _exit(127);
    }
    if (cx_sandbox_argv(&l->sc, l->lang, &l->conn, l->private_dir, l->keeper.files, l->keeper.state,
                        l->seccomp_fd, info_fd, &argv)) {
        say("out of memory", NULL);
        _exit(127);
    }
    execv(argv[0], argv);
    say("cannot run bubblewrap", strerror(errno));
    _exit(127);
}

/* bwrap writes {"child-pid": N} to the info descriptor once the sandbox's
 * first process exists. */
static int
read_sandbox_pid(int fd)
{
    char buf[1024];
    size_t len = 0;
    long long deadline = now_ms() + 30000;
    json_t *root;
    int pid = -1;

    while (len < sizeof(buf) - 1 && !memchr(buf, '}', len) && now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;

        if (poll(&p, 1, 1000) <= 0)
            continue;
        n = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    root = json_loadb(buf, len, JSON_DISABLE_EOF_CHECK, NULL);
    if (json_is_integer(json_object_get(root, "child-pid")))
        pid = (int)json_integer_value(json_object_get(root, "child-pid"));
    json_decref(root);
    return pid;
}

static void
note_event(struct launch *l, const char *name, uint32_t mask)
{
    char want[300];

    snprintf(want, sizeof(want), "%s.json", l->conn.base);
    if ((mask & IN_CLOSE_WRITE) && !strcmp(name, want)) {
        l->ready |= 1u << CX_SANDBOX_PORTS;
        return;
    }
    for (int i = 0; i < l->conn.nports; i++) {
        snprintf(want, sizeof(want), "%s-%d", l->conn.ip_name, l->conn.ports[i]);
        if ((mask & (IN_CREATE | IN_MOVED_TO)) && !strcmp(name, want))
            l->ready |= 1u << i;
    }
}

/* The kernel's own stdout and stderr: until the kernel is sealed (ipykernel
 * starting, no tenant code yet) up to 16 KiB of it go to the server's log,
 * for diagnosing a start that fails; after that it is tenant output, read
 * and dropped (ipykernel copies here what it captures of the descriptors,
 * a subprocess's output, as it sends it to the client). It is read
 * OUT_READ_MAX a wake-up and OUT_RATE a second at most (then not polled
 * until the second ends: the kernel's writes wait; the relay lets less
 * content through), so a flood of it costs this process, in the gateway's
 * cgroup, little and never keeps it from its signals and relay (an
 * attacker's review: 4 KiB reads until the pipe was empty, for ever). */
#define OUT_READ_MAX (256u << 10)
#define OUT_RATE     (32u << 20)

static void
pump_output(struct launch *l, bool log)
{
    char buf[65536];
    size_t got = 0;
    ssize_t n;

    while (got < OUT_READ_MAX && (n = read(l->out_fd, buf, sizeof(buf))) > 0) {
        got += (size_t)n;
        if (!log || l->out_logged >= 16384)
            continue;
        size_t keep = (size_t)n < 16384 - l->out_logged ? (size_t)n : 16384 - l->out_logged;
        if (write(2, buf, keep) < 0)
            break;
        l->out_logged += keep;
    }
    l->out_read += got;
}

/* Whether the kernel's output is polled now (OUT_RATE); if not, *timeout
 * is cut to the end of the second. */
static bool
output_wanted(struct launch *l, int *timeout)
{
    int64_t now = cx_now_us(), left;

    if (now - l->out_window >= 1000000) {
        l->out_window = now;
        l->out_read = 0;
    }
    if (l->out_read < OUT_RATE)
        return true;
    left = (l->out_window + 1000000 - now) / 1000 + 1;
    if (left < *timeout)
        *timeout = (int)left;
    return false;
}

/* Whether the process of a pidfd has ended. */
static bool
pidfd_ended(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};

    return fd < 0 || (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR)));
}

static void
reap(struct launch *l)
{
    int st;

    if (l->reaped)
        return;
    if (l->template) {
        /* not our child: its status is the template's to reap */
        if (pidfd_ended(l->tk.pidfd)) {
            l->status = 0;
            l->reaped = true;
        }
    } else if (waitpid(l->bwrap, &st, WNOHANG) == l->bwrap) {
        l->status = st;
        l->reaped = true;
    }
}

/* Ends the sandbox: bwrap, or the template's kernel (pid 1 of its pid
 * namespace: every process of the sandbox ends with it). */
static void
end_sandbox(struct launch *l)
{
    if (l->reaped)
        return;
    if (l->template)
        (void)pidfd_send_signal(l->tk.pidfd, SIGKILL, NULL, 0);
    else
        kill(l->bwrap, SIGKILL);
}

/* The descriptor that is readable once the sandbox ended, besides
 * SIGCHLD: the template's kernel's pidfd (-1: none, bwrap is our child). */
static int
end_fd(const struct launch *l)
{
    return l->template && !l->reaped ? l->tk.pidfd : -1;
}

/* Whether the sandbox's init, the kernel (and its inner kernel) are still
 * the processes the seal saw (their pidfds answer): never a pid reused
 * since. */
static bool
still_ours(const struct launch *l)
{
    return l->init_fd >= 0 && l->kernel_fd >= 0 && pidfd_send_signal(l->init_fd, 0, NULL, 0) == 0 &&
           pidfd_send_signal(l->kernel_fd, 0, NULL, 0) == 0 &&
           (l->lang == CX_SANDBOX_PYTHON ||
            (l->inner_fd >= 0 && pidfd_send_signal(l->inner_fd, 0, NULL, 0) == 0));
}

/* A run's end, from the relay (relay.h), before the reply that ends it
 * passes: every process of the sandbox but its init and the kernel (and a
 * front kernel's inner kernel) ends now, whatever the kernel's own code
 * does. */
static void
end_run_processes(void *ctx)
{
    struct launch *l = ctx;
    int killed = 0;

    if (l->kernel <= 0 || l->reaped)
        return;
    if (!still_ours(l)) {
        /* the kernel or its inner kernel ended: the sandbox goes with it
         * (never a sandbox whose run's processes outlive the run) */
        say("the kernel's processes are not the ones sealed: ending the sandbox", NULL);
        end_sandbox(l);
        return;
    }
    if (cx_sandbox_reap(l->cg.n ? &l->cg : NULL, l->sandbox, l->kernel, l->inner, &killed))
        say("could not end the run's processes", NULL);
}

/* A front kernel's inner kernel ended (its pidfd is readable): the front
 * should end too, and the server restart the pair; whatever the sandbox
 * still runs is ended now, from outside. */
static void
on_inner_end(struct launch *l)
{
    say("the inner kernel ended: ending the sandbox", NULL);
    close(l->inner_fd);
    l->inner_fd = -1;
    end_sandbox(l);
}

/* One signal from the signalfd: a child's exit, or one to pass on. */
static void
on_signal(struct launch *l)
{
    struct signalfd_siginfo si;

    while (read(l->signal_fd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGCHLD)
            reap(l);
        else if (l->reaped)
            continue;
        else if (!l->template)
            kill(l->bwrap, (int)si.ssi_signo);
        else if (si.ssi_signo == SIGINT) /* the kernel has a handler while it runs a cell */
            (void)pidfd_send_signal(l->tk.pidfd, SIGINT, NULL, 0);
        else /* pid 1 of its namespace: a signal it has no handler for would not end it */
            end_sandbox(l);
    }
}

/* Waits until every socket is bound and the connection file written, the
 * kernel dies, or the deadline passes. */
static bool
wait_ready(struct launch *l)
{
    long long deadline = now_ms() + READY_TIMEOUT_MS;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));

    while (l->ready != READY_ALL && !l->reaped) {
        struct pollfd p[4] = {{.fd = l->inotify_fd, .events = POLLIN},
                              {.fd = l->signal_fd, .events = POLLIN},
                              {.fd = l->out_fd, .events = POLLIN},
                              {.fd = end_fd(l), .events = POLLIN}};
        long long left = deadline - now_ms();
        ssize_t n;

        if (left <= 0)
            return false;
        if (poll(p, 4, (int)(left > 1000 ? 1000 : left)) < 0 && errno != EINTR)
            return false;
        if (p[2].revents)
            pump_output(l, true);
        if (p[1].revents)
            on_signal(l);
        if (p[3].revents)
            reap(l);
        if (!p[0].revents)
            continue;
        n = read(l->inotify_fd, buf, sizeof(buf));
        for (char *q = buf; n > 0 && q + sizeof(struct inotify_event) <= buf + n;) {
            struct inotify_event e; /* copied out: no cast that assumes alignment */

            memcpy(&e, q, sizeof(e));
            if (e.len && q + sizeof(e) + e.len <= buf + n)
                note_event(l, q + sizeof(e), e.mask);
            q += sizeof(e) + e.len;
        }
    }
    return l->ready == READY_ALL;
}

/* Seals the private directory in a child (entering namespaces changes the
 * process that does it). */
static bool
seal(struct launch *l)
{
    struct stat expect;
    pid_t pid;
    int st;

    if (stat(l->private_dir, &expect) != 0)
        return false;
    pid = fork();
    if (pid == 0) {
        char msg[CX_MSG_MAX];
        if (cx_sandbox_seal(l->sandbox, l->conn.runtime, &expect, msg, sizeof(msg))) {
            say(msg, strerror(errno));
            _exit(1);
        }
        _exit(0);
    }
    if (pid < 0)
        return false;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return false;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The kernel's sockets and connection file are there and sealed; or why
 * not, said. */
static bool
ready_and_sealed(struct launch *l)
{
    char what[96];
    bool ready = wait_ready(l);

    /* Linux gives a user 128 inotify instances by default
     * (fs.inotify.max_user_instances): held for a kernel's life, they
     * would bound the live kernels, not the ones starting at once */
    close(l->inotify_fd);
    l->inotify_fd = -1;
    if (!ready) {
        if (l->out_fd >= 0)
            pump_output(l, true); /* what it said before it ended */
        if (l->reaped)
            snprintf(what, sizeof(what),
                     "the sandbox ended (status %d) before the kernel was ready", l->status);
        else
            snprintf(what, sizeof(what),
                     "the kernel was not ready in time (readiness 0x%x of 0x%x)", l->ready,
                     READY_ALL);
        say(what, NULL);
        return false;
    }
    return seal(l);
}

static void
supervise(struct launch *l)
{
    static struct pollfd p[4 + CX_RELAY_POLL_MAX];

    while (!l->reaped) {
        int timeout = 1000, wanted = -1, nr;

        p[0] = (struct pollfd){.fd = l->signal_fd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = output_wanted(l, &timeout) ? l->out_fd : -1,
                               .events = POLLIN}; /* (-1: ignored) */
        p[2] = (struct pollfd){.fd = l->inner_fd, .events = POLLIN};
        p[3] = (struct pollfd){.fd = end_fd(l), .events = POLLIN};
        nr = cx_relay_poll_fds(l->relay, p + 4, CX_RELAY_POLL_MAX, &wanted);
        if (wanted >= 0 && wanted < timeout)
            timeout = wanted;
        int n = poll(p, 4 + (nfds_t)nr, timeout);

        if (n > 0 && p[3].revents)
            reap(l);
        if (n > 0 && p[2].revents)
            on_inner_end(l);
        if (n > 0 && p[1].revents & (POLLIN | POLLHUP))
            pump_output(l, false);
        if (n > 0 && p[1].revents & POLLHUP && !(p[1].revents & POLLIN)) {
            close(l->out_fd); /* every writer is gone */
            l->out_fd = -1;
        }
        if (n > 0 && p[0].revents)
            on_signal(l);
        else if (n == 0)
            reap(l); /* a SIGCHLD the signalfd folded into another: once a second */
        if (n > 0)
            cx_relay_handle(l->relay, p + 4, nr);
    }
}

static void
cleanup(struct launch *l)
{
    int rfd = open(l->conn.runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    cx_relay_free(l->relay);
    if (l->tk.pidfd >= 0)
        close(l->tk.pidfd);
    cx_keeper_release(&l->keeper);
    cx_sandbox_cgroup_remove(&l->cg);
    if (rfd >= 0 && l->private_dir[0]) {
        if (cx_sandbox_remove_tree(rfd, strrchr(l->private_dir, '/') + 1))
            say("could not remove the private directory", NULL);
    }
    if (rfd >= 0)
        close(rfd);
}

/* A JavaScript or R kernel's binary: a regular executable file (what the
 * sandbox binds), R under /usr (its R_HOME must be in the sandbox). */
static bool
language_installed(const struct launch *l)
{
    const char *bin = l->lang == CX_SANDBOX_R ? l->sc.r : l->sc.deno;
    struct stat st;

    if (l->lang == CX_SANDBOX_PYTHON)
        return true;
    if (stat(bin, &st) != 0 || !S_ISREG(st.st_mode) || access(bin, X_OK) != 0) {
        say(l->lang == CX_SANDBOX_R ? "R is not installed (sandbox.conf: r)"
                                    : "Deno is not installed (sandbox.conf: deno)",
            bin);
        return false;
    }
    if (l->lang == CX_SANDBOX_R && strncmp(bin, "/usr/", 5) != 0) {
        say("R must be installed under /usr (sandbox.conf: r)", bin);
        return false;
    }
    return true;
}

/* Everything up to the fork. */
static bool
prepare(struct launch *l, const char *config, const char *conn_path, pid_t server, sigset_t *block)
{
    char msg[CX_MSG_MAX], cwd[PATH_MAX];

    if (cx_sandbox_conf_load(&l->sc, config, msg, sizeof(msg))) {
        say("bad sandbox configuration", msg);
        return false;
    }
    if (!language_installed(l))
        return false;
    if (!getcwd(cwd, sizeof(cwd)) ||
        cx_sandbox_conn_read(conn_path, cwd, &l->conn, msg, sizeof(msg)) ||
        cx_keeper_hold(&l->conn, l->sc.max_workspace_bytes, server, &l->keeper, msg, sizeof(msg)) ||
        cx_sandbox_runtime_prepare(&l->conn, l->private_dir, sizeof(l->private_dir), msg,
                                   sizeof(msg)) ||
        cx_sandbox_cgroup_create(&l->sc, l->conn.base, &l->cg, msg, sizeof(msg)) ||
        cx_sandbox_seccomp_fd(&l->seccomp_fd, msg, sizeof(msg))) {
        say(msg, NULL);
        return false;
    }
    l->inotify_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (l->inotify_fd < 0 || inotify_add_watch(l->inotify_fd, l->private_dir,
                                               IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
        say("cannot watch the private directory", strerror(errno));
        return false;
    }
    l->signal_fd = signalfd(-1, block, SFD_CLOEXEC | SFD_NONBLOCK);
    if (l->signal_fd < 0) {
        say("signalfd failed", strerror(errno));
        return false;
    }
    return true;
}

static int
exit_code(const struct launch *l)
{
    if (!l->reaped)
        return 1;
    if (WIFEXITED(l->status))
        return WEXITSTATUS(l->status);
    return 128 + (WIFSIGNALED(l->status) ? WTERMSIG(l->status) : 0);
}

/* The signals read from the signalfd (the child restores old). */
static void
block_signals(sigset_t *block, sigset_t *old)
{
    static const int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT};

    sigemptyset(block);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(block, sigs[i]);
    sigprocmask(SIG_BLOCK, block, old);
}

/* Once sealed: the sandbox's init and the kernel, by pidfd (the run's
 * end reaps all but them); a front kernel's inner kernel is its one child
 * then (started before its connection file was written; no tenant code
 * has run yet). false when a front kernel's child can't be told: the first
 * run's end would take it. */
static bool
know_the_kernel(struct launch *l)
{
    if (l->template) { /* pid 1 of its namespaces: the init and the kernel in one */
        l->kernel = l->tk.pid;
        l->init_fd = dup(l->tk.pidfd);
        l->kernel_fd = dup(l->tk.pidfd);
        return l->init_fd >= 0 && l->kernel_fd >= 0;
    }
    l->init_fd = pidfd_open(l->sandbox, 0);
    l->kernel = cx_sandbox_kernel_pid(l->sandbox);
    l->kernel_fd = l->kernel > 0 ? pidfd_open(l->kernel, 0) : -1;
    if (l->kernel < 0 || l->init_fd < 0 || l->kernel_fd < 0) {
        say("the kernel process can't be told apart: its run's processes end only from inside",
            NULL);
        return l->lang == CX_SANDBOX_PYTHON;
    }
    if (l->lang == CX_SANDBOX_PYTHON)
        return true;
    l->inner = cx_sandbox_kernel_pid(l->kernel);
    l->inner_fd = l->inner > 0 ? pidfd_open(l->inner, 0) : -1;
    if (l->inner < 0 || l->inner_fd < 0) {
        say("the front kernel's inner kernel can't be told apart", NULL);
        l->inner = -1;
        return false;
    }
    return true;
}

/* Forks bwrap with the kernel in the sandbox, the kernel's output to
 * l->out_fd, and learns the sandbox's pid (bwrap's --info-fd; l->sandbox
 * <= 0 when it could not be read). false when bwrap could not be started
 * at all (l->bwrap is then no process to signal). */
static bool
start_sandbox(struct launch *l, sigset_t *old)
{
    int info[2], out[2];

    if (pipe2(info, O_CLOEXEC) != 0)
        return false;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(info[0]);
        close(info[1]);
        return false;
    }
    l->bwrap = fork();
    if (l->bwrap == 0) {
        /* bwrap writes to its end of the pipe: not close-on-exec there */
        if (fcntl(info[1], F_SETFD, 0) != 0)
            _exit(127);
        exec_bwrap(l, info[1], out[1], old);
    }
    close(info[1]);
    close(out[1]);
    l->out_fd = out[0];
    (void)fcntl(l->out_fd, F_SETFL, O_NONBLOCK);
    if (l->bwrap < 0) {
        say("fork failed", strerror(errno));
        close(info[0]);
        return false;
    }
    l->sandbox = read_sandbox_pid(info[0]);
    close(info[0]);
    return true;
}

/* A Python kernel forked from the template (template.h), when
 * sandbox.conf asks for it: false (said why) when it can't be had, and
 * the kernel starts with bwrap. */
static bool
start_from_template(struct launch *l, pid_t server)
{
    char msg[CX_MSG_MAX];
    int out[2];

    if (!cx_template_wanted(&l->sc, l->lang, &l->conn, server))
        return false;
    if (pipe2(out, O_CLOEXEC) != 0)
        return false;
    if (cx_template_start(&l->sc, &l->conn, l->private_dir, &l->keeper, &l->cg, l->seccomp_fd,
                          out[1], server, &l->tk, msg, sizeof(msg)) != CX_OK) {
        say(msg, NULL);
        say("starting the kernel with bubblewrap instead (for a minute)", NULL);
        close(out[0]);
        close(out[1]);
        return false;
    }
    close(out[1]);
    l->out_fd = out[0];
    (void)fcntl(l->out_fd, F_SETFL, O_NONBLOCK);
    l->template = true;
    l->sandbox = l->tk.pid;
    return true;
}

/* The kernel did not start (l->bwrap is a process of ours, or the
 * template's kernel): it is killed and reaped; the launcher's exit code,
 * bwrap's when it failed. */
static int
stop_unstarted(struct launch *l)
{
    if (l->template) {
        struct pollfd p = {.fd = l->tk.pidfd, .events = POLLIN};
        say("the kernel did not start; stopping it", NULL);
        end_sandbox(l);
        (void)poll(&p, 1, 2000);
        return 1;
    }
    if (!l->reaped) {
        say("the kernel did not start in the sandbox; stopping it", NULL);
        kill(l->bwrap, SIGKILL);
        while (!l->reaped && waitpid(l->bwrap, &l->status, 0) == l->bwrap)
            l->reaped = true;
    }
    return l->reaped && WIFEXITED(l->status) && WEXITSTATUS(l->status) ? WEXITSTATUS(l->status) : 1;
}

/* The launcher's own process: it ends when the server dies (OOM-killed,
 * say: the one started in its place knows none of its kernels), and is
 * not readable or writable through /proc by another process of the
 * gateway's user (nor is the keeper it starts): a kernel template is one,
 * and this process holds power over every kernel's namespaces. */
static bool
guard_self(pid_t server)
{
    return prctl(PR_SET_PDEATHSIG, SIGTERM) == 0 && getppid() == server &&
           prctl(PR_SET_DUMPABLE, 0) == 0;
}

int
main(int argc, char **argv)
{
    struct launch l = {.seccomp_fd = -1,
                       .inotify_fd = -1,
                       .signal_fd = -1,
                       .sandbox = -1,
                       .kernel = -1,
                       .inner = -1,
                       .init_fd = -1,
                       .kernel_fd = -1,
                       .inner_fd = -1,
                       .out_fd = -1,
                       .keeper = {.sock = -1, .userns = -1, .mntns = -1, .pidfd = -1},
                       .tk = {.pidfd = -1, .pid = -1}};
    pid_t server = getppid();
    const char *config = NULL, *conn_path;
    sigset_t block, old;
    int argi = 1, code = 1, lang;
    char msg[CX_MSG_MAX];

    for (; argi + 2 < argc && argv[argi][0] == '-'; argi += 2) {
        if (!strcmp(argv[argi], "--config"))
            config = argv[argi + 1];
        else if (!strcmp(argv[argi], "--language") &&
                 (lang = cx_sandbox_language_parse(argv[argi + 1])) >= 0)
            l.lang = (enum cx_sandbox_language)lang;
        else
            break;
    }
    if (argc != argi + 1 || argv[argi][0] == '-') {
        fprintf(stderr, "usage: codexec-kernel-launcher [--config SANDBOX_CONF] "
                        "[--language python|javascript|r] CONNECTION_FILE\n");
        return 2;
    }
    conn_path = argv[argi];
    block_signals(&block, &old);
    if (!guard_self(server))
        goto out;
    if (!prepare(&l, config, conn_path, server, &block) ||
        (!start_from_template(&l, server) && !start_sandbox(&l, &old)))
        goto out;
    /* the server's endpoints: the relay's, never the kernel's own */
    if (l.sandbox <= 0 || !ready_and_sealed(&l) ||
        (cx_relay_open(&l.conn, l.private_dir, &l.relay, msg, sizeof(msg)) &&
         (say("cannot relay the kernel's sockets", msg), true)) ||
        !know_the_kernel(&l)) {
        code = stop_unstarted(&l);
        goto out;
    }
    cx_relay_on_run_end(l.relay, end_run_processes, &l);
    /* what the start freed (the seccomp filter's making, mostly) goes
     * back: a launcher lives as long as its kernel, one per conversation */
    (void)malloc_trim(0);
    supervise(&l);
    code = exit_code(&l);
out:
    cleanup(&l);
    cx_sandbox_conf_cleanup(&l.sc);
    return code;
}
