/* codexec: what one thread of work needs from the library: the shared
 * configuration and secret, and its own database and gateway handles. */
#ifndef CX_CTX_H
#define CX_CTX_H

struct cx_config;
struct cx_auth;
struct cx_db;
struct cx_gateway;
struct cx_storage;

/* Gateways a configuration may list (config.h). */
#define CX_GATEWAYS_MAX 16

struct cx_ctx {
    const struct cx_config *cfg;             /* shared, read-only */
    const struct cx_auth *auth;              /* shared, read-only */
    struct cx_db *db;                        /* this thread's */
    struct cx_gateway *gw;                   /* this thread's handle of the first gateway */
    struct cx_gateway *gws[CX_GATEWAYS_MAX]; /* ... of every gateway, in config order */
    unsigned ngws;
    struct cx_storage *store; /* this thread's handle of the artifact storage */
};

#endif
