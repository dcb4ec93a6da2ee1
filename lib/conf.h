/* codexec: "key = value" files, parsed against a table of keys.
 *
 * codexec.conf (config.h) and the sandbox's sandbox.conf (sandbox.h) share
 * the syntax: '#' comment lines, blank lines, values trimmed, sizes with
 * K/M/G (binary) suffixes. Every key has a default; unknown keys, keys set
 * twice and bad values are refused with "name:line: message". The caller's
 * struct is plain data; a table says where each key lives in it. */
#ifndef CX_CONF_H
#define CX_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum cx_conf_type {
    CX_CONF_STR,           /* char *, strdup'ed */
    CX_CONF_UINT,          /* unsigned, within [min, max] */
    CX_CONF_SIZE,          /* uint64_t with K/M/G, within [min, max] */
    CX_CONF_BOOL,          /* bool: true/yes/on/1, false/no/off/0 */
    CX_CONF_LEVEL,         /* int: error, warn, info, debug */
    CX_CONF_DELIVERY,      /* int: direct, x-accel, x-sendfile, redirect */
    CX_CONF_MODE,          /* unsigned, octal, at most max */
    CX_CONF_MODULES,       /* char *: Python module names, normalised "a,b.c" */
    CX_CONF_PATH,          /* char *: "" or an absolute path without ".." or control chars */
    CX_CONF_ADDRS,         /* char *: an address list, normalised (util.h cx_addr_list_*) */
    CX_CONF_LINES,         /* char *: a key that may repeat; its values joined by '\n' */
    CX_CONF_LOG_FORMAT,    /* int: text, json */
    CX_CONF_STORAGE,       /* int: local, s3 */
    CX_CONF_S3_ADDRESSING, /* int: path, virtual */
};

struct cx_conf_key {
    const char *name;
    enum cx_conf_type type;
    size_t off; /* offsetof in the caller's struct */
    const char *def;
    uint64_t min, max;
};

/* Fills base with every key's default. On failure base is cleaned up. */
enum cx_err cx_conf_defaults(const struct cx_conf_key *keys, size_t n, void *base) CX_MUSTCHECK;

/* Parses text over the defaults; name is used in messages. On failure base
 * is cleaned up and errbuf holds "name:line: message". */
enum cx_err cx_conf_parse(const struct cx_conf_key *keys, size_t n, void *base, const char *name,
                          const char *text, char *errbuf, size_t errlen) CX_MUSTCHECK;

/* Reads path (at most 1 MiB, no NUL bytes) and parses it. */
enum cx_err cx_conf_load(const struct cx_conf_key *keys, size_t n, void *base, const char *path,
                         char *errbuf, size_t errlen) CX_MUSTCHECK;

/* Frees the strings; wipes those whose key name ends in "_token" and the
 * lines of "gateway" (they hold tokens). */
void cx_conf_cleanup(const struct cx_conf_key *keys, size_t n, void *base);

/* Parses "123", "64k", "8M", "5G" (binary units) into *out. */
enum cx_err cx_conf_parse_size(const char *s, uint64_t *out) CX_MUSTCHECK;

#endif
