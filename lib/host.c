#include "codexec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "db.h"
#include "gateway.h"
#include "health.h"
#include "kernel.h"
#include "storage.h"

enum cx_err
cx_host_ctx_open(struct cx_ctx *cx, const struct cx_config *cfg, const struct cx_auth *auth)
{
    enum cx_err rc;

    *cx = (struct cx_ctx){.cfg = cfg, .auth = auth};
    rc = cx_db_new(cfg->database, &cx->db);
    if (rc == CX_OK)
        rc = cx_storage_new(cfg, &cx->store);
    for (unsigned i = 0; rc == CX_OK && i < cfg->ngateways; i++) {
        rc = cx_gateway_new(cfg->gateways[i].url, cfg->gateways[i].token, &cx->gws[i]);
        if (rc == CX_OK)
            cx->ngws++;
    }
    cx->gw = cx->gws[0];
    return rc;
}

void
cx_host_ctx_close(struct cx_ctx *cx)
{
    for (unsigned i = 0; i < cx->ngws; i++)
        cx_gateway_free(cx->gws[i]);
    cx_db_free(cx->db);
    cx_storage_free(cx->store);
    cx->store = NULL;
    memset(cx->gws, 0, sizeof(cx->gws));
    cx->ngws = 0;
    cx->gw = NULL;
    cx->db = NULL;
}

void
cx_host_tick(void)
{
    cx_kernel_pool_drain_idle();
}

void
cx_host_shutdown(void)
{
    cx_kernel_pool_clear();
    cx_health_forget();
}

enum cx_err
cx_host_migrate(struct cx_ctx *cx, int *applied)
{
    return cx_db_migrate(cx->db, applied);
}

/* sd_notify(3)'s protocol, without libsystemd: one datagram to the socket
 * $NOTIFY_SOCKET names (a path, or "@name" in the abstract namespace). */
void
cx_host_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = path ? strlen(path) : 0;
    socklen_t len;
    int fd;

    if (n < 2 || n >= sizeof(sa.sun_path) || (path[0] != '/' && path[0] != '@'))
        return;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
        cx_log_warn(errno, "the service manager could not be told %.16s", state);
    close(fd);
}

int64_t
cx_host_watchdog_us(void)
{
    const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    char *end;
    long long v;

    if (!us)
        return 0;
    if (pid && strtoll(pid, &end, 10) != (long long)getpid())
        return 0; /* meant for another process (a parent's) */
    errno = 0;
    v = strtoll(us, &end, 10);
    return errno || *end || v <= 0 ? 0 : (int64_t)v;
}
