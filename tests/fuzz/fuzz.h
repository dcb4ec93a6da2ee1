/* Shared by the libFuzzer targets: the input as a NUL-terminated string,
 * and the input cut into pieces at a separator byte. */
#ifndef CX_FUZZ_H
#define CX_FUZZ_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline char *
fuzz_string(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);

    if (s) {
        memcpy(s, data, size);
        s[size] = '\0';
    }
    return s;
}

/* Quiet: the targets' errors are expected and would only slow them down. */
static inline void
fuzz_quiet(void)
{
    static int done;

    if (!done && cx_log_open("/dev/null", CX_LOG_ERR) == CX_OK)
        done = 1;
}

#endif
