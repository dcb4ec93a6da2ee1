/* codexec: logging. One line per event, one write(2) per line.
 *
 * Lines carry the request id of the calling thread. They must never carry
 * user content (code, output, error text, file contents) nor keys or tokens:
 * log ids, sizes, hashes, statuses and timings. Control characters in a
 * message are replaced so a value can never forge a line. */
#ifndef CX_LOG_H
#define CX_LOG_H

#include <stdbool.h>

#include "codexec.h"

void cx_log_close(void);

/* A run's end: "run <id> <status> in <ms>ms output=<n> reset=<0|1>"; in
 * JSON with run_id, status, duration_ms, output_bytes, reset. */
void cx_log_run(const char *run_id, const char *status, long long ms,
                unsigned long long output_bytes, bool reset);

#endif
