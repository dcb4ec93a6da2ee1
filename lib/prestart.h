/* codexec: a pool of pre-started kernels (kernel_pool_size).
 *
 * A new conversation's first run pays for a kernel start-up (most of a
 * second) unless a kernel is waiting for it. Pooled kernels are rows of
 * prestarted_kernels in PostgreSQL, so every codexec process sharing the
 * database shares the pool: a claim deletes the row inside the creating
 * transaction (SKIP LOCKED), so no kernel is ever handed out twice, and a
 * kernel never returns to the pool, so nothing of a previous owner can reach
 * the next one. One process at a time refills (an advisory lock), in a
 * background thread. Each language has a pool of its own kernelspec
 * (kernel_pool_size, kernel_pool_size_javascript, kernel_pool_size_r). */
#ifndef CX_PRESTART_H
#define CX_PRESTART_H

#include <stdbool.h>

#include "codexec.h"

/* How long a claim that left a kernel in the pool puts its refill off. */
#define CX_POOL_REFILL_DELAY_MS 2000

/* Inside the caller's transaction: takes the oldest pooled kernel of the
 * gateway and kernelspec. *got is false when none is ready (not an error).
 * id_out becomes the session's id; *left is how many ready kernels the
 * claim left (as far as it saw). */
enum cx_err cx_prestart_claim(struct cx_ctx *cx, const char *gateway_url, const char *kernel_name,
                              char id_out[37], char kernel_out[64], bool *got,
                              long *left) CX_MUSTCHECK;

/* Wakes the refilling thread now (a pool emptied, or a kernel wanted). */
void cx_prestart_kick(void);

/* Asks the refilling thread for a refill in ms milliseconds, unless one
 * is asked for sooner: a claim that left the pool with a kernel puts its
 * refill off, so a start-up (a few hundred ms of CPU and of the Jupyter
 * server's thread) does not slow the new conversation's first runs. */
void cx_prestart_kick_after(unsigned ms);

#endif
