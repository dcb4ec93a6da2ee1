#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
    }
}

int
cx_http_status_for(enum cx_err err)
{
    switch (err) {
    case CX_OK: return 200;
    case CX_ERR_INVALID: return 400;
    case CX_ERR_UNAUTHORIZED: return 401;
    case CX_ERR_FORBIDDEN: return 403;
    case CX_ERR_NOT_FOUND: return 404;
    case CX_ERR_CONFLICT: return 409;
    case CX_ERR_EXPIRED: return 410;
    case CX_ERR_TOO_LARGE: return 413;
    case CX_ERR_QUOTA: return 429;
    case CX_ERR_GATEWAY:
    case CX_ERR_PROTOCOL: return 502;
    case CX_ERR_DB:
    case CX_ERR_TIMEOUT: return 503;
    default: return 500;
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

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
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
                    if (end - v < 3 || (hi = hexval(v[1])) < 0 || (lo = hexval(v[2])) < 0)
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
