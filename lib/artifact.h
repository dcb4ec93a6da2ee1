/* codexec: artifacts and their versions (PostgreSQL rows + storage). */
#ifndef CX_ARTIFACT_H
#define CX_ARTIFACT_H

#include <jansson.h>

#include "ctx.h"
#include "err.h"

struct cx_capture;

/* Turns a run's captured files into artifact versions: same path in the
 * conversation = same artifact, next version; a file whose content equals
 * the current version is not stored again. Per-user quotas are checked in
 * the transaction (a file over quota goes to the capture's skipped list as
 * "quota_exceeded"). Order: rows inserted, files renamed into place and
 * synced, then COMMIT; a failed commit removes the files again. Appends the
 * payload entries to artifacts (an array). */
enum cx_err cx_artifact_commit_capture(struct cx_ctx *cx, const char *user, const char *cid,
                                       const char *run_id, struct cx_capture *cap,
                                       json_t *artifacts) CX_MUSTCHECK;

/* GET /v1/artifacts?conversation_id=: *out = {"artifacts": [...]}. */
enum cx_err cx_artifact_list(struct cx_ctx *cx, const char *user, const char *cid,
                             json_t **out) CX_MUSTCHECK;

/* GET /v1/artifacts/{id}: metadata with every version. CX_ERR_NOT_FOUND for
 * a missing, deleted or foreign artifact and a malformed id alike. */
enum cx_err cx_artifact_get(struct cx_ctx *cx, const char *user, const char *id,
                            json_t **out) CX_MUSTCHECK;

/* DELETE /v1/artifacts/{id}: rows go in a transaction, bytes after it. */
enum cx_err cx_artifact_delete(struct cx_ctx *cx, const char *user, const char *id) CX_MUSTCHECK;

#endif
