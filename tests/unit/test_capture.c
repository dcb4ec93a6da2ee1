/* The capture's receiving side fed the records a hostile kernel could send:
 * forged sizes and digests, path tricks, chunks out of order, files never
 * ended, oversized files, invented skipped entries. A real storage
 * directory; no kernel needed (the records are what a kernel sends). */
#include <dirent.h>
#include <sodium.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../../lib/capture.h"
#include "../../lib/config.h"
#include "../../lib/log.h"
#include "../../lib/storage.h"
#include "tap.h"

static struct cx_config cfg;
static char root[64];
static struct cx_storage *store;

static void
feed(struct cx_capture *c, json_t *m)
{
    cx_capture_on_message(c, m, NULL, 0);
    json_decref(m);
}

/* A record with a binary buffer. */
static void
feed_buf(struct cx_capture *c, json_t *m, const char *buf, size_t len)
{
    cx_capture_on_message(c, m, buf, len);
    json_decref(m);
}

static void
hex_sha(const char *data, size_t len, char out[65])
{
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)data, len);
    sodium_bin2hex(out, 65, h, sizeof(h));
}

/* One file as the helper sends it; size and sha as given (NULL: true ones). */
static void
send_file(struct cx_capture *c, int n, const char *path, const char *data, json_int_t size,
          const char *sha)
{
    char b64[256], mine[65];

    sodium_bin2base64(b64, sizeof(b64), (const unsigned char *)data, strlen(data),
                      sodium_base64_VARIANT_ORIGINAL);
    hex_sha(data, strlen(data), mine);
    /* unchecked: a path that is not UTF-8 must reach the check too */
    feed(c, json_pack("{s:s,s:i,s:o}", "op", "file", "n", n, "path", json_string_nocheck(path)));
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "chunk", "n", n, "data", b64));
    feed(c, json_pack("{s:s,s:i,s:I,s:s}", "op", "end", "n", n, "size",
                      size < 0 ? (json_int_t)strlen(data) : size, "sha256", sha ? sha : mine));
}

/* The reason recorded for path in the skipped list, or "". */
static const char *
skipped_reason(struct cx_capture *c, const char *path)
{
    json_t *e;
    size_t i;

    json_array_foreach(cx_capture_skipped(c), i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "path")), path))
            return json_string_value(json_object_get(e, "reason"));
    }
    return "";
}

static void
honest(void)
{
    struct cx_capture *c = NULL;
    struct cx_captured *f;

    need(cx_capture_new(&cfg, store, &c) == CX_OK, "capture");
    send_file(c, 1, "out/data.csv", "a,b\n1,2\n", -1, NULL);
    is_int(cx_capture_count(c), 1, "an honest file is received");
    f = cx_capture_file(c, 0);
    ok(f && !strcmp(f->path, "out/data.csv") && f->size == 8, "with its path and size");
    is_str(f ? f->mime : "", "text/csv", "and a MIME type from the bytes");
    ok(cx_capture_file(c, 1) == NULL, "no second file");
    ok(!cx_capture_done(c), "not done before the done record");
    feed(c, json_pack("{s:s,s:[]}", "op", "done", "skipped"));
    ok(cx_capture_done(c), "done");
    cx_capture_free(c);
}

/* The bytes as the message's binary buffer, as the helper sends them. */
static void
binary(void)
{
    static const char part1[] = "\0\1\2binary\xff", part2[] = "\n\r\0tail";
    char all[sizeof(part1) + sizeof(part2)], sha[65];
    struct cx_capture *c = NULL;
    struct cx_captured *f;

    memcpy(all, part1, sizeof(part1) - 1);
    memcpy(all + sizeof(part1) - 1, part2, sizeof(part2) - 1);
    hex_sha(all, sizeof(all) - 2, sha);
    need(cx_capture_new(&cfg, store, &c) == CX_OK, "capture");
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 0, "path", "raw.bin"));
    feed_buf(c, json_pack("{s:s,s:i}", "op", "chunk", "n", 0), part1, sizeof(part1) - 1);
    feed_buf(c, json_pack("{s:s,s:i}", "op", "chunk", "n", 0), part2, sizeof(part2) - 1);
    feed(c, json_pack("{s:s,s:i,s:I,s:s}", "op", "end", "n", 0, "size", (json_int_t)sizeof(all) - 2,
                      "sha256", sha));
    need(cx_capture_count(c) == 1, "a file in binary buffers is received");
    f = cx_capture_file(c, 0);
    ok(f->size == sizeof(all) - 2 && !strcmp(f->sha256, sha), "whole, NULs and all");

    /* a chunk with neither buffer nor data drops its file */
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 1, "path", "empty.bin"));
    feed(c, json_pack("{s:s,s:i}", "op", "chunk", "n", 1));
    is_str(skipped_reason(c, "empty.bin"), "corrupt_transfer", "a chunk of nothing is corrupt");
    /* with both, the data is what counts (and a bad one drops the file) */
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 2, "path", "both.bin"));
    feed_buf(c, json_pack("{s:s,s:i,s:s}", "op", "chunk", "n", 2, "data", "!!"), "ok", 2);
    is_str(skipped_reason(c, "both.bin"), "corrupt_transfer", "data and a buffer: data is read");
    /* a buffer past max_artifact_bytes (32 here), whatever the file said */
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 3, "path", "huge.bin"));
    {
        char big[4096];
        memset(big, 'x', sizeof(big));
        feed_buf(c, json_pack("{s:s,s:i}", "op", "chunk", "n", 3), big, sizeof(big));
    }
    is_str(skipped_reason(c, "huge.bin"), "too_large", "one large buffer: too_large");
    /* a buffer on a record that is not a chunk is not read */
    feed_buf(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 4, "path", "b.txt"), "zz", 2);
    feed(c, json_pack("{s:s,s:i,s:I,s:s}", "op", "end", "n", 4, "size", (json_int_t)0, "sha256",
                      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    is_int(cx_capture_count(c), 2, "an empty file, its file record's buffer ignored");
    cx_capture_free(c);
}

static const char *const bad_paths[] = {
    "/etc/passwd", "../x", "a/../../x", "a/..", "..", "", "a\xff.txt",
};

static void
hostile(void)
{
    struct cx_capture *c = NULL;
    char b64[64];

    need(cx_capture_new(&cfg, store, &c) == CX_OK, "capture");
    send_file(c, 1, "lie.txt", "abc", 4, NULL);
    is_str(skipped_reason(c, "lie.txt"), "corrupt_transfer", "a size that lies is refused");
    send_file(c, 2, "lie2.txt", "abc", -1,
              "0000000000000000000000000000000000000000000000000000000000000000");
    is_str(skipped_reason(c, "lie2.txt"), "corrupt_transfer", "a digest that lies is refused");
    for (size_t i = 0; i < sizeof(bad_paths) / sizeof(bad_paths[0]); i++)
        send_file(c, 10 + (int)i, bad_paths[i], "x", -1, NULL);
    is_int(cx_capture_count(c), 0, "no path trick is received");
    is_str(skipped_reason(c, "../x"), "invalid_name", "a traversal is reported as invalid_name");

    /* a chunk of another file's number is ignored; a bad base64 drops the file */
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 30, "path", "mixed.txt"));
    sodium_bin2base64(b64, sizeof(b64), (const unsigned char *)"zz", 2,
                      sodium_base64_VARIANT_ORIGINAL);
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "chunk", "n", 31, "data", b64));
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "chunk", "n", 30, "data", "!!not base64!!"));
    is_str(skipped_reason(c, "mixed.txt"), "corrupt_transfer", "bad base64: corrupt_transfer");
    /* a file never ended, then another */
    feed(c, json_pack("{s:s,s:i,s:s}", "op", "file", "n", 40, "path", "half.txt"));
    send_file(c, 41, "whole.txt", "w", -1, NULL);
    is_str(skipped_reason(c, "half.txt"), "incomplete_transfer", "a file never ended is dropped");
    is_int(cx_capture_count(c), 1, "the next one arrives");
    /* bigger than max_artifact_bytes (32 here) while arriving */
    send_file(c, 50, "big.bin", "0123456789abcdef0123456789abcdefXYZ", -1, NULL);
    is_str(skipped_reason(c, "big.bin"), "too_large", "over max_artifact_bytes: too_large");
    /* records without an op, of unknown ops, with wrong types */
    feed(c, json_pack("{s:i}", "n", 1));
    feed(c, json_pack("{s:s}", "op", "nonsense"));
    feed(c, json_pack("{s:i,s:i}", "op", 3, "n", 1));
    feed(c, json_pack("{s:s,s:s,s:i}", "op", "file", "n", "x", "path", 7));
    is_int(cx_capture_count(c), 1, "malformed records change nothing");
    /* skipped entries the kernel invents are filtered */
    feed(c,
         json_pack("{s:s,s:[{s:s,s:s},{s:s,s:s},{s:i}]}", "op", "done", "skipped", "path", "ok.txt",
                   "reason", "too_large", "path", "../../x", "reason", "x", "path", 1));
    is_str(skipped_reason(c, "ok.txt"), "too_large", "a plausible skipped entry is kept");
    is_str(skipped_reason(c, "../../x"), "", "a traversal in skipped is dropped");
    cx_capture_free(c);
}

static void
outputs(void)
{
    static const char png[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\1\0\0\0\1\x08\x02\0\0\0";
    struct cx_capture *c = NULL;

    need(cx_capture_new(&cfg, store, &c) == CX_OK, "capture");
    cx_capture_add_output(c, "image/png", png, sizeof(png) - 1);
    cx_capture_add_output(c, "text/html", "<p>x</p>", 8);
    need(cx_capture_count(c) == 2, "rich outputs become files");
    is_str(cx_capture_file(c, 0)->path, "output-1.png", "named output-<n>.<ext>");
    is_str(cx_capture_file(c, 1)->path, "output-2.html", "in order");
    is_str(cx_capture_file(c, 0)->mime, "image/png", "with the type of their bytes");
    cx_capture_add_output(c, "image/png", "0123456789abcdef0123456789abcdefXYZ", 35);
    is_str(skipped_reason(c, "output-3.png"), "too_large", "an output over the limit is skipped");
    cx_capture_free(c);
}

static int
open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

/* The caps hold whoever sends the records: 3 files here. */
static void
caps(void)
{
    struct cx_config small;
    struct cx_capture *c = NULL;
    char conf[256], err[256], name[32];
    int fds = open_fds();
    size_t n;

    snprintf(conf, sizeof(conf),
             "storage_dir = %s\nmax_captured_files = 3\nmax_output_bytes = 1024\n", root);
    if (cx_config_parse(&small, "unit", conf, err, sizeof(err))) {
        ok(0, "capture with caps: %s", err);
        return;
    }
    if (cx_capture_new(&small, store, &c)) {
        ok(0, "capture with caps");
        cx_config_cleanup(&small);
        return;
    }
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof(name), "f%d.txt", i);
        send_file(c, i + 1, name, "bytes", -1, NULL);
    }
    is_int(cx_capture_count(c), 3, "at most max_captured_files files are held");
    is_str(skipped_reason(c, "f3.txt"), "too_many_files", "the next is too_many_files");
    is_int(open_fds(), fds, "received files hold no descriptor until they commit");
    cx_capture_add_output(c, "text/html", "<p>x</p>", 8);
    is_str(skipped_reason(c, "output-1.html"), "too_many_files", "outputs count as files");
    for (int i = 0; i < 6000; i++)
        cx_capture_skip(c, "x", "invalid_name");
    n = json_array_size(cx_capture_skipped(c));
    is_int(n, 3 + 4096 + 1, "the skipped list is capped");
    is_str(
        json_string_value(json_object_get(json_array_get(cx_capture_skipped(c), n - 1), "reason")),
        "too_many_skipped", "and says so once at its end");
    cx_capture_free(c);

    need(cx_capture_new(&small, store, &c) == CX_OK, "another capture");
    {
        char big[700];
        memset(big, 'a', sizeof(big));
        ok(cx_capture_add_output(c, "text/html", big, sizeof(big)) != NULL, "the first is stored");
        /* a skipped output names nothing: no result may point at a file of
         * its name the code wrote itself */
        ok(cx_capture_add_output(c, "text/html", big, sizeof(big)) == NULL,
           "a skipped output answers no name");
    }
    is_int(cx_capture_count(c), 1, "rich outputs stop at max_output_bytes");
    is_str(skipped_reason(c, "output-2.html"), "output_limit", "as output_limit");
    cx_capture_free(c);
    cx_config_cleanup(&small);

    /* a run never stages more than the user may keep */
    snprintf(conf, sizeof(conf), "storage_dir = %s\nuser_quota_bytes = 12\n", root);
    need(cx_config_parse(&small, "unit", conf, err, sizeof(err)) == CX_OK &&
             cx_capture_new(&small, store, &c) == CX_OK,
         "a capture with a 12-byte quota");
    send_file(c, 1, "a.txt", "12345678", -1, NULL);
    send_file(c, 2, "b.txt", "12345678", -1, NULL);
    is_int(cx_capture_count(c), 1, "the first file is staged");
    is_str(skipped_reason(c, "b.txt"), "quota_exceeded", "the second would pass the quota");
    cx_capture_free(c);
    cx_config_cleanup(&small);
}

static enum cx_err
left_20(void *ctx, const char *user, uint64_t *left)
{
    int *asked = ctx;
    (*asked)++;
    *left = !strcmp(user, "owner") ? 20 : 1000;
    return CX_OK;
}

static enum cx_err
left_unknown(void *ctx, const char *user, uint64_t *left)
{
    (void)ctx, (void)user, (void)left;
    return CX_ERR_DB;
}

/* Captures of one user together stage at most what it has left (asked
 * once per capture, when it first stages), and give it back when freed. */
static void
ledger(void)
{
    struct cx_config big;
    struct cx_capture *a = NULL, *b = NULL, *other = NULL;
    char conf[256], err[256];
    int asked = 0;

    snprintf(conf, sizeof(conf), "storage_dir = %s\nuser_quota_bytes = 100\n", root);
    need(cx_config_parse(&big, "unit", conf, err, sizeof(err)) == CX_OK &&
             cx_capture_new(&big, store, &a) == CX_OK && cx_capture_new(&big, store, &b) == CX_OK &&
             cx_capture_new(&big, store, &other) == CX_OK,
         "three captures, 100 bytes of quota");
    cx_capture_set_owner(a, "owner", left_20, &asked);
    cx_capture_set_owner(b, "owner", left_20, &asked);
    cx_capture_set_owner(other, "someone", left_20, &asked);
    is_int(asked, 0, "ledger: nothing asked before anything is staged");
    send_file(a, 1, "a.txt", "0123456789AB", -1, NULL); /* 12 of the 20 left */
    is_int(cx_capture_count(a), 1, "ledger: the first run's 12 bytes stage");
    is_int((long long)cx_capture_staged_for("owner"), 12, "ledger: 12 bytes held for the owner");
    send_file(b, 1, "b.txt", "0123456789AB", -1, NULL); /* 12 more: past 20 */
    is_int(cx_capture_count(b), 0, "ledger: the parallel run's 12 do not");
    is_str(skipped_reason(b, "b.txt"), "quota_exceeded", "ledger: said as quota_exceeded");
    send_file(b, 2, "c.txt", "0123", -1, NULL);
    is_int(cx_capture_count(b), 1, "ledger: 4 more still fit");
    is_int((long long)cx_capture_staged_for("owner"), 16,
           "ledger: 16 held, the dropped file's not");
    send_file(other, 1, "o.txt", "0123456789AB0123456789AB", -1, NULL);
    is_int(cx_capture_count(other), 1, "ledger: another user's own room");
    is_int(asked, 3, "ledger: each capture asked once");
    cx_capture_free(a);
    is_int((long long)cx_capture_staged_for("owner"), 4, "ledger: a freed capture gives back");
    cx_capture_free(b);
    cx_capture_free(other);
    is_int((long long)cx_capture_staged_for("owner"), 0, "ledger: all given back");

    need(cx_capture_new(&big, store, &a) == CX_OK, "a capture whose owner's room can't be told");
    cx_capture_set_owner(a, "owner", left_unknown, NULL);
    send_file(a, 1, "a.txt", "0123456789AB0123456789AB", -1, NULL);
    is_int(cx_capture_count(a), 1, "ledger: unknown room falls back to the quota bound");
    cx_capture_free(a);
    cx_config_cleanup(&big);
}

int
main(void)
{
    char conf[256], err[256];

    if (cx_log_open(NULL, CX_LOG_ERR) || sodium_init() < 0)
        return 1;
    snprintf(root, sizeof(root), "/tmp/cx-unit-capture-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    snprintf(conf, sizeof(conf), "storage_dir = %s\nmax_artifact_bytes = 32\n", root);
    if (cx_config_parse(&cfg, "unit", conf, err, sizeof(err))) {
        printf("Bail out! %s\n", err);
        return 1;
    }
    if (cx_storage_new_local(root, &store)) {
        printf("Bail out! storage\n");
        return 1;
    }
    honest();
    binary();
    hostile();
    outputs();
    caps();
    ledger();
    {
        json_t *md = cx_capture_metadata(&cfg, "k", NULL, false, true);
        json_t *bare = cx_capture_metadata(&cfg, "k", NULL, false, false);
        ok(md && json_is_string(json_object_get(json_object_get(md, "codexec_capture"), "src")),
           "request metadata builds, with the helper's source");
        ok(bare && !json_object_get(json_object_get(bare, "codexec_capture"), "src") &&
               json_is_string(json_object_get(json_object_get(bare, "codexec_capture"), "sha256")),
           "or without it, with its sha256");
        json_decref(md);
        json_decref(bare);
    }
    cx_storage_free(store);
    cx_config_cleanup(&cfg);
    {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            printf("# could not remove %s\n", root);
    }
    return tap_done();
}
