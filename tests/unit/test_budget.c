/* A gateway's room for more kernels (lib/budget.h): by its measured
 * memory where it reports it, by a count where it does not, by both where
 * max_kernels is set; the kernels codexec placed since the report counted
 * at their average. Table-driven, no service needed. */
#include <stdint.h>

#include "../../lib/budget.h"
#include "../../lib/gateway.h"
#include "tap.h"

#define MiB (1LL << 20)
#define GiB (1LL << 30)

struct room_case {
    const char *what;
    bool report;
    struct cx_gateway_memory m;
    long used;
    unsigned max_kernels;
    uint64_t max_memory, reserve;
    long want;
};

static const struct room_case cases[] = {
    {"no report, no max_kernels: the default count",
     false,
     {0},
     100,
     0,
     0,
     0,
     CX_KERNELS_COUNTED - 100},
    {"no report: max_kernels", false, {0}, 3, 5, 0, 0, 2},
    {"no report: max_kernels spent", false, {0}, 7, 5, 0, 0, -2},
    /* 100 kernels of 16 MiB in a cgroup of 2 GiB: 1600 MiB used, 448 free */
    {"the kernels' cgroup limit",
     true,
     {100, 1600 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB},
     100,
     0,
     0,
     0,
     28},
    {"kernels placed since the report count at the average",
     true,
     {100, 1600 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB},
     110,
     0,
     0,
     0,
     18},
    {"a kernel closed since the report frees its room at once", true,
     {100, 2100 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB}, 96, 0, 0, 0, 1},
    {"codexec's max_memory below the cgroup's",
     true,
     {100, 1600 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB},
     100,
     0,
     1664 * MiB,
     0,
     4},
    {"a kernel that grew: its memory counts, not a count of kernels",
     true,
     {100, 1984 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB},
     100,
     0,
     0,
     0,
     3},
    {"over the limit", true, {100, 2100 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB}, 100, 0, 0, 0, -3},
    /* no cgroup limit: the host keeps its reserve (24 GiB / 20, within
     * [256 MiB, 2 GiB]: 1.2 GiB) */
    {"the host's available memory, less its reserve",
     true,
     {100, 1600 * MiB, -1, -1, 2 * GiB, 24 * GiB},
     100,
     0,
     0,
     0,
     (2 * GiB - 24 * GiB / 20) / (16 * MiB)},
    {"a reserve of the operator's",
     true,
     {100, 1600 * MiB, -1, -1, 2 * GiB, 24 * GiB},
     100,
     0,
     0,
     1 * GiB,
     64},
    {"max_kernels binds before memory",
     true,
     {100, 1600 * MiB, -1, -1, 20 * GiB, 24 * GiB},
     100,
     120,
     0,
     0,
     20},
    {"no max_kernels with a report: memory alone",
     true,
     {100, 1600 * MiB, -1, -1, 20 * GiB, 24 * GiB},
     2000,
     0,
     0,
     0,
     (20 * GiB - 24 * GiB / 20) / (16 * MiB) - 1900},
    {"nothing measured yet: 64 MiB a kernel",
     true,
     {0, 0, -1, 2 * GiB, 20 * GiB, 24 * GiB},
     0,
     0,
     0,
     0,
     32},
    {"the average is of the kernels' own cgroups, not what their parent holds besides",
     true,
     {100, 1600 * MiB, 800 * MiB, 2 * GiB, 20 * GiB, 24 * GiB},
     100,
     0,
     0,
     0,
     56},
    {"tiny kernels count as 8 MiB",
     true,
     {100, 100 * MiB, -1, 2 * GiB, 20 * GiB, 24 * GiB},
     100,
     0,
     0,
     0,
     (2 * GiB - 100 * MiB) / (8 * MiB)},
    {"no cgroups: each kernel the guess, within max_memory",
     true,
     {10, -1, -1, -1, 20 * GiB, 24 * GiB},
     10,
     0,
     1 * GiB,
     0,
     6},
    {"no memory left on the host",
     true,
     {100, 1600 * MiB, -1, -1, 100 * MiB, 24 * GiB},
     100,
     0,
     0,
     0,
     -71},
};

int
main(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct room_case *c = &cases[i];
        is_int(cx_budget_room_for(c->report ? &c->m : NULL, c->used, c->max_kernels, c->max_memory,
                                  c->reserve),
               c->want, "%s", c->what);
    }
    return tap_done();
}
