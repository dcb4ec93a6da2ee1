#include <stddef.h>

#include "codexec.h"

static const char *const messages[CX_ERR__COUNT] = {
    [CX_OK] = "success",
    [CX_ERR_NOMEM] = "out of memory",
    [CX_ERR_INVALID] = "invalid input",
    [CX_ERR_TOO_LARGE] = "input too large",
    [CX_ERR_NOT_FOUND] = "not found",
    [CX_ERR_INPUT_NOT_FOUND] = "input not found",
    [CX_ERR_UNAUTHORIZED] = "unauthorized",
    [CX_ERR_FORBIDDEN] = "forbidden",
    [CX_ERR_EXPIRED] = "expired",
    [CX_ERR_CONFLICT] = "conflict",
    [CX_ERR_QUOTA] = "quota exceeded",
    [CX_ERR_CAPACITY] = "capacity exhausted",
    [CX_ERR_TOO_MANY_RUNS] = "too many runs in progress",
    [CX_ERR_BUSY] = "busy",
    [CX_ERR_IO] = "input/output error",
    [CX_ERR_DB] = "database error",
    [CX_ERR_GATEWAY] = "gateway error",
    [CX_ERR_TIMEOUT] = "timed out",
    [CX_ERR_PROTOCOL] = "protocol error",
    [CX_ERR_KERNEL_DIED] = "the kernel died",
    [CX_ERR_INTERNAL] = "internal error",
    [CX_ERR_INVALID_PATH] = "invalid path",
    [CX_ERR_NOT_A_FILE] = "not a regular file",
    [CX_ERR_RUN_ENDED] = "the run already ended",
    [CX_ERR_IDEMPOTENCY] = "the idempotency key was used for another request",
    [CX_ERR_IN_PROGRESS] = "the first request of this idempotency key is in progress",
};

const char *
cx_strerror(enum cx_err err)
{
    if ((unsigned)err >= CX_ERR__COUNT || messages[err] == NULL)
        return "unknown error";
    return messages[err];
}
