/* codexec: capture of the files a run produced or changed.
 *
 * The kernel side (capture_helper.py, embedded) scans the workspace after the
 * user's cell, in the same pipelined batch, and streams only changed files
 * back as chunked display_data messages. This side turns those messages into
 * storage writers (temporary files, hashed as they arrive) and verifies size
 * and sha256 against what the kernel reported. See docs/internals/capture.md. */
#ifndef CX_CAPTURE_H
#define CX_CAPTURE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "codexec.h"

struct cx_config;
struct cx_storage_writer;
struct cx_storage;
struct cx_capture;

#define CX_CAPTURE_MIME "application/vnd.codexec.capture+json"

struct cx_captured {
    char path[1024]; /* relative to the workspace */
    uint64_t size;
    char sha256[65];
    char mime[128];
    struct cx_storage_writer *w; /* finished; owned until taken */
};

/* The writers stage in store (borrowed: it outlives the capture). Free
 * with _free. */
enum cx_err cx_capture_new(const struct cx_config *cfg, struct cx_storage *store,
                           struct cx_capture **out) CX_MUSTCHECK;
void cx_capture_free(struct cx_capture *c);

/* What a user has left of user_quota_bytes: CX_OK with *left, else the
 * capture keeps the per-run bound alone. */
typedef enum cx_err (*cx_capture_left_fn)(void *ctx, const char *user, uint64_t *left);

/* Makes the capture user's: the bytes it stages count, with what every
 * other capture of the user in this process stages, against what the user
 * has left, asked of left_fn once, when the first bytes are to be staged.
 * Past it, files are skipped as quota_exceeded before they are written.
 * Without an owner a capture stages up to user_quota_bytes. */
void cx_capture_set_owner(struct cx_capture *c, const char *user, cx_capture_left_fn left_fn,
                          void *ctx);

/* Bytes staged now by this process's captures of user (for tests). */
uint64_t cx_capture_staged_for(const char *user);

/* The request metadata for the helper, which the run's epilogue
 * (lib/epilogue.py) runs (new reference): limits, the outputs globs
 * (borrowed, may be NULL), the kernel-side state file named after
 * kernel_id, and the helper's sha256, and its source with with_source
 * (the kernel keeps the helper once it has had it). rescan: ignore the
 * record of the last scan (every file is offered). */
/* The kernel's file of the capture's last scan (a thread's buffer). */
const char *cx_capture_state_path(const char *kernel_id);

json_t *cx_capture_metadata(const struct cx_config *cfg, const char *kernel_id, json_t *outputs,
                            bool rescan, bool with_source);

/* Handles one capture message (the value under CX_CAPTURE_MIME) and the
 * message's first binary buffer (NULL when it has none): a chunk's bytes
 * are that buffer, or base64 in its "data" when the kernel could not send
 * buffers. */
void cx_capture_on_message(struct cx_capture *c, json_t *msg, const void *buf, size_t len);

/* Handles the helper's "done" record (the run epilogue's answer carries
 * it; NULL or anything but a done record: the helper failed). */
void cx_capture_on_result(struct cx_capture *c, json_t *done);

/* Adds a rich output (a display_data image, say) as a captured file named
 * output-<n>.<ext>. data: the decoded bytes. Returns that name (valid until
 * the next call); NULL when the output was skipped (the skipped list says
 * why under that name: no result may point at a file of that name the
 * code wrote itself) or came between a file's chunks and was ignored. */
const char *cx_capture_add_output(struct cx_capture *c, const char *mime, const void *data,
                                  size_t len);

/* Adds a finished writer as a captured file (takes w). */
void cx_capture_add_file(struct cx_capture *c, const char *path, struct cx_storage_writer *w,
                         uint64_t size, const char sha256[65], const char *mime);

/* Files received whole and verified. */
size_t cx_capture_count(const struct cx_capture *c);
struct cx_captured *cx_capture_file(struct cx_capture *c, size_t i);

/* Skipped paths so far: [{"path", "reason"}] (borrowed). */
json_t *cx_capture_skipped(struct cx_capture *c);
/* Adds a skipped entry. */
void cx_capture_skip(struct cx_capture *c, const char *path, const char *reason);

/* Whether the kernel side reported completion ("done"). */
bool cx_capture_done(const struct cx_capture *c);

#endif
