/* codexec: sandbox sessions, one kernel per (user, conversation).
 *
 * Session rows live in PostgreSQL so any codexec process serves any
 * conversation. Runs in one conversation are serialised with a session-level
 * PostgreSQL advisory lock held by the run's connection for the whole run. */
#ifndef CX_SESSION_H
#define CX_SESSION_H

#include <jansson.h>
#include <stdbool.h>

#include "auth.h"
#include "config.h"
#include "codexec.h"
#include "util.h"

struct cx_db_call; /* db.h */

struct cx_kernel_conn;

/* A session's workspace directory on the gateway: "w-<session id>", the
 * same for a pooled kernel's (its id becomes the session's). */
#define CX_WORKSPACE_MAX    48
#define CX_WORKSPACE_PREFIX "w-" /* then the session's id */
void cx_session_workspace_name(const char *id, char out[CX_WORKSPACE_MAX]);

struct cx_gateway;

struct cx_session {
    char id[37];
    char gateway_url[CX_GATEWAY_URL_MAX];
    struct cx_gateway *gw; /* the thread's handle of the session's gateway */
    char user[CX_USER_MAX + 1];
    char conversation_id[CX_CONVERSATION_MAX + 1];
    char kernel_id[64];
    char workspace[CX_WORKSPACE_MAX];
    char expires_at[32];
    enum cx_lang lang;   /* its language, fixed when it started */
    bool created;        /* this acquire made the session */
    bool reset;          /* its kernel was replaced: state lost */
    bool kernel_fresh;   /* codexec started or restarted the kernel itself */
    bool capture_rescan; /* the next capture must not trust the last scan */
    bool from_pool;      /* this acquire took a pooled kernel (its warm cell loaded the
                            epilogue): false once it is replaced or restarted */
    bool locked;
};

/* Locks the conversation (waiting up to busy_wait: CX_ERR_CONFLICT), then
 * loads or creates its session and kernel, extending the expiry to at least
 * now + ttl. At the user's session cap the least recently used idle
 * session is closed first; CX_ERR_QUOTA if all are busy. A new kernel goes
 * to the usable gateway with the most room in its budget (max_kernels); at
 * every budget the least recently used idle session of any user is closed
 * to make room, and when none is idle: CX_ERR_CAPACITY. A session whose
 * gateway is no longer usable moves to another (s->reset). A new session
 * is of the language lang (python for CX_LANG_ANY); one that exists in
 * another language than lang (unless CX_LANG_ANY) is
 * CX_ERR_LANGUAGE_MISMATCH, nothing held. On success the lock is held:
 * cx_session_release() ends it. msg says what failed. */
enum cx_err cx_session_acquire(struct cx_ctx *cx, const char *user, const char *conversation_id,
                               unsigned ttl, enum cx_lang lang, struct cx_session *s, char *msg,
                               size_t msglen) CX_MUSTCHECK;

/* cx_session_acquire(), with also (a statement of the caller's) sent in
 * the same round trip as the conversation's lock and touch, once the lock
 * is held, when the acquire takes that way: *also_done says whether it ran
 * (its implicit transaction committed asynchronously, as the touch's). */
enum cx_err cx_session_acquire_with(struct cx_ctx *cx, const char *user,
                                    const char *conversation_id, unsigned ttl, enum cx_lang lang,
                                    const struct cx_db_call *also, bool *also_done,
                                    struct cx_session *s, char *msg, size_t msglen) CX_MUSTCHECK;

/* cx_session_acquire() of a session that exists: CX_ERR_NOT_FOUND (and
 * nothing held) when the conversation has none. */
enum cx_err cx_session_attach(struct cx_ctx *cx, const char *user, const char *conversation_id,
                              unsigned ttl, enum cx_lang lang, struct cx_session *s, char *msg,
                              size_t msglen) CX_MUSTCHECK;

/* Records the kernel's state after a run and unlocks. Safe to call twice. */
void cx_session_release(struct cx_ctx *cx, struct cx_session *s);

/* The kernel vanished or died for good: start a new one in the same
 * workspace (s->reset becomes true). */
enum cx_err cx_session_replace_kernel(struct cx_ctx *cx, struct cx_session *s, char *msg,
                                      size_t msglen) CX_MUSTCHECK;

/* A new kernel for the session (its state is gone: s->reset), on the
 * usable gateway with room: for a session without one (evicted, a start
 * that failed half-way), or whose gateway went away. */
enum cx_err cx_session_move_kernel(struct cx_ctx *cx, struct cx_session *s, char *msg,
                                   size_t msglen) CX_MUSTCHECK;

/* cx_kernel_confirm() for the session's kernel on c, asking the gateway
 * every 2 s without an answer whether the kernel still exists (one deleted
 * behind codexec's back answers nothing on a connection pooled before):
 * CX_ERR_NOT_FOUND then, as for the server's notice that it gave up on
 * the kernel ("dead": the server forgets it). */
enum cx_err cx_session_confirm(struct cx_session *s, struct cx_kernel_conn *c,
                               int64_t deadline_us) CX_MUSTCHECK;

/* Restarts the kernel (a run overran its grace period): s->reset. */
enum cx_err cx_session_restart_kernel(struct cx_ctx *cx, struct cx_session *s) CX_MUSTCHECK;

/* Restarts the kernels the idle drain found talking with no run to read
 * them (cx_kernel_pool_talkers), each under its conversation's lock; one a
 * run holds is left to the run (it reads that output). Their next runs say
 * session.reset. Returns how many were restarted. */
int cx_session_restart_talkers(struct cx_ctx *cx);

/* The same for one kernel of a session (found talking otherwise: by its
 * last_activity at the reaper's sweeps); true when it was restarted. */
bool cx_session_restart_talker(struct cx_ctx *cx, const char *gateway_url, const char *kernel_id);

/* Closes up to limit expired sessions that no run holds; safe with several
 * processes. *closed counts them. */
enum cx_err cx_session_reap(struct cx_ctx *cx, int limit, int *closed) CX_MUSTCHECK;

#endif
