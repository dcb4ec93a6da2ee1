/* codexec: a run's inputs, staged into its kernel at inputs/<name>.
 *
 * Each input's current version is looked up (it must be the caller's, in
 * the run's conversation) and sent to the kernel as pipelined silent cells of
 * 1 MiB chunks, straight from storage: one chunk in memory at a time. The
 * path and the bytes travel as JSON data in the request's metadata, never
 * as source; the kernel writes without following a symlink. */
#ifndef CX_STAGE_H
#define CX_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "codexec.h"

struct cx_exec;
struct cx_kernel_conn;

struct cx_input {
    char key[1024];
    char path[300]; /* inputs/<safe name> */
    uint64_t size;
};

struct cx_inputs {
    struct cx_input *v;
    size_t n;
};

/* Looks up every input of req: CX_ERR_INPUT_NOT_FOUND (msg names it) for
 * one that is not the user's in this conversation. Names are made
 * clash-free: seed.csv, then seed-2.csv. Free with cx_stage_cleanup() on
 * any return. */
enum cx_err cx_stage_load(struct cx_ctx *cx, const char *user, const struct cx_run_request *req,
                          struct cx_inputs *in, char *msg, size_t msglen) CX_MUSTCHECK;

/* How many execute requests staging takes (one per chunk, at least one per
 * input). */
size_t cx_stage_requests(const struct cx_inputs *in);

/* Sends them on conn into stage[0 .. cx_stage_requests(in)). */
enum cx_err cx_stage_send(struct cx_ctx *cx, struct cx_kernel_conn *conn,
                          const struct cx_inputs *in, struct cx_exec *stage) CX_MUSTCHECK;

void cx_stage_cleanup(struct cx_inputs *in);

#endif
