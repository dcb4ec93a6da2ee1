/* The gateway client (REST + WebSocket + Jupyter messaging) against the
 * suite's real Jupyter server. */
#include <curl/curl.h>
#include <sodium.h>
#include <unistd.h>

#include "../../lib/buf.h"
#include "../../lib/gateway.h"
#include "../../lib/kernel.h"
#include "../../lib/log.h"
#include "../../lib/runend.h"
#include "../../lib/runexec.h"
#include "../../lib/util.h"
#include "../../lib/ws.h"
#include "tap.h"

struct seen {
    int streams, errors, results, statuses;
    char text[256];
    size_t nbufs, buflen[CX_KERNEL_MAX_BUFFERS];
    unsigned char bufsha[CX_KERNEL_MAX_BUFFERS][crypto_hash_sha256_BYTES];
};

static enum cx_err
on_msg(void *ctx, int index, const char *type, json_t *content,
       const struct cx_kernel_buffers *bufs)
{
    struct seen *s = ctx;
    (void)index;
    for (size_t i = 0; bufs && i < bufs->n; i++) {
        s->buflen[i] = bufs->len[i];
        crypto_hash_sha256(s->bufsha[i], bufs->data[i], bufs->len[i]);
    }
    if (bufs && bufs->n)
        s->nbufs = bufs->n;
    if (!strcmp(type, "stream")) {
        s->streams++;
        snprintf(s->text + strlen(s->text), sizeof(s->text) - strlen(s->text), "%s",
                 json_string_value(json_object_get(content, "text")));
    } else if (!strcmp(type, "error")) {
        s->errors++;
    } else if (!strcmp(type, "execute_result")) {
        s->results++;
    } else if (!strcmp(type, "status")) {
        s->statuses++;
    }
    return CX_OK;
}

static enum cx_err
exec1(struct cx_kernel_conn *c, const char *code, int64_t deadline, struct seen *s,
      struct cx_exec *e)
{
    enum cx_err rc;

    memset(e, 0, sizeof(*e));
    e->code = code;
    e->store_history = true;
    rc = cx_kernel_execute(c, e);
    if (rc)
        return rc;
    return cx_kernel_wait(c, e, 1, 1, deadline, on_msg, s);
}

/* Executes x=1 n times; returns how many took 30 ms or more (delayed-ACK
 * stalls: a tuned client takes a few ms here). */
static int
count_stalls(struct cx_kernel_conn *c, int n, double *median_ms)
{
    double t[64];
    int stalls = 0;

    for (int i = 0; i < n; i++) {
        struct cx_exec e;
        struct seen s = {0};
        int64_t t0 = cx_now_us();
        if (exec1(c, "x=1", cx_now_us() + 10000000, &s, &e)) {
            cx_exec_cleanup(&e, 1); /* (a reply may have come before the error) */
            return -1;
        }
        t[i] = (double)(cx_now_us() - t0) / 1000.0;
        cx_exec_cleanup(&e, 1);
        if (t[i] >= 30.0)
            stalls++;
    }
    for (int i = 0; i < n; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *median_ms = t[n / 2];
    return stalls;
}

/* Binary frames as a hostile kernel or gateway could shape them. */
static void
split(void)
{
    static const struct {
        const char *frame;
        size_t len;
        enum cx_err want;
        const char *what;
    } cases[] = {
        {"\0\0\0\1\0\0\0\x08{}", 10, CX_OK, "JSON alone"},
        {"\0\0\0\2\0\0\0\x0c\0\0\0\x0e{}ab", 16, CX_OK, "JSON and a buffer"},
        {"\0\0\0\2\0\0\0\x0c\0\0\0\x0e{}", 14, CX_OK, "an empty buffer at the end"},
        {"\0\0\0\0\0\0\0\x04", 8, CX_ERR_PROTOCOL, "no parts"},
        {"\0\0\0\1\0\0\0\x08", 8, CX_ERR_PROTOCOL, "no JSON"},
        {"\0\0\0\1\0\0\0\x09{}", 10, CX_ERR_PROTOCOL, "JSON not right after the offsets"},
        {"\0\0\0\2\0\0\0\x0c\0\0\0\x40{}ab", 16, CX_ERR_PROTOCOL, "an offset past the end"},
        {"\0\0\0\3\0\0\0\x10\0\0\0\x14\0\0\0\x12{}{}ab", 22, CX_ERR_PROTOCOL,
         "offsets out of order"},
        {"\0\0\0\x06\0\0\0\x1c", 8, CX_ERR_PROTOCOL, "more buffers than kept"},
        {"\xff\xff\xff\xff\0\0\0\x08", 8, CX_ERR_PROTOCOL, "a count near 2^32"},
        {"\0\0\0\1\0\0", 6, CX_ERR_PROTOCOL, "shorter than its header"},
        {"\0\0\0\x02\0\0\0\x0c", 8, CX_ERR_PROTOCOL, "offsets cut off"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct cx_kernel_buffers b;
        const char *json = NULL;
        size_t jlen = 0;
        enum cx_err rc = cx_kernel_split_binary((const unsigned char *)cases[i].frame, cases[i].len,
                                                &json, &jlen, &b);
        is_int(rc, cases[i].want, "binary frame: %s", cases[i].what);
        if (rc == CX_OK)
            ok(jlen == 2 && !memcmp(json, "{}", 2) && b.n == (cases[i].len == 10 ? 0u : 1u) &&
                   (b.n == 0 || b.len[0] == cases[i].len - 14),
               "  its JSON and buffers are where the offsets say");
    }
}

/* One unmasked text frame (the server's side) of text into b. */
static void
frame_op(struct cx_buf *b, unsigned char op, const char *text, size_t len)
{
    unsigned char h[10] = {(unsigned char)(0x80 | op)};
    size_t hl = 2;

    if (len < 126) {
        h[1] = (unsigned char)len;
    } else if (len < 65536) {
        h[1] = 126;
        h[2] = (unsigned char)(len >> 8);
        h[3] = (unsigned char)len;
        hl = 4;
    } else {
        h[1] = 127;
        for (int i = 0; i < 8; i++)
            h[2 + i] = (unsigned char)(len >> (56 - 8 * i));
        hl = 10;
    }
    cx_buf_add(b, h, hl);
    cx_buf_add(b, text, len);
}

static void
frame(struct cx_buf *b, const char *text, size_t len)
{
    frame_op(b, CX_WS_TEXT, text, len);
}

static void
put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A v1 message (the channel, the four JSON parts, parent the parent
 * header's, and a buffer or none) into b: the frame's bytes alone, or
 * (framed) as a binary frame. */
static void
v1_message_to(struct cx_buf *b, const char *parent, const char *channel, const char *type,
              const char *content, const char *buf, size_t buf_len, bool framed)
{
    char header[128];
    const char *part[6] = {channel, header, parent, "{}", content, buf};
    size_t len[6], n = buf ? 6 : 5, total = 8 * (n + 2);
    unsigned char *f;

    snprintf(header, sizeof(header), "{\"msg_type\":\"%s\",\"msg_id\":\"m\"}", type);
    for (size_t i = 0; i < n; i++)
        total += len[i] = i == 5 ? buf_len : strlen(part[i]);
    f = malloc(total);
    if (!f)
        return; /* (the test fails on what is missing) */
    put_le64(f, n + 1);
    for (size_t i = 0, at = 8 * (n + 2); i <= n; i++) {
        put_le64(f + 8 * (i + 1), at);
        if (i < n) {
            memcpy(f + at, part[i], len[i]);
            at += len[i];
        }
    }
    if (framed)
        frame_op(b, CX_WS_BINARY, (const char *)f, total);
    else
        cx_buf_add(b, f, total);
    free(f);
}

static void
v1_message(struct cx_buf *b, const char *channel, const char *type, const char *content,
           const char *buf, size_t buf_len, bool framed)
{
    v1_message_to(b, "{\"msg_id\":\"req-1\"}", channel, type, content, buf, buf_len, framed);
}

/* v1 frames: the split's checks, then a run's messages read as a run does
 * (a text frame on a v1 connection is not a message). */
static void
v1(void)
{
    struct cx_buf ok_frame, frames;
    struct cx_kernel_v1 v;
    struct cx_kernel_conn *c = NULL;
    struct cx_exec e = {.sent = true};
    struct seen s = {0};
    enum cx_err rc;

    cx_buf_init(&ok_frame, 1 << 20);
    cx_buf_init(&frames, 1 << 20);
    v1_message(&ok_frame, "iopub", "stream", "{}", "ab", 2, false);
    need(!cx_buf_err(&ok_frame), "v1: a frame built");
    {
        unsigned char *f = (unsigned char *)ok_frame.data;
        size_t len = ok_frame.len;
        cx_buf_add(&ok_frame, "x", 1); /* (len stays the frame's) */
        f = (unsigned char *)ok_frame.data;
        is_int(cx_kernel_split_v1(f, len + 1, &v), CX_ERR_PROTOCOL,
               "v1: bytes after the last part");
        ok(cx_kernel_split_v1(f, len, &v) == CX_OK && v.channel_len == 5 &&
               !memcmp(v.channel, "iopub", 5) && v.part_len[3] == 2 && v.bufs.n == 1 &&
               v.bufs.len[0] == 2 && !memcmp(v.bufs.data[0], "ab", 2),
           "v1: the channel, the parts and the buffer where the offsets say");
        is_int(cx_kernel_split_v1(f, 7, &v), CX_ERR_PROTOCOL, "v1: shorter than its count");
        is_int(cx_kernel_split_v1(f, 40, &v), CX_ERR_PROTOCOL, "v1: offsets cut off");
        is_int(cx_kernel_split_v1(f, len - 1, &v), CX_ERR_PROTOCOL, "v1: the last part cut off");
        put_le64(f, 5);
        is_int(cx_kernel_split_v1(f, len, &v), CX_ERR_PROTOCOL, "v1: fewer than four parts");
        put_le64(f, 6 + CX_KERNEL_MAX_BUFFERS + 1);
        is_int(cx_kernel_split_v1(f, len, &v), CX_ERR_PROTOCOL, "v1: more buffers than kept");
        put_le64(f, UINT64_MAX);
        is_int(cx_kernel_split_v1(f, len, &v), CX_ERR_PROTOCOL, "v1: a count near 2^64");
        put_le64(f, 7);
        put_le64(f + 8, 8 * 7);
        is_int(cx_kernel_split_v1(f, len, &v), CX_ERR_PROTOCOL,
               "v1: the channel not right after the offsets");
        put_le64(f + 8, 8 * 8);
        put_le64(f + 24, 8 * 8 + 2);
        is_int(cx_kernel_split_v1(f, len, &v), CX_ERR_PROTOCOL, "v1: offsets out of order");
    }
    frame(&frames, "{\"channel\":\"iopub\"}", 20);
    /* a server's notice has an empty parent; one whose parent header is
     * not an object is not a message at all */
    v1_message_to(&frames, "[]", "iopub", "status", "{\"execution_state\":\"restarting\"}", NULL, 0,
                  true);
    v1_message(&frames, "iopub", "stream", "{\"name\":\"stdout\",\"text\":\"v1 out\"}", NULL, 0,
               true);
    v1_message(&frames, "iopub", "display_data", "{\"data\":{}}", "\0\1bin", 5, true);
    v1_message(&frames, "iopub", "stream", "{\"name\":\"stdout\",\"text\":\"\xff!\"}", NULL, 0,
               true);
    v1_message(&frames, "shell", "execute_reply", "{\"status\":\"ok\"}", NULL, 0, true);
    v1_message(&frames, "iopub", "status", "{\"execution_state\":\"idle\"}", NULL, 0, true);
    snprintf(e.msg_id, sizeof(e.msg_id), "req-1");
    rc = cx_buf_err(&frames) ? cx_buf_err(&frames)
                             : cx_kernel_conn_buffered(frames.data, frames.len, true, &c);
    is_int(rc, CX_OK, "v1: the frames");
    if (rc == CX_OK) {
        is_int(cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 5000000, on_msg, &s), CX_OK,
               "v1: the run ends");
        is_str(s.text, "v1 out\xef\xbf\xbd!", "v1: its output read, invalid UTF-8 replaced");
        is_int((long)cx_kernel_conn_notices(c), 0, "v1: a parent header not an object: no notice");
        ok(s.nbufs == 1 && s.buflen[0] == 5, "v1: the buffer read");
        ok(e.got_reply && e.got_idle &&
               !strcmp(json_string_value(json_object_get(e.reply, "status")), "ok"),
           "v1: reply and idle");
    }
    cx_exec_cleanup(&e, 1);
    cx_kernel_conn_free(c);
    c = NULL;
    /* the same frames on a connection that did not select v1 (a proxy that
     * dropped the server's answer): none is taken for a message */
    memset(&e, 0, sizeof(e));
    e.sent = true;
    snprintf(e.msg_id, sizeof(e.msg_id), "req-1");
    memset(&s, 0, sizeof(s));
    if (cx_kernel_conn_buffered(frames.data, frames.len, false, &c) == CX_OK)
        ok(cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 2000000, on_msg, &s) != CX_OK &&
               !e.got_reply && !s.text[0],
           "v1 frames on a JSON connection: not messages");
    else
        ok(false, "v1 frames on a JSON connection: the connection");
    cx_exec_cleanup(&e, 1);
    cx_kernel_conn_free(c);
    cx_buf_cleanup(&frames);
    cx_buf_cleanup(&ok_frame);
}

static void
message(struct cx_buf *b, bool v1, const char *channel, const char *type, const char *content)
{
    struct cx_buf m;

    if (v1) {
        v1_message(b, channel, type, content, NULL, 0, true);
        return;
    }
    cx_buf_init(&m, 16u << 20);
    cx_buf_addf(&m,
                "{\"channel\":\"%s\",\"header\":{\"msg_type\":\"%s\"},"
                "\"parent_header\":{\"msg_id\":\"req-1\"},\"metadata\":{},\"content\":",
                channel, type);
    cx_buf_adds(&m, content);
    cx_buf_adds(&m, "}");
    frame(b, m.data, m.len);
    cx_buf_cleanup(&m);
}

struct costly_seen {
    int oversized, streams;
};

static enum cx_err
on_costly(void *ctx, int index, const char *type, json_t *content,
          const struct cx_kernel_buffers *bufs)
{
    struct costly_seen *s = ctx;
    (void)index, (void)content, (void)bufs;
    s->oversized += !strcmp(type, "oversized");
    s->streams += !strcmp(type, "stream");
    return CX_OK;
}

/* A message of tiny containers a kernel could send (a display of a deep
 * list): skipped unbuilt, told as oversized output; the run's messages
 * around it go on. */
static void
costly(bool v1)
{
    struct cx_buf frames, deep;
    struct cx_kernel_conn *c = NULL;
    struct cx_exec e = {.sent = true};
    struct costly_seen seen = {0};
    enum cx_err rc;

    cx_buf_init(&frames, 64u << 20);
    cx_buf_init(&deep, 16u << 20);
    cx_buf_adds(&deep, "{\"data\":{\"application/json\":[");
    for (int i = 0; i < 200000; i++)
        cx_buf_adds(&deep, i ? ",[]" : "[]");
    cx_buf_adds(&deep, "]}}");
    if (cx_buf_err(&deep)) { /* (a failed allocation: nothing to send) */
        ok(false, "costly: the deep list is built");
        cx_buf_cleanup(&deep);
        cx_buf_cleanup(&frames);
        return;
    }
    message(&frames, v1, "iopub", "display_data", deep.data);
    message(&frames, v1, "iopub", "stream", "{\"name\":\"stdout\",\"text\":\"after\"}");
    message(&frames, v1, "shell", "execute_reply", "{\"status\":\"ok\"}");
    message(&frames, v1, "iopub", "status", "{\"execution_state\":\"idle\"}");
    snprintf(e.msg_id, sizeof(e.msg_id), "req-1");
    rc = cx_buf_err(&frames) ? cx_buf_err(&frames)
                             : cx_kernel_conn_buffered(frames.data, frames.len, v1, &c);
    is_int(rc, CX_OK, "costly (%s): the frames", v1 ? "v1" : "JSON");
    if (rc == CX_OK) {
        rc = cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 5000000, on_costly, &seen);
        is_int(rc, CX_OK, "costly (%s): the run ends", v1 ? "v1" : "JSON");
        is_int(seen.oversized, 1, "costly: 200,000 containers told as oversized, unbuilt");
        is_int(seen.streams, 1, "costly: the output after it arrives");
        ok(e.got_reply && e.got_idle, "costly: reply and idle");
    }
    cx_exec_cleanup(&e, 1);
    cx_kernel_conn_free(c);
    cx_buf_cleanup(&frames);
    cx_buf_cleanup(&deep);
}

/* Executes, errors and binary buffers both ways on c, which speaks the
 * protocol named proto. */
static void
basics(struct cx_kernel_conn *c, const char *proto)
{
    struct cx_exec e;
    struct seen s;

    memset(&s, 0, sizeof(s));
    ok(exec1(c, "print('hi')\n6*7", cx_now_us() + 60000000, &s, &e) == CX_OK, "%s: execute", proto);
    ok(s.streams == 1 && !strcmp(s.text, "hi\n"), "stream seen");
    is_int(s.results, 1, "execute_result seen");
    ok(e.got_reply && e.got_idle, "reply and idle both arrived");
    is_str(json_string_value(json_object_get(e.reply, "status")), "ok", "reply status");
    cx_exec_cleanup(&e, 1);

    memset(&s, 0, sizeof(s));
    ok(exec1(c, "1/0", cx_now_us() + 10000000, &s, &e) == CX_OK, "%s: execute an error", proto);
    is_int(s.errors, 1, "error message seen");
    is_str(json_string_value(json_object_get(e.reply, "ename")), "ZeroDivisionError", "ename");
    cx_exec_cleanup(&e, 1);

    /* buffers reach us in binary frames, byte for byte (the capture's way) */
    memset(&s, 0, sizeof(s));
    ok(exec1(c,
             "p = get_ipython().display_pub\n"
             "p.session.send(p.pub_socket, 'display_data', {'data': {'text/plain': 'b'}, "
             "'metadata': {}, 'transient': {}}, parent=p.parent_header, ident=p.topic, "
             "buffers=[b'\\x00\\x01bin', bytes(range(256)) * 4096])",
             cx_now_us() + 60000000, &s, &e) == CX_OK,
       "%s: a message with two buffers", proto);
    {
        unsigned char want[2][crypto_hash_sha256_BYTES], big[1 << 20];
        for (size_t i = 0; i < sizeof(big); i++)
            big[i] = (unsigned char)i;
        crypto_hash_sha256(want[0], (const unsigned char *)"\0\1bin", 5);
        crypto_hash_sha256(want[1], big, sizeof(big));
        is_int(s.nbufs, 2, "both buffers arrive");
        ok(s.buflen[0] == 5 && s.buflen[1] == sizeof(big) &&
               !memcmp(s.bufsha[0], want[0], sizeof(want[0])) &&
               !memcmp(s.bufsha[1], want[1], sizeof(want[1])),
           "with their bytes");
    }
    cx_exec_cleanup(&e, 1);

    /* bytes that are not UTF-8 (a file name's, through surrogateescape)
     * go out as they are: read with U+FFFD in their place, output and
     * error alike, and the reply still comes */
    memset(&s, 0, sizeof(s));
    ok(exec1(c,
             "n = b'a\\xff\\xe2\\x82b'.decode('utf-8', 'surrogateescape')\n"
             "print(n)\n"
             "raise ValueError(n)",
             cx_now_us() + 10000000, &s, &e) == CX_OK,
       "%s: output and an error that are not UTF-8", proto);
    /* (one U+FFFD for the byte, one for the sequence cut short: Python's
     * "replace", which the JSON protocol's server decodes with) */
    is_str(s.text,
           "a\xef\xbf\xbd\xef\xbf\xbd"
           "b\n",
           "%s: its output read, U+FFFD in place", proto);
    ok(e.got_reply && s.errors == 1 &&
           !strcmp(json_string_value(json_object_get(e.reply, "evalue")),
                   "a\xef\xbf\xbd\xef\xbf\xbd"
                   "b"),
       "%s: its error and reply read", proto);
    cx_exec_cleanup(&e, 1);

    /* a buffer sent with a request reaches the kernel byte for byte (the
     * inputs' and the file API's way) */
    {
        static const char bytes[] = "\x00\xffsent\x01";
        memset(&s, 0, sizeof(s));
        memset(&e, 0, sizeof(e));
        e.code = "print(bytes(get_ipython().kernel.get_parent('shell')['buffers'][0]).hex())";
        e.buffer = bytes;
        e.buffer_len = sizeof(bytes) - 1;
        ok(cx_kernel_execute(c, &e) == CX_OK &&
               cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 10000000, on_msg, &s) == CX_OK,
           "%s: a request with a buffer", proto);
        is_str(s.text, "00ff73656e7401\n", "%s: its bytes arrived", proto);
        cx_exec_cleanup(&e, 1);
    }
}

int
main(void)
{
    const char *url = getenv("CODEXEC_TEST_GATEWAY_URL"),
               *token = getenv("CODEXEC_TEST_GATEWAY_TOKEN");
    struct cx_gateway *gw = NULL;
    struct cx_kernel_conn *c = NULL, *plain = NULL, *again = NULL;
    struct cx_exec e;
    struct seen s;
    char msg[256], kid[64];
    json_t *specs = NULL;
    enum cx_err rc;

    if (!url || !token) {
        printf("Bail out! CODEXEC_TEST_GATEWAY_URL/TOKEN not set: run through packaging/quickstart "
               "test\n");
        return 1;
    }
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) || cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    split();
    v1();
    costly(false);
    costly(true);
    need(cx_gateway_new(url, token, &gw) == CX_OK, "gateway handle");
    ok(cx_gateway_ping(gw, msg, sizeof(msg)) == CX_OK, "GET /api/kernelspecs");
    ok(cx_gateway_kernelspecs(gw, &specs) == CX_OK &&
           json_object_get(json_object_get(specs, "kernelspecs"), "python3-sandbox"),
       "the sandboxed kernelspec is listed");
    json_decref(specs);

    rc = cx_gateway_kernel_start(gw, "python3-sandbox", kid, msg, sizeof(msg));
    ok(rc == CX_OK, "kernel started (%s)", rc ? msg : "ok");
    if (rc)
        return tap_done();
    ok(cx_gateway_kernel_get(gw, kid, NULL) == CX_OK, "kernel known");
    {
        char other[64];
        ok(cx_gateway_kernel_start(gw, "no-such-spec", other, msg, sizeof(msg)) != CX_OK,
           "an unknown kernelspec fails");
    }
    is_int(cx_gateway_kernel_get(gw, "../../etc", NULL), CX_ERR_INVALID,
           "path tricks in ids refused");

    need(cx_kernel_conn_open(url, token, kid, CX_KERNEL_LEGACY, &c, msg, sizeof(msg)) == CX_OK,
         "channels open, the JSON protocol");
    ok(!cx_kernel_conn_v1(c), "  the JSON protocol spoken");
    basics(c, "JSON");
    cx_kernel_conn_free(c);
    need(cx_kernel_conn_open(url, token, kid, 0, &c, msg, sizeof(msg)) == CX_OK,
         "channels open, v1 offered");
    ok(cx_kernel_conn_v1(c), "  the server selected v1 (jupyter_server 1.18 and later)");
    basics(c, "v1");

    /* the run's epilogue: a token is data, whatever its characters; the
     * first call does not know it, the next does (without the source: the
     * kernel kept the epilogue) */
    for (int i = 0; i < 2; i++) {
        json_t *meta = json_object(), *ue = cx_runend_expr("k'\"\\\n)#", false, meta, i == 0), *a;
        memset(&s, 0, sizeof(s));
        memset(&e, 0, sizeof(e));
        e.code = "";
        e.user_expressions = ue;
        e.metadata = meta;
        ok(ue && cx_kernel_execute(c, &e) == CX_OK &&
               cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 10000000, on_msg, &s) == CX_OK,
           "epilogue %d evaluated", i + 1);
        a = cx_runend_answer(&e);
        ok(a && json_is_boolean(json_object_get(a, "known")) &&
               json_is_true(json_object_get(a, "known")) == (i == 1) &&
               json_is_null(json_object_get(a, "done")),
           "  it answers known=%s, no capture", i ? "true" : "false");
        json_decref(a);
        e.user_expressions = e.metadata = NULL;
        cx_exec_cleanup(&e, 1);
        json_decref(ue);
        json_decref(meta);
    }
    memset(&s, 0, sizeof(s));
    ok(exec1(c, "import sys; print(sys._codexec_kernel == 'k\\'\"\\\\\\n)#')",
             cx_now_us() + 10000000, &s, &e) == CX_OK &&
           !strcmp(s.text, "True\n"),
       "the token arrived as written (%s)", s.text);
    cx_exec_cleanup(&e, 1);

    /* a kernel that lost the epilogue (restarted, or user code cleared it)
     * and a request without its source: it answers that it needs it, having
     * done nothing, and the run is not taken as carried */
    memset(&s, 0, sizeof(s));
    ok(exec1(c, "import sys; [delattr(sys, a) for a in dir(sys) if a.startswith('_codexec_epi')]",
             cx_now_us() + 10000000, &s, &e) == CX_OK,
       "the kept epilogue cleared");
    cx_exec_cleanup(&e, 1);
    {
        json_t *meta = json_object(), *ue = cx_runend_expr("other", false, meta, false);
        memset(&e, 0, sizeof(e));
        e.code = "";
        e.user_expressions = ue;
        e.metadata = meta;
        ok(ue && cx_kernel_execute(c, &e) == CX_OK &&
               cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 10000000, on_msg, &s) == CX_OK &&
               e.got_reply,
           "an epilogue without its source, evaluated");
        ok(!cx_runend_carried(&e), "  it did not carry the run (it needs its source)");
        e.user_expressions = e.metadata = NULL;
        cx_exec_cleanup(&e, 1);
        json_decref(ue);
        json_decref(meta);
    }
    memset(&s, 0, sizeof(s));
    ok(exec1(c, "import sys; print(sys._codexec_kernel != 'other')", cx_now_us() + 10000000, &s,
             &e) == CX_OK &&
           !strcmp(s.text, "True\n"),
       "  and set no token");
    cx_exec_cleanup(&e, 1);

    /* a NUL in what the kernel sends does not lose the message */
    memset(&s, 0, sizeof(s));
    ok(exec1(c, "raise ValueError('x\\x00y')", cx_now_us() + 10000000, &s, &e) == CX_OK,
       "an error with a NUL in its message ends the wait");
    ok(e.got_reply && s.errors == 1, "its reply and its error message arrived");
    cx_exec_cleanup(&e, 1);

    /* pipelining: three requests in flight, answered in order */
    {
        struct cx_exec r[3] = {{.code = "a = 1"}, {.code = "a += 1"}, {.code = "print(a)"}};
        memset(&s, 0, sizeof(s));
        for (int i = 0; i < 3; i++)
            ok(cx_kernel_execute(c, &r[i]) == CX_OK, "pipelined send %d", i);
        ok(cx_kernel_wait(c, r, 3, 3, cx_now_us() + 10000000, on_msg, &s) == CX_OK,
           "all three complete");
        is_str(s.text, "2\n", "in order");
        cx_exec_cleanup(r, 3);
    }

    /* interrupt */
    memset(&s, 0, sizeof(s));
    memset(&e, 0, sizeof(e));
    e.code = "import time\ntime.sleep(30)";
    ok(cx_kernel_execute(c, &e) == CX_OK, "send a long cell");
    is_int(cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 500000, on_msg, &s), CX_ERR_TIMEOUT,
           "the wait times out");
    ok(cx_gateway_kernel_interrupt(gw, kid) == CX_OK, "interrupt (message mode)");
    ok(cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 10000000, on_msg, &s) == CX_OK,
       "the wait resumes and completes");
    is_str(json_string_value(json_object_get(e.reply, "ename")), "KeyboardInterrupt",
           "interrupted");
    cx_exec_cleanup(&e, 1);

    /* listening to an idle kernel: quiet; one whose thread prints on after
     * its cell: talking (the reaper's hearing of a suspected talker) */
    ok(cx_kernel_listen(c, 300, 64, 1u << 20) == CX_DRAIN_QUIET, "an idle kernel is heard quiet");
    memset(&s, 0, sizeof(s));
    ok(exec1(c,
             "import threading, time\n"
             "def _talk():\n"
             "    t = time.time()\n"
             "    while time.time() - t < 2:\n"
             "        print('x' * 16384, flush=True)\n"
             "        time.sleep(0.001)\n"
             "threading.Thread(target=_talk, daemon=True).start()",
             cx_now_us() + 10000000, &s, &e) == CX_OK,
       "a thread that prints after its cell");
    cx_exec_cleanup(&e, 1);
    ok(cx_kernel_listen(c, 300, 64, 1u << 20) == CX_DRAIN_TALKING, "  is heard talking");
    usleep(2500000);
    {
        /* what the server and the proxy still hold of it drains meanwhile */
        enum cx_drain d = CX_DRAIN_TALKING;

        for (int64_t until = cx_now_us() + 30000000; d != CX_DRAIN_QUIET && cx_now_us() < until;)
            d = cx_kernel_listen(c, 300, 64, 1u << 20);
        ok(d == CX_DRAIN_QUIET, "  and quiet once it ended");
    }

    /* delayed ACKs: the tuned client re-arms quick-ACK mode after every
     * read (checked by its count, not by time: a loaded machine stalls
     * either client); the stalls of both, straight to the Jupyter server
     * (a proxy in between has stalls of its own), are printed as figures */
    {
        const char *direct = getenv("CODEXEC_TEST_GATEWAY_DIRECT_URL");
        struct cx_kernel_conn *tc = NULL;
        double tuned_ms = 0, plain_ms = 0;
        int tuned, plain_stalls;
        uint64_t reads0, acks0;

        if (!direct || !*direct)
            direct = url;
        need(cx_kernel_conn_open(direct, token, kid, 0, &tc, msg, sizeof(msg)) == CX_OK,
             "a tuned connection");
        need(cx_kernel_conn_open(direct, token, kid, CX_KERNEL_PLAIN, &plain, msg, sizeof(msg)) ==
                 CX_OK,
             "a plain (delayed-ACK) connection");
        count_stalls(tc, 5, &tuned_ms); /* warm up */
        reads0 = cx_kernel_conn_reads(tc);
        acks0 = cx_kernel_conn_quickacks(tc);
        tuned = count_stalls(tc, 40, &tuned_ms);
        plain_stalls = count_stalls(plain, 40, &plain_ms);
        printf("# x=1 over 40 executes: tuned client %d stalls >= 30 ms (median %.1f ms), "
               "plain client %d stalls (median %.1f ms)\n",
               tuned, tuned_ms, plain_stalls, plain_ms);
        ok(tuned >= 0 && plain_stalls >= 0, "both clients complete 40 executes");
        ok(cx_kernel_conn_reads(tc) - reads0 >= 40 &&
               cx_kernel_conn_quickacks(tc) - acks0 == cx_kernel_conn_reads(tc) - reads0,
           "the tuned client re-armed TCP_QUICKACK after each of its %llu reads (%llu)",
           (unsigned long long)(cx_kernel_conn_reads(tc) - reads0),
           (unsigned long long)(cx_kernel_conn_quickacks(tc) - acks0));
        ok(cx_kernel_conn_reads(plain) >= 40 && cx_kernel_conn_quickacks(plain) == 0,
           "the plain client never set it");
        cx_kernel_conn_free(tc);
        cx_kernel_conn_free(plain);
    }

    /* pooling */
    cx_kernel_conn_put(c);
    ok(cx_kernel_conn_get(url, token, kid, &again, msg, sizeof(msg)) == CX_OK &&
           cx_kernel_conn_messages(again) > 0,
       "the pooled connection comes back");
    c = again;

    /* restart through the API (no connection hears of it): the pooled
     * connection that heard the old process is confirmed live again before
     * it carries output, and the first cell's output arrives */
    ok(cx_gateway_kernel_restart(gw, kid) == CX_OK, "restart");
    ok(cx_kernel_confirm(c, true, cx_now_us() + 30000000) == CX_OK,
       "the old connection is confirmed live on the new process");
    memset(&s, 0, sizeof(s));
    rc = exec1(c, "print('a' in globals())", cx_now_us() + 10000000, &s, &e);
    cx_exec_cleanup(&e, 1);
    ok(rc == CX_OK && !strcmp(s.text, "False\n"),
       "a restarted kernel has no state, and its first output is not lost (%zu bytes)",
       strlen(s.text));

    /* a death the gateway's restarter answers: a second (pooled)
     * connection hears the server's notice in its backlog, and is
     * confirmed again before it is trusted */
    {
        struct cx_kernel_conn *c2 = NULL;

        need(cx_kernel_conn_open(url, token, kid, 0, &c2, msg, sizeof(msg)) == CX_OK,
             "a second connection");
        ok(cx_kernel_confirm(c2, true, cx_now_us() + 30000000) == CX_OK &&
               !cx_kernel_conn_restarted(c2),
           "  confirmed");
        memset(&s, 0, sizeof(s));
        is_int(exec1(c, "a = 1\nimport os\nos._exit(1)", cx_now_us() + 30000000, &s, &e),
               CX_ERR_KERNEL_DIED, "a cell that kills its kernel: the server's notice");
        cx_exec_cleanup(&e, 1);
        /* (c's cell's output comes first: it is every connection's) */
        for (int64_t until = cx_now_us() + 10000000;
             !cx_kernel_conn_restarted(c2) && cx_now_us() < until;)
            (void)cx_kernel_drain(c2, 200);
        ok(cx_kernel_conn_restarted(c2), "  heard by the other connection too");
        ok(cx_kernel_confirm(c2, false, cx_now_us() + 30000000) == CX_OK &&
               !cx_kernel_conn_restarted(c2),
           "  which is confirmed live again, though codexec did not restart the kernel");
        memset(&s, 0, sizeof(s));
        rc = exec1(c2, "print('a' in globals())", cx_now_us() + 10000000, &s, &e);
        cx_exec_cleanup(&e, 1);
        ok(rc == CX_OK && !strcmp(s.text, "False\n"),
           "  its first output after the restart arrives (%zu bytes)", strlen(s.text));

        /* the notice reaches a connection in the middle of its handshake
         * (another connection's run heard of the death first, and the
         * restarter polls every 3 s): the handshake waits for the new
         * process, in the same sandbox; it is no reason to replace the
         * kernel (and lose its workspace) */
        struct cx_exec kill;
        memset(&kill, 0, sizeof(kill));
        kill.code = "b = 1\nimport os\nos._exit(1)";
        ok(cx_kernel_execute(c, &kill) == CX_OK, "a cell that kills its kernel, not waited for");
        usleep(300000); /* (it is dead; the restarter has not yet looked, as a rule) */
        rc = cx_kernel_confirm(c2, true, cx_now_us() + 30000000);
        is_int(rc, CX_OK, "  a handshake that hears the restart notice waits for the new process");
        memset(&s, 0, sizeof(s));
        rc = exec1(c2, "print('b' in globals())", cx_now_us() + 10000000, &s, &e);
        cx_exec_cleanup(&e, 1);
        ok(rc == CX_OK && !strcmp(s.text, "False\n"),
           "  the same kernel, restarted: its first output arrives (%zu bytes)", strlen(s.text));
        cx_exec_cleanup(&kill, 1);
        cx_kernel_conn_free(c2);
    }
    cx_kernel_conn_free(c);

    ok(cx_gateway_kernel_delete(gw, kid) == CX_OK, "delete");
    is_int(cx_gateway_kernel_get(gw, kid, NULL), CX_ERR_NOT_FOUND, "gone");
    ok(cx_gateway_kernel_delete(gw, kid) == CX_OK, "deleting twice is fine");
    is_int(cx_kernel_conn_open(url, token, kid, 0, &c, msg, sizeof(msg)), CX_ERR_NOT_FOUND,
           "channels of a deleted kernel: not found");
    is_int(cx_gateway_kernel_interrupt(gw, kid), CX_ERR_NOT_FOUND, "interrupt: not found");

    {
        struct cx_gateway *bad = NULL;
        ok(cx_gateway_new(url, "wrong-token", &bad) == CX_OK, "handle with a wrong token");
        ok(cx_gateway_kernelspecs(bad, &specs) != CX_OK, "refused");
        ok(strstr(msg, "wrong-token") == NULL, "the message does not carry the token");
        cx_gateway_free(bad);
    }
    cx_kernel_pool_clear();
    cx_gateway_free(gw);
    curl_global_cleanup();
    return tap_done();
}
