#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../lib/log.h"
#include "tap.h"

static char *
slurp(const char *path)
{
    static char buf[8192];
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    if (fd >= 0)
        close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

int
main(void)
{
    char path[] = "/tmp/cx-test-log-XXXXXX";
    int fd = mkstemp(path);
    char *text;

    if (fd < 0)
        return 1;
    close(fd);
    ok(cx_log_open(path, CX_LOG_INFO) == CX_OK, "opens a log file");
    cx_log_set_request_id("abc123");
    cx_log_info("first %d", 1);
    cx_log_debug("hidden at info level");
    cx_log_err(2, "open() of \"%s\" failed", "/x");
    cx_log_info("line\nforged [error] line\r");
    cx_log_set_request_id(NULL);
    cx_log_warn(0, "no request");
    text = slurp(path);
    ok(strstr(text, "[info]") && strstr(text, "req=abc123 first 1"),
       "level and request id on the line");
    ok(!strstr(text, "hidden"), "debug is filtered at info");
    ok(strstr(text, "(2: No such file or directory)") != NULL,
       "errno appended as its own argument");
    ok(strstr(text, "line?forged [error] line?") != NULL, "control characters cannot forge lines");
    {
        int lines = 0;
        for (char *p = text; *p; p++)
            lines += *p == '\n';
        is_int(lines, 4, "one line per event");
    }
    ok(strstr(text, "[warn]") && !strstr(strstr(text, "[warn]"), "req="),
       "no request id when cleared");
    cx_log_close();
    unlink(path);

    /* stderr connected to the journal (JOURNAL_STREAM names it): each line
     * starts with its syslog priority; stderr elsewhere: none */
    {
        char jpath[] = "/tmp/cx-test-journal-XXXXXX", js[64];
        int jfd = mkstemp(jpath), saved = dup(2);
        struct stat st;

        if (jfd < 0 || saved < 0 || fstat(jfd, &st) != 0)
            return 1;
        dup2(jfd, 2);
        snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
        setenv("JOURNAL_STREAM", js, 1);
        ok(cx_log_open(NULL, CX_LOG_INFO) == CX_OK, "logs to stderr");
        cx_log_err(0, "bad");
        cx_log_info("fine");
        ok(!strcmp(cx_log_stderr_prefix(CX_LOG_WARN), "<4>"),
           "a line written to stderr by hand starts with its priority too");
        setenv("JOURNAL_STREAM", "1:2", 1); /* another stream's */
        ok(cx_log_open("", CX_LOG_INFO) == CX_OK, "reopens stderr");
        cx_log_warn(0, "elsewhere");
        is_str(cx_log_stderr_prefix(CX_LOG_ERR), "", "... and with none elsewhere");
        unsetenv("JOURNAL_STREAM");
        dup2(saved, 2);
        close(saved);
        close(jfd);
        text = slurp(jpath);
        ok(strncmp(text, "<3>", 3) == 0 && strstr(text, "\n<6>") != NULL,
           "in the journal, an error is <3> and info <6>");
        ok(strstr(text, "\n<4>") == NULL && strstr(text, "elsewhere") != NULL,
           "on a stderr that is not the journal, no priority");
        unlink(jpath);
    }
    return tap_done();
}
