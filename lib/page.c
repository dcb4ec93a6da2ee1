#include <stdio.h>
#include <string.h>

#include "artifact.h"
#include "config.h"
#include "download.h"
#include "files.h"
#include "page.h"
#include "util.h"

void
cx_page_escape(struct cx_buf *b, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': cx_buf_adds(b, "&amp;"); break;
        case '<': cx_buf_adds(b, "&lt;"); break;
        case '>': cx_buf_adds(b, "&gt;"); break;
        case '"': cx_buf_adds(b, "&quot;"); break;
        case '\'': cx_buf_adds(b, "&#39;"); break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\t')
                cx_buf_adds(b, "&#xFFFD;"); /* control characters never render */
            else
                cx_buf_add(b, s, 1);
        }
    }
}

static void
human_size(long long n, char *out, size_t outlen)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;

    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, outlen, "%lld B", n);
    else
        snprintf(out, outlen, "%.1f %s", v, units[u]);
}

static const char style[] =
    "body{font:15px/1.4 system-ui,sans-serif;margin:2em;color:#222;background:#fafafa}"
    "h1{font-size:1.3em}table{border-collapse:collapse;width:100%;background:#fff}"
    "th,td{border-bottom:1px solid #ddd;padding:.5em;text-align:left;vertical-align:top}"
    "th{background:#f0f0f0}td.n{text-align:right;white-space:nowrap}"
    "img.preview{max-width:240px;max-height:180px;display:block;border:1px solid #ccc}"
    "code{font-size:.9em}.empty{color:#777}h2{font-size:1.1em;margin-top:2em}";

/* What a link to a listed artifact's current version is made of. */
static void
link_download(json_t *a, const char *id, struct cx_download *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->artifact_id, sizeof(d->artifact_id), "%s", id);
    d->version = (int)json_integer_value(json_object_get(a, "current_version"));
    snprintf(d->filename, sizeof(d->filename), "%s",
             json_string_value(json_object_get(a, "filename")));
    snprintf(d->mime, sizeof(d->mime), "%s", json_string_value(json_object_get(a, "mime_type")));
    snprintf(d->sha256, sizeof(d->sha256), "%s", json_string_value(json_object_get(a, "sha256")));
    snprintf(d->key, sizeof(d->key), "%s", json_string_value(json_object_get(a, "storage_key")));
}

/* One artifact's row, its preview and download link signed for who (the
 * listing is the user's: signing needs no further query). */
static enum cx_err
page_row(struct cx_ctx *cx, const struct cx_principal *who, json_t *a, struct cx_buf *out)
{
    const char *id = json_string_value(json_object_get(a, "artifact_id"));
    const char *kind = json_string_value(json_object_get(a, "kind"));
    struct cx_download d;
    char size[32];
    const char *url;
    json_t *link;

    link_download(a, id, &d);
    link = cx_link_sign(cx, who, &d, (long long)cx->cfg->link_default_expiry);
    if (!link)
        return CX_ERR_NOMEM;
    human_size(json_integer_value(json_object_get(a, "size")), size, sizeof(size));
    url = json_string_value(json_object_get(link, "url"));
    cx_buf_adds(out, "<tr><td>");
    if (!strcmp(kind, "image")) {
        cx_buf_adds(out, "<img class=\"preview\" alt=\"preview of ");
        cx_page_escape(out, json_string_value(json_object_get(a, "filename")));
        cx_buf_adds(out, "\" src=\"");
        cx_page_escape(out, url);
        cx_buf_adds(out, "\">");
    }
    cx_buf_adds(out, "</td><td><code>");
    cx_page_escape(out, json_string_value(json_object_get(a, "path")));
    cx_buf_adds(out, "</code></td><td>");
    cx_page_escape(out, kind);
    cx_buf_adds(out, "<br><small>");
    cx_page_escape(out, json_string_value(json_object_get(a, "mime_type")));
    cx_buf_addf(out, "</small></td><td class=\"n\">%s</td><td class=\"n\">%lld</td><td><a href=\"",
                size, (long long)json_integer_value(json_object_get(a, "current_version")));
    cx_page_escape(out, url);
    cx_buf_adds(out, "\" download>");
    cx_page_escape(out, json_string_value(json_object_get(a, "filename")));
    cx_buf_adds(out, "</a></td></tr>\n");
    json_decref(link);
    return CX_OK;
}

/* At most this many of the workspace's files are listed on the page. */
#define PAGE_FILES_MAX 500

/* The live workspace's files, read through its kernel (never from the
 * host): their paths, sizes and types; none without a session. */
static void
page_files(struct cx_ctx *cx, const struct cx_principal *who, const char *cid, struct cx_buf *out)
{
    char msg[CX_MSG_MAX] = "", size[32];
    json_t *list = NULL, *f;
    enum cx_err rc = cx_files_list(cx, who->user, cid, "", true, &list, msg, sizeof(msg));
    json_t *files = json_object_get(list, "files");
    size_t i, shown = 0;

    cx_buf_adds(out, "<h2>Files in the workspace</h2>\n");
    if (rc == CX_ERR_NOT_FOUND)
        cx_buf_adds(out, "<p class=\"empty\">No live session: the workspace is empty until "
                         "the next run.</p>\n");
    else if (rc)
        cx_buf_adds(out, "<p class=\"empty\">The workspace can't be listed now (a run may "
                         "hold it); reload later.</p>\n");
    else if (json_array_size(files) == 0)
        cx_buf_adds(out, "<p class=\"empty\">No files.</p>\n");
    else
        cx_buf_adds(out, "<table><thead><tr><th>Path</th><th>Type</th><th>Size</th></tr>"
                         "</thead><tbody>\n");
    json_array_foreach(files, i, f)
    {
        const char *type = json_string_value(json_object_get(f, "type"));

        if (shown == PAGE_FILES_MAX)
            break;
        shown++;
        cx_buf_adds(out, "<tr><td><code>");
        cx_page_escape(out, json_string_value(json_object_get(f, "path")));
        cx_buf_adds(out, "</code></td><td>");
        cx_page_escape(out, type ? type : "");
        human_size(json_integer_value(json_object_get(f, "size")), size, sizeof(size));
        cx_buf_addf(out, "</td><td class=\"n\">%s</td></tr>\n",
                    type && !strcmp(type, "file") ? size : "");
    }
    if (rc == CX_OK && json_array_size(files)) {
        cx_buf_adds(out, "</tbody></table>\n");
        if (json_array_size(files) > shown || json_is_true(json_object_get(list, "truncated")))
            cx_buf_addf(out,
                        "<p class=\"empty\">The first %zu shown; list them all with GET "
                        "/v1/conversations/{id}/files?recursive=true.</p>\n",
                        shown);
    }
    json_decref(list);
}

enum cx_err
cx_page_artifacts(struct cx_ctx *cx, const struct cx_principal *who, const char *cid,
                  struct cx_buf *out)
{
    json_t *list = NULL, *artifacts, *a;
    size_t i;
    enum cx_err rc;

    if (!cx_conversation_id_valid(cid))
        return CX_ERR_NOT_FOUND;
    rc = cx_artifact_list_with_keys(cx, who->user, cid, &list);
    if (rc)
        return rc;
    artifacts = json_object_get(list, "artifacts");
    cx_buf_adds(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                     "<meta name=\"viewport\" content=\"width=device-width\">"
                     "<title>Artifacts of ");
    cx_page_escape(out, cid);
    cx_buf_addf(out, "</title><style>%s</style></head><body>\n<h1>Artifacts of <code>", style);
    cx_page_escape(out, cid);
    cx_buf_adds(out, "</code></h1>\n");
    if (json_array_size(artifacts) == 0)
        cx_buf_adds(out, "<p class=\"empty\">No artifacts yet.</p>\n");
    else
        cx_buf_adds(out, "<table><thead><tr><th>Preview</th><th>Path</th><th>Type</th>"
                         "<th>Size</th><th>Versions</th><th>Download</th></tr></thead><tbody>\n");
    json_array_foreach(artifacts, i, a)
    {
        if (page_row(cx, who, a, out)) {
            json_decref(list);
            return CX_ERR_NOMEM;
        }
    }
    if (json_array_size(artifacts))
        cx_buf_adds(out, "</tbody></table>\n");
    page_files(cx, who, cid, out);
    cx_buf_adds(out, "</body></html>\n");
    json_decref(list);
    return cx_buf_err(out);
}
