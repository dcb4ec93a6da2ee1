/* A kernel's bytes on its sockets, as the launcher's relay reads them
 * (launcher/relay.c): whatever they are, the parser never reads outside them,
 * and it decides the same, run ends included, whether the bytes come whole
 * or in pieces (a socket hands them over in pieces of any size). */
#include <stdlib.h>

#include "../../launcher/relay.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int channel, whole;
    size_t piece;
    uint64_t ends_whole = 0, ends = 0;

    fuzz_quiet();
    if (size < 2)
        return 0;
    channel = data[0] % CX_SANDBOX_PORTS;
    piece = (size_t)data[1] % 97 + 1;
    whole = cx_relay_parse(data + 2, size - 2, channel, size, &ends_whole);
    if (cx_relay_parse(data + 2, size - 2, channel, piece, &ends) != whole ||
        (whole >= 0 && ends != ends_whole))
        abort(); /* the same bytes, cut otherwise: another answer */
    return 0;
}
