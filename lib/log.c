#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_fd = 2;
static int log_lvl = CX_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread char request_id[33];

static const char *const names[] = {"error", "warn", "info", "debug"};

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
    pthread_mutex_unlock(&log_lock);
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

void
cx_log_write(int level, int errnum, const char *fmt, ...)
{
    char line[2048], ebuf[128];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    size_t n, i, head;
    int k;

    if (level > log_lvl)
        return;
    if (level < CX_LOG_ERR)
        level = CX_LOG_ERR;
    if (level > CX_LOG_DEBUG)
        level = CX_LOG_DEBUG;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    k = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ [%s] %ld#%ld %s%s%s",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 ts.tv_nsec / 1000000, names[level], (long)getpid(), (long)syscall(SYS_gettid),
                 request_id[0] ? "req=" : "", request_id, request_id[0] ? " " : "");
    if (k < 0)
        return;
    head = (size_t)k < sizeof(line) ? (size_t)k : sizeof(line) - 1;
    va_start(ap, fmt);
    k = vsnprintf(line + head, sizeof(line) - head, fmt, ap);
    va_end(ap);
    n = k < 0 ? head : head + (size_t)k;
    if (n > sizeof(line) - 1)
        n = sizeof(line) - 1;
    if (errnum) {
        const char *e = strerror_r(errnum, ebuf, sizeof(ebuf));
        k = snprintf(line + n, sizeof(line) - n, " (%d: %s)", errnum, e);
        if (k > 0)
            n += (size_t)k;
        if (n > sizeof(line) - 1)
            n = sizeof(line) - 1;
    }
    for (i = head; i < n; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
            line[i] = '?';
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    /* One write per line: O_APPEND keeps lines whole across threads and processes. */
    while (write(log_fd, line, n) < 0 && errno == EINTR)
        ;
}
