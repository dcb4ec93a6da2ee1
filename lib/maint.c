#include <string.h>

#include "artifact.h"
#include "maint.h"
#include "run.h"
#include "session.h"

enum cx_err
cx_maint_sweep(struct cx_ctx *cx, int limit, bool artifacts, struct cx_maint *done)
{
    enum cx_err rc, rc2;

    memset(done, 0, sizeof(*done));
    rc = cx_session_reap(cx, limit, &done->sessions);
    /* each part goes on after another failed: they share nothing */
    rc2 = cx_run_expire(cx, &done->runs);
    if (rc == CX_OK)
        rc = rc2;
    if (artifacts) {
        rc2 = cx_artifact_gc(cx, &done->artifacts);
        if (rc == CX_OK)
            rc = rc2;
    }
    return rc;
}
