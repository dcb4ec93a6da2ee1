/* codexec-fcgi: method + path → handler. */
#ifndef CX_FCGI_ROUTER_H
#define CX_FCGI_ROUTER_H

#include "request.h"

/* Finds the route for r->method and r->path, fills r->route and
 * r->captures, and runs the handler; answers 404 or 405 itself. */
void cx_router_dispatch(struct cx_req *r);

#endif
