/* codexec: the download cache (its lookups are lib/download.c's; the
 * rest is public, for the processes that keep it in step). */
#ifndef CX_DLCACHE_H
#define CX_DLCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "auth.h"
#include "dlinfo.h"
#include "err.h"

/* An answer for the key's hash, artifact id and version asked (0: the
 * current one), if one is cached and live. *epoch is what to give
 * cx_dlcache_put() for the answer read on a miss. */
bool cx_dlcache_get(const unsigned char hash[32], const char *id, int asked,
                    struct cx_principal *who, struct cx_download *d, uint64_t *epoch);

/* Keeps the answer, unless something was forgotten since epoch. */
void cx_dlcache_put(const unsigned char hash[32], const char *id, int asked,
                    const struct cx_principal *who, const struct cx_download *d, uint64_t epoch);

/* The download cache: a download by API key answered without a database
 * round trip when the same key asked for the same artifact and version
 * within the last minute. The check stays on every request; only where
 * its answer comes from changes. An entry is forgotten the moment its key
 * is revoked or its artifact deleted or given a new version, as
 * PostgreSQL announces it (watch.h: the watcher calls the functions
 * below), on every process; while the announcements can't be heard (no
 * connection), nothing is answered from the cache. Process-wide, shared by
 * every thread. */

/* Sets the capacity (entries; 0: no cache). Once, before any thread. */
enum cx_err cx_dlcache_init(unsigned entries) CX_MUSTCHECK;
void cx_dlcache_shutdown(void);

/* The watcher heard (true) or lost (false) the announcements: either way
 * everything cached so far is forgotten. */
void cx_dlcache_set_live(bool live);
void cx_dlcache_forget_key(const char *key_id);
void cx_dlcache_forget_artifact(const char *artifact_id);

#endif
