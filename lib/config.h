/* codexec: codexec.conf, "key = value" lines, '#' comment lines.
 *
 * Every key has a default (docs/configuration.md); unknown keys and bad values are refused
 * with the line number. The struct is plain data so handlers can read it. */
#ifndef CX_CONFIG_H
#define CX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codexec.h"

/* Fills *cfg with every default. Free with cx_config_cleanup(). */
enum cx_err cx_config_defaults(struct cx_config *cfg) CX_MUSTCHECK;

/* Parses text (already in memory) over the defaults; name is used in errors. */
enum cx_err cx_config_parse(struct cx_config *cfg, const char *name, const char *text, char *errbuf,
                            size_t errlen) CX_MUSTCHECK;

#endif
