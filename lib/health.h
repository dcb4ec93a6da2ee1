/* codexec: the health check behind GET /v1/health. */
#ifndef CX_HEALTH_H
#define CX_HEALTH_H

#include <jansson.h>
#include <stdbool.h>

#include "codexec.h"

/* Drops the shared result (at exit, and for tests). */
void cx_health_forget(void);

#endif
