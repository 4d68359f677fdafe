
/*
 * Waking followers in other workers: each worker listens on its own
 * datagram socket; a leader's worker sends one datagram per worker that
 * has followers of the flight that just ended.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_NOTIFY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_NOTIFY_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_notify_init_process(ngx_cycle_t *cycle);
void ngx_http_singleflight_notify_exit_process(ngx_cycle_t *cycle);
void ngx_http_singleflight_notify(ngx_http_singleflight_zone_t *zone,
    ngx_pid_t *pids, ngx_uint_t n, uint64_t id, ngx_log_t *log);


#endif /* _NGX_HTTP_SINGLEFLIGHT_NOTIFY_H_INCLUDED_ */
