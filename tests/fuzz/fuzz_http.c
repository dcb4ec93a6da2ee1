/* Request headers and the query string as a web server passes them: the
 * query, Content-Length, Authorization, If-None-Match, Range, the
 * multipart boundary, a JSON body, ids, file names, address lists. */
#include "../../lib/auth.h"
#include "../../lib/http.h"
#include "../../lib/storage.h"
#include "../../lib/util.h"
#include "fuzz.h"

static void
query(const char *s)
{
    static const char *const names[] = {
        "conversation_id", "filename", "version", "sig", "u", "k", "exp", "x"};
    char big[1024], small[8];

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        (void)cx_http_query_get(s, names[i], big, sizeof(big));
        (void)cx_http_query_get(s, names[i], small, sizeof(small));
    }
}

static void
headers(const char *s)
{
    char boundary[80], cd[1200];
    uint64_t n, first, last;
    const char *tok;
    size_t len;

    (void)cx_http_content_length(s, &n);
    (void)cx_auth_parse_bearer(s, &tok, &len);
    (void)cx_http_etag_matches(s, "0123abcd");
    (void)cx_http_range(s, 12345, &first, &last);
    (void)cx_http_range(s, 0, &first, &last);
    (void)cx_http_range(s, UINT64_MAX, &first, &last);
    (void)cx_http_multipart_boundary(s, boundary, sizeof(boundary));
    cx_http_content_disposition(s, cd, sizeof(cd));
}

static struct cx_storage *store; /* a local one: paths only, never touched */

static void
names(const char *s, size_t size)
{
    char safe[256], *norm = NULL, key[1200];

    (void)cx_conversation_id_valid(s);
    (void)cx_uuid_valid(s);
    (void)cx_auth_user_valid(s);
    (void)cx_utf8_valid(s, size);
    cx_storage_safe_filename(s, size, safe);
    if (cx_storage_key(s, "123e4567-e89b-12d3-a456-426614174000", 1, s, key, sizeof(key)) == CX_OK)
        (void)cx_storage_path(store, key, key, sizeof(key));
    if (cx_addr_list_normalize(s, &norm) == CX_OK) {
        (void)cx_addr_list_match(norm, "127.0.0.1");
        (void)cx_addr_list_match(norm, "::1");
    }
    (void)cx_addr_list_match("10.0.0.0/8,::1/128", s);
    free(norm);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_string(data, size), msg[CX_MSG_MAX];
    json_t *j = NULL;

    if (!s)
        return 0;
    if (!store && cx_storage_new_local("/nonexistent", &store) != CX_OK)
        abort();
    fuzz_quiet();
    query(s);
    headers(s);
    names(s, size);
    if (cx_http_parse_json_object(s, size, &j, msg, sizeof(msg)) == CX_OK)
        json_decref(j);
    free(s);
    return 0;
}
