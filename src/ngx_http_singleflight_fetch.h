/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The fetch: the one upstream request of a flight, a background
 * subrequest of the request that hosts it, captured into the store.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_FETCH_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_FETCH_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_fetch_init(ngx_conf_t *cf,
    ngx_http_singleflight_fetch_host_t *host);
ngx_int_t ngx_http_singleflight_fetch_adopt(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation);
ngx_int_t ngx_http_singleflight_fetch_start(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation);
void **ngx_http_singleflight_fetch_began(
    ngx_http_singleflight_fetch_t *fetch);
ngx_int_t ngx_http_singleflight_fetch_unshare(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_fetch_done(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
void ngx_http_singleflight_fetch_filters(ngx_http_output_body_filter_pt self,
    ngx_http_output_body_filter_pt next);
ngx_int_t ngx_http_singleflight_fetch_header(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_fetch_body(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_chain_t *in);
ngx_int_t ngx_http_singleflight_fetch_pump(ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_fetch_header_out(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_request_t *r);
#if (nginx_version >= 1029000)
ngx_int_t ngx_http_singleflight_fetch_early_hints(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
#endif
ngx_array_t *ngx_http_singleflight_fetch_states_before(
    ngx_http_singleflight_ctx_t *ctx);
ngx_uint_t ngx_http_singleflight_fetch_running(
    ngx_http_singleflight_ctx_t *ctx);
ngx_uint_t ngx_http_singleflight_fetch_stops(ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_fetch_host_left(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn);
void ngx_http_singleflight_fetch_cleanup(ngx_http_singleflight_ctx_t *ctx);


/*
 * The fetch whose subrequest r is, or NULL.  Inline: the filters ask it
 * of every subrequest's response, without a call of their own.
 */

static ngx_inline ngx_http_singleflight_fetch_t *
ngx_http_singleflight_fetch_of(ngx_http_request_t *r)
{
    if (r->post_subrequest
        && r->post_subrequest->handler == ngx_http_singleflight_fetch_done)
    {
        return r->post_subrequest->data;
    }

    return NULL;
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_FETCH_H_INCLUDED_ */
