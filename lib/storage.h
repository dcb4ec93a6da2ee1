/* codexec: artifact storage (local filesystem backend). */
#ifndef CX_STORAGE_H
#define CX_STORAGE_H

#include <stddef.h>

#include "err.h"

/* Creates, syncs and removes a probe file under dir: CX_OK when the
 * storage can take writes. msg receives what failed. */
enum cx_err cx_storage_check_writable(const char *dir, char *msg, size_t msglen) CX_MUSTCHECK;

#endif
