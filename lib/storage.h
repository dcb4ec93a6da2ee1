/* codexec: artifact storage (local filesystem backend).
 *
 * Keys are derived by the server only (cx_storage_key): never from a path a
 * user chose. Writing goes through a writer: bytes stream into a temporary
 * file while their SHA-256 and size are computed, then the file is synced
 * and renamed into place, and the directory synced. The caller commits its
 * database rows after cx_storage_writer_commit() and removes the file again
 * if that commit fails (docs/internals/storage.md). The interface is narrow
 * so that an object-store backend can replace it. */
#ifndef CX_STORAGE_H
#define CX_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct cx_storage_writer;

/* Creates, syncs and removes a probe file under dir: CX_OK when the
 * storage can take writes. msg receives what failed. */
enum cx_err cx_storage_check_writable(const char *dir, char *msg, size_t msglen) CX_MUSTCHECK;

/* "artifacts/<user_key>/<artifact_id>/v<version>/<safe_filename>". */
enum cx_err cx_storage_key(const char *user, const char *artifact_id, int version,
                           const char *filename, char *out, size_t outlen) CX_MUSTCHECK;

/* A basename safe for keys and headers: no separators, NUL, control
 * characters or leading dots; invalid UTF-8 replaced; at most 255 bytes cut
 * on a character boundary; "file" when nothing is left. out: 256 bytes. */
void cx_storage_safe_filename(const char *name, size_t len, char out[256]);

/* Starts writing an object under root; its key is chosen at commit (it may
 * depend on rows not inserted yet). Bytes stage in root/.staging/. Free
 * with _commit or _abort. */
enum cx_err cx_storage_writer_new(const char *root, struct cx_storage_writer **out) CX_MUSTCHECK;
enum cx_err cx_storage_writer_write(struct cx_storage_writer *w, const void *data,
                                    size_t len) CX_MUSTCHECK;
/* Bytes written so far. */
uint64_t cx_storage_writer_size(const struct cx_storage_writer *w);
/* Syncs the temporary file and reports size and hex sha256 (65 bytes). */
enum cx_err cx_storage_writer_finish(struct cx_storage_writer *w, uint64_t *size,
                                     char sha256[65]) CX_MUSTCHECK;
/* Renames into place as key and syncs the directory; frees w either way. */
enum cx_err cx_storage_writer_commit(struct cx_storage_writer *w, const char *key) CX_MUSTCHECK;
/* Removes the temporary file and frees w. NULL is a no-op. */
void cx_storage_writer_abort(struct cx_storage_writer *w);

/* Removes an object (missing is fine) and its now empty directories. */
enum cx_err cx_storage_remove(const char *root, const char *key) CX_MUSTCHECK;

/* Calls fn with the key of every object under root (and, with
 * stale_seconds > 0, of every staging file older than that, as
 * ".staging/<name>" with staging true; younger ones are writes in
 * progress). fn may remove what it is given. Empty directories left behind
 * are removed when prune is set. A non-OK return of fn stops the walk. */
typedef enum cx_err (*cx_storage_walk_fn)(void *ctx, const char *key, bool staging);
enum cx_err cx_storage_walk(const char *root, long stale_seconds, bool prune, cx_storage_walk_fn fn,
                            void *ctx) CX_MUSTCHECK;

/* Reads an object through: its size and hex sha256 (65 bytes).
 * CX_ERR_NOT_FOUND when missing or not a regular file. */
enum cx_err cx_storage_digest(const char *root, const char *key, uint64_t *size,
                              char sha256[65]) CX_MUSTCHECK;

/* The object's path on disk (for open(2), X-Accel-Redirect, fsck). */
enum cx_err cx_storage_path(const char *root, const char *key, char *out,
                            size_t outlen) CX_MUSTCHECK;

#endif
