/* codexec: small helpers with no better home. */
#ifndef CX_UTIL_H
#define CX_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codexec.h"

/* Strict UTF-8 (RFC 3629): no overlongs, no surrogates, nothing past U+10FFFF. */
bool cx_utf8_valid(const char *s, size_t len);
/* A copy of s (NUL-ended, *out_len bytes) with what is not valid UTF-8
 * replaced by U+FFFD as Python's "replace" decodes (one for a sequence cut
 * short, one for each other byte); NULL over max bytes or without
 * memory. Free with free(). */
char *cx_utf8_fix(const char *s, size_t len, size_t max, size_t *out_len);

/* 8-4-4-4-12 hex, any case. */
bool cx_uuid_valid(const char *s);

/* A conversation id: a name inside a user's namespace, 1 to
 * CX_CONVERSATION_MAX of [A-Za-z0-9._:-]. */
#define CX_CONVERSATION_MAX 128
bool cx_conversation_id_valid(const char *s);

/* The value of a hex digit, or -1 (percent-decoding). */
int cx_hex_digit(char c);
/* What a client is told when it is not (every place that checks one). */
#define CX_CONVERSATION_RULE "conversation_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -"

/* write(2) until done, retrying EINTR. */
enum cx_err cx_write_all(int fd, const void *buf, size_t len) CX_MUSTCHECK;

/* A random (version 4) UUID, lower case. out: 37 bytes. */
void cx_uuid_generate(char out[37]);

/* What jansson would build from JSON text, estimated without building it:
 * bytes for each container ('[' or '{', counted outside strings), each
 * element (a ',' or ':' outside strings) and each string, as jansson 2.14
 * allocates them on x86-64 (measured: an empty array 140 bytes, an object
 * 236, a number 40, a short string 88); a string's characters cost their
 * length, which the text already bounds. A cost check, not a parser: the
 * text may still be invalid, and jansson still rejects it. 4 MiB of "[],"
 * costs jansson 187 MiB; it is estimated at 358 MB. */
#define CX_JSON_COST_CONTAINER 256
#define CX_JSON_COST_ELEMENT   48
#define CX_JSON_COST_STRING    96
size_t cx_json_cost(const char *s, size_t len);

/* The most JSON from outside (a request body, a kernel's message) may cost
 * to build: about 32,000 containers, 170,000 numbers or 58,000 strings
 * (a run's arguments that big belong in an input artifact). */
#define CX_JSON_COST_MAX (8u << 20)

/* Address lists ("127.0.0.0/8, ::1, 10.1.2.3"): IPv4 and IPv6 addresses
 * with an optional prefix length, separated by commas or spaces, at most
 * 32; "*" alone allows every address, "" none. _normalize checks text and
 * makes the canonical form ("127.0.0.0/8,::1/128") in a new string (free()
 * it): CX_ERR_INVALID for a bad list. _match tells whether addr (an IPv4,
 * IPv6 or IPv4-mapped IPv6 address as a web server passes REMOTE_ADDR) is in
 * a normalised list. */
enum cx_err cx_addr_list_normalize(const char *text, char **out) CX_MUSTCHECK;

/* "python", "javascript", "r"; "python" for CX_LANG_ANY. */
const char *cx_lang_name(enum cx_lang lang);
/* The language named s; false for another word. */
bool cx_lang_parse(const char *s, enum cx_lang *out);

#endif
