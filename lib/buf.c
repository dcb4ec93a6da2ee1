#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

void
cx_buf_init(struct cx_buf *b, size_t cap)
{
    memset(b, 0, sizeof(*b));
    b->cap = cap;
}

void
cx_buf_cleanup(struct cx_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void
cx_buf_reset(struct cx_buf *b)
{
    b->len = 0;
    b->err = CX_OK;
    if (b->data)
        b->data[0] = '\0';
}

static int
grow(struct cx_buf *b, size_t need)
{
    size_t want, n;
    char *p;

    if (b->err)
        return -1;
    if (need > b->cap || need + 1 < need) {
        b->err = CX_ERR_TOO_LARGE;
        return -1;
    }
    if (need + 1 <= b->alloc)
        return 0;
    n = b->alloc ? b->alloc : 64;
    while (n < need + 1)
        n = n > SIZE_MAX / 2 ? need + 1 : n * 2;
    want = n;
    if (want > b->cap + 1)
        want = b->cap + 1;
    p = realloc(b->data, want);
    if (!p) {
        b->err = CX_ERR_NOMEM;
        return -1;
    }
    b->data = p;
    b->alloc = want;
    return 0;
}

void
cx_buf_add(struct cx_buf *b, const void *data, size_t len)
{
    if (grow(b, b->len + len))
        return;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void
cx_buf_adds(struct cx_buf *b, const char *s)
{
    cx_buf_add(b, s, strlen(s));
}

void
cx_buf_vaddf(struct cx_buf *b, const char *fmt, va_list ap)
{
    va_list cp;
    int n;

    if (b->err)
        return;
    va_copy(cp, ap);
    n = vsnprintf(NULL, 0, fmt, cp);
    va_end(cp);
    if (n < 0) {
        b->err = CX_ERR_INVALID;
        return;
    }
    if (grow(b, b->len + (size_t)n))
        return;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void
cx_buf_addf(struct cx_buf *b, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    cx_buf_vaddf(b, fmt, ap);
    va_end(ap);
}

enum cx_err
cx_buf_err(const struct cx_buf *b)
{
    return b->err;
}

char *
cx_buf_take(struct cx_buf *b, size_t *len)
{
    char *p = b->data;

    if (!p) {
        p = calloc(1, 1);
        if (!p)
            return NULL;
    }
    if (len)
        *len = b->len;
    b->data = NULL;
    b->len = b->alloc = 0;
    return p;
}

void
cx_buf_keep_tail(struct cx_buf *b, size_t keep)
{
    if (b->len <= keep)
        return;
    memmove(b->data, b->data + (b->len - keep), keep);
    b->len = keep;
    b->data[b->len] = '\0';
}

void
cx_buf_shrink(struct cx_buf *b, size_t max_alloc)
{
    size_t want = b->len + 1 > 64 ? b->len + 1 : 64;
    char *p;

    if (!b->data || b->alloc <= max_alloc || want > max_alloc)
        return;
    p = realloc(b->data, want);
    if (p) { /* a failed shrink keeps the larger block: nothing is lost */
        b->data = p;
        b->alloc = want;
    }
}
