/* codexec: the artifacts page for people (GET /v1/conversations/{cid}/artifacts.html). */
#ifndef CX_PAGE_H
#define CX_PAGE_H

#include "auth.h"
#include "buf.h"
#include "codexec.h"

/* Appends s to b with &, <, >, ", ' escaped. */
void cx_page_escape(struct cx_buf *b, const char *s);

#endif
