/* codexec: what other processes change, as it happens, and the revocation
 * list the web server reads.
 *
 * A change that caches and the web server depend on (a key revoked, an
 * artifact deleted or given a new version) is announced by PostgreSQL at
 * its COMMIT on channel codexec_changes (sql/008_change_notices.sql): one
 * connection per process LISTENs, and learns of it within milliseconds.
 *
 * The revocation list is a directory holding one empty file per key
 * revoked in the last link_max_expiry seconds, named by the key's id: nginx
 * (the link module, nginx/module/) leaves a signed link whose key has a file to
 * codexec, which refuses it. */
#ifndef CX_WATCH_H
#define CX_WATCH_H

#include <stdbool.h>

#include "codexec.h"

struct cx_watch;

enum cx_err cx_watch_new(const char *conninfo, struct cx_watch **out) CX_MUSTCHECK;
void cx_watch_free(struct cx_watch *w);

/* Connects and LISTENs when not connected, and then returns at once with
 * *fresh set: whatever was learnt before may be stale. Otherwise waits up
 * to timeout_ms and calls fn for each notice. CX_ERR_DB when the database
 * can't be reached or the connection broke (call again later). */
enum cx_err cx_watch_wait(struct cx_watch *w, int timeout_ms, bool *fresh, cx_watch_fn fn,
                          void *ctx) CX_MUSTCHECK;

/* The file that says the list is kept (made by every sync): nginx hands
 * every link to codexec while it is missing, so a list nobody keeps, or
 * one nginx can't read, fails closed. */
#define CX_REVOKED_LISTED ".listed"

/* Makes revoked_keys_dir hold a file for every key revoked within
 * link_max_expiry, and removes the files older than that (their keys'
 * links have all expired), then CX_REVOKED_LISTED. Other names there are
 * left alone. */
enum cx_err cx_revoked_sync(struct cx_ctx *cx, int *added, int *removed) CX_MUSTCHECK;

#endif
