#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_fd = 2;
static int log_lvl = CX_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread char request_id[33];

static const char *const names[] = {"error", "warn", "info", "debug"};
/* With the lines going to the journal, each starts with its syslog
 * priority (sd-daemon(3)'s "<3>"): journalctl -p warning finds them. */
static const char *const journal_prefix[] = {"<3>", "<4>", "<6>", "<7>"};
static int to_journal = -1; /* -1: not yet known (the log not opened) */

/* Whether fd is the stream systemd connected to the journal
 * (JOURNAL_STREAM=device:inode, systemd.exec(5)). */
static int
is_journal(int fd)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    char tail;

    if (!js || sscanf(js, "%llu:%llu%c", &dev, &ino, &tail) != 2 || fstat(fd, &st) != 0)
        return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

enum cx_err
cx_log_open(const char *path, int level)
{
    int fd = 2;

    if (path && *path) {
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
        if (fd < 0)
            return CX_ERR_IO;
    }
    pthread_mutex_lock(&log_lock);
    if (log_fd > 2 && fd > 2) {
        /* Reopen (log rotation): keep the descriptor number other threads are
         * writing to, so no write ever lands on a closed or reused fd. */
        dup2(fd, log_fd);
        close(fd);
    } else {
        if (log_fd > 2)
            close(log_fd);
        log_fd = fd;
    }
    log_lvl = level;
    to_journal = fd == 2 && is_journal(2);
    pthread_mutex_unlock(&log_lock);
    return CX_OK;
}

void
cx_log_close(void)
{
    pthread_mutex_lock(&log_lock);
    if (log_fd > 2)
        close(log_fd);
    log_fd = 2;
    to_journal = -1; /* stderr again: whether it is the journal is asked anew */
    pthread_mutex_unlock(&log_lock);
}

const char *
cx_log_stderr_prefix(int level)
{
    int saved = errno; /* (the caller's strerror(errno) may come after) */
    const char *p =
        level >= CX_LOG_ERR && level <= CX_LOG_DEBUG && is_journal(2) ? journal_prefix[level] : "";

    errno = saved;
    return p;
}

int
cx_log_level(void)
{
    return log_lvl;
}

void
cx_log_set_request_id(const char *id)
{
    size_t i = 0;

    if (id)
        for (; id[i] && i < sizeof(request_id) - 1; i++)
            request_id[i] = (id[i] > ' ' && id[i] < 0x7f) ? id[i] : '?';
    request_id[i] = '\0';
}

static int log_json;

void
cx_log_set_json(bool json)
{
    log_json = json;
}

/* Appends s to line[*n] as JSON string content (control characters are
 * already gone: '"' and '\\' are what remains to escape). */
static void
json_text(char *line, size_t size, size_t *n, const char *s, size_t len)
{
    for (size_t i = 0; i < len && *n + 2 < size; i++) {
        if (s[i] == '"' || s[i] == '\\')
            line[(*n)++] = '\\';
        line[(*n)++] = s[i];
    }
}

/* One line out: the message (already formatted, control characters
 * replaced) with the time, level, process, thread, request id and, in
 * JSON, the extra fields (a JSON object's members, or ""). */
static void
emit(int level, const char *msg, size_t msglen, const char *fields)
{
    char line[4096];
    struct timespec ts;
    struct tm tm;
    const char *pri;
    size_t n;
    int k;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    if (to_journal < 0)
        to_journal = log_fd == 2 && is_journal(2);
    pri = to_journal ? journal_prefix[level] : "";

    if (log_json)
        k = snprintf(line, sizeof(line),
                     "%s{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                     "\"pid\":%ld,\"tid\":%ld,\"request_id\":\"%s\"%s%s,\"msg\":\"",
                     pri, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level], (long)getpid(),
                     (long)syscall(SYS_gettid), request_id, *fields ? "," : "", fields);
    else
        k = snprintf(line, sizeof(line),
                     "%s%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ [%s] %ld#%ld %s%s%s", pri,
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level], (long)getpid(), (long)syscall(SYS_gettid),
                     request_id[0] ? "req=" : "", request_id, request_id[0] ? " " : "");
    if (k < 0)
        return;
    n = (size_t)k < sizeof(line) - 8 ? (size_t)k : sizeof(line) - 8;
    if (log_json) {
        json_text(line, sizeof(line) - 3, &n, msg, msglen);
        line[n++] = '"';
        line[n++] = '}';
    } else {
        size_t m = msglen < sizeof(line) - 2 - n ? msglen : sizeof(line) - 2 - n;
        memcpy(line + n, msg, m);
        n += m;
    }
    line[n++] = '\n';
    /* One write per line: O_APPEND keeps lines whole across threads and processes. */
    while (write(log_fd, line, n) < 0 && errno == EINTR)
        ;
}

void
cx_log_write(int level, int errnum, const char *fmt, ...)
{
    char msg[2048], ebuf[128];
    va_list ap;
    size_t n;
    int k;

    if (level > log_lvl)
        return;
    if (level < CX_LOG_ERR)
        level = CX_LOG_ERR;
    if (level > CX_LOG_DEBUG)
        level = CX_LOG_DEBUG;
    va_start(ap, fmt);
    k = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    n = k < 0 ? 0 : (size_t)k < sizeof(msg) ? (size_t)k : sizeof(msg) - 1;
    if (errnum) {
        const char *e = strerror_r(errnum, ebuf, sizeof(ebuf));
        k = snprintf(msg + n, sizeof(msg) - n, " (%d: %s)", errnum, e);
        if (k > 0)
            n += (size_t)k;
        if (n > sizeof(msg) - 1)
            n = sizeof(msg) - 1;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)msg[i] < 0x20 || msg[i] == 0x7f)
            msg[i] = '?';
    emit(level, msg, n, "");
}

/* A word fit for a log field: letters, digits, "_" and "-" only, at most 31. */
static void
word(const char *in, char out[32])
{
    size_t i = 0;

    for (; in && in[i] && i < 31; i++) {
        char c = in[i];
        out[i] = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                         c == '_' || c == '-'
                     ? c
                     : '?';
    }
    out[i] = '\0';
}

void
cx_log_request(const char *method_in, const char *route_in, int status, long long us)
{
    char msg[256], fields[256], method[32], route[32];
    int n;

    if (CX_LOG_INFO > log_lvl)
        return;
    word(method_in, method); /* the client's: nothing of it may shape a line */
    word(route_in, route);
    n = snprintf(msg, sizeof(msg), "%s %s %d %lldus", method, route, status, us);
    snprintf(fields, sizeof(fields),
             "\"event\":\"request\",\"method\":\"%s\",\"route\":\"%s\",\"status\":%d,"
             "\"duration_us\":%lld",
             method, route, status, us);
    emit(CX_LOG_INFO, msg,
         n < 0                     ? 0
         : (size_t)n < sizeof(msg) ? (size_t)n
                                   : sizeof(msg) - 1,
         fields);
}

void
cx_log_run(const char *run_id, const char *status, long long ms, unsigned long long output_bytes,
           bool reset)
{
    char msg[256], fields[320];
    int n;

    if (CX_LOG_INFO > log_lvl)
        return;
    n = snprintf(msg, sizeof(msg), "run %s %s in %lldms output=%llu reset=%d", run_id, status, ms,
                 output_bytes, reset);
    snprintf(fields, sizeof(fields),
             "\"event\":\"run\",\"run_id\":\"%s\",\"status\":\"%s\",\"duration_ms\":%lld,"
             "\"output_bytes\":%llu,\"reset\":%s",
             run_id, status, ms, output_bytes, reset ? "true" : "false");
    emit(CX_LOG_INFO, msg,
         n < 0                     ? 0
         : (size_t)n < sizeof(msg) ? (size_t)n
                                   : sizeof(msg) - 1,
         fields);
}
