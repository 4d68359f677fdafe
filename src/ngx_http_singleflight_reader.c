/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The reader.
 *
 * Every request in a flight reads it, its leader included: it waits for
 * the header (followers for at most singleflight_timeout), decides whether
 * the response is its own to take, then sends it through its own output
 * filters, taking the body by offset from the store as the fetch adds to
 * it.  A reader never slows the fetch or another reader: each goes at its
 * own client's pace, on its own connection's write events, and parks when
 * it has caught up with what is stored.  One whose client asked for a
 * range, which its range filter cuts from the response, is done at that
 * range's last byte (reader_until()).
 *
 * At the header, a reader whose Vary values differ from the fetch's looks
 * for the flight of its own variant at once (rejoin), and a response that
 * is not for sharing sends every reader but the leader on its own way, as
 * if the module were off (continue).  A flight that failed gives each
 * reader its status, through the reader's own error_page; one whose body
 * broke off closes the connections of the readers that had some of it,
 * and sends the others looking for a flight again.
 *
 * A request that hosts a fetch outlives its client if it must: when its
 * client goes, its reading ends but the request stays, referenced by the
 * fetch's subrequest, until the fetch is over (_fetch.c).
 */


#include "ngx_http_singleflight_reader.h"
#include "ngx_http_singleflight_share.h"
#include "ngx_http_singleflight_tee.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_fetch.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_zone.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif


/* a flight a request read and left for another, held until it goes */
typedef struct {
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;
} ngx_http_singleflight_kept_t;


/* what a reader passes to its filters per go */
#define NGX_HTTP_SINGLEFLIGHT_READ_SIZE   (256 * 1024)

/* how many goes per event, before it lets the others run */
#define NGX_HTTP_SINGLEFLIGHT_READ_GOES   8

/* how many flights a request may look for, one after another */
#define NGX_HTTP_SINGLEFLIGHT_REJOINS     16

/*
 * A reader parked mid-body waits at the origin's pace, not its client's,
 * so no send_timeout; but it keeps a timer, which only comes back, so
 * that a worker shutting down gracefully waits for it.
 */
#define NGX_HTTP_SINGLEFLIGHT_PARKED      60000


static ngx_http_singleflight_ctx_t *ngx_http_singleflight_ctx_get(
    ngx_log_t *log);
static void ngx_http_singleflight_ctx_put(ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_cleanup(void *data);
static void ngx_http_singleflight_reader_kept(void *data);
static ngx_int_t ngx_http_singleflight_reader_arm(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_reader_direct_done(
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation);
static ngx_http_singleflight_waiter_t *
    ngx_http_singleflight_reader_host_waiter(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_reader_arrival(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_arrival_t *a);
static ngx_int_t ngx_http_singleflight_reader_lead(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t takeover);
static ngx_int_t ngx_http_singleflight_reader_late(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_reader_wait(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t parked);
static void ngx_http_singleflight_reader_timer(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_handler(ngx_http_request_t *r);
static void ngx_http_singleflight_reader_watch(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_test(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_reader_eof(ngx_http_request_t *r,
    ngx_err_t *err);
static ngx_int_t ngx_http_singleflight_reader_peek(ngx_http_request_t *r,
    ngx_err_t *err);
static void ngx_http_singleflight_reader_wake(
    ngx_http_singleflight_waiter_t *w);
static void ngx_http_singleflight_reader_look(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_uint_t ngx_http_singleflight_reader_elsewhere(
    ngx_http_request_t *r, ngx_http_singleflight_ctx_t *ctx, u_char *block);
static ngx_uint_t ngx_http_singleflight_reader_creds(
    ngx_http_singleflight_ctx_t *ctx, u_char *block);
static void ngx_http_singleflight_reader_take(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t state);
static off_t ngx_http_singleflight_reader_until(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t status);
static void ngx_http_singleflight_reader_pump(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_direct(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_reader_event(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_uint_t ngx_http_singleflight_reader_held(ngx_connection_t *c);
static ngx_int_t ngx_http_singleflight_reader_flush(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_reader_send(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, off_t len, ngx_uint_t state);
static ngx_int_t ngx_http_singleflight_reader_output(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_chain_t *out);
static void ngx_http_singleflight_reader_cut(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, off_t len);
static ngx_int_t ngx_http_singleflight_reader_park(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_atomic_uint_t seq);
static void ngx_http_singleflight_reader_wait_write(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_failed(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_timeout(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_redirected(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_promoted(
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_waited(
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_cached(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_takeover(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_adopt(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_reader_unfetched(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t generation);
static void ngx_http_singleflight_reader_rejoin(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_uint_t ngx_http_singleflight_reader_retry(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t condition);
static void ngx_http_singleflight_reader_alone(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t status);
static void ngx_http_singleflight_reader_end(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_int_t rc);
static void ngx_http_singleflight_reader_gone(ngx_http_request_t *r);
#if (NGX_HTTP_V3)
static void ngx_http_singleflight_reader_quic_hook(ngx_connection_t *c);
static void ngx_http_singleflight_reader_quic(ngx_event_t *ev);

/* what a QUIC stream's events went to (ngx_http_request_handler()) */
static ngx_event_handler_pt  ngx_http_singleflight_quic_next;
#endif
static void ngx_http_singleflight_reader_leave(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_continue(ngx_http_request_t *r);
static void ngx_http_singleflight_mirror_make(ngx_http_request_t *r,
    ngx_http_singleflight_mirror_conf_t *mcf);


/* this worker made a mirror: until then no response header looks */
ngx_uint_t  ngx_http_singleflight_mirror_made;

/*
 * The contexts of requests gone, kept for the next ones (at most
 * NGX_HTTP_SINGLEFLIGHT_CTX_KEPT), each free one's first word the next:
 * a context in the request's pool could take that pool past its first
 * block, a malloc() and a free() more for a request the module then lets
 * through (credentials, singleflight_bypass) or leads alone; so too its
 * pool cleanup, which it holds.  Under AddressSanitizer a free one is
 * poisoned, but for that cleanup, so that a use of it after its request
 * is seen.
 */

#define NGX_HTTP_SINGLEFLIGHT_CTX_KEPT  64

/* the size of a context's fields from "key" on, but its cleanup */
#define NGX_HTTP_SINGLEFLIGHT_CTX_COLD                                        \
    (offsetof(ngx_http_singleflight_ctx_t, cln)                               \
     - offsetof(ngx_http_singleflight_ctx_t, key))

#ifdef __SANITIZE_ADDRESS__
#define ngx_http_singleflight_poison(p, n)    ASAN_POISON_MEMORY_REGION(p, n)
#define ngx_http_singleflight_unpoison(p, n)  ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define ngx_http_singleflight_poison(p, n)
#define ngx_http_singleflight_unpoison(p, n)
#endif

/* what a fetch asks of its host's reader (_fetch.c) */
ngx_http_singleflight_fetch_host_t  ngx_http_singleflight_reader_host = {
    ngx_http_singleflight_reader_arm,
    ngx_http_singleflight_reader_direct_done,
    ngx_http_singleflight_reader_host_waiter
};

static void        *ngx_http_singleflight_ctx_free;
static ngx_uint_t   ngx_http_singleflight_ctx_nfree;


/* ------------------------------------------------------------ context */

ngx_http_singleflight_ctx_t *
ngx_http_singleflight_create_ctx(ngx_http_request_t *r)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_ctx_get(r->connection->log);
    if (ctx == NULL) {
        return NULL;
    }

    ngx_memzero(ctx, offsetof(ngx_http_singleflight_ctx_t, key));

    /* its pool cleanup is its own: nothing taken from the request's pool */

    ctx->cln.handler = ngx_http_singleflight_cleanup;
    ctx->cln.data = ctx;
    ctx->cln.next = r->pool->cleanup;
    r->pool->cleanup = &ctx->cln;

    ctx->request = r;

    /* under AddressSanitizer a look at the rest before it is set is seen */
    ngx_http_singleflight_poison(&ctx->key, NGX_HTTP_SINGLEFLIGHT_CTX_COLD);

    ngx_http_set_ctx(r, ctx, ngx_http_singleflight_module);

    return ctx;
}


/*
 * The rest of a context, before its request looks for a flight or a
 * flight takes it over: a request on its own way never needs it.
 */

void
ngx_http_singleflight_ctx_warm(ngx_http_singleflight_ctx_t *ctx)
{
    if (ctx->warm) {
        return;
    }

    ngx_http_singleflight_unpoison(&ctx->key, NGX_HTTP_SINGLEFLIGHT_CTX_COLD);
    ngx_memzero(&ctx->key, NGX_HTTP_SINGLEFLIGHT_CTX_COLD);

    ctx->waiter.handler = ngx_http_singleflight_reader_wake;
    ctx->waiter.data = ctx;
    ctx->warm = 1;

#if (NGX_HTTP_V3)
    ngx_http_singleflight_reader_quic_hook(ctx->request->connection);
#endif
}


static ngx_http_singleflight_ctx_t *
ngx_http_singleflight_ctx_get(ngx_log_t *log)
{
    void  *ctx;

    ctx = ngx_http_singleflight_ctx_free;

    if (ctx == NULL) {
        return ngx_alloc(sizeof(ngx_http_singleflight_ctx_t), log);
    }

    ngx_http_singleflight_unpoison(ctx, sizeof(void *));

    ngx_http_singleflight_ctx_free = *(void **) ctx;
    ngx_http_singleflight_ctx_nfree--;

    ngx_http_singleflight_unpoison(ctx, sizeof(ngx_http_singleflight_ctx_t));

    return ctx;
}


/*
 * From its pool's cleanup: nothing looks at a request's context then, but
 * ngx_destroy_pool() reads its cleanup's "next" once this returns.  So the
 * context stays allocated, on the list, with its cleanup readable; past
 * the limit, the one freed is the context kept before it, whose pool's
 * walk is over.
 */

static void
ngx_http_singleflight_ctx_put(ngx_http_singleflight_ctx_t *ctx)
{
    void  *prev;

    prev = ngx_http_singleflight_ctx_free;

    if (ngx_http_singleflight_ctx_nfree == NGX_HTTP_SINGLEFLIGHT_CTX_KEPT) {
        ngx_http_singleflight_unpoison(prev,
                                       sizeof(ngx_http_singleflight_ctx_t));
        *(void **) ctx = *(void **) prev;
        ngx_free(prev);

    } else {
        *(void **) ctx = prev;
        ngx_http_singleflight_ctx_nfree++;
    }

    ngx_http_singleflight_ctx_free = ctx;

    ngx_http_singleflight_poison(ctx,
                                 offsetof(ngx_http_singleflight_ctx_t, cln));
}


/*
 * An internal redirect (error_page, try_files, X-Accel-Redirect) and a
 * filter finalizing the request (a 412 or 416) clear module contexts;
 * ours is found again through its pool cleanup, so that a request keeps
 * its flight and $singleflight_status is still there for the log.  (The
 * first look, at the module's context, is ngx_http_singleflight_get_ctx()
 * in _reader.h.)
 */

ngx_http_singleflight_ctx_t *
ngx_http_singleflight_find_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_singleflight_ctx_t  *ctx;

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_singleflight_cleanup) {
            ctx = cln->data;

            if (ctx->request == r) {
                ngx_http_set_ctx(r, ctx, ngx_http_singleflight_module);
                return ctx;
            }
        }
    }

    return NULL;
}


/*
 * A request answered from a flight comes back into a collapsed location
 * (post_action, or error_page and then an X-Accel-Redirect) to look for
 * another: the flight it read stays held until the request goes, as what
 * it sent may point into it (reader_leave()), and its place in it is let
 * go.  NGX_ERROR: it cannot look for another.
 */

ngx_int_t
ngx_http_singleflight_reader_again(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_pool_cleanup_t            *cln;
    ngx_http_singleflight_kept_t  *kept;

    if (ctx->fn != NULL) {
        cln = ngx_pool_cleanup_add(r->pool,
                                   sizeof(ngx_http_singleflight_kept_t));
        if (cln == NULL) {
            return NGX_ERROR;
        }

        kept = cln->data;
        kept->zone = ctx->zone;
        kept->fn = ctx->fn;
        cln->handler = ngx_http_singleflight_reader_kept;

        ctx->fn = NULL;
    }

    ngx_memzero(&ctx->cursor, sizeof(ngx_http_singleflight_cursor_t));
    ctx->until = 0;

    return NGX_OK;
}


static void
ngx_http_singleflight_reader_kept(void *data)
{
    ngx_http_singleflight_kept_t  *kept = data;

    ngx_int_t  how;

    how = ngx_http_singleflight_flight_release(kept->zone, kept->fn,
                                               ngx_cycle->log);
    ngx_http_singleflight_wait_wake(kept->zone, kept->fn, how);
}


/*
 * The request went its own way, and a flight may wait for its response
 * (its slot PENDING): at its header ("r"), a redirect before it ("r",
 * internal) or its end (NULL), the flight is taken or let go
 * (tee_adopt())
 */

ngx_int_t
ngx_http_singleflight_reader_pending(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ctx->pending = 0;

    if (!ngx_http_singleflight_claim_pass(ctx->claim, ctx->claim_epoch)) {
        return NGX_OK;
    }

    ngx_http_singleflight_ctx_warm(ctx);

    return ngx_http_singleflight_tee_adopt(r, ctx);
}


/*
 * The location's content handler, where a cache answers in its upstream,
 * for a request whose upstream response a flight may wait for (PENDING,
 * or its own request as the flight's fetch).  Once its upstream has
 * looked in the cache, the others need not wait for it where the cache
 * answers them at once (share_unwaited()): the flight goes, and a
 * follower's fetch asks the cache, as each of them would without the
 * module.
 */

ngx_int_t
ngx_http_singleflight_reader_content(ngx_http_request_t *r)
{
    ngx_int_t                          rc;
    ngx_http_singleflight_ctx_t       *ctx;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    /*
     * the real one back first: a subrequest made meanwhile copies it
     * (the cache's background update, in an "if" block that has none)
     */

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);
    r->content_handler = sfcf->origin;

    rc = r->content_handler(r);

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx != NULL && (ctx->pending || ctx->tee != NULL)
        && ngx_http_singleflight_share_unwaited(r))
    {
        if (ctx->pending) {
            (void) ngx_http_singleflight_reader_pending(NULL, ctx);

        } else {
            ngx_http_singleflight_tee_forgo(ctx);
        }
    }

    return rc;
}


/*
 * The request goes: it is counted by its final $singleflight_status (once,
 * however many locations error_page took it through), what it held goes
 * back, its fetches end.
 */

static void
ngx_http_singleflight_cleanup(void *data)
{
    ngx_http_singleflight_ctx_t  *ctx = data;

    ngx_int_t                          how;
    ngx_http_singleflight_counters_t  *counters;

    if (ctx->status != NGX_HTTP_SINGLEFLIGHT_ST_NONE) {
        /* the handler gave it its zone before any status */
        counters = ctx->zone->counters;
        (void) ngx_atomic_fetch_add(&counters->requests[ctx->status], 1);
    }

    if (ctx->pending) {
        /* gone before its header: a flight waiting for it fetches */
        (void) ngx_http_singleflight_reader_pending(NULL, ctx);
    }

    if (!ctx->warm || (ctx->direct && ctx->tee == NULL)) {
        /*
         * it never looked for a flight, or went upstream itself
         * (singleflight_lone direct) and never anywhere else after: no
         * flight, fetch or wait to undo; its slot may have gone with its
         * upstream response (_filter.c)
         */
        if (ctx->claim != NULL) {
            ngx_http_singleflight_unclaim(ctx->claim, ctx->claim_epoch);
        }

        ngx_http_singleflight_ctx_put(ctx);
        return;
    }

    ngx_http_singleflight_wait_unpark(&ctx->waiter);

    if (ctx->counted) {
        ctx->header_sent = 0;
        ngx_http_singleflight_reader_leave(ctx->request, ctx);
    }

    if (ctx->fn != NULL) {
        how = ngx_http_singleflight_flight_release(ctx->zone, ctx->fn,
                                                   ngx_cycle->log);
        ngx_http_singleflight_wait_wake(ctx->zone, ctx->fn, how);
        ctx->fn = NULL;
    }

    ngx_http_singleflight_fetch_cleanup(ctx);

    if (ctx->claim != NULL) {
        ngx_http_singleflight_unclaim(ctx->claim, ctx->claim_epoch);
    }

    ngx_http_singleflight_ctx_put(ctx);
}


/* ------------------------------------------------------------ joining */

/*
 * A request arrives in a flight.  NGX_DONE: it waits, or reads; NGX_DECLINED:
 * it goes on as if the module were off; a status: its answer.
 */

ngx_int_t
ngx_http_singleflight_reader_join(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t                         generation;
    ngx_http_singleflight_zone_t      *zone;
    ngx_http_singleflight_node_t      *fn;
    ngx_http_singleflight_join_e       rc;
    ngx_http_singleflight_arrival_t    a;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = ctx->conf;
    zone = ctx->zone;

    ngx_http_singleflight_reader_arrival(r, ctx, &a);

    rc = ngx_http_singleflight_flight_join(zone, &a, &fn, &generation);

    switch (rc) {

    case NGX_HTTP_SINGLEFLIGHT_JOIN_PRIVATE:
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_PRIVATE;
        return NGX_DECLINED;

    case NGX_HTTP_SINGLEFLIGHT_JOIN_OVERFLOW:
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_OVERFLOW;

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight flight %uL has too many followers",
                       fn->id);

        return conf->max_waiters_status ? (ngx_int_t) conf->max_waiters_status
                                        : NGX_DECLINED;

    case NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM:
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NO_MEMORY;
        return NGX_DECLINED;

    default:
        break;
    }

    ctx->fn = fn;
    ctx->generation = generation;
    ctx->seen = a.seq;
    ctx->counted = 1;
    ctx->cursor.fn = fn;
    ctx->uri_changes = r->uri_changes;

    if (ctx->wait_start == 0) {
        ctx->wait_start = ngx_current_msec;
    }

    switch (rc) {

    case NGX_HTTP_SINGLEFLIGHT_JOIN_LEAD:
    case NGX_HTTP_SINGLEFLIGHT_JOIN_TAKEOVER:
        return ngx_http_singleflight_reader_lead(r, ctx,
                                  rc == NGX_HTTP_SINGLEFLIGHT_JOIN_TAKEOVER);

    case NGX_HTTP_SINGLEFLIGHT_JOIN_FOLLOW:

        ctx->host = 0;
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER;
        (void) ngx_atomic_fetch_add(&zone->counters->followers, 1);

        return ngx_http_singleflight_reader_wait(r, ctx, 1);

    default: /* NGX_HTTP_SINGLEFLIGHT_JOIN_LATE */
        return ngx_http_singleflight_reader_late(r, ctx);
    }
}


/* the request's side of a join: its key and what the location allows */

static void
ngx_http_singleflight_reader_arrival(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_arrival_t *a)
{
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = ctx->conf;

    ngx_memzero(a, sizeof(ngx_http_singleflight_arrival_t));

    a->request = r;
    a->key = &ctx->key;
    a->hash = ctx->hash;

    /*
     * the private marks' hash only when the zone has marks (read without
     * the lock: a mark made meanwhile is missed, as by a request a moment
     * earlier)
     */
    if (ctx->zone->sh->nmarks) {
        a->mark = ngx_http_singleflight_hash64(ctx->key.data, ctx->key.len);
    }
    a->max_waiters = conf->max_waiters;
    a->max_retries = (conf->promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF)
                     ? 0 : conf->promote_tries;
    a->head = (r->method == NGX_HTTP_HEAD);
    a->promote_dead = (conf->promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEAD)
                      ? 1 : 0;
    a->creds = ctx->creds;

    a->predict = ctx->predict;
    a->predict_len = ctx->predict_len;

    if (conf->temp_path) {
        /* as ngx_create_temp_file() makes it: path/levels/10 digits */
        a->file_room = conf->temp_path->name.len + 1 + conf->temp_path->len
                       + 10 + 1;
    }
}


/* the request leads its flight (a new one, or an orphan taken over) */

static ngx_int_t
ngx_http_singleflight_reader_lead(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t takeover)
{
    ngx_int_t                      how;
    ngx_uint_t                     generation;
    ngx_http_singleflight_zone_t  *zone;
    ngx_http_singleflight_node_t  *fn;

    zone = ctx->zone;
    fn = ctx->fn;
    generation = ctx->generation;

    /*
     * singleflight_lone direct: a request of its slot went its own way
     * before it and may share its response (_tee.c); the flight waits for
     * that request's header, and this request for the flight's
     */

    if (!takeover && ctx->rejoins == 0 && ctx->claim != NULL
        && r->method == NGX_HTTP_GET && !ctx->range_sent
        && ngx_http_singleflight_claim_open(*ctx->claim, ctx->claim_epoch,
                                            ctx->claim_mark)
        && ngx_http_singleflight_flight_defer(zone, fn, generation,
                                              ctx->claim, ctx->claim_epoch,
                                              ctx->claim_mark, &ctx->seen)
           == NGX_OK)
    {
        ctx->host = 0;
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER;
        (void) ngx_atomic_fetch_add(&zone->counters->followers, 1);

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight flight %uL waits for a request on its "
                       "own way", fn->id);

        return ngx_http_singleflight_reader_wait(r, ctx, 1);
    }

    ngx_http_singleflight_reader_promoted(ctx);

    ctx->host = 1;

    if (!takeover) {
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_LEADER;

    } else {
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_PROMOTED;
        (void) ngx_atomic_fetch_add(&zone->counters->promotions, 1);
    }

    /*
     * singleflight_lone own: its own request fetches it, when it came to
     * the flight from the phase handler (not woken from a wait: a re-join
     * or a retry), and nothing in it keeps it from the whole response.
     * So does a GET of a "direct" location that found its slot taken by
     * a request past its header (a late arrival, a proxy_cache hit, a
     * slot shared with another key): a cache hit is then its own, and a
     * miss feeds the flight as the first request's response would have
     */

    if (!takeover && ctx->rejoins == 0
        && (ctx->conf->lone == NGX_HTTP_SINGLEFLIGHT_LONE_OWN
            || (ctx->conf->lone == NGX_HTTP_SINGLEFLIGHT_LONE_DIRECT
                && ctx->claim != NULL && !r->internal))
        && ngx_http_singleflight_tee_start(r, ctx) == NGX_DECLINED)
    {
        if (ctx->conf->cached && r->content_handler != NULL
            && r->content_handler == ctx->conf->origin)
        {
            r->content_handler = ngx_http_singleflight_reader_content;
        }

        /*
         * on through the phases to the location's content handler;
         * counted as a flight at its header, unless a cache answers it
         */
        return NGX_DECLINED;
    }

    if (!takeover) {
        (void) ngx_atomic_fetch_add(&zone->counters->flights, 1);
    }

    if (ngx_http_singleflight_fetch_start(r, ctx, fn, generation) == NGX_OK) {
        /* not parked: its fetch wakes it (reader_host_waiter()) */
        return ngx_http_singleflight_reader_wait(r, ctx, 0);
    }

    /* no fetch: everybody goes alone, this request too */

    how = ngx_http_singleflight_flight_alone(zone, fn, generation,
                                             NGX_HTTP_SINGLEFLIGHT_R_UNSHARED,
                                             0, NULL, r->connection->log);
    ngx_http_singleflight_wait_wake(zone, fn, how);

    how = ngx_http_singleflight_flight_unhost(zone, fn, generation,
                                              r->connection->log);
    ngx_http_singleflight_wait_wake(zone, fn, how);

    ngx_http_singleflight_reader_leave(r, ctx);

    return NGX_DECLINED;
}


/* the response is there already: the request takes it at the next event */

static ngx_int_t
ngx_http_singleflight_reader_late(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ctx->host = 0;
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER;
    (void) ngx_atomic_fetch_add(&ctx->zone->counters->followers, 1);
    (void) ngx_atomic_fetch_add(&ctx->zone->counters->late_joins, 1);

    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_WAITING;
    ctx->woken = 1;

    ngx_http_singleflight_reader_watch(r, ctx);

    ngx_post_event(r->connection->write, &ngx_posted_events);

    return NGX_DONE;
}


/* the request waits for its flight's header; "parked": the join did that */

static ngx_int_t
ngx_http_singleflight_reader_wait(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t parked)
{
    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_WAITING;
    ctx->woken = 0;

    /* only this wait's own timer may time it out */
    r->connection->write->timedout = 0;

    ngx_http_singleflight_reader_watch(r, ctx);

    if (parked) {
        if (ngx_http_singleflight_wait_add(ctx->zone, ctx->fn, ctx->seen,
                                           &ctx->waiter)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    ngx_http_singleflight_reader_timer(r, ctx);

    return NGX_DONE;
}


/* a follower waits for the header for at most singleflight_timeout */

static void
ngx_http_singleflight_reader_timer(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_msec_t    waited, left;
    ngx_event_t  *wev;

    wev = r->connection->write;

    if (ctx->host || ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_WAITING) {
        if (wev->timer_set) {
            ngx_del_timer(wev);
        }

        return;
    }

    waited = ngx_current_msec - ctx->wait_start;
    left = (waited < ctx->conf->timeout) ? ctx->conf->timeout - waited : 1;

    ngx_add_timer(wev, left);
}


/* ------------------------------------------------------------ events */

static void
ngx_http_singleflight_reader_handler(ngx_http_request_t *r)
{
    ngx_event_t                  *wev;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    wev = r->connection->write;

    switch (ctx->phase) {

    case NGX_HTTP_SINGLEFLIGHT_RD_WAITING:

        if (ctx->woken) {
            ctx->woken = 0;
            wev->timedout = 0;
            ngx_http_singleflight_reader_look(r, ctx);
            return;
        }

        if (wev->timedout) {
            wev->timedout = 0;
            ngx_http_singleflight_reader_timeout(r, ctx);
            return;
        }

        /* the connection became writable; still waiting */

        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
        }

        return;

    case NGX_HTTP_SINGLEFLIGHT_RD_SENDING:
        ngx_http_singleflight_reader_pump(r, ctx);
        return;

    case NGX_HTTP_SINGLEFLIGHT_RD_DIRECT:
        ngx_http_singleflight_reader_direct(r, ctx);
        return;

    default:
        return;
    }
}


/* the flight changed: look at it, at the next event */

static void
ngx_http_singleflight_reader_wake(ngx_http_singleflight_waiter_t *w)
{
    ngx_http_request_t           *r;
    ngx_http_singleflight_ctx_t  *ctx = w->data;

    r = ctx->request;

    ctx->woken = 1;

    ngx_post_event(r->connection->write, &ngx_posted_events);
}


/*
 * The host of flight "fn" waits for its header without being parked (its
 * own fetch is what changes the flight until then): after each change the
 * fetch makes, it is to look, as a parked request woken would.  Its waiter
 * then, NULL if it does not wait so (or is woken already).
 */

static ngx_http_singleflight_waiter_t *
ngx_http_singleflight_reader_host_waiter(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn)
{
    if (ctx->phase == NGX_HTTP_SINGLEFLIGHT_RD_WAITING && ctx->fn == fn
        && ctx->counted && ctx->waiter.group == NULL && !ctx->woken)
    {
        return &ctx->waiter;
    }

    return NULL;
}


/*
 * A waiting or reading request's handlers.  Is its client watched for
 * going away?
 * As nginx's upstream does it: not with proxy_ignore_client_abort (or
 * fastcgi_..., ...), where a client that closed its side of the
 * connection still gets the whole response; a client gone for good is
 * seen when the response is sent to it.
 */

static void
ngx_http_singleflight_reader_watch(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    r->read_event_handler = ctx->conf->ignore_abort
                            ? ngx_http_block_reading
                            : ngx_http_singleflight_reader_test;
    r->write_event_handler = ngx_http_singleflight_reader_handler;
}


/*
 * The client of a waiting or reading request may go away: as nginx's
 * ngx_http_test_reading() tells, but what follows is the module's (a
 * request that hosts a fetch must not take the fetch with it).
 */

static void
ngx_http_singleflight_reader_test(ngx_http_request_t *r)
{
    ngx_err_t                     err;
    ngx_int_t                     rc;
    ngx_connection_t             *c;
    ngx_http_singleflight_ctx_t  *ctx;

    c = r->connection;
    err = 0;

    rc = ngx_http_singleflight_reader_eof(r, &err);

    if (rc == NGX_DECLINED) {
        rc = ngx_http_singleflight_reader_peek(r, &err);
    }

    if (rc != NGX_DONE) {
        return;
    }

    if (err) {
        c->read->error = 1;
    }

    ngx_log_error(NGX_LOG_INFO, c->log, err,
                  "client prematurely closed connection");

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_CLIENT_CLOSED_REQUEST);
        return;
    }

    ngx_http_singleflight_reader_end(r, ctx, NGX_HTTP_CLIENT_CLOSED_REQUEST);
}


/*
 * What the connection's protocol or event method tells of its client
 * without a look at the socket: NGX_DONE, it is gone (*err, the reason);
 * NGX_OK, it is there; NGX_DECLINED, nothing known, peek.
 */

static ngx_int_t
ngx_http_singleflight_reader_eof(ngx_http_request_t *r, ngx_err_t *err)
{
    ngx_event_t       *rev;
    ngx_connection_t  *c;

    c = r->connection;
    rev = c->read;

#if (NGX_HTTP_V2)

    if (r->stream) {
        return c->error ? NGX_DONE : NGX_OK;
    }

#endif

#if (NGX_HTTP_V3)

    if (c->quic) {
        if (rev->error) {
            c->error = 1;
            return NGX_DONE;
        }

        return NGX_OK;
    }

#endif

#if (NGX_HAVE_KQUEUE)

    if (ngx_event_flags & NGX_USE_KQUEUE_EVENT) {

        if (!rev->pending_eof) {
            return NGX_OK;
        }

        rev->eof = 1;
        c->error = 1;
        *err = rev->kq_errno;

        return NGX_DONE;
    }

#endif

#if (NGX_HAVE_EPOLLRDHUP)

    if ((ngx_event_flags & NGX_USE_EPOLL_EVENT) && ngx_use_epoll_rdhup) {
        socklen_t  len;

        if (!rev->pending_eof) {
            return NGX_OK;
        }

        rev->eof = 1;
        c->error = 1;

        len = sizeof(ngx_err_t);

        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *) err, &len)
            == -1)
        {
            *err = ngx_socket_errno;
        }

        return NGX_DONE;
    }

#endif

    return NGX_DECLINED;
}


/* a peek at the socket: NGX_DONE when its client has closed it */

static ngx_int_t
ngx_http_singleflight_reader_peek(ngx_http_request_t *r, ngx_err_t *err)
{
    int                n;
    char               buf[1];
    ngx_event_t       *rev;
    ngx_connection_t  *c;

    c = r->connection;
    rev = c->read;

    n = recv(c->fd, buf, 1, MSG_PEEK);

    if (n == 0) {
        rev->eof = 1;
        c->error = 1;
        return NGX_DONE;
    }

    if (n == -1) {
        *err = ngx_socket_errno;

        if (*err != NGX_EAGAIN) {
            rev->eof = 1;
            c->error = 1;
            return NGX_DONE;
        }

        *err = 0;
    }

    if ((ngx_event_flags & NGX_USE_LEVEL_EVENT) && rev->active) {
        if (ngx_del_event(rev, NGX_READ_EVENT, 0) != NGX_OK) {
            c->error = 1;
            return NGX_DONE;
        }
    }

    return NGX_OK;
}


/* ------------------------------------------------------------ the header */

static void
ngx_http_singleflight_reader_look(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t                      rc;
    ngx_uint_t                     state;
    ngx_atomic_uint_t              seq;
    ngx_http_singleflight_node_t  *fn;

    fn = ctx->fn;

    for ( ;; ) {
        seq = ngx_http_singleflight_flight_seq(fn);
        state = ngx_http_singleflight_flight_state(fn);

        switch (state) {

        case NGX_HTTP_SINGLEFLIGHT_FETCHING:

            rc = ngx_http_singleflight_reader_park(r, ctx, seq);

            if (rc == NGX_AGAIN) {
                continue;
            }

            if (rc == NGX_ERROR) {
                ngx_http_singleflight_reader_end(r, ctx,
                                               NGX_HTTP_INTERNAL_SERVER_ERROR);
                return;
            }

            ngx_http_singleflight_reader_timer(r, ctx);
            return;

        case NGX_HTTP_SINGLEFLIGHT_ORPHANED:
            ctx->seen = seq;
            ngx_http_singleflight_reader_takeover(r, ctx);
            return;

        case NGX_HTTP_SINGLEFLIGHT_STREAMING:
        case NGX_HTTP_SINGLEFLIGHT_COMPLETE:
            ctx->seen = seq;
            ngx_http_singleflight_reader_take(r, ctx, state);
            return;

        case NGX_HTTP_SINGLEFLIGHT_FAILED:
            ctx->seen = seq;
            ngx_http_singleflight_reader_failed(r, ctx);
            return;

        default: /* NGX_HTTP_SINGLEFLIGHT_ALONE */

            ctx->seen = seq;

            if (fn->reason == NGX_HTTP_SINGLEFLIGHT_R_CACHED && !ctx->host) {
                ngx_http_singleflight_reader_cached(r, ctx);
                return;
            }

            /*
             * a private response too: its followers were collapsed, and
             * go on their own because of the response (NOT_SHARED); only
             * requests that a marked key keeps from collapsing at all are
             * PRIVATE
             */

            if (ctx->host) {
                /* its own response: as its fetch left it */

            } else if (fn->reason == NGX_HTTP_SINGLEFLIGHT_R_NOMEM) {
                /* the zone had no room for the header: as for a flight */
                ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NO_MEMORY;

            } else {
                ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED;
                (void) ngx_atomic_fetch_add(&ctx->zone->counters->not_shared,
                                            1);
            }

            ngx_http_singleflight_reader_alone(r, ctx, 0);
            return;
        }
    }
}


/* an orphaned flight: this request fetches it, or waits on who does */

static void
ngx_http_singleflight_reader_takeover(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t                     generation, wake;
    ngx_http_singleflight_node_t  *fn;

    fn = ctx->fn;

    if (r->method == NGX_HTTP_HEAD
        && fn->key[0] == NGX_HTTP_SINGLEFLIGHT_CLASS_GET)
    {
        /*
         * a HEAD request never fetches a GET flight (its fetch would have
         * no body for the others): it looks for a HEAD flight instead
         */
        ngx_http_singleflight_reader_rejoin(r, ctx);
        return;
    }

    if (!ngx_http_singleflight_flight_takeover(ctx->zone, fn, &generation,
                                               &wake, r->connection->log))
    {
        /* another follower was quicker: wait on its fetch */
        ngx_http_singleflight_reader_look(r, ctx);
        return;
    }

    ngx_http_singleflight_wait_wake(ctx->zone, fn, wake);

    ngx_http_singleflight_reader_promoted(ctx);

    ctx->host = 1;
    ctx->generation = generation;
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_PROMOTED;
    ctx->fetch = NULL;

    (void) ngx_atomic_fetch_add(&ctx->zone->counters->promotions, 1);

    if (ngx_http_singleflight_fetch_start(r, ctx, fn, generation)
        != NGX_OK)
    {
        ngx_http_singleflight_reader_unfetched(r, ctx, generation);
        ngx_http_singleflight_reader_alone(r, ctx, 0);
        return;
    }

    /* the promoted leader waits for its own fetch, without a timeout */

    ngx_http_singleflight_reader_look(r, ctx);
}


/*
 * A flight adrift: its fetching worker died mid-body, and this reader,
 * caught up with what was published, asks the origin for the rest
 * (singleflight_promote dead, singleflight_resume) unless another reader
 * was quicker.  When its fetch cannot start, the flight breaks off for
 * every reader, as it would have without the adoption.
 */

static void
ngx_http_singleflight_reader_adopt(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t                     generation, wake, adopted;
    ngx_http_singleflight_node_t  *fn;

    fn = ctx->fn;

    adopted = ngx_http_singleflight_flight_adopt(ctx->zone, fn, &generation,
                                                 &wake, r->connection->log);

    ngx_http_singleflight_wait_wake(ctx->zone, fn, wake);

    if (!adopted) {
        return;
    }

    ctx->host = 1;
    ctx->generation = generation;

    if (ngx_http_singleflight_fetch_adopt(r, ctx, fn, generation) == NGX_OK) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "singleflight could not ask for the rest of flight %uL",
                  fn->id);

    ngx_http_singleflight_reader_unfetched(r, ctx, generation);
}


/*
 * The fetch this request took the flight over to start did not start:
 * the flight loses it (orphaned again, or cut mid-body), and the request
 * lets go of its part as the fetch's host.
 */

static void
ngx_http_singleflight_reader_unfetched(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t generation)
{
    ngx_int_t                      how;
    ngx_http_singleflight_node_t  *fn;

    fn = ctx->fn;

    how = ngx_http_singleflight_flight_orphan(ctx->zone, fn, generation,
                                              r->connection->log);
    ngx_http_singleflight_wait_wake(ctx->zone, fn, how);

    how = ngx_http_singleflight_flight_unhost(ctx->zone, fn, generation,
                                              r->connection->log);
    ngx_http_singleflight_wait_wake(ctx->zone, fn, how);
}


/*
 * Is the flight's response one this reader cannot be sent: another
 * variant, or a Range nginx cannot cut from it?  Then the reader has
 * gone its own way, to another flight or upstream as without the
 * module, and this says 1.
 */

static ngx_uint_t
ngx_http_singleflight_reader_elsewhere(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, u_char *block)
{
    ngx_uint_t  creds;

    if (!ngx_http_singleflight_vary_match(r, block)) {

        /*
         * another variant: the flight of its own, at once, foreseen from
         * the names of this one (the header does not change: no lock)
         */

        (void) ngx_atomic_fetch_add(&ctx->zone->counters->vary_mismatches, 1);

        if (ctx->host || ngx_http_singleflight_vary_unfetchable(r, block)) {
            /*
             * the response varies on a header the fetch did not send as
             * this request does (Range, a conditional; for its own fetch,
             * CDN-Loop too): no flight can answer it, it goes upstream as
             * without the module
             */

            ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED;
            ngx_http_singleflight_reader_alone(r, ctx, 0);
            return 1;
        }

        ctx->predict = ngx_http_singleflight_vary_predict(r, block,
                                                          &ctx->predict_len);

        ngx_http_singleflight_reader_rejoin(r, ctx);
        return 1;
    }

    creds = ctx->host ? 0 : ngx_http_singleflight_reader_creds(ctx, block);

    if (creds) {
        /*
         * its credentials: no shared cache would give it this response,
         * it goes upstream on its own (_share.c); the key is marked for
         * requests with those credentials only
         */

        (void) ngx_atomic_fetch_add(&ctx->zone->counters->not_shared, 1);

        ngx_http_singleflight_flight_mark_creds(ctx->zone, ctx->fn, creds,
                                                ctx->conf->private_ttl);

        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED;
        ngx_http_singleflight_reader_alone(r, ctx, 0);
        return 1;
    }

    if (!ctx->range_sent && ngx_http_singleflight_store_unrangeable(r, block))
    {
        /*
         * its Range, on a response without a length: the origin would
         * have answered it, nginx cannot; it goes upstream on its own
         */

        if (!ctx->host) {
            (void) ngx_atomic_fetch_add(&ctx->zone->counters->not_shared, 1);
        }

        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED;
        ngx_http_singleflight_reader_alone(r, ctx, 0);
        return 1;
    }

    return 0;
}


/*
 * May a response go to a request with the reader's credentials?  0: yes;
 * else the credentials it may not go to (NGX_HTTP_SINGLEFLIGHT_CREDS_...)
 */

static ngx_uint_t
ngx_http_singleflight_reader_creds(ngx_http_singleflight_ctx_t *ctx,
    u_char *block)
{
    ngx_uint_t                      refused;
    ngx_http_singleflight_header_t  hdr;

    if (ctx->creds == 0) {
        return 0;
    }

    ngx_http_singleflight_store_parse(block, &hdr);

    refused = 0;

    if (!(hdr.flags & NGX_HTTP_SINGLEFLIGHT_H_COOKIE)) {
        refused |= NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE;
    }

    if (!(hdr.flags & NGX_HTTP_SINGLEFLIGHT_H_AUTH)) {
        refused |= NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH;
    }

    return ctx->creds & refused;
}


/* the header is there: this request's to take, or not */

static void
ngx_http_singleflight_reader_take(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t state)
{
    u_char                          *block;
    ngx_int_t                        rc;
    ngx_uint_t                       status;
    ngx_http_singleflight_node_t    *fn;
    ngx_http_singleflight_header_t   hdr;

    fn = ctx->fn;
    block = fn->store.header;

    if (ngx_http_singleflight_reader_elsewhere(r, ctx, block)) {
        return;
    }

    ngx_http_singleflight_wait_unpark(&ctx->waiter);

    ngx_http_singleflight_reader_waited(ctx);
    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_SENDING;

    ngx_http_singleflight_reader_timer(r, ctx);

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        ngx_http_singleflight_reader_end(r, ctx, rc);
        return;
    }

    if (ngx_http_singleflight_store_restore(r, block, ctx->range_sent)
        != NGX_OK
        || (!ctx->host
            && ngx_http_singleflight_store_upstream(r, block) != NGX_OK))
    {
        ngx_http_singleflight_reader_end(r, ctx,
                                         NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (!ctx->host) {
        (void) ngx_atomic_fetch_add(&ctx->zone->counters->served, 1);
    }

    ngx_http_singleflight_store_parse(block, &hdr);
    ctx->buffered = hdr.buffered;

    if (ctx->mirror != NULL) {
        ctx->redirects = hdr.moved.redirects;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight %s served from flight %uL, waited %M ms",
                   ctx->host ? "leader" : "follower", fn->id,
                   ctx->wait_time);

    ctx->header_sent = 1;

    status = r->headers_out.status;

    rc = ngx_http_send_header(r);

    if (ctx->host) {
        ngx_http_singleflight_fetch_header_out(ctx, r);
    }

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        ngx_http_singleflight_reader_end(r, ctx, rc);
        return;
    }

    ctx->until = ngx_http_singleflight_reader_until(r, ctx, status);

    ngx_http_singleflight_reader_pump(r, ctx);
}


/*
 * Where the reader's answer ends, when nginx's range filter cut one range
 * from the stored response ("status": the stored one, a 200): its last
 * byte, which the filter sends as the response's last (the offset and the
 * length it answers with, as for slice).  Once that went out the reader
 * is done, whatever the flight still fetches: its client goes on with its
 * connection, and a fetch nobody reads any more stops.  0: the end of the
 * body (several ranges, cut from one buffer, end with the body).
 */

static off_t
ngx_http_singleflight_reader_until(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t status)
{
    ngx_http_headers_out_t  *ho;

    ho = &r->headers_out;

    if (ctx->range_sent
        || status != NGX_HTTP_OK
        || ho->status != NGX_HTTP_PARTIAL_CONTENT
        || ho->content_range == NULL
        || ho->content_length_n <= 0
        || ho->content_offset < 0)
    {
        return 0;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight reader's range ends at %O of flight %uL",
                   ho->content_offset + ho->content_length_n, ctx->fn->id);

    return ho->content_offset + ho->content_length_n;
}


/* ------------------------------------------------------------ the body */

static void
ngx_http_singleflight_reader_pump(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    off_t                           len;
    ngx_int_t                       rc;
    ngx_uint_t                      state, go;
    ngx_atomic_uint_t               seq;
    ngx_http_singleflight_node_t   *fn;

    fn = ctx->fn;

    if (ngx_http_singleflight_reader_event(r, ctx) != NGX_OK) {
        return;
    }

    for (go = 0; go < NGX_HTTP_SINGLEFLIGHT_READ_GOES; go++) {

        if (ngx_http_singleflight_reader_flush(r, ctx) != NGX_OK) {
            return;
        }

        /* seq first: a change after it makes parking fail below */

        seq = ngx_http_singleflight_flight_seq(fn);
        state = ngx_http_singleflight_flight_state(fn);
        len = ngx_http_singleflight_flight_length(fn);

        if (ctx->cursor.offset < len) {
            if (ngx_http_singleflight_reader_send(r, ctx, len, state)
                != NGX_OK)
            {
                return;
            }

            if (state != NGX_HTTP_SINGLEFLIGHT_COMPLETE
                || ctx->cursor.offset < len)
            {
                continue;
            }
        }

        if (state == NGX_HTTP_SINGLEFLIGHT_COMPLETE) {
            /* everything went before the flight said it was complete */
            ctx->last_sent = 1;

            if (fn->store.trailers != NULL
                && ngx_http_singleflight_store_restore_trailers(r,
                                                          fn->store.trailers)
                   != NGX_OK)
            {
                ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
                return;
            }

            rc = ngx_http_send_special(r, NGX_HTTP_LAST);
            ngx_http_singleflight_reader_end(r, ctx, rc);
            return;
        }

        if (state != NGX_HTTP_SINGLEFLIGHT_STREAMING) {
            ngx_http_singleflight_reader_cut(r, ctx, len);
            return;
        }

        if (ngx_http_singleflight_flight_adrift(fn)) {
            /* its fetching worker died: this reader asks for the rest */
            ngx_http_singleflight_reader_adopt(r, ctx);
            continue;
        }

        rc = ngx_http_singleflight_reader_park(r, ctx, seq);

        if (rc == NGX_AGAIN) {
            continue;
        }

        if (rc == NGX_ERROR) {
            ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
        }

        return;
    }

    /* the others' turn; this one goes on at the next event */

    ngx_post_event(r->connection->write, &ngx_posted_events);
}


/*
 * What the write event that woke the reader means: NGX_OK when it is to
 * send, NGX_DONE when there is nothing to do (still parked, limit_rate)
 * or the request ended (send_timeout).
 */

static ngx_int_t
ngx_http_singleflight_reader_event(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_event_t       *wev;
    ngx_connection_t  *c;

    c = r->connection;
    wev = c->write;

    if (wev->timedout) {

        if (ctx->waiter.group != NULL) {
            /* parked: the timer only keeps the worker from exiting */
            wev->timedout = 0;
            ngx_add_timer(wev, NGX_HTTP_SINGLEFLIGHT_PARKED);
            return NGX_DONE;
        }

        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "client timed out");
        c->timedout = 1;
        ngx_http_singleflight_reader_end(r, ctx, NGX_HTTP_REQUEST_TIME_OUT);
        return NGX_DONE;
    }

    if (ctx->waiter.group != NULL && !ctx->woken && ctx->seen
        == ngx_http_singleflight_flight_seq(ctx->fn))
    {
        /* a write event of the connection while parked: nothing new */

        if (!wev->timer_set && ctx->phase == NGX_HTTP_SINGLEFLIGHT_RD_SENDING)
        {
            /* it was limit_rate's timer (reader_park() left it) */
            ngx_add_timer(wev, NGX_HTTP_SINGLEFLIGHT_PARKED);
        }

        return NGX_DONE;
    }

    ctx->woken = 0;

    if (wev->delayed) {
        /* limit_rate: its timer brings the next write event */
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
        }

        return NGX_DONE;
    }

    return NGX_OK;
}


/*
 * Does the client's socket hold what was written (the write filter, an
 * HTTP/2 stream, SSL), so that a write event will come?  SSL also keeps
 * the tail of a write that asked for no flush (the pieces of a buffered
 * response, as nginx's event pipe sends them) while the socket takes
 * more: that tail waits for the next write or the end, as without the
 * module, and no event comes for it (nor would an empty call through gzip
 * reach it).  A filter that gathers the whole body (image_filter) sets a
 * bit of its own, which only the last buffer clears.
 */

static ngx_uint_t
ngx_http_singleflight_reader_held(ngx_connection_t *c)
{
    return (c->buffered & (NGX_HTTP_WRITE_BUFFERED|NGX_HTTP_V2_BUFFERED))
           || ((c->buffered & NGX_SSL_BUFFERED) && !c->write->ready);
}


/*
 * What the filters hold goes first.  NGX_OK: nothing is left in them;
 * NGX_DONE: the request waits for its connection, or ended.
 */

static ngx_int_t
ngx_http_singleflight_reader_flush(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_connection_t  *c;

    c = r->connection;

    if (ctx->cursor.busy == NULL && !ngx_http_singleflight_reader_held(c)) {
        return NGX_OK;
    }

    if (ngx_http_singleflight_reader_output(r, ctx, NULL) == NGX_ERROR) {
        return NGX_DONE;
    }

    if (ctx->cursor.busy || ngx_http_singleflight_reader_held(c)
        || c->write->delayed)
    {
        ngx_http_singleflight_reader_wait_write(r, ctx);
        return NGX_DONE;
    }

    return NGX_OK;
}


/*
 * The stored body from the reader's offset up to "len" goes out; the end
 * of a range ends the request.  NGX_OK: on to the next; NGX_DONE: it
 * ended.  The end of the response goes right after, in a buffer of its
 * own, as nginx's upstream sends it: a filter that judges the body at its
 * end (ModSecurity) may drop the chain that carries it.  The last data is
 * not flushed: the end flushes it, in the same write.  The pieces of a
 * response nginx's upstream buffered are "recycled", as its event pipe
 * marks its buffers: the write filter sends them at once, but gzip ends
 * no block there, so the compressed bytes are those without the module.
 */

static ngx_int_t
ngx_http_singleflight_reader_send(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, off_t len, ngx_uint_t state)
{
    off_t         sent;
    ngx_int_t     rc;
    ngx_chain_t  *out, *cl;

    sent = ctx->cursor.offset;

    if (ctx->until && len >= ctx->until) {

        if (ctx->host && !ngx_http_singleflight_fetch_stops(ctx)) {
            /*
             * the response is being cached, or the client's abort
             * ignored: its fetch goes on whoever reads, and its leader
             * reads on too, so that the flight stays there for others
             */
            ctx->until = 0;

        } else {
            /* its answer ends there */
            len = ctx->until;
        }
    }

    out = ngx_http_singleflight_store_read(r, &ctx->cursor, len,
                                           NGX_HTTP_SINGLEFLIGHT_READ_SIZE);
    if (out == NGX_CHAIN_ERROR) {
        ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
        return NGX_DONE;
    }

    for (cl = out; cl->next; cl = cl->next) { /* void */ }

    if (state != NGX_HTTP_SINGLEFLIGHT_COMPLETE || ctx->cursor.offset < len) {
        if (ctx->buffered) {
            cl->buf->recycled = 1;

        } else {
            cl->buf->flush = 1;
        }
    }

    if (ctx->until && ctx->cursor.offset == ctx->until) {
        /* the range filter makes it the last buffer of the response */
        ctx->last_sent = 1;

    }

    if (!ctx->host) {
        (void) ngx_atomic_fetch_add(&ctx->zone->counters->bytes_shared,
                                    (ngx_atomic_int_t)
                                        (ctx->cursor.offset - sent));
    }

    rc = ngx_http_singleflight_reader_output(r, ctx, out);

    if (rc == NGX_ERROR) {
        return NGX_DONE;
    }

    if (ctx->last_sent) {
        ngx_http_singleflight_reader_end(r, ctx, rc);
        return NGX_DONE;
    }

    return NGX_OK;
}


/*
 * "out" (or nothing: what the filters hold) into the reader's filters,
 * its buffers kept for reuse; NGX_ERROR ends the request.
 */

static ngx_int_t
ngx_http_singleflight_reader_output(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_chain_t *out)
{
    ngx_int_t  rc;

    rc = ngx_http_output_filter(r, out);

    ngx_chain_update_chains(r->pool, &ctx->cursor.free, &ctx->cursor.busy,
                            &out,
                            (ngx_buf_tag_t) &ngx_http_singleflight_module);

    if (rc == NGX_ERROR) {
        ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
    }

    return rc;
}


/* the body broke off: this reader's response breaks off too */

static void
ngx_http_singleflight_reader_cut(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, off_t len)
{
    (void) ngx_atomic_fetch_add(&ctx->zone->counters->cut, 1);

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "singleflight flight %uL broke off after %O bytes",
                  ctx->fn->id, len);

    /* what it has goes out first, as nginx's upstream flushes it */
    r->keepalive = 0;
    (void) ngx_http_send_special(r, NGX_HTTP_FLUSH);

    ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
}


/* the client is slow: its write event brings the next go */

static void
ngx_http_singleflight_reader_wait_write(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    if (ngx_http_singleflight_reader_arm(r) != NGX_OK) {
        ngx_http_singleflight_reader_end(r, ctx, NGX_ERROR);
    }
}


/*
 * What the client's connection could not take yet: its next write event
 * goes on, within send_timeout, as nginx's own writers arm it.  Also from
 * a fetch in direct mode, whose writes reach the leader's connection
 * without the leader's handler on the stack.
 */

static ngx_int_t
ngx_http_singleflight_reader_arm(ngx_http_request_t *r)
{
    ngx_event_t               *wev;
    ngx_http_core_loc_conf_t  *clcf;

    wev = r->connection->write;
    clcf = ngx_http_get_module_loc_conf(r->main, ngx_http_core_module);

    if (!wev->delayed) {
        ngx_add_timer(wev, clcf->send_timeout);
    }

    return ngx_handle_write_event(wev, clcf->send_lowat);
}


/* caught up with the store: wait for more */

static ngx_int_t
ngx_http_singleflight_reader_park(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_atomic_uint_t seq)
{
    ngx_int_t     rc;
    ngx_event_t  *wev;

    if (ctx->waiter.group != NULL) {
        if (ctx->seen == seq) {
            return NGX_OK;
        }

        ngx_http_singleflight_wait_unpark(&ctx->waiter);
    }

    ctx->seen = seq;

    wev = r->connection->write;

    rc = ngx_http_singleflight_wait_park(ctx->zone, ctx->fn, seq,
                                         &ctx->waiter);

    if (rc == NGX_OK && ctx->phase == NGX_HTTP_SINGLEFLIGHT_RD_SENDING
        && !wev->delayed)
    {
        /*
         * the origin's pace, not the client's: no send_timeout now; but
         * limit_rate's timer stays, or the client would wait for this one
         * once the flight has more
         */
        ngx_add_timer(wev, NGX_HTTP_SINGLEFLIGHT_PARKED);
    }

    if (rc == NGX_ERROR) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "singleflight request could not wait for flight %uL",
                      ctx->fn->id);
    }

    return rc;
}


/* ------------------------------------------------------------ direct */

/*
 * Direct mode: the leader's own fetch writes to it (_fetch.c); its
 * connection's write events let the fetch go on once the client took
 * what was written.
 */

static void
ngx_http_singleflight_reader_direct(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t          rc;
    ngx_event_t       *wev;
    ngx_connection_t  *c;

    c = r->connection;
    wev = c->write;

    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "client timed out");
        c->timedout = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    if (wev->delayed) {
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    /*
     * postponed: its own filters' subrequests (SSI includes) wrote, and
     * this is the wake-up of the last to end; what waited behind them
     * goes out now, as nginx's writer would send it
     */

    if (r->buffered || c->buffered || r->postponed) {
        if (ngx_http_output_filter(r, NULL) == NGX_ERROR) {
            ngx_http_finalize_request(r, NGX_ERROR);
            return;
        }
    }

    rc = ngx_http_singleflight_fetch_pump(ctx);

    if (rc == NGX_DONE) {
        ngx_http_singleflight_reader_end(r, ctx, NGX_OK);
        return;
    }

    if (rc == NGX_ERROR || rc > NGX_OK) {
        /* the fetch ended without its end, the response is cut; or a 416 */
        ngx_http_singleflight_reader_end(r, ctx, rc);
        return;
    }

    if (r->buffered || c->buffered) {
        ngx_http_singleflight_reader_wait_write(r, ctx);
    }
}


/* ------------------------------------------------------------ outcomes */

/* the flight failed */

static void
ngx_http_singleflight_reader_failed(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t                     status, reason;
    ngx_http_singleflight_node_t  *fn;

    fn = ctx->fn;
    reason = fn->reason;

    status = fn->status ? fn->status : ctx->conf->error_status;

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_CUT && ctx->host
        && fn->store.header != NULL)
    {
        /*
         * its own fetch's response broke off: what came of it, then its
         * connection closed, as nginx gives a cut upstream response
         */
        ngx_http_singleflight_reader_take(r, ctx,
                                          NGX_HTTP_SINGLEFLIGHT_FAILED);
        return;
    }

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_CUT
        || reason == NGX_HTTP_SINGLEFLIGHT_R_ABANDONED)
    {
        /*
         * its body broke off before this request had any of it: by the
         * promote rules ("error"), it looks for a flight again while its
         * tries last; then it gets the 502 nginx would have made
         */

        status = NGX_HTTP_BAD_GATEWAY;

        if (ngx_http_singleflight_reader_retry(r, ctx,
                                         NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR))
        {
            return;
        }
    }

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_DEAD && fn->store.header != NULL
        && ngx_http_singleflight_reader_retry(r, ctx,
                                         NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEAD))
    {
        /*
         * its fetching worker died after the header, before this request
         * had any of the response ("dead"); one that dies before the
         * header was taken over, or failed for good, by flight.c
         */
        return;
    }

    if (reason != NGX_HTTP_SINGLEFLIGHT_R_STATUS
        && (!ctx->host || reason == NGX_HTTP_SINGLEFLIGHT_R_CUT))
    {
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_ERROR;
        (void) ngx_atomic_fetch_add(&ctx->zone->counters->errors, 1);
    }

    ngx_http_singleflight_reader_waited(ctx);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight flight %uL failed, the request gets %ui",
                   fn->id, status);

    if (fn->status_conf != NULL && status == fn->status) {
        /* the fetch's status, with the error pages of where it failed */
        ngx_http_singleflight_store_location(r, fn->status_conf);

        if (fn->store.failure != NULL) {
            /* without memory for them, it keeps its own: an error anyway */
            (void) ngx_http_singleflight_store_restore_failure(r,
                                                        fn->store.failure);
        }
    }

    ngx_http_singleflight_reader_end(r, ctx, status);
}


/*
 * A follower's wait for its header is over, however it ended: answered
 * (its response, its error status), timed out, or sent on its own way
 * (the response was not for sharing); recorded once per wait.
 */

static void
ngx_http_singleflight_reader_waited(ngx_http_singleflight_ctx_t *ctx)
{
    if (ctx->waited) {
        return;
    }

    ctx->waited = 1;
    ctx->wait_time = ngx_current_msec - ctx->wait_start;

    if (!ctx->host && !ctx->header_sent) {
        ngx_http_singleflight_stats_observe(&ctx->zone->counters->wait,
                                            (ngx_msec_int_t) ctx->wait_time);
    }
}


/*
 * Its flight's first request was answered from the cache (proxy_cache
 * and the like): so will this one be, on its own way.  A cache hit is not
 * the module's: no status ($singleflight_status empty), not counted, its
 * short wait for that header not in the histogram, as a request the
 * module never saw.
 */

static void
ngx_http_singleflight_reader_cached(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NONE;
    ctx->waited = 1;
    ctx->wait_time = ngx_current_msec - ctx->wait_start;

    ngx_http_singleflight_reader_alone(r, ctx, 0);
}


/*
 * A follower about to fetch its flight itself (promoted): its wait as a
 * follower ends here, as one sent upstream on its own, and is recorded
 * (its wait for its own fetch's header is a leader's, not recorded).
 */

static void
ngx_http_singleflight_reader_promoted(ngx_http_singleflight_ctx_t *ctx)
{
    if (ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER && !ctx->host
        && !ctx->waited && ctx->wait_start)
    {
        ngx_http_singleflight_stats_observe(&ctx->zone->counters->wait,
                                 (ngx_msec_int_t) (ngx_current_msec
                                                   - ctx->wait_start));
    }
}


/* singleflight_timeout: on its own, or its status; the flight goes on */

static void
ngx_http_singleflight_reader_timeout(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_TIMEOUT;
    ngx_http_singleflight_reader_waited(ctx);

    (void) ngx_atomic_fetch_add(&ctx->zone->counters->timeouts, 1);

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight follower timed out");

    ngx_http_singleflight_reader_alone(r, ctx, ctx->conf->timeout_status);
}


/* a reader that cannot take this flight's response looks for another */

static void
ngx_http_singleflight_reader_rejoin(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t  rc;

    ngx_http_singleflight_reader_leave(r, ctx);

    ctx->host = 0;
    ctx->fetch = NULL;

    if (++ctx->rejoins > NGX_HTTP_SINGLEFLIGHT_REJOINS) {
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED;
        ngx_http_singleflight_reader_alone(r, ctx, 0);
        return;
    }

    rc = ngx_http_singleflight_reader_join(r, ctx);

    if (rc == NGX_DONE) {
        return;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_singleflight_reader_alone(r, ctx, 0);
        return;
    }

    ngx_http_singleflight_reader_end(r, ctx, rc);
}


/*
 * A reader that had nothing of a failed flight looks for a flight again,
 * if "condition" is one of singleflight_promote's and its tries last
 * (counted per request).  0: it does not.
 */

static ngx_uint_t
ngx_http_singleflight_reader_retry(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t condition)
{
    if (!(ctx->conf->promote & condition)
        || ctx->cut_retries >= ctx->conf->promote_tries)
    {
        return 0;
    }

    ctx->cut_retries++;
    ngx_http_singleflight_reader_rejoin(r, ctx);

    return 1;
}


/* on its own way, as if the module were off: or answered with "status" */

static void
ngx_http_singleflight_reader_alone(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t status)
{
    if (!ctx->host && ctx->wait_start) {
        /* a follower refused after its wait: the wait was all the same */
        ngx_http_singleflight_reader_waited(ctx);
    }

    ngx_http_singleflight_reader_leave(r, ctx);

    if (status) {
        ngx_http_singleflight_reader_end(r, ctx, status);
        return;
    }

    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_ALONE;

    /* on through the phases: the mirror module's handler is among them */
    ngx_http_singleflight_reader_mirror_skip(r, ctx);

    if (ctx->host) {
        /*
         * its fetches' upstreams were lent for its variables: its own
         * content handler starts with those of where it came from only,
         * as without the module
         */

        if (r->upstream != NULL && r->upstream->cleanup == NULL) {
            r->upstream = NULL;
        }

        r->upstream_states = ngx_http_singleflight_fetch_states_before(ctx);
    }

    if (r->connection->write->timer_set) {
        ngx_del_timer(r->connection->write);
    }

    ngx_http_singleflight_continue(r);
}


/*
 * The request is answered, or its client gone.  A request whose fetch
 * still runs for others is not terminated with its client: it lets go
 * of its own reference only, and its subrequest's keeps it until the
 * fetch is over.
 */

static void
ngx_http_singleflight_reader_end(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_int_t rc)
{
    ngx_uint_t         direct;
    ngx_connection_t  *c;

    c = r->connection;

    if (r->uri_changes != ctx->uri_changes) {
        ngx_http_singleflight_reader_redirected(r, ctx);
        return;
    }

    /* its fetch's response was its own: nobody else reads it */
    direct = (ctx->phase == NGX_HTTP_SINGLEFLIGHT_RD_DIRECT);

    if (ctx->phase == NGX_HTTP_SINGLEFLIGHT_RD_WAITING) {
        /* its client gone (or an error) while it waited: a wait too */
        ngx_http_singleflight_reader_waited(ctx);
    }

    ngx_http_singleflight_reader_leave(r, ctx);

    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_DONE;

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_request_empty_handler;

    if (c->write->timer_set && !c->write->delayed) {
        /* a limit_rate delay's timer sends the rest (ngx_http_writer) */
        ngx_del_timer(c->write);
    }

    if ((rc == NGX_ERROR || rc == NGX_HTTP_CLIENT_CLOSED_REQUEST
         || rc == NGX_HTTP_REQUEST_TIME_OUT || c->error)
        && ngx_http_singleflight_fetch_running(ctx))
    {
        if (!ctx->header_sent) {
            r->headers_out.status = NGX_HTTP_CLIENT_CLOSED_REQUEST;
        }

        if (c->read->timer_set) {
            ngx_del_timer(c->read);
        }

        /*
         * its response is cut: once the fetch lets the request go, the
         * connection is closed as nginx closes it on an error or a
         * send_timeout, never kept alive for a next request
         */

        r->keepalive = 0;
        r->lingering_close = 0;
        c->read->eof = 1;

        if (rc == NGX_HTTP_REQUEST_TIME_OUT) {
            c->timedout = 1;
        }

        if (!direct) {
            r->read_event_handler = ngx_http_singleflight_reader_gone;
            r->write_event_handler = ngx_http_singleflight_reader_gone;
            ngx_http_singleflight_reader_gone(r);
        }

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "singleflight leader's client is gone, "
                       "its fetch goes on");

        ngx_http_finalize_request(r, NGX_DONE);
        return;
    }

    ngx_http_finalize_request(r, rc);
}


/*
 * A leader whose client is gone while its fetch goes on for others.
 * nginx ends a request whose connection has an error as soon as a
 * subrequest of it ends (a mirror), and the fetch with it: the error
 * stays cleared (HTTP/2 sets it again when the whole connection goes
 * after the stream).  Nothing more is written to this client, and its
 * connection is closed by its read->eof.  Not with subrequests whose
 * output goes to the client in order (SSI includes): they would write to
 * it.
 */

static void
ngx_http_singleflight_reader_gone(ngx_http_request_t *r)
{
    ngx_http_block_reading(r);

    if (r == r->main && r->postponed == NULL) {
        r->connection->error = 0;
    }
}


#if (NGX_HTTP_V3)

/*
 * An HTTP/3 request's events.  When its QUIC connection closes (the
 * client's, or its idle timeout), nginx ends each of its streams'
 * requests before any handler of theirs runs (ngx_http_request_handler()
 * on c->close).  While others read what this request fetches (its own
 * upstream response, or its fetch's), the close is as its client gone:
 * the response is read on for them, as for an HTTP/1.1 or HTTP/2 client
 * gone (the QUIC connection waits for its streams).
 */

static void
ngx_http_singleflight_reader_quic_hook(ngx_connection_t *c)
{
    if (c->quic == NULL || c->read->handler != c->write->handler
        || c->read->handler == ngx_http_singleflight_reader_quic
        || (ngx_http_singleflight_quic_next != NULL
            && ngx_http_singleflight_quic_next != c->read->handler))
    {
        return;
    }

    ngx_http_singleflight_quic_next = c->read->handler;
    c->read->handler = ngx_http_singleflight_reader_quic;
    c->write->handler = ngx_http_singleflight_reader_quic;
}


static void
ngx_http_singleflight_reader_quic(ngx_event_t *ev)
{
    ngx_connection_t             *c;
    ngx_http_request_t           *r;
    ngx_http_singleflight_ctx_t  *ctx;

    c = ev->data;
    r = c->data;

    if (c->close) {
        ctx = ngx_http_singleflight_get_ctx(r->main);

        if (ctx != NULL
            && (ngx_http_singleflight_tee_storing(ctx)
                || (ngx_http_singleflight_fetch_running(ctx)
                    && ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_DIRECT)))
        {
            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                           "singleflight QUIC connection closed, "
                           "its stream is read on for others");
            c->close = 0;
            c->error = 1;
        }
    }

    ngx_http_singleflight_quic_next(ev);
}

#endif


/*
 * A filter refused the response (a 412 for If-Match, a 416, an
 * image_filter 415) and error_page sent the request to another location
 * (the only way a reader's URI changes): that location answers it and
 * nginx ends it, as after its own upstream.  The reader lets go of the
 * flight and of its reference, and touches nothing else of the request.
 */

static void
ngx_http_singleflight_reader_redirected(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_singleflight_reader_leave(r, ctx);

    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_DONE;

    if (ngx_http_singleflight_fetch_running(ctx)) {
        /* it waits for the fetch (see reader_end()): never kept alive */
        r->keepalive = 0;
        r->lingering_close = 0;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight reader answered by its error_page");

    ngx_http_finalize_request(r, NGX_DONE);
}


/*
 * A filter refused a leader's response and nginx answers it instead (a
 * special response, an error_page): that answer's header is on its way.
 * nginx ends a request so answered as an error (filter_finalize: once
 * the answer is sent, it terminates the request), and terminating ends
 * every upstream of the request, the fetch others read included.  While
 * its fetch runs for others, the leader's answer ends as any: the fetch
 * goes on.  A direct response's fetch is the leader's alone, and ends
 * with it, as without the module.
 */

void
ngx_http_singleflight_reader_refused(ngx_http_request_t *r)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx != NULL && ctx->host
        && ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_DIRECT
        && ngx_http_singleflight_fetch_running(ctx))
    {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight leader refused, its fetch goes on");

        r->filter_finalize = 0;
    }
}


/* the request reads the flight no more */

static void
ngx_http_singleflight_reader_leave(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t                      how;
    ngx_uint_t                     keep;
    ngx_http_singleflight_node_t  *fn;

    ngx_http_singleflight_wait_unpark(&ctx->waiter);

    fn = ctx->fn;

    if (!ctx->counted || fn == NULL) {
        return;
    }

    ctx->counted = 0;

    /* for its log: what its flight's fetch went through */
    ctx->resumes = fn->resumes;
    ctx->was_hedged = fn->hedged;

    /*
     * what it sent may point into the zone until the request goes; a
     * direct response came from the fetch's own buffers, never the zone
     */
    keep = ctx->header_sent && ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_DIRECT;

    how = ngx_http_singleflight_flight_leave(ctx->zone, fn, ctx->host, keep,
                                             r->connection->log);
    ngx_http_singleflight_wait_wake(ctx->zone, fn, how);

    if (ctx->fetches != NULL) {
        /* its fetch goes on for the others, or stops once nobody reads */
        ngx_http_singleflight_fetch_host_left(ctx, fn);
    }

    if (!keep) {
        ctx->fn = NULL;
        ctx->cursor.fn = NULL;
    }
}


/*
 * Its direct response's fetch is over: the leader, the flight's only
 * reader, lets go of the flight with the fetch, in one locked step.
 * NGX_DECLINED: it is no such reader any more (gone, or cut off), and the
 * fetch lets go alone.
 */

static ngx_int_t
ngx_http_singleflight_reader_direct_done(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation)
{
    ngx_int_t  how;

    if (!ctx->counted || !ctx->host || ctx->fn != fn
        || ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_DIRECT)
    {
        return NGX_DECLINED;
    }

    ctx->counted = 0;

    /* for its log, as reader_leave() keeps them */
    ctx->resumes = fn->resumes;
    ctx->was_hedged = fn->hedged;

    how = ngx_http_singleflight_flight_end_direct(ctx->zone, fn, generation,
                                             ctx->request->connection->log);
    ngx_http_singleflight_wait_wake(ctx->zone, fn, how);

    ctx->fn = NULL;
    ctx->cursor.fn = NULL;

    return NGX_OK;
}


/* on to the next precontent handler and the content handler */

static void
ngx_http_singleflight_continue(ngx_http_request_t *r)
{
    if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    r->phase_handler++;
    ngx_http_core_run_phases(r);
}


/* ------------------------------------------------------------ mirror */

/*
 * nginx's mirror module makes its subrequests in the precontent phase,
 * after this module's handler, which holds a request it collapses: such
 * a request never reaches it.  So the module makes a request's mirrors
 * itself when it joins a flight, before it waits, as the mirror module
 * would have made them before the location's content handler ran.  A
 * request that goes on through the phases after all (reader_alone(), or
 * a join that declines) passes the mirror module's handler with its
 * mirrors hidden: made once, not twice.
 */

void
ngx_http_singleflight_reader_mirror_join(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_singleflight_mirror_conf_t  *mcf;
    ngx_http_singleflight_main_conf_t    *smcf;

    ctx->mirror = NULL;
    ctx->redirects = 0;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    if (smcf->mirror_conf == NGX_ERROR) {
        return;
    }

    mcf = r->loc_conf[smcf->mirror_conf];

    if (mcf->mirror == NULL) {
        return;
    }

    ngx_http_singleflight_mirror_make(r, mcf);

    ctx->mirror = mcf;
    ngx_http_singleflight_mirror_made = 1;
}


/*
 * The request made its mirrors and goes on through the phases: the
 * mirror module's handler finds none in the request's copy of its
 * location's configuration.  A later redirect takes the configuration
 * of the location it goes to, and that location's mirrors, as without
 * this module.
 */

void
ngx_http_singleflight_reader_mirror_skip(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    void                               **lc;
    ngx_http_singleflight_main_conf_t   *smcf;

    static ngx_http_singleflight_mirror_conf_t  none;

    if (ctx->mirror == NULL) {
        return;
    }

    ctx->mirror = NULL;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    lc = ngx_palloc(r->pool, ngx_http_max_module * sizeof(void *));
    if (lc == NULL) {
        /* mirrored twice rather than answered with an error */
        return;
    }

    ngx_memcpy(lc, r->loc_conf, ngx_http_max_module * sizeof(void *));
    lc[smcf->mirror_conf] = &none;

    r->loc_conf = lc;
}


/*
 * A collapsed request's response header goes out: for each internal
 * redirect (or rewrite "last") the fetch took, which the request would
 * have taken too, the mirrors of the location where the response was
 * made, as the mirror module would have made them on each pass through
 * the phases.
 */

void
ngx_http_singleflight_reader_mirror(ngx_http_request_t *r)
{
    ngx_uint_t                            n;
    ngx_http_singleflight_ctx_t          *ctx;
    ngx_http_singleflight_mirror_conf_t  *mcf;
    ngx_http_singleflight_main_conf_t    *smcf;

    if (!ngx_http_singleflight_mirror_made) {
        return;
    }

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx == NULL || ctx->mirror == NULL) {
        return;
    }

    ctx->mirror = NULL;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);
    mcf = r->loc_conf[smcf->mirror_conf];

    for (n = 0; n < ctx->redirects && mcf->mirror != NULL; n++) {
        ngx_http_singleflight_mirror_make(r, mcf);
    }
}


/* the mirror module's subrequests, as it makes them */

static void
ngx_http_singleflight_mirror_make(ngx_http_request_t *r,
    ngx_http_singleflight_mirror_conf_t *mcf)
{
    ngx_str_t           *name;
    ngx_uint_t           i;
    ngx_http_request_t  *sr;

    name = mcf->mirror->elts;

    for (i = 0; i < mcf->mirror->nelts; i++) {
        if (ngx_http_subrequest(r, &name[i], &r->args, &sr, NULL,
                                NGX_HTTP_SUBREQUEST_BACKGROUND)
            != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "singleflight could not mirror to \"%V\"",
                          &name[i]);
            return;
        }

        sr->header_only = 1;
        sr->method = r->method;
        sr->method_name = r->method_name;

        if (mcf->request_body) {
            /* the body this module read for the request's key */
            r->preserve_body = 1;

        } else {
            sr->request_body = NULL;
        }
    }
}
