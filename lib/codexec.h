/* codexec: the public interface of libcodexec (pkg-config codexec).
 *
 * Everything a host of the library calls: codexec-fcgi and codexec-admin
 * use nothing else, and the shared library exports exactly the functions
 * declared in the headers below (lib/libcodexec.sym, checked by
 * tests/check-exports.sh). A host opens one struct cx_ctx per thread
 * (cx_host_ctx_open) over a configuration (cx_config_load) and the server
 * secret (cx_auth_new), then calls the modules. Every fallible call returns
 * enum cx_err; docs/internals/map.md says which module does what. */
#ifndef CODEXEC_H
#define CODEXEC_H

#include "err.h"
#include "buf.h"
#include "util.h"
#include "log.h"
#include "config.h"
#include "ctx.h"
#include "host.h"
#include "auth.h"
#include "http.h"
#include "storage.h"
#include "metrics.h"
#include "health.h"
#include "runreq.h"
#include "run.h"
#include "lane.h"
#include "artifact.h"
#include "download.h"
#include "dlcache.h"
#include "page.h"
#include "session.h"
#include "budget.h"
#include "prestart.h"
#include "maint.h"
#include "watch.h"

#endif
