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
 *
 * Two bits of a slot let the first request share its response with those
 * that come while it waits for its header (_tee.c: adoption):
 *
 *   PENDING: the request that found the slot at 0 is on its own way and
 *   has not had its header yet, and its response may be a flight's (a
 *   whole GET); it clears the bit at its header, or at its end.  With it
 *   the slot keeps 16 more bits of that request's hash, its mark;
 *
 *   WANTED: a request that then made a flight of the same hash (the same
 *   mark too) waits for that header rather than fetching (flight_defer(),
 *   which sets it under the instance's lock, only while PENDING is set).
 *
 * The first request clears both at once; if WANTED was set it takes the
 * flight over, or lets it go (a follower fetches).  One word, so a flight
 * is never left waiting for a header that has already passed.
 */

#define NGX_HTTP_SINGLEFLIGHT_CLAIMS  8192          /* a power of 2 */

/*
 * A slot: the epoch above the shift; below it, on 64-bit platforms, 16
 * bits of the first request's hash (its mark: a flight of another key in
 * the slot does not wait for it), then WANTED, PENDING and the count
 */

#if (NGX_PTR_SIZE == 8)
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT  40
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_BITS   22
#define ngx_http_singleflight_claim_mark(hash)                                \
    ((ngx_atomic_uint_t) ((hash) >> 48) << 24)
#else
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT  16
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_BITS   14
#define ngx_http_singleflight_claim_mark(hash)  0
#endif

#define NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW                                       \
    (((ngx_atomic_uint_t) 1 << NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT) - 1)
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED                                    \
    ((ngx_atomic_uint_t) 1 << (NGX_HTTP_SINGLEFLIGHT_CLAIM_BITS + 1))
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING                                   \
    ((ngx_atomic_uint_t) 1 << NGX_HTTP_SINGLEFLIGHT_CLAIM_BITS)
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT                                     \
    (NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING - 1)
#define NGX_HTTP_SINGLEFLIGHT_CLAIM_MARK                                      \
    (NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW                                          \
     & ~(NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED                                   \
         |NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING                                 \
         |NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT))


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
 * "pending": the only one sets PENDING, and its mark.
 */

static ngx_inline ngx_uint_t
ngx_http_singleflight_claim(ngx_http_singleflight_zone_t *zone, uint64_t hash,
    ngx_uint_t pending, ngx_atomic_t **slot, ngx_atomic_uint_t *epoch,
    ngx_atomic_uint_t *mark)
{
    ngx_atomic_t       *s;
    ngx_atomic_uint_t   v, nv, e;

    s = &zone->sh->claims[(hash ^ (hash >> 32))
                          & (NGX_HTTP_SINGLEFLIGHT_CLAIMS - 1)];

    e = (ngx_atomic_uint_t) zone->sh->claim_epoch
        << NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT;

    do {
        v = *s;

        if ((v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW) != e
            || (v & NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) == 0)
        {
            nv = e + 1
                 + (pending ? NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING
                              + ngx_http_singleflight_claim_mark(hash)
                            : 0);

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
    *mark = ngx_http_singleflight_claim_mark(hash);

    return (nv & NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) == 1;
}


/* the request is over: its count goes, unless its epoch is past */

static ngx_inline void
ngx_http_singleflight_unclaim(ngx_atomic_t *slot, ngx_atomic_uint_t epoch)
{
    ngx_atomic_uint_t  v;

    do {
        v = *slot;

        if ((v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW) != epoch
            || (v & NGX_HTTP_SINGLEFLIGHT_CLAIM_COUNT) == 0)
        {
            return;
        }

    } while (!ngx_atomic_cmp_set(slot, v, v - 1));
}


/*
 * The first request's header, or its end: PENDING and WANTED go.  1 if a
 * flight waits for it (WANTED was set).
 */

static ngx_inline ngx_uint_t
ngx_http_singleflight_claim_pass(ngx_atomic_t *slot, ngx_atomic_uint_t epoch)
{
    ngx_atomic_uint_t  v;

    do {
        v = *slot;

        if ((v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW) != epoch
            || !(v & NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING))
        {
            return 0;
        }

    } while (!ngx_atomic_cmp_set(slot, v,
                                 v & ~(NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING
                                       |NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED)));

    return (v & NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED) ? 1 : 0;
}


/*
 * may a flight of the slot, of a key with "mark", wait for the first
 * request's header?
 */

static ngx_inline ngx_uint_t
ngx_http_singleflight_claim_open(ngx_atomic_uint_t v, ngx_atomic_uint_t epoch,
    ngx_atomic_uint_t mark)
{
    return (v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW) == epoch
           && (v & NGX_HTTP_SINGLEFLIGHT_CLAIM_MARK) == mark
           && (v & (NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING
                    |NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED))
              == NGX_HTTP_SINGLEFLIGHT_CLAIM_PENDING;
}


/* a flight waits for the first request's header: under the lock */

static ngx_inline ngx_uint_t
ngx_http_singleflight_claim_want_locked(ngx_atomic_t *slot,
    ngx_atomic_uint_t epoch, ngx_atomic_uint_t mark)
{
    ngx_atomic_uint_t  v;

    do {
        v = *slot;

        if (!ngx_http_singleflight_claim_open(v, epoch, mark)) {
            return 0;
        }

    } while (!ngx_atomic_cmp_set(slot, v,
                                 v | NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED));

    return 1;
}


/*
 * the flight that waited for the first request's header is gone: another
 * may wait for it (claim_open())
 */

static ngx_inline void
ngx_http_singleflight_claim_unwant(ngx_atomic_t *slot, ngx_atomic_uint_t epoch)
{
    ngx_atomic_uint_t  v;

    do {
        v = *slot;

        if ((v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_LOW) != epoch
            || !(v & NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED))
        {
            return;
        }

    } while (!ngx_atomic_cmp_set(slot, v,
                                 v & ~NGX_HTTP_SINGLEFLIGHT_CLAIM_WANTED));
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_ZONE_H_INCLUDED_ */
