/* The Model Context Protocol on /mcp (SPEC §10.6): JSON-RPC 2.0 messages
 * read as hostile input, the lifecycle (initialize, ping, logging), and
 * the dispatch to the tools and resources (mcptools.c). The transport
 * (HTTP status, headers, event streams) is codexec-fcgi's (fcgi/mcp.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http.h"
#include "mcp.h"
#include "util.h"

#define MCP_ID_MAX     256 /* bytes of a request id we echo back */
#define MCP_METHOD_MAX 128

static const char *const versions[] = {CX_MCP_VERSIONS};
#define NVERSIONS (sizeof(versions) / sizeof(versions[0]))

/* --- Messages --------------------------------------------------------------- */

static json_t *
rpc_error(const json_t *id, int code, const char *message, json_t *data)
{
    json_t *e = json_pack("{s:i,s:s}", "code", code, "message", message), *out;

    if (e && data && json_object_set(e, "data", data)) {
        json_decref(e);
        return NULL;
    }
    /* (json_pack takes e's reference, also when it fails) */
    out = e ? json_pack("{s:s,s:o}", "jsonrpc", "2.0", "error", e) : NULL;
    if (out && id && json_object_set(out, "id", (json_t *)id)) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* The response carrying result (its reference taken, also on failure). */
static json_t *
rpc_result(const json_t *id, json_t *result)
{
    return result ? json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result", result) : NULL;
}

/* A batch: the body's first character that is not white space is '['. */
static bool
is_batch(const char *body, size_t len)
{
    size_t i = 0;

    while (i < len && strchr(" \t\r\n", body[i]))
        i++;
    return i < len && body[i] == '[';
}

static bool
id_ok(const json_t *id)
{
    return (json_is_string(id) && json_string_length(id) <= MCP_ID_MAX) || json_is_integer(id);
}

/* The members of a JSON-RPC 2.0 message: a request (method, id), a
 * notification (method), a response (result or error, id). */
static const char *
shape_error(json_t *o)
{
    json_t *method = json_object_get(o, "method"), *id = json_object_get(o, "id");

    if (!json_is_string(json_object_get(o, "jsonrpc")) ||
        strcmp(json_string_value(json_object_get(o, "jsonrpc")), "2.0") != 0)
        return "jsonrpc must be \"2.0\"";
    if (id && !id_ok(id))
        return "id must be a string (at most 256 bytes) or an integer";
    if (method && (!json_is_string(method) || json_string_length(method) == 0 ||
                   json_string_length(method) > MCP_METHOD_MAX))
        return "method must be a name";
    if (!method && (!id || (!json_object_get(o, "result") && !json_object_get(o, "error"))))
        return "a message is a request, a notification or a response";
    if (method && json_object_get(o, "params") && !json_is_object(json_object_get(o, "params")))
        return "params must be an object";
    return NULL;
}

enum cx_err
cx_mcp_parse(const char *body, size_t len, struct cx_mcp_msg *m, json_t **error)
{
    char msg[CX_MSG_MAX];
    const char *why;
    json_t *o = NULL;

    memset(m, 0, sizeof(*m));
    *error = NULL;
    if (is_batch(body, len)) {
        *error =
            rpc_error(NULL, -32600, "batches are not supported: send one message a request", NULL);
        return CX_ERR_INVALID;
    }
    if (cx_http_parse_json_object(body, len, &o, msg, sizeof(msg))) {
        *error = rpc_error(NULL, -32700, msg, NULL);
        return CX_ERR_INVALID;
    }
    why = shape_error(o);
    if (why) {
        json_decref(o);
        *error = rpc_error(NULL, -32600, why, NULL);
        return CX_ERR_INVALID;
    }
    m->root = o;
    m->method = json_string_value(json_object_get(o, "method"));
    m->id = m->method ? json_object_get(o, "id") : NULL;
    m->params = json_object_get(o, "params");
    return CX_OK;
}

void
cx_mcp_msg_cleanup(struct cx_mcp_msg *m)
{
    json_decref(m->root);
    memset(m, 0, sizeof(*m));
}

bool
cx_mcp_version_ok(const char *header)
{
    if (!header)
        return true;
    for (size_t i = 0; i < NVERSIONS; i++)
        if (!strcmp(header, versions[i]))
            return true;
    return false;
}

/* Whether origin is one of the list's entries (separated by commas or
 * white space), compared without case; a trailing slash is no part. */
bool
cx_mcp_origin_allowed(const struct cx_config *cfg, const char *origin)
{
    const char *p = cfg->mcp_allowed_origins;
    size_t olen;

    if (!origin)
        return true; /* no browser sent it */
    olen = strlen(origin);
    while (olen > 0 && origin[olen - 1] == '/')
        olen--;
    while (p && *p) {
        size_t n;
        p += strspn(p, ", \t");
        n = strcspn(p, ", \t");
        if (n == olen && n > 0 && !strncasecmp(p, origin, n))
            return true;
        p += n;
    }
    return false;
}

/* --- What a request is ------------------------------------------------------ */

static bool
is_method(const struct cx_mcp_msg *m, const char *name)
{
    return m->method && !strcmp(m->method, name);
}

static const char *
tool_name(const struct cx_mcp_msg *m)
{
    return is_method(m, "tools/call") ? json_string_value(json_object_get(m->params, "name"))
                                      : NULL;
}

bool
cx_mcp_on_lane(const struct cx_mcp_msg *m)
{
    static const char *const kernel_tools[] = {"run_code", "write_file", "read_file", "list_files",
                                               "reset_session"};
    const char *tool = tool_name(m);

    if (is_method(m, "resources/read"))
        return true; /* up to 4 MiB from storage: not on the workers that answer everyone */
    for (size_t i = 0; tool && i < sizeof(kernel_tools) / sizeof(kernel_tools[0]); i++)
        if (!strcmp(tool, kernel_tools[i]))
            return true;
    return false;
}

/* The request's progressToken (a string or an integer), or NULL. */
static json_t *
progress_token(const struct cx_mcp_msg *m)
{
    json_t *t = json_object_get(json_object_get(m->params, "_meta"), "progressToken");

    return id_ok(t) ? t : NULL;
}

bool
cx_mcp_streams(const struct cx_mcp_msg *m)
{
    const char *tool = tool_name(m);

    return tool && !strcmp(tool, "run_code") && progress_token(m);
}

/* --- The lifecycle ---------------------------------------------------------- */

/* The version asked for if we speak it, else our newest (the client
 * then decides whether it can go on). */
static const char *
agree_version(const json_t *params)
{
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));

    for (size_t i = 0; asked && i < NVERSIONS; i++)
        if (!strcmp(asked, versions[i]))
            return versions[i];
    return versions[0];
}

static enum cx_err
initialize(struct cx_mcp_call *c, json_t **result)
{
    const char *version = agree_version(c->m->params);
    enum cx_err rc;

    rc = cx_mcp_session_begin(c->cx, c->who, version, c->s);
    if (rc)
        return rc;
    *result = json_pack(
        "{s:s,s:{s:{s:b},s:{s:b,s:b},s:{}},s:{s:s,s:s,s:s},s:s}", "protocolVersion", version,
        "capabilities", "tools", "listChanged", 0, "resources", "listChanged", 0, "subscribe", 0,
        "logging", "serverInfo", "name", "codexec", "title", "codexec", "version", PACKAGE_VERSION,
        "instructions",
        "Runs code in a sandboxed, stateful Jupyter kernel: variables and files persist across "
        "run_code calls of this session (its conversation). Files the code writes become "
        "versioned artifacts (resources, and links for a browser). write_file/read_file/"
        "list_files work on the live workspace (/workspace, also /mnt/data in the kernel).");
    return *result ? CX_OK : CX_ERR_NOMEM;
}

static enum cx_err
set_level(struct cx_mcp_call *c, json_t **result)
{
    static const char *const levels[] = {"debug", "info",     "notice", "warning",
                                         "error", "critical", "alert",  "emergency"};
    const char *level = json_string_value(json_object_get(c->m->params, "level"));

    for (size_t i = 0; level && i < sizeof(levels) / sizeof(levels[0]); i++)
        if (!strcmp(level, levels[i])) {
            *result = json_object(); /* (codexec sends no log messages) */
            return *result ? CX_OK : CX_ERR_NOMEM;
        }
    snprintf(c->msg, c->msglen, "level must be one of RFC 5424's (debug ... emergency)");
    return CX_ERR_INVALID;
}

static enum cx_err
empty_result(struct cx_mcp_call *c, json_t **result)
{
    (void)c;
    *result = json_object();
    return *result ? CX_OK : CX_ERR_NOMEM;
}

static enum cx_err
tools_list(struct cx_mcp_call *c, json_t **result)
{
    if (json_object_get(c->m->params, "cursor")) {
        snprintf(c->msg, c->msglen, "tools/list has one page: no cursor is valid");
        return CX_ERR_INVALID;
    }
    *result = cx_mcp_tools_list();
    return *result ? CX_OK : CX_ERR_NOMEM;
}

static enum cx_err
templates_list(struct cx_mcp_call *c, json_t **result)
{
    (void)c;
    *result = json_pack("{s:[{s:s,s:s,s:s}]}", "resourceTemplates", "uriTemplate",
                        CX_MCP_ARTIFACT_URI "{artifact_id}", "name", "artifact", "description",
                        "An artifact of yours (its current version; ?version=N for another).");
    return *result ? CX_OK : CX_ERR_NOMEM;
}

static const struct {
    const char *method;
    enum cx_err (*fn)(struct cx_mcp_call *c, json_t **result);
} methods[] = {
    {"initialize", initialize},
    {"ping", empty_result},
    {"logging/setLevel", set_level},
    {"tools/list", tools_list},
    {"tools/call", cx_mcp_tools_call},
    {"resources/list", cx_mcp_resources_list},
    {"resources/read", cx_mcp_resources_read},
    {"resources/templates/list", templates_list},
};

enum cx_err
cx_mcp_request(struct cx_ctx *cx, const struct cx_principal *who, struct cx_mcp_session *s,
               const struct cx_mcp_msg *m, const char *base, const struct cx_mcp_sink *sink,
               json_t **out, char *msg, size_t msglen)
{
    struct cx_mcp_call c = {.cx = cx,
                            .who = who,
                            .s = s,
                            .m = m,
                            .base = base,
                            .sink = sink,
                            .msg = msg,
                            .msglen = msglen};
    json_t *result = NULL;
    enum cx_err rc;

    *out = NULL;
    msg[0] = '\0';
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        if (!is_method(m, methods[i].method))
            continue;
        rc = methods[i].fn(&c, &result);
        if (rc == CX_OK && !result)
            return CX_ERR_NOMEM;
        if (rc == CX_OK)
            *out = rpc_result(m->id, result);
        else if (rc == CX_DONE) /* a protocol error the call made: *result */
            *out = result;
        else
            return rc;
        return *out ? CX_OK : CX_ERR_NOMEM;
    }
    *out = rpc_error(m->id, -32601, "no such method", NULL);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

json_t *
cx_mcp_error(const struct cx_mcp_msg *m, enum cx_err rc, const char *msg, json_t *data)
{
    int code = -32603;

    switch (rc) {
    case CX_ERR_INVALID:
    case CX_ERR_INVALID_PATH:
    case CX_ERR_NOT_A_FILE:
    case CX_ERR_TOO_LARGE:
    case CX_ERR_INPUT_NOT_FOUND:
    case CX_ERR_LANGUAGE_MISMATCH:
    case CX_ERR_NOT_FOUND: code = -32602; break;
    default: break;
    }
    if (rc == CX_ERR_NOT_FOUND && m && is_method(m, "resources/read"))
        code = -32002;
    return rpc_error(m ? m->id : NULL, code, msg && *msg ? msg : cx_strerror(rc), data);
}

json_t *
cx_mcp_protocol_error(const struct cx_mcp_msg *m, int code, const char *message)
{
    return rpc_error(m->id, code, message, NULL);
}

void
cx_mcp_notify(struct cx_ctx *cx, const struct cx_principal *who, const struct cx_mcp_session *s,
              const struct cx_mcp_msg *m)
{
    json_t *rid = json_object_get(m->params, "requestId");
    char run_id[37], msg[CX_MSG_MAX], *text;
    json_t *out = NULL;

    if (!is_method(m, "notifications/cancelled") || !id_ok(rid))
        return; /* initialized, progress, roots: nothing to do */
    text = json_dumps(rid, JSON_ENCODE_ANY | JSON_COMPACT);
    if (text && cx_mcp_call_cancel(cx, s, text, run_id) == CX_OK && run_id[0] &&
        cx_run_cancel(cx, who->user, run_id, &out, msg, sizeof(msg)) == CX_OK)
        cx_log_info("mcp: a run_code call was cancelled by its client");
    json_decref(out);
    free(text);
}
