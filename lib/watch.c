#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "cancel.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "util.h"
#include "watch.h"

/* More revoked keys than this within link_max_expiry is a misuse; the
 * list then holds the newest (links of older ones are refused by codexec). */
#define REVOKED_MAX 100000

struct cx_watch {
    char *conninfo;
    PGconn *conn;
};

enum cx_err
cx_watch_new(const char *conninfo, struct cx_watch **out)
{
    struct cx_watch *w = calloc(1, sizeof(*w));

    *out = NULL;
    if (!w || !(w->conninfo = strdup(conninfo))) {
        free(w);
        return CX_ERR_NOMEM;
    }
    *out = w;
    return CX_OK;
}

static void
drop(struct cx_watch *w)
{
    if (w->conn)
        PQfinish(w->conn);
    w->conn = NULL;
}

void
cx_watch_free(struct cx_watch *w)
{
    if (!w)
        return;
    drop(w);
    free(w->conninfo);
    free(w);
}

static enum cx_err
listen_now(struct cx_watch *w)
{
    PGresult *r;
    bool ok;

    /* TCP keepalives of its own: a connection that died silently (a
     * partition, no reset) is found within about 10 s, and while it is
     * down the download cache answers nothing; a connect never holds a
     * stop longer than 5 s */
    static const char *const keys[] = {"dbname",           "keepalives_idle", "keepalives_interval",
                                       "keepalives_count", "connect_timeout", NULL};
    const char *const values[] = {w->conninfo, "5", "2", "2", "5", NULL};

    w->conn = PQconnectdbParams(keys, values, 1);
    if (!w->conn || PQstatus(w->conn) != CONNECTION_OK) {
        drop(w);
        return CX_ERR_DB;
    }
    r = PQexec(w->conn, "LISTEN codexec_changes");
    ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok || PQsetnonblocking(w->conn, 1) != 0) {
        drop(w);
        return CX_ERR_DB;
    }
    return CX_OK;
}

/* "key <uuid>", "artifact <uuid>" or "cancel <uuid>" (a run's) to fn;
 * anything else is ignored. */
static void
deliver(const char *payload, cx_watch_fn fn, void *ctx)
{
    char kind[16], id[40];
    const char *sp = strchr(payload, ' ');

    if (!sp || (size_t)(sp - payload) >= sizeof(kind) || strlen(sp + 1) >= sizeof(id))
        return;
    snprintf(kind, sizeof(kind), "%.*s", (int)(sp - payload), payload);
    snprintf(id, sizeof(id), "%s", sp + 1);
    if ((!strcmp(kind, "key") || !strcmp(kind, "artifact") || !strcmp(kind, "cancel")) &&
        cx_uuid_valid(id))
        fn(ctx, kind, id);
}

enum cx_err
cx_watch_wait(struct cx_watch *w, int timeout_ms, bool *fresh, cx_watch_fn fn, void *ctx)
{
    struct pollfd p = {.events = POLLIN};
    PGnotify *n;

    *fresh = false;
    if (!w->conn || PQstatus(w->conn) != CONNECTION_OK) {
        drop(w);
        if (listen_now(w))
            return CX_ERR_DB;
        *fresh = true;
        return CX_OK;
    }
    p.fd = PQsocket(w->conn);
    if (poll(&p, 1, timeout_ms) < 0 && errno != EINTR)
        return CX_ERR_INTERNAL;
    if (p.revents && !PQconsumeInput(w->conn)) {
        drop(w);
        return CX_ERR_DB;
    }
    while ((n = PQnotifies(w->conn)) != NULL) {
        if (n->relname && strcmp(n->relname, "codexec_changes") == 0 && n->extra)
            deliver(n->extra, fn, ctx);
        PQfreemem(n);
    }
    return CX_OK;
}

/* The directory, opened without following a link in its last step. */
static int
open_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    if (fd < 0)
        cx_log_err(errno, "open() of revoked_keys_dir failed");
    return fd;
}

/* The key's file, created if missing (its time is when it was made). */
static enum cx_err
mark(int dfd, const char *id)
{
    int fd = openat(dfd, id, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);

    if (fd < 0) {
        cx_log_err(errno, "could not list revoked key %s for the web server", id);
        return CX_ERR_IO;
    }
    close(fd);
    return CX_OK;
}

CX_SQL(q_revoked, 1,
       "SELECT id::text FROM api_keys WHERE revoked_at > now() - make_interval(secs => $1::int)"
       " ORDER BY revoked_at DESC LIMIT 100001");

/* Files older than max_age go: every link their key signed has expired
 * (a key revoked again within max_age was made again). *removed counts. */
static enum cx_err
expire_marks(int dfd, unsigned max_age, int *removed)
{
    DIR *d = fdopendir(dup(dfd));
    time_t now = time(NULL);
    struct dirent *e;

    if (!d)
        return CX_ERR_IO;
    while ((e = readdir(d)) != NULL) {
        struct stat st;

        if (!cx_uuid_valid(e->d_name) || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            now - st.st_mtime <= (time_t)max_age)
            continue;
        if (unlinkat(dfd, e->d_name, 0) == 0)
            (*removed)++;
    }
    closedir(d);
    return CX_OK;
}

/* A file for each key of r (valid ids only, the newest REVOKED_MAX) that
 * has none; *added counts. */
static enum cx_err
mark_revoked(int dfd, PGresult *r, int *added)
{
    enum cx_err rc = CX_OK;

    for (int i = 0; i < PQntuples(r) && i < REVOKED_MAX && rc == CX_OK; i++) {
        const char *id = PQgetvalue(r, i, 0);
        struct stat st;

        if (!cx_uuid_valid(id))
            continue;
        if (fstatat(dfd, id, &st, AT_SYMLINK_NOFOLLOW) == 0) {
            if (S_ISREG(st.st_mode))
                continue;
            (void)unlinkat(dfd, id, 0); /* a link nginx would follow: the file's place */
        }
        rc = mark(dfd, id);
        if (rc == CX_OK)
            (*added)++;
    }
    return rc;
}

enum cx_err
cx_revoked_sync(struct cx_ctx *cx, int *added, int *removed)
{
    unsigned max_age = cx->cfg->link_max_expiry;
    char age[16];
    const char *p[1] = {age};
    PGresult *r = NULL;
    enum cx_err rc, rc2;
    int dfd;

    *added = *removed = 0;
    snprintf(age, sizeof(age), "%u", max_age);
    rc = cx_db_exec(cx->db, &q_revoked, p, &r);
    if (rc)
        return rc;
    if (PQntuples(r) > REVOKED_MAX)
        cx_log_warn(0, "more than %d keys revoked lately: the web server's list holds the newest",
                    REVOKED_MAX);
    dfd = open_dir(cx->cfg->revoked_keys_dir);
    if (dfd < 0) {
        PQclear(r);
        return CX_ERR_IO;
    }
    rc = mark_revoked(dfd, r, added);
    PQclear(r);
    /* the list is kept: nginx leaves every link to codexec without it */
    if (rc == CX_OK)
        rc = mark(dfd, CX_REVOKED_LISTED);
    rc2 = expire_marks(dfd, max_age, removed);
    close(dfd);
    return rc ? rc : rc2;
}

CX_SQL(q_key_live, 1, "SELECT 1 FROM api_keys WHERE id = $1::uuid AND revoked_at IS NULL");

enum cx_err
cx_revoked_note(struct cx_ctx *cx, const char *key_id)
{
    const char *dir = cx->cfg->revoked_keys_dir;
    const char *p[1] = {key_id};
    PGresult *r = NULL;
    enum cx_err rc;
    bool live;
    int dfd;

    if (!cx_uuid_valid(key_id))
        return CX_ERR_INVALID;
    rc = cx_db_exec(cx->db, &q_key_live, p, &r);
    if (rc)
        return rc;
    live = PQntuples(r) == 1;
    PQclear(r);
    dfd = open_dir(dir);
    if (dfd < 0)
        return CX_ERR_IO;
    if (!live)
        rc = mark(dfd, key_id); /* revoked, or removed: its links die */
    else if (unlinkat(dfd, key_id, 0) != 0 && errno != ENOENT)
        rc = CX_ERR_IO;
    close(dfd);
    return rc;
}

struct follow {
    struct cx_ctx *cx;
    const struct cx_watch_hooks *hooks;
};

static void
on_notice(void *arg, const char *kind, const char *id)
{
    struct follow *f = arg;

    if (!strcmp(kind, "cancel")) {
        cx_cancel_note(id); /* a run of this process, if it is one */
        return;
    }
    if (f->hooks && f->hooks->on_change)
        f->hooks->on_change(f->hooks->ctx, kind, id);
    if (strcmp(kind, "key") || !f->cx->cfg->revoked_keys_dir[0])
        return;
    if (cx_revoked_note(f->cx, id))
        cx_log_warn(0, "watcher: revoked key %s not yet listed; the next sweep will", id);
}

static void
live(const struct cx_watch_hooks *h, bool is_live)
{
    if (h && h->on_live)
        h->on_live(h->ctx, is_live);
}

/* Up to a second, or less once *stop is set. */
static void
pause_a_second(const volatile int *stop)
{
    for (int i = 0; i < 10 && !*stop; i++)
        usleep(100000);
}

enum cx_err
cx_watch_follow(struct cx_ctx *cx, const volatile int *stop, const struct cx_watch_hooks *hooks)
{
    struct follow f = {.cx = cx, .hooks = hooks};
    struct cx_watch *w = NULL;
    int64_t next_sync = 0;
    bool down = false;
    enum cx_err rc = cx_watch_new(cx->cfg->database, &w);

    if (rc)
        return rc;
    while (!*stop) {
        bool fresh = false;
        int added, removed;

        if (cx_watch_wait(w, 1000, &fresh, on_notice, &f)) {
            if (!down)
                cx_log_warn(0, "watcher: the database is unreachable; retrying every second");
            live(hooks, false);
            down = true;
            pause_a_second(stop);
            continue;
        }
        down = false;
        if (fresh)
            live(hooks, true); /* (forgetting what was heard before) */
        if (!cx->cfg->revoked_keys_dir[0] || (!fresh && cx_now_us() < next_sync))
            continue;
        if (cx_revoked_sync(cx, &added, &removed))
            cx_log_warn(0, "watcher: the revocation list could not be made; retrying");
        else if (added || removed)
            cx_log_info("watcher: revocation list: %d key(s) added, %d expired", added, removed);
        next_sync = cx_now_us() + (int64_t)cx->cfg->reaper_interval * 1000000;
    }
    cx_watch_free(w);
    return CX_OK;
}
