/* codexec: process-wide request metrics in Prometheus text format. */
#ifndef CX_METRICS_H
#define CX_METRICS_H

#include <stdint.h>

#include "buf.h"

/* route: a static string naming the route ("runs_create"); status: the
 * HTTP status; us: the request's duration in microseconds. Thread-safe. */
void cx_metrics_observe(const char *route, int status, int64_t us);

/* Process-wide event counters, rendered as codexec_<name>_total. */
enum cx_counter {
    CX_COUNT_GATEWAY_REST,       /* REST calls to the gateway */
    CX_COUNT_GATEWAY_WS_CONNECT, /* channel WebSockets opened */
    CX_COUNT_GATEWAY_BATCHES,    /* pipelined request batches sent and awaited */
    CX_COUNT_GATEWAY_STALE,      /* messages read and dropped: not for a run of ours */
    CX_COUNT_ACCEPT_ERRORS,      /* accept() failures a worker backed off from */
    CX_COUNT_CAPTURE_BYTES,      /* bytes of captured files stored */
    CX_COUNT_CAPTURE_BASE64,     /* bytes of files received base64 in JSON, not binary */
    CX_COUNT_DOWNLOAD_BYTES,     /* bytes of artifacts handed out (body or X-Accel/X-Sendfile) */
    CX_COUNT_DATABASE_ERRORS,    /* PostgreSQL statements or connections that failed */
    CX_COUNT_GATEWAY_ERRORS,     /* gateway calls that failed (transport or status) */
    CX_COUNT_DLCACHE_HITS,       /* downloads by key answered from the download cache */
    CX_COUNT_DLCACHE_MISSES,     /* ... that asked the database (while the cache was live) */
    CX_COUNT__N
};
void cx_metrics_count(enum cx_counter c);
void cx_metrics_add(enum cx_counter c, uint64_t n);
uint64_t cx_metrics_counter(enum cx_counter c);

/* Counters with one label, rendered as codexec_<family>_total{<label>="…"}.
 * value: a static string (a status, a reason). */
enum cx_family {
    CX_FAMILY_RUNS,            /* runs ended, by status (ok, error, timeout, ...) */
    CX_FAMILY_EVICTIONS,       /* idle sessions closed to make room, by reason */
    CX_FAMILY_REFUSALS,        /* requests refused for a limit, by reason */
    CX_FAMILY_STORAGE,         /* object-store requests, by operation */
    CX_FAMILY_STORAGE_ERRORS,  /* ... that failed (not a missing object), by operation */
    CX_FAMILY_KERNEL_RESTARTS, /* kernels restarted, by reason (timeout, idle_output) */
    CX_FAMILY__N
};
void cx_metrics_count_by(enum cx_family f, const char *value);

/* A run's duration, for codexec_run_duration_seconds. */
void cx_metrics_run_duration(int64_t us);

/* Process-wide levels, rendered as codexec_<name>. */
enum cx_gauge {
    CX_GAUGE_WORKERS, /* request threads alive */
    CX_GAUGE__N
};
void cx_metrics_gauge_add(enum cx_gauge g, int64_t delta);

/* Appends the exposition text to b. */
void cx_metrics_render(struct cx_buf *b);

#endif
