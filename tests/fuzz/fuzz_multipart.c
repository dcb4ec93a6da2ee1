/* multipart/form-data bodies: the first line is the Content-Type, the rest
 * the body, fed in pieces whose sizes come from the input too. */
#include "../../lib/http.h"
#include "fuzz.h"

static enum cx_err
on_begin(void *ctx, const char *name, const char *filename)
{
    size_t *n = ctx;
    *n += strlen(name) + (filename ? strlen(filename) : 0);
    return CX_OK;
}

static enum cx_err
on_data(void *ctx, const char *data, size_t len)
{
    size_t *n = ctx;
    *n += len ? (unsigned char)data[0] + (unsigned char)data[len - 1] : 0;
    return CX_OK;
}

static enum cx_err
on_end(void *ctx)
{
    (void)ctx;
    return CX_OK;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct cx_multipart_cb cb = {on_begin, on_data, on_end};
    const uint8_t *nl = memchr(data, '\n', size);
    char *ctype, boundary[80];
    struct cx_multipart *m = NULL;
    size_t seen = 0, off, step;

    if (!nl)
        return 0;
    fuzz_quiet();
    ctype = fuzz_string(data, (size_t)(nl - data));
    if (!ctype)
        return 0;
    if (cx_http_multipart_boundary(ctype, boundary, sizeof(boundary)) == CX_OK &&
        cx_http_multipart_new(boundary, &cb, &seen, &m) == CX_OK) {
        off = (size_t)(nl - data) + 1;
        step = size > 0 ? 1 + data[0] % 97 : 1; /* odd piece sizes split every token */
        while (off < size) {
            size_t n = size - off < step ? size - off : step;
            if (cx_http_multipart_feed(m, (const char *)data + off, n) != CX_OK)
                break;
            off += n;
        }
        (void)cx_http_multipart_finish(m);
        cx_http_multipart_free(m);
    }
    free(ctype);
    return 0;
}
