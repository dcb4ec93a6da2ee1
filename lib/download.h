/* codexec: downloads: which bytes a request may have, and signed links. */
#ifndef CX_DOWNLOAD_H
#define CX_DOWNLOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "auth.h"
#include "codexec.h"

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
