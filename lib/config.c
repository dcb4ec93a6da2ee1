#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conf.h"
#include "util.h"

#define O(f)  offsetof(struct cx_config, f)
#define KiB   1024ULL
#define MiB   (1024ULL * KiB)
#define GiB   (1024ULL * MiB)
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

/* Every key of codexec.conf with its default and range; docs/configuration.md says what
 * each does. */
static const struct cx_conf_key keys[] = {
    /* the process */
    {"listen", CX_CONF_STR, O(listen), "", 0, 0},
    {"socket_mode", CX_CONF_MODE, O(socket_mode), "0660", 0, 0777},
    {"workers", CX_CONF_UINT, O(workers), "16", 1, 1024},
    {"run_workers", CX_CONF_UINT, O(run_workers), "0", 0, 1024}, /* 0: workers (lane.h) */
    {"log_file", CX_CONF_STR, O(log_file), "", 0, 0},
    {"log_level", CX_CONF_LEVEL, O(log_level), "info", 0, 0},
    {"log_format", CX_CONF_LOG_FORMAT, O(log_format), "text", 0, 0},
    /* the services it uses */
    {"database", CX_CONF_STR, O(database), "dbname=codexec", 0, 0},
    {"gateway_url", CX_CONF_STR, O(gateway_url), "http://127.0.0.1:8888", 0, 0},
    {"gateway_token", CX_CONF_STR, O(gateway_token), "", 0, 0},
    /* 0: no count of its own where the gateway reports its memory, else
     * CX_KERNELS_COUNTED (budget.h) */
    {"max_kernels", CX_CONF_UINT, O(max_kernels), "0", 0, 100000},
    /* 0: the gateway's kernels' cgroup limit (budget.h) */
    {"max_kernel_memory", CX_CONF_SIZE, O(max_kernel_memory), "0", 0, 1ULL << 50},
    /* 0: a twentieth of the gateway's host, within [256 MiB, 2 GiB] */
    {"gateway_memory_reserve", CX_CONF_SIZE, O(gateway_memory_reserve), "0", 0, 1ULL << 50},
    {"gateway", CX_CONF_LINES, O(gateway_lines), "", 0, 0},
    {"kernel_name", CX_CONF_STR, O(kernel_name), "python3", 0, 0},
    {"kernel_name_javascript", CX_CONF_STR, O(kernel_name_javascript), "", 0, 0},
    {"kernel_name_r", CX_CONF_STR, O(kernel_name_r), "", 0, 0},
    {"storage_dir", CX_CONF_STR, O(storage_dir), CX_LOCALSTATEDIR "/lib/codexec/storage", 0, 0},
    {"secret_file", CX_CONF_STR, O(secret_file), CX_SYSCONFDIR "/codexec/secret", 0, 0},
    /* object storage instead of storage_dir */
    {"storage", CX_CONF_STORAGE, O(storage), "local", 0, 0},
    {"s3_endpoint", CX_CONF_STR, O(s3_endpoint), "", 0, 0},
    {"s3_region", CX_CONF_STR, O(s3_region), "us-east-1", 0, 0},
    {"s3_bucket", CX_CONF_STR, O(s3_bucket), "", 0, 0},
    {"s3_prefix", CX_CONF_STR, O(s3_prefix), "", 0, 0},
    {"s3_addressing", CX_CONF_S3_ADDRESSING, O(s3_addressing), "path", 0, 0},
    {"s3_credentials_file", CX_CONF_PATH, O(s3_credentials_file), "", 0, 0},
    {"s3_part_size", CX_CONF_SIZE, O(s3_part_size), "8M", 5 * MiB, 64 * MiB},
    {"s3_url_expiry", CX_CONF_UINT, O(s3_url_expiry), "60", 1, 604800},
    /* who may do what, and how downloads leave */
    {"trust_remote_user", CX_CONF_BOOL, O(trust_remote_user), "false", 0, 0},
    {"require_approval", CX_CONF_BOOL, O(require_approval), "false", 0, 0},
    {"delivery", CX_CONF_DELIVERY, O(delivery), "direct", 0, 0},
    {"x_accel_prefix", CX_CONF_STR, O(x_accel_prefix), "/_codexec_storage/", 0, 0},
    /* runs and sessions (docs/configuration.md) */
    {"default_timeout", CX_CONF_UINT, O(default_timeout), "30", 1, 86400},
    {"max_timeout", CX_CONF_UINT, O(max_timeout), "300", 1, 86400},
    {"default_ttl", CX_CONF_UINT, O(default_ttl), "600", 1, 30 * 86400},
    {"max_ttl", CX_CONF_UINT, O(max_ttl), "3600", 1, 30 * 86400},
    {"interrupt_grace", CX_CONF_UINT, O(interrupt_grace), "5", 1, 600},
    {"busy_wait", CX_CONF_UINT, O(busy_wait), "10", 0, 3600},
    {"approval_ttl", CX_CONF_UINT, O(approval_ttl), "3600", 1, 30 * 86400},
    {"run_answer_ttl", CX_CONF_UINT, O(run_answer_ttl), "604800", 0, 365 * 86400},
    /* sizes (docs/configuration.md) */
    {"tail_chars", CX_CONF_UINT, O(tail_chars), "4000", 1, 1000000},
    {"max_output_bytes", CX_CONF_SIZE, O(max_output_bytes), "8M", 1024, 1 * GiB},
    {"max_code_bytes", CX_CONF_SIZE, O(max_code_bytes), "1M", 16, 64 * MiB},
    {"max_body_bytes", CX_CONF_SIZE, O(max_body_bytes), "64M", 1024, 64 * GiB},
    {"max_run_body_bytes", CX_CONF_SIZE, O(max_run_body_bytes), "4M", 1024, 1 * GiB},
    {"max_artifact_bytes", CX_CONF_SIZE, O(max_artifact_bytes), "100M", 1, 64 * GiB},
    /* counts and quotas (docs/configuration.md) */
    {"max_captured_files", CX_CONF_UINT, O(max_captured_files), "64", 0, 100000},
    {"max_inputs", CX_CONF_UINT, O(max_inputs), "32", 0, 10000},
    {"user_quota_bytes", CX_CONF_SIZE, O(user_quota_bytes), "5G", 0, 1024 * GiB * 1024},
    {"user_quota_artifacts", CX_CONF_UINT, O(user_quota_artifacts), "5000", 0, 100000000},
    {"user_quota_versions", CX_CONF_UINT, O(user_quota_versions), "50000", 0, 100000000},
    {"user_quota_answer_bytes", CX_CONF_SIZE, O(user_quota_answer_bytes), "256M", 64 * 1024,
     1024 * GiB},
    {"max_sessions_per_user", CX_CONF_UINT, O(max_sessions_per_user), "8", 1, 100000},
    {"max_pending_runs_per_user", CX_CONF_UINT, O(max_pending_runs_per_user), "16", 1, 100000},
    /* 0: a quarter of workers, at least 1 (lane.h) */
    {"max_concurrent_runs_per_user", CX_CONF_UINT, O(max_concurrent_runs_per_user), "0", 0, 1024},
    /* links, housekeeping, the kernel pool */
    {"link_default_expiry", CX_CONF_UINT, O(link_default_expiry), "300", 1, 365 * 86400},
    {"link_max_expiry", CX_CONF_UINT, O(link_max_expiry), "604800", 1, 365 * 86400},
    {"revoked_keys_dir", CX_CONF_PATH, O(revoked_keys_dir), "", 0, 0},
    {"download_cache_entries", CX_CONF_UINT, O(download_cache_entries), "1024", 0, 16384},
    {"reaper_interval", CX_CONF_UINT, O(reaper_interval), "30", 1, 86400},
    {"kernel_orphan_grace", CX_CONF_UINT, O(kernel_orphan_grace), "60", 1, 86400},
    {"kernel_pool_size", CX_CONF_UINT, O(kernel_pool_size), "0", 0, 1024},
    {"kernel_preload", CX_CONF_MODULES, O(kernel_preload), "", 0, 0},
    {"kernel_pool_size_javascript", CX_CONF_UINT, O(kernel_pool_size_javascript), "0", 0, 1024},
    {"kernel_pool_size_r", CX_CONF_UINT, O(kernel_pool_size_r), "0", 0, 1024},
    {"kernel_preload_javascript", CX_CONF_MODULES, O(kernel_preload_javascript), "", 0, 0},
    {"kernel_preload_r", CX_CONF_MODULES, O(kernel_preload_r), "", 0, 0},
    /* who may read /metrics (REMOTE_ADDR, as the web server passes it) */
    {"metrics_allow", CX_CONF_ADDRS, O(metrics_allow), "127.0.0.0/8, ::1", 0, 0},
    /* ... or only with the operators' token, whatever the address (auth.h) */
    {"metrics_token", CX_CONF_BOOL, O(metrics_token), "false", 0, 0},
    /* FastCGI params count only with the web server's key (auth.h) */
    {"web_server_key", CX_CONF_BOOL, O(web_server_key), "false", 0, 0},
    /* MCP (docs/mcp.md) */
    {"mcp_allowed_origins", CX_CONF_STR, O(mcp_allowed_origins), "", 0, 0},
    {"public_url", CX_CONF_STR, O(public_url), "", 0, 0},
    /* RAGFlow's executor-manager protocol (docs/integrations.md) */
    {"ragflow_timeout", CX_CONF_UINT, O(ragflow_timeout), "10", 1, 86400},
};

static void
wipe(char **s)
{
    if (*s) {
        memset(*s, 0, strlen(*s));
        free(*s);
        *s = NULL;
    }
}

void
cx_config_cleanup(struct cx_config *cfg)
{
    wipe(&cfg->s3_key_id);
    wipe(&cfg->s3_secret);
    wipe(&cfg->s3_token);
    for (unsigned i = 0; i < cfg->ngateways; i++)
        if (cfg->gateways[i].token) {
            memset(cfg->gateways[i].token, 0, strlen(cfg->gateways[i].token));
            free(cfg->gateways[i].token);
            cfg->gateways[i].token = NULL;
        }
    cfg->ngateways = 0;
    cx_conf_cleanup(keys, NKEYS, cfg);
}

/* Adds a gateway; msg says what is wrong with it. */
static enum cx_err
add_gateway(struct cx_config *cfg, const char *url, size_t urllen, const char *token,
            unsigned max_kernels, uint64_t max_memory, char *msg, size_t msglen)
{
    struct cx_gateway_conf *g = &cfg->gateways[cfg->ngateways];

    while (urllen > 0 && url[urllen - 1] == '/')
        urllen--;
    if (cfg->ngateways == CX_GATEWAYS_MAX) {
        snprintf(msg, msglen, "at most %d gateways", CX_GATEWAYS_MAX);
        return CX_ERR_INVALID;
    }
    if (urllen >= sizeof(g->url) || (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))) {
        snprintf(msg, msglen, "a gateway URL starts with http:// or https://");
        return CX_ERR_INVALID;
    }
    for (size_t i = 0; i < urllen; i++)
        if ((unsigned char)url[i] <= ' ' || url[i] == '"' || url[i] == '\\' || url[i] == 0x7f) {
            snprintf(msg, msglen, "a gateway URL has no spaces, quotes or backslashes");
            return CX_ERR_INVALID;
        }
    memcpy(g->url, url, urllen);
    g->url[urllen] = '\0';
    for (unsigned i = 0; i < cfg->ngateways; i++)
        if (!strcmp(cfg->gateways[i].url, g->url)) {
            snprintf(msg, msglen, "gateway %.200s is listed twice", g->url);
            return CX_ERR_INVALID;
        }
    g->token = strdup(token);
    if (!g->token)
        return CX_ERR_NOMEM;
    g->max_kernels = max_kernels;
    g->max_memory = max_memory;
    cfg->ngateways++;
    return CX_OK;
}

/* "URL [token=TOKEN] [max_kernels=N] [max_memory=SIZE]" */
static enum cx_err
gateway_line(struct cx_config *cfg, char *line, char *msg, size_t msglen)
{
    char *save = NULL, *url = strtok_r(line, " \t", &save), *w;
    const char *token = "";
    unsigned long max = cfg->max_kernels;
    uint64_t mem = cfg->max_kernel_memory;

    if (!url) {
        snprintf(msg, msglen,
                 "gateway: expected \"URL [token=TOKEN] [max_kernels=N] [max_memory=SIZE]\"");
        return CX_ERR_INVALID;
    }
    while ((w = strtok_r(NULL, " \t", &save))) {
        char *end;
        if (!strncmp(w, "token=", 6)) {
            token = w + 6;
        } else if (!strncmp(w, "max_kernels=", 12) && w[12] >= '0' && w[12] <= '9') {
            errno = 0;
            max = strtoul(w + 12, &end, 10);
            if (errno || *end || max > 100000) {
                snprintf(msg, msglen, "gateway: max_kernels is out of range [0, 100000]");
                return CX_ERR_INVALID;
            }
        } else if (!strncmp(w, "max_memory=", 11)) {
            if (cx_conf_parse_size(w + 11, &mem) || mem > 1ULL << 50) {
                snprintf(msg, msglen, "gateway: max_memory is not a size (such as 16G)");
                return CX_ERR_INVALID;
            }
        } else {
            snprintf(msg, msglen,
                     "gateway: unknown word (token=..., max_kernels=... and "
                     "max_memory=... are known)");
            return CX_ERR_INVALID;
        }
    }
    return add_gateway(cfg, url, strlen(url), token, (unsigned)max, mem, msg, msglen);
}

/* The gateways, from gateway_url on and the "gateway" lines. */
static enum cx_err
gateways(struct cx_config *cfg, char *msg, size_t msglen)
{
    enum cx_err rc =
        add_gateway(cfg, cfg->gateway_url, strlen(cfg->gateway_url), cfg->gateway_token,
                    cfg->max_kernels, cfg->max_kernel_memory, msg, msglen);
    char *lines = rc == CX_OK && cfg->gateway_lines ? strdup(cfg->gateway_lines) : NULL;
    char *save = NULL;

    if (rc || !cfg->gateway_lines)
        return rc;
    if (!lines)
        return CX_ERR_NOMEM;
    for (char *l = strtok_r(lines, "\n", &save); l && rc == CX_OK; l = strtok_r(NULL, "\n", &save))
        rc = gateway_line(cfg, l, msg, msglen);
    memset(lines, 0, strlen(cfg->gateway_lines));
    free(lines);
    return rc;
}

enum cx_err
cx_config_defaults(struct cx_config *cfg)
{
    char msg[CX_MSG_MAX];
    enum cx_err rc;

    memset(cfg, 0, sizeof(*cfg));
    rc = cx_conf_defaults(keys, NKEYS, cfg);
    if (rc == CX_OK && (rc = gateways(cfg, msg, sizeof(msg))))
        cx_config_cleanup(cfg);
    return rc;
}

/* Settings that must not exceed another. */
static const struct {
    size_t lo, hi;
    bool wide; /* uint64_t, else unsigned */
    const char *what;
} ordered[] = {
    {O(default_timeout), O(max_timeout), false, "default_timeout is above max_timeout"},
    {O(default_ttl), O(max_ttl), false, "default_ttl is above max_ttl"},
    {O(link_default_expiry), O(link_max_expiry), false,
     "link_default_expiry is above link_max_expiry"},
    {O(max_code_bytes), O(max_run_body_bytes), true, "max_code_bytes is above max_run_body_bytes"},
};

static uint64_t
field(const struct cx_config *cfg, size_t off, bool wide)
{
    const char *p = (const char *)cfg + off;

    return wide ? *(const uint64_t *)p : *(const unsigned *)p;
}

/* The S3 credentials, from s3_credentials_file ("access_key_id = ...",
 * "secret_access_key = ...", "session_token = ...") or the environment
 * (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN). */
struct creds {
    char *id, *secret, *token;
};
static const struct cx_conf_key cred_keys[] = {
    {"access_key_id", CX_CONF_STR, offsetof(struct creds, id), "", 0, 0},
    {"secret_access_key", CX_CONF_STR, offsetof(struct creds, secret), "", 0, 0},
    {"session_token", CX_CONF_STR, offsetof(struct creds, token), "", 0, 0},
};

static enum cx_err
s3_credentials(struct cx_config *cfg, char *msg, size_t msglen)
{
    struct creds c = {0};
    const char *file = cfg->s3_credentials_file;
    struct stat st;

    if (file[0]) {
        char err[CX_MSG_MAX];
        if (stat(file, &st) != 0) {
            snprintf(msg, msglen, "s3_credentials_file: %s", strerror(errno));
            return CX_ERR_INVALID;
        }
        if (st.st_mode & 0007) {
            snprintf(msg, msglen, "s3_credentials_file is readable by others (chmod o-rwx)");
            return CX_ERR_INVALID;
        }
        if (cx_conf_load(cred_keys, 3, &c, file, err, sizeof(err))) {
            snprintf(msg, msglen, "%s", err);
            return CX_ERR_INVALID;
        }
    } else {
        const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY"),
                   *token = getenv("AWS_SESSION_TOKEN");
        c.id = strdup(id ? id : "");
        c.secret = strdup(secret ? secret : "");
        c.token = strdup(token ? token : "");
    }
    cfg->s3_key_id = c.id;
    cfg->s3_secret = c.secret;
    cfg->s3_token = c.token;
    if (!c.id || !c.secret || !c.token)
        return CX_ERR_NOMEM;
    if (!c.id[0] || !c.secret[0]) {
        snprintf(msg, msglen,
                 "storage = s3 needs an access key id and a secret access key "
                 "(s3_credentials_file, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)");
        return CX_ERR_INVALID;
    }
    return CX_OK;
}

/* "" or segments of [A-Za-z0-9_.-] (not "." or ".."), each followed by
 * '/': a prefix stays inside the bucket, and is a whole "directory" (two
 * deployments in one bucket must not nest: fsck of one would take the
 * other's objects for orphans). */
static bool
prefix_ok(const char *p)
{
    size_t n = strlen(p);

    if (n > 512 || !cx_name_chars(p, n, "_.-/") || (n && p[n - 1] != '/'))
        return false;
    while (*p) {
        size_t seg = strcspn(p, "/");
        if (seg == 0 || (seg == 1 && p[0] == '.') || (seg == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        p += seg + (p[seg] == '/');
    }
    return true;
}

/* storage = s3: what it needs, and what it rules out. */
static enum cx_err
s3_settings(struct cx_config *cfg, char *msg, size_t msglen)
{
    if (cfg->storage != CX_STORAGE_S3) {
        if (cfg->delivery == CX_DELIVERY_REDIRECT) {
            snprintf(msg, msglen, "delivery = redirect needs storage = s3");
            return CX_ERR_INVALID;
        }
        return CX_OK;
    }
    if (!cfg->s3_region[0] || strlen(cfg->s3_region) > 64 ||
        !cx_name_chars(cfg->s3_region, strlen(cfg->s3_region), "-")) {
        snprintf(msg, msglen, "s3_region: 1 to 64 of [A-Za-z0-9-]");
        return CX_ERR_INVALID;
    }
    if (!cfg->s3_bucket[0]) {
        snprintf(msg, msglen, "storage = s3 needs s3_bucket");
        return CX_ERR_INVALID;
    }
    if (strlen(cfg->s3_bucket) > 255 ||
        !cx_name_chars(cfg->s3_bucket, strlen(cfg->s3_bucket), "_.-")) {
        snprintf(msg, msglen, "s3_bucket: at most 255 of [A-Za-z0-9_.-]");
        return CX_ERR_INVALID;
    }
    if (cfg->delivery == CX_DELIVERY_X_SENDFILE) {
        snprintf(msg, msglen, "delivery = x-sendfile needs storage = local");
        return CX_ERR_INVALID;
    }
    if (cfg->max_artifact_bytes > 5 * GiB || cfg->max_artifact_bytes / cfg->s3_part_size >= 10000) {
        snprintf(msg, msglen,
                 "with storage = s3, max_artifact_bytes is at most 5G and at most "
                 "9999 times s3_part_size (objects are copied into place)");
        return CX_ERR_INVALID;
    }
    if (!prefix_ok(cfg->s3_prefix)) {
        snprintf(msg, msglen,
                 "s3_prefix: at most 512 of [A-Za-z0-9_.-/], ending in /, in "
                 "segments that are neither empty, \".\" nor \"..\"");
        return CX_ERR_INVALID;
    }
    if (!cfg->s3_endpoint[0]) {
        char url[300];
        snprintf(url, sizeof(url), "https://s3.%s.amazonaws.com", cfg->s3_region);
        free(cfg->s3_endpoint);
        cfg->s3_endpoint = strdup(url);
        if (!cfg->s3_endpoint)
            return CX_ERR_NOMEM;
    }
    return s3_credentials(cfg, msg, msglen);
}

/* "http(s)://host[:port]" and, with path, a path after it: what an
 * Origin names, and where the public sees codexec. */
static bool
web_origin_ok(const char *s, size_t n, bool path)
{
    size_t skip = !strncmp(s, "https://", 8) ? 8 : !strncmp(s, "http://", 7) ? 7 : 0;
    size_t host;

    if (!skip || n <= skip || n > 512)
        return false;
    host = skip + strcspn(s + skip, "/");
    if (host > n)
        host = n;
    if (host == skip || !cx_name_chars(s + skip, host - skip, ".-:[]"))
        return false;
    return host == n || (path && cx_name_chars(s + host, n - host, "/-._~%"));
}

/* mcp_allowed_origins: origins, separated by commas or white space;
 * public_url: an origin and a path, its trailing slash dropped. */
static enum cx_err
mcp_settings(struct cx_config *cfg, char *msg, size_t msglen)
{
    const char *p = cfg->mcp_allowed_origins;
    size_t n;

    while (*p) {
        p += strspn(p, ", \t");
        n = strcspn(p, ", \t");
        if (n && !web_origin_ok(p, n, false)) {
            snprintf(msg, msglen,
                     "mcp_allowed_origins: each is scheme://host[:port] (http or https)");
            return CX_ERR_INVALID;
        }
        p += n;
    }
    n = strlen(cfg->public_url);
    while (n && cfg->public_url[n - 1] == '/')
        cfg->public_url[--n] = '\0';
    if (n && !web_origin_ok(cfg->public_url, n, true)) {
        snprintf(msg, msglen, "public_url: http(s)://host[:port][/path], no query");
        return CX_ERR_INVALID;
    }
    return CX_OK;
}

/* Each language its own kernelspec: the pool tells its kernels apart by
 * kernelspec, and a session's replacements are of its language's. */
static enum cx_err
language_settings(const struct cx_config *cfg, char *msg, size_t msglen)
{
    for (int i = 0; i < CX_LANG__COUNT; i++)
        for (int j = i + 1; j < CX_LANG__COUNT; j++) {
            const char *a = cx_config_kernel_name(cfg, (enum cx_lang)i);
            const char *b = cx_config_kernel_name(cfg, (enum cx_lang)j);

            if (a && b && !strcmp(a, b)) {
                snprintf(msg, msglen, "kernel_name%s%s and kernel_name_%s name the same kernelspec",
                         i ? "_" : "", i ? cx_lang_name((enum cx_lang)i) : "",
                         cx_lang_name((enum cx_lang)j));
                return CX_ERR_INVALID;
            }
        }
    return CX_OK;
}

static enum cx_err
check_whole(struct cx_config *cfg, char *msg, size_t msglen)
{
    enum cx_err rc = s3_settings(cfg, msg, msglen);

    if (rc == CX_OK)
        rc = mcp_settings(cfg, msg, msglen);
    if (rc == CX_OK)
        rc = language_settings(cfg, msg, msglen);
    if (rc)
        return rc;
    for (size_t i = 0; i < sizeof(ordered) / sizeof(ordered[0]); i++)
        if (field(cfg, ordered[i].lo, ordered[i].wide) >
            field(cfg, ordered[i].hi, ordered[i].wide)) {
            snprintf(msg, msglen, "%s", ordered[i].what);
            return CX_ERR_INVALID;
        }
    return gateways(cfg, msg, msglen);
}

enum cx_err
cx_config_parse(struct cx_config *cfg, const char *name, const char *text, char *errbuf,
                size_t errlen)
{
    char msg[CX_MSG_MAX];
    enum cx_err rc;

    memset(cfg, 0, sizeof(*cfg));
    rc = cx_conf_parse(keys, NKEYS, cfg, name, text, errbuf, errlen);
    if (rc == CX_OK && (rc = check_whole(cfg, msg, sizeof(msg)))) {
        snprintf(errbuf, errlen, "%s: %s", name, msg);
        cx_config_cleanup(cfg);
    }
    return rc;
}

enum cx_err
cx_config_load(struct cx_config *cfg, const char *path, char *errbuf, size_t errlen)
{
    char msg[CX_MSG_MAX];
    enum cx_err rc;

    memset(cfg, 0, sizeof(*cfg));
    rc = cx_conf_load(keys, NKEYS, cfg, path, errbuf, errlen);
    if (rc == CX_OK && (rc = check_whole(cfg, msg, sizeof(msg)))) {
        snprintf(errbuf, errlen, "%s: %s", path, msg);
        cx_config_cleanup(cfg);
    }
    return rc;
}

const char *
cx_config_kernel_name(const struct cx_config *cfg, enum cx_lang lang)
{
    const char *name = lang == CX_LANG_JAVASCRIPT ? cfg->kernel_name_javascript
                       : lang == CX_LANG_R        ? cfg->kernel_name_r
                                                  : cfg->kernel_name;

    return name && *name ? name : NULL;
}

unsigned
cx_config_pool_size(const struct cx_config *cfg, enum cx_lang lang)
{
    if (!cx_config_kernel_name(cfg, lang))
        return 0;
    return lang == CX_LANG_JAVASCRIPT ? cfg->kernel_pool_size_javascript
           : lang == CX_LANG_R        ? cfg->kernel_pool_size_r
                                      : cfg->kernel_pool_size;
}

const char *
cx_config_preload(const struct cx_config *cfg, enum cx_lang lang)
{
    const char *p = lang == CX_LANG_JAVASCRIPT ? cfg->kernel_preload_javascript
                    : lang == CX_LANG_R        ? cfg->kernel_preload_r
                                               : cfg->kernel_preload;

    return p ? p : "";
}

enum cx_err
cx_config_language(const struct cx_config *cfg, const json_t *v, enum cx_lang *out, char *msg,
                   size_t msglen)
{
    char offered[64] = "";

    *out = CX_LANG_PYTHON;
    if (!v)
        return CX_OK;
    if (!json_is_string(v) || !cx_lang_parse(json_string_value(v), out)) {
        snprintf(msg, msglen, "language must be \"python\", \"javascript\" or \"r\"");
        return CX_ERR_INVALID;
    }
    if (cx_config_kernel_name(cfg, *out))
        return CX_OK;
    for (int i = 0; i < CX_LANG__COUNT; i++)
        if (cx_config_kernel_name(cfg, (enum cx_lang)i))
            snprintf(offered + strlen(offered), sizeof(offered) - strlen(offered), "%s%s",
                     *offered ? ", " : "", cx_lang_name((enum cx_lang)i));
    snprintf(msg, msglen, "language: this server does not run %s (it runs %s)", cx_lang_name(*out),
             offered);
    return CX_ERR_INVALID;
}
