#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "config.h"
#include "db.h"
#include "kernel.h"
#include "stage.h"
#include "storage.h"

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

CX_SQL(q_input, 3,
       "SELECT v.filename, v.storage_key, v.size FROM artifacts a JOIN artifact_versions v"
       " ON v.artifact_id = a.id AND v.version = a.current_version"
       " WHERE a.id = $1::uuid AND a.user_id = $2 AND a.conversation_id = $3"
       " AND a.deleted_at IS NULL");

enum cx_err
cx_stage_load(struct cx_ctx *cx, const char *user, const struct cx_run_request *req,
              struct cx_inputs *in, char *msg, size_t msglen)
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
        struct cx_input *x = &in->v[i];
        PGresult *r = NULL;
        enum cx_err rc = cx_db_exec(cx->db, &q_input, p, &r);
        const char *name, *dot;

        if (rc)
            return rc;
        if (PQntuples(r) != 1) {
            PQclear(r);
            snprintf(msg, msglen, "input artifact %s not found in this conversation", id);
            return CX_ERR_INPUT_NOT_FOUND;
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

size_t
cx_stage_requests(const struct cx_inputs *in)
{
    size_t n = 0;

    for (size_t i = 0; i < in->n; i++)
        n += in->v[i].size ? (in->v[i].size + STAGE_CHUNK - 1) / STAGE_CHUNK : 1;
    return n;
}

/* One input on its way into the kernel: its bytes gather into chunks,
 * each sent as one staging cell (the first truncates the file). */
struct sending {
    struct cx_kernel_conn *conn;
    struct cx_exec *stage;
    size_t k;
    const char *path;
    unsigned char *buf;
    size_t len;
    char *b64;
    size_t b64len;
    bool first;
    uint64_t want, got; /* the input's size; bytes read so far */
    enum cx_err rc;
};

static enum cx_err
send_chunk(struct sending *s)
{
    json_t *meta;
    enum cx_err rc;

    sodium_bin2base64(s->b64, s->b64len, s->buf, s->len, sodium_base64_VARIANT_ORIGINAL);
    meta = json_pack("{s:{s:s,s:b,s:s}}", "codexec_input", "path", s->path, "first", s->first,
                     "data", s->b64);
    s->stage[s->k] = (struct cx_exec){.code = stage_cell,
                                      .role = CX_EXEC_OWN,
                                      .silent = true,
                                      .stop_on_error = true,
                                      .metadata = meta};
    rc = meta ? cx_kernel_execute(s->conn, &s->stage[s->k]) : CX_ERR_NOMEM;
    s->stage[s->k].metadata = NULL;
    json_decref(meta);
    s->k++;
    s->len = 0;
    s->first = false;
    return rc;
}

static bool
on_input_bytes(void *ctx, const void *data, size_t len)
{
    struct sending *s = ctx;

    if (len > s->want - s->got) {
        s->rc = CX_ERR_IO; /* more than the row says: not this object */
        return false;
    }
    s->got += len;
    while (len > 0 && s->rc == CX_OK) {
        size_t n = STAGE_CHUNK - s->len < len ? STAGE_CHUNK - s->len : len;

        memcpy(s->buf + s->len, data, n);
        s->len += n;
        data = (const unsigned char *)data + n;
        len -= n;
        if (s->len == STAGE_CHUNK)
            s->rc = send_chunk(s);
    }
    return s->rc == CX_OK;
}

enum cx_err
cx_stage_send(struct cx_ctx *cx, struct cx_kernel_conn *conn, const struct cx_inputs *in,
              struct cx_exec *stage)
{
    struct sending s = {.conn = conn, .stage = stage};
    enum cx_err rc = CX_OK;

    s.b64len = sodium_base64_ENCODED_LEN(STAGE_CHUNK, sodium_base64_VARIANT_ORIGINAL);
    s.buf = malloc(STAGE_CHUNK);
    s.b64 = malloc(s.b64len);
    if (!s.buf || !s.b64)
        rc = CX_ERR_NOMEM;
    for (size_t i = 0; i < in->n && rc == CX_OK; i++) {
        uint64_t size = in->v[i].size;

        s.path = in->v[i].path;
        s.first = true;
        s.len = 0;
        s.want = size;
        s.got = 0;
        s.rc = CX_OK;
        rc = size ? cx_storage_read(cx->store, in->v[i].key, 0, size - 1, on_input_bytes, &s)
                  : CX_OK;
        if (s.rc)
            rc = s.rc;
        if (rc == CX_OK && s.got != size)
            rc = CX_ERR_IO; /* a short object */
        /* the rest, or an empty file's only cell */
        if (rc == CX_OK && (s.len > 0 || s.first))
            rc = send_chunk(&s);
    }
    free(s.buf);
    free(s.b64);
    return rc;
}

void
cx_stage_cleanup(struct cx_inputs *in)
{
    free(in->v);
    in->v = NULL;
    in->n = 0;
}
