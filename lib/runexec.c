#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "cancel.h"
#include "capture.h"
#include "config.h"
#include "db.h"
#include "runend.h"
#include "gateway.h"
#include "kernel.h"
#include "log.h"
#include "metrics.h"
#include "codexec.h"
#include "runexec.h"
#include "session.h"
#include "stage.h"
#include "util.h"

/* Runs main(**arguments) after a successful cell. The arguments arrive as
 * JSON data in the request's metadata, never as source; the result leaves
 * as a JSON display bundle. Runs in a private namespace: nothing of it is
 * left in the user's. */
static const char call_cell[] =
    "exec('''\n"
    "import json\n"
    "from IPython import get_ipython\n"
    "from IPython.display import display\n"
    "ip = get_ipython()\n"
    "if ip.last_execution_succeeded:\n"
    "    args = ip.kernel.get_parent(\"shell\")[\"metadata\"][\"codexec_arguments\"]\n"
    "    fn = ip.user_ns.get(\"main\")\n"
    "    if not callable(fn):\n"
    "        raise NameError(\"with arguments, the code must define a function main()\")\n"
    "    value = json.loads(json.dumps(fn(**args)))\n"
    "    display({\"application/vnd.codexec.result+json\": {\"value\": value}}, raw=True)\n"
    "''', {})\n";

#define WINDOW_US (2 * 1000000LL)
/* the most a run that lost output waits for its epilogue's reply, in steps */
#define LOST_WAIT_US (10 * 1000000LL)
#define LOST_STEP_US (100 * 1000LL)
/* How soon a cancel is seen: the longest single wait of a cancellable run. */
#define CANCEL_STEP_US (200 * 1000LL)

/* The last characters of stdout or stderr, in bounded memory. */
struct tail {
    struct cx_buf b;
    size_t keep; /* bytes to keep at least: 4 × tail_chars */
};

struct cx_runexec {
    struct cx_ctx *cx;
    struct cx_runexec_facts f;
    struct cx_kernel_conn *conn; /* borrowed while executing */
    const char *kernel_id;       /* ... and the session's kernel, */
    struct cx_gateway *gw;       /* ... on its gateway */
    struct tail out, err;
    struct cx_exec *all; /* the staging requests, then CX_REQ_MAX of the run's */
    struct cx_exec *reqs;
    size_t base; /* staging requests before reqs */
    int nreq;
    int carrier;            /* the request carrying the epilogue's expressions */
    bool taken_new;         /* output lost, the process lacked the epilogue, and its
                               own request had no answer in time: a new process */
    struct cx_capture *cap; /* NULL without capture */
    /* a streaming run's listener (run.h), NULL for none */
    const struct cx_run_sink *sink;
    struct cx_buf pend;    /* stream text not yet told, of one stream: */
    bool pend_err;         /* stderr's */
    int64_t pend_since_us; /* when it began to wait (0: nothing waits) */
    int64_t said_us;       /* when the sink last heard from us */
    bool capturing;        /* "capturing" was said */
    unsigned displays;     /* "display" events said */
    /* output "full": stdout and stderr whole (within max_output_bytes) */
    bool full;
    struct cx_buf full_out, full_err;
    json_t *results;                /* the user cell's execute_result and display_data, in order */
    const struct cx_cancel *cancel; /* NULL: not cancellable */
};

#define RESULTS_MAX     256         /* entries of "results" */
#define RESULT_TEXT_MAX (64 * 1024) /* bytes of one inline value */

static void
tail_init(struct tail *t, unsigned chars)
{
    t->keep = (size_t)chars * 4;
    cx_buf_init(&t->b, t->keep * 2 + 65536);
}

static void
tail_add(struct tail *t, const char *s, size_t n)
{
    if (n > t->keep) {
        s += n - t->keep;
        n = t->keep;
    }
    if (t->b.len + n > t->keep * 2 + 65536 - 1)
        cx_buf_keep_tail(&t->b, t->keep);
    cx_buf_add(&t->b, s, n);
}

/* The last chars code points, starting on a character boundary, as a
 * JSON string (a NUL the kernel sent is kept). */
static json_t *
tail_json(struct tail *t, unsigned chars)
{
    const char *start = t->b.data ? t->b.data : "";
    const char *p = start + t->b.len;
    unsigned count = 0;

    while (p > start && count < chars) {
        p--;
        if (((unsigned char)*p & 0xc0) != 0x80)
            count++;
    }
    while (((unsigned char)*p & 0xc0) == 0x80)
        p++; /* never start inside a character */
    return json_stringn(p, (size_t)(start + t->b.len - p));
}

/* ------------------------------------------------------------------------ */
/* A streaming run's events                                                 */

#define PEND_MAX 16384 /* stream text told at once without waiting more */

static void
tell(struct cx_runexec *st, const char *name, json_t *data)
{
    if (st->sink && !st->sink->fn(st->sink->ctx, name, data, 0))
        st->sink = NULL; /* the client is gone; the run goes on */
    st->said_us = cx_now_us();
}

void
cx_runexec_flush(struct cx_runexec *st)
{
    /* in events of PEND_MAX bytes at most, cut between characters: a
     * single huge print costs no huge event */
    for (size_t at = 0; st->sink && !cx_buf_err(&st->pend) && at < st->pend.len;) {
        size_t n = st->pend.len - at;
        json_t *d;

        if (n > PEND_MAX) {
            n = PEND_MAX;
            while (n > 1 && ((unsigned char)st->pend.data[at + n] & 0xc0) == 0x80)
                n--;
        }
        d = json_pack("{s:s%}", "text", st->pend.data + at, n);
        if (d)
            tell(st, st->pend_err ? "stderr" : "stdout", d);
        json_decref(d);
        at += n;
    }
    cx_buf_reset(&st->pend);
    cx_buf_shrink(&st->pend, 2 * PEND_MAX);
    st->pend_since_us = 0;
}

void
cx_runexec_say(struct cx_runexec *st, const char *name, json_t *data)
{
    if (st->sink) {
        cx_runexec_flush(st);
        if (!data)
            data = json_object();
        if (data)
            tell(st, name, data);
    }
    json_decref(data);
}

void
cx_runexec_status(struct cx_runexec *st, const char *state)
{
    if (st->sink)
        cx_runexec_say(st, "status", json_pack("{s:s}", "state", state));
}

/* Stream text waits up to CX_RUN_COALESCE_MS for more of the same stream:
 * one event for a burst of prints. Whole JSON strings are appended, so a
 * character is never split. True when text began to wait: the wait in
 * progress must end sooner than it planned, to tell it in time. */
static bool
pend_add(struct cx_runexec *st, bool err, const char *s, size_t n)
{
    bool began;

    if (!st->sink)
        return false;
    if (st->pend.len && st->pend_err != err)
        cx_runexec_flush(st); /* the two streams' order is kept */
    st->pend_err = err;
    began = !st->pend_since_us;
    if (began)
        st->pend_since_us = cx_now_us();
    cx_buf_add(&st->pend, s, n);
    if (st->pend.len >= PEND_MAX) {
        cx_runexec_flush(st);
        return false;
    }
    return began;
}

/* When the sink needs us next: the waiting text, else a heartbeat. */
static int64_t
sink_due(const struct cx_runexec *st)
{
    if (!st->sink)
        return INT64_MAX;
    if (st->pend_since_us)
        return st->pend_since_us + CX_RUN_COALESCE_MS * 1000LL;
    return st->said_us + CX_RUN_HEARTBEAT_MS * 1000LL;
}

static void
sink_tick(struct cx_runexec *st)
{
    if (!st->sink || cx_now_us() < sink_due(st))
        return;
    if (st->pend_since_us)
        cx_runexec_flush(st);
    else
        tell(st, NULL, NULL); /* a heartbeat */
}

void
cx_runexec_capturing(struct cx_runexec *st)
{
    if (!st->capturing) {
        st->capturing = true;
        cx_runexec_status(st, "capturing");
    }
}

static void
count_output(struct cx_runexec *st, size_t n)
{
    st->f.output_bytes += n;
    if (st->f.output_bytes <= st->cx->cfg->max_output_bytes || st->f.truncated)
        return;
    st->f.truncated = true;
    if (!st->f.interrupted) {
        st->f.interrupted = true;
        if (cx_gateway_kernel_interrupt(st->gw, st->kernel_id))
            cx_log_warn(0, "interrupt after the output limit failed");
    }
}

/* Images and other rich outputs of the user's cell become artifacts, and
 * a listener hears of each under the name it gets. */
static const char *
rich_outputs(struct cx_runexec *st, json_t *data, const char **mime_out)
{
    static const char *const binary[] = {"image/png", "image/jpeg", "image/gif", "application/pdf"};
    static const char *const text[] = {"image/svg+xml"};
    const char *mime = NULL, *path = NULL;

    for (size_t i = 0; !mime && i < sizeof(binary) / sizeof(binary[0]); i++) {
        const char *b64 = json_string_value(json_object_get(data, binary[i]));
        size_t cap, len = 0;
        unsigned char *buf;

        if (!b64)
            continue;
        mime = binary[i]; /* one artifact per output, the richest form */
        if (!st->cap)
            break;
        cap = strlen(b64) / 4 * 3 + 3;
        buf = malloc(cap);
        if (buf && sodium_base642bin(buf, cap, b64, strlen(b64), "\n\r ", &len, NULL,
                                     sodium_base64_VARIANT_ORIGINAL) == 0)
            path = cx_capture_add_output(st->cap, mime, buf, len);
        free(buf);
    }
    for (size_t i = 0; !mime && i < sizeof(text) / sizeof(text[0]); i++) {
        json_t *v = json_object_get(data, text[i]);

        if (!json_is_string(v))
            continue;
        mime = text[i];
        if (st->cap)
            path =
                cx_capture_add_output(st->cap, mime, json_string_value(v), json_string_length(v));
    }
    /* as many as can become artifacts, and none past the output limit */
    if (mime && st->sink && !st->f.truncated && st->displays < st->cx->cfg->max_captured_files) {
        st->displays++;
        cx_runexec_say(st, "display", json_pack("{s:s,s:s?}", "mime_type", mime, "path", path));
    }
    *mime_out = mime;
    return path;
}

/* The size of an inline value: a string's bytes, else its JSON's. */
static size_t
inline_size(const json_t *v)
{
    char *text;
    size_t n;

    if (json_is_string(v))
        return json_string_length(v);
    text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    n = text ? strlen(text) : RESULT_TEXT_MAX + 1;
    free(text);
    return n;
}

/* One entry of "results": the text types inline (longer ones replaced by
 * {"truncated": true}), the binary one captured (path: its artifact, named
 * once the capture is stored: cx_runexec_results). */
static void
add_result(struct cx_runexec *st, const char *type, json_t *data, const char *mime,
           const char *path)
{
    static const char *const text[] = {"text/plain", "text/html", "text/markdown",
                                       "application/json", "image/svg+xml"};
    json_t *d;

    if (st->f.truncated || !st->results || json_array_size(st->results) >= RESULTS_MAX)
        return;
    d = json_object();
    for (size_t i = 0; d && i < sizeof(text) / sizeof(text[0]); i++) {
        json_t *v = json_object_get(data, text[i]);
        size_t n;

        if (!v || (!json_is_string(v) && strcmp(text[i], "application/json") != 0))
            continue;
        n = inline_size(v);
        /* (an execute_result's text/plain is counted as the result) */
        if (strcmp(type, "execute_result") != 0 || strcmp(text[i], "text/plain") != 0)
            count_output(st, n);
        if (st->f.truncated)
            break;
        json_object_set_new(
            d, text[i], n > RESULT_TEXT_MAX ? json_pack("{s:b}", "truncated", 1) : json_incref(v));
    }
    if (d && mime && path && strcmp(mime, "image/svg+xml") != 0)
        json_object_set_new(d, mime, json_pack("{s:s}", "path", path));
    if (d && json_object_size(d) > 0)
        json_array_append_new(st->results, json_pack("{s:s,s:o}", "type", type, "data", d));
    else
        json_decref(d);
}

/* A stream's text: counted, kept in the tail, told to the sink. */
static enum cx_err
on_stream(struct cx_runexec *st, json_t *content)
{
    const char *name = json_string_value(json_object_get(content, "name"));
    json_t *text = json_object_get(content, "text");
    size_t n = json_string_length(text);
    bool err = name && !strcmp(name, "stderr");

    if (!json_is_string(text))
        return CX_OK;
    count_output(st, n);
    if (st->f.truncated)
        return CX_OK;
    tail_add(err ? &st->err : &st->out, json_string_value(text), n);
    if (st->full)
        cx_buf_add(err ? &st->full_err : &st->full_out, json_string_value(text), n);
    if (pend_add(st, err, json_string_value(text), n))
        return CX_AGAIN; /* wait_windows() ticks the sink and comes back */
    return CX_OK;
}

static void
set_result(struct cx_runexec *st, json_t *value)
{
    json_decref(st->f.result);
    st->f.result = json_incref(value);
    st->f.have_result = true;
}

/* A display or an execute result: main()'s result (the call cell's), the
 * user cell's rich outputs, and its last expression's value as text. */
static void
on_result(struct cx_runexec *st, int index, const char *type, json_t *content)
{
    json_t *data = json_object_get(content, "data");
    json_t *value =
        json_object_get(json_object_get(data, "application/vnd.codexec.result+json"), "value");
    json_t *plain;

    if (index == CX_REQ_CALL && value) {
        set_result(st, value);
        return;
    }
    const char *mime = NULL, *path = NULL;

    if (index != CX_REQ_USER)
        return;
    if (st->cap || st->sink)
        path = rich_outputs(st, data, &mime);
    plain = json_object_get(data, "text/plain");
    if (!strcmp(type, "execute_result") && json_is_string(plain)) {
        count_output(st, json_string_length(plain));
        if (!st->f.truncated)
            set_result(st, plain);
    }
    add_result(st, type, data, mime, path);
}

static enum cx_err
on_message(void *ctx, int index, const char *type, json_t *content,
           const struct cx_kernel_buffers *bufs)
{
    struct cx_runexec *st = ctx;

    if (index >= 0 && (size_t)index < st->base) {
        if (!strcmp(type, "error"))
            st->f.events |= CX_EVENT(CX_OUTCOME_STAGE_FAILED);
        return CX_OK;
    }
    if (index >= 0)
        index -= (int)st->base;
    /* Past the output limit, once every reply is in, the rest of the output
     * is of no use: stop here rather than wait for it to drain. */
    if (st->f.truncated && cx_exec_all_replied(st->reqs, CX_REQ_MAX))
        return CX_DONE;
    if (index < 0) {
        count_output(st, st->cx->cfg->max_output_bytes + 1); /* "oversized" */
        return CX_OK;
    }
    st->f.any_message = true;
    if (index == st->carrier && st->cap && !strcmp(type, "display_data")) {
        json_t *m = json_object_get(json_object_get(content, "data"), CX_CAPTURE_MIME);
        if (m) {
            cx_runexec_capturing(st); /* the user's code is done */
            cx_capture_on_message(st->cap, m, bufs->n ? bufs->data[0] : NULL,
                                  bufs->n ? bufs->len[0] : 0);
            return CX_OK;
        }
    }
    if (index == CX_REQ_EPILOGUE)
        return CX_OK;
    if (!strcmp(type, "stream"))
        return on_stream(st, content);
    if (!strcmp(type, "error")) {
        json_decref(st->f.error);
        st->f.error = json_incref(content);
    } else if (!strcmp(type, "execute_result") || !strcmp(type, "display_data")) {
        on_result(st, index, type, content);
    }
    return CX_OK;
}

/* What the gateway says of the session's kernel when a run hears nothing,
 * asked for 3 s at most: CX_ERR_NOT_FOUND when it is gone; CX_ERR_GATEWAY
 * when the gateway is going away, the call failing (not slow: a busy
 * server is still running the code) and a fresh probe too (a server that
 * refuses its port while our WebSocket stays open is: a stop closes its
 * listener first and its connections last, and one that fails in its
 * own shutdown lingers so); else CX_OK, as one failed or slow answer
 * proves nothing. */
static enum cx_err
kernel_check(struct cx_session *s)
{
    enum cx_err rc;

    cx_gateway_timeout(s->gw, 3000);
    rc = cx_gateway_kernel_get(s->gw, s->kernel_id, NULL);
    cx_gateway_timeout(s->gw, 0);
    if (rc == CX_ERR_NOT_FOUND)
        return rc;
    if (rc == CX_ERR_GATEWAY && !cx_gateway_recheck(s->gw))
        return CX_ERR_GATEWAY;
    return CX_OK;
}

/* Waits for the sent requests until deadline_us, in windows: a window with
 * no message at all asks the gateway whether the kernel still exists (our
 * pooled WebSocket outlives a kernel deleted behind our back); a silent
 * window in which every reply was already in but an idle status never came
 * means the output channel was lost. */
static enum cx_err
wait_windows(struct cx_runexec *st, struct cx_session *s, struct cx_exec *reqs, int n,
             int64_t deadline_us, bool cancellable)
{
    const struct cx_cancel *cancel = cancellable ? st->cancel : NULL;
    enum cx_err rc;
    int silent = 0;

    for (;;) {
        int64_t now = cx_now_us();
        int64_t until = now + WINDOW_US < deadline_us ? now + WINDOW_US : deadline_us;
        uint64_t before = cx_kernel_conn_reads(st->conn);
        bool replied = cx_exec_all_replied(reqs, n);

        if (now >= deadline_us)
            return CX_ERR_TIMEOUT;
        /* the window, in steps where a listener is due sooner */
        do {
            int64_t due = sink_due(st);

            if (cancel && due > cx_now_us() + CANCEL_STEP_US)
                due = cx_now_us() + CANCEL_STEP_US;
            rc = cx_kernel_wait(st->conn, reqs, n, n, due < until ? due : until, on_message, st);
            if (rc == CX_ERR_TIMEOUT || rc == CX_AGAIN)
                sink_tick(st);
            if ((rc == CX_ERR_TIMEOUT || rc == CX_AGAIN) && cx_cancel_requested(cancel)) {
                st->f.events |= CX_EVENT(CX_OUTCOME_CANCELLED);
                return CX_ERR_TIMEOUT;
            }
        } while ((rc == CX_ERR_TIMEOUT || rc == CX_AGAIN) && cx_now_us() < until);
        if (rc == CX_DONE) {
            st->f.abandoned = true; /* output left unread: do not pool */
            return CX_OK;
        }
        if (rc != CX_ERR_TIMEOUT && rc != CX_AGAIN)
            return rc;
        if (!cx_db_connection_ok(st->cx->db)) {
            /* The conversation's lock went with the connection: another run
             * may enter this kernel now. Stop rather than run unguarded. */
            cx_log_err(0, "run stopped: the conversation's lock was lost with PostgreSQL");
            return CX_ERR_DB;
        }
        silent = replied && cx_kernel_conn_reads(st->conn) == before ? silent + 1 : 0;
        /* (a reply is in: a kernel gone since is lost output, and what
         * ran is not sent again) */
        if (silent >= 2) {
            if (kernel_check(s) == CX_ERR_GATEWAY)
                return CX_ERR_GATEWAY;
            st->f.events |= CX_EVENT(CX_OUTCOME_OUTPUT_LOST);
            return CX_OK;
        }
        if (!st->f.any_message && (rc = kernel_check(s)) != CX_OK)
            return rc;
    }
}

/* Waits for the sent requests in reqs[0..n) until deadline_us; at the
 * deadline interrupts the kernel, and restarts it when it is not idle within
 * the grace period (the TIMEOUT event). */
static enum cx_err
wait_run(struct cx_runexec *st, struct cx_session *s, struct cx_exec *reqs, int n,
         int64_t deadline_us)
{
    const struct cx_config *cfg = st->cx->cfg;
    enum cx_err rc;

    rc = wait_windows(st, s, reqs, n, deadline_us, true);
    if (rc == CX_ERR_TIMEOUT) {
        bool cancelled = st->f.events & CX_EVENT(CX_OUTCOME_CANCELLED);

        if (!cancelled)
            st->f.events |= CX_EVENT(CX_OUTCOME_TIMEOUT);
        cx_log_info("run %s; interrupting", cancelled ? "cancelled" : "timed out");
        rc = cx_gateway_kernel_interrupt(s->gw, s->kernel_id);
        if (rc == CX_ERR_NOT_FOUND)
            return rc;
        if (rc)
            cx_log_warn(0, "interrupt request failed");
        rc = wait_windows(st, s, reqs, n, cx_now_us() + cfg->interrupt_grace * 1000000LL, false);
        if (rc == CX_ERR_TIMEOUT) {
            cx_log_info("kernel not idle %us after the interrupt; restarting",
                        cfg->interrupt_grace);
            rc = cx_session_restart_kernel(st->cx, s);
            if (rc == CX_ERR_NOT_FOUND)
                return rc;
            if (rc)
                cx_log_warn(0, "kernel restart failed");
            rc = CX_OK;
        }
    }
    return rc;
}

/* A request's metadata for the epilogue: the capture's parameters and,
 * with_source, the epilogue's and the helper's sources. */
static enum cx_err
build_metadata(struct cx_runexec *st, struct cx_session *s, const struct cx_run_request *req,
               json_t *meta, bool with_source)
{
    json_t *cap = NULL;
    enum cx_err rc = CX_ERR_NOMEM;

    if (with_source && !cx_runend_add_source(meta))
        return CX_ERR_NOMEM;
    if (!st->cap)
        return CX_OK;
    cap = cx_capture_metadata(st->cx->cfg, s->kernel_id, req->outputs, s->capture_rescan,
                              with_source);
    if (cap && !json_object_update(meta, cap))
        rc = CX_OK;
    json_decref(cap);
    return rc;
}

/* The metadata of the requests that may end the run: the one the epilogue
 * rides on (meta) and the epilogue's own (epimeta). */
static enum cx_err
run_metadata(struct cx_runexec *st, struct cx_session *s, const struct cx_run_request *req,
             json_t *meta, json_t *epimeta)
{
    /* The epilogue's and the helper's sources travel only to a kernel
     * codexec just started (12 KB of JSON each server and kernel would
     * parse on every run) and, in the epilogue's own request, to one that
     * says it needs them (restarted behind our back, or codexec upgraded).
     * A pooled kernel had them in its warm cell. */
    if (build_metadata(st, s, req, meta, s->kernel_fresh && !s->from_pool) ||
        build_metadata(st, s, req, epimeta, true))
        return CX_ERR_NOMEM;
    return CX_OK;
}

/* Sends the pipelined requests (the user's cell, then main() when there are
 * arguments) and waits for them, applying the timeout and its grace period.
 * The epilogue (the restart check and the capture) rides on the last one as
 * user expressions, so a run is one execute, like a raw client's. When that
 * cell fails the kernel skips its expressions, and a kernel that lost the
 * epilogue (restarted behind our back) answers that it needs its source;
 * then a separate silent request carries them, with the sources: one more
 * round trip, for those runs only. */
/* The run's requests: the user's cell, the main() call, and the epilogue,
 * whose expressions (uexpr) ride on last, the run's last cell; the
 * epilogue's own request, with its sources (epimeta), has its own
 * (epiexpr). */
static void
prepare_requests(struct cx_runexec *st, const struct cx_run_request *req, int last, json_t *uexpr,
                 json_t *meta, json_t *epiexpr, json_t *epimeta)
{
    struct cx_exec *reqs = st->reqs;

    memset(st->all, 0, sizeof(*st->all) * (st->base + CX_REQ_MAX));
    st->taken_new = false;
    reqs[CX_REQ_USER] = (struct cx_exec){.code = req->code, .store_history = true};
    reqs[CX_REQ_CALL] = (struct cx_exec){.code = call_cell, .role = CX_EXEC_CALL};
    reqs[last].user_expressions = uexpr;
    reqs[last].metadata = meta;
    /* the requests that may end the run: their replies pass once the
     * sandbox's other processes are ended, from outside the kernel */
    reqs[last].ends_run = true;
    reqs[CX_REQ_EPILOGUE] = (struct cx_exec){.code = "",
                                             .role = CX_EXEC_OWN,
                                             .silent = true,
                                             .user_expressions = epiexpr,
                                             .metadata = epimeta,
                                             .ends_run = true};
    st->carrier = last;
}

/* Sends the inputs' staging requests and the run's cells up to last. */
static enum cx_err
send_run(struct cx_runexec *st, struct cx_session *s, const struct cx_inputs *in, int last,
         int64_t deadline, char *msg, size_t msglen)
{
    enum cx_err rc;

    /* A kernel codexec (or the gateway, after a death) just started: its
     * output channel may not be live on this connection (a pooled one
     * heard the old process), and output sent before it is would be lost. */
    rc = cx_session_confirm(s, st->conn, deadline);
    /* A kernel that vanished, or that the server gave up on (its
     * restarter stops after five quick deaths), before anything of this
     * run was sent: not this run's death, but a new kernel and the run
     * once more. (A notice that it is restarting the kernel is waited out:
     * the new process keeps the sandbox and its workspace.) */
    if (rc == CX_ERR_NOT_FOUND || rc == CX_ERR_IO)
        return rc;
    if (rc)
        cx_log_warn(0, "kernel %s: output channel not confirmed live", s->kernel_id);
    /* (the confirmation read what an earlier run or other clients left: a
     * restart notice, say, is not taken for this run's news) */
    rc = cx_stage_send(st->cx, st->conn, in, st->all);
    if (rc == CX_ERR_IO || rc == CX_ERR_NOT_FOUND) {
        snprintf(msg, msglen, "an input could not be read from storage");
        return CX_ERR_IO;
    }
    for (int i = CX_REQ_USER; i <= last && rc == CX_OK; i++)
        rc = cx_kernel_execute(st->conn, &st->reqs[i]);
    if (rc)
        snprintf(msg, msglen, "sending to the kernel failed");
    return rc;
}

/* After output was lost (most often a process that took the run before
 * the server's output channel joined it: restarted behind our back), the
 * epilogue sent on its own still tells whether the process is a new one,
 * which the run must say (found: such a run said reset false). Its reply
 * is waited for, not its idle status (the channel may still be lost), for
 * LOST_WAIT_US at most, never interrupting. Without it, the process is
 * taken for a new one when the run's last cell found it without the
 * epilogue (lacked): this request, run later, would make the next run's
 * epilogue call the process known. The answer stays OutputLost but for a
 * kernel's death (KernelDied, reset). (The conversation's lock is not
 * asked for: the run's cells are done, and an interrupt now could only
 * reach this request or the run of whoever took the lock.) */
static enum cx_err
wait_lost_epilogue(struct cx_runexec *st, int n, int64_t deadline, bool lacked)
{
    const struct cx_exec *epi = &st->reqs[CX_REQ_EPILOGUE];
    enum cx_err rc = CX_ERR_TIMEOUT;

    if (deadline > cx_now_us() + LOST_WAIT_US)
        deadline = cx_now_us() + LOST_WAIT_US;
    while (!epi->got_reply && (rc == CX_ERR_TIMEOUT || rc == CX_AGAIN) && cx_now_us() < deadline) {
        int64_t step = cx_now_us() + LOST_STEP_US;

        rc = cx_kernel_wait(st->conn, st->all, n, n, step < deadline ? step : deadline, on_message,
                            st);
        sink_tick(st);
    }
    if (rc == CX_DONE)
        st->f.abandoned = true; /* output left unread (the connection is dropped anyway) */
    st->taken_new = !epi->got_reply && lacked;
    return rc == CX_ERR_KERNEL_DIED ? rc : CX_OK;
}

/* Waits for the run; then, when its last cell did not carry the epilogue
 * (it failed, or the kernel needs the sources), sends the epilogue on its
 * own and waits for it. */
static enum cx_err
wait_all(struct cx_runexec *st, struct cx_session *s, int64_t deadline, char *msg, size_t msglen)
{
    int n = (int)st->base + CX_REQ_MAX;
    enum cx_err rc;
    bool lost, lacked;

    cx_metrics_count(CX_COUNT_GATEWAY_BATCHES); /* the run's one round trip */
    rc = wait_run(st, s, st->all, n, deadline);
    /* A request a new process took before the server's output channel
     * joined it (one restarted behind our back, or at a notice: lib/kernel.c,
     * dispatch): what it sent before its busy status reached us is lost,
     * though its idle status came. (Found: a run sent as a restart behind
     * our back began said ok, its printed line lost; only requests queued
     * at a notice were checked.) A run past max_output_bytes says so
     * instead. */
    for (int i = 0; i < n && rc == CX_OK && !st->f.truncated; i++)
        if (st->all[i].got_idle && !st->all[i].got_busy)
            st->f.events |= CX_EVENT(CX_OUTCOME_OUTPUT_LOST);
    lost = st->f.events & CX_EVENT(CX_OUTCOME_OUTPUT_LOST);
    if (rc || (st->f.events & CX_EVENTS_STOPPED) || cx_runend_carried(&st->reqs[st->carrier]))
        return rc;
    lacked = cx_runend_lacks_epilogue(&st->reqs[st->carrier]);
    st->carrier = CX_REQ_EPILOGUE;
    rc = cx_kernel_execute(st->conn, &st->reqs[CX_REQ_EPILOGUE]);
    if (rc) {
        snprintf(msg, msglen, "sending to the kernel failed");
        return rc;
    }
    cx_metrics_count(CX_COUNT_GATEWAY_BATCHES);
    return lost ? wait_lost_epilogue(st, n, deadline, lacked)
                : wait_run(st, s, st->all, n, deadline);
}

/* Sends the pipelined requests (the user's cell, then main() when there are
 * arguments) and waits for them, applying the timeout and its grace period.
 * The epilogue (the restart check and the capture) rides on the last one as
 * user expressions, so a run is one execute, like a raw client's. When that
 * cell fails the kernel skips its expressions, and a kernel that lost the
 * epilogue (restarted behind our back) answers that it needs its source;
 * then a separate silent request carries them, with the sources: one more
 * round trip, for those runs only. */
enum cx_err
cx_runexec_execute(struct cx_runexec *st, struct cx_kernel_conn *conn, struct cx_session *s,
                   const struct cx_run_request *req, const struct cx_inputs *in, char *msg,
                   size_t msglen)
{
    int last = req->arguments ? CX_REQ_CALL : CX_REQ_USER;
    int64_t deadline = cx_now_us() + (int64_t)(req->timeout * 1e6);
    json_t *uexpr = NULL, *epiexpr = NULL, *meta = json_object(), *epimeta = json_object();
    enum cx_err rc = CX_ERR_NOMEM;

    st->conn = conn;
    st->kernel_id = s->kernel_id;
    st->gw = s->gw;
    if (!meta || !epimeta || run_metadata(st, s, req, meta, epimeta))
        goto out;
    /* (the sources are in the metadata already, when they go) */
    uexpr = cx_runend_expr(s->kernel_id, st->cap != NULL, meta, false);
    epiexpr = cx_runend_expr(s->kernel_id, st->cap != NULL, epimeta, false);
    if (!uexpr || !epiexpr ||
        (req->arguments && json_object_set(meta, "codexec_arguments", req->arguments)))
        goto out;
    prepare_requests(st, req, last, uexpr, meta, epiexpr, epimeta);
    rc = send_run(st, s, in, last, deadline, msg, msglen);
    if (rc == CX_OK)
        rc = wait_all(st, s, deadline, msg, msglen);
    if (rc == CX_OK && st->cap && cx_runend_carried(&st->reqs[st->carrier])) {
        json_t *answer = cx_runend_answer(&st->reqs[st->carrier]);
        cx_capture_on_result(st->cap, json_object_get(answer, "done"));
        json_decref(answer);
    }
out:
    /* the requests borrowed these until now */
    for (int i = 0; i < CX_REQ_MAX; i++)
        st->reqs[i].user_expressions = st->reqs[i].metadata = NULL;
    json_decref(uexpr);
    json_decref(epiexpr);
    json_decref(meta);
    json_decref(epimeta);
    st->conn = NULL;
    return rc;
}

enum cx_err
cx_runexec_new(struct cx_ctx *cx, const struct cx_inputs *in, bool capture, bool full,
               const struct cx_run_sink *sink, struct cx_runexec **out)
{
    struct cx_runexec *st = calloc(1, sizeof(*st));

    *out = st;
    if (!st)
        return CX_ERR_NOMEM;
    st->cx = cx;
    st->sink = sink;
    st->base = cx_stage_requests(in);
    st->nreq = (int)st->base + CX_REQ_MAX;
    tail_init(&st->out, cx->cfg->tail_chars);
    tail_init(&st->err, cx->cfg->tail_chars);
    /* counted output only, told in PEND_MAX pieces */
    cx_buf_init(&st->pend, (size_t)cx->cfg->max_output_bytes + PEND_MAX);
    st->full = full;
    cx_buf_init(&st->full_out, full ? (size_t)cx->cfg->max_output_bytes + 1 : 1);
    cx_buf_init(&st->full_err, full ? (size_t)cx->cfg->max_output_bytes + 1 : 1);
    st->results = json_array();
    st->all = calloc((size_t)st->nreq, sizeof(*st->all));
    if (!st->all)
        return CX_ERR_NOMEM;
    st->reqs = st->all + st->base;
    if (capture && cx_capture_new(cx->cfg, cx->store, &st->cap))
        return CX_ERR_NOMEM;
    return CX_OK;
}

void
cx_runexec_cancel_by(struct cx_runexec *st, const struct cx_cancel *c)
{
    st->cancel = c;
}

void
cx_runexec_free(struct cx_runexec *st)
{
    if (!st)
        return;
    if (st->all)
        cx_exec_cleanup(st->all, st->nreq);
    free(st->all);
    cx_capture_free(st->cap);
    json_decref(st->f.error);
    json_decref(st->f.result);
    cx_buf_cleanup(&st->out.b);
    cx_buf_cleanup(&st->err.b);
    cx_buf_cleanup(&st->pend);
    cx_buf_cleanup(&st->full_out);
    cx_buf_cleanup(&st->full_err);
    json_decref(st->results);
    free(st);
}

const struct cx_runexec_facts *
cx_runexec_facts(const struct cx_runexec *st)
{
    static const struct cx_runexec_facts none;

    return st ? &st->f : &none;
}

struct cx_capture *
cx_runexec_capture(const struct cx_runexec *st)
{
    return st->cap;
}

json_t *
cx_runexec_stdout(struct cx_runexec *st)
{
    return tail_json(&st->out, st->cx->cfg->tail_chars);
}

json_t *
cx_runexec_stderr(struct cx_runexec *st)
{
    return st->err.b.len ? tail_json(&st->err, st->cx->cfg->tail_chars) : NULL;
}

json_t *
cx_runexec_full(struct cx_runexec *st, bool err)
{
    struct cx_buf *b = err ? &st->full_err : &st->full_out;

    if (!st->full)
        return NULL;
    return json_stringn(b->len ? b->data : "", b->len);
}

/* A captured output's placeholder {"path"} as its artifact's id and
 * version, found in artifacts (the run's entries); dropped when it was
 * not stored. */
static void
name_artifacts(json_t *data, const json_t *artifacts)
{
    const char *mime;
    json_t *v, *tmp;

    json_object_foreach_safe(data, tmp, mime, v)
    {
        const char *path = json_string_value(json_object_get(v, "path"));
        json_t *named = NULL;

        if (!path)
            continue;
        for (size_t i = 0; !named && i < json_array_size(artifacts); i++) {
            json_t *a = json_array_get(artifacts, i);
            const char *p = json_string_value(json_object_get(a, "path"));
            if (p && !strcmp(p, path))
                named = json_pack("{s:O,s:O}", "artifact_id", json_object_get(a, "artifact_id"),
                                  "version", json_object_get(a, "version"));
        }
        if (named)
            json_object_set_new(data, mime, named);
        else
            json_object_del(data, mime);
    }
}

json_t *
cx_runexec_results(struct cx_runexec *st, const json_t *artifacts)
{
    json_t *out = json_deep_copy(st->results);

    for (size_t i = 0; out && i < json_array_size(out); i++)
        name_artifacts(json_object_get(json_array_get(out, i), "data"), artifacts);
    return out ? out : json_array();
}

void
cx_runexec_retry(struct cx_runexec *st)
{
    cx_exec_cleanup(st->all, st->nreq);
}

void
cx_runexec_conclude(struct cx_runexec *st)
{
    for (int i = CX_REQ_USER; i <= CX_REQ_CALL && !st->f.error; i++) {
        const char *rs = json_string_value(json_object_get(st->reqs[i].reply, "status"));
        if (rs && !strcmp(rs, "error"))
            st->f.error = json_incref(st->reqs[i].reply);
    }
    if (st->f.interrupted && st->f.error)
        st->f.events |= CX_EVENT(CX_OUTCOME_OUTPUT_LIMIT);
}

void
cx_runexec_note(struct cx_runexec *st, enum cx_outcome o)
{
    st->f.events |= CX_EVENT(o);
}

bool
cx_runexec_says_fresh(const struct cx_runexec *st)
{
    const struct cx_exec *carrier = &st->reqs[st->carrier];

    return st->taken_new || (cx_runend_carried(carrier) && cx_runend_says_fresh(carrier));
}

enum cx_outcome
cx_runexec_outcome(const struct cx_runexec *st)
{
    enum cx_outcome o = CX_OUTCOME_OK;

    for (int i = CX_OUTCOME_OK; i <= CX_OUTCOME_CANCELLED; i++)
        if (st->f.events & CX_EVENT(i))
            o = (enum cx_outcome)i; /* the most serious one */
    return o;
}
