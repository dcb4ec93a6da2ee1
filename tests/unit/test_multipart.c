#include "../../lib/http.h"
#include "tap.h"

struct got {
    char names[8][64];
    char files[8][64];
    char data[8][256];
    size_t lens[8];
    int parts, ends;
};

static enum cx_err
b(void *ctx, const char *name, const char *filename)
{
    struct got *g = ctx;
    if (g->parts >= 8)
        return CX_ERR_INVALID;
    snprintf(g->names[g->parts], 64, "%s", name);
    snprintf(g->files[g->parts], 64, "%s", filename ? filename : "(none)");
    g->parts++;
    return CX_OK;
}

static enum cx_err
d(void *ctx, const char *data, size_t len)
{
    struct got *g = ctx;
    size_t *l = &g->lens[g->parts - 1];
    if (*l + len > 255)
        return CX_ERR_TOO_LARGE;
    memcpy(g->data[g->parts - 1] + *l, data, len);
    *l += len;
    return CX_OK;
}

static enum cx_err
e(void *ctx)
{
    ((struct got *)ctx)->ends++;
    return CX_OK;
}

static const struct cx_multipart_cb cb = {b, d, e};

static int
parse(const char *body, size_t len, size_t split, struct got *g)
{
    struct cx_multipart *m = NULL;
    int rc;

    memset(g, 0, sizeof(*g));
    if (cx_http_multipart_new("XyZ", &cb, g, &m))
        return -1;
    rc = cx_http_multipart_feed(m, body, split);
    if (!rc)
        rc = cx_http_multipart_feed(m, body + split, len - split);
    if (!rc)
        rc = cx_http_multipart_finish(m);
    cx_http_multipart_free(m);
    return rc;
}

int
main(void)
{
    static const char body[] =
        "preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"conversation_id\"\r\n\r\nc1"
        "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a "
        "\\\"b\\\".csv\"\r\n"
        "Content-Type: text/csv\r\n\r\nx,y\r\n--Xy\r\nz--XyZ\r\n--XyZ--\r\nepilogue";
    char bd[80];
    struct got g;
    int all_ok = 1;

    for (size_t split = 0; split <= sizeof(body) - 1; split++) {
        int rc = parse(body, sizeof(body) - 1, split, &g);
        if (rc || g.parts != 2 || g.ends != 2 || strcmp(g.names[0], "conversation_id") ||
            g.lens[0] != 2 || memcmp(g.data[0], "c1", 2) || strcmp(g.names[1], "file") ||
            strcmp(g.files[1], "a \"b\".csv") || g.lens[1] != 17 ||
            memcmp(g.data[1], "x,y\r\n--Xy\r\nz--XyZ", 17)) {
            all_ok = 0;
            printf("# split %zu: rc %d parts %d ends %d\n", split, rc, g.parts, g.ends);
            break;
        }
    }
    ok(all_ok, "every split point parses the same two parts, boundary-like bytes kept");
    is_str(g.files[0], "(none)", "a field has no filename");

    {
        static const char nofinal[] =
            "--XyZ\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nabc";
        ok(parse(nofinal, sizeof(nofinal) - 1, 3, &g) != CX_OK, "no closing boundary: refused");
        static const char noname[] =
            "--XyZ\r\nContent-Disposition: form-data\r\n\r\nabc\r\n--XyZ--";
        ok(parse(noname, sizeof(noname) - 1, 3, &g) != CX_OK, "a part without a name: refused");
        static const char junk[] = "--XyZjunk";
        ok(parse(junk, sizeof(junk) - 1, 3, &g) != CX_OK, "junk after a delimiter: refused");
    }
    {
        char big[20000];
        memcpy(big, "--XyZ\r\n", 7);
        memset(big + 7, 'H', sizeof(big) - 7);
        ok(parse(big, sizeof(big), 100, &g) != CX_OK, "an endless header block: refused");
    }
    ok(cx_http_multipart_boundary("multipart/form-data; boundary=----abc", bd, sizeof(bd)) ==
               CX_OK &&
           !strcmp(bd, "----abc"),
       "boundary parsed");
    ok(cx_http_multipart_boundary("multipart/form-data; boundary=\"q r\"; x=y", bd, sizeof(bd)) ==
               CX_OK &&
           !strcmp(bd, "q r"),
       "quoted boundary");
    ok(cx_http_multipart_boundary("multipart/form-data", bd, sizeof(bd)) != CX_OK,
       "missing boundary");
    ok(cx_http_multipart_boundary("text/plain; boundary=x", bd, sizeof(bd)) != CX_OK,
       "not multipart");
    {
        char longb[200] = "multipart/form-data; boundary=";
        memset(longb + strlen(longb), 'b', 80);
        ok(cx_http_multipart_boundary(longb, bd, sizeof(bd)) != CX_OK,
           "boundary over 70 characters");
    }
    return tap_done();
}
