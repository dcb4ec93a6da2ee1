/* codexec: the runs of this process that a cancel may reach.
 *
 * POST /v1/runs/{id}/cancel marks the run's record and announces
 * "cancel <id>" on codexec_changes (lib/watch.h); whichever process runs
 * it hears that on its watcher's connection and finds the run here. The
 * run's thread looks at its flag between its waits for the kernel
 * (lib/runexec.c). Bounded by the run threads: a run registers for as long
 * as it runs on one. */
#ifndef CX_CANCEL_H
#define CX_CANCEL_H

#include <stdbool.h>

struct cx_cancel {
    char run_id[37];
    int requested;                   /* set by any thread (__atomic) */
    struct cx_cancel *next, **pprev; /* pprev: NULL when not registered */
};

/* c (the caller's, until unregistered) for run_id. */
void cx_cancel_register(struct cx_cancel *c, const char *run_id);
void cx_cancel_unregister(struct cx_cancel *c);

/* Sets the flag of run_id when it runs in this process; whether it did. */
bool cx_cancel_note(const char *run_id);

bool cx_cancel_requested(const struct cx_cancel *c);

#endif
