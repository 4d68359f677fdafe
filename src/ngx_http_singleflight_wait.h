/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The wait side: a worker's requests parked on flights, grouped per
 * flight; waking them; and the worker's heartbeat, which also looks for
 * the flights of dead workers.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_WAIT_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_WAIT_H_INCLUDED_


#include "ngx_http_singleflight.h"


/* how often a worker beats its heart and looks at its groups */
#define NGX_HTTP_SINGLEFLIGHT_BEAT  500


ngx_int_t ngx_http_singleflight_wait_park(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_atomic_uint_t seen,
    ngx_http_singleflight_waiter_t *w);
ngx_int_t ngx_http_singleflight_wait_add(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_atomic_uint_t seen,
    ngx_http_singleflight_waiter_t *w);
ngx_int_t ngx_http_singleflight_wait_own(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t how,
    ngx_http_singleflight_waiter_t *w, ngx_atomic_uint_t seq,
    ngx_http_singleflight_waiter_t *first);
void ngx_http_singleflight_wait_listen(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_http_singleflight_waiter_t *w, ngx_event_t *ev);
void ngx_http_singleflight_wait_unpark(ngx_http_singleflight_waiter_t *w);
void ngx_http_singleflight_wait_wake(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t how);
void ngx_http_singleflight_wait_wake_first(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t how,
    ngx_http_singleflight_waiter_t *first);

ngx_int_t ngx_http_singleflight_wait_init_process(ngx_cycle_t *cycle);
void ngx_http_singleflight_wait_exit_process(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_SINGLEFLIGHT_WAIT_H_INCLUDED_ */
