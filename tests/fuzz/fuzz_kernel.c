/* Jupyter messages as a kernel (a tenant's code) could make them: each
 * line of the input is one frame (text, or binary with buffers); they are
 * waited for as replies to three requests, the way a run waits, and every
 * message is handed to a callback that reads it as a run does. An input
 * whose first line is "v1" is read by a connection that speaks v1 (binary
 * frames of offsets and parts), any other by one speaking JSON. */
#include "../../lib/kernel.h"
#include "../../lib/util.h"
#include "fuzz.h"

static enum cx_err
on_msg(void *ctx, int index, const char *type, json_t *content,
       const struct cx_kernel_buffers *bufs)
{
    size_t *n = ctx;
    json_t *data = json_object_get(content, "data");

    *n += (size_t)index + strlen(type) + json_object_size(data);
    for (size_t i = 0; bufs && i < bufs->n; i++)
        *n += bufs->len[i] ? bufs->data[i][bufs->len[i] - 1] : 0u; /* read to the end */
    (void)json_string_length(json_object_get(content, "text"));
    return CX_OK;
}

/* Wraps each line as an unmasked text frame; a line that begins with 'B'
 * is the rest of it as a binary frame (count, offsets, JSON, buffers). */
static uint8_t *
frames(const uint8_t *data, size_t size, size_t *outlen)
{
    uint8_t *out = malloc(size * 2 + 64), *o = out;
    size_t start = 0;

    if (!out)
        return NULL;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != '\n')
            continue;
        size_t n = i - start;
        bool bin = n > 0 && data[start] == 'B';
        if (bin) {
            start++;
            n--;
        }
        *o++ = bin ? 0x82 : 0x81;
        if (n < 126) {
            *o++ = (uint8_t)n;
        } else {
            *o++ = 126;
            *o++ = (uint8_t)(n >> 8);
            *o++ = (uint8_t)n;
        }
        memcpy(o, data + start, n);
        o += n;
        start = i + 1;
    }
    *outlen = (size_t)(o - out);
    return out;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cx_kernel_conn *c = NULL;
    struct cx_exec reqs[3];
    size_t len = 0, seen = 0;
    uint8_t *f;

    if (size > 60000)
        return 0; /* lines must fit 16-bit frame lengths */
    fuzz_quiet();
    f = frames(data, size, &len);
    if (!f)
        return 0;
    if (cx_kernel_conn_buffered(f, len, size >= 3 && !memcmp(data, "v1\n", 3), &c) == CX_OK) {
        memset(reqs, 0, sizeof(reqs));
        for (int i = 0; i < 3; i++) {
            snprintf(reqs[i].msg_id, sizeof(reqs[i].msg_id), "m%d", i);
            reqs[i].sent = true;
        }
        (void)cx_kernel_wait(c, reqs, 3, 3, cx_now_us() + 1000000, on_msg, &seen);
        cx_exec_cleanup(reqs, 3);
        cx_kernel_conn_free(c);
    }
    free(f);
    return 0;
}
