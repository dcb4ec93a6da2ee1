/* codexec: runs, the whole story of POST /v1/runs with no HTTP in it. */
#ifndef CX_RUN_H
#define CX_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "codexec.h"
#include "util.h"

struct cx_config;
struct cx_ctx;

struct cx_principal;

/* Marks pending runs past approval_ttl expired and runs left "running" by a
 * crashed process failed; *changed counts them. */
enum cx_err cx_run_expire(struct cx_ctx *cx, int *changed) CX_MUSTCHECK;

/* Strips ANSI escape sequences (CSI and OSC) in place. */
void cx_run_strip_ansi(char *s);

#endif
