/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Whom a response may go to: nobody else (singleflight_private), and
 * which requests with credentials (singleflight_credentials http).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_SHARE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_SHARE_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_uint_t ngx_http_singleflight_share(ngx_http_request_t *r,
    ngx_uint_t conditions, ngx_uint_t *creds);
ngx_uint_t ngx_http_singleflight_share_checked(ngx_http_request_t *r,
    void **from);
ngx_uint_t ngx_http_singleflight_share_reason(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t *creds, ngx_array_t **vary);
ngx_uint_t ngx_http_singleflight_share_cached(ngx_http_request_t *r);
ngx_uint_t ngx_http_singleflight_share_answered(ngx_http_request_t *r);
ngx_uint_t ngx_http_singleflight_share_unwaited(ngx_http_request_t *r);
ngx_uint_t ngx_http_singleflight_share_header_only(ngx_http_request_t *r);


#endif /* _NGX_HTTP_SINGLEFLIGHT_SHARE_H_INCLUDED_ */
