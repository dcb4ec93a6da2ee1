#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../lib/conf.h"
#include "../../lib/config.h"
#include "tap.h"

static const struct {
    const char *text;
    int rc;
    const char *err; /* substring expected in the message */
} cases[] = {
    {"", CX_OK, NULL},
    {"# only a comment\n\n   \n", CX_OK, NULL},
    {"workers = 4\n", CX_OK, NULL},
    {"bogus = 1\n", CX_ERR_INVALID, "t.conf:1: unknown key"},
    {"\n\nworkers = many\n", CX_ERR_INVALID, "t.conf:3: workers"},
    {"workers = 0\n", CX_ERR_INVALID, "out of range"},
    {"workers = -1\n", CX_ERR_INVALID, "workers"},
    {"workers = 4\nworkers = 5\n", CX_ERR_INVALID, "t.conf:2: workers is set twice"},
    {"max_body_bytes = 12Q\n", CX_ERR_INVALID, "expected a size"},
    {"max_body_bytes = 99999999999999999999G\n", CX_ERR_INVALID, "max_body_bytes"},
    {"trust_remote_user = maybe\n", CX_ERR_INVALID, "true or false"},
    {"delivery = ftp\n", CX_ERR_INVALID, "direct, x-accel, x-sendfile or redirect"},
    {"log_level = loud\n", CX_ERR_INVALID, "log_level"},
    /* object storage */
    {"storage = disk\n", CX_ERR_INVALID, "local or s3"},
    {"storage = s3\n", CX_ERR_INVALID, "s3_bucket"},
    {"delivery = redirect\n", CX_ERR_INVALID, "redirect needs storage = s3"},
    {"storage = s3\ns3_bucket = b\ndelivery = x-sendfile\n", CX_ERR_INVALID,
     "needs storage = local"},
    {"storage = s3\ns3_bucket = b\ns3_region = us:east\n", CX_ERR_INVALID, "s3_region"},
    {"storage = s3\ns3_bucket = b\ns3_prefix = /x\n", CX_ERR_INVALID, "s3_prefix"},
    {"storage = s3\ns3_bucket = b\ns3_prefix = a b\n", CX_ERR_INVALID, "s3_prefix"},
    {"storage = s3\ns3_bucket = b\ns3_prefix = a/../../x/\n", CX_ERR_INVALID, "s3_prefix"},
    {"storage = s3\ns3_bucket = b\ns3_prefix = a//b/\n", CX_ERR_INVALID, "s3_prefix"},
    {"storage = s3\ns3_bucket = b\ns3_prefix = codexec\n", CX_ERR_INVALID, "ending in /"},
    {"storage = s3\ns3_bucket = b/c\n", CX_ERR_INVALID, "s3_bucket"},
    {"s3_part_size = 128M\n", CX_ERR_INVALID, "s3_part_size"},
    {"storage = s3\ns3_bucket = b\nmax_artifact_bytes = 6G\n", CX_ERR_INVALID, "at most 5G"},
    {"s3_part_size = 1M\n", CX_ERR_INVALID, "s3_part_size"},
    {"s3_addressing = dns\n", CX_ERR_INVALID, "path or virtual"},
    {"storage = s3\ns3_bucket = b\ns3_credentials_file = /nonexistent/c\n", CX_ERR_INVALID,
     "s3_credentials_file"},
    {"storage = s3\ns3_bucket = b\ns3_credentials_file = relative\n", CX_ERR_INVALID,
     "s3_credentials_file"},
    {"socket_mode = 0999\n", CX_ERR_INVALID, "octal"},
    {"just words\n", CX_ERR_INVALID, "t.conf:1: expected \"key = value\""},
    {"default_timeout = 400\n", CX_ERR_INVALID, "default_timeout is above max_timeout"},
    {"max_code_bytes = 128M\nmax_body_bytes = 64M\n", CX_ERR_INVALID, "max_code_bytes"},
    /* kernel_preload names become source text: only dotted identifiers */
    {"kernel_preload = numpy, pandas, matplotlib.pyplot\n", CX_OK, NULL},
    {"kernel_preload = os; import shutil\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = numpy, \"pandas\"\n", CX_ERR_INVALID, "module names"},
    {"kernel_preload = numpy,\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = numpy,,pandas\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = 1numpy\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = numpy..linalg\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = numpy.\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = .numpy\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = num py\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = n\\u00e9\n", CX_ERR_INVALID, "kernel_preload"},
    {"kernel_preload = caf\xc3\xa9\n", CX_ERR_INVALID, "kernel_preload"},
    /* the languages: one kernelspec each, preload names as Python's */
    {"kernel_name_r = r-sandbox\nkernel_name_javascript = javascript-sandbox\n", CX_OK, NULL},
    {"kernel_name_r = python3\n", CX_ERR_INVALID, "kernel_name and kernel_name_r"},
    {"kernel_name_r = k\nkernel_name_javascript = k\n", CX_ERR_INVALID,
     "kernel_name_javascript and kernel_name_r"},
    {"kernel_preload_r = ggplot2, data.table\n", CX_OK, NULL},
    {"kernel_preload_r = ggplot2\"); system(\"x\n", CX_ERR_INVALID, "kernel_preload_r"},
    {"kernel_preload_javascript = fs, path\n", CX_OK, NULL},
    {"kernel_preload_javascript = fs\"); Deno.exit(\n", CX_ERR_INVALID,
     "kernel_preload_javascript"},
    {"kernel_pool_size_r = 1025\n", CX_ERR_INVALID, "kernel_pool_size_r"},
    /* more gateways: "gateway = URL [token=T] [max_kernels=N]", repeatable */
    {"gateway = http://10.0.0.2:8888 token=abc max_kernels=64\n", CX_OK, NULL},
    {"gateway = http://a\ngateway = https://b/ token=x\n", CX_OK, NULL},
    {"gateway = ftp://a\n", CX_ERR_INVALID, "http:// or https://"},
    {"gateway = http://a\"b\n", CX_ERR_INVALID, "no spaces, quotes"},
    {"gateway = http://127.0.0.1:8888/\n", CX_ERR_INVALID, "listed twice"},
    {"gateway = http://a max_kernels=0\n", CX_OK, NULL}, /* by its memory (lib/budget.h) */
    {"gateway = http://a max_kernels=100001\n", CX_ERR_INVALID, "max_kernels is out of range"},
    {"gateway = http://a max_memory=16G\n", CX_OK, NULL},
    {"gateway = http://a max_memory=lots\n", CX_ERR_INVALID, "max_memory is not a size"},
    {"gateway = http://a max_kernels=x\n", CX_ERR_INVALID, "unknown word"},
    {"gateway = http://a color=red\n", CX_ERR_INVALID, "unknown word"},
    {"gateway = \n", CX_ERR_INVALID, "gateway"},
    {"max_kernels = 100001\n", CX_ERR_INVALID, "max_kernels"},
    {"max_kernel_memory = 12Q\n", CX_ERR_INVALID, "max_kernel_memory"},
    {"gateway_memory_reserve = -1\n", CX_ERR_INVALID, "gateway_memory_reserve"},
    {"metrics_allow = 10.0.0.0/33\n", CX_ERR_INVALID, "metrics_allow"},
    {"max_code_bytes = 8M\n", CX_ERR_INVALID, "max_code_bytes is above max_run_body_bytes"},
};

/* A request's language: offered or not, by the kernelspecs configured. */
static void
languages(void)
{
    struct cx_config cfg;
    char err[512] = "", msg[256] = "";
    enum cx_lang lang;
    json_t *v;

    if (cx_config_parse(&cfg, "t.conf",
                        "kernel_name_r = r-sandbox\nkernel_pool_size_r = 2\n"
                        "kernel_pool_size_javascript = 3\n",
                        err, sizeof(err)) != CX_OK) {
        ok(0, "a configuration with R (%s)", err);
        return;
    }
    ok(cx_config_language(&cfg, NULL, &lang, msg, sizeof(msg)) == CX_OK && lang == CX_LANG_PYTHON,
       "no language: python");
    v = json_string("r");
    ok(cx_config_language(&cfg, v, &lang, msg, sizeof(msg)) == CX_OK && lang == CX_LANG_R, "r");
    json_decref(v);
    v = json_string("javascript");
    ok(cx_config_language(&cfg, v, &lang, msg, sizeof(msg)) == CX_ERR_INVALID &&
           strstr(msg, "does not run javascript (it runs python, r)"),
       "javascript, not offered: %s", msg);
    json_decref(v);
    v = json_string("R");
    ok(cx_config_language(&cfg, v, &lang, msg, sizeof(msg)) == CX_ERR_INVALID &&
           strstr(msg, "\"python\", \"javascript\" or \"r\""),
       "another word: %s", msg);
    json_decref(v);
    v = json_integer(1);
    ok(cx_config_language(&cfg, v, &lang, msg, sizeof(msg)) == CX_ERR_INVALID, "not a string");
    json_decref(v);
    is_str(cx_config_kernel_name(&cfg, CX_LANG_R), "r-sandbox", "R's kernelspec");
    ok(cx_config_kernel_name(&cfg, CX_LANG_JAVASCRIPT) == NULL, "JavaScript's: none");
    is_int(cx_config_pool_size(&cfg, CX_LANG_R), 2, "R's pool");
    is_int(cx_config_pool_size(&cfg, CX_LANG_JAVASCRIPT), 0, "no pool for a language not offered");
    cx_config_cleanup(&cfg);
}

/* storage = s3 takes its keys from a file that only the service reads. */
static void
s3_credentials(void)
{
    char path[] = "/tmp/cx-unit-s3-XXXXXX", text[256], err[512] = "";
    struct cx_config cfg;
    int fd = mkstemp(path);
    static const char creds[] = "access_key_id = AKIDEXAMPLE\n"
                                "secret_access_key = wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY\n";

    if (fd < 0 || write(fd, creds, sizeof(creds) - 1) != (ssize_t)(sizeof(creds) - 1)) {
        ok(0, "a credentials file");
        return;
    }
    close(fd);
    snprintf(text, sizeof(text),
             "storage = s3\ns3_bucket = art\ns3_prefix = cx/\ns3_credentials_file = %s\n", path);
    ok(cx_config_parse(&cfg, "t.conf", text, err, sizeof(err)) == CX_OK, "s3 with a key file (%s)",
       err);
    if (cfg.s3_secret) {
        is_str(cfg.s3_key_id, "AKIDEXAMPLE", "the key id from the file");
        is_str(cfg.s3_secret, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "the secret");
        is_str(cfg.s3_endpoint, "https://s3.us-east-1.amazonaws.com", "AWS's endpoint by default");
        cx_config_cleanup(&cfg);
    }
    chmod(path, 0644);
    ok(cx_config_parse(&cfg, "t.conf", text, err, sizeof(err)) == CX_ERR_INVALID &&
           strstr(err, "readable by others") && !strstr(err, "wJalr"),
       "a key file others can read is refused (%s)", err);
    unlink(path);
}

int
main(void)
{
    struct cx_config cfg;
    char err[512];
    uint64_t v;

    if (cx_config_defaults(&cfg) != CX_OK)
        return 1;
    languages();
    is_int(cfg.ngateways, 1, "one gateway by default");
    is_str(cfg.gateways[0].url, "http://127.0.0.1:8888", "from gateway_url");
    is_int(cfg.gateways[0].max_kernels, 0, "max_kernels 0: by the gateway's memory");
    is_int(cfg.gateways[0].max_memory, 0, "max_kernel_memory 0: the kernels' cgroup's");
    cx_config_cleanup(&cfg);
    ok(cx_config_parse(&cfg, "t.conf",
                       "gateway_url = http://x:1/\ngateway_token = t1\nmax_kernels = 7\n"
                       "max_kernel_memory = 8G\n"
                       "gateway = http://y:2 token=t2\n"
                       "gateway = https://z:3 max_kernels=9 max_memory=2G\n",
                       err, sizeof(err)) == CX_OK,
       "three gateways (%s)", err);
    /* Under a failed allocation the parse fails and there is nothing to
     * look at (tests/faultinject.py). */
    is_int(cfg.ngateways, 3, "three of them");
    if (cfg.ngateways == 3) {
        is_str(cfg.gateways[0].url, "http://x:1", "the first from gateway_url, without its slash");
        is_str(cfg.gateways[0].token, "t1", "the first's token");
        is_int(cfg.gateways[0].max_kernels, 7, "the first's max_kernels");
        is_str(cfg.gateways[1].url, "http://y:2", "the second");
        is_str(cfg.gateways[1].token, "t2", "with its token");
        is_int(cfg.gateways[1].max_kernels, 7, "and max_kernels' default");
        is_str(cfg.gateways[2].url, "https://z:3", "the third");
        is_str(cfg.gateways[2].token, "", "with no token");
        is_int(cfg.gateways[2].max_kernels, 9, "and its own budget");
        is_int(cfg.gateways[1].max_memory, 8LL << 30, "max_kernel_memory's default");
        is_int(cfg.gateways[2].max_memory, 2LL << 30, "and its own memory budget");
    }
    cx_config_cleanup(&cfg);
    if (cx_config_defaults(&cfg) != CX_OK)
        return 1;
    languages();
    /* docs/configuration.md defaults */
    is_int(cfg.default_timeout, 30, "default timeout 30 s");
    is_int(cfg.max_timeout, 300, "max timeout 300 s");
    is_int(cfg.default_ttl, 600, "default ttl 600 s");
    is_int(cfg.max_ttl, 3600, "max ttl 3600 s");
    is_int(cfg.tail_chars, 4000, "tails 4000 chars");
    is_int(cfg.max_output_bytes, 8 << 20, "output 8 MiB");
    is_int(cfg.max_code_bytes, 1 << 20, "code 1 MiB");
    is_int(cfg.max_body_bytes, 64 << 20, "body 64 MiB");
    is_int(cfg.max_artifact_bytes, 100 << 20, "artifact 100 MiB");
    is_int(cfg.max_captured_files, 64, "64 captured files");
    is_int(cfg.max_inputs, 32, "32 inputs");
    is_int(cfg.user_quota_bytes, 5ULL << 30, "5 GiB per user");
    is_int(cfg.user_quota_artifacts, 5000, "5000 artifacts per user");
    is_int(cfg.user_quota_versions, 50000, "50000 versions per user");
    is_int(cfg.user_quota_answer_bytes, 256ULL << 20, "256 MiB of kept answers per user");
    is_int(cfg.max_sessions_per_user, 8, "8 sessions per user");
    is_int(cfg.link_default_expiry, 300, "links 300 s by default");
    is_int(cfg.link_max_expiry, 7 * 86400, "links 7 days at most");
    is_int(cfg.delivery, CX_DELIVERY_DIRECT, "direct delivery by default");
    ok(!cfg.trust_remote_user, "REMOTE_USER not trusted by default");
    cx_config_cleanup(&cfg);

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        int rc = cx_config_parse(&cfg, "t.conf", cases[i].text, err, sizeof(err));
        is_int(rc, cases[i].rc, "case %zu: status", i);
        if (cases[i].err) {
            ok(strstr(err, cases[i].err) != NULL, "case %zu: message names the problem", i);
            if (!strstr(err, cases[i].err))
                printf("#   message: %s\n", err);
        } else if (rc == CX_OK) {
            cx_config_cleanup(&cfg);
        }
    }

    ok(cx_config_parse(&cfg, "t.conf",
                       "  database = host=/tmp dbname=x  \n"
                       "gateway_url=http://127.0.0.1:9\n"
                       "max_output_bytes = 2M\n"
                       "delivery = x-accel\n"
                       "trust_remote_user = yes\n"
                       "socket_mode = 0600\n",
                       err, sizeof(err)) == CX_OK,
       "a full file parses");
    is_str(cfg.database, "host=/tmp dbname=x", "values are trimmed, inner spaces kept");
    is_str(cfg.gateway_url, "http://127.0.0.1:9", "no spaces around = is fine");
    is_int(cfg.max_output_bytes, 2 << 20, "size suffix M");
    is_int(cfg.delivery, CX_DELIVERY_X_ACCEL, "delivery x-accel");
    ok(cfg.trust_remote_user, "bool yes");
    is_int(cfg.socket_mode, 0600, "octal mode");
    cx_config_cleanup(&cfg);

    ok(cx_config_parse(&cfg, "t.conf", "kernel_preload =  numpy ,pandas,\tmatplotlib.pyplot \n",
                       err, sizeof(err)) == CX_OK,
       "kernel_preload parses");
    is_str(cfg.kernel_preload, "numpy,pandas,matplotlib.pyplot", "kernel_preload normalised");
    cx_config_cleanup(&cfg);
    ok(cx_config_defaults(&cfg) == CX_OK && cfg.kernel_preload && !*cfg.kernel_preload,
       "no kernel_preload by default");
    cx_config_cleanup(&cfg);

    ok(cx_conf_parse_size("64k", &v) == CX_OK && v == 65536, "size 64k");
    ok(cx_conf_parse_size("5G", &v) == CX_OK && v == 5ULL << 30, "size 5G");
    ok(cx_conf_parse_size("", &v) != CX_OK, "empty size refused");
    ok(cx_conf_parse_size("-5", &v) != CX_OK, "negative size refused");
    ok(cx_conf_parse_size("5 G", &v) != CX_OK, "inner space refused");

    err[0] = '\0';
    ok(cx_config_load(&cfg, "/nonexistent/codexec.conf", err, sizeof(err)) == CX_ERR_IO,
       "a missing file is an I/O error");
    ok(strstr(err, "/nonexistent/codexec.conf") != NULL, "and the message names the file");
    s3_credentials();
    return tap_done();
}
