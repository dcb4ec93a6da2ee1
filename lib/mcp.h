/* codexec: the MCP server's parts (docs/internals/mcp.md): the protocol
 * (mcp.c), the tools and resources (mcptools.c), sessions and calls in
 * PostgreSQL (mcpsess.c). */
#ifndef CX_MCP_H
#define CX_MCP_H

#include <jansson.h>
#include <stdbool.h>

#include "codexec.h"

/* Artifacts are resources under this scheme: codexec://artifacts/<id>,
 * codexec://artifacts/<id>?version=<n>. */
#define CX_MCP_ARTIFACT_URI "codexec://artifacts/"

/* initialize: a new session of who's, speaking version. */
enum cx_err cx_mcp_session_begin(struct cx_ctx *cx, const struct cx_principal *who,
                                 const char *version, struct cx_mcp_session *s) CX_MUSTCHECK;
/* The reaper's part: ends the sessions past their expiry (at most a
 * thousand a call); *ended counts them. */
enum cx_err cx_mcp_expire(struct cx_ctx *cx, int *ended) CX_MUSTCHECK;

/* A run_code call of the session, by its JSON-RPC id (as JSON text): begun,
 * its run named (*cancelled: a cancel came first), cancelled (run_id: its
 * run if named yet, else ""), ended. CX_ERR_NOT_FOUND: no such call. */
enum cx_err cx_mcp_call_begin(struct cx_ctx *cx, const struct cx_mcp_session *s,
                              const char *request_id) CX_MUSTCHECK;
enum cx_err cx_mcp_call_run(struct cx_ctx *cx, const struct cx_mcp_session *s,
                            const char *request_id, const char *run_id,
                            bool *cancelled) CX_MUSTCHECK;
enum cx_err cx_mcp_call_cancel(struct cx_ctx *cx, const struct cx_mcp_session *s,
                               const char *request_id, char run_id[37]) CX_MUSTCHECK;
void cx_mcp_call_end(struct cx_ctx *cx, const struct cx_mcp_session *s, const char *request_id);

/* What a tool call or a resource request works with. */
struct cx_mcp_call {
    struct cx_ctx *cx;
    const struct cx_principal *who;
    struct cx_mcp_session *s; /* initialize fills it */
    const struct cx_mcp_msg *m;
    const char *base; /* what links start with */
    const struct cx_mcp_sink *sink;
    char *msg;
    size_t msglen;
};

/* A protocol error response to m (no such tool): new reference. */
json_t *cx_mcp_protocol_error(const struct cx_mcp_msg *m, int code, const char *message);

/* tools/list's result (new reference). */
json_t *cx_mcp_tools_list(void);
/* tools/call: *result the CallToolResult, or a failure as cx_mcp_request. */
enum cx_err cx_mcp_tools_call(struct cx_mcp_call *c, json_t **result) CX_MUSTCHECK;
/* resources/list (the session's conversation's artifacts, in pages) and
 * resources/read. */
enum cx_err cx_mcp_resources_list(struct cx_mcp_call *c, json_t **result) CX_MUSTCHECK;
enum cx_err cx_mcp_resources_read(struct cx_mcp_call *c, json_t **result) CX_MUSTCHECK;

/* The bytes of the user's artifact version (0: current), at most max:
 * CX_ERR_TOO_LARGE beyond it (*d filled still). *data: malloc'ed. */
enum cx_err cx_mcp_artifact_bytes(struct cx_mcp_call *c, const char *id, int version, size_t max,
                                  struct cx_download *d, unsigned char **data,
                                  size_t *len) CX_MUSTCHECK;

/* Base64 (standard, padded) of data, as a JSON string; NULL on failure. */
json_t *cx_mcp_base64(const void *data, size_t len);

#endif
