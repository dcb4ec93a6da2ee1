#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

bool
cx_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str, *end = s + len;

    while (s < end) {
        unsigned char c = *s;
        size_t n;
        uint32_t cp;

        if (c < 0x80) {
            s++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if ((size_t)(end - s) <= n)
            return false;
        for (size_t i = 1; i <= n; i++) {
            if ((s[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        s += n + 1;
    }
    return true;
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

void
cx_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char h[crypto_hash_sha256_BYTES];

    crypto_hash_sha256(h, data, len);
    sodium_bin2hex(out, 65, h, sizeof(h));
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
