/* codexec: MIME types from the bytes (libmagic), and artifact kinds.
 *
 * libmagic handles are not thread-safe: each thread gets its own magic_t,
 * opened on first use and closed at thread exit. */
#ifndef CX_MIME_H
#define CX_MIME_H

#include <stddef.h>

#include "codexec.h"

/* The MIME type of data (the first bytes of a file suffice; 64 KiB is
 * plenty), refined by the file name's extension only where magic is
 * generic: text/plain → text/csv for .csv, application/zip → the OOXML type
 * for .docx/.xlsx/.pptx, and so on. out: at least 128 bytes. */
enum cx_err cx_mime_detect(const void *data, size_t len, const char *filename, char *out,
                           size_t outlen) CX_MUSTCHECK;

/* The artifact kind of a MIME type: "image", "html", "data", "document",
 * "spreadsheet", "presentation" or "file". A static string. */
const char *cx_mime_kind(const char *mime);

#endif
