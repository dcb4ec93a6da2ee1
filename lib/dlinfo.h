/* codexec: what a download needs to know of an artifact version, as
 * downloads resolve it and the download cache keeps it. */
#ifndef CX_DLINFO_H
#define CX_DLINFO_H

#include <stdint.h>

struct cx_download {
    char artifact_id[37];
    int version;
    char filename[256];
    char mime[128];
    uint64_t size;
    char sha256[65];
    char key[1024];
    long long created; /* unix seconds: Last-Modified */
};

#endif
