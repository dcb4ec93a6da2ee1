/* codexec: process-wide request metrics in Prometheus text format. */
#ifndef CX_METRICS_H
#define CX_METRICS_H

#include <stdint.h>

#include "buf.h"

/* route: a static string naming the route ("runs_create"); status: the
 * HTTP status; us: the request's duration in microseconds. Thread-safe. */
void cx_metrics_observe(const char *route, int status, int64_t us);

/* Appends the exposition text to b. */
void cx_metrics_render(struct cx_buf *b);

#endif
