#include <stdio.h>
#include <stdlib.h>

#include "budget.h"
#include "buf.h"
#include "config.h"
#include "db.h"

/* A gateway's kernels: sessions that have one (or are starting one: an
 * empty kernel_id, the reservation) and pooled ones. */
#define GW_KERNELS(url)                                                                            \
    "(SELECT count(*) FROM sessions WHERE gateway_url = " url " AND kernel_id IS NOT NULL) +"      \
    " (SELECT count(*) FROM prestarted_kernels WHERE gateway_url = " url ")"
CX_SQL(q_gw_count, 1, "SELECT " GW_KERNELS("$1"));

enum cx_err
cx_budget_kernels(struct cx_ctx *cx, const char *gateway_url, long *count)
{
    const char *p[1] = {gateway_url};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_gw_count, p, &r);

    *count = rc == CX_OK ? strtol(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    return rc;
}

CX_SQL(q_gw_gauges, 1,
       "SELECT (SELECT count(*) FROM sessions WHERE gateway_url = $1 AND kernel_id <> ''),"
       " " GW_KERNELS("$1") ","
                            " (SELECT count(*) FROM prestarted_kernels WHERE gateway_url = $1)");

void
cx_budget_metrics(struct cx_ctx *cx, struct cx_buf *b)
{
    static const char *const help[] = {
        "# HELP codexec_sessions Sessions with a kernel, by gateway.\n"
        "# TYPE codexec_sessions gauge\n",
        "# HELP codexec_kernels Kernels codexec holds on the gateway (sessions, starting, "
        "pooled), against its max_kernels.\n# TYPE codexec_kernels gauge\n",
        "# HELP codexec_kernel_pool_ready Pre-started kernels waiting, by gateway.\n"
        "# TYPE codexec_kernel_pool_ready gauge\n",
    };
    static const char *const name[] = {"sessions", "kernels", "kernel_pool_ready"};
    PGresult *r[CX_GATEWAYS_MAX] = {0};

    for (unsigned i = 0; i < cx->ngws; i++) {
        const char *p[1] = {cx->cfg->gateways[i].url};
        if (cx_db_exec(cx->db, &q_gw_gauges, p, &r[i]))
            r[i] = NULL;
    }
    for (int g = 0; g < 3; g++) {
        cx_buf_adds(b, help[g]);
        for (unsigned i = 0; i < cx->ngws; i++)
            if (r[i])
                cx_buf_addf(b, "codexec_%s{gateway=\"%s\"} %s\n", name[g], cx->cfg->gateways[i].url,
                            PQgetvalue(r[i], 0, g));
    }
    cx_buf_adds(b, "# HELP codexec_gateway_max_kernels The gateway's kernel budget.\n"
                   "# TYPE codexec_gateway_max_kernels gauge\n");
    for (unsigned i = 0; i < cx->ngws; i++)
        cx_buf_addf(b, "codexec_gateway_max_kernels{gateway=\"%s\"} %u\n", cx->cfg->gateways[i].url,
                    cx->cfg->gateways[i].max_kernels);
    for (unsigned i = 0; i < cx->ngws; i++)
        PQclear(r[i]);
}
