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
cx_health_check(struct cx_db *db, struct cx_gateway *gw, const char *storage_dir, json_t **out)
{
    char msg[256];
    json_t *checks = json_object();
    int ok = 1, rc;

    rc = cx_db_ping(db);
    record(checks, "postgresql", rc != 0, "cannot query PostgreSQL", &ok);
    msg[0] = '\0';
    rc = cx_gateway_ping(gw, msg, sizeof(msg));
    record(checks, "gateway", rc != 0, msg[0] ? msg : "gateway unreachable", &ok);
    msg[0] = '\0';
    rc = cx_storage_check_writable(storage_dir, msg, sizeof(msg));
    record(checks, "storage", rc != 0, msg, &ok);
    *out = json_pack("{s:s,s:o}", "status", ok ? "ok" : "unavailable", "checks", checks);
    return ok;
}
