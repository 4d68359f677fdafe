/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * A request's flight key: what makes two requests the same.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_


#include "ngx_http_singleflight.h"


void ngx_http_singleflight_key_init_generation(void);
ngx_int_t ngx_http_singleflight_key_values(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value);
ngx_int_t ngx_http_singleflight_key_make(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value);
uint64_t ngx_http_singleflight_key_sketch(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value);
uint64_t ngx_http_singleflight_hash64(u_char *data, size_t len);

void ngx_http_singleflight_key_value(ngx_str_t *key, ngx_str_t *value);
ngx_int_t ngx_http_singleflight_body_hash(ngx_http_request_t *r,
    ngx_str_t *hex);


#endif /* _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_ */
