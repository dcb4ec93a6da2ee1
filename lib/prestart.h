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

/* Inside the caller's transaction: takes the oldest pooled kernel of the
 * gateway and kernelspec. *got is false when none is ready (not an error).
 * id_out becomes the session's id. */
enum cx_err cx_prestart_claim(struct cx_ctx *cx, const char *gateway_url, const char *kernel_name,
                              char id_out[37], char kernel_out[64], bool *got) CX_MUSTCHECK;

/* Wakes the refilling thread (after a claim). */
void cx_prestart_kick(void);

#endif
