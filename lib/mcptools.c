/* MCP tools and resources (SPEC §10.6): each tool one call of the API's
 * own library (runs, a conversation's files, artifacts, links, sessions)
 * for the request's user, its arguments checked as hostile input, its
 * answer made into MCP content and structuredContent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "mcp.h"
#include "util.h"

#define IMAGE_MAX  (1u << 20)  /* a run's PNG result inline as image content */
#define IMAGES_MAX (4u << 20)  /* ... all of them together (the rest: resource_links) */
#define READ_MAX   (4u << 20)  /* read_file's file inline */
#define TEXT_MAX   (64u << 10) /* a result bundle's text/plain in the content */

static const char *
or_(const char *s, const char *otherwise)
{
    return s ? s : otherwise;
}

/* --- Arguments -------------------------------------------------------------- */

static enum cx_err
bad(struct cx_mcp_call *c, const char *what)
{
    snprintf(c->msg, c->msglen, "%s", what);
    return CX_ERR_INVALID;
}

/* Every argument is one the tool takes. */
static enum cx_err
known_args(struct cx_mcp_call *c, json_t *args, const char *const *names)
{
    const char *key;
    json_t *v;

    json_object_foreach(args, key, v)
    {
        bool ok = false;
        for (const char *const *n = names; *n && !ok; n++)
            ok = !strcmp(key, *n);
        if (!ok) {
            snprintf(c->msg, c->msglen, "unknown argument (the tool takes: see its inputSchema)");
            return CX_ERR_INVALID;
        }
    }
    return CX_OK;
}

/* A string argument (NULL when absent and not required). */
static enum cx_err
str_arg(struct cx_mcp_call *c, json_t *args, const char *name, bool required, const char **out)
{
    json_t *v = json_object_get(args, name);

    *out = json_string_value(v);
    if ((v && !json_is_string(v)) || (required && !v)) {
        snprintf(c->msg, c->msglen, "%s must be a string%s", name, required ? " (required)" : "");
        return CX_ERR_INVALID;
    }
    return CX_OK;
}

/* conversation_id, or the session's own conversation. */
static enum cx_err
conversation(struct cx_mcp_call *c, json_t *args, const char **cid)
{
    enum cx_err rc = str_arg(c, args, "conversation_id", false, cid);

    if (rc == CX_OK && !*cid)
        *cid = c->s->conversation;
    if (rc == CX_OK && !cx_conversation_id_valid(*cid))
        return bad(c, CX_CONVERSATION_RULE);
    return rc;
}

/* A workspace path argument, held to the path rules (empty_ok: "" is the
 * workspace itself). */
static enum cx_err
path_arg(struct cx_mcp_call *c, json_t *args, bool required, char out[CX_FILE_PATH_MAX + 1])
{
    const char *raw;
    enum cx_err rc = str_arg(c, args, "path", required, &raw);

    if (rc)
        return rc;
    return cx_files_path(raw ? raw : "", false, !required, out, c->msg, c->msglen);
}

/* --- Results ---------------------------------------------------------------- */

static json_t *
text_block(const char *text)
{
    return json_pack("{s:s,s:s}", "type", "text", "text", text);
}

/* A CallToolResult: content (stolen), structured (stolen, may be NULL). */
static json_t *
tool_result(json_t *content, json_t *structured, bool is_error)
{
    json_t *r = content ? json_pack("{s:o,s:b}", "content", content, "isError", is_error) : NULL;

    if (r && structured)
        json_object_set_new(r, "structuredContent", structured);
    else
        json_decref(structured);
    return r;
}

/* structured as the result, and as JSON text for a client that reads
 * content only (the spec's advice). */
static enum cx_err
structured_result(json_t *structured, json_t **result)
{
    char *text = structured ? json_dumps(structured, JSON_COMPACT) : NULL;

    *result = text ? tool_result(json_pack("[o]", text_block(text)), structured, false) : NULL;
    if (!*result && !text)
        json_decref(structured);
    free(text);
    return *result ? CX_OK : CX_ERR_NOMEM;
}

json_t *
cx_mcp_base64(const void *data, size_t len)
{
    size_t n = sodium_base64_ENCODED_LEN(len, sodium_base64_VARIANT_ORIGINAL);
    char *b = malloc(n);
    json_t *s = NULL;

    if (b) {
        sodium_bin2base64(b, n, data, len, sodium_base64_VARIANT_ORIGINAL);
        s = json_string(b);
    }
    free(b);
    return s;
}

/* Whether a type is text a client can show as is. */
static bool
textual(const char *mime)
{
    return !strncmp(mime, "text/", 5) || !strncmp(mime, "application/json", 16) ||
           !strncmp(mime, "application/xml", 15) || !strncmp(mime, "image/svg+xml", 13);
}

/* --- The files tools -------------------------------------------------------- */

struct memread {
    const unsigned char *p;
    size_t left;
};

static ssize_t
mem_read(void *ctx, void *buf, size_t n)
{
    struct memread *m = ctx;

    if (n > m->left)
        n = m->left;
    memcpy(buf, m->p, n);
    m->p += n;
    m->left -= n;
    return (ssize_t)n;
}

/* content (text) or content_base64, decoded: *data malloc'ed. */
static enum cx_err
file_content(struct cx_mcp_call *c, json_t *args, unsigned char **data, size_t *len)
{
    const char *text, *b64;
    size_t blen;

    if (str_arg(c, args, "content", false, &text) ||
        str_arg(c, args, "content_base64", false, &b64))
        return CX_ERR_INVALID;
    if (!text == !b64)
        return bad(c, "give content (text) or content_base64, one of them");
    if (text) {
        *len = json_string_length(json_object_get(args, "content"));
        *data = malloc(*len + 1);
        if (*data)
            memcpy(*data, text, *len);
        return *data ? CX_OK : CX_ERR_NOMEM;
    }
    blen = strlen(b64);
    *data = malloc(blen / 4 * 3 + 3);
    if (!*data)
        return CX_ERR_NOMEM;
    if (sodium_base642bin(*data, blen / 4 * 3 + 3, b64, blen, "\r\n", len, NULL,
                          sodium_base64_VARIANT_ORIGINAL) &&
        sodium_base642bin(*data, blen / 4 * 3 + 3, b64, blen, "\r\n", len, NULL,
                          sodium_base64_VARIANT_ORIGINAL_NO_PADDING)) {
        free(*data);
        *data = NULL;
        return bad(c, "content_base64 is not base64");
    }
    return CX_OK;
}

static enum cx_err
write_file(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    char path[CX_FILE_PATH_MAX + 1], clen[24];
    unsigned char *data = NULL;
    const char *cid;
    json_t *out = NULL;
    size_t len = 0;
    enum cx_err rc;

    rc = path_arg(c, args, true, path);
    if (rc == CX_OK)
        rc = conversation(c, args, &cid);
    if (rc == CX_OK)
        rc = file_content(c, args, &data, &len);
    if (rc == CX_OK) {
        struct memread m = {data, len};
        snprintf(clen, sizeof(clen), "%zu", len);
        rc = cx_files_write(c->cx, c->who->user, cid, path, clen, mem_read, &m, &out, c->msg,
                            c->msglen);
    }
    free(data);
    return rc ? rc : structured_result(out, result);
}

struct memfile {
    uint64_t size;
    char sha256[65], mime[128];
    unsigned char *data;
    size_t len;
    bool too_large;
};

static bool
file_head(void *ctx, uint64_t size, const char *sha256, const char *mime)
{
    struct memfile *f = ctx;

    f->size = size;
    snprintf(f->sha256, sizeof(f->sha256), "%s", sha256);
    snprintf(f->mime, sizeof(f->mime), "%s", mime);
    if (size > READ_MAX) {
        f->too_large = true;
        return false;
    }
    f->data = malloc(size ? size : 1);
    return f->data != NULL;
}

static bool
file_data(void *ctx, const void *data, size_t len)
{
    struct memfile *f = ctx;

    if (len > f->size - f->len)
        return false;
    memcpy(f->data + f->len, data, len);
    f->len += len;
    return true;
}

/* A file's bytes as content: text, an image, or an embedded blob. */
static json_t *
file_block(const struct memfile *f, const char *uri)
{
    json_t *v = NULL;

    if (textual(f->mime) && (v = json_stringn((const char *)f->data, f->len)))
        return json_pack("{s:s,s:o}", "type", "text", "text", v);
    v = cx_mcp_base64(f->data, f->len);
    if (!v)
        return NULL;
    if (!strncmp(f->mime, "image/", 6))
        return json_pack("{s:s,s:o,s:s}", "type", "image", "data", v, "mimeType", f->mime);
    return json_pack("{s:s,s:{s:s,s:s,s:o}}", "type", "resource", "resource", "uri", uri,
                     "mimeType", f->mime, "blob", v);
}

static enum cx_err
read_file(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    char path[CX_FILE_PATH_MAX + 1];
    struct memfile f = {0};
    struct cx_files_reader rd = {file_head, file_data, &f, true};
    const char *cid;
    struct cx_buf uri;
    enum cx_err rc;

    rc = path_arg(c, args, true, path);
    if (rc == CX_OK)
        rc = conversation(c, args, &cid);
    if (rc == CX_OK)
        rc = cx_files_read(c->cx, c->who->user, cid, path, &rd, c->msg, c->msglen);
    if (rc == CX_OK && f.too_large) {
        snprintf(c->msg, c->msglen,
                 "the file is larger than read_file's 4 MiB; read it with GET"
                 " /v1/conversations/{id}/files/{path}");
        rc = CX_ERR_TOO_LARGE;
    }
    if (rc == CX_OK && f.len != f.size)
        rc = CX_ERR_IO;
    if (rc == CX_OK) {
        cx_buf_init(&uri, 3 * CX_FILE_PATH_MAX + 512);
        cx_buf_addf(&uri, "codexec://conversations/%s/files/", cid);
        cx_http_pct_encode(&uri, path, "-_.~/");
        *result = cx_buf_err(&uri) ? NULL
                                   : tool_result(json_pack("[o]", file_block(&f, uri.data)),
                                                 json_pack("{s:s,s:I,s:s,s:s}", "path", path,
                                                           "size", (json_int_t)f.size, "sha256",
                                                           f.sha256, "mime_type", f.mime),
                                                 false);
        cx_buf_cleanup(&uri);
        rc = *result ? CX_OK : CX_ERR_NOMEM;
    }
    free(f.data);
    return rc;
}

static enum cx_err
list_files(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    char path[CX_FILE_PATH_MAX + 1];
    json_t *rec = json_object_get(args, "recursive"), *out = NULL;
    const char *cid;
    enum cx_err rc;

    if (rec && !json_is_boolean(rec))
        return bad(c, "recursive must be true or false");
    rc = path_arg(c, args, false, path);
    if (rc == CX_OK)
        rc = conversation(c, args, &cid);
    if (rc == CX_OK)
        rc = cx_files_list(c->cx, c->who->user, cid, path, json_is_true(rec), &out, c->msg,
                           c->msglen);
    return rc ? rc : structured_result(out, result);
}

/* --- Artifacts, links, sessions -------------------------------------------- */

static enum cx_err
list_artifacts(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    json_t *out = NULL;
    const char *cid;
    enum cx_err rc = conversation(c, args, &cid);

    if (rc == CX_OK)
        rc = cx_artifact_list(c->cx, c->who->user, cid, &out);
    return rc ? rc : structured_result(out, result);
}

static enum cx_err
get_download_link(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    const char *id;
    json_t *body, *out = NULL;
    enum cx_err rc = str_arg(c, args, "artifact_id", true, &id);

    if (rc)
        return rc;
    body = json_object();
    if (!body)
        return CX_ERR_NOMEM;
    if (json_object_get(args, "version"))
        json_object_set(body, "version", json_object_get(args, "version"));
    if (json_object_get(args, "expires_in"))
        json_object_set(body, "expires_in", json_object_get(args, "expires_in"));
    rc = cx_link_create(c->cx, c->who, id, body, &out, c->msg, c->msglen);
    json_decref(body);
    if (rc == CX_OK) {
        /* absolute: the agent hands it to a browser that knows no host */
        char *url = NULL;
        if (asprintf(&url, "%s%s", c->base, json_string_value(json_object_get(out, "url"))) < 0)
            url = NULL;
        rc = url && !json_object_set_new(out, "url", json_string(url)) ? CX_OK : CX_ERR_NOMEM;
        free(url);
    }
    if (rc)
        json_decref(out);
    return rc ? rc : structured_result(out, result);
}

static enum cx_err
reset_session(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    const char *cid;
    enum cx_err rc = conversation(c, args, &cid);

    if (rc == CX_OK)
        rc = cx_session_close(c->cx, c->who->user, cid);
    if (rc == CX_ERR_CONFLICT)
        snprintf(c->msg, c->msglen, "a run holds the conversation; reset it once the run ended");
    if (rc && rc != CX_ERR_NOT_FOUND)
        return rc;
    return structured_result(json_pack("{s:s,s:b}", "conversation_id", cid, "closed", rc == CX_OK),
                             result);
}

/* --- run_code ---------------------------------------------------------------- */

/* The run's events: its id (for notifications/cancelled), and with a
 * progressToken its output as notifications/progress. */
struct listen {
    struct cx_mcp_call *c;
    const char *rid; /* the call's id, as JSON text */
    json_t *token;
    double progress;
};

static void
note_run(struct listen *l, json_t *data)
{
    const char *run_id = json_string_value(json_object_get(data, "run_id"));
    char msg[CX_MSG_MAX];
    json_t *out = NULL;
    bool cancelled = false;

    if (run_id && cx_mcp_call_run(l->c->cx, l->c->s, l->rid, run_id, &cancelled) == CX_OK &&
        cancelled &&
        cx_run_cancel(l->c->cx, l->c->who->user, run_id, &out, msg, sizeof(msg)) == CX_OK)
        cx_log_info("mcp: a run_code call cancelled before its run began");
    json_decref(out);
}

static bool
run_event(void *ctx, const char *name, json_t *data, unsigned id)
{
    struct listen *l = ctx;
    const char *text = json_string_value(json_object_get(data, "text"));
    json_t *n;
    char what[160];
    bool ok;

    (void)id;
    if (name && !strcmp(name, "run"))
        note_run(l, data);
    if (!l->token)
        return false; /* nobody listens to the rest */
    if (!name)
        return l->c->sink->fn(l->c->sink->ctx, NULL);
    if (!strcmp(name, "status") || !strcmp(name, "display")) {
        snprintf(what, sizeof(what), "%s: %.120s", name,
                 or_(json_string_value(
                         json_object_get(data, !strcmp(name, "status") ? "state" : "mime_type")),
                     ""));
        text = what;
    }
    if (!text || !strcmp(name, "run"))
        return true;
    n = json_pack("{s:s,s:s,s:{s:O,s:f,s:s}}", "jsonrpc", "2.0", "method", "notifications/progress",
                  "params", "progressToken", l->token, "progress", ++l->progress, "message", text);
    ok = !n || l->c->sink->fn(l->c->sink->ctx, n);
    json_decref(n);
    return ok;
}

/* The run request's body from run_code's arguments. */
static enum cx_err
run_body(struct cx_mcp_call *c, json_t *args, json_t **body)
{
    static const char *const pass[] = {"code", "language", "timeout", "inputs", "output"};
    const char *cid, *code;
    enum cx_err rc = str_arg(c, args, "code", true, &code);

    if (rc == CX_OK)
        rc = conversation(c, args, &cid);
    if (rc)
        return rc;
    *body = json_pack("{s:s}", "conversation_id", cid);
    for (size_t i = 0; *body && i < sizeof(pass) / sizeof(pass[0]); i++)
        if (json_object_get(args, pass[i]))
            json_object_set(*body, pass[i], json_object_get(args, pass[i]));
    return *body ? CX_OK : CX_ERR_NOMEM;
}

/* The text of what the run said: its output, a value, its error. */
static void
run_texts(json_t *content, const json_t *a)
{
    const char *out = json_string_value(json_object_get(a, "stdout"));
    const char *err = json_string_value(json_object_get(a, "stderr"));
    const char *name = json_string_value(json_object_get(a, "error_name"));
    struct cx_buf b;

    out = out ? out : json_string_value(json_object_get(a, "stdout_tail"));
    err = err ? err : json_string_value(json_object_get(a, "stderr_tail"));
    cx_buf_init(&b, 64u << 20);
    cx_buf_adds(&b, out ? out : "");
    if (err && *err)
        cx_buf_addf(&b, "%s[stderr]\n%s", b.len && b.data[b.len - 1] != '\n' ? "\n" : "", err);
    if (json_is_true(json_object_get(a, "result_present")) &&
        !json_is_null(json_object_get(a, "result")) && json_object_get(a, "result")) {
        char *v = json_dumps(json_object_get(a, "result"), JSON_ENCODE_ANY | JSON_COMPACT);
        cx_buf_addf(&b, "%sresult: %.65536s", b.len ? "\n" : "", v ? v : "");
        free(v);
    }
    if (name)
        cx_buf_addf(&b, "%s%s: %s\n%s", b.len ? "\n" : "", name,
                    or_(json_string_value(json_object_get(a, "error")), ""),
                    or_(json_string_value(json_object_get(a, "traceback")), ""));
    if (!cx_buf_err(&b))
        json_array_append_new(content, text_block(b.len ? b.data : "(no output)"));
    cx_buf_cleanup(&b);
}

/* PNG results inline (at most 1 MiB each), text/plain values as text. */
static void
run_results(struct cx_mcp_call *c, json_t *content, const json_t *a)
{
    size_t i, left = IMAGES_MAX;
    json_t *r;

    json_array_foreach(json_object_get(a, "results"), i, r)
    {
        json_t *data = json_object_get(r, "data"), *png = json_object_get(data, "image/png");
        const char *plain = json_string_value(json_object_get(data, "text/plain"));
        const char *id = json_string_value(json_object_get(png, "artifact_id"));
        struct cx_download d;
        unsigned char *bytes = NULL;
        size_t len;

        if (id && left > 0 &&
            cx_mcp_artifact_bytes(c, id, (int)json_integer_value(json_object_get(png, "version")),
                                  left < IMAGE_MAX ? left : IMAGE_MAX, &d, &bytes, &len) == CX_OK) {
            left -= len;
            json_array_append_new(content,
                                  json_pack("{s:s,s:o,s:s}", "type", "image", "data",
                                            cx_mcp_base64(bytes, len), "mimeType", "image/png"));
        } else if (!png && plain && strlen(plain) <= TEXT_MAX &&
                   !strcmp(or_(json_string_value(json_object_get(r, "type")), ""),
                           "execute_result"))
            json_array_append_new(content, text_block(plain));
        free(bytes);
    }
}

/* A resource_link per artifact the run captured. */
static void
run_links(json_t *content, const json_t *a)
{
    size_t i;
    json_t *art, *zero = json_integer(0);

    json_array_foreach(json_object_get(a, "artifacts"), i, art)
    {
        const char *id = json_string_value(json_object_get(art, "artifact_id"));
        json_t *version = json_object_get(art, "version");
        char uri[160];

        if (!id || strlen(id) > 40 || !json_is_integer(version))
            continue;
        snprintf(uri, sizeof(uri), CX_MCP_ARTIFACT_URI "%s?version=%lld", id,
                 (long long)json_integer_value(version));
        json_array_append_new(
            content,
            json_pack("{s:s,s:s,s:s,s:s,s:O}", "type", "resource_link", "uri", uri, "name",
                      or_(json_string_value(json_object_get(art, "path")), id), "mimeType",
                      or_(json_string_value(json_object_get(art, "mime_type")),
                          "application/octet-stream"),
                      "size",
                      json_is_integer(json_object_get(art, "size")) ? json_object_get(art, "size")
                                                                    : zero));
    }
    json_decref(zero);
}

static json_t *
run_result(struct cx_mcp_call *c, json_t *answer, bool pending)
{
    json_t *content = json_array();

    if (!content) {
        json_decref(answer);
        return NULL;
    }
    if (pending) {
        json_array_append_new(content, text_block("The run waits for approval (run_id in "
                                                  "structuredContent)."));
        return tool_result(content, answer, false);
    }
    run_texts(content, answer);
    run_results(c, content, answer);
    run_links(content, answer);
    return tool_result(content, answer,
                       strcmp(or_(json_string_value(json_object_get(answer, "status")), ""), "ok"));
}

static enum cx_err
run_code(struct cx_mcp_call *c, json_t *args, json_t **result)
{
    struct listen l = {.c = c};
    struct cx_run_sink sink = {.fn = run_event, .ctx = &l, .unkept = true};
    struct cx_run_request req;
    json_t *body = NULL, *out = NULL;
    bool pending = false;
    char *rid;
    enum cx_err rc = run_body(c, args, &body);

    if (rc)
        return rc;
    rc = cx_run_request_parse(c->cx->cfg, body, &req, c->msg, c->msglen);
    json_decref(body);
    if (rc)
        return rc;
    l.token = json_object_get(json_object_get(c->m->params, "_meta"), "progressToken");
    l.token = c->sink && (json_is_string(l.token) || json_is_integer(l.token)) ? l.token : NULL;
    rid = json_dumps(c->m->id, JSON_ENCODE_ANY | JSON_COMPACT);
    l.rid = rid;
    rc = rid ? cx_mcp_call_begin(c->cx, c->s, rid) : CX_ERR_NOMEM;
    if (rc == CX_OK) {
        rc = cx_run_submit_stream(c->cx, c->who, &req, &sink, &out, &pending, c->msg, c->msglen);
        cx_mcp_call_end(c->cx, c->s, rid);
    }
    free(rid);
    cx_run_request_cleanup(&req);
    if (rc == CX_OK && !(*result = run_result(c, out, pending)))
        rc = CX_ERR_NOMEM;
    else if (rc)
        json_decref(out);
    return rc;
}

/* --- The table --------------------------------------------------------------- */

static const char *const a_run[] = {"code",   "language", "conversation_id", "timeout", "inputs",
                                    "output", NULL};
static const char *const a_write[] = {"path", "content", "content_base64", "conversation_id", NULL};
static const char *const a_read[] = {"path", "conversation_id", NULL};
static const char *const a_list[] = {"path", "recursive", "conversation_id", NULL};
static const char *const a_cid[] = {"conversation_id", NULL};
static const char *const a_link[] = {"artifact_id", "version", "expires_in", NULL};

static const struct {
    const char *name;
    const char *const *args;
    enum cx_err (*fn)(struct cx_mcp_call *c, json_t *args, json_t **result);
} tools[] = {
    {"run_code", a_run, run_code},
    {"write_file", a_write, write_file},
    {"read_file", a_read, read_file},
    {"list_files", a_list, list_files},
    {"list_artifacts", a_cid, list_artifacts},
    {"get_download_link", a_link, get_download_link},
    {"reset_session", a_cid, reset_session},
};

enum cx_err
cx_mcp_tools_call(struct cx_mcp_call *c, json_t **result)
{
    const char *name = json_string_value(json_object_get(c->m->params, "name"));
    json_t *args = json_object_get(c->m->params, "arguments");
    json_t *empty = NULL;
    enum cx_err rc;

    for (size_t i = 0; name && i < sizeof(tools) / sizeof(tools[0]); i++) {
        if (strcmp(name, tools[i].name) != 0)
            continue;
        if (args && !json_is_object(args))
            return bad(c, "arguments must be an object");
        if (!args && !(args = empty = json_object()))
            return CX_ERR_NOMEM;
        rc = known_args(c, args, tools[i].args);
        if (rc == CX_OK)
            rc = tools[i].fn(c, args, result);
        json_decref(empty);
        return rc;
    }
    *result = cx_mcp_protocol_error(c->m, -32602, "no such tool (see tools/list)");
    return *result ? CX_DONE : CX_ERR_NOMEM;
}
