/* codexec: artifact storage, on a local filesystem (storage_dir) or in an
 * S3-compatible object store (storage = s3, lib/s3.h).
 *
 * Keys are derived by the server only (cx_storage_key): never from a path a
 * user chose. Writing goes through a writer: bytes stream into a staging
 * file or object while their SHA-256 and size are computed, then it is
 * moved into place under its key (a rename and a directory sync; a
 * server-side copy in a store). The caller commits its database rows after
 * cx_storage_writer_commit() and removes the object again if that commit
 * fails (docs/internals/storage.md). */
#ifndef CX_STORAGE_H
#define CX_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codexec.h"

struct cx_storage_writer;
struct cx_s3;

/* A handle on the configured storage, for one thread (a store's handle
 * keeps its connection). Free with cx_storage_free(); NULL is a no-op. */
enum cx_err cx_storage_new(const struct cx_config *cfg, struct cx_storage **out) CX_MUSTCHECK;
/* A handle on a directory (tests, tools). */
enum cx_err cx_storage_new_local(const char *root, struct cx_storage **out) CX_MUSTCHECK;
void cx_storage_free(struct cx_storage *st);
/* The object store's client, or NULL with local storage (borrowed). */
struct cx_s3 *cx_storage_s3(struct cx_storage *st);

/* Writes and removes a probe: CX_OK when the storage can take writes. msg
 * receives what failed. */
enum cx_err cx_storage_check_writable(struct cx_storage *st, char *msg, size_t msglen) CX_MUSTCHECK;

/* "artifacts/<user_key>/<artifact_id>/v<version>/<safe_filename>". */
enum cx_err cx_storage_key(const char *user, const char *artifact_id, int version,
                           const char *filename, char *out, size_t outlen) CX_MUSTCHECK;

/* A basename safe for keys and headers: no separators, NUL, control
 * characters or leading dots; invalid UTF-8 replaced; at most 255 bytes cut
 * on a character boundary; "file" when nothing is left. out: 256 bytes. */
void cx_storage_safe_filename(const char *name, size_t len, char out[256]);

/* Starts writing an object; its key is chosen at commit (it may depend on
 * rows not inserted yet). Bytes stage under .staging/ (in a store: in
 * memory up to s3_part_size, then as parts of a multipart upload). The
 * writer uses st until it is freed with _commit or _abort. */
enum cx_err cx_storage_writer_new(struct cx_storage *st,
                                  struct cx_storage_writer **out) CX_MUSTCHECK;
enum cx_err cx_storage_writer_write(struct cx_storage_writer *w, const void *data,
                                    size_t len) CX_MUSTCHECK;
/* Bytes written so far. */
uint64_t cx_storage_writer_size(const struct cx_storage_writer *w);
/* Syncs the staging file (stores the staging object) and reports size and
 * hex sha256 (65 bytes). */
enum cx_err cx_storage_writer_finish(struct cx_storage_writer *w, uint64_t *size,
                                     char sha256[65]) CX_MUSTCHECK;
/* Moves into place as key (and syncs the directory); frees w either way. */
enum cx_err cx_storage_writer_commit(struct cx_storage_writer *w, const char *key) CX_MUSTCHECK;
/* Removes what was staged and frees w. NULL is a no-op. */
void cx_storage_writer_abort(struct cx_storage_writer *w);

/* Removes an object (missing is fine) and its now empty directories; a
 * staging key also ends the multipart uploads left under it. */
enum cx_err cx_storage_remove(struct cx_storage *st, const char *key) CX_MUSTCHECK;

/* Calls fn with the key of every object (and, with stale_seconds > 0, of
 * everything staged longer ago than that, as ".staging/<name>" with
 * staging true; younger ones are writes in progress). fn may remove what
 * it is given. Empty directories left behind are removed when prune is
 * set. A non-OK return of fn stops the walk. */
typedef enum cx_err (*cx_storage_walk_fn)(void *ctx, const char *key, bool staging);
enum cx_err cx_storage_walk(struct cx_storage *st, long stale_seconds, bool prune,
                            cx_storage_walk_fn fn, void *ctx) CX_MUSTCHECK;

/* Removes what was staged longer ago than stale_seconds and not written
 * since: what a process that crashed mid-write left (the reaper's sweep).
 * *removed counts it. */
enum cx_err cx_storage_sweep_staging(struct cx_storage *st, long stale_seconds,
                                     int *removed) CX_MUSTCHECK;

/* Reads an object through: its size and hex sha256 (65 bytes).
 * CX_ERR_NOT_FOUND when missing or not a regular file. */
enum cx_err cx_storage_digest(struct cx_storage *st, const char *key, uint64_t *size,
                              char sha256[65]) CX_MUSTCHECK;

/* Bytes first..last (inclusive) of an object into sink, in pieces as they
 * come; a false return of sink stops (CX_ERR_IO). CX_ERR_NOT_FOUND when
 * it is missing. */
typedef bool (*cx_storage_sink)(void *ctx, const void *data, size_t len);
enum cx_err cx_storage_read(struct cx_storage *st, const char *key, uint64_t first, uint64_t last,
                            cx_storage_sink sink, void *ctx) CX_MUSTCHECK;

#endif
