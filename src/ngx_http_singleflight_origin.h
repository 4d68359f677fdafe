/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * What nginx's upstream modules send to the origin: which content
 * handlers go to one (proxy_pass, fastcgi_pass, uwsgi_pass, scgi_pass,
 * grpc_pass, memcached_pass), and the request headers a location sets
 * for it (proxy_set_header, grpc_set_header, fastcgi_param HTTP_...).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_ORIGIN_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_ORIGIN_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_origin_hook(ngx_conf_t *cf);
void ngx_http_singleflight_origin_unhook(void *data);
ngx_int_t ngx_http_singleflight_origin_merge(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
ngx_uint_t ngx_http_singleflight_origin_handler(ngx_http_request_t *r,
    ngx_http_handler_pt handler);
ngx_uint_t ngx_http_singleflight_origin_joiner(ngx_http_request_t *r,
    ngx_http_handler_pt handler);
ngx_http_upstream_conf_t *ngx_http_singleflight_origin_upstream(
    ngx_conf_t *cf, ngx_http_core_loc_conf_t *clcf);
ngx_uint_t ngx_http_singleflight_origin_sets(void **loc_conf, ngx_str_t *name);
ngx_int_t ngx_http_singleflight_origin_header(ngx_http_request_t *r,
    void **loc_conf, ngx_str_t *name, ngx_str_t *client, ngx_str_t *value);
ngx_int_t ngx_http_singleflight_module_index(ngx_conf_t *cf,
    const char *name);


#endif /* _NGX_HTTP_SINGLEFLIGHT_ORIGIN_H_INCLUDED_ */
