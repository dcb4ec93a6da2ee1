/* codexec: process-wide request metrics in Prometheus text format. */
#ifndef CX_METRICS_H
#define CX_METRICS_H

#include <stdint.h>

#include "buf.h"

uint64_t cx_metrics_counter(enum cx_counter c);

/* A run's duration, for codexec_run_duration_seconds. */
void cx_metrics_run_duration(int64_t us);

#endif
