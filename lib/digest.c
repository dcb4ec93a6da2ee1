#include "digest.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <sodium.h>
#include <string.h>

/* The implementations, fetched on first use (an implicit fetch, as
 * EVP_sha256() makes, looks the provider up again at every init); a
 * fetch that failed (out of memory) is tried again next time. */
static pthread_mutex_t fetch_lock = PTHREAD_MUTEX_INITIALIZER;
static EVP_MD *sha256_md;
static EVP_MAC *hmac;
static bool fetched; /* both are there */

static bool
fetch(void)
{
    bool have = __atomic_load_n(&fetched, __ATOMIC_ACQUIRE);

    if (!have) {
        pthread_mutex_lock(&fetch_lock);
        if (!sha256_md)
            sha256_md = EVP_MD_fetch(NULL, "SHA2-256", NULL);
        if (!hmac)
            hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        have = sha256_md && hmac;
        __atomic_store_n(&fetched, have, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&fetch_lock);
    }
    return have;
}

static const EVP_MD *
md(void)
{
    return fetch() ? sha256_md : NULL;
}

enum cx_err
cx_sha256_init(struct cx_sha256 *s)
{
    const EVP_MD *m = md();

    s->failed = false;
    s->ctx = m ? EVP_MD_CTX_new() : NULL;
    if (!s->ctx || !EVP_DigestInit_ex(s->ctx, m, NULL)) {
        cx_sha256_cleanup(s);
        s->failed = true;
        return CX_ERR_NOMEM;
    }
    return CX_OK;
}

void
cx_sha256_update(struct cx_sha256 *s, const void *data, size_t len)
{
    if (!s->failed && len && !EVP_DigestUpdate(s->ctx, data, len))
        s->failed = true;
}

enum cx_err
cx_sha256_final(struct cx_sha256 *s, unsigned char out[CX_SHA256_BYTES])
{
    unsigned n = 0;
    bool good = !s->failed && s->ctx && EVP_DigestFinal_ex(s->ctx, out, &n) && n == CX_SHA256_BYTES;

    cx_sha256_cleanup(s);
    s->failed = !good;
    return good ? CX_OK : CX_ERR_NOMEM;
}

void
cx_sha256_cleanup(struct cx_sha256 *s)
{
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

enum cx_err
cx_sha256(const void *data, size_t len, unsigned char out[CX_SHA256_BYTES])
{
    const EVP_MD *m = md();
    unsigned n = 0;

    return m && EVP_Digest(data, len, out, &n, m, NULL) && n == CX_SHA256_BYTES ? CX_OK
                                                                                : CX_ERR_NOMEM;
}

enum cx_err
cx_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char h[CX_SHA256_BYTES];
    enum cx_err rc = cx_sha256(data, len, h);

    if (rc == CX_OK)
        sodium_bin2hex(out, 65, h, sizeof(h));
    else
        out[0] = '\0';
    return rc;
}

const char *
cx_sha256_kept(struct cx_sha256_kept *k, const char *text)
{
    bool have;

    pthread_mutex_lock(&k->lock);
    have = k->hex[0] || cx_sha256_hex(text, strlen(text), k->hex) == CX_OK;
    pthread_mutex_unlock(&k->lock);
    return have ? k->hex : NULL;
}

/* HMAC with the named digest; the first CX_MAC_BYTES of it in out. */
static enum cx_err
mac(const char *digest, const void *key, size_t keylen, const void *msg, size_t len,
    unsigned char out[CX_MAC_BYTES])
{
    OSSL_PARAM params[] = {OSSL_PARAM_utf8_string("digest", (char *)digest, 0), OSSL_PARAM_END};
    unsigned char full[EVP_MAX_MD_SIZE];
    size_t n = 0;
    EVP_MAC_CTX *c = fetch() ? EVP_MAC_CTX_new(hmac) : NULL;
    bool good;

    /* (an empty key is HMAC's too; OpenSSL wants a pointer all the same) */
    good = c && EVP_MAC_init(c, keylen ? key : (const void *)"", keylen, params) &&
           EVP_MAC_update(c, msg, len) && EVP_MAC_final(c, full, &n, sizeof(full)) &&
           n >= CX_MAC_BYTES;
    EVP_MAC_CTX_free(c);
    if (good)
        memcpy(out, full, CX_MAC_BYTES);
    OPENSSL_cleanse(full, sizeof(full));
    return good ? CX_OK : CX_ERR_NOMEM;
}

enum cx_err
cx_hmac_sha256(const void *key, size_t keylen, const void *msg, size_t len,
               unsigned char out[CX_MAC_BYTES])
{
    return mac("SHA2-256", key, keylen, msg, len, out);
}

enum cx_err
cx_hmac_sha512_256(const void *key, size_t keylen, const void *msg, size_t len,
                   unsigned char out[CX_MAC_BYTES])
{
    return mac("SHA2-512", key, keylen, msg, len, out);
}
