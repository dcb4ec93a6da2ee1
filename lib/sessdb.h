/* codexec: what sessions do inside another statement's round trip: kept
 * out of the public session.h, as it takes a database call (db.h). */
#ifndef CX_SESSDB_H
#define CX_SESSDB_H

#include "codexec.h"

struct cx_db_call;
struct cx_session;

/* cx_session_release() with also (may be NULL) run in the same round trip
 * and transaction (each on its own if that fails; also alone when the
 * session is not locked): the run's end. */
void cx_session_release_with(struct cx_ctx *cx, struct cx_session *s, struct cx_db_call *also);

#endif
