#include <fcntl.h>
#include <stdlib.h>
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
    return tap_done();
}
