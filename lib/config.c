#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"

enum type { T_STR, T_UINT, T_SIZE, T_BOOL, T_LEVEL, T_DELIVERY, T_MODE };

struct key {
    const char *name;
    enum type type;
    size_t off;
    const char *def;
    uint64_t min, max; /* for T_UINT and T_SIZE */
};

#define O(f) offsetof(struct cx_config, f)
#define KiB  1024ULL
#define MiB  (1024ULL * KiB)
#define GiB  (1024ULL * MiB)

static const struct key keys[] = {
    {"listen", T_STR, O(listen), "", 0, 0},
    {"socket_mode", T_MODE, O(socket_mode), "0660", 0, 0777},
    {"workers", T_UINT, O(workers), "16", 1, 1024},
    {"log_file", T_STR, O(log_file), "", 0, 0},
    {"log_level", T_LEVEL, O(log_level), "info", 0, 0},
    {"database", T_STR, O(database), "dbname=codexec", 0, 0},
    {"gateway_url", T_STR, O(gateway_url), "http://127.0.0.1:8888", 0, 0},
    {"gateway_token", T_STR, O(gateway_token), "", 0, 0},
    {"kernel_name", T_STR, O(kernel_name), "python3", 0, 0},
    {"storage_dir", T_STR, O(storage_dir), "/var/lib/codexec/storage", 0, 0},
    {"secret_file", T_STR, O(secret_file), "/etc/codexec/secret", 0, 0},
    {"trust_remote_user", T_BOOL, O(trust_remote_user), "false", 0, 0},
    {"require_approval", T_BOOL, O(require_approval), "false", 0, 0},
    {"delivery", T_DELIVERY, O(delivery), "direct", 0, 0},
    {"x_accel_prefix", T_STR, O(x_accel_prefix), "/_codexec_storage/", 0, 0},
    {"default_timeout", T_UINT, O(default_timeout), "30", 1, 86400},
    {"max_timeout", T_UINT, O(max_timeout), "300", 1, 86400},
    {"default_ttl", T_UINT, O(default_ttl), "600", 1, 30 * 86400},
    {"max_ttl", T_UINT, O(max_ttl), "3600", 1, 30 * 86400},
    {"interrupt_grace", T_UINT, O(interrupt_grace), "5", 1, 600},
    {"busy_wait", T_UINT, O(busy_wait), "10", 0, 3600},
    {"approval_ttl", T_UINT, O(approval_ttl), "3600", 1, 30 * 86400},
    {"tail_chars", T_UINT, O(tail_chars), "4000", 1, 1000000},
    {"max_output_bytes", T_SIZE, O(max_output_bytes), "8M", 1024, 1 * GiB},
    {"max_code_bytes", T_SIZE, O(max_code_bytes), "1M", 16, 64 * MiB},
    {"max_body_bytes", T_SIZE, O(max_body_bytes), "64M", 1024, 64 * GiB},
    {"max_artifact_bytes", T_SIZE, O(max_artifact_bytes), "100M", 1, 64 * GiB},
    {"max_captured_files", T_UINT, O(max_captured_files), "64", 0, 100000},
    {"max_inputs", T_UINT, O(max_inputs), "32", 0, 10000},
    {"user_quota_bytes", T_SIZE, O(user_quota_bytes), "5G", 0, 1024 * GiB * 1024},
    {"user_quota_artifacts", T_UINT, O(user_quota_artifacts), "5000", 0, 100000000},
    {"max_sessions_per_user", T_UINT, O(max_sessions_per_user), "8", 1, 100000},
    {"link_default_expiry", T_UINT, O(link_default_expiry), "300", 1, 365 * 86400},
    {"link_max_expiry", T_UINT, O(link_max_expiry), "604800", 1, 365 * 86400},
    {"reaper_interval", T_UINT, O(reaper_interval), "30", 1, 86400},
    {"kernel_pool_size", T_UINT, O(kernel_pool_size), "0", 0, 1024},
};

static const char *const levels[] = {"error", "warn", "info", "debug"};
static const char *const deliveries[] = {"direct", "x-accel", "x-sendfile"};

enum cx_err
cx_config_parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;
    uint64_t mult = 1;

    if (!isdigit((unsigned char)*s))
        return CX_ERR_INVALID;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s)
        return CX_ERR_INVALID;
    switch (*end) {
    case '\0': break;
    case 'k':
    case 'K':
        mult = KiB;
        end++;
        break;
    case 'm':
    case 'M':
        mult = MiB;
        end++;
        break;
    case 'g':
    case 'G':
        mult = GiB;
        end++;
        break;
    default: return CX_ERR_INVALID;
    }
    if (*end != '\0')
        return CX_ERR_INVALID;
    if (v > UINT64_MAX / mult)
        return CX_ERR_INVALID;
    *out = v * mult;
    return CX_OK;
}

static int
lookup(const char *const *names, size_t n, const char *v)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], v) == 0)
            return (int)i;
    return -1;
}

/* Sets one key; on failure writes a message (without position) to msg. */
static enum cx_err
set_value(struct cx_config *cfg, const struct key *k, const char *v, char *msg, size_t msglen)
{
    char *base = (char *)cfg + k->off;
    uint64_t n;
    char *end;
    int i;

    switch (k->type) {
    case T_STR: {
        char *copy = strdup(v);
        if (!copy)
            return CX_ERR_NOMEM;
        free(*(char **)base);
        *(char **)base = copy;
        return CX_OK;
    }
    case T_UINT:
    case T_SIZE:
        if (k->type == T_UINT) {
            if (!isdigit((unsigned char)*v))
                goto bad_number;
            errno = 0;
            unsigned long long u = strtoull(v, &end, 10);
            if (errno || *end)
                goto bad_number;
            n = u;
        } else if (cx_config_parse_size(v, &n)) {
            snprintf(msg, msglen, "%s: expected a size such as 512, 64K, 8M or 5G", k->name);
            return CX_ERR_INVALID;
        }
        if (n < k->min || n > k->max) {
            snprintf(msg, msglen, "%s: %s is out of range [%llu, %llu]", k->name, v,
                     (unsigned long long)k->min, (unsigned long long)k->max);
            return CX_ERR_INVALID;
        }
        if (k->type == T_UINT)
            *(unsigned *)base = (unsigned)n;
        else
            *(uint64_t *)base = n;
        return CX_OK;
    case T_MODE:
        if (*v < '0' || *v > '7')
            goto bad_mode;
        errno = 0;
        n = strtoull(v, &end, 8);
        if (errno || *end || n > k->max)
            goto bad_mode;
        *(unsigned *)base = (unsigned)n;
        return CX_OK;
    case T_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1"))
            *(bool *)base = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0"))
            *(bool *)base = false;
        else {
            snprintf(msg, msglen, "%s: expected true or false", k->name);
            return CX_ERR_INVALID;
        }
        return CX_OK;
    case T_LEVEL:
        i = lookup(levels, sizeof(levels) / sizeof(levels[0]), v);
        if (i < 0) {
            snprintf(msg, msglen, "%s: expected error, warn, info or debug", k->name);
            return CX_ERR_INVALID;
        }
        *(int *)base = i;
        return CX_OK;
    case T_DELIVERY:
        i = lookup(deliveries, sizeof(deliveries) / sizeof(deliveries[0]), v);
        if (i < 0) {
            snprintf(msg, msglen, "%s: expected direct, x-accel or x-sendfile", k->name);
            return CX_ERR_INVALID;
        }
        *(int *)base = i;
        return CX_OK;
    }
    return CX_ERR_INTERNAL;
bad_number:
    snprintf(msg, msglen, "%s: expected a non-negative integer", k->name);
    return CX_ERR_INVALID;
bad_mode:
    snprintf(msg, msglen, "%s: expected an octal mode such as 0660", k->name);
    return CX_ERR_INVALID;
}

void
cx_config_cleanup(struct cx_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (keys[i].type == T_STR) {
            char **p = (char **)((char *)cfg + keys[i].off);
            if (keys[i].off == O(gateway_token) && *p)
                memset(*p, 0, strlen(*p));
            free(*p);
            *p = NULL;
        }
}

enum cx_err
cx_config_defaults(struct cx_config *cfg)
{
    char msg[128];
    enum cx_err rc;

    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        rc = set_value(cfg, &keys[i], keys[i].def, msg, sizeof(msg));
        if (rc) {
            cx_config_cleanup(cfg);
            return rc;
        }
    }
    return CX_OK;
}

static char *
trim(char *s)
{
    char *e;

    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

static enum cx_err
check_whole(struct cx_config *cfg, char *msg, size_t msglen)
{
    if (cfg->default_timeout > cfg->max_timeout) {
        snprintf(msg, msglen, "default_timeout is above max_timeout");
        return CX_ERR_INVALID;
    }
    if (cfg->default_ttl > cfg->max_ttl) {
        snprintf(msg, msglen, "default_ttl is above max_ttl");
        return CX_ERR_INVALID;
    }
    if (cfg->link_default_expiry > cfg->link_max_expiry) {
        snprintf(msg, msglen, "link_default_expiry is above link_max_expiry");
        return CX_ERR_INVALID;
    }
    if (cfg->max_code_bytes > cfg->max_body_bytes) {
        snprintf(msg, msglen, "max_code_bytes is above max_body_bytes");
        return CX_ERR_INVALID;
    }
    return CX_OK;
}

enum cx_err
cx_config_parse(struct cx_config *cfg, const char *name, const char *text, char *errbuf,
                size_t errlen)
{
    char msg[256];
    char *copy = NULL, *line, *next;
    unsigned lineno = 0;
    unsigned char seen[sizeof(keys) / sizeof(keys[0])] = {0};
    enum cx_err rc;

    rc = cx_config_defaults(cfg);
    if (rc)
        return rc;
    copy = strdup(text);
    if (!copy) {
        rc = CX_ERR_NOMEM;
        goto out;
    }
    for (line = copy; line; line = next) {
        char *eq, *k, *v;
        size_t i;

        lineno++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (strlen(line) > 4096) {
            snprintf(errbuf, errlen, "%s:%u: line too long", name, lineno);
            rc = CX_ERR_INVALID;
            goto out;
        }
        k = trim(line);
        if (*k == '\0' || *k == '#')
            continue;
        eq = strchr(k, '=');
        if (!eq) {
            snprintf(errbuf, errlen, "%s:%u: expected \"key = value\"", name, lineno);
            rc = CX_ERR_INVALID;
            goto out;
        }
        *eq = '\0';
        k = trim(k);
        v = trim(eq + 1);
        for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (strcmp(keys[i].name, k) == 0)
                break;
        if (i == sizeof(keys) / sizeof(keys[0])) {
            snprintf(errbuf, errlen, "%s:%u: unknown key \"%.64s\"", name, lineno, k);
            rc = CX_ERR_INVALID;
            goto out;
        }
        if (seen[i]) {
            snprintf(errbuf, errlen, "%s:%u: %s is set twice", name, lineno, keys[i].name);
            rc = CX_ERR_INVALID;
            goto out;
        }
        seen[i] = 1;
        rc = set_value(cfg, &keys[i], v, msg, sizeof(msg));
        if (rc) {
            snprintf(errbuf, errlen, "%s:%u: %s", name, lineno, msg);
            goto out;
        }
    }
    rc = check_whole(cfg, msg, sizeof(msg));
    if (rc)
        snprintf(errbuf, errlen, "%s: %s", name, msg);
out:
    free(copy);
    if (rc)
        cx_config_cleanup(cfg);
    return rc;
}

enum cx_err
cx_config_load(struct cx_config *cfg, const char *path, char *errbuf, size_t errlen)
{
    struct cx_buf b;
    char chunk[4096];
    size_t n;
    FILE *f;
    enum cx_err rc;

    f = fopen(path, "re");
    if (!f) {
        snprintf(errbuf, errlen, "%s: cannot open: %s", path, strerror(errno));
        return CX_ERR_IO;
    }
    cx_buf_init(&b, 1024 * 1024);
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        cx_buf_add(&b, chunk, n);
    if (ferror(f)) {
        snprintf(errbuf, errlen, "%s: read failed", path);
        rc = CX_ERR_IO;
    } else if (cx_buf_err(&b)) {
        snprintf(errbuf, errlen, "%s: file too large", path);
        rc = cx_buf_err(&b);
    } else if (memchr(b.data ? b.data : "", '\0', b.len)) {
        snprintf(errbuf, errlen, "%s: contains a NUL byte", path);
        rc = CX_ERR_INVALID;
    } else {
        rc = cx_config_parse(cfg, path, b.data ? b.data : "", errbuf, errlen);
    }
    fclose(f);
    cx_buf_cleanup(&b);
    return rc;
}
