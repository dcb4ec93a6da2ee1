#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage.h"
#include "util.h"

enum cx_err
cx_storage_check_writable(const char *dir, char *msg, size_t msglen)
{
    char path[4096];
    int fd, n;

    n = snprintf(path, sizeof(path), "%s/.health-XXXXXX", dir);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        snprintf(msg, msglen, "storage path too long");
        return CX_ERR_INVALID;
    }
    fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, msglen, "cannot create a file in storage: %s", strerror(errno));
        return CX_ERR_IO;
    }
    if (cx_write_all(fd, "ok\n", 3) || fsync(fd)) {
        snprintf(msg, msglen, "cannot write to storage: %s", strerror(errno));
        close(fd);
        unlink(path);
        return CX_ERR_IO;
    }
    close(fd);
    unlink(path);
    return CX_OK;
}
