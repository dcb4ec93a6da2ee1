#include "conf.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "util.h"

#define KiB 1024ULL
#define MiB (1024ULL * KiB)
#define GiB (1024ULL * MiB)

static const char *const levels[] = {"error", "warn", "info", "debug"};
static const char *const deliveries[] = {"direct", "x-accel", "x-sendfile", "redirect"};
static const char *const log_formats[] = {"text", "json"};
static const char *const storages[] = {"local", "s3"};
static const char *const addressings[] = {"path", "virtual"};

enum cx_err
cx_conf_parse_size(const char *s, uint64_t *out)
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

/* "numpy, pandas, matplotlib.pyplot": Python module names (dotted
 * identifiers of ASCII letters, digits and '_'), at most 32 of them. They
 * become source text of the warming cell, so nothing else may pass. Stored
 * as "numpy,pandas,matplotlib.pyplot". */
static bool
module_name_valid(const char *s, size_t n)
{
    bool at_start = true;

    if (n == 0 || n > 128 || s[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';

        if (at_start ? !letter : !(letter || (c >= '0' && c <= '9') || c == '.'))
            return false;
        at_start = c == '.';
    }
    return true;
}

static enum cx_err
parse_modules(const char *v, char **out)
{
    char *norm = malloc(strlen(v) + 1), *w = norm;
    unsigned count = 0;

    if (!norm)
        return CX_ERR_NOMEM;
    for (const char *item = v; *v;) {
        const char *end;

        v = strchr(item, ',');
        if (!v)
            v = item + strlen(item);
        while (item < v && (*item == ' ' || *item == '\t'))
            item++;
        for (end = v; end > item && (end[-1] == ' ' || end[-1] == '\t'); end--)
            ;
        if (!module_name_valid(item, (size_t)(end - item)) || ++count > 32) {
            free(norm);
            return CX_ERR_INVALID;
        }
        if (w != norm)
            *w++ = ',';
        memcpy(w, item, (size_t)(end - item));
        w += end - item;
        if (*v == ',' && *++v == '\0') { /* a trailing comma */
            free(norm);
            return CX_ERR_INVALID;
        }
        item = v;
    }
    *w = '\0';
    *out = norm;
    return CX_OK;
}

/* An absolute path with no "." or ".." component, no control characters
 * and no doubled or trailing slash; or "" (unset). */
static bool
path_valid(const char *v)
{
    if (!*v)
        return true;
    if (v[0] != '/' || strlen(v) > 1024)
        return false;
    for (const char *p = v; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return false;
        if (p[0] == '/' && (p[1] == '/' || p[1] == '\0') && p != v)
            return false;
        if (p[0] == '/' && p[1] == '.' &&
            (p[2] == '/' || p[2] == '\0' || (p[2] == '.' && (p[3] == '/' || p[3] == '\0'))))
            return false;
    }
    return strcmp(v, "/") != 0;
}

static int
lookup(const char *const *names, size_t n, const char *v)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], v) == 0)
            return (int)i;
    return -1;
}

/* Parsers of one type: v into the field at base; on failure a message
 * (without position) naming the key in msg. */
typedef enum cx_err (*set_fn)(const struct cx_conf_key *k, char *base, const char *v, char *msg,
                              size_t msglen);

static enum cx_err
invalid(const struct cx_conf_key *k, char *msg, size_t msglen, const char *expected)
{
    snprintf(msg, msglen, "%s: expected %s", k->name, expected);
    return CX_ERR_INVALID;
}

static enum cx_err
take_string(char *base, char *copy)
{
    if (!copy)
        return CX_ERR_NOMEM;
    free(*(char **)base);
    *(char **)base = copy;
    return CX_OK;
}

static enum cx_err
set_str(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    return take_string(base, strdup(v));
}

static enum cx_err
set_path(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    if (!path_valid(v))
        return invalid(k, msg, msglen, "an absolute path");
    return take_string(base, strdup(v));
}

static enum cx_err
set_number(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    uint64_t n;

    if (k->type == CX_CONF_SIZE && cx_conf_parse_size(v, &n))
        return invalid(k, msg, msglen, "a size such as 512, 64K, 8M or 5G");
    if (k->type == CX_CONF_UINT) {
        char *end;
        if (!isdigit((unsigned char)*v))
            return invalid(k, msg, msglen, "a non-negative integer");
        errno = 0;
        n = strtoull(v, &end, 10);
        if (errno || *end)
            return invalid(k, msg, msglen, "a non-negative integer");
    }
    if (n < k->min || n > k->max) {
        snprintf(msg, msglen, "%s: %s is out of range [%llu, %llu]", k->name, v,
                 (unsigned long long)k->min, (unsigned long long)k->max);
        return CX_ERR_INVALID;
    }
    if (k->type == CX_CONF_UINT)
        *(unsigned *)base = (unsigned)n;
    else
        *(uint64_t *)base = n;
    return CX_OK;
}

static enum cx_err
set_mode(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    char *end;
    unsigned long long n;

    if (*v < '0' || *v > '7')
        return invalid(k, msg, msglen, "an octal mode such as 0660");
    errno = 0;
    n = strtoull(v, &end, 8);
    if (errno || *end || n > k->max)
        return invalid(k, msg, msglen, "an octal mode such as 0660");
    *(unsigned *)base = (unsigned)n;
    return CX_OK;
}

static enum cx_err
set_bool(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1"))
        *(bool *)base = true;
    else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0"))
        *(bool *)base = false;
    else
        return invalid(k, msg, msglen, "true or false");
    return CX_OK;
}

/* A word from a fixed list, stored as its index. */
static enum cx_err
set_choice(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    static const struct {
        enum cx_conf_type type;
        const char *const *words;
        size_t n;
        const char *expected;
    } choices[] = {
        {CX_CONF_LEVEL, levels, 4, "error, warn, info or debug"},
        {CX_CONF_DELIVERY, deliveries, 4, "direct, x-accel, x-sendfile or redirect"},
        {CX_CONF_LOG_FORMAT, log_formats, 2, "text or json"},
        {CX_CONF_STORAGE, storages, 2, "local or s3"},
        {CX_CONF_S3_ADDRESSING, addressings, 2, "path or virtual"},
    };

    for (size_t c = 0; c < sizeof(choices) / sizeof(choices[0]); c++) {
        int i;
        if (choices[c].type != k->type)
            continue;
        i = lookup(choices[c].words, choices[c].n, v);
        if (i < 0)
            return invalid(k, msg, msglen, choices[c].expected);
        *(int *)base = i;
        return CX_OK;
    }
    return CX_ERR_INTERNAL;
}

static enum cx_err
set_modules(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    char *list = NULL;
    enum cx_err rc = parse_modules(v, &list);

    if (rc == CX_ERR_INVALID)
        return invalid(k, msg, msglen,
                       "Python module names separated by commas, such as "
                       "\"numpy, pandas, matplotlib.pyplot\"");
    return rc ? rc : take_string(base, list);
}

static enum cx_err
set_addrs(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    char *list = NULL;
    enum cx_err rc = cx_addr_list_normalize(v, &list);

    if (rc == CX_ERR_INVALID)
        return invalid(k, msg, msglen,
                       "addresses or networks separated by commas, such as \"127.0.0.0/8, ::1\", "
                       "or * for every address");
    return rc ? rc : take_string(base, list);
}

/* A repeatable key: each value is appended as a line. */
static enum cx_err
set_lines(const struct cx_conf_key *k, char *base, const char *v, char *msg, size_t msglen)
{
    char *old = *(char **)base, *joined;
    size_t n = old ? strlen(old) : 0;

    if (!*v && k->def != v) /* (only the default, "", is empty) */
        return invalid(k, msg, msglen, "a value (an empty line sets nothing)");
    if (!n)
        return take_string(base, strdup(v));
    joined = malloc(n + strlen(v) + 2);
    if (!joined)
        return CX_ERR_NOMEM;
    memcpy(joined, old, n);
    joined[n] = '\n';
    memcpy(joined + n + 1, v, strlen(v) + 1);
    memset(old, 0, n); /* it may hold tokens */
    return take_string(base, joined);
}

static const set_fn setters[] = {
    [CX_CONF_STR] = set_str,        [CX_CONF_UINT] = set_number,
    [CX_CONF_SIZE] = set_number,    [CX_CONF_BOOL] = set_bool,
    [CX_CONF_LEVEL] = set_choice,   [CX_CONF_DELIVERY] = set_choice,
    [CX_CONF_MODE] = set_mode,      [CX_CONF_MODULES] = set_modules,
    [CX_CONF_PATH] = set_path,      [CX_CONF_ADDRS] = set_addrs,
    [CX_CONF_LINES] = set_lines,    [CX_CONF_LOG_FORMAT] = set_choice,
    [CX_CONF_STORAGE] = set_choice, [CX_CONF_S3_ADDRESSING] = set_choice,
};

/* Sets one key; on failure writes a message (without position) to msg. */
static enum cx_err
set_value(void *cfg, const struct cx_conf_key *k, const char *v, char *msg, size_t msglen)
{
    if ((size_t)k->type >= sizeof(setters) / sizeof(setters[0]) || !setters[k->type])
        return CX_ERR_INTERNAL;
    return setters[k->type](k, (char *)cfg + k->off, v, msg, msglen);
}

static bool
is_string(const struct cx_conf_key *k)
{
    return k->type == CX_CONF_STR || k->type == CX_CONF_MODULES || k->type == CX_CONF_PATH ||
           k->type == CX_CONF_ADDRS || k->type == CX_CONF_LINES;
}

void
cx_conf_cleanup(const struct cx_conf_key *keys, size_t n, void *base)
{
    if (!base)
        return;
    for (size_t i = 0; i < n; i++)
        if (is_string(&keys[i])) {
            char **p = (char **)((char *)base + keys[i].off);
            size_t len = strlen(keys[i].name);
            if (*p && ((len > 6 && !strcmp(keys[i].name + len - 6, "_token")) ||
                       !strcmp(keys[i].name, "gateway")))
                memset(*p, 0, strlen(*p));
            free(*p);
            *p = NULL;
        }
}

enum cx_err
cx_conf_defaults(const struct cx_conf_key *keys, size_t n, void *base)
{
    char msg[CX_MSG_MAX];
    enum cx_err rc;

    for (size_t i = 0; i < n; i++) {
        rc = set_value(base, &keys[i], keys[i].def, msg, sizeof(msg));
        if (rc) {
            cx_conf_cleanup(keys, n, base);
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

/* One line (NUL-terminated, trimmed of nothing yet): a comment, a blank
 * or "key = value" for a key of the table set at most once (seen). msg
 * says what is wrong with it. */
static enum cx_err
parse_line(const struct cx_conf_key *keys, size_t nkeys, void *cfg, unsigned char *seen, char *line,
           char *msg, size_t msglen)
{
    char *eq, *k, *v;
    size_t i;

    *msg = '\0';
    if (strlen(line) > 4096) {
        snprintf(msg, msglen, "line too long");
        return CX_ERR_INVALID;
    }
    k = trim(line);
    if (*k == '\0' || *k == '#')
        return CX_OK;
    eq = strchr(k, '=');
    if (!eq) {
        snprintf(msg, msglen, "expected \"key = value\"");
        return CX_ERR_INVALID;
    }
    *eq = '\0';
    k = trim(k);
    v = trim(eq + 1);
    for (i = 0; i < nkeys; i++)
        if (strcmp(keys[i].name, k) == 0)
            break;
    if (i == nkeys) {
        snprintf(msg, msglen, "unknown key \"%.64s\"", k);
        return CX_ERR_INVALID;
    }
    if (seen[i] && keys[i].type != CX_CONF_LINES) {
        snprintf(msg, msglen, "%s is set twice", keys[i].name);
        return CX_ERR_INVALID;
    }
    seen[i] = 1;
    return set_value(cfg, &keys[i], v, msg, msglen);
}

enum cx_err
cx_conf_parse(const struct cx_conf_key *keys, size_t nkeys, void *cfg, const char *name,
              const char *text, char *errbuf, size_t errlen)
{
    char msg[CX_MSG_MAX];
    char *copy = NULL, *line, *next;
    unsigned lineno = 0;
    unsigned char *seen;
    enum cx_err rc;

    rc = cx_conf_defaults(keys, nkeys, cfg);
    if (rc)
        return rc;
    seen = calloc(nkeys ? nkeys : 1, 1);
    copy = strdup(text);
    if (!seen || !copy)
        rc = CX_ERR_NOMEM;
    for (line = copy; rc == CX_OK && line; line = next) {
        lineno++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        rc = parse_line(keys, nkeys, cfg, seen, line, msg, sizeof(msg));
        if (rc)
            snprintf(errbuf, errlen, "%s:%u: %s", name, lineno, msg);
    }
    free(copy);
    free(seen);
    if (rc)
        cx_conf_cleanup(keys, nkeys, cfg);
    return rc;
}

enum cx_err
cx_conf_load(const struct cx_conf_key *keys, size_t nkeys, void *cfg, const char *path,
             char *errbuf, size_t errlen)
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
        rc = cx_conf_parse(keys, nkeys, cfg, path, b.data ? b.data : "", errbuf, errlen);
    }
    fclose(f);
    cx_buf_cleanup(&b);
    return rc;
}
