/* codexec: the health check behind GET /v1/health. */
#ifndef CX_HEALTH_H
#define CX_HEALTH_H

#include <jansson.h>
#include <stdbool.h>

struct cx_db;
struct cx_gateway;

/* Checks PostgreSQL (SELECT 1), the gateway (GET /api, then the token and
 * kernel_name through GET /api/kernelspecs) and storage (a probe
 * file is written and synced). *out gets a new reference:
 * {"status": "ok"|"unavailable", "checks": {"postgresql": "ok"|"failed: …", …}}.
 * Returns true when every check passed. The result is shared by the
 * process's threads and at most a second old: health checks are safe to
 * hammer. *out is NULL (and false returned) only when out of memory. */
bool cx_health_check(struct cx_db *db, struct cx_gateway *gw, const char *kernel_name,
                     const char *storage_dir, json_t **out);

/* Drops the shared result (at exit, and for tests). */
void cx_health_forget(void);

#endif
