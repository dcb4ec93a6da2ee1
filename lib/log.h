/* codexec: logging. One line per event, one write(2) per line.
 *
 * Lines carry the request id of the calling thread. They must never carry
 * user content (code, output, error text, file contents) nor keys or tokens:
 * log ids, sizes, hashes, statuses and timings. Control characters in a
 * message are replaced so a value can never forge a line. */
#ifndef CX_LOG_H
#define CX_LOG_H

#include <stdbool.h>

#include "err.h"

enum cx_log_level { CX_LOG_ERR = 0, CX_LOG_WARN, CX_LOG_INFO, CX_LOG_DEBUG };

/* path NULL or "" = stderr. May be called again (SIGHUP) to reopen. */
enum cx_err cx_log_open(const char *path, int level) CX_MUSTCHECK;
void cx_log_close(void);
int cx_log_level(void);

/* The calling thread's request id (copied, at most 32 chars); NULL clears. */
void cx_log_set_request_id(const char *id);

/* JSON lines instead of text: one object per line with time, level, pid,
 * tid, request_id, msg, and for requests and runs their fields. */
void cx_log_set_json(bool json);

/* A request's summary line: "GET health 200 1234us"; in JSON with method,
 * route, status and duration_us. method and route are codexec's own words
 * (a route name, never the path). */
void cx_log_request(const char *method, const char *route, int status, long long us);

/* A run's end: "run <id> <status> in <ms>ms output=<n> reset=<0|1>"; in
 * JSON with run_id, status, duration_ms, output_bytes, reset. */
void cx_log_run(const char *run_id, const char *status, long long ms,
                unsigned long long output_bytes, bool reset);

/* errnum: an errno value appended as "(N: text)", or 0. */
void cx_log_write(int level, int errnum, const char *fmt, ...) CX_PRINTF(3, 4);

#define cx_log_err(errnum, ...)  cx_log_write(CX_LOG_ERR, (errnum), __VA_ARGS__)
#define cx_log_warn(errnum, ...) cx_log_write(CX_LOG_WARN, (errnum), __VA_ARGS__)
#define cx_log_info(...)         cx_log_write(CX_LOG_INFO, 0, __VA_ARGS__)
#define cx_log_debug(...)                                                                          \
    do {                                                                                           \
        if (cx_log_level() >= CX_LOG_DEBUG)                                                        \
            cx_log_write(CX_LOG_DEBUG, 0, __VA_ARGS__);                                            \
    } while (0)

#endif
