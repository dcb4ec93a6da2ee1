/* The artifacts page: every value escaped, only the user's artifacts, links
 * that verify. Real PostgreSQL and storage. */
#include "../../lib/download.h"
#include "../../lib/page.h"
#include "cxtest.h"

static const struct {
    const char *in;
    const char *out;
} escapes[] = {
    {"plain", "plain"},
    {"a&b", "a&amp;b"},
    {"<script>", "&lt;script&gt;"},
    {"\"onload=x", "&quot;onload=x"},
    {"it's", "it&#39;s"},
    {"tab\there", "tab\there"},
    {"nl\nhere", "nl&#xFFFD;here"},
    {"esc\x1b[31m", "esc&#xFFFD;[31m"},
    {"caf\xc3\xa9", "caf\xc3\xa9"},
    {"", ""},
};

static void
escaping(void)
{
    for (size_t i = 0; i < sizeof(escapes) / sizeof(escapes[0]); i++) {
        struct cx_buf b;
        cx_buf_init(&b, 1024);
        cx_page_escape(&b, escapes[i].in);
        is_str(b.data ? b.data : "", escapes[i].out, "escape %zu", i);
        cx_buf_cleanup(&b);
    }
}

/* The first href="..." in html, unescaped (&amp; -> &), its query part. */
static void
first_link_query(const char *html, char *out, size_t outlen)
{
    const char *p = strstr(html, "href=\"");
    size_t n = 0;

    out[0] = '\0';
    if (!p || !(p = strchr(p, '?')))
        return;
    for (p++; *p && *p != '"' && n + 1 < outlen; p++) {
        out[n++] = *p;
        if (!strncmp(p, "&amp;", 5))
            p += 4; /* the '&' is kept, "amp;" skipped */
    }
    out[n] = '\0';
}

static void
page(struct cxtest *t)
{
    struct cx_principal bob = cxtest_principal(t, "bob"), eve = cxtest_principal(t, "eve");
    const char *evil = "%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E.txt";
    char msg[CX_MSG_MAX], q[2048], user[CX_USER_MAX + 1], id[37];
    struct cx_buf b;
    json_t *a = NULL;
    int version = 0;

    ok(cxtest_upload(t, "bob", "c1", evil, "hello", 5, &a, msg, sizeof(msg)) == CX_OK,
       "an artifact with markup in its name");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(a, "artifact_id")));
    json_decref(a);
    cx_buf_init(&b, 1 << 20);
    ok(cx_page_artifacts(&t->cx, &bob, "c1", &b) == CX_OK && b.data, "bob's page renders");
    ok(b.data && strstr(b.data, "&lt;img src=x onerror=alert(1)&gt;.txt"), "the name is escaped");
    ok(b.data && !strstr(b.data, "<img src=x"), "no markup of the user's reaches the page");
    ok(b.data && !strstr(b.data, "<script"), "no script at all");
    first_link_query(b.data ? b.data : "", q, sizeof(q));
    ok(cx_link_verify(&t->cx, q, id, user, &version) == CX_OK && !strcmp(user, "bob") &&
           version == 1,
       "its download link is a valid signed link for bob's version 1");
    cx_buf_cleanup(&b);

    cx_buf_init(&b, 1 << 20);
    ok(cx_page_artifacts(&t->cx, &eve, "c1", &b) == CX_OK && b.data &&
           strstr(b.data, "No artifacts yet.") && !strstr(b.data, "onerror"),
       "eve's page of the same conversation id shows none of bob's");
    cx_buf_cleanup(&b);
    cx_buf_init(&b, 1 << 20);
    is_int(cx_page_artifacts(&t->cx, &bob, "<x>", &b), CX_ERR_NOT_FOUND,
           "a malformed conversation id: not found");
    cx_buf_cleanup(&b);
    cx_buf_init(&b, 64);
    is_int(cx_page_artifacts(&t->cx, &bob, "c1", &b), CX_ERR_TOO_LARGE,
           "a page over the buffer's cap is an error, not a cut page");
    cx_buf_cleanup(&b);
}

int
main(void)
{
    struct cxtest t;

    escaping();
    cxtest_open(&t, "page", "");
    page(&t);
    cxtest_close(&t);
    return tap_done();
}
