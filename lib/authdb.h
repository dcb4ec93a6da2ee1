/* codexec: API keys inside another statement (internal to lib/).
 *
 * A download checks its key and finds its artifact in one round trip: the
 * statement joins api_keys (as k) with what it reads. */
#ifndef CX_AUTHDB_H
#define CX_AUTHDB_H

#include <libpq-fe.h>
#include <stddef.h>

#include "codexec.h"

struct cx_sql;

/* For a statement that checks a key and reads something else in the same
 * round trip (a download checks the key and finds the artifact at once):
 * $1 is the key's hash, the first CX_AUTH_KEY_NCOLS columns are these, and
 * the table api_keys is named k. */
#define CX_AUTH_KEY_COLUMNS                                                                        \
    "k.id, k.user_id, k.require_approval, k.key_hash,"                                             \
    " k.last_used_at IS NULL OR k.last_used_at < now() - interval '5 minutes', k.on_behalf"
#define CX_AUTH_KEY_MATCH "k.key_hash = $1::bytea AND k.revoked_at IS NULL"
#define CX_AUTH_KEY_NCOLS 6

/* cx_auth_check_key() with the caller's statement q (see above; at most one
 * row), whose parameters after $1 are more[0..nmore). On CX_OK *res holds
 * the row for the caller's own columns: PQclear() it. */
enum cx_err cx_auth_check_key_with(const struct cx_auth *a, struct cx_db *db, const char *key,
                                   size_t len, struct cx_sql *q, const char *const *more, int nmore,
                                   struct cx_principal *p, PGresult **res) CX_MUSTCHECK;

#endif
