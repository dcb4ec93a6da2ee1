/* codexec-admin: the operator CLI. It uses the same lib/ calls as the server. */
#include <curl/curl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>

#include "../lib/codexec.h"

/* A message for the operator on stderr, which is the journal under
 * systemd (ExecStartPre=codexec-admin migrate): with its priority there. */
static void __attribute__((format(printf, 2, 3))) say(int level, const char *fmt, ...)
{
    va_list ap;

    fputs(cx_log_stderr_prefix(level), stderr);
    fputs("codexec-admin: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static void
usage(FILE *f)
{
    fprintf(
        f,
        "usage: codexec-admin [--config FILE] COMMAND   (--config anywhere on the line)\n"
        "  --version                       print the version\n"
        "  config check                    read the configuration; say what is wrong, or ok\n"
        "  migrate                         apply database migrations\n"
        "  secret init                     create the server secret file if missing\n"
        "  nginx-link-key                  print the nginx line that gives nginx the key of\n"
        "                                  signed links (a key for links only, never the secret)\n"
        "  web-server-key [--apache]       print the nginx (or Apache) line that sends the web\n"
        "                                  server's key (web_server_key = true)\n"
        "  metrics-token                   print the operators' Bearer token for /metrics\n"
        "                                  (metrics_token = true)\n"
        "  key create --user NAME [--label L] [--require-approval] [--on-behalf]\n"
        "                                  create an API key; prints only the key\n"
        "  key revoke ID                   revoke a key by id\n"
        "  key list [--user NAME]          list keys (never the keys themselves)\n"
        "  fsck [--repair]                 check storage against the database\n"
        "  storage migrate                 copy storage_dir's artifacts into the S3 store\n"
        "                                  (storage = s3), checking each; resumable\n"
        "  gc                              close expired sessions, expire runs, drop tombstones\n"
        "  sessions list [--user NAME]     list sandbox sessions\n"
        "  sessions close --user NAME --conversation ID\n"
        "                                  close one session (kernel and workspace)\n"
        "  pool drain                      delete the pre-started kernels (kernel_pool_size)\n"
        "  revoked follow                  keep revoked_keys_dir for this host's nginx until\n"
        "                                  SIGTERM (an edge host without codexec-fcgi)\n");
}

static int
cmd_migrate(struct cx_ctx *cx)
{
    int applied = 0;

    if (cx_host_migrate(cx, &applied)) {
        say(CX_LOG_ERR, "migrate failed (see the log above)\n");
        return 1;
    }
    say(CX_LOG_INFO, "%d migration(s) applied\n", applied);
    return 0;
}

static int
cmd_key_create(const struct cx_config *cfg, struct cx_db *db, int argc, char **argv)
{
    static const struct option opts[] = {
        {"user", required_argument, NULL, 'u'},
        {"label", required_argument, NULL, 'l'},
        {"require-approval", no_argument, NULL, 'a'},
        {"on-behalf", no_argument, NULL, 'o'},
        {NULL, 0, NULL, 0},
    };
    const char *user = NULL, *label = NULL;
    char key[CX_KEY_CHARS + 1], id[37];
    struct cx_auth *auth = NULL;
    unsigned flags = 0;
    enum cx_err rc;
    int c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "u:l:ao", opts, NULL)) != -1) {
        switch (c) {
        case 'u': user = optarg; break;
        case 'l': label = optarg; break;
        case 'a': flags |= CX_KEY_APPROVAL; break;
        case 'o': flags |= CX_KEY_ON_BEHALF; break;
        default: usage(stderr); return 2;
        }
    }
    if (!user || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (!cx_auth_user_valid(user)) {
        say(CX_LOG_ERR, "--user must be 1 to 256 bytes of UTF-8 without control "
                        "characters\n");
        return 2;
    }
    if ((flags & CX_KEY_ON_BEHALF) && strchr(user, ':')) {
        say(CX_LOG_ERR, "--on-behalf needs a --user without ':' (its end users are "
                        "USER:<id>)\n");
        return 2;
    }
    if (cx_auth_new(cfg->secret_file, &auth)) {
        say(CX_LOG_ERR, "cannot load the secret file %s\n", cfg->secret_file);
        return 1;
    }
    rc = cx_auth_key_create(auth, db, user, label, flags, key, id);
    cx_auth_free(auth);
    if (rc) {
        say(CX_LOG_ERR, "key create failed: %s\n", cx_strerror(rc));
        return 1;
    }
    printf("%s\n", key);
    fflush(stdout);
    sodium_memzero(key, sizeof(key));
    say(CX_LOG_INFO, "created key %s for the user\n", id);
    return 0;
}

/* Prints rows (objects) as tab-separated columns under a header of the
 * column names (space-separated in columns); null as "-". */
static void
print_rows(json_t *rows, const char *columns)
{
    size_t i;
    json_t *row;

    for (const char *c = columns; *c; c++)
        putchar(*c == ' ' ? '\t' : *c);
    putchar('\n');
    json_array_foreach(rows, i, row)
    {
        const char *key;
        json_t *v;
        bool first = true;

        json_object_foreach(row, key, v)
        {
            printf("%s%s", first ? "" : "\t", json_is_string(v) ? json_string_value(v) : "-");
            first = false;
        }
        putchar('\n');
    }
}

/* "list [--user NAME]": rows from list(), printed. */
static int
cmd_list(int argc, char **argv, enum cx_err (*list)(void *, const char *, json_t **), void *ctx,
         const char *columns)
{
    const char *user = argc == 3 && !strcmp(argv[1], "--user") ? argv[2] : NULL;
    json_t *rows = NULL;

    if (argc != 1 && !user) {
        usage(stderr);
        return 2;
    }
    if (list(ctx, user, &rows)) {
        say(CX_LOG_ERR, "%s failed\n", argv[0]);
        return 1;
    }
    print_rows(rows, columns);
    json_decref(rows);
    return 0;
}

static enum cx_err
list_keys(void *cx, const char *user, json_t **out)
{
    return cx_auth_key_list(((struct cx_ctx *)cx)->db, user, out);
}

static enum cx_err
list_sessions(void *cx, const char *user, json_t **out)
{
    return cx_session_list(cx, user, out);
}

static int
cmd_fsck(struct cx_ctx *cx, int argc, char **argv)
{
    bool repair = argc == 2 && !strcmp(argv[1], "--repair");
    int problems = 0;

    if (argc > 2 || (argc == 2 && !repair)) {
        usage(stderr);
        return 2;
    }
    if (cx_artifact_fsck(cx, repair, stdout, &problems)) {
        say(CX_LOG_ERR, "fsck failed\n");
        return 1;
    }
    printf("%d problem(s)%s\n", problems, repair ? " left after repair" : "");
    return problems ? 1 : 0;
}

static int
cmd_storage_migrate(struct cx_ctx *cx)
{
    int copied = 0, problems = 0;
    enum cx_err rc = cx_artifact_storage_migrate(cx, stdout, &copied, &problems);

    if (rc == CX_ERR_INVALID) {
        say(CX_LOG_ERR, "storage migrate needs storage = s3 in the configuration "
                        "(it copies from storage_dir)\n");
        return 2;
    }
    printf("%d version(s) copied, %d problem(s)\n", copied, problems);
    if (rc) {
        say(CX_LOG_ERR, "storage migrate stopped: %s (run it again to go on)\n", cx_strerror(rc));
        return 1;
    }
    return problems ? 1 : 0;
}

static int
cmd_gc(struct cx_ctx *cx)
{
    struct cx_maint total = {0}, one;
    enum cx_err rc;

    do {
        rc = cx_maint_sweep(cx, 64, total.sessions == 0, &one);
        total.sessions += one.sessions;
        total.runs += one.runs;
        total.artifacts += one.artifacts;
    } while (rc == CX_OK && one.sessions == 64);
    if (rc) {
        say(CX_LOG_ERR, "gc failed: %s\n", cx_strerror(rc));
        return 1;
    }
    printf("closed %d expired session(s), expired %d run(s), removed %d deleted artifact(s)\n",
           total.sessions, total.runs, total.artifacts);
    return 0;
}

static int
cmd_sessions(struct cx_ctx *cx, int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "list"))
        return cmd_list(argc, argv, list_sessions, cx, CX_SESSION_LIST_COLUMNS);
    if (argc == 5 && !strcmp(argv[0], "close") && !strcmp(argv[1], "--user") &&
        !strcmp(argv[3], "--conversation")) {
        enum cx_err rc = cx_session_close(cx, argv[2], argv[4]);
        if (rc == CX_OK)
            return 0;
        say(CX_LOG_ERR, "%s\n",
            rc == CX_ERR_NOT_FOUND  ? "no such session"
            : rc == CX_ERR_CONFLICT ? "a run holds this conversation; retry later"
                                    : cx_strerror(rc));
        return 1;
    }
    usage(stderr);
    return 2;
}

/* pool drain: delete every pooled kernel (after changing the kernelspec or
 * the sandbox, or when kernel_pool_size goes to 0). Running codexec
 * processes refill the pool to their kernel_pool_size. */
static int
cmd_pool(struct cx_ctx *cx, int argc, char **argv)
{
    if (argc == 1 && !strcmp(argv[0], "drain")) {
        int n = 0;
        if (cx_prestart_drain(cx, &n)) {
            say(CX_LOG_ERR, "pool drain failed\n");
            return 1;
        }
        printf("deleted %d pooled kernel(s)\n", n);
        return 0;
    }
    usage(stderr);
    return 2;
}

static int
cmd_secret_init(const struct cx_config *cfg)
{
    enum cx_err rc = cx_auth_secret_create(cfg->secret_file);

    if (rc == CX_ERR_CONFLICT) {
        say(CX_LOG_INFO, "%s exists; left as it is\n", cfg->secret_file);
        return 0;
    }
    if (rc) {
        say(CX_LOG_ERR, "cannot create %s\n", cfg->secret_file);
        return 1;
    }
    say(CX_LOG_INFO, "created %s\n", cfg->secret_file);
    return 0;
}

static int
cmd_key_revoke(struct cx_ctx *cx, const char *id)
{
    enum cx_err rc = cx_auth_key_revoke(cx->db, id);

    if (rc == CX_ERR_NOT_FOUND)
        say(CX_LOG_ERR, "no active key with id %s\n", id);
    else if (rc)
        say(CX_LOG_ERR, "revoke failed: %s\n", cx_strerror(rc));
    else
        say(CX_LOG_INFO, "revoked %s\n", id);
    if (rc)
        return 1;
    /* its links die at the web server now, whether codexec-fcgi runs or not */
    if (cx->cfg->revoked_keys_dir[0] && cx_revoked_note(cx, id)) {
        say(CX_LOG_WARN,
            "%s could not be added to revoked_keys_dir: nginx accepts its "
            "links until codexec-fcgi lists it\n",
            id);
        return 1;
    }
    return 0;
}

/* `set $codexec_link_key "<hex>";` for the nginx link module (nginx/module/). */
static int
cmd_nginx_link_key(const struct cx_config *cfg)
{
    struct cx_auth *auth = NULL;

    if (cx_auth_new(cfg->secret_file, &auth)) {
        say(CX_LOG_ERR, "cannot read %s\n", cfg->secret_file);
        return 1;
    }
    printf("# written by codexec-admin nginx-link-key: keep it readable by root only\n"
           "set $codexec_link_key \"%s\";\n",
           cx_auth_edge_key(auth));
    cx_auth_free(auth);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* What the web server sends as CODEXEC_WEB_KEY (web_server_key), as a
 * line of its configuration: nginx's, or with --apache Apache's. */
static int
cmd_web_server_key(const struct cx_config *cfg, bool apache)
{
    struct cx_auth *auth = NULL;

    if (cx_auth_new(cfg->secret_file, &auth)) {
        say(CX_LOG_ERR, "cannot read %s\n", cfg->secret_file);
        return 1;
    }
    printf("# written by codexec-admin web-server-key: keep it readable by root only\n");
    if (apache)
        printf("SetEnv CODEXEC_WEB_KEY %s\n", cx_auth_web_key(auth));
    else
        printf("fastcgi_param CODEXEC_WEB_KEY \"%s\";\n", cx_auth_web_key(auth));
    cx_auth_free(auth);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* The operators' Bearer token for /metrics (metrics_token), alone. */
static int
cmd_metrics_token(const struct cx_config *cfg)
{
    struct cx_auth *auth = NULL;

    if (cx_auth_new(cfg->secret_file, &auth)) {
        say(CX_LOG_ERR, "cannot read %s\n", cfg->secret_file);
        return 1;
    }
    printf("%s\n", cx_auth_ops_token(auth));
    cx_auth_free(auth);
    return fflush(stdout) == 0 ? 0 : 1;
}

static volatile int follow_stop;

static void
on_stop_signal(int sig)
{
    (void)sig;
    follow_stop = 1;
}

/* Keeps revoked_keys_dir on a host whose nginx checks signed links but
 * that runs no codexec-fcgi (codexec-revoked.service), until SIGTERM. */
static int
cmd_revoked_follow(struct cx_ctx *cx)
{
    struct sigaction sa = {.sa_handler = on_stop_signal};

    if (!cx->cfg->revoked_keys_dir[0]) {
        say(CX_LOG_ERR, "revoked follow needs revoked_keys_dir in the config\n");
        return 2;
    }
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    cx_log_set_request_id("revoked");
    cx_log_info("following the revocation list in %s", cx->cfg->revoked_keys_dir);
    if (cx_watch_follow(cx, &follow_stop, NULL)) {
        say(CX_LOG_ERR, "out of memory\n");
        return 1;
    }
    return 0;
}

/* The commands that need the database (and the gateway): argv[0] is the
 * command's name. */
static int
dispatch(struct cx_ctx *cx, int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : "";

    if (!strcmp(argv[0], "migrate") && argc == 1)
        return cmd_migrate(cx);
    if (!strcmp(argv[0], "key") && !strcmp(sub, "create"))
        return cmd_key_create(cx->cfg, cx->db, argc - 1, argv + 1);
    if (!strcmp(argv[0], "key") && !strcmp(sub, "revoke") && argc == 3)
        return cmd_key_revoke(cx, argv[2]);
    if (!strcmp(argv[0], "key") && !strcmp(sub, "list"))
        return cmd_list(argc - 1, argv + 1, list_keys, cx, CX_AUTH_KEY_LIST_COLUMNS);
    if (!strcmp(argv[0], "fsck"))
        return cmd_fsck(cx, argc, argv);
    if (!strcmp(argv[0], "storage") && argc == 2 && !strcmp(argv[1], "migrate"))
        return cmd_storage_migrate(cx);
    if (!strcmp(argv[0], "gc") && argc == 1)
        return cmd_gc(cx);
    if (!strcmp(argv[0], "sessions"))
        return cmd_sessions(cx, argc - 1, argv + 1);
    if (!strcmp(argv[0], "pool"))
        return cmd_pool(cx, argc - 1, argv + 1);
    if (!strcmp(argv[0], "revoked") && argc == 2 && !strcmp(argv[1], "follow"))
        return cmd_revoked_follow(cx);
    usage(stderr);
    return 2;
}

/* Takes "--config FILE" and "--config=FILE" out of argv wherever they
 * are before a "--" (the last one wins; "--" itself is taken out); false
 * when one lacks its FILE. */
static bool
take_config(int *argc, char **argv, const char **path)
{
    int out = 1;

    for (int i = 1; i < *argc; i++) {
        if (!strncmp(argv[i], "--config=", 9)) {
            *path = argv[i] + 9;
        } else if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= *argc)
                return false;
            *path = argv[++i];
        } else if (!strcmp(argv[i], "--")) { /* the rest as it is, "--config" too */
            while (++i < *argc)
                argv[out++] = argv[i];
        } else {
            argv[out++] = argv[i];
        }
    }
    *argc = out;
    argv[out] = NULL;
    return **path != '\0';
}

/* codexec-admin config check: the file parsed as the server parses it. */
static int
cmd_config_check(const char *path)
{
    struct cx_config cfg;
    char errbuf[512];

    if (cx_config_load(&cfg, path, errbuf, sizeof(errbuf))) {
        say(CX_LOG_ERR, "%s\n", errbuf);
        return 1;
    }
    printf("%s: ok (%u gateway(s), storage %s, delivery %s)\n", path, cfg.ngateways,
           cfg.storage == CX_STORAGE_S3 ? "s3" : "local",
           cfg.delivery == CX_DELIVERY_X_ACCEL      ? "x-accel"
           : cfg.delivery == CX_DELIVERY_X_SENDFILE ? "x-sendfile"
           : cfg.delivery == CX_DELIVERY_REDIRECT   ? "redirect"
                                                    : "direct");
    cx_config_cleanup(&cfg);
    return 0;
}

int
main(int argc, char **argv)
{
    const char *config_path = CX_CONFIG_FILE;
    struct cx_config cfg;
    struct cx_ctx cx = {0};
    char errbuf[512];
    int i = 1, status = 1;

    if (!take_config(&argc, argv, &config_path)) {
        usage(stderr);
        return 2;
    }
    if (i >= argc || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
        usage(i >= argc ? stderr : stdout);
        return i >= argc ? 2 : 0;
    }
    if (!strcmp(argv[i], "--version") && argc == 2) {
        printf("codexec-admin %s\n", PACKAGE_VERSION);
        return 0;
    }
    if (!strcmp(argv[i], "config") && argc == 3 && !strcmp(argv[2], "check"))
        return cmd_config_check(config_path);
    if (cx_config_load(&cfg, config_path, errbuf, sizeof(errbuf))) {
        say(CX_LOG_ERR, "%s\n", errbuf);
        return 1;
    }
    if (cx_log_open(NULL, cfg.log_level) == CX_OK && sodium_init() >= 0 &&
        curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK) {
        if (!strcmp(argv[i], "secret") && i + 2 == argc && !strcmp(argv[i + 1], "init"))
            status = cmd_secret_init(&cfg);
        else if (!strcmp(argv[i], "nginx-link-key") && i + 1 == argc)
            status = cmd_nginx_link_key(&cfg);
        else if (!strcmp(argv[i], "web-server-key") &&
                 (i + 1 == argc || (i + 2 == argc && !strcmp(argv[i + 1], "--apache"))))
            status = cmd_web_server_key(&cfg, i + 2 == argc);
        else if (!strcmp(argv[i], "metrics-token") && i + 1 == argc)
            status = cmd_metrics_token(&cfg);
        else if (cx_host_ctx_open(&cx, &cfg, NULL) == CX_OK)
            status = dispatch(&cx, argc - i, argv + i);
        curl_global_cleanup();
    }
    cx_host_ctx_close(&cx);
    cx_config_cleanup(&cfg);
    return status;
}
