/* rawexec: the floor a run is measured against. Executes a cell N times on
 * a kernel's channels WebSocket with nothing else around it, and prints each
 * execute's milliseconds (reply and idle received), one per line.
 *
 *   rawexec GATEWAY_URL TOKEN KERNEL_ID N|Ss tuned|plain [CODE]
 *
 * N executes, or as many as fit in S seconds ("5s"). With EPILOGUE=capture
 * in the environment each execute carries codexec's run epilogue (restart
 * token, reaping, capture), as a run's cell does: the kernel-side floor of
 * a run.
 * EPILOGUE=empty pipelines an empty silent execute after each one, and
 * EPILOGUE=code:SRC a silent SRC (to weigh a second request);
 * EPILOGUE=expr:EXPR carries EXPR as a user expression, EPILOGUE=meta the
 * capture's metadata alone (to weigh the epilogue's parts). WARM=1 first
 * runs an untimed empty silent execute, as the kernel pool does.
 *
 * RUN_END=1 gives each execute a run's end id (CX_RELAY_RUN_END): the
 * launcher ends the sandbox's other processes before its reply passes, as
 * after a run.
 *
 * STAMPS=1 prints each execute's end too, in seconds of CLOCK_MONOTONIC
 * after its milliseconds (the bench counts the executes that end in one
 * window common to every client).
 *
 * LEGACY=1 speaks the server's JSON protocol, not v1 (docs/internals/ws.md).
 *
 * tuned re-arms TCP_QUICKACK after every read (codexec's client); plain
 * leaves delayed ACKs on, as most WebSocket clients do. */
#include <curl/curl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/capture.h"
#include "../../lib/config.h"
#include "../../lib/kernel.h"
#include "../../lib/log.h"
#include "../../lib/runend.h"
#include "../../lib/util.h"

int
main(int argc, char **argv)
{
    struct cx_kernel_conn *c = NULL;
    char msg[256];
    int64_t until = 0;
    char *end;
    long n;

    if (argc < 6) {
        fprintf(stderr, "usage: rawexec GATEWAY_URL TOKEN KERNEL_ID N|Ss tuned|plain [CODE]\n");
        return 2;
    }
    n = strtol(argv[4], &end, 10);
    if (*end == 's') {
        until = cx_now_us() + n * 1000000LL;
        n = -1;
    }
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) || cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    if (cx_kernel_conn_open(argv[1], argv[2], argv[3],
                            (strcmp(argv[5], "plain") ? 0u : CX_KERNEL_PLAIN) |
                                (getenv("LEGACY") ? CX_KERNEL_LEGACY : 0u),
                            &c, msg, sizeof(msg))) {
        fprintf(stderr, "rawexec: %s\n", msg);
        return 1;
    }
    const char *epi = getenv("EPILOGUE");
    bool stamps = getenv("STAMPS") != NULL, run_end = getenv("RUN_END") != NULL;
    struct cx_config cfg;
    json_t *meta = NULL, *uexpr = NULL, *wmeta = NULL, *wexpr = NULL;
    int nreq =
        epi && strcmp(epi, "capture") && strncmp(epi, "expr:", 5) && strcmp(epi, "meta") ? 2 : 1;

    if (cx_config_defaults(&cfg))
        return 1;
    if (epi && !strcmp(epi, "capture")) {
        /* as a run: the sources once (the pool's warm-up), then not */
        meta = cx_capture_metadata(&cfg, argv[3], NULL, false, false);
        uexpr = meta ? cx_runend_expr(argv[3], true, meta, false) : NULL;
        wmeta = cx_capture_metadata(&cfg, argv[3], NULL, false, true);
        wexpr = wmeta ? cx_runend_expr(argv[3], true, wmeta, true) : NULL;
        if (!uexpr || !wexpr)
            return 1;
    } else if (epi && !strncmp(epi, "expr:", 5)) {
        uexpr = json_pack("{s:s}", "cx", epi + 5);
    } else if (epi && !strcmp(epi, "meta")) {
        meta = cx_capture_metadata(&cfg, argv[3], NULL, false, false);
    }
    if (getenv("WARM") || wexpr) { /* as the kernel pool warms a kernel: untimed */
        struct cx_exec w = {
            .code = "", .silent = true, .user_expressions = wexpr, .metadata = wmeta};
        if (cx_kernel_execute(c, &w) ||
            cx_kernel_wait(c, &w, 1, 1, cx_now_us() + 120 * 1000000LL, NULL, NULL))
            return 1;
        w.user_expressions = w.metadata = NULL;
        cx_exec_cleanup(&w, 1);
    }
    for (long i = 0; n < 0 ? cx_now_us() < until : i < n; i++) {
        struct cx_exec e[2] = {
            {.code = argc > 6 ? argv[6] : "x=1",
             .store_history = true,
             .user_expressions = uexpr,
             .metadata = meta,
             .ends_run = run_end},
            {.code = epi && !strncmp(epi, "code:", 5) ? epi + 5 : "", .silent = true},
        };
        int64_t t0 = cx_now_us();
        bool sent = true;

        for (int k = 0; k < nreq; k++)
            sent = sent && cx_kernel_execute(c, &e[k]) == CX_OK;
        if (!sent || cx_kernel_wait(c, e, nreq, nreq, cx_now_us() + 60 * 1000000LL, NULL, NULL)) {
            fprintf(stderr, "rawexec: execute failed\n");
            return 1;
        }
        int64_t t1 = cx_now_us();

        if (stamps)
            printf("%.3f %.6f\n", (double)(t1 - t0) / 1000.0, (double)t1 / 1e6);
        else
            printf("%.3f\n", (double)(t1 - t0) / 1000.0);
        fflush(stdout);
        e[0].metadata = e[0].user_expressions = NULL;
        cx_exec_cleanup(e, nreq);
    }
    json_decref(meta);
    json_decref(uexpr);
    json_decref(wmeta);
    json_decref(wexpr);
    cx_config_cleanup(&cfg);
    cx_kernel_conn_free(c);
    curl_global_cleanup();
    return 0;
}
