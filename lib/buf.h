/* codexec: growable byte buffer with a hard cap and sticky failure.
 *
 * Appends after a failure (allocation, or growth past the cap) are no-ops;
 * the caller checks cx_buf_err() once at the end (curl dynbuf style).
 * The struct lives in caller storage: cx_buf_init() / cx_buf_cleanup().
 * The data is always NUL-terminated (the NUL is not counted in len). */
#ifndef CX_BUF_H
#define CX_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "codexec.h"

void cx_buf_add(struct cx_buf *b, const void *data, size_t len);
void cx_buf_vaddf(struct cx_buf *b, const char *fmt, va_list ap) CX_PRINTF(2, 0);
/* Drops all but the last keep bytes (a no-op when it holds no more). */
void cx_buf_keep_tail(struct cx_buf *b, size_t keep);
/* Gives memory back after a large use: when more than max_alloc bytes are
 * allocated and the contents fit in max_alloc, the block shrinks to fit. */
void cx_buf_shrink(struct cx_buf *b, size_t max_alloc);
/* Hands the data to the caller (free() it); the buffer is left empty. */
char *cx_buf_take(struct cx_buf *b, size_t *len);

#endif
