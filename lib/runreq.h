/* codexec: a run's request (the validated POST /v1/runs body) and its
 * listener (a streaming run's events): what the run's steps (run.c) and
 * its execution in the kernel (runexec.c) both read, apart from either. */
#ifndef CX_RUNREQ_H
#define CX_RUNREQ_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"
#include "util.h"

struct cx_config;

/* A validated POST /v1/runs body. Strings and arrays are borrowed from
 * root, which the struct holds a reference to: cx_run_request_cleanup(). */
struct cx_run_request {
    json_t *root;
    char conversation_id[CX_CONVERSATION_MAX + 1];
    const char *code;
    size_t code_len;
    json_t *inputs;  /* array of uuid strings, or NULL */
    json_t *outputs; /* array of glob strings, or NULL */
    bool capture_artifacts;
    double timeout;    /* seconds, clamped to (0, max_timeout] */
    unsigned ttl;      /* seconds, clamped to [1, max_ttl] */
    json_t *arguments; /* object, or NULL */
};

/* Validates body (a JSON object) against docs/openapi.yaml and the limits in cfg.
 * On failure returns CX_ERR_INVALID or CX_ERR_TOO_LARGE and msg holds a
 * sentence for the client naming the field. On success *req takes a new
 * reference to body. */
enum cx_err cx_run_request_parse(const struct cx_config *cfg, json_t *body,
                                 struct cx_run_request *req, char *msg, size_t msglen) CX_MUSTCHECK;
void cx_run_request_cleanup(struct cx_run_request *req);

/* A streaming run's events, as they happen (Server-Sent Events in
 * codexec-fcgi). name: "run" {run_id, conversation_id} first, then
 * "status" {state: "queued" | "executing" | "capturing"}, "stdout" and
 * "stderr" {text} (coalesced over CX_RUN_COALESCE_MS, whole characters),
 * "display" {mime_type, path} for a rich output that becomes an artifact
 * under path; NULL name when nothing was said for CX_RUN_HEARTBEAT_MS (a
 * heartbeat is due). data is borrowed. The final answer is not an event:
 * it is the call's *out, or its error. Returns false once the client is
 * gone: the run goes on to its end and its record, and fn is not called
 * again. */
#define CX_RUN_COALESCE_MS  25
#define CX_RUN_HEARTBEAT_MS 15000
struct cx_run_sink {
    bool (*fn)(void *ctx, const char *name, json_t *data);
    void *ctx;
};

#endif
