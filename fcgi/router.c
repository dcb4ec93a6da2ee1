#include <stdio.h>
#include <string.h>

#include "handlers.h"
#include "router.h"

struct route {
    const char *method;
    const char *pattern; /* "{}" matches one non-empty segment, a last "{**}" the rest */
    const char *name;
    void (*fn)(struct cx_req *r);
    /* authenticated, then on a run thread (cx_req_defer): it holds a
     * conversation and its kernel as a run does, within the user's
     * max_concurrent_runs_per_user, so a slow body or kernel never holds
     * the workers that answer everyone */
    bool lane;
};

static const struct route routes[] = {
    {"GET", "/v1/health", "health", cx_h_health},
    {"GET", "/metrics", "metrics", cx_h_metrics},
    {"POST", "/v1/runs", "runs_create", cx_h_runs_create},
    {"GET", "/v1/runs/{}", "runs_get", cx_h_runs_get},
    {"POST", "/v1/runs/{}/approve", "runs_approve", cx_h_runs_approve},
    {"POST", "/v1/runs/{}/reject", "runs_reject", cx_h_runs_reject},
    {"GET", "/v1/runs/{}/events", "runs_events", cx_h_runs_events},
    {"POST", "/v1/runs/{}/cancel", "runs_cancel", cx_h_runs_cancel},
    {"GET", "/v1/conversations", "conversations_list", cx_h_conversations_list},
    {"POST", "/v1/conversations/{}/session", "session_open", cx_h_session_open, true},
    {"GET", "/v1/conversations/{}/session", "session_get", cx_h_session_get},
    {"DELETE", "/v1/conversations/{}/session", "session_delete", cx_h_session_delete},
    {"GET", "/v1/conversations/{}/files", "files_list", cx_h_files_list, true},
    {"PUT", "/v1/conversations/{}/files/{**}", "files_put", cx_h_files_put, true},
    {"GET", "/v1/conversations/{}/files/{**}", "files_get", cx_h_files_get, true},
    {"DELETE", "/v1/conversations/{}/files/{**}", "files_delete", cx_h_files_delete, true},
    {"GET", "/v1/conversations/{}/artifacts.html", "artifacts_page", cx_h_artifacts_page, true},
    {"GET", "/v1/artifacts", "artifacts_list", cx_h_artifacts_list},
    {"POST", "/v1/artifacts", "artifacts_upload", cx_h_artifacts_upload},
    {"GET", "/v1/artifacts/{}", "artifacts_get", cx_h_artifacts_get},
    {"DELETE", "/v1/artifacts/{}", "artifacts_delete", cx_h_artifacts_delete},
    {"GET", "/v1/artifacts/{}/content", "artifacts_content", cx_h_artifacts_content},
    {"POST", "/v1/artifacts/{}/links", "artifacts_links", cx_h_artifacts_links},
    /* RAGFlow's executor-manager protocol */
    {"GET", "/compat/ragflow/healthz", "ragflow_healthz", cx_h_compat_ragflow_healthz},
    {"POST", "/compat/ragflow/run", "ragflow_run", cx_h_compat_ragflow_run, true},
    /* the MCP server: no GET (no stream of its own to offer: 405) */
    {"POST", "/mcp", "mcp", cx_h_mcp_post},
    {"DELETE", "/mcp", "mcp_delete", cx_h_mcp_delete},
    {"OPTIONS", "/mcp", "mcp_preflight", cx_h_mcp_options},
};

/* Matches path against pattern; captures go to r when r is not NULL. */
static bool
match(const char *pattern, const char *path, struct cx_req *r)
{
    int ncap = 0;
    const char *start = path;

    while (*pattern && *path) {
        if (!strcmp(pattern, "{**}")) {
            if (r)
                r->rest = (size_t)(path - start);
            return true; /* the rest, not empty */
        }
        if (pattern[0] == '{' && pattern[1] == '}') {
            size_t n = strcspn(path, "/");
            if (n == 0 || ncap >= CX_MAX_CAPTURES || n >= sizeof(r->captures[0]))
                return false;
            if (r)
                snprintf(r->captures[ncap], sizeof(r->captures[0]), "%.*s", (int)n, path);
            ncap++;
            pattern += 2;
            path += n;
            continue;
        }
        if (*pattern != *path)
            return false;
        pattern++;
        path++;
    }
    return *pattern == '\0' && *path == '\0';
}

void
cx_router_dispatch(struct cx_req *r)
{
    char allow[128] = "";
    bool path_known = false;
    const char *method = strcmp(r->method, "HEAD") == 0 ? "GET" : r->method;

    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (!match(routes[i].pattern, r->path, NULL))
            continue;
        path_known = true;
        if (strcmp(routes[i].method, method) == 0) {
            match(routes[i].pattern, r->path, r);
            r->route = routes[i].name;
            if (!routes[i].lane)
                routes[i].fn(r);
            else if (cx_req_authenticate(r))
                (void)cx_req_defer(r, routes[i].fn);
            return;
        }
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof(allow) - n, "%s%s%s", n ? ", " : "", routes[i].method,
                 strcmp(routes[i].method, "GET") == 0 ? ", HEAD" : "");
    }
    if (path_known) {
        r->route = "method_not_allowed";
        cx_req_header(r, "Allow", allow);
        cx_req_send_error(r, 405, "method_not_allowed", "this method is not allowed on this path");
        return;
    }
    r->route = "not_found";
    cx_req_send_error(r, 404, "not_found", "no such route");
}
