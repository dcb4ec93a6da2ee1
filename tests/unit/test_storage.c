#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../lib/log.h"
#include "../../lib/mime.h"
#include "../../lib/storage.h"
#include "tap.h"

static int
remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static const struct {
    const char *in;
    size_t len;
    const char *out;
} names[] = {
    {"report.txt", 10, "report.txt"},
    {"../../etc/passwd", 16, "passwd"},
    {"a\\b\\c.txt", 9, "c.txt"},
    {"..hidden", 8, "hidden"},
    {"...", 3, "file"},
    {"", 0, "file"},
    {"a\r\nb.txt", 8, "ab.txt"},
    {"q\"uote.txt", 10, "quote.txt"},
    {"nul\0byte", 8, "nulbyte"},
    {"\xc3\xbc"
     "ber.txt",
     9,
     "\xc3\xbc"
     "ber.txt"},
    {"bad\xff.txt", 8, "bad_.txt"},
    {"dir/", 4, "file"},
};

int
main(void)
{
    char out[256], key[1024], root[] = "/tmp/cx-test-storage-XXXXXX", path[4096], sha[65];
    struct cx_storage_writer *w;
    struct cx_storage *store = NULL;
    uint64_t size;
    struct stat st;

    if (cx_log_open(NULL, CX_LOG_ERR) || !mkdtemp(root) || cx_storage_new_local(root, &store))
        return 1;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        cx_storage_safe_filename(names[i].in, names[i].len, out);
        is_str(out, names[i].out, "safe filename %zu", i);
    }
    {
        char longname[600];
        memset(longname, 'x', sizeof(longname));
        cx_storage_safe_filename(longname, sizeof(longname), out);
        is_int(strlen(out), 255, "at most 255 bytes");
        for (size_t i = 0; i < 300; i++) { /* a two-byte character at the cut */
            longname[2 * i] = '\xc3';
            longname[2 * i + 1] = '\xa9';
        }
        cx_storage_safe_filename(longname, sizeof(longname), out);
        ok(strlen(out) == 254, "cut on a character boundary (%zu)", strlen(out));
    }
    ok(cx_storage_key("bob", "123e4567-e89b-12d3-a456-426614174000", 2, "a/b.txt", key,
                      sizeof(key)) == CX_OK,
       "key");
    is_str(key, "artifacts/bob/123e4567-e89b-12d3-a456-426614174000/v2/b.txt", "key shape");
    ok(cx_storage_key("../x", "123e4567-e89b-12d3-a456-426614174000", 1, "f", key, sizeof(key)) ==
               CX_OK &&
           !strncmp(key, "artifacts/h-", 12) && !strstr(key, ".."),
       "unsafe user ids are hashed");
    ok(cx_storage_key(".", "123e4567-e89b-12d3-a456-426614174000", 1, "f", key, sizeof(key)) ==
               CX_OK &&
           !strncmp(key, "artifacts/h-", 12),
       "\".\" is hashed");
    is_int(cx_storage_key("bob", "../../x", 1, "f", key, sizeof(key)), CX_ERR_INVALID,
           "the artifact id must be a uuid");
    is_int(cx_storage_path(store, "../etc/passwd", path, sizeof(path)), CX_ERR_INVALID,
           "no .. in keys");
    {
        static const struct {
            const char *key;
            enum cx_err want;
        } keys[] = {
            {"artifacts/a/b", CX_OK},        {"artifacts/john..doe/x", CX_OK},
            {"artifacts/a/b..c", CX_OK},     {"artifacts/a/..", CX_ERR_INVALID},
            {"a/../b", CX_ERR_INVALID},      {"./a", CX_ERR_INVALID},
            {"a//b", CX_ERR_INVALID},        {"a/", CX_ERR_INVALID},
            {"/etc/passwd", CX_ERR_INVALID}, {"", CX_ERR_INVALID},
            {"..", CX_ERR_INVALID},
        };
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            is_int(cx_storage_path(store, keys[i].key, path, sizeof(path)), keys[i].want,
                   "key \"%s\"", keys[i].key);
    }
    ok(cx_storage_key("john..doe", "123e4567-e89b-12d3-a456-426614174000", 1, "a..b.txt", key,
                      sizeof(key)) == CX_OK &&
           cx_storage_path(store, key, path, sizeof(path)) == CX_OK,
       "a user and a file name with .. inside have a usable key");

    need(cx_storage_writer_new(store, &w) == CX_OK, "writer");
    ok(cx_storage_writer_write(w, "hello ", 6) == CX_OK &&
           cx_storage_writer_write(w, "world", 5) == CX_OK,
       "writes");
    ok(cx_storage_writer_finish(w, &size, sha) == CX_OK && size == 11, "finish");
    is_str(sha, "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9", "sha256");
    ok(cx_storage_writer_commit(w, "artifacts/bob/123e4567-e89b-12d3-a456-426614174000/v1/h.txt") ==
           CX_OK,
       "commit");
    snprintf(path, sizeof(path), "%s/artifacts/bob/123e4567-e89b-12d3-a456-426614174000/v1/h.txt",
             root);
    ok(stat(path, &st) == 0 && st.st_size == 11, "in place");
    ok(cx_storage_remove(store, "artifacts/bob/123e4567-e89b-12d3-a456-426614174000/v1/h.txt") ==
               CX_OK &&
           stat(path, &st) != 0,
       "removed");
    snprintf(path, sizeof(path), "%s/artifacts/bob", root);
    ok(stat(path, &st) != 0, "empty parents removed too");
    snprintf(path, sizeof(path), "%s/artifacts", root);
    ok(stat(path, &st) == 0, "but not the top one (a writer makes files in it)");
    ok(stat(root, &st) == 0, "root kept");
    w = NULL;
    ok(cx_storage_writer_new(store, &w) == CX_OK && cx_storage_writer_write(w, "x", 1) == CX_OK,
       "writer");
    cx_storage_writer_abort(w);
    snprintf(path, sizeof(path), "%s/.staging", root);
    ok(rmdir(path) == 0, "abort leaves the staging directory empty");

    /* MIME and kinds */
    {
        static const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0,
                                            0,    13,  'I', 'H', 'D',  'R',  0,    0,    0, 1,
                                            0,    0,   0,   1,   8,    2,    0,    0,    0};
        static const char zip[] = "PK\x03\x04\x14\x00\x00\x00\x00\x00";
        char m[128];
        ok(cx_mime_detect(png, sizeof(png), "x.bin", m, sizeof(m)) == CX_OK, "detect");
        is_str(m, "image/png", "PNG from the bytes, whatever the name");
        ok(cx_mime_detect("a,b\n1,2\n", 8, "t.csv", m, sizeof(m)) == CX_OK, "detect");
        is_str(m, "text/csv", "text/plain refined by .csv");
        ok(cx_mime_detect("a,b\n1,2\n", 8, "t.txt", m, sizeof(m)) == CX_OK, "detect");
        is_str(m, "text/plain", "no refinement for .txt");
        ok(cx_mime_detect(png, sizeof(png), "x.csv", m, sizeof(m)) == CX_OK, "detect");
        is_str(m, "image/png", "an extension never overrides specific bytes");
        ok(cx_mime_detect(zip, sizeof(zip) - 1, "r.xlsx", m, sizeof(m)) == CX_OK, "detect");
        ok(!strcmp(m, "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet") ||
               !strncmp(m, "application/", 12),
           "zip refined for .xlsx (%s)", m);
        ok(cx_mime_detect("<html><body>x</body></html>", 27, "p.html", m, sizeof(m)) == CX_OK,
           "detect");
        is_str(m, "text/html", "html");
        ok(cx_mime_detect("", 0, "empty", m, sizeof(m)) == CX_OK, "detect");
        is_str(m, "application/octet-stream", "empty file");
        is_str(cx_mime_kind("image/svg+xml"), "image", "kind image");
        is_str(cx_mime_kind("text/html"), "html", "kind html");
        is_str(cx_mime_kind("text/csv"), "data", "kind data");
        is_str(cx_mime_kind("application/pdf"), "document", "kind document");
        is_str(cx_mime_kind("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
               "spreadsheet", "kind spreadsheet");
        is_str(cx_mime_kind(
                   "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
               "presentation", "kind presentation");
        is_str(cx_mime_kind("text/plain"), "file", "kind file");
    }
    cx_storage_free(store);
    ok(nftw(root, remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0, "the test's root removed");
    return tap_done();
}
