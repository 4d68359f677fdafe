/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Observability: the singleflight_stats content handler.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_STATS_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_STATS_H_INCLUDED_


#include "ngx_http_singleflight.h"


char *ngx_http_singleflight_stats(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_singleflight_stats_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_SINGLEFLIGHT_STATS_H_INCLUDED_ */
