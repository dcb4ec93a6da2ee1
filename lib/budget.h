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

#endif
