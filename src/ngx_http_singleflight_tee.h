/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/* PROTOTYPE: the leader as its own fetch (singleflight_lone tee) */


#ifndef _NGX_HTTP_SINGLEFLIGHT_TEE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_TEE_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_uint_t ngx_http_singleflight_tee_eligible(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_tee_start(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_tee_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);


#endif /* _NGX_HTTP_SINGLEFLIGHT_TEE_H_INCLUDED_ */
