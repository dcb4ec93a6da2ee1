#include "codexec.h"

#include <string.h>

#include "config.h"
#include "db.h"
#include "gateway.h"
#include "health.h"
#include "kernel.h"
#include "storage.h"

enum cx_err
cx_host_ctx_open(struct cx_ctx *cx, const struct cx_config *cfg, const struct cx_auth *auth)
{
    enum cx_err rc;

    *cx = (struct cx_ctx){.cfg = cfg, .auth = auth};
    rc = cx_db_new(cfg->database, &cx->db);
    if (rc == CX_OK)
        rc = cx_storage_new(cfg, &cx->store);
    for (unsigned i = 0; rc == CX_OK && i < cfg->ngateways; i++) {
        rc = cx_gateway_new(cfg->gateways[i].url, cfg->gateways[i].token, &cx->gws[i]);
        if (rc == CX_OK)
            cx->ngws++;
    }
    cx->gw = cx->gws[0];
    return rc;
}

void
cx_host_ctx_close(struct cx_ctx *cx)
{
    for (unsigned i = 0; i < cx->ngws; i++)
        cx_gateway_free(cx->gws[i]);
    cx_db_free(cx->db);
    cx_storage_free(cx->store);
    cx->store = NULL;
    memset(cx->gws, 0, sizeof(cx->gws));
    cx->ngws = 0;
    cx->gw = NULL;
    cx->db = NULL;
}

void
cx_host_tick(void)
{
    cx_kernel_pool_drain_idle();
}

void
cx_host_shutdown(void)
{
    cx_kernel_pool_clear();
    cx_health_forget();
}

enum cx_err
cx_host_migrate(struct cx_ctx *cx, int *applied)
{
    return cx_db_migrate(cx->db, applied);
}
