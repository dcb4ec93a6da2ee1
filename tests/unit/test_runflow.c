/* A whole run through the library, as codexec-fcgi makes one: request,
 * session, kernel (the suite's Jupyter server), capture, storage, rows.
 * Small on purpose: it is here so that the fault injection
 * (tests/faultinject.py) fails allocations all along a run's path. */
#include "../../lib/run.h"
#include "../../lib/session.h"
#include "cxtest.h"

/* A listener that notes the events' names and the stdout it hears, and
 * goes away after stop_after calls (0: never). */
struct events {
    char names[512];
    char out[256];
    int calls, stop_after;
    unsigned last_id; /* named events are numbered 1, 2, ... in order */
    bool ids_broken;
};

static bool
on_event(void *ctx, const char *name, json_t *data, unsigned id)
{
    struct events *e = ctx;
    size_t n = strlen(e->names), o = strlen(e->out);

    e->calls++;
    if (name && id != e->last_id + 1)
        e->ids_broken = true;
    if (name)
        e->last_id = id;
    snprintf(e->names + n, sizeof(e->names) - n, "%s,", name ? name : ":");
    if (name && !strcmp(name, "stdout"))
        snprintf(e->out + o, sizeof(e->out) - o, "%s",
                 json_string_value(json_object_get(data, "text")));
    return !e->stop_after || e->calls < e->stop_after;
}

/* A run as codexec-fcgi makes one; e: its listener, or NULL for none. */
static json_t *
submit_stream(struct cxtest *t, const struct cx_principal *who, const char *body, struct events *e,
              enum cx_err *rc)
{
    struct cx_run_request req;
    struct cx_run_sink sink = {.fn = on_event, .ctx = e};
    char msg[CX_MSG_MAX] = "";
    json_t *j = json_loads(body, 0, NULL), *out = NULL;
    bool pending = false;

    need(j != NULL, "a request body");
    *rc = cx_run_request_parse(&t->cfg, j, &req, msg, sizeof(msg));
    json_decref(j);
    if (*rc)
        return NULL;
    *rc =
        cx_run_submit_stream(&t->cx, who, &req, e ? &sink : NULL, &out, &pending, msg, sizeof(msg));
    cx_run_request_cleanup(&req);
    if (*rc)
        printf("# run: %s\n", msg);
    return out;
}

static json_t *
submit(struct cxtest *t, const struct cx_principal *who, const char *body, enum cx_err *rc)
{
    return submit_stream(t, who, body, NULL, rc);
}

static void
streams(struct cxtest *t, const struct cx_principal *who)
{
    struct events e = {0};
    enum cx_err rc;
    json_t *r, *rec = NULL;
    char id[40];

    r = submit_stream(t, who, "{\"conversation_id\":\"s1\",\"code\":\"print('a')\\nprint('b')\"}",
                      &e, &rc);
    is_int(rc, CX_OK, "a streaming run");
    ok(!strncmp(e.names, "run,status,status,stdout,", 25), "run, queued, executing, output (%s)",
       e.names);
    ok(strstr(e.names, ",status,") && !strcmp(e.names + strlen(e.names) - 7, "status,"),
       "capturing last (%s)", e.names);
    is_str(e.out, "a\nb\n", "the output, whole");
    ok(!e.ids_broken && e.last_id >= 5, "each event numbered, in order (last %u)", e.last_id);
    is_str(json_string_value(json_object_get(r, "stdout_tail")), "a\nb\n", "and the answer");
    json_decref(r);

    memset(&e, 0, sizeof(e));
    e.stop_after = 1; /* the client goes away at the run event */
    r = submit_stream(t, who,
                      "{\"conversation_id\":\"s1\",\"code\":\"print('gone')\\nopen('g.txt', "
                      "'w').write('g')\"}",
                      &e, &rc);
    is_int(rc, CX_OK, "a run whose client went away");
    is_int(e.calls, 1, "is not told to it any more");
    is_int(json_array_size(json_object_get(r, "artifacts")), 1, "captures its file");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(r, "run_id")));
    json_decref(r);
    ok(cx_run_get(&t->cx, who->user, id, &rec) == CX_OK, "its record");
    is_str(json_string_value(json_object_get(rec, "stdout_tail")), "gone\n", "keeps its answer");
    is_int(json_array_size(json_object_get(rec, "artifacts")), 1, "with its artifact");
    json_decref(rec);
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
    streams(&t, &bob);
    ok(cx_session_close(&t.cx, "bob", "s1") == CX_OK, "the streaming session closes");
    cxtest_close(&t);
    return tap_done();
}
