/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * A request's flight key: what makes two requests the same.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_


#include "ngx_http_singleflight.h"


void ngx_http_singleflight_key_init_generation(void);
ngx_int_t ngx_http_singleflight_key_make(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value);
uint64_t ngx_http_singleflight_key_sketch(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value);
uint64_t ngx_http_singleflight_hash64(u_char *data, size_t len);
ngx_int_t ngx_http_singleflight_variable_index(ngx_cycle_t *cycle,
    u_char *name, size_t len);

void ngx_http_singleflight_key_value(ngx_str_t *key, ngx_str_t *value);
ngx_int_t ngx_http_singleflight_body_hash(ngx_http_request_t *r,
    ngx_str_t *hex);


/*
 * The singleflight_key value, in one part or two: NGX_DECLINED when it is
 * empty (no flight), NGX_ERROR.  The default, $scheme$host, is made
 * without the script engine, as nginx makes those variables: "https" on a
 * TLS connection, and the Host (or the request line's host) or else the
 * server's name; never empty.  Inline: every request the module looks at
 * asks it.
 */

static ngx_inline ngx_int_t
ngx_http_singleflight_key_values(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value)
{
    ngx_http_core_srv_conf_t  *cscf;

    if (!ctx->conf->key_default) {
        ngx_str_null(&value[1]);

        if (ngx_http_complex_value(r, ctx->conf->key, &value[0]) != NGX_OK) {
            return NGX_ERROR;
        }

        return value[0].len ? NGX_OK : NGX_DECLINED;
    }

    ngx_str_set(&value[0], "http");

#if (NGX_HTTP_SSL)
    if (r->connection->ssl) {
        ngx_str_set(&value[0], "https");
    }
#endif

    if (r->headers_in.server.len) {
        value[1] = r->headers_in.server;

    } else {
        cscf = ngx_http_get_module_srv_conf(r, ngx_http_core_module);
        value[1] = cscf->server_name;
    }

    return NGX_OK;
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_ */
