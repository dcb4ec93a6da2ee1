#include <stdio.h>

#include "db.h"
#include "gateway.h"
#include "health.h"
#include "storage.h"

static void
record(json_t *checks, const char *name, int failed, const char *msg, int *all_ok)
{
    char text[320];

    if (!failed) {
        json_object_set_new(checks, name, json_string("ok"));
        return;
    }
    *all_ok = 0;
    snprintf(text, sizeof(text), "failed: %s", msg);
    json_object_set_new(checks, name, json_string(text));
}

bool
cx_health_check(struct cx_db *db, struct cx_gateway *gw, const char *kernel_name,
                const char *storage_dir, json_t **out)
{
    char msg[CX_MSG_MAX];
    json_t *checks = json_object();
    int ok = 1, rc;

    rc = cx_db_ping(db);
    record(checks, "postgresql", rc != 0, "cannot query PostgreSQL", &ok);
    msg[0] = '\0';
    rc = cx_gateway_ping(gw, msg, sizeof(msg));
    if (rc == CX_OK && kernel_name) {
        /* GET /api answers without a token; this one proves ours works and
         * that the kernelspec runs are started with exists. */
        json_t *specs = NULL;
        rc = cx_gateway_kernelspecs(gw, &specs);
        if (rc)
            snprintf(msg, sizeof(msg), "GET /api/kernelspecs refused (check gateway_token)");
        else if (!json_object_get(json_object_get(specs, "kernelspecs"), kernel_name)) {
            snprintf(msg, sizeof(msg), "kernelspec \"%.64s\" not found on the gateway",
                     kernel_name);
            rc = CX_ERR_NOT_FOUND;
        }
        json_decref(specs);
    }
    record(checks, "gateway", rc != 0, msg[0] ? msg : "gateway unreachable", &ok);
    msg[0] = '\0';
    rc = cx_storage_check_writable(storage_dir, msg, sizeof(msg));
    record(checks, "storage", rc != 0, msg, &ok);
    *out = json_pack("{s:s,s:o}", "status", ok ? "ok" : "unavailable", "checks", checks);
    return ok;
}
