/* codexec: the Jupyter gateway client (REST part).
 *
 * One struct cx_gateway per worker thread: it owns a libcurl easy handle so
 * connections to the gateway are reused across requests. The token travels
 * in "Authorization: token ..." and never in a URL. */
#ifndef CX_GATEWAY_H
#define CX_GATEWAY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "codexec.h"

struct cx_gateway;

/* url: base URL such as "http://127.0.0.1:8888" (no trailing /api).
 * token may be NULL or "". Free with cx_gateway_free(). */
enum cx_err cx_gateway_new(const char *url, const char *token,
                           struct cx_gateway **out) CX_MUSTCHECK;
void cx_gateway_free(struct cx_gateway *gw);

/* One REST call: method and a path under the base URL ("/api/kernels").
 * body may be NULL. *status gets the HTTP status; *resp (may be NULL) a new
 * reference to the parsed JSON body or NULL when the body is empty or not
 * JSON. CX_ERR_GATEWAY when the gateway could not be reached; an HTTP error
 * status is not an error here: callers decide. msg (may be NULL) receives a
 * sentence naming what failed, without the token. */
enum cx_err cx_gateway_call(struct cx_gateway *gw, const char *method, const char *path,
                            json_t *body, long *status, json_t **resp, char *msg,
                            size_t msglen) CX_MUSTCHECK;

/* GET /api/kernelspecs: CX_OK when the gateway answers 200 to our token. */
enum cx_err cx_gateway_ping(struct cx_gateway *gw, char *msg, size_t msglen) CX_MUSTCHECK;

/* The base URL and token this handle talks to (borrowed). */
const char *cx_gateway_url(const struct cx_gateway *gw);
const char *cx_gateway_token(const struct cx_gateway *gw);

/* POST /api/kernels {"name"}: id_out receives the kernel id. */
enum cx_err cx_gateway_kernel_start(struct cx_gateway *gw, const char *name, char id_out[64],
                                    char *msg, size_t msglen) CX_MUSTCHECK;
/* DELETE /api/kernels/{id}; a kernel that is already gone is not an error. */
enum cx_err cx_gateway_kernel_delete(struct cx_gateway *gw, const char *id) CX_MUSTCHECK;
/* POST /api/kernels/{id}/interrupt and /restart. CX_ERR_NOT_FOUND if gone. */
enum cx_err cx_gateway_kernel_interrupt(struct cx_gateway *gw, const char *id) CX_MUSTCHECK;
enum cx_err cx_gateway_kernel_restart(struct cx_gateway *gw, const char *id) CX_MUSTCHECK;
/* GET /api/kernels/{id}: *model (may be NULL) gets a new reference. */
enum cx_err cx_gateway_kernel_get(struct cx_gateway *gw, const char *id,
                                  json_t **model) CX_MUSTCHECK;
/* GET /api/kernels: *out gets a new reference to the array of models. */
enum cx_err cx_gateway_kernel_list(struct cx_gateway *gw, json_t **out) CX_MUSTCHECK;
/* GET /api/kernelspecs: *out gets a new reference. */
enum cx_err cx_gateway_kernelspecs(struct cx_gateway *gw, json_t **out) CX_MUSTCHECK;

/* The time limit of the handle's next calls, in ms; 0: the default (two
 * minutes, for a kernel start on a loaded machine). */
void cx_gateway_timeout(struct cx_gateway *gw, long ms);
/* Sets the handle's default (0: two minutes) and its next calls' limit. */
void cx_gateway_default_timeout(struct cx_gateway *gw, long ms);

/* Whether the gateway should get new kernels: it answered its last probe
 * (GET /api/kernelspecs with our token, 3 s at most, and its memory
 * report), the answer shared by the threads. A process's refresher
 * (cx_gateway_refresh(), from codexec-fcgi's reaper) keeps it fresh, so a
 * run never waits for a probe; a caller probes itself only when the last
 * answer is older than 4 s (the reaper is busy: restarting a kernel, a
 * sweep). */
bool cx_gateway_usable(struct cx_gateway *gw);

/* Probes gw when its last answer is 2 s old or more (and no other thread
 * is probing): called about once a second, off the runs' threads. */
void cx_gateway_refresh(struct cx_gateway *gw);

/* After a call to gw failed: probes it now (unless another thread is) and
 * says whether it is still usable; the answer is shared as above. */
bool cx_gateway_recheck(struct cx_gateway *gw);

/* What a gateway running codexec's configuration says of its memory (GET
 * /api/codexec/memory, asked with each probe): measured from outside the
 * sandboxes, so no kernel says less than it holds. */
struct cx_gateway_memory {
    long kernels;            /* the kernels the server runs */
    int64_t kernels_bytes;   /* their memory: processes and tmpfs (-1: no cgroups) */
    int64_t own_bytes;       /* ... of their cgroups alone (the average's; -1: as above) */
    int64_t limit_bytes;     /* their cgroup's limit (-1: none) */
    int64_t available_bytes; /* the host's MemAvailable */
    int64_t total_bytes;     /* the host's memory (-1: unknown) */
};

/* The report of gw's last probe, when there is one younger than 10 s;
 * false otherwise (a gateway without the endpoint is asked again after a
 * minute: admission then counts kernels, lib/budget.h). */
bool cx_gateway_memory(struct cx_gateway *gw, struct cx_gateway_memory *out);

/* The handle in cx of the gateway with this URL, or NULL when the
 * configuration no longer lists it. */
struct cx_gateway *cx_ctx_gateway(const struct cx_ctx *cx, const char *url);

#endif
