/* codexec: artifacts and their versions (PostgreSQL rows + storage). */
#ifndef CX_ARTIFACT_H
#define CX_ARTIFACT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "codexec.h"

struct cx_capture;

/* What user keeps: the bytes of every version and the live artifacts. */
enum cx_err cx_artifact_usage(struct cx_ctx *cx, const char *user, uint64_t *bytes,
                              uint64_t *count) CX_MUSTCHECK;

/* Turns a run's captured files into artifact versions: same path in the
 * conversation = same artifact, next version; a file whose content equals
 * the current version is not stored again. Per-user quotas are checked in
 * the transaction (a file over quota goes to the capture's skipped list as
 * "quota_exceeded"). Order: rows inserted, files renamed into place and
 * synced, then COMMIT; a failed commit removes the files again. Appends the
 * payload entries to artifacts (an array). run_id NULL: an upload. */
enum cx_err cx_artifact_commit_capture(struct cx_ctx *cx, const char *user, const char *cid,
                                       const char *run_id, struct cx_capture *cap,
                                       json_t *artifacts) CX_MUSTCHECK;

/* The same with each artifact's "storage_key" (the artifacts page signs
 * links with it); never an answer to a client. */
enum cx_err cx_artifact_list_with_keys(struct cx_ctx *cx, const char *user, const char *cid,
                                       json_t **out) CX_MUSTCHECK;

/* codexec-admin gc: removes tombstones of deleted artifacts. *removed counts. */
enum cx_err cx_artifact_gc(struct cx_ctx *cx, int *removed) CX_MUSTCHECK;

/* The current version of the artifact at path in the conversation, as an
 * upload answers it. CX_ERR_NOT_FOUND when there is none. */
enum cx_err cx_artifact_current(struct cx_ctx *cx, const char *user, const char *cid,
                                const char *path, json_t **out) CX_MUSTCHECK;

/* The advisory lock between commits (shared, from a file's rename into
 * place to COMMIT) and whoever removes a file no row names (exclusive:
 * fsck, a failed commit), as SQL. */
#define CX_STORAGE_LOCK "hashtextextended('storage', 3)"

/* "/v1/artifacts/<id>/content?version=<n>", the download URL in answers. */
#define CX_CONTENT_URL_MAX 96
void cx_artifact_content_url(const char *id, int version, char out[CX_CONTENT_URL_MAX]);

#endif
