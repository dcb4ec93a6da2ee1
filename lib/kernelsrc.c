/* The Python codexec runs in kernels (lib/codexec.h cx_kernel_source): a
 * file of its own, so that the launcher, which asks for them, links
 * nothing else of the library for it (libcrypto's relocations alone were
 * 400 KiB of each launcher's memory). */
#include <string.h>

#include "codexec.h"

extern const char cx_epilogue_py[];
extern const char cx_capture_helper_py[];
extern const char cx_files_helper_py[];

const char *
cx_kernel_source(const char *name)
{
    if (!strcmp(name, "epilogue"))
        return cx_epilogue_py;
    if (!strcmp(name, "capture"))
        return cx_capture_helper_py;
    if (!strcmp(name, "files"))
        return cx_files_helper_py;
    return NULL;
}
