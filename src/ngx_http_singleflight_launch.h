/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The launch: a fetch's subrequest started, and started again (a hedge,
 * a resume).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_LAUNCH_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_LAUNCH_H_INCLUDED_


#include "ngx_http_singleflight.h"


void ngx_http_singleflight_launch_init(ngx_http_post_subrequest_pt done);
ngx_int_t ngx_http_singleflight_launch_new(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_http_singleflight_fetch_t *prev);
void ngx_http_singleflight_launch_won(ngx_http_singleflight_fetch_t *fetch);
ngx_int_t ngx_http_singleflight_launch_part(
    ngx_http_singleflight_fetch_t *fetch);
ngx_int_t ngx_http_singleflight_launch_resume(
    ngx_http_singleflight_fetch_t *fetch);
ngx_int_t ngx_http_singleflight_launch_resumed(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
void ngx_http_singleflight_launch_asked(ngx_log_t *log,
    ngx_http_singleflight_node_t *fn, off_t from, off_t total,
    ngx_uint_t whole);


#endif /* _NGX_HTTP_SINGLEFLIGHT_LAUNCH_H_INCLUDED_ */
