/* codexec: the run's end in the kernel: the epilogue (lib/epilogue.py), the user expression that
 * ends every run in the kernel: the restart token, the reaping, the
 * capture. Asked by the run (runexec.c) and by the kernel pool when it
 * warms a kernel (prestart.c); it knows nothing of either. */
#ifndef CX_RUNEND_H
#define CX_RUNEND_H

#include <jansson.h>
#include <stdbool.h>

struct cx_exec;

/* The epilogue for a kernel (token: its id), with or without the capture:
 * the user expressions of a request whose metadata is meta (new
 * reference); with_source, meta gets the epilogue's source first. A kernel
 * keeps the epilogue once it has had it, and answers "need" when it has
 * not and meta carries no source (the expression is then a short one the
 * kernel compiles faster). NULL when out of memory. */
json_t *cx_runend_expr(const char *token, bool capture, json_t *meta, bool with_source);

/* The epilogue's source into a request's metadata, for a kernel that has
 * not kept it; false when out of memory. */
bool cx_runend_add_source(json_t *meta);

/* The epilogue's answer in a request's reply (new reference):
 * {"known": bool, "done": the capture's done record or null}; NULL when
 * it was not evaluated, failed or answered something else. */
json_t *cx_runend_answer(const struct cx_exec *e);

/* Whether a request's user expressions (the epilogue) were evaluated: the
 * kernel evaluates them only after a cell that succeeded. */
bool cx_runend_carried(const struct cx_exec *e);
/* Whether e's expression found none of this codexec's epilogue kept in the
 * process (a new one, or codexec upgraded since) and had none in the
 * request: it did nothing. (Not the epilogue's own answer that it lacks the
 * capture helper: that process is known.) */
bool cx_runend_lacks_epilogue(const struct cx_exec *e);

/* Whether the epilogue found a kernel codexec had not used before. */
bool cx_runend_says_fresh(const struct cx_exec *epilogue);

#endif
