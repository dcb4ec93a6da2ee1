/* codexec: the kernel's sockets relayed to the Jupyter server, bounded.
 *
 * The kernel process owns its ZeroMQ sockets, so everything it sends is
 * tenant-written, down to the framing. ZeroMQ bounds a frame's size but not
 * the frames of one message (a message of a thousand 24 MiB frames, sent
 * zero-copy from one buffer, lands whole in the server's memory), nor
 * anything's rate. So the server never connects to the kernel: the
 * launcher listens on the endpoints the server connects to, connects to the
 * kernel's for each connection, and passes the bytes on, reading the
 * kernel's side as ZMTP 3 frames:
 *
 *   - each message: at most 32 frames and 32 MiB, its frames within their
 *     roles' sizes (identities, then "<IDS|MSG>", signature, header,
 *     parent header, metadata, content, buffers; the heartbeat's small);
 *   - each kernel: messages and bytes per second, as token buckets; past
 *     them the kernel is not read (it waits, in its own bounded memory).
 *
 * A connection that breaks a rule is closed (the server's ZeroMQ drops
 * the partial message and connects again). The server's side is passed on
 * as it comes, within the same buffers.
 *
 * The kernel's greeting must be ZMTP 3 or later with the NULL mechanism,
 * then READY (an older one frames otherwise: the relay would not see the
 * messages the server sees).
 *
 * The run's end: the server's side of the shell channel is read for the
 * requests whose id begins CX_RELAY_RUN_END (codexec's that may end a
 * run). A kernel's shell message whose parent header holds such an id
 * calls the run-end function once its last frame has come and before any
 * byte of its end is passed on, so its client sees the reply only once the
 * function returned (the launcher ends the sandbox's other processes
 * there); once per request. Used by codexec-kernel-launcher. See
 * docs/internals/sandbox.md. */
#ifndef CX_RELAY_H
#define CX_RELAY_H

#include <poll.h>
#include <stdint.h>

#include "../lib/codexec.h"
#include "sandbox.h"

struct cx_relay;

/* The start of the msg_id of a request that ends a run (lib/kernel.c). */

/* Listens on the server's endpoints (c's runtime directory, "<ip>-<port>",
 * each made under a temporary name and renamed over the old one) for the
 * kernel's sockets in private_dir (each checked to be a socket, never
 * followed). msg says what failed. Free with cx_relay_free(). */
enum cx_err cx_relay_open(const struct cx_sandbox_conn *c, const char *private_dir,
                          struct cx_relay **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* The relay's descriptors to poll, into p (at most max; returns how many)
 * and how soon it wants to be called again (ms, -1: only on events). */
int cx_relay_poll_fds(struct cx_relay *r, struct pollfd *p, int max, int *timeout_ms);

/* Handles what poll() said of the descriptors cx_relay_poll_fds() gave. */
void cx_relay_handle(struct cx_relay *r, const struct pollfd *p, int n);

/* fn(ctx) is called at each run's end, as above. */
void cx_relay_on_run_end(struct cx_relay *r, void (*fn)(void *ctx), void *ctx);

/* Connections closed for a broken rule, since the start (for tests). */
uint64_t cx_relay_refused(const struct cx_relay *r);

/* Run ends seen, since the start (for tests). */
uint64_t cx_relay_run_ends(const struct cx_relay *r);

/* Closes everything. NULL is a no-op. */
void cx_relay_free(struct cx_relay *r);

#ifdef CX_TEST_HOOKS
/* The kernel side's parser alone over d, fed in pieces of piece bytes, as
 * if the server had sent a run-end request of id CX_RELAY_RUN_END "fuzz":
 * the messages it passed, or -1 when they broke a rule; *ends (if not
 * NULL) the run ends it saw (fuzzing). */
int cx_relay_parse(const unsigned char *d, size_t n, int channel, size_t piece, uint64_t *ends);
#endif

/* The most descriptors cx_relay_poll_fds() gives. */
#define CX_RELAY_POLL_MAX (CX_SANDBOX_PORTS + 2 * 128)

#endif
