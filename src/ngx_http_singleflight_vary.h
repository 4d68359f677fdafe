
/*
 * Vary: a response that varies on request headers is shared only with
 * followers whose values of those headers are the leader's.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_VARY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_VARY_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_vary_collect(ngx_http_request_t *r,
    ngx_array_t **pairs);
ngx_uint_t ngx_http_singleflight_vary_match(ngx_http_request_t *r,
    ngx_http_singleflight_node_t *fn);


#endif /* _NGX_HTTP_SINGLEFLIGHT_VARY_H_INCLUDED_ */
