/* Configuration files: codexec.conf and sandbox.conf, whatever an operator
 * (or a broken deployment) puts in them. */
#include "../../lib/config.h"
#include "../../launcher/sandbox.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_string(data, size), err[256];
    struct cx_config cfg;
    struct cx_sandbox_conf sc;

    if (!s)
        return 0;
    fuzz_quiet();
    if (cx_config_parse(&cfg, "fuzz", s, err, sizeof(err)) == CX_OK)
        cx_config_cleanup(&cfg);
    if (cx_sandbox_conf_parse(&sc, "fuzz", s, err, sizeof(err)) == CX_OK)
        cx_sandbox_conf_cleanup(&sc);
    free(s);
    return 0;
}
