/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The wait side.
 *
 * A request that waits for its flight to change (its header, more of its
 * body, an outcome) parks: the flight transition "park" sets its worker's
 * hold on the flight as parked, under the lock that every change is
 * published under, unless the flight already changed since the request
 * last looked (its seq).  Then the request joins its worker's group for
 * the flight and returns to the event loop.
 *
 * A change in this worker wakes the group directly.  A change in another
 * worker writes to this worker's wake-up pipe (_registry.c); the handler
 * looks at every group of the worker and wakes those whose flight's seq
 * moved since they were last woken: one look per wake-up, however many
 * flights changed.  The groups are this worker's own memory and the seq
 * is read without the lock, so the look is cheap.
 *
 * A woken group is not served there and then: it goes to the worker's
 * ready queue, ordered by the instance's clock at its flight's change,
 * and a posted event serves at most NGX_HTTP_SINGLEFLIGHT_WAKE_BATCH
 * waiters, first sending the wake-ups this worker owes the others, then
 * leaves the rest for after the event loop's next look at its events.
 * So a burst of flights completing at once is served in the order they
 * completed by every worker alike, and a wake-up from another worker is
 * not held behind a whole round of this worker's own followers.
 *
 * Twice a second each worker beats its heart in the registry and looks
 * at its groups again, a safety net for a wake-up that could not be sent.
 * It also checks the flights its groups wait on for a fetching worker
 * that is gone: a worker whose slot was taken over, or whose heart has
 * not beaten for a second, is looked up (kill(), /proc) outside any
 * lock, and if it is dead what it held is given back (_flight.c).  A
 * crashed worker is usually handled sooner: its replacement, in the same
 * process slot, finds its pid there when it starts.
 */


#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_zone.h"


/* the dead are looked for among silent workers every so many beats */
#define NGX_HTTP_SINGLEFLIGHT_SWEEP  10

/* waiters woken in one round of events at most */
#define NGX_HTTP_SINGLEFLIGHT_WAKE_BATCH  8


struct ngx_http_singleflight_group_s {
    ngx_rbtree_node_t                node;        /* key: flight id */
    ngx_queue_t                      all;         /* the worker's groups */
    uint64_t                         id;
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;
    ngx_queue_t                      waiters;
    ngx_atomic_uint_t                seq;         /* when last woken */
    unsigned                         ready:1;     /* in the ready queue */
};


static ngx_http_singleflight_group_t *ngx_http_singleflight_group_alloc(void);
static void ngx_http_singleflight_group_free(
    ngx_http_singleflight_group_t *group);
static ngx_http_singleflight_group_t *ngx_http_singleflight_group_lookup(
    ngx_http_singleflight_zone_t *zone, uint64_t id);
static void ngx_http_singleflight_group_wake(
    ngx_http_singleflight_group_t *group);
static void ngx_http_singleflight_ready_handler(ngx_event_t *ev);
static void ngx_http_singleflight_scan(ngx_cycle_t *cycle);
static void ngx_http_singleflight_beat_handler(ngx_event_t *ev);
static void ngx_http_singleflight_reclaim(ngx_cycle_t *cycle,
    ngx_uint_t slot, ngx_pid_t pid);
static void ngx_http_singleflight_strays(ngx_cycle_t *cycle);
static ngx_array_t *ngx_http_singleflight_instances(ngx_cycle_t *cycle);


static ngx_queue_t        ngx_http_singleflight_groups;

/*
 * Groups kept for reuse, at most NGX_HTTP_SINGLEFLIGHT_SPARE_GROUPS: a
 * group comes and goes with every flight its worker's requests wait on
 * (a lone request's direct response, read unparked, has none), and a
 * malloc() and free() each time keep the heap's top moving (brk() up and
 * down under load, with its page faults).  Chained through their "fn".
 */
#define NGX_HTTP_SINGLEFLIGHT_SPARE_GROUPS  256

static ngx_http_singleflight_group_t  *ngx_http_singleflight_spare;
static ngx_uint_t                      ngx_http_singleflight_nspare;
static ngx_rbtree_t       ngx_http_singleflight_ready;
static ngx_rbtree_node_t  ngx_http_singleflight_ready_sentinel;
static ngx_event_t        ngx_http_singleflight_ready_ev;

/* what a debug build's timer log takes the ready event's data for */
static ngx_connection_t   ngx_http_singleflight_ready_dumb;
static ngx_event_t     ngx_http_singleflight_beat;
static ngx_uint_t      ngx_http_singleflight_beats;


/*
 * Parks "w" on the flight, which it last saw at "seen".  NGX_AGAIN: the
 * flight changed meanwhile, look again; NGX_ERROR: no hold on the flight.
 */

ngx_int_t
ngx_http_singleflight_wait_park(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_atomic_uint_t seen,
    ngx_http_singleflight_waiter_t *w)
{
    ngx_int_t  rc;

    rc = ngx_http_singleflight_flight_park(zone, fn, seen);

    if (rc != NGX_OK) {
        return rc;
    }

    return ngx_http_singleflight_wait_add(zone, fn, seen, w);
}


/*
 * A fetch listening for its flight being abandoned ("generation" to stop):
 * "w" wakes it, and its event is posted at once if the abandonment came
 * before.  The seq is read without the lock: an abandonment published
 * just before is in it already, and no look at the groups would wake "w"
 * for it, so the flag (published before the seq) is looked at too; the
 * event looks again under the lock.
 */

void
ngx_http_singleflight_wait_listen(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_http_singleflight_waiter_t *w, ngx_event_t *ev)
{
    if (w->group != NULL
        || ngx_http_singleflight_wait_add(zone, fn,
                                     ngx_http_singleflight_flight_seq(fn), w)
           != NGX_OK)
    {
        /* without it, the fetch learns at its next body buffer */
        return;
    }

    if (ngx_http_singleflight_flight_abandoning(fn, generation)
        && !ev->posted)
    {
        ngx_post_event(ev, &ngx_posted_events);
    }
}


/* the local half of parking, for a hold parked already (by a join) */

ngx_int_t
ngx_http_singleflight_wait_add(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_atomic_uint_t seen,
    ngx_http_singleflight_waiter_t *w)
{
    ngx_http_singleflight_group_t  *group;

    group = ngx_http_singleflight_group_lookup(zone, fn->id);

    if (group == NULL) {
        group = ngx_http_singleflight_group_alloc();
        if (group == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(group, sizeof(ngx_http_singleflight_group_t));

        group->node.key = (ngx_rbtree_key_t) fn->id;
        group->id = fn->id;
        group->zone = zone;
        group->fn = fn;
        group->seq = seen;
        ngx_queue_init(&group->waiters);

        ngx_rbtree_insert(&zone->groups, &group->node);
        ngx_queue_insert_tail(&ngx_http_singleflight_groups, &group->all);
    }

    ngx_queue_insert_tail(&group->waiters, &w->queue);
    w->group = group;

    return NGX_OK;
}


void
ngx_http_singleflight_wait_unpark(ngx_http_singleflight_waiter_t *w)
{
    ngx_http_singleflight_group_t  *group;

    group = w->group;

    if (group == NULL) {
        return;
    }

    ngx_queue_remove(&w->queue);
    w->group = NULL;

    if (!ngx_queue_empty(&group->waiters)) {
        return;
    }

    if (group->ready) {
        ngx_rbtree_delete(&ngx_http_singleflight_ready, &group->node);

    } else {
        ngx_rbtree_delete(&group->zone->groups, &group->node);
        ngx_queue_remove(&group->all);
    }

    ngx_http_singleflight_group_free(group);
}


/*
 * After a change that w's own owner made (a fetch's): the others parked
 * here on the flight are woken, w is not.  Alone in its group, w stays
 * parked, having seen the flight at "seq": a look at the groups wakes it
 * only for a change after that one (the group's seq is all of its
 * waiters', so only when alone).  Else, with others to wake, w is
 * unparked and its owner parks it again.  "first": as in wait_wake_first(),
 * woken at any rate.  NGX_OK: w is still parked.
 */

ngx_int_t
ngx_http_singleflight_wait_own(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t how,
    ngx_http_singleflight_waiter_t *w, ngx_atomic_uint_t seq,
    ngx_http_singleflight_waiter_t *first)
{
    ngx_http_singleflight_group_t  *group;

    group = w->group;

    if (group != NULL && !group->ready
        && ngx_queue_head(&group->waiters) == ngx_queue_last(&group->waiters))
    {
        group->seq = seq;

    } else if (how & NGX_HTTP_SINGLEFLIGHT_WAKE_LOCAL) {
        ngx_http_singleflight_wait_unpark(w);
        ngx_http_singleflight_wait_wake_first(zone, fn, how, first);
        return NGX_DECLINED;
    }

    /* no group woken: the host, if it waits, at once */

    if (first != NULL) {
        first->handler(first);
    }

    return (w->group != NULL) ? NGX_OK : NGX_DECLINED;
}


/* after a transition: this worker's parked requests on the flight */

void
ngx_http_singleflight_wait_wake(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t how)
{
    ngx_http_singleflight_wait_wake_first(zone, fn, how, NULL);
}


/*
 * wait_wake(), and "first" (if not NULL: a request that waits without
 * being parked, a fetch's host before its header) is woken too, at the
 * head of the flight's group when the group is woken: in the group's
 * turn of the ready queue, as a parked request would be.  Woken at once,
 * a burst's hosts would all come before any of their followers.
 */

void
ngx_http_singleflight_wait_wake_first(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t how,
    ngx_http_singleflight_waiter_t *first)
{
    ngx_http_singleflight_group_t  *group;

    group = NULL;

    if (how & NGX_HTTP_SINGLEFLIGHT_WAKE_LOCAL) {
        group = ngx_http_singleflight_group_lookup(zone, fn->id);
    }

    if (group == NULL) {
        if (first != NULL) {
            first->handler(first);
        }

        return;
    }

    if (first != NULL) {
        ngx_queue_insert_head(&group->waiters, &first->queue);
        first->group = group;
    }

    ngx_http_singleflight_group_wake(group);
}


static ngx_http_singleflight_group_t *
ngx_http_singleflight_group_alloc(void)
{
    ngx_http_singleflight_group_t  *group;

    group = ngx_http_singleflight_spare;

    if (group != NULL) {
        ngx_http_singleflight_spare = (ngx_http_singleflight_group_t *)
                                                                    group->fn;
        ngx_http_singleflight_nspare--;
        return group;
    }

    return ngx_alloc(sizeof(ngx_http_singleflight_group_t), ngx_cycle->log);
}


static void
ngx_http_singleflight_group_free(ngx_http_singleflight_group_t *group)
{
    if (ngx_http_singleflight_nspare >= NGX_HTTP_SINGLEFLIGHT_SPARE_GROUPS) {
        ngx_free(group);
        return;
    }

    group->fn = (ngx_http_singleflight_node_t *) ngx_http_singleflight_spare;
    ngx_http_singleflight_spare = group;
    ngx_http_singleflight_nspare++;
}


static ngx_http_singleflight_group_t *
ngx_http_singleflight_group_lookup(ngx_http_singleflight_zone_t *zone,
    uint64_t id)
{
    ngx_rbtree_key_t                key;
    ngx_rbtree_node_t              *node, *sentinel;
    ngx_http_singleflight_group_t  *group;

    key = (ngx_rbtree_key_t) id;
    node = zone->groups.root;
    sentinel = zone->groups.sentinel;

    while (node != sentinel) {

        if (key != node->key) {
            node = (key < node->key) ? node->left : node->right;
            continue;
        }

        group = (ngx_http_singleflight_group_t *) node;

        if (group->id == id) {
            return group;
        }

        /* ngx_rbtree_insert_value() puts equal keys to the right */
        node = node->right;
    }

    return NULL;
}


/*
 * Every waiter of the group is to look at the flight for itself: the
 * group goes to the ready queue, keyed by when its flight changed.
 */

static void
ngx_http_singleflight_group_wake(ngx_http_singleflight_group_t *group)
{
    ngx_rbtree_delete(&group->zone->groups, &group->node);
    ngx_queue_remove(&group->all);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "singleflight wakes the requests of flight %uL",
                   group->id);

    group->ready = 1;
    group->node.key = (ngx_rbtree_key_t) group->fn->stamp;

    ngx_rbtree_insert(&ngx_http_singleflight_ready, &group->node);

    if (!ngx_http_singleflight_ready_ev.posted) {
        ngx_post_event(&ngx_http_singleflight_ready_ev, &ngx_posted_events);
    }
}


/*
 * The ready queue, earliest change first, a batch at a time; the rest
 * after the event loop has looked at its events again.
 */

static void
ngx_http_singleflight_ready_handler(ngx_event_t *ev)
{
    ngx_uint_t                       n;
    ngx_queue_t                     *q;
    ngx_rbtree_t                    *ready;
    ngx_rbtree_node_t               *node;
    ngx_http_singleflight_group_t   *group;
    ngx_http_singleflight_waiter_t  *w;

    ready = &ngx_http_singleflight_ready;

    /* the other workers' followers must not wait for ours */
    ngx_http_singleflight_registry_flush_now();

    for (n = 0; n < NGX_HTTP_SINGLEFLIGHT_WAKE_BATCH; n++) {

        if (ready->root == ready->sentinel) {
            return;
        }

        node = ngx_rbtree_min(ready->root, ready->sentinel);
        group = (ngx_http_singleflight_group_t *) node;

        q = ngx_queue_head(&group->waiters);
        ngx_queue_remove(q);

        if (ngx_queue_empty(&group->waiters)) {
            ngx_rbtree_delete(ready, node);
            ngx_http_singleflight_group_free(group);
        }

        /* the handler may park it again, or wake and unpark others */

        w = ngx_queue_data(q, ngx_http_singleflight_waiter_t, queue);
        w->group = NULL;
        w->handler(w);
    }

    if (ready->root != ready->sentinel) {

        /* woken again by a handler above: still not before the next look */

        if (ev->posted) {
            ngx_delete_posted_event(ev);
        }

        if (ngx_exiting) {
            /*
             * a worker shutting down exits once no timer is left, posted
             * events or not: a timer keeps it for the requests still to
             * be woken
             */

            if (!ev->timer_set) {
                ngx_add_timer(ev, 1);
            }

            return;
        }

        ngx_post_event(ev, &ngx_posted_next_events);
    }
}


/* a wake-up came: the groups whose flight moved */

static void
ngx_http_singleflight_scan(ngx_cycle_t *cycle)
{
    ngx_queue_t                    *q, *next;
    ngx_http_singleflight_group_t  *group;

    for (q = ngx_queue_head(&ngx_http_singleflight_groups);
         q != ngx_queue_sentinel(&ngx_http_singleflight_groups);
         q = next)
    {
        next = ngx_queue_next(q);
        group = ngx_queue_data(q, ngx_http_singleflight_group_t, all);

        if (ngx_http_singleflight_flight_seq(group->fn) != group->seq) {
            ngx_http_singleflight_group_wake(group);
        }
    }
}


/* ------------------------------------------------------------ heartbeat */

static void
ngx_http_singleflight_beat_handler(ngx_event_t *ev)
{
    ngx_pid_t                       pid;
    ngx_msec_t                      age;
    ngx_uint_t                      n, i, slot, deferred;
    ngx_queue_t                    *q;
    ngx_cycle_t                    *cycle;
    ngx_http_singleflight_node_t   *fn;
    ngx_http_singleflight_group_t  *group;
    struct {
        ngx_uint_t                  slot;
        ngx_pid_t                   pid;
    }                               suspects[16];

    cycle = (ngx_cycle_t *) ngx_cycle;

    ngx_http_singleflight_registry_beat(ev->log);

    /* fetching workers our requests wait on, that may be gone */

    n = 0;
    deferred = 0;

    for (q = ngx_queue_head(&ngx_http_singleflight_groups);
         q != ngx_queue_sentinel(&ngx_http_singleflight_groups)
         && n < 16;
         q = ngx_queue_next(q))
    {
        group = ngx_queue_data(q, ngx_http_singleflight_group_t, all);
        fn = group->fn;

        if (group->zone->local) {
            continue;
        }

        if (fn->deferred) {
            /* waiting for a first request's header, in a worker unknown */
            deferred = 1;
            continue;
        }

        if (!fn->hosted || fn->host_pid == ngx_pid) {
            continue;
        }

        /* read without the lock: only a hint, checked below */

        slot = fn->host_slot;
        pid = fn->host_pid;

        if (!ngx_http_singleflight_registry_suspect(slot, pid)) {
            continue;
        }

        for (i = 0; i < n; i++) {
            if (suspects[i].pid == pid) {
                break;
            }
        }

        if (i == n) {
            suspects[n].slot = slot;
            suspects[n].pid = pid;
            n++;
        }
    }

    for (i = 0; i < n; i++) {
        if (ngx_http_singleflight_registry_dead(suspects[i].slot,
                                                suspects[i].pid))
        {
            ngx_http_singleflight_reclaim(cycle, suspects[i].slot,
                                          suspects[i].pid);
        }
    }

    /*
     * now and then, whoever else fell silent; at every beat while a flight
     * waited on here waits for a first request's header (that request's
     * worker may have died), as soon as a fetching worker is suspect
     */

    if (++ngx_http_singleflight_beats % NGX_HTTP_SINGLEFLIGHT_SWEEP == 0
        || deferred)
    {
        age = deferred ? NGX_HTTP_SINGLEFLIGHT_STALE
                       : NGX_HTTP_SINGLEFLIGHT_SWEEP
                         * NGX_HTTP_SINGLEFLIGHT_BEAT;

        for (slot = 0; slot < NGX_MAX_PROCESSES; slot++) {
            pid = ngx_http_singleflight_registry_silent(slot, age);

            if (pid && ngx_http_singleflight_registry_dead(slot, pid)) {
                ngx_http_singleflight_reclaim(cycle, slot, pid);
            }
        }

        ngx_http_singleflight_strays(cycle);
    }

    ngx_http_singleflight_scan(cycle);

    /*
     * always, a worker shutting down too: its requests may park after a
     * beat found none (a request that was held by limit_req, a reader
     * between two sends), and they would lose their safety net and their
     * look for a dead fetching worker; the timer is cancelable, it does
     * not keep the worker from exiting
     */

    ngx_add_timer(ev, NGX_HTTP_SINGLEFLIGHT_BEAT);
}


/* a dead worker's share of every shared instance goes back */

static void
ngx_http_singleflight_reclaim(ngx_cycle_t *cycle, ngx_uint_t slot,
    ngx_pid_t pid)
{
    ngx_uint_t                      i;
    ngx_array_t                    *instances;
    ngx_http_singleflight_zone_t  **zp;

    instances = ngx_http_singleflight_instances(cycle);

    if (instances != NULL) {
        zp = instances->elts;

        for (i = 0; i < instances->nelts; i++) {
            ngx_http_singleflight_flight_reclaim(zp[i], slot, pid,
                                                 cycle->log);
        }
    }

    ngx_http_singleflight_registry_clear(slot, pid);

    /* what the reclaim changed for our own requests */

    ngx_http_singleflight_scan(cycle);
}


/*
 * the records of processes gone that the registry no longer names, so
 * that the look above cannot find them
 */

static void
ngx_http_singleflight_strays(ngx_cycle_t *cycle)
{
    ngx_pid_t                       pids[16];
    ngx_uint_t                      i, j, n, slots[16];
    ngx_array_t                    *instances;
    ngx_http_singleflight_zone_t  **zp;

    instances = ngx_http_singleflight_instances(cycle);

    if (instances == NULL) {
        return;
    }

    zp = instances->elts;

    for (i = 0; i < instances->nelts; i++) {
        if (zp[i]->local) {
            continue;
        }

        n = ngx_http_singleflight_flight_strays(zp[i], slots, pids, 16);

        for (j = 0; j < n; j++) {
            if (ngx_http_singleflight_registry_dead(slots[j], pids[j])) {
                ngx_http_singleflight_reclaim(cycle, slots[j], pids[j]);
            }
        }
    }
}


/* every shared instance of every zone, for this worker */

static ngx_array_t *
ngx_http_singleflight_instances(ngx_cycle_t *cycle)
{
    ngx_uint_t                           i, j;
    ngx_array_t                         *a;
    ngx_http_singleflight_zone_t       **zp, **p;
    ngx_http_singleflight_zone_conf_t  **zcp;
    ngx_http_singleflight_main_conf_t   *smcf;

    static ngx_array_t                  *instances;

    if (instances != NULL) {
        return instances;
    }

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL) {
        return NULL;
    }

    a = ngx_array_create(cycle->pool, 4,
                         sizeof(ngx_http_singleflight_zone_t *));
    if (a == NULL) {
        return NULL;
    }

    zcp = smcf->zones.elts;

    for (i = 0; i < smcf->zones.nelts; i++) {
        zp = zcp[i]->instances.elts;

        for (j = 0; j < zcp[i]->instances.nelts; j++) {
            p = ngx_array_push(a);
            if (p == NULL) {
                return NULL;
            }

            *p = zp[j];
        }
    }

    instances = a;

    return instances;
}


/* ------------------------------------------------------------ process */

ngx_int_t
ngx_http_singleflight_wait_init_process(ngx_cycle_t *cycle)
{
    ngx_pid_t                            old;
    ngx_uint_t                           i;
    ngx_array_t                         *instances;
    ngx_http_singleflight_zone_t       **zp;
    ngx_http_singleflight_zone_conf_t  **zcp;
    ngx_http_singleflight_main_conf_t   *smcf;

    ngx_queue_init(&ngx_http_singleflight_groups);
    ngx_rbtree_init(&ngx_http_singleflight_ready,
                    &ngx_http_singleflight_ready_sentinel,
                    ngx_rbtree_insert_value);

    ngx_http_singleflight_ready_ev.handler =
                                        ngx_http_singleflight_ready_handler;
    ngx_http_singleflight_ready_ev.log = cycle->log;
    ngx_http_singleflight_ready_dumb.fd = (ngx_socket_t) -1;
    ngx_http_singleflight_ready_ev.data = &ngx_http_singleflight_ready_dumb;

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL || smcf->zones.nelts == 0) {
        return NGX_OK;
    }

    old = ngx_http_singleflight_registry_init_process(cycle,
                                                  ngx_http_singleflight_scan);

    instances = ngx_http_singleflight_instances(cycle);
    if (instances == NULL) {
        return NGX_ERROR;
    }

    zp = instances->elts;

    for (i = 0; i < instances->nelts; i++) {

        if (old) {
            /* the worker this one replaces, in the same process slot */
            ngx_http_singleflight_flight_reclaim(zp[i],
                                      ngx_http_singleflight_registry_slot(),
                                      old, cycle->log);
        }

        (void) ngx_http_singleflight_flight_attach(zp[i], cycle->log);
    }

    /* scope=worker instances: this worker's alone */

    zcp = smcf->zones.elts;

    for (i = 0; i < smcf->zones.nelts; i++) {
        if (zcp[i]->scope == NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER
            && zcp[i]->mine != NULL)
        {
            (void) ngx_http_singleflight_flight_attach(zcp[i]->mine,
                                                       cycle->log);
        }
    }

    ngx_http_singleflight_beat.handler = ngx_http_singleflight_beat_handler;
    ngx_http_singleflight_beat.log = cycle->log;
    ngx_http_singleflight_beat.data = cycle;
    ngx_http_singleflight_beat.cancelable = 1;

    ngx_add_timer(&ngx_http_singleflight_beat, NGX_HTTP_SINGLEFLIGHT_BEAT);

    return NGX_OK;
}


void
ngx_http_singleflight_wait_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                           i;
    ngx_array_t                         *instances;
    ngx_http_singleflight_zone_t       **zp;

    instances = ngx_http_singleflight_instances(cycle);

    if (instances != NULL) {
        zp = instances->elts;

        for (i = 0; i < instances->nelts; i++) {
            ngx_http_singleflight_flight_detach(zp[i], cycle->log);
        }
    }

    ngx_http_singleflight_registry_exit_process(cycle);
}
