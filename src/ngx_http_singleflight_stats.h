/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Observability: the singleflight_stats content handler, and the
 * histograms' one writer.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_STATS_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_STATS_H_INCLUDED_


#include "ngx_http_singleflight.h"


char *ngx_http_singleflight_stats(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_singleflight_stats_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_stats_send(ngx_http_request_t *r,
    ngx_buf_t *b);
void ngx_http_singleflight_stats_observe(ngx_http_singleflight_histogram_t *h,
    ngx_msec_int_t ms);
ngx_msec_t ngx_http_singleflight_stats_percentile(
    ngx_http_singleflight_histogram_t *h, ngx_uint_t p, ngx_uint_t min);


/* $singleflight_status's words, by ngx_http_singleflight_status_e */
extern ngx_str_t  ngx_http_singleflight_status_names[];


#endif /* _NGX_HTTP_SINGLEFLIGHT_STATS_H_INCLUDED_ */
