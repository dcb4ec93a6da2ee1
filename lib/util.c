#include <arpa/inet.h>
#include <ctype.h>
#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "util.h"

/* The length of the valid UTF-8 sequence at s (1 to 4), or 0. */
static size_t
utf8_seq(const unsigned char *s, const unsigned char *end)
{
    unsigned char c = *s;
    size_t n;
    uint32_t cp;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 1;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 2;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - s) <= n)
        return 0;
    for (size_t i = 1; i <= n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n + 1;
}

bool
cx_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str, *end = s + len;

    while (s < end) {
        size_t n = utf8_seq(s, end);

        if (!n)
            return false;
        s += n;
    }
    return true;
}

/* The bytes at s (not a valid sequence) that one U+FFFD replaces: a lead
 * byte and what follows it of a sequence cut short (Unicode's "maximal
 * subpart", as Python's "replace" decodes), else the one byte. */
static size_t
utf8_bad(const unsigned char *s, const unsigned char *end)
{
    unsigned char c = *s, lo = 0x80, hi = 0xbf;
    size_t need, k = 1;

    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef)
        need = 2;
    else if (c >= 0xf0 && c <= 0xf4)
        need = 3;
    else
        return 1;
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    while (k <= need && s + k < end && s[k] >= lo && s[k] <= hi) {
        k++;
        lo = 0x80;
        hi = 0xbf;
    }
    return k > need ? need : k; /* (a whole one would have been valid) */
}

char *
cx_utf8_fix(const char *str, size_t len, size_t max, size_t *out_len)
{
    const unsigned char *s = (const unsigned char *)str, *end = s + len;
    struct cx_buf b;

    cx_buf_init(&b, max);
    while (s < end && !cx_buf_err(&b)) {
        size_t k = utf8_seq(s, end);

        if (k)
            cx_buf_add(&b, s, k);
        else
            cx_buf_add(&b, "\xef\xbf\xbd", 3);
        s += k ? k : utf8_bad(s, end);
    }
    if (cx_buf_err(&b)) {
        cx_buf_cleanup(&b);
        return NULL;
    }
    return cx_buf_take(&b, out_len);
}

bool
cx_uuid_valid(const char *s)
{
    static const int dash[] = {8, 13, 18, 23};
    size_t i, d = 0;

    if (!s)
        return false;
    for (i = 0; i < 36; i++) {
        char c = s[i];
        if (d < 4 && (int)i == dash[d]) {
            if (c != '-')
                return false;
            d++;
            continue;
        }
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return false;
    }
    return s[36] == '\0';
}

enum cx_err
cx_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return CX_ERR_IO;
        }
        p += n;
        len -= (size_t)n;
    }
    return CX_OK;
}

int64_t
cx_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
cx_now_ms(void)
{
    return cx_now_us() / 1000;
}

void
cx_random_id(char out[33])
{
    unsigned char raw[16];

    randombytes_buf(raw, sizeof(raw));
    sodium_bin2hex(out, 33, raw, sizeof(raw));
}

void
cx_uuid_generate(char out[37])
{
    unsigned char b[16];
    char hex[33];

    randombytes_buf(b, sizeof(b));
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    sodium_bin2hex(hex, sizeof(hex), b, sizeof(b));
    snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

bool
cx_name_chars(const char *s, size_t n, const char *extra)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              (c && strchr(extra, c))))
            return false;
    }
    return true;
}

bool
cx_conversation_id_valid(const char *s)
{
    size_t n = s ? strnlen(s, CX_CONVERSATION_MAX + 1) : 0;

    return n >= 1 && n <= CX_CONVERSATION_MAX && cx_name_chars(s, n, "._:-");
}

#define ADDR_LIST_MAX 32

struct net {
    int family;
    unsigned char addr[16];
    unsigned bits;
};

/* One "address[/bits]" of n characters. */
static bool
net_parse(const char *s, size_t n, struct net *out)
{
    char text[64], *slash, *end;
    unsigned long bits;

    if (n == 0 || n >= sizeof(text))
        return false;
    memcpy(text, s, n);
    text[n] = '\0';
    slash = strchr(text, '/');
    if (slash)
        *slash = '\0';
    if (inet_pton(AF_INET, text, out->addr) == 1)
        out->family = AF_INET;
    else if (inet_pton(AF_INET6, text, out->addr) == 1)
        out->family = AF_INET6;
    else
        return false;
    out->bits = out->family == AF_INET ? 32 : 128;
    if (slash) {
        if (!isdigit((unsigned char)slash[1]))
            return false;
        errno = 0;
        bits = strtoul(slash + 1, &end, 10);
        if (errno || *end || bits > out->bits)
            return false;
        out->bits = (unsigned)bits;
    }
    return true;
}

static bool
net_contains(const struct net *net, int family, const unsigned char *addr)
{
    unsigned full = net->bits / 8, rest = net->bits % 8;

    if (family != net->family || memcmp(net->addr, addr, full) != 0)
        return false;
    return rest == 0 || ((net->addr[full] ^ addr[full]) & (0xff << (8 - rest))) == 0;
}

/* Calls fn for each item of a list; false at the first it refuses. */
static bool
addr_list_each(const char *list, bool (*fn)(void *, const char *, size_t), void *ctx)
{
    const char *p = list;
    unsigned count = 0;

    for (;;) {
        size_t n;
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            return true;
        n = strcspn(p, " \t,");
        if (++count > ADDR_LIST_MAX || !fn(ctx, p, n))
            return false;
        p += n;
    }
}

static bool
add_normalized(void *ctx, const char *item, size_t n)
{
    struct cx_buf *b = ctx;
    char text[INET6_ADDRSTRLEN];
    struct net net;

    if (!net_parse(item, n, &net) || !inet_ntop(net.family, net.addr, text, sizeof(text)))
        return false;
    cx_buf_addf(b, "%s%s/%u", b->len ? "," : "", text, net.bits);
    return true;
}

enum cx_err
cx_addr_list_normalize(const char *text, char **out)
{
    struct cx_buf b;
    const char *t = text + strspn(text, " \t");
    size_t len;

    if (!strncmp(t, "*", 1) && t[1 + strspn(t + 1, " \t")] == '\0') {
        *out = strdup("*");
        return *out ? CX_OK : CX_ERR_NOMEM;
    }
    cx_buf_init(&b, 4096);
    cx_buf_adds(&b, "");
    if (!addr_list_each(text, add_normalized, &b) || cx_buf_err(&b)) {
        enum cx_err rc = cx_buf_err(&b) ? cx_buf_err(&b) : CX_ERR_INVALID;
        cx_buf_cleanup(&b);
        return rc;
    }
    *out = cx_buf_take(&b, &len);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

struct match {
    int family;
    unsigned char addr[16];
    bool found;
};

static bool
match_one(void *ctx, const char *item, size_t n)
{
    struct match *m = ctx;
    struct net net;

    if (net_parse(item, n, &net) && net_contains(&net, m->family, m->addr))
        m->found = true;
    return !m->found; /* stop at the first match */
}

bool
cx_addr_list_match(const char *list, const char *addr)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    struct match m = {0};

    if (!list || !addr)
        return false;
    if (!strcmp(list, "*"))
        return true;
    if (inet_pton(AF_INET, addr, m.addr) == 1) {
        m.family = AF_INET;
    } else if (inet_pton(AF_INET6, addr, m.addr) == 1) {
        m.family = AF_INET6;
        if (!memcmp(m.addr, mapped, sizeof(mapped))) { /* ::ffff:a.b.c.d */
            memmove(m.addr, m.addr + 12, 4);
            m.family = AF_INET;
        }
    } else {
        return false;
    }
    addr_list_each(list, match_one, &m);
    return m.found;
}

size_t
cx_json_cost(const char *s, size_t len)
{
    const char *p = s, *end = s + len;
    size_t cost = 0;

    while (p < end) {
        char ch = *p++;

        if (ch == '"') {
            cost += CX_JSON_COST_STRING;
            /* to the closing quote: one not preceded by an odd run of
             * backslashes (memchr over the string's bulk) */
            for (;;) {
                const char *q = memchr(p, '"', (size_t)(end - p));
                size_t bs = 0;

                if (!q)
                    return cost; /* unterminated: jansson refuses it */
                while (q - bs > p && q[-1 - (ptrdiff_t)bs] == '\\')
                    bs++;
                p = q + 1;
                if (bs % 2 == 0)
                    break;
            }
        } else if (ch == '[' || ch == '{') {
            cost += CX_JSON_COST_CONTAINER;
        } else if (ch == ',' || ch == ':') {
            cost += CX_JSON_COST_ELEMENT;
        }
    }
    return cost;
}

int
cx_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static const char *const lang_names[CX_LANG__COUNT] = {
    [CX_LANG_PYTHON] = "python", [CX_LANG_JAVASCRIPT] = "javascript", [CX_LANG_R] = "r"};

const char *
cx_lang_name(enum cx_lang lang)
{
    return lang > CX_LANG_PYTHON && lang < CX_LANG__COUNT ? lang_names[lang] : "python";
}

bool
cx_lang_parse(const char *s, enum cx_lang *out)
{
    for (int i = 0; i < CX_LANG__COUNT; i++)
        if (s && !strcmp(s, lang_names[i])) {
            *out = (enum cx_lang)i;
            return true;
        }
    return false;
}
