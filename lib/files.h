/* codexec: a conversation's files, the live workspace (SPEC §10.1).
 *
 * Each operation holds the conversation's lock (as a run does) and talks to
 * the session's kernel: lib/files_helper.py, sent as silent requests, walks
 * the path inside the sandbox one segment at a time without following a
 * link, so nothing on the host ever touches what a tenant made. Writes go
 * in 1 MiB binary buffers, at most FILES_WINDOW in flight; reads come back
 * in 8 MiB windows of 1 MiB buffers: the memory of one operation is a few
 * chunks, whatever the file's size. The interface is in codexec.h; see
 * docs/internals/files.md. */
#ifndef CX_FILES_H
#define CX_FILES_H

#include "codexec.h"

#endif
