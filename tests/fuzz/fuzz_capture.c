/* Capture records as the kernel (or user code forging them) could send
 * them: each line of the input is one record; the last line is also taken
 * as the loader's result. Files go to a private temporary storage and are
 * dropped with the capture. */
#include <stdio.h>

#include "../../lib/capture.h"
#include "../../lib/storage.h"
#include "../../lib/config.h"
#include "fuzz.h"

static struct cx_config cfg;
static struct cx_storage *store;

static int
setup(void)
{
    static int ready;
    static char root[] = "/dev/shm/cx-fuzz-capture-XXXXXX"; /* tmpfs: syncs cost nothing */
    char conf[256], err[256];

    if (ready)
        return ready > 0;
    ready = -1;
    fuzz_quiet();
    if (!mkdtemp(root))
        return 0;
    snprintf(conf, sizeof(conf),
             "storage_dir = %s\nmax_artifact_bytes = 4096\nmax_captured_files = 8\n"
             "max_output_bytes = 2048\n",
             root);
    if (cx_config_parse(&cfg, "fuzz", conf, err, sizeof(err)) != CX_OK ||
        cx_storage_new_local(root, &store) != CX_OK)
        return 0;
    ready = 1;
    return 1;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cx_capture *c = NULL;
    size_t start = 0;
    json_t *last = NULL;

    if (!setup() || cx_capture_new(&cfg, store, &c) != CX_OK)
        return 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != '\n')
            continue;
        json_t *m = json_loadb((const char *)data + start, i - start, 0, NULL);
        if (m) {
            /* the record's own bytes as its buffer: chunks without data */
            cx_capture_on_message(c, m, data + start, i - start);
            json_decref(last);
            last = m;
        }
        start = i + 1;
    }
    if (last) {
        cx_capture_on_result(c, last);
        cx_capture_add_output(c, "image/png", data, size);
    }
    json_decref(last);
    for (size_t i = 0; i < cx_capture_count(c); i++)
        (void)cx_capture_file(c, i);
    (void)json_array_size(cx_capture_skipped(c));
    cx_capture_free(c);
    return 0;
}
