#include "../../lib/config.h"
#include "../../lib/run.h"
#include "../../lib/util.h"
#include "tap.h"

static const struct {
    const char *body;
    int rc;
    const char *msg;
} cases[] = {
    {"{\"conversation_id\":\"c1\",\"code\":\"x=1\"}", CX_OK, NULL},
    {"{\"code\":\"x=1\"}", CX_ERR_INVALID, "conversation_id"},
    {"{\"conversation_id\":\"\",\"code\":\"x=1\"}", CX_ERR_INVALID, "conversation_id"},
    {"{\"conversation_id\":\"../etc\",\"code\":\"x=1\"}", CX_ERR_INVALID, "conversation_id"},
    {"{\"conversation_id\":\"a b\",\"code\":\"x=1\"}", CX_ERR_INVALID, "conversation_id"},
    {"{\"conversation_id\":\"c'; DROP TABLE runs;--\",\"code\":\"x=1\"}", CX_ERR_INVALID,
     "conversation_id"},
    {"{\"conversation_id\":7,\"code\":\"x=1\"}", CX_ERR_INVALID, "conversation_id"},
    {"{\"conversation_id\":\"c1\"}", CX_ERR_INVALID, "code"},
    {"{\"conversation_id\":\"c1\",\"code\":\"  \\n\\t\"}", CX_ERR_INVALID, "blank"},
    {"{\"conversation_id\":\"c1\",\"code\":[]}", CX_ERR_INVALID, "code"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"capture_artifacts\":\"false\"}", CX_ERR_INVALID,
     "capture_artifacts"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"timeout\":0}", CX_ERR_INVALID, "timeout"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"timeout\":-3}", CX_ERR_INVALID, "timeout"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"timeout\":\"5\"}", CX_ERR_INVALID, "timeout"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"ttl\":1.5}", CX_ERR_INVALID, "ttl"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"inputs\":\"abc\"}", CX_ERR_INVALID, "inputs"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"inputs\":[\"nope\"]}", CX_ERR_INVALID,
     "inputs[0]"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"inputs\":[\"123e4567-e89b-12d3-a456-"
     "426614174000\",\"123e4567-e89b-12d3-a456-426614174000\"]}",
     CX_ERR_INVALID, "repeats"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"outputs\":[\"\"]}", CX_ERR_INVALID,
     "outputs[0]"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"outputs\":\"*.png\"}", CX_ERR_INVALID,
     "outputs"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"arguments\":[1]}", CX_ERR_INVALID, "arguments"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"arguments\":{\"a-b\":1}}", CX_ERR_INVALID,
     "identifiers"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"arguments\":{\"__import__('os')\":1}}",
     CX_ERR_INVALID, "identifiers"},
    {"{\"conversation_id\":\"c1\",\"code\":\"x\",\"timout\":5}", CX_ERR_INVALID, "unknown field"},
};

int
main(void)
{
    struct cx_config cfg;
    struct cx_run_request req;
    char msg[256];
    json_t *j;

    if (cx_config_defaults(&cfg))
        return 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        j = json_loads(cases[i].body, 0, NULL);
        if (!j) {
            ok(0, "case %zu: test JSON parses", i);
            continue;
        }
        msg[0] = '\0';
        int rc = cx_run_request_parse(&cfg, j, &req, msg, sizeof(msg));
        is_int(rc, cases[i].rc, "case %zu: status", i);
        if (cases[i].msg)
            ok(strstr(msg, cases[i].msg) != NULL, "case %zu: message names %s (%s)", i,
               cases[i].msg, msg);
        if (rc == CX_OK)
            cx_run_request_cleanup(&req);
        json_decref(j);
    }

    j = json_loads("{\"conversation_id\":\"c.1:x-y_z\",\"code\":\"print(1)\",\"timeout\":9999,"
                   "\"ttl\":-5,\"capture_artifacts\":false,\"arguments\":{\"a\":null,\"b\":true}}",
                   0, NULL);
    ok(cx_run_request_parse(&cfg, j, &req, msg, sizeof(msg)) == CX_OK, "full request parses");
    ok(req.timeout == 300, "timeout clamped to max_timeout");
    is_int(req.ttl, 1, "ttl clamped up to 1");
    ok(!req.capture_artifacts, "capture_artifacts false");
    ok(json_is_object(req.arguments), "arguments kept");
    is_str(req.conversation_id, "c.1:x-y_z", "conversation id");
    cx_run_request_cleanup(&req);
    json_decref(j);

    j = json_loads("{\"conversation_id\":\"c\",\"code\":\"x\",\"ttl\":999999}", 0, NULL);
    ok(cx_run_request_parse(&cfg, j, &req, msg, sizeof(msg)) == CX_OK && req.ttl == 3600 &&
           req.timeout == 30 && req.capture_artifacts,
       "defaults and ttl clamped to max_ttl");
    cx_run_request_cleanup(&req);
    json_decref(j);

    {
        size_t n = cfg.max_code_bytes + 1;
        char *code = malloc(n + 1);
        need(code != NULL, "memory for a large code");
        memset(code, 'x', n);
        code[n] = '\0';
        j = json_pack("{s:s,s:s}", "conversation_id", "c", "code", code);
        is_int(cx_run_request_parse(&cfg, j, &req, msg, sizeof(msg)), CX_ERR_TOO_LARGE,
               "code over max_code_bytes is too large");
        json_decref(j);
        free(code);
    }
    {
        char id[140];
        memset(id, 'a', 129);
        id[129] = '\0';
        ok(!cx_conversation_id_valid(id), "129 characters is too long");
        id[128] = '\0';
        ok(cx_conversation_id_valid(id), "128 characters is fine");
    }
    cx_config_cleanup(&cfg);
    return tap_done();
}
