/* The gateway's REST client against the suite's real Jupyter server: what
 * it refuses to put in a URL, how it reports a wrong token and an
 * unreachable server, idempotent deletes, vanished kernels. Only the
 * surface every Jupyter gateway offers is used: /api/kernels and
 * /api/kernelspecs. (The kernel
 * channels are test_kernel's.) */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../lib/gateway.h"
#include "../../lib/log.h"
#include "../../lib/util.h"
#include "tap.h"

static const char *const unsafe_ids[] = {
    "../../etc",
    "..",
    "a/b",
    "a?b",
    "a#b",
    "a%2Fb",
    "a b",
    "",
    "a\nb",
    "x..y",
    "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123"
    "456789"
    "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123"
    "456789"
    "0",
};

static void
refused_ids(struct cx_gateway *gw)
{
    for (size_t i = 0; i < sizeof(unsafe_ids) / sizeof(unsafe_ids[0]); i++) {
        is_int(cx_gateway_kernel_get(gw, unsafe_ids[i], NULL), CX_ERR_INVALID, "id %zu refused", i);
        is_int(cx_gateway_kernel_delete(gw, unsafe_ids[i]), CX_ERR_INVALID, "delete %zu refused",
               i);
        is_int(cx_gateway_kernel_interrupt(gw, unsafe_ids[i]), CX_ERR_INVALID,
               "interrupt %zu refused", i);
    }
}

static void
wrong_peers(const char *url, const char *token)
{
    struct cx_gateway *bad = NULL;
    char msg[CX_MSG_MAX] = "", wrong[128];

    snprintf(wrong, sizeof(wrong), "%s-wrong", token);
    need(cx_gateway_new(url, wrong, &bad) == CX_OK, "a handle with a wrong token");
    {
        json_t *specs = NULL;
        /* GET /api answers anyone; the kernelspecs need the token */
        is_int(cx_gateway_kernelspecs(bad, &specs), CX_ERR_GATEWAY,
               "a wrong token fails on an authenticated call");
        json_decref(specs);
    }
    cx_gateway_free(bad);

    need(cx_gateway_new("http://127.0.0.1:1/", token, &bad) == CX_OK, "a handle to a closed port");
    is_int(cx_gateway_ping(bad, msg, sizeof(msg)), CX_ERR_GATEWAY, "an unreachable gateway");
    ok(strstr(msg, "GET /api") != NULL, "says which call failed (%s)", msg);
    is_str(cx_gateway_url(bad), "http://127.0.0.1:1", "trailing slashes dropped from the URL");
    cx_gateway_free(bad);
}

static void
vanished_kernel(struct cx_gateway *gw)
{
    char msg[CX_MSG_MAX] = "", kid[64];
    json_t *model = NULL;

    if (cx_gateway_kernel_start(gw, "python3-sandbox", kid, msg, sizeof(msg)) != CX_OK) {
        ok(0, "kernel started (%s)", msg);
        return;
    }
    ok(cx_gateway_kernel_get(gw, kid, &model) == CX_OK &&
           json_string_value(json_object_get(model, "id")) &&
           !strcmp(json_string_value(json_object_get(model, "id")), kid),
       "its model names it");
    json_decref(model);
    ok(cx_gateway_kernel_interrupt(gw, kid) == CX_OK, "interrupt a live kernel");
    ok(cx_gateway_kernel_delete(gw, kid) == CX_OK, "delete it");
    is_int(cx_gateway_kernel_get(gw, kid, NULL), CX_ERR_NOT_FOUND, "then it is not found");
    ok(cx_gateway_kernel_delete(gw, kid) == CX_OK, "deleting it again is not an error");
    is_int(cx_gateway_kernel_interrupt(gw, kid), CX_ERR_NOT_FOUND, "interrupting it: not found");
    is_int(cx_gateway_kernel_restart(gw, kid), CX_ERR_NOT_FOUND, "restarting it: not found");
    is_int(cx_gateway_kernel_get(gw, "00000000-0000-0000-0000-000000000000", NULL),
           CX_ERR_NOT_FOUND, "a kernel that never was: not found");
}

/* A server that takes the connection and never answers: a call gives up
 * at the handle's limit, and a one-call limit goes back to the handle's
 * default, not to two minutes. */
static void
hung_server(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    struct cx_gateway *gw = NULL;
    char url[64];
    int64_t t0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    need(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 8) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &alen) == 0,
         "a listening socket nobody serves");
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(a.sin_port));
    need(cx_gateway_new(url, "t", &gw) == CX_OK, "a handle on it");
    cx_gateway_default_timeout(gw, 700);
    t0 = cx_now_ms();
    is_int(cx_gateway_kernel_get(gw, "00000000-0000-0000-0000-000000000000", NULL), CX_ERR_TIMEOUT,
           "a hung server times out");
    ok(cx_now_ms() - t0 < 5000, "at the handle's default (%lld ms)", (long long)(cx_now_ms() - t0));
    cx_gateway_timeout(gw, 300);
    cx_gateway_timeout(gw, 0);
    t0 = cx_now_ms();
    is_int(cx_gateway_kernel_get(gw, "00000000-0000-0000-0000-000000000000", NULL), CX_ERR_TIMEOUT,
           "again, after a one-call limit");
    ok(cx_now_ms() - t0 < 5000, "back at the default, not two minutes (%lld ms)",
       (long long)(cx_now_ms() - t0));
    cx_gateway_free(gw);
    close(fd);
}

int
main(void)
{
    const char *url = getenv("CODEXEC_TEST_GATEWAY_URL");
    const char *token = getenv("CODEXEC_TEST_GATEWAY_TOKEN");
    struct cx_gateway *gw = NULL;
    char msg[CX_MSG_MAX];

    if (!url || !*url || !token) {
        printf("Bail out! CODEXEC_TEST_GATEWAY_URL/TOKEN not set: run through packaging/quickstart "
               "test\n");
        return 1;
    }
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) || cx_log_open(NULL, CX_LOG_ERR))
        return 1;
    need(cx_gateway_new(url, token, &gw) == CX_OK && cx_gateway_ping(gw, msg, sizeof(msg)) == CX_OK,
         "the suite's gateway answers");
    is_str(cx_gateway_token(gw), token, "the handle keeps its token");
    refused_ids(gw);
    wrong_peers(url, token);

    vanished_kernel(gw);
    hung_server();

    cx_gateway_free(gw);
    curl_global_cleanup();
    cx_log_close();
    return tap_done();
}
