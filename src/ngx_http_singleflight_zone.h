
/*
 * The shared-memory zone: the singleflight_zone directive, the rbtree of
 * flights, node and chunk lifecycle, and the registry of worker slots.
 * Every function named *_locked expects shpool->mutex to be held.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
ngx_int_t ngx_http_singleflight_init_shctx(ngx_http_singleflight_zone_t *zone);
void ngx_http_singleflight_group_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);

ngx_http_singleflight_node_t *ngx_http_singleflight_lookup_locked(
    ngx_http_singleflight_zone_t *zone, uint32_t hash, ngx_str_t *key);
ngx_http_singleflight_node_t *ngx_http_singleflight_create_locked(
    ngx_http_singleflight_zone_t *zone, uint32_t hash, ngx_str_t *key,
    ngx_uint_t *nomem);
void ngx_http_singleflight_unlink_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn);
void ngx_http_singleflight_join_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn);
void ngx_http_singleflight_rewait_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn);
void ngx_http_singleflight_unwait_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn);
void ngx_http_singleflight_lead_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t follower);
void ngx_http_singleflight_release_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t leader);
void ngx_http_singleflight_mark_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_msec_t ttl);
ngx_uint_t ngx_http_singleflight_marked_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
void ngx_http_singleflight_expire_locked(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t n);
ngx_uint_t ngx_http_singleflight_take_mask_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_pid_t *pids);
ngx_uint_t ngx_http_singleflight_reclaim_locked(
    ngx_http_singleflight_zone_t *zone, ngx_pid_t pid);
void ngx_http_singleflight_drop_body_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
void *ngx_http_singleflight_alloc_locked(ngx_http_singleflight_zone_t *zone,
    size_t size, ngx_uint_t *nomem);
void ngx_http_singleflight_log_dead(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log, ngx_pid_t pid, ngx_uint_t led);
void ngx_http_singleflight_log_nomem(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log, ngx_uint_t nomem);
ngx_uint_t ngx_http_singleflight_pages_used(ngx_slab_pool_t *shpool);
ngx_uint_t ngx_http_singleflight_pages_total(ngx_slab_pool_t *shpool);


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


static ngx_inline void
ngx_http_singleflight_unlock(ngx_http_singleflight_zone_t *zone)
{
    ngx_http_singleflight_gauges_t  *g;

    if (!zone->local) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return;
    }

    if (zone->wstats != NULL) {
        g = &zone->wstats->gauges;
        g->in_flight = zone->sh->in_flight;
        g->waiters = zone->sh->waiters;
        g->pages_free = zone->shpool->pfree;
        g->pages_used = (ngx_uint_t) (zone->shpool->last - zone->shpool->pages)
                        - zone->shpool->pfree;
        g->pages_baseline = zone->sh->baseline;
    }
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_ */
