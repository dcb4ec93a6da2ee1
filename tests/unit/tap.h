/* Minimal TAP for the unit tests: each check prints "ok N" or "not ok N"
 * with the file and line of the failed expectation. */
#ifndef CX_TAP_H
#define CX_TAP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int tap_n, tap_failed;

/* Stops a test that can't go on ("Bail out!" was printed). _exit: what it
 * abandons is not a leak of the code under test, so LeakSanitizer's check
 * at exit is skipped; crashes and memory errors are caught as they happen. */
static inline void
tap_bail(void)
{
    fflush(stdout);
    fflush(stderr);
    _exit(1);
}

#define ok(cond, ...)                                                                              \
    do {                                                                                           \
        int ok_ = (cond) ? 1 : 0;                                                                  \
        tap_n++;                                                                                   \
        printf("%sok %d - ", ok_ ? "" : "not ", tap_n);                                            \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        if (!ok_) {                                                                                \
            tap_failed++;                                                                          \
            printf("#   failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
        }                                                                                          \
        fflush(stdout);                                                                            \
    } while (0)

/* ok(), but what follows depends on it: on failure the program stops
 * ("Bail out!"), as it must when an allocation failed (tests/faultinject.py
 * fails each in turn). */
#define need(cond, ...)                                                                            \
    do {                                                                                           \
        int need_ = (cond) ? 1 : 0;                                                                \
        ok(need_, __VA_ARGS__);                                                                    \
        if (!need_) {                                                                              \
            printf("Bail out! a step the rest depends on failed\n");                               \
            tap_bail();                                                                            \
        }                                                                                          \
    } while (0)

#define is_int(got, want, ...)                                                                     \
    do {                                                                                           \
        long long g_ = (long long)(got), w_ = (long long)(want);                                   \
        ok(g_ == w_, __VA_ARGS__);                                                                 \
        if (g_ != w_)                                                                              \
            printf("#   got %lld, want %lld\n", g_, w_);                                           \
    } while (0)

#define is_str(got, want, ...)                                                                     \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        int same_ = g_ && w_ ? strcmp(g_, w_) == 0 : g_ == w_;                                     \
        ok(same_, __VA_ARGS__);                                                                    \
        if (!same_)                                                                                \
            printf("#   got \"%s\", want \"%s\"\n", g_ ? g_ : "(null)", w_ ? w_ : "(null)");       \
    } while (0)

static inline int
tap_done(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

/* PostgreSQL is not optional in this suite: a missing conninfo is a failure. */
static inline const char *
tap_pg(void)
{
    const char *pg = getenv("CODEXEC_TEST_PG");
    if (!pg || !*pg) {
        printf("Bail out! CODEXEC_TEST_PG is not set: run through packaging/quickstart test\n");
        tap_bail();
    }
    return pg;
}

#endif
