/* codexec: the download cache (its lookups are lib/download.c's; the
 * rest is public, for the processes that keep it in step). */
#ifndef CX_DLCACHE_H
#define CX_DLCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "auth.h"
#include "codexec.h"

/* An answer for the key's hash, artifact id and version asked (0: the
 * current one), if one is cached and live. *epoch is what to give
 * cx_dlcache_put() for the answer read on a miss. */
bool cx_dlcache_get(const unsigned char hash[32], const char *id, int asked,
                    struct cx_principal *who, struct cx_download *d, uint64_t *epoch);

/* Keeps the answer, unless something was forgotten since epoch. */
void cx_dlcache_put(const unsigned char hash[32], const char *id, int asked,
                    const struct cx_principal *who, const struct cx_download *d, uint64_t epoch);

/* A key's check (cx_auth_check_key(): a key of every request but a
 * download's) kept in the same table, with the same life and forgetting:
 * the principal its hash stands for, if cached and live. */
bool cx_dlcache_key_get(const unsigned char hash[32], struct cx_principal *who, uint64_t *epoch);
void cx_dlcache_key_put(const unsigned char hash[32], const struct cx_principal *who,
                        uint64_t epoch);

/* The watcher heard (true) or lost (false) the announcements: either way
 * everything cached so far is forgotten. */
void cx_dlcache_set_live(bool live);
void cx_dlcache_forget_key(const char *key_id);
void cx_dlcache_forget_artifact(const char *artifact_id);

#endif
