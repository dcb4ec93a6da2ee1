/* The MCP server's protocol parts that need nothing running: messages read
 * as hostile input, protocol versions, Origins, the error answers, which
 * requests go to a run thread, and the settings. */
#include "../../lib/config.h"
#include "../../lib/mcp.h"
#include "tap.h"

static const struct {
    const char *body;
    int code; /* the JSON-RPC error's, 0 when it parses */
    const char *why;
} cases[] = {
    {"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\"}", 0, "a request, id 0"},
    {"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"ping\",\"params\":{}}", 0, "a string id"},
    {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", 0, "a notification"},
    {"{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}", 0, "a response"},
    {"{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":1,\"message\":\"x\"}}", 0, "an error"},
    {" [ {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"} ]", -32600, "a batch"},
    {"[]", -32600, "an empty batch"},
    {"", -32700, "nothing"},
    {"{", -32700, "cut"},
    {"\"ping\"", -32700, "not an object"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ping\"}", -32700, "a duplicate key"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xff\"}", -32700, "not UTF-8"},
    {"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}", -32600, "JSON-RPC 1.0"},
    {"{\"id\":1,\"method\":\"ping\"}", -32600, "no jsonrpc"},
    {"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}", -32600, "a null id"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", -32600, "a real id"},
    {"{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"ping\"}", -32600, "a boolean id"},
    {"{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"ping\"}", -32600, "an array id"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}", -32600, "a number for a method"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\"}", -32600, "an empty method"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":[1]}", -32600,
     "positional params"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":\"x\"}", -32600,
     "a string for params"},
    {"{\"jsonrpc\":\"2.0\",\"id\":1}", -32600, "neither request nor response"},
    {"{\"jsonrpc\":\"2.0\",\"result\":{}}", -32600, "a response without an id"},
};

static void
parse_cases(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct cx_mcp_msg m;
        json_t *error = NULL;
        enum cx_err rc = cx_mcp_parse(cases[i].body, strlen(cases[i].body), &m, &error);
        int code =
            (int)json_integer_value(json_object_get(json_object_get(error, "error"), "code"));

        if (cases[i].code == 0)
            ok(rc == CX_OK && !error, "parses: %s", cases[i].why);
        else
            ok(rc == CX_ERR_INVALID && code == cases[i].code && !json_object_get(error, "id") &&
                   !strcmp(json_string_value(json_object_get(error, "jsonrpc")), "2.0"),
               "refused with %d and no id: %s (got %d)", cases[i].code, cases[i].why, code);
        json_decref(error);
        cx_mcp_msg_cleanup(&m);
    }
}

static void
long_id(void)
{
    char body[600];
    struct cx_mcp_msg m;
    json_t *error = NULL;

    snprintf(body, sizeof(body), "{\"jsonrpc\":\"2.0\",\"id\":\"%0256d\",\"method\":\"ping\"}", 0);
    ok(cx_mcp_parse(body, strlen(body), &m, &error) == CX_OK, "an id of 256 bytes is taken");
    cx_mcp_msg_cleanup(&m);
    json_decref(error); /* (made only when the parse failed: an allocation) */
    error = NULL;
    snprintf(body, sizeof(body), "{\"jsonrpc\":\"2.0\",\"id\":\"%0257d\",\"method\":\"ping\"}", 0);
    ok(cx_mcp_parse(body, strlen(body), &m, &error) == CX_ERR_INVALID, "one of 257 is not");
    cx_mcp_msg_cleanup(&m); /* (jansson out of memory may cut a string short) */
    json_decref(error);
}

static struct cx_mcp_msg
msg(const char *body)
{
    struct cx_mcp_msg m;
    json_t *error = NULL;

    if (cx_mcp_parse(body, strlen(body), &m, &error) != CX_OK) {
        printf("Bail out! %s does not parse\n", body);
        tap_bail();
    }
    return m;
}

static void
what_requests_are(void)
{
    struct cx_mcp_msg m = msg("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":"
                              "{\"name\":\"run_code\",\"_meta\":{\"progressToken\":\"t\"}}}");
    json_t *e;

    ok(cx_mcp_on_lane(&m) && cx_mcp_streams(&m), "run_code with a token: a run thread, a stream");
    cx_mcp_msg_cleanup(&m);
    m = msg("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":"
            "\"run_code\",\"_meta\":{\"progressToken\":{\"a\":1}}}}");
    ok(cx_mcp_on_lane(&m) && !cx_mcp_streams(&m), "a token that is no id: no stream");
    cx_mcp_msg_cleanup(&m);
    m = msg("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":"
            "\"list_artifacts\"}}");
    ok(!cx_mcp_on_lane(&m) && !cx_mcp_streams(&m), "list_artifacts: on the worker");
    cx_mcp_msg_cleanup(&m);
    m = msg("{\"jsonrpc\":\"2.0\",\"id\":\"q\",\"method\":\"resources/read\"}");
    ok(cx_mcp_on_lane(&m), "resources/read: on a run thread (it reads storage)");
    e = cx_mcp_error(&m, CX_ERR_NOT_FOUND, "gone", NULL);
    is_int(json_integer_value(json_object_get(json_object_get(e, "error"), "code")), -32002,
           "a resource not found is -32002");
    is_str(json_string_value(json_object_get(e, "id")), "q", "the error carries the request's id");
    json_decref(e);
    e = cx_mcp_error(&m, CX_ERR_CAPACITY, NULL, NULL);
    is_int(json_integer_value(json_object_get(json_object_get(e, "error"), "code")), -32603,
           "capacity is an internal error of the call");
    json_decref(e);
    cx_mcp_msg_cleanup(&m);
}

static void
versions_and_origins(void)
{
    struct cx_config cfg;
    char err[256];

    ok(cx_mcp_version_ok(NULL) && cx_mcp_version_ok("2025-11-25") &&
           cx_mcp_version_ok("2025-06-18") && cx_mcp_version_ok("2025-03-26"),
       "the versions spoken, and none said");
    ok(!cx_mcp_version_ok("2024-11-05") && !cx_mcp_version_ok("") &&
           !cx_mcp_version_ok("2025-11-25 "),
       "others are not");
    if (cx_config_parse(&cfg, "t",
                        "mcp_allowed_origins = https://app.example.com, http://localhost:3000\n"
                        "public_url = https://codexec.example.com/base/\n",
                        err, sizeof(err))) {
        printf("Bail out! %s\n", err);
        tap_bail();
    }
    ok(cx_mcp_origin_allowed(&cfg, NULL), "no Origin: not a browser's");
    ok(cx_mcp_origin_allowed(&cfg, "https://APP.example.com"), "a listed Origin, any case");
    ok(cx_mcp_origin_allowed(&cfg, "http://localhost:3000"), "another");
    ok(!cx_mcp_origin_allowed(&cfg, "https://app.example.com.evil.net"), "a longer one is not");
    ok(!cx_mcp_origin_allowed(&cfg, "https://app.example"), "a shorter one is not");
    ok(!cx_mcp_origin_allowed(&cfg, "http://localhost:30001"), "another port is not");
    ok(!cx_mcp_origin_allowed(&cfg, "null"), "null is not");
    is_str(cfg.public_url, "https://codexec.example.com/base", "public_url without its slash");
    cx_config_cleanup(&cfg);
    ok(cx_config_parse(&cfg, "t", "", err, sizeof(err)) == CX_OK &&
           !cx_mcp_origin_allowed(&cfg, "http://localhost"),
       "by default no browser Origin may");
    cx_config_cleanup(&cfg);
    ok(cx_config_parse(&cfg, "t", "mcp_allowed_origins = app.example.com\n", err, sizeof(err)) ==
           CX_ERR_INVALID,
       "an origin without a scheme is refused");
    ok(cx_config_parse(&cfg, "t", "mcp_allowed_origins = https://a.example/path\n", err,
                       sizeof(err)) == CX_ERR_INVALID,
       "an origin with a path is refused");
    ok(cx_config_parse(&cfg, "t", "public_url = https://a.example/?x=1\n", err, sizeof(err)) ==
           CX_ERR_INVALID,
       "a public_url with a query is refused");
}

/* tools/list: the table is valid JSON, each tool's name and required
 * arguments as SPEC §10.6 fixes them, an input and an output schema each. */
static void
tools(void)
{
    static const struct {
        const char *name, *required;
    } want[] = {{"run_code", "code"},         {"write_file", "path"},
                {"read_file", "path"},        {"list_files", ""},
                {"list_artifacts", ""},       {"get_download_link", "artifact_id"},
                {"reset_session", ""}};
    json_t *list = cx_mcp_tools_list(), *t = json_object_get(list, "tools");

    need(json_array_size(t) == 7, "tools/list parses: seven tools");
    for (size_t i = 0; i < 7; i++) {
        json_t *tool = json_array_get(t, i), *in = json_object_get(tool, "inputSchema");
        json_t *req = json_object_get(in, "required");
        const char *r = json_string_value(json_array_get(req, 0));

        is_str(json_string_value(json_object_get(tool, "name")), want[i].name, "tool %zu", i);
        is_str(r ? r : "", want[i].required, "%s's required argument", want[i].name);
        ok(json_array_size(req) <= 1 &&
               json_is_object(json_object_get(json_object_get(tool, "outputSchema"), "properties")),
           "%s: one required argument at most, an output schema", want[i].name);
    }
    json_decref(list);
}

int
main(void)
{
    parse_cases();
    long_id();
    what_requests_are();
    versions_and_origins();
    tools();
    return tap_done();
}
