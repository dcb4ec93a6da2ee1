/* codexec: what expires, swept in one place. The server's reaper thread
 * and `codexec-admin gc` make the same call. */
#ifndef CX_MAINT_H
#define CX_MAINT_H

#include <stdbool.h>

#include "ctx.h"
#include "err.h"

struct cx_maint {
    int sessions;  /* expired sessions closed (kernel and workspace deleted) */
    int runs;      /* pending runs expired, abandoned runs failed */
    int artifacts; /* deleted artifacts whose bytes were removed */
};

/* One sweep: up to limit expired sessions that no run holds, pending runs
 * past approval_ttl, runs left "running" by a crashed process and, with
 * artifacts, the bytes of deleted artifacts. Safe with several processes
 * (rows are claimed with SKIP LOCKED). done counts what was done, also on
 * failure; done->sessions == limit means there may be more. */
enum cx_err cx_maint_sweep(struct cx_ctx *cx, int limit, bool artifacts,
                           struct cx_maint *done) CX_MUSTCHECK;

#endif
