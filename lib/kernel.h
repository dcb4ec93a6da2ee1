/* codexec: Jupyter messaging (protocol 5.3) on a kernel's channels WebSocket.
 *
 * A struct cx_kernel_conn is one WebSocket to /api/kernels/{id}/channels.
 * Connections are pooled per process and reused across runs: a run checks
 * one out (cx_kernel_conn_get), owns it exclusively, and checks it back in
 * (cx_kernel_conn_put). Requests are pipelined: send several
 * execute_requests, then wait for all of them at once. */
#ifndef CX_KERNEL_H
#define CX_KERNEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "codexec.h"

struct cx_kernel_conn;

/* One execute_request and what came back for it. */
/* Whose code a request carries, for a front kernel (the kernel of a
 * JavaScript or R session, docs/internals/languages.md): codexec's own
 * Python (the epilogue, staging, the file API, the pool's warm-up), or the
 * call of main(); NULL, the caller's, in the session's language. Sent as
 * the request's content["codexec"]; ipykernel ignores it. */
#define CX_EXEC_OWN  "own"
#define CX_EXEC_CALL "call"

struct cx_exec {
    /* in */
    const char *code;
    const char *role; /* CX_EXEC_OWN, CX_EXEC_CALL or NULL */
    bool silent;
    bool store_history;
    bool stop_on_error;
    bool allow_stdin;
    json_t *user_expressions; /* borrowed, may be NULL */
    json_t *metadata;         /* borrowed, may be NULL */
    bool ends_run;            /* its reply leaves the sandbox once the run's processes are gone */
    const void *buffer;       /* borrowed, may be NULL: the message's one binary buffer */
    size_t buffer_len;
    /* out */
    char msg_id[64];
    bool sent;
    bool heard;    /* a message answering it came: the kernel took it */
    bool queued;   /* sent, not heard, when the server said the kernel went
                      away: the new process may take it */
    bool got_busy; /* its first output: without it its start was lost */
    bool got_reply;
    bool got_idle;
    json_t *reply; /* execute_reply content (new reference), or NULL */
};

/* A WebSocket message from the gateway larger than this is skipped
 * unparsed (reported as oversized output): no run keeps more than
 * max_output_bytes of output, and a captured file travels in 1 MiB chunks. */
#define CX_KERNEL_MAX_MESSAGE (16u << 20)

/* A message's binary buffers (the protocol's "buffers": a WebSocket binary
 * frame carries them after the JSON), borrowed for the call. Messages with
 * more are dropped whole. */
#define CX_KERNEL_MAX_BUFFERS 4

struct cx_kernel_buffers {
    size_t n;
    const unsigned char *data[CX_KERNEL_MAX_BUFFERS];
    size_t len[CX_KERNEL_MAX_BUFFERS];
};

/* Called for each iopub/shell message whose parent is one of the requests:
 * index is the request's position, msg_type e.g. "stream", content the
 * message content, bufs its buffers (n = 0 for most; all borrowed). Any
 * other return than CX_OK stops the wait with it: an error, or CX_AGAIN
 * (the caller has work to do before it waits on) or CX_DONE (no more
 * messages are wanted), passed back as they are. A message too large to
 * keep (over CX_KERNEL_MAX_MESSAGE) is skipped and reported as index -1, msg_type
 * "oversized", content and bufs NULL. */
typedef enum cx_err (*cx_exec_fn)(void *ctx, int index, const char *msg_type, json_t *content,
                                  const struct cx_kernel_buffers *bufs);

/* Splits a binary frame of the Jupyter Server WebSocket protocol (a count
 * n, n big-endian 32-bit offsets, the message's JSON, then its buffers) into
 * the JSON (*json, *json_len) and the buffers. CX_ERR_PROTOCOL for a frame
 * that is not one (offsets outside it or out of order, no JSON) or has
 * more than CX_KERNEL_MAX_BUFFERS buffers. */
enum cx_err cx_kernel_split_binary(const unsigned char *frame, size_t len, const char **json,
                                   size_t *json_len, struct cx_kernel_buffers *bufs) CX_MUSTCHECK;

/* The Jupyter Server's v1 WebSocket protocol (jupyter_server >= 1.18):
 * the server relays the kernel's frames without parsing and re-encoding
 * them. A message is one binary frame: a count n, n 64-bit little-endian
 * offsets (where the channel's name starts, where each part after it
 * starts, where the last ends), the channel's name, the header, parent
 * header, metadata and content (JSON each), then the buffers. */
#define CX_KERNEL_WS_V1 "v1.kernel.websocket.jupyter.org"

struct cx_kernel_v1 {
    const char *channel;
    size_t channel_len;
    const char *part[4]; /* header, parent header, metadata, content */
    size_t part_len[4];
    struct cx_kernel_buffers bufs;
};

/* Splits a v1 frame (all borrowed from frame). CX_ERR_PROTOCOL for one
 * that is not (fewer than the four parts, offsets outside it or out of
 * order) or has more than CX_KERNEL_MAX_BUFFERS buffers. */
enum cx_err cx_kernel_split_v1(const unsigned char *frame, size_t len,
                               struct cx_kernel_v1 *out) CX_MUSTCHECK;

/* A connection to the kernel: a pooled one if available, else a new one.
 * CX_ERR_NOT_FOUND when the gateway does not know the kernel. */
enum cx_err cx_kernel_conn_get(const char *gateway_url, const char *token, const char *kernel_id,
                               struct cx_kernel_conn **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* cx_kernel_conn_open()'s flags: CX_KERNEL_PLAIN leaves delayed ACKs on
 * (only for measuring what a plain client pays), CX_KERNEL_LEGACY does not
 * offer the v1 protocol (the JSON protocol every server speaks). */
#define CX_KERNEL_PLAIN  1u
#define CX_KERNEL_LEGACY 2u

/* A new connection, never pooled unless put back. It speaks v1 when the
 * server selects it. */
enum cx_err cx_kernel_conn_open(const char *gateway_url, const char *token, const char *kernel_id,
                                unsigned flags, struct cx_kernel_conn **out, char *msg,
                                size_t msglen) CX_MUSTCHECK;

/* Whether c speaks the v1 protocol (the server selected it). */
bool cx_kernel_conn_v1(const struct cx_kernel_conn *c);

/* Returns a connection to the pool (or frees it when it is broken). */
void cx_kernel_conn_put(struct cx_kernel_conn *c);

/* Frees a connection without pooling it. NULL is a no-op. */
void cx_kernel_conn_free(struct cx_kernel_conn *c);

/* Drops pooled connections to a kernel (it was deleted or replaced). */
void cx_kernel_pool_forget(const char *kernel_id);

/* Reads and drops whatever reached the pooled (idle) connections. A kernel
 * sends its output to every connection, so the idle one of a process that
 * did not serve the run gets it too, and the server buffers what is not
 * read. A kernel that keeps talking past a drain's budget with no run to
 * read it loses the connection and is noted as a talker. Called every
 * second by the ticker thread. */
void cx_kernel_pool_drain_idle(void);

/* A kernel the drain found talking while idle. */
struct cx_kernel_talker {
    char gateway_url[512];
    char kernel_id[64];
};

/* Moves up to max noted talkers into out (each noted once until taken);
 * returns how many. */
int cx_kernel_pool_talkers(struct cx_kernel_talker *out, int max);

/* Frees every pooled connection (at exit). */
void cx_kernel_pool_clear(void);

/* Until the kernel's output channel is live: a kernel_info_request every
 * 200 ms until an iopub message answers one (jupyter_client's
 * wait_for_ready). After a (re)start, the server's subscription to the new
 * kernel's iopub may not be in place yet, and what the kernel publishes
 * meanwhile is lost. CX_ERR_TIMEOUT at the deadline, CX_ERR_KERNEL_DIED
 * when the server says it gave up on the kernel ("dead"); its notice that
 * it is restarting the kernel is waited out (the new process answers). */
enum cx_err cx_kernel_ready(struct cx_kernel_conn *c, int64_t deadline_us) CX_MUSTCHECK;

/* Before a connection carries a run or a file operation: its backlog is
 * read (a pooled one's; so is the handshake's after it), then, for a
 * kernel codexec just (re)started (fresh) or one the connection heard the
 * server say went away, the kernel_info handshake of cx_kernel_ready() on
 * this very connection. Its earlier traffic proves nothing then: the
 * output channel it heard was the old process's, and the server may still
 * be joining the new one's (after a restart through the API, with no
 * notice to any connection). */
enum cx_err cx_kernel_confirm(struct cx_kernel_conn *c, bool fresh,
                              int64_t deadline_us) CX_MUSTCHECK;

/* Whether c heard the server's notice that the kernel went away since its
 * output channel was last confirmed live (for tests). */
bool cx_kernel_conn_restarted(const struct cx_kernel_conn *c);
/* The server's notices that the kernel went away heard while c waited for
 * requests: one during a wait means a request may still reach the new
 * process, so it is not sent again. */
uint64_t cx_kernel_conn_notices(const struct cx_kernel_conn *c);
/* Whether an idle status answering a request sent on c arrived, and no
 * notice of the kernel's end since: its output channel is live on c. */
bool cx_kernel_conn_live(const struct cx_kernel_conn *c);

/* Sends e as an execute_request on the shell channel; fills e->msg_id. */
enum cx_err cx_kernel_execute(struct cx_kernel_conn *c, struct cx_exec *e) CX_MUSTCHECK;

/* Processes messages for the requests in reqs until the first `need` sent
 * ones have both their reply and their idle status, or until deadline_us.
 * Messages for any of the n requests reach fn. CX_ERR_TIMEOUT is resumable;
 * CX_ERR_KERNEL_DIED when the server reports the kernel restarting or dead;
 * CX_ERR_IO when the WebSocket failed. */
enum cx_err cx_kernel_wait(struct cx_kernel_conn *c, struct cx_exec *reqs, int n, int need,
                           int64_t deadline_us, cx_exec_fn fn, void *ctx) CX_MUSTCHECK;

/* A connection whose kernel already sent the WebSocket frames in frames
 * (in the v1 protocol, or the JSON one) and went away: what it sent can
 * be waited for. For fuzzing and tests. */
enum cx_err cx_kernel_conn_buffered(const void *frames, size_t len, bool v1,
                                    struct cx_kernel_conn **out) CX_MUSTCHECK;

/* Whether every request of reqs sent has its reply. */
bool cx_exec_all_replied(const struct cx_exec *reqs, int n);

/* Releases the replies held by reqs. */
void cx_exec_cleanup(struct cx_exec *reqs, int n);

/* What a drain found: nothing more to read, a kernel that kept talking past
 * the budget (a pooled connection is then better closed), a failed
 * connection. */
enum cx_drain { CX_DRAIN_QUIET, CX_DRAIN_TALKING, CX_DRAIN_FAILED };

/* Reads and discards what arrives within wait_ms (stale messages from an
 * earlier run), then what can be read without waiting, within a budget
 * (1024 messages, 4 MiB, 20 ms). */
enum cx_drain cx_kernel_drain(struct cx_kernel_conn *c, int wait_ms);

/* Reads and discards what arrives for ms: CX_DRAIN_TALKING as soon as more
 * than max_messages or max_bytes came (a kernel that talks on its own),
 * CX_DRAIN_QUIET when less did by then. */
enum cx_drain cx_kernel_listen(struct cx_kernel_conn *c, int ms, unsigned max_messages,
                               uint64_t max_bytes);

/* WebSocket messages received on this connection (for tests and metrics). */
uint64_t cx_kernel_conn_messages(const struct cx_kernel_conn *c);

/* Socket reads so far: grows while any byte arrives, even mid-message. */
uint64_t cx_kernel_conn_reads(const struct cx_kernel_conn *c);

/* Reads after which quick-ACK mode was re-armed (a tuned connection: every
 * one; a plain one: none). */
uint64_t cx_kernel_conn_quickacks(const struct cx_kernel_conn *c);

#endif
