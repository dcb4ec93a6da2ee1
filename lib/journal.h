/* codexec: a run's events, kept for GET /v1/runs/{id}/events.
 *
 * A run started with wait: false, or streamed, tells its events (the
 * sink of codexec.h) to a journal: each gets the next id (1, 2, ...), is
 * kept in run_events (sql/011) and passed on to the streaming client, if
 * any, with its id. A follower (any process) replays them from after an
 * id, then polls for more while the run runs, and ends with the result:
 * the run's record and answer (cx_run_get), the id after the last event.
 * Kept within max_output_bytes + 1 MiB and 100,000 events a run; past that
 * the run goes on and its events are only told, not kept. */
#ifndef CX_JOURNAL_H
#define CX_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "codexec.h"

struct cx_journal {
    struct cx_ctx *cx;
    char run_id[37];
    const struct cx_run_sink *inner; /* the streaming client, NULL once gone */
    struct cx_run_sink sink;         /* what the run tells */
    unsigned seq;                    /* the last id given */
    size_t bytes;                    /* kept so far */
    unsigned kept;                   /* events kept so far */
    bool full;                       /* nothing more is kept */
};

/* j's sink passes on to inner (NULL: none). The run's record must exist. */
void cx_journal_open(struct cx_journal *j, struct cx_ctx *cx, const char *run_id,
                     const struct cx_run_sink *inner);

#endif
