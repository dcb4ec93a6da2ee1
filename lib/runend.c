#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest.h"
#include "runend.h"
#include "kernel.h"
#include "util.h"

extern const char cx_epilogue_py[];

/* The run's epilogue, one user expression: the function kept in sys under
 * a name of this version of lib/epilogue.py, called with the token (the
 * kernel id, as a JSON string, which is a Python literal) and whether to
 * capture. The kernel compiles the expression on every evaluation, so it
 * is short when the request carries no source (every run but a new
 * kernel's first): without the function kept it answers 'need' and does
 * nothing. With the source in the request's metadata (not in the
 * expression: 0.16 ms to compile with it), a process without the function
 * executes the source into a private namespace and keeps the function. */
#define EPILOGUE_FMT "getattr(__import__('sys'), '_codexec_epi_%s', lambda *a: 'need')(%s, %s)"
#define EPILOGUE_SOURCE_FMT                                                                        \
    "(getattr(__import__('sys'), '_codexec_epi_%s', None) or (lambda s, m, d: (exec("              \
    "m['codexec_epilogue'], d), setattr(s, '_codexec_epi_%s', d['epilogue']), d['epilogue'])[2])(" \
    "__import__('sys'), __import__('IPython').get_ipython().kernel.get_parent('shell')"            \
    "['metadata'], {'__name__': '__codexec__'}))(%s, %s)"

/* The epilogue's version: its source's SHA-256, the first 16 digits. */
static struct cx_sha256_kept epilogue_sha = CX_SHA256_KEPT_INIT;

bool
cx_runend_add_source(json_t *meta)
{
    return !json_object_set_new(meta, "codexec_epilogue", json_string(cx_epilogue_py));
}

json_t *
cx_runend_expr(const char *token, bool capture, json_t *meta, bool with_source)
{
    json_t *t = json_string(token), *out = NULL;
    char *lit = t ? json_dumps(t, JSON_ENCODE_ANY) : NULL;
    const char *sha = cx_sha256_kept(&epilogue_sha, cx_epilogue_py);
    const char *cap = capture ? "True" : "False";
    char expr[2048], version[17];
    int len = -1;

    if (with_source && !cx_runend_add_source(meta))
        goto out;
    if (sha)
        snprintf(version, sizeof(version), "%.16s", sha);
    if (lit && sha && json_object_get(meta, "codexec_epilogue"))
        len = snprintf(expr, sizeof(expr), EPILOGUE_SOURCE_FMT, version, version, lit, cap);
    else if (lit && sha)
        len = snprintf(expr, sizeof(expr), EPILOGUE_FMT, version, lit, cap);
    if (len > 0 && (size_t)len < sizeof(expr))
        out = json_pack("{s:s}", "cx", expr);
out:
    free(lit);
    json_decref(t);
    return out;
}

json_t *
cx_runend_answer(const struct cx_exec *e)
{
    json_t *v = json_object_get(json_object_get(e->reply, "user_expressions"), "cx");
    const char *status = json_string_value(json_object_get(v, "status"));
    const char *plain =
        json_string_value(json_object_get(json_object_get(v, "data"), "text/plain"));
    json_t *a;

    if (!status || strcmp(status, "ok") || !plain ||
        cx_json_cost(plain, strlen(plain)) > CX_JSON_COST_MAX)
        return NULL;
    a = json_loads(plain, 0, NULL);
    if (!json_is_object(a)) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static const char *
expr_text(const struct cx_exec *e)
{
    json_t *v = json_object_get(json_object_get(e->reply, "user_expressions"), "cx");

    return json_string_value(json_object_get(json_object_get(v, "data"), "text/plain"));
}

bool
cx_runend_lacks_epilogue(const struct cx_exec *e)
{
    const char *plain = expr_text(e);

    return plain && !strcmp(plain, "'need'");
}

/* Whether the epilogue did nothing for want of its sources. */
static bool
needs_sources(const struct cx_exec *e)
{
    const char *plain = expr_text(e);

    /* the expression's answer, or lib/epilogue.py's (no capture helper), as
     * written: no parse of what may be a long answer */
    return cx_runend_lacks_epilogue(e) || (plain && !strcmp(plain, "{\"need\": true}"));
}

bool
cx_runend_says_fresh(const struct cx_exec *epilogue)
{
    json_t *a = cx_runend_answer(epilogue);
    bool known = json_is_true(json_object_get(a, "known"));

    json_decref(a);
    return !known;
}

bool
cx_runend_carried(const struct cx_exec *e)
{
    const char *status = json_string_value(json_object_get(e->reply, "status"));

    return e->got_reply && status && !strcmp(status, "ok") &&
           json_object_get(json_object_get(e->reply, "user_expressions"), "cx") &&
           !needs_sources(e);
}
