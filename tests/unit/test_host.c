/* lib/host.c: telling systemd (sd_notify's protocol, over a real datagram
 * socket bound here) and the watchdog's interval. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../lib/codexec.h"
#include "tap.h"

/* A datagram socket at path (or, with a leading '@', in the abstract
 * namespace), bound; -1 on failure. */
static int
listener(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0)
        return -1;
    return fd;
}

static void
heard(int fd, const char *want, const char *what)
{
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);

    buf[n > 0 ? n : 0] = '\0';
    ok(n > 0 && strcmp(buf, want) == 0, "%s", what);
}

int
main(void)
{
    char dir[] = "/tmp/cx-test-notify-XXXXXX", path[128], abstract[64], pid[32];
    char buf[16];
    int fd, afd;

    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof(path), "%s/notify", dir);
    fd = listener(path);
    ok(fd >= 0, "a notify socket");
    setenv("NOTIFY_SOCKET", path, 1);
    cx_host_notify("READY=1");
    heard(fd, "READY=1", "READY=1 reaches a socket named by its path");
    snprintf(abstract, sizeof(abstract), "@cx-test-notify-%ld", (long)getpid());
    afd = listener(abstract);
    setenv("NOTIFY_SOCKET", abstract, 1);
    cx_host_notify("STOPPING=1");
    heard(afd, "STOPPING=1", "... and an abstract one (@name)");
    setenv("NOTIFY_SOCKET", "relative/name", 1);
    cx_host_notify("READY=1");
    ok(recv(fd, buf, sizeof(buf), 0) < 0 && recv(afd, buf, sizeof(buf), 0) < 0,
       "a NOTIFY_SOCKET that is neither is not used");
    unsetenv("NOTIFY_SOCKET");
    cx_host_notify("READY=1"); /* not under systemd: nothing, no crash */
    ok(recv(fd, buf, sizeof(buf), 0) < 0, "without NOTIFY_SOCKET, nothing is sent");

    unsetenv("WATCHDOG_USEC");
    is_int((int)cx_host_watchdog_us(), 0, "no watchdog without WATCHDOG_USEC");
    setenv("WATCHDOG_USEC", "30000000", 1);
    ok(cx_host_watchdog_us() == 30000000, "WATCHDOG_USEC read");
    snprintf(pid, sizeof(pid), "%ld", (long)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    ok(cx_host_watchdog_us() == 0, "another process's watchdog is not ours");
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    ok(cx_host_watchdog_us() == 30000000, "ours when WATCHDOG_PID is this process");
    setenv("WATCHDOG_USEC", "30s", 1);
    ok(cx_host_watchdog_us() == 0, "a malformed interval is none");

    close(fd);
    close(afd);
    unlink(path);
    rmdir(dir);
    return tap_done();
}
