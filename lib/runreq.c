/* POST /v1/runs: the request body, field by field (docs/openapi.yaml). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "codexec.h"
#include "util.h"

#define MAX_OUTPUT_GLOBS 64
#define MAX_GLOB_BYTES   1024

static bool
blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' && s[i] != '\f' &&
            s[i] != '\v')
            return false;
    return true;
}

/* A parser reads its field (v, NULL when absent) into req; on failure it
 * writes a sentence naming the field. */
typedef enum cx_err (*field_fn)(const struct cx_config *cfg, json_t *v, struct cx_run_request *req,
                                char *msg, size_t msglen);

static enum cx_err
fail(char *msg, size_t msglen, enum cx_err rc, const char *sentence)
{
    snprintf(msg, msglen, "%s", sentence);
    return rc;
}

static enum cx_err
f_conversation(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
               size_t msglen)
{
    if (!json_is_string(v) || !cx_conversation_id_valid(json_string_value(v)))
        return fail(msg, msglen, CX_ERR_INVALID, CX_CONVERSATION_RULE);
    snprintf(req->conversation_id, sizeof(req->conversation_id), "%s", json_string_value(v));
    return CX_OK;
}

static enum cx_err
f_code(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg, size_t msglen)
{
    if (!json_is_string(v))
        return fail(msg, msglen, CX_ERR_INVALID, "code is required and must be a string");
    req->code = json_string_value(v);
    req->code_len = json_string_length(v);
    if (req->code_len > cfg->max_code_bytes) {
        snprintf(msg, msglen, "code exceeds max_code_bytes (%llu bytes)",
                 (unsigned long long)cfg->max_code_bytes);
        return CX_ERR_TOO_LARGE;
    }
    if (blank(req->code, req->code_len))
        return fail(msg, msglen, CX_ERR_INVALID, "code must not be blank");
    return CX_OK;
}

/* One element of an array field; false with a message when it is not. */
typedef bool (*element_fn)(json_t *array, size_t i, json_t *e, char *msg, size_t msglen);

/* An optional array of at most max elements that each pass ok: *out is
 * v, or NULL when absent or null. */
static enum cx_err
array_field(json_t *v, size_t max, const char *what, element_fn ok, json_t **out, char *msg,
            size_t msglen)
{
    size_t i;
    json_t *e;

    *out = NULL;
    if (!v || json_is_null(v))
        return CX_OK;
    if (!json_is_array(v) || json_array_size(v) > max) {
        snprintf(msg, msglen, "%s must be an array of at most %zu %s", what, max,
                 !strcmp(what, "inputs") ? "artifact ids" : "globs");
        return CX_ERR_INVALID;
    }
    json_array_foreach(v, i, e)
    {
        if (!ok(v, i, e, msg, msglen))
            return CX_ERR_INVALID;
    }
    *out = v;
    return CX_OK;
}

/* An artifact id, not repeated. */
static bool
input_ok(json_t *array, size_t i, json_t *e, char *msg, size_t msglen)
{
    if (!json_is_string(e) || !cx_uuid_valid(json_string_value(e))) {
        snprintf(msg, msglen, "inputs[%zu] is not an artifact id", i);
        return false;
    }
    for (size_t k = 0; k < i; k++)
        if (!strcasecmp(json_string_value(json_array_get(array, k)), json_string_value(e))) {
            snprintf(msg, msglen, "inputs[%zu] repeats inputs[%zu]", i, k);
            return false;
        }
    return true;
}

static bool
glob_ok(json_t *array, size_t i, json_t *e, char *msg, size_t msglen)
{
    if (json_is_string(e) && json_string_length(e) > 0 && json_string_length(e) <= MAX_GLOB_BYTES)
        return true;
    snprintf(msg, msglen, "outputs[%zu] must be a non-empty string of at most %d bytes", i,
             MAX_GLOB_BYTES);
    return false;
}

static enum cx_err
f_inputs(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
         size_t msglen)
{
    return array_field(v, cfg->max_inputs, "inputs", input_ok, &req->inputs, msg, msglen);
}

static enum cx_err
f_outputs(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
          size_t msglen)
{
    return array_field(v, MAX_OUTPUT_GLOBS, "outputs", glob_ok, &req->outputs, msg, msglen);
}

static enum cx_err
f_capture(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
          size_t msglen)
{
    req->capture_artifacts = true;
    if (!v)
        return CX_OK;
    if (!json_is_boolean(v))
        return fail(msg, msglen, CX_ERR_INVALID, "capture_artifacts must be true or false");
    req->capture_artifacts = json_is_true(v);
    return CX_OK;
}

static enum cx_err
f_output(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
         size_t msglen)
{
    (void)cfg;
    req->output_full = false;
    if (!v)
        return CX_OK;
    if (json_is_string(v) && !strcmp(json_string_value(v), "full"))
        req->output_full = true;
    else if (!json_is_string(v) || strcmp(json_string_value(v), "tail") != 0)
        return fail(msg, msglen, CX_ERR_INVALID, "output must be \"tail\" or \"full\"");
    return CX_OK;
}

static enum cx_err
f_wait(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg, size_t msglen)
{
    (void)cfg;
    req->detach = false;
    if (!v)
        return CX_OK;
    if (!json_is_boolean(v))
        return fail(msg, msglen, CX_ERR_INVALID, "wait must be true or false");
    req->detach = json_is_false(v);
    return CX_OK;
}

static enum cx_err
f_language(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
           size_t msglen)
{
    return cx_config_language(cfg, v, &req->lang, msg, msglen);
}

static enum cx_err
f_timeout(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
          size_t msglen)
{
    double t;

    req->timeout = cfg->default_timeout;
    if (!v || json_is_null(v))
        return CX_OK;
    if (!json_is_number(v) || !isfinite(t = json_number_value(v)) || t <= 0)
        return fail(msg, msglen, CX_ERR_INVALID, "timeout must be a positive number of seconds");
    req->timeout = t > cfg->max_timeout ? cfg->max_timeout : t;
    return CX_OK;
}

static enum cx_err
f_ttl(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg, size_t msglen)
{
    json_int_t t;

    req->ttl = cfg->default_ttl;
    if (!v || json_is_null(v))
        return CX_OK;
    if (!json_is_integer(v))
        return fail(msg, msglen, CX_ERR_INVALID, "ttl must be an integer number of seconds");
    t = json_integer_value(v);
    req->ttl = t < 1 ? 1 : t > (json_int_t)cfg->max_ttl ? cfg->max_ttl : (unsigned)t;
    return CX_OK;
}

/* Names become Python keyword arguments: identifiers only. */
static bool
identifier(const char *key)
{
    size_t n = strlen(key);
    bool ok = n > 0 && n <= 128 && !(key[0] >= '0' && key[0] <= '9');

    for (size_t k = 0; ok && k < n; k++)
        ok = (key[k] >= 'A' && key[k] <= 'Z') || (key[k] >= 'a' && key[k] <= 'z') ||
             (key[k] >= '0' && key[k] <= '9') || key[k] == '_';
    return ok;
}

static enum cx_err
f_arguments(const struct cx_config *cfg, json_t *v, struct cx_run_request *req, char *msg,
            size_t msglen)
{
    const char *key;
    json_t *e;

    if (!v || json_is_null(v))
        return CX_OK;
    if (!json_is_object(v))
        return fail(msg, msglen, CX_ERR_INVALID, "arguments must be a JSON object");
    json_object_foreach(v, key, e)
    {
        if (!identifier(key))
            return fail(msg, msglen, CX_ERR_INVALID,
                        "arguments keys must be identifiers ([A-Za-z_][A-Za-z0-9_]*)");
    }
    req->arguments = v;
    return CX_OK;
}

static const struct field {
    const char *name;
    field_fn parse;
} fields[] = {
    {"conversation_id", f_conversation},
    {"code", f_code},
    {"inputs", f_inputs},
    {"outputs", f_outputs},
    {"capture_artifacts", f_capture},
    {"timeout", f_timeout},
    {"ttl", f_ttl},
    {"arguments", f_arguments},
    {"output", f_output},
    {"language", f_language},
    {"wait", f_wait},
};
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

enum cx_err
cx_run_request_parse(const struct cx_config *cfg, json_t *body, struct cx_run_request *req,
                     char *msg, size_t msglen)
{
    const char *key;
    json_t *v;
    enum cx_err rc;

    memset(req, 0, sizeof(*req));
    json_object_foreach(body, key, v)
    {
        size_t i = 0;
        while (i < NFIELDS && strcmp(key, fields[i].name) != 0)
            i++;
        if (i == NFIELDS)
            return fail(msg, msglen, CX_ERR_INVALID, "unknown field in the request body");
    }
    for (size_t i = 0; i < NFIELDS; i++) {
        rc = fields[i].parse(cfg, json_object_get(body, fields[i].name), req, msg, msglen);
        if (rc) {
            memset(req, 0, sizeof(*req));
            return rc;
        }
    }
    req->root = json_incref(body);
    return CX_OK;
}

void
cx_run_request_cleanup(struct cx_run_request *req)
{
    if (req) {
        json_decref(req->root);
        memset(req, 0, sizeof(*req));
    }
}
