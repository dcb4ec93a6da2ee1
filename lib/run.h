/* codexec: runs, the whole story of POST /v1/runs with no HTTP in it (its
 * calls for the programs are in codexec.h; this is what the reaper
 * needs). */
#ifndef CX_RUN_H
#define CX_RUN_H

#include "codexec.h"

/* Marks pending runs past approval_ttl expired and runs left "running" by a
 * crashed process failed; *changed counts them. */
enum cx_err cx_run_expire(struct cx_ctx *cx, int *changed) CX_MUSTCHECK;

#endif
