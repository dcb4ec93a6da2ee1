/* codexec-fcgi: the FastCGI server.
 *
 * A pool of worker threads accepts on one listening socket (a unix socket or
 * TCP address given by --listen or the config, fd 3 under systemd socket
 * activation, else fd 0 as spawned by a web server). SIGTERM and SIGINT stop
 * accepting; requests in flight finish; then the process exits. SIGHUP
 * reopens the log file. */
#include <curl/curl.h>
#include <errno.h>
#include <fcgiapp.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/codexec.h"
#include "request.h"
#include "router.h"

static int listen_fd;
static volatile int stopping; /* set under reaper_lock */
/* Written once when stopping: wakes the worker waiting for a connection.
 * The listening socket itself is never shut down: under socket activation
 * it is systemd's as well, and shutdown() would break it for the next
 * start (codexec.socket then fails with "resources"). */
static int stop_pipe[2] = {-1, -1};

/* One worker at a time waits in accept(): the holder of the acceptor role.
 * Having accepted, it hands the role to the worker that went idle last
 * (LIFO), not to whichever wakes first: the workers that just served stay
 * the ones that serve, with their PostgreSQL backends, prepared statements
 * and caches warm, and the rest stay cold until the load needs them.
 * (Measured: 80 workers taking turns cost a sequential client 30 ms per run
 * where two warm ones cost 17 ms; docs/performance.md.) */
struct idle_worker {
    pthread_cond_t cond;
    bool go;
};
static pthread_mutex_t accept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct idle_worker **idle_stack; /* cfg.workers slots */
static unsigned idle_count;
static bool role_free = true;

/* Waits for the acceptor role; false when stopping. */
static bool
take_role(struct idle_worker *me)
{
    bool got;

    pthread_mutex_lock(&accept_lock);
    if (role_free && !stopping) {
        role_free = false;
        pthread_mutex_unlock(&accept_lock);
        return true;
    }
    me->go = false;
    idle_stack[idle_count++] = me;
    while (!me->go && !stopping)
        pthread_cond_wait(&me->cond, &accept_lock);
    got = me->go;
    if (!got) {
        for (unsigned i = 0; i < idle_count; i++)
            if (idle_stack[i] == me) {
                idle_stack[i] = idle_stack[--idle_count];
                break;
            }
    }
    pthread_mutex_unlock(&accept_lock);
    return got;
}

static void
pass_role(void)
{
    pthread_mutex_lock(&accept_lock);
    if (idle_count > 0) {
        struct idle_worker *next = idle_stack[--idle_count];
        next->go = true;
        pthread_cond_signal(&next->cond);
    } else {
        role_free = true;
    }
    pthread_mutex_unlock(&accept_lock);
}

static void
wake_idle_workers(void)
{
    pthread_mutex_lock(&accept_lock);
    for (unsigned i = 0; i < idle_count; i++)
        pthread_cond_signal(&idle_stack[i]->cond);
    pthread_mutex_unlock(&accept_lock);
}
static struct cx_config cfg;
static struct cx_auth *auth;

static void
usage(FILE *f)
{
    fprintf(f, "usage: codexec-fcgi [--config FILE] [--listen ADDR] [--workers N] | --version\n"
               "  ADDR: /path/to.sock, unix:/path/to.sock, HOST:PORT or :PORT;\n"
               "  without it, fd 3 (systemd LISTEN_FDS) or fd 0 (spawned by a web server).\n");
}

static void
set_request_context(struct cx_req *r)
{
    const char *uri = cx_req_param(r, "REQUEST_URI");
    const char *q, *incoming = cx_req_param(r, "CODEXEC_REQUEST_ID");
    size_t n;

    /* The web server's request id ties our lines to its access log; take it
     * only when it looks like one (hex), else make our own. */
    if (incoming && strlen(incoming) >= 8 && strlen(incoming) <= 32 &&
        strspn(incoming, "0123456789abcdef") == strlen(incoming))
        snprintf(r->id, sizeof(r->id), "%s", incoming);
    else
        cx_random_id(r->id);
    cx_log_set_request_id(r->id);
    r->method = cx_req_param(r, "REQUEST_METHOD");
    if (!r->method)
        r->method = "GET";
    if (!uri)
        uri = "/";
    q = strchr(uri, '?');
    n = q ? (size_t)(q - uri) : strlen(uri);
    if (n >= sizeof(r->path))
        n = sizeof(r->path) - 1;
    memcpy(r->path, uri, n);
    r->path[n] = '\0';
    r->query = cx_req_param(r, "QUERY_STRING");
    if (!r->query)
        r->query = "";
}

/* Serves one request; false when a run thread took it over (the request
 * and its connection are then that thread's to end). */
static bool
serve(struct cx_ctx *cx, FCGX_Request *fr)
{
    struct cx_req r;

    memset(&r, 0, sizeof(r));
    r.t0_us = cx_now_us();
    r.fr = fr;
    r.cx = cx;
    cx_buf_init(&r.headers, 64 * 1024);
    set_request_context(&r);
    cx_router_dispatch(&r);
    if (r.deferred) {
        cx_log_set_request_id(NULL);
        return false;
    }
    cx_req_finish(&r);
    return true;
}

/* A new FastCGI request for the next connection; NULL (logged) when out
 * of memory. */
static FCGX_Request *
new_request(void)
{
    FCGX_Request *fr = malloc(sizeof(*fr));

    if (!fr || FCGX_InitRequest(fr, listen_fd, 0) != 0) {
        cx_log_err(0, "FCGX_InitRequest() failed");
        free(fr);
        return NULL;
    }
    return fr;
}

/* A thread's own database and gateway handles; false (logged) when out of
 * memory. ctx_close() frees them either way. */
static bool
ctx_open(struct cx_ctx *cx, const char *thread)
{
    if (cx_host_ctx_open(cx, &cfg, auth)) {
        cx_log_err(0, "%s start-up failed: out of memory", thread);
        return false;
    }
    return true;
}

static void
ctx_close(struct cx_ctx *cx)
{
    cx_host_ctx_close(cx);
}

/* accept() failed (EMFILE, ENFILE, ENOBUFS, ...): a worker never exits on
 * it. It says so (once a second at most) and backs off, up to a second,
 * so the process serves again as soon as descriptors are free. */
static void
accept_failed(unsigned *backoff_ms)
{
    static int64_t last_log;
    int64_t now = cx_now_ms(), last = __atomic_load_n(&last_log, __ATOMIC_RELAXED);
    struct timespec ts;

    if (now - last >= 1000 && __atomic_compare_exchange_n(&last_log, &last, now, false,
                                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        cx_log_err(errno, "accept() failed; backing off");
    cx_metrics_count(CX_COUNT_ACCEPT_ERRORS);
    *backoff_ms = *backoff_ms ? (*backoff_ms * 2 > 1000 ? 1000 : *backoff_ms * 2) : 10;
    ts.tv_sec = *backoff_ms / 1000;
    ts.tv_nsec = (long)(*backoff_ms % 1000) * 1000000;
    nanosleep(&ts, NULL);
}

/* Waits until the listening socket has a connection (true) or the process
 * is stopping (false). */
static bool
wait_for_connection(void)
{
    struct pollfd p[2] = {{.fd = listen_fd, .events = POLLIN},
                          {.fd = stop_pipe[0], .events = POLLIN}};

    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return !stopping; /* accept() says what is wrong */
        }
        if (p[1].revents)
            return false;
        if (p[0].revents)
            return true;
    }
}

static void *
worker_main(void *arg)
{
    struct cx_ctx cx;
    struct idle_worker me = {.go = false};
    FCGX_Request *fr = NULL;
    unsigned backoff_ms = 0;
    (void)arg;

    pthread_cond_init(&me.cond, NULL);
    if (!ctx_open(&cx, "worker") || !(fr = new_request()))
        goto out;
    cx_metrics_gauge_add(CX_GAUGE_WORKERS, 1);
    while (take_role(&me)) {
        int rc = stopping || !wait_for_connection() ? -1 : FCGX_Accept_r(fr);

        pass_role();
        if (rc < 0 && stopping)
            break;
        if (rc == -EAGAIN || rc == -EWOULDBLOCK)
            continue; /* the connection went away before its request: wait again */
        if (rc < 0) {
            accept_failed(&backoff_ms);
            continue;
        }
        backoff_ms = 0;
        if (!serve(&cx, fr)) {
            /* a run thread has it now */
            while (!(fr = new_request()) && !stopping)
                accept_failed(&backoff_ms);
            if (!fr)
                break;
            continue;
        }
        FCGX_Finish_r(fr);
        /* libfcgi keeps a connection the web server asked to keep
         * (fastcgi_keep_conn on) and would read the next request from it
         * alone, holding the acceptor role while it idles: close it. */
        if (fr->ipcFd >= 0)
            FCGX_Free(fr, 1);
    }
    if (fr)
        FCGX_Free(fr, 1);
    free(fr);
    cx_metrics_gauge_add(CX_GAUGE_WORKERS, -1);
out:
    ctx_close(&cx);
    pthread_cond_destroy(&me.cond);
    return NULL;
}

/* Closes expired sessions and expires stale runs every reaper_interval
 * (safe with several processes: rows are claimed with SKIP LOCKED). The
 * ticker, a thread of its own so that no slow sweep delays it, empties
 * idle pooled WebSockets every second. */
static pthread_mutex_t reaper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reaper_cond; /* on CLOCK_MONOTONIC: init_reaper_cond() */

static bool
init_reaper_cond(void)
{
    pthread_condattr_t a;
    bool ok = pthread_condattr_init(&a) == 0 &&
              pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0 &&
              pthread_cond_init(&reaper_cond, &a) == 0;

    pthread_condattr_destroy(&a);
    return ok;
}

/* Sleeps up to seconds, or until stopping; false once stopping. */
static bool
nap(unsigned seconds)
{
    struct timespec ts;
    bool go;

    clock_gettime(CLOCK_MONOTONIC, &ts); /* a clock set back does not stall us */
    ts.tv_sec += seconds;
    pthread_mutex_lock(&reaper_lock);
    if (!stopping)
        pthread_cond_timedwait(&reaper_cond, &reaper_lock, &ts);
    go = !stopping;
    pthread_mutex_unlock(&reaper_lock);
    return go;
}

static void *
ticker_main(void *arg)
{
    int64_t every = cx_host_watchdog_us() / 2, next = 0;
    (void)arg;

    cx_log_set_request_id("ticker");
    do {
        cx_host_tick();
        /* WatchdogSec=: the process is alive while its ticker is */
        if (every > 0 && cx_now_us() >= next) {
            cx_host_notify("WATCHDOG=1");
            next = cx_now_us() + every;
        }
    } while (nap(1));
    return NULL;
}

static void *
reaper_main(void *arg)
{
    struct cx_ctx cx;
    int64_t next_sweep = 0;
    (void)arg;

    cx_log_set_request_id("reaper");
    if (ctx_open(&cx, "reaper"))
        do
            cx_maint_reap(&cx, &next_sweep);
        while (nap(1));
    ctx_close(&cx);
    return NULL;
}

/* Follows the other processes' changes (the download cache's and the
 * revocation list's: lib/dlcache.c). */
static void *
watcher_main(void *arg)
{
    struct cx_ctx cx;
    (void)arg;

    cx_log_set_request_id("watcher");
    if (ctx_open(&cx, "watcher"))
        cx_dlcache_follow(&cx, &stopping);
    ctx_close(&cx);
    return NULL;
}

/* Keeps the pools of pre-started kernels full (a kernel_pool_size > 0). */
static void *
prestart_main(void *arg)
{
    struct cx_ctx cx;
    (void)arg;

    cx_log_set_request_id("pool");
    if (!ctx_open(&cx, "kernel pool"))
        goto out;
    do {
        int started;
        if (cx_prestart_fill(&cx, &started))
            cx_log_warn(0, "kernel pool: refill failed; retrying in %us", cfg.reaper_interval);
    } while (cx_prestart_wait(cfg.reaper_interval));
out:
    ctx_close(&cx);
    return NULL;
}

static int
open_listener(const char *addr)
{
    const char *path = addr;
    int fd;

    if (!addr || !*addr) {
        const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
        if (pid && fds && strtol(pid, NULL, 10) == (long)getpid() && strcmp(fds, "1") == 0)
            return 3;
        int type = 0;
        socklen_t len = sizeof(type);
        if (getsockopt(0, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
            fprintf(stderr, "%scodexec-fcgi: no --listen given and fd 0 is not a socket\n",
                    cx_log_stderr_prefix(CX_LOG_ERR));
            return -1;
        }
        return 0;
    }
    if (strncmp(addr, "unix:", 5) == 0)
        path = addr + 5;
    if (path[0] == '/')
        unlink(path); /* a stale socket from a previous run */
    fd = FCGX_OpenSocket(path, 1024);
    if (fd < 0) {
        fprintf(stderr, "%scodexec-fcgi: cannot listen on \"%s\": %s\n",
                cx_log_stderr_prefix(CX_LOG_ERR), addr, strerror(errno));
        return -1;
    }
    if (path[0] == '/' && chmod(path, cfg.socket_mode) != 0) {
        fprintf(stderr, "%scodexec-fcgi: chmod() of \"%s\" failed: %s\n",
                cx_log_stderr_prefix(CX_LOG_ERR), path, strerror(errno));
        return -1;
    }
    return fd;
}

/* The command line; -1 to go on, else the exit status. */
static int
parse_args(int argc, char **argv, const char **config_path, const char **listen_addr,
           unsigned *workers)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},  {"listen", required_argument, NULL, 'l'},
        {"workers", required_argument, NULL, 'w'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "c:l:w:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': *config_path = optarg; break;
        case 'l': *listen_addr = optarg; break;
        case 'w': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 1024) {
                usage(stderr);
                return 2;
            }
            *workers = (unsigned)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        case 'V': printf("codexec-fcgi %s\n", PACKAGE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    return -1;
}

/* Configuration, log, libraries, the secret and the listening socket. */
static bool
start_up(const char *config_path, unsigned workers, const char **listen_addr)
{
    char errbuf[512];

    if (cx_config_load(&cfg, config_path, errbuf, sizeof(errbuf))) {
        fprintf(stderr, "%scodexec-fcgi: %s\n", cx_log_stderr_prefix(CX_LOG_ERR), errbuf);
        return false;
    }
    if (workers)
        cfg.workers = workers;
    if (!*listen_addr)
        *listen_addr = cfg.listen;
    cx_log_set_json(cfg.log_format == 1);
    if (cx_log_open(cfg.log_file, cfg.log_level)) {
        fprintf(stderr, "%scodexec-fcgi: cannot open log file \"%s\": %s\n",
                cx_log_stderr_prefix(CX_LOG_ERR), cfg.log_file, strerror(errno));
        return false;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        cx_log_err(0, "curl_global_init() failed");
        return false;
    }
    if (cx_auth_new(cfg.secret_file, &auth))
        return false;
    if (cx_dlcache_init(cfg.download_cache_entries)) {
        cx_log_err(0, "the download cache (%u entries) could not be made",
                   cfg.download_cache_entries);
        return false;
    }
#ifdef CX_TEST_HOOKS
    cx_artifact_test_hooks();
#endif
    if (FCGX_Init() != 0) {
        cx_log_err(0, "FCGX_Init() failed");
        return false;
    }
    listen_fd = open_listener(*listen_addr);
    /* Non-blocking: libfcgi goes back to accept() by itself when a
     * connection closes before its request, and a blocking accept() there
     * would sleep through a stop (and through the stop pipe) until the next
     * connection. Accepted connections do not inherit the flag. */
    if (listen_fd >= 0) {
        int fl = fcntl(listen_fd, F_GETFL);
        if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
            cx_log_err(errno, "fcntl() of the listening socket failed");
            return false;
        }
    }
    return listen_fd >= 0;
}

struct threads {
    pthread_t *workers, reaper, ticker, prestart, watcher;
    unsigned started;
    bool reaper_started, ticker_started, prestart_started, watcher_started;
};

static bool
start_threads(struct threads *t)
{
    if (!init_reaper_cond()) {
        cx_log_err(errno, "pthread_cond_init() failed");
        return false;
    }
    if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
        cx_log_err(errno, "pipe2() failed");
        return false;
    }
    t->workers = calloc(cfg.workers, sizeof(*t->workers));
    idle_stack = calloc(cfg.workers, sizeof(*idle_stack));
    if (!t->workers || !idle_stack)
        return false;
    for (; t->started < cfg.workers; t->started++)
        if (pthread_create(&t->workers[t->started], NULL, worker_main, NULL) != 0) {
            cx_log_err(errno, "pthread_create() failed");
            break;
        }
    if (t->started == 0)
        return false;
    if (cx_lane_start(&cfg, auth)) {
        cx_log_err(errno, "the run threads could not be started");
        return false;
    }
    if (pthread_create(&t->reaper, NULL, reaper_main, NULL) != 0) {
        cx_log_err(errno, "pthread_create() of the reaper failed");
        return false;
    }
    t->reaper_started = true;
    if (pthread_create(&t->ticker, NULL, ticker_main, NULL) != 0) {
        cx_log_err(errno, "pthread_create() of the ticker failed");
        return false;
    }
    t->ticker_started = true;
    if (cfg.revoked_keys_dir[0] || cfg.download_cache_entries > 0) {
        if (pthread_create(&t->watcher, NULL, watcher_main, NULL) != 0) {
            cx_log_err(errno, "pthread_create() of the watcher failed");
            return false;
        }
        t->watcher_started = true;
    }
    if (cx_config_pool_size(&cfg, CX_LANG_PYTHON) + cx_config_pool_size(&cfg, CX_LANG_JAVASCRIPT) +
            cx_config_pool_size(&cfg, CX_LANG_R) >
        0) {
        if (pthread_create(&t->prestart, NULL, prestart_main, NULL) != 0) {
            cx_log_err(errno, "pthread_create() of the kernel pool failed");
            return false;
        }
        t->prestart_started = true;
    }
    return true;
}

/* Serves until SIGTERM or SIGINT; SIGHUP reopens the log. */
static void
wait_for_stop(sigset_t *sigs)
{
    for (;;) {
        int sig = 0;

        if (sigwait(sigs, &sig) != 0)
            continue;
        if (sig != SIGHUP) {
            cx_log_info("signal %d: stopping; requests in flight will finish", sig);
            return;
        }
        if (cx_log_open(cfg.log_file, cfg.log_level))
            cx_log_err(errno, "reopen of log file failed");
        else
            cx_log_info("log file reopened");
    }
}

static void
stop_threads(struct threads *t)
{
    pthread_mutex_lock(&reaper_lock);
    stopping = 1;
    pthread_cond_broadcast(&reaper_cond);
    pthread_mutex_unlock(&reaper_lock);
    cx_run_events_stop(); /* event streams end; a client resumes elsewhere */
    /* Wakes the worker waiting for a connection; connections already
     * accepted finish normally. */
    if (stop_pipe[1] >= 0 && write(stop_pipe[1], "x", 1) != 1)
        cx_log_err(errno, "write() to the stop pipe failed");
    if (idle_stack)
        wake_idle_workers();
    for (unsigned i = 0; i < t->started; i++)
        pthread_join(t->workers[i], NULL);
    cx_lane_stop(); /* the runs in flight finish */
    if (t->reaper_started)
        pthread_join(t->reaper, NULL);
    if (t->ticker_started)
        pthread_join(t->ticker, NULL);
    if (t->watcher_started)
        pthread_join(t->watcher, NULL);
    cx_prestart_shutdown();
    if (t->prestart_started)
        pthread_join(t->prestart, NULL);
    cx_host_shutdown();
}

int
main(int argc, char **argv)
{
    const char *config_path = CX_CONFIG_FILE, *listen_addr = NULL;
    struct threads t = {0};
    unsigned workers = 0;
    sigset_t sigs;
    int status = parse_args(argc, argv, &config_path, &listen_addr, &workers);

    if (status >= 0)
        return status;
    status = 1;
    listen_fd = -1;
    /* Signals go to one thread that waits for them: workers never see them. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (start_up(config_path, workers, &listen_addr) && start_threads(&t)) {
        cx_log_info("codexec-fcgi %s started: %u workers, listening on %s", PACKAGE_VERSION,
                    t.started,
                    listen_addr && *listen_addr ? listen_addr
                    : listen_fd == 3            ? "fd 3"
                                                : "fd 0");
        cx_host_notify("READY=1"); /* Type=notify: systemd starts what waits for us */
        wait_for_stop(&sigs);
        cx_host_notify("STOPPING=1");
        status = 0;
    }
    stop_threads(&t);
    if (status == 0 && listen_addr && *listen_addr) {
        const char *path = strncmp(listen_addr, "unix:", 5) == 0 ? listen_addr + 5 : listen_addr;
        if (path[0] == '/')
            unlink(path);
    }
    if (status == 0)
        cx_log_info("stopped");
    free(t.workers);
    free(idle_stack);
    cx_dlcache_shutdown();
    cx_auth_free(auth);
    cx_config_cleanup(&cfg);
    curl_global_cleanup();
    return status;
}
