/* Changes other processes made (LISTEN codexec_changes) and the revocation
 * list nginx reads (revoked_keys_dir). Real PostgreSQL. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../lib/watch.h"
#include "cxtest.h"

struct notices {
    int n;
    char kind[8][16], id[8][40];
};

static void
collect(void *ctx, const char *kind, const char *id)
{
    struct notices *s = ctx;

    if (s->n < 8) {
        snprintf(s->kind[s->n], sizeof(s->kind[0]), "%s", kind);
        snprintf(s->id[s->n], sizeof(s->id[0]), "%s", id);
    }
    s->n++;
}

/* Waits up to 5 s for n notices. */
static void
wait_for(struct cx_watch *w, struct notices *s, int n)
{
    bool fresh;

    for (int i = 0; i < 50 && s->n < n; i++)
        if (cx_watch_wait(w, 100, &fresh, collect, s) != CX_OK)
            break;
}

static bool
exists(const char *dir, const char *name)
{
    char path[512];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void
touch(const char *dir, const char *name, long age)
{
    char path[512];
    struct timespec ts[2];
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0)
        close(fd);
    ts[0].tv_sec = ts[1].tv_sec = time(NULL) - age;
    ts[0].tv_nsec = ts[1].tv_nsec = 0;
    utimensat(AT_FDCWD, path, ts, 0);
}

int
main(void)
{
    struct cxtest t;
    struct cx_principal bob, eve;
    struct cx_watch *w = NULL;
    struct notices s = {0};
    char dir[64] = "/tmp/cx-unit-revoked-XXXXXX", extra[128], msg[CX_MSG_MAX], id[37], path[512];
    const char *old = "11111111-2222-3333-4444-555555555555";
    json_t *a = NULL;
    bool fresh = false;
    int added = -1, removed = -1;

    if (!mkdtemp(dir))
        return 1;
    chmod(dir, 0755);
    snprintf(extra, sizeof(extra), "revoked_keys_dir = %s\nlink_max_expiry = 3600\n", dir);
    cxtest_open(&t, "watch", extra);
    bob = cxtest_principal(&t, "bob");
    eve = cxtest_principal(&t, "eve");

    need(cx_watch_new(t.cfg.database, &w) == CX_OK, "a watch");
    ok(cx_watch_wait(w, 100, &fresh, collect, &s) == CX_OK && fresh,
       "the first wait connects and says all may have changed");
    ok(cx_watch_wait(w, 100, &fresh, collect, &s) == CX_OK && !fresh && s.n == 0,
       "then it waits, and nothing happened");

    ok(cx_auth_key_revoke(t.cx.db, bob.key_id) == CX_OK, "bob's key revoked");
    wait_for(w, &s, 1);
    ok(s.n == 1 && !strcmp(s.kind[0], "key") && !strcmp(s.id[0], bob.key_id),
       "its notice arrives: key %s", bob.key_id);
    need(cxtest_upload(&t, "eve", "c1", "f.txt", "x", 1, &a, msg, sizeof(msg)) == CX_OK,
         "an upload");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(a, "artifact_id")));
    json_decref(a);
    ok(cx_artifact_delete(&t.cx, "eve", id) == CX_OK, "deleted");
    wait_for(w, &s, 2);
    ok(s.n >= 2 && !strcmp(s.kind[s.n - 1], "artifact") && !strcmp(s.id[s.n - 1], id),
       "an artifact's deletion is announced");

    /* the list */
    touch(dir, old, 7200); /* revoked long ago: its links are all dead */
    touch(dir, "README", 7200);
    snprintf(path, sizeof(path), "%s/%s", dir, eve.key_id);
    ok(cx_revoked_sync(&t.cx, &added, &removed) == CX_OK, "sync");
    is_int(added, 1, "the revoked key added");
    is_int(removed, 1, "the old file removed");
    ok(exists(dir, bob.key_id), "bob's key listed");
    ok(!exists(dir, eve.key_id), "eve's live key not listed");
    ok(!exists(dir, old), "the old one gone");
    ok(exists(dir, "README"), "other names left alone");
    ok(exists(dir, CX_REVOKED_LISTED), "the list says it is kept");
    ok(cx_revoked_sync(&t.cx, &added, &removed) == CX_OK && added == 0 && removed == 0,
       "a second sync changes nothing");
    /* a link in a revoked key's place (nginx would follow it) is replaced */
    snprintf(path, sizeof(path), "%s/%s", dir, bob.key_id);
    unlink(path);
    ok(symlink("/nonexistent/x", path) == 0, "a dangling link in bob's place");
    ok(cx_revoked_sync(&t.cx, &added, &removed) == CX_OK && added == 1, "sync");
    ok(exists(dir, bob.key_id), "a regular file again");

    /* one key at a time, as the watcher does on a notice */
    ok(cx_revoked_note(&t.cx, eve.key_id) == CX_OK && !exists(dir, eve.key_id),
       "a live key: no file");
    ok(cx_auth_key_revoke(t.cx.db, eve.key_id) == CX_OK, "eve's key revoked");
    ok(cx_revoked_note(&t.cx, eve.key_id) == CX_OK && exists(dir, eve.key_id), "then listed");
    ok(cx_revoked_note(&t.cx, "00000000-0000-0000-0000-000000000000") == CX_OK &&
           exists(dir, "00000000-0000-0000-0000-000000000000"),
       "a key with no row (removed): listed");
    is_int(cx_revoked_note(&t.cx, "../../etc/passwd"), CX_ERR_INVALID, "a malformed id: refused");

    cx_watch_free(w);
    cxtest_close(&t);
    snprintf(path, sizeof(path), "rm -rf '%s'", dir);
    if (system(path) != 0)
        printf("# could not remove %s\n", dir);
    return tap_done();
}
