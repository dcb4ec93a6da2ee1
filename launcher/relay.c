#include "relay.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../lib/codexec.h"

#define PAIRS_MAX     128
#define UP_BUF        (256 * 1024) /* kernel -> server, per connection */
#define DOWN_BUF      (256 * 1024) /* server -> kernel (an input's 1 MiB chunk streams through) */
#define GREETING      64           /* ZMTP 3: signature, version, mechanism, as-server, filler */
#define CMD_MAX       4096
#define SHELL_CHANNEL 0 /* the connection file's order: shell, iopub, stdin, control, hb */
#define HB_CHANNEL    4
#define HB_FRAME      1024
#define HB_FRAMES     4
#define MSG_FRAMES    32
#define MSG_BYTES     (34u << 20)
#define IDENT_MAX     256
#define IDENTS_MAX    8
#define DELIM         "<IDS|MSG>"
#define CONTENT_MAX   ((16u << 20) + 65536)
#define PARENT_MAX    16384

/* The most each frame of a Jupyter message may hold, by its place after
 * the delimiter: signature, header, parent header, metadata, content;
 * buffers after them. ipykernel's are a few hundred bytes but content. */
static const uint64_t role_max[] = {0, 128, 16384, PARENT_MAX, 65536, CONTENT_MAX};

/* What one kernel may send per second, and in a burst: messages, all
 * bytes, and the content bytes the server parses as JSON (captured files
 * travel as buffers, which it does not). */
#define RATE_MSGS     4000.0
#define BURST_MSGS    8000.0
#define RATE_BYTES    (512.0 * 1024 * 1024)
#define BURST_BYTES   (512.0 * 1024 * 1024)
#define RATE_CONTENT  (16.0 * 1024 * 1024)
#define BURST_CONTENT (16.0 * 1024 * 1024)

/* The run-end requests the server sent whose reply has not come: a few
 * (one a run; more only when replies never came, after a restart). */
#define ENDS_MAX    16
#define END_ID_MAX  64
#define HEADER_KEEP 4096 /* the server's header frame, when kept */

struct bucket {
    double tokens, rate, burst;
};

enum frame_state { F_FLAGS, F_SIZE, F_BODY };

/* One side of a connection, as ZMTP frames: the kernel's (every rule
 * applies), or the server's on the shell channel (trusted; read only for
 * the ids of the requests that end a run). */
struct zmtp {
    bool server;
    unsigned char greeting[GREETING];
    uint64_t greeted; /* greeting bytes seen */
    bool want_ready;  /* the greeting done, READY not yet */
    enum frame_state state;
    unsigned char flags;
    unsigned char size[8];
    int size_got, size_len;
    uint64_t left;          /* of the frame's body */
    unsigned char head[16]; /* its first bytes (the delimiter test) */
    uint64_t head_len, frame_len;
    int frame;    /* its index in the message */
    int delim_at; /* the delimiter's index, -1 before it */
    uint64_t msg_bytes;
    /* the frame kept whole on the shell channel (NULL on the others): the
     * kernel's parent header, the server's header */
    unsigned char *keep;
    size_t keep_len;
    int keep_role;
    int end_at; /* the run-end request its message answers, -1: none */
};

struct half {
    unsigned char *buf; /* mmap'd: its pages given back once drained (fill) */
    size_t off, len, cap;
    size_t high; /* the most it held since its pages were last given back */
    bool eof;    /* its source ended: close once it is written */
};

/* What a drained buffer keeps of its pages: a file passing through once
 * (a capture's, an input's 1 MiB chunks) does not hold 256 KiB of each of
 * the kernel's connections for the kernel's life. */
#define HALF_KEEP (16 * 1024)

struct pair {
    int srv, krn;
    int channel;
    struct half up, down;
    struct zmtp z, zs; /* the kernel's side; the server's */
    bool dead;
};

struct listener {
    int fd;
    int channel;
    char name[300];
};

enum slot_kind { S_LISTEN, S_SRV, S_KRN };

struct cx_relay {
    struct listener ls[CX_SANDBOX_PORTS];
    int nls;
    int pfd; /* the private directory */
    struct pair *pairs[PAIRS_MAX];
    int npairs;
    struct bucket msgs, bytes, content;
    int64_t refilled_us;
    uint64_t refused, run_ends;
    char end_ids[ENDS_MAX][END_ID_MAX]; /* a ring; "" where free */
    int end_next;
    void (*run_end)(void *ctx);
    void *run_end_ctx;
    /* what cx_relay_poll_fds() put where */
    struct {
        enum slot_kind kind;
        int i;
    } slots[CX_RELAY_POLL_MAX];
};

static void
refill(struct cx_relay *r)
{
    int64_t now = cx_now_us();
    double dt = (double)(now - r->refilled_us) / 1e6;
    struct bucket *b[] = {&r->msgs, &r->bytes, &r->content};

    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
        b[i]->tokens += dt * b[i]->rate;
        if (b[i]->tokens > b[i]->burst)
            b[i]->tokens = b[i]->burst;
    }
    r->refilled_us = now;
}

/* Milliseconds until every bucket holds a token again (0: now). */
static int
wait_ms(const struct cx_relay *r)
{
    const struct bucket *b[] = {&r->msgs, &r->bytes, &r->content};
    double worst = 0;

    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
        if (b[i]->tokens <= 0 && -b[i]->tokens / b[i]->rate > worst)
            worst = -b[i]->tokens / b[i]->rate;
    return worst > 0 ? (int)(worst * 1000) + 1 : 0;
}

/* The kernel's greeting: ZMTP 3 or later with the NULL mechanism, as the
 * server's ZeroMQ speaks it. An older version's greeting is shorter and
 * its frames are framed otherwise: read as ZMTP 3, the relay would see
 * other messages than the server, so it is refused. */
static bool
greeting_ok(const unsigned char *g)
{
    static const unsigned char null[20] = "NULL";

    return g[0] == 0xff && (g[9] & 0x01) && g[10] >= 3 && !memcmp(g + 12, null, sizeof(null));
}

/* A frame's size is known: whether its place allows it. */
static bool
frame_ok(const struct pair *p, const struct zmtp *z)
{
    if (z->want_ready && !(z->flags & 0x04))
        return false;    /* READY comes first */
    if (z->flags & 0x04) /* a command (READY, PING): never inside a message */
        return z->frame == 0 && z->frame_len <= CMD_MAX;
    if (z->msg_bytes + z->frame_len > MSG_BYTES || z->frame >= MSG_FRAMES)
        return false;
    if (p->channel == HB_CHANNEL)
        return z->frame < HB_FRAMES && z->frame_len <= HB_FRAME;
    if (z->delim_at < 0) /* identities, or the delimiter */
        return z->frame < IDENTS_MAX + 1 && z->frame_len <= IDENT_MAX;
    int role = z->frame - z->delim_at;
    return z->frame_len <= role_max[role < 5 ? role : 5];
}

/* The server sent a request with this header: if its id begins with
 * CX_RELAY_RUN_END, its reply is awaited. */
static void
header_check(struct cx_relay *r, const struct zmtp *z)
{
    const unsigned char *at =
        memmem(z->keep, z->keep_len, CX_RELAY_RUN_END, strlen(CX_RELAY_RUN_END));
    size_t n = 0, left;

    if (!at)
        return;
    left = z->keep_len - (size_t)(at - z->keep);
    while (n < left && n < END_ID_MAX - 1 && at[n] != '"')
        n++;
    if (n == left || n == END_ID_MAX - 1)
        return;
    memcpy(r->end_ids[r->end_next], at, n);
    r->end_ids[r->end_next][n] = '\0';
    r->end_next = (r->end_next + 1) % ENDS_MAX;
}

/* A shell message from the kernel has this parent header: whether it may
 * pass, and which run-end request the server sent it answers (then, when
 * its last frame has come and before it passes, the run's processes end:
 * once per request). The header is the kernel's, so no JSON parser
 * decides: a header with an escape is refused (ipykernel copies the
 * request's header, which has none), and without escapes every string is
 * its bytes, so a parent id that the client will match to its request
 * holds that id as it is. Found elsewhere in the header (another field, a
 * second msg_id), it ends the tenant's processes early: theirs to waste. */
static bool
parent_check(struct cx_relay *r, struct zmtp *z)
{
    if (memchr(z->keep, '\\', z->keep_len))
        return false;
    for (int i = 0; i < ENDS_MAX; i++)
        if (r->end_ids[i][0] &&
            memmem(z->keep, z->keep_len, r->end_ids[i], strlen(r->end_ids[i]))) {
            z->end_at = i;
            break;
        }
    return true;
}

/* A message that answers a run-end request has come whole: the run's
 * processes end before its last bytes pass. */
static void
run_end(struct cx_relay *r, struct zmtp *z)
{
    r->end_ids[z->end_at][0] = '\0';
    z->end_at = -1;
    r->run_ends++;
    if (r->run_end)
        r->run_end(r->run_end_ctx);
}

/* A frame of z ended; false when its message may not pass. */
static bool
frame_end(struct cx_relay *r, struct pair *p, struct zmtp *z)
{
    bool ok = true;

    z->state = F_FLAGS;
    if (z->flags & 0x04) {
        /* the first command is READY ("\5READY", then properties) */
        if (z->want_ready && (z->head_len < 6 || memcmp(z->head, "\5READY", 6)))
            return z->server;
        z->want_ready = false;
        if (!z->server)
            r->msgs.tokens -= 1;
        return true;
    }
    if (p->channel != HB_CHANNEL && z->delim_at < 0 && z->frame_len == strlen(DELIM) &&
        !memcmp(z->head, DELIM, strlen(DELIM)))
        z->delim_at = z->frame;
    if (!z->server && p->channel != HB_CHANNEL && z->delim_at >= 0 && z->frame - z->delim_at == 5)
        r->content.tokens -= (double)z->frame_len;
    if (z->keep && z->delim_at >= 0 && z->frame - z->delim_at == z->keep_role) {
        if (z->server)
            header_check(r, z);
        else
            ok = parent_check(r, z);
    }
    if (z->flags & 0x01) {
        z->frame++;
        return ok;
    }
    if (!z->server && p->channel != HB_CHANNEL && z->delim_at < 0)
        z->msg_bytes = MSG_BYTES + 1; /* a message without the delimiter: not Jupyter's */
    if (ok && z->end_at >= 0)
        run_end(r, z);
    z->frame = 0, z->delim_at = -1, z->msg_bytes = 0, z->keep_len = 0, z->end_at = -1;
    if (!z->server)
        r->msgs.tokens -= 1;
    return ok;
}

static void
zmtp_init(struct zmtp *z, bool server, unsigned char *keep)
{
    memset(z, 0, sizeof(*z));
    z->server = server;
    z->delim_at = -1;
    z->end_at = -1;
    z->keep = keep;
    z->keep_role = server ? 2 : 3; /* the header; the parent header */
}

/* The size's last byte came: the frame's length, checked (the kernel's),
 * and an empty frame ended at once. */
static bool
size_done(struct cx_relay *r, struct pair *p, struct zmtp *z)
{
    z->frame_len = 0;
    for (int i = 0; i < z->size_len; i++)
        z->frame_len = z->frame_len << 8 | z->size[i];
    if (!z->server && !frame_ok(p, z))
        return false;
    z->left = z->frame_len;
    z->head_len = 0;
    z->msg_bytes += z->frame_len;
    z->state = F_BODY;
    return z->left != 0 || frame_end(r, p, z);
}

/* Bytes of the frame's body, at most what it has left: its head kept for
 * frame_end(), and the frame of the role the caller keeps. The bytes
 * taken. */
static size_t
body_bytes(struct zmtp *z, const unsigned char *d, size_t n)
{
    size_t k = n < z->left ? n : (size_t)z->left;

    if (z->head_len < sizeof(z->head)) {
        size_t h = k < sizeof(z->head) - z->head_len ? k : sizeof(z->head) - z->head_len;
        memcpy(z->head + z->head_len, d, h);
        z->head_len += h;
    }
    /* the kernel's within PARENT_MAX (frame_ok() held it to its role); the
     * server's kept when it fits */
    if (z->keep && z->delim_at >= 0 && z->frame - z->delim_at == z->keep_role) {
        size_t room = (z->server ? HEADER_KEEP : PARENT_MAX) - z->keep_len;
        memcpy(z->keep + z->keep_len, d, k < room ? k : room);
        z->keep_len += k < room ? k : room;
    }
    z->left -= k;
    return k;
}

/* Reads one side's bytes as frames; false when the kernel's break a rule
 * (the server's are only read). */
static bool
zmtp_feed(struct cx_relay *r, struct pair *p, struct zmtp *z, const unsigned char *d, size_t n)
{
    if (!z->server)
        r->bytes.tokens -= (double)n;
    while (n > 0) {
        if (z->greeted < GREETING) {
            size_t k = n < GREETING - z->greeted ? n : GREETING - z->greeted;
            memcpy(z->greeting + z->greeted, d, k);
            z->greeted += k, d += k, n -= k;
            if (z->greeted == GREETING && !z->server && !greeting_ok(z->greeting))
                return false;
            z->want_ready = z->greeted == GREETING;
            continue;
        }
        switch (z->state) {
        case F_FLAGS:
            z->flags = *d++, n--;
            if ((z->flags & 0xf8) && !z->server)
                return false; /* reserved bits */
            z->size_len = z->flags & 0x02 ? 8 : 1;
            z->size_got = 0;
            z->state = F_SIZE;
            break;
        case F_SIZE:
            z->size[z->size_got++] = *d++, n--;
            if (z->size_got == z->size_len && !size_done(r, p, z))
                return false;
            break;
        case F_BODY: {
            size_t k = body_bytes(z, d, n);
            d += k, n -= k;
            if (z->left == 0 && !frame_end(r, p, z))
                return false;
            break;
        }
        }
        if (!z->server && z->msg_bytes > MSG_BYTES)
            return false;
    }
    return true;
}

static bool
half_init(struct half *h, size_t cap)
{
    void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    h->buf = m == MAP_FAILED ? NULL : m;
    h->off = h->len = h->high = 0;
    h->cap = cap;
    h->eof = false;
    return h->buf != NULL;
}

static void
half_free(struct half *h)
{
    if (h->buf)
        munmap(h->buf, h->cap);
    h->buf = NULL;
}

/* Drained: the pages past HALF_KEEP it touched go back to the system. */
static void
half_drained(struct half *h)
{
    h->off = h->len = 0;
    if (h->high > HALF_KEEP) {
        (void)madvise(h->buf + HALF_KEEP, h->cap - HALF_KEEP, MADV_DONTNEED);
        h->high = 0;
    }
}

static void
pair_free(struct pair *p)
{
    if (!p)
        return;
    if (p->srv >= 0)
        close(p->srv);
    if (p->krn >= 0)
        close(p->krn);
    half_free(&p->up);
    half_free(&p->down);
    free(p->z.keep);
    free(p->zs.keep);
    free(p);
}

/* Reads what fd has into h (space permitting); *got bytes arrive at
 * *start. False at its end or on an error. */
static bool
fill(int fd, struct half *h, const unsigned char **start, size_t *got)
{
    ssize_t n;

    if (h->off == h->len) {
        half_drained(h);
    } else if (h->off > 0 && h->len == h->cap) {
        memmove(h->buf, h->buf + h->off, h->len - h->off);
        h->len -= h->off;
        h->off = 0;
    }
    *got = 0;
    *start = h->buf + h->len;
    if (h->len == h->cap)
        return true; /* full: read once it is written */
    n = read(fd, h->buf + h->len, h->cap - h->len);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR;
    if (n == 0)
        return false;
    *got = (size_t)n;
    h->len += (size_t)n;
    if (h->len > h->high)
        h->high = h->len;
    return true;
}

/* Writes what h holds to fd; false on error. */
static bool
drain(int fd, struct half *h)
{
    while (h->off < h->len) {
        ssize_t n = send(fd, h->buf + h->off, h->len - h->off, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR;
        h->off += (size_t)n;
    }
    return true;
}

static int
unix_socket(void)
{
    return socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

static bool
set_path(struct sockaddr_un *a, const char *path)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(a->sun_path))
        return false;
    memcpy(a->sun_path, path, strlen(path) + 1);
    return true;
}

/* A new connection from the server: one to the kernel's socket for it. */
static void
accept_one(struct cx_relay *r, const struct listener *l)
{
    struct sockaddr_un a;
    char path[400];
    struct pair *p;
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd < 0)
        return;
    if (r->npairs == PAIRS_MAX || !(p = calloc(1, sizeof(*p)))) {
        close(fd);
        return;
    }
    p->srv = fd;
    p->channel = l->channel;
    p->krn = unix_socket();
    zmtp_init(&p->z, false, NULL);
    zmtp_init(&p->zs, true, NULL);
    if (l->channel == SHELL_CHANNEL &&
        (!(p->z.keep = malloc(PARENT_MAX)) || !(p->zs.keep = malloc(HEADER_KEEP)))) {
        pair_free(p);
        return;
    }
    /* through the directory's descriptor: its path is too long for a
     * socket address, and it is the one the launcher checked */
    snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", r->pfd, l->name);
    if (p->krn < 0 || !half_init(&p->up, UP_BUF) || !half_init(&p->down, DOWN_BUF) ||
        !set_path(&a, path) ||
        (connect(p->krn, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS &&
         errno != EAGAIN)) {
        pair_free(p);
        return;
    }
    r->pairs[r->npairs++] = p;
}

/* The server's endpoint name: a socket of ours, bound under a temporary
 * name and renamed over whatever was there (an earlier launch's). Bound
 * through the directory's descriptor: the temporary name is longer than
 * the endpoint's, and the runtime directory's path with it can be too long
 * for a socket address (found: a checkout in /var/tmp/tmp.XXXXXXXXXX/). */
static int
listen_at(int rfd, const char *name)
{
    struct sockaddr_un a;
    char tmp[320], path[400];
    int fd = unix_socket();

    snprintf(tmp, sizeof(tmp), ".%s.relay", name);
    snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", rfd, tmp);
    (void)unlinkat(rfd, tmp, 0);
    if (fd < 0 || !set_path(&a, path) || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(fd, 64) != 0 || renameat(rfd, tmp, rfd, name) != 0) {
        if (fd >= 0)
            close(fd);
        (void)unlinkat(rfd, tmp, 0);
        return -1;
    }
    return fd;
}

enum cx_err
cx_relay_open(const struct cx_sandbox_conn *c, const char *private_dir, struct cx_relay **out,
              char *msg, size_t msglen)
{
    struct cx_relay *r = calloc(1, sizeof(*r));
    int rfd = open(c->runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    enum cx_err rc = CX_OK;

    *out = NULL;
    if (r)
        r->pfd = -1;
    if (!r || rfd < 0) {
        snprintf(msg, msglen, "cannot open the runtime directory");
        rc = r ? CX_ERR_IO : CX_ERR_NOMEM;
        goto out;
    }
    r->pfd = open(private_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    r->msgs = (struct bucket){BURST_MSGS, RATE_MSGS, BURST_MSGS};
    r->bytes = (struct bucket){BURST_BYTES, RATE_BYTES, BURST_BYTES};
    r->content = (struct bucket){BURST_CONTENT, RATE_CONTENT, BURST_CONTENT};
    r->refilled_us = cx_now_us();
    for (int i = 0; i < c->nports && rc == CX_OK; i++) {
        struct listener *l = &r->ls[r->nls];
        struct stat st;

        snprintf(l->name, sizeof(l->name), "%s-%d", c->ip_name, c->ports[i]);
        l->channel = i;
        /* what the relay connects to must be the kernel's socket, not a
         * link it made before the seal */
        if (r->pfd < 0 || fstatat(r->pfd, l->name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISSOCK(st.st_mode)) {
            snprintf(msg, msglen, "the kernel's endpoint %s is not a socket", l->name);
            rc = CX_ERR_INVALID;
        } else if ((l->fd = listen_at(rfd, l->name)) < 0) {
            snprintf(msg, msglen, "cannot listen on the endpoint %s", l->name);
            rc = CX_ERR_IO;
        } else {
            r->nls++;
        }
    }
out:
    if (rfd >= 0)
        close(rfd);
    if (rc)
        cx_relay_free(r);
    else
        *out = r;
    return rc;
}

int
cx_relay_poll_fds(struct cx_relay *r, struct pollfd *p, int max, int *timeout_ms)
{
    int n = 0, wait;
    bool starved;

    if (!r) {
        *timeout_ms = -1;
        return 0;
    }
    refill(r);
    wait = wait_ms(r);
    starved = wait > 0;
    *timeout_ms = starved ? wait : -1;
    for (int i = 0; i < r->nls && n < max; i++) {
        p[n] = (struct pollfd){.fd = r->ls[i].fd, .events = POLLIN};
        r->slots[n++].kind = S_LISTEN, r->slots[n - 1].i = i;
    }
    for (int i = 0; i < r->npairs && n + 2 <= max; i++) {
        struct pair *q = r->pairs[i];
        short se = 0, ke = 0;

        if (!q->down.eof && q->down.len - q->down.off < q->down.cap)
            se |= POLLIN;
        if (q->up.off < q->up.len)
            se |= POLLOUT;
        /* the kernel is read only within its budget */
        if (!q->up.eof && !starved && q->up.len - q->up.off < q->up.cap)
            ke |= POLLIN;
        if (q->down.off < q->down.len)
            ke |= POLLOUT;
        p[n] = (struct pollfd){.fd = q->srv, .events = se};
        r->slots[n].kind = S_SRV, r->slots[n++].i = i;
        p[n] = (struct pollfd){.fd = q->krn, .events = ke};
        r->slots[n].kind = S_KRN, r->slots[n++].i = i;
    }
    return n;
}

/* One side's events on a pair. */
static void
pair_events(struct cx_relay *r, struct pair *q, bool kernel_side, short rev)
{
    const unsigned char *start;
    size_t got = 0;

    /* what was read is passed on at once (the other side is most often
     * ready: one poll() a chunk, not two); POLLOUT only for the rest */
    if (kernel_side) {
        if ((rev & (POLLIN | POLLHUP | POLLERR)) && !q->up.eof) {
            if (!fill(q->krn, &q->up, &start, &got)) {
                q->up.eof = true;
            } else if (got && !zmtp_feed(r, q, &q->z, start, got)) {
                r->refused++;
                q->dead = true;
                return;
            }
            if (got && !drain(q->srv, &q->up))
                q->dead = true;
        }
        if ((rev & POLLOUT) && !drain(q->krn, &q->down))
            q->dead = true;
    } else {
        if ((rev & (POLLIN | POLLHUP | POLLERR)) && !q->down.eof) {
            if (!fill(q->srv, &q->down, &start, &got))
                q->down.eof = true;
            else if (got && q->zs.keep)
                (void)zmtp_feed(r, q, &q->zs, start, got); /* the run-end requests */
            if (got && !drain(q->krn, &q->down))
                q->dead = true;
        }
        if ((rev & POLLOUT) && !drain(q->srv, &q->up))
            q->dead = true;
    }
    /* a side that ended: the pair goes once what it sent is passed on */
    if ((q->up.eof && q->up.off == q->up.len) || (q->down.eof && q->down.off == q->down.len))
        q->dead = true;
}

void
cx_relay_handle(struct cx_relay *r, const struct pollfd *p, int n)
{
    int w = 0;

    if (!r)
        return;
    for (int i = 0; i < n; i++) {
        if (!p[i].revents)
            continue;
        if (r->slots[i].kind == S_LISTEN)
            accept_one(r, &r->ls[r->slots[i].i]);
        else if (!r->pairs[r->slots[i].i]->dead)
            pair_events(r, r->pairs[r->slots[i].i], r->slots[i].kind == S_KRN, p[i].revents);
    }
    for (int i = 0; i < r->npairs; i++) {
        if (r->pairs[i]->dead)
            pair_free(r->pairs[i]);
        else
            r->pairs[w++] = r->pairs[i];
    }
    r->npairs = w;
}

void
cx_relay_on_run_end(struct cx_relay *r, void (*fn)(void *ctx), void *ctx)
{
    r->run_end = fn;
    r->run_end_ctx = ctx;
}

uint64_t
cx_relay_refused(const struct cx_relay *r)
{
    return r->refused;
}

uint64_t
cx_relay_run_ends(const struct cx_relay *r)
{
    return r->run_ends;
}

void
cx_relay_free(struct cx_relay *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->nls; i++)
        close(r->ls[i].fd);
    for (int i = 0; i < r->npairs; i++)
        pair_free(r->pairs[i]);
    if (r->pfd >= 0)
        close(r->pfd);
    free(r);
}

#ifdef CX_TEST_HOOKS
int
cx_relay_parse(const unsigned char *d, size_t n, int channel, size_t piece, uint64_t *ends)
{
    struct cx_relay r = {
        .msgs = {1e12, 1, 1e12}, .bytes = {1e12, 1, 1e12}, .content = {1e12, 1, 1e12}};
    unsigned char keep[PARENT_MAX];
    struct pair p = {.channel = channel};
    double before = r.msgs.tokens;

    zmtp_init(&p.z, false, channel == SHELL_CHANNEL ? keep : NULL);
    /* as if the server had sent a run-end request of this id */
    snprintf(r.end_ids[0], END_ID_MAX, "%sfuzz", CX_RELAY_RUN_END);
    for (size_t at = 0; at < n; at += piece)
        if (!zmtp_feed(&r, &p, &p.z, d + at, n - at < piece ? n - at : piece))
            return -1;
    if (ends)
        *ends = r.run_ends;
    return (int)(before - r.msgs.tokens);
}
#endif
