#include <sodium.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/digest.h"
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

/* SHA-256 and HMAC through libcrypto, against libsodium's (an
 * implementation of its own): every length to 300 bytes (the padding's
 * edges at 55, 56, 63, 64, 119, 120...), each fed whole and in pieces
 * split at random, then 1 MiB and 3 MiB + 7 in uneven writes; the test
 * vectors of FIPS 180-2 and RFC 4231. */
static bool
sha256_pieces(const unsigned char *data, size_t len, size_t most, unsigned char got[32])
{
    struct cx_sha256 s;

    if (cx_sha256_init(&s))
        return false;
    for (size_t at = 0; at < len;) {
        size_t n = 1 + randombytes_uniform((uint32_t)most);
        n = n < len - at ? n : len - at;
        cx_sha256_update(&s, data + at, n);
        at += n;
    }
    return cx_sha256_final(&s, got) == CX_OK;
}

static void
sha256(void)
{
    static unsigned char data[(3 << 20) + 7];
    unsigned char want[32], got[32];
    int bad = 0;
    char hex[65];

    randombytes_buf(data, sizeof(data));
    for (size_t len = 0; len <= 300; len++) {
        crypto_hash_sha256(want, data, len);
        bad += cx_sha256(data, len, got) != CX_OK || memcmp(want, got, 32) != 0;
        bad += !sha256_pieces(data, len, 70, got) || memcmp(want, got, 32) != 0;
    }
    is_int(bad, 0, "sha256: every length to 300, whole and split, as libsodium's");
    bad = 0;
    for (size_t len = 1 << 20; len <= sizeof(data); len += (2 << 20) + 7) {
        crypto_hash_sha256(want, data, len);
        bad += !sha256_pieces(data, len, 200000, got) || memcmp(want, got, 32) != 0;
    }
    is_int(bad, 0, "sha256: 1 MiB and 3 MiB + 7 in uneven writes, as libsodium's");
    ok(cx_sha256_hex("abc", 3, hex) == CX_OK &&
           !strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
       "sha256: abc");
    ok(cx_sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, hex) ==
               CX_OK &&
           !strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
       "sha256: the two-block vector");
    ok(cx_sha256_hex("", 0, hex) == CX_OK &&
           !strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
       "sha256: empty");
    {
        static struct cx_sha256_kept k = CX_SHA256_KEPT_INIT;
        const char *a = cx_sha256_kept(&k, "abc"), *b = cx_sha256_kept(&k, "abc");
        ok(a && a == b &&
               !strcmp(a, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
           "sha256: a kept digest, computed once");
    }
    {
        struct cx_sha256 s;
        ok(cx_sha256_init(&s) == CX_OK, "sha256: a state");
        cx_sha256_update(&s, "abc", 3);
        cx_sha256_cleanup(&s);
        cx_sha256_cleanup(&s);
        ok(s.ctx == NULL, "sha256: cleaned up without a digest, twice");
    }
}

static void
hmac(void)
{
    unsigned char key[200], msg[300], want[64], got[32];
    crypto_auth_hmacsha256_state st;
    int bad = 0;
    char hex[65];

    ok(cx_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, got) == CX_OK,
       "hmac-sha256: RFC 4231 case 2");
    sodium_bin2hex(hex, sizeof(hex), got, 32);
    is_str(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
           "hmac-sha256: its MAC");
    randombytes_buf(key, sizeof(key));
    randombytes_buf(msg, sizeof(msg));
    /* keys shorter and longer than the block (64), messages to 300 */
    for (size_t kl = 0; kl <= sizeof(key); kl += 13)
        for (size_t ml = 0; ml <= sizeof(msg); ml += 37) {
            crypto_auth_hmacsha256_init(&st, key, kl);
            crypto_auth_hmacsha256_update(&st, msg, ml);
            crypto_auth_hmacsha256_final(&st, want);
            bad += cx_hmac_sha256(key, kl, msg, ml, got) != CX_OK || memcmp(want, got, 32) != 0;
        }
    is_int(bad, 0, "hmac-sha256: keys 0 to 200 bytes, messages to 300, as libsodium's");
    bad = 0;
    /* v1 links: libsodium's crypto_auth, HMAC-SHA-512 cut to 256 bits */
    for (size_t ml = 0; ml <= sizeof(msg); ml += 11) {
        crypto_auth(want, msg, ml, key);
        bad += cx_hmac_sha512_256(key, crypto_auth_KEYBYTES, msg, ml, got) != CX_OK ||
               memcmp(want, got, 32) != 0;
    }
    is_int(bad, 0, "hmac-sha512-256: as libsodium's crypto_auth (v1 links)");
}

/* cx_json_cost: what jansson would build, counted outside strings only. */
static const struct {
    const char *json;
    size_t cost;
} costs[] = {
    {"{}", CX_JSON_COST_CONTAINER},
    {"[1,2,3]", CX_JSON_COST_CONTAINER + 2 * CX_JSON_COST_ELEMENT},
    {"{\"a\":[]}", 2 * CX_JSON_COST_CONTAINER + CX_JSON_COST_ELEMENT + CX_JSON_COST_STRING},
    /* all inside a string */
    {"\"[[[,,,:::{{{\"", CX_JSON_COST_STRING},
    /* an escaped quote */
    {"[\"a\\\"[[[\", {}]", 2 * CX_JSON_COST_CONTAINER + CX_JSON_COST_ELEMENT + CX_JSON_COST_STRING},
    /* an escaped backslash */
    {"[\"a\\\\\",[]]", 2 * CX_JSON_COST_CONTAINER + CX_JSON_COST_ELEMENT + CX_JSON_COST_STRING},
    {"\"unterminated [[[", CX_JSON_COST_STRING},
    {"", 0},
};

static void
json_cost_cases(void)
{
    size_t n = 400000;
    char *deep = malloc(n * 3 + 2);

    for (size_t i = 0; i < sizeof(costs) / sizeof(costs[0]); i++)
        is_int((long long)cx_json_cost(costs[i].json, strlen(costs[i].json)),
               (long long)costs[i].cost, "json cost of %s", costs[i].json);
    if (!deep)
        return;
    /* 1.2 MB of "[[],[],...]": jansson would take ~50 MB for it */
    deep[0] = '[';
    for (size_t i = 0; i < n; i++)
        memcpy(deep + 1 + i * 3, "[],", 3);
    deep[n * 3] = ']';
    deep[n * 3 + 1] = '\0';
    ok(cx_json_cost(deep, n * 3 + 1) > CX_JSON_COST_MAX,
       "a small body of tiny containers is costly");
    /* the same bytes as one string cost nothing to count */
    deep[0] = '"';
    deep[n * 3] = '"';
    is_int((long long)cx_json_cost(deep, n * 3 + 1), CX_JSON_COST_STRING,
           "... inside a string, one string");
    free(deep);
}

int
main(void)
{
    char id[33];

    if (sodium_init() < 0)
        return 1;
    sha256();
    hmac();

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
    for (size_t i = 0; i < sizeof(utf8_cases) / sizeof(utf8_cases[0]); i++) {
        size_t n = 0;
        char *f = cx_utf8_fix(utf8_cases[i].s, utf8_cases[i].len, 1024, &n);
        ok(f && cx_utf8_valid(f, n) &&
               (!utf8_cases[i].valid || (n == utf8_cases[i].len && !memcmp(f, utf8_cases[i].s, n))),
           "utf8 fixed: %s", utf8_cases[i].what);
        free(f);
    }
    {
        /* what Python's bytes.decode('utf-8', 'replace') gives */
        static const struct {
            const char *in, *out;
            size_t in_len, out_len;
            const char *what;
        } fix[] = {
            {"\x61\xff\xc3\xa9\xed\xa0\x80\x7a",
             "\x61\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\x7a", 8, 16,
             "one byte, a surrogate's three, the valid kept"},
            {"\x61\xe2\x82\x62", "\x61\xef\xbf\xbd\x62", 4, 5, "a sequence cut short"},
            {"\xf0\x9f\x98", "\xef\xbf\xbd", 3, 3, "cut short at the end"},
            {"\xf0\x9f\x98\x7a", "\xef\xbf\xbd\x7a", 4, 4, "four bytes cut short"},
            {"\xe0\xa0", "\xef\xbf\xbd", 2, 3, "E0's second byte"},
            {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3, 9,
             "an overlong: each byte"},
            {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4, 12,
             "past U+10FFFF: each byte"},
            {"\xc3", "\xef\xbf\xbd", 1, 3, "a lone lead byte"},
            {"\xf0\x9f\x41\xe2\x82\xac", "\xef\xbf\xbd\x41\xe2\x82\xac", 6, 7,
             "cut short before a valid one"},
        };
        size_t n = 0;
        char *f;

        for (size_t i = 0; i < sizeof(fix) / sizeof(fix[0]); i++) {
            f = cx_utf8_fix(fix[i].in, fix[i].in_len, 64, &n);
            ok(f && n == fix[i].out_len && !memcmp(f, fix[i].out, n), "utf8 fixed: %s",
               fix[i].what);
            free(f);
        }
        f = cx_utf8_fix("\xff\xff", 2, 6, &n);
        ok(f && n == 6, "utf8 fixed: at its maximum");
        free(f);
        ok(cx_utf8_fix("\xff\xff", 2, 5, &n) == NULL, "utf8 fixed: over its maximum, none");
    }
    ok(cx_uuid_valid("123e4567-e89b-12d3-a456-426614174000"), "uuid: valid");
    ok(cx_uuid_valid("123E4567-E89B-12D3-A456-426614174000"), "uuid: upper case");
    ok(!cx_uuid_valid("123e4567e89b12d3a456426614174000"), "uuid: no dashes");
    ok(!cx_uuid_valid("123e4567-e89b-12d3-a456-4266141740001"), "uuid: too long");
    ok(!cx_uuid_valid("123e4567-e89b-12d3-a456-42661417400"), "uuid: too short");
    ok(!cx_uuid_valid("' OR 1=1 --"), "uuid: SQL");
    ok(!cx_uuid_valid(NULL), "uuid: NULL");
    json_cost_cases();
    cx_random_id(id);
    is_int(strlen(id), 32, "random id is 32 hex chars");
    ok(cx_now_ms() > 0, "monotonic clock runs");
    return tap_done();
}
