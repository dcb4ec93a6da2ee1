#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <strings.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "http.h"
#include "util.h"

const char *
cx_http_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
    }
}

json_t *
cx_http_error_json(const char *code, const char *message)
{
    return json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message);
}

enum cx_err
cx_http_content_length(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (!s || *s < '0' || *s > '9')
        return CX_ERR_INVALID;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end)
        return CX_ERR_INVALID;
    *out = v;
    return CX_OK;
}

enum cx_err
cx_http_read_body(cx_http_read_fn read_fn, void *ctx, const char *content_length, uint64_t max,
                  char **body, size_t *len)
{
    uint64_t want = 0;
    size_t got = 0;
    char *p;

    *body = NULL;
    *len = 0;
    if (content_length && *content_length && cx_http_content_length(content_length, &want))
        return CX_ERR_INVALID;
    if (want > max)
        return CX_ERR_TOO_LARGE;
    p = malloc((size_t)want + 1);
    if (!p)
        return CX_ERR_NOMEM;
    while (got < want) {
        ssize_t n = read_fn(ctx, p + got, (size_t)want - got);
        if (n <= 0) {
            free(p);
            return CX_ERR_IO;
        }
        got += (size_t)n;
    }
    p[got] = '\0';
    *body = p;
    *len = got;
    return CX_OK;
}

enum cx_err
cx_http_parse_json_object(const char *body, size_t len, json_t **out, char *msg, size_t msglen)
{
    json_error_t jerr;
    json_t *j;

    *out = NULL;
    if (len == 0) {
        snprintf(msg, msglen, "the request body is empty; a JSON object is expected");
        return CX_ERR_INVALID;
    }
    if (memchr(body, '\0', len) || !cx_utf8_valid(body, len)) {
        snprintf(msg, msglen, "the request body is not valid UTF-8");
        return CX_ERR_INVALID;
    }
    /* Shape before jansson: a small body of tiny containers would cost
     * dozens of times its size to build. */
    if (cx_json_cost(body, len) > CX_JSON_COST_MAX) {
        snprintf(msg, msglen,
                 "the request body holds too many JSON values (at most about %u containers, "
                 "%u numbers or %u strings; larger data belongs in an input artifact)",
                 CX_JSON_COST_MAX / CX_JSON_COST_CONTAINER, CX_JSON_COST_MAX / CX_JSON_COST_ELEMENT,
                 CX_JSON_COST_MAX / (CX_JSON_COST_STRING + CX_JSON_COST_ELEMENT));
        return CX_ERR_TOO_LARGE;
    }
    j = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!j) {
        /* jerr.text describes the syntax only; it quotes no input. */
        snprintf(msg, msglen, "malformed JSON at line %d, column %d", jerr.line, jerr.column);
        return CX_ERR_INVALID;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(msg, msglen, "the request body must be a JSON object");
        return CX_ERR_INVALID;
    }
    *out = j;
    return CX_OK;
}

enum cx_err
cx_http_query_get(const char *query, const char *name, char *out, size_t outlen)
{
    size_t nlen = strlen(name);
    const char *p = query;

    if (!query || outlen == 0)
        return CX_ERR_NOT_FOUND;
    while (p && *p) {
        const char *amp = strchr(p, '&');
        const char *end = amp ? amp : p + strlen(p);

        if ((size_t)(end - p) >= nlen && memcmp(p, name, nlen) == 0 &&
            (p + nlen == end || p[nlen] == '=')) {
            const char *v = p + nlen + (p + nlen < end ? 1 : 0);
            size_t o = 0;

            for (; v < end; v++) {
                int c = (unsigned char)*v;
                if (c == '+') {
                    c = ' ';
                } else if (c == '%') {
                    int hi, lo;
                    if (end - v < 3 || (hi = cx_hex_digit(v[1])) < 0 ||
                        (lo = cx_hex_digit(v[2])) < 0)
                        return CX_ERR_INVALID;
                    c = hi * 16 + lo;
                    v += 2;
                }
                if (c == 0)
                    return CX_ERR_INVALID;
                if (o + 1 >= outlen)
                    return CX_ERR_TOO_LARGE;
                out[o++] = (char)c;
            }
            out[o] = '\0';
            return cx_utf8_valid(out, o) ? CX_OK : CX_ERR_INVALID;
        }
        p = amp ? amp + 1 : NULL;
    }
    return CX_ERR_NOT_FOUND;
}

/* ------------------------------------------------------------------------ */
/* multipart/form-data                                                       */

enum mp_state { MP_PREAMBLE, MP_AFTER_DELIM, MP_HEADERS, MP_BODY, MP_END };

#define MP_MAX_HEADERS 8192

struct cx_multipart {
    struct cx_multipart_cb cb;
    void *ctx;
    enum mp_state state;
    char delim[80]; /* "\r\n--" boundary */
    size_t dlen;
    char *buf;
    size_t len, cap;
};

enum cx_err
cx_http_multipart_boundary(const char *ct, char *out, size_t outlen)
{
    const char *b;
    size_t n;

    if (!ct || strncasecmp(ct, "multipart/form-data", 19) != 0)
        return CX_ERR_INVALID;
    b = strcasestr(ct, "boundary=");
    if (!b)
        return CX_ERR_INVALID;
    b += 9;
    if (*b == '"') {
        b++;
        n = strcspn(b, "\"");
    } else {
        n = strcspn(b, "; \t");
    }
    if (n == 0 || n > 70 || n >= outlen) /* RFC 2046: 1..70 characters */
        return CX_ERR_INVALID;
    memcpy(out, b, n);
    out[n] = '\0';
    return CX_OK;
}

enum cx_err
cx_http_multipart_new(const char *boundary, const struct cx_multipart_cb *cb, void *ctx,
                      struct cx_multipart **out)
{
    struct cx_multipart *m = calloc(1, sizeof(*m));

    if (!m)
        return CX_ERR_NOMEM;
    m->cb = *cb;
    m->ctx = ctx;
    m->dlen = (size_t)snprintf(m->delim, sizeof(m->delim), "\r\n--%s", boundary);
    m->cap = 65536 + MP_MAX_HEADERS;
    m->buf = malloc(m->cap);
    if (!m->buf || m->dlen >= sizeof(m->delim)) {
        cx_http_multipart_free(m);
        return CX_ERR_NOMEM;
    }
    /* The first delimiter may open the body without the CRLF: pretend it. */
    m->buf[0] = '\r';
    m->buf[1] = '\n';
    m->len = 2;
    *out = m;
    return CX_OK;
}

void
cx_http_multipart_free(struct cx_multipart *m)
{
    if (!m)
        return;
    free(m->buf);
    free(m);
}

static void
consume(struct cx_multipart *m, size_t n)
{
    memmove(m->buf, m->buf + n, m->len - n);
    m->len -= n;
}

/* Copies a parameter value (quoted or token) of a header into out. */
static bool
header_param(const char *h, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name), o = 0;
    const char *p = h;

    while ((p = strcasestr(p, name))) {
        if ((p == h || p[-1] == ' ' || p[-1] == ';' || p[-1] == '\t') && p[nl] == '=')
            break;
        p += nl;
    }
    if (!p)
        return false;
    p += nl + 1;
    if (*p == '"') {
        for (p++; *p && *p != '"' && *p != '\r'; p++) {
            if (*p == '\\' && p[1])
                p++;
            if (o + 1 < outlen)
                out[o++] = *p;
        }
    } else {
        for (; *p && *p != ';' && *p != '\r' && *p != ' '; p++)
            if (o + 1 < outlen)
                out[o++] = *p;
    }
    out[o] = '\0';
    return true;
}

static enum cx_err
part_headers(struct cx_multipart *m, char *head)
{
    char name[256] = "", filename[1024];
    bool has_file = false;
    char *line = head;

    while (line && *line) {
        char *next = strstr(line, "\r\n");
        if (next)
            *next = '\0';
        if (strncasecmp(line, "Content-Disposition:", 20) == 0) {
            if (!header_param(line, "name", name, sizeof(name)))
                return CX_ERR_INVALID;
            has_file = header_param(line, "filename", filename, sizeof(filename));
        }
        line = next ? next + 2 : NULL;
    }
    if (!name[0])
        return CX_ERR_INVALID;
    return m->cb.begin(m->ctx, name, has_file ? filename : NULL);
}

static enum cx_err
mp_run(struct cx_multipart *m)
{
    enum cx_err rc;

    for (;;) {
        switch (m->state) {
        case MP_PREAMBLE:
        case MP_BODY: {
            char *hit = memmem(m->buf, m->len, m->delim, m->dlen);
            size_t safe;
            if (hit) {
                size_t n = (size_t)(hit - m->buf);
                if (m->state == MP_BODY && n && (rc = m->cb.data(m->ctx, m->buf, n)))
                    return rc;
                if (m->state == MP_BODY && (rc = m->cb.end(m->ctx)))
                    return rc;
                consume(m, n + m->dlen);
                m->state = MP_AFTER_DELIM;
                continue;
            }
            /* Keep what could be the start of a delimiter. */
            safe = m->len >= m->dlen ? m->len - (m->dlen - 1) : 0;
            if (safe && m->state == MP_BODY && (rc = m->cb.data(m->ctx, m->buf, safe)))
                return rc;
            consume(m, safe);
            return CX_OK;
        }
        case MP_AFTER_DELIM:
            if (m->len < 2)
                return CX_OK;
            if (m->buf[0] == '-' && m->buf[1] == '-') {
                m->state = MP_END;
                m->len = 0;
                return CX_OK;
            }
            if (m->buf[0] != '\r' || m->buf[1] != '\n')
                return CX_ERR_INVALID;
            consume(m, 2);
            m->state = MP_HEADERS;
            continue;
        case MP_HEADERS: {
            char *end = memmem(m->buf, m->len, "\r\n\r\n", 4);
            size_t n;
            if (!end) {
                if (m->len > MP_MAX_HEADERS)
                    return CX_ERR_INVALID;
                return CX_OK;
            }
            n = (size_t)(end - m->buf);
            if (memchr(m->buf, '\0', n))
                return CX_ERR_INVALID;
            m->buf[n + 2] = '\0';
            rc = part_headers(m, m->buf);
            if (rc)
                return rc;
            consume(m, n + 4);
            m->state = MP_BODY;
            continue;
        }
        case MP_END: m->len = 0; return CX_OK;
        }
    }
}

enum cx_err
cx_http_multipart_feed(struct cx_multipart *m, const char *data, size_t len)
{
    while (len > 0) {
        size_t room = m->cap - m->len, n = len < room ? len : room;
        enum cx_err rc;

        if (n == 0)
            return CX_ERR_INVALID; /* a header block that never ends */
        memcpy(m->buf + m->len, data, n);
        m->len += n;
        data += n;
        len -= n;
        rc = mp_run(m);
        if (rc)
            return rc;
    }
    return CX_OK;
}

enum cx_err
cx_http_multipart_finish(struct cx_multipart *m)
{
    return m->state == MP_END ? CX_OK : CX_ERR_INVALID;
}

/* ------------------------------------------------------------------------ */
/* Download headers                                                          */

void
cx_http_content_disposition(const char *filename, char *out, size_t outlen)
{
    struct cx_buf pct;
    char ascii[256];
    size_t a = 0;

    for (const unsigned char *s = (const unsigned char *)filename; *s && a < sizeof(ascii) - 1;
         s++) {
        if ((*s & 0xc0) == 0x80)
            continue; /* one '_' per non-ASCII character, not per byte */
        ascii[a++] = (*s < 0x20 || *s >= 0x7f || *s == '"' || *s == '\\' || *s == '%' || *s == ';')
                         ? '_'
                         : (char)*s;
    }
    ascii[a] = '\0';
    /* RFC 5987 attr-char: ALPHA DIGIT ! # $ & + - . ^ _ ` | ~ */
    cx_buf_init(&pct, 800);
    cx_http_pct_encode(&pct, filename, "!#$&+-.^_`|~");
    snprintf(out, outlen, "attachment; filename=\"%s\"; filename*=UTF-8''%s", a ? ascii : "file",
             pct.len && !cx_buf_err(&pct) ? pct.data : "file");
    cx_buf_cleanup(&pct);
}

void
cx_http_pct_encode(struct cx_buf *b, const char *s, const char *keep)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
            strchr(keep, *p))
            cx_buf_add(b, p, 1);
        else
            cx_buf_addf(b, "%%%02X", *p);
    }
}

void
cx_http_date(long long t, char out[32])
{
    static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t tt = (time_t)t;
    struct tm tm;

    gmtime_r(&tt, &tm);
    snprintf(out, 32, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday,
             months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

static bool
parse_u64(const char **p, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (**p < '0' || **p > '9')
        return false;
    errno = 0;
    v = strtoull(*p, &end, 10);
    if (errno)
        return false;
    *out = v;
    *p = end;
    return true;
}

enum cx_range
cx_http_range(const char *h, uint64_t size, uint64_t *first, uint64_t *last)
{
    const char *p;
    uint64_t a = 0, b = 0;
    bool have_a, have_b;

    if (!h || strncasecmp(h, "bytes=", 6) != 0)
        return CX_RANGE_NONE;
    p = h + 6;
    while (*p == ' ')
        p++;
    if (strchr(p, ','))
        return CX_RANGE_NONE; /* several ranges: the whole body */
    have_a = parse_u64(&p, &a);
    if (*p++ != '-')
        return CX_RANGE_NONE;
    have_b = parse_u64(&p, &b);
    while (*p == ' ')
        p++;
    if (*p || (!have_a && !have_b))
        return CX_RANGE_NONE;
    if (!have_a) { /* suffix: the last b bytes */
        if (b == 0 || size == 0)
            return CX_RANGE_UNSATISFIABLE;
        *first = b >= size ? 0 : size - b;
        *last = size - 1;
        return CX_RANGE_ONE;
    }
    if (have_b && b < a)
        return CX_RANGE_NONE;
    if (a >= size)
        return CX_RANGE_UNSATISFIABLE;
    *first = a;
    *last = !have_b || b >= size ? size - 1 : b;
    return CX_RANGE_ONE;
}

bool
cx_http_etag_matches(const char *inm, const char *etag)
{
    size_t n = strlen(etag);

    if (!inm)
        return false;
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == '*')
            return true;
        if (p[0] == 'W' && p[1] == '/')
            p += 2; /* weak comparison, as If-None-Match asks */
        if (*p == '"' && !strncmp(p + 1, etag, n) && p[1 + n] == '"')
            return true;
        while (*p && *p != ',')
            p++;
    }
    return false;
}
