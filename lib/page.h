/* codexec: the artifacts page for people (GET /v1/conversations/{cid}/artifacts.html). */
#ifndef CX_PAGE_H
#define CX_PAGE_H

#include "auth.h"
#include "buf.h"
#include "ctx.h"
#include "err.h"

/* Appends a self-contained HTML page (no external assets) listing the
 * user's artifacts in the conversation: path, kind, type, size, versions,
 * an image preview and a download link. Links are signed (the browser sends
 * no Authorization header for <a> and <img>). Every value is escaped. */
enum cx_err cx_page_artifacts(struct cx_ctx *cx, const struct cx_principal *who, const char *cid,
                              struct cx_buf *out) CX_MUSTCHECK;

/* Appends s to b with &, <, >, ", ' escaped. */
void cx_page_escape(struct cx_buf *b, const char *s);

/* The Content-Security-Policy the page is served with. */
#define CX_PAGE_CSP                                                                                \
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action " \
    "'none'; frame-ancestors 'none'"

#endif
