/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The zone: the singleflight_zone directive, its instances (one shared,
 * one per NUMA node, or one per worker), the tree of flights, the private
 * marks, and slab allocation.  Functions named *_locked expect the
 * instance's lock to be held.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_


#include "ngx_http_singleflight.h"


char *ngx_http_singleflight_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_http_singleflight_zone_conf_t *ngx_http_singleflight_zone_find(
    ngx_conf_t *cf, ngx_str_t *name);
ngx_int_t ngx_http_singleflight_zone_init_process(ngx_cycle_t *cycle);
void ngx_http_singleflight_zone_exit_process(ngx_cycle_t *cycle);

void *ngx_http_singleflight_alloc_locked(ngx_http_singleflight_zone_t *zone,
    size_t size, ngx_uint_t *nomem);
ngx_uint_t ngx_http_singleflight_nomem_locked(
    ngx_http_singleflight_zone_t *zone);
void ngx_http_singleflight_log_nomem(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log, ngx_uint_t nomem);

void ngx_http_singleflight_mark_locked(ngx_http_singleflight_zone_t *zone,
    uint64_t hash, ngx_msec_t ttl);
ngx_uint_t ngx_http_singleflight_marked_locked(
    ngx_http_singleflight_zone_t *zone, uint64_t hash);
void ngx_http_singleflight_expire_locked(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t n);

void ngx_http_singleflight_zone_gauges(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_gauges_t *g);


extern ngx_str_t  ngx_http_singleflight_scopes[];


/*
 * An instance's lock.  scope=worker instances are in one worker's memory
 * and take no lock; unlocking one publishes its gauges for the stats.
 */

static ngx_inline void
ngx_http_singleflight_lock(ngx_http_singleflight_zone_t *zone)
{
    if (!zone->local) {
        ngx_shmtx_lock(&zone->shpool->mutex);
    }
}


/* a scope=worker instance's gauges, for the stats, after a change */

static ngx_inline void
ngx_http_singleflight_publish(ngx_http_singleflight_zone_t *zone)
{
    if (zone->local && zone->wstats != NULL) {
        ngx_http_singleflight_zone_gauges(zone, &zone->wstats->gauges);
    }
}


static ngx_inline void
ngx_http_singleflight_unlock(ngx_http_singleflight_zone_t *zone)
{
    if (!zone->local) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return;
    }

    ngx_http_singleflight_publish(zone);
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_ */
