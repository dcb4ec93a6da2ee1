/* codexec: a pool of pre-started kernels (kernel_pool_size).
 *
 * A new conversation's first run pays for a kernel start-up (most of a
 * second) unless a kernel is waiting for it. Pooled kernels are rows of
 * prestarted_kernels in PostgreSQL, so every codexec process sharing the
 * database shares the pool: a claim deletes the row in the statement that
 * inserts the session (SKIP LOCKED), so no kernel is ever handed out twice,
 * and a kernel never returns to the pool, so nothing of a previous owner
 * can reach the next one. One process at a time refills (an advisory lock), in a
 * background thread. Each language has a pool of its own kernelspec
 * (kernel_pool_size, kernel_pool_size_javascript, kernel_pool_size_r). */
#ifndef CX_PRESTART_H
#define CX_PRESTART_H

#include <stdbool.h>

#include "codexec.h"

/* How long a claim that left a kernel in the pool puts its refill off. */
#define CX_POOL_REFILL_DELAY_MS 2000

/* The claim, as two CTEs for the statement that makes the kernel a
 * session's ($1 the gateway's URL, $2 the kernelspec): claim (id,
 * kernel_id) is the oldest ready kernel, its row deleted (SKIP LOCKED: never
 * handed out twice; a failure of the statement puts it back), and pool
 * (ready) counts the ready kernels as the statement found them, the claimed
 * one among them. The session takes the row's id. Claimed only when
 * the SQL condition cond holds (none claimed otherwise, none deleted, and
 * none locked, which another claim would skip). */
#define CX_PRESTART_CLAIM_CTES(cond)                                                               \
    "claim AS (DELETE FROM prestarted_kernels WHERE id = (SELECT id FROM prestarted_kernels"       \
    " WHERE gateway_url = $1 AND kernel_name = $2 AND ready AND " cond                             \
    " ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, kernel_id),"               \
    " pool AS (SELECT count(*) AS ready FROM prestarted_kernels"                                   \
    " WHERE gateway_url = $1 AND kernel_name = $2 AND ready)"

/* Wakes the refilling thread now (a pool emptied, or a kernel wanted). */
void cx_prestart_kick(void);

/* Asks the refilling thread for a refill in ms milliseconds, unless one
 * is asked for sooner: a claim that left the pool with a kernel puts its
 * refill off, so a start-up (a few hundred ms of CPU and of the Jupyter
 * server's thread) does not slow the new conversation's first runs. */
void cx_prestart_kick_after(unsigned ms);

#endif
