/* codexec: artifacts and their versions (PostgreSQL rows + storage). */
#ifndef CX_ARTIFACT_H
#define CX_ARTIFACT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "ctx.h"
#include "err.h"

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

/* POST /v1/artifacts: streams body bytes (raw, or the "file" part of a
 * multipart/form-data body) into storage, never holding them whole, then
 * stores them like a captured file. Query parameters conversation_id and
 * filename (raw) or form fields (multipart). *out: the artifact entry.
 * CX_ERR_INVALID/TOO_LARGE/QUOTA with msg for the client. */
enum cx_err cx_artifact_upload(struct cx_ctx *cx, const char *user, const char *query,
                               const char *content_type, const char *content_length,
                               ssize_t (*read_fn)(void *, void *, size_t), void *read_ctx,
                               json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* GET /v1/artifacts?conversation_id=: *out = {"conversation_id",
 * "artifacts": [...]}. CX_ERR_INVALID for a malformed conversation id. */
enum cx_err cx_artifact_list(struct cx_ctx *cx, const char *user, const char *cid,
                             json_t **out) CX_MUSTCHECK;
/* The same with each artifact's "storage_key" (the artifacts page signs
 * links with it); never an answer to a client. */
enum cx_err cx_artifact_list_with_keys(struct cx_ctx *cx, const char *user, const char *cid,
                                       json_t **out) CX_MUSTCHECK;

/* GET /v1/artifacts/{id}: metadata with every version. CX_ERR_NOT_FOUND for
 * a missing, deleted or foreign artifact and a malformed id alike. */
enum cx_err cx_artifact_get(struct cx_ctx *cx, const char *user, const char *id,
                            json_t **out) CX_MUSTCHECK;

/* DELETE /v1/artifacts/{id}: rows go in a transaction, bytes after it. */
enum cx_err cx_artifact_delete(struct cx_ctx *cx, const char *user, const char *id) CX_MUSTCHECK;

/* codexec-admin fsck: files without rows (and staging files older than an
 * hour), rows without files, size or sha256 mismatches, one line each to
 * report. With repair, files without rows are removed (rows are only ever
 * reported: their bytes cannot be made up). *problems counts what remains. */
enum cx_err cx_artifact_fsck(struct cx_ctx *cx, bool repair, FILE *report,
                             int *problems) CX_MUSTCHECK;

/* codexec-admin storage migrate: copies every version's bytes from
 * storage_dir into the configured object store (storage = s3), checking
 * each one's size and sha256 against its row on the way; versions already
 * in the store with the row's size are skipped, so a migration that
 * stopped goes on where it was. One line per problem to report; *copied
 * and *problems count. CX_ERR_INVALID when storage is not s3. */
enum cx_err cx_artifact_storage_migrate(struct cx_ctx *cx, FILE *report, int *copied,
                                        int *problems) CX_MUSTCHECK;

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

#ifdef CX_TEST_HOOKS
/* Test builds only (configure --enable-test-hooks), a stand-in for a crash
 * that cannot be produced on demand: when the environment has
 * CODEXEC_TEST_CRASH_BEFORE_COMMIT=1, the process exits after renaming
 * files into place and before COMMIT. */
void cx_artifact_test_hooks(void);
#endif

#endif
