
/*
 * The flight key: the singleflight_key value prefixed by a class byte
 * (GET, HEAD, other method) and the method's name for other methods.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_key(ngx_http_request_t *r,
    ngx_http_complex_value_t *cv, ngx_str_t *key, uint32_t *hash);
ngx_int_t ngx_http_singleflight_key_build(ngx_pool_t *pool,
    ngx_str_t *method, ngx_str_t *value, ngx_str_t *key);
void ngx_http_singleflight_key_class(ngx_str_t *key, uint32_t *hash,
    u_char class);
void ngx_http_singleflight_key_value(ngx_str_t *key, ngx_str_t *value);


#endif /* _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_ */
