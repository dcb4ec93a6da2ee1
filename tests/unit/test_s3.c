/* lib/s3.c without a store: endpoints, and presigned URLs against AWS's
 * published example (the SigV4 query-string documentation for S3); the
 * requests themselves are checked against botocore in tests/system/test_s3.py. */
#include <string.h>

#include "../../lib/log.h"
#include "../../lib/s3.h"
#include "tap.h"

static struct cx_s3_conf
conf(const char *endpoint, const char *bucket, bool virtual_host)
{
    return (struct cx_s3_conf){.endpoint = endpoint,
                               .region = "us-east-1",
                               .bucket = bucket,
                               .prefix = "",
                               .virtual_host = virtual_host,
                               .key_id = "AKIAIOSFODNN7EXAMPLE",
                               .secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                               .token = ""};
}

int
main(void)
{
    static const struct {
        const char *endpoint;
        enum cx_err rc;
        const char *origin; /* path-style, bucket b */
    } endpoints[] = {
        {"https://s3.amazonaws.com", CX_OK, "https://s3.amazonaws.com"},
        {"https://s3.amazonaws.com/", CX_OK, "https://s3.amazonaws.com"},
        {"https://s3.amazonaws.com:443", CX_OK, "https://s3.amazonaws.com"},
        {"http://127.0.0.1:9000", CX_OK, "http://127.0.0.1:9000"},
        {"http://127.0.0.1:80", CX_OK, "http://127.0.0.1"},
        {"ftp://s3.amazonaws.com", CX_ERR_INVALID, NULL},
        {"https://s3.amazonaws.com/bucket", CX_ERR_INVALID, NULL},
        {"https://user@s3.amazonaws.com", CX_ERR_INVALID, NULL},
        {"https://", CX_ERR_INVALID, NULL},
        {"https://a b", CX_ERR_INVALID, NULL},
        {"https://h?x", CX_ERR_INVALID, NULL},
    };
    /* AWS's example: GET examplebucket/test.txt, 2013-05-24T00:00:00Z, a day */
    static const char want[] =
        "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
    struct cx_s3_conf c;
    struct cx_s3 *s3 = NULL;
    char url[4096];

    if (cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    for (size_t i = 0; i < sizeof(endpoints) / sizeof(endpoints[0]); i++) {
        c = conf(endpoints[i].endpoint, "b", false);
        is_int(cx_s3_new(&c, &s3), endpoints[i].rc, "endpoint %s", endpoints[i].endpoint);
        if (s3 && endpoints[i].origin)
            is_str(cx_s3_origin(s3), endpoints[i].origin, "its origin");
        cx_s3_free(s3);
        s3 = NULL;
    }
    c = conf("https://s3.amazonaws.com", "", false);
    is_int(cx_s3_new(&c, &s3), CX_ERR_INVALID, "a bucket is required");

    c = conf("https://s3.amazonaws.com", "examplebucket", true);
    need(cx_s3_new(&c, &s3) == CX_OK, "virtual-hosted examplebucket");
    is_str(cx_s3_origin(s3), "https://examplebucket.s3.amazonaws.com", "the bucket's host");
    ok(cx_s3_presign(s3, "test.txt", 1369353600, 86400, "", false, url, sizeof(url)) == CX_OK,
       "presign");
    is_str(url, want, "AWS's example presigned URL, to the byte");
    ok(cx_s3_presign(s3, "test.txt", 1369353600, 86400, "", true, url, sizeof(url)) == CX_OK &&
           !strncmp(url, "/test.txt?X-Amz-Algorithm=", 26),
       "path only: %s", url);
    ok(cx_s3_presign(s3, "test.txt", 1369353600, 86400, "", false, url, 64) == CX_ERR_TOO_LARGE,
       "a short buffer is refused, not cut");
    ok(cx_s3_presign(s3, "a b/\xc3\xa9(1)+.txt", 1369353600, 60,
                     "response-content-type=text%2Fplain", false, url, sizeof(url)) == CX_OK &&
           strstr(url, "/a%20b/%C3%A9%281%29%2B.txt?") &&
           strstr(url,
                  "&X-Amz-SignedHeaders=host&response-content-type=text%2Fplain&X-Amz-Signature="),
       "keys encoded as SigV4 wants, overrides signed after X-Amz-*: %s", url);

    /* what x-amz-content-sha256 carries: an object's bytes over https go
     * unsigned (hashed once, by the storage writer), a known hash as it is,
     * anything else hashed */
    {
        char sha[65];
        ok(cx_s3_payload_sha(s3, "abc", 3, true, NULL, sha) == CX_OK &&
               !strcmp(sha, "UNSIGNED-PAYLOAD"),
           "an object's bytes over https: UNSIGNED-PAYLOAD");
        ok(cx_s3_payload_sha(s3, "abc", 3, false, NULL, sha) == CX_OK &&
               !strcmp(sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
           "a request's own body (XML) over https: hashed");
        ok(cx_s3_payload_sha(s3, "abc", 3, true, "00ff", sha) == CX_OK && !strcmp(sha, "00ff"),
           "a hash the caller has: as it is");
        ok(cx_s3_payload_sha(s3, NULL, 0, false, NULL, sha) == CX_OK &&
               !strcmp(sha, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
           "no body: the empty string's hash");
        cx_s3_free(s3);
        c = conf("http://127.0.0.1:9000", "b", false);
        need(cx_s3_new(&c, &s3) == CX_OK, "a store over http");
        ok(cx_s3_payload_sha(s3, "abc", 3, true, NULL, sha) == CX_OK &&
               !strcmp(sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
           "an object's bytes over http: hashed and signed (nothing else keeps them whole)");
    }
    cx_s3_free(s3);
    cx_s3_free(NULL);
    return tap_done();
}
