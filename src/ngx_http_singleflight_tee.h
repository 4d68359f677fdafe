/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/* a request as its flight's fetch (singleflight_lone own, and direct) */


#ifndef _NGX_HTTP_SINGLEFLIGHT_TEE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_TEE_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_tee_start(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_tee_adopt(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_tee_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_uint_t ngx_http_singleflight_tee_storing(ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_tee_forgo(ngx_http_singleflight_ctx_t *ctx);


#endif /* _NGX_HTTP_SINGLEFLIGHT_TEE_H_INCLUDED_ */
