/* codexec: the gateways' kernel budgets (max_kernels): what each holds
 * for codexec, counted in PostgreSQL, and their gauges. Read by sessions
 * (where a kernel starts) and the kernel pool (whether one more fits). */
#ifndef CX_BUDGET_H
#define CX_BUDGET_H

#include "codexec.h"

struct cx_buf;

/* The kernels a gateway holds for codexec: sessions with one (or starting
 * one) and pooled ones; what max_kernels bounds. */
enum cx_err cx_budget_kernels(struct cx_ctx *cx, const char *gateway_url, long *count) CX_MUSTCHECK;

/* A gateway's kernel count when max_kernels is 0 and it reports no memory
 * (a gateway without codexec's configuration). */
#define CX_KERNELS_COUNTED 128

/* How many more kernels a gateway takes, beyond the used ones codexec holds
 * there (0 or less: none). Where the gateway reports its memory (m, from
 * its last probe: gateway.h), by that: its kernels' measured memory plus,
 * for each kernel codexec placed since the report, one of their average
 * (less one for each it closed since),
 * within max_memory (0: the kernels' cgroup limit), and the host keeping
 * reserve bytes available (0: a twentieth of it, within [256 MiB, 2
 * GiB]); an average kernel is at least 8 MiB, and 64 MiB until one is
 * measured. And by max_kernels when it is set (0: no count of its own
 * with a memory report, CX_KERNELS_COUNTED without one). */
struct cx_gateway_memory;
long cx_budget_room_for(const struct cx_gateway_memory *m, long used, unsigned max_kernels,
                        uint64_t max_memory, uint64_t reserve);

/* The same for the configured gateway i (its last memory report and
 * codexec.conf's budgets). */
long cx_budget_room(struct cx_ctx *cx, unsigned i, long used);

#endif
