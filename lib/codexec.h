/* codexec: the library's interface to its programs.
 *
 * codexec-fcgi (fcgi/), codexec-admin (admin/) and codexec-kernel-launcher
 * (launcher/) call libcodexec through this header alone, and it declares
 * nothing else: every function here is one a program calls (the list is
 * lib/libcodexec.sym; tests/check-exports.sh holds the programs to it).
 * The modules' own headers (lib/<module>.h) declare what the modules call
 * of each other; they include this one. The library is linked into the
 * programs (a convenience library), not installed.
 *
 * A program opens one struct cx_ctx per thread (cx_host_ctx_open) over a
 * configuration (cx_config_load) and the server secret (cx_auth_new),
 * then calls the modules. Every fallible call returns enum cx_err;
 * docs/internals/map.md says which module does what. */
#ifndef CODEXEC_H
#define CODEXEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* What the programs hold only pointers to. */
struct cx_auth;
struct cx_db;
struct cx_gateway;
struct cx_storage;

/* The prefix of the message ids of codexec's requests that may end a run:
 * the launcher's relay (launcher/relay.h) ends the sandbox's other
 * processes before such a request's reply passes (lib/kernel.c sends
 * them). */
#define CX_RELAY_RUN_END "codexec-run-end-"

/* The Python codexec runs in every Python kernel, by name: "epilogue"
 * (lib/epilogue.py), "capture" (lib/capture_helper.py), "files"
 * (lib/files_helper.py); NULL for another. A kernel compiles each the
 * first time a request carries it and keeps it under its version (the
 * source's SHA-256); the launcher's kernel template compiles them ahead,
 * kept where every kernel forked from it finds them
 * (launcher/template.py). */
const char *cx_kernel_source(const char *name);

/* --- Errors (lib/err.c) ------------------------------------------------------ */

#define CX_MUSTCHECK    __attribute__((warn_unused_result))
#define CX_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* The size of every message buffer that goes with an error: a sentence for
 * the client, never user content beyond ids. */
#define CX_MSG_MAX 256

enum cx_err {
    /* Not failures: what a callback tells the loop that called it, as
     * nginx's NGX_AGAIN and NGX_DONE. The loop acts on them; they never
     * reach a client (the error table has no row for them). */
    CX_AGAIN = -2, /* pause: return to the caller, which calls again */
    CX_DONE = -4,  /* stop: nothing more is of use */
    CX_OK = 0,
    CX_ERR_NOMEM,           /* allocation failed or a buffer hit its cap */
    CX_ERR_INVALID,         /* bad input from a caller or a file */
    CX_ERR_TOO_LARGE,       /* input exceeds a configured limit */
    CX_ERR_NOT_FOUND,       /* no such row, file or route */
    CX_ERR_INPUT_NOT_FOUND, /* a run's input is not the caller's in its conversation */
    CX_ERR_UNAUTHORIZED,
    CX_ERR_FORBIDDEN,
    CX_ERR_EXPIRED,
    CX_ERR_CONFLICT,      /* busy, already exists */
    CX_ERR_QUOTA,         /* a per-user limit (sessions, bytes, artifacts) */
    CX_ERR_CAPACITY,      /* no kernel can be had now: every gateway is full */
    CX_ERR_TOO_MANY_RUNS, /* the user's runs in progress are at their limit */
    CX_ERR_BUSY,          /* every run slot of the process is taken */
    CX_ERR_IO,            /* read/write/fsync on local storage or a stream */
    CX_ERR_DB,            /* PostgreSQL failed */
    CX_ERR_GATEWAY,       /* the Jupyter gateway failed or answered badly */
    CX_ERR_TIMEOUT,
    CX_ERR_PROTOCOL,    /* a peer broke its protocol (WebSocket, Jupyter) */
    CX_ERR_KERNEL_DIED, /* the kernel exited or was restarted during a run */
    CX_ERR_INTERNAL,
    CX_ERR_INVALID_PATH,      /* a workspace path that breaks its rules */
    CX_ERR_NOT_A_FILE,        /* a path through a symlink, or naming no regular file */
    CX_ERR_RUN_ENDED,         /* a run that already ended (cancel) */
    CX_ERR_IDEMPOTENCY,       /* an Idempotency-Key reused for another request */
    CX_ERR_IN_PROGRESS,       /* the first request of an Idempotency-Key is still in progress */
    CX_ERR_LANGUAGE_MISMATCH, /* a run in another language than its session's */
    CX_ERR__COUNT
};

/* A static English description; never NULL. */
const char *cx_strerror(enum cx_err err);

/* --- Languages (SPEC §10.3; docs/internals/languages.md) -------------------- */

/* A session's language, fixed when it starts. CX_LANG_ANY: whatever the
 * session has (python for one created now), for calls that run no code of
 * the caller's (file operations). */
enum cx_lang {
    CX_LANG_ANY = -1,
    CX_LANG_PYTHON = 0,
    CX_LANG_JAVASCRIPT,
    CX_LANG_R,
    CX_LANG__COUNT
};

/* --- Byte buffers with a cap (lib/buf.c) ------------------------------------- */

struct cx_buf {
    char *data;
    size_t len;
    size_t alloc;
    size_t cap;
    enum cx_err err;
};

void cx_buf_init(struct cx_buf *b, size_t cap);
void cx_buf_cleanup(struct cx_buf *b);
void cx_buf_reset(struct cx_buf *b);
void cx_buf_adds(struct cx_buf *b, const char *s);
void cx_buf_addf(struct cx_buf *b, const char *fmt, ...) CX_PRINTF(2, 3);
/* CX_OK, CX_ERR_NOMEM or CX_ERR_TOO_LARGE: the first failure, sticky. */
enum cx_err cx_buf_err(const struct cx_buf *b);

/* --- Helpers (lib/util.c) ---------------------------------------------------- */

/* Whether s[0..n) holds only ASCII letters, digits and characters of
 * extra. */
bool cx_name_chars(const char *s, size_t n, const char *extra);

/* Monotonic clock in milliseconds / microseconds. */
int64_t cx_now_ms(void);
int64_t cx_now_us(void);

/* Lower-case hex of 16 random bytes (a request id). out: 33 bytes. */
void cx_random_id(char out[33]);

/* Whether addr (an IPv4, IPv6 or IPv4-mapped IPv6 address as a web server
 * passes REMOTE_ADDR) is in a normalised address list (metrics_allow). */
bool cx_addr_list_match(const char *list, const char *addr);

/* A conversation id: a name inside a user's namespace, 1 to
 * CX_CONVERSATION_MAX of [A-Za-z0-9._:-]; CX_CONVERSATION_RULE is what a
 * client is told when it is not (every place that checks one). */
#define CX_CONVERSATION_MAX  128
#define CX_CONVERSATION_RULE "conversation_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -"

/* --- Logging (lib/log.c) ----------------------------------------------------- */

enum cx_log_level { CX_LOG_ERR = 0, CX_LOG_WARN, CX_LOG_INFO, CX_LOG_DEBUG };

/* path NULL or "" = stderr. May be called again (SIGHUP) to reopen. */
enum cx_err cx_log_open(const char *path, int level) CX_MUSTCHECK;
int cx_log_level(void);

/* The calling thread's request id (copied, at most 32 chars); NULL clears. */
void cx_log_set_request_id(const char *id);

/* JSON lines instead of text: one object per line with time, level, pid,
 * tid, request_id, msg, and for requests and runs their fields. */
void cx_log_set_json(bool json);

/* A request's summary line: "GET health 200 1234us"; in JSON with method,
 * route, status and duration_us. method and route are codexec's own words
 * (a route name, never the path). */
void cx_log_request(const char *method, const char *route, int status, long long us);

/* What a line written to stderr by hand (a start-up failure, before or
 * beside the log) starts with: its syslog priority ("<3>") when stderr is
 * the journal, else "". */
const char *cx_log_stderr_prefix(int level);

/* errnum: an errno value appended as "(N: text)", or 0. */
void cx_log_write(int level, int errnum, const char *fmt, ...) CX_PRINTF(3, 4);

#define cx_log_err(errnum, ...)  cx_log_write(CX_LOG_ERR, (errnum), __VA_ARGS__)
#define cx_log_warn(errnum, ...) cx_log_write(CX_LOG_WARN, (errnum), __VA_ARGS__)
#define cx_log_info(...)         cx_log_write(CX_LOG_INFO, 0, __VA_ARGS__)
#define cx_log_debug(...)                                                                          \
    do {                                                                                           \
        if (cx_log_level() >= CX_LOG_DEBUG)                                                        \
            cx_log_write(CX_LOG_DEBUG, 0, __VA_ARGS__);                                            \
    } while (0)

/* --- A thread's context ------------------------------------------------------ */

/* Gateways a configuration may list (config.h). */
#define CX_GATEWAYS_MAX 16

struct cx_ctx {
    const struct cx_config *cfg;             /* shared, read-only */
    const struct cx_auth *auth;              /* shared, read-only */
    struct cx_db *db;                        /* this thread's */
    struct cx_gateway *gw;                   /* this thread's handle of the first gateway */
    struct cx_gateway *gws[CX_GATEWAYS_MAX]; /* ... of every gateway, in config order */
    unsigned ngws;
    struct cx_storage *store; /* this thread's handle of the artifact storage */
};

/* --- "key = value" files (lib/conf.c): codexec.conf and the launcher's sandbox.conf --- */

enum cx_conf_type {
    CX_CONF_STR,           /* char *, strdup'ed */
    CX_CONF_UINT,          /* unsigned, within [min, max] */
    CX_CONF_SIZE,          /* uint64_t with K/M/G, within [min, max] */
    CX_CONF_BOOL,          /* bool: true/yes/on/1, false/no/off/0 */
    CX_CONF_LEVEL,         /* int: error, warn, info, debug */
    CX_CONF_DELIVERY,      /* int: direct, x-accel, x-sendfile, redirect */
    CX_CONF_MODE,          /* unsigned, octal, at most max */
    CX_CONF_MODULES,       /* char *: Python module names, normalised "a,b.c" */
    CX_CONF_PATH,          /* char *: "" or an absolute path without ".." or control chars */
    CX_CONF_ADDRS,         /* char *: an address list, normalised (util.h cx_addr_list_*) */
    CX_CONF_LINES,         /* char *: a key that may repeat; its values joined by '\n' */
    CX_CONF_LOG_FORMAT,    /* int: text, json */
    CX_CONF_STORAGE,       /* int: local, s3 */
    CX_CONF_S3_ADDRESSING, /* int: path, virtual */
};

struct cx_conf_key {
    const char *name;
    enum cx_conf_type type;
    size_t off; /* offsetof in the caller's struct */
    const char *def;
    uint64_t min, max;
};

/* Fills base with every key's default. On failure base is cleaned up. */
enum cx_err cx_conf_defaults(const struct cx_conf_key *keys, size_t n, void *base) CX_MUSTCHECK;

/* Parses text over the defaults; name is used in messages. On failure base
 * is cleaned up and errbuf holds "name:line: message". */
enum cx_err cx_conf_parse(const struct cx_conf_key *keys, size_t n, void *base, const char *name,
                          const char *text, char *errbuf, size_t errlen) CX_MUSTCHECK;

/* Reads path (at most 1 MiB, no NUL bytes) and parses it. */
enum cx_err cx_conf_load(const struct cx_conf_key *keys, size_t n, void *base, const char *path,
                         char *errbuf, size_t errlen) CX_MUSTCHECK;

/* Frees the strings; wipes those whose key name ends in "_token" and the
 * lines of "gateway" (they hold tokens). */
void cx_conf_cleanup(const struct cx_conf_key *keys, size_t n, void *base);

/* --- codexec.conf (lib/config.c) --------------------------------------------- */

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

/* A Jupyter gateway: gateway_url/gateway_token/max_kernels/
 * max_kernel_memory, then each "gateway = URL [token=TOKEN]
 * [max_kernels=N] [max_memory=SIZE]" line. */
#define CX_GATEWAY_URL_MAX 512
struct cx_gateway_conf {
    char url[CX_GATEWAY_URL_MAX]; /* without a trailing slash */
    char *token;                  /* "" for none; wiped on cleanup */
    unsigned max_kernels;         /* its kernel count budget (0: by memory, lib/budget.h) */
    uint64_t max_memory;          /* its kernels' memory budget (0: their cgroup's limit) */
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
    unsigned max_kernels;            /* the first gateway's budget (0: by memory) */
    uint64_t max_kernel_memory;      /* ... its kernels' memory budget (0: their cgroup's) */
    uint64_t gateway_memory_reserve; /* what a gateway's host keeps free (0: a 20th) */
    char *gateway_lines;             /* more gateways, one per line (the "gateway" key) */
    char *kernel_name;               /* python's kernelspec */
    char *kernel_name_javascript;    /* "": JavaScript is not offered */
    char *kernel_name_r;             /* "": R is not offered */
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
    /* limits (docs/configuration.md) */
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
    unsigned user_quota_versions;     /* of all its artifacts: files on disk, rows */
    uint64_t user_quota_answer_bytes; /* runs' kept answers and events (PostgreSQL) */
    unsigned max_sessions_per_user;
    unsigned max_pending_runs_per_user;    /* runs waiting for approval */
    unsigned max_concurrent_runs_per_user; /* 0: a quarter of workers (lane.h) */
    unsigned link_default_expiry, link_max_expiry;
    char *revoked_keys_dir;          /* "": none; else one empty file per key revoked lately */
    unsigned download_cache_entries; /* downloads by key answered without a query (0: off) */
    unsigned reaper_interval;
    unsigned kernel_orphan_grace; /* seconds before a kernel no row names is deleted */
    unsigned kernel_pool_size;    /* python's; the others' below */
    char *kernel_preload;         /* "numpy,pandas": modules pooled kernels import while warming */
    unsigned kernel_pool_size_javascript, kernel_pool_size_r;
    char *kernel_preload_javascript; /* Node's built-in modules ("fs,path") */
    char *kernel_preload_r;          /* R packages ("ggplot2,data.table") */
    char *metrics_allow;             /* normalised address list (util.h) */
    bool metrics_token;              /* /metrics by the operators' token only (auth.h) */
    bool web_server_key;             /* trust params only with CODEXEC_WEB_KEY (auth.h) */
    char *mcp_allowed_origins; /* browser Origins /mcp serves, separated by commas or spaces */
    char *public_url; /* "": links in MCP answers start with the request's scheme and Host */
    unsigned
        ragflow_timeout; /* seconds a /compat/ragflow/run may run (RAGFlow's SANDBOX_TIMEOUT) */
    /* derived: every gateway, the first from gateway_url */
    struct cx_gateway_conf gateways[CX_GATEWAYS_MAX];
    unsigned ngateways;
};

/* A language's pool size (kernel_pool_size, kernel_pool_size_javascript,
 * kernel_pool_size_r; 0 for a language the server does not offer). */
unsigned cx_config_pool_size(const struct cx_config *cfg, enum cx_lang lang);

/* Reads a file over the defaults. On failure *cfg is cleaned up and errbuf
 * holds "path:line: message". */
enum cx_err cx_config_load(struct cx_config *cfg, const char *path, char *errbuf,
                           size_t errlen) CX_MUSTCHECK;

void cx_config_cleanup(struct cx_config *cfg);

/* --- Hosting the library (lib/host.c) ---------------------------------------- */

/* A thread's own database and gateway handles over the shared
 * configuration and secret (auth may be NULL for tools that never check a
 * key). Close with cx_host_ctx_close(), also after a failure. */
enum cx_err cx_host_ctx_open(struct cx_ctx *cx, const struct cx_config *cfg,
                             const struct cx_auth *auth) CX_MUSTCHECK;
void cx_host_ctx_close(struct cx_ctx *cx);

/* Once a second, from one thread: reads and drops what reached the pooled
 * (idle) kernel connections, which the gateway would otherwise buffer
 * without bound (docs/internals/runs.md). */
void cx_host_tick(void);

/* At exit, after the threads that use the library stopped: closes the
 * pooled kernel connections. */
void cx_host_shutdown(void);

/* Applies the schema's migrations (idempotent, safe to run concurrently);
 * *applied counts the new ones. */
enum cx_err cx_host_migrate(struct cx_ctx *cx, int *applied) CX_MUSTCHECK;

/* Tells the service manager a state (sd_notify(3): "READY=1",
 * "STOPPING=1", "WATCHDOG=1", "STATUS=..."): a datagram to
 * $NOTIFY_SOCKET, a no-op without one (not under systemd). Never blocks. */
void cx_host_notify(const char *state);

/* The watchdog interval systemd expects a "WATCHDOG=1" within
 * (WATCHDOG_USEC, when WATCHDOG_PID is this process), in microseconds; 0
 * for none. */
int64_t cx_host_watchdog_us(void);

/* --- API keys and the server secret (lib/auth.c) ----------------------------- */

#define CX_KEY_CHARS 46 /* "cx_" + 43 */
#define CX_USER_MAX  256

struct cx_principal {
    char user[CX_USER_MAX + 1];
    char key_id[37]; /* "" when authenticated by REMOTE_USER */
    bool require_approval;
    bool on_behalf;   /* the key may act for end users (On-Behalf-Of) */
    size_t owner_len; /* acting for an end user: user[0, owner_len) is the key's own */
};

/* cx_auth_key_create()'s flags. */
#define CX_KEY_APPROVAL  1u /* its runs wait for approval */
#define CX_KEY_ON_BEHALF 2u /* it may send On-Behalf-Of (SPEC §10.4) */

/* An end user's id in On-Behalf-Of: 1 to 128 of [A-Za-z0-9._:@-]. */
#define CX_ON_BEHALF_MAX 128

/* Writes a new secret file (mode 0600, fails if it exists). */
enum cx_err cx_auth_secret_create(const char *path) CX_MUSTCHECK;

/* Loads the secret. Free with cx_auth_free() (wipes the keys). */
enum cx_err cx_auth_new(const char *secret_file, struct cx_auth **out) CX_MUSTCHECK;
void cx_auth_free(struct cx_auth *a);

/* The key of today's signed links (v2, HMAC-SHA-256), borrowed: 64 hex
 * characters of a 32-byte subkey, and those characters are the HMAC key
 * (as nginx's njs takes it, without decoding). The one key the web server
 * may hold to check links itself: it signs links and nothing else, and the
 * server secret can't be had from it. */
const char *cx_auth_edge_key(const struct cx_auth *a);

/* The web server's key (web_server_key), borrowed, 64 hex characters: the
 * web server sends it as the FastCGI param CODEXEC_WEB_KEY from a
 * configuration only root reads, and only a request that carries it may
 * set REMOTE_USER, AUTH_TYPE and a REMOTE_ADDR codexec trusts. Any other
 * process that can reach the socket (a PHP app in www-data) is then an
 * HTTP client like any other. */
const char *cx_auth_web_key(const struct cx_auth *a);

/* The operators' token (metrics_token), borrowed, 64 hex characters: a
 * Bearer token for /metrics and health's details. */
const char *cx_auth_ops_token(const struct cx_auth *a);

/* Whether given (may be NULL) is want, compared in constant time. */
bool cx_auth_hex_equal(const char *given, const char *want);

/* Checks that a user name is acceptable (1..256 bytes of valid UTF-8, no
 * control characters). Used for key creation and REMOTE_USER. */
bool cx_auth_user_valid(const char *user);

/* Authenticates a request: the REMOTE_USER value when trust_remote_user is
 * on and it is set, else the Authorization header. */
enum cx_err cx_auth_request(const struct cx_auth *a, struct cx_db *db, bool trust_remote_user,
                            const char *remote_user, const char *authorization,
                            struct cx_principal *p) CX_MUSTCHECK;

/* Creates a key for user with flags (CX_KEY_*); key_out receives the key
 * (CX_KEY_CHARS + 1 bytes) and id_out its row id (37 bytes). CX_ERR_INVALID
 * for an on-behalf key whose user holds ':' (its end users would be
 * ambiguous). */
enum cx_err cx_auth_key_create(const struct cx_auth *a, struct cx_db *db, const char *user,
                               const char *label, unsigned flags, char *key_out,
                               char *id_out) CX_MUSTCHECK;

/* On-Behalf-Of (header, NULL when absent) applied to p: p->user becomes
 * "<user>:<id>", as if that user's own key had sent the request.
 * CX_ERR_FORBIDDEN for a principal that is not an on-behalf key or whose
 * user holds ':', CX_ERR_INVALID for a malformed id (msg says why). */
enum cx_err cx_auth_act_for(struct cx_principal *p, const char *header, char *msg,
                            size_t msglen) CX_MUSTCHECK;

/* Revokes by row id. CX_ERR_NOT_FOUND if no active key has that id. */
enum cx_err cx_auth_key_revoke(struct cx_db *db, const char *id) CX_MUSTCHECK;

/* The keys (of user, or all with NULL), oldest first, as objects with these
 * members ("approval" is "yes" or "no", "revoked" null while valid); never
 * a key or its hash. */
#define CX_AUTH_KEY_LIST_COLUMNS "id user label prefix approval created revoked"
enum cx_err cx_auth_key_list(struct cx_db *db, const char *user, json_t **out) CX_MUSTCHECK;

/* --- HTTP helpers (lib/http.c) ----------------------------------------------- */

/* Reason phrase of a status ("Not Found"); "Unknown" for others. */
const char *cx_http_reason(int status);

/* New reference: {"error": {"code": code, "message": message}}. NULL on OOM. */
json_t *cx_http_error_json(const char *code, const char *message);

/* Reads a request body of content_length bytes (the CONTENT_LENGTH param,
 * NULL or "" = none) through read_fn, refusing more than max bytes, whether
 * announced or actually sent (CX_ERR_TOO_LARGE). A short body is CX_ERR_IO.
 * On CX_OK *body is malloc'ed, NUL-terminated, and the caller frees it. */
typedef ssize_t (*cx_http_read_fn)(void *ctx, void *buf, size_t n);
enum cx_err cx_http_read_body(cx_http_read_fn read_fn, void *ctx, const char *content_length,
                              uint64_t max, char **body, size_t *len) CX_MUSTCHECK;

/* Parses a JSON object from a body. Rejects invalid UTF-8, NUL bytes,
 * duplicate keys, trailing data and non-objects; msg receives a sentence
 * fit for the client. On CX_OK *out is a new reference. */
enum cx_err cx_http_parse_json_object(const char *body, size_t len, json_t **out, char *msg,
                                      size_t msglen) CX_MUSTCHECK;

/* Finds name in a query string and percent-decodes its value into out.
 * CX_ERR_NOT_FOUND if absent, CX_ERR_INVALID if malformed (bad escape, NUL,
 * invalid UTF-8), CX_ERR_TOO_LARGE if it does not fit. */
enum cx_err cx_http_query_get(const char *query, const char *name, char *out,
                              size_t outlen) CX_MUSTCHECK;

/* Content-Disposition for a download: attachment; filename="<ASCII>";
 * filename*=UTF-8''<percent-encoded>. Quotes, backslashes, CR, LF and other
 * control characters never reach the header. out: 1200 bytes suffice. */
void cx_http_content_disposition(const char *filename, char *out, size_t outlen);

/* Appends s percent-encoded: ALPHA and DIGIT and the characters in keep
 * stay, every other byte becomes %XX. */
void cx_http_pct_encode(struct cx_buf *b, const char *s, const char *keep);

/* IMF-fixdate (RFC 9110), e.g. "Sun, 06 Nov 1994 08:49:37 GMT". out: 32 bytes. */
void cx_http_date(long long unix_seconds, char out[32]);

enum cx_range { CX_RANGE_NONE, CX_RANGE_ONE, CX_RANGE_UNSATISFIABLE };

/* Interprets a Range header against a body of size bytes. One range
 * ("a-b", "a-", "-n") gives CX_RANGE_ONE and [*first, *last]; an absent,
 * malformed, non-bytes or multi-range header gives CX_RANGE_NONE (the
 * whole body); a range past the end, CX_RANGE_UNSATISFIABLE. */
enum cx_range cx_http_range(const char *header, uint64_t size, uint64_t *first, uint64_t *last);

/* Whether an If-None-Match header matches the entity tag "\"<etag>\"". */
bool cx_http_etag_matches(const char *if_none_match, const char *etag);

/* --- Artifact storage (lib/storage.c) ---------------------------------------- */

/* The object's path on disk (for open(2), X-Accel-Redirect, X-Sendfile);
 * CX_ERR_INVALID for a bad key or with an object store. */
enum cx_err cx_storage_path(const struct cx_storage *st, const char *key, char *out,
                            size_t outlen) CX_MUSTCHECK;

/* --- Metrics (lib/metrics.c) ------------------------------------------------- */

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
    CX_COUNT_KEYCACHE_HITS,      /* keys checked without a database query */
    CX_COUNT_KEYCACHE_MISSES,    /* ... that asked the database (while the cache was live) */
    CX_COUNT__N
};
void cx_metrics_count(enum cx_counter c);
void cx_metrics_add(enum cx_counter c, uint64_t n);

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

/* Process-wide levels, rendered as codexec_<name>. */
enum cx_gauge {
    CX_GAUGE_WORKERS, /* request threads alive */
    CX_GAUGE__N
};
void cx_metrics_gauge_add(enum cx_gauge g, int64_t delta);

/* Appends the exposition text to b. */
void cx_metrics_render(struct cx_buf *b);

/* --- Health (lib/health.c) --------------------------------------------------- */

/* Checks PostgreSQL (SELECT 1), every gateway (the token and kernel_name
 * through GET /api/kernelspecs) and storage (a probe file is
 * written and synced). *out gets a new reference: {"status": "ok" |
 * "unavailable", "checks": {"postgresql": "ok" | "failed: …", "gateway":
 * (ok while one gateway is), "gateways": {URL: …}, "storage": …}}.
 * Returns true when every check passed. The result is shared by the
 * process's threads and at most a second old: health checks are safe to
 * hammer. *out is NULL (and false returned) only when out of memory. */
bool cx_health_check(struct cx_ctx *cx, json_t **out);

/* Leaves of a health answer only what anyone may know: each check's "ok"
 * or "failed", without the reason or the gateways' URLs. */
void cx_health_redact(json_t *answer);

/* --- A run's request and its listener (lib/runreq.c) ------------------------- */

/* A validated POST /v1/runs body. Strings and arrays are borrowed from
 * root, which the struct holds a reference to: cx_run_request_cleanup(). */
struct cx_run_request {
    json_t *root;
    char conversation_id[CX_CONVERSATION_MAX + 1];
    const char *code;
    size_t code_len;
    json_t *inputs;  /* array of uuid strings, or NULL */
    json_t *outputs; /* array of glob strings, or NULL */
    bool capture_artifacts;
    double timeout;    /* seconds, clamped to (0, max_timeout] */
    unsigned ttl;      /* seconds, clamped to [1, max_ttl] */
    json_t *arguments; /* object, or NULL */
    enum cx_lang lang; /* language: CX_LANG_PYTHON unless asked */
    bool output_full;  /* output: "full": stdout and stderr whole in the answer */
    bool detach;       /* wait: false: answered 202 at the "run" event, run without the client */
};

/* Validates body (a JSON object) against docs/openapi.yaml and the limits in cfg.
 * On failure returns CX_ERR_INVALID or CX_ERR_TOO_LARGE and msg holds a
 * sentence for the client naming the field. On success *req takes a new
 * reference to body. */
enum cx_err cx_run_request_parse(const struct cx_config *cfg, json_t *body,
                                 struct cx_run_request *req, char *msg, size_t msglen) CX_MUSTCHECK;
void cx_run_request_cleanup(struct cx_run_request *req);

/* A streaming run's events, as they happen (Server-Sent Events in
 * codexec-fcgi). name: "run" {run_id, conversation_id} first, then
 * "status" {state: "queued" | "executing" | "capturing"}, "stdout" and
 * "stderr" {text} (coalesced over CX_RUN_COALESCE_MS, whole characters),
 * "display" {mime_type, path} for a rich output that becomes an artifact
 * under path; NULL name when nothing was said for CX_RUN_HEARTBEAT_MS (a
 * heartbeat is due). data is borrowed; id is the event's (1, 2, ...: the
 * SSE id a client resumes after, GET /v1/runs/{id}/events), 0 for none.
 * The final answer is not an event: it is the call's *out, or its error
 * (the follower of cx_run_events() tells it as "result"). Returns false
 * once the client is gone: the run goes on to its end and its record, and
 * fn is not called again. */
#define CX_RUN_COALESCE_MS  25
#define CX_RUN_HEARTBEAT_MS 15000
struct cx_run_sink {
    bool (*fn)(void *ctx, const char *name, json_t *data, unsigned id);
    void *ctx;
    /* a listener that replays nothing (an MCP call): the events are not
     * kept for GET /v1/runs/{id}/events, and the record is not made
     * durable before the "run" event, as for a run without a listener */
    bool unkept;
};

/* --- Runs (lib/run.c) -------------------------------------------------------- */

/* The user's run record (never the code): with, once the run ended, the
 * fields of its answer (as POST /v1/runs answered or streamed it, kept for
 * run_answer_ttl). CX_ERR_NOT_FOUND for a missing
 * run, another user's run and a malformed id alike. *out: new reference. */
enum cx_err cx_run_get(struct cx_ctx *cx, const char *user, const char *run_id,
                       json_t **out) CX_MUSTCHECK;

/* POST /v1/runs: runs the request in the caller's conversation, or, when
 * approval is required (config or key), records it as pending (*pending),
 * telling sink (NULL: nobody) what happens while it runs. On CX_OK *out is
 * the payload (new reference): the run's answer, also when its code raised
 * or timed out. Request-level failures: CX_ERR_INPUT_NOT_FOUND,
 * CX_ERR_CONFLICT (the conversation is busy), CX_ERR_QUOTA (at the session
 * cap, all busy), CX_ERR_GATEWAY, CX_ERR_DB; msg says what failed. An
 * error after the "run" event is still the return value. With a sink, or
 * detached, the run's record is made durable before the "run" event and
 * its events are kept (lib/journal.h). */
enum cx_err cx_run_submit_stream(struct cx_ctx *cx, const struct cx_principal *who,
                                 struct cx_run_request *req, const struct cx_run_sink *sink,
                                 json_t **out, bool *pending, char *msg,
                                 size_t msglen) CX_MUSTCHECK;

/* POST /v1/runs/{id}/approve and /reject. CX_ERR_FORBIDDEN for a key that
 * itself requires approval (whatever the run), CX_ERR_NOT_FOUND for a run
 * that is not this user's or not pending, CX_ERR_EXPIRED when it waited too
 * long. */
enum cx_err cx_run_approve(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
                           json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;
/* cx_run_approve() with the approved run's events told to sink. */
enum cx_err cx_run_approve_stream(struct cx_ctx *cx, const struct cx_principal *who,
                                  const char *run_id, const struct cx_run_sink *sink, json_t **out,
                                  char *msg, size_t msglen) CX_MUSTCHECK;
enum cx_err cx_run_reject(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
                          json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* POST /v1/runs/{id}/cancel: the run, running or waiting for approval,
 * ends with error_name "Cancelled" (a running one once its process hears
 * of it: interrupted, restarted if it ignores that). *out: {run_id,
 * status}. CX_ERR_NOT_FOUND for another user's or no run, CX_ERR_RUN_ENDED
 * when it already ended. */
enum cx_err cx_run_cancel(struct cx_ctx *cx, const char *user, const char *run_id, json_t **out,
                          char *msg, size_t msglen) CX_MUSTCHECK;

/* GET /v1/runs/{id}/events (lib/journal.c): tells sink the run's kept
 * events after id after, then the new ones as they are kept while it
 * runs (polling), then "result": the run's record with its answer. On
 * the calling thread for as long as the run: bounded per user and per
 * process (CX_ERR_TOO_MANY_RUNS, CX_ERR_BUSY). CX_ERR_NOT_FOUND for no
 * run of the user's. Returns once the client is gone, at the longest a
 * run lasts, or after cx_run_events_stop(). */
enum cx_err cx_run_events(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
                          unsigned after, const struct cx_run_sink *sink, char *msg,
                          size_t msglen) CX_MUSTCHECK;
/* At shutdown, before the request threads are joined: every follower
 * returns within a quarter second. */
void cx_run_events_stop(void);

/* --- Idempotency-Key (lib/idem.c) -------------------------------------------- */

/* A request with an Idempotency-Key: the first of a user with a key (for
 * 24 hours) does the work (owner) and records its answer; a later one with
 * the same fingerprint is answered that (replay), one with another is
 * CX_ERR_IDEMPOTENCY. Only successes are kept: a failed first request
 * releases its key, so a retry does the work. */
#define CX_IDEM_KEY_MAX 128
struct cx_idem {
    struct cx_ctx *cx;
    char user[CX_USER_MAX + 1];
    char key[CX_IDEM_KEY_MAX + 1]; /* "": no key, every call a no-op */
    bool owner;                    /* this request does it: cx_idem_finish() */
    bool replay;                   /* the first's answer: status and answer */
    int status;
    json_t *answer;
    char body_sha256[65]; /* a replay: the first's streamed body, "" for none */
    void *hash;           /* the owner's streamed body as read */
    cx_http_read_fn inner;
    void *inner_ctx;
};

/* Claims key (the Idempotency-Key header, NULL or "" for none: *id is a
 * no-op) for user and the request, whose fingerprint is the SHA-256 of
 * what[0..len) (its method, route and JSON body, or a streamed body's
 * length and type). A first request of the key still in progress is
 * waited for up to wait_s seconds (a run), else CX_ERR_IN_PROGRESS.
 * CX_ERR_INVALID for a key that is not 1-128 printable ASCII. Clean up
 * with cx_idem_cleanup(). */
enum cx_err cx_idem_begin(struct cx_ctx *cx, const char *user, const char *key, const char *what,
                          size_t len, unsigned wait_s, struct cx_idem *id, char *msg,
                          size_t msglen) CX_MUSTCHECK;
/* The owner's body is read through cx_idem_read(id, ...) from now on,
 * hashed on the way: a replay checks its own against it. */
void cx_idem_reader(struct cx_idem *id, cx_http_read_fn inner, void *ctx);
ssize_t cx_idem_read(void *id, void *buf, size_t n);
/* A replay of a streamed body: reads the body through fn (at most max
 * bytes, else CX_ERR_TOO_LARGE) and compares it with the first's
 * (CX_ERR_IDEMPOTENCY when it differs). */
enum cx_err cx_idem_check_body(struct cx_idem *id, cx_http_read_fn fn, void *ctx,
                               uint64_t max) CX_MUSTCHECK;
/* The owner's run is run_id (recorded before it runs: a retry waits for
 * it and is answered its record). */
void cx_idem_run(struct cx_idem *id, const char *run_id);
/* The owner's answer: status (2xx) and its body, kept; status 0 (it
 * failed) releases the key. */
void cx_idem_finish(struct cx_idem *id, int status, const json_t *answer);
/* Frees; an owner that did not finish releases the key. */
void cx_idem_cleanup(struct cx_idem *id);

/* --- Run threads (lib/lane.c) ------------------------------------------------ */

/* A job: called once on a run thread, with that thread's context. */
typedef void (*cx_lane_fn)(struct cx_ctx *cx, void *arg);

/* Starts the run threads (each opens its context over cfg and auth, which
 * must outlive cx_lane_stop()). */
enum cx_err cx_lane_start(const struct cx_config *cfg, const struct cx_auth *auth) CX_MUSTCHECK;

/* Takes no more jobs, lets those queued and running finish, and joins the
 * threads. Safe without a start. */
void cx_lane_stop(void);

/* Queues fn(cx, arg) for user. CX_ERR_TOO_MANY_RUNS when the user has
 * per_user jobs queued or running, CX_ERR_BUSY when the queue is full or
 * the lane stopping; msg says which. On CX_OK fn is called exactly once. */
enum cx_err cx_lane_submit(const char *user, cx_lane_fn fn, void *arg, char *msg,
                           size_t msglen) CX_MUSTCHECK;

/* Called by a job before its answer goes out (before the last event of a
 * streamed one): from then on the job no longer counts as one of its
 * user's runs in progress (the client, told the run's end, may send the
 * next one at once; the thread still finishes the job). No-op off a run
 * thread and when called again; the job's end does it otherwise. */
void cx_lane_answered(void);

/* A request body read on a request thread (fcgi/request.c): behind a web
 * server that passes bodies on as they arrive (Apache's mod_proxy_fcgi;
 * nginx buffers them first), a client that sends its body slowly holds
 * the thread as long, and an upload to an object store holds it while it
 * writes. At most a quarter of workers (at least 1) of one owner's (a
 * key's own user: an on-behalf key's end users are its); the others are
 * left to the other keys, health checks and downloads. CX_OK or
 * CX_ERR_BUSY (msg says whose). */
enum cx_err cx_lane_body_enter(const struct cx_config *cfg, const char *owner, char *msg,
                               size_t msglen) CX_MUSTCHECK;
void cx_lane_body_leave(const char *owner);

/* --- Artifacts (lib/artifact.c, upload.c, commit.c, fsck.c) ------------------ */

/* POST /v1/artifacts: streams body bytes (raw, or the "file" part of a
 * multipart/form-data body) into storage, never holding them whole, then
 * stores them like a captured file. Query parameters conversation_id and
 * filename (raw) or form fields (multipart). *out: the artifact entry.
 * CX_ERR_INVALID/TOO_LARGE/QUOTA with msg for the client. */
enum cx_err cx_artifact_upload(struct cx_ctx *cx, const char *user, const char *query,
                               const char *content_type, const char *content_length,
                               ssize_t (*read_fn)(void *, void *, size_t), void *read_ctx,
                               json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* GET /v1/artifacts?conversation_id=: *out = {"conversation_id",
 * "artifacts": [...]}. CX_ERR_INVALID for a malformed conversation id. */
enum cx_err cx_artifact_list(struct cx_ctx *cx, const char *user, const char *cid,
                             json_t **out) CX_MUSTCHECK;

/* GET /v1/artifacts/{id}: metadata with every version. CX_ERR_NOT_FOUND for
 * a missing, deleted or foreign artifact and a malformed id alike. */
enum cx_err cx_artifact_get(struct cx_ctx *cx, const char *user, const char *id,
                            json_t **out) CX_MUSTCHECK;

/* DELETE /v1/artifacts/{id}: rows go in a transaction, bytes after it. */
enum cx_err cx_artifact_delete(struct cx_ctx *cx, const char *user, const char *id) CX_MUSTCHECK;

/* codexec-admin fsck: files without rows (and staging files older than an
 * hour), rows without files, size or sha256 mismatches, one line each to
 * report. With repair, files without rows are removed (rows are only ever
 * reported: their bytes cannot be made up). *problems counts what remains. */
enum cx_err cx_artifact_fsck(struct cx_ctx *cx, bool repair, FILE *report,
                             int *problems) CX_MUSTCHECK;

/* codexec-admin storage migrate: copies every version's bytes from
 * storage_dir into the configured object store (storage = s3), checking
 * each one's size and sha256 against its row on the way; versions already
 * in the store with the row's size are skipped, so a migration that
 * stopped goes on where it was. One line per problem to report; *copied
 * and *problems count. CX_ERR_INVALID when storage is not s3. */
enum cx_err cx_artifact_storage_migrate(struct cx_ctx *cx, FILE *report, int *copied,
                                        int *problems) CX_MUSTCHECK;

#ifdef CX_TEST_HOOKS
/* Test builds only (configure --enable-test-hooks), a stand-in for a crash
 * that cannot be produced on demand: when the environment has
 * CODEXEC_TEST_CRASH_BEFORE_COMMIT=1, the process exits after renaming
 * files into place and before COMMIT. */
void cx_artifact_test_hooks(void);
#endif

/* --- A conversation's files (lib/files.c) ------------------------------------ */

#define CX_FILE_PATH_MAX    4096
#define CX_FILE_SEGMENT_MAX 255

/* A workspace path, percent-encoded (a URL's path: encoded) or not (a
 * query's value, decoded already): decoded into out, then held to SPEC §10.1's rules:
 * "/"-separated, no empty, "." or ".." segment, no NUL or control character, UTF-8, at most 4096
 * bytes, each segment at most 255. CX_ERR_INVALID_PATH with msg saying which rule; "" only with
 * empty_ok (the workspace itself). */
enum cx_err cx_files_path(const char *raw, bool encoded, bool empty_ok,
                          char out[CX_FILE_PATH_MAX + 1], char *msg, size_t msglen) CX_MUSTCHECK;

/* PUT .../files/{path}: the body (content_length bytes, at most
 * max_artifact_bytes, read through read_fn a chunk at a time) written to the
 * path, parents made, the session created if there is none. The file is
 * the caller's input: the next run's capture does not take it. *out:
 * {"path", "size", "sha256"} (the SHA-256 of the bytes read). */
enum cx_err cx_files_write(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
                           const char *content_length, cx_http_read_fn read_fn, void *rctx,
                           json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* Where a read goes: head() once, before any byte, with the file's size,
 * SHA-256 and libmagic type (false: no body wanted after all, as for a
 * matching If-None-Match); then, when body, data() for every piece in order
 * (false: stop). */
struct cx_files_reader {
    bool (*head)(void *ctx, uint64_t size, const char *sha256, const char *mime);
    bool (*data)(void *ctx, const void *data, size_t len);
    void *ctx;
    bool body;
};

/* GET/HEAD .../files/{path}. CX_ERR_NOT_FOUND without a session or file;
 * an error after head() means the body was cut short. */
enum cx_err cx_files_read(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
                          const struct cx_files_reader *rd, char *msg, size_t msglen) CX_MUSTCHECK;

/* GET .../files?path=DIR&recursive=: *out = {"files": [{"path", "type",
 * "size", "mtime"}], "truncated"}, at most 10000 entries. */
enum cx_err cx_files_list(struct cx_ctx *cx, const char *user, const char *cid, const char *dir,
                          bool recursive, json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* DELETE .../files/{path}: a file, or a directory tree with recursive. */
enum cx_err cx_files_delete(struct cx_ctx *cx, const char *user, const char *cid, const char *path,
                            bool recursive, char *msg, size_t msglen) CX_MUSTCHECK;

/* --- What a download knows of an artifact ------------------------------------ */

struct cx_download {
    char artifact_id[37];
    int version;
    char filename[256];
    char mime[128];
    uint64_t size;
    char sha256[65];
    char key[1024];
    long long created; /* unix seconds: Last-Modified */
};

/* --- Downloads and links (lib/download.c) ------------------------------------ */

/* A download request's credentials, as the web server passed them. */
struct cx_download_request {
    const char *id;            /* the artifact id from the path */
    const char *query;         /* the query string, "" when absent */
    const char *remote_user;   /* REMOTE_USER when the web server authenticated, else NULL */
    const char *authorization; /* the Authorization header, or NULL */
    const char *on_behalf;     /* the On-Behalf-Of header, or NULL */
};

/* GET /v1/artifacts/{id}/content: who may read what. A valid signed link
 * names the user and version; else REMOTE_USER; else an API key, checked in
 * the same statement that finds the artifact (one round trip). *who is the
 * principal (empty for a link). CX_ERR_FORBIDDEN for a tampered or moved
 * link, CX_ERR_EXPIRED for an old one, CX_ERR_UNAUTHORIZED without valid
 * credentials (also before a bad ?version: a 401 never depends on the
 * query), CX_ERR_INVALID for a bad ?version, CX_ERR_NOT_FOUND alike for a
 * missing and a foreign artifact. msg says which. */
enum cx_err cx_download_authorize(struct cx_ctx *cx, const struct cx_download_request *q,
                                  struct cx_principal *who, struct cx_download *d, char *msg,
                                  size_t msglen) CX_MUSTCHECK;

/* Opens the version's bytes for reading (never through a symlink); local
 * storage only. */
enum cx_err cx_download_open(struct cx_ctx *cx, const struct cx_download *d, int *fd) CX_MUSTCHECK;

/* Whether the bytes are in an object store (read them with
 * cx_download_read), else in files (cx_download_open). */
bool cx_download_from_store(struct cx_ctx *cx);

/* A presigned URL of the version's object, valid s3_url_expiry seconds:
 * for a browser (a redirect: the store sends its type and disposition), or
 * its path and query only (for nginx's internal location). */
enum cx_err cx_download_presign(struct cx_ctx *cx, const struct cx_download *d, bool for_browser,
                                char *out, size_t outlen) CX_MUSTCHECK;

/* Bytes first..last of the version into sink as they come (storage.h
 * cx_storage_read). */
enum cx_err cx_download_read(struct cx_ctx *cx, const struct cx_download *d, uint64_t first,
                             uint64_t last, bool (*sink)(void *ctx, const void *data, size_t len),
                             void *ctx) CX_MUSTCHECK;

/* POST /v1/artifacts/{id}/links: body {"version"?, "expires_in"?} (borrowed,
 * may be NULL). *out = {"url", "expires_at", "version"}. The link is bound
 * to the user, the artifact, the version, the expiry and the key that made
 * it (revoking that key kills the link), HMAC'd with the server's link key. */
enum cx_err cx_link_create(struct cx_ctx *cx, const struct cx_principal *who, const char *id,
                           json_t *body, json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* --- The download cache (lib/dlcache.c) -------------------------------------- */

/* The download cache: a download by API key answered without a database
 * round trip when the same key asked for the same artifact and version
 * within the last minute. The check stays on every request; only where
 * its answer comes from changes. An entry is forgotten the moment its key
 * is revoked or its artifact deleted or given a new version, as
 * PostgreSQL announces it (cx_dlcache_follow below), on every process; while the announcements
 * can't be heard (no connection), nothing is answered from the cache. Process-wide, shared by every
 * thread. */

/* Sets the capacity (entries; 0: no cache). Once, before any thread. */
enum cx_err cx_dlcache_init(unsigned entries) CX_MUSTCHECK;
void cx_dlcache_shutdown(void);

/* The watcher's loop (watch.h cx_watch_follow) until *stop is set: the
 * cache forgets a revoked key or a changed artifact, and revoked_keys_dir
 * follows, within milliseconds of the COMMIT, on every node; off while the
 * changes can't be heard. */
void cx_dlcache_follow(struct cx_ctx *cx, const volatile int *stop);

/* --- The artifacts page (lib/page.c) ----------------------------------------- */

/* Appends a self-contained HTML page (no external assets) listing the
 * user's artifacts in the conversation: path, kind, type, size, versions,
 * an image preview and a download link. Links are signed (the browser sends
 * no Authorization header for <a> and <img>). Then the live workspace's
 * files (path, type, size; the first 500), listed through the session's
 * kernel: on a run thread (the router's lane). Every value is escaped. */
enum cx_err cx_page_artifacts(struct cx_ctx *cx, const struct cx_principal *who, const char *cid,
                              struct cx_buf *out) CX_MUSTCHECK;

/* The Content-Security-Policy the page is served with. */
#define CX_PAGE_CSP                                                                                \
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action " \
    "'none'; frame-ancestors 'none'"

/* --- Sessions (lib/session.c) ------------------------------------------------ */

/* POST /v1/conversations/{cid}/session: body {"ttl"?, "language"?}
 * (borrowed, may be NULL). Creates the session and answers once its
 * kernel is ready (*created), or extends an existing one's expiry (never
 * shortens it). *out: the session's object (lib/sessapi.c). */
enum cx_err cx_session_open(struct cx_ctx *cx, const char *user, const char *cid, json_t *body,
                            json_t **out, bool *created, char *msg, size_t msglen) CX_MUSTCHECK;

/* GET /v1/conversations/{cid}/session: the object, or CX_ERR_NOT_FOUND. */
enum cx_err cx_session_get(struct cx_ctx *cx, const char *user, const char *cid,
                           json_t **out) CX_MUSTCHECK;

/* GET /v1/conversations: {"conversations": [object, ...]}, the user's live
 * sessions, most recently used first. */
enum cx_err cx_session_list_live(struct cx_ctx *cx, const char *user, json_t **out) CX_MUSTCHECK;

/* DELETE /v1/conversations/{cid}/session: CX_ERR_NOT_FOUND if none,
 * CX_ERR_CONFLICT if a run holds it. */
enum cx_err cx_session_close(struct cx_ctx *cx, const char *user,
                             const char *conversation_id) CX_MUSTCHECK;

/* The sessions (of user, or all with NULL), most recently used first, as
 * objects with these members ("kernel" null without one). */
#define CX_SESSION_LIST_COLUMNS "id user conversation kernel workspace last_used expires"
enum cx_err cx_session_list(struct cx_ctx *cx, const char *user, json_t **out) CX_MUSTCHECK;

/* --- Kernel budgets (lib/budget.c) ------------------------------------------- */

/* Appends the gauges of every gateway in Prometheus text (one query each):
 * codexec_sessions, codexec_kernels, codexec_kernel_pool_ready and
 * codexec_gateway_max_kernels, labelled gateway="URL". */
void cx_budget_metrics(struct cx_ctx *cx, struct cx_buf *b);

/* --- The kernel pool (lib/prestart.c) ---------------------------------------- */

/* Sleeps until a refill is due (cx_prestart_kick, or the time
 * cx_prestart_kick_after asked for) or seconds pass, whichever is first
 * unless a refill is put off: then until it is due. False once
 * cx_prestart_shutdown() was called. */
bool cx_prestart_wait(unsigned seconds);
void cx_prestart_shutdown(void);

/* For each usable gateway: drops pooled kernels it no longer knows and any
 * above kernel_pool_size, then starts kernels (each warmed with the preload
 * and the capture) until the pool is full, the gateway's budget
 * (max_kernels) is spent, or shutdown. Skips a gateway another process is
 * refilling. *started counts new kernels. */
enum cx_err cx_prestart_fill(struct cx_ctx *cx, int *started) CX_MUSTCHECK;

/* Deletes every pooled kernel of every gateway (codexec-admin pool drain);
 * *deleted counts them. */
enum cx_err cx_prestart_drain(struct cx_ctx *cx, int *deleted) CX_MUSTCHECK;

/* --- Expiry (lib/maint.c) ---------------------------------------------------- */

struct cx_maint {
    int sessions;  /* expired sessions closed (kernel and workspace deleted) */
    int runs;      /* pending runs expired, abandoned runs failed */
    int artifacts; /* deleted artifacts whose bytes were removed */
    int kernels;   /* kernels on the gateway that no row named, deleted */
    int staging;   /* staged writes left by a crash, removed */
    int mcp;       /* MCP sessions past their expiry, ended */
};

/* A staged write not written for this long is a crashed process's: no
 * run lasts longer (max_timeout, its grace and its capture), and a write
 * in progress touches its file at every chunk. */
#define CX_MAINT_STAGING_GRACE(cfg) ((cfg)->max_timeout + (cfg)->interrupt_grace + 600)

/* One sweep: up to limit expired sessions that no run holds, pending runs
 * past approval_ttl, runs left "running" by a crashed process, kernels on
 * the gateway that no session or pool row has named for
 * kernel_orphan_grace seconds (a process that died between starting one and
 * recording it), staged writes older than CX_MAINT_STAGING_GRACE and, with
 * artifacts, the bytes of deleted artifacts. Safe
 * with several processes. done counts what was done, also on failure;
 * done->sessions == limit means there may be more. */
enum cx_err cx_maint_sweep(struct cx_ctx *cx, int limit, bool artifacts,
                           struct cx_maint *done) CX_MUSTCHECK;

/* The server's reaper, called about once a second from one thread: probes
 * the gateways whose last probe is 2 s old (lib/gateway.h: the runs use
 * their answers and never wait for a probe), restarts the kernels the
 * ticker found talking while idle, and when *next_sweep
 * (cx_now_us(); 0 at first) is due sweeps CX_MAINT_REAP_BATCH sessions
 * (and the rest, but not the artifacts' bytes: that is `codexec-admin
 * gc`'s), logs what it did and sets *next_sweep: a second later when the
 * batch was full, else reaper_interval later. */
#define CX_MAINT_REAP_BATCH 16
void cx_maint_reap(struct cx_ctx *cx, int64_t *next_sweep);

/* --- MCP (lib/mcp.c, mcptools.c, mcpsess.c): SPEC §10.6 --------------------- */

/* The protocol versions /mcp speaks, newest first. */
#define CX_MCP_VERSIONS      "2025-11-25", "2025-06-18", "2025-03-26"
#define CX_MCP_SESSION_CHARS 32 /* an Mcp-Session-Id: lower-case hex */

/* One JSON-RPC message as POSTed to /mcp. */
struct cx_mcp_msg {
    json_t *root;       /* the message (a reference the struct holds) */
    json_t *id;         /* borrowed: a request's id; NULL for a notification or a response */
    const char *method; /* borrowed; NULL for a response */
    json_t *params;     /* borrowed; NULL when absent */
};

/* Parses a POSTed body: one JSON-RPC 2.0 message (a request, a
 * notification or a response). On failure (not JSON, a batch, not
 * JSON-RPC 2.0, an id neither a string nor an integer) *error is the
 * JSON-RPC error to answer with HTTP 400 (new reference, no id). */
enum cx_err cx_mcp_parse(const char *body, size_t len, struct cx_mcp_msg *m,
                         json_t **error) CX_MUSTCHECK;
void cx_mcp_msg_cleanup(struct cx_mcp_msg *m);

/* Whether an MCP-Protocol-Version header (NULL when absent) is one /mcp
 * speaks. */
bool cx_mcp_version_ok(const char *header);

/* Whether a request's Origin (NULL when it has none: not a browser's)
 * may use /mcp: one of mcp_allowed_origins, compared without case. */
bool cx_mcp_origin_allowed(const struct cx_config *cfg, const char *origin);

/* An MCP session: its id and the conversation its tools work in. */
struct cx_mcp_session {
    char id[CX_MCP_SESSION_CHARS + 1];
    char conversation[CX_CONVERSATION_MAX + 1]; /* "mcp-<id>" */
    char version[16];                           /* the protocol version agreed */
};

/* The session named by an Mcp-Session-Id of who's (its user and key);
 * its expiry moves on. CX_ERR_NOT_FOUND alike for a malformed, unknown,
 * expired, ended and another key's or user's id. */
enum cx_err cx_mcp_session_find(struct cx_ctx *cx, const struct cx_principal *who,
                                const char *header, struct cx_mcp_session *s) CX_MUSTCHECK;

/* DELETE /mcp: ends the session and closes its conversation's sandbox
 * session (if no run holds it). CX_ERR_NOT_FOUND as above. */
enum cx_err cx_mcp_session_end(struct cx_ctx *cx, const struct cx_principal *who,
                               const char *header) CX_MUSTCHECK;

/* What a request's call says while it runs (notifications/progress):
 * fn(ctx, message) with a JSON-RPC notification (borrowed), or NULL when
 * nothing was said for a while (a keep-alive is due); false once the
 * client is gone (the call goes on to its end). */
struct cx_mcp_sink {
    bool (*fn)(void *ctx, json_t *message);
    void *ctx;
};

/* Whether the request works a conversation's kernel (a tool that runs
 * code or touches the workspace): the caller runs it on a run thread. */
bool cx_mcp_on_lane(const struct cx_mcp_msg *m);
/* Whether the request reports progress as it runs (a run_code call with a
 * progressToken): worth an event stream. */
bool cx_mcp_streams(const struct cx_mcp_msg *m);

/* Answers a request of the session s (initialize: none yet; it makes one
 * and fills s). base: "scheme://host[/prefix]", what the links it makes
 * start with. On CX_OK *out is the JSON-RPC response (new reference): a
 * result, or a protocol error (no such method or tool, bad arguments).
 * Else the request failed as an API call would (busy, capacity, quota,
 * not found, ...): msg says why, and cx_mcp_error() makes the response. */
enum cx_err cx_mcp_request(struct cx_ctx *cx, const struct cx_principal *who,
                           struct cx_mcp_session *s, const struct cx_mcp_msg *m, const char *base,
                           const struct cx_mcp_sink *sink, json_t **out, char *msg,
                           size_t msglen) CX_MUSTCHECK;

/* The JSON-RPC error response to m (NULL: to a message that could not be
 * read, without an id) for a failure rc: its JSON-RPC code (-32602 for
 * bad input, -32002 for a resource not found, -32603 else), msg, and data
 * (borrowed, may be NULL: codexec's own error code, status and
 * Retry-After). New reference. */
json_t *cx_mcp_error(const struct cx_mcp_msg *m, enum cx_err rc, const char *msg, json_t *data);

/* A notification of the session: notifications/cancelled cancels its
 * run_code call's run, wherever it runs; the others change nothing. */
void cx_mcp_notify(struct cx_ctx *cx, const struct cx_principal *who,
                   const struct cx_mcp_session *s, const struct cx_mcp_msg *m);

/* --- RAGFlow's executor-manager protocol (lib/compat.c): SPEC §10.7 --------- */

/* POST /compat/ragflow/run: body {"code_b64", "language"?, "arguments"?}
 * (borrowed). The code runs with main(**arguments) in a fresh
 * conversation, closed after it; *out: RAGFlow's result ({"status",
 * "stdout", "stderr", "exit_code", "detail", "time_used_ms", "artifacts",
 * "result"}), also when the code failed. CX_ERR_INVALID for a malformed
 * request (msg says why); the run's own refusals (capacity, too many
 * runs, busy) as for POST /v1/runs. */
enum cx_err cx_compat_ragflow_run(struct cx_ctx *cx, const struct cx_principal *who, json_t *body,
                                  json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* GET /compat/ragflow/healthz: {"status": "ok"} and true when codexec's
 * health checks pass, else {"status": "unavailable"}. */
bool cx_compat_ragflow_health(struct cx_ctx *cx, json_t **out);

/* --- Following other processes' changes (lib/watch.c) ------------------------ */

/* kind is "key" or "artifact", id a UUID; both checked. */
typedef void (*cx_watch_fn)(void *ctx, const char *kind, const char *id);

/* One key changed: its file exists unless the key is live. */
enum cx_err cx_revoked_note(struct cx_ctx *cx, const char *key_id) CX_MUSTCHECK;

/* What a follower is told besides keeping the list: every change (fn),
 * and whether it can hear them now (live: false while the database can't
 * be heard, true again after a reconnection, which may have missed some). */
struct cx_watch_hooks {
    cx_watch_fn on_change;                 /* may be NULL */
    void (*on_live)(void *ctx, bool live); /* may be NULL */
    void *ctx;
};

/* Follows the changes until *stop is set (checked at least once a second):
 * LISTENs, and with revoked_keys_dir keeps the revocation list, each
 * revoked key's file within milliseconds of its COMMIT and the whole list
 * made again at every (re)connection and every reaper_interval. A
 * database that can't be reached is retried every second (said once).
 * The loop of codexec-fcgi's watcher thread and of `codexec-admin revoked
 * follow`, which keeps the list on a host that runs nginx and no
 * codexec-fcgi. */
enum cx_err cx_watch_follow(struct cx_ctx *cx, const volatile int *stop,
                            const struct cx_watch_hooks *hooks) CX_MUSTCHECK;

#endif
