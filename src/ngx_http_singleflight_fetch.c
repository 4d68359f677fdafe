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
 * that comes back to this nginx is recognised (_handler.c, _clone.c).
 *
 * The subrequest runs on a connection of its own (_fake.c): a copy of
 * the leader's (its addresses, TLS and HTTP/2 or HTTP/3 state, for
 * variables) with no socket, always ready for writing.  nginx's event
 * pipe writes to it at the origin's pace, and the module's filters, first
 * in the chain, take every byte into the store and pass nothing further
 * (_capture.c).  The leader is a
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
 *
 * This file decides, at the fetch's header, what becomes of its response
 * (stored and shared, or its leader's alone), and at its end what the
 * flight learns (complete, cut, made again, failed).  Below it, _launch.c
 * starts the subrequest (the first, a hedge, a resume), _clone.c makes
 * its request and gives the leader its $upstream_... variables, and
 * _capture.c takes its body and tells the flight's readers.
 */


#include "ngx_http_singleflight_fetch.h"
#include "ngx_http_singleflight_launch.h"
#include "ngx_http_singleflight_fake.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_capture.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_share.h"


static void ngx_http_singleflight_fetch_origin(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r);
static void ngx_http_singleflight_fetch_quiet(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_fetch_outcome(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t rc);
static ngx_int_t ngx_http_singleflight_fetch_over(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_uint_t ngx_http_singleflight_fetch_empty(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_fetch_header_error(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_uint_t reading);
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
static ngx_uint_t ngx_http_singleflight_fetch_intercepted(
    ngx_http_singleflight_fetch_t *fetch, ngx_uint_t status);
static void ngx_http_singleflight_fetch_failed(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t rc);
static void ngx_http_singleflight_fetch_unhost(
    ngx_http_singleflight_fetch_t *fetch);
static ngx_uint_t ngx_http_singleflight_fetch_lazy(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_uint_t ngx_http_singleflight_fetch_unrangeable(
    ngx_http_request_t *host, ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_host_reading(
    ngx_http_singleflight_fetch_t *fetch);


/* what a fetch asks of its host's reader (_reader.c), see fetch_init() */
static ngx_http_singleflight_fetch_host_t  *ngx_http_singleflight_host_reader;


ngx_int_t
ngx_http_singleflight_fetch_init(ngx_conf_t *cf,
    ngx_http_singleflight_fetch_host_t *host)
{
    ngx_http_singleflight_host_reader = host;

    ngx_http_singleflight_capture_init(host);
    ngx_http_singleflight_launch_init(ngx_http_singleflight_fetch_done);
    ngx_http_singleflight_clone_init(cf);

    return NGX_OK;
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
    return ngx_http_singleflight_launch_new(r, ctx, fn, generation, NULL);
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

    rc = ngx_http_singleflight_launch_new(r, ctx, fn, generation, &prev);
    if (rc != NGX_OK) {
        return rc;
    }

    /* as a fetch's own break is logged */

    ngx_http_singleflight_launch_asked(r->connection->log, fn,
                                       prev.writer.stored, prev.resume.total,
                                       prev.resume.whole);

    return NGX_OK;
}


/* ------------------------------------------------------------ header */

ngx_int_t
ngx_http_singleflight_fetch_header(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r)
{
    ngx_int_t     rc;
    ngx_uint_t    header_only, reason, reading, creds;
    ngx_array_t  *vary;

    if (fetch->resume.waiting) {
        return ngx_http_singleflight_launch_resumed(fetch, r);
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
        ngx_http_singleflight_launch_won(fetch);
    }

    if (fetch->header) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "singleflight fetch of flight %uL sent a header twice",
                      fetch->fn->id);
        return NGX_ERROR;
    }

    fetch->header = 1;

    ngx_http_singleflight_fetch_origin(fetch, r);

    if (fetch->origin && ngx_http_singleflight_share_answered(r)) {
        /*
         * how long an origin takes: a cache's or a file's answer not, nor
         * nginx's own 502 or 504
         */
        fetch->timed = 1;
        ngx_http_singleflight_stats_observe(&fetch->zone->counters->header,
                                        ngx_current_msec - fetch->fn->start);
    }

    header_only = ngx_http_singleflight_share_header_only(r);

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

    /*
     * is the response its leader's alone, and why (as for a leader that
     * fetches it itself, _tee.c)?  R_NONE: it may be shared, with "vary"
     * the headers it varies on
     */

    vary = NULL;
    reason = ngx_http_singleflight_share_reason(r, fetch->ctx, &creds, &vary);

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_ERROR) {
        return NGX_ERROR;
    }

    fetch->creds = creds;

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
    ngx_http_singleflight_capture_tell(fetch, how);

    return rc;
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
                   "singleflight fetch of flight %uL is nobody's there",
                   fetch->fn->id);

    how = ngx_http_singleflight_flight_alone(fetch->zone, fetch->fn,
                                         fetch->generation,
                                         NGX_HTTP_SINGLEFLIGHT_R_UNSHARED,
                                         0, &seq, r->connection->log);

    fetch->stopping = 1;

    ngx_http_singleflight_capture_changed(fetch, how, seq);

    return NGX_ERROR;
}


/* the location configuration the fetch began in, its leader's */

void **
ngx_http_singleflight_fetch_began(ngx_http_singleflight_fetch_t *fetch)
{
    return fetch->begin.loc_conf;
}


/* a response for its leader alone: everybody else goes upstream */

static ngx_int_t
ngx_http_singleflight_fetch_header_alone(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_uint_t reason, ngx_uint_t reading)
{
    ngx_int_t          rc, how;
    ngx_atomic_uint_t  seq;

    ngx_http_singleflight_store_unroom(&fetch->writer);

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

    ngx_http_singleflight_capture_changed(fetch, how, seq);

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
    ngx_http_singleflight_capture_changed(fetch, 0,
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

    if (!header_only
        && ngx_http_singleflight_store_room(&fetch->writer) != NGX_OK)
    {
        /* neither the zone nor a file has room: the leader's alone */
        return ngx_http_singleflight_fetch_header_alone(fetch, r,
                                        NGX_HTTP_SINGLEFLIGHT_R_NOMEM,
                                        reading);
    }

    ngx_http_singleflight_clone_where(fetch->sr, &fetch->begin.uri,
                                      &fetch->begin.args, &where);

    block = ngx_http_singleflight_store_serialize(r, &where, vary,
                        ngx_http_singleflight_fetch_resumable(fetch, &where)
                        | NGX_HTTP_SINGLEFLIGHT_H_CREDS(fetch->creds),
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
                                        NGX_HTTP_SINGLEFLIGHT_R_NOMEM,
                                        reading);
    }

    if (rc == NGX_DECLINED) {
        /* the flight is no longer ours (its worker's share was reclaimed?) */
        return NGX_ERROR;
    }

    fetch->complete = header_only;

    ngx_http_singleflight_capture_tell(fetch, rc);
    ngx_http_singleflight_capture_listen(fetch);

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
    ngx_int_t                       rc, rate;
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

    /* the subrequest's headers_out become the leader's, and its pace */

    host->headers_out = r->headers_out;

    rate = ngx_http_singleflight_store_limit_rate(r);

    if (rate != NGX_ERROR) {
        host->limit_rate = (size_t) rate;
        host->limit_rate_set = 1;
    }

    if (r->headers_out.headers.last == &r->headers_out.headers.part) {
        host->headers_out.headers.last = &host->headers_out.headers.part;
    }

    if (r->headers_out.trailers.last == &r->headers_out.trailers.part) {
        host->headers_out.trailers.last = &host->headers_out.trailers.part;
    }

    ngx_http_singleflight_clone_where(fetch->sr, &fetch->begin.uri,
                                      &fetch->begin.args, &where);
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
        && !fetch->ctx->range_sent && !ngx_http_singleflight_store_cache(r))
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
    ngx_list_t                    *list;
    ngx_table_elt_t               *h, *ho;
    ngx_http_request_t            *host;
    ngx_http_singleflight_walk_t   walk;

    host = fetch->host;

    if (!ngx_http_singleflight_host_reading(fetch) || host->header_sent) {
        return NGX_OK;
    }

    list = &r->headers_out.headers;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(list, &walk)) != NULL) {

        if (h->hash == 0) {
            continue;
        }

        ho = ngx_list_push(&host->headers_out.headers);
        if (ho == NULL) {
            return NGX_OK;
        }

        *ho = *h;
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
 * The request's $upstream_... states as they were before its fetches in
 * this location: what its own content handler starts from when it goes
 * its own way, as without the module (those of a location it came from)
 */

ngx_array_t *
ngx_http_singleflight_fetch_states_before(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_singleflight_fetch_t  *fetch;

    for (fetch = ctx->fetches; fetch; fetch = fetch->next) {
        if (fetch->vars.pass == ctx->request->uri_changes) {
            return fetch->vars.before;
        }
    }

    return ctx->request->upstream_states;
}


/*
 * Would the request's fetch of its flight stop, were the flight read by
 * nobody (capture_stop())?  Not one whose response is being cached, nor one
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


/* ------------------------------------------------------------ body */

/* the module's body filter, and the one after it (_filter.c) */

void
ngx_http_singleflight_fetch_filters(ngx_http_output_body_filter_pt self,
    ngx_http_output_body_filter_pt next)
{
    ngx_http_singleflight_capture_filters(self, next);
}


/* the fetch's body: stored, or its leader's alone as its header decided */

ngx_int_t
ngx_http_singleflight_fetch_body(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_chain_t *in)
{
    if (fetch->direct) {
        return ngx_http_singleflight_capture_direct(fetch, in);
    }

    return ngx_http_singleflight_capture_body(fetch, r, in);
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


/* how a direct response's fetch ended, for its leader (fetch_pump()) */

static ngx_int_t
ngx_http_singleflight_fetch_over(ngx_http_singleflight_fetch_t *fetch)
{
    if (!fetch->last) {
        return NGX_ERROR;
    }

    return fetch->header_rc ? fetch->header_rc : NGX_DONE;
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

    /* a background subrequest again, however it ends (launch_content()) */
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
     * The fetch's own connection's error (capture_stop(), a filter's): on
     * it ngx_http_finalize_request() would terminate r->main, the leader,
     * whatever this handler answers.  The fetch ends here, quietly.
     */

    r->connection->error = 0;

    if (fetch->finished) {
        return NGX_OK;
    }

    fetch->finished = 1;
    fetch->pending = NULL;

    /* before a resume copies its writer: the room is this one's */
    ngx_http_singleflight_store_unroom(&fetch->writer);

    ngx_http_singleflight_fetch_origin(fetch, r);

    if (fetch->timed
        && (fetch->complete || (fetch->direct && fetch->last)))
    {
        ngx_http_singleflight_stats_observe(&fetch->zone->counters->body,
                                        ngx_current_msec - fetch->fn->start);
    }

    ngx_http_singleflight_fetch_quiet(fetch);

    if (ngx_http_singleflight_launch_part(fetch) == NGX_OK) {
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

    if (ngx_http_singleflight_launch_resume(fetch) == NGX_OK) {
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
        || r->upstream_states == NULL
        || r->upstream_states->nelts <= fetch->vars.seeded
        || ngx_http_singleflight_share_cached(r))
    {
        /* no upstream past those of the host's before (clone_states_seed()) */
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

    if (fetch->fake != NULL && fetch->fake->write.timer_set) {
        /* a fetch whose launch failed early has none */
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
        ngx_http_singleflight_capture_tell(fetch, how);
        ngx_http_singleflight_fetch_unhost(fetch);
        return;
    }

    ngx_http_singleflight_fetch_failed(fetch, rc);
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

        if (ngx_http_singleflight_fetch_intercepted(fetch, status)) {
            /*
             * the origin's own 5xx, which *_intercept_errors made nginx's
             * error page: the http_5xx conditions, not "error" or
             * "timeout"; every request's own error_page answers it, as
             * nothing of the origin's is shared (singleflight_share_errors
             * has nothing to keep)
             */
            reason = NGX_HTTP_SINGLEFLIGHT_R_STATUS;
            cond = ngx_http_singleflight_promote_status(status);

        } else if (status == NGX_HTTP_GATEWAY_TIME_OUT) {
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
            ngx_http_singleflight_clone_where(fetch->sr, &fetch->begin.uri,
                                              &fetch->begin.args, &where);

            how = ngx_http_singleflight_flight_fail(fetch->zone, fetch->fn,
                                                    fetch->generation, reason,
                                                    status, &where, log);
            ngx_http_singleflight_capture_tell(fetch, how);
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
                                                NGX_HTTP_BAD_GATEWAY, NULL,
                                                log);
        ngx_http_singleflight_capture_tell(fetch, how);

        /* the new fetch's use of the flight goes too */
        (void) ngx_http_singleflight_flight_unhost(fetch->zone, fetch->fn,
                                                   generation, log);
    }

    ngx_http_singleflight_fetch_unhost(fetch);
}


/*
 * Whether the 5xx "status", with which the fetch ended without a
 * response, was the origin's: its last try, past the host's states it was
 * seeded with, had the origin's header (nginx's own 502 and 504 come
 * without one).
 */

static ngx_uint_t
ngx_http_singleflight_fetch_intercepted(ngx_http_singleflight_fetch_t *fetch,
    ngx_uint_t status)
{
    ngx_array_t                *states;
    ngx_http_upstream_state_t  *state;

    states = fetch->sr->upstream_states;

    if (status < NGX_HTTP_INTERNAL_SERVER_ERROR || states == NULL
        || states->nelts <= fetch->vars.seeded)
    {
        return 0;
    }

    state = states->elts;
    state += states->nelts - 1;

    return state->peer != NULL && state->status == status
           && state->header_time != (ngx_msec_t) -1;
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

    ngx_http_singleflight_capture_tell(fetch, how);
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
            ngx_http_singleflight_capture_listen(fetch);
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
        ngx_http_singleflight_fetch_quiet(fetch);

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


