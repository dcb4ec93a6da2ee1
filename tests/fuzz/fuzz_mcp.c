/* A message POSTed to /mcp: parsed as JSON-RPC, then what the transport
 * asks of it, and the requests that need no database or kernel answered
 * (ping, logging/setLevel, tools/list, resources/templates/list, an unknown
 * method) and their errors made. */
#include "../../lib/config.h"
#include "../../lib/mcp.h"
#include "fuzz.h"

static bool
offline(const struct cx_mcp_msg *m)
{
    static const char *const ok[] = {"ping", "logging/setLevel", "tools/list",
                                     "resources/templates/list", "no/such"};

    for (size_t i = 0; m->method && m->id && i < sizeof(ok) / sizeof(ok[0]); i++)
        if (!strcmp(m->method, ok[i]))
            return true;
    return false;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct cx_config cfg;
    static int ready;
    struct cx_ctx cx = {.cfg = &cfg};
    struct cx_principal who = {.user = "fuzz"};
    struct cx_mcp_session s = {.id = "0", .conversation = "mcp-0"};
    struct cx_mcp_msg m;
    char msg[CX_MSG_MAX];
    json_t *error = NULL, *out = NULL;

    if (!ready) {
        fuzz_quiet();
        if (cx_config_defaults(&cfg) != CX_OK)
            return 0;
        ready = 1;
    }
    if (cx_mcp_parse((const char *)data, size, &m, &error) != CX_OK) {
        json_decref(error);
        return 0;
    }
    (void)cx_mcp_on_lane(&m);
    (void)cx_mcp_streams(&m);
    if (offline(&m) &&
        cx_mcp_request(&cx, &who, &s, &m, "http://h", NULL, &out, msg, sizeof(msg)) != CX_OK)
        out = cx_mcp_error(&m, CX_ERR_INVALID, msg, NULL);
    json_decref(out);
    cx_mcp_msg_cleanup(&m);
    return 0;
}
