/* codexec: a WebSocket client (RFC 6455) over a libcurl connection.
 *
 * Debian 12's libcurl has no WebSocket support, so curl only opens the
 * connection (CURLOPT_CONNECT_ONLY: TCP, TLS, proxies) and this module does
 * the handshake and the framing over curl_easy_send()/curl_easy_recv().
 * See docs/internals/ws.md.
 *
 * One connection is used by one thread at a time. Messages are returned
 * whole (fragments reassembled), pings are answered, a close is echoed. */
#ifndef CX_WS_H
#define CX_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "codexec.h"

struct cx_ws;

enum cx_ws_opcode {
    CX_WS_CONT = 0x0,
    CX_WS_TEXT = 0x1,
    CX_WS_BINARY = 0x2,
    CX_WS_CLOSE = 0x8,
    CX_WS_PING = 0x9,
    CX_WS_PONG = 0xa,
};

struct cx_ws_options {
    const char *url;          /* ws://host:port/path?query or wss:// */
    const char *extra_header; /* one "Name: value" line, or NULL (e.g. Authorization) */
    const char *protocol;     /* a subprotocol offered (Sec-WebSocket-Protocol), or NULL */
    long connect_timeout_ms;  /* connect + handshake */
    size_t max_message;       /* larger messages fail with CX_ERR_TOO_LARGE */
    bool no_quickack;         /* for measurements only: leave delayed ACKs on */
};

/* Connects and completes the handshake (status 101 and a correct
 * Sec-WebSocket-Accept). CX_ERR_NOT_FOUND when the server answers 404,
 * CX_ERR_UNAUTHORIZED for 401/403, CX_ERR_GATEWAY otherwise; msg says why.
 * Free with cx_ws_free(). */
enum cx_err cx_ws_connect(const struct cx_ws_options *opt, struct cx_ws **out, char *msg,
                          size_t msglen) CX_MUSTCHECK;

/* Sends one message in one frame (masked, as a client must). */
/* A connection whose peer sent exactly data and went away: the frames in
 * it can be received, nothing can be sent. For fuzzing and tests. */
enum cx_err cx_ws_buffered(const void *data, size_t len, size_t max_message,
                           struct cx_ws **out) CX_MUSTCHECK;

enum cx_err cx_ws_send(struct cx_ws *ws, enum cx_ws_opcode op, const void *data,
                       size_t len) CX_MUSTCHECK;
/* One message of two parts, a then b (either may be empty), in one frame:
 * neither is copied. */
enum cx_err cx_ws_send2(struct cx_ws *ws, enum cx_ws_opcode op, const void *a, size_t alen,
                        const void *b, size_t blen) CX_MUSTCHECK;

/* Receives the next data message (text or binary) into out (reset first),
 * waiting until deadline_us (cx_now_us() clock). Pings are answered and
 * pongs dropped on the way. CX_ERR_TIMEOUT leaves the connection usable
 * (a partial frame stays buffered); CX_ERR_IO when the peer closed,
 * CX_ERR_PROTOCOL for a malformed frame or invalid UTF-8 in text,
 * CX_ERR_TOO_LARGE over max_message. After any error but a timeout the
 * connection is dead (cx_ws_alive() is false). */
enum cx_err cx_ws_recv(struct cx_ws *ws, int64_t deadline_us, struct cx_buf *out,
                       enum cx_ws_opcode *op) CX_MUSTCHECK;

bool cx_ws_alive(const struct cx_ws *ws);

/* Whether the server selected the subprotocol cx_ws_options offered. */
bool cx_ws_protocol_selected(const struct cx_ws *ws);

/* Sends a close frame (best effort) and frees. NULL is a no-op. */
void cx_ws_free(struct cx_ws *ws);

/* Reads performed so far (for tests that count them). */
uint64_t cx_ws_reads(const struct cx_ws *ws);

/* Bytes received so far, whole messages or not. */
uint64_t cx_ws_bytes_in(const struct cx_ws *ws);

/* Reads after which TCP_QUICKACK was set again (0 with no_quickack). */
uint64_t cx_ws_quickacks(const struct cx_ws *ws);

#endif
