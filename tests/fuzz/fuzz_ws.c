/* WebSocket frames as a peer could send them (the gateway, or whatever
 * answers on its port): every message they make is received, with a small
 * and a large message cap. */
#include "../../lib/buf.h"
#include "../../lib/util.h"
#include "../../lib/ws.h"
#include "fuzz.h"

static void
receive_all(const uint8_t *data, size_t size, size_t max_message)
{
    struct cx_ws *ws = NULL;
    struct cx_buf out;
    enum cx_ws_opcode op;

    if (cx_ws_buffered(data, size, max_message, &ws) != CX_OK)
        return;
    cx_buf_init(&out, max_message + 1);
    for (int i = 0; i < 10000; i++) {
        enum cx_err rc = cx_ws_recv(ws, cx_now_us() + 1000000, &out, &op);
        if (rc != CX_OK && rc != CX_ERR_TOO_LARGE)
            break;
    }
    cx_buf_cleanup(&out);
    cx_ws_free(ws);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    receive_all(data, size, 64);
    receive_all(data, size, 1 << 20);
    return 0;
}
