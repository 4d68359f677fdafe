
/*
 * The flight key.  The first byte is the class (GET or HEAD flight); the
 * rest is the evaluated singleflight_key.  Keys may hold any bytes and be
 * of any length: they are compared in full, the hash only orders the tree.
 */


#include "ngx_http_singleflight_key.h"


ngx_int_t
ngx_http_singleflight_key(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *sfcf, ngx_http_singleflight_ctx_t *ctx)
{
    u_char     *p, class;
    size_t      len;
    ngx_str_t   value, method;

    if (ngx_http_complex_value(r, sfcf->key, &value) != NGX_OK) {
        return NGX_ERROR;
    }

    /*
     * GET and HEAD have classes of their own; any other method configured
     * in singleflight_methods gets a class holding the method's name, so
     * that a POST never joins a GET flight of the same key
     */

    ngx_str_null(&method);

    if (r->method == NGX_HTTP_GET) {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_GET;

    } else if (r->method == NGX_HTTP_HEAD) {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD;

    } else {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_OTHER;
        method = r->method_name;
    }

    len = 1 + method.len + 1 + value.len;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ctx->key.data = p;
    ctx->key.len = len;

    p++;

    if (method.len) {
        p = ngx_cpymem(p, method.data, method.len);
    }

    *p++ = ' ';

    if (value.len) {
        ngx_memcpy(p, value.data, value.len);
    }

    ngx_http_singleflight_key_class(ctx, class);

    return NGX_OK;
}


void
ngx_http_singleflight_key_class(ngx_http_singleflight_ctx_t *ctx,
    u_char class)
{
    ctx->key.data[0] = class;
    ctx->hash = ngx_murmur_hash2(ctx->key.data, ctx->key.len);
}
