/* codexec: the health check behind GET /v1/health. */
#ifndef CX_HEALTH_H
#define CX_HEALTH_H

#include <jansson.h>
#include <stdbool.h>

#include "ctx.h"

/* Checks PostgreSQL (SELECT 1), every gateway (the token and kernel_name
 * through GET /api/kernelspecs) and storage (a probe file is
 * written and synced). *out gets a new reference: {"status": "ok" |
 * "unavailable", "checks": {"postgresql": "ok" | "failed: …", "gateway":
 * (ok while one gateway is), "gateways": {URL: …}, "storage": …}}.
 * Returns true when every check passed. The result is shared by the
 * process's threads and at most a second old: health checks are safe to
 * hammer. *out is NULL (and false returned) only when out of memory. */
bool cx_health_check(struct cx_ctx *cx, json_t **out);

/* Leaves of a health answer only what anyone may know: each check's "ok"
 * or "failed", without the reason or the gateways' URLs. */
void cx_health_redact(json_t *answer);

/* Drops the shared result (at exit, and for tests). */
void cx_health_forget(void);

#endif
