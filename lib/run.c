#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <sodium.h>

#include "artifact.h"
#include "auth.h"
#include "capture.h"
#include "buf.h"
#include "config.h"
#include "ctx.h"
#include "db.h"
#include "gateway.h"
#include "http.h"
#include "kernel.h"
#include "log.h"
#include "metrics.h"
#include "run.h"
#include "session.h"
#include "storage.h"
#include "util.h"

#define MAX_OUTPUT_GLOBS 64
#define MAX_GLOB_BYTES   1024

bool
cx_run_conversation_id_valid(const char *s)
{
    size_t n = 0;

    if (!s)
        return false;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return false;
        if (n >= CX_CONVERSATION_MAX)
            return false;
    }
    return n >= 1;
}

static bool
blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' && s[i] != '\f' &&
            s[i] != '\v')
            return false;
    return true;
}

static const char *const known_fields[] = {"conversation_id",   "code",    "inputs", "outputs",
                                           "capture_artifacts", "timeout", "ttl",    "arguments"};

enum cx_err
cx_run_request_parse(const struct cx_config *cfg, json_t *body, struct cx_run_request *req,
                     char *msg, size_t msglen)
{
    const char *key;
    json_t *v, *e;
    size_t i;

    memset(req, 0, sizeof(*req));
    json_object_foreach(body, key, v)
    {
        for (i = 0; i < sizeof(known_fields) / sizeof(known_fields[0]); i++)
            if (strcmp(key, known_fields[i]) == 0)
                break;
        if (i == sizeof(known_fields) / sizeof(known_fields[0])) {
            snprintf(msg, msglen, "unknown field in the request body");
            return CX_ERR_INVALID;
        }
    }

    v = json_object_get(body, "conversation_id");
    if (!json_is_string(v) || !cx_run_conversation_id_valid(json_string_value(v))) {
        snprintf(msg, msglen, "conversation_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -");
        return CX_ERR_INVALID;
    }
    snprintf(req->conversation_id, sizeof(req->conversation_id), "%s", json_string_value(v));

    v = json_object_get(body, "code");
    if (!json_is_string(v)) {
        snprintf(msg, msglen, "code is required and must be a string");
        return CX_ERR_INVALID;
    }
    req->code = json_string_value(v);
    req->code_len = json_string_length(v);
    if (req->code_len > cfg->max_code_bytes) {
        snprintf(msg, msglen, "code exceeds max_code_bytes (%llu bytes)",
                 (unsigned long long)cfg->max_code_bytes);
        return CX_ERR_TOO_LARGE;
    }
    if (blank(req->code, req->code_len)) {
        snprintf(msg, msglen, "code must not be blank");
        return CX_ERR_INVALID;
    }

    v = json_object_get(body, "inputs");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v)) {
            snprintf(msg, msglen, "inputs must be an array of artifact ids");
            return CX_ERR_INVALID;
        }
        if (json_array_size(v) > cfg->max_inputs) {
            snprintf(msg, msglen, "inputs holds more than %u artifact ids", cfg->max_inputs);
            return CX_ERR_INVALID;
        }
        json_array_foreach(v, i, e)
        {
            if (!json_is_string(e) || !cx_uuid_valid(json_string_value(e))) {
                snprintf(msg, msglen, "inputs[%zu] is not an artifact id", i);
                return CX_ERR_INVALID;
            }
            for (size_t k = 0; k < i; k++)
                if (strcasecmp(json_string_value(json_array_get(v, k)), json_string_value(e)) ==
                    0) {
                    snprintf(msg, msglen, "inputs[%zu] repeats inputs[%zu]", i, k);
                    return CX_ERR_INVALID;
                }
        }
        req->inputs = v;
    }

    v = json_object_get(body, "outputs");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v) || json_array_size(v) > MAX_OUTPUT_GLOBS) {
            snprintf(msg, msglen, "outputs must be an array of at most %d globs", MAX_OUTPUT_GLOBS);
            return CX_ERR_INVALID;
        }
        json_array_foreach(v, i, e)
        {
            if (!json_is_string(e) || json_string_length(e) == 0 ||
                json_string_length(e) > MAX_GLOB_BYTES) {
                snprintf(msg, msglen, "outputs[%zu] must be a non-empty string of at most %d bytes",
                         i, MAX_GLOB_BYTES);
                return CX_ERR_INVALID;
            }
        }
        req->outputs = v;
    }

    req->capture_artifacts = true;
    v = json_object_get(body, "capture_artifacts");
    if (v) {
        if (!json_is_boolean(v)) {
            snprintf(msg, msglen, "capture_artifacts must be true or false");
            return CX_ERR_INVALID;
        }
        req->capture_artifacts = json_is_true(v);
    }

    req->timeout = cfg->default_timeout;
    v = json_object_get(body, "timeout");
    if (v && !json_is_null(v)) {
        double t;
        if (!json_is_number(v) || !isfinite(t = json_number_value(v)) || t <= 0) {
            snprintf(msg, msglen, "timeout must be a positive number of seconds");
            return CX_ERR_INVALID;
        }
        req->timeout = t > cfg->max_timeout ? cfg->max_timeout : t;
    }

    req->ttl = cfg->default_ttl;
    v = json_object_get(body, "ttl");
    if (v && !json_is_null(v)) {
        json_int_t t;
        if (!json_is_integer(v)) {
            snprintf(msg, msglen, "ttl must be an integer number of seconds");
            return CX_ERR_INVALID;
        }
        t = json_integer_value(v);
        req->ttl = t < 1 ? 1 : t > (json_int_t)cfg->max_ttl ? cfg->max_ttl : (unsigned)t;
    }

    v = json_object_get(body, "arguments");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) {
            snprintf(msg, msglen, "arguments must be a JSON object");
            return CX_ERR_INVALID;
        }
        json_object_foreach(v, key, e)
        {
            /* Names become Python keyword arguments. */
            size_t n = strlen(key);
            bool ok = n > 0 && n <= 128 && !(key[0] >= '0' && key[0] <= '9');
            for (size_t k = 0; ok && k < n; k++)
                ok = (key[k] >= 'A' && key[k] <= 'Z') || (key[k] >= 'a' && key[k] <= 'z') ||
                     (key[k] >= '0' && key[k] <= '9') || key[k] == '_';
            if (!ok) {
                snprintf(msg, msglen,
                         "arguments keys must be identifiers ([A-Za-z_][A-Za-z0-9_]*)");
                return CX_ERR_INVALID;
            }
        }
        req->arguments = v;
    }
    req->root = json_incref(body);
    return CX_OK;
}

void
cx_run_request_cleanup(struct cx_run_request *req)
{
    if (!req)
        return;
    json_decref(req->root);
    memset(req, 0, sizeof(*req));
}

CX_SQL(q_run_get, 2,
       "SELECT id, conversation_id, status, code_length, code_sha256, error_name, truncated,"
       " session_reset,"
       " to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
       " to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
       " to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
       " execution_ms"
       " FROM runs WHERE id = $1::uuid AND user_id = $2");

static json_t *
text_or_null(PGresult *r, int col)
{
    return PQgetisnull(r, 0, col) ? json_null() : json_string(PQgetvalue(r, 0, col));
}

enum cx_err
cx_run_get(struct cx_db *db, const char *user, const char *run_id, json_t **out)
{
    const char *params[2] = {run_id, user};
    PGresult *r = NULL;
    enum cx_err rc;

    if (!cx_uuid_valid(run_id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_exec(db, &q_run_get, params, &r);
    if (rc)
        return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return CX_ERR_NOT_FOUND;
    }
    *out = json_pack(
        "{s:s,s:s,s:s,s:I,s:s,s:o,s:b,s:b,s:o,s:o,s:o,s:o}", "run_id", PQgetvalue(r, 0, 0),
        "conversation_id", PQgetvalue(r, 0, 1), "status", PQgetvalue(r, 0, 2), "code_length",
        (json_int_t)strtoll(PQgetvalue(r, 0, 3), NULL, 10), "code_sha256", PQgetvalue(r, 0, 4),
        "error_name", text_or_null(r, 5), "truncated", PQgetvalue(r, 0, 6)[0] == 't',
        "session_reset", PQgetvalue(r, 0, 7)[0] == 't', "created_at", text_or_null(r, 8),
        "started_at", text_or_null(r, 9), "finished_at", text_or_null(r, 10), "execution_ms",
        PQgetisnull(r, 0, 11) ? json_null()
                              : json_integer(strtoll(PQgetvalue(r, 0, 11), NULL, 10)));
    PQclear(r);
    return *out ? CX_OK : CX_ERR_NOMEM;
}

/* ------------------------------------------------------------------------ */
/* Executing a run                                                           */

/* Evaluated by the epilogue: "True" when this kernel process has run for
 * codexec before (the token is set), else it sets the token. A kernel that
 * answers otherwise was started or restarted since. */
#define TOKEN_CHECK_FMT                                                                            \
    "(lambda s, t: getattr(s, '_codexec_kernel', None) == t or "                                   \
    "setattr(s, '_codexec_kernel', t))(__import__('sys'), '%s')"

/* Evaluated by the epilogue before the capture: every process of the
 * sandbox but its init (pid 1) and the kernel ends with the run, so a fork
 * bomb, a runaway child or a writer that outlives its cell holds nothing
 * (pids, memory, CPU, files being written) past the run. The kernel's own
 * children are reaped, within 200 ms. Only inside codexec's sandbox (its
 * launcher's CODEXEC_SANDBOX, and the kernel a child of the sandbox's own
 * pid 1): a kernel started without the sandbox shares the host's
 * processes. Defined once per kernel process. */
#define REAP_EXPR                                                                                  \
    "(lambda s: s.__dict__.get('_codexec_reap') or (exec('"                                        \
    "def _codexec_reap():\\n"                                                                      \
    " import os, time\\n"                                                                          \
    " me, mine = os.getpid(), []\\n"                                                               \
    " if os.environ.get(\"CODEXEC_SANDBOX\") != \"1\" or os.getppid() != 1: return\\n"             \
    " for d in os.listdir(\"/proc\"):\\n"                                                          \
    "  if d.isdigit() and int(d) not in (1, me):\\n"                                               \
    "   try:\\n"                                                                                   \
    "    child = open(f\"/proc/{d}/stat\").read().rsplit(\")\", 1)[1].split()[1] == str(me)\\n"    \
    "    os.kill(int(d), 9)\\n"                                                                    \
    "    if child: mine.append(int(d))\\n"                                                         \
    "   except (OSError, IndexError):\\n"                                                          \
    "    pass\\n"                                                                                  \
    " end = time.monotonic() + 0.2\\n"                                                             \
    " while mine and time.monotonic() < end:\\n"                                                   \
    "  for p in list(mine):\\n"                                                                    \
    "   try:\\n"                                                                                   \
    "    if os.waitpid(p, os.WNOHANG)[0]: mine.remove(p)\\n"                                       \
    "   except ChildProcessError:\\n"                                                              \
    "    mine.remove(p)\\n"                                                                        \
    "  time.sleep(0.002)\\n"                                                                       \
    "', s.__dict__) or s._codexec_reap))(__import__('sys'))()"

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

/* The pipelined requests of a run, in the order the kernel runs them. */
enum { REQ_USER, REQ_CALL, REQ_EPILOGUE, REQ_MAX };

#define WINDOW_US (2 * 1000000LL)

struct tail {
    struct cx_buf b;
    size_t keep; /* bytes to keep at least: 4 × tail_chars */
};

struct exec_state {
    struct cx_ctx *cx;
    struct cx_kernel_conn *conn;
    const char *kernel_id;
    struct tail out, err;
    uint64_t output_bytes;
    bool truncated;
    bool interrupted_for_output;
    bool timed_out;
    bool died;
    json_t *error;  /* {"ename","evalue","traceback"} of the user or call cell */
    json_t *result; /* JSON value */
    bool have_result;
    bool any_message;       /* a message for one of the requests arrived */
    struct cx_exec *reqs;   /* the run's requests, REQ_MAX of them */
    bool output_lost;       /* replies came, idle statuses did not */
    bool abandoned;         /* stopped reading mid-output */
    struct cx_capture *cap; /* NULL when capture_artifacts is false */
    int carrier;            /* the request carrying the epilogue's expressions */
    size_t base;            /* input-staging requests before reqs[0] */
    bool stage_failed;
};

/* Writes one chunk of a staged input; the path and bytes come as JSON data
 * in the metadata. Private namespace; the file is never followed if it is a
 * symlink. */
static const char stage_cell[] =
    "exec('''\n"
    "import base64, os\n"
    "ip = __import__(\"IPython\").get_ipython()\n"
    "m = ip.kernel.get_parent(\"shell\")[\"metadata\"][\"codexec_input\"]\n"
    "p = os.path.join(ip.starting_dir, m[\"path\"])\n"
    "os.makedirs(os.path.dirname(p), exist_ok=True)\n"
    "flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if m[\"first\"] else "
    "os.O_APPEND)\n"
    "with os.fdopen(os.open(p, flags, 0o644), \"wb\") as f:\n"
    "    f.write(base64.b64decode(m[\"data\"]))\n"
    "''', {})\n";

#define STAGE_CHUNK (1u << 20)

struct input {
    char key[1024];
    char path[300]; /* inputs/<safe name> */
    uint64_t size;
};

struct inputs {
    struct input *v;
    size_t n;
};

CX_SQL(q_input, 3,
       "SELECT v.filename, v.storage_key, v.size FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.id = $1::uuid AND a.user_id = $2 AND a.conversation_id = $3"
       " AND a.deleted_at IS NULL");

/* Looks up every input: CX_ERR_NOT_FOUND (msg names it) for one that is not
 * the user's in this conversation. Names are made clash-free: seed.csv, then
 * seed-2.csv. Free in->v on any return. */
static enum cx_err
load_inputs(struct cx_ctx *cx, const char *user, const struct cx_run_request *req,
            struct inputs *in, char *msg, size_t msglen)
{
    size_t n = req->inputs ? json_array_size(req->inputs) : 0;

    in->v = NULL;
    in->n = 0;
    if (n == 0)
        return CX_OK;
    in->v = calloc(n, sizeof(*in->v));
    if (!in->v)
        return CX_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *id = json_string_value(json_array_get(req->inputs, i));
        const char *p[3] = {id, user, req->conversation_id};
        struct input *x = &in->v[i];
        PGresult *r = NULL;
        enum cx_err rc = cx_db_exec(cx->db, &q_input, p, &r);
        const char *name, *dot;

        if (rc)
            return rc;
        if (PQntuples(r) != 1) {
            PQclear(r);
            snprintf(msg, msglen, "input artifact %s not found in this conversation", id);
            return CX_ERR_NOT_FOUND;
        }
        snprintf(x->key, sizeof(x->key), "%s", PQgetvalue(r, 0, 1));
        x->size = strtoull(PQgetvalue(r, 0, 2), NULL, 10);
        name = PQgetvalue(r, 0, 0);
        dot = strrchr(name, '.');
        if (!dot || dot == name)
            dot = name + strlen(name);
        for (int k = 1;; k++) {
            bool clash = false;
            if (k == 1)
                snprintf(x->path, sizeof(x->path), "inputs/%s", name);
            else
                snprintf(x->path, sizeof(x->path), "inputs/%.*s-%d%s", (int)(dot - name), name, k,
                         dot);
            for (size_t j = 0; j < i; j++)
                clash = clash || !strcmp(in->v[j].path, x->path);
            if (!clash)
                break;
        }
        PQclear(r);
        in->n++;
    }
    return CX_OK;
}

static size_t
stage_requests(const struct inputs *in)
{
    size_t n = 0;

    for (size_t i = 0; i < in->n; i++)
        n += in->v[i].size ? (in->v[i].size + STAGE_CHUNK - 1) / STAGE_CHUNK : 1;
    return n;
}

/* Sends every input as pipelined chunk requests, straight from storage: one
 * chunk in memory at a time. stage has stage_requests(in) slots. */
static enum cx_err
send_inputs(struct exec_state *st, const struct inputs *in, struct cx_exec *stage)
{
    size_t b64len = sodium_base64_ENCODED_LEN(STAGE_CHUNK, sodium_base64_VARIANT_ORIGINAL);
    unsigned char *buf = malloc(STAGE_CHUNK);
    char *b64 = malloc(b64len);
    enum cx_err rc = buf && b64 ? CX_OK : CX_ERR_NOMEM;
    size_t k = 0;

    for (size_t i = 0; i < in->n && rc == CX_OK; i++) {
        char path[4096];
        uint64_t left = in->v[i].size;
        FILE *f = NULL;
        bool first = true;

        rc = cx_storage_path(st->cx->cfg->storage_dir, in->v[i].key, path, sizeof(path));
        if (rc == CX_OK && !(f = fopen(path, "rbe")))
            rc = CX_ERR_IO;
        while (rc == CX_OK && (first || left > 0)) {
            size_t want = left < STAGE_CHUNK ? (size_t)left : STAGE_CHUNK;
            json_t *meta;

            if (want && fread(buf, 1, want, f) != want) {
                rc = CX_ERR_IO;
                break;
            }
            sodium_bin2base64(b64, b64len, buf, want, sodium_base64_VARIANT_ORIGINAL);
            meta = json_pack("{s:{s:s,s:b,s:s}}", "codexec_input", "path", in->v[i].path, "first",
                             first, "data", b64);
            stage[k] = (struct cx_exec){
                .code = stage_cell, .silent = true, .stop_on_error = true, .metadata = meta};
            rc = meta ? cx_kernel_execute(st->conn, &stage[k]) : CX_ERR_NOMEM;
            stage[k].metadata = NULL;
            json_decref(meta);
            k++;
            left -= want;
            first = false;
        }
        if (f)
            fclose(f);
    }
    free(buf);
    free(b64);
    return rc;
}

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
    if (t->b.len + n > t->keep * 2 + 65536 - 1) {
        size_t drop = t->b.len - t->keep;
        memmove(t->b.data, t->b.data + drop, t->b.len - drop);
        t->b.len -= drop;
        t->b.data[t->b.len] = '\0';
    }
    cx_buf_add(&t->b, s, n);
}

/* The last chars code points, starting on a character boundary. */
static const char *
tail_text(struct tail *t, unsigned chars)
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
    return p;
}

void
cx_run_strip_ansi(char *s)
{
    char *w = s;

    for (char *r = s; *r;) {
        if (r[0] == '\x1b' && r[1] == '[') {
            r += 2;
            while (*r && !(*r >= 0x40 && *r <= 0x7e))
                r++;
            if (*r)
                r++;
        } else if (r[0] == '\x1b' && r[1] == ']') {
            r += 2;
            while (*r && *r != '\x07' && !(r[0] == '\x1b' && r[1] == '\\'))
                r++;
            r += *r == '\x07' ? 1 : (*r ? 2 : 0);
        } else if (r[0] == '\x1b') {
            r += r[1] ? 2 : 1;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

static void
count_output(struct exec_state *st, size_t n)
{
    st->output_bytes += n;
    if (st->output_bytes <= st->cx->cfg->max_output_bytes || st->truncated)
        return;
    st->truncated = true;
    if (!st->interrupted_for_output) {
        st->interrupted_for_output = true;
        if (cx_gateway_kernel_interrupt(st->cx->gw, st->kernel_id))
            cx_log_warn(0, "interrupt after the output limit failed");
    }
}

/* Images and other rich outputs of the user's cell become artifacts. */
static void
rich_outputs(struct exec_state *st, json_t *data)
{
    static const char *const binary[] = {"image/png", "image/jpeg", "image/gif", "application/pdf"};
    static const char *const text[] = {"image/svg+xml"};

    for (size_t i = 0; i < sizeof(binary) / sizeof(binary[0]); i++) {
        const char *b64 = json_string_value(json_object_get(data, binary[i]));
        size_t cap, len = 0;
        unsigned char *buf;

        if (!b64)
            continue;
        cap = strlen(b64) / 4 * 3 + 3;
        buf = malloc(cap);
        if (buf && sodium_base642bin(buf, cap, b64, strlen(b64), "\n\r ", &len, NULL,
                                     sodium_base64_VARIANT_ORIGINAL) == 0)
            cx_capture_add_output(st->cap, binary[i], buf, len);
        free(buf);
        return; /* one artifact per output, the richest form */
    }
    for (size_t i = 0; i < sizeof(text) / sizeof(text[0]); i++) {
        json_t *v = json_object_get(data, text[i]);
        if (json_is_string(v)) {
            cx_capture_add_output(st->cap, text[i], json_string_value(v), json_string_length(v));
            return;
        }
    }
}

static bool
all_replied(const struct cx_exec *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (reqs[i].sent && !reqs[i].got_reply)
            return false;
    return true;
}

static enum cx_err
on_message(void *ctx, int index, const char *type, json_t *content)
{
    struct exec_state *st = ctx;

    if (index >= 0 && (size_t)index < st->base) {
        if (!strcmp(type, "error"))
            st->stage_failed = true;
        return CX_OK;
    }
    if (index >= 0)
        index -= (int)st->base;
    /* Past the output limit, once every reply is in, the rest of the output
     * is of no use: stop here rather than wait for it to drain. */
    if (st->truncated && all_replied(st->reqs, REQ_MAX))
        return CX_ERR_TOO_LARGE;

    if (index < 0) {
        count_output(st, st->cx->cfg->max_output_bytes + 1); /* "oversized" */
        return CX_OK;
    }
    st->any_message = true;
    if (index == st->carrier && st->cap && !strcmp(type, "display_data")) {
        json_t *m = json_object_get(json_object_get(content, "data"), CX_CAPTURE_MIME);
        if (m) {
            cx_capture_on_message(st->cap, m);
            return CX_OK;
        }
    }
    if (index == REQ_EPILOGUE)
        return CX_OK;
    if (!strcmp(type, "stream")) {
        const char *name = json_string_value(json_object_get(content, "name"));
        json_t *text = json_object_get(content, "text");
        size_t n = json_string_length(text);

        if (!json_is_string(text))
            return CX_OK;
        count_output(st, n);
        if (st->truncated)
            return CX_OK;
        tail_add(name && !strcmp(name, "stderr") ? &st->err : &st->out, json_string_value(text), n);
    } else if (!strcmp(type, "error")) {
        json_decref(st->error);
        st->error = json_incref(content);
    } else if (!strcmp(type, "execute_result") || !strcmp(type, "display_data")) {
        json_t *data = json_object_get(content, "data");
        json_t *value =
            json_object_get(json_object_get(data, "application/vnd.codexec.result+json"), "value");

        if (index == REQ_CALL && value) {
            json_decref(st->result);
            st->result = json_incref(value);
            st->have_result = true;
            return CX_OK;
        }
        if (index == REQ_USER && st->cap)
            rich_outputs(st, data);
        if (index == REQ_USER && !strcmp(type, "execute_result")) {
            json_t *plain = json_object_get(data, "text/plain");
            if (json_is_string(plain)) {
                count_output(st, json_string_length(plain));
                if (!st->truncated) {
                    json_decref(st->result);
                    st->result = json_incref(plain);
                    st->have_result = true;
                }
            }
        }
    }
    return CX_OK;
}

static bool
epilogue_says_fresh(const struct cx_exec *epilogue)
{
    json_t *v = json_object_get(json_object_get(epilogue->reply, "user_expressions"), "cx");
    const char *plain =
        json_string_value(json_object_get(json_object_get(v, "data"), "text/plain"));

    return !(plain && !strcmp(plain, "True"));
}

CX_SQL(q_run_insert, 6,
       "INSERT INTO runs (id, user_id, conversation_id, api_key_id, status, code_length,"
       " code_sha256, started_at) VALUES ($1::uuid, $2, $3, nullif($4, '')::uuid, 'running',"
       " $5::int, $6, now())");
CX_SQL(q_run_finish, 6,
       "UPDATE runs SET status = $2, error_name = $3, truncated = $4::boolean,"
       " session_reset = $5::boolean, execution_ms = $6::int, finished_at = now()"
       " WHERE id = $1::uuid");

static void
set_error(json_t *payload, const char *ename, const char *evalue, json_t *tb)
{
    char *text = NULL;
    size_t n = strlen(ename) + strlen(evalue) + 3;

    text = malloc(n);
    if (!text)
        return;
    snprintf(text, n, "%s: %s", ename, evalue);
    cx_run_strip_ansi(text);
    json_object_set_new(payload, "status", json_string("error"));
    json_object_set_new(payload, "error", json_string(text));
    json_object_set_new(payload, "error_name", json_string(ename));
    free(text);
    if (tb) {
        struct cx_buf b;
        size_t i;
        json_t *line;

        cx_buf_init(&b, 4u << 20);
        json_array_foreach(tb, i, line)
        {
            if (json_is_string(line))
                cx_buf_addf(&b, "%s%s", i ? "\n" : "", json_string_value(line));
        }
        if (!cx_buf_err(&b) && b.data) {
            cx_run_strip_ansi(b.data);
            json_object_set_new(payload, "traceback", json_string(b.data));
        }
        cx_buf_cleanup(&b);
    }
}

/* Waits for the sent requests until deadline_us, in windows: a window with
 * no message at all asks the gateway whether the kernel still exists (our
 * pooled WebSocket outlives a kernel deleted behind our back); a silent
 * window in which every reply was already in but an idle status never came
 * means the output channel was lost. */
static enum cx_err
wait_windows(struct exec_state *st, struct cx_session *s, struct cx_exec *reqs, int n,
             int64_t deadline_us)
{
    enum cx_err rc;
    int silent = 0;

    for (;;) {
        int64_t now = cx_now_us();
        int64_t until = now + WINDOW_US < deadline_us ? now + WINDOW_US : deadline_us;
        uint64_t before = cx_kernel_conn_reads(st->conn);
        bool replied = all_replied(reqs, n);

        if (now >= deadline_us)
            return CX_ERR_TIMEOUT;
        rc = cx_kernel_wait(st->conn, reqs, n, n, until, on_message, st);
        if (rc == CX_ERR_TOO_LARGE) {
            st->abandoned = true; /* output left unread: do not pool */
            return CX_OK;
        }
        if (rc != CX_ERR_TIMEOUT)
            return rc;
        silent = replied && cx_kernel_conn_reads(st->conn) == before ? silent + 1 : 0;
        if (silent >= 2) {
            st->output_lost = true;
            return CX_OK;
        }
        if (!st->any_message) {
            rc = cx_gateway_kernel_get(st->cx->gw, s->kernel_id, NULL);
            if (rc == CX_ERR_NOT_FOUND)
                return rc;
        }
    }
}

/* Waits for the sent requests in reqs[0..n) until deadline_us; at the
 * deadline interrupts the kernel, and restarts it when it is not idle within
 * the grace period (st->timed_out). */
static enum cx_err
wait_run(struct exec_state *st, struct cx_session *s, struct cx_exec *reqs, int n,
         int64_t deadline_us)
{
    const struct cx_config *cfg = st->cx->cfg;
    enum cx_err rc;

    rc = wait_windows(st, s, reqs, n, deadline_us);
    if (rc == CX_ERR_TIMEOUT) {
        st->timed_out = true;
        cx_log_info("run timed out; interrupting");
        rc = cx_gateway_kernel_interrupt(st->cx->gw, s->kernel_id);
        if (rc == CX_ERR_NOT_FOUND)
            return rc;
        if (rc)
            cx_log_warn(0, "interrupt request failed");
        rc = wait_windows(st, s, reqs, n, cx_now_us() + cfg->interrupt_grace * 1000000LL);
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

/* Whether a request's user expressions (the epilogue) were evaluated: the
 * kernel evaluates them only after a cell that succeeded. */
static bool
carried(const struct cx_exec *e)
{
    const char *status = json_string_value(json_object_get(e->reply, "status"));

    return e->got_reply && status && !strcmp(status, "ok") &&
           json_object_get(json_object_get(e->reply, "user_expressions"), "cx");
}

/* Sends the pipelined requests (the user's cell, then main() when there are
 * arguments) and waits for them, applying the timeout and its grace period.
 * The epilogue (the restart check and the capture) rides on the last one as
 * user expressions, so a run is one execute, like a raw client's. When that
 * cell fails the kernel skips its expressions; then a separate silent
 * request carries them: one more round trip, for failed runs only. */
static enum cx_err
execute(struct exec_state *st, struct cx_session *s, const struct cx_run_request *req,
        const struct inputs *in, struct cx_exec *all, char *msg, size_t msglen)
{
    struct cx_exec *reqs = all + st->base;
    const struct cx_config *cfg = st->cx->cfg;
    int last = req->arguments ? REQ_CALL : REQ_USER;
    int64_t deadline = cx_now_us() + (int64_t)(req->timeout * 1e6);
    char check[256];
    json_t *uexpr = NULL, *meta = NULL, *capmeta = NULL;
    enum cx_err rc = CX_ERR_NOMEM;

    snprintf(check, sizeof(check), TOKEN_CHECK_FMT, s->kernel_id);
    uexpr = json_pack("{s:s,s:s}", "cx", check, "reap", REAP_EXPR);
    meta = json_object();
    if (st->cap) {
        capmeta = cx_capture_metadata(cfg, s->kernel_id, req->outputs, s->capture_rescan);
        if (!capmeta || json_object_set_new(uexpr, "cap", json_string(cx_capture_expression())) ||
            json_object_update(meta, capmeta))
            goto out;
    }
    if (!uexpr || !meta ||
        (req->arguments && json_object_set(meta, "codexec_arguments", req->arguments)))
        goto out;
    memset(all, 0, sizeof(*all) * (st->base + REQ_MAX));
    reqs[REQ_USER] = (struct cx_exec){.code = req->code, .store_history = true};
    reqs[REQ_CALL] = (struct cx_exec){.code = call_cell};
    reqs[last].user_expressions = uexpr;
    reqs[last].metadata = meta;
    reqs[REQ_EPILOGUE] = (struct cx_exec){
        .code = "", .silent = true, .user_expressions = uexpr, .metadata = capmeta};
    st->carrier = last;
    /* Leftovers of an earlier run or of other clients (a restart notice,
     * say) must not be taken for this run's news. */
    cx_kernel_drain(st->conn, 0);
    rc = send_inputs(st, in, all);
    for (int i = REQ_USER; i <= last && rc == CX_OK; i++)
        rc = cx_kernel_execute(st->conn, &reqs[i]);
    if (rc) {
        snprintf(msg, msglen, "sending to the kernel failed");
        goto out;
    }
    cx_metrics_count(CX_COUNT_GATEWAY_BATCHES); /* the run's one round trip */
    rc = wait_run(st, s, all, (int)st->base + REQ_MAX, deadline);
    if (rc == CX_OK && !st->timed_out && !st->output_lost && !carried(&reqs[last])) {
        st->carrier = REQ_EPILOGUE;
        rc = cx_kernel_execute(st->conn, &reqs[REQ_EPILOGUE]);
        if (rc) {
            snprintf(msg, msglen, "sending to the kernel failed");
            goto out;
        }
        cx_metrics_count(CX_COUNT_GATEWAY_BATCHES);
        rc = wait_run(st, s, all, (int)st->base + REQ_MAX, deadline);
    }
    if (rc == CX_OK && st->cap && carried(&reqs[st->carrier]))
        cx_capture_on_result(
            st->cap,
            json_object_get(json_object_get(reqs[st->carrier].reply, "user_expressions"), "cap"));
out:
    /* the requests borrowed these until now */
    for (int i = 0; i < REQ_MAX; i++)
        reqs[i].user_expressions = reqs[i].metadata = NULL;
    json_decref(uexpr);
    json_decref(meta);
    json_decref(capmeta);
    return rc;
}

static enum cx_err
run_in_session(struct cx_ctx *cx, const struct cx_principal *who, struct cx_run_request *req,
               const struct inputs *in, const char *run_id, int *status, json_t **out, char *msg,
               size_t msglen)
{
    const struct cx_config *cfg = cx->cfg;
    struct exec_state st;
    struct cx_session s;
    struct cx_exec *all = NULL, *reqs;
    json_t *payload = NULL, *artifacts = NULL, *loaded = NULL;
    int64_t t0 = 0, ms = 0;
    enum cx_err rc;
    int nreq, attempt;
    bool reused = false;

    memset(&st, 0, sizeof(st));
    st.cx = cx;
    st.base = stage_requests(in);
    nreq = (int)st.base + REQ_MAX;
    all = calloc((size_t)nreq, sizeof(*all));
    reqs = all ? all + st.base : NULL;
    st.reqs = reqs;
    if (!all) {
        *status = 500;
        rc = CX_ERR_NOMEM;
        goto out;
    }
    if (req->capture_artifacts && cx_capture_new(cfg, &st.cap)) {
        *status = 500;
        rc = CX_ERR_NOMEM;
        goto out;
    }
    tail_init(&st.out, cfg->tail_chars);
    tail_init(&st.err, cfg->tail_chars);

    rc = cx_session_acquire(cx, who->user, req->conversation_id, req->ttl, &s, msg, msglen);
    if (rc) {
        *status = rc == CX_ERR_CONFLICT ? 409 : rc == CX_ERR_QUOTA ? 429 : cx_http_status_for(rc);
        goto out;
    }
    for (attempt = 0; attempt < 2; attempt++) {
        rc = cx_kernel_conn_get(cx_gateway_url(cx->gw), cx_gateway_token(cx->gw), s.kernel_id,
                                &st.conn, msg, msglen);
        if (rc == CX_ERR_NOT_FOUND) {
            /* The gateway forgot the kernel (deleted, culled, gateway restart). */
            cx_log_info("session %s: kernel %s vanished; replacing it", s.id, s.kernel_id);
            rc = cx_session_replace_kernel(cx, &s, msg, msglen);
            if (rc == CX_OK)
                rc = cx_kernel_conn_get(cx_gateway_url(cx->gw), cx_gateway_token(cx->gw),
                                        s.kernel_id, &st.conn, msg, msglen);
        }
        if (rc) {
            *status = 502;
            goto out;
        }
        reused = cx_kernel_conn_messages(st.conn) > 0;
        st.kernel_id = s.kernel_id;
        t0 = cx_now_us();
        rc = execute(&st, &s, req, in, all, msg, msglen);
        if (rc == CX_ERR_NOT_FOUND && attempt == 0 && !st.timed_out) {
            /* The kernel vanished before running anything of ours. */
            cx_kernel_conn_free(st.conn);
            st.conn = NULL;
            cx_exec_cleanup(all, nreq);
            cx_log_info("session %s: kernel %s vanished; replacing it", s.id, s.kernel_id);
            rc = cx_session_replace_kernel(cx, &s, msg, msglen);
            if (rc) {
                *status = 502;
                goto out;
            }
            continue;
        }
        if (rc == CX_ERR_NOT_FOUND) {
            /* It vanished while the code ran: what ran is lost with it. */
            rc = cx_session_replace_kernel(cx, &s, msg, msglen);
            if (rc) {
                *status = 502;
                goto out;
            }
            rc = CX_ERR_KERNEL_DIED;
        }
        if (rc == CX_ERR_IO && reused && !st.any_message) {
            /* A pooled connection the server had closed: nothing ran yet. */
            cx_kernel_conn_free(st.conn);
            st.conn = NULL;
            cx_exec_cleanup(all, nreq);
            continue;
        }
        break;
    }
    ms = (cx_now_us() - t0) / 1000;
    if (rc == CX_OK && (st.output_lost || st.abandoned)) {
        if (st.output_lost)
            cx_log_warn(0, "run %s: replies arrived without their idle status; output lost",
                        run_id);
        cx_kernel_conn_free(st.conn);
        st.conn = NULL;
    }
    if (rc == CX_ERR_KERNEL_DIED) {
        st.died = true;
        s.reset = true;
        s.kernel_fresh = true; /* the gateway restarts it */
        cx_kernel_conn_free(st.conn);
        st.conn = NULL;
        rc = CX_OK;
    } else if (rc) {
        cx_log_warn(0, "run %s: kernel connection failed: %s", run_id, cx_strerror(rc));
        snprintf(msg, msglen, "the connection to the kernel failed during the run");
        *status = 502;
        goto out;
    }
    /* The execute_reply carries the error too, when its iopub copy was not
     * read (the run stopped reading past the output limit). */
    for (int i = REQ_USER; i <= REQ_CALL && !st.error; i++) {
        const char *rs = json_string_value(json_object_get(reqs[i].reply, "status"));
        if (rs && !strcmp(rs, "error"))
            st.error = json_incref(reqs[i].reply);
    }
    if (!st.died && carried(&reqs[st.carrier]) && epilogue_says_fresh(&reqs[st.carrier]) &&
        !s.kernel_fresh)
        s.reset = true; /* restarted behind our back since the last run */
    if (!st.died && !st.timed_out)
        s.kernel_fresh = false;

    /* A timed-out run captures nothing; the next one rescans everything, so
     * what it wrote before the deadline is not lost. */
    if (st.cap)
        s.capture_rescan = st.timed_out || s.reset ? true : !cx_capture_done(st.cap);
    artifacts = json_array();
    if (st.cap && !s.reset && !st.timed_out &&
        cx_artifact_commit_capture(cx, who->user, req->conversation_id, run_id, st.cap, artifacts))
        cx_log_warn(0, "run %s: captured files could not be stored", run_id);
    loaded = json_array();
    for (size_t i = 0; i < in->n; i++)
        json_array_append_new(loaded, json_string(in->v[i].path));
    payload = json_pack(
        "{s:s,s:s,s:s,s:o,s:O,s:O?,s:b,s:I,s:{s:s,s:b,s:b,s:s}}", "run_id", run_id, "status", "ok",
        "stdout_tail", tail_text(&st.out, cfg->tail_chars), "artifacts", artifacts, "inputs_loaded",
        loaded, "result", st.have_result ? st.result : NULL, "truncated", st.truncated,
        "execution_ms", (json_int_t)ms, "session", "conversation_id", req->conversation_id,
        "created", s.created, "reset", s.reset, "expires_at", s.expires_at);
    artifacts = NULL; /* "o" steals it, even on failure */
    if (!payload) {
        rc = CX_ERR_NOMEM;
        *status = 500;
        goto out;
    }
    if (st.cap && json_array_size(cx_capture_skipped(st.cap)))
        json_object_set(payload, "skipped", cx_capture_skipped(st.cap));
    if (st.err.b.len)
        json_object_set_new(payload, "stderr_tail",
                            json_string(tail_text(&st.err, cfg->tail_chars)));
    if (st.timed_out) {
        char ev[64];
        snprintf(ev, sizeof(ev), "execution exceeded %gs", req->timeout);
        set_error(payload, "TimeoutError", ev, NULL);
    } else if (st.died) {
        set_error(payload, "KernelDied", "the kernel exited during the run; its state was lost",
                  NULL);
    } else if (st.stage_failed) {
        set_error(payload, "InputStagingFailed", "the inputs could not be written to inputs/",
                  NULL);
    } else if (st.output_lost) {
        set_error(payload, "OutputLost",
                  "the kernel's output channel was lost during the run; output may be incomplete",
                  NULL);
    } else if (st.interrupted_for_output && st.error) {
        char ev[96];
        snprintf(ev, sizeof(ev), "output exceeded %llu bytes",
                 (unsigned long long)cfg->max_output_bytes);
        set_error(payload, "OutputLimitExceeded", ev, NULL);
    } else if (st.error) {
        const char *en = json_string_value(json_object_get(st.error, "ename"));
        const char *ev = json_string_value(json_object_get(st.error, "evalue"));
        set_error(payload, en ? en : "Error", ev ? ev : "", json_object_get(st.error, "traceback"));
    }
    *status = 200;
    rc = CX_OK;
out:
    if (s.locked) {
        if (!s.reset)
            cx_kernel_conn_put(st.conn); /* kept open for the next run */
        else
            cx_kernel_conn_free(st.conn);
        st.conn = NULL;
        cx_session_release(cx, &s);
    }
    cx_kernel_conn_free(st.conn);
    {
        const char *st_s =
            payload ? json_string_value(json_object_get(payload, "status")) : "error";
        const char *en = payload ? json_string_value(json_object_get(payload, "error_name")) : NULL;
        char msbuf[24];
        const char *p[6] = {run_id,
                            st_s,
                            en ? en : (payload ? NULL : "RequestFailed"),
                            st.truncated ? "true" : "false",
                            s.reset ? "true" : "false",
                            msbuf};
        snprintf(msbuf, sizeof(msbuf), "%lld", (long long)ms);
        if (cx_db_exec(cx->db, &q_run_finish, p, NULL))
            cx_log_warn(0, "could not record the end of run %s", run_id);
        cx_log_info("run %s %s in %lldms output=%llu reset=%d", run_id, st_s, (long long)ms,
                    (unsigned long long)st.output_bytes, s.reset);
    }
    if (all)
        cx_exec_cleanup(all, nreq);
    free(all);
    cx_capture_free(st.cap);
    json_decref(loaded);
    json_decref(artifacts);
    json_decref(st.error);
    json_decref(st.result);
    cx_buf_cleanup(&st.out.b);
    cx_buf_cleanup(&st.err.b);
    *out = payload;
    return rc;
}

CX_SQL(q_run_status, 2,
       "UPDATE runs SET status = $2, started_at = CASE WHEN $2 = 'running'"
       " THEN now() ELSE started_at END, finished_at = CASE WHEN $2 <> 'running'"
       " THEN now() ELSE finished_at END WHERE id = $1::uuid");

/* Loads the inputs (again: they may be gone since the request was checked)
 * and runs. A missing input now fails the run as a 404. */
static enum cx_err
run_with_inputs(struct cx_ctx *cx, const struct cx_principal *who, struct cx_run_request *req,
                const char *run_id, int *status, json_t **out, char *msg, size_t msglen)
{
    struct inputs in;
    enum cx_err rc = load_inputs(cx, who->user, req, &in, msg, msglen);

    if (rc) {
        const char *p[2] = {run_id, "error"};
        *status = rc == CX_ERR_NOT_FOUND ? 404 : cx_http_status_for(rc);
        if (cx_db_exec(cx->db, &q_run_status, p, NULL))
            cx_log_warn(0, "could not fail run %s", run_id);
    } else {
        rc = run_in_session(cx, who, req, &in, run_id, status, out, msg, msglen);
    }
    free(in.v);
    return rc;
}

CX_SQL(q_pending_insert, 8,
       "WITH r AS (INSERT INTO runs (id, user_id, conversation_id, api_key_id, status,"
       " code_length, code_sha256) VALUES ($1::uuid, $2, $3, nullif($4, '')::uuid,"
       " 'pending_approval', $5::int, $6) RETURNING id)"
       " INSERT INTO pending_runs (run_id, request, expires_at)"
       " SELECT id, $7::jsonb, now() + make_interval(secs => $8::int) FROM r");

enum cx_err
cx_run_submit(struct cx_ctx *cx, const struct cx_principal *who, struct cx_run_request *req,
              int *status, json_t **out, char *msg, size_t msglen)
{
    char run_id[37], len_s[24], sha[65];
    const char *p[8] = {run_id, who->user, req->conversation_id, who->key_id, len_s, sha};
    struct inputs in;
    enum cx_err rc;

    *out = NULL;
    /* Inputs are checked first: a foreign one is a 404 and nothing runs. */
    rc = load_inputs(cx, who->user, req, &in, msg, msglen);
    free(in.v);
    if (rc) {
        *status = rc == CX_ERR_NOT_FOUND ? 404 : cx_http_status_for(rc);
        return rc;
    }
    cx_uuid_generate(run_id);
    snprintf(len_s, sizeof(len_s), "%zu", req->code_len);
    cx_sha256_hex(req->code, req->code_len, sha);
    cx_log_info("run %s requested: code_len=%zu code_sha256=%s", run_id, req->code_len, sha);
    if (cx->cfg->require_approval || who->require_approval) {
        char ttl[16], *request = json_dumps(req->root, JSON_COMPACT);
        if (!request)
            return CX_ERR_NOMEM;
        snprintf(ttl, sizeof(ttl), "%u", cx->cfg->approval_ttl);
        p[6] = request;
        p[7] = ttl;
        rc = cx_db_exec(cx->db, &q_pending_insert, p, NULL);
        free(request);
        if (rc) {
            *status = 503;
            snprintf(msg, msglen, "the database is unavailable");
            return rc;
        }
        *out = json_pack("{s:s,s:s}", "run_id", run_id, "status", "pending_approval");
        *status = 202;
        return *out ? CX_OK : CX_ERR_NOMEM;
    }
    rc = cx_db_exec(cx->db, &q_run_insert, p, NULL);
    if (rc) {
        *status = 503;
        snprintf(msg, msglen, "the database is unavailable");
        return rc;
    }
    return run_with_inputs(cx, who, req, run_id, status, out, msg, msglen);
}

CX_SQL(q_pending_take, 2,
       "WITH p AS (DELETE FROM pending_runs WHERE run_id = $1::uuid AND run_id IN"
       " (SELECT id FROM runs WHERE id = $1::uuid AND user_id = $2 AND status = 'pending_approval')"
       " RETURNING request, expires_at < now() AS expired)"
       " SELECT request::text, expired FROM p");

/* Takes the pending request of a run (deleting it) and sets the run's new
 * status in one transaction. *request: new reference. */
static enum cx_err
take_pending(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id,
             const char *new_status, json_t **request)
{
    const char *p[2] = {run_id, who->user};
    const char *u[2] = {run_id, new_status};
    PGresult *r = NULL;
    enum cx_err rc;
    bool expired;

    *request = NULL;
    if (!cx_uuid_valid(run_id))
        return CX_ERR_NOT_FOUND;
    rc = cx_db_begin(cx->db);
    if (rc)
        return rc;
    rc = cx_db_exec(cx->db, &q_pending_take, p, &r);
    if (rc)
        goto fail;
    if (PQntuples(r) != 1) {
        rc = CX_ERR_NOT_FOUND;
        goto fail;
    }
    expired = PQgetvalue(r, 0, 1)[0] == 't';
    if (expired)
        u[1] = "expired";
    rc = cx_db_exec(cx->db, &q_run_status, u, NULL);
    if (rc)
        goto fail;
    if (!expired) {
        *request = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
        if (!*request) {
            rc = CX_ERR_INTERNAL;
            goto fail;
        }
    }
    PQclear(r);
    rc = cx_db_commit(cx->db);
    if (rc) {
        json_decref(*request);
        *request = NULL;
        return rc;
    }
    return expired ? CX_ERR_EXPIRED : CX_OK;
fail:
    PQclear(r);
    cx_db_rollback(cx->db);
    return rc;
}

enum cx_err
cx_run_approve(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id, int *status,
               json_t **out, char *msg, size_t msglen)
{
    struct cx_run_request req;
    json_t *request = NULL;
    enum cx_err rc;

    *out = NULL;
    if (who->require_approval) {
        /* Its runs wait for someone else: it never decides one. */
        *status = 403;
        snprintf(msg, msglen, "a key that requires approval can't approve or reject runs");
        return CX_ERR_FORBIDDEN;
    }
    rc = take_pending(cx, who, run_id, "running", &request);
    if (rc) {
        *status = cx_http_status_for(rc);
        return rc;
    }
    /* Validated again: the limits may have changed while it waited. */
    rc = cx_run_request_parse(cx->cfg, request, &req, msg, msglen);
    json_decref(request);
    if (rc) {
        const char *p[2] = {run_id, "error"};
        if (cx_db_exec(cx->db, &q_run_status, p, NULL))
            cx_log_warn(0, "could not fail run %s", run_id);
        *status = 400;
        return rc;
    }
    rc = run_with_inputs(cx, who, &req, run_id, status, out, msg, msglen);
    cx_run_request_cleanup(&req);
    return rc;
}

enum cx_err
cx_run_reject(struct cx_ctx *cx, const struct cx_principal *who, const char *run_id, json_t **out)
{
    json_t *request = NULL;
    enum cx_err rc;

    *out = NULL;
    if (who->require_approval)
        return CX_ERR_FORBIDDEN;
    rc = take_pending(cx, who, run_id, "rejected", &request);
    json_decref(request);
    if (rc)
        return rc;
    *out = json_pack("{s:s,s:s}", "run_id", run_id, "status", "rejected");
    return *out ? CX_OK : CX_ERR_NOMEM;
}

CX_SQL(q_expire_pending, 0,
       "WITH p AS (DELETE FROM pending_runs WHERE expires_at < now() RETURNING run_id)"
       " UPDATE runs SET status = 'expired', finished_at = now() FROM p WHERE runs.id = p.run_id");
CX_SQL(q_abandon, 1,
       "UPDATE runs SET status = 'error', error_name = 'Abandoned', finished_at = now()"
       " WHERE status = 'running' AND started_at < now() - make_interval(secs => $1::int)");

int
cx_run_expire(struct cx_ctx *cx)
{
    char secs[16];
    const char *p[1] = {secs};
    PGresult *r = NULL;
    int n = 0;

    if (cx_db_exec(cx->db, &q_expire_pending, NULL, &r))
        return -1;
    n += (int)strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    /* Longer than any run can last: its process died. */
    snprintf(secs, sizeof(secs), "%u", cx->cfg->max_timeout + cx->cfg->interrupt_grace + 600);
    if (cx_db_exec(cx->db, &q_abandon, p, &r))
        return -1;
    n += (int)strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return n;
}
