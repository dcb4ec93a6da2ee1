/*
 * ngx_http_codexec_link_module: codexec's signed links checked by nginx
 * itself, and the version's file served from storage_dir, so that a
 * browser's download never waits for codexec-fcgi. Its directives are in
 * ../codexec-links.conf; docs/api.md, "Signed links at the edge", says how
 * it is built and loaded.
 *
 * A link (POST /v1/artifacts/{id}/links, the artifacts page) is
 *   /v1/artifacts/<id>/content?version=<n>&u=<user>&k=<key id>&exp=<unix>&m=<meta>&sig=<mac>
 * where sig is HMAC-SHA-256 (base64url, no padding), keyed with the 64 hex
 * characters of the edge key codexec derives for links alone
 * (codexec-admin nginx-link-key), of
 *   "codexec-link-v2\n" u "\n" id "\n" version "\n" exp "\n" k "\n" m
 * with u, k and m as the query has them (not decoded), and m, base64url,
 * holds the version's storage key, MIME type, sha256 and
 * Content-Disposition, one per line: all nginx needs to serve the file.
 *
 * This module only ever says yes. Whatever it does not accept (no link, a
 * MAC that does not match, an expired link, a key in the revocation list
 * or a list not kept, anything malformed, a method other than GET and
 * HEAD, a file that is not there) goes to the named location
 * (codexec_link_fallback, @codexec) unchanged, and codexec answers as it
 * always has: 403, 410, 401, 404.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#define CODEXEC_LINK_KEY_LEN  64
#define CODEXEC_LINK_DIR_MAX  1024
#define CODEXEC_LINK_PATH_MAX 4096

typedef struct {
    ngx_http_complex_value_t  *key;
    ngx_str_t                  storage;
    ngx_str_t                  revoked;
    ngx_str_t                  fallback;
} ngx_http_codexec_link_conf_t;

/* The link's parameters, as the query has them. */
typedef struct {
    ngx_str_t                  sig;
    ngx_str_t                  u;
    ngx_str_t                  k;
    ngx_str_t                  version;
    ngx_str_t                  exp;
    ngx_str_t                  m;
    ngx_str_t                  id;
} ngx_http_codexec_link_t;

/* What m carries. */
typedef struct {
    ngx_str_t                  key;
    ngx_str_t                  type;
    ngx_str_t                  sha;
    ngx_str_t                  disposition;
} ngx_http_codexec_link_meta_t;


static ngx_int_t ngx_http_codexec_link_handler(ngx_http_request_t *r);
static void *ngx_http_codexec_link_create_conf(ngx_conf_t *cf);
static char *ngx_http_codexec_link_merge_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_codexec_link_storage(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


static ngx_command_t  ngx_http_codexec_link_commands[] = {

    { ngx_string("codexec_link_storage"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_codexec_link_storage,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("codexec_link_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_codexec_link_conf_t, key),
      NULL },

    { ngx_string("codexec_link_revoked"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_codexec_link_conf_t, revoked),
      NULL },

    { ngx_string("codexec_link_fallback"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_codexec_link_conf_t, fallback),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_codexec_link_module_ctx = {
    NULL,                                  /* preconfiguration */
    NULL,                                  /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_codexec_link_create_conf,     /* create location configuration */
    ngx_http_codexec_link_merge_conf       /* merge location configuration */
};


ngx_module_t  ngx_http_codexec_link_module = {
    NGX_MODULE_V1,
    &ngx_http_codexec_link_module_ctx,     /* module context */
    ngx_http_codexec_link_commands,        /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* The parameters a link must have (u and k may be empty, not absent) and
 * the artifact's id: the third step of /v1/artifacts/<id>/content. */
static ngx_int_t
ngx_http_codexec_link_args(ngx_http_request_t *r, ngx_http_codexec_link_t *l)
{
    u_char  *p, *end, *start;
    int      steps;

    if (ngx_http_arg(r, (u_char *) "sig", 3, &l->sig) != NGX_OK
        || ngx_http_arg(r, (u_char *) "u", 1, &l->u) != NGX_OK
        || ngx_http_arg(r, (u_char *) "k", 1, &l->k) != NGX_OK
        || ngx_http_arg(r, (u_char *) "version", 7, &l->version) != NGX_OK
        || ngx_http_arg(r, (u_char *) "exp", 3, &l->exp) != NGX_OK
        || ngx_http_arg(r, (u_char *) "m", 1, &l->m) != NGX_OK
        || l->sig.len == 0 || l->version.len == 0 || l->exp.len == 0
        || l->m.len == 0)
    {
        return NGX_DECLINED;
    }

    /* /v1/artifacts/<id>/content */
    p = r->uri.data;
    end = p + r->uri.len;
    start = NULL;

    for (steps = 0; p < end; p++) {
        if (*p != '/') {
            continue;
        }

        steps++;

        if (steps == 3) {
            start = p + 1;

        } else if (steps == 4) {
            l->id.data = start;
            l->id.len = p - start;
            return l->id.len && end - p == sizeof("/content") - 1
                   && ngx_strncmp(p, "/content", sizeof("/content") - 1) == 0
                   ? NGX_OK : NGX_DECLINED;
        }
    }

    return NGX_DECLINED;
}


/* A lowercase hex digit, as key ids and sha256s are written. */
static ngx_flag_t
ngx_http_codexec_link_hex_char(u_char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}


/* A byte a header's value may hold: no control character. */
static ngx_flag_t
ngx_http_codexec_link_header_char(u_char c)
{
    return (c >= 0x20 || c == '\t') && c != 0x7f;
}


/* k: empty, or a key id (a lowercase UUID) before it names a file. */
static ngx_int_t
ngx_http_codexec_link_key_id(ngx_str_t *k)
{
    ngx_uint_t  i;

    if (k->len == 0) {
        return NGX_OK;
    }

    if (k->len != 36) {
        return NGX_DECLINED;
    }

    for (i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (k->data[i] != '-') {
                return NGX_DECLINED;
            }

        } else if (!ngx_http_codexec_link_hex_char(k->data[i])) {
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


/* Whether the link's key may not be trusted here: the revocation list
 * (revoked_keys_dir: a file per revoked key, and .listed once codexec
 * keeps it) names it, is not kept, or can't be read. Fails closed. */
static ngx_flag_t
ngx_http_codexec_link_revoked(ngx_http_codexec_link_conf_t *lcf, ngx_str_t *k)
{
    u_char           path[CODEXEC_LINK_DIR_MAX + 64], *p;
    ngx_file_info_t  fi;

    if (ngx_http_codexec_link_key_id(k) != NGX_OK) {
        return 1;
    }

    p = ngx_snprintf(path, sizeof(path) - 1, "%V/.listed", &lcf->revoked);
    *p = '\0';

    if (ngx_link_info(path, &fi) == NGX_FILE_ERROR || !ngx_is_file(&fi)) {
        return 1;
    }

    if (k->len == 0) {
        return 0;
    }

    p = ngx_snprintf(path, sizeof(path) - 1, "%V/%V", &lcf->revoked, k);
    *p = '\0';

    /* (lstat: a dangling link named by k counts as there) */
    return ngx_link_info(path, &fi) != NGX_FILE_ERROR
           || ngx_errno != NGX_ENOENT;
}


static ngx_flag_t
ngx_http_codexec_link_update(EVP_MAC_CTX *c, ngx_str_t *s, ngx_flag_t nl)
{
    return EVP_MAC_update(c, s->data, s->len)
           && (!nl || EVP_MAC_update(c, (u_char *) "\n", 1));
}


/* The link's MAC against sig, in time that depends on lengths only.
 * HMAC-SHA-256 through libcrypto's EVP API; the keyed context is kept for
 * the next request (a worker serves one request at a time), and
 * EVP_MAC_init without a key starts it again from the key's inner and
 * outer states, hashed once. Any failure of libcrypto (out of memory) is
 * "not ok": codexec answers then. */
static ngx_flag_t
ngx_http_codexec_link_mac_ok(ngx_str_t *key, ngx_http_codexec_link_t *l)
{
    static u_char        have[CODEXEC_LINK_KEY_LEN];
    static EVP_MAC_CTX  *ctx;

    u_char               d[EVP_MAX_MD_SIZE], enc[64];
    size_t               dlen;
    ngx_str_t            src, dst;
    EVP_MAC             *mac;
    ngx_flag_t           ok;
    OSSL_PARAM           params[2];

    if (key->len != CODEXEC_LINK_KEY_LEN) {
        return 0;
    }

    if (ctx == NULL || CRYPTO_memcmp(have, key->data, CODEXEC_LINK_KEY_LEN)) {
        EVP_MAC_CTX_free(ctx);
        mac = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
        ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
        EVP_MAC_free(mac); /* (the context holds its own reference) */

        params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
                                                     (char *) "SHA2-256", 0);
        params[1] = OSSL_PARAM_construct_end();

        if (ctx == NULL
            || !EVP_MAC_init(ctx, key->data, CODEXEC_LINK_KEY_LEN, params))
        {
            EVP_MAC_CTX_free(ctx);
            ctx = NULL;
            return 0;
        }

        ngx_memcpy(have, key->data, CODEXEC_LINK_KEY_LEN);

    } else if (!EVP_MAC_init(ctx, NULL, 0, NULL)) {
        return 0;
    }

    ok = EVP_MAC_update(ctx, (u_char *) "codexec-link-v2\n",
                        sizeof("codexec-link-v2\n") - 1)
         && ngx_http_codexec_link_update(ctx, &l->u, 1)
         && ngx_http_codexec_link_update(ctx, &l->id, 1)
         && ngx_http_codexec_link_update(ctx, &l->version, 1)
         && ngx_http_codexec_link_update(ctx, &l->exp, 1)
         && ngx_http_codexec_link_update(ctx, &l->k, 1)
         && ngx_http_codexec_link_update(ctx, &l->m, 0)
         && EVP_MAC_final(ctx, d, &dlen, sizeof(d))
         && dlen == 32;

    if (!ok) {
        return 0;
    }

    src.data = d;
    src.len = dlen;
    dst.data = enc;
    ngx_encode_base64url(&dst, &src);
    OPENSSL_cleanse(d, sizeof(d));

    return l->sig.len == dst.len
           && CRYPTO_memcmp(enc, l->sig.data, dst.len) == 0;
}


/* exp: digits only (whatever else codexec signed, it judges), and not
 * past, to the millisecond. */
static ngx_flag_t
ngx_http_codexec_link_expired(ngx_str_t *exp)
{
    ngx_int_t    n;
    ngx_time_t  *tp;

    n = exp->len <= 18 ? ngx_atoi(exp->data, exp->len) : NGX_ERROR;

    if (n == NGX_ERROR) {
        return 1;
    }

    tp = ngx_timeofday();

    return n < (ngx_int_t) tp->sec || (n == (ngx_int_t) tp->sec && tp->msec);
}


/* A storage key as codexec derives it: relative, no empty, "." or ".."
 * step, no control character, ?, #, % or backslash. (It is under the MAC:
 * this is a second line, not the first.) */
static ngx_flag_t
ngx_http_codexec_link_key_safe(ngx_str_t *key)
{
    u_char  *p, *end, *step;

    if (key->len == 0 || key->len > CODEXEC_LINK_PATH_MAX / 2) {
        return 0;
    }

    end = key->data + key->len;
    step = key->data;

    for (p = key->data; p <= end; p++) {
        if (p == end || *p == '/') {
            if (p == step
                || (p - step == 1 && step[0] == '.')
                || (p - step == 2 && step[0] == '.' && step[1] == '.'))
            {
                return 0;
            }

            step = p + 1;
            continue;
        }

        if (*p < 0x20 || *p == 0x7f || *p == '?' || *p == '#' || *p == '%'
            || *p == '\\')
        {
            return 0;
        }
    }

    return 1;
}


static ngx_flag_t
ngx_http_codexec_link_all(ngx_str_t *s, ngx_flag_t (*ok)(u_char))
{
    ngx_uint_t  i;

    for (i = 0; i < s->len; i++) {
        if (!ok(s->data[i])) {
            return 0;
        }
    }

    return 1;
}


/* m's four lines, each checked. */
static ngx_int_t
ngx_http_codexec_link_meta(ngx_http_request_t *r, ngx_str_t *m,
    ngx_http_codexec_link_meta_t *meta)
{
    u_char      *p, *end, *nl;
    ngx_str_t    raw, *f[4];
    ngx_uint_t   i;

    raw.data = ngx_pnalloc(r->pool, ngx_base64_decoded_length(m->len));
    if (raw.data == NULL || ngx_decode_base64url(&raw, m) != NGX_OK) {
        return NGX_ERROR;
    }

    f[0] = &meta->key;
    f[1] = &meta->type;
    f[2] = &meta->sha;
    f[3] = &meta->disposition;

    p = raw.data;
    end = raw.data + raw.len;

    for (i = 0; i < 4; i++) {
        nl = i < 3 ? ngx_strlchr(p, end, '\n') : end;
        if (nl == NULL) {
            return NGX_DECLINED;
        }

        f[i]->data = p;
        f[i]->len = nl - p;

        if (i < 3) {
            p = nl + 1;
        }
    }

    if (!ngx_http_codexec_link_key_safe(&meta->key)
        || meta->type.len == 0
        || !ngx_http_codexec_link_all(&meta->type,
                                      ngx_http_codexec_link_header_char)
        || meta->sha.len != 64
        || !ngx_http_codexec_link_all(&meta->sha,
                                      ngx_http_codexec_link_hex_char)
        || meta->disposition.len == 0
        || !ngx_http_codexec_link_all(&meta->disposition,
                                      ngx_http_codexec_link_header_char))
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* If-None-Match against the sha256, as codexec compares (weak allowed). */
static ngx_flag_t
ngx_http_codexec_link_none_match(ngx_table_elt_t *h, ngx_str_t *sha)
{
    u_char  *p, *end, *start, *last;

    if (h == NULL) {
        return 0;
    }

    p = h->value.data;
    end = p + h->value.len;

    for ( ;; ) {
        start = p;

        while (p < end && *p != ',') {
            p++;
        }

        last = p;

        while (start < last && (*start == ' ' || *start == '\t')) {
            start++;
        }

        while (last > start && (last[-1] == ' ' || last[-1] == '\t')) {
            last--;
        }

        if (last - start == 1 && *start == '*') {
            return 1;
        }

        if (last - start >= 2 && start[0] == 'W' && start[1] == '/') {
            start += 2;
        }

        if ((size_t) (last - start) == sha->len + 2 && start[0] == '"'
            && last[-1] == '"'
            && ngx_strncmp(start + 1, sha->data, sha->len) == 0)
        {
            return 1;
        }

        if (p == end) {
            return 0;
        }

        p++;
    }
}


static ngx_table_elt_t *
ngx_http_codexec_link_header(ngx_http_request_t *r, char *name, ngx_str_t *v)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NULL;
    }

    h->hash = 1;
    h->key.data = (u_char *) name;
    h->key.len = ngx_strlen(name);
    h->value = *v;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return h;
}


/* The version's headers, on the file's answer and on 304: Content-Type,
 * ETag (nginx's own, so that If-Range resumes a download), Content-
 * Disposition, Cache-Control. */
static ngx_int_t
ngx_http_codexec_link_headers(ngx_http_request_t *r,
    ngx_http_codexec_link_meta_t *meta)
{
    ngx_str_t         etag;
    static ngx_str_t  priv = ngx_string("private");

    r->headers_out.content_type = meta->type;
    r->headers_out.content_type_len = meta->type.len;
    r->headers_out.content_type_lowcase = NULL;

    etag.len = meta->sha.len + 2;
    etag.data = ngx_pnalloc(r->pool, etag.len);
    if (etag.data == NULL) {
        return NGX_ERROR;
    }

    etag.data[0] = '"';
    ngx_memcpy(etag.data + 1, meta->sha.data, meta->sha.len);
    etag.data[etag.len - 1] = '"';

    r->headers_out.etag = ngx_http_codexec_link_header(r, "ETag", &etag);

    if (r->headers_out.etag == NULL
        || ngx_http_codexec_link_header(r, "Content-Disposition",
                                        &meta->disposition) == NULL
        || ngx_http_codexec_link_header(r, "Cache-Control", &priv) == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* The file under storage_dir, opened as nginx's static module opens one;
 * NGX_DECLINED when it is not there (deleted: codexec says 404). */
static ngx_int_t
ngx_http_codexec_link_open(ngx_http_request_t *r,
    ngx_http_codexec_link_conf_t *lcf, ngx_http_codexec_link_meta_t *meta,
    ngx_str_t *path, ngx_open_file_info_t *of)
{
    u_char                    *p;
    ngx_http_core_loc_conf_t  *clcf;

    path->len = lcf->storage.len + 1 + meta->key.len;
    path->data = ngx_pnalloc(r->pool, path->len + 1);
    if (path->data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(path->data, lcf->storage.data, lcf->storage.len);
    *p++ = '/';
    p = ngx_cpymem(p, meta->key.data, meta->key.len);
    *p = '\0';

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    ngx_memzero(of, sizeof(ngx_open_file_info_t));

    of->read_ahead = clcf->read_ahead;
    of->directio = clcf->directio;
    of->valid = clcf->open_file_cache_valid;
    of->min_uses = clcf->open_file_cache_min_uses;
    of->errors = clcf->open_file_cache_errors;
    of->events = clcf->open_file_cache_events;

    if (ngx_http_set_disable_symlinks(r, clcf, path, of) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_open_cached_file(clcf->open_file_cache, path, of, r->pool)
        != NGX_OK)
    {
        if (of->err == 0) {
            return NGX_ERROR;
        }

        /* (no path: it holds the user's name and the file's) */
        if (of->err != NGX_ENOENT && of->err != NGX_ENOTDIR) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, of->err,
                          "codexec link: %s of the stored file failed",
                          of->failed);
        }

        return NGX_DECLINED;
    }

    if (!of->is_file) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "codexec link: the stored file is not a regular file");
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* The version: 304 for a matching If-None-Match, else the file as nginx's
 * static module sends one (Range, Last-Modified, sendfile); codexec
 * answers when the file is not there. */
static ngx_int_t
ngx_http_codexec_link_serve(ngx_http_request_t *r,
    ngx_http_codexec_link_conf_t *lcf, ngx_http_codexec_link_meta_t *meta)
{
    ngx_int_t              rc;
    ngx_str_t              path;
    ngx_buf_t             *b;
    ngx_chain_t            out;
    ngx_open_file_info_t   of;

    rc = ngx_http_codexec_link_open(r, lcf, meta, &path, &of);

    if (rc == NGX_DECLINED) {
        return ngx_http_named_location(r, &lcf->fallback);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    r->connection->log->action = "sending response to client";

    /* all allocated before the first header is added */
    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->file = ngx_pcalloc(r->pool, sizeof(ngx_file_t));
    if (b->file == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_codexec_link_headers(r, meta) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_codexec_link_none_match(r->headers_in.if_none_match,
                                         &meta->sha))
    {
        r->headers_out.status = NGX_HTTP_NOT_MODIFIED;
        r->header_only = 1;
        return ngx_http_send_header(r);
    }

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = of.size;
    r->headers_out.last_modified_time = of.mtime;
    r->allow_ranges = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b->file_pos = 0;
    b->file_last = of.size;

    b->in_file = b->file_last ? 1 : 0;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;
    b->sync = (b->last_buf || b->in_file) ? 0 : 1;

    b->file->fd = of.fd;
    b->file->name = path;
    b->file->log = r->connection->log;
    b->file->directio = of.is_directio;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/*
 * The request line up to its query, for what names it from now on: the
 * error log's "request:" (this module's messages, codexec's upstream
 * errors) and $request. A link's query holds its signature, a credential
 * until it expires; codexec reads the query from $request_uri and
 * $query_string, not from this line.
 */

static void
ngx_http_codexec_link_hide_query(ngx_http_request_t *r)
{
    u_char  *q;

    q = ngx_strlchr(r->request_line.data,
                    r->request_line.data + r->request_line.len, '?');

    if (q != NULL) {
        r->request_line.len = q - r->request_line.data;
    }
}


static ngx_int_t
ngx_http_codexec_link_handler(ngx_http_request_t *r)
{
    ngx_str_t                      key;
    ngx_http_codexec_link_t        link;
    ngx_http_codexec_link_meta_t   meta;
    ngx_http_codexec_link_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_codexec_link_module);

    ngx_http_codexec_link_hide_query(r);

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))
        || ngx_http_codexec_link_args(r, &link) != NGX_OK
        || ngx_http_complex_value(r, lcf->key, &key) != NGX_OK
        || !ngx_http_codexec_link_mac_ok(&key, &link)
        || ngx_http_codexec_link_expired(&link.exp)
        || ngx_http_codexec_link_revoked(lcf, &link.k)
        || ngx_http_codexec_link_meta(r, &link.m, &meta) != NGX_OK)
    {
        return ngx_http_named_location(r, &lcf->fallback);
    }

    return ngx_http_codexec_link_serve(r, lcf, &meta);
}


static void *
ngx_http_codexec_link_create_conf(ngx_conf_t *cf)
{
    ngx_http_codexec_link_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_codexec_link_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->key = NULL;
     *     conf->storage = { 0, NULL };
     *     conf->revoked = { 0, NULL };
     *     conf->fallback = { 0, NULL };
     */

    return conf;
}


static char *
ngx_http_codexec_link_merge_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_codexec_link_conf_t  *prev = parent;
    ngx_http_codexec_link_conf_t  *conf = child;

    if (conf->key == NULL) {
        conf->key = prev->key;
    }

    ngx_conf_merge_str_value(conf->storage, prev->storage, "");
    ngx_conf_merge_str_value(conf->revoked, prev->revoked, "");
    ngx_conf_merge_str_value(conf->fallback, prev->fallback, "@codexec");

    if (conf->storage.len == 0) {
        return NGX_CONF_OK;
    }

    if (conf->key == NULL || conf->revoked.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "codexec_link_storage needs codexec_link_key "
                           "and codexec_link_revoked");
        return NGX_CONF_ERROR;
    }

    if (conf->revoked.data[0] != '/'
        || conf->revoked.len > CODEXEC_LINK_DIR_MAX)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "codexec_link_revoked must be an absolute path "
                           "of at most %d characters", CODEXEC_LINK_DIR_MAX);
        return NGX_CONF_ERROR;
    }

    if (conf->fallback.len < 2 || conf->fallback.data[0] != '@') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "codexec_link_fallback must name a location "
                           "(@name)");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_codexec_link_storage(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_codexec_link_conf_t  *lcf = conf;

    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    if (lcf->storage.data) {
        return "is duplicate";
    }

    value = cf->args->elts;
    lcf->storage = value[1];

    while (lcf->storage.len > 1
           && lcf->storage.data[lcf->storage.len - 1] == '/')
    {
        lcf->storage.len--;
    }

    if (lcf->storage.data[0] != '/'
        || lcf->storage.len > CODEXEC_LINK_DIR_MAX)
    {
        return "must be an absolute path of at most 1024 characters";
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_codexec_link_handler;

    return NGX_CONF_OK;
}
