/* codexec: codexec.conf, "key = value" lines, '#' comment lines.
 *
 * Every key has a default (README: Configuration); unknown keys and bad values are refused
 * with the line number. The struct is plain data so handlers can read it. */
#ifndef CX_CONFIG_H
#define CX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctx.h"
#include "err.h"

enum cx_delivery {
    CX_DELIVERY_DIRECT,
    CX_DELIVERY_X_ACCEL,
    CX_DELIVERY_X_SENDFILE,
    CX_DELIVERY_REDIRECT /* s3: a 302 to a presigned URL */
};
enum cx_storage_kind { CX_STORAGE_LOCAL, CX_STORAGE_S3 };

/* Where configure put things (make install; the Debian package: /etc, /var). */
#ifndef CX_SYSCONFDIR
#define CX_SYSCONFDIR "/etc"
#endif
#ifndef CX_LOCALSTATEDIR
#define CX_LOCALSTATEDIR "/var"
#endif
#define CX_CONFIG_FILE CX_SYSCONFDIR "/codexec/codexec.conf"

/* A Jupyter gateway: gateway_url/gateway_token/max_kernels, then each
 * "gateway = URL [token=TOKEN] [max_kernels=N]" line. */
#define CX_GATEWAY_URL_MAX 512
struct cx_gateway_conf {
    char url[CX_GATEWAY_URL_MAX]; /* without a trailing slash */
    char *token;                  /* "" for none; wiped on cleanup */
    unsigned max_kernels;         /* its kernel budget */
};

struct cx_config {
    /* server */
    char *listen; /* "" = fd 0 (spawned by a web server or systemd) */
    unsigned socket_mode;
    unsigned workers;     /* request threads */
    unsigned run_workers; /* run threads (lane.h); 0: as many as workers */
    char *log_file;       /* "" = stderr */
    int log_level;        /* enum cx_log_level */
    int log_format;       /* 0 text, 1 JSON lines (log.h) */
    /* services */
    char *database; /* libpq conninfo */
    char *gateway_url;
    char *gateway_token;
    unsigned max_kernels; /* the first gateway's budget */
    char *gateway_lines;  /* more gateways, one per line (the "gateway" key) */
    char *kernel_name;
    char *storage_dir;
    char *secret_file;
    /* object storage (storage = s3) */
    int storage; /* enum cx_storage_kind */
    char *s3_endpoint;
    char *s3_region;
    char *s3_bucket;
    char *s3_prefix;
    int s3_addressing; /* 0 path-style, 1 virtual-hosted */
    char *s3_credentials_file;
    uint64_t s3_part_size;  /* a multipart upload's parts; smaller objects go in one PUT */
    unsigned s3_url_expiry; /* seconds a presigned URL (x-accel, redirect) lives */
    char *s3_key_id, *s3_secret, *s3_token; /* read at load; wiped on cleanup */
    /* auth and delivery */
    bool trust_remote_user;
    bool require_approval;
    int delivery; /* enum cx_delivery */
    char *x_accel_prefix;
    /* limits (README: Configuration) */
    unsigned default_timeout, max_timeout;
    unsigned default_ttl, max_ttl;
    unsigned interrupt_grace;
    unsigned busy_wait;
    unsigned approval_ttl;
    unsigned run_answer_ttl; /* seconds a run's answer is kept (0: not kept) */
    unsigned tail_chars;
    uint64_t max_output_bytes;
    uint64_t max_code_bytes;
    uint64_t max_body_bytes;     /* uploads */
    uint64_t max_run_body_bytes; /* POST /v1/runs: code and arguments */
    uint64_t max_artifact_bytes;
    unsigned max_captured_files;
    unsigned max_inputs;
    uint64_t user_quota_bytes;
    unsigned user_quota_artifacts;
    unsigned max_sessions_per_user;
    unsigned max_pending_runs_per_user;    /* runs waiting for approval */
    unsigned max_concurrent_runs_per_user; /* 0: a quarter of workers (lane.h) */
    unsigned link_default_expiry, link_max_expiry;
    char *revoked_keys_dir;          /* "": none; else one empty file per key revoked lately */
    unsigned download_cache_entries; /* downloads by key answered without a query (0: off) */
    unsigned reaper_interval;
    unsigned kernel_orphan_grace; /* seconds before a kernel no row names is deleted */
    unsigned kernel_pool_size;
    char *kernel_preload; /* "numpy,pandas": modules pooled kernels import while warming */
    char *metrics_allow;  /* normalised address list (util.h) */
    bool metrics_token;   /* /metrics by the operators' token only (auth.h) */
    bool web_server_key;  /* trust params only with CODEXEC_WEB_KEY (auth.h) */
    /* derived: every gateway, the first from gateway_url */
    struct cx_gateway_conf gateways[CX_GATEWAYS_MAX];
    unsigned ngateways;
};

/* Fills *cfg with every default. Free with cx_config_cleanup(). */
enum cx_err cx_config_defaults(struct cx_config *cfg) CX_MUSTCHECK;

/* Reads a file over the defaults. On failure *cfg is cleaned up and errbuf
 * holds "path:line: message". */
enum cx_err cx_config_load(struct cx_config *cfg, const char *path, char *errbuf,
                           size_t errlen) CX_MUSTCHECK;

/* Parses text (already in memory) over the defaults; name is used in errors. */
enum cx_err cx_config_parse(struct cx_config *cfg, const char *name, const char *text, char *errbuf,
                            size_t errlen) CX_MUSTCHECK;

void cx_config_cleanup(struct cx_config *cfg);

#endif
