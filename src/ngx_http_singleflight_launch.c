/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The launch: a fetch's subrequest started, and started again.
 *
 * A flight's fetch is a subrequest of the request that hosts it, made as
 * a clone of it (_clone.c), on a connection of its own (_fake.c), with a
 * store writer (_store.c) and events to hear of its flight (_capture.c).
 * Besides the first, a flight may have two more kinds of fetch, both
 * started here and both invisible to its readers:
 *
 *   - a hedge (singleflight_hedge): when the first has no header after
 *     the delay, the same request once more; the first header of the
 *     two wins, the other fetch stops unread;
 *   - a resume (singleflight_resume): when a response breaks off before
 *     its end, a fetch that asks for the rest by Range (or for all of it
 *     again, compared with what is stored) and takes the broken one's
 *     place.
 *
 * Which fetch a flight's response comes from, and what it does with its
 * header, is decided above (_fetch.c).
 */


#include "ngx_http_singleflight_launch.h"
#include "ngx_http_singleflight_fake.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_capture.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_stats.h"


static ngx_http_singleflight_fetch_t *ngx_http_singleflight_launch_alloc(
    ngx_http_request_t *r, ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation);
static ngx_int_t ngx_http_singleflight_launch_request(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_singleflight_fetch_t *prev,
    ngx_http_singleflight_request_headers_t *rh);
static void ngx_http_singleflight_launch_state(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_singleflight_fetch_t *prev);
static ngx_int_t ngx_http_singleflight_launch_content(ngx_http_request_t *r);
static void ngx_http_singleflight_launch_hedge_arm(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_launch_hedge(ngx_event_t *ev);
static ngx_int_t ngx_http_singleflight_launch_refetched(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);


static ngx_http_post_subrequest_pt  ngx_http_singleflight_launch_done;


/* what ends every fetch's subrequest (_fetch.c) */

void
ngx_http_singleflight_launch_init(ngx_http_post_subrequest_pt done)
{
    ngx_http_singleflight_launch_done = done;
}


/* ------------------------------------------------------------ starting */

/* a fetch; with "prev", one that resumes prev's broken response */

ngx_int_t
ngx_http_singleflight_launch_new(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_http_singleflight_fetch_t *prev)
{
    ngx_uint_t                                again;
    ngx_pool_t                               *pool;
    ngx_http_request_t                       *sr;
    ngx_http_singleflight_fake_t             *fake;
    ngx_http_singleflight_fetch_t            *fetch, *f;
    ngx_http_singleflight_request_headers_t   rh;

    again = 0;

    for (f = ctx->fetches; f; f = f->next) {
        /*
         * a fetch made again in this location, after one that ended (not
         * a hedge beside a running one, nor after a redirect)
         */
        again |= (f->vars.pass == r->uri_changes && f->finished);
    }

    fetch = ngx_http_singleflight_launch_alloc(r, ctx, fn, generation);
    if (fetch == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_singleflight_launch_request(fetch, prev, &rh) != NGX_OK) {
        goto failed;
    }

    fake = ngx_http_singleflight_fake_get(r);
    if (fake == NULL) {
        goto failed;
    }

    fetch->fake = fake;

    fetch->ps.handler = ngx_http_singleflight_launch_done;
    fetch->ps.data = fetch;

    pool = ngx_http_singleflight_fake_pool(r, ctx);
    if (pool == NULL) {
        goto failed;
    }

    sr = ngx_http_singleflight_clone_subrequest(r, pool, &fetch->ps,
                                                &fetch->begin,
                                                prev ? &prev->begin : NULL);
    if (sr == NULL) {
        goto failed;
    }

    /*
     * posted already, it runs once the current event is handled; nothing
     * below can fail, so it never runs half set up
     */

    fetch->sr = sr;
    fetch->resuming = (prev != NULL);

    ngx_http_singleflight_clone_states_seed(r, sr, &fetch->vars,
                                            again || prev != NULL);

    if (sr->content_handler != NULL) {
        /* as its own request's, for a stale cache entry: launch_content() */
        sr->content_handler = ngx_http_singleflight_launch_content;
    }

    fake->c.data = sr;
    fake->log_ctx.request = sr;
    fake->log_ctx.current_request = sr;

    sr->connection = &fake->c;
    sr->discard_body = 0;

    ngx_http_singleflight_clone_headers_set(sr, &rh);

    if (rh.stripped || prev != NULL) {
        /* the subrequest's value of a header variable may differ */
        ngx_http_singleflight_clone_variables(r, sr);
    }

    ngx_http_singleflight_launch_state(fetch, prev);

    ngx_http_singleflight_capture_listen(fetch);

    ctx->fetch = fetch;

    if (prev == NULL) {
        ngx_http_singleflight_launch_hedge_arm(fetch);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight fetch of flight %uL, generation %ui: "
                   "\"%V\"", fn->id, generation, &r->uri);

    return NGX_OK;

failed:

    if (fetch != NULL) {
        fetch->held = 0;

        if (fetch->fake) {
            ngx_http_singleflight_fake_free(fetch->fake);
            fetch->fake = NULL;
        }
    }

    return NGX_ERROR;
}


/* a fetch of the host request "r", one of its context's fetches */

static ngx_http_singleflight_fetch_t *
ngx_http_singleflight_launch_alloc(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation)
{
    ngx_http_singleflight_fetch_t  *fetch, **fp;

    fetch = ngx_pcalloc(r->pool, sizeof(ngx_http_singleflight_fetch_t));
    if (fetch == NULL) {
        return NULL;
    }

    /* at the end of the host's list: one fetch, rarely two or three */

    fp = &ctx->fetches;

    while (*fp) {
        fp = &(*fp)->next;
    }

    *fp = fetch;

    fetch->host = r;
    fetch->ctx = ctx;
    fetch->zone = ctx->zone;
    fetch->fn = fn;
    fetch->generation = generation;
    fetch->held = 1;

    return fetch;
}


/*
 * The fetch's request headers; a resuming fetch's ask for the rest of
 * prev's response.
 */

static ngx_int_t
ngx_http_singleflight_launch_request(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_singleflight_fetch_t *prev,
    ngx_http_singleflight_request_headers_t *rh)
{
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = fetch->ctx->conf;

    rh->range = NULL;
    rh->if_range = NULL;

    if (fetch->ctx->range_sent) {
        /* a far or bounded range's flight: the origin answers that Range */
        rh->range = fetch->host->headers_in.range;
    }

    if (ngx_http_singleflight_clone_headers(fetch->host, rh,
                                            fetch->ctx->range_sent)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (prev == NULL) {
        /* a range flight's answer is not resumed: its Range is the request's */
        fetch->resume.tries = (conf->resume && !fetch->ctx->range_sent)
                              ? conf->resume_tries : 0;
        return NGX_OK;
    }

    fetch->resume = prev->resume;
    fetch->resume.tries--;
    fetch->resume.waiting = 1;
    fetch->resume.from = prev->direct ? prev->sent : prev->writer.stored;

    if (fetch->resume.whole) {
        /* all of it again, as the first fetch asked for it */
        return NGX_OK;
    }

    return ngx_http_singleflight_resume_headers(&fetch->resume, rh,
                                                fetch->host->pool);
}


/* its store writer (prev's, to go on where it stopped), its events */

static void
ngx_http_singleflight_launch_state(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_singleflight_fetch_t *prev)
{
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = fetch->ctx->conf;

    if (prev != NULL) {
        /* the rest goes where the first bytes went */
        fetch->writer = prev->writer;
        fetch->direct = prev->direct;
        fetch->sent = prev->sent;
        fetch->length = prev->length;

        if (prev->sr != NULL && fetch->host->upstream != NULL
            && (fetch->host->upstream == prev->vars.lent
                || fetch->host->upstream == prev->sr->upstream))
        {
            /* the leader's upstream is still the first fetch's: this
             * one's upstreams follow it (clone_upstream_vars()) */
            fetch->vars.lent = fetch->host->upstream;
        }

    } else {
        fetch->writer.zone = fetch->zone;
        fetch->writer.fn = fetch->fn;
        fetch->writer.memory = conf->memory;
        fetch->writer.length = -1;
        fetch->writer.temp_path = conf->temp_path;
        fetch->writer.pool = fetch->host->pool;
    }

    fetch->writer.log = &fetch->fake->log;

    ngx_http_singleflight_capture_events(fetch);
}


/*
 * The fetch's content handler (proxy_pass, fastcgi_pass, ...) runs as for
 * the request it was made for.  nginx serves no stale cache entry to a
 * background subrequest (proxy_cache_use_stale updating,
 * proxy_cache_background_update, stale-while-revalidate): the fetch is
 * none while its handler looks in the cache.  Whatever ends the fetch,
 * nginx calls its post_subrequest handler (fetch_done()) first, which
 * makes it one again before nginx finalizes a subrequest by that flag.
 */

static ngx_int_t
ngx_http_singleflight_launch_content(ngx_http_request_t *r)
{
    ngx_int_t                       rc;
    ngx_http_singleflight_fetch_t  *fetch;

    fetch = r->post_subrequest->data;

    r->content_handler = fetch->begin.content_handler;
    r->background = 0;

    rc = r->content_handler(r);

    r->background = 1;

    return rc;
}


/* ------------------------------------------------------------ hedging */

/*
 * singleflight_hedge: a first fetch of a GET or HEAD (not a resume, not a
 * hedge) gets a timer; with "auto", at the p95 of the zone's times to a
 * header, never below the floor, and only once 20 are known.
 */

static void
ngx_http_singleflight_launch_hedge_arm(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_msec_t                         delay;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = fetch->ctx->conf;

    if (conf->hedge == 0 || fetch->ctx->hedged
        || !(fetch->host->method & (NGX_HTTP_GET|NGX_HTTP_HEAD)))
    {
        return;
    }

    delay = conf->hedge;

    if (conf->hedge_auto) {
        delay = ngx_http_singleflight_stats_percentile(
                                      &fetch->zone->counters->header, 95, 20);
        if (delay == 0) {
            return;
        }

        delay = ngx_max(delay, conf->hedge);
    }

    fetch->hedge_ev.handler = ngx_http_singleflight_launch_hedge;
    fetch->hedge_ev.data = fetch;
    fetch->hedge_ev.log = &fetch->fake->log;
    fetch->hedge_ev.cancelable = 1;

    ngx_add_timer(&fetch->hedge_ev, delay);
}


/* no header yet: the same request once more, for the whole flight */

static void
ngx_http_singleflight_launch_hedge(ngx_event_t *ev)
{
    ngx_http_singleflight_fetch_t  *fetch = ev->data;

    ngx_http_request_t             *host;
    ngx_http_singleflight_ctx_t    *ctx;
    ngx_http_singleflight_fetch_t  *hedge;

    ctx = fetch->ctx;
    host = fetch->host;

    if (fetch->header || fetch->finished || fetch->stopping
        || fetch->partner || ctx->hedged || ctx->fetch != fetch)
    {
        return;
    }

    if (ngx_http_singleflight_flight_hedge(fetch->zone, fetch->fn,
                                           fetch->generation)
        != NGX_OK)
    {
        return;
    }

    ctx->hedged = 1;

    if (ngx_http_singleflight_launch_new(host, ctx, fetch->fn,
                                        fetch->generation, NULL)
        != NGX_OK)
    {
        ctx->fetch = fetch;
        ngx_http_singleflight_capture_tell(fetch,
                        ngx_http_singleflight_flight_release(fetch->zone,
                                                   fetch->fn, ev->log));
        return;
    }

    hedge = ctx->fetch;
    hedge->hedge = 1;
    hedge->partner = fetch;
    fetch->partner = hedge;

    (void) ngx_atomic_fetch_add(&fetch->zone->counters->hedges, 1);

    ngx_log_error(NGX_LOG_INFO, ev->log, 0,
                  "singleflight flight %uL has no header after %M ms, "
                  "fetching it once more (hedge)", fetch->fn->id,
                  ngx_current_msec - fetch->fn->start);

    /* a subrequest runs from its parent's posted requests */
    ngx_http_run_posted_requests(host->connection);
}


/* the first header of the two: the other fetch stops, unread */

void
ngx_http_singleflight_launch_won(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_http_singleflight_fetch_t  *loser;

    loser = fetch->partner;

    fetch->partner = NULL;
    loser->partner = NULL;
    loser->lost = 1;

    if (loser->hedge_ev.timer_set) {
        ngx_del_timer(&loser->hedge_ev);
    }

    fetch->ctx->fetch = fetch;

    if (fetch->hedge) {
        (void) ngx_atomic_fetch_add(&fetch->zone->counters->hedge_wins, 1);
    }

    ngx_log_error(NGX_LOG_INFO, fetch->sr->connection->log, 0,
                  "singleflight flight %uL: the %s fetch's header came "
                  "first, the other one stops", fetch->fn->id,
                  fetch->hedge ? "second (hedge)" : "first");

    if (!loser->finished && !loser->event.posted) {
        /* stopped from the event loop, not from inside this filter */
        ngx_post_event(&loser->event, &ngx_posted_events);
    }
}


/*
 * A fetch of a hedged pair ends without being the flight's: it lost, or
 * it failed before any header while the other one goes on.  It lets go
 * of its use of the flight, which stays hosted by the other.  NGX_OK: it
 * was one of those; NGX_DECLINED: it ends as the flight's fetch.
 */

ngx_int_t
ngx_http_singleflight_launch_part(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_int_t                       how;
    ngx_http_singleflight_fetch_t  *other;

    other = fetch->partner;

    if (!fetch->lost && (other == NULL || fetch->header)) {
        return NGX_DECLINED;
    }

    if (other != NULL) {
        /* failed first: the other fetch is the flight's from now on */
        other->partner = NULL;
        fetch->partner = NULL;
        fetch->ctx->fetch = other;

        ngx_log_error(NGX_LOG_INFO, fetch->sr->connection->log, 0,
                      "singleflight flight %uL: one of its two fetches "
                      "failed, the other goes on", fetch->fn->id);
    }

    if (fetch->held) {
        fetch->held = 0;
        how = ngx_http_singleflight_flight_release(fetch->zone, fetch->fn,
                                                   fetch->writer.log);
        ngx_http_singleflight_capture_tell(fetch, how);
    }

    return NGX_OK;
}


/* ------------------------------------------------------------ resuming */

/*
 * The response broke off before its end: if it is resumable and tries
 * are left, a new fetch asks for the rest and takes this one's place (its
 * use of the flight, its store writer or its leader's output), and the
 * readers see nothing of it.  A response with no Range to resume by (a
 * weak validator, no length) is asked for whole, where its first bytes
 * are in the store to be compared with (not one that went to its leader
 * alone, not one broken before any byte of its body).  NGX_DECLINED: it
 * ends as a break does.
 */

ngx_int_t
ngx_http_singleflight_launch_resume(ngx_http_singleflight_fetch_t *fetch)
{
    off_t                            from;
    ngx_http_singleflight_resume_t  *rs;

    rs = &fetch->resume;

    if (!fetch->header || fetch->retry || fetch->stopping || !fetch->held
        || rs->tries == 0 || rs->failed
        || fetch->complete || (fetch->direct && fetch->last)
        || fetch->pending != NULL || fetch->fn->abandon)
    {
        return NGX_DECLINED;
    }

    if (rs->validator.len == 0) {

        if (!rs->whole || fetch->direct) {
            /* no Range, and nothing stored to compare all of it with */
            return NGX_DECLINED;
        }

    } else if (fetch->direct
               && fetch->ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_DIRECT)
    {
        /* its leader is gone: nobody to send the rest to */
        return NGX_DECLINED;
    }

    from = fetch->direct ? fetch->sent : fetch->writer.stored;

    if ((rs->total >= 0 && from >= rs->total) || (rs->whole && from == 0)) {
        return NGX_DECLINED;
    }

    if (ngx_http_singleflight_launch_new(fetch->host, fetch->ctx, fetch->fn,
                                        fetch->generation, fetch)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    /* the new fetch holds the flight in this one's stead */
    fetch->held = 0;

    ngx_http_singleflight_launch_asked(fetch->sr->connection->log, fetch->fn,
                                       from, rs->total, rs->whole);

    return NGX_OK;
}


/* a break the flight asks the origin about again, at "from": logged */

void
ngx_http_singleflight_launch_asked(ngx_log_t *log,
    ngx_http_singleflight_node_t *fn, off_t from, off_t total,
    ngx_uint_t whole)
{
    if (whole) {
        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "singleflight flight %uL broke off at byte %O, "
                      "asking for all of it again", fn->id, from);

    } else {
        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "singleflight flight %uL broke off at byte %O of %O, "
                      "asking for the rest", fn->id, from, total);
    }
}


/*
 * A resuming fetch's header: a 206 for the rest of the same
 * representation goes on where the first response stopped, unseen by
 * anyone; anything else ends the flight as the break would have.
 */

ngx_int_t
ngx_http_singleflight_launch_resumed(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_http_singleflight_resume_t  *rs;

    rs = &fetch->resume;
    rs->waiting = 0;
    fetch->header = 1;

    if (rs->whole) {
        return ngx_http_singleflight_launch_refetched(fetch, r);
    }

    if (ngx_http_singleflight_resume_check(rs, r) == NGX_OK) {
        (void) ngx_atomic_fetch_add(&fetch->zone->counters->resumes, 1);
        ngx_http_singleflight_flight_resumed(fetch->zone, fetch->fn);

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "singleflight flight %uL resumed at byte %O",
                      fetch->fn->id, rs->from);

        return NGX_OK;
    }

    (void) ngx_atomic_fetch_add(&fetch->zone->counters->resume_failures, 1);

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "singleflight flight %uL not resumed at byte %O: the "
                  "origin answered %ui, not the rest of the same response",
                  fetch->fn->id, rs->from, r->headers_out.status);

    /* nothing of it is kept: the flight ends as cut */
    ngx_str_null(&rs->validator);
    rs->failed = 1;
    r->header_only = 1;

    return NGX_OK;
}


/*
 * The header of a whole response asked for again: if it is the first
 * one's, its first "from" bytes are compared with the store as they come
 * (capture_compare()); anything else ends the flight as cut.
 */

static ngx_int_t
ngx_http_singleflight_launch_refetched(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_http_singleflight_resume_t  *rs;

    rs = &fetch->resume;

    if (ngx_http_singleflight_resume_check_whole(rs, r) != NGX_OK) {
        ngx_http_singleflight_capture_unresumed(fetch, r->connection->log,
                                              "has another header");
        r->header_only = 1;
        return NGX_OK;
    }

    rs->skip = rs->from;

    if (rs->skip == 0) {
        /* a dead worker had published nothing: nothing to compare */
        ngx_http_singleflight_capture_same(fetch, r->connection->log);
        return NGX_OK;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight flight %uL asked for again, comparing "
                   "its first %O bytes", fetch->fn->id, rs->skip);

    return NGX_OK;
}
