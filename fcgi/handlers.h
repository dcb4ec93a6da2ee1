/* codexec-fcgi: route handlers. Each parses, calls lib/, and responds; those the
 * router runs on the lane (router.c) come authenticated, on a run thread. */
#ifndef CX_FCGI_HANDLERS_H
#define CX_FCGI_HANDLERS_H

#include "request.h"

void cx_h_health(struct cx_req *r);
void cx_h_metrics(struct cx_req *r);
void cx_h_runs_create(struct cx_req *r);
void cx_h_runs_get(struct cx_req *r);
void cx_h_runs_approve(struct cx_req *r);
void cx_h_runs_reject(struct cx_req *r);
void cx_h_runs_events(struct cx_req *r);
void cx_h_runs_cancel(struct cx_req *r);
void cx_h_session_delete(struct cx_req *r);
void cx_h_session_open(struct cx_req *r);
void cx_h_session_get(struct cx_req *r);
void cx_h_conversations_list(struct cx_req *r);
void cx_h_files_list(struct cx_req *r);
void cx_h_files_put(struct cx_req *r);
void cx_h_files_get(struct cx_req *r);
void cx_h_files_delete(struct cx_req *r);
void cx_h_artifacts_list(struct cx_req *r);
void cx_h_artifacts_get(struct cx_req *r);
void cx_h_artifacts_delete(struct cx_req *r);
void cx_h_artifacts_upload(struct cx_req *r);
void cx_h_artifacts_content(struct cx_req *r);
void cx_h_artifacts_links(struct cx_req *r);
void cx_h_artifacts_page(struct cx_req *r);
void cx_h_compat_ragflow_healthz(struct cx_req *r);
void cx_h_compat_ragflow_run(struct cx_req *r);
/* /mcp (fcgi/mcp.c) */
void cx_h_mcp_post(struct cx_req *r);
void cx_h_mcp_delete(struct cx_req *r);
void cx_h_mcp_options(struct cx_req *r);

#endif
