/* codexec: what a process that hosts the library needs around its calls
 * (codexec-fcgi, codexec-admin, another FastCGI host): a thread's own
 * handles, the process's background chores, its shutdown, the schema. */
#ifndef CX_HOST_H
#define CX_HOST_H

#include "ctx.h"
#include "err.h"

struct cx_auth;
struct cx_config;

/* A thread's own database and gateway handles over the shared
 * configuration and secret (auth may be NULL for tools that never check a
 * key). Close with cx_host_ctx_close(), also after a failure. */
enum cx_err cx_host_ctx_open(struct cx_ctx *cx, const struct cx_config *cfg,
                             const struct cx_auth *auth) CX_MUSTCHECK;
void cx_host_ctx_close(struct cx_ctx *cx);

/* Once a second, from one thread: reads and drops what reached the pooled
 * (idle) kernel connections, which the gateway would otherwise buffer
 * without bound (docs/internals/runs.md). */
void cx_host_tick(void);

/* At exit, after the threads that use the library stopped: closes the
 * pooled kernel connections. */
void cx_host_shutdown(void);

/* Applies the schema's migrations (idempotent, safe to run concurrently);
 * *applied counts the new ones. */
enum cx_err cx_host_migrate(struct cx_ctx *cx, int *applied) CX_MUSTCHECK;

#endif
