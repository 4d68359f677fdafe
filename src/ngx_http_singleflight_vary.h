/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Vary: which request headers a stored response varies on, with the
 * fetch's values, and whether a request's values are the same.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_VARY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_VARY_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_table_elt_t *ngx_http_singleflight_vary_header(ngx_http_request_t *r,
    ngx_http_singleflight_walk_t *w);
ngx_http_upstream_t *ngx_http_singleflight_vary_upstream(
    ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_vary_collect(ngx_http_request_t *r,
    ngx_http_request_t *host, ngx_array_t **pairs);
ngx_uint_t ngx_http_singleflight_vary_match(ngx_http_request_t *r,
    u_char *block);
ngx_uint_t ngx_http_singleflight_vary_unfetchable(ngx_http_request_t *r,
    u_char *block);
ngx_uint_t ngx_http_singleflight_vary_names(u_char *block);
u_char *ngx_http_singleflight_vary_predict(ngx_http_request_t *r,
    u_char *block, size_t *len);
ngx_uint_t ngx_http_singleflight_conditional(ngx_str_t *name);


/* the request headers a fetch never sends, ending with a null string */
extern ngx_str_t  ngx_http_singleflight_conditions[];


#endif /* _NGX_HTTP_SINGLEFLIGHT_VARY_H_INCLUDED_ */
