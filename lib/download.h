/* codexec: downloads: which bytes a request may have, and signed links. */
#ifndef CX_DOWNLOAD_H
#define CX_DOWNLOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "auth.h"
#include "ctx.h"
#include "dlinfo.h"
#include "err.h"

/* The user's artifact version (0 = current). CX_ERR_NOT_FOUND alike for a
 * missing, deleted or foreign artifact, a missing version, a malformed id. */
enum cx_err cx_download_resolve(struct cx_ctx *cx, const char *user, const char *id, int version,
                                struct cx_download *d) CX_MUSTCHECK;

/* For a request with an API key: checks the key (as cx_auth_check_key(),
 * filling *who) and resolves the artifact in one statement, one round trip.
 * CX_ERR_UNAUTHORIZED for a bad key, then as cx_download_resolve(). */
enum cx_err cx_download_resolve_for_key(struct cx_ctx *cx, const char *key, size_t len,
                                        const char *id, int version, struct cx_principal *who,
                                        struct cx_download *d) CX_MUSTCHECK;

/* A download request's credentials, as the web server passed them. */
struct cx_download_request {
    const char *id;            /* the artifact id from the path */
    const char *query;         /* the query string, "" when absent */
    const char *remote_user;   /* REMOTE_USER when the web server authenticated, else NULL */
    const char *authorization; /* the Authorization header, or NULL */
};

/* GET /v1/artifacts/{id}/content: who may read what. A valid signed link
 * names the user and version; else REMOTE_USER; else an API key, checked in
 * the same statement that finds the artifact (one round trip). *who is the
 * principal (empty for a link). CX_ERR_FORBIDDEN for a tampered or moved
 * link, CX_ERR_EXPIRED for an old one, CX_ERR_UNAUTHORIZED without valid
 * credentials (also before a bad ?version: a 401 never depends on the
 * query), CX_ERR_INVALID for a bad ?version, CX_ERR_NOT_FOUND alike for a
 * missing and a foreign artifact. msg says which. */
enum cx_err cx_download_authorize(struct cx_ctx *cx, const struct cx_download_request *q,
                                  struct cx_principal *who, struct cx_download *d, char *msg,
                                  size_t msglen) CX_MUSTCHECK;

/* Opens the version's bytes for reading (never through a symlink); local
 * storage only. */
enum cx_err cx_download_open(struct cx_ctx *cx, const struct cx_download *d, int *fd) CX_MUSTCHECK;

/* Whether the bytes are in an object store (read them with
 * cx_download_read), else in files (cx_download_open). */
bool cx_download_from_store(struct cx_ctx *cx);

/* A presigned URL of the version's object, valid s3_url_expiry seconds:
 * for a browser (a redirect: the store sends its type and disposition), or
 * its path and query only (for nginx's internal location). */
enum cx_err cx_download_presign(struct cx_ctx *cx, const struct cx_download *d, bool for_browser,
                                char *out, size_t outlen) CX_MUSTCHECK;

/* Bytes first..last of the version into sink as they come (storage.h
 * cx_storage_read). */
enum cx_err cx_download_read(struct cx_ctx *cx, const struct cx_download *d, uint64_t first,
                             uint64_t last, bool (*sink)(void *ctx, const void *data, size_t len),
                             void *ctx) CX_MUSTCHECK;

/* POST /v1/artifacts/{id}/links: body {"version"?, "expires_in"?} (borrowed,
 * may be NULL). *out = {"url", "expires_at", "version"}. The link is bound
 * to the user, the artifact, the version, the expiry and the key that made
 * it (revoking that key kills the link), HMAC'd with the server's link key. */
enum cx_err cx_link_create(struct cx_ctx *cx, const struct cx_principal *who, const char *id,
                           json_t *body, json_t **out, char *msg, size_t msglen) CX_MUSTCHECK;

/* The signed link itself, {"url", "expires_at", "version"} (new reference,
 * NULL when out of memory), for a version the caller knows to be the
 * user's: no database query (the artifacts page signs a link per row).
 * From d: the artifact id and version, and what a web server that checks
 * links itself needs to serve it (key, MIME type, sha256, file name). */
json_t *cx_link_sign(struct cx_ctx *cx, const struct cx_principal *who, const struct cx_download *d,
                     long long expires_in);

/* Checks a signed link's query for artifact id. CX_ERR_NOT_FOUND when the
 * query carries no signature (not a link); CX_ERR_FORBIDDEN when tampered,
 * moved to another artifact or version, or its key is revoked;
 * CX_ERR_EXPIRED when past its expiry. On CX_OK: the user and version. */
enum cx_err cx_link_verify(struct cx_ctx *cx, const char *query, const char *id,
                           char user[CX_USER_MAX + 1], int *version) CX_MUSTCHECK;

#endif
