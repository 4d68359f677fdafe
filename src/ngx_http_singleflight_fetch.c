/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The fetch.
 *
 * A flight's upstream request must not depend on any one client: not on
 * its pace (a client that reads slowly, or nothing, must not hold the
 * others), and not on its staying (a client that goes away must not cost
 * the others their response).  So the fetch is not the leader's own
 * request but a background subrequest of it, cloned at this module's
 * phase (NGX_HTTP_SUBREQUEST_BACKGROUND|NGX_HTTP_SUBREQUEST_CLONE): it
 * runs the rest of the location as the leader would have (try_files, the
 * content handler: proxy_pass, fastcgi_pass..., any with content=any),
 * with the leader's variables, body and headers, less its conditional and
 * Range headers (every client's own filters answer those from the stored
 * response) and plus a CDN-Loop header naming this nginx, so that a fetch
 * that comes back to this nginx is recognised (_handler.c).
 *
 * The subrequest runs on a connection of its own (_fake.c): a copy of
 * the leader's (its addresses, TLS and HTTP/2 or HTTP/3 state, for
 * variables) with no socket, always ready for writing.  nginx's event pipe writes to it at
 * the origin's pace, and the module's filters, first in the chain, take
 * every byte into the store and pass nothing further.  The leader is a
 * reader of the store like every follower, at its own pace; when its
 * client goes, it stays (finalized, but referenced by its subrequest)
 * until the fetch is over, and the fetch goes on for the others.  The
 * fetch is stopped only when nobody reads its flight any more, the way
 * nginx stops an upstream request whose client went away (so
 * proxy_ignore_client_abort and caching still mean what they mean).
 *
 * Every way the subrequest ends reaches its post_subrequest handler first
 * (ngx_http_singleflight_fetch_done()): the outcome is recorded in the
 * flight and the handler answers NGX_OK, so no error page is ever made in
 * the fetch, and the leader's request is never terminated by it.  Each
 * reader turns a failed flight's status into its own response, through
 * its own error_page.
 *
 * A response that is its leader's alone (a private one, one with
 * "Vary: *", one too large for singleflight_max_size, a cache hit, or
 * with singleflight_lazy a small one nobody else waits for) is not
 * stored: the subrequest's response goes straight through the leader's
 * filters (direct mode), paced by the leader's connection like any
 * upstream response, and the others go upstream on their own.
 *
 * Why a subrequest rather than capturing the leader's own upstream
 * response: the leader's request belongs to its client (its header_only,
 * err_status, error pages, the write events of its connection, its abort),
 * and every such tie would have to be cut inside nginx's upstream code.
 */


#include "ngx_http_singleflight_fetch.h"
#include "ngx_http_singleflight_fake.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_share.h"


/* r->buffered of a fetch: a file buffer still being copied */
#define NGX_HTTP_SINGLEFLIGHT_BUFFERED   0x04

/* at most this much of a file buffer is copied per event */
#define NGX_HTTP_SINGLEFLIGHT_FILE_SLICE (1024 * 1024)


struct ngx_http_singleflight_fetch_s {
    ngx_http_request_t              *host;
    ngx_http_request_t              *sr;
    ngx_http_singleflight_ctx_t     *ctx;         /* the host's */
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;
    ngx_uint_t                       generation;
    ngx_uint_t                       retry;       /* the next generation */
    ngx_http_singleflight_fake_t    *fake;
    ngx_http_singleflight_writer_t   writer;
    ngx_http_singleflight_waiter_t   waiter;
    ngx_event_t                      event;
    ngx_chain_t                     *pending;     /* file buffers to copy */
    ngx_http_singleflight_vars_t     vars;        /* what the host's
                                                     $upstream_... read */
    ngx_http_post_subrequest_t       ps;
    ngx_http_singleflight_resume_t   resume;
    off_t                            sent;        /* direct: body bytes */
    off_t                            length;      /* direct: the body's, by
                                                     its header; -1: none */
    ngx_int_t                        header_rc;   /* direct: a status the
                                                     leader's filters made
                                                     (416) */
    ngx_event_t                      hedge_ev;    /* singleflight_hedge */
    ngx_http_singleflight_fetch_t   *partner;     /* the other, if hedged */
    ngx_http_singleflight_fetch_t   *next;        /* its host's next one */
    ngx_http_singleflight_begin_t    begin;       /* where it began */

    unsigned                         header:1;
    unsigned                         complete:1;
    unsigned                         direct:1;
    unsigned                         last:1;      /* direct: all passed */
    unsigned                         finished:1;
    unsigned                         origin:1;    /* counted as an origin
                                                     request */
    unsigned                         held:1;      /* its use of the flight */
    unsigned                         sealed:1;
    unsigned                         stopping:1;
    unsigned                         hedge:1;     /* the second fetch */
    unsigned                         resuming:1;  /* asks for the rest */
    unsigned                         lost:1;      /* its partner's header
                                                     came first */
    unsigned                         resumed:1;   /* it asks for the rest
                                                     of another's */
    unsigned                         creds:2;     /* the credentials its
                                                     response may go to */
};


static ngx_int_t ngx_http_singleflight_fetch_new(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_http_singleflight_fetch_t *prev);
static ngx_http_singleflight_fetch_t *ngx_http_singleflight_fetch_alloc(
    ngx_http_request_t *r, ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation);
static ngx_int_t ngx_http_singleflight_fetch_request(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_singleflight_fetch_t *prev,
    ngx_http_singleflight_request_headers_t *rh);
static void ngx_http_singleflight_fetch_state(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_singleflight_fetch_t *prev);
static void ngx_http_singleflight_fetch_origin(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
static void ngx_http_singleflight_fetch_quiet(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_outcome(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t rc);
static ngx_int_t ngx_http_singleflight_fetch_content(ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_fetch_answered(ngx_chain_t *in);
static void ngx_http_singleflight_fetch_trailers(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_uint_t ngx_http_singleflight_fetch_empty(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_fetch_refetched(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
static void ngx_http_singleflight_fetch_unresumed(
    ngx_http_singleflight_fetch_t *fetch, ngx_log_t *log, char *why);
static ngx_int_t ngx_http_singleflight_fetch_compare(
    ngx_http_singleflight_fetch_t *fetch, ngx_chain_t *in);
static void ngx_http_singleflight_fetch_same(
    ngx_http_singleflight_fetch_t *fetch, ngx_log_t *log);
static ngx_int_t ngx_http_singleflight_fetch_resume(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_int_t ngx_http_singleflight_fetch_resumed(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_fetch_header_error(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_uint_t reading);
static ngx_int_t ngx_http_singleflight_fetch_header_reason(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_uint_t *reason, ngx_array_t **vary);
static ngx_int_t ngx_http_singleflight_fetch_header_alone(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_uint_t reason, ngx_uint_t reading);
static ngx_int_t ngx_http_singleflight_fetch_header_lazy(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_uint_t reading);
static ngx_uint_t ngx_http_singleflight_fetch_resumable(
    ngx_http_singleflight_fetch_t *fetch,
    ngx_http_singleflight_where_t *where);
static ngx_int_t ngx_http_singleflight_fetch_header_store(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_array_t *vary, ngx_uint_t header_only, ngx_uint_t reading);
static ngx_int_t ngx_http_singleflight_fetch_direct(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_fetch_over(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_int_t ngx_http_singleflight_fetch_direct_body(
    ngx_http_singleflight_fetch_t *fetch, ngx_chain_t *in);
static ngx_int_t ngx_http_singleflight_fetch_take(
    ngx_http_singleflight_fetch_t *fetch, ngx_chain_t **cl, ngx_uint_t *last);
static ngx_int_t ngx_http_singleflight_fetch_framed(off_t length, off_t at,
    off_t size, ngx_uint_t end);
static void ngx_http_singleflight_fetch_misframed(
    ngx_http_singleflight_fetch_t *fetch, off_t length, off_t end);
static void ngx_http_singleflight_fetch_drop(ngx_chain_t *in);
static ngx_int_t ngx_http_singleflight_fetch_publish(
    ngx_http_singleflight_fetch_t *fetch, ngx_uint_t last);
static void ngx_http_singleflight_fetch_failed(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t rc);
static void ngx_http_singleflight_fetch_unhost(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_changed(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t how,
    ngx_atomic_uint_t seq);
static void ngx_http_singleflight_fetch_tell(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t how);
static void ngx_http_singleflight_fetch_listen(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_wake(
    ngx_http_singleflight_waiter_t *w);
static void ngx_http_singleflight_fetch_event(ngx_event_t *ev);
static void ngx_http_singleflight_fetch_stop(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_halt(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_hedge_arm(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_hedge(ngx_event_t *ev);
static void ngx_http_singleflight_fetch_won(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_int_t ngx_http_singleflight_fetch_part(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_uint_t ngx_http_singleflight_fetch_lazy(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_uint_t ngx_http_singleflight_fetch_unrangeable(
    ngx_http_request_t *host, ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_host_reading(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_int_t ngx_http_singleflight_fetch_leader(ngx_http_request_t *r,
    ngx_chain_t *in);


static ngx_http_output_body_filter_pt  ngx_http_singleflight_filter_self;
static ngx_http_output_body_filter_pt  ngx_http_singleflight_filter_next;


/* what a fetch asks of its host's reader (_reader.c), see fetch_init() */
static ngx_http_singleflight_fetch_host_t  *ngx_http_singleflight_host_reader;


ngx_int_t
ngx_http_singleflight_fetch_init(ngx_conf_t *cf,
    ngx_http_singleflight_fetch_host_t *host)
{
    ngx_http_singleflight_host_reader = host;

    ngx_http_singleflight_clone_init(cf);

    return NGX_OK;
}


/* the module's body filter, and the one after it (_filter.c) */

void
ngx_http_singleflight_fetch_filters(ngx_http_output_body_filter_pt self,
    ngx_http_output_body_filter_pt next)
{
    ngx_http_singleflight_filter_self = self;
    ngx_http_singleflight_filter_next = next;
}


/* ------------------------------------------------------------ starting */

/*
 * The request "r" (the flight's leader, or a follower taking over an
 * orphan, or the leader again for a retry) starts the fetch of flight
 * "fn", generation "generation", whose hold use the caller took.  For a
 * retry "r" may have left the flight already (its client went away):
 * the flight is the fetch's, not ctx->fn.
 */

ngx_int_t
ngx_http_singleflight_fetch_start(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation)
{
    return ngx_http_singleflight_fetch_new(r, ctx, fn, generation, NULL);
}


/*
 * A reader of a flight whose fetching worker died mid-body, and that it
 * adopted (flight_adopt()), asks for the rest: a resuming fetch as if the
 * dead one had broken off at what it published, with the validator and
 * length read back from the stored header and a store writer that goes
 * on where the dead one's stopped.  Only for a response that stayed in
 * the reader's location (H_RESUMABLE, or H_WHOLE: asked for again whole),
 * so the rest is asked for where the reader itself begins.  NGX_DECLINED
 * or NGX_ERROR: no fetch.
 */

ngx_int_t
ngx_http_singleflight_fetch_adopt(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation)
{
    ngx_int_t                          rc;
    ngx_http_singleflight_fetch_t      prev;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = ctx->conf;

    ngx_memzero(&prev, sizeof(ngx_http_singleflight_fetch_t));

    rc = ngx_http_singleflight_resume_stored(&prev.resume, fn->store.header,
                                             r->pool);
    if (rc != NGX_OK) {
        return rc;
    }

    /* the new fetch has a try less for its own breaks */
    prev.resume.tries = ngx_max(conf->resume_tries, 1);

    prev.writer.zone = ctx->zone;
    prev.writer.fn = fn;
    prev.writer.memory = conf->memory;
    prev.writer.length = prev.resume.total;
    prev.writer.temp_path = conf->temp_path;
    prev.writer.pool = r->pool;
    prev.writer.log = r->connection->log;

    rc = ngx_http_singleflight_store_adopt(&prev.writer,
                                    ngx_http_singleflight_flight_length(fn));
    if (rc != NGX_OK) {
        return rc;
    }

    ngx_http_singleflight_clone_begin_get(r, &prev.begin);

    return ngx_http_singleflight_fetch_new(r, ctx, fn, generation, &prev);
}


/* a fetch; with "prev", one that resumes prev's broken response */

static ngx_int_t
ngx_http_singleflight_fetch_new(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_http_singleflight_fetch_t *prev)
{
    ngx_pool_t                               *pool;
    ngx_http_request_t                       *sr;
    ngx_http_singleflight_fake_t             *fake;
    ngx_http_singleflight_fetch_t            *fetch;
    ngx_http_singleflight_request_headers_t   rh;

    fetch = ngx_http_singleflight_fetch_alloc(r, ctx, fn, generation);
    if (fetch == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_singleflight_fetch_request(fetch, prev, &rh) != NGX_OK) {
        goto failed;
    }

    fake = ngx_http_singleflight_fake_get(r);
    if (fake == NULL) {
        goto failed;
    }

    fetch->fake = fake;

    fetch->ps.handler = ngx_http_singleflight_fetch_done;
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

    if (sr->content_handler != NULL) {
        /* as its own request's, for a stale cache entry: fetch_content() */
        sr->content_handler = ngx_http_singleflight_fetch_content;
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

    ngx_http_singleflight_fetch_state(fetch, prev);

    ngx_http_singleflight_fetch_listen(fetch);

    ctx->fetch = fetch;

    if (prev == NULL) {
        ngx_http_singleflight_fetch_hedge_arm(fetch);
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
ngx_http_singleflight_fetch_alloc(ngx_http_request_t *r,
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
ngx_http_singleflight_fetch_request(ngx_http_singleflight_fetch_t *fetch,
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

    fetch->resumed = 1;
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
ngx_http_singleflight_fetch_state(ngx_http_singleflight_fetch_t *fetch,
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

    fetch->event.handler = ngx_http_singleflight_fetch_event;
    fetch->event.data = fetch;
    fetch->event.log = &fetch->fake->log;

    fetch->waiter.handler = ngx_http_singleflight_fetch_wake;
    fetch->waiter.data = fetch;
}


/* ------------------------------------------------------------ header */

ngx_int_t
ngx_http_singleflight_fetch_header(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_int_t     rc;
    ngx_uint_t    header_only, reason, reading;
    ngx_array_t  *vary;

    if (fetch->resume.waiting) {
        return ngx_http_singleflight_fetch_resumed(fetch, r);
    }

    if (fetch->lost) {
        /* its partner's header came first: this one is being stopped */
        r->header_only = 1;
        return NGX_OK;
    }

    if (fetch->hedge_ev.timer_set) {
        ngx_del_timer(&fetch->hedge_ev);
    }

    if (fetch->partner) {
        ngx_http_singleflight_fetch_won(fetch);
    }

    if (fetch->header) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "singleflight fetch of flight %uL sent a header twice",
                      fetch->fn->id);
        return NGX_ERROR;
    }

    fetch->header = 1;

    ngx_http_singleflight_fetch_origin(fetch, r);

    if (!ngx_http_singleflight_share_cached(r)) {
        /* how long an origin takes: a cache's answer is not one */
        ngx_http_singleflight_stats_observe(&fetch->zone->counters->header,
                                        ngx_current_msec - fetch->fn->start);
    }

    header_only = (r->method == NGX_HTTP_HEAD
                   || r->headers_out.status == NGX_HTTP_NO_CONTENT
                   || r->headers_out.status == NGX_HTTP_NOT_MODIFIED);

    if (header_only) {
        /* as nginx's header filter would: the upstream stops there */
        r->header_only = 1;
    }

    if (fetch->resume.tries) {
        ngx_http_singleflight_resume_note(&fetch->resume, r);
    }

    reading = ngx_http_singleflight_host_reading(fetch);

    if (reading) {
        ngx_http_singleflight_clone_header_vars(fetch->host, r,
                                                &fetch->vars);
    }

    rc = ngx_http_singleflight_fetch_header_error(fetch, r, reading);

    if (rc != NGX_DECLINED) {
        return rc;
    }

    vary = NULL;

    if (ngx_http_singleflight_fetch_header_reason(fetch, r, &reason, &vary)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (reason != NGX_HTTP_SINGLEFLIGHT_R_NONE) {
        return ngx_http_singleflight_fetch_header_alone(fetch, r, reason,
                                                        reading);
    }

    rc = ngx_http_singleflight_fetch_header_lazy(fetch, r, reading);

    if (rc != NGX_DECLINED) {
        return rc;
    }

    return ngx_http_singleflight_fetch_header_store(fetch, r, vary,
                                                    header_only, reading);
}


/*
 * An origin 5xx: another try for the followers (singleflight_promote),
 * or the leader's alone (singleflight_share_errors off), or shared as any
 * response (NGX_DECLINED).
 */

static ngx_int_t
ngx_http_singleflight_fetch_header_error(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_uint_t reading)
{
    ngx_int_t                          rc, how;
    ngx_uint_t                         status, reason;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = fetch->ctx->conf;
    status = r->headers_out.status;

    if (status < NGX_HTTP_INTERNAL_SERVER_ERROR) {
        return NGX_DECLINED;
    }

    if (reading) {
        ngx_http_singleflight_clone_states_seen(fetch->host, r,
                                                &fetch->vars);
    }

    reason = ngx_http_singleflight_promote_status(status);

    if ((reason & conf->promote)
        && !(conf->promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF))
    {
        fetch->retry = fetch->generation;

        if (ngx_http_singleflight_flight_retry(fetch->zone, fetch->fn,
                                               &fetch->retry,
                                               r->connection->log)
            == NGX_OK)
        {
            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "singleflight origin answered %ui, "
                           "fetching again", status);

            r->header_only = 1;
            return NGX_OK;
        }

        fetch->retry = 0;
    }

    if (conf->share_errors) {
        return NGX_DECLINED;
    }

    /* the followers get singleflight_error_status, the leader this */

    rc = reading ? ngx_http_singleflight_fetch_direct(fetch, r) : NGX_ERROR;

    how = ngx_http_singleflight_flight_fail(fetch->zone, fetch->fn,
                                            fetch->generation,
                                            NGX_HTTP_SINGLEFLIGHT_R_ORIGIN,
                                            0, NULL, r->connection->log);
    ngx_http_singleflight_fetch_tell(fetch, how);

    return rc;
}


/*
 * Is the response its leader's alone, and why (share_reason(), as for a
 * leader that fetches it itself, _tee.c)?  R_NONE: it may be shared, with
 * "vary" the headers it varies on.
 */

static ngx_int_t
ngx_http_singleflight_fetch_header_reason(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_uint_t *reason, ngx_array_t **vary)
{
    ngx_uint_t  creds;

    *reason = ngx_http_singleflight_share_reason(r, fetch->ctx, &creds, vary);

    if (*reason == NGX_HTTP_SINGLEFLIGHT_R_ERROR) {
        return NGX_ERROR;
    }

    fetch->creds = creds;

    return NGX_OK;
}


/*
 * The fetch is nobody's before it has a response (it went where a fetch
 * would fetch otherwise than its leader: ngx_http_singleflight_
 * subrequest()): the flight is its leader's alone, and nobody reads it,
 * so that the leader and the followers go their own way.  NGX_ERROR: the
 * fetch ends, quietly (ngx_http_singleflight_fetch_done()).
 */

ngx_int_t
ngx_http_singleflight_fetch_unshare(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_int_t          how;
    ngx_atomic_uint_t  seq;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight fetch of flight %uL went to slices",
                   fetch->fn->id);

    how = ngx_http_singleflight_flight_alone(fetch->zone, fetch->fn,
                                         fetch->generation,
                                         NGX_HTTP_SINGLEFLIGHT_R_UNSHARED,
                                         0, &seq, r->connection->log);

    fetch->stopping = 1;

    ngx_http_singleflight_fetch_changed(fetch, how, seq);

    return NGX_ERROR;
}


/* a response for its leader alone: everybody else goes upstream */

static ngx_int_t
ngx_http_singleflight_fetch_header_alone(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_uint_t reason, ngx_uint_t reading)
{
    ngx_int_t          rc, how;
    ngx_atomic_uint_t  seq;

    if (reading && !fetch->ctx->range_sent
        && ngx_http_singleflight_fetch_unrangeable(fetch->host, r))
    {
        /*
         * the leader's Range: it goes upstream on its own as the others
         * do, and the fetch, which nobody reads then, stops
         */
        reading = 0;
    }

    how = ngx_http_singleflight_flight_alone(fetch->zone, fetch->fn,
                                             fetch->generation, reason,
                                             fetch->ctx->conf->private_ttl,
                                             &seq, r->connection->log);

    rc = reading ? ngx_http_singleflight_fetch_direct(fetch, r) : NGX_ERROR;

    ngx_http_singleflight_fetch_changed(fetch, how, seq);

    return rc;
}


/*
 * singleflight_lazy: nobody else waits, the leader reads it alone, not
 * stored.  NGX_DECLINED: it is stored.
 */

static ngx_int_t
ngx_http_singleflight_fetch_header_lazy(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_uint_t reading)
{
    ngx_int_t                          rc;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = fetch->ctx->conf;

    if (!conf->lazy || !reading || !ngx_http_singleflight_fetch_lazy(r, conf))
    {
        return NGX_DECLINED;
    }

    if (ngx_http_singleflight_flight_solo(fetch->zone, fetch->fn,
                                          fetch->generation,
                                          r->connection->log)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight flight has no followers, not stored");

    (void) ngx_atomic_fetch_add(&fetch->zone->counters->unstored, 1);

    rc = ngx_http_singleflight_fetch_direct(fetch, r);

    /* nothing changed for anybody else: the host is woken, nobody else */
    ngx_http_singleflight_fetch_changed(fetch, 0,
                                    ngx_http_singleflight_flight_seq(fetch->fn));

    return rc;
}


/*
 * Whether another worker may ask for the rest of the response, or all of
 * it again, should this one die mid-body (fetch_adopt()): it is
 * resumable, and it was made where its fetch began, unmoved, where every
 * reader of it begins too.
 */

static ngx_uint_t
ngx_http_singleflight_fetch_resumable(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_singleflight_where_t *where)
{
    if (where->moved.flags || where->loc_conf != fetch->begin.loc_conf) {
        return 0;
    }

    if (fetch->resume.validator.len) {
        return NGX_HTTP_SINGLEFLIGHT_H_RESUMABLE;
    }

    return fetch->resume.whole ? NGX_HTTP_SINGLEFLIGHT_H_WHOLE : 0;
}


/* stored, for everybody: the header into the zone, the body follows */

static ngx_int_t
ngx_http_singleflight_fetch_header_store(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_array_t *vary, ngx_uint_t header_only,
    ngx_uint_t reading)
{
    size_t                          len;
    u_char                         *block;
    ngx_int_t                       rc;
    ngx_http_singleflight_where_t   where;

    if (reading) {
        ngx_http_singleflight_clone_states_seen(fetch->host, r,
                                                &fetch->vars);
    }

    fetch->writer.length = r->headers_out.content_length_n;

    ngx_http_singleflight_clone_where(fetch->sr, &fetch->begin, &where);

    block = ngx_http_singleflight_store_serialize(r, &where, vary,
                        ngx_http_singleflight_fetch_resumable(fetch, &where)
                        | ((fetch->creds & NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE)
                           ? NGX_HTTP_SINGLEFLIGHT_H_COOKIE : 0)
                        | ((fetch->creds & NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH)
                           ? NGX_HTTP_SINGLEFLIGHT_H_AUTH : 0),
                        &len);
    if (block == NULL) {
        return NGX_ERROR;
    }

    rc = ngx_http_singleflight_flight_header(fetch->zone, fetch->fn,
                                             fetch->generation, block, len,
                                             header_only,
                                             r->connection->log);

    if (rc == NGX_ABORT) {
        /* no room in the zone for the header: the leader's alone */
        return ngx_http_singleflight_fetch_header_alone(fetch, r,
                                        NGX_HTTP_SINGLEFLIGHT_R_UNSHARED,
                                        reading);
    }

    if (rc == NGX_DECLINED) {
        /* the flight is no longer ours (its worker's share was reclaimed?) */
        return NGX_ERROR;
    }

    fetch->complete = header_only;

    ngx_http_singleflight_fetch_tell(fetch, rc);
    ngx_http_singleflight_fetch_listen(fetch);

    return NGX_OK;
}


/*
 * Direct mode: the response goes through the leader's own filters as the
 * subrequest produces it.  Called from the subrequest's header filter.
 */

static ngx_int_t
ngx_http_singleflight_fetch_direct(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_int_t                       rc;
    ngx_http_request_t             *host;
    ngx_http_singleflight_ctx_t    *ctx;
    ngx_http_singleflight_where_t   where;

    host = fetch->host;
    ctx = fetch->ctx;

    fetch->direct = 1;
    fetch->length = r->headers_out.content_length_n;

    ngx_http_singleflight_wait_unpark(&ctx->waiter);

    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_DIRECT;
    ctx->header_sent = 1;
    ctx->wait_time = ngx_current_msec - ctx->wait_start;

    /* the subrequest's headers_out become the leader's */

    host->headers_out = r->headers_out;

    if (r->headers_out.headers.last == &r->headers_out.headers.part) {
        host->headers_out.headers.last = &host->headers_out.headers.part;
    }

    if (r->headers_out.trailers.last == &r->headers_out.trailers.part) {
        host->headers_out.trailers.last = &host->headers_out.trailers.part;
    }

    ngx_http_singleflight_clone_where(fetch->sr, &fetch->begin, &where);
    ngx_http_singleflight_store_location(host, where.loc_conf);

    if (ngx_http_singleflight_store_move(host, &where.moved, where.uri,
                                         where.args)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    fetch->ctx->redirects = where.moved.redirects;

    host->allow_ranges = r->allow_ranges;
    host->single_range = r->single_range;
    host->upstream_states = r->upstream_states;

    if (host->headers_in.range != NULL && !host->allow_ranges
        && !fetch->ctx->range_sent)
    {
        /* its Range, which the fetch did not send, as a reader's */
        ngx_http_singleflight_store_allow_ranges(host, 0,
                       ngx_http_singleflight_store_ranges(
                                                    &r->headers_out.headers));
    }

    /* conditionals answered as for a stored response's readers */

    if (ngx_http_singleflight_store_unconditional(r)) {
        host->disable_not_modified = 1;
    }

    rc = ngx_http_send_header(host);

    if (rc == NGX_ERROR || rc > NGX_OK || host->header_only
        || r->header_only)
    {
        /* the leader needs no body (HEAD, 204, 304, an error): no more */

        if (rc > NGX_OK) {
            /* its own filters' answer (a 416), sent when the fetch ends */
            fetch->header_rc = rc;
        }

        if (rc == NGX_OK) {
            /* its header goes out now, as nginx's upstream ends one */
            (void) ngx_http_send_special(host, NGX_HTTP_LAST);
        }

        fetch->last = 1;
        r->header_only = 1;

        ngx_post_event(host->connection->write, &ngx_posted_events);

        return NGX_OK;
    }

    return NGX_OK;
}


/* ------------------------------------------------------------ body */

ngx_int_t
ngx_http_singleflight_fetch_body(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t     rc;
    ngx_uint_t    last;
    ngx_chain_t  *cl;

    if (fetch->direct) {
        return ngx_http_singleflight_fetch_direct_body(fetch, in);
    }

    if (!fetch->header || fetch->retry || fetch->complete || fetch->stopping
        || fetch->resume.failed || fetch->lost)
    {
        /* nothing to keep: a body after a header-only response, say */
        ngx_http_singleflight_fetch_drop(in);

        return fetch->stopping ? NGX_ERROR : NGX_OK;
    }

    if (fetch->resume.skip
        && ngx_http_singleflight_fetch_compare(fetch, in) != NGX_OK)
    {
        /* not the same response: the flight ends as cut */
        return NGX_ERROR;
    }

    last = 0;

    if (fetch->pending == NULL) {

        /* the usual case: all of "in" stored now, no copy of its links */

        cl = in;

        rc = ngx_http_singleflight_fetch_take(fetch, &cl, &last);

        if (rc == NGX_DECLINED) {
            /* not the length it said: the flight breaks off */
            return NGX_ERROR;
        }

        if (rc != NGX_OK) {
            goto failed;
        }

        if (cl != NULL
            && ngx_chain_add_copy(r->pool, &fetch->pending, cl) != NGX_OK)
        {
            return NGX_ERROR;
        }

    } else {

        /* a file's rest waits: "in" after it */

        if (in != NULL
            && ngx_chain_add_copy(r->pool, &fetch->pending, in) != NGX_OK)
        {
            return NGX_ERROR;
        }

        rc = ngx_http_singleflight_fetch_take(fetch, &fetch->pending, &last);

        if (rc == NGX_DECLINED) {
            fetch->pending = NULL;
            return NGX_ERROR;
        }

        if (rc != NGX_OK) {
            goto failed;
        }
    }

    rc = ngx_http_singleflight_fetch_publish(fetch, last);

    if (rc != NGX_OK) {
        return rc;
    }

    if (fetch->pending) {
        r->buffered |= NGX_HTTP_SINGLEFLIGHT_BUFFERED;
        ngx_post_event(r->connection->write, &ngx_posted_events);
        return NGX_AGAIN;
    }

    r->buffered &= ~NGX_HTTP_SINGLEFLIGHT_BUFFERED;

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_CRIT, r->connection->log, ngx_errno,
                  "singleflight could not store the body of flight %uL",
                  fetch->fn->id);

    fetch->pending = NULL;

    return NGX_ERROR;
}


/*
 * A whole response asked for again: its first bytes, "skip" of them still
 * to come, must be those stored.  They are taken off "in" as they are
 * compared, and what follows is stored as usual.  At the first
 * difference, or a response that ends before them, it is not used.
 */

static ngx_int_t
ngx_http_singleflight_fetch_compare(ngx_http_singleflight_fetch_t *fetch,
    ngx_chain_t *in)
{
    off_t                            n;
    ngx_int_t                        rc;
    ngx_buf_t                       *b;
    ngx_chain_t                     *cl;
    ngx_http_singleflight_resume_t  *rs;

    rs = &fetch->resume;

    for (cl = in; cl && rs->skip; cl = cl->next) {
        b = cl->buf;
        n = ngx_min(ngx_buf_size(b), rs->skip);

        if (n > 0) {
            rc = ngx_http_singleflight_store_same_buf(&fetch->writer,
                                                      rs->from - rs->skip,
                                                      b, (size_t) n);
            if (rc != NGX_OK) {
                ngx_http_singleflight_fetch_unresumed(fetch,
                    fetch->writer.log,
                    rc == NGX_DECLINED ? "has other bytes"
                                       : "could not be compared");
                return NGX_ERROR;
            }

            if (ngx_buf_in_memory(b)) {
                b->pos += n;

            } else {
                b->file_pos += n;
            }

            rs->skip -= n;
        }

        if (rs->skip && (b->last_buf || b->last_in_chain)) {
            ngx_http_singleflight_fetch_unresumed(fetch, fetch->writer.log,
                                                  "is shorter");
            return NGX_ERROR;
        }
    }

    if (rs->skip == 0) {
        ngx_http_singleflight_fetch_same(fetch, fetch->writer.log);
    }

    return NGX_OK;
}


/* a whole response asked for again goes on: its first bytes were those */

static void
ngx_http_singleflight_fetch_same(ngx_http_singleflight_fetch_t *fetch,
    ngx_log_t *log)
{
    (void) ngx_atomic_fetch_add(&fetch->zone->counters->resumes, 1);
    ngx_http_singleflight_flight_resumed(fetch->zone, fetch->fn);

    ngx_log_error(NGX_LOG_INFO, log, 0,
                  "singleflight flight %uL resumed at byte %O: the "
                  "response asked for again has the same first bytes",
                  fetch->fn->id, fetch->resume.from);
}


/*
 * The buffers from "*cl" on go into the store, a file's at most
 * NGX_HTTP_SINGLEFLIGHT_FILE_SLICE bytes at a time: "*cl" is left at the
 * first buffer not wholly taken, NULL when all were.  NGX_DECLINED: a
 * buffer would take the body past the stored header's Content-Length, or
 * end it before, and is not taken (fetch_misframed()).
 */

static ngx_int_t
ngx_http_singleflight_fetch_take(ngx_http_singleflight_fetch_t *fetch,
    ngx_chain_t **cl, ngx_uint_t *last)
{
    off_t       size;
    size_t      budget, done;
    ngx_buf_t  *b;

    budget = NGX_HTTP_SINGLEFLIGHT_FILE_SLICE;

    for ( /* void */ ; *cl; *cl = (*cl)->next) {
        b = (*cl)->buf;
        size = ngx_buf_size(b);

        if (ngx_http_singleflight_fetch_framed(fetch->writer.length,
                                               fetch->writer.stored, size,
                                               b->last_buf || b->last_in_chain)
            != NGX_OK)
        {
            ngx_http_singleflight_fetch_misframed(fetch, fetch->writer.length,
                                                fetch->writer.stored + size);
            return NGX_DECLINED;
        }

        if (ngx_buf_in_memory(b)) {

            if (b->last > b->pos
                && ngx_http_singleflight_store_append(&fetch->writer, b->pos,
                                                   b->last - b->pos)
                   != NGX_OK)
            {
                return NGX_ERROR;
            }

            b->pos = b->last;

        } else if (b->in_file) {

            if (ngx_http_singleflight_store_append_file(&fetch->writer, b,
                                                        budget, &done)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            b->file_pos += done;
            budget -= ngx_min(budget, done);

            if (b->file_pos < b->file_last) {
                return NGX_OK;
            }
        }

        if (b->last_buf || b->last_in_chain) {
            *last = 1;
        }
    }

    return NGX_OK;
}


/*
 * A body of "length" bytes (-1: not known), "at" of them had: do "size"
 * more, and its end if "end", keep to that length?  No response ever
 * goes past its Content-Length, nor ends before it, for any reader.
 */

static ngx_int_t
ngx_http_singleflight_fetch_framed(off_t length, off_t at, off_t size,
    ngx_uint_t end)
{
    if (length < 0) {
        return NGX_OK;
    }

    if (size > length - at || (end && at + size != length)) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/*
 * The body goes past its header's Content-Length ("end" beyond "length"),
 * or ends before it: the response is broken, as one that an upstream sent
 * too much or too little of, and the flight breaks off (the fetch ends
 * cut, every reader's connection is closed after what it had).  Nor is it
 * resumed: its origin frames it otherwise than it says.  For a resume,
 * the rest is not the one asked for.
 */

static void
ngx_http_singleflight_fetch_misframed(ngx_http_singleflight_fetch_t *fetch,
    off_t length, off_t end)
{
    ngx_log_t  *log;

    log = fetch->writer.log;

    fetch->resume.failed = 1;
    fetch->resume.skip = 0;

    if (fetch->resumed) {
        (void) ngx_atomic_fetch_add(&fetch->zone->counters->resume_failures,
                                    1);

        if (end > length) {
            ngx_log_error(NGX_LOG_INFO, log, 0,
                          "singleflight flight %uL not resumed at byte %O: "
                          "the rest goes past the response's %O bytes",
                          fetch->fn->id, fetch->resume.from, length);

        } else {
            ngx_log_error(NGX_LOG_INFO, log, 0,
                          "singleflight flight %uL not resumed at byte %O: "
                          "the rest ends at byte %O of the response's %O",
                          fetch->fn->id, fetch->resume.from, end, length);
        }

        return;
    }

    if (end > length) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "singleflight flight %uL: the body is longer than its "
                      "Content-Length of %O bytes, the response breaks off",
                      fetch->fn->id, length);

    } else {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "singleflight flight %uL: the body ends at byte %O, "
                      "before its Content-Length of %O bytes, the response "
                      "breaks off", fetch->fn->id, end, length);
    }
}


/* a body's buffers that nobody takes, as taken */

static void
ngx_http_singleflight_fetch_drop(ngx_chain_t *in)
{
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
    }
}


/* what the body filter stored is published to the readers */

static ngx_int_t
ngx_http_singleflight_fetch_publish(ngx_http_singleflight_fetch_t *fetch,
    ngx_uint_t last)
{
    ngx_int_t                          rc;
    ngx_log_t                         *log;
    ngx_atomic_uint_t                  seq;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = fetch->ctx->conf;
    log = fetch->writer.log;

    if (!last
        && fetch->writer.stored == ngx_http_singleflight_flight_length(
                                                                 fetch->fn))
    {
        return NGX_OK;
    }

    if (conf->max_size && !fetch->sealed
        && fetch->writer.stored > conf->max_size)
    {
        /* who reads it goes on, nobody joins any more */

        fetch->sealed = 1;
        (void) ngx_atomic_fetch_add(&fetch->zone->counters->oversized, 1);
        (void) ngx_http_singleflight_flight_seal(fetch->zone, fetch->fn,
                                                 fetch->generation, log);
    }

    rc = ngx_http_singleflight_flight_body(fetch->zone, fetch->fn,
                                           fetch->generation,
                                           fetch->writer.stored, last, &seq,
                                           log);

    if (rc == NGX_ABORT || rc == NGX_DECLINED || last) {
        ngx_http_singleflight_wait_unpark(&fetch->waiter);
    }

    if (rc == NGX_ABORT || rc == NGX_DECLINED) {

        /* nobody reads it any more, or it is no longer ours */

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "singleflight fetch of flight %uL stops",
                       fetch->fn->id);

        if (rc == NGX_ABORT && !fetch->stopping) {
            (void) ngx_atomic_fetch_add(&fetch->zone->counters->abandoned, 1);
        }

        fetch->stopping = 1;
        fetch->pending = NULL;

        return NGX_ERROR;
    }

    if (last) {
        fetch->complete = 1;
        ngx_http_singleflight_fetch_tell(fetch, rc);

    } else {
        /* a lone leader's body costs no group per buffer */
        ngx_http_singleflight_fetch_changed(fetch, rc, seq);
    }

    return NGX_OK;
}


/* how a direct response's fetch ended, for its leader (fetch_pump()) */

static ngx_int_t
ngx_http_singleflight_fetch_over(ngx_http_singleflight_fetch_t *fetch)
{
    if (!fetch->last) {
        return NGX_ERROR;
    }

    return fetch->header_rc ? fetch->header_rc : NGX_DONE;
}


/*
 * A direct response's body into its leader's filters.  The module's body
 * filter has nothing to do for a leader: the ones after it, unless a
 * filter loaded after this module sits above it, when the leader's output
 * starts at the top as any.
 */

static ngx_int_t
ngx_http_singleflight_fetch_leader(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t  rc;

    if (ngx_http_top_body_filter != ngx_http_singleflight_filter_self) {
        return ngx_http_output_filter(r, in);
    }

    rc = ngx_http_singleflight_filter_next(r, in);

    if (rc == NGX_ERROR) {
        /* as ngx_http_output_filter() marks it */
        r->connection->error = 1;
    }

    return rc;
}


/* direct mode: the leader's own filters take the body */

static ngx_int_t
ngx_http_singleflight_fetch_direct_body(ngx_http_singleflight_fetch_t *fetch,
    ngx_chain_t *in)
{
    off_t                size;
    ngx_int_t            rc;
    ngx_buf_t           *end;
    ngx_chain_t         *cl;
    ngx_http_request_t  *host;

    host = fetch->host;

    if (fetch->last || fetch->resume.failed) {
        ngx_http_singleflight_fetch_drop(in);
        return NGX_OK;
    }

    size = 0;
    end = NULL;

    for (cl = in; cl; cl = cl->next) {
        size += ngx_buf_size(cl->buf);

        if (cl->buf->last_in_chain) {
            end = cl->buf;
        }
    }

    if (ngx_http_singleflight_fetch_framed(fetch->length, fetch->sent, size,
                                           end != NULL)
        != NGX_OK)
    {
        /*
         * none of it goes to the leader: what it had goes out, as nginx's
         * upstream flushes a response cut short, then its connection is
         * closed when the fetch ends (fetch_pump())
         */

        ngx_http_singleflight_fetch_drop(in);

        ngx_http_singleflight_fetch_misframed(fetch, fetch->length,
                                              fetch->sent + size);
        (void) ngx_http_send_special(host, NGX_HTTP_FLUSH);

        ngx_post_event(host->connection->write, &ngx_posted_events);

        return NGX_ERROR;
    }

    /* what a resume would ask for the rest after */
    fetch->sent += size;

    if (end != NULL) {
        /* a subrequest's end is the leader's, its trailers too */
        end->last_buf = 1;
        fetch->last = 1;
        ngx_http_singleflight_fetch_trailers(fetch);
    }

    rc = ngx_http_singleflight_fetch_leader(host, in);

    if (end == NULL && ngx_http_singleflight_fetch_answered(in)) {
        /*
         * the leader's filters ended its answer (nginx's range filter at
         * the range's last byte): the rest of the body is nobody's, and
         * comes in buffers the upstream reuses, the end marked on them
         */
        fetch->last = 1;
    }

    if (rc != NGX_ERROR
        && (host->buffered || host->connection->buffered)
        && ngx_http_singleflight_host_reader->arm(host) != NGX_OK)
    {
        rc = NGX_ERROR;
    }

    if (fetch->last || rc == NGX_ERROR) {
        ngx_post_event(host->connection->write, &ngx_posted_events);
    }

    return rc;
}


/*
 * Did the leader's own filters end its answer in "in", a direct fetch's
 * buffers that went through them?  nginx's range filter marks a range's
 * last byte as the response's last on the buffer itself (last_buf,
 * last_in_chain), and that buffer is the upstream's: proxy_buffering off
 * gives it again for the next bytes, the marks still on it, where they
 * would read as the body's end, short of its Content-Length
 * (fetch_framed()).  The leader's answer is complete there; whatever the
 * fetch still reads is nobody's.
 */

static ngx_uint_t
ngx_http_singleflight_fetch_answered(ngx_chain_t *in)
{
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        if (cl->buf->last_buf || cl->buf->last_in_chain) {
            return 1;
        }
    }

    return 0;
}


/*
 * The origin's trailers (proxy_pass_trailers) came into the fetch's list
 * after the leader took a copy of it, empty then: the leader takes the
 * list as it is now.  Nothing was added to the leader's copy in between:
 * nginx adds a request's own (add_trailer) at its last buffer, after
 * this, and they follow the origin's, as without the module.
 */

static void
ngx_http_singleflight_fetch_trailers(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_http_request_t  *host, *sr;

    sr = fetch->sr;

    if (sr->headers_out.trailers.part.nelts == 0) {
        return;
    }

    host = fetch->host;
    host->headers_out.trailers = sr->headers_out.trailers;

    if (sr->headers_out.trailers.last == &sr->headers_out.trailers.part) {
        host->headers_out.trailers.last = &host->headers_out.trailers.part;
    }
}


/*
 * Direct mode, from the leader's write event: its output drained, the
 * fetch may go on.  NGX_DONE: the fetch is over and its last buffer
 * passed, the leader may finish; a status (416): it ends with that
 * special response, made by its own filters instead of the header.
 */

ngx_int_t
ngx_http_singleflight_fetch_pump(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_connection_t               *fc;
    ngx_http_request_t             *sr;
    ngx_http_singleflight_fetch_t  *fetch;

    fetch = ctx->fetch;

    if (fetch == NULL || !fetch->direct) {
        return NGX_ERROR;
    }

    if (fetch->finished) {
        return ngx_http_singleflight_fetch_over(fetch);
    }

    if (fetch->resume.waiting) {
        /* the rest is asked for: nothing to drive before its header */
        return NGX_OK;
    }

    sr = fetch->sr;
    fc = sr->connection;

    /* the upstream's downstream handler: its event pipe writes again */

    sr->write_event_handler(sr);
    ngx_http_run_posted_requests(fc);

    if (fetch->finished) {
        return ngx_http_singleflight_fetch_over(fetch);
    }

    return NGX_OK;
}


#if (nginx_version >= 1029000)

/*
 * The origin's 103 Early Hints, as nginx passes them (early_hints): to the
 * leader that waits for its own fetch, as without the module, before its
 * response.  Followers get the final response only.
 */

ngx_int_t
ngx_http_singleflight_fetch_early_hints(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_uint_t           i;
    ngx_list_part_t     *part;
    ngx_table_elt_t     *h, *ho;
    ngx_http_request_t  *host;

    host = fetch->host;

    if (!ngx_http_singleflight_host_reading(fetch) || host->header_sent) {
        return NGX_OK;
    }

    part = &r->headers_out.headers.part;
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

        if (h[i].hash == 0) {
            continue;
        }

        ho = ngx_list_push(&host->headers_out.headers);
        if (ho == NULL) {
            return NGX_OK;
        }

        *ho = h[i];
        ho->next = NULL;
    }

    /* what the leader's connection could not take goes with its header */
    (void) ngx_http_send_early_hints(host);

    ngx_http_clean_header(host);

    return NGX_OK;
}

#endif


/* the leader's header is out: its $upstream_... may tell the end now */

void
ngx_http_singleflight_fetch_header_out(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_request_t *r)
{
    ngx_http_singleflight_fetch_t  *fetch;

    fetch = ctx->fetch;

    if (fetch != NULL && fetch->vars.final != NULL
        && r->upstream_states == fetch->vars.seen)
    {
        r->upstream_states = fetch->vars.final;
    }
}


/* does the request host a fetch that is not over? */

ngx_uint_t
ngx_http_singleflight_fetch_running(ngx_http_singleflight_ctx_t *ctx)
{
    return ctx->fetch != NULL && !ctx->fetch->finished;
}


/*
 * Would the request's fetch of its flight stop, were the flight read by
 * nobody (fetch_stop())?  Not one whose response is being cached, nor one
 * with proxy_ignore_client_abort (or fastcgi_..., ...): nginx goes on with
 * such an upstream request whoever reads it.
 */

ngx_uint_t
ngx_http_singleflight_fetch_stops(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_upstream_t            *u;
    ngx_http_singleflight_fetch_t  *fetch;

    fetch = ctx->fetch;

    if (fetch == NULL || fetch->finished || fetch->fn != ctx->fn) {
        return 1;
    }

    u = fetch->sr->upstream;

    return u == NULL || !(u->cacheable || u->conf->ignore_client_abort);
}


/*
 * The fetch's content handler (proxy_pass, fastcgi_pass, ...) runs as for
 * the request it was made for.  nginx serves no stale cache entry to a
 * background subrequest (proxy_cache_use_stale updating,
 * proxy_cache_background_update, stale-while-revalidate): the fetch is
 * none while its handler looks in the cache.  Whatever ends the fetch,
 * nginx calls fetch_done() first, which makes it one again before nginx
 * finalizes a subrequest by that flag.
 */

static ngx_int_t
ngx_http_singleflight_fetch_content(ngx_http_request_t *r)
{
    ngx_int_t                       rc;
    ngx_http_singleflight_fetch_t  *fetch;

    fetch = ngx_http_singleflight_fetch_of(r);

    r->content_handler = fetch->begin.content_handler;
    r->background = 0;

    rc = r->content_handler(r);

    r->background = 1;

    return rc;
}


/* ------------------------------------------------------------ the end */

/* a response whose body is empty: of length 0, or an empty cache entry */

static ngx_uint_t
ngx_http_singleflight_fetch_empty(ngx_http_request_t *r)
{
    if (r->headers_out.content_length_n == 0) {
        return 1;
    }

#if (NGX_HTTP_CACHE)

    if (r->cached && r->cache != NULL
        && r->cache->length == (off_t) r->cache->body_start)
    {
        return 1;
    }

#endif

    return 0;
}


/*
 * Every end of the subrequest comes here first: the upstream's finalizing,
 * an nginx-made status (the upstream could not be reached, timed out, a
 * static file was not found), an error.  The flight learns the outcome;
 * the subrequest ends quietly.
 */

ngx_int_t
ngx_http_singleflight_fetch_done(ngx_http_request_t *r, void *data,
    ngx_int_t rc)
{
    ngx_http_singleflight_fetch_t  *fetch = data;

    /* a background subrequest again, however it ends (fetch_content()) */
    r->background = 1;

    if (rc == NGX_OK && fetch->header && !fetch->last && !fetch->complete
        && !fetch->stopping && !r->header_only
        && ngx_http_singleflight_fetch_empty(r))
    {
        /*
         * nginx 1.22 ends a subrequest's empty body with its header alone
         * (an empty file, an empty cached response, with a length or
         * not), where a main request gets its last buffer: the end of its
         * body, then
         */
        (void) ngx_http_send_special(r, NGX_HTTP_LAST);
    }

    if (fetch->stopping) {
        /* a file buffer it was copying: nobody wants the rest */
        r->buffered &= ~NGX_HTTP_SINGLEFLIGHT_BUFFERED;

    } else if ((rc == NGX_OK || rc == NGX_AGAIN)
               && (r->buffered || r->postponed))
    {
        /*
         * not over yet: it is finalized again when it is (without output
         * held back, nginx ends a subrequest on NGX_AGAIN as on NGX_OK:
         * its last buffer given to a leader's busy connection, say)
         */
        return rc;
    }

    /*
     * The fetch's own connection's error (fetch_stop(), a filter's): on
     * it ngx_http_finalize_request() would terminate r->main, the leader,
     * whatever this handler answers.  The fetch ends here, quietly.
     */

    r->connection->error = 0;

    if (fetch->finished) {
        return NGX_OK;
    }

    fetch->finished = 1;
    fetch->pending = NULL;

    ngx_http_singleflight_fetch_origin(fetch, r);

    if (fetch->complete || (fetch->direct && fetch->last)) {
        ngx_http_singleflight_stats_observe(&fetch->zone->counters->body,
                                        ngx_current_msec - fetch->fn->start);
    }

    ngx_http_singleflight_fetch_quiet(fetch);

    if (ngx_http_singleflight_fetch_part(fetch) == NGX_OK) {
        return NGX_OK;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight fetch of flight %uL done: %i, %s",
                   fetch->fn->id, rc,
                   fetch->direct ? "direct"
                   : fetch->complete ? "complete"
                   : fetch->header ? "cut" : "no response");

    if (fetch->ctx->phase != NGX_HTTP_SINGLEFLIGHT_RD_ALONE) {
        /* not when the leader went its own way: its upstream is its own */
        ngx_http_singleflight_clone_upstream_vars(fetch->host, fetch->sr,
                                                  &fetch->vars,
                                                  fetch->ctx->header_sent);
    }

    if (ngx_http_singleflight_fetch_resume(fetch) == NGX_OK) {
        return NGX_OK;
    }

    ngx_http_singleflight_fetch_outcome(fetch, rc);

    return NGX_OK;
}


/*
 * A fetch that reached an upstream (proxy_pass and the other *_pass
 * directives: r's upstream states) was an origin request, counted by what
 * it was; not one a cache in its location answered, nor a file.  Counted
 * once, at its response header, or at its end when it got none: a long
 * download is in the count while it runs.
 */

static void
ngx_http_singleflight_fetch_origin(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_uint_t  what;

    if (fetch->origin
        || r->upstream_states == NULL || r->upstream_states->nelts == 0)
    {
        return;
    }

    fetch->origin = 1;

    if (fetch->hedge) {
        what = NGX_HTTP_SINGLEFLIGHT_ORIGIN_HEDGE;

    } else if (fetch->resuming) {
        what = NGX_HTTP_SINGLEFLIGHT_ORIGIN_RESUME;

    } else if (fetch->generation == 1) {
        what = NGX_HTTP_SINGLEFLIGHT_ORIGIN_FIRST;

    } else {
        what = NGX_HTTP_SINGLEFLIGHT_ORIGIN_RETRY;
    }

    (void) ngx_atomic_fetch_add(&fetch->zone->counters->origin_requests[what],
                                1);
}


/* nothing of the fetch's may fire any more: its wait, event and timers */

static void
ngx_http_singleflight_fetch_quiet(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_http_singleflight_wait_unpark(&fetch->waiter);

    if (fetch->event.posted) {
        ngx_delete_posted_event(&fetch->event);
    }

    if (fetch->fake->write.timer_set) {
        ngx_del_timer(&fetch->fake->write);
    }

    if (fetch->hedge_ev.timer_set) {
        ngx_del_timer(&fetch->hedge_ev);
    }
}


/*
 * The flight learns how its fetch ended: a direct response is over for
 * its leader, a stored one is complete, an abandoned one stops, a body
 * that broke off fails the flight, and no response at all is fetched
 * again or fails (fetch_failed()).
 */

static void
ngx_http_singleflight_fetch_outcome(ngx_http_singleflight_fetch_t *fetch,
    ngx_int_t rc)
{
    ngx_int_t  how;

    if (fetch->direct) {

        if (fetch->held
            && ngx_http_singleflight_host_reader->direct_done(fetch->ctx,
                                                       fetch->fn,
                                                       fetch->generation)
               == NGX_OK)
        {
            /* let go with its leader */
            fetch->held = 0;
        }

        ngx_http_singleflight_fetch_unhost(fetch);

        /*
         * the leader learns at its next write event; cut short, its
         * connection closes, as without us (_reader.c)
         */

        ngx_post_event(fetch->host->connection->write, &ngx_posted_events);
        return;
    }

    if (fetch->complete || fetch->stopping) {
        /* stopping: abandoned, nobody reads the flight */
        ngx_http_singleflight_fetch_unhost(fetch);
        return;
    }

    if (fetch->header && !fetch->retry) {
        how = ngx_http_singleflight_flight_fail(fetch->zone, fetch->fn,
                                                fetch->generation,
                                                NGX_HTTP_SINGLEFLIGHT_R_CUT,
                                                0, NULL, fetch->writer.log);
        ngx_http_singleflight_fetch_tell(fetch, how);
        ngx_http_singleflight_fetch_unhost(fetch);
        return;
    }

    ngx_http_singleflight_fetch_failed(fetch, rc);
}


/* ------------------------------------------------------------ hedging */

/*
 * singleflight_hedge: a first fetch of a GET or HEAD (not a resume, not a
 * hedge) gets a timer; with "auto", at the p95 of the zone's times to a
 * header, never below the floor, and only once 20 are known.
 */

static void
ngx_http_singleflight_fetch_hedge_arm(ngx_http_singleflight_fetch_t *fetch)
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

    fetch->hedge_ev.handler = ngx_http_singleflight_fetch_hedge;
    fetch->hedge_ev.data = fetch;
    fetch->hedge_ev.log = &fetch->fake->log;
    fetch->hedge_ev.cancelable = 1;

    ngx_add_timer(&fetch->hedge_ev, delay);
}


/* no header yet: the same request once more, for the whole flight */

static void
ngx_http_singleflight_fetch_hedge(ngx_event_t *ev)
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

    if (ngx_http_singleflight_fetch_new(host, ctx, fetch->fn,
                                        fetch->generation, NULL)
        != NGX_OK)
    {
        ctx->fetch = fetch;
        ngx_http_singleflight_fetch_tell(fetch,
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

static void
ngx_http_singleflight_fetch_won(ngx_http_singleflight_fetch_t *fetch)
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

static ngx_int_t
ngx_http_singleflight_fetch_part(ngx_http_singleflight_fetch_t *fetch)
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
        ngx_http_singleflight_fetch_tell(fetch, how);
    }

    return NGX_OK;
}


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

static ngx_int_t
ngx_http_singleflight_fetch_resume(ngx_http_singleflight_fetch_t *fetch)
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

    if (ngx_http_singleflight_fetch_new(fetch->host, fetch->ctx, fetch->fn,
                                        fetch->generation, fetch)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    /* the new fetch holds the flight in this one's stead */
    fetch->held = 0;

    if (rs->whole) {
        ngx_log_error(NGX_LOG_INFO, fetch->sr->connection->log, 0,
                      "singleflight flight %uL broke off at byte %O, "
                      "asking for all of it again", fetch->fn->id, from);

    } else {
        ngx_log_error(NGX_LOG_INFO, fetch->sr->connection->log, 0,
                      "singleflight flight %uL broke off at byte %O of %O, "
                      "asking for the rest", fetch->fn->id, from, rs->total);
    }

    return NGX_OK;
}


/*
 * A resuming fetch's header: a 206 for the rest of the same
 * representation goes on where the first response stopped, unseen by
 * anyone; anything else ends the flight as the break would have.
 */

static ngx_int_t
ngx_http_singleflight_fetch_resumed(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_http_singleflight_resume_t  *rs;

    rs = &fetch->resume;
    rs->waiting = 0;
    fetch->header = 1;

    if (rs->whole) {
        return ngx_http_singleflight_fetch_refetched(fetch, r);
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
 * (fetch_compare()); anything else ends the flight as cut.
 */

static ngx_int_t
ngx_http_singleflight_fetch_refetched(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_http_singleflight_resume_t  *rs;

    rs = &fetch->resume;

    if (ngx_http_singleflight_resume_check_whole(rs, r) != NGX_OK) {
        ngx_http_singleflight_fetch_unresumed(fetch, r->connection->log,
                                              "has another header");
        r->header_only = 1;
        return NGX_OK;
    }

    rs->skip = rs->from;

    if (rs->skip == 0) {
        /* a dead worker had published nothing: nothing to compare */
        ngx_http_singleflight_fetch_same(fetch, r->connection->log);
        return NGX_OK;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight flight %uL asked for again, comparing "
                   "its first %O bytes", fetch->fn->id, rs->skip);

    return NGX_OK;
}


/* a whole response asked for again is not used: the flight ends as cut */

static void
ngx_http_singleflight_fetch_unresumed(ngx_http_singleflight_fetch_t *fetch,
    ngx_log_t *log, char *why)
{
    (void) ngx_atomic_fetch_add(&fetch->zone->counters->resume_failures, 1);

    ngx_log_error(NGX_LOG_INFO, log, 0,
                  "singleflight flight %uL not resumed at byte %O: the "
                  "response asked for again %s", fetch->fn->id,
                  fetch->resume.from, why);

    fetch->resume.failed = 1;
    fetch->resume.skip = 0;
}


/* no response: another try (a new generation), or the flight fails */

static void
ngx_http_singleflight_fetch_failed(ngx_http_singleflight_fetch_t *fetch,
    ngx_int_t rc)
{
    ngx_int_t                          how;
    ngx_log_t                         *log;
    ngx_uint_t                         status, reason, cond, generation;
    ngx_http_singleflight_ctx_t       *ctx;
    ngx_http_singleflight_where_t      where;
    ngx_http_singleflight_loc_conf_t  *conf;

    ctx = fetch->ctx;
    conf = ctx->conf;
    log = fetch->sr->connection->log;

    generation = fetch->retry;

    if (generation == 0) {

        status = (rc >= NGX_HTTP_SPECIAL_RESPONSE) ? (ngx_uint_t) rc
                                                   : NGX_HTTP_BAD_GATEWAY;

        if (status == NGX_HTTP_GATEWAY_TIME_OUT) {
            reason = NGX_HTTP_SINGLEFLIGHT_R_TIMEOUT;
            cond = NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT;

        } else if (status == NGX_HTTP_BAD_GATEWAY) {
            reason = NGX_HTTP_SINGLEFLIGHT_R_ERROR;
            cond = NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR;

        } else {
            /* nginx's own answer (404, 403, 500...): everybody's answer */
            reason = NGX_HTTP_SINGLEFLIGHT_R_STATUS;
            cond = 0;
        }

        if ((conf->promote & cond)
            && !(conf->promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF))
        {
            generation = fetch->generation;

            if (ngx_http_singleflight_flight_retry(fetch->zone, fetch->fn,
                                                   &generation, log)
                != NGX_OK)
            {
                generation = 0;
            }
        }

        if (generation == 0) {
            ngx_http_singleflight_clone_where(fetch->sr, &fetch->begin,
                                              &where);

            how = ngx_http_singleflight_flight_fail(fetch->zone, fetch->fn,
                                                    fetch->generation, reason,
                                                    status, &where, log);
            ngx_http_singleflight_fetch_tell(fetch, how);
            ngx_http_singleflight_fetch_unhost(fetch);
            return;
        }
    }

    /* another try, from the same request, for the followers waiting */

    (void) ngx_atomic_fetch_add(&fetch->zone->counters->retries, 1);

    if (ctx->fn == fetch->fn) {
        ctx->generation = generation;
    }

    ctx->fetch = NULL;

    if (ngx_http_singleflight_fetch_start(fetch->host, ctx, fetch->fn,
                                          generation)
        != NGX_OK)
    {
        how = ngx_http_singleflight_flight_fail(fetch->zone, fetch->fn,
                                                generation,
                                                NGX_HTTP_SINGLEFLIGHT_R_ERROR,
                                                NGX_HTTP_BAD_GATEWAY, NULL, log);
        ngx_http_singleflight_fetch_tell(fetch, how);

        /* the new fetch's use of the flight goes too */
        (void) ngx_http_singleflight_flight_unhost(fetch->zone, fetch->fn,
                                                   generation, log);
    }

    ngx_http_singleflight_fetch_unhost(fetch);
}


static void
ngx_http_singleflight_fetch_unhost(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_int_t  how;

    if (!fetch->held) {
        return;
    }

    fetch->held = 0;

    how = ngx_http_singleflight_flight_unhost(fetch->zone, fetch->fn,
                                              fetch->generation,
                                              fetch->writer.log);

    ngx_http_singleflight_fetch_tell(fetch, how);
}


/* ------------------------------------------------------------ abandoning */

/*
 * After a change the fetch made itself: the requests of this worker that
 * wait on the flight are woken (its host first, if it waits for the
 * header), the fetch is not (its own change is not news to it); it stays
 * where it listens, or listens again.
 */

static void
ngx_http_singleflight_fetch_changed(ngx_http_singleflight_fetch_t *fetch,
    ngx_int_t how, ngx_atomic_uint_t seq)
{
    ngx_http_singleflight_waiter_t  *host;

    host = ngx_http_singleflight_host_reader->host_waiter(fetch->ctx,
                                                          fetch->fn);

    if (ngx_http_singleflight_wait_own(fetch->zone, fetch->fn, how,
                                       &fetch->waiter, seq, host)
        != NGX_OK)
    {
        ngx_http_singleflight_fetch_listen(fetch);
    }
}


/*
 * After a change the fetch made: this worker's requests parked on the
 * flight are woken, and its host if it waits for the header (the host is
 * not parked: until the header only its own fetch changes its flight),
 * first among them.
 */

static void
ngx_http_singleflight_fetch_tell(ngx_http_singleflight_fetch_t *fetch,
    ngx_int_t how)
{
    ngx_http_singleflight_waiter_t  *host;

    host = ngx_http_singleflight_host_reader->host_waiter(fetch->ctx,
                                                          fetch->fn);

    ngx_http_singleflight_wait_wake_first(fetch->zone, fetch->fn, how, host);
}


/*
 * The fetch listens for its flight being abandoned: nobody reading it.
 * While its host request reads the flight it cannot be: until the header,
 * and for a direct response (a lone request's, read to the end), the fetch
 * listens only once the host has left it (fetch_host_left()).  A stored
 * response's fetch listens from its header on all the same: the group it
 * makes is the one its readers park in, kept for the flight's life rather
 * than made and freed at every wait of theirs.
 */

static void
ngx_http_singleflight_fetch_listen(ngx_http_singleflight_fetch_t *fetch)
{
    if (fetch->finished || fetch->stopping || fetch->waiter.group != NULL) {
        return;
    }

    if (fetch->ctx->counted && fetch->ctx->fn == fetch->fn
        && (!fetch->header || fetch->direct))
    {
        return;
    }

    if (ngx_http_singleflight_wait_add(fetch->zone, fetch->fn,
                       ngx_http_singleflight_flight_seq(fetch->fn),
                       &fetch->waiter)
        != NGX_OK)
    {
        /* without it, the fetch learns at its next body buffer */
        return;
    }

    /*
     * The seq was read without the lock: an abandonment published just
     * before is in it already, and no look at the groups would wake the
     * fetch for it.  So once listening, the fetch looks at the flag too
     * (published before the seq); its event looks again under the lock.
     */

    if (ngx_http_singleflight_flight_abandoning(fetch->fn, fetch->generation)
        && !fetch->event.posted)
    {
        ngx_post_event(&fetch->event, &ngx_posted_events);
    }
}


static void
ngx_http_singleflight_fetch_wake(ngx_http_singleflight_waiter_t *w)
{
    ngx_http_singleflight_fetch_t  *fetch = w->data;

    if (!fetch->event.posted) {
        ngx_post_event(&fetch->event, &ngx_posted_events);
    }
}


static void
ngx_http_singleflight_fetch_event(ngx_event_t *ev)
{
    ngx_http_singleflight_fetch_t  *fetch = ev->data;

    if (fetch->finished || fetch->stopping) {
        return;
    }

    if (fetch->lost) {
        ngx_http_singleflight_fetch_halt(fetch);
        return;
    }

    if (ngx_http_singleflight_flight_abandoned(fetch->zone, fetch->fn,
                                               fetch->generation))
    {
        ngx_http_singleflight_fetch_stop(fetch);
        return;
    }

    ngx_http_singleflight_fetch_listen(fetch);
}


/*
 * Nobody reads the flight: its fetch stops as nginx stops an upstream
 * request whose client went away (unless proxy_ignore_client_abort, or a
 * response being cached, keeps it going).
 */

static void
ngx_http_singleflight_fetch_stop(ngx_http_singleflight_fetch_t *fetch)
{
    (void) ngx_atomic_fetch_add(&fetch->zone->counters->abandoned, 1);

    ngx_http_singleflight_fetch_halt(fetch);
}


/* the fetch's upstream request ends as for a client gone: closed */

static void
ngx_http_singleflight_fetch_halt(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_connection_t    *fc;
    ngx_http_request_t  *sr;

    fetch->stopping = 1;

    sr = fetch->sr;
    fc = sr->connection;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, fc->log, 0,
                   "singleflight flight %uL abandoned, its fetch stops",
                   fetch->fn->id);

    fc->error = 1;

    sr->read_event_handler(sr);
    ngx_http_run_posted_requests(fc);
}


/* the host request has left flight "fn": its fetches of it listen now */

void
ngx_http_singleflight_fetch_host_left(ngx_http_singleflight_ctx_t *ctx,
    ngx_http_singleflight_node_t *fn)
{
    ngx_http_singleflight_fetch_t  *fetch;

    for (fetch = ctx->fetches; fetch; fetch = fetch->next) {
        /* one that holds the flight: "fn" is still there */
        if (fetch->fn == fn && fetch->held) {
            ngx_http_singleflight_fetch_listen(fetch);
        }
    }
}


/* ------------------------------------------------------------ cleanup */

/* the host request goes: its fetches with it */

void
ngx_http_singleflight_fetch_cleanup(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t                       how;
    ngx_http_singleflight_fetch_t  *fetch;

    for (fetch = ctx->fetches; fetch; fetch = fetch->next) {
        ngx_http_singleflight_wait_unpark(&fetch->waiter);

        if (fetch->event.posted) {
            ngx_delete_posted_event(&fetch->event);
        }

        if (fetch->hedge_ev.timer_set) {
            ngx_del_timer(&fetch->hedge_ev);
        }

        if (!fetch->finished && fetch->held && !fetch->direct) {

            /* terminated: a follower may take over (the host is going) */

            how = ngx_http_singleflight_flight_orphan(fetch->zone, fetch->fn,
                                                      fetch->generation,
                                                      ngx_cycle->log);
            ngx_http_singleflight_wait_wake(fetch->zone, fetch->fn, how);
        }

        if (fetch->held) {
            fetch->held = 0;

            how = ngx_http_singleflight_flight_unhost(fetch->zone, fetch->fn,
                                                      fetch->generation,
                                                      ngx_cycle->log);
            ngx_http_singleflight_wait_wake(fetch->zone, fetch->fn, how);
        }

        if (fetch->fake) {
            ngx_http_singleflight_fake_free(fetch->fake);
            fetch->fake = NULL;
        }
    }

    ctx->fetches = NULL;
    ctx->fetch = NULL;

    if (ctx->pool != NULL) {
        ngx_http_singleflight_fake_pool_free(ctx->pool);
        ctx->pool = NULL;
    }
}


/* ------------------------------------------------------------ helpers */

/*
 * singleflight_lazy: may a response nobody else waits for go to its leader
 * unstored?  Its length must be known and at most the lazy limit
 * (singleflight_memory unless a size is given).  A request that arrives
 * while its body is sent starts a flight of its own.
 */

static ngx_uint_t
ngx_http_singleflight_fetch_lazy(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf)
{
    off_t  len, max;

    if (r->header_only) {
        return 1;
    }

    len = r->headers_out.content_length_n;
    max = conf->lazy_max ? conf->lazy_max : (off_t) conf->memory;

    return len >= 0 && len <= max;
}


/*
 * The leader's Range on a response its range filter cannot cut (see
 * ngx_http_singleflight_store_unrangeable()).  A stored response's
 * leader finds that as a reader; lazy needs a length, so this is for a
 * response that is the leader's alone.
 */

static ngx_uint_t
ngx_http_singleflight_fetch_unrangeable(ngx_http_request_t *host,
    ngx_http_request_t *r)
{
    /* the Range first: the header list is walked only for one */

    return host->headers_in.range != NULL
           && ngx_http_singleflight_store_uncut(r->headers_out.status,
                  r->headers_out.content_length_n,
                  r->allow_ranges
                  || ngx_http_singleflight_store_ranges(
                                                &r->headers_out.headers));
}


static ngx_uint_t
ngx_http_singleflight_host_reading(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = fetch->ctx;

    return ctx->host && ctx->fn == fetch->fn
           && ctx->phase == NGX_HTTP_SINGLEFLIGHT_RD_WAITING;
}


