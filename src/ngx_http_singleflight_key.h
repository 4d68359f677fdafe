
/*
 * The flight key: the singleflight_key value prefixed by a class byte
 * that keeps HEAD flights apart from GET flights.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_key(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *sfcf, ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_key_class(ngx_http_singleflight_ctx_t *ctx,
    u_char class);


#endif /* _NGX_HTTP_SINGLEFLIGHT_KEY_H_INCLUDED_ */
