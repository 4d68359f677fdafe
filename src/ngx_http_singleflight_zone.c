
/*
 * The shared-memory zone of in-flight keys.
 *
 * Layout (of one instance; _scope.c says how many a zone has): a slab
 * pool whose data is an ngx_http_singleflight_shctx_t: an
 * rbtree of flights keyed by the hash of their key (full key compared on
 * collisions), the registry of worker slots used to address wake-ups, and
 * the counters.  A flight node is unlinked from the tree as soon as its
 * flight is over, so later requests start a new flight, and is freed when
 * the last request that references it lets go (refs == 0).
 */


#include "ngx_http_singleflight_zone.h"


static void ngx_http_singleflight_free_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_rbtree_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_int_t ngx_http_singleflight_group_rbtree_cmp(
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *temp);



ngx_int_t
ngx_http_singleflight_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_singleflight_zone_t  *ozone = data;

    ngx_http_singleflight_zone_t  *zone;

    zone = shm_zone->data;

    if (ozone) {
        /* a reload with the same size: adopt the live zone and its flights */
        zone->sh = ozone->sh;
        zone->shpool = ozone->shpool;
        zone->counters = &zone->sh->counters;
        return NGX_OK;
    }

    zone->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        zone->sh = zone->shpool->data;
        zone->counters = &zone->sh->counters;
        return NGX_OK;
    }

    return ngx_http_singleflight_init_shctx(zone);
}


/* a fresh instance: its tree, queues and counters in its slab pool */

ngx_int_t
ngx_http_singleflight_init_shctx(ngx_http_singleflight_zone_t *zone)
{
    size_t  len;

    /* _locked: a scope=worker instance has no mutex; nobody else runs yet */

    zone->sh = ngx_slab_calloc_locked(zone->shpool,
                                      sizeof(ngx_http_singleflight_shctx_t));
    if (zone->sh == NULL) {
        return NGX_ERROR;
    }

    zone->shpool->data = zone->sh;
    zone->counters = &zone->sh->counters;

    ngx_rbtree_init(&zone->sh->rbtree, &zone->sh->sentinel,
                    ngx_http_singleflight_rbtree_insert_value);
    ngx_queue_init(&zone->sh->nodes);
    ngx_queue_init(&zone->sh->marks);

    len = sizeof(" in singleflight zone \"\"") + zone->name.len;

    zone->shpool->log_ctx = ngx_slab_alloc_locked(zone->shpool, len);
    if (zone->shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(zone->shpool->log_ctx, " in singleflight zone \"%V\"%Z",
                &zone->name);

    /* we report exhaustion ourselves, rate-limited */
    zone->shpool->log_nomem = 0;

    zone->sh->baseline = ngx_http_singleflight_pages_used(zone->shpool);

    return NGX_OK;
}


static void
ngx_http_singleflight_rbtree_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_int_t                      rc;
    ngx_rbtree_node_t            **p;
    ngx_http_singleflight_node_t  *fn, *fnt;

    fn = (ngx_http_singleflight_node_t *) node;

    for ( ;; ) {

        if (node->key < temp->key) {
            p = &temp->left;

        } else if (node->key > temp->key) {
            p = &temp->right;

        } else { /* node->key == temp->key */

            fnt = (ngx_http_singleflight_node_t *) temp;

            rc = ngx_memn2cmp(fn->key, fnt->key, fn->key_len, fnt->key_len);

            p = (rc < 0) ? &temp->left : &temp->right;
        }

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


ngx_http_singleflight_node_t *
ngx_http_singleflight_lookup_locked(ngx_http_singleflight_zone_t *zone,
    uint32_t hash, ngx_str_t *key)
{
    ngx_int_t                      rc;
    ngx_rbtree_node_t             *node, *sentinel;
    ngx_http_singleflight_node_t  *fn;

    node = zone->sh->rbtree.root;
    sentinel = zone->sh->rbtree.sentinel;

    while (node != sentinel) {

        if (hash < node->key) {
            node = node->left;
            continue;
        }

        if (hash > node->key) {
            node = node->right;
            continue;
        }

        /* hash == node->key */

        fn = (ngx_http_singleflight_node_t *) node;

        rc = ngx_memn2cmp(key->data, fn->key, key->len, fn->key_len);

        if (rc == 0) {
            return fn;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


ngx_http_singleflight_node_t *
ngx_http_singleflight_create_locked(ngx_http_singleflight_zone_t *zone,
    uint32_t hash, ngx_str_t *key, ngx_uint_t *nomem)
{
    size_t                         size;
    ngx_http_singleflight_node_t  *fn;

    size = offsetof(ngx_http_singleflight_node_t, key) + key->len;

    fn = ngx_http_singleflight_alloc_locked(zone, size, nomem);
    if (fn == NULL) {
        return NULL;
    }

    ngx_memzero(fn, offsetof(ngx_http_singleflight_node_t, key));

    fn->node.key = hash;
    fn->id = ++zone->sh->next_id;
    fn->leader_pid = ngx_pid;
    fn->generation = 1;
    fn->refs = 1;
    fn->state = NGX_HTTP_SINGLEFLIGHT_RUNNING;
    fn->linked = 1;
    fn->start = ngx_current_msec;
    fn->key_len = key->len;
    ngx_memcpy(fn->key, key->data, key->len);

    ngx_rbtree_insert(&zone->sh->rbtree, &fn->node);
    ngx_queue_insert_tail(&zone->sh->nodes, &fn->queue);
    zone->sh->in_flight++;

    return fn;
}


/* a follower joins: it holds the flight and waits on it */

void
ngx_http_singleflight_join_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    fn->refs++;
    fn->waiters++;
    zone->sh->waiters++;

    if (zone->slot != -1) {
        fn->slot_refs[zone->slot]++;
        fn->slot_waiters[zone->slot]++;
        fn->wait_mask |= (uint64_t) 1 << zone->slot;
    }
}


/* a follower waits again, after a wake-up that did not end its flight */

void
ngx_http_singleflight_rewait_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (zone->slot != -1) {
        fn->wait_mask |= (uint64_t) 1 << zone->slot;
    }
}


/* a follower stops waiting; it may still hold the flight */

void
ngx_http_singleflight_unwait_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    fn->waiters--;
    zone->sh->waiters--;

    if (zone->slot != -1 && fn->slot_waiters[zone->slot] > 0) {
        fn->slot_waiters[zone->slot]--;
    }
}


/*
 * This process's request takes the lead of a flight whose leader failed.
 * A waiting follower's reference becomes the leader's; a newly arrived
 * request takes a new one.
 */

void
ngx_http_singleflight_lead_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t follower)
{
    fn->state = NGX_HTTP_SINGLEFLIGHT_RUNNING;
    fn->leader_pid = ngx_pid;
    fn->generation++;
    fn->promotions++;

    if (!follower) {
        fn->refs++;
        return;
    }

    ngx_http_singleflight_unwait_locked(zone, fn);

    if (zone->slot != -1 && fn->slot_refs[zone->slot] > 0) {
        fn->slot_refs[zone->slot]--;
    }
}


void
ngx_http_singleflight_unlink_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (fn->linked) {
        ngx_rbtree_delete(&zone->sh->rbtree, &fn->node);
        fn->linked = 0;
        zone->sh->in_flight--;
    }
}


void
ngx_http_singleflight_drop_body_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    ngx_http_singleflight_chunk_t  *cl, *next;

    for (cl = fn->first; cl; cl = next) {
        next = cl->next;
        ngx_slab_free_locked(zone->shpool, cl);
    }

    fn->first = NULL;
    fn->last = NULL;
    fn->body_len = 0;

    if (fn->header) {
        ngx_slab_free_locked(zone->shpool, fn->header);
        fn->header = NULL;
        fn->header_len = 0;
    }
}


/* drops a reference: the leader's, or a follower's of this process */

void
ngx_http_singleflight_release_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t leader)
{
    if (!leader && zone->slot != -1 && fn->slot_refs[zone->slot] > 0) {
        fn->slot_refs[zone->slot]--;
    }

    if (fn->refs > 0) {
        fn->refs--;
    }

    if (fn->refs == 0) {
        ngx_http_singleflight_free_locked(zone, fn);
    }
}


static void
ngx_http_singleflight_free_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (fn->expire) {
        ngx_queue_remove(&fn->mark);
        fn->expire = 0;
    }

    ngx_http_singleflight_unlink_locked(zone, fn);
    ngx_http_singleflight_drop_body_locked(zone, fn);
    ngx_queue_remove(&fn->queue);
    ngx_slab_free_locked(zone->shpool, fn);
}


/*
 * A private response: its key stays in the tree, marked, for "ttl", so
 * that requests for it in the meantime go upstream at once instead of
 * queueing behind a flight whose response they could not have.  The mark
 * keeps the leader's reference until it expires.
 */

void
ngx_http_singleflight_mark_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_msec_t ttl)
{
    fn->state = NGX_HTTP_SINGLEFLIGHT_PRIVATE;

    if (ttl == 0 || !fn->linked) {
        ngx_http_singleflight_unlink_locked(zone, fn);
        ngx_http_singleflight_release_locked(zone, fn, 1);
        return;
    }

    fn->expire = ngx_current_msec + ttl;
    if (fn->expire == 0) {
        fn->expire = 1;
    }

    ngx_queue_insert_tail(&zone->sh->marks, &fn->mark);
}


/* true if a marked node is still marked; drops its mark when it expired */

ngx_uint_t
ngx_http_singleflight_marked_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if ((ngx_msec_int_t) (fn->expire - ngx_current_msec) > 0) {
        return 1;
    }

    ngx_queue_remove(&fn->mark);
    fn->expire = 0;
    ngx_http_singleflight_unlink_locked(zone, fn);
    ngx_http_singleflight_release_locked(zone, fn, 1);

    return 0;
}


/* drops up to "n" expired marks, oldest first */

void
ngx_http_singleflight_expire_locked(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t n)
{
    ngx_queue_t                   *q;
    ngx_http_singleflight_node_t  *fn;

    while (n-- && !ngx_queue_empty(&zone->sh->marks)) {
        q = ngx_queue_head(&zone->sh->marks);
        fn = ngx_queue_data(q, ngx_http_singleflight_node_t, mark);

        if (ngx_http_singleflight_marked_locked(zone, fn)) {
            return;
        }
    }
}


/* the pids of other workers with followers of this flight; clears the mask */

ngx_uint_t
ngx_http_singleflight_take_mask_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_pid_t *pids)
{
    uint64_t    mask;
    ngx_uint_t  i, n;

    mask = fn->wait_mask;
    fn->wait_mask = 0;

    if (zone->slot != -1) {
        mask &= ~((uint64_t) 1 << zone->slot);
    }

    n = 0;

    for (i = 0; mask != 0; i++, mask >>= 1) {
        if ((mask & 1) && zone->sh->slots[i] != 0) {
            pids[n++] = zone->sh->slots[i];
        }
    }

    return n;
}


/*
 * A worker died (it crashed or was killed): give back everything it held.
 * Its followers' references and waits are dropped; flights it led are
 * failed for their followers elsewhere, who find out on their next poll,
 * and unlinked so the next request for the key starts afresh; its slot is
 * freed.  Returns the number of flights it led.
 */

ngx_uint_t
ngx_http_singleflight_reclaim_locked(ngx_http_singleflight_zone_t *zone,
    ngx_pid_t pid)
{
    ngx_int_t                      slot;
    ngx_uint_t                     i, n, led;
    ngx_queue_t                   *q, *next;
    ngx_http_singleflight_node_t  *fn;

    slot = -1;

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_SLOTS; i++) {
        if (zone->sh->slots[i] == pid) {
            zone->sh->slots[i] = 0;
            slot = i;
            break;
        }
    }

    led = 0;

    for (q = ngx_queue_head(&zone->sh->nodes);
         q != ngx_queue_sentinel(&zone->sh->nodes);
         q = next)
    {
        next = ngx_queue_next(q);
        fn = ngx_queue_data(q, ngx_http_singleflight_node_t, queue);

        if (slot != -1) {
            n = ngx_min(fn->waiters, (ngx_uint_t) fn->slot_waiters[slot]);
            fn->waiters -= n;
            zone->sh->waiters -= n;
            fn->refs -= ngx_min(fn->refs, (ngx_uint_t) fn->slot_refs[slot]);
            fn->slot_refs[slot] = 0;
            fn->slot_waiters[slot] = 0;
            fn->wait_mask &= ~((uint64_t) 1 << slot);
        }

        if (fn->state == NGX_HTTP_SINGLEFLIGHT_RUNNING
            && fn->leader_pid == pid)
        {
            led++;

            fn->state = NGX_HTTP_SINGLEFLIGHT_FAILED;
            fn->fail_status = 0;   /* each follower's singleflight_error_status */
            ngx_http_singleflight_unlink_locked(zone, fn);

            if (fn->refs > 0) {
                fn->refs--;    /* the dead leader's reference */
            }
        }

        if (fn->refs == 0) {
            ngx_http_singleflight_free_locked(zone, fn);
        }
    }

    return led;
}


void *
ngx_http_singleflight_alloc_locked(ngx_http_singleflight_zone_t *zone,
    size_t size, ngx_uint_t *nomem)
{
    void  *p;

    *nomem = 0;

    p = ngx_slab_alloc_locked(zone->shpool, size);

    if (p == NULL) {
        (void) ngx_atomic_fetch_add(&zone->counters->no_memory, 1);

        /* at most one warning a minute per zone, logged after unlocking */

        if (ngx_time() - zone->sh->nomem_logged >= 60) {
            zone->sh->nomem_logged = ngx_time();
            *nomem = 1;
        }
    }

    return p;
}


/*
 * One line per dead worker, whichever worker notices first: a follower's
 * poll, or the worker that replaces it.
 */

void
ngx_http_singleflight_log_dead(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log, ngx_pid_t pid, ngx_uint_t led)
{
    if (led) {
        (void) ngx_atomic_fetch_add(&zone->counters->dead_leaders, led);

        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "singleflight leader process %P is gone, "
                      "%ui flight(s) it led in zone \"%V\" failed",
                      pid, led, &zone->name);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, log, 0,
                  "singleflight worker process %P is gone, "
                  "its share of zone \"%V\" was given back", pid, &zone->name);
}


void
ngx_http_singleflight_log_nomem(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log, ngx_uint_t nomem)
{
    if (nomem) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "singleflight zone \"%V\" is full, "
                      "requests are not collapsed", &zone->name);
    }
}


ngx_uint_t
ngx_http_singleflight_pages_total(ngx_slab_pool_t *shpool)
{
    return (ngx_uint_t) (shpool->last - shpool->pages);
}


ngx_uint_t
ngx_http_singleflight_pages_used(ngx_slab_pool_t *shpool)
{
    return ngx_http_singleflight_pages_total(shpool) - shpool->pfree;
}


/* the per-worker tree of waiting groups, keyed by flight id */

static ngx_int_t
ngx_http_singleflight_group_rbtree_cmp(ngx_rbtree_node_t *node,
    ngx_rbtree_node_t *temp)
{
    ngx_http_singleflight_group_t  *g, *gt;

    g = (ngx_http_singleflight_group_t *) node;
    gt = (ngx_http_singleflight_group_t *) temp;

    return (g->id < gt->id) ? -1 : 1;
}


void
ngx_http_singleflight_group_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t  **p;

    for ( ;; ) {

        if (node->key != temp->key) {
            p = (node->key < temp->key) ? &temp->left : &temp->right;

        } else {
            p = (ngx_http_singleflight_group_rbtree_cmp(node, temp) < 0)
                ? &temp->left : &temp->right;
        }

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}
