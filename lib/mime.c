#include <magic.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "mime.h"

static pthread_key_t magic_key;
static pthread_once_t magic_once = PTHREAD_ONCE_INIT;

static void
close_magic(void *m)
{
    magic_close(m);
}

static void
make_key(void)
{
    if (pthread_key_create(&magic_key, close_magic) != 0)
        cx_log_err(0, "pthread_key_create() for libmagic failed");
}

static magic_t
thread_magic(void)
{
    magic_t m;

    pthread_once(&magic_once, make_key);
    m = pthread_getspecific(magic_key);
    if (m)
        return m;
    m = magic_open(MAGIC_MIME_TYPE | MAGIC_NO_CHECK_COMPRESS | MAGIC_NO_CHECK_ELF);
    if (!m)
        return NULL;
    if (magic_load(m, NULL) != 0) {
        cx_log_err(0, "magic_load() failed: %s", magic_error(m));
        magic_close(m);
        return NULL;
    }
    pthread_setspecific(magic_key, m);
    return m;
}

static const char *
extension(const char *filename)
{
    const char *dot = filename ? strrchr(filename, '.') : NULL;
    return dot && dot != filename ? dot + 1 : "";
}

struct refine {
    const char *generic; /* what libmagic said */
    const char *ext;
    const char *mime;
};

/* Only where the bytes cannot tell: never overrides a specific answer. */
static const struct refine refinements[] = {
    {"text/plain", "csv", "text/csv"},
    {"text/plain", "tsv", "text/tab-separated-values"},
    {"text/plain", "md", "text/markdown"},
    {"text/plain", "json", "application/json"},
    {"text/plain", "css", "text/css"},
    {"text/plain", "js", "text/javascript"},
    {"text/plain", "svg", "image/svg+xml"},
    {"text/plain", "xml", "application/xml"},
    {"text/plain", "yaml", "application/yaml"},
    {"text/plain", "yml", "application/yaml"},
    {"text/xml", "svg", "image/svg+xml"},
    {"application/zip", "docx",
     "application/vnd.openxmlformats-officedocument.wordprocessingml.document"},
    {"application/zip", "xlsx",
     "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"},
    {"application/zip", "pptx",
     "application/vnd.openxmlformats-officedocument.presentationml.presentation"},
    {"application/octet-stream", "parquet", "application/vnd.apache.parquet"},
};

enum cx_err
cx_mime_detect(const void *data, size_t len, const char *filename, char *out, size_t outlen)
{
    magic_t m = thread_magic();
    const char *t, *ext = extension(filename);

    if (!m)
        return CX_ERR_INTERNAL;
    t = len ? magic_buffer(m, data, len) : "application/x-empty";
    if (!t)
        t = "application/octet-stream";
    for (size_t i = 0; i < sizeof(refinements) / sizeof(refinements[0]); i++)
        if (!strcmp(t, refinements[i].generic) && !strcasecmp(ext, refinements[i].ext)) {
            t = refinements[i].mime;
            break;
        }
    if (!strcmp(t, "application/x-empty"))
        t = "application/octet-stream";
    snprintf(out, outlen, "%s", t);
    return CX_OK;
}

const char *
cx_mime_kind(const char *mime)
{
    static const struct {
        const char *prefix;
        const char *kind;
    } kinds[] = {
        {"image/", "image"},
        {"text/html", "html"},
        {"application/xhtml+xml", "html"},
        {"text/csv", "data"},
        {"text/tab-separated-values", "data"},
        {"application/json", "data"},
        {"application/vnd.apache.parquet", "data"},
        {"application/x-sqlite3", "data"},
        {"application/vnd.sqlite3", "data"},
        {"application/pdf", "document"},
        {"application/msword", "document"},
        {"application/vnd.openxmlformats-officedocument.wordprocessingml", "document"},
        {"application/vnd.oasis.opendocument.text", "document"},
        {"text/markdown", "document"},
        {"application/vnd.ms-excel", "spreadsheet"},
        {"application/vnd.openxmlformats-officedocument.spreadsheetml", "spreadsheet"},
        {"application/vnd.oasis.opendocument.spreadsheet", "spreadsheet"},
        {"application/vnd.ms-powerpoint", "presentation"},
        {"application/vnd.openxmlformats-officedocument.presentationml", "presentation"},
        {"application/vnd.oasis.opendocument.presentation", "presentation"},
    };

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strncmp(mime, kinds[i].prefix, strlen(kinds[i].prefix)))
            return kinds[i].kind;
    return "file";
}
