/* MIME types from the bytes (the system's libmagic), refined by the
 * extension only where the bytes are generic; artifact kinds. */
#include <pthread.h>

#include "../../lib/mime.h"
#include "tap.h"

#define PNG "\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\1\0\0\0\1\x08\x02\0\0\0"
#define ZIP                                                                                        \
    "\x50\x4b\x03\x04\x14\x00\x00\x00\x00\x00\x99\x5e\x7e\x5d\xac\x2a\x93\xd8\x02\x00\x00\x00\x02" \
    "\x00\x00\x00\x05\x00\x00\x00\x61\x2e\x74\x78\x74\x68\x69\x50\x4b\x01\x02\x14\x03\x14\x00\x00" \
    "\x00\x00\x00\x99\x5e\x7e\x5d\xac\x2a\x93\xd8\x02\x00\x00\x00\x02\x00\x00\x00\x05\x00\x00\x00" \
    "\x00\x00\x00\x00\x00\x00\x00\x00\x80\x01\x00\x00\x00\x00\x61\x2e\x74\x78\x74\x50\x4b\x05\x06" \
    "\x00\x00\x00\x00\x01\x00\x01\x00\x33\x00\x00\x00\x25\x00\x00\x00\x00\x00"

static const struct {
    const char *data;
    size_t len;
    const char *name;
    const char *mime;
    const char *kind;
} cases[] = {
    {"a,b\n1,2\n", 8, "t.csv", "text/csv", "data"},
    {"a,b\n1,2\n", 8, "T.CSV", "text/csv", "data"},
    {"a,b\n1,2\n", 8, "t.txt", "text/plain", "file"},
    {"a\tb\n", 4, "t.tsv", "text/tab-separated-values", "data"},
    {"# Title\n", 8, "r.md", "text/markdown", "document"},
    {"<html><body>x</body></html>", 27, "p.html", "text/html", "html"},
    /* the bytes win over the name: HTML named .png is still HTML */
    {"<html><body>x</body></html>", 27, "p.png", "text/html", "html"},
    {PNG, sizeof(PNG) - 1, "p.png", "image/png", "image"},
    {PNG, sizeof(PNG) - 1, "p.csv", "image/png", "image"},
    {"GIF89a", 6, "x", "image/gif", "image"},
    {"%PDF-1.4\n%\xe2\xe3\n1 0 obj\n<<>>\nendobj\n", 33, "d.pdf", "application/pdf", "document"},
    {ZIP, sizeof(ZIP) - 1, "a.zip", "application/zip", "file"},
    {ZIP, sizeof(ZIP) - 1, "a.xlsx",
     "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "spreadsheet"},
    {ZIP, sizeof(ZIP) - 1, "a.docx",
     "application/vnd.openxmlformats-officedocument.wordprocessingml.document", "document"},
    {ZIP, sizeof(ZIP) - 1, "a.pptx",
     "application/vnd.openxmlformats-officedocument.presentationml.presentation", "presentation"},
    /* an extension never turns specific bytes into something else */
    {PNG, sizeof(PNG) - 1, "a.xlsx", "image/png", "image"},
    {"{\"a\": 1}", 8, "d.json", "application/json", "data"},
    {"", 0, "empty.csv", "application/octet-stream", "file"},
    {"", 0, NULL, "application/octet-stream", "file"},
    {"\x7f"
     "ELF\x02\x01\x01",
     7, "a.out", "application/octet-stream", "file"},
    {"a,b\n", 4, ".csv", "text/plain", "file"}, /* a dot file has no extension */
    {"a,b\n", 4, "x.", "text/plain", "file"},
};

static void *
detect_in_thread(void *arg)
{
    char *out = arg;
    if (cx_mime_detect(PNG, sizeof(PNG) - 1, "x", out, 128))
        out[0] = '\0';
    return NULL;
}

int
main(void)
{
    char out[128], small[10];
    pthread_t th;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ok(cx_mime_detect(cases[i].data, cases[i].len, cases[i].name, out, sizeof(out)) == CX_OK,
           "detect %zu (%s)", i, cases[i].name ? cases[i].name : "no name");
        is_str(out, cases[i].mime, "mime %zu (%s)", i, cases[i].name ? cases[i].name : "no name");
        is_str(cx_mime_kind(out), cases[i].kind, "kind of %s", out);
    }
    ok(cx_mime_detect(PNG, sizeof(PNG) - 1, "x", small, sizeof(small)) == CX_OK &&
           strlen(small) == sizeof(small) - 1,
       "a short buffer truncates, never overflows");
    is_str(cx_mime_kind("image/svg+xml"), "image", "svg is an image kind");
    is_str(cx_mime_kind("application/x-sqlite3"), "data", "sqlite is data");
    is_str(cx_mime_kind(""), "file", "empty type is a file");
    /* each thread has its own libmagic handle */
    out[0] = '\0';
    ok(pthread_create(&th, NULL, detect_in_thread, out) == 0 && pthread_join(th, NULL) == 0,
       "a second thread runs");
    is_str(out, "image/png", "and detects with its own handle");
    return tap_done();
}
