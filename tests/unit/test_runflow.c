/* A whole run through the library, as codexec-fcgi makes one: request,
 * session, kernel (the suite's Jupyter server), capture, storage, rows.
 * Small on purpose: it is here so that the fault injection
 * (tests/faultinject.py) fails allocations all along a run's path. */
#include "../../lib/run.h"
#include "../../lib/session.h"
#include "cxtest.h"

static json_t *
submit(struct cxtest *t, const struct cx_principal *who, const char *body, enum cx_err *rc)
{
    struct cx_run_request req;
    char msg[CX_MSG_MAX] = "";
    json_t *j = json_loads(body, 0, NULL), *out = NULL;
    bool pending = false;

    need(j != NULL, "a request body");
    *rc = cx_run_request_parse(&t->cfg, j, &req, msg, sizeof(msg));
    json_decref(j);
    if (*rc)
        return NULL;
    *rc = cx_run_submit(&t->cx, who, &req, &out, &pending, msg, sizeof(msg));
    cx_run_request_cleanup(&req);
    if (*rc)
        printf("# run: %s\n", msg);
    return out;
}

int
main(void)
{
    struct cxtest t;
    struct cx_principal bob;
    enum cx_err rc;
    json_t *r;

    cxtest_open(&t, "runflow", "kernel_name = python3-sandbox\n");
    bob = cxtest_principal(&t, "bob");
    r = submit(&t, &bob,
               "{\"conversation_id\":\"c1\",\"code\":\"x = 6 * 7\\nprint(x)\\n"
               "open('out.csv', 'w').write('a,b\\\\n1,2\\\\n')\"}",
               &rc);
    is_int(rc, CX_OK, "a run");
    is_str(json_string_value(json_object_get(r, "status")), "ok", "succeeds");
    is_str(json_string_value(json_object_get(r, "stdout_tail")), "42\n", "prints");
    is_int(json_array_size(json_object_get(r, "artifacts")), 1, "and stores its file");
    json_decref(r);
    r = submit(&t, &bob, "{\"conversation_id\":\"c1\",\"code\":\"print(x + 1)\\n1/0\"}", &rc);
    is_int(rc, CX_OK, "a second run");
    is_str(json_string_value(json_object_get(r, "stdout_tail")), "43\n", "keeps the state");
    is_str(json_string_value(json_object_get(r, "status")), "error", "and reports the error");
    json_decref(r);
    ok(cx_session_close(&t.cx, "bob", "c1") == CX_OK, "the session closes");
    cxtest_close(&t);
    return tap_done();
}
