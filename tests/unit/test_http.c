#include "../../lib/http.h"
#include "tap.h"

struct src {
    const char *data;
    size_t len, pos;
};

static ssize_t
rd(void *ctx, void *buf, size_t n)
{
    struct src *s = ctx;
    size_t k = s->len - s->pos;
    if (k > n)
        k = n;
    if (k > 3)
        k = 3; /* short reads, as a socket gives them */
    memcpy(buf, s->data + s->pos, k);
    s->pos += k;
    return (ssize_t)k;
}

static const struct {
    const char *body;
    size_t len;
    int rc;
    const char *msg;
} json_cases[] = {
    {"{\"a\":1}", 7, CX_OK, NULL},
    {"{\"a\":", 5, CX_ERR_INVALID, "malformed JSON"},
    {"[1,2]", 5, CX_ERR_INVALID, "must be a JSON object"},
    {"\"s\"", 3, CX_ERR_INVALID, "must be a JSON object"},
    {"", 0, CX_ERR_INVALID, "empty"},
    {"{\"a\":\"\xff\"}", 9, CX_ERR_INVALID, "not valid UTF-8"},
    {"{\"a\":\"\xc0\xaf\"}", 10, CX_ERR_INVALID, "not valid UTF-8"},
    {"{\"a\":1}\0", 8, CX_ERR_INVALID, "not valid UTF-8"},
    {"{\"a\":1,\"a\":2}", 13, CX_ERR_INVALID, "malformed JSON"},
    {"{\"a\":1} x", 9, CX_ERR_INVALID, "malformed JSON"},
    {"{\"a\":\"\\u0000\"}", 14, CX_ERR_INVALID, "malformed JSON"},
    {"{\"a\":\"\\ud800\"}", 14, CX_ERR_INVALID, "malformed JSON"},
};

int
main(void)
{
    struct src s;
    char *body, out[64], msg[160];
    size_t len;
    json_t *j;
    uint64_t cl;

    s = (struct src){"0123456789", 10, 0};
    ok(cx_http_read_body(rd, &s, "10", 100, &body, &len) == CX_OK && len == 10 &&
           memcmp(body, "0123456789", 10) == 0 && body[10] == '\0',
       "reads a body across short reads");
    free(body);
    s = (struct src){"0123456789", 10, 0};
    is_int(cx_http_read_body(rd, &s, "10", 9, &body, &len), CX_ERR_TOO_LARGE,
           "announced length over the cap is refused before reading");
    is_int(s.pos, 0, "nothing was read");
    s = (struct src){"01234", 5, 0};
    is_int(cx_http_read_body(rd, &s, "10", 100, &body, &len), CX_ERR_IO, "a short body fails");
    s = (struct src){"", 0, 0};
    is_int(cx_http_read_body(rd, &s, "1e3", 100, &body, &len), CX_ERR_INVALID,
           "malformed Content-Length");
    is_int(cx_http_read_body(rd, &s, "-1", 100, &body, &len), CX_ERR_INVALID,
           "negative Content-Length");
    is_int(cx_http_read_body(rd, &s, "99999999999999999999999", 100, &body, &len), CX_ERR_INVALID,
           "overflowing Content-Length");
    ok(cx_http_read_body(rd, &s, NULL, 100, &body, &len) == CX_OK && len == 0, "no body");
    free(body);
    ok(cx_http_content_length("42", &cl) == CX_OK && cl == 42, "content length parses");

    for (size_t i = 0; i < sizeof(json_cases) / sizeof(json_cases[0]); i++) {
        msg[0] = '\0';
        int rc =
            cx_http_parse_json_object(json_cases[i].body, json_cases[i].len, &j, msg, sizeof(msg));
        is_int(rc, json_cases[i].rc, "json case %zu", i);
        if (json_cases[i].msg)
            ok(strstr(msg, json_cases[i].msg) != NULL, "json case %zu message: %s", i, msg);
        json_decref(j);
    }

    j = cx_http_error_json("not_found", "no such run");
    ok(j && strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                   "not_found") == 0,
       "error body has error.code");
    ok(j && json_is_string(json_object_get(json_object_get(j, "error"), "message")),
       "error body has error.message");
    json_decref(j);

    ok(cx_http_query_get("a=1&conversation_id=c%3A1&b", "conversation_id", out, sizeof(out)) ==
               CX_OK &&
           strcmp(out, "c:1") == 0,
       "query value percent-decoded");
    ok(cx_http_query_get("x=a+b", "x", out, sizeof(out)) == CX_OK && strcmp(out, "a b") == 0,
       "plus is a space");
    is_int(cx_http_query_get("aa=1", "a", out, sizeof(out)), CX_ERR_NOT_FOUND,
           "prefix is not a match");
    is_int(cx_http_query_get("a=%00", "a", out, sizeof(out)), CX_ERR_INVALID, "NUL refused");
    is_int(cx_http_query_get("a=%zz", "a", out, sizeof(out)), CX_ERR_INVALID, "bad escape refused");
    is_int(cx_http_query_get("a=%ff", "a", out, sizeof(out)), CX_ERR_INVALID,
           "invalid UTF-8 refused");
    is_int(cx_http_query_get("a=%4", "a", out, sizeof(out)), CX_ERR_INVALID, "truncated escape");
    is_int(cx_http_query_get("a=0123456789", "a", out, 5), CX_ERR_TOO_LARGE,
           "too long for the buffer");
    ok(cx_http_query_get("a", "a", out, sizeof(out)) == CX_OK && out[0] == '\0', "bare name");
    is_str(cx_http_reason(416), "Range Not Satisfiable", "reason phrase");
    return tap_done();
}
