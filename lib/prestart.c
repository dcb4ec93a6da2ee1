#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture.h"
#include "config.h"
#include "db.h"
#include "gateway.h"
#include "kernel.h"
#include "log.h"
#include "prestart.h"
#include "runend.h"
#include "budget.h"
#include "util.h"

CX_SQL(q_list, 1,
       "SELECT id, kernel_id, kernel_name, ready FROM prestarted_kernels WHERE gateway_url = $1"
       " ORDER BY created_at");
/* Zero rows when a claim took it first. */
CX_SQL(q_take, 1, "DELETE FROM prestarted_kernels WHERE id = $1::uuid RETURNING kernel_id");
CX_SQL(q_add, 4,
       "INSERT INTO prestarted_kernels (id, gateway_url, kernel_name, kernel_id, ready)"
       " VALUES ($1::uuid, $2, $3, $4, false)");
CX_SQL(q_ready, 1, "UPDATE prestarted_kernels SET ready = true WHERE id = $1::uuid");
#define FILL_KEY "hashtextextended('prestart' || E'\\n' || $1, 2)"
CX_SQL(q_fill_lock, 1, "SELECT pg_try_advisory_lock(" FILL_KEY ")");
CX_SQL(q_fill_unlock, 1, "SELECT pg_advisory_unlock(" FILL_KEY ")");

static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cond; /* on the monotonic clock: a clock step
                                    neither starts a refill early nor
                                    holds one off */
static pthread_once_t wake_once = PTHREAD_ONCE_INIT;
static bool shut;
static int64_t kick_at; /* cx_now_us() a refill is due at; 0: none asked */

static bool wake_mono; /* wake_cond is on CLOCK_MONOTONIC */

static void
wake_init(void)
{
    pthread_condattr_t a;

    wake_mono = pthread_condattr_init(&a) == 0 &&
                pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0 &&
                pthread_cond_init(&wake_cond, &a) == 0;
    pthread_condattr_destroy(&a);
    if (!wake_mono)
        pthread_cond_init(&wake_cond, NULL); /* static-like: cannot fail */
}

/* The wake lock, held, the condition made. */
static void
wake_lock_take(void)
{
    pthread_once(&wake_once, wake_init);
    pthread_mutex_lock(&wake_lock);
}

void
cx_prestart_kick_after(unsigned ms)
{
    int64_t at = cx_now_us() + (int64_t)ms * 1000;

    wake_lock_take();
    /* the earliest asked: a stream of claims never puts a refill off */
    if (kick_at == 0 || at < kick_at) {
        kick_at = at;
        pthread_cond_broadcast(&wake_cond);
    }
    pthread_mutex_unlock(&wake_lock);
}

void
cx_prestart_kick(void)
{
    cx_prestart_kick_after(0);
}

bool
cx_prestart_wait(unsigned seconds)
{
    int64_t deadline = cx_now_us() + (int64_t)seconds * 1000000;
    bool go;

    wake_lock_take();
    while (!shut) {
        /* a refill asked for later holds off the periodic one too */
        int64_t until = kick_at ? kick_at : deadline, now = cx_now_us();
        struct timespec ts;

        if (now >= until)
            break;
        if (!wake_mono) { /* on the wall clock, a second at most: a step costs one */
            clock_gettime(CLOCK_REALTIME, &ts);
            until = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 +
                    (until - now < 1000000 ? until - now : 1000000);
        }
        ts.tv_sec = until / 1000000;
        ts.tv_nsec = (long)(until % 1000000) * 1000;
        pthread_cond_timedwait(&wake_cond, &wake_lock, &ts);
    }
    kick_at = 0;
    go = !shut;
    pthread_mutex_unlock(&wake_lock);
    return go;
}

void
cx_prestart_shutdown(void)
{
    wake_lock_take();
    shut = true;
    pthread_cond_broadcast(&wake_cond);
    pthread_mutex_unlock(&wake_lock);
}

static bool
shutting_down(void)
{
    bool s;

    pthread_mutex_lock(&wake_lock);
    s = shut;
    pthread_mutex_unlock(&wake_lock);
    return s;
}

/* Deletes a pooled kernel whose row we removed (or never inserted). */
static void
discard(struct cx_ctx *cx, const char *kernel_id)
{
    cx_kernel_pool_forget(kernel_id);
    if (cx_gateway_kernel_delete(cx->gw, kernel_id))
        cx_log_warn(0, "could not delete pooled kernel %s", kernel_id);
}

/* Removes the row, then the kernel, unless a claim got there first. */
static enum cx_err
take(struct cx_ctx *cx, const char *id)
{
    const char *p[1] = {id};
    PGresult *r = NULL;
    enum cx_err rc = cx_db_exec(cx->db, &q_take, p, &r);

    if (rc == CX_OK && PQntuples(r) == 1)
        discard(cx, PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

static bool
alive(struct cx_ctx *cx, const char *kernel_id)
{
    json_t *model = NULL;
    enum cx_err rc = cx_gateway_kernel_get(cx->gw, kernel_id, &model);
    const char *state = json_string_value(json_object_get(model, "execution_state"));
    bool ok = rc == CX_OK && !(state && !strcmp(state, "dead"));

    json_decref(model);
    /* Only a definite "gone" drops it: a gateway hiccup is not one. */
    return ok || (rc != CX_OK && rc != CX_ERR_NOT_FOUND);
}

/* The language whose kernelspec is name; -1 for none the server offers. */
static int
language_of(const struct cx_config *cfg, const char *name)
{
    for (int i = 0; i < CX_LANG__COUNT; i++) {
        const char *k = cx_config_kernel_name(cfg, (enum cx_lang)i);
        if (k && !strcmp(k, name))
            return i;
    }
    return -1;
}

/* Keeps at most each language's pool size of live kernels of its
 * kernelspec (kept[lang]: how many); false on a database failure. */
static bool
prune(struct cx_ctx *cx, int kept[CX_LANG__COUNT])
{
    const char *p[1] = {cx_gateway_url(cx->gw)};
    PGresult *r = NULL;
    bool ok = true;

    memset(kept, 0, sizeof(int) * CX_LANG__COUNT);
    if (cx_db_exec(cx->db, &q_list, p, &r))
        return false;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *id = PQgetvalue(r, i, 0), *kid = PQgetvalue(r, i, 1);
        int lang = language_of(cx->cfg, PQgetvalue(r, i, 2));
        /* (one still warming under the fill lock we hold is a dead
         * process's warm-up: it goes) */
        bool keep = lang >= 0 &&
                    (unsigned)kept[lang] < cx_config_pool_size(cx->cfg, (enum cx_lang)lang) &&
                    PQgetvalue(r, i, 3)[0] == 't' && alive(cx, kid);

        if (keep) {
            kept[lang]++;
        } else if (take(cx, id)) {
            ok = false;
            break;
        }
    }
    PQclear(r);
    return ok;
}

/* The warming cell: imports kernel_preload's modules (validated by the
 * config parser as dotted identifiers, so they are safe inside a string
 * literal) into sys.modules without binding a name in the user's namespace.
 * A module that fails is skipped and the cell ends with an error, which
 * start_one logs. Without preload a cell that binds nothing either, but
 * still takes IPython's whole path (an empty one returns before it): its
 * hooks, the compile cache, the AST, the display hook (a last expression of
 * None publishes nothing). Free with free(). */
static char *
preload_cell(const char *modules)
{
    static const char fmt[] = "exec('''\n"
                              "import importlib\n"
                              "failed = 0\n"
                              "for m in \"%s\".split(\",\"):\n"
                              "    try:\n"
                              "        importlib.import_module(m)\n"
                              "    except Exception:\n"
                              "        failed += 1\n"
                              "if failed:\n"
                              "    raise ImportError(\"kernel_preload: %%d failed\" %% failed)\n"
                              "''', {})\n";
    size_t n = sizeof(fmt) + strlen(modules);
    char *code = malloc(n);

    if (code && !*modules)
        snprintf(code, n, "pass\nNone\n");
    else if (code)
        snprintf(code, n, fmt, modules);
    return code;
}

/* The warm-up of a JavaScript or R kernel's own language (the front
 * kernel's inner kernel, whose first cell pays for its own set-up): its
 * preload's modules or packages (dotted identifiers, validated by the
 * config parser) loaded, none attached or bound. Free with free(). */
static char *
inner_warm_cell(enum cx_lang lang, const char *modules)
{
    static const char r_fmt[] =
        "local({ failed <- 0L\n"
        "  for (p in strsplit(\"%s\", \",\", fixed = TRUE)[[1]])\n"
        "    if (!suppressPackageStartupMessages(requireNamespace(p, quietly = TRUE)))\n"
        "      failed <- failed + 1L\n"
        "  if (failed) stop(paste(\"kernel_preload_r:\", failed, \"failed\")) })\n";
    static const char js_fmt[] = "{ let failed = 0;\n"
                                 "  for (const m of \"%s\".split(\",\").filter(Boolean))\n"
                                 "    try { await import(\"node:\" + m); } catch { failed++; }\n"
                                 "  if (failed) throw new Error(`kernel_preload_javascript: "
                                 "${failed} failed`); }\n";
    size_t n = (lang == CX_LANG_R ? sizeof(r_fmt) : sizeof(js_fmt)) + strlen(modules);
    char *code = malloc(n);

    if (code && lang == CX_LANG_R)
        snprintf(code, n, r_fmt, modules);
    else if (code)
        snprintf(code, n, js_fmt, modules);
    return code;
}

static bool
warm_ok(const struct cx_exec *e)
{
    const char *status = json_string_value(json_object_get(e->reply, "status"));

    return status && !strcmp(status, "ok");
}

/* How long a new kernel's warm-up may take in all, its cells and
 * rehearsals (a start-up's imports): a kernel that hangs is discarded
 * after it, not after a wait per cell. */
#define WARM_US (120 * 1000000LL)

/* Sends the cells and waits for them all, until deadline (cx_now_us()). */
static enum cx_err
run_cells(struct cx_kernel_conn *c, struct cx_exec *cells, int n, int64_t deadline)
{
    enum cx_err rc = CX_OK;

    for (int i = 0; rc == CX_OK && i < n; i++)
        rc = cx_kernel_execute(c, &cells[i]);
    return rc ? rc : cx_kernel_wait(c, cells, n, n, deadline, NULL, NULL);
}

/* How many times a pooled Python kernel runs a run's own request before
 * it is ready (rehearse()). */
#define REHEARSALS 8

/* Takes the rehearsals out of a Python kernel's history again: its
 * counter back to 1, In and Out empty, no _i, _ii, _iii or _iN, the
 * history's caches empty and the rows a saving thread wrote of them gone
 * (a kernel with a history file; the sandbox's is in memory, where none is
 * written): the first run finds what a cold kernel shows it (test_pool
 * compares the two). Run silent, so that it is not in the history itself,
 * before any tenant code; the function's name and its own cell's source
 * go with it. */
static const char unrehearse_cell[] =
    "def __codexec_unrehearse(ip=get_ipython()):\n"
    "    import linecache, sys\n"
    "    hm = ip.history_manager\n"
    "    with hm.db_input_cache_lock, hm.db_output_cache_lock:\n"
    "        del hm.db_input_cache[:], hm.db_output_cache[:]\n"
    "        try:\n"
    "            with hm.db:\n"
    "                for t in ('history', 'output_history'):\n"
    "                    hm.db.execute('DELETE FROM %s WHERE session = ?' % t,\n"
    "                                  (hm.session_number,))\n"
    "        except Exception:\n"
    "            pass\n"
    "    del hm.input_hist_parsed[1:], hm.input_hist_raw[1:]\n"
    "    hm.output_hist.clear()\n"
    "    hm.output_hist_reprs.clear()\n"
    "    hm._i00 = hm._i = hm._ii = hm._iii = ''\n"
    "    for n in ['_i', '_ii', '_iii'] + ['_i%d' % k for k in range(1, ip.execution_count + 1)]:\n"
    "        ip.user_ns.pop(n, None)\n"
    "        ip.user_ns_hidden.pop(n, None)\n"
    "    ip.execution_count = 1\n"
    "    name = sys._getframe().f_code.co_filename\n"
    "    for c in (linecache.cache, getattr(linecache, '_ipython_cache', {}),\n"
    "              getattr(ip.compile, '_filename_map', {})):\n"
    "        c.pop(name, None)\n"
    "__codexec_unrehearse()\n"
    "del __codexec_unrehearse\n";

/* Runs a run's own request (a stored cell, the epilogue without its
 * sources, the capture of the empty workspace, the run's end) a few times
 * on a warmed Python kernel, then takes them out of its history
 * (unrehearse_cell): Python specialises the code it runs over its first
 * executions, and a kernel's first writes to the pages it shares with its
 * template are copy-on-write faults. Measured on a kernel warmed by one
 * cell: its first request of a run's form took 2-3 ms more than its third
 * (83, 33 and 10 page faults); after eight kept out of the history,
 * 0.5-1 ms more (19 faults), most of that its first stored cell; stored,
 * a conversation's first run took 1.0-1.7 ms less again (three rows of 16
 * to 20 new conversations in turns). Paid here, not by the conversation's
 * first run. */
static enum cx_err
rehearse(struct cx_ctx *cx, struct cx_kernel_conn *c, const char *kid, int64_t deadline)
{
    json_t *meta = cx_capture_metadata(cx->cfg, kid, NULL, false, false);
    json_t *uexpr = meta ? cx_runend_expr(kid, true, meta, false) : NULL;
    struct cx_exec e[REHEARSALS + 1];
    enum cx_err rc = uexpr ? CX_OK : CX_ERR_NOMEM;

    for (int i = 0; i < REHEARSALS; i++)
        e[i] = (struct cx_exec){.code = "pass\nNone",
                                .role = CX_EXEC_OWN,
                                .store_history = true,
                                .user_expressions = uexpr,
                                .metadata = meta,
                                .ends_run = true};
    e[REHEARSALS] = (struct cx_exec){.code = unrehearse_cell, .role = CX_EXEC_OWN, .silent = true};
    if (rc == CX_OK)
        rc = run_cells(c, e, REHEARSALS + 1, deadline);
    /* a kernel whose history could not be undone would not look cold */
    if (rc == CX_OK && !warm_ok(&e[REHEARSALS])) {
        cx_log_warn(0, "pooled kernel %s: its rehearsals could not be taken out of its history",
                    kid);
        rc = CX_ERR_GATEWAY;
    }
    for (int i = 0; rc == CX_OK && i < REHEARSALS; i++)
        if (!cx_runend_carried(&e[i])) {
            /* (the kernel is still pooled: its first run asks again) */
            cx_log_warn(0, "pooled kernel %s: a rehearsal's epilogue did not answer", kid);
            break;
        }
    cx_exec_cleanup(e, REHEARSALS + 1); /* the replies: uexpr and meta are ours */
    json_decref(uexpr);
    json_decref(meta);
    return rc;
}

/* Warms a new kernel on a connection to it: the preload and, once on the
 * empty workspace, the epilogue: it and the capture helper are compiled
 * and cached, their modules imported and the record written, as after any
 * run, so the first real run pays none of it. A JavaScript or R kernel
 * first runs a cell of its own language (its preload), then the same
 * Python cell in its front kernel. */
static enum cx_err
warm(struct cx_ctx *cx, struct cx_kernel_conn *c, const char *kid, enum cx_lang lang)
{
    json_t *meta = cx_capture_metadata(cx->cfg, kid, NULL, false, true);
    json_t *uexpr = meta ? cx_runend_expr(kid, true, meta, true) : NULL;
    bool inner = lang != CX_LANG_PYTHON;
    char *code = inner ? strdup("") : preload_cell(cx_config_preload(cx->cfg, lang));
    char *lcode = inner ? inner_warm_cell(lang, cx_config_preload(cx->cfg, lang)) : NULL;
    /* The Python cell is not silent (nor kept in the history: the count
     * stays 1): IPython's first cell that is costs ~8 ms of first-time
     * work (its publishing, hooks and lazy defaults), paid here and not by
     * the conversation's first run. */
    struct cx_exec e[2] = {{.silent = true, .code = lcode},
                           {.silent = false,
                            .code = code,
                            .role = CX_EXEC_OWN,
                            .user_expressions = uexpr,
                            .metadata = meta}};
    struct cx_exec *all = inner ? e : e + 1;
    int n = inner ? 2 : 1;
    int64_t deadline = cx_now_us() + WARM_US;
    enum cx_err rc = uexpr && meta && code && (lcode || !inner) ? CX_OK : CX_ERR_NOMEM;

    if (rc == CX_OK)
        rc = run_cells(c, all, n, deadline);
    if (rc == CX_OK && !cx_runend_carried(&e[1])) {
        /* the preload failed, and IPython skipped the expressions: the
         * epilogue and helper go in a cell of their own, so the
         * conversation's first run need not carry them (lib/runexec.c) */
        struct cx_exec x = {.silent = true,
                            .code = "",
                            .role = CX_EXEC_OWN,
                            .user_expressions = uexpr,
                            .metadata = meta};

        rc = run_cells(c, &x, 1, deadline);
        cx_exec_cleanup(&x, 1);
    }
    if (rc == CX_OK && !inner)
        rc = rehearse(cx, c, kid, deadline);
    for (int i = 0; rc == CX_OK && i < n; i++)
        if (!warm_ok(&all[i]))
            cx_log_warn(0, "%s: a module failed to import in pooled kernel %s",
                        lang == CX_LANG_PYTHON ? "kernel_preload"
                        : lang == CX_LANG_R    ? "kernel_preload_r"
                                               : "kernel_preload_javascript",
                        kid);
    cx_exec_cleanup(e, 2); /* the replies: uexpr and meta are ours */
    json_decref(uexpr);
    json_decref(meta);
    free(code);
    free(lcode);
    return rc;
}

/* Starts a kernel and waits until it has run a silent
 * cell with the preload and the capture, so that its first real run does
 * not wait for its start-up. */
static enum cx_err
start_one(struct cx_ctx *cx, enum cx_lang lang)
{
    char id[37], kid[64], msg[CX_MSG_MAX];
    const char *name = cx_config_kernel_name(cx->cfg, lang);
    const char *p[4] = {id, cx_gateway_url(cx->gw), name, kid};
    struct cx_kernel_conn *c = NULL;
    int64_t t0 = cx_now_us();
    enum cx_err rc;

    cx_uuid_generate(id);
    rc = cx_gateway_kernel_start(cx->gw, name, kid, msg, sizeof(msg));
    if (rc)
        return rc;
    /* named at once (warming): never taken for an orphan */
    rc = cx_db_exec(cx->db, &q_add, p, NULL);
    if (rc) {
        discard(cx, kid);
        return rc;
    }
    rc = cx_kernel_conn_open(cx_gateway_url(cx->gw), cx_gateway_token(cx->gw), kid, 0, &c, msg,
                             sizeof(msg));
    if (rc == CX_OK) {
        rc = warm(cx, c, kid, lang);
        /* Kept in this process's pool of connections: a first run through a
         * new connection waits for the server's set-up of it (tens of ms,
         * measured). When another process claims the kernel, this one sits
         * idle (emptied every second) until the pool's idle expiry, like the
         * connection of any session that moved to another process. */
        if (rc == CX_OK)
            cx_kernel_conn_put(c);
        else
            cx_kernel_conn_free(c);
    }
    if (rc == CX_OK)
        rc = cx_db_exec(cx->db, &q_ready, p, NULL);
    if (rc) {
        if (take(cx, id)) /* the row and the kernel */
            discard(cx, kid);
        return rc;
    }
    cx_log_info("pooled %s kernel %s ready in %lldms", cx_lang_name(lang), kid,
                (long long)(cx_now_us() - t0) / 1000);
    return CX_OK;
}

/* Whether the gateway (cx->gw, configured gateway i) has room in its
 * budget for one more (lib/budget.h). */
static bool
room_for_one(struct cx_ctx *cx, unsigned i)
{
    long used = 0;

    return cx_budget_kernels(cx, cx_gateway_url(cx->gw), &used) == CX_OK &&
           cx_budget_room(cx, i, used) > 0;
}

/* The pool of one gateway (cx->gw, configured gateway i), within its
 * budget. */
static enum cx_err
fill_gateway(struct cx_ctx *cx, unsigned i, int *started)
{
    const char *p[1] = {cx_gateway_url(cx->gw)};
    PGresult *r = NULL;
    enum cx_err rc;
    int have[CX_LANG__COUNT];
    bool got, failed[CX_LANG__COUNT] = {false};

    rc = cx_db_exec(cx->db, &q_fill_lock, p, &r);
    if (rc)
        return rc;
    got = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!got)
        return CX_OK; /* another process is refilling */
    rc = prune(cx, have) ? CX_OK : CX_ERR_DB;
    /* one kernel of each language a round, so one slow to start holds up
     * no other's pool, and one that fails to start none either */
    for (bool more = rc == CX_OK; more && !shutting_down();) {
        more = false;
        for (int l = 0; l < CX_LANG__COUNT && !shutting_down(); l++) {
            enum cx_err one;

            if (failed[l] || (unsigned)have[l] >= cx_config_pool_size(cx->cfg, (enum cx_lang)l))
                continue;
            if (!room_for_one(cx, i))
                break;
            one = start_one(cx, (enum cx_lang)l);
            if (one) {
                cx_log_warn(0, "could not start a pooled %s kernel: %s",
                            cx_lang_name((enum cx_lang)l), cx_strerror(one));
                failed[l] = true;
                rc = rc ? rc : one;
                continue;
            }
            have[l]++;
            (*started)++;
            more = true;
        }
    }
    if (cx_db_exec(cx->db, &q_fill_unlock, p, NULL))
        cx_log_warn(0, "pool advisory unlock failed; the lock ends with the connection");
    return rc;
}

enum cx_err
cx_prestart_fill(struct cx_ctx *cx, int *started)
{
    struct cx_gateway *first = cx->gw;
    enum cx_err rc = CX_OK;

    *started = 0;
    for (unsigned i = 0; i < cx->ngws; i++) {
        enum cx_err r;
        cx->gw = cx->gws[i]; /* the gateway the calls below are about */
        if (!cx_gateway_usable(cx->gw))
            continue;
        r = fill_gateway(cx, i, started);
        if (rc == CX_OK)
            rc = r;
    }
    cx->gw = first;
    return rc;
}

enum cx_err
cx_prestart_drain(struct cx_ctx *cx, int *deleted)
{
    struct cx_gateway *first = cx->gw;
    enum cx_err rc = CX_OK;

    *deleted = 0;
    for (unsigned g = 0; rc == CX_OK && g < cx->ngws; g++) {
        const char *p[1] = {cx->cfg->gateways[g].url};
        PGresult *r = NULL;

        cx->gw = cx->gws[g];
        rc = cx_db_exec(cx->db, &q_list, p, &r);
        for (int i = 0; rc == CX_OK && i < PQntuples(r); i++) {
            rc = take(cx, PQgetvalue(r, i, 0));
            if (rc == CX_OK)
                (*deleted)++;
        }
        PQclear(r);
    }
    cx->gw = first;
    return rc;
}
