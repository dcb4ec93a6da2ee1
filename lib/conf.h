/* codexec: "key = value" files, parsed against a table of keys.
 *
 * codexec.conf (config.h) and the sandbox's sandbox.conf (launcher/sandbox.h) share
 * the syntax: '#' comment lines, blank lines, values trimmed, sizes with
 * K/M/G (binary) suffixes. Every key has a default; unknown keys, keys set
 * twice and bad values are refused with "name:line: message". The caller's
 * struct is plain data; a table says where each key lives in it. */
#ifndef CX_CONF_H
#define CX_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "codexec.h"

/* Parses "123", "64k", "8M", "5G" (binary units) into *out. */
enum cx_err cx_conf_parse_size(const char *s, uint64_t *out) CX_MUSTCHECK;

#endif
