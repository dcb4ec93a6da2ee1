#include <pthread.h>
#include <string.h>

#include "metrics.h"

#define MAX_SERIES 256
#define MAX_ROUTES 64

static const double bounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                1,     2.5,   5,    10,    30,   60,  300};
#define NBOUNDS (sizeof(bounds) / sizeof(bounds[0]))

struct series {
    const char *route;
    int status;
    uint64_t count;
};

struct histogram {
    const char *route;
    uint64_t buckets[NBOUNDS];
    uint64_t count;
    double sum;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t counters[CX_COUNT__N];
/* codexec_<name>_total and its HELP line */
static const struct {
    const char *name, *help;
} counter_info[CX_COUNT__N] = {
    [CX_COUNT_GATEWAY_REST] = {"gateway_rest_requests", "REST calls to the gateway."},
    [CX_COUNT_GATEWAY_WS_CONNECT] = {"gateway_ws_connects", "Kernel WebSockets opened."},
    [CX_COUNT_GATEWAY_BATCHES] = {"gateway_round_trips", "Pipelined batches sent and awaited."},
    [CX_COUNT_GATEWAY_STALE] = {"gateway_stale_messages",
                                "Kernel messages read and dropped (not for a run of ours)."},
    [CX_COUNT_ACCEPT_ERRORS] = {"accept_errors", "accept() failures a worker backed off from."},
    [CX_COUNT_CAPTURE_BYTES] = {"capture_bytes", "Bytes of captured files stored."},
    [CX_COUNT_CAPTURE_BASE64] = {"capture_base64_bytes",
                                 "Bytes of files a kernel sent base64 in JSON, not binary."},
    [CX_COUNT_DOWNLOAD_BYTES] = {"download_bytes", "Bytes of artifacts handed out."},
    [CX_COUNT_DATABASE_ERRORS] = {"database_errors",
                                  "PostgreSQL statements or connections that failed."},
    [CX_COUNT_GATEWAY_ERRORS] = {"gateway_errors", "Gateway calls that failed."},
    [CX_COUNT_DLCACHE_HITS] = {"download_cache_hits",
                               "Downloads by key answered without a database query."},
    [CX_COUNT_DLCACHE_MISSES] = {"download_cache_misses",
                                 "Downloads by key that queried the database (cache live)."},
    [CX_COUNT_KEYCACHE_HITS] = {"key_cache_hits",
                                "API keys of other requests checked without a database query."},
    [CX_COUNT_KEYCACHE_MISSES] = {"key_cache_misses",
                                  "API keys of other requests checked by a query (cache live)."},
};

static const struct {
    const char *name, *label, *help;
} family_info[CX_FAMILY__N] = {
    [CX_FAMILY_RUNS] = {"runs", "status", "Runs ended, by status."},
    [CX_FAMILY_EVICTIONS] = {"session_evictions", "reason",
                             "Idle sessions closed to make room, by reason."},
    [CX_FAMILY_REFUSALS] = {"refusals", "reason", "Requests refused for a limit, by reason."},
    [CX_FAMILY_STORAGE] = {"storage_requests", "op", "Requests to the object store, by operation."},
    [CX_FAMILY_KERNEL_RESTARTS] = {"kernel_restarts", "reason",
                                   "Kernels codexec restarted, by reason (timeout: not idle after "
                                   "the interrupt; idle_output: talking with no run)."},
    [CX_FAMILY_STORAGE_ERRORS] = {"storage_errors", "op",
                                  "Object-store requests that failed, by operation."},
};

#define MAX_LABELLED 64
static struct {
    enum cx_family family;
    const char *value;
    uint64_t count;
} labelled[MAX_LABELLED];
static size_t nlabelled;

/* Runs: one histogram, the request buckets. */
static struct {
    uint64_t buckets[NBOUNDS];
    uint64_t count;
    double sum;
} runs_hist;

static int64_t gauges[CX_GAUGE__N];
static const struct {
    const char *name, *help;
} gauge_info[CX_GAUGE__N] = {
    [CX_GAUGE_WORKERS] = {"workers", "Request threads alive."},
};

void
cx_metrics_gauge_add(enum cx_gauge g, int64_t delta)
{
    __atomic_add_fetch(&gauges[g], delta, __ATOMIC_RELAXED);
}

void
cx_metrics_count(enum cx_counter c)
{
    __atomic_add_fetch(&counters[c], 1, __ATOMIC_RELAXED);
}

void
cx_metrics_add(enum cx_counter c, uint64_t n)
{
    __atomic_add_fetch(&counters[c], n, __ATOMIC_RELAXED);
}

void
cx_metrics_count_by(enum cx_family f, const char *value)
{
    size_t i;

    pthread_mutex_lock(&lock);
    for (i = 0; i < nlabelled; i++)
        if (labelled[i].family == f && !strcmp(labelled[i].value, value))
            break;
    if (i == nlabelled && nlabelled < MAX_LABELLED) {
        labelled[i].family = f;
        labelled[i].value = value;
        nlabelled++;
    }
    if (i < nlabelled)
        labelled[i].count++;
    pthread_mutex_unlock(&lock);
}

void
cx_metrics_run_duration(int64_t us)
{
    double s = (double)us / 1e6;

    pthread_mutex_lock(&lock);
    for (size_t b = 0; b < NBOUNDS; b++)
        if (s <= bounds[b])
            runs_hist.buckets[b]++;
    runs_hist.count++;
    runs_hist.sum += s;
    pthread_mutex_unlock(&lock);
}

/* Under lock: the labelled counters and the runs' histogram. */
static void
render_runs(struct cx_buf *b)
{
    for (int f = 0; f < CX_FAMILY__N; f++) {
        cx_buf_addf(b, "# HELP codexec_%s_total %s\n# TYPE codexec_%s_total counter\n",
                    family_info[f].name, family_info[f].help, family_info[f].name);
        for (size_t i = 0; i < nlabelled; i++)
            if (labelled[i].family == (enum cx_family)f)
                cx_buf_addf(b, "codexec_%s_total{%s=\"%s\"} %llu\n", family_info[f].name,
                            family_info[f].label, labelled[i].value,
                            (unsigned long long)labelled[i].count);
    }
    cx_buf_adds(b, "# HELP codexec_run_duration_seconds Runs' durations, from the request to "
                   "the answer.\n# TYPE codexec_run_duration_seconds histogram\n");
    for (size_t k = 0; k < NBOUNDS; k++)
        cx_buf_addf(b, "codexec_run_duration_seconds_bucket{le=\"%g\"} %llu\n", bounds[k],
                    (unsigned long long)runs_hist.buckets[k]);
    cx_buf_addf(b,
                "codexec_run_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
                "codexec_run_duration_seconds_sum %.6f\ncodexec_run_duration_seconds_count %llu\n",
                (unsigned long long)runs_hist.count, runs_hist.sum,
                (unsigned long long)runs_hist.count);
}

uint64_t
cx_metrics_counter(enum cx_counter c)
{
    return __atomic_load_n(&counters[c], __ATOMIC_RELAXED);
}
static struct series series[MAX_SERIES];
static size_t nseries;
static struct histogram hist[MAX_ROUTES];
static size_t nhist;

void
cx_metrics_observe(const char *route, int status, int64_t us)
{
    double s = (double)us / 1e6;
    size_t i;

    pthread_mutex_lock(&lock);
    for (i = 0; i < nseries; i++)
        if (series[i].status == status && strcmp(series[i].route, route) == 0)
            break;
    if (i == nseries && nseries < MAX_SERIES) {
        series[i].route = route;
        series[i].status = status;
        nseries++;
    }
    if (i < nseries)
        series[i].count++;
    for (i = 0; i < nhist; i++)
        if (strcmp(hist[i].route, route) == 0)
            break;
    if (i == nhist && nhist < MAX_ROUTES) {
        hist[i].route = route;
        nhist++;
    }
    if (i < nhist) {
        for (size_t b = 0; b < NBOUNDS; b++)
            if (s <= bounds[b])
                hist[i].buckets[b]++;
        hist[i].count++;
        hist[i].sum += s;
    }
    pthread_mutex_unlock(&lock);
}

void
cx_metrics_render(struct cx_buf *b)
{
    for (int c = 0; c < CX_COUNT__N; c++)
        cx_buf_addf(b,
                    "# HELP codexec_%s_total %s\n# TYPE codexec_%s_total counter\n"
                    "codexec_%s_total %llu\n",
                    counter_info[c].name, counter_info[c].help, counter_info[c].name,
                    counter_info[c].name,
                    (unsigned long long)cx_metrics_counter((enum cx_counter)c));
    for (int g = 0; g < CX_GAUGE__N; g++)
        cx_buf_addf(b, "# HELP codexec_%s %s\n# TYPE codexec_%s gauge\ncodexec_%s %lld\n",
                    gauge_info[g].name, gauge_info[g].help, gauge_info[g].name, gauge_info[g].name,
                    (long long)__atomic_load_n(&gauges[g], __ATOMIC_RELAXED));
    pthread_mutex_lock(&lock);
    render_runs(b);
    cx_buf_adds(b, "# HELP codexec_http_requests_total HTTP requests by route and status.\n"
                   "# TYPE codexec_http_requests_total counter\n");
    for (size_t i = 0; i < nseries; i++)
        cx_buf_addf(b, "codexec_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                    series[i].route, series[i].status, (unsigned long long)series[i].count);
    cx_buf_adds(b, "# HELP codexec_http_request_duration_seconds Request latency by route.\n"
                   "# TYPE codexec_http_request_duration_seconds histogram\n");
    for (size_t i = 0; i < nhist; i++) {
        for (size_t k = 0; k < NBOUNDS; k++)
            cx_buf_addf(
                b, "codexec_http_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %llu\n",
                hist[i].route, bounds[k], (unsigned long long)hist[i].buckets[k]);
        cx_buf_addf(b,
                    "codexec_http_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n",
                    hist[i].route, (unsigned long long)hist[i].count);
        cx_buf_addf(b, "codexec_http_request_duration_seconds_sum{route=\"%s\"} %.6f\n",
                    hist[i].route, hist[i].sum);
        cx_buf_addf(b, "codexec_http_request_duration_seconds_count{route=\"%s\"} %llu\n",
                    hist[i].route, (unsigned long long)hist[i].count);
    }
    pthread_mutex_unlock(&lock);
}
