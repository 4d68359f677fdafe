
/*
 * The flight key: a class byte, the method's name for methods other than
 * GET and HEAD, a space, then the evaluated singleflight_key.  GET and HEAD
 * flights are kept apart by the class (a HEAD request may still follow a
 * GET flight: see _handler.c), and a POST never joins a GET flight of the
 * same key.  Keys may hold any bytes and be of any length: they are
 * compared in full, the hash only orders the tree.
 */


#include "ngx_http_singleflight_key.h"


ngx_int_t
ngx_http_singleflight_key(ngx_http_request_t *r,
    ngx_http_complex_value_t *cv, ngx_str_t *key, uint32_t *hash)
{
    u_char      class;
    ngx_str_t   value, method;

    if (ngx_http_complex_value(r, cv, &value) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_str_null(&method);

    if (r->method == NGX_HTTP_GET) {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_GET;

    } else if (r->method == NGX_HTTP_HEAD) {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD;

    } else {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_OTHER;
        method = r->method_name;
    }

    if (ngx_http_singleflight_key_build(r->pool, &method, &value, key)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_singleflight_key_class(key, hash, class);

    return NGX_OK;
}


/* the key without its class byte, which key_class() sets */

ngx_int_t
ngx_http_singleflight_key_build(ngx_pool_t *pool, ngx_str_t *method,
    ngx_str_t *value, ngx_str_t *key)
{
    u_char  *p;

    key->len = 1 + method->len + 1 + value->len;

    key->data = ngx_pnalloc(pool, key->len);
    if (key->data == NULL) {
        return NGX_ERROR;
    }

    p = key->data + 1;

    if (method->len) {
        p = ngx_cpymem(p, method->data, method->len);
    }

    *p++ = ' ';

    if (value->len) {
        ngx_memcpy(p, value->data, value->len);
    }

    return NGX_OK;
}


void
ngx_http_singleflight_key_class(ngx_str_t *key, uint32_t *hash, u_char class)
{
    key->data[0] = class;
    *hash = ngx_murmur_hash2(key->data, key->len);
}


/* the key as configured, past the class byte and the method */

void
ngx_http_singleflight_key_value(ngx_str_t *key, ngx_str_t *value)
{
    u_char  *p;

    p = ngx_strlchr(key->data + 1, key->data + key->len, ' ');

    if (p == NULL) {
        ngx_str_null(value);
        return;
    }

    p++;

    value->data = p;
    value->len = key->data + key->len - p;
}
