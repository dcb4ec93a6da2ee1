#include <curl/curl.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buf.h"
#include "digest.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "s3.h"

#define XML_MAX    (4u << 20) /* a listing page of 1000 keys fits */
#define PARTS_MAX  10000
#define HEAD_MAX   65536   /* response headers */
#define PAGES_MAX  1000000 /* listing pages: a billion keys */
#define CALL_SECS  300L    /* a request that is not a download's */
#define EMPTY_SHA  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define UNRESERVED "-_.~"

struct cx_s3 {
    CURL *curl;
    char *origin;      /* scheme://host[:port], the bucket's host with virtual_host */
    char *host;        /* host[:port] as a client sends it in Host: */
    char *path;        /* "/bucket/prefix" or "/prefix": put before a key */
    char *bucket_path; /* "/bucket" or "": the bucket's own URL path */
    char *prefix;
    char *bucket;
    char *region;
    char *key_id, *secret, *token;
    char sigv4[160];
};

struct cx_s3_upload {
    char *key;
    char *id;
    char (*etags)[80];
    unsigned nparts;
};

/* One request. The body, if any, is in memory; a response body goes to
 * sink while the status is 2xx, else (an error document) into resp. */
struct req {
    const char *op;     /* for metrics: a static word */
    const char *method; /* GET, HEAD, PUT, POST, DELETE */
    const char *name;   /* the object's key (prefix added here), NULL: the bucket */
    const char *query;  /* canonical: sorted, encoded; "" for none */
    const void *body;
    size_t len;
    const char *sha;    /* the body's sha256 if known (hex), else NULL */
    bool bulk;          /* the body is an object's bytes (see cx_s3_payload_sha) */
    const char *header; /* one more header, or NULL */
    const char *range;  /* "bytes=a-b" or NULL */
    uint64_t first;     /* with range: where the answer must start */
    uint64_t want;      /* bytes the sink may get at most (0: no limit) */
    cx_s3_sink sink;
    void *ctx;
    struct cx_buf resp;
    bool stopped; /* sink said stop */
    bool bad;     /* the store answered other bytes than asked for */
    long status;
    uint64_t got; /* bytes given to the sink */
    size_t head_bytes;
    bool has_range; /* a Content-Range came */
    uint64_t range_first;
    char etag[80];
};

static void
wipe_free(char *s)
{
    if (s) {
        sodium_memzero(s, strlen(s));
        free(s);
    }
}

void
cx_s3_free(struct cx_s3 *s3)
{
    if (!s3)
        return;
    if (s3->curl)
        curl_easy_cleanup(s3->curl);
    free(s3->origin);
    free(s3->host);
    free(s3->path);
    free(s3->bucket_path);
    free(s3->prefix);
    free(s3->bucket);
    free(s3->region);
    wipe_free(s3->key_id);
    wipe_free(s3->secret);
    wipe_free(s3->token);
    free(s3);
}

static char *dupf(const char *fmt, ...) CX_PRINTF(1, 2);

static char *
dupf(const char *fmt, ...)
{
    va_list ap;
    int n;
    char *s;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) {
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    return s;
}

/* Splits "scheme://host[:port][/]" into scheme and host (the default port
 * dropped, as clients drop it from Host:). */
static bool
split_endpoint(const char *url, char scheme[8], char *host, size_t hostlen)
{
    const char *h, *end;
    size_t n;

    if (!strncmp(url, "http://", 7))
        snprintf(scheme, 8, "http");
    else if (!strncmp(url, "https://", 8))
        snprintf(scheme, 8, "https");
    else
        return false;
    h = url + strlen(scheme) + 3;
    end = h + strcspn(h, "/?#@");
    if (end == h || (*end && strcmp(end, "/") != 0))
        return false;
    n = (size_t)(end - h);
    if (n >= hostlen)
        return false;
    memcpy(host, h, n);
    host[n] = '\0';
    if ((!strcmp(scheme, "http") && n > 3 && !strcmp(host + n - 3, ":80")) ||
        (!strcmp(scheme, "https") && n > 4 && !strcmp(host + n - 4, ":443")))
        *strrchr(host, ':') = '\0';
    for (const char *p = host; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == '\\')
            return false;
    return true;
}

enum cx_err
cx_s3_new(const struct cx_s3_conf *c, struct cx_s3 **out)
{
    struct cx_s3 *s3;
    char scheme[8], host[512];
    struct cx_buf pfx;

    *out = NULL;
    if (!split_endpoint(c->endpoint, scheme, host, sizeof(host)) || !c->bucket[0])
        return CX_ERR_INVALID;
    s3 = calloc(1, sizeof(*s3));
    if (!s3)
        return CX_ERR_NOMEM;
    cx_buf_init(&pfx, 4096);
    cx_http_pct_encode(&pfx, c->prefix, UNRESERVED "/");
    if (c->virtual_host) {
        s3->host = dupf("%s.%s", c->bucket, host);
        s3->bucket_path = strdup("");
        s3->path = dupf("/%s", pfx.data ? pfx.data : "");
    } else {
        s3->host = strdup(host);
        s3->bucket_path = dupf("/%s", c->bucket);
        s3->path = dupf("/%s/%s", c->bucket, pfx.data ? pfx.data : "");
    }
    s3->origin = s3->host ? dupf("%s://%s", scheme, s3->host) : NULL;
    s3->prefix = strdup(c->prefix);
    s3->bucket = strdup(c->bucket);
    s3->region = strdup(c->region);
    s3->key_id = strdup(c->key_id);
    s3->secret = strdup(c->secret);
    s3->token = strdup(c->token ? c->token : "");
    s3->curl = curl_easy_init();
    snprintf(s3->sigv4, sizeof(s3->sigv4), "aws:amz:%s:s3", c->region);
    if (cx_buf_err(&pfx) || !s3->host || !s3->bucket_path || !s3->path || !s3->origin ||
        !s3->prefix || !s3->bucket || !s3->region || !s3->key_id || !s3->secret || !s3->token ||
        !s3->curl) {
        cx_buf_cleanup(&pfx);
        cx_s3_free(s3);
        return CX_ERR_NOMEM;
    }
    cx_buf_cleanup(&pfx);
    *out = s3;
    return CX_OK;
}

const char *
cx_s3_origin(const struct cx_s3 *s3)
{
    return s3->origin;
}

/* The URL path of an object: the prefix and the key, each byte but the
 * unreserved ones and '/' percent-encoded (SigV4's canonical URI for S3). */
static void
object_path(const struct cx_s3 *s3, const char *key, struct cx_buf *b)
{
    cx_buf_adds(b, s3->path);
    cx_http_pct_encode(b, key, UNRESERVED "/");
}

static size_t
on_body(char *p, size_t size, size_t n, void *userdata)
{
    struct req *q = userdata;
    size_t len = size * n;

    /* (on_header saw the status line before any byte of the body) */
    if (q->sink && q->status >= 200 && q->status < 300) {
        /* The bytes asked for, no others: a store that ignores Range (200,
         * or another start) or sends more than asked is refused. */
        if (q->got == 0 &&
            (q->range ? q->status != 206 || !q->has_range || q->range_first != q->first
                      : q->status != 200))
            q->bad = true;
        if (q->want && len > q->want - q->got)
            q->bad = true;
        if (q->bad)
            return 0;
        q->got += len;
        if (!q->sink(q->ctx, p, len)) {
            q->stopped = true;
            return 0;
        }
        return len;
    }
    cx_buf_add(&q->resp, p, len);
    /* past the cap: a 2xx answer fails here, an error document is cut */
    return cx_buf_err(&q->resp) && q->status >= 200 && q->status < 300 ? 0 : len;
}

/* The decimal number at p (at most n bytes), or UINT64_MAX. */
static uint64_t
number(const char *p, size_t n)
{
    uint64_t v = 0;
    size_t i = 0;

    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        if (v > (UINT64_MAX - 9) / 10)
            return UINT64_MAX;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    return i ? v : UINT64_MAX;
}

static size_t
on_header(char *p, size_t size, size_t n, void *userdata)
{
    struct req *q = userdata;
    size_t len = size * n;

    q->head_bytes += len;
    if (q->head_bytes > HEAD_MAX)
        return 0; /* a store that sends headers without end */
    if (len > 9 && !strncmp(p, "HTTP/", 5)) {
        const char *sp = memchr(p, ' ', len);
        uint64_t st = sp ? number(sp + 1, len - (size_t)(sp + 1 - p)) : UINT64_MAX;
        q->status = st < 1000 ? (long)st : 0;
        q->has_range = false;
    } else if (len > 21 && !strncasecmp(p, "content-range: bytes ", 21)) {
        q->range_first = number(p + 21, len - 21);
        q->has_range = q->range_first != UINT64_MAX;
    } else if (len > 5 && !strncasecmp(p, "etag:", 5)) {
        size_t i = 5, e = len;
        while (i < len && (p[i] == ' ' || p[i] == '\t'))
            i++;
        while (e > i && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' '))
            e--;
        if (e - i < sizeof(q->etag)) {
            memcpy(q->etag, p + i, e - i);
            q->etag[e - i] = '\0';
        }
    }
    return len;
}

/* The first <tag>value</tag> in [p, end): value and its length. */
static bool
xml_find(const char *p, const char *end, const char *tag, const char **v, size_t *vlen)
{
    char open[64], close[64];
    size_t on = (size_t)snprintf(open, sizeof(open), "<%s>", tag);
    size_t cn = (size_t)snprintf(close, sizeof(close), "</%s>", tag);

    for (; p + on <= end; p++) {
        if (memcmp(p, open, on) != 0)
            continue;
        for (const char *q = p + on; q + cn <= end; q++)
            if (!memcmp(q, close, cn)) {
                *v = p + on;
                *vlen = (size_t)(q - *v);
                return true;
            }
        return false;
    }
    return false;
}

/* XML text into out (NUL-terminated): the five entities and numeric
 * references; false when it does not fit or is malformed. */
static bool
xml_text(const char *v, size_t n, char *out, size_t outlen)
{
    static const struct {
        const char *ent;
        char c;
    } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    size_t o = 0;

    for (size_t i = 0; i < n;) {
        char c = v[i];
        size_t step = 1;

        if (c == '&') {
            size_t k;
            for (k = 0; k < sizeof(ents) / sizeof(ents[0]); k++) {
                size_t el = strlen(ents[k].ent);
                if (i + el <= n && !memcmp(v + i, ents[k].ent, el)) {
                    c = ents[k].c;
                    step = el;
                    break;
                }
            }
            if (k == sizeof(ents) / sizeof(ents[0])) {
                char *e;
                unsigned long cp;
                if (i + 3 >= n || v[i + 1] != '#')
                    return false;
                cp = v[i + 2] == 'x' ? strtoul(v + i + 3, &e, 16) : strtoul(v + i + 2, &e, 10);
                if (e >= v + n || *e != ';' || cp == 0 || cp > 0x10ffff ||
                    (cp >= 0xd800 && cp <= 0xdfff))
                    return false;
                step = (size_t)(e - (v + i)) + 1;
                if (o + 4 >= outlen)
                    return false;
                if (cp < 0x80) {
                    out[o++] = (char)cp;
                } else if (cp < 0x800) {
                    out[o++] = (char)(0xc0 | (cp >> 6));
                    out[o++] = (char)(0x80 | (cp & 0x3f));
                } else if (cp < 0x10000) {
                    out[o++] = (char)(0xe0 | (cp >> 12));
                    out[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    out[o++] = (char)(0x80 | (cp & 0x3f));
                } else {
                    out[o++] = (char)(0xf0 | (cp >> 18));
                    out[o++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                    out[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    out[o++] = (char)(0x80 | (cp & 0x3f));
                }
                i += step;
                continue;
            }
        }
        if (o + 1 >= outlen)
            return false;
        out[o++] = c;
        i += step;
    }
    out[o] = '\0';
    return true;
}

/* An S3 error code from an error document, for the log ("" if none). */
static void
error_code(const struct cx_buf *b, char out[64])
{
    const char *v;
    size_t n;

    out[0] = '\0';
    if (b->data && xml_find(b->data, b->data + b->len, "Code", &v, &n) && n < 64 &&
        xml_text(v, n, out, 64))
        for (char *p = out; *p; p++)
            if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
                *p = '_'; /* it came from the network */
}

/* "name: value" (or name alone: a whole line) onto h; *ok false once any
 * append failed. */
static struct curl_slist *
add_header(struct curl_slist *h, bool *ok, const char *name, const char *value)
{
    size_t n = strlen(name) + (value ? strlen(value) + 3 : 1);
    char *line = *ok ? malloc(n) : NULL;
    struct curl_slist *l = NULL;

    if (!line) {
        *ok = false;
        return h;
    }
    if (value)
        snprintf(line, n, "%s: %s", name, value);
    else
        snprintf(line, n, "%s", name);
    l = curl_slist_append(h, line);
    sodium_memzero(line, n); /* it may be the session token */
    free(line);
    if (!l)
        *ok = false;
    return l ? l : h;
}

/* libcurl 7.88 signs every header of CURLOPT_HTTPHEADER, a removal
 * ("Accept:") too, although it never sends it (fixed in 8.3.0): so this
 * list holds only headers that go out. */
static struct curl_slist *
req_headers(const struct cx_s3 *s3, const struct req *q, const char *sha)
{
    struct curl_slist *h = NULL;
    bool ok = true;

    h = add_header(h, &ok, "x-amz-content-sha256", sha);
    if (q->body)
        h = add_header(h, &ok, "Content-Type",
                       !strcmp(q->method, "POST") ? "application/xml" : "application/octet-stream");
    if (s3->token[0])
        h = add_header(h, &ok, "x-amz-security-token", s3->token);
    if (q->header)
        h = add_header(h, &ok, q->header, NULL);
    if (q->range)
        h = add_header(h, &ok, "Range", q->range);
    if (!ok) {
        curl_slist_free_all(h);
        return NULL;
    }
    return h;
}

static void
set_method(CURL *c, const struct req *q)
{
    if (q->body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->len ? q->body : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->len);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
    } else if (!strcmp(q->method, "HEAD")) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (strcmp(q->method, "GET") != 0) {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
    }
}

enum cx_err
cx_s3_payload_sha(const struct cx_s3 *s3, const void *body, size_t len, bool bulk,
                  const char *known, char out[65])
{
    if (!body) {
        snprintf(out, 65, "%s", EMPTY_SHA);
        return CX_OK;
    }
    if (known) {
        snprintf(out, 65, "%s", known);
        return CX_OK;
    }
    /* (libcurl signs with the header's hash only since 7.87: an older one
     * hashes the body itself, and the header must then say the same) */
    if (bulk && !strncmp(s3->origin, "https://", 8) &&
        curl_version_info(CURLVERSION_NOW)->version_num >= 0x075700) {
        snprintf(out, 65, "UNSIGNED-PAYLOAD");
        return CX_OK;
    }
    return cx_sha256_hex(body, len, out);
}

/* The request's options on s3->curl, reset first (the connection stays). */
static void
set_options(struct cx_s3 *s3, struct req *q, const char *url, struct curl_slist *h)
{
    curl_easy_reset(s3->curl); /* (keeps the connection) */
    curl_easy_setopt(s3->curl, CURLOPT_URL, url);
    curl_easy_setopt(s3->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(s3->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s3->curl, CURLOPT_PATH_AS_IS, 1L); /* the path we signed, as it is */
    curl_easy_setopt(s3->curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    /* A store that trickles is a store that failed; a download lasts as
     * long as its client reads, anything else at most CALL_SECS. */
    curl_easy_setopt(s3->curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(s3->curl, CURLOPT_LOW_SPEED_TIME, 30L);
    if (!q->sink)
        curl_easy_setopt(s3->curl, CURLOPT_TIMEOUT, CALL_SECS);
    curl_easy_setopt(s3->curl, CURLOPT_AWS_SIGV4, s3->sigv4);
    curl_easy_setopt(s3->curl, CURLOPT_USERNAME, s3->key_id);
    curl_easy_setopt(s3->curl, CURLOPT_PASSWORD, s3->secret);
    curl_easy_setopt(s3->curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(s3->curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s3->curl, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(s3->curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(s3->curl, CURLOPT_HEADERDATA, q);
    set_method(s3->curl, q);
}

/* What the store's answer to q (cc: the transfer's outcome) means. */
static enum cx_err
answer_rc(struct req *q, CURLcode cc)
{
    char code[64];

    error_code(&q->resp, code);
    if (q->bad) {
        cx_log_warn(0, "S3 %s: the store answered other bytes than asked for (status %ld)", q->op,
                    q->status);
        return CX_ERR_IO;
    }
    if (cc != CURLE_OK) {
        cx_log_warn(0, "S3 %s failed: %s", q->op, curl_easy_strerror(cc));
        return CX_ERR_IO;
    }
    if (q->status == 404 && (!strcmp(code, "NoSuchKey") || !strcmp(code, "NoSuchUpload") ||
                             (!strcmp(q->method, "HEAD") && !code[0])))
        return CX_ERR_NOT_FOUND; /* (a missing bucket is not a missing object) */
    if (q->status < 200 || q->status >= 300) {
        cx_log_warn(0, "S3 %s answered %ld %s", q->op, q->status, code);
        return CX_ERR_IO;
    }
    if (!q->sink && cx_buf_err(&q->resp)) {
        cx_log_warn(0, "S3 %s: an answer larger than %u bytes", q->op, XML_MAX);
        return CX_ERR_IO;
    }
    return CX_OK;
}

/* Sends q; CX_OK on a 2xx. The body's sha256 (or UNSIGNED-PAYLOAD) goes
 * into the signature. */
static enum cx_err
perform(struct cx_s3 *s3, struct req *q)
{
    struct cx_buf url;
    struct curl_slist *h = NULL;
    char sha[65];
    CURLcode cc;
    enum cx_err rc = CX_OK;

    cx_buf_init(&q->resp, XML_MAX);
    cx_buf_init(&url, 16384);
    cx_buf_adds(&url, s3->origin);
    if (q->name)
        object_path(s3, q->name, &url);
    else
        cx_buf_addf(&url, "%s/", s3->bucket_path);
    if (q->query[0])
        cx_buf_addf(&url, "?%s", q->query);
    rc = cx_s3_payload_sha(s3, q->body, q->len, q->bulk, q->sha, sha);
    h = rc ? NULL : req_headers(s3, q, sha);
    if (cx_buf_err(&url) || !h) {
        rc = CX_ERR_NOMEM;
        goto out;
    }
    set_options(s3, q, url.data, h);
    cx_metrics_count_by(CX_FAMILY_STORAGE, q->op);
    cc = curl_easy_perform(s3->curl);
    curl_easy_setopt(s3->curl, CURLOPT_USERNAME, "");
    curl_easy_setopt(s3->curl, CURLOPT_PASSWORD, "");
    if (q->stopped) {
        rc = CX_ERR_IO; /* our reader went; not the store's fault */
        goto out;
    }
    rc = answer_rc(q, cc);
    if (rc == CX_ERR_IO)
        cx_metrics_count_by(CX_FAMILY_STORAGE_ERRORS, q->op);
out:
    curl_slist_free_all(h);
    cx_buf_cleanup(&url);
    return rc;
}

/* A 200 whose document is an <Error> (CopyObject, CompleteMultipartUpload
 * can fail after their status line went out). */
static enum cx_err
check_document(struct req *q)
{
    char code[64];

    if (q->resp.data && strstr(q->resp.data, "<Error>")) {
        error_code(&q->resp, code);
        cx_log_warn(0, "S3 %s failed after 200: %s", q->op, code);
        cx_metrics_count_by(CX_FAMILY_STORAGE_ERRORS, q->op);
        return CX_ERR_IO;
    }
    return CX_OK;
}

enum cx_err
cx_s3_put(struct cx_s3 *s3, const char *key, const void *data, size_t len, const char *sha256)
{
    struct req q = {.op = "put",
                    .method = "PUT",
                    .name = key,
                    .query = "",
                    .body = data ? data : "",
                    .len = len,
                    .sha = sha256,
                    .bulk = true};
    enum cx_err rc = perform(s3, &q);

    cx_buf_cleanup(&q.resp);
    return rc;
}

enum cx_err
cx_s3_copy(struct cx_s3 *s3, const char *from, const char *to)
{
    struct cx_buf src;
    struct req q = {.op = "copy", .method = "PUT", .name = to, .query = "", .body = "", .len = 0};
    enum cx_err rc;

    cx_buf_init(&src, 16384);
    cx_buf_adds(&src, "x-amz-copy-source: /");
    cx_http_pct_encode(&src, s3->bucket, UNRESERVED);
    cx_buf_adds(&src, "/");
    cx_http_pct_encode(&src, s3->prefix, UNRESERVED "/");
    cx_http_pct_encode(&src, from, UNRESERVED "/");
    if (cx_buf_err(&src)) {
        cx_buf_cleanup(&src);
        return CX_ERR_NOMEM;
    }
    q.header = src.data;
    rc = perform(s3, &q);
    if (rc == CX_OK)
        rc = check_document(&q);
    cx_buf_cleanup(&q.resp);
    cx_buf_cleanup(&src);
    return rc;
}

enum cx_err
cx_s3_delete(struct cx_s3 *s3, const char *key)
{
    struct req q = {.op = "delete", .method = "DELETE", .name = key, .query = ""};
    enum cx_err rc = perform(s3, &q);

    cx_buf_cleanup(&q.resp);
    return rc == CX_ERR_NOT_FOUND ? CX_OK : rc;
}

enum cx_err
cx_s3_head(struct cx_s3 *s3, const char *key, uint64_t *size)
{
    struct req q = {.op = "head", .method = "HEAD", .name = key, .query = ""};
    curl_off_t n = -1;
    enum cx_err rc = perform(s3, &q);

    if (rc == CX_OK) {
        curl_easy_getinfo(s3->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &n);
        rc = n >= 0 ? CX_OK : CX_ERR_IO;
        *size = n >= 0 ? (uint64_t)n : 0;
    }
    cx_buf_cleanup(&q.resp);
    return rc;
}

enum cx_err
cx_s3_get(struct cx_s3 *s3, const char *key, uint64_t first, uint64_t last, cx_s3_sink sink,
          void *ctx)
{
    char range[64];
    struct req q = {
        .op = "get", .method = "GET", .name = key, .query = "", .sink = sink, .ctx = ctx};
    enum cx_err rc;

    if (first > 0 || last != UINT64_MAX) {
        if (last == UINT64_MAX)
            snprintf(range, sizeof(range), "bytes=%llu-", (unsigned long long)first);
        else
            snprintf(range, sizeof(range), "bytes=%llu-%llu", (unsigned long long)first,
                     (unsigned long long)last);
        q.range = range;
        q.first = first;
        q.want = last == UINT64_MAX ? 0 : last - first + 1;
    }
    rc = perform(s3, &q);
    /* (an empty or short body never reached on_body's checks) */
    if (rc == CX_OK && ((q.range && q.status != 206) || (q.want && q.got != q.want))) {
        cx_log_warn(0, "S3 get: %llu of %llu bytes, status %ld", (unsigned long long)q.got,
                    (unsigned long long)q.want, q.status);
        cx_metrics_count_by(CX_FAMILY_STORAGE_ERRORS, q.op);
        rc = CX_ERR_IO;
    }
    cx_buf_cleanup(&q.resp);
    return rc;
}

/* value, encoded for a canonical query string (everything but the
 * unreserved characters). */
static void
query_value(struct cx_buf *b, const char *v)
{
    cx_http_pct_encode(b, v, UNRESERVED);
}

enum cx_err
cx_s3_upload_begin(struct cx_s3 *s3, const char *key, struct cx_s3_upload **out)
{
    struct req q = {.op = "upload_begin",
                    .method = "POST",
                    .name = key,
                    .query = "uploads=",
                    .body = "",
                    .len = 0};
    struct cx_s3_upload *up = NULL;
    const char *v;
    size_t n;
    char id[1024];
    enum cx_err rc = perform(s3, &q);

    *out = NULL;
    if (rc == CX_OK &&
        (!q.resp.data || !xml_find(q.resp.data, q.resp.data + q.resp.len, "UploadId", &v, &n) ||
         !xml_text(v, n, id, sizeof(id)) || !id[0])) {
        cx_log_warn(0, "S3 upload_begin: no UploadId in the answer");
        rc = CX_ERR_IO;
    }
    if (rc == CX_OK) {
        up = calloc(1, sizeof(*up));
        if (!up || !(up->key = strdup(key)) || !(up->id = strdup(id))) {
            rc = CX_ERR_NOMEM;
            if (up) {
                free(up->key);
                free(up);
            }
            up = NULL;
        }
    }
    cx_buf_cleanup(&q.resp);
    *out = up;
    return rc;
}

static enum cx_err
upload_query(const struct cx_s3_upload *up, unsigned part, struct cx_buf *b)
{
    if (part)
        cx_buf_addf(b, "partNumber=%u&", part);
    cx_buf_adds(b, "uploadId=");
    query_value(b, up->id);
    return cx_buf_err(b);
}

enum cx_err
cx_s3_upload_part(struct cx_s3 *s3, struct cx_s3_upload *up, const void *data, size_t len)
{
    struct cx_buf qs;
    struct req q = {.op = "upload_part",
                    .method = "PUT",
                    .name = up->key,
                    .body = data,
                    .len = len,
                    .bulk = true};
    enum cx_err rc;

    if (up->nparts >= PARTS_MAX)
        return CX_ERR_TOO_LARGE;
    if (up->nparts % 64 == 0) {
        void *e = realloc(up->etags, (up->nparts + 64) * sizeof(*up->etags));
        if (!e)
            return CX_ERR_NOMEM;
        up->etags = e;
    }
    cx_buf_init(&qs, 4096);
    rc = upload_query(up, up->nparts + 1, &qs);
    q.query = qs.data;
    if (rc == CX_OK)
        rc = perform(s3, &q);
    if (rc == CX_OK && !q.etag[0]) {
        cx_log_warn(0, "S3 upload_part: no ETag in the answer");
        rc = CX_ERR_IO;
    }
    if (rc == CX_OK)
        snprintf(up->etags[up->nparts++], sizeof(up->etags[0]), "%s", q.etag);
    cx_buf_cleanup(&q.resp);
    cx_buf_cleanup(&qs);
    return rc;
}

static void
upload_free(struct cx_s3_upload *up)
{
    free(up->key);
    free(up->id);
    free(up->etags);
    free(up);
}

enum cx_err
cx_s3_upload_complete(struct cx_s3 *s3, struct cx_s3_upload *up)
{
    struct cx_buf qs, body;
    struct req q = {.op = "upload_complete", .method = "POST", .name = up->key};
    enum cx_err rc;

    cx_buf_init(&qs, 4096);
    cx_buf_init(&body, (size_t)up->nparts * 160 + 256);
    rc = upload_query(up, 0, &qs);
    cx_buf_adds(&body, "<CompleteMultipartUpload>");
    for (unsigned i = 0; i < up->nparts; i++) {
        cx_buf_addf(&body, "<Part><PartNumber>%u</PartNumber><ETag>", i + 1);
        for (const char *e = up->etags[i]; *e; e++) {
            if (*e == '"')
                cx_buf_adds(&body, "&quot;");
            else if (*e == '&')
                cx_buf_adds(&body, "&amp;");
            else if (*e == '<')
                cx_buf_adds(&body, "&lt;");
            else
                cx_buf_add(&body, e, 1);
        }
        cx_buf_adds(&body, "</ETag></Part>");
    }
    cx_buf_adds(&body, "</CompleteMultipartUpload>");
    if (rc == CX_OK)
        rc = cx_buf_err(&body);
    q.query = qs.data;
    q.body = body.data;
    q.len = body.len;
    if (rc == CX_OK)
        rc = perform(s3, &q);
    if (rc == CX_OK)
        rc = check_document(&q);
    cx_buf_cleanup(&q.resp);
    cx_buf_cleanup(&qs);
    cx_buf_cleanup(&body);
    if (rc)
        cx_s3_upload_abort(s3, up);
    else
        upload_free(up);
    return rc;
}

void
cx_s3_upload_abort(struct cx_s3 *s3, struct cx_s3_upload *up)
{
    struct cx_buf qs;
    struct req q = {.op = "upload_abort", .method = "DELETE"};

    if (!up)
        return;
    cx_buf_init(&qs, 4096);
    q.name = up->key;
    if (upload_query(up, 0, &qs) == CX_OK) {
        q.query = qs.data;
        if (perform(s3, &q) && q.status != 404)
            cx_log_warn(0, "S3: a multipart upload could not be aborted (fsck ends it)");
    }
    cx_buf_cleanup(&q.resp);
    cx_buf_cleanup(&qs);
    upload_free(up);
}

/* "2026-11-30T20:49:54.000Z" */
static time_t
iso_time(const char *s)
{
    struct tm tm = {0};
    char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    time_t t = end ? timegm(&tm) : (time_t)-1;

    return t > 0 ? t : 0; /* 0: not a time (never taken for "long ago") */
}

/* The objects of one listing page; *more and token for the next. */
static enum cx_err
list_page(struct req *q, const char *full, size_t pfxlen, cx_s3_list_fn fn, void *ctx, bool *more,
          char *token, size_t toklen)
{
    const char *p = q->resp.data, *end = p ? p + q->resp.len : NULL, *v, *item;
    size_t n, ilen;
    enum cx_err rc = CX_OK;

    *more = false;
    if (!p)
        return CX_ERR_IO;
    while (rc == CX_OK && xml_find(p, end, "Contents", &item, &ilen)) {
        char key[2048], when[64], size[32];
        const char *iend = item + ilen;

        p = iend;
        /* only what was asked for, with a date: the store's word is all
         * that says an object is a stale staging one */
        if (!xml_find(item, iend, "Key", &v, &n) || !xml_text(v, n, key, sizeof(key)) ||
            strncmp(key, full, strlen(full)) != 0 ||
            !xml_find(item, iend, "LastModified", &v, &n) || !xml_text(v, n, when, sizeof(when)) ||
            !iso_time(when))
            continue;
        if (!xml_find(item, iend, "Size", &v, &n) || !xml_text(v, n, size, sizeof(size)))
            size[0] = '\0';
        rc = fn(ctx, key + pfxlen, iso_time(when), strtoull(size, NULL, 10));
    }
    if (rc == CX_OK && xml_find(q->resp.data, end, "IsTruncated", &v, &n) && n == 4 &&
        !memcmp(v, "true", 4)) {
        char next[2048];
        if (!xml_find(q->resp.data, end, "NextContinuationToken", &v, &n) ||
            !xml_text(v, n, next, sizeof(next)) || !next[0] || !strcmp(next, token) ||
            strlen(next) >= toklen) {
            cx_log_warn(0, "S3 list: a truncated page without a new continuation token");
            return CX_ERR_IO; /* (else the same page for ever) */
        }
        snprintf(token, toklen, "%s", next);
        *more = true;
    }
    return rc;
}

enum cx_err
cx_s3_list(struct cx_s3 *s3, const char *under, cx_s3_list_fn fn, void *ctx)
{
    char token[2048] = "", full[2048], saved[2048] = "";
    size_t pfxlen = strlen(s3->prefix);
    unsigned power = 1, since = 0;
    bool more = true;
    enum cx_err rc = CX_OK;

    if ((size_t)snprintf(full, sizeof(full), "%s%s", s3->prefix, under) >= sizeof(full))
        return CX_ERR_TOO_LARGE;
    for (unsigned page = 0; rc == CX_OK && more; page++) {
        if (page == PAGES_MAX) {
            rc = CX_ERR_TOO_LARGE;
            break;
        }
        struct cx_buf qs;
        struct req q = {.op = "list", .method = "GET"};

        cx_buf_init(&qs, 8192);
        if (token[0]) {
            cx_buf_adds(&qs, "continuation-token=");
            query_value(&qs, token);
            cx_buf_adds(&qs, "&");
        }
        cx_buf_adds(&qs, "list-type=2&prefix=");
        query_value(&qs, full);
        rc = cx_buf_err(&qs);
        q.query = qs.data;
        if (rc == CX_OK)
            rc = perform(s3, &q);
        if (rc == CX_OK)
            rc = list_page(&q, full, pfxlen, fn, ctx, &more, token, sizeof(token));
        cx_buf_cleanup(&q.resp);
        cx_buf_cleanup(&qs);
        /* A store that pages in circles (its tokens come round again) is
         * found within twice the circle's length (Brent): the tokens, not
         * the keys' order, which not every S3-compatible store keeps in
         * bytes (the test store lists by its directories). */
        if (rc == CX_OK && more && strcmp(token, saved) == 0) {
            cx_log_warn(0, "S3 list: the store's continuation tokens go round; the listing stops");
            rc = CX_ERR_IO;
        } else if (rc == CX_OK && more && ++since == power) {
            snprintf(saved, sizeof(saved), "%s", token);
            power *= 2;
            since = 0;
        }
    }
    return rc;
}

/* Every multipart upload under the prefix whose key starts with under:
 * fn(ctx, key, upload id, initiated). One page (1000 uploads): what is left
 * is found on the next call. */
typedef enum cx_err (*upload_fn)(void *ctx, const char *key, const char *id, time_t initiated);

static enum cx_err
each_upload(struct cx_s3 *s3, const char *under, upload_fn fn, void *ctx)
{
    struct cx_buf qs;
    struct req q = {.op = "list_uploads", .method = "GET"};
    size_t pfxlen = strlen(s3->prefix);
    const char *p, *end, *item, *v;
    size_t ilen, n;
    enum cx_err rc;

    cx_buf_init(&qs, 8192);
    cx_buf_adds(&qs, "prefix=");
    query_value(&qs, s3->prefix);
    query_value(&qs, under);
    cx_buf_adds(&qs, "&uploads=");
    rc = cx_buf_err(&qs);
    q.query = qs.data;
    if (rc == CX_OK)
        rc = perform(s3, &q);
    if (rc == CX_ERR_IO && (q.status == 501 || q.status == 405))
        rc = CX_ERR_INVALID; /* the store can't list them */
    p = q.resp.data;
    end = p ? p + q.resp.len : NULL;
    while (rc == CX_OK && p && xml_find(p, end, "Upload", &item, &ilen)) {
        char key[2048], id[1024], when[64];

        p = item + ilen;
        if (xml_find(item, p, "Key", &v, &n) && xml_text(v, n, key, sizeof(key)) &&
            xml_find(item, p, "UploadId", &v, &n) && xml_text(v, n, id, sizeof(id)) &&
            xml_find(item, p, "Initiated", &v, &n) && xml_text(v, n, when, sizeof(when)) &&
            iso_time(when) && !strncmp(key, s3->prefix, pfxlen) &&
            !strncmp(key + pfxlen, under, strlen(under)))
            rc = fn(ctx, key + pfxlen, id, iso_time(when));
    }
    cx_buf_cleanup(&q.resp);
    cx_buf_cleanup(&qs);
    return rc;
}

struct stale {
    time_t before;
    cx_s3_list_fn fn;
    void *ctx;
};

static enum cx_err
on_stale_upload(void *ctx, const char *key, const char *id, time_t initiated)
{
    struct stale *s = ctx;

    (void)id;
    return initiated < s->before ? s->fn(s->ctx, key, initiated, 0) : CX_OK;
}

enum cx_err
cx_s3_list_uploads(struct cx_s3 *s3, const char *under, time_t before, cx_s3_list_fn fn, void *ctx)
{
    struct stale s = {.before = before, .fn = fn, .ctx = ctx};

    return each_upload(s3, under, on_stale_upload, &s);
}

struct aborting {
    struct cx_s3 *s3;
    const char *key;
};

static enum cx_err
on_abort(void *ctx, const char *key, const char *id, time_t initiated)
{
    struct aborting *a = ctx;
    struct cx_s3_upload *up;

    (void)initiated;
    if (strcmp(key, a->key) != 0)
        return CX_OK;
    up = calloc(1, sizeof(*up));
    if (!up || !(up->key = strdup(key)) || !(up->id = strdup(id))) {
        if (up)
            free(up->key);
        free(up);
        return CX_ERR_NOMEM;
    }
    cx_s3_upload_abort(a->s3, up);
    return CX_OK;
}

enum cx_err
cx_s3_abort_uploads(struct cx_s3 *s3, const char *key)
{
    struct aborting a = {.s3 = s3, .key = key};

    return each_upload(s3, key, on_abort, &a);
}

static bool
hmac(unsigned char out[32], const unsigned char *key, size_t keylen, const char *msg)
{
    return cx_hmac_sha256(key, keylen, msg, strlen(msg), out) == CX_OK;
}

/* SigV4's signing key for the day, region and service s3. */
static bool
signing_key(const struct cx_s3 *s3, const char *day, unsigned char k[32])
{
    size_t n = strlen(s3->secret) + 5;
    char *first = malloc(n);
    bool good;

    if (!first)
        return false;
    snprintf(first, n, "AWS4%s", s3->secret);
    good = hmac(k, (const unsigned char *)first, n - 1, day);
    sodium_memzero(first, n);
    free(first);
    good = good && hmac(k, k, 32, s3->region) && hmac(k, k, 32, "s3") &&
           hmac(k, k, 32, "aws4_request");
    if (!good)
        sodium_memzero(k, 32);
    return good;
}

enum cx_err
cx_s3_presign(const struct cx_s3 *s3, const char *key, time_t now, unsigned expires,
              const char *extra, bool path_only, char *out, size_t outlen)
{
    struct cx_buf path, qs, creq, sts;
    char stamp[17], day[9], scope[160], hex[65];
    unsigned char d[32], k[32];
    struct tm tm;
    enum cx_err rc;
    int n;

    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    strftime(day, sizeof(day), "%Y%m%d", &tm);
    snprintf(scope, sizeof(scope), "%s/%s/s3/aws4_request", day, s3->region);
    cx_buf_init(&path, 16384);
    cx_buf_init(&qs, 16384);
    cx_buf_init(&creq, 65536);
    cx_buf_init(&sts, 4096);
    object_path(s3, key, &path);
    /* sorted: X-Amz-* sort before lowercase response-* parameters */
    cx_buf_adds(&qs, "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=");
    query_value(&qs, s3->key_id);
    cx_buf_adds(&qs, "%2F");
    query_value(&qs, scope);
    cx_buf_addf(&qs, "&X-Amz-Date=%s&X-Amz-Expires=%u", stamp, expires);
    if (s3->token[0]) {
        cx_buf_adds(&qs, "&X-Amz-Security-Token=");
        query_value(&qs, s3->token);
    }
    cx_buf_adds(&qs, "&X-Amz-SignedHeaders=host");
    if (extra[0])
        cx_buf_addf(&qs, "&%s", extra);
    cx_buf_addf(&creq, "GET\n%s\n%s\nhost:%s\n\nhost\nUNSIGNED-PAYLOAD", path.data ? path.data : "",
                qs.data ? qs.data : "", s3->host);
    rc = cx_buf_err(&path) ? cx_buf_err(&path)
         : cx_buf_err(&qs) ? cx_buf_err(&qs)
                           : cx_buf_err(&creq);
    if (rc == CX_OK)
        rc = cx_sha256_hex(creq.data, creq.len, hex);
    if (rc == CX_OK) {
        cx_buf_addf(&sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", stamp, scope, hex);
        rc = cx_buf_err(&sts);
    }
    if (rc == CX_OK && !signing_key(s3, day, k))
        rc = CX_ERR_NOMEM;
    if (rc == CX_OK && !hmac(d, k, sizeof(k), sts.data))
        rc = CX_ERR_NOMEM;
    sodium_memzero(k, sizeof(k));
    if (rc == CX_OK) {
        sodium_bin2hex(hex, sizeof(hex), d, sizeof(d));
        n = snprintf(out, outlen, "%s%s?%s&X-Amz-Signature=%s", path_only ? "" : s3->origin,
                     path.data, qs.data, hex);
        if (n < 0 || (size_t)n >= outlen)
            rc = CX_ERR_TOO_LARGE;
    }
    cx_buf_cleanup(&path);
    cx_buf_cleanup(&qs);
    cx_buf_cleanup(&creq);
    cx_buf_cleanup(&sts);
    return rc;
}
