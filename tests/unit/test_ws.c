/* The WebSocket client against a scripted peer.
 *
 * The peer below is a test double, and named as one: it sends frames that no
 * real server (and certainly not Jupyter's) would send — malformed, masked,
 * oversized — which cannot be produced for real. The client's behaviour
 * against the real Jupyter server is covered by test_kernel and the system
 * tests. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../lib/log.h"
#include "../../lib/util.h"
#include "../../lib/ws.h"
#include "tap.h"

enum handshake { HS_OK, HS_WRONG_ACCEPT, HS_404, HS_401 };

struct peer {
    int lfd, port;
    enum handshake hs;
    /* what to send after the handshake */
    unsigned char out[400000];
    size_t out_len;
    int pause_after; /* bytes sent before a pause (0 = no pause) */
    int pause_ms;
    int trickle_ms; /* > 0: one byte, then a pause of this many ms, and so on */
    /* what the client sent, unmasked, and whether every frame was masked */
    unsigned char in[200000];
    size_t in_len;
    int in_frames;
    int in_opcodes[16];
    int all_masked;
    int read_client;             /* how many client frames to read before closing */
    const char *answer_protocol; /* the subprotocol the 101 names, or NULL */
    char offered[128];           /* the subprotocol the client offered */
    pthread_t thread;
};

static void
frame(struct peer *p, int fin, int opcode, const void *data, size_t len, int masked, int rsv)
{
    unsigned char *o = p->out + p->out_len;
    size_t h = 0;

    o[h++] = (unsigned char)((fin ? 0x80 : 0) | (rsv ? 0x40 : 0) | opcode);
    if (len < 126) {
        o[h++] = (unsigned char)((masked ? 0x80 : 0) | len);
    } else if (len <= 0xffff) {
        o[h++] = (unsigned char)((masked ? 0x80 : 0) | 126);
        o[h++] = (unsigned char)(len >> 8);
        o[h++] = (unsigned char)len;
    } else {
        o[h++] = (unsigned char)((masked ? 0x80 : 0) | 127);
        for (int i = 7; i >= 0; i--)
            o[h++] = (unsigned char)((uint64_t)len >> (8 * i));
    }
    if (masked) {
        memset(o + h, 0, 4); /* a zero mask keeps the payload readable */
        h += 4;
    }
    memcpy(o + h, data, len);
    p->out_len += h + len;
}

static void
raw(struct peer *p, const void *data, size_t len)
{
    memcpy(p->out + p->out_len, data, len);
    p->out_len += len;
}

static int
read_n(int fd, unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

static void *
peer_main(void *arg)
{
    struct peer *p = arg;
    char req[8192], resp[512], key[64] = "", accept_b64[64];
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen;
    size_t n = 0;
    int fd = accept(p->lfd, NULL, NULL);

    if (fd < 0)
        return NULL;
    while (n < sizeof(req) - 1) {
        ssize_t k = read(fd, req + n, sizeof(req) - 1 - n);
        if (k <= 0)
            goto out;
        n += (size_t)k;
        req[n] = '\0';
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    {
        char *k = strcasestr(req, "Sec-WebSocket-Key:");
        if (k)
            sscanf(k + 18, " %63s", key);
        k = strcasestr(req, "Sec-WebSocket-Protocol:");
        if (k)
            sscanf(k + 23, " %127s", p->offered);
    }
    snprintf(resp, sizeof(resp), "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", key);
    EVP_Digest(resp, strlen(resp), digest, &dlen, EVP_sha1(), NULL);
    sodium_bin2base64(accept_b64, sizeof(accept_b64), digest, dlen, sodium_base64_VARIANT_ORIGINAL);
    if (p->hs == HS_WRONG_ACCEPT)
        accept_b64[0] = accept_b64[0] == 'A' ? 'B' : 'A';
    if (p->hs == HS_404)
        snprintf(resp, sizeof(resp), "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    else if (p->hs == HS_401)
        snprintf(resp, sizeof(resp), "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
    else
        snprintf(resp, sizeof(resp),
                 "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nsec-websocket-accept:   %s  \r\n%s%s%s\r\n",
                 accept_b64, p->answer_protocol ? "Sec-WebSocket-Protocol: " : "",
                 p->answer_protocol ? p->answer_protocol : "", p->answer_protocol ? "\r\n" : "");
    if (write(fd, resp, strlen(resp)) < 0)
        goto out;
    if (p->trickle_ms > 0) {
        for (size_t i = 0; i < p->out_len; i++) {
            if (write(fd, p->out + i, 1) < 0)
                goto out;
            usleep((useconds_t)p->trickle_ms * 1000);
        }
    } else if (p->pause_after > 0 && (size_t)p->pause_after < p->out_len) {
        if (write(fd, p->out, (size_t)p->pause_after) < 0)
            goto out;
        usleep((useconds_t)p->pause_ms * 1000);
        if (write(fd, p->out + p->pause_after, p->out_len - (size_t)p->pause_after) < 0)
            goto out;
    } else if (p->out_len && write(fd, p->out, p->out_len) < 0) {
        goto out;
    }
    p->all_masked = 1;
    for (int f = 0; f < p->read_client; f++) {
        unsigned char h[14], mask[4];
        uint64_t len;
        if (read_n(fd, h, 2))
            break;
        p->in_opcodes[p->in_frames < 16 ? p->in_frames : 15] = h[0] & 0x0f;
        p->all_masked &= (h[1] & 0x80) != 0;
        len = h[1] & 0x7f;
        if (len == 126) {
            if (read_n(fd, h, 2))
                break;
            len = ((uint64_t)h[0] << 8) | h[1];
        } else if (len == 127) {
            if (read_n(fd, h, 8))
                break;
            len = 0;
            for (int i = 0; i < 8; i++)
                len = (len << 8) | h[i];
        }
        if (read_n(fd, mask, 4) || len > sizeof(p->in) - p->in_len ||
            read_n(fd, p->in + p->in_len, (size_t)len))
            break;
        for (uint64_t i = 0; i < len; i++)
            p->in[p->in_len + i] ^= mask[i & 3];
        p->in_len += (size_t)len;
        p->in_frames++;
    }
out:
    usleep(100 * 1000);
    close(fd);
    return NULL;
}

static struct peer *
peer_start(enum handshake hs)
{
    struct peer *p = calloc(1, sizeof(*p));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);

    need(p != NULL, "memory for the peer");
    p->hs = hs;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    bind(p->lfd, (struct sockaddr *)&a, sizeof(a));
    listen(p->lfd, 1);
    getsockname(p->lfd, (struct sockaddr *)&a, &al);
    p->port = ntohs(a.sin_port);
    return p;
}

static void
peer_go(struct peer *p)
{
    pthread_create(&p->thread, NULL, peer_main, p);
}

static void
peer_end(struct peer *p)
{
    shutdown(p->lfd, SHUT_RDWR); /* a peer still waiting for the client stops waiting */
    pthread_join(p->thread, NULL);
    close(p->lfd);
    free(p);
}

static enum cx_err
client_offering(struct peer *p, struct cx_ws **ws, size_t max_message, const char *protocol)
{
    char url[128], msg[256];
    struct cx_ws_options o = {.url = url,
                              .connect_timeout_ms = 5000,
                              .max_message = max_message,
                              .extra_header = "Authorization: token secret",
                              .protocol = protocol};

    snprintf(url, sizeof(url), "ws://127.0.0.1:%d/api/kernels/x/channels?session_id=s", p->port);
    peer_go(p);
    return cx_ws_connect(&o, ws, msg, sizeof(msg));
}

static enum cx_err
client(struct peer *p, struct cx_ws **ws, size_t max_message)
{
    return client_offering(p, ws, max_message, NULL);
}

/* A subprotocol offered and selected, offered and not, or selected
 * unoffered. */
static void
subprotocols(void)
{
    static const struct {
        const char *offer, *answer;
        enum cx_err want;
        bool selected;
        const char *what;
    } cases[] = {
        {"v1.kernel.websocket.jupyter.org", "v1.kernel.websocket.jupyter.org", CX_OK, true,
         "offered and selected"},
        {"v1.kernel.websocket.jupyter.org", NULL, CX_OK, false, "offered, none selected"},
        {"v1.kernel.websocket.jupyter.org", "v2.other", CX_ERR_PROTOCOL, false,
         "another one selected: refused"},
        {NULL, "v1.kernel.websocket.jupyter.org", CX_ERR_PROTOCOL, false,
         "one selected, none offered: refused"},
        {"v1.kernel.websocket.jupyter.org",
         "v1.kernel.websocket.jupyter.org\r\nSec-WebSocket-Protocol: "
         "v1.kernel.websocket.jupyter.org",
         CX_ERR_PROTOCOL, false, "named twice: refused"},
        {"v1.kernel.websocket.jupyter.org",
         "v1.kernel.websocket.jupyter.org\r\nX-Sec-WebSocket-Protocol: other", CX_OK, true,
         "selected, another header like it beside"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct peer *p = peer_start(HS_OK);
        struct cx_ws *ws = NULL;
        enum cx_err rc;

        p->answer_protocol = cases[i].answer;
        rc = client_offering(p, &ws, 0, cases[i].offer);
        is_int(rc, cases[i].want, "subprotocol %s", cases[i].what);
        if (rc == CX_OK)
            ok(cx_ws_protocol_selected(ws) == cases[i].selected, "  selected: %s",
               cases[i].selected ? "yes" : "no");
        /* (the peer read the request before it answered) */
        is_str(p->offered, cases[i].offer ? cases[i].offer : "", "  the offer sent");
        cx_ws_free(ws);
        peer_end(p);
    }
}

static enum cx_err
recv1(struct cx_ws *ws, struct cx_buf *b, enum cx_ws_opcode *op, int ms)
{
    return cx_ws_recv(ws, cx_now_us() + ms * 1000LL, b, op);
}

int
main(void)
{
    struct cx_buf b;
    struct cx_ws *ws = NULL;
    struct peer *p;
    enum cx_ws_opcode op;
    static unsigned char big[70000];

    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) || cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    signal(SIGPIPE, SIG_IGN); /* the peer writes on after a client gave up */
    cx_buf_init(&b, 1 << 20);
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)('a' + i % 26);

    subprotocols();
    p = peer_start(HS_WRONG_ACCEPT);
    is_int(client(p, &ws, 0), CX_ERR_PROTOCOL, "a wrong Sec-WebSocket-Accept is refused");
    peer_end(p);
    p = peer_start(HS_404);
    is_int(client(p, &ws, 0), CX_ERR_NOT_FOUND, "404 on the upgrade: not found");
    peer_end(p);
    p = peer_start(HS_401);
    is_int(client(p, &ws, 0), CX_ERR_UNAUTHORIZED, "403 on the upgrade: unauthorized");
    peer_end(p);

    /* fragments with a ping in between; 16- and 64-bit lengths */
    p = peer_start(HS_OK);
    frame(p, 0, CX_WS_TEXT, "hel", 3, 0, 0);
    frame(p, 1, CX_WS_PING, "pp", 2, 0, 0);
    frame(p, 0, CX_WS_CONT, "lo ", 3, 0, 0);
    frame(p, 1, CX_WS_CONT, "world", 5, 0, 0);
    frame(p, 1, CX_WS_TEXT, big, 300, 0, 0);
    frame(p, 1, CX_WS_BINARY, big, sizeof(big), 0, 0);
    frame(p, 1, CX_WS_PONG, "", 0, 0, 0);
    frame(p, 1, CX_WS_TEXT, "", 0, 0, 0);
    p->read_client = 3;
    need(client(p, &ws, 0) == CX_OK, "handshake");
    ok(recv1(ws, &b, &op, 2000) == CX_OK && op == CX_WS_TEXT && b.len == 11 &&
           !memcmp(b.data, "hello world", 11),
       "fragments reassembled around a ping");
    ok(recv1(ws, &b, &op, 2000) == CX_OK && b.len == 300 && !memcmp(b.data, big, 300),
       "16-bit length");
    ok(recv1(ws, &b, &op, 2000) == CX_OK && op == CX_WS_BINARY && b.len == sizeof(big) &&
           !memcmp(b.data, big, sizeof(big)),
       "64-bit length, binary");
    ok(recv1(ws, &b, &op, 2000) == CX_OK && b.len == 0, "empty message after a pong");
    ok(cx_ws_send(ws, CX_WS_TEXT, "abc", 3) == CX_OK, "send small");
    ok(cx_ws_send(ws, CX_WS_BINARY, big, sizeof(big)) == CX_OK, "send 64-bit length");
    cx_ws_free(ws);
    peer_end(p);

    /* client frames seen by the peer: pong echo, masking */
    p = peer_start(HS_OK);
    frame(p, 1, CX_WS_PING, "xyz", 3, 0, 0);
    frame(p, 1, CX_WS_TEXT, "go", 2, 0, 0);
    p->read_client = 3;
    need(client(p, &ws, 0) == CX_OK, "handshake");
    ok(recv1(ws, &b, &op, 2000) == CX_OK && b.len == 2, "message after a ping");
    ok(cx_ws_send(ws, CX_WS_BINARY, big, sizeof(big)) == CX_OK, "send");
    ok(cx_ws_send(ws, CX_WS_TEXT, "end", 3) == CX_OK, "send");
    pthread_join(p->thread, NULL);
    is_int(p->in_frames, 3, "peer read three frames");
    is_int(p->in_opcodes[0], CX_WS_PONG, "a pong answered the ping");
    ok(p->in_len == 3 + sizeof(big) + 3 && !memcmp(p->in, "xyz", 3), "the pong echoes the payload");
    ok(!memcmp(p->in + 3, big, sizeof(big)), "a large frame arrives intact after unmasking");
    ok(p->all_masked, "every client frame is masked");
    cx_ws_free(ws);
    close(p->lfd);
    free(p);

    /* malformed frames: each kills the connection with a protocol error */
    {
        static const struct {
            const char *what;
            unsigned char bytes[8];
            size_t n;
        } bad[] = {
            {"masked frame from the server", {0x81, 0x82, 0, 0, 0, 0, 'h', 'i'}, 8},
            {"RSV bit without an extension", {0xc1, 0x02, 'h', 'i'}, 4},
            {"non-minimal 16-bit length", {0x81, 126, 0, 2, 'h', 'i'}, 6},
            {"fragmented control frame", {0x09, 0x00}, 2},
            {"unknown opcode", {0x83, 0x00}, 2},
            {"continuation without a start", {0x80, 0x01, 'x'}, 3},
            {"invalid UTF-8 in text", {0x81, 0x02, 0xc3, 0x28}, 4},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            p = peer_start(HS_OK);
            raw(p, bad[i].bytes, bad[i].n);
            need(client(p, &ws, 0) == CX_OK, "handshake");
            is_int(recv1(ws, &b, &op, 2000), CX_ERR_PROTOCOL, "%s", bad[i].what);
            ok(!cx_ws_alive(ws), "%s: connection dead", bad[i].what);
            cx_ws_free(ws);
            peer_end(p);
        }
        p = peer_start(HS_OK);
        {
            unsigned char ctl[130];
            memset(ctl, 'c', sizeof(ctl));
            frame(p, 1, CX_WS_PING, ctl, 126, 0, 0);
        }
        need(client(p, &ws, 0) == CX_OK, "handshake");
        is_int(recv1(ws, &b, &op, 2000), CX_ERR_PROTOCOL, "control frame over 125 bytes");
        cx_ws_free(ws);
        peer_end(p);
    }

    /* oversized messages are skipped in bounded memory; the connection lives */
    p = peer_start(HS_OK);
    frame(p, 1, CX_WS_TEXT, big, 5000, 0, 0);
    frame(p, 0, CX_WS_TEXT, big, 800, 0, 0);
    frame(p, 1, CX_WS_CONT, big, 800, 0, 0);
    frame(p, 1, CX_WS_TEXT, "after", 5, 0, 0);
    need(client(p, &ws, 1000) == CX_OK, "handshake");
    is_int(recv1(ws, &b, &op, 2000), CX_ERR_TOO_LARGE, "one frame over max_message");
    ok(cx_ws_alive(ws), "still alive");
    is_int(recv1(ws, &b, &op, 2000), CX_ERR_TOO_LARGE, "fragments adding up over max_message");
    ok(recv1(ws, &b, &op, 2000) == CX_OK && b.len == 5 && !memcmp(b.data, "after", 5),
       "the next message is intact");
    cx_ws_free(ws);
    peer_end(p);

    /* a timeout mid-frame is resumable */
    p = peer_start(HS_OK);
    frame(p, 1, CX_WS_TEXT, big, 1000, 0, 0);
    p->pause_after = 500;
    p->pause_ms = 600;
    need(client(p, &ws, 0) == CX_OK, "handshake");
    is_int(recv1(ws, &b, &op, 150), CX_ERR_TIMEOUT, "times out mid-frame");
    ok(cx_ws_alive(ws), "alive after a timeout");
    ok(recv1(ws, &b, &op, 3000) == CX_OK && b.len == 1000 && !memcmp(b.data, big, 1000),
       "the frame completes afterwards");
    cx_ws_free(ws);
    peer_end(p);

    /* A peer that keeps sending, slowly, never holds a reader past its
     * deadline: a 1000-byte message at a byte per 2 ms, a 100 ms deadline. */
    p = peer_start(HS_OK);
    frame(p, 1, CX_WS_TEXT, big, 1000, 0, 0);
    p->trickle_ms = 2;
    need(client(p, &ws, 0) == CX_OK, "handshake");
    {
        int64_t t0 = cx_now_us();
        is_int(recv1(ws, &b, &op, 100), CX_ERR_TIMEOUT, "a trickling message times out");
        ok(cx_now_us() - t0 < 1000000, "at its deadline, not when the data stops (%lld ms)",
           (long long)((cx_now_us() - t0) / 1000));
    }
    cx_ws_free(ws);
    peer_end(p);

    /* A stream of pings is answered but does not extend the deadline. */
    p = peer_start(HS_OK);
    for (int i = 0; i < 3000; i++)
        frame(p, 1, CX_WS_PING, "p", 1, 0, 0);
    p->trickle_ms = 0;
    need(client(p, &ws, 0) == CX_OK, "handshake");
    {
        int64_t t0 = cx_now_us();
        int rc = recv1(ws, &b, &op, 20);
        ok(rc == CX_ERR_TIMEOUT || rc == CX_ERR_IO, "pings alone never make a message (%d)", rc);
        ok(cx_now_us() - t0 < 2000000, "and end by the deadline");
    }
    cx_ws_free(ws);
    peer_end(p);

    /* Messages up to max_message fit whatever was buffered before them:
     * five of 30000 bytes, then one of 99000, with max_message 100000. */
    p = peer_start(HS_OK);
    for (int i = 0; i < 5; i++)
        frame(p, 1, CX_WS_TEXT, big, 30000, 0, 0);
    frame(p, 1, CX_WS_TEXT, big, 69000, 0, 0);
    need(client(p, &ws, 100000) == CX_OK, "handshake");
    {
        int got = 0;
        for (int i = 0; i < 6; i++)
            got += recv1(ws, &b, &op, 3000) == CX_OK;
        is_int(got, 6, "every message arrives");
        ok(cx_ws_alive(ws), "and the connection lives");
    }
    cx_ws_free(ws);
    peer_end(p);

    /* close */
    p = peer_start(HS_OK);
    frame(p, 1, CX_WS_CLOSE, "\x03\xe8", 2, 0, 0);
    p->read_client = 1;
    need(client(p, &ws, 0) == CX_OK, "handshake");
    is_int(recv1(ws, &b, &op, 2000), CX_ERR_IO, "a close frame ends the connection");
    ok(!cx_ws_alive(ws), "not alive");
    pthread_join(p->thread, NULL);
    ok(p->in_frames == 1 && p->in_opcodes[0] == CX_WS_CLOSE && p->in_len == 2 && p->in[0] == 0x03 &&
           p->in[1] == 0xe8,
       "the close is echoed with its code");
    is_int(cx_ws_send(ws, CX_WS_TEXT, "x", 1), CX_ERR_IO, "no sends after close");
    cx_ws_free(ws);
    close(p->lfd);
    free(p);

    /* peer vanishes */
    p = peer_start(HS_OK);
    need(client(p, &ws, 0) == CX_OK, "handshake");
    is_int(recv1(ws, &b, &op, 3000), CX_ERR_IO, "EOF is an I/O error");
    cx_ws_free(ws);
    peer_end(p);

    {
        char msg[128];
        struct cx_ws_options o = {.url = "http://127.0.0.1:1/", .connect_timeout_ms = 1000};
        is_int(cx_ws_connect(&o, &ws, msg, sizeof(msg)), CX_ERR_INVALID, "not a ws URL");
        o.url = "ws://127.0.0.1:1/x";
        is_int(cx_ws_connect(&o, &ws, msg, sizeof(msg)), CX_ERR_GATEWAY, "nothing listening");
    }
    cx_ws_free(NULL);
    cx_buf_cleanup(&b);
    curl_global_cleanup();
    return tap_done();
}
