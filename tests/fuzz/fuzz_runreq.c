/* The body of POST /v1/runs: parsed as JSON, then as a run request. */
#include "../../lib/config.h"
#include "../../lib/http.h"
#include "../../lib/run.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct cx_config cfg;
    static int ready;
    struct cx_run_request req;
    char msg[CX_MSG_MAX];
    json_t *body = NULL;

    if (!ready) {
        fuzz_quiet();
        if (cx_config_defaults(&cfg) != CX_OK)
            return 0;
        ready = 1;
    }
    if (cx_http_parse_json_object((const char *)data, size, &body, msg, sizeof(msg)) != CX_OK)
        return 0;
    if (cx_run_request_parse(&cfg, body, &req, msg, sizeof(msg)) == CX_OK)
        cx_run_request_cleanup(&req);
    json_decref(body);
    return 0;
}
