#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buf.h"
#include "kernel.h"
#include "log.h"
#include "metrics.h"
#include "util.h"
#include "ws.h"

#define POOL_MAX        256
#define POOL_IDLE_US    (300 * 1000000LL)
#define MAX_WS_MESSAGE  CX_KERNEL_MAX_MESSAGE
#define DRAIN_MAX       1024          /* messages one drain reads at most */
#define DRAIN_MAX_BYTES (4u << 20)    /* ... bytes */
#define DRAIN_BUDGET_US (20 * 1000LL) /* ... time, beyond its wait */
#define MSG_KEEP_ALLOC  (256u * 1024) /* what an idle connection keeps */

/* The nudges of a kernel's restart remembered: one a second, the older
 * long answered or lost. */
#define NUDGES_KEPT    8
#define NUDGE_EVERY_US 1000000
/* How long the new process is given to answer a nudge: its start-up, and
 * more (a kernel that died young is started on new ports, which this
 * connection's channels never reach). */
#define AWAIT_RESTART_US (15 * 1000000LL)

struct cx_kernel_conn {
    struct cx_kernel_conn *next;
    char kernel_id[64];
    char gateway_url[512];
    char session[37]; /* the Jupyter client session id */
    struct cx_ws *ws;
    bool v1;      /* the server's v1 WebSocket protocol (CX_KERNEL_WS_V1) */
    bool v1_said; /* a v1 frame came on a JSON connection: said in the log */
    struct cx_buf msg;
    int64_t last_used_us;
    int64_t drained_us; /* the ticker's last drain of it */
    uint64_t messages;
    bool forget;      /* its kernel was deleted while it was being drained */
    bool restarted;   /* it heard the server's notice that the kernel went away */
    bool live;        /* it heard an idle status answering a request sent on it,
                         and no notice since: its output channel is subscribed */
    uint64_t notices; /* the server's notices heard during requests' waits */
    /* The server's notice came while none of the requests in flight was
     * heard taken (those marked queued): whether the new process takes
     * them is asked with kernel_info requests (nudges) on the same shell
     * channel, which keeps order (dispatch), and on the control channel,
     * which a busy kernel answers at once. Once the new process is heard
     * (a queued request's message, or a control nudge's reply) the nudges
     * stop and the time limit goes (the cell may run long); the first
     * shell nudge's reply still decides. */
    bool awaiting, reached;
    int64_t nudge_due_us, await_end_us;
    unsigned nnudges;
    char nudges[NUDGES_KEPT][40];
};

/* Kernels whose idle connection the drain found still talking, waiting
 * for cx_kernel_pool_talkers() (the reaper restarts them). A fixed set:
 * more at once are found again by the next drain. */
#define TALKERS_MAX 64
static struct cx_kernel_talker talkers[TALKERS_MAX];
static int ntalkers;

/* At most one connection per kernel in this process: runs of one
 * conversation never overlap, a connection goes back to the pool after its
 * run, and the one the ticker drains is out of the pool only while a run
 * that wants it waits for it (draining, drained). */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t drained = PTHREAD_COND_INITIALIZER;
static struct cx_kernel_conn *pool, *draining;
static int pool_len;

static bool
same_kernel(const struct cx_kernel_conn *c, const char *gateway_url, const char *kernel_id)
{
    return !strcmp(c->kernel_id, kernel_id) && !strcmp(c->gateway_url, gateway_url);
}

void
cx_kernel_conn_free(struct cx_kernel_conn *c)
{
    if (!c)
        return;
    cx_ws_free(c->ws);
    cx_buf_cleanup(&c->msg);
    free(c);
}

static struct cx_kernel_conn *
pool_take(const char *gateway_url, const char *kernel_id)
{
    struct cx_kernel_conn **pp, *c, *stale = NULL;
    int64_t now = cx_now_us();

    pthread_mutex_lock(&pool_lock);
    for (;;) {
        for (pp = &pool; (c = *pp);) {
            if (now - c->last_used_us > POOL_IDLE_US) {
                *pp = c->next;
                pool_len--;
                c->next = stale;
                stale = c;
                continue;
            }
            if (same_kernel(c, gateway_url, kernel_id)) {
                *pp = c->next;
                pool_len--;
                c->next = NULL;
                break;
            }
            pp = &c->next;
        }
        if (c || !draining || !same_kernel(draining, gateway_url, kernel_id))
            break;
        pthread_cond_wait(&drained, &pool_lock); /* a few ms: the ticker has it */
    }
    pthread_mutex_unlock(&pool_lock);
    while (stale) {
        struct cx_kernel_conn *n = stale->next;
        cx_kernel_conn_free(stale);
        stale = n;
    }
    return c;
}

enum cx_err
cx_kernel_conn_get(const char *gateway_url, const char *token, const char *kernel_id,
                   struct cx_kernel_conn **out, char *msg, size_t msglen)
{
    struct cx_kernel_conn *c = pool_take(gateway_url, kernel_id);

    if (c && cx_ws_alive(c->ws)) {
        *out = c;
        return CX_OK;
    }
    cx_kernel_conn_free(c);
    return cx_kernel_conn_open(gateway_url, token, kernel_id, 0, out, msg, msglen);
}

enum cx_err
cx_kernel_conn_buffered(const void *frames, size_t len, bool v1, struct cx_kernel_conn **out)
{
    struct cx_kernel_conn *c = calloc(1, sizeof(*c));
    enum cx_err rc = c ? cx_ws_buffered(frames, len, MAX_WS_MESSAGE, &c->ws) : CX_ERR_NOMEM;

    *out = NULL;
    if (rc) {
        free(c);
        return rc;
    }
    snprintf(c->kernel_id, sizeof(c->kernel_id), "buffered");
    c->v1 = v1;
    cx_uuid_generate(c->session);
    cx_buf_init(&c->msg, MAX_WS_MESSAGE);
    *out = c;
    return CX_OK;
}

enum cx_err
cx_kernel_conn_open(const char *gateway_url, const char *token, const char *kernel_id,
                    unsigned flags, struct cx_kernel_conn **out, char *msg, size_t msglen)
{
    struct cx_ws_options opt = {0};
    struct cx_kernel_conn *c;
    char url[1024], auth[512];
    enum cx_err rc;

    c = calloc(1, sizeof(*c));
    if (!c)
        return CX_ERR_NOMEM;
    snprintf(c->kernel_id, sizeof(c->kernel_id), "%s", kernel_id);
    snprintf(c->gateway_url, sizeof(c->gateway_url), "%s", gateway_url);
    cx_uuid_generate(c->session);
    cx_buf_init(&c->msg, MAX_WS_MESSAGE);
    /* http://host → ws://host, https:// → wss:// */
    if (strncmp(gateway_url, "https://", 8) == 0)
        snprintf(url, sizeof(url), "wss://%s/api/kernels/%s/channels?session_id=%s",
                 gateway_url + 8, kernel_id, c->session);
    else if (strncmp(gateway_url, "http://", 7) == 0)
        snprintf(url, sizeof(url), "ws://%s/api/kernels/%s/channels?session_id=%s", gateway_url + 7,
                 kernel_id, c->session);
    else {
        cx_kernel_conn_free(c);
        snprintf(msg, msglen, "gateway_url must start with http:// or https://");
        return CX_ERR_INVALID;
    }
    /* Base URLs with a trailing slash would give "//api". */
    for (char *p = strstr(url, "//api/"); p; p = strstr(p, "//api/"))
        memmove(p, p + 1, strlen(p));
    opt.url = url;
    if (token && *token) {
        snprintf(auth, sizeof(auth), "Authorization: token %s", token);
        opt.extra_header = auth;
    }
    /* The server answers the upgrade once the kernel is ready (it nudges the
     * kernel first): a cold kernel on a busy machine takes seconds. */
    opt.connect_timeout_ms = 90000;
    opt.max_message = MAX_WS_MESSAGE;
    opt.no_quickack = (flags & CX_KERNEL_PLAIN) != 0;
    /* the server passes v1's messages through as the kernel's frames,
     * without parsing and re-encoding each one (a server that does not
     * select it speaks the JSON protocol) */
    opt.protocol = flags & CX_KERNEL_LEGACY ? NULL : CX_KERNEL_WS_V1;
    cx_metrics_count(CX_COUNT_GATEWAY_WS_CONNECT);
    rc = cx_ws_connect(&opt, &c->ws, msg, msglen);
    memset(auth, 0, sizeof(auth));
    if (rc) {
        cx_kernel_conn_free(c);
        return rc;
    }
    c->v1 = cx_ws_protocol_selected(c->ws);
    *out = c;
    return CX_OK;
}

/* Under pool_lock: puts a live connection in the pool, replacing one to
 * the same kernel (the newer has read its run's messages; the older may
 * hold them unread). Returns what the caller frees: the one replaced, or c
 * itself when it is broken or the pool is full. */
static struct cx_kernel_conn *
pool_push_locked(struct cx_kernel_conn *c)
{
    struct cx_kernel_conn **pp, *old;

    if (!cx_ws_alive(c->ws))
        return c;
    for (pp = &pool; (old = *pp); pp = &old->next)
        if (same_kernel(old, c->gateway_url, c->kernel_id)) {
            *pp = old->next;
            pool_len--;
            old->next = NULL;
            break;
        }
    if (pool_len >= POOL_MAX)
        return c; /* (old is NULL: taking it out made room) */
    c->next = pool;
    pool = c;
    pool_len++;
    return old;
}

static void
pool_push(struct cx_kernel_conn *c)
{
    struct cx_kernel_conn *extra;

    pthread_mutex_lock(&pool_lock);
    extra = pool_push_locked(c);
    pthread_mutex_unlock(&pool_lock);
    cx_kernel_conn_free(extra);
}

/* Empties the pool; the caller owns the returned list. */
static struct cx_kernel_conn *
pool_take_all(void)
{
    struct cx_kernel_conn *list;

    pthread_mutex_lock(&pool_lock);
    list = pool;
    pool = NULL;
    pool_len = 0;
    pthread_mutex_unlock(&pool_lock);
    return list;
}

void
cx_kernel_conn_put(struct cx_kernel_conn *c)
{
    if (!c)
        return;
    c->last_used_us = cx_now_us();
    c->awaiting = false; /* a run's question, not the next one's */
    pool_push(c);
}

void
cx_kernel_pool_forget(const char *kernel_id)
{
    for (;;) {
        struct cx_kernel_conn **pp, *c = NULL;

        pthread_mutex_lock(&pool_lock);
        for (pp = &pool; *pp; pp = &(*pp)->next)
            if (!strcmp((*pp)->kernel_id, kernel_id)) {
                c = *pp;
                *pp = c->next;
                pool_len--;
                break;
            }
        if (draining && !strcmp(draining->kernel_id, kernel_id))
            draining->forget = true; /* the ticker frees it */
        pthread_mutex_unlock(&pool_lock);
        if (!c)
            return;
        cx_kernel_conn_free(c);
    }
}

/* Under pool_lock: takes the first connection not drained since start. */
static struct cx_kernel_conn *
take_undrained(int64_t start)
{
    struct cx_kernel_conn **pp, *c;

    for (pp = &pool; (c = *pp); pp = &c->next)
        if (c->drained_us < start) {
            *pp = c->next;
            pool_len--;
            c->next = NULL;
            return c;
        }
    return NULL;
}

/* Under pool_lock: notes a kernel that keeps talking while idle, once. */
static void
note_talker_locked(const struct cx_kernel_conn *c)
{
    for (int i = 0; i < ntalkers; i++)
        if (!strcmp(talkers[i].kernel_id, c->kernel_id) &&
            !strcmp(talkers[i].gateway_url, c->gateway_url))
            return;
    if (ntalkers == TALKERS_MAX)
        return;
    snprintf(talkers[ntalkers].gateway_url, sizeof(talkers[ntalkers].gateway_url), "%s",
             c->gateway_url);
    snprintf(talkers[ntalkers].kernel_id, sizeof(talkers[ntalkers].kernel_id), "%s", c->kernel_id);
    ntalkers++;
}

int
cx_kernel_pool_talkers(struct cx_kernel_talker *out, int max)
{
    int n;

    pthread_mutex_lock(&pool_lock);
    n = ntalkers < max ? ntalkers : max;
    memcpy(out, talkers, sizeof(*out) * (size_t)n);
    memmove(talkers, talkers + n, sizeof(*talkers) * (size_t)(ntalkers - n));
    ntalkers -= n;
    pthread_mutex_unlock(&pool_lock);
    return n;
}

void
cx_kernel_pool_drain_idle(void)
{
    int64_t start = cx_now_us();
    struct cx_kernel_conn *c, *extra;

    /* One at a time, out of the pool only while it is read; a run that wants
     * it meanwhile waits for it rather than open another connection. */
    for (;;) {
        enum cx_drain d = CX_DRAIN_FAILED;
        bool keep;

        pthread_mutex_lock(&pool_lock);
        c = draining = take_undrained(start);
        pthread_mutex_unlock(&pool_lock);
        if (!c)
            return;
        if (cx_now_us() - c->last_used_us <= POOL_IDLE_US)
            d = cx_kernel_drain(c, 0);
        keep = d != CX_DRAIN_FAILED && cx_ws_alive(c->ws);
        pthread_mutex_lock(&pool_lock);
        draining = NULL;
        c->drained_us = cx_now_us();
        /* A kernel that seems to talk on with no run to read it: the reaper
         * hears it out on this same connection (a second one would be two
         * at the server for a while) and restarts it if it does talk; the
         * server meanwhile holds at most 32 MiB for us (its guard). */
        if (d == CX_DRAIN_TALKING && !c->forget)
            note_talker_locked(c);
        extra = keep && !c->forget ? pool_push_locked(c) : c; /* idle too long, gone */
        pthread_cond_broadcast(&drained);
        pthread_mutex_unlock(&pool_lock);
        cx_kernel_conn_free(extra);
    }
}

void
cx_kernel_pool_clear(void)
{
    struct cx_kernel_conn *c = pool_take_all();

    while (c) {
        struct cx_kernel_conn *n = c->next;
        cx_kernel_conn_free(c);
        c = n;
    }
}

uint64_t
cx_kernel_conn_messages(const struct cx_kernel_conn *c)
{
    return c->messages;
}

uint64_t
cx_kernel_conn_reads(const struct cx_kernel_conn *c)
{
    return cx_ws_reads(c->ws);
}

uint64_t
cx_kernel_conn_quickacks(const struct cx_kernel_conn *c)
{
    return cx_ws_quickacks(c->ws);
}

static void
iso_now(char out[64])
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000);
}

static void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void
put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* m in the JSON protocol: a text frame, or with a buffer the server's
 * binary frame (the part count 2, the offsets of the JSON and of the
 * buffer, then both). */
static enum cx_err
send_json(struct cx_kernel_conn *c, json_t *m, const void *buf, size_t len)
{
    char *text = json_dumps(m, JSON_COMPACT);
    size_t tlen = text ? strlen(text) : 0;
    unsigned char *head = NULL;
    enum cx_err rc = CX_ERR_NOMEM;

    if (text && !buf) {
        rc = cx_ws_send(c->ws, CX_WS_TEXT, text, tlen);
        free(text);
        return rc;
    }
    if (text && len <= CX_KERNEL_MAX_MESSAGE && tlen <= CX_KERNEL_MAX_MESSAGE)
        head = malloc(12 + tlen);
    if (head) {
        /* the offsets, the JSON, then the buffer sent from where it is */
        put_be32(head, 2);
        put_be32(head + 4, 12);
        put_be32(head + 8, (uint32_t)(12 + tlen));
        memcpy(head + 12, text, tlen);
        rc = cx_ws_send2(c->ws, CX_WS_BINARY, head, 12 + tlen, buf, len);
    }
    free(head);
    free(text);
    return rc;
}

/* m in the v1 protocol: one binary frame of the offsets (a count, then
 * where the channel, each of the four JSON parts and the buffer start, and
 * where the last ends; 64-bit little-endian), the channel's name, the
 * parts, the buffer sent from where it is. */
static enum cx_err
send_v1(struct cx_kernel_conn *c, json_t *m, const void *buf, size_t len)
{
    static const char *const names[4] = {"header", "parent_header", "metadata", "content"};
    const char *channel = json_string_value(json_object_get(m, "channel"));
    char *part[4] = {NULL};
    size_t plen[4], noff = buf ? 7 : 6, at = 8 * (noff + 1), total;
    unsigned char *head = NULL;
    enum cx_err rc = CX_ERR_NOMEM;
    int i;

    for (i = 0; i < 4 && channel; i++) {
        part[i] = json_dumps(json_object_get(m, names[i]), JSON_COMPACT);
        if (!part[i])
            break;
        plen[i] = strlen(part[i]);
    }
    total = at + (channel ? strlen(channel) : 0);
    for (int k = 0; k < i; k++)
        total += plen[k];
    if (i == 4 && len <= CX_KERNEL_MAX_MESSAGE && total <= CX_KERNEL_MAX_MESSAGE)
        head = malloc(total);
    if (head) {
        size_t off = at, clen = strlen(channel);

        put_le64(head, noff);
        put_le64(head + 8, off);
        memcpy(head + off, channel, clen);
        off += clen;
        put_le64(head + 16, off);
        for (int k = 0; k < 4; k++) {
            memcpy(head + off, part[k], plen[k]);
            off += plen[k];
            put_le64(head + 24 + 8 * k, off);
        }
        if (buf)
            put_le64(head + 56, off + len);
        rc = cx_ws_send2(c->ws, CX_WS_BINARY, head, total, buf, buf ? len : 0);
    }
    free(head);
    for (int k = 0; k < 4; k++)
        free(part[k]);
    return rc;
}

/* Sends the message m (taken) on c, with one binary buffer or none
 * (buf NULL), in the protocol the server selected. */
static enum cx_err
send_message(struct cx_kernel_conn *c, json_t *m, const void *buf, size_t len)
{
    enum cx_err rc;

    if (!m)
        return CX_ERR_NOMEM;
    rc = c->v1 ? send_v1(c, m, buf, len) : send_json(c, m, buf, len);
    json_decref(m);
    return rc;
}

/* A kernel_info_request on channel ("shell" or "control"); msg_id
 * receives its id. */
static enum cx_err
send_kernel_info(struct cx_kernel_conn *c, const char *channel, char msg_id[40])
{
    char date[64];

    cx_uuid_generate(msg_id);
    iso_now(date);
    return send_message(c,
                        json_pack("{s:{s:s,s:s,s:s,s:s,s:s,s:s},s:{},s:{},s:{},s:s,s:[]}", "header",
                                  "msg_id", msg_id, "username", "codexec", "session", c->session,
                                  "date", date, "msg_type", "kernel_info_request", "version", "5.3",
                                  "parent_header", "metadata", "content", "channel", channel,
                                  "buffers"),
                        NULL, 0);
}

static uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

enum cx_err
cx_kernel_split_binary(const unsigned char *frame, size_t len, const char **json, size_t *json_len,
                       struct cx_kernel_buffers *bufs)
{
    uint32_t parts, off[CX_KERNEL_MAX_BUFFERS + 2];

    /* n, then n offsets: the JSON's (just past them) and each buffer's; a
     * part ends where the next begins, the last at the frame's end. */
    if (len < 8 || len > UINT32_MAX)
        return CX_ERR_PROTOCOL;
    parts = be32(frame);
    if (parts < 1 || parts > CX_KERNEL_MAX_BUFFERS + 1 || len < 4 * ((size_t)parts + 1))
        return CX_ERR_PROTOCOL;
    for (uint32_t i = 0; i < parts; i++)
        off[i] = be32(frame + 4 * (i + 1));
    off[parts] = (uint32_t)len;
    if (off[0] != 4 * (parts + 1))
        return CX_ERR_PROTOCOL;
    for (uint32_t i = 0; i < parts; i++)
        if (off[i + 1] < off[i])
            return CX_ERR_PROTOCOL;
    if (off[1] == off[0])
        return CX_ERR_PROTOCOL; /* no JSON */
    *json = (const char *)frame + off[0];
    *json_len = off[1] - off[0];
    bufs->n = parts - 1;
    for (uint32_t i = 1; i < parts; i++) {
        bufs->data[i - 1] = frame + off[i];
        bufs->len[i - 1] = off[i + 1] - off[i];
    }
    return CX_OK;
}

static uint64_t
le64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

enum cx_err
cx_kernel_split_v1(const unsigned char *frame, size_t len, struct cx_kernel_v1 *out)
{
    uint64_t n, off[CX_KERNEL_MAX_BUFFERS + 6];

    /* n, then n offsets: the channel's start (just past them), the start
     * of each part after it, and the end of the last part */
    if (len < 8)
        return CX_ERR_PROTOCOL;
    n = le64(frame);
    if (n < 6 || n > CX_KERNEL_MAX_BUFFERS + 6 || len < 8 * (n + 1))
        return CX_ERR_PROTOCOL;
    for (uint64_t i = 0; i < n; i++)
        off[i] = le64(frame + 8 * (i + 1));
    if (off[0] != 8 * (n + 1) || off[n - 1] != len)
        return CX_ERR_PROTOCOL;
    for (uint64_t i = 0; i + 1 < n; i++)
        if (off[i + 1] < off[i])
            return CX_ERR_PROTOCOL;
    out->channel = (const char *)frame + off[0];
    out->channel_len = off[1] - off[0];
    for (int i = 0; i < 4; i++) {
        out->part[i] = (const char *)frame + off[i + 1];
        out->part_len[i] = off[i + 2] - off[i + 1];
    }
    out->bufs.n = n - 6;
    for (uint64_t i = 0; i < n - 6; i++) {
        out->bufs.data[i] = frame + off[i + 5];
        out->bufs.len[i] = off[i + 6] - off[i + 5];
    }
    return CX_OK;
}

/* A message of the kernel's, as far as codexec reads it: the JSON
 * protocol's whole message (the parts borrowed from it) or v1's parts
 * (each its own; the metadata is not read). */
struct kmsg {
    json_t *whole, *header, *parent, *content;
    char channel[16];
    struct cx_kernel_buffers bufs; /* borrowed from c->msg */
};

static void
kmsg_cleanup(struct kmsg *k)
{
    if (k->whole) {
        json_decref(k->whole);
    } else {
        json_decref(k->header);
        json_decref(k->parent);
        json_decref(k->content);
    }
    memset(k, 0, sizeof(*k));
}

static json_t *
load_json(const char *json, size_t len)
{
    return json_loadb(json, len, JSON_ALLOW_NUL, NULL);
}

/* A v1 part: its JSON, or NULL. ipykernel passes on the bytes a cell
 * printed as they are, invalid UTF-8 included, which jansson refuses (the
 * JSON protocol's server decoded them with Python's "replace"): such a
 * part is read with them replaced by U+FFFD. *too_large: that copy would
 * be over CX_KERNEL_MAX_MESSAGE. */
static json_t *
load_part(const char *json, size_t len, bool *too_large)
{
    json_t *j = load_json(json, len);
    size_t flen = 0;
    char *fixed;

    if (j || cx_utf8_valid(json, len))
        return j;
    fixed = cx_utf8_fix(json, len, CX_KERNEL_MAX_MESSAGE, &flen);
    *too_large = *too_large || !fixed;
    j = fixed ? load_json(fixed, flen) : NULL;
    free(fixed);
    return j;
}

/* kmsg_read() of a v1 frame: its parts built (not the metadata), and its
 * channel's name (*channel, *clen). */
static enum cx_err
read_v1(struct cx_kernel_conn *c, enum cx_ws_opcode op, struct kmsg *k, const char **channel,
        size_t *clen)
{
    struct cx_kernel_v1 v;
    bool too_large = false;

    if (op != CX_WS_BINARY ||
        cx_kernel_split_v1((const unsigned char *)c->msg.data, c->msg.len, &v))
        return CX_ERR_PROTOCOL;
    if (cx_json_cost(v.part[0], v.part_len[0]) + cx_json_cost(v.part[1], v.part_len[1]) +
            cx_json_cost(v.part[3], v.part_len[3]) >
        CX_JSON_COST_MAX)
        return CX_ERR_TOO_LARGE;
    /* (a part that is not JSON drops the message, as the JSON protocol's
     * server dropped it) */
    k->header = load_part(v.part[0], v.part_len[0], &too_large);
    k->parent = k->header ? load_part(v.part[1], v.part_len[1], &too_large) : NULL;
    k->content = k->parent ? load_part(v.part[3], v.part_len[3], &too_large) : NULL;
    k->bufs = v.bufs;
    if (too_large || !json_is_object(k->parent)) {
        kmsg_cleanup(k);
        return too_large ? CX_ERR_TOO_LARGE : CX_ERR_PROTOCOL;
    }
    *channel = v.channel;
    *clen = v.channel_len;
    return CX_OK;
}

/* kmsg_read() of a JSON protocol's frame: the message built whole. */
static enum cx_err
read_json(struct cx_kernel_conn *c, enum cx_ws_opcode op, struct kmsg *k, const char **channel,
          size_t *clen)
{
    const unsigned char *frame = (const unsigned char *)c->msg.data;
    const char *json = c->msg.data;
    size_t json_len = c->msg.len;
    struct cx_kernel_v1 v;

    if (op == CX_WS_BINARY &&
        cx_kernel_split_binary(frame, c->msg.len, &json, &json_len, &k->bufs)) {
        /* the server selected v1, and something between said it did not:
         * no message is read (and the server drops the connection at our
         * first text frame) */
        if (!c->v1_said && cx_kernel_split_v1(frame, c->msg.len, &v) == CX_OK) {
            c->v1_said = true;
            cx_log_warn(0,
                        "kernel %s: the gateway sends v1 frames on a connection that did not "
                        "select v1 (a proxy dropped Sec-WebSocket-Protocol?)",
                        c->kernel_id);
        }
        return CX_ERR_PROTOCOL;
    }
    if (cx_json_cost(json, json_len) > CX_JSON_COST_MAX)
        return CX_ERR_TOO_LARGE;
    k->whole = load_json(json, json_len);
    k->header = json_object_get(k->whole, "header");
    k->parent = json_object_get(k->whole, "parent_header");
    k->content = json_object_get(k->whole, "content");
    *channel = json_string_value(json_object_get(k->whole, "channel"));
    *clen = *channel ? strlen(*channel) : 0;
    return CX_OK;
}

/* Reads the message c->msg holds (op: its frame's type) into k:
 * CX_OK, CX_ERR_TOO_LARGE when it would cost too much to build
 * (cx_json_cost(): it can only be output), CX_ERR_PROTOCOL when it is not
 * a message (not JSON, a frame of the other protocol, no channel, header
 * or content object). */
static enum cx_err
kmsg_read(struct cx_kernel_conn *c, enum cx_ws_opcode op, struct kmsg *k)
{
    const char *channel = NULL;
    size_t clen = 0;
    enum cx_err rc;

    memset(k, 0, sizeof(*k));
    rc = c->v1 ? read_v1(c, op, k, &channel, &clen) : read_json(c, op, k, &channel, &clen);
    if (rc)
        return rc;
    if (!channel || clen >= sizeof(k->channel) || memchr(channel, '\0', clen) ||
        !json_is_object(k->header) || !json_is_object(k->content)) {
        kmsg_cleanup(k);
        return CX_ERR_PROTOCOL;
    }
    memcpy(k->channel, channel, clen);
    return CX_OK;
}

static const char *
kmsg_type(const struct kmsg *k)
{
    return json_string_value(json_object_get(k->header, "msg_type"));
}

static const char *
kmsg_parent_id(const struct kmsg *k)
{
    return json_string_value(json_object_get(k->parent, "msg_id"));
}

static const char *
kmsg_state(const struct kmsg *k)
{
    return json_string_value(json_object_get(k->content, "execution_state"));
}

/* The server's notice that the kernel process went away (its restarter is
 * starting another, or gave up): a status "restarting" or "dead" with no
 * parent. */
static bool
is_notice(const char *parent, const char *state)
{
    return !parent && state && (!strcmp(state, "dead") || !strcmp(state, "restarting"));
}

/* Whether c->msg is that notice: only a short message holding
 * "execution_state" is parsed to tell. */
#define NOTICE_MAX 4096

static bool
server_notice(struct cx_kernel_conn *c, enum cx_ws_opcode op)
{
    struct kmsg k;
    bool notice;

    if (c->msg.len > NOTICE_MAX || !memmem(c->msg.data, c->msg.len, "execution_state", 15) ||
        kmsg_read(c, op, &k))
        return false;
    notice = is_notice(kmsg_parent_id(&k), kmsg_state(&k));
    kmsg_cleanup(&k);
    return notice;
}

/* A message was read on c (rc and op as cx_ws_recv gave them). After the
 * server's notice of the kernel's end, what the connection's output
 * channel was subscribed to is gone: cx_kernel_confirm() must see it live
 * again before the connection is trusted with output. */
/* The frame of a message without buffers: the server's notices, the
 * kernel_info replies. */
static enum cx_ws_opcode
plain_op(const struct cx_kernel_conn *c)
{
    return c->v1 ? CX_WS_BINARY : CX_WS_TEXT;
}

static void
heard(struct cx_kernel_conn *c, enum cx_err rc, enum cx_ws_opcode op)
{
    c->messages++;
    if (rc == CX_OK && op == plain_op(c) && server_notice(c, op)) {
        c->restarted = true;
        c->live = false;
    }
}

/* A message during cx_kernel_ready(): CX_OK when it is on iopub with a
 * parent in ids[0..n), CX_ERR_KERNEL_DIED for the server's notice that it
 * gave up on the kernel ("dead": it is gone from the server),
 * CX_ERR_TIMEOUT (keep waiting) otherwise. Its notice that it is
 * restarting the kernel only marks c: the new process is coming, in the
 * same sandbox and workspace, and answers a later nudge. (A death heard
 * by another connection, whose run reported it, reaches this one late: it
 * is no reason to replace the kernel and lose its workspace.) */
static enum cx_err
ready_answer(struct cx_kernel_conn *c, enum cx_ws_opcode op, char ids[][40], int n)
{
    struct kmsg k;
    const char *parent, *state;
    enum cx_err rc = CX_ERR_TIMEOUT;

    if (kmsg_read(c, op, &k))
        return rc;
    parent = kmsg_parent_id(&k);
    state = kmsg_state(&k);
    if (is_notice(parent, state)) {
        c->restarted = true;
        if (!strcmp(state, "dead"))
            rc = CX_ERR_KERNEL_DIED;
    }
    for (int i = 0; parent && !strcmp(k.channel, "iopub") && i < n && rc; i++)
        if (!strcmp(parent, ids[i]))
            rc = CX_OK;
    kmsg_cleanup(&k);
    return rc;
}

enum cx_err
cx_kernel_ready(struct cx_kernel_conn *c, int64_t deadline_us)
{
    char ids[64][40];
    int n = 0;

    while (cx_now_us() < deadline_us) {
        int64_t window = cx_now_us() + 200000;
        enum cx_ws_opcode op;
        enum cx_err rc;

        if (n == 64)
            n = 0; /* the oldest nudges are long answered or lost */
        rc = send_kernel_info(c, "shell", ids[n++]);
        if (rc)
            return rc;
        while ((rc = cx_ws_recv(c->ws, window < deadline_us ? window : deadline_us, &c->msg,
                                &op)) == CX_OK) {
            c->messages++;
            rc = ready_answer(c, op, ids, n);
            if (rc == CX_OK) {
                c->restarted = false; /* live again: the new process answered */
                c->live = true;
            }
            if (rc != CX_ERR_TIMEOUT)
                return rc;
        }
        if (rc != CX_ERR_TIMEOUT && rc != CX_ERR_TOO_LARGE)
            return rc;
    }
    return CX_ERR_TIMEOUT;
}

enum cx_err
cx_kernel_confirm(struct cx_kernel_conn *c, bool fresh, int64_t deadline_us)
{
    enum cx_err rc;

    /* a pooled connection's backlog first: the notice may be in it (what
     * a request then hears of a notice is news, not a leftover) */
    if (c->messages > 0)
        (void)cx_kernel_drain(c, 0);
    if (!fresh && !c->restarted)
        return CX_OK;
    rc = cx_kernel_ready(c, deadline_us);
    if (rc == CX_OK)
        (void)cx_kernel_drain(c, 0); /* the handshake's stragglers */
    return rc;
}

bool
cx_kernel_conn_v1(const struct cx_kernel_conn *c)
{
    return c->v1;
}

bool
cx_kernel_conn_live(const struct cx_kernel_conn *c)
{
    return c->live && !c->restarted;
}

uint64_t
cx_kernel_conn_notices(const struct cx_kernel_conn *c)
{
    return c->notices;
}

bool
cx_kernel_conn_restarted(const struct cx_kernel_conn *c)
{
    return c->restarted;
}

enum cx_err
cx_kernel_execute(struct cx_kernel_conn *c, struct cx_exec *e)
{
    char date[64];
    json_t *m;
    enum cx_err rc;

    /* the launcher's relay ends the sandbox's other processes before such
     * a request's reply passes (launcher/relay.h) */
    if (e->ends_run) {
        memcpy(e->msg_id, CX_RELAY_RUN_END, strlen(CX_RELAY_RUN_END));
        cx_uuid_generate(e->msg_id + strlen(CX_RELAY_RUN_END));
    } else {
        cx_uuid_generate(e->msg_id);
    }
    iso_now(date);
    m = json_pack("{s:{s:s,s:s,s:s,s:s,s:s,s:s},s:{},s:O?,s:{s:s,s:b,s:b,s:O?,s:b,s:b},s:s,s:[]}",
                  "header", "msg_id", e->msg_id, "username", "codexec", "session", c->session,
                  "date", date, "msg_type", "execute_request", "version", "5.3", "parent_header",
                  "metadata", e->metadata, "content", "code", e->code, "silent", e->silent,
                  "store_history", e->store_history, "user_expressions", e->user_expressions,
                  "allow_stdin", e->allow_stdin, "stop_on_error", e->stop_on_error, "channel",
                  "shell", "buffers");
    if (!m)
        return CX_ERR_NOMEM;
    if (!e->metadata)
        json_object_set_new(m, "metadata", json_object());
    if (!e->user_expressions)
        json_object_set_new(json_object_get(m, "content"), "user_expressions", json_object());
    if (e->role &&
        json_object_set_new(json_object_get(m, "content"), "codexec", json_string(e->role))) {
        json_decref(m);
        return CX_ERR_NOMEM;
    }
    rc = send_message(c, m, e->buffer, e->buffer_len);
    if (rc == CX_OK)
        e->sent = true;
    return rc;
}

static int
find_request(struct cx_exec *reqs, int n, const char *parent_id)
{
    for (int i = 0; i < n; i++)
        if (reqs[i].sent && !strcmp(reqs[i].msg_id, parent_id))
            return i;
    return -1;
}

static bool
any_heard(const struct cx_exec *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (reqs[i].sent && reqs[i].heard)
            return true;
    return false;
}

/* Whether every request sent (queued_only: queued at the notice) has its
 * reply. */
static bool
replied(const struct cx_exec *reqs, int n, bool queued_only)
{
    for (int i = 0; i < n; i++)
        if ((queued_only ? reqs[i].queued : reqs[i].sent) && !reqs[i].got_reply)
            return false;
    return true;
}

bool
cx_exec_all_replied(const struct cx_exec *reqs, int n)
{
    return replied(reqs, n, false);
}

static void
await_restart(struct cx_kernel_conn *c, struct cx_exec *reqs, int n)
{
    c->awaiting = true;
    c->reached = false;
    c->nnudges = 0;      /* an earlier wait's nudges answer nothing here */
    c->nudge_due_us = 0; /* at once */
    c->await_end_us = cx_now_us() + AWAIT_RESTART_US;
    for (int i = 0; i < n; i++)
        reqs[i].queued = reqs[i].sent;
}

static bool
is_nudge(const struct cx_kernel_conn *c, const char *parent_id)
{
    for (unsigned i = 0; i < NUDGES_KEPT && i < c->nnudges; i++)
        if (!strcmp(c->nudges[i], parent_id))
            return true;
    return false;
}

static bool
all_done(struct cx_exec *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (reqs[i].sent && !(reqs[i].got_reply && reqs[i].got_idle))
            return false;
    return true;
}

/* One message of the kernel's (its JSON text and binary buffers): the
 * request it answers gets its reply or idle status, and fn hears it.
 * Another client's, an earlier run's and a malformed message are skipped
 * (CX_OK); the server's notice of the kernel's end is CX_ERR_KERNEL_DIED,
 * unless it is restarting the kernel and none of the requests was heard
 * taken: requests still queued in the server's ZeroMQ reach the new
 * process when it connects again (found: a run answered KernelDied while
 * its code ran in the new process), so c awaits the answer to a nudge sent
 * behind them, and the nudge's reply coming before theirs is
 * CX_ERR_KERNEL_DIED (they went with the old process); else what fn
 * returned. */
static enum cx_err
dispatch(struct cx_kernel_conn *c, struct cx_exec *reqs, int n, const struct kmsg *k, cx_exec_fn fn,
         void *ctx)
{
    const char *type = kmsg_type(k), *channel = k->channel, *parent_id = kmsg_parent_id(k);
    const char *state = kmsg_state(k);
    json_t *content = k->content;
    enum cx_err rc = CX_OK;
    int i;

    if (!type)
        return CX_OK;
    if (!strcmp(type, "status") && is_notice(parent_id, state)) {
        c->restarted = true; /* its output channel to be confirmed again */
        c->live = false;
        c->notices++;
        if (!strcmp(state, "restarting") && !c->awaiting && !any_heard(reqs, n)) {
            await_restart(c, reqs, n);
        } else if (strcmp(state, "restarting") || !c->awaiting || c->reached) {
            /* the server gave up; the old process had them; the new one
             * died in turn */
            c->awaiting = false;
            rc = CX_ERR_KERNEL_DIED;
        }
        return rc; /* (restarting again before the new process was heard) */
    }
    if (c->awaiting && parent_id && !strcmp(type, "kernel_info_reply") && is_nudge(c, parent_id)) {
        if (!strcmp(channel, "control")) {
            c->reached = true; /* up on these ports: its shell answer will come */
        } else if (!strcmp(channel, "shell")) {
            c->awaiting = false;
            if (!replied(reqs, n, true))
                rc = CX_ERR_KERNEL_DIED; /* they went with the old process */
        }
        return rc;
    }
    i = parent_id ? find_request(reqs, n, parent_id) : -1;
    cx_log_debug("kernel message %s/%s for request %d", channel, type, i);
    if (i < 0)
        return CX_OK; /* another client's or an earlier run's message */
    reqs[i].heard = true;
    c->reached = c->reached || (c->awaiting && reqs[i].queued);
    if (!strcmp(channel, "shell") && !strcmp(type, "execute_reply")) {
        reqs[i].got_reply = true;
        json_decref(reqs[i].reply);
        reqs[i].reply = json_incref(content);
        if (c->awaiting && replied(reqs, n, true))
            c->awaiting = false; /* the new process took them all */
    } else if (!strcmp(channel, "iopub") && !strcmp(type, "status") && state) {
        reqs[i].got_busy = reqs[i].got_busy || !strcmp(state, "busy");
        reqs[i].got_idle = reqs[i].got_idle || !strcmp(state, "idle");
    }
    return fn ? fn(ctx, i, type, content, &k->bufs) : CX_OK;
}

enum cx_err
cx_kernel_wait(struct cx_kernel_conn *c, struct cx_exec *reqs, int n, int need, int64_t deadline_us,
               cx_exec_fn fn, void *ctx)
{
    enum cx_ws_opcode op;
    enum cx_err rc;

    while (!all_done(reqs, need)) {
        struct kmsg k;
        int64_t until = deadline_us;

        if (c->awaiting && !c->reached) {
            if (cx_now_us() >= c->await_end_us) {
                c->awaiting = false;
                return CX_ERR_KERNEL_DIED; /* no answer from a new process */
            }
            if (cx_now_us() >= c->nudge_due_us) {
                rc = send_kernel_info(c, "shell", c->nudges[c->nnudges++ % NUDGES_KEPT]);
                if (rc == CX_OK)
                    rc = send_kernel_info(c, "control", c->nudges[c->nnudges++ % NUDGES_KEPT]);
                if (rc)
                    return rc;
                c->nudge_due_us = cx_now_us() + NUDGE_EVERY_US;
            }
            until = c->nudge_due_us < deadline_us ? c->nudge_due_us : deadline_us;
        }
        rc = cx_ws_recv(c->ws, until, &c->msg, &op);
        if (rc == CX_ERR_TIMEOUT && until < deadline_us)
            continue; /* the next nudge */
        if (rc == CX_ERR_TOO_LARGE && !cx_ws_alive(c->ws))
            return CX_ERR_IO; /* the connection died of it: nothing was skipped */
        if (rc && rc != CX_ERR_TOO_LARGE)
            return rc;
        c->messages++;
        if (rc == CX_OK)
            rc = kmsg_read(c, op, &k);
        if (rc == CX_ERR_PROTOCOL)
            continue; /* not a message */
        /* A message too large to keep was skipped (a huge stream chunk), or
         * holds too many values to build: it can only be output, so it is
         * reported as such. */
        if (rc == CX_ERR_TOO_LARGE) {
            rc = fn ? fn(ctx, -1, "oversized", NULL, NULL) : CX_OK;
        } else {
            rc = dispatch(c, reqs, n, &k, fn, ctx);
            kmsg_cleanup(&k);
        }
        if (rc == CX_ERR_KERNEL_DIED)
            c->live = false;
        if (rc)
            return rc;
    }
    for (int i = 0; i < need && !c->restarted; i++)
        c->live = c->live || reqs[i].got_idle;
    return CX_OK;
}

void
cx_exec_cleanup(struct cx_exec *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        json_decref(reqs[i].reply);
        reqs[i].reply = NULL;
    }
}

enum cx_drain
cx_kernel_listen(struct cx_kernel_conn *c, int ms, unsigned max_messages, uint64_t max_bytes)
{
    int64_t deadline = cx_now_us() + ms * 1000LL;
    uint64_t start = cx_ws_bytes_in(c->ws);
    unsigned n = 0;
    enum cx_drain d = CX_DRAIN_QUIET;
    enum cx_ws_opcode op;

    while (cx_now_us() < deadline) {
        enum cx_err rc = cx_ws_recv(c->ws, deadline, &c->msg, &op);

        if (rc == CX_ERR_TIMEOUT)
            continue; /* (the loop's test ends it) */
        if (rc != CX_OK && rc != CX_ERR_TOO_LARGE) {
            d = CX_DRAIN_FAILED;
            break;
        }
        heard(c, rc, op);
        cx_metrics_count(CX_COUNT_GATEWAY_STALE);
        if (++n > max_messages || cx_ws_bytes_in(c->ws) - start > max_bytes) {
            d = CX_DRAIN_TALKING;
            break;
        }
    }
    /* (a message still arriving at the deadline counts by its bytes) */
    if (d == CX_DRAIN_QUIET && cx_ws_bytes_in(c->ws) - start > max_bytes)
        d = CX_DRAIN_TALKING;
    cx_buf_shrink(&c->msg, MSG_KEEP_ALLOC);
    return d;
}

enum cx_drain
cx_kernel_drain(struct cx_kernel_conn *c, int wait_ms)
{
    int64_t deadline = cx_now_us() + wait_ms * 1000LL, until = deadline + DRAIN_BUDGET_US;
    uint64_t start = cx_ws_bytes_in(c->ws);
    enum cx_drain d = CX_DRAIN_TALKING;
    enum cx_ws_opcode op;

    /* Reads while messages are there to read without waiting (after the
     * first wait_ms), within a budget of messages, bytes and time: a
     * kernel whose background thread prints forever never holds the
     * caller, and is told apart from one that went quiet. Quiet means no
     * byte came in the last look: a message still arriving is talk. */
    for (int i = 0; i < DRAIN_MAX; i++) {
        uint64_t before = cx_ws_bytes_in(c->ws);
        enum cx_err rc = cx_ws_recv(c->ws, i == 0 ? deadline : cx_now_us(), &c->msg, &op);

        if (rc == CX_ERR_TIMEOUT && cx_ws_bytes_in(c->ws) == before) {
            d = CX_DRAIN_QUIET;
            break;
        }
        if (rc != CX_OK && rc != CX_ERR_TOO_LARGE && rc != CX_ERR_TIMEOUT) {
            d = CX_DRAIN_FAILED;
            break;
        }
        if (rc != CX_ERR_TIMEOUT) {
            heard(c, rc, op);
            cx_metrics_count(CX_COUNT_GATEWAY_STALE);
        }
        if (cx_ws_bytes_in(c->ws) - start > DRAIN_MAX_BYTES || cx_now_us() > until)
            break;
    }
    cx_buf_shrink(&c->msg, MSG_KEEP_ALLOC); /* after a large message */
    return d;
}
