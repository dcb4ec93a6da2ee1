/* rawexec: the floor a run is measured against. Executes a cell N times on
 * a kernel's channels WebSocket with nothing else around it, and prints each
 * execute's milliseconds (reply and idle received), one per line.
 *
 *   rawexec GATEWAY_URL TOKEN KERNEL_ID N tuned|plain [CODE]
 *
 * tuned re-arms TCP_QUICKACK after every read (codexec's client); plain
 * leaves delayed ACKs on, as most WebSocket clients do. */
#include <curl/curl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/kernel.h"
#include "../../lib/log.h"
#include "../../lib/util.h"

int
main(int argc, char **argv)
{
    struct cx_kernel_conn *c = NULL;
    char msg[256];
    long n;

    if (argc < 6) {
        fprintf(stderr, "usage: rawexec GATEWAY_URL TOKEN KERNEL_ID N tuned|plain [CODE]\n");
        return 2;
    }
    n = strtol(argv[4], NULL, 10);
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) || cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    if (cx_kernel_conn_open(argv[1], argv[2], argv[3], strcmp(argv[5], "plain") != 0, &c, msg,
                            sizeof(msg))) {
        fprintf(stderr, "rawexec: %s\n", msg);
        return 1;
    }
    for (long i = 0; i < n; i++) {
        struct cx_exec e = {.code = argc > 6 ? argv[6] : "x=1", .store_history = true};
        int64_t t0 = cx_now_us();

        if (cx_kernel_execute(c, &e) ||
            cx_kernel_wait(c, &e, 1, 1, cx_now_us() + 60 * 1000000LL, NULL, NULL)) {
            fprintf(stderr, "rawexec: execute failed\n");
            return 1;
        }
        printf("%.3f\n", (double)(cx_now_us() - t0) / 1000.0);
        fflush(stdout);
        cx_exec_cleanup(&e, 1);
    }
    cx_kernel_conn_free(c);
    curl_global_cleanup();
    return 0;
}
