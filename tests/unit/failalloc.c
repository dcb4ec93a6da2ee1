/* Fault injection for the unit tests: the Nth allocation fails.
 *
 * Linked into every unit test with -Wl,--wrap for malloc, calloc, realloc,
 * strdup and strndup, so that allocations made by codexec's code (and by
 * jansson, routed here with json_set_alloc_funcs) go through it; libpq,
 * libcurl and libmagic allocate on their own. Without CX_FAIL_ALLOC in the
 * environment it only passes calls on. With CX_FAIL_ALLOC=N the Nth
 * allocation returns NULL (ENOMEM) and every other succeeds; N = 0 fails
 * none and, at exit, prints "failalloc: <count>" to stderr so a driver
 * (tests/faultinject.py) knows how many there are to fail. A test double
 * for a fault that cannot be produced on demand, named as one.
 *
 * Not failed: what jansson's decoder allocates (json_loadb and json_loads
 * are wrapped too). jansson up to 2.15.1 drops a failed append to its
 * lexer's buffer and then decodes the string past the buffer's end, a
 * heap overflow (load.c lex_save; upstream's fix, "stop silently dropping
 * lex_save() OOM failures", is not in a release): failing those
 * allocations tests jansson, not codexec, and crashes in it for any string
 * of 16 bytes or more. Everything codexec builds with jansson still fails
 * in turn. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);

static long fail_at = -1; /* -1: off */
static long count;
static __thread int decoding; /* inside jansson's decoder: nothing fails */

json_t *__real_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__real_json_loads(const char *input, size_t flags, json_error_t *error);
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__wrap_json_loads(const char *input, size_t flags, json_error_t *error);

json_t *
__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error)
{
    json_t *j;

    decoding++;
    j = __real_json_loadb(buffer, buflen, flags, error);
    decoding--;
    return j;
}

json_t *
__wrap_json_loads(const char *input, size_t flags, json_error_t *error)
{
    json_t *j;

    decoding++;
    j = __real_json_loads(input, flags, error);
    decoding--;
    return j;
}

/* Whether this allocation is the one to fail. */
static int
fails(void)
{
    if (fail_at < 0 || decoding)
        return 0;
    if (__atomic_add_fetch(&count, 1, __ATOMIC_RELAXED) == fail_at) {
        errno = ENOMEM;
        return 1;
    }
    return 0;
}

void *
__wrap_malloc(size_t n)
{
    return fails() ? NULL : __real_malloc(n);
}

void *
__wrap_calloc(size_t n, size_t size)
{
    return fails() ? NULL : __real_calloc(n, size);
}

void *
__wrap_realloc(void *p, size_t n)
{
    return fails() ? NULL : __real_realloc(p, n);
}

char *
__wrap_strdup(const char *s)
{
    return fails() ? NULL : __real_strdup(s);
}

char *
__wrap_strndup(const char *s, size_t n)
{
    return fails() ? NULL : __real_strndup(s, n);
}

static void
report(void)
{
    if (fail_at == 0)
        fprintf(stderr, "failalloc: %ld\n", count);
}

__attribute__((constructor)) static void
failalloc_init(void)
{
    const char *v = getenv("CX_FAIL_ALLOC");

    if (!v || !*v)
        return;
    fail_at = strtol(v, NULL, 10);
    if (fail_at < 0)
        fail_at = -1;
    json_set_alloc_funcs(__wrap_malloc, free);
    atexit(report);
}
