/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * What a fetch runs on: a connection with no client, and a pool of its
 * host's (_fake.c).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_FAKE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_FAKE_H_INCLUDED_


#include "ngx_http_singleflight.h"


/* a fetch's connection, kept on a list for reuse once its request is gone */
typedef struct {
    ngx_connection_t                 c;
    ngx_event_t                      read;
    ngx_event_t                      write;
    ngx_log_t                        log;
    ngx_http_log_ctx_t               log_ctx;
    ngx_queue_t                      queue;
} ngx_http_singleflight_fake_t;


ngx_http_singleflight_fake_t *ngx_http_singleflight_fake_get(
    ngx_http_request_t *r);
void ngx_http_singleflight_fake_free(ngx_http_singleflight_fake_t *fake);
ngx_pool_t *ngx_http_singleflight_fake_pool(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
void ngx_http_singleflight_fake_pool_free(ngx_pool_t *pool);


#endif /* _NGX_HTTP_SINGLEFLIGHT_FAKE_H_INCLUDED_ */
