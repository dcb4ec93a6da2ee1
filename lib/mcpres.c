/* MCP resources: the artifacts of the session's conversation, listed in
 * pages and read whole up to a size (beyond it, a signed link); and the
 * tools' descriptions (tools/list). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "download.h"
#include "mcp.h"
#include "util.h"

#define PAGE_SIZE       100
#define RESOURCE_INLINE (4u << 20) /* an artifact read inline; larger ones as a link */

/* --- Artifact bytes ----------------------------------------------------------- */

struct into {
    unsigned char *p;
    size_t len, cap;
};

static bool
into_mem(void *ctx, const void *data, size_t len)
{
    struct into *m = ctx;

    if (len > m->cap - m->len)
        return false; /* more than its size said */
    memcpy(m->p + m->len, data, len);
    m->len += len;
    return true;
}

enum cx_err
cx_mcp_artifact_bytes(struct cx_mcp_call *c, const char *id, int version, size_t max,
                      struct cx_download *d, unsigned char **data, size_t *len)
{
    struct into m = {0};
    enum cx_err rc;

    *data = NULL;
    *len = 0;
    if (version < 0)
        return CX_ERR_NOT_FOUND;
    rc = cx_download_resolve(c->cx, c->who->user, id, version, d);
    if (rc)
        return rc;
    if (d->size > max)
        return CX_ERR_TOO_LARGE;
    m.cap = (size_t)d->size;
    m.p = malloc(m.cap ? m.cap : 1);
    if (!m.p)
        return CX_ERR_NOMEM;
    if (m.cap)
        rc = cx_download_read(c->cx, d, 0, d->size - 1, into_mem, &m);
    if (rc == CX_OK && m.len != m.cap)
        rc = CX_ERR_IO;
    if (rc) {
        free(m.p);
        return rc;
    }
    *data = m.p;
    *len = m.len;
    return CX_OK;
}

/* --- resources/list ----------------------------------------------------------- */

/* The cursor: where the page starts, as the last page said. */
static bool
cursor_of(const json_t *params, size_t *at)
{
    json_t *cur = json_object_get(params, "cursor");
    const char *s = json_string_value(cur);
    char *end;

    *at = 0;
    if (!cur)
        return true;
    if (!s || !*s || strlen(s) > 9 || strspn(s, "0123456789") != strlen(s))
        return false;
    *at = (size_t)strtoul(s, &end, 10);
    return true;
}

static json_t *
resource_of(const json_t *a)
{
    const char *id = json_string_value(json_object_get(a, "artifact_id"));
    char uri[128];

    if (!id || strlen(id) > 40)
        return NULL;
    snprintf(uri, sizeof(uri), CX_MCP_ARTIFACT_URI "%s", id);
    return json_pack("{s:s,s:O,s:O,s:O,s:s}", "uri", uri, "name", json_object_get(a, "path"),
                     "mimeType", json_object_get(a, "mime_type"), "size",
                     json_object_get(a, "size"), "description",
                     "an artifact of this session's conversation (its current version)");
}

enum cx_err
cx_mcp_resources_list(struct cx_mcp_call *c, json_t **result)
{
    json_t *list = NULL, *arts, *res;
    size_t at, n;
    enum cx_err rc;

    if (!cursor_of(c->m->params, &at)) {
        snprintf(c->msg, c->msglen, "the cursor is not one resources/list gave");
        return CX_ERR_INVALID;
    }
    rc = cx_artifact_list(c->cx, c->who->user, c->s->conversation, &list);
    if (rc)
        return rc;
    arts = json_object_get(list, "artifacts");
    n = json_array_size(arts);
    res = json_array();
    for (size_t i = at; res && i < n && i < at + PAGE_SIZE; i++) {
        json_t *r = resource_of(json_array_get(arts, i));
        if (r)
            json_array_append_new(res, r);
    }
    *result = res ? json_pack("{s:o}", "resources", res) : NULL;
    if (*result && at + PAGE_SIZE < n) {
        char next[24];
        snprintf(next, sizeof(next), "%zu", at + PAGE_SIZE);
        json_object_set_new(*result, "nextCursor", json_string(next));
    }
    json_decref(list);
    return *result ? CX_OK : CX_ERR_NOMEM;
}

/* --- resources/read ------------------------------------------------------------ */

/* codexec://artifacts/<uuid>[?version=<n>] into id and version (0:
 * current). */
static bool
parse_uri(const char *uri, char id[37], int *version)
{
    size_t plen = strlen(CX_MCP_ARTIFACT_URI);
    const char *rest;

    *version = 0;
    if (!uri || strncmp(uri, CX_MCP_ARTIFACT_URI, plen) != 0 || strlen(uri + plen) < 36)
        return false;
    snprintf(id, 37, "%.36s", uri + plen);
    rest = uri + plen + 36;
    if (!*rest)
        return cx_uuid_valid(id);
    if (strncmp(rest, "?version=", 9) != 0 || !rest[9] || strlen(rest + 9) > 9 ||
        strspn(rest + 9, "0123456789") != strlen(rest + 9))
        return false;
    *version = (int)strtol(rest + 9, NULL, 10);
    return *version > 0 && cx_uuid_valid(id);
}

static bool
textual(const char *mime)
{
    return !strncmp(mime, "text/", 5) || !strncmp(mime, "application/json", 16) ||
           !strncmp(mime, "image/svg+xml", 13);
}

/* Too large to send inline: a signed link, for a browser or a fetch. */
static json_t *
as_link(struct cx_mcp_call *c, const char *uri, const struct cx_download *d)
{
    json_t *link = cx_link_sign(c->cx, c->who, d, c->cx->cfg->link_default_expiry), *out = NULL;
    char *url = NULL;

    if (link &&
        asprintf(&url, "%s%s", c->base, json_string_value(json_object_get(link, "url"))) >= 0)
        out = json_pack("{s:s,s:s,s:s}", "uri", uri, "mimeType", "text/uri-list", "text", url);
    free(url);
    json_decref(link);
    return out;
}

enum cx_err
cx_mcp_resources_read(struct cx_mcp_call *c, json_t **result)
{
    const char *uri = json_string_value(json_object_get(c->m->params, "uri"));
    struct cx_download d;
    unsigned char *data = NULL;
    json_t *content = NULL, *v;
    char id[37];
    size_t len;
    int version;
    enum cx_err rc;

    if (!parse_uri(uri, id, &version)) {
        snprintf(c->msg, c->msglen, "no such resource (" CX_MCP_ARTIFACT_URI "<id>[?version=N])");
        return CX_ERR_NOT_FOUND;
    }
    rc = cx_mcp_artifact_bytes(c, id, version, RESOURCE_INLINE, &d, &data, &len);
    if (rc == CX_ERR_TOO_LARGE)
        content = as_link(c, uri, &d);
    else if (rc)
        return rc;
    else if (textual(d.mime) && (v = json_stringn((const char *)data, len)))
        content = json_pack("{s:s,s:s,s:o}", "uri", uri, "mimeType", d.mime, "text", v);
    else if ((v = cx_mcp_base64(data, len)))
        content = json_pack("{s:s,s:s,s:o}", "uri", uri, "mimeType", d.mime, "blob", v);
    free(data);
    *result = content ? json_pack("{s:[o]}", "contents", content) : NULL;
    return *result ? CX_OK : CX_ERR_NOMEM;
}

/* --- tools/list -------------------------------------------------------------- */

#define CID_ARG                                                                                    \
    "\"conversation_id\": {\"type\": \"string\", \"pattern\": \"^[A-Za-z0-9._:-]{1,128}$\","       \
    " \"description\": \"the conversation to work in (default: this MCP session's own)\"}"
#define OBJ_OUT(props, req)                                                                        \
    "{\"type\": \"object\", \"properties\": {" props "}, \"required\": [" req "]}"

/* clang-format off */
static const char tools_json[] =
    "{\"tools\": ["
    "{\"name\": \"run_code\", \"title\": \"Run code\","
    " \"description\": \"Runs code in the conversation's sandboxed, stateful kernel (variables,"
    " imports and files persist across calls). Files the code creates or changes in its working"
    " directory become artifacts (resource links). Returns the output, the error if any, PNG"
    " figures as images, and the whole answer in structuredContent.\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {"
    "\"code\": {\"type\": \"string\", \"description\": \"the code to run\"},"
    " \"language\": {\"type\": \"string\", \"enum\": [\"python\", \"javascript\", \"r\"],"
    " \"description\": \"default python; a conversation keeps the language it started with\"},"
    " " CID_ARG ","
    " \"timeout\": {\"type\": \"number\", \"exclusiveMinimum\": 0, \"description\": \"seconds\"},"
    " \"inputs\": {\"type\": \"array\", \"items\": {\"type\": \"string\"},"
    " \"description\": \"artifact ids to place in the workspace first\"},"
    " \"output\": {\"type\": \"string\", \"enum\": [\"tail\", \"full\"]}},"
    " \"required\": [\"code\"], \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"run_id\": {\"type\": \"string\"}, \"status\": {\"type\": \"string\"}",
                                  "\"run_id\", \"status\"") ","
    " \"annotations\": {\"readOnlyHint\": false, \"destructiveHint\": true, \"openWorldHint\": false}},"
    "{\"name\": \"write_file\", \"title\": \"Write a file\","
    " \"description\": \"Writes a file into the conversation's live workspace (parents made): text"
    " as content, bytes as content_base64. The code sees it at once; it is an input, not an"
    " artifact.\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {"
    "\"path\": {\"type\": \"string\", \"description\": \"relative to the workspace\"},"
    " \"content\": {\"type\": \"string\"}, \"content_base64\": {\"type\": \"string\"}, " CID_ARG "},"
    " \"required\": [\"path\"], \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"path\": {\"type\": \"string\"}, \"size\": {\"type\": \"integer\"},"
                                  " \"sha256\": {\"type\": \"string\"}",
                                  "\"path\", \"size\", \"sha256\"") ","
    " \"annotations\": {\"readOnlyHint\": false, \"destructiveHint\": true, \"idempotentHint\": true,"
    " \"openWorldHint\": false}},"
    "{\"name\": \"read_file\", \"title\": \"Read a file\","
    " \"description\": \"Reads a file of the conversation's live workspace (at most 4 MiB): text"
    " as text, images as images, other bytes as an embedded blob.\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {"
    "\"path\": {\"type\": \"string\"}, " CID_ARG "},"
    " \"required\": [\"path\"], \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"path\": {\"type\": \"string\"}, \"size\": {\"type\": \"integer\"},"
                                  " \"sha256\": {\"type\": \"string\"}, \"mime_type\": {\"type\": \"string\"}",
                                  "\"path\", \"size\", \"sha256\", \"mime_type\"") ","
    " \"annotations\": {\"readOnlyHint\": true, \"openWorldHint\": false}},"
    "{\"name\": \"list_files\", \"title\": \"List files\","
    " \"description\": \"Lists a directory of the conversation's live workspace (at most 10000"
    " entries).\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {"
    "\"path\": {\"type\": \"string\", \"description\": \"a directory; default the workspace\"},"
    " \"recursive\": {\"type\": \"boolean\"}, " CID_ARG "}, \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"files\": {\"type\": \"array\"}, \"truncated\": {\"type\": \"boolean\"}",
                                  "\"files\", \"truncated\"") ","
    " \"annotations\": {\"readOnlyHint\": true, \"openWorldHint\": false}},"
    "{\"name\": \"list_artifacts\", \"title\": \"List artifacts\","
    " \"description\": \"Lists the conversation's artifacts: what runs captured and what was"
    " uploaded, each with its current version.\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {" CID_ARG "},"
    " \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"artifacts\": {\"type\": \"array\"}", "\"artifacts\"") ","
    " \"annotations\": {\"readOnlyHint\": true, \"openWorldHint\": false}},"
    "{\"name\": \"get_download_link\", \"title\": \"Get a download link\","
    " \"description\": \"A signed link to an artifact that a browser can open without a key,"
    " until it expires.\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {"
    "\"artifact_id\": {\"type\": \"string\"}, \"version\": {\"type\": \"integer\", \"minimum\": 1},"
    " \"expires_in\": {\"type\": \"integer\", \"minimum\": 1, \"description\": \"seconds\"}},"
    " \"required\": [\"artifact_id\"], \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"url\": {\"type\": \"string\"}, \"expires_at\": {\"type\": \"string\"},"
                                  " \"version\": {\"type\": \"integer\"}",
                                  "\"url\", \"expires_at\", \"version\"") ","
    " \"annotations\": {\"readOnlyHint\": true, \"openWorldHint\": false}},"
    "{\"name\": \"reset_session\", \"title\": \"Reset the session\","
    " \"description\": \"Ends the conversation's kernel and workspace (artifacts stay); the next"
    " run starts afresh.\","
    " \"inputSchema\": {\"type\": \"object\", \"properties\": {" CID_ARG "},"
    " \"additionalProperties\": false},"
    " \"outputSchema\": " OBJ_OUT("\"conversation_id\": {\"type\": \"string\"}, \"closed\": {\"type\": \"boolean\"}",
                                  "\"conversation_id\", \"closed\"") ","
    " \"annotations\": {\"readOnlyHint\": false, \"destructiveHint\": true, \"idempotentHint\": true,"
    " \"openWorldHint\": false}}"
    "]}";
/* clang-format on */

json_t *
cx_mcp_tools_list(void)
{
    return json_loads(tools_json, 0, NULL);
}
