/* codexec: what expires, swept in one place. The server's reaper thread
 * and `codexec-admin gc` make the same call. The gateway is codexec's
 * alone: a kernel on it that no row names is a leftover, and goes. */
#ifndef CX_MAINT_H
#define CX_MAINT_H

#include <stdbool.h>

#include "ctx.h"
#include "err.h"

struct cx_maint {
    int sessions;  /* expired sessions closed (kernel and workspace deleted) */
    int runs;      /* pending runs expired, abandoned runs failed */
    int artifacts; /* deleted artifacts whose bytes were removed */
    int kernels;   /* kernels on the gateway that no row named, deleted */
    int staging;   /* staged writes left by a crash, removed */
};

/* A staged write not written for this long is a crashed process's: no
 * run lasts longer (max_timeout, its grace and its capture), and a write
 * in progress touches its file at every chunk. */
#define CX_MAINT_STAGING_GRACE(cfg) ((cfg)->max_timeout + (cfg)->interrupt_grace + 600)

/* One sweep: up to limit expired sessions that no run holds, pending runs
 * past approval_ttl, runs left "running" by a crashed process, kernels on
 * the gateway that no session or pool row has named for
 * kernel_orphan_grace seconds (a process that died between starting one and
 * recording it), staged writes older than CX_MAINT_STAGING_GRACE and, with
 * artifacts, the bytes of deleted artifacts. Safe
 * with several processes. done counts what was done, also on failure;
 * done->sessions == limit means there may be more. */
enum cx_err cx_maint_sweep(struct cx_ctx *cx, int limit, bool artifacts,
                           struct cx_maint *done) CX_MUSTCHECK;

#endif
