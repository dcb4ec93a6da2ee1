#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "db.h"
#include "run.h"
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
