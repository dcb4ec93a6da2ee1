#include "../../lib/util.h"
#include "tap.h"

static const struct {
    const char *s;
    size_t len;
    int valid;
    const char *what;
} utf8_cases[] = {
    {"plain ascii", 11, 1, "ASCII"},
    {"caf\xc3\xa9", 5, 1, "two-byte sequence"},
    {"\xe2\x82\xac", 3, 1, "three-byte sequence (euro)"},
    {"\xf0\x9f\x98\x80", 4, 1, "four-byte sequence (emoji)"},
    {"\xc3", 1, 0, "truncated two-byte sequence"},
    {"\xc0\xaf", 2, 0, "overlong slash"},
    {"\xe0\x80\xaf", 3, 0, "overlong three-byte"},
    {"\xed\xa0\x80", 3, 0, "UTF-16 surrogate"},
    {"\xf4\x90\x80\x80", 4, 0, "beyond U+10FFFF"},
    {"\xff", 1, 0, "0xFF byte"},
    {"\x80", 1, 0, "lone continuation byte"},
    {"ok\xe2\x82", 4, 0, "truncated at the end"},
};

static const struct {
    const char *text;
    const char *norm; /* NULL: refused */
} lists[] = {
    {"127.0.0.0/8, ::1", "127.0.0.0/8,::1/128"},
    {"10.1.2.3", "10.1.2.3/32"},
    {"  ", ""},
    {"", ""},
    {"*", "*"},
    {" * ", "*"},
    {"2001:db8::/32 192.168.0.0/16", "2001:db8::/32,192.168.0.0/16"},
    {"10.0.0.0/33", NULL},
    {"::1/129", NULL},
    {"10.0.0.1/", NULL},
    {"10.0.0.1/-1", NULL},
    {"example.com", NULL},
    {"10.0.0.256", NULL},
    {"*, 10.0.0.1", NULL},
    {"10.0.0.1/8x", NULL},
};

static const struct {
    const char *list;
    const char *addr;
    bool allowed;
} matches[] = {
    {"127.0.0.0/8,::1/128", "127.0.0.1", true},
    {"127.0.0.0/8,::1/128", "127.255.1.2", true},
    {"127.0.0.0/8,::1/128", "::1", true},
    {"127.0.0.0/8,::1/128", "::ffff:127.0.0.1", true},
    {"127.0.0.0/8,::1/128", "128.0.0.1", false},
    {"127.0.0.0/8,::1/128", "::2", false},
    {"127.0.0.0/8,::1/128", "", false},
    {"127.0.0.0/8,::1/128", "localhost", false},
    {"127.0.0.0/8,::1/128", NULL, false},
    {"10.0.0.0/12", "10.15.255.255", true},
    {"10.0.0.0/12", "10.16.0.0", false},
    {"", "127.0.0.1", false},
    {"*", "203.0.113.9", true},
    {"0.0.0.0/0", "203.0.113.9", true},
    {"0.0.0.0/0", "2001:db8::1", false},
};

int
main(void)
{
    char id[33];

    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        char *norm = NULL;
        enum cx_err rc = cx_addr_list_normalize(lists[i].text, &norm);
        if (lists[i].norm)
            ok(rc == CX_OK && norm && !strcmp(norm, lists[i].norm), "list \"%s\" is \"%s\" (%s)",
               lists[i].text, lists[i].norm, norm ? norm : "refused");
        else
            is_int(rc, CX_ERR_INVALID, "list \"%s\" is refused", lists[i].text);
        free(norm);
    }
    for (size_t i = 0; i < sizeof(matches) / sizeof(matches[0]); i++)
        is_int(cx_addr_list_match(matches[i].list, matches[i].addr), matches[i].allowed,
               "%s in \"%s\"", matches[i].addr ? matches[i].addr : "(null)", matches[i].list);

    for (size_t i = 0; i < sizeof(utf8_cases) / sizeof(utf8_cases[0]); i++)
        is_int(cx_utf8_valid(utf8_cases[i].s, utf8_cases[i].len), utf8_cases[i].valid, "utf8: %s",
               utf8_cases[i].what);
    ok(cx_uuid_valid("123e4567-e89b-12d3-a456-426614174000"), "uuid: valid");
    ok(cx_uuid_valid("123E4567-E89B-12D3-A456-426614174000"), "uuid: upper case");
    ok(!cx_uuid_valid("123e4567e89b12d3a456426614174000"), "uuid: no dashes");
    ok(!cx_uuid_valid("123e4567-e89b-12d3-a456-4266141740001"), "uuid: too long");
    ok(!cx_uuid_valid("123e4567-e89b-12d3-a456-42661417400"), "uuid: too short");
    ok(!cx_uuid_valid("' OR 1=1 --"), "uuid: SQL");
    ok(!cx_uuid_valid(NULL), "uuid: NULL");
    cx_random_id(id);
    is_int(strlen(id), 32, "random id is 32 hex chars");
    ok(cx_now_ms() > 0, "monotonic clock runs");
    return tap_done();
}
