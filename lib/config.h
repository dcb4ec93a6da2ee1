/* codexec: codexec.conf, "key = value" lines, '#' comment lines.
 *
 * Every key has a default (docs/configuration.md); unknown keys and bad values are refused
 * with the line number. The struct is plain data so handlers can read it. */
#ifndef CX_CONFIG_H
#define CX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "codexec.h"

/* Fills *cfg with every default. Free with cx_config_cleanup(). */
enum cx_err cx_config_defaults(struct cx_config *cfg) CX_MUSTCHECK;

/* Parses text (already in memory) over the defaults; name is used in errors. */
enum cx_err cx_config_parse(struct cx_config *cfg, const char *name, const char *text, char *errbuf,
                            size_t errlen) CX_MUSTCHECK;

/* A language's kernelspec: NULL when the server does not offer it
 * (kernel_name_javascript or kernel_name_r unset). */
const char *cx_config_kernel_name(const struct cx_config *cfg, enum cx_lang lang);

/* A language's preload list ("" for none): kernel_preload,
 * kernel_preload_javascript, kernel_preload_r. */
const char *cx_config_preload(const struct cx_config *cfg, enum cx_lang lang);

/* A request's "language" (absent: python): CX_ERR_INVALID, msg saying
 * why, for another value or a language the server does not offer. */
enum cx_err cx_config_language(const struct cx_config *cfg, const json_t *v, enum cx_lang *out,
                               char *msg, size_t msglen) CX_MUSTCHECK;

#endif
