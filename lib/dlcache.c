/* The download cache (dlcache.h): a direct-mapped table of the answers
 * cx_download_resolve_for_key() gave lately. */
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "dlcache.h"
#include "log.h"
#include "metrics.h"
#include "util.h"
#include "watch.h"

/* An entry answers for a minute at most: every minute a key in use is
 * checked against the database again (and its last use recorded). */
#define ENTRY_LIFE_US (60 * 1000000LL)

struct entry {
    bool used;
    unsigned char hash[32]; /* the key's stored hash, never the key */
    char id[37];
    int asked; /* the version asked for: 0 is the current one */
    int64_t until_us;
    struct cx_principal who;
    struct cx_download d;
};

static struct {
    pthread_mutex_t lock;
    struct entry *slots;
    unsigned n;
    bool live;      /* the watcher hears the announcements */
    uint64_t epoch; /* bumped by every forgetting: a lookup that began
                       before one must not store what it read */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

enum cx_err
cx_dlcache_init(unsigned entries)
{
    if (entries == 0)
        return CX_OK;
    cache.slots = calloc(entries, sizeof(*cache.slots));
    if (!cache.slots)
        return CX_ERR_NOMEM;
    cache.n = entries;
    return CX_OK;
}

void
cx_dlcache_shutdown(void)
{
    pthread_mutex_lock(&cache.lock);
    if (cache.slots)
        sodium_memzero(cache.slots, cache.n * sizeof(*cache.slots));
    free(cache.slots);
    cache.slots = NULL;
    cache.n = 0;
    cache.live = false;
    pthread_mutex_unlock(&cache.lock);
}

static unsigned
slot_of(const unsigned char hash[32], const char *id, int asked)
{
    unsigned char h[8];
    uint64_t v;
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, sizeof(h));
    crypto_generichash_update(&st, hash, 32);
    crypto_generichash_update(&st, (const unsigned char *)id, strlen(id));
    crypto_generichash_update(&st, (const unsigned char *)&asked, sizeof(asked));
    crypto_generichash_final(&st, h, sizeof(h));
    memcpy(&v, h, sizeof(v));
    return (unsigned)(v % cache.n);
}

/* Under the lock. */
static void
forget_where(bool (*match)(const struct entry *, const char *), const char *what)
{
    cache.epoch++;
    for (unsigned i = 0; i < cache.n; i++)
        if (cache.slots[i].used && (!match || match(&cache.slots[i], what)))
            cache.slots[i].used = false;
}

void
cx_dlcache_set_live(bool live)
{
    pthread_mutex_lock(&cache.lock);
    forget_where(NULL, NULL);
    cache.live = live;
    pthread_mutex_unlock(&cache.lock);
}

static bool
of_key(const struct entry *e, const char *key_id)
{
    return strcmp(e->who.key_id, key_id) == 0;
}

static bool
of_artifact(const struct entry *e, const char *id)
{
    return strcmp(e->id, id) == 0;
}

void
cx_dlcache_forget_key(const char *key_id)
{
    pthread_mutex_lock(&cache.lock);
    forget_where(of_key, key_id);
    pthread_mutex_unlock(&cache.lock);
}

void
cx_dlcache_forget_artifact(const char *artifact_id)
{
    pthread_mutex_lock(&cache.lock);
    forget_where(of_artifact, artifact_id);
    pthread_mutex_unlock(&cache.lock);
}

/* A key's own entry: no artifact, and a version no download asks for. */
#define KEY_ENTRY (-1)

/* The entry for (hash, id, asked) to *who and *d (when d), if there is a
 * live one; under the lock. */
static bool
lookup(const unsigned char hash[32], const char *id, int asked, struct cx_principal *who,
       struct cx_download *d)
{
    const struct entry *e = &cache.slots[slot_of(hash, id, asked)];
    bool hit = e->used && e->asked == asked && e->until_us > cx_now_us() &&
               sodium_memcmp(e->hash, hash, 32) == 0 && strcmp(e->id, id) == 0;

    if (hit) {
        *who = e->who;
        if (d)
            *d = e->d;
    }
    return hit;
}

/* Keeps it, unless something was forgotten since epoch. */
static void
store(const unsigned char hash[32], const char *id, int asked, const struct cx_principal *who,
      const struct cx_download *d, uint64_t epoch)
{
    pthread_mutex_lock(&cache.lock);
    /* nothing was forgotten since the lookup began: what it read stands */
    if (cache.n && cache.live && cache.epoch == epoch && strlen(id) < sizeof(cache.slots[0].id)) {
        struct entry *e = &cache.slots[slot_of(hash, id, asked)];
        e->used = true;
        memcpy(e->hash, hash, 32);
        snprintf(e->id, sizeof(e->id), "%s", id);
        e->asked = asked;
        e->until_us = cx_now_us() + ENTRY_LIFE_US;
        e->who = *who;
        if (d)
            e->d = *d;
        else
            memset(&e->d, 0, sizeof(e->d));
    }
    pthread_mutex_unlock(&cache.lock);
}

/* A lookup counted in hits and misses (while live); *epoch for store(). */
static bool
get(const unsigned char hash[32], const char *id, int asked, struct cx_principal *who,
    struct cx_download *d, uint64_t *epoch, enum cx_counter hits, enum cx_counter misses)
{
    bool hit = false;

    pthread_mutex_lock(&cache.lock);
    *epoch = cache.epoch;
    if (cache.n && cache.live) {
        hit = lookup(hash, id, asked, who, d);
        cx_metrics_add(hit ? hits : misses, 1);
    }
    pthread_mutex_unlock(&cache.lock);
    return hit;
}

bool
cx_dlcache_get(const unsigned char hash[32], const char *id, int asked, struct cx_principal *who,
               struct cx_download *d, uint64_t *epoch)
{
    if (asked < 0) {
        *epoch = 0;
        return false;
    }
    return get(hash, id, asked, who, d, epoch, CX_COUNT_DLCACHE_HITS, CX_COUNT_DLCACHE_MISSES);
}

void
cx_dlcache_put(const unsigned char hash[32], const char *id, int asked,
               const struct cx_principal *who, const struct cx_download *d, uint64_t epoch)
{
    if (asked >= 0)
        store(hash, id, asked, who, d, epoch);
}

bool
cx_dlcache_key_get(const unsigned char hash[32], struct cx_principal *who, uint64_t *epoch)
{
    return get(hash, "", KEY_ENTRY, who, NULL, epoch, CX_COUNT_KEYCACHE_HITS,
               CX_COUNT_KEYCACHE_MISSES);
}

void
cx_dlcache_key_put(const unsigned char hash[32], const struct cx_principal *who, uint64_t epoch)
{
    store(hash, "", KEY_ENTRY, who, NULL, epoch);
}

/* A change another process made (sql/008): the cache forgets. */
static void
on_change(void *arg, const char *kind, const char *id)
{
    (void)arg;
    if (strcmp(kind, "artifact") == 0)
        cx_dlcache_forget_artifact(id);
    else
        cx_dlcache_forget_key(id);
}

/* While the changes can't be heard, the cache answers nothing. */
static void
on_live(void *arg, bool live)
{
    (void)arg;
    cx_dlcache_set_live(live);
}

void
cx_dlcache_follow(struct cx_ctx *cx, const volatile int *stop)
{
    struct cx_watch_hooks hooks = {.on_change = on_change, .on_live = on_live};

    if (cx_watch_follow(cx, stop, &hooks))
        cx_log_err(0, "watcher: out of memory; the download cache stays off");
}
