/* launcher/sandbox.c: sandbox.conf, the connection file, removing what a kernel
 * left (never following it), the bwrap command line, the seccomp filter, the
 * run's end and the kernel's end on cgroup v2. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/filter.h>
#include <linux/seccomp.h>

#include "../../launcher/relay.h"
#include "../../launcher/sandbox.h"
#include "tap.h"

static const struct {
    const char *text;
    int rc;
    const char *err;
} conf_cases[] = {
    {"", CX_OK, NULL},
    {"memory = 1G\nmax_workspace_bytes = 512M\n", CX_OK, NULL},
    {"memory = 1G\nmax_workspace_bytes = 1G\n", CX_ERR_INVALID, "above memory"},
    {"cgroup = ../escape\n", CX_ERR_INVALID, "cgroup"},
    {"cgroup = a/../b\n", CX_ERR_INVALID, "cgroup"},
    {"cgroup = /abs\n", CX_ERR_INVALID, "cgroup"},
    {"cgroup = codexec-kernels/sub\n", CX_OK, NULL},
    {"python_env = relative/env\n", CX_ERR_INVALID, "absolute path"},
    {"python_env = /opt/../etc\n", CX_ERR_INVALID, "absolute path"},
    {"python_env = /opt/env\n", CX_OK, NULL},
    {"cache_dir = /var/cache/x\n\x01", CX_ERR_INVALID, NULL},
    {"pids = 1\n", CX_ERR_INVALID, "out of range"},
    {"cpu_weight = 0\n", CX_ERR_INVALID, "out of range"},
    {"bogus = 1\n", CX_ERR_INVALID, "unknown key"},
};

static void
test_conf(void)
{
    struct cx_sandbox_conf sc;
    char err[256];

    ok(cx_sandbox_conf_load(&sc, NULL, err, sizeof(err)) == CX_OK, "defaults");
    is_int(sc.memory, 2ULL << 30, "memory 2 GiB by default");
    is_int(sc.max_workspace_bytes, 1ULL << 30, "workspace 1 GiB by default");
    is_int(sc.pids, 256, "256 processes by default");
    is_int(sc.cpu_percent, 100, "one core by default");
    is_str(sc.bwrap, "/usr/bin/bwrap", "bwrap's path");
    cx_sandbox_conf_cleanup(&sc);
    for (size_t i = 0; i < sizeof(conf_cases) / sizeof(conf_cases[0]); i++) {
        err[0] = '\0';
        int rc = cx_sandbox_conf_parse(&sc, "s.conf", conf_cases[i].text, err, sizeof(err));
        is_int(rc, conf_cases[i].rc, "conf case %zu", i);
        if (conf_cases[i].err && !strstr(err, conf_cases[i].err))
            ok(0, "conf case %zu names the problem (%s)", i, err);
        if (rc == CX_OK)
            cx_sandbox_conf_cleanup(&sc);
    }
}

static char dir[64];

static void
write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static const char conn_json[] =
    "{\"transport\": \"ipc\", \"ip\": \"%s/kernel-abc-ipc\", \"shell_port\": 1, "
    "\"iopub_port\": 2, \"stdin_port\": 3, \"control_port\": 4, \"hb_port\": 5, \"key\": \"k\"}";

/* Pumps the relay until nothing happens for a poll's 20 ms. */
static void
pump(struct cx_relay *r)
{
    struct pollfd p[CX_RELAY_POLL_MAX];

    for (int i = 0; i < 200; i++) {
        int timeout, n = cx_relay_poll_fds(r, p, CX_RELAY_POLL_MAX, &timeout);
        if (poll(p, (nfds_t)n, 20) <= 0)
            return;
        cx_relay_handle(r, p, n);
    }
}

/* What a server connection reads, up to max bytes, after the relay ran. */
static ssize_t
take(int fd, unsigned char *buf, size_t max)
{
    ssize_t got = 0, n = -1;

    while ((size_t)got < max && (n = recv(fd, buf + got, max - (size_t)got, MSG_DONTWAIT)) > 0)
        got += n;
    return got ? got : n; /* 0: closed; -1: nothing yet */
}

/* Appends a ZMTP frame (short form) to b. */
static size_t
zframe(unsigned char *b, unsigned char flags, const char *body, size_t len)
{
    b[0] = flags;
    b[1] = (unsigned char)len;
    memcpy(b + 2, body, len);
    return len + 2;
}

/* A ZMTP greeting and a READY command: what a kernel's socket says first. */
static size_t
zgreeting(unsigned char *out)
{
    size_t len = 64;

    memset(out, 0, 64);
    out[0] = 0xff, out[9] = 0x7f, out[10] = 3, out[11] = 1;
    memcpy(out + 12, "NULL", 4);
    len += zframe(out + len, 0x04, "\005READY", 6);
    return len;
}

/* A message from the kernel (a reply, header hdr) or the server (a
 * request) with this header and parent header. */
static size_t
zmsg(unsigned char *out, const char *hdr, const char *parent)
{
    size_t len = 0;

    len += zframe(out + len, 0x01, "<IDS|MSG>", 9);
    len += zframe(out + len, 0x01, "sig", 3);
    len += zframe(out + len, 0x01, hdr, strlen(hdr));
    len += zframe(out + len, 0x01, parent, strlen(parent));
    len += zframe(out + len, 0x01, "{}", 2);
    len += zframe(out + len, 0x00, "{\"status\":\"ok\"}", 15);
    return len;
}

static size_t
zreply(unsigned char *out, const char *parent)
{
    return zmsg(out, "{\"msg_type\":\"execute_reply\"}", parent);
}

struct run_end_seen {
    int srv; /* the server's connection */
    int calls;
    ssize_t had; /* bytes the server could read at the call */
};

static void
on_run_end(void *ctx)
{
    struct run_end_seen *s = ctx;
    unsigned char b[4096];

    s->calls++;
    s->had = recv(s->srv, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT);
}

/* A connection through the relay: the server's end in *srv, the kernel's
 * in *krn. */
static bool
relay_connect(struct cx_relay *r, const char *endpoint, int kernel_listen, int *srv, int *krn)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};

    memcpy(sa.sun_path, endpoint, strlen(endpoint) + 1);
    *krn = -1;
    *srv = socket(AF_UNIX, SOCK_STREAM, 0);
    if (*srv < 0 || connect(*srv, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        return false;
    pump(r);
    *krn = accept(kernel_listen, NULL, NULL);
    return *krn >= 0;
}

/* The run's end on the shell channel: a reply to a run-end request the
 * server sent calls the launcher before its last bytes pass, once; a reply
 * to any other, or a kernel's own run-end id, does not; a parent header
 * with an escape is refused. */
static void
test_relay_run_end(struct cx_relay *r, const char *endpoint, int kernel_listen)
{
    unsigned char out[4096], in[4096];
    char hdr[200];
    struct run_end_seen seen = {0};
    uint64_t refused = cx_relay_refused(r);
    size_t len, half, greet;
    int krn;

    cx_relay_on_run_end(r, on_run_end, &seen);
    ok(relay_connect(r, endpoint, kernel_listen, &seen.srv, &krn),
       "run end: the server connects to the shell endpoint");
    greet = zgreeting(out);
    ok(write(krn, out, greet) == (ssize_t)greet && write(seen.srv, out, greet) == (ssize_t)greet,
       "run end: both greet");
    /* the server's run-end request, on its way to the kernel */
    snprintf(hdr, sizeof(hdr), "{\"msg_id\": \"%s0e4c2b51\", \"msg_type\": \"execute_request\"}",
             CX_RELAY_RUN_END);
    len = zmsg(out, hdr, "{}");
    ok(write(seen.srv, out, len) == (ssize_t)len, "run end: the server sends a run-end request");
    pump(r);
    ok(take(krn, in, sizeof(in)) == (ssize_t)(greet + len), "run end: ... which the kernel gets");
    pump(r);
    take(seen.srv, in, sizeof(in)); /* the kernel's greeting */
    len = zreply(out, "{\"msg_id\":\"0e4c2b51\",\"msg_type\":\"execute_request\"}");
    ok(write(krn, out, len) == (ssize_t)len, "run end: a reply to another request");
    pump(r);
    ok(take(seen.srv, in, sizeof(in)) == (ssize_t)len && seen.calls == 0,
       "run end: ... passes, no run's end (%d)", seen.calls);
    len = zreply(out, "{\"msg_id\":\"" CX_RELAY_RUN_END "ffff\"}");
    ok(write(krn, out, len) == (ssize_t)len, "run end: a run-end id the server never sent");
    pump(r);
    ok(take(seen.srv, in, sizeof(in)) == (ssize_t)len && seen.calls == 0,
       "run end: ... passes, no run's end (%d)", seen.calls);
    /* the reply to the run-end request, in two writes */
    snprintf(hdr, sizeof(hdr), "{\"msg_id\":\"%s0e4c2b51\",\"msg_type\":\"execute_request\"}",
             CX_RELAY_RUN_END);
    len = zreply(out, hdr);
    half = len - 4; /* its parent header whole, not its last frame */
    ok(write(krn, out, half) == (ssize_t)half, "run end: all but the end of the reply");
    pump(r);
    ok(seen.calls == 0, "run end: ... is not its end yet");
    ok(write(krn, out + half, len - half) == (ssize_t)(len - half), "run end: ... the rest");
    pump(r);
    ok(seen.calls == 1 && seen.had == (ssize_t)half,
       "run end: the launcher is called before the reply's end passed (%d calls, %zd of %zu bytes)",
       seen.calls, seen.had, len);
    ok(take(seen.srv, in, sizeof(in)) == (ssize_t)len && !memcmp(in, out, len),
       "run end: ... then the reply passes byte for byte");
    ok(write(krn, out, len) == (ssize_t)len, "run end: the same reply again");
    pump(r);
    ok(take(seen.srv, in, sizeof(in)) == (ssize_t)len && seen.calls == 1 &&
           cx_relay_run_ends(r) == 1,
       "run end: ... passes, once per request (%d calls)", seen.calls);
    /* an escape in the parent header: no parser decides, the header goes */
    len = zreply(out, "{\"msg_id\":\"\\u0063odexec-run-end-0e4c2b51\"}");
    ok(write(krn, out, len) == (ssize_t)len, "run end: a parent header with an escape");
    pump(r);
    ok(take(seen.srv, in, sizeof(in)) == 0 && cx_relay_refused(r) == refused + 1,
       "run end: ... closes the connection, nothing of it passed");
    cx_relay_on_run_end(r, NULL, NULL);
    close(seen.srv);
    close(krn);
}

/* Greetings the server's ZeroMQ would read otherwise than the relay: a
 * ZMTP 2 one (12 bytes, other framing), a first frame that isn't READY. */
static void
test_relay_greetings(struct cx_relay *r, const char *endpoint, int kernel_listen)
{
    unsigned char out[256], in[256];
    uint64_t refused = cx_relay_refused(r);
    size_t len;
    int srv, krn;

    ok(relay_connect(r, endpoint, kernel_listen, &srv, &krn), "greeting: a connection");
    len = zgreeting(out);
    out[10] = 2; /* ZMTP 2.0 */
    ok(write(krn, out, len) == (ssize_t)len, "greeting: a kernel greets as ZMTP 2");
    pump(r);
    ok(take(srv, in, sizeof(in)) == 0 && cx_relay_refused(r) == refused + 1,
       "greeting: ... is refused");
    close(srv);
    close(krn);
    ok(relay_connect(r, endpoint, kernel_listen, &srv, &krn), "greeting: another connection");
    len = zgreeting(out) - 8; /* without READY */
    len += zframe(out + len, 0x00, "x", 1);
    ok(write(krn, out, len) == (ssize_t)len, "greeting: a message before READY");
    pump(r);
    ok(take(srv, in, sizeof(in)) == 0 && cx_relay_refused(r) == refused + 2,
       "greeting: ... is refused");
    close(srv);
    close(krn);
}

/* The relay passes a kernel's well-formed traffic on byte for byte, and
 * closes a connection whose message breaks a rule (too many frames). */
static void
test_relay(struct cx_relay *r, const char *endpoint, int kernel_listen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    unsigned char out[4096], in[4096];
    size_t len = 0;
    int srv = socket(AF_UNIX, SOCK_STREAM, 0), krn = -1;
    ssize_t got;

    memcpy(sa.sun_path, endpoint, strlen(endpoint) + 1);
    ok(srv >= 0 && connect(srv, (struct sockaddr *)&sa, sizeof(sa)) == 0,
       "relay: the server connects");
    pump(r);
    krn = accept(kernel_listen, NULL, NULL);
    ok(krn >= 0, "relay: ... and the kernel sees a connection");
    if (krn < 0) {
        close(srv);
        return;
    }
    memset(out, 0, 64); /* a greeting's 64 bytes */
    out[0] = 0xff, out[9] = 0x7f, out[10] = 3, out[11] = 1;
    memcpy(out + 12, "NULL", 4);
    len = 64;
    len += zframe(out + len, 0x04, "\005READY", 6);
    len += zframe(out + len, 0x01, "", 0); /* the topic */
    len += zframe(out + len, 0x01, "<IDS|MSG>", 9);
    len += zframe(out + len, 0x01, "sig", 3);
    len += zframe(out + len, 0x01, "{\"msg_type\":\"stream\"}", 21);
    len += zframe(out + len, 0x01, "{}", 2);
    len += zframe(out + len, 0x01, "{}", 2);
    len += zframe(out + len, 0x00, "{\"text\":\"hi\"}", 13);
    ok(write(krn, out, len) == (ssize_t)len, "relay: the kernel sends a message");
    pump(r);
    got = take(srv, in, sizeof(in));
    ok(got == (ssize_t)len && !memcmp(in, out, len), "relay: the server gets it byte for byte");
    ok(write(srv, "\x01\x00", 2) == 2, "relay: the server sends");
    pump(r);
    ok(take(krn, in, sizeof(in)) == 2, "relay: ... and the kernel gets it");
    /* 40 frames in one message */
    len = 0;
    for (int i = 0; i < 40; i++)
        len += zframe(out + len, i < 39 ? 0x01 : 0x00, "x", 1);
    ok(write(krn, out, len) == (ssize_t)len, "relay: a message of 40 frames");
    pump(r);
    got = take(srv, in, sizeof(in));
    ok(got == 0, "relay: the connection is closed, nothing of it passed (%zd)", got);
    ok(cx_relay_refused(r) == 1, "relay: counted as refused");
    close(srv);
    close(krn);
}

static void
test_conn(void)
{
    struct cx_sandbox_conn c;
    char path[256], text[512], msg[256], private_dir[512], link[600];
    struct stat st;

    snprintf(path, sizeof(path), "%s/kernel-abc.json", dir);
    snprintf(text, sizeof(text), conn_json, dir);
    write_text(path, text);
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_OK, "a connection file reads");
    is_str(c.base, "kernel-abc", "its name");
    is_str(c.ip_name, "kernel-abc-ipc", "the endpoints' name");
    is_int(c.nports, 5, "five ports");
    ok(cx_sandbox_conn_read("kernel-abc.json", dir, &c, msg, sizeof(msg)) == CX_OK,
       "a relative path is taken from the working directory");

    /* A symlink where the file should be is never followed. */
    snprintf(path, sizeof(path), "%s/kernel-lnk.json", dir);
    snprintf(text, sizeof(text), "%s/kernel-abc.json", dir);
    ok(symlink(text, path) == 0, "planted a symlink");
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) != CX_OK, "a symlink is refused");

    snprintf(path, sizeof(path), "%s/kernel-tcp.json", dir);
    write_text(path, "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"shell_port\": 1}");
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_ERR_INVALID &&
           strstr(msg, "ipc"),
       "tcp is refused: the sandbox has no network");
    snprintf(path, sizeof(path), "%s/kernel-far.json", dir);
    write_text(path, "{\"transport\": \"ipc\", \"ip\": \"/elsewhere/k-ipc\", \"shell_port\": 1, "
                     "\"iopub_port\": 2, \"stdin_port\": 3, \"control_port\": 4, \"hb_port\": 5}");
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_ERR_INVALID,
       "endpoints outside the runtime directory are refused");
    snprintf(path, sizeof(path), "%s/kernel-port.json", dir);
    write_text(path, "{\"transport\": \"ipc\", \"ip\": \"k-ipc\", \"shell_port\": 0}");
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_ERR_INVALID,
       "a missing or zero port is refused");
    ok(cx_sandbox_conn_read("/a/../b/k.json", "/", &c, msg, sizeof(msg)) == CX_ERR_INVALID,
       "a path with .. is refused");
    ok(cx_sandbox_conn_read("/tmp/x.txt", "/", &c, msg, sizeof(msg)) == CX_ERR_INVALID,
       "a name without .json is refused");

    /* A fresh private directory each time, and the kernel's copy in it. */
    snprintf(path, sizeof(path), "%s/kernel-abc.json", dir);
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_OK, "read again");
    ok(cx_sandbox_runtime_prepare(&c, private_dir, sizeof(private_dir), msg, sizeof(msg)) == CX_OK,
       "a private directory");
    ok(stat(private_dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700, "0700");
    snprintf(link, sizeof(link), "%s/kernel-abc.json", private_dir);
    ok(stat(link, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600,
       "the kernel's copy of the connection file");
    /* The previous kernel replaced its copy with a symlink: the next launch
     * makes a new directory and removes the old one without following. */
    unlink(link);
    snprintf(text, sizeof(text), "%s/victim", dir);
    write_text(text, "victim");
    ok(symlink(text, link) == 0, "planted a symlink in the private directory");
    {
        char second[512];
        struct cx_relay *relay = NULL;
        int kernel_fds[5] = {-1, -1, -1, -1, -1};
        ok(cx_sandbox_runtime_prepare(&c, second, sizeof(second), msg, sizeof(msg)) == CX_OK,
           "a second launch");
        ok(strcmp(second, private_dir) != 0, "gets a new directory");
        ok(stat(private_dir, &st) != 0, "the old one is gone");
        ok(stat(text, &st) == 0 && st.st_size == 6, "the victim is untouched");
        /* a link where a socket should be is refused */
        char ep[600];
        ok((size_t)snprintf(ep, sizeof(ep), "%s/kernel-abc-ipc-1", second) < sizeof(ep) &&
               symlink(text, ep) == 0,
           "a symlink for an endpoint");
        ok(cx_relay_open(&c, second, &relay, msg, sizeof(msg)) == CX_ERR_INVALID,
           "is not relayed for the server");
        cx_relay_free(relay); /* (NULL unless the check above failed) */
        relay = NULL;
        unlink(ep);
        for (int i = 1; i <= 5; i++) { /* the kernel binds its five sockets */
            struct sockaddr_un sa = {.sun_family = AF_UNIX};
            int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
            snprintf(ep, sizeof(ep), "%s/kernel-abc-ipc-%d", second, i);
            if (strlen(ep) >= sizeof(sa.sun_path))
                printf("# %s is too long for a socket\n", ep);
            memcpy(sa.sun_path, ep, strlen(ep) < sizeof(sa.sun_path) ? strlen(ep) : 0);
            if (sfd < 0 || bind(sfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(sfd, 8))
                printf("# bind %s failed\n", ep);
            kernel_fds[i - 1] = sfd;
        }
        ok(cx_relay_open(&c, second, &relay, msg, sizeof(msg)) == CX_OK, "endpoints relayed");
        snprintf(path, sizeof(path), "%s/kernel-abc-ipc-2", dir);
        ok(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode),
           "the server's endpoint is the relay's socket, not a link into the sandbox");
        if (relay)
            test_relay(relay, path, kernel_fds[1]);
        snprintf(path, sizeof(path), "%s/kernel-abc-ipc-1", dir);
        if (relay) {
            test_relay_run_end(relay, path, kernel_fds[0]);
            test_relay_greetings(relay, path, kernel_fds[0]);
        }
        cx_relay_free(relay);
        for (int i = 0; i < 5; i++)
            if (kernel_fds[i] >= 0)
                close(kernel_fds[i]);
    }
}

/* The longest runtime directory the stack allows (57 bytes: packaging/
 * stack.py) with a kernel's real name: the relay's endpoints still bind
 * (found: the relay's temporary name overflowed a socket address). */
static void
test_relay_long_runtime(void)
{
    static const char id[] = "kernel-4887e573-6818-46d2-af7c-717268c7c827";
    char runtime[sizeof(dir) + 64], path[256], text[512], msg[256], private_dir[512];
    struct cx_sandbox_conn c;
    struct cx_relay *relay = NULL;
    int fds[5] = {-1, -1, -1, -1, -1}, pfd;

    snprintf(runtime, sizeof(runtime), "%s/%.*s", dir, (int)(56 - strlen(dir)),
             "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr");
    ok(mkdir(runtime, 0700) == 0, "a runtime directory of %zu bytes", strlen(runtime));
    snprintf(path, sizeof(path), "%s/%s.json", runtime, id);
    snprintf(text, sizeof(text),
             "{\"transport\": \"ipc\", \"ip\": \"%s/%s-ipc\", \"shell_port\": 1, \"iopub_port\": 2,"
             " \"stdin_port\": 3, \"control_port\": 4, \"hb_port\": 5, \"key\": \"k\"}",
             runtime, id);
    write_text(path, text);
    ok(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_OK &&
           cx_sandbox_runtime_prepare(&c, private_dir, sizeof(private_dir), msg, sizeof(msg)) ==
               CX_OK,
       "its kernel's private directory");
    pfd = open(private_dir, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < 5 && pfd >= 0; i++) { /* the kernel's sockets, bound as it sees them */
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        fds[i] = socket(AF_UNIX, SOCK_STREAM, 0);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s-ipc-%d", pfd, id, i + 1);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&sa, sizeof(sa)) || listen(fds[i], 8))
            printf("# bind %s failed\n", sa.sun_path);
    }
    ok(cx_relay_open(&c, private_dir, &relay, msg, sizeof(msg)) == CX_OK, "relayed: %s",
       relay ? "" : msg);
    snprintf(path, sizeof(path), "%s/%s-ipc-5", runtime, id);
    {
        struct stat st;
        ok(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && strlen(path) == 107,
           "the server's endpoint, %zu bytes, is there", strlen(path));
    }
    cx_relay_free(relay);
    for (int i = 0; i < 5; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (pfd >= 0)
        close(pfd);
}

static void
test_remove_tree(void)
{
    char p[512], victim[256];
    struct stat st;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);

    snprintf(victim, sizeof(victim), "%s/outside", dir);
    mkdir(victim, 0700);
    snprintf(p, sizeof(p), "%s/outside/keep", dir);
    write_text(p, "keep");
    snprintf(p, sizeof(p), "%s/t", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof(p), "%s/t/link", dir);
    ok(symlink(victim, p) == 0, "a symlink to a directory outside");
    snprintf(p, sizeof(p), "%s/t/locked", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof(p), "%s/t/locked/f", dir);
    write_text(p, "f");
    snprintf(p, sizeof(p), "%s/t/locked", dir);
    chmod(p, 0); /* os.chmod('d', 0), as a kernel would */
    snprintf(p, sizeof(p), "%s/t/fifo", dir);
    mkfifo(p, 0600);
    ok(cx_sandbox_remove_tree(dfd, "t") == CX_OK, "the tree is removed");
    snprintf(p, sizeof(p), "%s/t", dir);
    ok(lstat(p, &st) != 0, "nothing of it is left");
    snprintf(p, sizeof(p), "%s/outside/keep", dir);
    ok(stat(p, &st) == 0, "what the symlink named is untouched");
    ok(cx_sandbox_remove_tree(dfd, "missing") == CX_OK, "a missing tree is not an error");

    /* deeper than the cap: refused, not a stack or descriptor overflow */
    snprintf(p, sizeof(p), "%s/deep", dir);
    mkdir(p, 0700);
    {
        int fd = open(p, O_RDONLY | O_DIRECTORY);
        for (int i = 0; i < 80 && fd >= 0; i++) {
            int next;
            mkdirat(fd, "d", 0700);
            next = openat(fd, "d", O_RDONLY | O_DIRECTORY);
            close(fd);
            fd = next;
        }
        if (fd >= 0)
            close(fd);
    }
    ok(cx_sandbox_remove_tree(dfd, "deep") == CX_ERR_TOO_LARGE, "80 levels: refused at 64");
    close(dfd);
}

/* The command line of a JavaScript and an R kernel: the front kernel
 * (python -P -c, its source) over the language's binary; Deno outside
 * /usr bound read-only, and no address-space limit for V8. */
static void
test_argv_languages(const struct cx_sandbox_conn *c)
{
    struct cx_sandbox_conf sc;
    char err[256], joined[65536];
    char **argv = NULL;

    need(cx_sandbox_conf_parse(&sc, "s", "deno = /opt/deno/bin/deno\n", err, sizeof(err)) == CX_OK,
         "conf for the languages");
    for (int lang = CX_SANDBOX_JAVASCRIPT; lang <= CX_SANDBOX_R; lang++) {
        joined[0] = '\0';
        ok(cx_sandbox_argv(&sc, (enum cx_sandbox_language)lang, c, "/run/x/sbx-kernel-abc.123456",
                           NULL, NULL, 7, 9, &argv) == CX_OK,
           "argv (%d)", lang);
        for (char **a = argv; a && *a; a++) {
            strncat(joined, *a, sizeof(joined) - strlen(joined) - 2);
            strncat(joined, " ", sizeof(joined) - strlen(joined) - 1);
        }
        ok(strstr(joined, "/usr/bin/python3 -P -c # codexec front kernel") != NULL,
           "the front kernel from the launcher's own copy (%d)", lang);
        if (lang == CX_SANDBOX_R) {
            ok(strstr(joined, " --inner r --path /usr/bin/R -f ") != NULL, "R's IRkernel");
            ok(strstr(joined, "--as=") != NULL, "R: an address-space limit");
            ok(strstr(joined, "/opt/deno") == NULL, "R: no Deno bound");
        } else {
            ok(strstr(joined, " --inner javascript --path /opt/deno/bin/deno -f ") != NULL,
               "Deno's kernel");
            ok(strstr(joined, "--as=") == NULL && strstr(joined, "--data=4294967296 ") != NULL,
               "JavaScript: writable memory bounded (RLIMIT_DATA), not V8's reserved cage");
            ok(strstr(joined, "--ro-bind /opt/deno/bin/deno /opt/deno/bin/deno") != NULL &&
                   strstr(joined, "--ro-bind /opt/deno/bin/deno") <
                       strstr(joined, "--remount-ro /"),
               "Deno outside /usr bound read-only, before the root is sealed");
        }
        ok(strstr(joined, "exec_lines") == NULL, "no matplotlib hook outside Python");
        ok(strstr(joined, " --IPKernelApp.ignore_cwd=True") != NULL,
           "the workspace is not on the front kernel's sys.path while it starts");
        cx_sandbox_argv_free(argv);
        argv = NULL;
    }
    ok(cx_sandbox_language_parse("r") == CX_SANDBOX_R &&
           cx_sandbox_language_parse("javascript") == CX_SANDBOX_JAVASCRIPT &&
           cx_sandbox_language_parse("python") == CX_SANDBOX_PYTHON &&
           cx_sandbox_language_parse("R") < 0 && cx_sandbox_language_parse("") < 0,
       "the launcher's --language words");
    cx_sandbox_conf_cleanup(&sc);
}

static void
test_argv(void)
{
    struct cx_sandbox_conf sc;
    struct cx_sandbox_conn c;
    char path[256], text[512], msg[256], err[256], joined[8192] = "";
    char **argv = NULL;

    snprintf(path, sizeof(path), "%s/kernel-abc.json", dir);
    snprintf(text, sizeof(text), conn_json, dir);
    write_text(path, text);
    need(cx_sandbox_conn_read(path, "/", &c, msg, sizeof(msg)) == CX_OK, "conn for argv");
    need(cx_sandbox_conf_parse(&sc, "s", "max_workspace_bytes = 300M\npython_env = /opt/env\n", err,
                               sizeof(err)) == CX_OK,
         "conf for argv");
    ok(cx_sandbox_argv(&sc, CX_SANDBOX_PYTHON, &c, "/run/x/sbx-kernel-abc.123456", NULL, NULL, 7, 9,
                       &argv) == CX_OK,
       "argv");
    for (char **a = argv; a && *a; a++) {
        strncat(joined, *a, sizeof(joined) - strlen(joined) - 2);
        strncat(joined, " ", sizeof(joined) - strlen(joined) - 1);
    }
    ok(strstr(joined, "--unshare-all --unshare-user") != NULL, "namespaces");
    {
        struct statvfs sv;
        bool rw = statvfs("/proc/sys/user", &sv) == 0 && !(sv.f_flag & ST_RDONLY);
        ok(rw == (strstr(joined, "--disable-userns") != NULL),
           "no nested user namespaces, where /proc/sys can say so");
    }
    ok(strstr(joined, "--cap-drop ALL") != NULL, "no capabilities");
    ok(strstr(joined, "--size 314572800 --tmpfs /workspace") != NULL, "a sized workspace");
    ok(strstr(joined, "--tmpfs /tmp") && strstr(joined, "--tmpfs /dev/shm"),
       "sized /tmp and /dev/shm");
    ok(strstr(joined, "--seccomp 7") && strstr(joined, "--info-fd 9"), "seccomp and info fds");
    ok(strstr(joined, "--ro-bind /opt/env /opt/env") != NULL, "the Python environment read-only");
    ok(strstr(joined, "/opt/env/bin/python3 -P -m ipykernel_launcher -f") != NULL,
       "its python, the workspace not first on sys.path");
    ok(strstr(joined, "--as=") != NULL, "an address-space limit");
    ok(strstr(joined, " --HistoryManager.hist_file=:memory:") != NULL, "history kept in memory");
    ok(strstr(joined, " --IPKernelApp.ignore_cwd=True") && strstr(joined, "sys.path.append('')"),
       "the workspace joins sys.path last, once the kernel is up");
    snprintf(text, sizeof(text), "--bind /run/x/sbx-kernel-abc.123456 %s ", dir);
    ok(strstr(joined, text) != NULL, "the private directory over the runtime directory");
    ok(strstr(joined, "--setenv CODEXEC_SANDBOX 1") != NULL, "the sandbox marker");
    ok(strstr(joined, "--bind /") == strstr(joined, "--bind /run/x"), "no other writable bind");
    cx_sandbox_argv_free(argv);
    cx_sandbox_conf_cleanup(&sc);
    test_argv_languages(&c);
}

/* Loads the filter into a child and tries what it must refuse. */
static void
test_seccomp(void)
{
    char msg[128];
    int fd = -1, status = 0;
    pid_t pid;

    ok(cx_sandbox_seccomp_fd(&fd, msg, sizeof(msg)) == CX_OK, "a filter is built");
    pid = fork();
    if (pid == 0) {
        static unsigned char buf[65536];
        ssize_t n = read(fd, buf, sizeof(buf));
        struct sock_fprog prog = {.len = (unsigned short)(n / 8),
                                  .filter = (struct sock_filter *)buf};
        int bad = 0;

        if (n <= 0 || n % 8 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
            _exit(100);
        bad |= (unshare(CLONE_NEWUSER) == 0 || errno != EPERM) << 0;
        bad |= (syscall(SYS_ptrace, 0, 0, 0, 0) == 0 || errno != EPERM) << 1;
        bad |= (syscall(SYS_bpf, 0, 0, 0) >= 0 || errno != EPERM) << 2;
        bad |= (syscall(SYS_clone3, NULL, 0) >= 0 || errno != ENOSYS) << 3;
        bad |= (syscall(SYS_io_uring_setup, 1, NULL) >= 0 || errno != EPERM) << 4;
        bad |= (getpid() <= 0) << 5; /* ordinary calls still work */
        _exit(bad);
    }
    waitpid(pid, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "unshare, ptrace, bpf, io_uring refused, clone3 ENOSYS, getpid fine (status %d)",
       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (fd >= 0)
        close(fd);
}

/* The processes listed in dir's cgroup.procs, into pids; their count. */
static int
cgroup_procs(const char *cgdir, long *pids, int max)
{
    char path[sizeof(((struct cx_sandbox_cgroup *)0)->dirs[0]) + 16];
    FILE *f;
    int n = 0;

    snprintf(path, sizeof(path), "%s/cgroup.procs", cgdir);
    if (!(f = fopen(path, "re")))
        return -1;
    while (n < max && fscanf(f, "%ld", &pids[n]) == 1)
        n++;
    fclose(f);
    return n;
}

/* The first child listed of pid (the oldest: the list is in the order
 * they were made); -1 for none. */
static int
first_child(int pid)
{
    char path[64], buf[8192];
    FILE *f;
    int child = -1;

    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", pid, pid);
    f = fopen(path, "re");
    if (f && fgets(buf, sizeof(buf), f))
        child = (int)strtol(buf, NULL, 10);
    if (f)
        fclose(f);
    return child > 0 ? child : -1;
}

/* A sandbox's shape in a cgroup, made for real: a host process (outside
 * the namespace, in the cgroup), the namespace's init, the "kernel" under
 * it, and the kernel's children: an inner kernel first (a front kernel's),
 * then 200 asleep and one forking without end.
 * Its pid (the host process) is returned, the init's into *init. */
static pid_t
start_tenant(const char *cgdir, pid_t *init)
{
    int fds[2];
    pid_t host;
    char path[sizeof(((struct cx_sandbox_cgroup *)0)->dirs[0]) + 16];

    if (pipe(fds))
        return -1;
    host = fork();
    if (host == 0) {
        pid_t b;
        int fd;

        snprintf(path, sizeof(path), "%s/cgroup.procs", cgdir);
        fd = open(path, O_WRONLY);
        if (fd < 0 || write(fd, "0", 1) != 1 || unshare(CLONE_NEWPID))
            _exit(1);
        close(fd);
        b = fork();
        if (b == 0) {            /* init */
            if (fork() == 0) {   /* the kernel */
                if (fork() == 0) /* its inner kernel (a front kernel's), first */
                    for (;;)
                        pause();
                for (int i = 0; i < 200; i++)
                    if (fork() == 0)
                        for (;;)
                            pause();
                if (fork() == 0) /* a forker that never stops */
                    for (;;) {
                        pid_t c = fork();
                        if (c == 0)
                            _exit(0);
                        if (c > 0)
                            waitpid(c, NULL, 0);
                    }
                for (;;)
                    pause();
            }
            for (;;)
                if (wait(NULL) < 0 && errno != EINTR)
                    pause();
        }
        if (write(fds[1], &b, sizeof(b)) != sizeof(b))
            _exit(1);
        waitpid(b, NULL, 0);
        _exit(0);
    }
    close(fds[1]);
    if (host < 0 || read(fds[0], init, sizeof(*init)) != sizeof(*init))
        *init = -1;
    close(fds[0]);
    return host;
}

/* cgroup v2 (a hierarchy of its own, mounted here: its freezer and
 * cgroup.kill need no controller): the run's end kills all but init and
 * the kernel, the forker included, and thaws; the kernel's end kills the
 * rest and removes the cgroup. */
static void
test_cgroup_v2_end(void)
{
    char mnt[sizeof(dir) + 8], events[sizeof(((struct cx_sandbox_cgroup *)0)->dirs[0]) + 16];
    struct cx_sandbox_cgroup cg = {.v2 = {true}, .mask = {7}, .n = 1};
    long pids[1024];
    pid_t host, init = -1;
    int kernel = -1, inner = -1, killed = 0, n = 0, status = 0;

    snprintf(mnt, sizeof(mnt), "%s/cg2", dir);
    if (mkdir(mnt, 0700) || mount("none", mnt, "cgroup2", 0, NULL)) {
        ok(0, "a cgroup2 hierarchy mounts (%s)", strerror(errno));
        return;
    }
    snprintf(cg.dirs[0], sizeof(cg.dirs[0]), "%s/k-test", mnt);
    ok(mkdir(cg.dirs[0], 0755) == 0, "a kernel's cgroup");
    host = start_tenant(cg.dirs[0], &init);
    for (int i = 0; i < 500 && (kernel < 0 || n < 205); i++, usleep(10000)) {
        kernel = init > 0 ? cx_sandbox_kernel_pid(init) : -1;
        n = cgroup_procs(cg.dirs[0], pids, 1024);
    }
    ok(host > 0 && kernel > 0 && n >= 205, "the tenant runs: %d processes", n);
    inner = first_child(kernel);
    ok(inner > 0, "the inner kernel: %d", inner);
    ok(cx_sandbox_kernel_pid(kernel) < 0, "a kernel with many children names none of them");
    ok(cx_sandbox_reap(&cg, init, kernel, inner, &killed) == CX_OK && killed >= 201,
       "the run's end: %d killed", killed);
    for (int i = 0; i < 200 && (n = cgroup_procs(cg.dirs[0], pids, 1024)) > 4; i++)
        usleep(10000);
    ok(n == 4 && kill(kernel, 0) == 0 && kill(inner, 0) == 0,
       "host process, init, kernel and inner kernel are left: %d", n);
    ok(first_child(kernel) == inner, "... the inner kernel among them");
    ok(cx_sandbox_reap(&cg, init, kernel, -1, &killed) == CX_OK && killed >= 1 &&
           kill(kernel, 0) == 0,
       "without it spared, the inner kernel goes too (%d)", killed);
    for (int i = 0; i < 200 && (n = cgroup_procs(cg.dirs[0], pids, 1024)) > 3; i++)
        usleep(10000);
    ok(cx_sandbox_reap(&cg, init, kernel, -1, &killed) == CX_OK && killed == 0 &&
           kill(kernel, 0) == 0,
       "the next run's end: nothing to kill (%d)", killed);
    snprintf(events, sizeof(events), "%s/cgroup.events", cg.dirs[0]);
    {
        FILE *f = fopen(events, "re");
        ok(f && fread(events, 1, sizeof(events) - 1, f) > 0 && strstr(events, "frozen 0"),
           "and thawed");
        if (f)
            fclose(f);
    }
    snprintf(events, sizeof(events), "%s", cg.dirs[0]);
    cx_sandbox_cgroup_remove(&cg);
    ok(access(events, F_OK) != 0, "the kernel's end: the cgroup is gone");
    for (int i = 0; i < 200 && waitpid(host, &status, WNOHANG) == 0; i++)
        usleep(10000);
    ok(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "its processes were killed");
    if (access(events, F_OK) == 0) { /* the test's own clean-up, for a failure */
        snprintf(events + strlen(events), sizeof(events) - strlen(events), "/cgroup.kill");
        FILE *f = fopen(events, "we");
        if (f)
            fclose((fputs("1", f), f));
        waitpid(host, &status, 0);
        *strrchr(events, '/') = '\0';
        for (int i = 0; i < 100 && rmdir(events) != 0; i++)
            usleep(10000);
    }
    if (umount2(mnt, MNT_DETACH) || rmdir(mnt))
        printf("# could not unmount %s\n", mnt);
}

int
main(void)
{
    /* the test's own writes to a peer the relay closed (after a failed
     * allocation) are write errors, not the end of the program (the
     * relay's sends use MSG_NOSIGNAL) */
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof(dir), "/tmp/cx-sandbox-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    test_conf();
    test_conn();
    test_relay_long_runtime();
    test_remove_tree();
    test_argv();
    test_seccomp();
    test_cgroup_v2_end();
    {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            printf("# could not remove %s\n", dir);
    }
    return tap_done();
}
