
/*
 * Leader or follower.
 *
 * The handler runs in the precontent phase, after rewrite and access
 * checks, so a follower is only ever given a response its own request was
 * allowed to get.  Under the zone's mutex it either finds a flight for the
 * key and joins it (refs and waiters counted in the node, this worker's
 * slot set in the node's wait_mask), or inserts a new flight and goes on
 * to the content handler as its leader.
 *
 * A follower is suspended with its connection's write event timer armed
 * for singleflight_timeout and is queued in a per-worker group for the
 * flight.  It is woken by posting that write event: directly when the
 * flight ends in this worker, through a datagram (_notify.c) when it ends
 * in another.  No wake-up can be lost: the leader takes the wait_mask
 * under the same mutex a follower sets its bit under, so a follower either
 * sees the flight over or is in the mask the leader reads; and a worker
 * handles the datagram only after the follower that caused it returned
 * to the event loop, its group already in place.  A group also re-checks
 * its flight every NGX_HTTP_SINGLEFLIGHT_POLL ms: a safety net for a lost
 * datagram and the way a dead leader's worker is noticed.
 */


#include "ngx_http_singleflight_handler.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_notify.h"
#include "ngx_http_singleflight_fanout.h"
#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_scope.h"


static ngx_int_t ngx_http_singleflight_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_join(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_strip_conditions(
    ngx_http_request_t *r);
static ngx_http_singleflight_ctx_t *ngx_http_singleflight_create_ctx(
    ngx_http_request_t *r);
static void ngx_http_singleflight_cleanup(void *data);
static ngx_int_t ngx_http_singleflight_wait(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_wait_handler(ngx_http_request_t *r);
static void ngx_http_singleflight_resume(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_continue(ngx_http_request_t *r);
static void ngx_http_singleflight_own_error(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_reset_response(ngx_http_request_t *r);
static void ngx_http_singleflight_rejoin(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_stop_waiting_locked(
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_lead(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t status);
static void ngx_http_singleflight_leave_group(
    ngx_http_singleflight_ctx_t *ctx);
static ngx_http_singleflight_group_t *ngx_http_singleflight_group_lookup(
    ngx_http_singleflight_zone_t *zone, uint64_t id);
static void ngx_http_singleflight_group_wake(
    ngx_http_singleflight_group_t *group);
static void ngx_http_singleflight_group_free(
    ngx_http_singleflight_group_t *group);
static void ngx_http_singleflight_poll_handler(ngx_event_t *ev);


ngx_int_t
ngx_http_singleflight_handler_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_singleflight_handler;

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_handler(ngx_http_request_t *r)
{
    ngx_http_singleflight_ctx_t       *ctx;
    ngx_http_singleflight_zone_t      *zone;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);

    if (sfcf->zone == NULL || r != r->main) {
        return NGX_DECLINED;
    }

    if (ngx_http_singleflight_get_ctx(r) != NULL) {
        /* seen before: an internal redirect, or resumed past us */
        return NGX_DECLINED;
    }

    if (!(r->method & sfcf->methods)) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_singleflight_create_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    zone = sfcf->zone->mine;

    if (zone == NULL) {
        /* this worker has no instance (see _scope.c): plain proxying */
        return NGX_DECLINED;
    }

    ctx->zone = zone;
    ctx->conf = sfcf;

    if (r->headers_in.upgrade != NULL) {
        /* a WebSocket or other protocol switch is nobody else's */
        return NGX_DECLINED;
    }

    switch (ngx_http_test_predicates(r, sfcf->bypass)) {

    case NGX_ERROR:
        return NGX_HTTP_INTERNAL_SERVER_ERROR;

    case NGX_DECLINED:
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_BYPASS;
        (void) ngx_atomic_fetch_add(&zone->counters->bypassed, 1);
        return NGX_DECLINED;

    default: /* NGX_OK */
        break;
    }

    if (!sfcf->credentials
        && (r->headers_in.authorization != NULL
#if (nginx_version >= 1023000)
            || r->headers_in.cookie != NULL))
#else
            || r->headers_in.cookies.nelts > 0))
#endif
    {
        /* one user's credentials, maybe one user's response */

        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_PRIVATE;
        (void) ngx_atomic_fetch_add(&zone->counters->private, 1);
        return NGX_DECLINED;
    }

    if (ngx_http_singleflight_key(r, sfcf->key, &ctx->key, &ctx->hash)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_singleflight_join(r, ctx);
}


/*
 * Under the zone's lock: follow the key's flight, take over a flight
 * between leaders, or start a new one.  NGX_DONE: the request waits;
 * NGX_DECLINED: it goes on to the content handler (as a leader, or alone).
 */

static ngx_int_t
ngx_http_singleflight_join(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t                         nomem;
    ngx_http_singleflight_zone_t      *zone;
    ngx_http_singleflight_node_t      *fn;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    sfcf = ctx->conf;
    zone = ctx->zone;

    ngx_http_singleflight_lock(zone);

    fn = NULL;

    if (r->method == NGX_HTTP_HEAD) {

        /* a HEAD request can take its headers from a GET flight */

        ngx_http_singleflight_key_class(&ctx->key, &ctx->hash,
                                        NGX_HTTP_SINGLEFLIGHT_CLASS_GET);
        fn = ngx_http_singleflight_lookup_locked(zone, ctx->hash, &ctx->key);

        if (fn != NULL && fn->state != NGX_HTTP_SINGLEFLIGHT_RUNNING) {
            /* but it must never lead one: its fetch would have no body */
            fn = NULL;
        }

        if (fn == NULL) {
            ngx_http_singleflight_key_class(&ctx->key, &ctx->hash,
                                            NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD);
        }
    }

    if (fn == NULL) {
        fn = ngx_http_singleflight_lookup_locked(zone, ctx->hash, &ctx->key);
    }

    if (fn != NULL && fn->state == NGX_HTTP_SINGLEFLIGHT_PRIVATE) {

        if (ngx_http_singleflight_marked_locked(zone, fn)) {
            ngx_http_singleflight_unlock(zone);

            ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_PRIVATE;
            (void) ngx_atomic_fetch_add(&zone->counters->private, 1);

            return NGX_DECLINED;
        }

        fn = NULL;
    }

    if (fn != NULL && fn->state == NGX_HTTP_SINGLEFLIGHT_ORPHANED) {

        /* a flight between leaders: this request takes it over */

        ngx_http_singleflight_lead_locked(zone, fn, 0);
        ngx_http_singleflight_unlock(zone);

        ctx->fn = fn;

        return ngx_http_singleflight_lead(r, ctx,
                                          NGX_HTTP_SINGLEFLIGHT_ST_PROMOTED);
    }

    if (fn != NULL) {

        if (sfcf->max_waiters && fn->waiters >= sfcf->max_waiters) {
            ngx_http_singleflight_unlock(zone);

            ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_OVERFLOW;
            (void) ngx_atomic_fetch_add(&zone->counters->overflows, 1);

            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "singleflight flight %uL has too many waiters",
                           fn->id);

            if (sfcf->max_waiters_status) {
                return sfcf->max_waiters_status;
            }

            return NGX_DECLINED;
        }

        ngx_http_singleflight_join_locked(zone, fn);
        ngx_http_singleflight_unlock(zone);

        ctx->fn = fn;
        ctx->waiting = 1;
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER;

        if (ctx->wait_start == 0) {
            ctx->wait_start = ngx_current_msec;
        }

        (void) ngx_atomic_fetch_add(&zone->counters->followers, 1);

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight follower of flight %uL, hash %uD",
                       fn->id, ctx->hash);

        return ngx_http_singleflight_wait(r, ctx);
    }

    ngx_http_singleflight_expire_locked(zone, 2);

    fn = ngx_http_singleflight_create_locked(zone, ctx->hash, &ctx->key,
                                             &nomem);

    if (fn == NULL) {
        ngx_http_singleflight_unlock(zone);

        ngx_http_singleflight_log_nomem(zone, r->connection->log, nomem);
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NO_MEMORY;

        return NGX_DECLINED;
    }

    fn->promote_tries = sfcf->promote_tries;

    ngx_http_singleflight_unlock(zone);

    ctx->fn = fn;

    return ngx_http_singleflight_lead(r, ctx,
                                      NGX_HTTP_SINGLEFLIGHT_ST_LEADER);
}


static ngx_int_t
ngx_http_singleflight_lead(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t status)
{
    ngx_atomic_t  *counter;

    ctx->generation = ctx->fn->generation;
    ctx->leader = 1;
    ctx->capturing = 1;
    ctx->status = status;

    counter = (status == NGX_HTTP_SINGLEFLIGHT_ST_LEADER)
              ? &ctx->zone->counters->flights
              : &ctx->zone->counters->promotions;

    (void) ngx_atomic_fetch_add(counter, 1);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight %s of flight %uL, hash %uD",
                   (status == NGX_HTTP_SINGLEFLIGHT_ST_LEADER)
                   ? "leader" : "promoted leader",
                   ctx->fn->id, ctx->hash);

    if (ngx_http_singleflight_strip_conditions(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return NGX_DECLINED;
}


/*
 * A leader fetches the full response for everyone.  Its conditional and
 * range headers are taken off the list an upstream module copies into its
 * request, and hidden from nginx's not_modified and range filters, which
 * would otherwise end the leader's response at its header (a 304) or cut
 * its body (a 206) below the capture filter.  So the leader itself gets
 * the full 200, which HTTP allows; each follower's own filters answer its
 * conditional or range request from the shared 200 (see _fanout.c).
 */

static ngx_str_t  ngx_http_singleflight_conditions[] = {
    ngx_string("If-Modified-Since"),
    ngx_string("If-Unmodified-Since"),
    ngx_string("If-None-Match"),
    ngx_string("If-Match"),
    ngx_string("If-Range"),
    ngx_string("Range"),
    ngx_null_string
};


static ngx_int_t
ngx_http_singleflight_strip_conditions(ngx_http_request_t *r)
{
    ngx_str_t        *name;
    ngx_uint_t        i, n, skip;
    ngx_list_t        headers;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h, *nh;

    if (r->headers_in.if_modified_since == NULL
        && r->headers_in.if_unmodified_since == NULL
        && r->headers_in.if_none_match == NULL
        && r->headers_in.if_match == NULL
        && r->headers_in.if_range == NULL
        && r->headers_in.range == NULL)
    {
        return NGX_OK;
    }

    r->headers_in.if_modified_since = NULL;
    r->headers_in.if_unmodified_since = NULL;
    r->headers_in.if_none_match = NULL;
    r->headers_in.if_match = NULL;
    r->headers_in.if_range = NULL;
    r->headers_in.range = NULL;

    n = 0;

    for (part = &r->headers_in.headers.part; part; part = part->next) {
        n += part->nelts;
    }

    if (ngx_list_init(&headers, r->pool, n ? n : 1, sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        skip = 0;

        for (name = ngx_http_singleflight_conditions; name->len; name++) {
            if (h[i].key.len == name->len
                && ngx_strncasecmp(h[i].key.data, name->data, name->len) == 0)
            {
                skip = 1;
                break;
            }
        }

        if (skip) {
            continue;
        }

        nh = ngx_list_push(&headers);
        if (nh == NULL) {
            return NGX_ERROR;
        }

        *nh = h[i];
    }

    r->headers_in.headers = headers;

    return NGX_OK;
}


static ngx_http_singleflight_ctx_t *
ngx_http_singleflight_create_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_singleflight_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_singleflight_cleanup;
    cln->data = ctx;

    ctx->request = r;

    ngx_http_set_ctx(r, ctx, ngx_http_singleflight_module);

    return ctx;
}


/*
 * An internal redirect (error_page, try_files, X-Accel-Redirect) and a
 * filter finalizing the request (a 412 or 416 from not_modified or range)
 * clear module contexts; ours is found again through its pool cleanup, so
 * that a leader keeps capturing, nobody joins a flight twice, and
 * $singleflight_status is still there for the log.
 */

ngx_http_singleflight_ctx_t *
ngx_http_singleflight_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_singleflight_module);

    if (ctx != NULL || !(r->internal || r->filter_finalize)) {
        return ctx;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_singleflight_cleanup) {
            ctx = cln->data;
            ngx_http_set_ctx(r, ctx, ngx_http_singleflight_module);
            return ctx;
        }
    }

    return NULL;
}


static void
ngx_http_singleflight_cleanup(void *data)
{
    ngx_http_singleflight_ctx_t  *ctx = data;

    ngx_uint_t                     abort;
    ngx_http_request_t            *r;
    ngx_http_singleflight_zone_t  *zone;

    if (ctx->group) {
        ngx_http_singleflight_leave_group(ctx);
    }

    if (ctx->capturing) {

        /*
         * the leader's request ended before its response was complete:
         * its client went away ("abort"), or the upstream failed after
         * the header was sent ("error")
         */

        r = ctx->request;

        abort = (r->headers_out.status == NGX_HTTP_CLIENT_CLOSED_REQUEST
                 || r->connection->error);

        ngx_http_singleflight_fail(ctx,
                                   abort ? NGX_HTTP_SINGLEFLIGHT_PROMOTE_ABORT
                                         : NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR,
                                   NGX_HTTP_BAD_GATEWAY, ngx_cycle->log);
        return;
    }

    if (ctx->fn == NULL) {
        return;
    }

    zone = ctx->zone;

    ngx_http_singleflight_lock(zone);

    ngx_http_singleflight_stop_waiting_locked(ctx);
    ngx_http_singleflight_release_locked(zone, ctx->fn, 0);

    ngx_http_singleflight_unlock(zone);

    ctx->fn = NULL;
}


static ngx_int_t
ngx_http_singleflight_wait(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_msec_t                         left, waited;
    ngx_http_singleflight_zone_t      *zone;
    ngx_http_singleflight_group_t     *group;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);
    zone = ctx->zone;

    group = ngx_http_singleflight_group_lookup(zone, ctx->fn->id);

    if (group == NULL) {
        group = ngx_alloc(sizeof(ngx_http_singleflight_group_t),
                          ngx_cycle->log);
        if (group == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_memzero(group, sizeof(ngx_http_singleflight_group_t));

        group->node.key = (ngx_rbtree_key_t) ctx->fn->id;
        group->id = ctx->fn->id;
        group->zone = zone;
        group->fn = ctx->fn;
        ngx_queue_init(&group->waiters);

        group->poll.handler = ngx_http_singleflight_poll_handler;
        group->poll.data = group;
        group->poll.log = ngx_cycle->log;
        group->poll.cancelable = 1;

        ngx_rbtree_insert(&zone->groups, &group->node);
        ngx_add_timer(&group->poll, NGX_HTTP_SINGLEFLIGHT_POLL);
    }

    ngx_queue_insert_tail(&group->waiters, &ctx->queue);
    ctx->group = group;
    ctx->woken = 0;

    waited = ngx_current_msec - ctx->wait_start;
    left = (waited < sfcf->timeout) ? sfcf->timeout - waited : 1;

    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_singleflight_wait_handler;

    ngx_add_timer(r->connection->write, left);

    return NGX_DONE;
}


static void
ngx_http_singleflight_wait_handler(ngx_http_request_t *r)
{
    ngx_event_t                   *wev;
    ngx_http_singleflight_ctx_t   *ctx;
    ngx_http_singleflight_zone_t  *zone;

    ctx = ngx_http_singleflight_get_ctx(r);
    wev = r->connection->write;

    if (ctx == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (ctx->woken) {
        ctx->woken = 0;
        ngx_http_singleflight_resume(r, ctx);
        return;
    }

    if (!wev->timedout) {
        /* the connection became writable; we are still waiting */

        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        }

        return;
    }

    /* singleflight_timeout: go upstream alone, the flight goes on */

    wev->timedout = 0;

    ngx_http_singleflight_leave_group(ctx);

    zone = ctx->zone;

    ngx_http_singleflight_lock(zone);

    ngx_http_singleflight_stop_waiting_locked(ctx);
    ngx_http_singleflight_release_locked(zone, ctx->fn, 0);

    ngx_http_singleflight_unlock(zone);

    ctx->fn = NULL;
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_TIMEOUT;
    ctx->wait_time = ngx_current_msec - ctx->wait_start;

    (void) ngx_atomic_fetch_add(&zone->counters->timeouts, 1);

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight follower timed out");

    if (ctx->no_lead) {
        ngx_http_singleflight_own_error(r, ctx);
        return;
    }

    if (ctx->conf->timeout_status) {
        r->read_event_handler = ngx_http_block_reading;
        r->write_event_handler = ngx_http_request_empty_handler;
        ngx_http_finalize_request(r, ctx->conf->timeout_status);
        return;
    }

    ngx_http_singleflight_continue(r);
}


static void
ngx_http_singleflight_resume(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t                      rc;
    ngx_uint_t                     n, status;
    ngx_pid_t                      pids[NGX_HTTP_SINGLEFLIGHT_SLOTS];
    uint64_t                       id;
    ngx_http_singleflight_zone_t  *zone;
    ngx_http_singleflight_node_t  *fn;

    zone = ctx->zone;
    fn = ctx->fn;

    ngx_http_singleflight_lock(zone);

    switch (fn->state) {

    case NGX_HTTP_SINGLEFLIGHT_RUNNING:

        /* a new leader took over, or a spurious wake-up: wait on */

        ngx_http_singleflight_rewait_locked(zone, fn);
        ngx_http_singleflight_unlock(zone);

        rc = ngx_http_singleflight_wait(r, ctx);

        if (rc != NGX_DONE) {
            ngx_http_finalize_request(r, rc);
        }

        return;

    case NGX_HTTP_SINGLEFLIGHT_ORPHANED:

        if (ctx->no_lead) {

            /* a failed leader never leads again: another follower will */

            ngx_http_singleflight_rewait_locked(zone, fn);
            ngx_http_singleflight_unlock(zone);

            rc = ngx_http_singleflight_wait(r, ctx);

            if (rc != NGX_DONE) {
                ngx_http_singleflight_own_error(r, ctx);
            }

            return;
        }

        if (r->method == NGX_HTTP_HEAD
            && fn->key[0] == NGX_HTTP_SINGLEFLIGHT_CLASS_GET)
        {
            /*
             * a HEAD request never leads a GET flight (its fetch has no
             * body for the GET followers): it leaves it to them, and looks
             * for, or starts, a HEAD flight of its own
             */

            ngx_http_singleflight_stop_waiting_locked(ctx);
            ngx_http_singleflight_release_locked(zone, fn, 0);
            ngx_http_singleflight_unlock(zone);

            ngx_http_singleflight_rejoin(r, ctx);
            return;
        }

        if (fn->promotions < fn->promote_tries) {

            /* promotion: our reference becomes the leader's */

            ngx_http_singleflight_lead_locked(zone, fn, 1);
            ngx_http_singleflight_unlock(zone);

            ctx->waiting = 0;
            ctx->wait_time = ngx_current_msec - ctx->wait_start;

            rc = ngx_http_singleflight_lead(r, ctx,
                                            NGX_HTTP_SINGLEFLIGHT_ST_PROMOTED);

            if (rc != NGX_DECLINED) {
                ngx_http_finalize_request(r, rc);
                return;
            }

            ngx_http_singleflight_continue(r);
            return;
        }

        /* out of promotions: the flight fails for everyone */

        fn->state = NGX_HTTP_SINGLEFLIGHT_FAILED;
        ngx_http_singleflight_unlink_locked(zone, fn);

        id = fn->id;
        n = ngx_http_singleflight_take_mask_locked(zone, fn, pids);

        ngx_http_singleflight_unlock(zone);

        ngx_http_singleflight_wake_group(zone, id);
        ngx_http_singleflight_notify(zone, pids, n, id, r->connection->log);

        ngx_http_singleflight_lock(zone);

        /* fall through */

    case NGX_HTTP_SINGLEFLIGHT_FAILED:

        status = fn->fail_status ? fn->fail_status : ctx->conf->error_status;

        ngx_http_singleflight_stop_waiting_locked(ctx);
        ngx_http_singleflight_release_locked(zone, fn, 0);

        ngx_http_singleflight_unlock(zone);

        ctx->fn = NULL;
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_ERROR;
        ctx->wait_time = ngx_current_msec - ctx->wait_start;

        (void) ngx_atomic_fetch_add(&zone->counters->errors, 1);

        r->read_event_handler = ngx_http_block_reading;
        r->write_event_handler = ngx_http_request_empty_handler;

        if (ctx->no_lead && ngx_http_singleflight_reset_response(r) != NGX_OK) {
            status = NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_finalize_request(r, status);
        return;

    case NGX_HTTP_SINGLEFLIGHT_NOSHARE:
    case NGX_HTTP_SINGLEFLIGHT_PRIVATE:

        ngx_http_singleflight_stop_waiting_locked(ctx);
        ngx_http_singleflight_release_locked(zone, fn, 0);

        ngx_http_singleflight_unlock(zone);

        ctx->fn = NULL;
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED;
        ctx->wait_time = ngx_current_msec - ctx->wait_start;

        (void) ngx_atomic_fetch_add(&zone->counters->not_shared, 1);

        if (ctx->no_lead) {
            ngx_http_singleflight_own_error(r, ctx);
            return;
        }

        ngx_http_singleflight_continue(r);
        return;

    default: /* NGX_HTTP_SINGLEFLIGHT_DONE */

        ngx_http_singleflight_stop_waiting_locked(ctx);
        ngx_http_singleflight_unlock(zone);

        /* a done flight's response does not change: read it unlocked */

        if (!ngx_http_singleflight_vary_match(r, fn)) {

            /*
             * the response varies on a request header whose value differs
             * from the leader's: look for (or start) a flight of our own
             */

            ngx_http_singleflight_lock(zone);
            ngx_http_singleflight_release_locked(zone, fn, 0);
            ngx_http_singleflight_unlock(zone);

            (void) ngx_atomic_fetch_add(&zone->counters->vary_mismatches,
                                        1);

            if (ctx->no_lead) {
                ctx->fn = NULL;
                ngx_http_singleflight_own_error(r, ctx);
                return;
            }

            ngx_http_singleflight_rejoin(r, ctx);
            return;
        }

        /* keep our reference: the response is sent from the zone */

        ctx->wait_time = ngx_current_msec - ctx->wait_start;

        r->read_event_handler = ngx_http_block_reading;
        r->write_event_handler = ngx_http_request_empty_handler;

        if (ctx->no_lead && ngx_http_singleflight_reset_response(r) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        rc = ngx_http_singleflight_send(r, ctx);

        ngx_http_finalize_request(r, rc);
        return;
    }
}


static void
ngx_http_singleflight_continue(ngx_http_request_t *r)
{
    /* on to the next precontent handler and the content handler */

    if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    r->phase_handler++;
    ngx_http_core_run_phases(r);
}


/*
 * A woken follower that cannot take its flight's outcome (a HEAD on an
 * orphaned GET flight, a Vary mismatch) and has let go of it: it looks for,
 * or starts, a flight it can take.
 */

static void
ngx_http_singleflight_rejoin(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t  rc;

    ctx->fn = NULL;

    rc = ngx_http_singleflight_join(r, ctx);

    if (rc == NGX_DECLINED) {
        ngx_http_singleflight_continue(r);

    } else if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


static void
ngx_http_singleflight_stop_waiting_locked(ngx_http_singleflight_ctx_t *ctx)
{
    if (ctx->waiting) {
        ctx->waiting = 0;
        ngx_http_singleflight_unwait_locked(ctx->zone, ctx->fn);
    }
}


/*
 * The leader's own request failed with a promotion condition while others
 * wait: rather than answer its client with nginx's error, it becomes a
 * follower of the flight it leaves, which another follower is promoted to
 * lead.  Called from the header filter as the error page is about to go
 * out; on NGX_OK the caller sets header_only and returns NGX_DONE, so
 * nginx finalizes nothing but the extra reference taken here, and the
 * request waits like any follower.  It never leads again; if its flight
 * ends without a response for it, it answers with its own error.
 */

ngx_int_t
ngx_http_singleflight_follow_own(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t reason, ngx_uint_t status)
{
    ngx_int_t                      rc;
    ngx_uint_t                     promote;
    ngx_http_singleflight_zone_t  *zone;
    ngx_http_singleflight_node_t  *fn;

    promote = ctx->conf->promote;

    if ((promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF) || !(promote & reason)
        || r != r->main || r->internal || r->header_sent)
    {
        return NGX_DECLINED;
    }

    zone = ctx->zone;
    fn = ctx->fn;

    ngx_http_singleflight_lock(zone);

    if (fn->generation != ctx->generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_RUNNING
        || fn->waiters == 0
        || fn->promotions >= fn->promote_tries)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    /* a follower's reference first: the flight outlives the leader's */

    ngx_http_singleflight_join_locked(zone, fn);

    ngx_http_singleflight_unlock(zone);

    ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_ORPHANED, status,
                                 r->connection->log);

    ctx->fn = fn;
    ctx->leader = 0;
    ctx->waiting = 1;
    ctx->no_lead = 1;
    ctx->own_status = status;
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER;
    ctx->wait_start = ngx_current_msec;

    rc = ngx_http_singleflight_wait(r, ctx);

    if (rc != NGX_DONE) {
        ngx_http_singleflight_lock(zone);
        ngx_http_singleflight_stop_waiting_locked(ctx);
        ngx_http_singleflight_release_locked(zone, fn, 0);
        ngx_http_singleflight_unlock(zone);
        ctx->fn = NULL;
        return NGX_DECLINED;
    }

    r->main->count++;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight failed leader follows flight %uL", fn->id);

    return NGX_OK;
}


/* a failed leader whose flight had nothing for it: its own error after all */

static void
ngx_http_singleflight_own_error(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t  status;

    if (ctx->fn != NULL) {
        ngx_http_singleflight_lock(ctx->zone);
        ngx_http_singleflight_stop_waiting_locked(ctx);
        ngx_http_singleflight_release_locked(ctx->zone, ctx->fn, 0);
        ngx_http_singleflight_unlock(ctx->zone);
        ctx->fn = NULL;
    }

    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_ERROR;

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_request_empty_handler;

    status = ctx->own_status;

    if (ngx_http_singleflight_reset_response(r) != NGX_OK) {
        status = NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_finalize_request(r, status);
}


/* the error page that was not sent: a clean slate for the real response */

static ngx_int_t
ngx_http_singleflight_reset_response(ngx_http_request_t *r)
{
    r->header_only = 0;
    r->err_status = 0;

    ngx_memzero(&r->headers_out, sizeof(ngx_http_headers_out_t));

    if (ngx_list_init(&r->headers_out.headers, r->pool, 20,
                      sizeof(ngx_table_elt_t))
        != NGX_OK
        || ngx_list_init(&r->headers_out.trailers, r->pool, 4,
                         sizeof(ngx_table_elt_t))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    r->headers_out.content_length_n = -1;
    r->headers_out.last_modified_time = -1;

    return NGX_OK;
}


/*
 * The leader failed without a response to share.  "reason" is one of the
 * singleflight_promote conditions; when it is configured, a follower is
 * promoted (while singleflight_promote_tries last), otherwise every
 * follower gets "status": the error nginx gave the leader.
 */

void
ngx_http_singleflight_fail(ngx_http_singleflight_ctx_t *ctx,
    ngx_uint_t reason, ngx_uint_t status, ngx_log_t *log)
{
    ngx_uint_t  promote;

    promote = ctx->conf->promote;

    if (!(promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF) && (promote & reason)) {
        ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_ORPHANED,
                                     status, log);
        return;
    }

    ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_FAILED, status,
                                 log);
}


/*
 * singleflight_lazy: the leader's header has arrived and nobody waits, so
 * nothing is captured.  The flight ends here, under the lock that keeps
 * anyone from joining it meanwhile; later requests start their own.
 */

ngx_int_t
ngx_http_singleflight_finish_alone(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_singleflight_zone_t  *zone;
    ngx_http_singleflight_node_t  *fn;

    zone = ctx->zone;
    fn = ctx->fn;

    ngx_http_singleflight_lock(zone);

    if (fn->waiters != 0
        || fn->generation != ctx->generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_RUNNING)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    fn->state = NGX_HTTP_SINGLEFLIGHT_NOSHARE;
    ngx_http_singleflight_unlink_locked(zone, fn);
    ngx_http_singleflight_release_locked(zone, fn, 1);

    ngx_http_singleflight_unlock(zone);

    ctx->capturing = 0;
    ctx->fn = NULL;

    return NGX_OK;
}


/*
 * The end of a leader's part in a flight:
 *   NGX_HTTP_SINGLEFLIGHT_DONE      the response is stored, share it;
 *   NGX_HTTP_SINGLEFLIGHT_NOSHARE   followers must fetch on their own;
 *   NGX_HTTP_SINGLEFLIGHT_ORPHANED  promote a follower, or fail them all
 *                                   with "status" once tries are used up;
 *   NGX_HTTP_SINGLEFLIGHT_FAILED    every follower gets "status" (0: its
 *                                   own singleflight_error_status).
 */

void
ngx_http_singleflight_finish(ngx_http_singleflight_ctx_t *ctx,
    ngx_uint_t state, ngx_uint_t status, ngx_log_t *log)
{
    uint64_t                       id;
    ngx_uint_t                     n;
    ngx_pid_t                      pids[NGX_HTTP_SINGLEFLIGHT_SLOTS];
    ngx_http_singleflight_zone_t  *zone;
    ngx_http_singleflight_node_t  *fn;

    zone = ctx->zone;
    fn = ctx->fn;

    ctx->capturing = 0;
    ctx->fn = NULL;

    ngx_http_singleflight_lock(zone);

    if (fn->generation != ctx->generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_RUNNING)
    {
        /* no longer ours to end */
        ngx_http_singleflight_release_locked(zone, fn, 1);
        ngx_http_singleflight_unlock(zone);
        return;
    }

    id = fn->id;

    if (state == NGX_HTTP_SINGLEFLIGHT_ORPHANED
        && (fn->waiters == 0 || fn->promotions >= fn->promote_tries))
    {
        state = NGX_HTTP_SINGLEFLIGHT_FAILED;
    }

    if (state != NGX_HTTP_SINGLEFLIGHT_DONE) {
        ngx_http_singleflight_drop_body_locked(zone, fn);
        fn->fail_status = status;
    }

    fn->state = state;

    n = ngx_http_singleflight_take_mask_locked(zone, fn, pids);

    if (state == NGX_HTTP_SINGLEFLIGHT_PRIVATE) {
        /* the mark keeps the leader's reference */
        ngx_http_singleflight_mark_locked(zone, fn, ctx->conf->private_ttl);

    } else {
        if (state != NGX_HTTP_SINGLEFLIGHT_ORPHANED) {
            ngx_http_singleflight_unlink_locked(zone, fn);
        }

        ngx_http_singleflight_release_locked(zone, fn, 1);
    }

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL ends in state %ui, "
                   "waking %ui other workers", id, state, n);

    ngx_http_singleflight_wake_group(zone, id);
    ngx_http_singleflight_notify(zone, pids, n, id, log);
}


void
ngx_http_singleflight_wake_group(ngx_http_singleflight_zone_t *zone,
    uint64_t id)
{
    ngx_http_singleflight_group_t  *group;

    group = ngx_http_singleflight_group_lookup(zone, id);

    if (group != NULL) {
        ngx_http_singleflight_group_wake(group);
    }
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

        node = (id < group->id) ? node->left : node->right;
    }

    return NULL;
}


/* wake every local waiter of the group: each resolves its own outcome */

static void
ngx_http_singleflight_group_wake(ngx_http_singleflight_group_t *group)
{
    ngx_queue_t                  *q;
    ngx_event_t                  *wev;
    ngx_http_singleflight_ctx_t  *ctx;

    while (!ngx_queue_empty(&group->waiters)) {
        q = ngx_queue_head(&group->waiters);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_singleflight_ctx_t, queue);
        ctx->group = NULL;
        ctx->woken = 1;

        wev = ctx->request->connection->write;

        if (wev->timer_set) {
            ngx_del_timer(wev);
        }

        ngx_post_event(wev, &ngx_posted_events);
    }

    ngx_http_singleflight_group_free(group);
}


static void
ngx_http_singleflight_leave_group(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_event_t                    *wev;
    ngx_http_singleflight_group_t  *group;

    group = ctx->group;

    if (group == NULL) {
        return;
    }

    ngx_queue_remove(&ctx->queue);
    ctx->group = NULL;

    wev = ctx->request->connection->write;

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    if (ngx_queue_empty(&group->waiters)) {
        ngx_http_singleflight_group_free(group);
    }
}


static void
ngx_http_singleflight_group_free(ngx_http_singleflight_group_t *group)
{
    if (group->poll.timer_set) {
        ngx_del_timer(&group->poll);
    }

    ngx_rbtree_delete(&group->zone->groups, &group->node);
    ngx_free(group);
}


/*
 * The safety net: every NGX_HTTP_SINGLEFLIGHT_POLL ms a group looks at its
 * flight.  A flight no longer running wakes the group (a datagram was
 * lost); a running flight whose leader's worker is gone is failed for its
 * followers (singleflight_error_status), and everything the dead worker
 * held in the zone is given back, so the next request for the key starts
 * afresh.
 */

static void
ngx_http_singleflight_poll_handler(ngx_event_t *ev)
{
    ngx_pid_t                       pid;
    ngx_uint_t                      dead, led;
    ngx_http_singleflight_zone_t   *zone;
    ngx_http_singleflight_node_t   *fn;
    ngx_http_singleflight_group_t  *group;

    group = ev->data;
    zone = group->zone;
    fn = group->fn;
    led = 0;

    ngx_http_singleflight_lock(zone);

    pid = fn->leader_pid;

    dead = (fn->state == NGX_HTTP_SINGLEFLIGHT_RUNNING
            && pid != ngx_pid
            && ngx_http_singleflight_dead(pid));

    if (dead) {
        /* our group's references keep fn alive through this */
        led = ngx_http_singleflight_reclaim_locked(zone, pid);
    }

    if (fn->state == NGX_HTTP_SINGLEFLIGHT_RUNNING) {
        ngx_http_singleflight_unlock(zone);
        ngx_add_timer(ev, NGX_HTTP_SINGLEFLIGHT_POLL);
        return;
    }

    ngx_http_singleflight_unlock(zone);

    if (dead) {
        ngx_http_singleflight_log_dead(zone, ev->log, pid, led);
    }

    ngx_http_singleflight_group_wake(group);
}
