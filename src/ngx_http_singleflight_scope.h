
/*
 * Zone scoping: singleflight_zone, its instances (one, one per NUMA node,
 * or one per worker) and each worker's choice of instance and slot.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_SCOPE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_SCOPE_H_INCLUDED_


#include "ngx_http_singleflight.h"


extern ngx_str_t  ngx_http_singleflight_scopes[];


char *ngx_http_singleflight_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_http_singleflight_zone_conf_t *ngx_http_singleflight_zone_find(
    ngx_conf_t *cf, ngx_str_t *name);
ngx_int_t ngx_http_singleflight_scope_init_process(ngx_cycle_t *cycle);
void ngx_http_singleflight_scope_exit_process(ngx_cycle_t *cycle);
ngx_uint_t ngx_http_singleflight_dead(ngx_pid_t pid);


#endif /* _NGX_HTTP_SINGLEFLIGHT_SCOPE_H_INCLUDED_ */
