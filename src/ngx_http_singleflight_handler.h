/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The phase handler: whether a request is collapsed at all, and the
 * name by which this nginx recognises its own fetches (CDN-Loop).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_handler_init(ngx_conf_t *cf);
void ngx_http_singleflight_handler_init_module(ngx_cycle_t *cycle);
void ngx_http_singleflight_scan_init(ngx_http_singleflight_loc_conf_t *conf);
char *ngx_http_singleflight_loop_name(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_ */
