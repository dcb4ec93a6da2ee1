#include "../../lib/buf.h"
#include "tap.h"

int
main(void)
{
    struct cx_buf b;
    char *p;
    size_t n;

    cx_buf_init(&b, 16);
    cx_buf_adds(&b, "hello");
    cx_buf_addf(&b, " %d", 42);
    is_str(b.data, "hello 42", "appends and formats");
    is_int(b.len, 8, "length counts bytes without the NUL");
    cx_buf_adds(&b, "0123456789");
    is_int(cx_buf_err(&b), CX_ERR_TOO_LARGE, "growth past the cap fails");
    is_str(b.data, "hello 42", "a failed append leaves the data as it was");
    cx_buf_adds(&b, "x");
    is_int(b.len, 8, "appends after a failure are no-ops (sticky)");
    cx_buf_reset(&b);
    is_int(cx_buf_err(&b), CX_OK, "reset clears the error");
    cx_buf_add(&b, "a\0b", 3);
    is_int(b.len, 3, "binary data with NUL is kept");
    p = cx_buf_take(&b, &n);
    ok(p && n == 3 && p[2] == 'b' && p[3] == '\0', "take hands over NUL-terminated data");
    ok(b.data == NULL && b.len == 0, "take leaves the buffer empty");
    free(p);
    cx_buf_cleanup(&b);

    cx_buf_init(&b, 1 << 20);
    for (int i = 0; i < 10000; i++)
        cx_buf_addf(&b, "%04d", i % 10000);
    need(b.len == 40000 && !cx_buf_err(&b), "many appends grow the buffer");
    ok(memcmp(b.data + 39996, "9999", 4) == 0, "content is intact after growth");
    cx_buf_cleanup(&b);
    cx_buf_cleanup(&b);
    ok(1, "cleanup twice is safe");
    {
        struct cx_buf s;
        cx_buf_init(&s, 1 << 24);
        for (int i = 0; i < 100000; i++)
            cx_buf_adds(&s, "0123456789");
        cx_buf_shrink(&s, 4096);
        ok(s.alloc > 4096, "a large buffer still in use keeps its memory");
        cx_buf_reset(&s);
        cx_buf_adds(&s, "small");
        cx_buf_shrink(&s, 4096);
        ok(s.alloc <= 4096 && !strcmp(s.data, "small"),
           "emptied, it gives it back, keeping its contents");
        cx_buf_adds(&s, " again");
        is_str(s.data, "small again", "and grows again after");
        cx_buf_cleanup(&s);
    }
    return tap_done();
}
