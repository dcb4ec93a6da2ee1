/* The workspace paths of the file API (SPEC §10.1): decoded once, held to
 * their rules, every refusal CX_ERR_INVALID_PATH. */
#include <string.h>

#include "../../lib/codexec.h"
#include "tap.h"

static const struct {
    const char *raw;
    bool encoded, empty_ok;
    const char *want; /* NULL: refused */
} cases[] = {
    {"a.csv", true, false, "a.csv"},
    {"data/in%20put.csv", true, false, "data/in put.csv"},
    {"a+b", true, false, "a+b"},       /* a path's "+" is a plus */
    {"%C3%A9t%C3%A9", true, false, "\xc3\xa9t\xc3\xa9"},
    {"..a/b..", true, false, "..a/b.."}, /* dots inside a name are a name */
    {".hidden", true, false, ".hidden"},
    {"%2e%2e%2fx", false, false, "%2e%2e%2fx"}, /* not encoded: taken as it is */
    {"", true, true, ""},
    {"", true, false, NULL},
    {"..", true, false, NULL},
    {"../x", true, false, NULL},
    {"%2e%2e/x", true, false, NULL},
    {"a/%2E%2E", true, false, NULL},
    {"a/%2e", true, false, NULL},
    {"./a", true, false, NULL},
    {"a//b", true, false, NULL},
    {"/a", true, false, NULL},
    {"%2fa", true, false, NULL},
    {"a/", true, false, NULL},
    {"a%00b", true, false, NULL},
    {"a%0Ab", true, false, NULL},
    {"a%7f", true, false, NULL},
    {"a\tb", true, false, NULL},
    {"%", true, false, NULL},
    {"%4", true, false, NULL},
    {"%zz", true, false, NULL},
    {"%ff", true, false, NULL},
    {"%C0%AF", true, false, NULL}, /* an overlong "/" */
    {".codexec-up-x", true, false, NULL},
    {"d/.codexec-up-1", true, false, NULL},
    {"..", false, true, NULL},
    {"a/../b", false, true, NULL},
};

int
main(void)
{
    char out[CX_FILE_PATH_MAX + 1], msg[CX_MSG_MAX], seg[300], *longp;
    enum cx_err rc;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        msg[0] = '\0';
        rc = cx_files_path(cases[i].raw, cases[i].encoded, cases[i].empty_ok, out, msg,
                           sizeof(msg));
        if (cases[i].want) {
            ok(rc == CX_OK, "accepted: \"%s\" (%s)", cases[i].raw, msg);
            is_str(out, cases[i].want, "decoded: \"%s\"", cases[i].raw);
        } else {
            ok(rc == CX_ERR_INVALID_PATH && !strncmp(msg, "invalid path: ", 14),
               "refused: \"%s\" (%s)", cases[i].raw, msg);
        }
    }
    memset(seg, 's', 255);
    seg[255] = '\0';
    ok(cx_files_path(seg, true, false, out, msg, sizeof(msg)) == CX_OK, "a 255-byte segment");
    seg[255] = 's';
    seg[256] = '\0';
    ok(cx_files_path(seg, true, false, out, msg, sizeof(msg)) == CX_ERR_INVALID_PATH,
       "a 256-byte segment");
    /* 4096 bytes in all, then one more */
    longp = malloc(3 * 4097 + 1);
    if (!longp)
        tap_bail();
    for (int i = 0; i < 4096; i++)
        longp[i] = i % 100 == 99 ? '/' : 'p';
    longp[4096] = '\0';
    ok(cx_files_path(longp, true, false, out, msg, sizeof(msg)) == CX_OK && strlen(out) == 4096,
       "a 4096-byte path");
    longp[4096] = 'p';
    longp[4097] = '\0';
    ok(cx_files_path(longp, true, false, out, msg, sizeof(msg)) == CX_ERR_INVALID_PATH,
       "a 4097-byte path");
    /* 4096 bytes once decoded, three times that encoded */
    for (int i = 0; i < 4096; i++)
        memcpy(longp + 3 * i, i % 100 == 99 ? "%2F" : "%70", 3);
    longp[3 * 4096] = '\0';
    ok(cx_files_path(longp, true, false, out, msg, sizeof(msg)) == CX_OK && strlen(out) == 4096,
       "a 4096-byte path sent encoded");
    free(longp);
    return tap_done();
}
