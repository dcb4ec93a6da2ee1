#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/sendfile.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../lib/codexec.h"
#include "request.h"

const char *
cx_req_param(struct cx_req *r, const char *name)
{
    return FCGX_GetParam(name, r->fr->envp);
}

void
cx_req_finish(struct cx_req *r)
{
    const char *route = r->route ? r->route : "unknown";

    cx_req_body_done(r);
    if (!r->status)
        cx_req_send_error(r, 500, "internal_error", "internal error");
    cx_metrics_observe(route, r->status, cx_now_us() - r->t0_us);
    cx_log_request(r->method, r->route ? r->route : "-", r->status,
                   (long long)(cx_now_us() - r->t0_us));
    cx_buf_cleanup(&r->headers);
    if (r->state && r->state_free)
        r->state_free(r->state);
    r->state = NULL;
    cx_log_set_request_id(NULL);
}

/* A request the lane runs: its own copy, the continuation. */
struct deferred {
    struct cx_req r;
    void (*fn)(struct cx_req *r);
};

/* A run that waited this long for a thread is answered 503 instead: its
 * client has likely given up or retried (nginx waits 330 s). */
#define QUEUE_WAIT_MAX_US (60 * 1000000LL)

/* Whether the web server closed the connection while the request waited
 * (its client went away): nothing is run for it then. */
static bool
hung_up(const FCGX_Request *fr)
{
    struct pollfd p = {.fd = fr->ipcFd, .events = POLLRDHUP};

    return fr->ipcFd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void refuse(struct cx_req *r, enum cx_err err, const char *msg);

static void
run_deferred(struct cx_ctx *cx, void *arg)
{
    struct deferred *d = arg;
    FCGX_Request *fr = d->r.fr;

    cx_log_set_request_id(d->r.id);
    d->r.cx = cx;
    if (hung_up(fr)) {
        cx_log_info("the client went away while its run waited for a thread; not run");
        d->r.status = 499; /* (nginx's word for it, in the log and metrics only) */
    } else if (cx_now_us() - d->r.t0_us > QUEUE_WAIT_MAX_US) {
        refuse(&d->r, CX_ERR_BUSY, "the run waited too long for a run thread");
    } else if (cx) {
        d->fn(&d->r);
    }
    if (!d->r.ended) {
        cx_req_finish(&d->r);
        cx_lane_answered(); /* before the answer's last bytes go out */
        FCGX_Finish_r(fr);
    }
    FCGX_Free(fr, 1);
    free(fr);
    free(d);
}

void
cx_req_end_early(struct cx_req *r)
{
    if (!r->deferred || r->ended)
        return;
    cx_req_finish(r);
    FCGX_Finish_r(r->fr);
    r->method = r->query = "";
    r->ended = true;
    cx_log_set_request_id(r->id); /* the run's lines still carry it */
}

bool
cx_req_defer(struct cx_req *r, void (*fn)(struct cx_req *r))
{
    char msg[CX_MSG_MAX] = "";
    struct deferred *d = malloc(sizeof(*d));
    enum cx_err rc;

    if (!d) {
        cx_req_send_lib_error(r, CX_ERR_NOMEM, NULL);
        return false;
    }
    d->r = *r; /* the headers' buffer moves with it */
    d->r.deferred = true;
    d->fn = fn;
    rc = cx_lane_submit(r->who.user, run_deferred, d, msg, sizeof(msg));
    if (rc) {
        free(d);
        refuse(r, rc, msg);
        return false;
    }
    r->deferred = true;
    return true;
}

void
cx_req_header(struct cx_req *r, const char *name, const char *value)
{
    if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n")) {
        cx_log_err(0, "refused a header with a line break in it");
        return;
    }
    cx_buf_addf(&r->headers, "%s: %s\r\n", name, value);
}

static void
send_head(struct cx_req *r, int status, const char *content_type, long long len)
{
    FCGX_FPrintF(r->fr->out, "Status: %d %s\r\n", status, cx_http_reason(status));
    if (content_type)
        FCGX_FPrintF(r->fr->out, "Content-Type: %s\r\n", content_type);
    if (len >= 0)
        FCGX_FPrintF(r->fr->out, "Content-Length: %lld\r\n", len);
    /* API answers are never cached; a handler may say otherwise. */
    if (!r->headers.data || !strstr(r->headers.data, "Cache-Control:"))
        FCGX_PutS("Cache-Control: no-store\r\n", r->fr->out);
    FCGX_FPrintF(r->fr->out, "X-Content-Type-Options: nosniff\r\nX-Request-Id: %s\r\n", r->id);
    if (r->headers.len && !cx_buf_err(&r->headers))
        FCGX_PutStr(r->headers.data, (int)r->headers.len, r->fr->out);
    FCGX_PutS("\r\n", r->fr->out);
    r->status = status;
}

void
cx_req_send_text(struct cx_req *r, int status, const char *content_type, const char *body,
                 size_t len)
{
    send_head(r, status, content_type, (long long)len);
    if (strcmp(r->method, "HEAD") != 0 && len)
        FCGX_PutStr(body, (int)len, r->fr->out);
}

/* libfcgi's writer sends the body through an 8 KiB buffer, one record and
 * one write(2) per 8 KiB, which held direct downloads to a fifth of what
 * nginx sends from a file. The records here are the same protocol
 * (FastCGI 1.0, FCGI_STDOUT, this request's id), written on the
 * connection libfcgi accepted, after its buffer was flushed; libfcgi then
 * ends the stream and the request as usual. */
#define RECORD_MAX 65528 /* a multiple of 8: no padding */

/* The head of a FastCGI stdout record of request id: n bytes, then pad. */
static void
record_head(unsigned char head[8], int id, size_t n, size_t pad)
{
    head[0] = 1; /* FCGI_VERSION_1 */
    head[1] = 6; /* FCGI_STDOUT */
    head[2] = (unsigned char)(id >> 8);
    head[3] = (unsigned char)id;
    head[4] = (unsigned char)(n >> 8);
    head[5] = (unsigned char)n;
    head[6] = (unsigned char)pad;
    head[7] = 0;
}

static bool
write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

bool
cx_req_send_file(struct cx_req *r, int fd, uint64_t first, uint64_t last)
{
    int out = r->fr->ipcFd, id = r->fr->requestId;
    off_t off = (off_t)first;

    if (FCGX_FFlush(r->fr->out) != 0)
        return false;
    while ((uint64_t)off <= last) {
        size_t n =
            last - (uint64_t)off + 1 < RECORD_MAX ? (size_t)(last - (uint64_t)off + 1) : RECORD_MAX;
        size_t pad = (8 - n % 8) % 8, left = n;
        unsigned char head[8];
        static const unsigned char zeros[8];

        record_head(head, id, n, pad);

        if (!write_all(out, head, sizeof(head)))
            goto cut;
        while (left > 0) {
            ssize_t w = sendfile(out, fd, &off, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                goto cut; /* the file shrank, or the connection went */
            left -= (size_t)w;
        }
        if (pad && !write_all(out, zeros, pad))
            goto cut;
    }
    return true;
cut:
    /* A record promised bytes that will not come: nothing valid can follow. */
    shutdown(out, SHUT_RDWR);
    return false;
}

bool
cx_req_send_bytes(struct cx_req *r, const void *data, size_t len)
{
    return len <= INT_MAX && FCGX_PutStr(data, (int)len, r->fr->out) == (int)len;
}

void
cx_req_forget_headers(struct cx_req *r)
{
    cx_buf_reset(&r->headers);
}

void
cx_req_cut(struct cx_req *r)
{
    FCGX_FFlush(r->fr->out);
    shutdown(r->fr->ipcFd, SHUT_RDWR);
}

void
cx_req_send_empty(struct cx_req *r, int status)
{
    send_head(r, status, NULL, status == 204 || status == 304 ? -1 : 0);
}

void
cx_req_send_head(struct cx_req *r, int status, const char *content_type, long long len)
{
    send_head(r, status, content_type, len);
}

void
cx_req_send_json(struct cx_req *r, int status, json_t *json)
{
    char *s = json ? json_dumps(json, JSON_COMPACT) : NULL;

    if (!s) {
        static const char oom[] =
            "{\"error\":{\"code\":\"internal_error\",\"message\":\"out of memory\"}}";
        cx_req_send_text(r, 500, "application/json", oom, sizeof(oom) - 1);
        return;
    }
    cx_req_send_text(r, status, "application/json", s, strlen(s));
    free(s);
}

void
cx_req_send_error(struct cx_req *r, int status, const char *code, const char *message)
{
    json_t *j = cx_http_error_json(code, message);

    cx_req_send_json(r, status, j);
    json_decref(j);
}

/* The one table from a library error to an answer (docs/openapi.yaml):
 * its status and code, the message when the library said nothing more
 * precise, the Retry-After a client is told (a run slot frees up within
 * a second, a sandbox in a few, a service takes longer), and whether it
 * is a refusal for a limit (codexec_refusals_total). */
static const struct answer {
    int status;
    const char *code;
    const char *message;
    const char *retry_after;
    bool refusal;
} answers[CX_ERR__COUNT] = {
    [CX_ERR_NOMEM] = {500, "internal_error", "internal error", NULL, false},
    [CX_ERR_INVALID] = {400, "invalid_request", "the request is invalid", NULL, false},
    [CX_ERR_TOO_LARGE] = {413, "payload_too_large", "the request is too large", NULL, true},
    [CX_ERR_NOT_FOUND] = {404, "not_found", "no such resource", NULL, false},
    [CX_ERR_INPUT_NOT_FOUND] = {404, "input_not_found", "an input artifact was not found", NULL,
                                false},
    [CX_ERR_UNAUTHORIZED] = {401, "unauthorized", "a valid API key is required", NULL, false},
    [CX_ERR_FORBIDDEN] = {403, "forbidden", "this is not allowed", NULL, false},
    [CX_ERR_EXPIRED] = {410, "expired", "this has expired", NULL, false},
    [CX_ERR_CONFLICT] = {409, "conversation_busy", "a run holds this conversation", NULL, true},
    [CX_ERR_QUOTA] = {429, "quota_exceeded", "a quota was exceeded", NULL, true},
    [CX_ERR_CAPACITY] = {503, "capacity_exhausted", "no sandbox is free; retry later", "2", true},
    [CX_ERR_TOO_MANY_RUNS] = {429, "too_many_runs", "too many runs in progress; retry later", "1",
                              true},
    [CX_ERR_BUSY] = {503, "unavailable", "the server is busy; retry shortly", "1", true},
    [CX_ERR_IO] = {500, "internal_error", "a storage operation failed", NULL, false},
    [CX_ERR_DB] = {503, "unavailable", "the database is unavailable; retry later", "5", false},
    [CX_ERR_GATEWAY] = {502, "gateway_error", "the Jupyter gateway failed", NULL, false},
    [CX_ERR_TIMEOUT] = {503, "unavailable", "a backing service timed out; retry later", "5", false},
    [CX_ERR_PROTOCOL] = {502, "gateway_error", "the gateway broke its protocol", NULL, false},
    [CX_ERR_KERNEL_DIED] = {502, "gateway_error", "the kernel died", NULL, false},
    [CX_ERR_INTERNAL] = {500, "internal_error", "internal error", NULL, false},
    [CX_ERR_INVALID_PATH] = {400, "invalid_path", "the path is invalid", NULL, false},
    [CX_ERR_NOT_A_FILE] = {409, "not_a_file", "the path names no regular file", NULL, false},
    [CX_ERR_RUN_ENDED] = {409, "run_ended", "the run already ended", NULL, false},
    [CX_ERR_IDEMPOTENCY] = {422, "idempotency_mismatch",
                            "this Idempotency-Key was used for another request", NULL, false},
    [CX_ERR_LANGUAGE_MISMATCH] = {409, "language_mismatch",
                                  "this conversation's session runs another language", NULL, false},
    [CX_ERR_IN_PROGRESS] = {409, "idempotency_in_progress",
                            "the first request with this Idempotency-Key is still in progress", "1",
                            false},
};

static const struct answer *
answer_of(enum cx_err err)
{
    if ((unsigned)err < CX_ERR__COUNT && answers[err].status)
        return &answers[err];
    return &answers[CX_ERR_INTERNAL];
}

/* The lane's refusal: the route's own answer (r->refuse), else the API's. */
static void
refuse(struct cx_req *r, enum cx_err err, const char *msg)
{
    const struct answer *a = answer_of(err);

    if (r->refuse) /* (which counts it among the refusals: cx_req_error_data) */
        r->refuse(r, a->status, err, msg && *msg ? msg : a->message);
    else
        cx_req_send_lib_error(r, err, msg);
}

void
cx_req_retry_after(struct cx_req *r, enum cx_err err)
{
    const struct answer *a = answer_of(err);

    if (a->retry_after)
        cx_req_header(r, "Retry-After", a->retry_after);
}

json_t *
cx_req_error_data(enum cx_err err, int *status)
{
    const struct answer *a = answer_of(err);
    json_t *d = json_pack("{s:s,s:i}", "code", a->code, "status", a->status);

    if (d && a->retry_after)
        json_object_set_new(d, "retry_after", json_integer(strtol(a->retry_after, NULL, 10)));
    if (a->refusal)
        cx_metrics_count_by(CX_FAMILY_REFUSALS, a->code);
    if (status)
        *status = a->status;
    return d;
}

void
cx_req_send_lib_error(struct cx_req *r, enum cx_err err, const char *msg)
{
    const struct answer *a = answer_of(err);

    if (a->status == 401)
        cx_req_header(r, "WWW-Authenticate", "Bearer");
    cx_req_retry_after(r, err);
    if (a->refusal)
        cx_metrics_count_by(CX_FAMILY_REFUSALS, a->code); /* a static string */
    cx_req_send_error(r, a->status, a->code, msg && *msg ? msg : a->message);
}

/* A request body that sends nothing for this long ends in an error. */
#define BODY_STALL_S 30

/* Whose share of request bodies: the key's own user (acting for an end
 * user, the part before it). */
static void
owner_of(const struct cx_req *r, char out[CX_USER_MAX + 1])
{
    size_t n = r->who.owner_len ? r->who.owner_len : strlen(r->who.user);

    snprintf(out, CX_USER_MAX + 1, "%.*s", (int)n, r->who.user);
}

enum cx_err
cx_req_body_begin(struct cx_req *r, char *msg, size_t msglen)
{
    enum cx_err rc;

    struct timeval tv = {.tv_sec = BODY_STALL_S};
    char owner[CX_USER_MAX + 1];

    /* (a body that stops coming fails the read: its thread is not held
     * for as long as the web server would wait) */
    if (setsockopt(r->fr->ipcFd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)))
        cx_log_warn(errno, "could not set a receive timeout on a request");
    if (r->deferred || r->body_slot)
        return CX_OK;
    owner_of(r, owner);
    rc = cx_lane_body_enter(r->cx->cfg, owner, msg, msglen);
    r->body_slot = rc == CX_OK;
    return rc;
}

void
cx_req_body_done(struct cx_req *r)
{
    char owner[CX_USER_MAX + 1];

    if (r->body_slot) {
        owner_of(r, owner);
        cx_lane_body_leave(owner);
    }
    r->body_slot = false;
}

ssize_t
cx_req_read(void *ctx, void *buf, size_t n)
{
    FCGX_Stream *in = ctx;
    int chunk = n > (1 << 30) ? (1 << 30) : (int)n;
    int got = FCGX_GetStr(buf, chunk, in);

    /* (a read that failed, its stall timeout say, is not the body's end) */
    return got < chunk && FCGX_GetError(in) ? -1 : got;
}

/* "application/json", any case, alone or with parameters. */
static bool
is_json_type(const char *ctype)
{
    if (!ctype)
        return false;
    ctype += strspn(ctype, " \t");
    return strncasecmp(ctype, "application/json", 16) == 0 &&
           (ctype[16] == '\0' || ctype[16] == ';' || ctype[16] == ' ' || ctype[16] == '\t');
}

bool
cx_req_json_type(struct cx_req *r)
{
    /* Also when the type is missing: a browser sends a cross-site POST
     * without a preflight only with a "simple" type or none (sendBeacon). */
    if (is_json_type(cx_req_param(r, "CONTENT_TYPE")))
        return true;
    cx_req_send_error(r, 415, "unsupported_media_type",
                      "the request body must be application/json");
    return false;
}

json_t *
cx_req_json_body(struct cx_req *r, uint64_t max)
{
    char msg[CX_MSG_MAX];
    char *body = NULL;
    size_t len = 0;
    json_t *j = NULL;
    enum cx_err rc;

    if (!cx_req_json_type(r))
        return NULL;
    rc = cx_req_body_begin(r, msg, sizeof(msg));
    if (rc) {
        cx_req_send_lib_error(r, rc, msg);
        return NULL;
    }
    rc = cx_http_read_body(cx_req_read, r->fr->in, cx_req_param(r, "CONTENT_LENGTH"), max, &body,
                           &len);
    cx_req_body_done(r);
    if (rc == CX_ERR_TOO_LARGE) {
        snprintf(msg, sizeof(msg), "the request body exceeds %llu bytes", (unsigned long long)max);
        cx_req_send_lib_error(r, CX_ERR_TOO_LARGE, msg);
        return NULL;
    }
    if (rc == CX_ERR_INVALID) {
        cx_req_send_error(r, 400, "invalid_request", "Content-Length is malformed");
        return NULL;
    }
    if (rc) {
        cx_req_send_error(r, 400, "invalid_request", "the request body could not be read");
        return NULL;
    }
    rc = cx_http_parse_json_object(body, len, &j, msg, sizeof(msg));
    free(body);
    if (rc) {
        cx_req_send_lib_error(r, rc, msg); /* malformed: 400; too many values: 413 */
        return NULL;
    }
    return j;
}

bool
cx_req_vouched(struct cx_req *r)
{
    if (!r->cx->cfg->web_server_key)
        return true;
    return cx_auth_hex_equal(cx_req_param(r, "CODEXEC_WEB_KEY"), cx_auth_web_key(r->cx->auth));
}

bool
cx_req_operator(struct cx_req *r)
{
    const char *h = cx_req_param(r, "HTTP_AUTHORIZATION");

    if (r->cx->cfg->metrics_token)
        return h && !strncasecmp(h, "Bearer ", 7) &&
               cx_auth_hex_equal(h + 7 + strspn(h + 7, " "), cx_auth_ops_token(r->cx->auth));
    return cx_req_vouched(r) &&
           cx_addr_list_match(r->cx->cfg->metrics_allow, cx_req_param(r, "REMOTE_ADDR"));
}

const char *
cx_req_remote_user(struct cx_req *r)
{
    const char *user = NULL, *auth_type = cx_req_param(r, "AUTH_TYPE");
    int seen = 0;

    if (!r->cx->cfg->trust_remote_user || !auth_type || !*auth_type || !cx_req_vouched(r))
        return NULL;
    for (char **e = r->fr->envp; *e; e++)
        if (!strncmp(*e, "REMOTE_USER=", 12)) {
            user = *e + 12;
            seen++;
        }
    if (seen > 1)
        cx_log_warn(0, "REMOTE_USER sent %d times: ignored (check the web server's config)", seen);
    return seen == 1 && *user ? user : NULL;
}

/* The host part of "scheme://host[:port]" or "host[:port]", lower case. */
static void
host_of(const char *s, char *out, size_t outlen)
{
    const char *p = strstr(s, "://");
    size_t n;

    p = p ? p + 3 : s;
    n = p[0] == '[' ? strcspn(p, "]") + 1 : strcspn(p, ":/");
    snprintf(out, outlen, "%.*s", (int)n, p);
    for (char *c = out; *c; c++)
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c - 'A' + 'a');
}

/* A browser's request from another site: Sec-Fetch-Site says so, or an
 * Origin names another host. */
static bool
cross_site(struct cx_req *r)
{
    const char *site = cx_req_param(r, "HTTP_SEC_FETCH_SITE");
    const char *origin = cx_req_param(r, "HTTP_ORIGIN"), *host = cx_req_param(r, "HTTP_HOST");
    char a[256], b[256];

    if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
        return true;
    if (!origin || !host)
        return false;
    if (!strcmp(origin, "null"))
        return true;
    host_of(origin, a, sizeof(a));
    host_of(host, b, sizeof(b));
    return strcmp(a, b) != 0;
}

bool
cx_req_authenticate(struct cx_req *r)
{
    const char *remote = cx_req_remote_user(r);
    char msg[CX_MSG_MAX] = "";
    enum cx_err rc;

    rc = cx_auth_request(r->cx->auth, r->cx->db, remote != NULL, remote,
                         cx_req_param(r, "HTTP_AUTHORIZATION"), &r->who);
    if (!cx_req_auth_result(r, rc))
        return false;
    rc = cx_auth_act_for(&r->who, cx_req_param(r, "HTTP_ON_BEHALF_OF"), msg, sizeof(msg));
    if (rc) {
        cx_req_send_lib_error(r, rc, msg);
        return false;
    }
    /* The web server's authentication travels with every request a
     * browser makes, also those another site makes it send: such a
     * credential changes nothing from another site. A key does not
     * travel by itself. */
    if (!r->who.key_id[0] && strcmp(r->method, "GET") != 0 && strcmp(r->method, "HEAD") != 0 &&
        cross_site(r)) {
        cx_req_send_error(r, 403, "forbidden",
                          "a request from another site can't use the web server's authentication");
        return false;
    }
    return true;
}

bool
cx_req_auth_result(struct cx_req *r, enum cx_err rc)
{
    if (rc == CX_OK)
        return true;
    cx_req_send_lib_error(r, rc, NULL);
    return false;
}

/* ------------------------------------------------------------------------ */
/* Server-Sent Events                                                       */

/* A client that stops reading, or reads a byte now and then (the web
 * server passes a stream on unbuffered, so its stall is ours), must not
 * hold the worker past the run: a stream may spend this long in all
 * waiting for the connection to take its events; then the client counts
 * as gone, the connection is cut, and the run goes on without it. */
#define SSE_STALL_BUDGET_MS 10000

bool
cx_req_wants_events(struct cx_req *r)
{
    const char *accept = cx_req_param(r, "HTTP_ACCEPT");

    return accept && strcasestr(accept, "text/event-stream");
}

/* Writes n bytes without blocking, waiting in poll() out of the stream's
 * stall budget. */
static bool
write_budgeted(struct cx_sse *sse, const unsigned char *p, size_t n)
{
    int fd = sse->r->fr->ipcFd;

    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int64_t t0 = cx_now_ms();
            int rc;

            if (sse->stalled_ms >= SSE_STALL_BUDGET_MS)
                return false;
            rc = poll(&pfd, 1, (int)(SSE_STALL_BUDGET_MS - sse->stalled_ms));
            sse->stalled_ms += cx_now_ms() - t0;
            if (rc < 0 && errno != EINTR)
                return false;
            continue;
        }
        return false;
    }
    return true;
}

/* data as FastCGI stdout records of this request (the framing libfcgi
 * uses; its own buffer is empty, flushed after the head). */
static bool
write_records(struct cx_sse *sse, const char *data, size_t len)
{
    int id = sse->r->fr->requestId;

    while (len > 0) {
        size_t n = len < RECORD_MAX ? len : RECORD_MAX, pad = (8 - n % 8) % 8;
        unsigned char head[8];
        static const unsigned char zeros[8];

        record_head(head, id, n, pad);

        if (!write_budgeted(sse, head, sizeof(head)) ||
            !write_budgeted(sse, (const unsigned char *)data, n) ||
            (pad && !write_budgeted(sse, zeros, pad)))
            return false;
        data += n;
        len -= n;
    }
    return true;
}

static bool
sse_event(void *ctx, const char *name, json_t *data, unsigned id)
{
    struct cx_sse *sse = ctx;
    struct cx_buf b;
    char *text = NULL;
    bool ok;

    if (sse->gone)
        return false;
    if (!sse->started) {
        cx_req_header(sse->r, "X-Accel-Buffering", "no"); /* nginx: no buffering */
        cx_req_send_head(sse->r, 200, "text/event-stream; charset=utf-8", -1);
        sse->started = true;
        if (FCGX_FFlush(sse->r->fr->out) != 0 || FCGX_GetError(sse->r->fr->out) != 0)
            goto gone;
    }
    if (name) {
        /* compact JSON escapes every line break: one data line */
        text = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text)
            return true; /* this event is lost, not the stream */
    }
    cx_buf_init(&b, strlen(text ? text : "") + 64);
    if (name && id) {
        cx_buf_addf(&b, "id: %u\n", id);
        sse->last_id = id;
    }
    if (name)
        cx_buf_addf(&b, "event: %s\ndata: %s\n\n", name, text);
    else
        cx_buf_adds(&b, ": keep-alive\n\n"); /* a comment: proxies see traffic */
    free(text);
    if (cx_buf_err(&b)) {
        cx_buf_cleanup(&b);
        return true; /* this event is lost, not the stream */
    }
    ok = write_records(sse, b.data, b.len);
    cx_buf_cleanup(&b);
    if (ok)
        return true;
gone:
    sse->gone = true;
    /* Nothing valid can follow a record cut short: libfcgi's own last
     * records then fail at once instead of waiting on the client. */
    shutdown(sse->r->fr->ipcFd, SHUT_RDWR);
    cx_log_info("the client of a streaming run went away; the run goes on");
    return false;
}

/* libfcgi's own blocking writes of the stream (the head, the closing
 * records after the last event) give up after as long as the stall budget.
 * It stays for the connection's life: codexec's configurations close it
 * after the request (no fastcgi_keep_conn). */
static void
send_timeout(struct cx_req *r)
{
    struct timeval tv = {.tv_sec = SSE_STALL_BUDGET_MS / 1000};

    if (setsockopt(r->fr->ipcFd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
        cx_log_warn(errno, "could not set a send timeout on a streaming answer");
}

void
cx_req_sse_sink(struct cx_req *r, struct cx_sse *sse, struct cx_run_sink *sink)
{
    *sse = (struct cx_sse){.r = r};
    *sink = (struct cx_run_sink){.fn = sse_event, .ctx = sse};
    send_timeout(r);
}

void
cx_req_sse_end(struct cx_sse *sse, enum cx_err rc, int status, json_t *out, const char *msg)
{
    const struct answer *a = answer_of(rc);
    json_t *error;

    /* a streamed answer reaches the client event by event: its last one
     * may be read (and the next run sent) before the request ends */
    cx_lane_answered();
    if (!sse->started) {
        if (rc == CX_OK)
            cx_req_send_json(sse->r, status, out);
        else
            cx_req_send_lib_error(sse->r, rc, msg);
        return;
    }
    if (rc == CX_OK) {
        sse_event(sse, "result", out, sse->last_id ? sse->last_id + 1 : 0);
        return;
    }
    error = cx_http_error_json(a->code, msg && *msg ? msg : a->message);
    if (a->refusal)
        cx_metrics_count_by(CX_FAMILY_REFUSALS, a->code);
    if (error)
        sse_event(sse, "result", error, sse->last_id ? sse->last_id + 1 : 0);
    json_decref(error);
}
