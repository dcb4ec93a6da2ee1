#include <pthread.h>
#include <string.h>

#include "cancel.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct cx_cancel *runs;

void
cx_cancel_register(struct cx_cancel *c, const char *run_id)
{
    strncpy(c->run_id, run_id, sizeof(c->run_id) - 1);
    c->run_id[sizeof(c->run_id) - 1] = '\0';
    c->requested = 0;
    pthread_mutex_lock(&lock);
    c->next = runs;
    c->pprev = &runs;
    if (runs)
        runs->pprev = &c->next;
    runs = c;
    pthread_mutex_unlock(&lock);
}

void
cx_cancel_unregister(struct cx_cancel *c)
{
    /* (in one step, not a walk of every run in flight: one ends each run) */
    pthread_mutex_lock(&lock);
    if (c->pprev) {
        *c->pprev = c->next;
        if (c->next)
            c->next->pprev = c->pprev;
    }
    pthread_mutex_unlock(&lock);
    c->next = NULL;
    c->pprev = NULL;
}

bool
cx_cancel_note(const char *run_id)
{
    bool found = false;

    pthread_mutex_lock(&lock);
    for (struct cx_cancel *c = runs; c; c = c->next)
        if (!strcmp(c->run_id, run_id)) {
            __atomic_store_n(&c->requested, 1, __ATOMIC_RELEASE);
            found = true;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

bool
cx_cancel_requested(const struct cx_cancel *c)
{
    return c && __atomic_load_n(&c->requested, __ATOMIC_ACQUIRE);
}
