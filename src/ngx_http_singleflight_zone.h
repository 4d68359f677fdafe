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
ngx_http_singleflight_zone_conf_t *ngx_http_singleflight_zone_default(
    ngx_conf_t *cf);
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


/* the pages of an instance's slab pool in use */

static ngx_inline ngx_uint_t
ngx_http_singleflight_pages_used(ngx_slab_pool_t *sp)
{
    return (ngx_uint_t) (sp->last - sp->pages) - sp->pfree;
}


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


/*
 * singleflight_lone direct.  An instance whose zone a "direct" location
 * uses has slots, each for the keys of one hash (key_sketch(): of a key's
 * parts, taken before the key is made): how many requests of such
 * locations with a key of that hash are in progress, and in which epoch
 * they were counted.  A request that finds its slot at 0 has
 * nobody to share with and goes upstream itself, as without the module;
 * the others look for a flight as usual.  A process that went away took
 * the counts of its requests with it: the removal of its record starts a
 * new epoch (claims_reset_locked()), in which a slot counted in an older
 * one is 0 again.  Nothing here is locked; a collision or a reset only
 * sends a request one way rather than the other.
 */

#define NGX_HTTP_SINGLEFLIGHT_CLAIMS  8192          /* a power of 2 */

#if (NGX_PTR_SIZE == 8)
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT  32
#else
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT  16
#endif

#define NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT                                     \
    (((ngx_atomic_uint_t) 1 << NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT) - 1)


ngx_int_t ngx_http_singleflight_claims_init(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t locked);


/* a new epoch: under the instance's lock */

static ngx_inline void
ngx_http_singleflight_claims_reset_locked(ngx_http_singleflight_zone_t *zone)
{
    if (zone->sh->claims != NULL) {
        zone->sh->claim_epoch++;
    }
}


/*
 * Counts a request with a key of "hash" in its slot: 1 if it is the only
 * one there, 0 if it is not (or nothing was counted: *slot is NULL).
 */

static ngx_inline ngx_uint_t
ngx_http_singleflight_claim(ngx_http_singleflight_zone_t *zone, uint64_t hash,
    ngx_atomic_t **slot, ngx_atomic_uint_t *epoch)
{
    ngx_atomic_t       *s;
    ngx_atomic_uint_t   v, nv, e;

    s = &zone->sh->claims[(hash ^ (hash >> 32))
                          & (NGX_HTTP_SINGLEFLIGHT_CLAIMS - 1)];

    e = (ngx_atomic_uint_t) zone->sh->claim_epoch
        << NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT;

    do {
        v = *s;

        if ((v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) != e
            || (v & NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) == 0)
        {
            nv = e + 1;

        } else if ((v & NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT)
                   == NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT)
        {
            *slot = NULL;
            return 0;

        } else {
            nv = v + 1;
        }

    } while (!ngx_atomic_cmp_set(s, v, nv));

    *slot = s;
    *epoch = e;

    return nv == e + 1;
}


/* the request is over: its count goes, unless its epoch is past */

static ngx_inline void
ngx_http_singleflight_unclaim(ngx_atomic_t *slot, ngx_atomic_uint_t epoch)
{
    ngx_atomic_uint_t  v;

    do {
        v = *slot;

        if ((v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) != epoch
            || (v & NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) == 0)
        {
            return;
        }

    } while (!ngx_atomic_cmp_set(slot, v, v - 1));
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_ */
