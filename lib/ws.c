#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "log.h"
#include "util.h"
#include "ws.h"

#define WS_GUID       "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#define MAX_HANDSHAKE 16384
#define SEND_CHUNK    65536
#define READ_CHUNK    65536
/* The receive buffer: a whole frame of max_message (and its header, or the
 * handshake), plus one read of whatever follows it. */
#define IN_CAP(max_message) ((max_message) + MAX_HANDSHAKE + 64 + READ_CHUNK)
/* What an idle connection keeps of its buffers after a large message. */
#define WS_KEEP_ALLOC (256u * 1024)

struct cx_ws {
    CURL *curl;
    curl_socket_t fd;
    bool alive;
    bool close_sent;
    bool quickack;
    bool protocol; /* the server selected the subprotocol offered */
    size_t max_message;
    /* received bytes not yet parsed: data[off .. len) */
    struct cx_buf in;
    size_t off;
    /* a fragmented data message being assembled */
    bool in_message;
    enum cx_ws_opcode message_op;
    /* an oversized message being skipped */
    bool discarding;
    bool discard_fin;
    uint64_t discard_left;
    uint64_t reads;
    uint64_t bytes_in;  /* every byte received, frames and all */
    uint64_t quickacks; /* reads after which quick-ACK mode was re-armed */
};

static void
quickack(struct cx_ws *ws)
{
    /* Jupyter's server writes each message as its own small segment without
     * TCP_NODELAY; with delayed ACKs on our side every message pair waits
     * ~40 ms. Quick-ACK mode is reset by the kernel, so re-arm it after
     * every read. */
    int one = 1;

    if (ws->quickack && ws->fd != CURL_SOCKET_BAD &&
        setsockopt(ws->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one)) == 0)
        ws->quickacks++;
}

static int
wait_fd(struct cx_ws *ws, short events, int64_t deadline_us)
{
    struct pollfd p = {.fd = ws->fd, .events = events};
    int64_t left = deadline_us - cx_now_us();
    int rc;

    if (left <= 0)
        return 0;
    do
        rc = poll(&p, 1, (int)((left + 999) / 1000));
    while (rc < 0 && errno == EINTR);
    return rc;
}

/* Drops the parsed bytes before n more are added: always when nothing
 * unparsed is left, when they are most of the buffer (moving the rest is
 * then cheap), and whenever n would not fit otherwise, so that a message
 * up to max_message always fits whatever came before it. */
static void
compact(struct cx_ws *ws, size_t n)
{
    size_t rest = ws->in.len - ws->off;

    if (ws->off == 0)
        return;
    if (rest == 0 || ws->off >= rest || ws->in.len + n > ws->in.cap) {
        cx_buf_keep_tail(&ws->in, rest);
        ws->off = 0;
    }
}

/* Reads what is available into ws->in, waiting until the deadline.
 * CX_OK when at least one byte arrived. */
static enum cx_err
read_some(struct cx_ws *ws, int64_t deadline_us)
{
    char chunk[READ_CHUNK];

    if (!ws->curl)
        return CX_ERR_IO; /* a buffered connection: nothing more will come */
    for (;;) {
        size_t n = 0;
        CURLcode cc = curl_easy_recv(ws->curl, chunk, sizeof(chunk), &n);

        if (cc == CURLE_OK) {
            ws->reads++;
            ws->bytes_in += n;
            quickack(ws);
            if (n == 0)
                return CX_ERR_IO; /* orderly shutdown by the peer */
            compact(ws, n);
            cx_buf_add(&ws->in, chunk, n);
            return cx_buf_err(&ws->in) ? CX_ERR_TOO_LARGE : CX_OK;
        }
        if (cc != CURLE_AGAIN)
            return CX_ERR_IO;
        int w = wait_fd(ws, POLLIN, deadline_us);
        if (w == 0)
            return CX_ERR_TIMEOUT;
        if (w < 0)
            return CX_ERR_IO;
    }
}

static enum cx_err
send_all(struct cx_ws *ws, const void *data, size_t len)
{
    const char *p = data;
    int64_t deadline = cx_now_us() + 30 * 1000000LL;

    if (!ws->curl)
        return CX_ERR_IO; /* a buffered connection: the peer is gone */
    while (len > 0) {
        size_t n = 0;
        CURLcode cc = curl_easy_send(ws->curl, p, len, &n);

        if (cc == CURLE_OK) {
            p += n;
            len -= n;
            continue;
        }
        if (cc != CURLE_AGAIN)
            return CX_ERR_IO;
        if (wait_fd(ws, POLLOUT, deadline) <= 0)
            return CX_ERR_TIMEOUT;
    }
    return CX_OK;
}

static void
accept_value(const char *key, char out[64])
{
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    char cat[128];

    snprintf(cat, sizeof(cat), "%s%s", key, WS_GUID);
    EVP_Digest(cat, strlen(cat), digest, &dlen, EVP_sha1(), NULL);
    sodium_bin2base64(out, 64, digest, dlen, sodium_base64_VARIANT_ORIGINAL);
}

/* Finds header name in the response head; copies its trimmed value. */
static bool
find_header(const char *head, const char *name, char *out, size_t outlen)
{
    size_t nlen = strlen(name);
    const char *line = strstr(head, "\r\n");

    while (line && line[2] != '\r') {
        line += 2;
        if (strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
            const char *v = line + nlen + 1, *e = strstr(v, "\r\n");
            while (*v == ' ' || *v == '\t')
                v++;
            while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
                e--;
            snprintf(out, outlen, "%.*s", (int)(e - v), v);
            return true;
        }
        line = strstr(line, "\r\n");
    }
    return false;
}

/* The server's answer to the handshake (its head in ws->in, NUL-ended):
 * 101, the key's Sec-WebSocket-Accept and no subprotocol but the one
 * offered. */
static enum cx_err
check_answer(struct cx_ws *ws, const struct cx_ws_options *opt, const char *key, char *msg,
             size_t msglen)
{
    char expect[64], got[128];
    int status = 0;

    if (sscanf(ws->in.data, "HTTP/1.%*d %d", &status) != 1)
        status = 0;
    if (status != 101) {
        snprintf(msg, msglen, "WebSocket handshake: server answered %d", status);
        return status == 404                      ? CX_ERR_NOT_FOUND
               : (status == 401 || status == 403) ? CX_ERR_UNAUTHORIZED
                                                  : CX_ERR_GATEWAY;
    }
    accept_value(key, expect);
    if (!find_header(ws->in.data, "Sec-WebSocket-Accept", got, sizeof(got)) ||
        strcmp(got, expect) != 0) {
        snprintf(msg, msglen, "WebSocket handshake: wrong Sec-WebSocket-Accept");
        return CX_ERR_PROTOCOL;
    }
    /* a subprotocol selected must be the one offered (RFC 6455, 4.1);
     * none selected is the server's default protocol */
    if (find_header(ws->in.data, "Sec-WebSocket-Protocol", got, sizeof(got))) {
        const char *first = strcasestr(ws->in.data, "\r\nSec-WebSocket-Protocol:");

        if (!opt->protocol || strcmp(got, opt->protocol) != 0 || !first ||
            strcasestr(first + 2, "\r\nSec-WebSocket-Protocol:")) {
            snprintf(msg, msglen, "WebSocket handshake: a subprotocol not offered, or two");
            return CX_ERR_PROTOCOL;
        }
        ws->protocol = true;
    }
    return CX_OK;
}

static enum cx_err
handshake(struct cx_ws *ws, const struct cx_ws_options *opt, const char *host_port,
          const char *target, char *msg, size_t msglen)
{
    unsigned char nonce[16];
    char key[32], *end;
    struct cx_buf req;
    int64_t deadline = cx_now_us() + opt->connect_timeout_ms * 1000LL;
    enum cx_err rc;

    randombytes_buf(nonce, sizeof(nonce));
    sodium_bin2base64(key, sizeof(key), nonce, sizeof(nonce), sodium_base64_VARIANT_ORIGINAL);
    cx_buf_init(&req, MAX_HANDSHAKE);
    cx_buf_addf(&req,
                "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n",
                target, host_port, key);
    if (opt->protocol)
        cx_buf_addf(&req, "Sec-WebSocket-Protocol: %s\r\n", opt->protocol);
    if (opt->extra_header)
        cx_buf_addf(&req, "%s\r\n", opt->extra_header);
    cx_buf_adds(&req, "\r\n");
    rc = cx_buf_err(&req) ? CX_ERR_INVALID : send_all(ws, req.data, req.len);
    sodium_memzero(req.data, req.len); /* it holds the token */
    cx_buf_cleanup(&req);
    if (rc) {
        snprintf(msg, msglen, "WebSocket handshake: send failed");
        return CX_ERR_GATEWAY;
    }
    while (!(end = ws->in.data ? strstr(ws->in.data, "\r\n\r\n") : NULL)) {
        rc = read_some(ws, deadline);
        if (rc) {
            snprintf(msg, msglen, "WebSocket handshake: %s",
                     rc == CX_ERR_TIMEOUT ? "timed out" : "connection closed");
            return rc == CX_ERR_TIMEOUT ? CX_ERR_TIMEOUT : CX_ERR_GATEWAY;
        }
        if (ws->in.len > MAX_HANDSHAKE) {
            snprintf(msg, msglen, "WebSocket handshake: response head too large");
            return CX_ERR_PROTOCOL;
        }
    }
    end[2] = '\0'; /* head ends with one CRLF now; frames start at end + 4 */
    rc = check_answer(ws, opt, key, msg, msglen);
    if (rc)
        return rc;
    ws->off = (size_t)(end + 4 - ws->in.data);
    return CX_OK;
}

/* A ws:// or wss:// URL as the http(s) URL curl connects to, the
 * "host:port" of the Host header and the request target. */
static enum cx_err
split_url(const char *url, char http_url[2048], char host_port[512], char target[2048], char *msg,
          size_t msglen)
{
    char *host = NULL, *port = NULL, *path = NULL, *query = NULL;
    bool tls = strncmp(url, "wss://", 6) == 0;
    CURLU *u;
    enum cx_err rc = CX_ERR_INVALID;

    if (!tls && strncmp(url, "ws://", 5) != 0) {
        snprintf(msg, msglen, "not a ws:// or wss:// URL");
        return CX_ERR_INVALID;
    }
    snprintf(http_url, 2048, "%s://%s", tls ? "https" : "http", url + (tls ? 6 : 5));
    u = curl_url();
    if (!u || curl_url_set(u, CURLUPART_URL, http_url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK) {
        snprintf(msg, msglen, "malformed WebSocket URL");
    } else {
        (void)curl_url_get(u, CURLUPART_QUERY, &query, 0);
        snprintf(host_port, 512, "%s:%s", host, port);
        snprintf(target, 2048, "%s%s%s", path, query ? "?" : "", query ? query : "");
        rc = CX_OK;
    }
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(query);
    curl_url_cleanup(u);
    return rc;
}

/* TCP (and TLS) through curl, which then hands over the socket. */
static enum cx_err
curl_connect(struct cx_ws *ws, const struct cx_ws_options *opt, const char *http_url, char *msg,
             size_t msglen)
{
    CURLcode cc;

    ws->curl = curl_easy_init();
    if (!ws->curl)
        return CX_ERR_NOMEM;
    curl_easy_setopt(ws->curl, CURLOPT_URL, http_url);
    curl_easy_setopt(ws->curl, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(ws->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(ws->curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(ws->curl, CURLOPT_CONNECTTIMEOUT_MS,
                     opt->connect_timeout_ms ? opt->connect_timeout_ms : 10000L);
    curl_easy_setopt(ws->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    cc = curl_easy_perform(ws->curl);
    if (cc != CURLE_OK) {
        snprintf(msg, msglen, "WebSocket connect failed: %s", curl_easy_strerror(cc));
        return CX_ERR_GATEWAY;
    }
    if (curl_easy_getinfo(ws->curl, CURLINFO_ACTIVESOCKET, &ws->fd) != CURLE_OK ||
        ws->fd == CURL_SOCKET_BAD) {
        snprintf(msg, msglen, "WebSocket connect: no socket");
        return CX_ERR_GATEWAY;
    }
    return CX_OK;
}

enum cx_err
cx_ws_connect(const struct cx_ws_options *opt, struct cx_ws **out, char *msg, size_t msglen)
{
    char http_url[2048], host_port[512], target[2048];
    struct cx_ws *ws;
    enum cx_err rc;

    *out = NULL;
    rc = split_url(opt->url, http_url, host_port, target, msg, msglen);
    if (rc)
        return rc;
    ws = calloc(1, sizeof(*ws));
    if (!ws)
        return CX_ERR_NOMEM;
    ws->fd = CURL_SOCKET_BAD;
    ws->quickack = !opt->no_quickack;
    ws->max_message = opt->max_message ? opt->max_message : 64u << 20;
    cx_buf_init(&ws->in, IN_CAP(ws->max_message));
    rc = curl_connect(ws, opt, http_url, msg, msglen);
    if (rc == CX_OK)
        rc = handshake(ws, opt, host_port, target, msg, msglen);
    if (rc) {
        ws->close_sent = true; /* never opened: nothing to close */
        cx_ws_free(ws);
        return rc;
    }
    ws->alive = true;
    *out = ws;
    return CX_OK;
}

enum cx_err
cx_ws_buffered(const void *data, size_t len, size_t max_message, struct cx_ws **out)
{
    struct cx_ws *ws = calloc(1, sizeof(*ws));

    *out = NULL;
    if (!ws)
        return CX_ERR_NOMEM;
    ws->fd = CURL_SOCKET_BAD;
    ws->max_message = max_message ? max_message : 64u << 20;
    cx_buf_init(&ws->in, IN_CAP(ws->max_message));
    cx_buf_add(&ws->in, data, len);
    if (cx_buf_err(&ws->in)) {
        cx_buf_cleanup(&ws->in);
        free(ws);
        return CX_ERR_TOO_LARGE;
    }
    ws->alive = true;
    ws->close_sent = true; /* nobody to tell */
    *out = ws;
    return CX_OK;
}

enum cx_err
cx_ws_send(struct cx_ws *ws, enum cx_ws_opcode op, const void *data, size_t len)
{
    return cx_ws_send2(ws, op, data, len, NULL, 0);
}

enum cx_err
cx_ws_send2(struct cx_ws *ws, enum cx_ws_opcode op, const void *a, size_t alen, const void *b,
            size_t blen)
{
    unsigned char head[14], mask[4], chunk[SEND_CHUNK];
    size_t h = 0, len = alen + blen;
    enum cx_err rc;

    if (!ws->alive)
        return CX_ERR_IO;
    head[h++] = (unsigned char)(0x80 | (op & 0x0f));
    if (len < 126) {
        head[h++] = (unsigned char)(0x80 | len);
    } else if (len <= 0xffff) {
        head[h++] = 0x80 | 126;
        head[h++] = (unsigned char)(len >> 8);
        head[h++] = (unsigned char)len;
    } else {
        head[h++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            head[h++] = (unsigned char)((uint64_t)len >> (8 * i));
    }
    randombytes_buf(mask, sizeof(mask));
    memcpy(head + h, mask, 4);
    h += 4;
    rc = send_all(ws, head, h);
    /* Masked in bounded pieces: memory does not grow with the message,
     * and its two parts are never copied together. */
    for (int part = 0, at = 0; part < 2; part++) {
        const unsigned char *p = part ? b : a;
        size_t plen = part ? blen : alen;
        for (size_t done = 0; rc == CX_OK && done < plen;) {
            size_t n = plen - done < sizeof(chunk) ? plen - done : sizeof(chunk);
            for (size_t i = 0; i < n; i++)
                chunk[i] = p[done + i] ^ mask[(at + i) & 3];
            rc = send_all(ws, chunk, n);
            done += n;
            at = (int)((at + n) & 3);
        }
    }
    if (rc)
        ws->alive = false;
    return rc;
}

/* Parses the frame header at ws->in[off]. *hlen is 0 while more bytes are
 * needed for the header itself. */
static enum cx_err
frame_header(struct cx_ws *ws, size_t *hlen, bool *fin, unsigned *opcode, uint64_t *plen)
{
    const unsigned char *b = (const unsigned char *)ws->in.data + ws->off;
    size_t avail = ws->in.len - ws->off, h = 2;
    uint64_t len;

    *hlen = 0;
    if (avail < 2)
        return CX_OK;
    if (b[0] & 0x70)
        return CX_ERR_PROTOCOL; /* RSV bits without a negotiated extension */
    if (b[1] & 0x80)
        return CX_ERR_PROTOCOL; /* servers must not mask */
    len = b[1] & 0x7f;
    if (len == 126) {
        if (avail < 4)
            return CX_OK;
        len = ((uint64_t)b[2] << 8) | b[3];
        if (len < 126)
            return CX_ERR_PROTOCOL; /* not minimal */
        h = 4;
    } else if (len == 127) {
        if (avail < 10)
            return CX_OK;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = (len << 8) | b[2 + i];
        if (len >> 63 || len <= 0xffff)
            return CX_ERR_PROTOCOL;
        h = 10;
    }
    *fin = b[0] & 0x80;
    *opcode = b[0] & 0x0f;
    if (*opcode >= 0x8 && (!*fin || len > 125))
        return CX_ERR_PROTOCOL; /* control frames are short and whole */
    if (*opcode != CX_WS_CONT && *opcode != CX_WS_TEXT && *opcode != CX_WS_BINARY &&
        *opcode != CX_WS_CLOSE && *opcode != CX_WS_PING && *opcode != CX_WS_PONG)
        return CX_ERR_PROTOCOL;
    *hlen = h;
    *plen = len;
    return CX_OK;
}

/* Best effort: the connection is going away whether or not this arrives. */
static void
send_close(struct cx_ws *ws, const void *body, size_t len)
{
    ws->close_sent = true;
    if (cx_ws_send(ws, CX_WS_CLOSE, body, len) != CX_OK)
        ws->alive = false;
}

static void
fail(struct cx_ws *ws, unsigned short code)
{
    unsigned char body[2] = {(unsigned char)(code >> 8), (unsigned char)code};

    if (ws->alive && !ws->close_sent)
        send_close(ws, body, sizeof(body));
    ws->alive = false;
}

/* Drops buffered bytes of a frame being discarded. */
static void
discard_buffered(struct cx_ws *ws)
{
    size_t avail = ws->in.len - ws->off;
    size_t n = avail < ws->discard_left ? avail : (size_t)ws->discard_left;

    ws->off += n;
    ws->discard_left -= n;
}

/* The frame at ws->off, once enough of it is buffered. */
struct frame {
    size_t hlen;
    uint64_t plen;
    unsigned opcode;
    bool fin;
    bool ready; /* false: read more first */
    const unsigned char *payload;
};

/* Parses the next frame, after skipping what is buffered of a frame being
 * discarded. CX_ERR_TOO_LARGE when a discarded message just ended (the
 * connection lives on); CX_ERR_PROTOCOL for a malformed header. */
static enum cx_err
next_frame(struct cx_ws *ws, struct cx_buf *out, struct frame *f)
{
    enum cx_err rc;

    memset(f, 0, sizeof(*f));
    if (ws->discard_left > 0) {
        discard_buffered(ws);
        if (ws->discard_left > 0)
            return CX_OK; /* every buffered byte of it is gone: read more */
        if (ws->discard_fin) {
            ws->in_message = false;
            ws->discarding = false;
            cx_buf_reset(out);
            return CX_ERR_TOO_LARGE;
        }
    }
    rc = frame_header(ws, &f->hlen, &f->fin, &f->opcode, &f->plen);
    if (rc || !f->hlen)
        return rc; /* an incomplete header: read more */
    if (f->opcode < 0x8 && (ws->discarding || out->len + f->plen > ws->max_message))
        f->ready = true; /* to be skipped: the header is enough */
    else
        f->ready = ws->in.len - ws->off - f->hlen >= f->plen;
    f->payload = (const unsigned char *)ws->in.data + ws->off + f->hlen;
    return CX_OK;
}

/* Ping, pong, close. CX_ERR_IO once the peer closed. */
static enum cx_err
control_frame(struct cx_ws *ws, const struct frame *f)
{
    ws->off += f->hlen + (size_t)f->plen;
    switch (f->opcode) {
    case CX_WS_PING:
        /* the payload points into ws->in, which a send does not touch */
        return cx_ws_send(ws, CX_WS_PONG, f->payload, (size_t)f->plen) ? CX_ERR_IO : CX_OK;
    case CX_WS_CLOSE:
        if (!ws->close_sent)
            send_close(ws, f->payload, f->plen >= 2 ? 2 : 0);
        ws->alive = false;
        return CX_ERR_IO;
    default: return CX_OK; /* pong */
    }
}

/* A data frame: starts or continues a message, skips one too large to
 * keep (in bounded memory, reported once all of it has passed), or
 * completes one (*done). */
static enum cx_err
data_frame(struct cx_ws *ws, const struct frame *f, struct cx_buf *out, enum cx_ws_opcode *op,
           bool *done)
{
    if (f->opcode != CX_WS_CONT) {
        if (ws->in_message) {
            fail(ws, 1002); /* a new message inside a fragmented one */
            return CX_ERR_PROTOCOL;
        }
        ws->in_message = true;
        ws->discarding = false;
        ws->message_op = f->opcode;
        cx_buf_reset(out);
    } else if (!ws->in_message) {
        fail(ws, 1002);
        return CX_ERR_PROTOCOL;
    }
    if (ws->discarding || out->len + f->plen > ws->max_message) {
        ws->discarding = true;
        ws->off += f->hlen;
        ws->discard_left = f->plen;
        ws->discard_fin = f->fin;
        cx_buf_reset(out);
        if (f->plen > 0 || !f->fin)
            return CX_OK;
        ws->in_message = ws->discarding = false;
        return CX_ERR_TOO_LARGE;
    }
    ws->off += f->hlen + (size_t)f->plen;
    cx_buf_add(out, f->payload, (size_t)f->plen);
    if (cx_buf_err(out)) {
        fail(ws, 1009);
        return CX_ERR_TOO_LARGE;
    }
    if (!f->fin)
        return CX_OK;
    ws->in_message = false;
    if (ws->message_op == CX_WS_TEXT && !cx_utf8_valid(out->data ? out->data : "", out->len)) {
        fail(ws, 1007);
        return CX_ERR_PROTOCOL;
    }
    *op = ws->message_op;
    *done = true;
    return CX_OK;
}

enum cx_err
cx_ws_recv(struct cx_ws *ws, int64_t deadline_us, struct cx_buf *out, enum cx_ws_opcode *op)
{
    enum cx_err rc;
    bool done = false;

    if (!ws->alive)
        return CX_ERR_IO;
    if (!ws->in_message)
        cx_buf_reset(out);
    for (int step = 0; !done; step++) {
        struct frame f;

        /* The deadline holds while data keeps arriving: after the first
         * step (what is buffered may always be looked at), every frame
         * and every read is checked against it. */
        if (step > 0 && cx_now_us() >= deadline_us)
            return CX_ERR_TIMEOUT;

        rc = next_frame(ws, out, &f);
        if (rc == CX_ERR_TOO_LARGE)
            return rc;
        if (rc) {
            fail(ws, 1002);
            return rc;
        }
        if (!f.ready) {
            rc = read_some(ws, deadline_us);
            if (rc && rc != CX_ERR_TIMEOUT)
                ws->alive = false;
            if (rc)
                return rc;
            continue;
        }
        rc = f.opcode >= 0x8 ? control_frame(ws, &f) : data_frame(ws, &f, out, op, &done);
        if (rc)
            return rc;
    }
    /* After a large message, give its memory back. */
    if (ws->in.alloc > WS_KEEP_ALLOC) {
        cx_buf_keep_tail(&ws->in, ws->in.len - ws->off);
        ws->off = 0;
        cx_buf_shrink(&ws->in, WS_KEEP_ALLOC);
    }
    return CX_OK;
}

bool
cx_ws_alive(const struct cx_ws *ws)
{
    return ws && ws->alive;
}

bool
cx_ws_protocol_selected(const struct cx_ws *ws)
{
    return ws->protocol;
}

uint64_t
cx_ws_reads(const struct cx_ws *ws)
{
    return ws->reads;
}

uint64_t
cx_ws_bytes_in(const struct cx_ws *ws)
{
    return ws->bytes_in;
}

uint64_t
cx_ws_quickacks(const struct cx_ws *ws)
{
    return ws->quickacks;
}

void
cx_ws_free(struct cx_ws *ws)
{
    if (!ws)
        return;
    if (ws->alive && !ws->close_sent) {
        unsigned char body[2] = {0x03, 0xe8}; /* 1000, normal closure */
        send_close(ws, body, sizeof(body));
    }
    if (ws->curl)
        curl_easy_cleanup(ws->curl);
    cx_buf_cleanup(&ws->in);
    free(ws);
}
