
/*
 * Fan-out: answering a follower with its flight's stored response.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_FANOUT_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_FANOUT_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_uint_t ngx_http_singleflight_linked(ngx_http_request_t *r,
    ngx_table_elt_t *h);
ngx_int_t ngx_http_singleflight_send(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);


#endif /* _NGX_HTTP_SINGLEFLIGHT_FANOUT_H_INCLUDED_ */
