#include <stdio.h>
#include <stdlib.h>

#include "budget.h"
#include "buf.h"
#include "config.h"
#include "db.h"
#include "gateway.h"

/* A gateway's kernels: sessions that have one (or are starting one: an
 * empty kernel_id, the reservation) and pooled ones. */
#define GW_KERNELS(url)                                                                            \
    "(SELECT count(*) FROM sessions WHERE gateway_url = " url " AND kernel_id IS NOT NULL) +"      \
    " (SELECT count(*) FROM prestarted_kernels WHERE gateway_url = " url ")"
CX_SQL(q_gw_count, 1, "SELECT " GW_KERNELS("$1"));

#define KERNEL_GUESS (64LL << 20) /* an average kernel until the gateway measured one */
#define KERNEL_FLOOR (8LL << 20)
#define RESERVE_MIN  (256LL << 20)
#define RESERVE_MAX  (2LL << 30)

/* More kernels of per bytes that fit in free bytes (floored: over by a
 * byte is one too many), less the kernels placed since the report
 * (pending; negative: removed since, their room free already). */
static long
fit(int64_t free_, int64_t per, long pending)
{
    return (long)(free_ >= 0 ? free_ / per : -((-free_ + per - 1) / per)) - pending;
}

long
cx_budget_room_for(const struct cx_gateway_memory *m, long used, unsigned max_kernels,
                   uint64_t max_memory, uint64_t reserve)
{
    long room = (long)(max_kernels ? max_kernels : m ? 100000 : CX_KERNELS_COUNTED) - used;
    int64_t per, limit, res, measured;
    long pending;

    if (!m)
        return room;
    /* the kernels' own cgroups: what their parent holds besides (pages
     * of restarted kernels' workspaces) is no kernel's */
    per = m->own_bytes >= 0 ? m->own_bytes : m->kernels_bytes;
    per = m->kernels > 0 && per >= 0 ? per / m->kernels : KERNEL_GUESS;
    per = per < KERNEL_FLOOR ? KERNEL_FLOOR : per;
    /* placed since the report, or (negative) closed since: a session
     * evicted to make room makes it at once, not at the next report */
    pending = used - m->kernels;
    /* without cgroups the kernels' memory is the guess for each */
    measured = m->kernels_bytes >= 0 ? m->kernels_bytes : (int64_t)m->kernels * per;
    limit = max_memory ? (int64_t)max_memory : m->limit_bytes;
    if (limit >= 0 && fit(limit - measured, per, pending) < room)
        room = fit(limit - measured, per, pending);
    res = (int64_t)reserve;
    if (!res) {
        res = m->total_bytes > 0 ? m->total_bytes / 20 : RESERVE_MIN;
        res = res < RESERVE_MIN ? RESERVE_MIN : res > RESERVE_MAX ? RESERVE_MAX : res;
    }
    if (fit(m->available_bytes - res, per, pending) < room)
        room = fit(m->available_bytes - res, per, pending);
    return room;
}

long
cx_budget_room(struct cx_ctx *cx, unsigned i, long used)
{
    const struct cx_gateway_conf *g = &cx->cfg->gateways[i];
    struct cx_gateway_memory m;
    bool have = cx_gateway_memory(cx->gws[i], &m);

    return cx_budget_room_for(have ? &m : NULL, used, g->max_kernels, g->max_memory,
                              cx->cfg->gateway_memory_reserve);
}

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

/* What each gateway reported of its memory, and the room admission sees
 * there (kernels held: gauges' column 1). */
static void
memory_metrics(struct cx_ctx *cx, struct cx_buf *b, PGresult *const *r)
{
    static const char *const of[] = {"kernels", "limit", "available"};

    cx_buf_adds(b, "# HELP codexec_gateway_memory_bytes What the gateway measured (GET "
                   "/api/codexec/memory): its kernels' memory, their limit, the host's "
                   "available memory.\n# TYPE codexec_gateway_memory_bytes gauge\n");
    for (unsigned i = 0; i < cx->ngws; i++) {
        struct cx_gateway_memory m;
        if (!cx_gateway_memory(cx->gws[i], &m))
            continue;
        int64_t v[3] = {m.kernels_bytes, m.limit_bytes, m.available_bytes};
        for (int k = 0; k < 3; k++)
            if (v[k] >= 0)
                cx_buf_addf(b, "codexec_gateway_memory_bytes{gateway=\"%s\",of=\"%s\"} %lld\n",
                            cx->cfg->gateways[i].url, of[k], (long long)v[k]);
    }
    cx_buf_adds(b, "# HELP codexec_gateway_room Kernels the gateway takes more now (its memory, "
                   "or max_kernels).\n# TYPE codexec_gateway_room gauge\n");
    for (unsigned i = 0; i < cx->ngws; i++)
        if (r[i])
            cx_buf_addf(b, "codexec_gateway_room{gateway=\"%s\"} %ld\n", cx->cfg->gateways[i].url,
                        cx_budget_room(cx, i, strtol(PQgetvalue(r[i], 0, 1), NULL, 10)));
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
    cx_buf_adds(b, "# HELP codexec_gateway_max_kernels The gateway's kernel count budget "
                   "(0: none of its own, its memory decides).\n"
                   "# TYPE codexec_gateway_max_kernels gauge\n");
    for (unsigned i = 0; i < cx->ngws; i++)
        cx_buf_addf(b, "codexec_gateway_max_kernels{gateway=\"%s\"} %u\n", cx->cfg->gateways[i].url,
                    cx->cfg->gateways[i].max_kernels);
    memory_metrics(cx, b, r);
    for (unsigned i = 0; i < cx->ngws; i++)
        PQclear(r[i]);
}
