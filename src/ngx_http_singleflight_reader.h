/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The reader: a request's part in a flight.  It arrives with its key and
 * leads, follows or joins a flight (join), waits for the header, decides
 * whether the response is its own to take (Vary, private, the flight's
 * outcome), and serves it from the store by offset, at its own pace, or
 * straight from the fetch it hosts (direct mode).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_READER_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_READER_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_http_singleflight_ctx_t *ngx_http_singleflight_find_ctx(
    ngx_http_request_t *r);
ngx_http_singleflight_ctx_t *ngx_http_singleflight_create_ctx(
    ngx_http_request_t *r);
void ngx_http_singleflight_ctx_warm(ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_reader_pending(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_reader_content(ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_reader_join(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
ngx_int_t ngx_http_singleflight_reader_again(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_reader_refused(ngx_http_request_t *r);
void ngx_http_singleflight_reader_mirror_join(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_reader_mirror_skip(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_reader_mirror(ngx_http_request_t *r);


/* what a fetch asks of its host, for fetch_init() */
extern ngx_http_singleflight_fetch_host_t  ngx_http_singleflight_reader_host;

/* read by the header filter; set by reader.c alone */
extern ngx_uint_t  ngx_http_singleflight_mirror_made;


/*
 * The request's context, or NULL: the module's, or after a redirect
 * cleared it, the one its pool cleanup holds (_reader.c)
 */

static ngx_inline ngx_http_singleflight_ctx_t *
ngx_http_singleflight_get_ctx(ngx_http_request_t *r)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_singleflight_module);

    if (ctx != NULL || !(r->internal || r->filter_finalize)) {
        return ctx;
    }

    return ngx_http_singleflight_find_ctx(r);
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_READER_H_INCLUDED_ */
