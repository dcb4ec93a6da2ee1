/* codexec: runs, the whole story of POST /v1/runs with no HTTP in it. */
#ifndef CX_RUN_H
#define CX_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"

struct cx_config;
struct cx_db;

#define CX_CONVERSATION_MAX 128

/* A validated POST /v1/runs body. Strings and arrays are borrowed from
 * root, which the struct holds a reference to: cx_run_request_cleanup(). */
struct cx_run_request {
    json_t *root;
    char conversation_id[CX_CONVERSATION_MAX + 1];
    const char *code;
    size_t code_len;
    json_t *inputs;  /* array of uuid strings, or NULL */
    json_t *outputs; /* array of glob strings, or NULL */
    bool capture_artifacts;
    double timeout;    /* seconds, clamped to (0, max_timeout] */
    unsigned ttl;      /* seconds, clamped to [1, max_ttl] */
    json_t *arguments; /* object, or NULL */
};

/* 1–128 of [A-Za-z0-9._:-]. */
bool cx_run_conversation_id_valid(const char *s);

/* Validates body (a JSON object) against SPEC §3 and the limits in cfg.
 * On failure returns CX_ERR_INVALID or CX_ERR_TOO_LARGE and msg holds a
 * sentence for the client naming the field. On success *req takes a new
 * reference to body. */
enum cx_err cx_run_request_parse(const struct cx_config *cfg, json_t *body,
                                 struct cx_run_request *req, char *msg, size_t msglen) CX_MUSTCHECK;
void cx_run_request_cleanup(struct cx_run_request *req);

/* The user's run record (never the code). CX_ERR_NOT_FOUND for a missing
 * run, another user's run and a malformed id alike. *out: new reference. */
enum cx_err cx_run_get(struct cx_db *db, const char *user, const char *run_id,
                       json_t **out) CX_MUSTCHECK;

#endif
