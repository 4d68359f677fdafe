/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * NUMA topology for scope=numa: which node each CPU is on, which node
 * this worker runs on, and binding a zone's memory to its node.  On
 * systems without the Linux interfaces there is one node.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_NUMA_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_NUMA_H_INCLUDED_


#include "ngx_http_singleflight.h"


#define NGX_HTTP_SINGLEFLIGHT_MAX_NODES  64


typedef struct {
    ngx_int_t   *cpu_node;    /* the node of each cpu, -1: unknown */
    ngx_uint_t   ncpus;
    ngx_uint_t   nodes;
} ngx_http_singleflight_numa_t;


ngx_int_t ngx_http_singleflight_numa_topology(ngx_conf_t *cf,
    ngx_http_singleflight_numa_t *numa);
ngx_int_t ngx_http_singleflight_numa_node(ngx_http_singleflight_numa_t *numa,
    ngx_log_t *log);
void ngx_http_singleflight_numa_bind(ngx_shm_zone_t *shm_zone,
    ngx_int_t node, ngx_str_t *name);


#endif /* _NGX_HTTP_SINGLEFLIGHT_NUMA_H_INCLUDED_ */
