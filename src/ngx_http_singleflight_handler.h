
/*
 * The precontent phase handler: decides leader or follower, suspends
 * followers on the event loop and resumes them; the leader's end of a
 * flight (done, not shareable, failed) and the wake-ups it causes.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_handler_init(ngx_conf_t *cf);
ngx_http_singleflight_ctx_t *ngx_http_singleflight_get_ctx(
    ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_follow_own(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t reason, ngx_uint_t status);
void ngx_http_singleflight_fail(ngx_http_singleflight_ctx_t *ctx,
    ngx_uint_t reason, ngx_uint_t status, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_finish_alone(
    ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_finish(ngx_http_singleflight_ctx_t *ctx,
    ngx_uint_t state, ngx_uint_t status, ngx_log_t *log);
void ngx_http_singleflight_wake_group(ngx_http_singleflight_zone_t *zone,
    uint64_t id);


#endif /* _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_ */
