/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The leader as its own fetch (singleflight_lone own), or a request that
 * went its own way taking over the flight that waited for its header
 * (singleflight_lone direct, tee_adopt()).
 *
 * The leader of a new flight runs the location's content handler itself,
 * exactly as without the module, rather than a subrequest (_fetch.c); its
 * upstream request carries CDN-Loop as a fetch's does.  At its response
 * header (the module's header filter):
 *
 *   nobody followed and the response is small (singleflight_lazy): the
 *   flight ends there (flight_solo()), and the response goes on as
 *   without the module;
 *
 *   the response may be shared: its header is stored, and its body is
 *   copied into the store as the upstream module reads it from the origin
 *   (the event pipe's input filter, wrapped once the upstream module chose
 *   it in u->input_filter_init), at the origin's pace, while the leader's
 *   own client gets the response through its own filters at its own pace
 *   (the pipe's output filter, wrapped: if that client goes away while
 *   others read, the response is read on for them); the upstream's end
 *   (u->finalize_request, wrapped) completes the flight or, short of its
 *   end, leaves it adrift (a reader asks for the rest) or cut, as when a
 *   fetching worker dies mid-body;
 *
 *   the response is the leader's alone (private, a cache hit, too large,
 *   "Vary: *", an interim status): everybody else goes alone;
 *
 *   an origin 5xx (singleflight_promote) or a response the pipe does not
 *   buffer (proxy_buffering off, grpc_pass): the flight is orphaned, and a
 *   follower takes it over with a fetch of its own.
 *
 * The leader gone before its header orphans the flight the same way.
 *
 * Why not always: a request with a Range or a conditional header, a body,
 * or another method than GET would not get the whole representation from
 * the origin, and a hedged location needs a fetch it can stop; those
 * leaders fetch by a subrequest as before.
 */


#include "ngx_http_singleflight_tee.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_share.h"
#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_key.h"


struct ngx_http_singleflight_tee_s {
    ngx_http_request_t                  *r;
    ngx_http_singleflight_ctx_t         *ctx;
    ngx_http_singleflight_zone_t        *zone;
    ngx_http_singleflight_node_t        *fn;
    ngx_uint_t                           generation;
    ngx_http_singleflight_writer_t       writer;
    ngx_http_singleflight_resume_t       resume;
    ngx_str_t                            uri;         /* where it began */
    ngx_str_t                            args;
    void                               **loc_conf;
    ngx_pool_cleanup_t                  *cln;
    ngx_int_t                          (*input_filter_init)(void *data);
    ngx_event_pipe_input_filter_pt       pipe_input;
    void                               (*finalize)(ngx_http_request_t *r,
                                                   ngx_int_t rc);
    ngx_event_pipe_output_filter_pt      output;
    off_t                                max_temp_file_size; /* the pipe's */
    ngx_http_event_handler_pt            read_handler;
    ngx_http_event_handler_pt            write_handler;
    ngx_msec_t                           start;       /* the flight's */
    ngx_http_singleflight_waiter_t       waiter;      /* its client gone:
                                                         nobody else reading
                                                         ends the upstream */
    ngx_event_t                          event;
    unsigned                             hosted:1;
    unsigned                             timed:1;     /* flight_seconds at
                                                         its upstream's end */
    unsigned                             header:1;
    unsigned                             storing:1;
    unsigned                             sealed:1;
    unsigned                             gone:1;      /* its client: the
                                                         upstream is read on
                                                         for the others */
};


static ngx_uint_t ngx_http_singleflight_tee_whole(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_uint_t ngx_http_singleflight_tee_failed(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_msec_t ngx_http_singleflight_tee_first_try(ngx_http_request_t *r);
static ngx_http_singleflight_tee_t *ngx_http_singleflight_tee_new(
    ngx_http_request_t *r);
static void ngx_http_singleflight_tee_init(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_tee_t *tee);
static ngx_int_t ngx_http_singleflight_tee_error(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee);
static ngx_int_t ngx_http_singleflight_tee_store(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee, ngx_uint_t creds, ngx_array_t *vary,
    ngx_uint_t header_only);
static void ngx_http_singleflight_tee_alone(ngx_http_singleflight_tee_t *tee,
    ngx_uint_t reason);
static void ngx_http_singleflight_tee_orphan(ngx_http_singleflight_tee_t *tee,
    ngx_log_t *log);
static ngx_int_t ngx_http_singleflight_tee_input_init(void *data);
static ngx_int_t ngx_http_singleflight_tee_pipe_input(ngx_event_pipe_t *p,
    ngx_buf_t *buf);
static void ngx_http_singleflight_tee_spool(ngx_event_pipe_t *p,
    ngx_http_singleflight_tee_t *tee);
static ngx_int_t ngx_http_singleflight_tee_output(void *data,
    ngx_chain_t *in);
static void ngx_http_singleflight_tee_consumed(ngx_chain_t *cl);
static void ngx_http_singleflight_tee_read(ngx_http_request_t *r);
static void ngx_http_singleflight_tee_write(ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_tee_gone(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee, ngx_err_t err);
static void ngx_http_singleflight_tee_listen(ngx_http_singleflight_tee_t *tee);
static void ngx_http_singleflight_tee_wake(ngx_http_singleflight_waiter_t *w);
static void ngx_http_singleflight_tee_event(ngx_event_t *ev);
static void ngx_http_singleflight_tee_clear(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee);
static void ngx_http_singleflight_tee_finalize(ngx_http_request_t *r,
    ngx_int_t rc);
static void ngx_http_singleflight_tee_end(ngx_http_singleflight_tee_t *tee,
    ngx_uint_t complete, ngx_log_t *log);
static void ngx_http_singleflight_tee_cleanup(void *data);
static void **ngx_http_singleflight_tee_location(ngx_http_request_t *r);
static ngx_http_singleflight_tee_t *ngx_http_singleflight_tee_of(
    ngx_http_request_t *r);


/*
 * does the request ask for the whole representation, with nothing the
 * origin must read?  (Its request_body is not looked at: the upstream
 * module makes one for every request it sends.)
 */

static ngx_uint_t
ngx_http_singleflight_tee_whole(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_headers_in_t             *h;
    ngx_http_singleflight_loc_conf_t  *conf;

    h = &r->headers_in;
    conf = ctx->conf;

    return r == r->main
           && r->method == NGX_HTTP_GET
           && h->content_length_n <= 0
           && h->chunked == 0
           && h->range == NULL
           && h->if_range == NULL
           && h->if_none_match == NULL
           && h->if_modified_since == NULL
           && h->if_match == NULL
           && h->if_unmodified_since == NULL
           && conf->hedge == 0
           && conf->lazy
           && !ctx->range_sent;
}


/*
 * The leader goes on through the phases to the location's content
 * handler, if nothing in it keeps it from the whole response.
 * NGX_DECLINED: it does; NGX_ERROR: it fetches by a subrequest.
 */

ngx_int_t
ngx_http_singleflight_tee_start(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_singleflight_tee_t  *tee;

    if (r->request_body != NULL || !ngx_http_singleflight_tee_whole(r, ctx)) {
        return NGX_ERROR;
    }

    tee = ngx_http_singleflight_tee_new(r);

    if (tee == NULL
        || ngx_http_singleflight_loop_header(r, &r->headers_in.headers)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_singleflight_tee_init(r, ctx, tee);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight leader fetches flight %uL itself",
                   ctx->fn->id);

    return NGX_DECLINED;
}


/*
 * singleflight_lone direct: the request that went its own way has its
 * header ("r"), or ends before it (NULL), and a flight of its slot waits
 * for it (claim_pass(), _zone.h).  The request takes the flight over as
 * its fetch, from this header on, when its response may be the flight's:
 * the same key, not redirected, and the whole representation (of which
 * the handler checked only the common part).  Otherwise it lets the
 * flight go, and a follower fetches it.  Its upstream request carried
 * CDN-Loop, as a fetch's (_handler.c): if it came back here, it did not
 * wait for this flight.
 */

ngx_int_t
ngx_http_singleflight_tee_adopt(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_str_t                     *key, value[2];
    ngx_log_t                     *log;
    ngx_uint_t                     how, generation;
    ngx_atomic_uint_t              seq;
    ngx_http_singleflight_tee_t   *tee;
    ngx_http_singleflight_node_t  *fn, *gone;

    key = NULL;
    tee = NULL;
    log = ngx_cycle->log;

    if (r != NULL) {
        log = r->connection->log;

        if (!r->internal
            && ngx_http_singleflight_tee_whole(r, ctx)
            && ngx_http_singleflight_key_values(r, ctx, value) == NGX_OK
            && ngx_http_singleflight_key_make(r, ctx, value) == NGX_OK)
        {
            tee = ngx_http_singleflight_tee_new(r);
            key = (tee != NULL) ? &ctx->key : NULL;
        }
    }

    how = ngx_http_singleflight_flight_take(ctx->zone, ctx->claim, key,
                                            ctx->hash,
                                            ngx_http_singleflight_tee_failed(
                                                              r, ctx->conf),
                                            &fn, &gone, &generation, &seq,
                                            log);

    if (gone != NULL) {
        ngx_http_singleflight_wait_wake(ctx->zone, gone, how);
    }

    if (fn == NULL) {
        return NGX_OK;
    }

    /* the flight's leader from here, as if it had led it from the start */

    ctx->fn = fn;
    ctx->generation = generation;
    ctx->seen = seq;
    ctx->counted = 1;
    ctx->cursor.fn = fn;
    ctx->uri_changes = r->uri_changes;
    ctx->host = 1;
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_LEADER;

    ngx_http_singleflight_tee_init(r, ctx, tee);

    if (r->upstream != NULL && r->upstream->start_time != 0) {
        /*
         * its times count from its first upstream try, not from the
         * flight, which a later request made
         */
        tee->start = ngx_http_singleflight_tee_first_try(r);
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight request on its own way fetches flight %uL",
                   fn->id);

    return ngx_http_singleflight_tee_header(r, ctx);
}


/*
 * Did the request's upstream fail before a header, for a
 * singleflight_promote condition, and an error_page take it elsewhere?
 * Its upstream is the first of its states (it claimed its slot in its
 * first location, with none before), up to the empty state nginx puts
 * before the next location's.  As at a failed header (tee_error()): an
 * origin's status when it sent a header (not one redirecting by
 * X-Accel-Redirect), nginx's 504 or 502 otherwise.
 */

static ngx_uint_t
ngx_http_singleflight_tee_failed(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_uint_t                  i, match;
    ngx_http_upstream_state_t  *state;

    if (r == NULL || !r->internal || r->upstream_states == NULL
        || (conf->promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF))
    {
        return 0;
    }

    state = r->upstream_states->elts;

    for (i = 0; i < r->upstream_states->nelts; i++) {
        if (state[i].peer == NULL) {
            break;
        }
    }

    if (i == 0) {
        return 0;
    }

    state = &state[i - 1];

    if (state->status < NGX_HTTP_INTERNAL_SERVER_ERROR) {
        return 0;
    }

    if (state->header_time != (ngx_msec_t) -1) {

        if (r->upstream != NULL
            && r->upstream->headers_in.x_accel_redirect != NULL)
        {
            return 0;
        }

        match = ngx_http_singleflight_promote_status(state->status);

    } else if (state->status == NGX_HTTP_GATEWAY_TIME_OUT) {
        match = NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT;

    } else {
        match = NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR;
    }

    return (match & conf->promote) != 0;
}


/*
 * When the request's upstream began: its try's start, less the response
 * times of the tries proxy_next_upstream made before it, back to the
 * empty state nginx puts between two upstreams of one request
 */

static ngx_msec_t
ngx_http_singleflight_tee_first_try(ngx_http_request_t *r)
{
    ngx_uint_t                  i;
    ngx_msec_t                  start;
    ngx_http_upstream_state_t  *state;

    start = r->upstream->start_time;

    if (r->upstream_states == NULL || r->upstream_states->nelts < 2) {
        return start;
    }

    state = r->upstream_states->elts;

    for (i = r->upstream_states->nelts - 1; i-- > 0; /* void */) {

        if (state[i].peer == NULL
            || state[i].response_time == (ngx_msec_t) -1)
        {
            break;
        }

        start -= state[i].response_time;
    }

    return start;
}


/* a tee, and its pool cleanup (without a handler until it is used) */

static ngx_http_singleflight_tee_t *
ngx_http_singleflight_tee_new(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_singleflight_tee_t  *tee;

    tee = ngx_pcalloc(r->pool, sizeof(ngx_http_singleflight_tee_t));
    if (tee == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    tee->cln = cln;

    return tee;
}


/* the request is its flight's fetch */

static void
ngx_http_singleflight_tee_init(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_singleflight_tee_t *tee)
{
    tee->r = r;
    tee->ctx = ctx;
    tee->zone = ctx->zone;
    tee->fn = ctx->fn;
    tee->generation = ctx->generation;
    tee->uri = r->uri;
    tee->args = r->args;
    tee->loc_conf = ngx_http_singleflight_tee_location(r);
    tee->start = ctx->fn->start;
    tee->hosted = 1;

    /* a pool cleanup added later runs earlier: before the context's */
    tee->cln->handler = ngx_http_singleflight_tee_cleanup;
    tee->cln->data = tee;

    ctx->tee = tee;
    ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_ALONE;
}


/* is the request's upstream response copied into its flight for others? */

ngx_uint_t
ngx_http_singleflight_tee_storing(ngx_http_singleflight_ctx_t *ctx)
{
    return ctx->tee != NULL && ctx->tee->storing;
}


/* the leader's response header: the flight ends, is shared, or goes on */

ngx_int_t
ngx_http_singleflight_tee_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_log_t                         *log;
    ngx_uint_t                         reason, creds, lazy, header_only;
    ngx_array_t                       *vary;
    ngx_http_upstream_t               *u;
    ngx_http_singleflight_tee_t       *tee;
    ngx_http_singleflight_counters_t  *counters;
    ngx_http_singleflight_loc_conf_t  *conf;

    tee = ctx->tee;

    if (tee->header || !tee->hosted) {
        return NGX_OK;
    }

    tee->header = 1;

    log = r->connection->log;
    conf = ctx->conf;
    counters = tee->zone->counters;
    u = r->upstream;

    if (ngx_http_singleflight_share_cached(r)) {
        /* a cache hit is not a flight: as a request the module never saw */
        if (ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_LEADER) {
            ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NONE;
        }

    } else {

        if (ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_LEADER) {
            /* a flight led (flights_total), counted once it is no hit */
            (void) ngx_atomic_fetch_add(&counters->flights, 1);
        }

        if (r->upstream_states != NULL && r->upstream_states->nelts) {
            (void) ngx_atomic_fetch_add(&counters->origin_requests[
                                        NGX_HTTP_SINGLEFLIGHT_ORIGIN_FIRST],
                                        1);

            if (ngx_http_singleflight_share_answered(r)) {
                /* how long the origin took: nginx's own 502 or 504 not */
                ngx_http_singleflight_stats_observe(&counters->header,
                                                    ngx_current_msec
                                                    - tee->start);
            }

            if (u != NULL && u->peer.connection != NULL && !u->header_sent) {
                /* its last byte ends the flight's time, stored or not */
                tee->timed = 1;
                tee->finalize = u->finalize_request;
                u->finalize_request = ngx_http_singleflight_tee_finalize;
            }
        }
    }

    if (r->uri_changes != ctx->uri_changes
        && ngx_http_singleflight_share_checked(r, tee->loc_conf))
    {
        /*
         * redirected where it met checks of clients that its followers
         * did not (ngx_http_singleflight_share_checked()): its own
         * response, and a follower fetches, whose fetch is then nobody's
         */
        ngx_http_singleflight_tee_orphan(tee, log);
        return NGX_OK;
    }

    if (r->headers_out.status >= NGX_HTTP_INTERNAL_SERVER_ERROR
        && ngx_http_singleflight_tee_error(r, tee) == NGX_OK)
    {
        return NGX_OK;
    }

    if (r->headers_out.status == NGX_HTTP_PARTIAL_CONTENT) {
        /*
         * a part asked for by the location itself (slice's
         * "proxy_set_header Range $slice_range", after a redirect into
         * such a location): not the representation, which a fetch gets
         */
        ngx_http_singleflight_tee_orphan(tee, log);
        return NGX_OK;
    }

    vary = NULL;

    reason = ngx_http_singleflight_share_reason(r, ctx, &creds, &vary);

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_ERROR) {
        /* the request fails; not its flight, which a follower fetches */
        ngx_http_singleflight_tee_orphan(tee, log);
        return NGX_ERROR;
    }

    if (reason != NGX_HTTP_SINGLEFLIGHT_R_NONE) {
        ngx_http_singleflight_tee_alone(tee, reason);
        return NGX_OK;
    }

    header_only = ngx_http_singleflight_share_header_only(r);

    lazy = header_only
           || (r->headers_out.content_length_n >= 0
               && r->headers_out.content_length_n
                  <= (conf->lazy_max ? conf->lazy_max
                                     : (off_t) conf->memory));

    if (lazy
        && ngx_http_singleflight_flight_solo(tee->zone, tee->fn,
                                             tee->generation, log)
           == NGX_OK)
    {
        /* nobody followed: as without the module from here */
        (void) ngx_atomic_fetch_add(&counters->unstored, 1);
        ngx_http_singleflight_tee_end(tee, 0, log);
        return NGX_OK;
    }

    if (!header_only
        && (u == NULL || u->peer.connection == NULL || u->header_sent
            || !u->buffering || u->pipe == NULL
            || u->input_filter_init == NULL))
    {
        /*
         * not a response the upstream is about to send through its pipe
         * (an error page, a file after X-Accel-Redirect, one nginx does
         * not buffer, which a follower would get at the leader's pace):
         * a follower fetches it
         */
        ngx_http_singleflight_tee_orphan(tee, log);
        return NGX_OK;
    }

    return ngx_http_singleflight_tee_store(r, tee, creds, vary, header_only);
}


/*
 * A 5xx, the origin's or nginx's own (an upstream that failed or timed
 * out): the followers try once more themselves where singleflight_promote
 * says so and a try is left (this one was the flight's first), or get the
 * flight's failure.  NGX_DECLINED: an origin's 5xx
 * shared as any response (singleflight_share_errors).
 */

static ngx_int_t
ngx_http_singleflight_tee_error(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee)
{
    ngx_int_t                          how;
    ngx_uint_t                         status, reason, match, promote;
    ngx_http_upstream_t               *u;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = tee->ctx->conf;
    promote = conf->promote;
    status = r->headers_out.status;
    u = r->upstream;

    if (u != NULL && u->headers_in.status_n == status) {
        reason = NGX_HTTP_SINGLEFLIGHT_R_ORIGIN;
        match = ngx_http_singleflight_promote_status(status) & promote;

    } else if (status == NGX_HTTP_GATEWAY_TIME_OUT) {
        reason = NGX_HTTP_SINGLEFLIGHT_R_TIMEOUT;
        match = promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT;

    } else {
        reason = NGX_HTTP_SINGLEFLIGHT_R_ERROR;
        match = promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR;
    }

    if (match && !(promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF)
        && ngx_http_singleflight_flight_spend_try(tee->zone, tee->fn,
                                                  tee->generation)
           == NGX_OK)
    {
        /* its failure was the flight's first try: a follower's the next */
        ngx_http_singleflight_tee_orphan(tee, r->connection->log);
        return NGX_OK;
    }

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_ORIGIN && conf->share_errors) {
        return NGX_DECLINED;
    }

    /* the flight failed: no complete response of it to time */
    tee->timed = 0;

    how = ngx_http_singleflight_flight_fail(tee->zone, tee->fn,
                                     tee->generation, reason,
                                     reason == NGX_HTTP_SINGLEFLIGHT_R_ORIGIN
                                     ? 0 : status,
                                     NULL, r->connection->log);
    ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);

    ngx_http_singleflight_tee_end(tee, 0, r->connection->log);

    return NGX_OK;
}


/* the header into the flight, and the body after it as the pipe reads it */

static ngx_int_t
ngx_http_singleflight_tee_store(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee, ngx_uint_t creds, ngx_array_t *vary,
    ngx_uint_t header_only)
{
    size_t                             len;
    u_char                            *block;
    ngx_int_t                          how;
    ngx_uint_t                         flags;
    ngx_http_upstream_t               *u;
    ngx_http_singleflight_where_t      where;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = tee->ctx->conf;
    u = r->upstream;

    ngx_http_singleflight_clone_where(tee->r, &tee->uri, &tee->args, &where);
    where.loc_conf = ngx_http_singleflight_tee_location(tee->r);

    flags = 0;

    if (conf->resume && !where.moved.flags
        && where.loc_conf == tee->loc_conf)
    {
        ngx_http_singleflight_resume_note(&tee->resume, r);

        if (tee->resume.validator.len) {
            flags |= NGX_HTTP_SINGLEFLIGHT_H_RESUMABLE;

        } else if (tee->resume.whole) {
            flags |= NGX_HTTP_SINGLEFLIGHT_H_WHOLE;
        }
    }

    flags |= NGX_HTTP_SINGLEFLIGHT_H_CREDS(creds);

    block = ngx_http_singleflight_store_serialize(r, &where, vary, flags,
                                                  &len);
    if (block == NULL) {
        ngx_http_singleflight_tee_orphan(tee, r->connection->log);
        return NGX_ERROR;
    }

    tee->writer.zone = tee->zone;
    tee->writer.fn = tee->fn;
    tee->writer.memory = conf->memory;
    tee->writer.temp_path = conf->temp_path;
    tee->writer.pool = r->pool;
    tee->writer.log = r->connection->log;
    tee->writer.length = header_only ? 0 : r->headers_out.content_length_n;

    if (ngx_http_singleflight_store_room(&tee->writer) != NGX_OK) {
        /* neither the zone nor a file has room: the leader's alone */
        ngx_http_singleflight_tee_alone(tee, NGX_HTTP_SINGLEFLIGHT_R_NOMEM);
        return NGX_OK;
    }

    how = ngx_http_singleflight_flight_header(tee->zone, tee->fn,
                                              tee->generation, block, len,
                                              header_only,
                                              r->connection->log);

    if (how == NGX_ABORT) {
        /* no room in the zone for the header: the leader's alone */
        ngx_http_singleflight_tee_alone(tee, NGX_HTTP_SINGLEFLIGHT_R_NOMEM);
        return NGX_OK;
    }

    if (how == NGX_DECLINED) {
        /* no longer its flight (its worker's share was reclaimed?) */
        ngx_http_singleflight_tee_end(tee, 0, r->connection->log);
        return NGX_OK;
    }

    ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);

    if (header_only) {
        /* complete as it is */
        ngx_http_singleflight_tee_end(tee, 0, r->connection->log);
        return NGX_OK;
    }

    tee->storing = 1;

    tee->input_filter_init = u->input_filter_init;
    u->input_filter_init = ngx_http_singleflight_tee_input_init;

    if (u->finalize_request != ngx_http_singleflight_tee_finalize) {
        tee->finalize = u->finalize_request;
        u->finalize_request = ngx_http_singleflight_tee_finalize;
    }

    return NGX_OK;
}


/* its leader's alone: everybody else goes alone */

static void
ngx_http_singleflight_tee_alone(ngx_http_singleflight_tee_t *tee,
    ngx_uint_t reason)
{
    ngx_int_t  how;

    ngx_http_singleflight_store_unroom(&tee->writer);

    how = ngx_http_singleflight_flight_alone(tee->zone, tee->fn,
                                             tee->generation, reason,
                                             tee->ctx->conf->private_ttl,
                                             NULL, tee->r->connection->log);
    ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);

    ngx_http_singleflight_tee_end(tee, 0, tee->r->connection->log);
}


/* nothing to share: a follower takes the flight over with a fetch */

static void
ngx_http_singleflight_tee_orphan(ngx_http_singleflight_tee_t *tee,
    ngx_log_t *log)
{
    ngx_int_t  how;

    /* the flight's response is its fetch's: the leader's is not timed */
    tee->timed = 0;

    how = ngx_http_singleflight_flight_orphan(tee->zone, tee->fn,
                                              tee->generation, log);
    ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);

    ngx_http_singleflight_tee_end(tee, 0, log);
}


/*
 * The cache answers the others without waiting for this request's
 * origin (share_unwaited()): the flight goes, and a follower's fetch asks
 * the cache.  Before the header only, once.
 */

void
ngx_http_singleflight_tee_forgo(ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_singleflight_tee_t  *tee;

    tee = ctx->tee;

    if (tee != NULL && tee->hosted && !tee->header) {
        ngx_http_singleflight_tee_orphan(tee, tee->r->connection->log);
    }
}


/* the upstream module chose its body filter: what it gives is copied */

static ngx_int_t
ngx_http_singleflight_tee_input_init(void *data)
{
    ngx_int_t                     rc;
    ngx_http_request_t           *r;
    ngx_http_upstream_t          *u;
    ngx_http_singleflight_tee_t  *tee;

    /* every upstream module of nginx's makes its request the context */
    r = data;
    u = r->upstream;

    tee = ngx_http_singleflight_tee_of(r);

    u->input_filter_init = tee->input_filter_init;

    rc = tee->input_filter_init(data);

    if (rc == NGX_OK && tee->storing && u->pipe != NULL
        && u->pipe->input_ctx == r)
    {
        tee->pipe_input = u->pipe->input_filter;
        u->pipe->input_filter = ngx_http_singleflight_tee_pipe_input;

        if (u->pipe->output_ctx == r) {
            tee->output = u->pipe->output_filter;
            u->pipe->output_filter = ngx_http_singleflight_tee_output;
            tee->max_temp_file_size = u->pipe->max_temp_file_size;

            tee->read_handler = r->read_event_handler;
            r->read_event_handler = ngx_http_singleflight_tee_read;
        }
    }

    return rc;
}


/*
 * The response to the leader's own client.  If that client goes away
 * while others read the flight, the origin's response is read on for
 * them, to its end, as nginx reads on for its cache (what its client
 * would have got is dropped); the upstream request ends as without the
 * module once nobody else reads.
 */

static ngx_int_t
ngx_http_singleflight_tee_output(void *data, ngx_chain_t *in)
{
    ngx_int_t                     rc;
    ngx_event_pipe_t             *p;
    ngx_http_request_t           *r;
    ngx_http_singleflight_tee_t  *tee;

    r = data;
    tee = ngx_http_singleflight_tee_of(r);

    if (tee->write_handler == NULL) {
        /* the upstream module's, set once the pipe is made */
        tee->write_handler = r->write_event_handler;
        r->write_event_handler = ngx_http_singleflight_tee_write;
    }

    if (!tee->gone) {
        rc = tee->output(data, in);

        if (rc != NGX_ERROR || !tee->storing) {
            return rc;
        }

        /*
         * whatever failed (the client, or a filter), nothing more goes to
         * that client: no end of a body it did not get whole
         */
        (void) ngx_http_singleflight_tee_gone(r, tee, 0);
    }

    if (!tee->storing) {
        /* nobody else reads it any more */
        return NGX_ERROR;
    }

    /* what the pipe gives (and what it holds as sent) is taken */

    p = r->upstream->pipe;

    ngx_http_singleflight_tee_consumed(in);
    ngx_http_singleflight_tee_consumed(p->busy);

    return NGX_OK;
}


static void
ngx_http_singleflight_tee_consumed(ngx_chain_t *cl)
{
    for ( /* void */ ; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
    }
}


/*
 * The client's send_timeout, while the leader's upstream request feeds
 * others: as a client gone (ngx_http_singleflight_tee_output()), not the
 * end of the upstream request.  Without it, an origin pausing longer than
 * send_timeout while that client reads nothing would cut the others'
 * response.  Nothing more is written to that client: no timer, no event.
 */

static void
ngx_http_singleflight_tee_write(ngx_http_request_t *r)
{
    ngx_event_t                  *wev;
    ngx_http_singleflight_tee_t  *tee;

    tee = ngx_http_singleflight_tee_of(r);
    wev = r->connection->write;

    if (wev->timedout && tee->storing && !tee->gone) {

        if (!ngx_http_singleflight_tee_gone(r, tee, NGX_ETIMEDOUT)) {
            /* its next write is as a gone client's (tee_gone()) */
            r->connection->timedout = 1;
            wev->timedout = 0;
        }
    }

    ngx_http_singleflight_tee_clear(r, tee);

    tee->write_handler(r);
}


/*
 * The client's side, while the leader's upstream request feeds others.
 * nginx's own check tells whether the client closed its connection, told
 * that the upstream response is read on (as for a cache); then the
 * upstream request ends only if nobody else reads the flight.
 */

static void
ngx_http_singleflight_tee_read(ngx_http_request_t *r)
{
    unsigned                      cacheable;
    ngx_http_upstream_t          *u;
    ngx_http_singleflight_tee_t  *tee;

    tee = ngx_http_singleflight_tee_of(r);
    u = r->upstream;

    if (tee != NULL && tee->storing && !tee->gone && u != NULL) {
        cacheable = u->cacheable;
        u->cacheable = 1;

        tee->read_handler(r);

        u->cacheable = cacheable;

        if (!r->connection->error
            || !ngx_http_singleflight_tee_gone(r, tee, 0))
        {
            return;
        }
    }

    if (tee == NULL || !tee->storing) {
        r->read_event_handler = (tee != NULL) ? tee->read_handler
                                              : ngx_http_block_reading;
        r->read_event_handler(r);
        return;
    }

    ngx_http_block_reading(r);
    ngx_http_singleflight_tee_clear(r, tee);
}


/*
 * The leader's client is gone: it reads the flight no more.  1: nobody
 * else does either, and the upstream request ends as without the module;
 * 0: it is read on for the others, and nothing more goes to that client.
 */

static ngx_uint_t
ngx_http_singleflight_tee_gone(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee, ngx_err_t err)
{
    ngx_int_t                     how;
    ngx_event_t                  *wev;
    ngx_http_singleflight_ctx_t  *ctx;

    tee->gone = 1;
    r->connection->error = 1;
    ctx = tee->ctx;

    if (ctx->counted && ctx->fn == tee->fn) {
        ctx->counted = 0;
        ctx->fn = NULL;
        ctx->cursor.fn = NULL;

        how = ngx_http_singleflight_flight_leave(tee->zone, tee->fn, 1, 0,
                                                 r->connection->log);
        ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);
    }

    if (tee->storing
        && ngx_http_singleflight_flight_abandoned(tee->zone, tee->fn,
                                                  tee->generation))
    {
        (void) ngx_atomic_fetch_add(&tee->zone->counters->abandoned, 1);
        tee->storing = 0;
        ngx_http_singleflight_store_close(&tee->writer);
    }

    if (!tee->storing) {
        return 1;
    }

    ngx_log_error(NGX_LOG_INFO, r->connection->log, err,
                  "singleflight client of flight %uL %s, its upstream "
                  "response is read on for the others", tee->fn->id,
                  err ? "timed out" : "gone");

    /*
     * The pipe gives its output filter nothing while the client's
     * connection is not ready for writing, and arms send_timeout for it:
     * gone with a full socket, its buffers would fill up (no temporary
     * file, or a full one) and stop the origin, or the timer would end
     * the upstream request once the origin paused that long.  Ready from
     * now on, what it writes is taken as sent (tee_output()), at once.
     */

    wev = r->connection->write;

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    wev->ready = 1;
    wev->delayed = 0;

    if (!wev->posted) {
        ngx_post_event(wev, &ngx_posted_events);
    }

    ngx_http_singleflight_tee_clear(r, tee);

    tee->event.handler = ngx_http_singleflight_tee_event;
    tee->event.data = tee;
    tee->event.log = r->connection->log;
    tee->waiter.handler = ngx_http_singleflight_tee_wake;
    tee->waiter.data = tee;

    ngx_http_singleflight_tee_listen(tee);

    return 0;
}


/*
 * nginx ends a request whose connection has an error as soon as any
 * subrequest of it ends (a mirror): the upstream request the others read
 * would end with it.  While it is read on for them, the error of the gone
 * client's connection stays cleared (HTTP/2 sets it again when the whole
 * connection goes after the stream); it is set again when the upstream
 * request ends (tee_finalize()).  Nothing goes to that client meanwhile
 * (tee_output()).  Not with subrequests whose output goes to the client
 * in order (SSI includes): they would write to it.
 */

static void
ngx_http_singleflight_tee_clear(ngx_http_request_t *r,
    ngx_http_singleflight_tee_t *tee)
{
    if (tee->gone && tee->storing && r->postponed == NULL) {
        r->connection->error = 0;
    }
}


/*
 * Its client gone, the leader's upstream request listens for the others
 * leaving: with nobody left, it ends as without the module, even while
 * the origin sends nothing (a body buffer finds it out too).
 */

static void
ngx_http_singleflight_tee_listen(ngx_http_singleflight_tee_t *tee)
{
    if (tee->storing) {
        ngx_http_singleflight_wait_listen(tee->zone, tee->fn, tee->generation,
                                          &tee->waiter, &tee->event);
    }
}


static void
ngx_http_singleflight_tee_wake(ngx_http_singleflight_waiter_t *w)
{
    ngx_http_singleflight_tee_t  *tee = w->data;

    if (!tee->event.posted) {
        ngx_post_event(&tee->event, &ngx_posted_events);
    }
}


static void
ngx_http_singleflight_tee_event(ngx_event_t *ev)
{
    ngx_connection_t             *c;
    ngx_http_request_t           *r;
    ngx_http_singleflight_tee_t  *tee;

    tee = ev->data;

    if (!tee->storing) {
        return;
    }

    if (!ngx_http_singleflight_flight_abandoned(tee->zone, tee->fn,
                                                tee->generation))
    {
        ngx_http_singleflight_tee_listen(tee);
        return;
    }

    (void) ngx_atomic_fetch_add(&tee->zone->counters->abandoned, 1);
    tee->storing = 0;
    ngx_http_singleflight_store_close(&tee->writer);

    /* nginx's own check finds the client gone and ends the upstream */

    r = tee->r;
    c = r->connection;
    c->error = 1;

    r->read_event_handler = tee->read_handler;
    r->read_event_handler(r);

    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_singleflight_tee_pipe_input(ngx_event_pipe_t *p, ngx_buf_t *buf)
{
    off_t                         length;
    ngx_int_t                     rc, how;
    ngx_chain_t                  *cl, **last;
    ngx_atomic_uint_t             seq;
    ngx_http_request_t           *r;
    ngx_http_singleflight_tee_t  *tee;
    ngx_http_singleflight_ctx_t  *ctx;

    r = p->input_ctx;
    tee = ngx_http_singleflight_tee_of(r);
    ctx = tee->ctx;

    /* p->last_in means something only while p->in has links */
    last = p->in ? p->last_in : NULL;

    rc = tee->pipe_input(p, buf);

    ngx_http_singleflight_tee_spool(p, tee);

    if (rc != NGX_OK || !tee->storing) {
        return rc;
    }

    length = tee->writer.length;

    for (cl = last ? *last : p->in; cl; cl = cl->next) {

        if (cl->buf->last == cl->buf->pos) {
            continue;
        }

        if (length >= 0 && tee->writer.stored + (cl->buf->last - cl->buf->pos)
                           > length)
        {
            /* more than its Content-Length: no reader gets any of it */
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "singleflight upstream sent more than its "
                          "Content-Length of %O bytes", length);
            ngx_http_singleflight_tee_end(tee, 0, r->connection->log);
            return rc;
        }

        if (ngx_http_singleflight_store_append(&tee->writer, cl->buf->pos,
                                               cl->buf->last - cl->buf->pos)
            != NGX_OK)
        {
            ngx_http_singleflight_tee_end(tee, 0, r->connection->log);
            return rc;
        }
    }

    if (tee->writer.stored == ngx_http_singleflight_flight_length(tee->fn)) {
        return rc;
    }

    if (ctx->conf->max_size && !tee->sealed
        && tee->writer.stored > ctx->conf->max_size)
    {
        /* who reads it goes on, nobody joins any more */
        tee->sealed = 1;

        if (ngx_http_singleflight_flight_seal(tee->zone, tee->fn,
                                              tee->generation,
                                              r->connection->log))
        {
            (void) ngx_atomic_fetch_add(&tee->zone->counters->oversized, 1);
        }
    }

    how = ngx_http_singleflight_flight_body(tee->zone, tee->fn,
                                            tee->generation,
                                            tee->writer.stored, NULL, &seq,
                                            r->connection->log);

    if (how == NGX_ABORT || how == NGX_DECLINED) {
        /* nobody else reads it any more: the leader goes on alone */
        if (how == NGX_ABORT) {
            (void) ngx_atomic_fetch_add(&tee->zone->counters->abandoned, 1);
        }

        tee->storing = 0;
        ngx_http_singleflight_store_close(&tee->writer);

        if (tee->gone) {
            /* with nobody at all: as a failed write to its client */
            p->downstream_error = 1;
        }

        return rc;
    }

    ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);

    return rc;
}


/*
 * The others read what the origin sends, not what the leader's client
 * takes: while they read, its response goes on to the temporary file
 * past the location's *_max_temp_file_size (0 too), where the pipe would
 * stop reading the origin at that client's pace; with nobody else, the
 * location's limit again.  Looked at as the origin's bytes come.
 */

static void
ngx_http_singleflight_tee_spool(ngx_event_pipe_t *p,
    ngx_http_singleflight_tee_t *tee)
{
    ngx_uint_t  own;

    if (tee->output == NULL) {
        /* the pipe does not write to the leader's client */
        return;
    }

    own = (tee->ctx->counted && tee->ctx->fn == tee->fn);

    if (tee->storing && ngx_http_singleflight_flight_readers(tee->fn) > own) {
        p->max_temp_file_size = NGX_MAX_OFF_T_VALUE;

    } else {
        p->max_temp_file_size = tee->max_temp_file_size;
    }
}


/* the upstream request is over: whole (rc 0), or not */

static void
ngx_http_singleflight_tee_finalize(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_uint_t                    complete;
    ngx_http_singleflight_tee_t  *tee;

    tee = ngx_http_singleflight_tee_of(r);

    if (tee->gone) {
        /* as nginx set it (tee_gone()): no keep-alive, no last buffer */
        r->connection->error = 1;
    }

    if (tee->gone && r->upstream->pipe != NULL) {
        /*
         * its client gone, the upstream ends as after a failed write to
         * it: no last buffer through the output filters, where the copy
         * filter may still hold buffers of the pipe, taken as sent
         * (ngx_http_singleflight_tee_output()) and empty now
         */
        r->upstream->pipe->downstream_error = 1;
    }

    r->upstream->finalize_request = tee->finalize;
    tee->finalize(r, rc);

    complete = (rc == 0
                && (tee->writer.length < 0
                    || tee->writer.stored == tee->writer.length));

    if (tee->timed && rc == 0) {
        tee->timed = 0;
        ngx_http_singleflight_stats_observe(&tee->zone->counters->body,
                                            ngx_current_msec - tee->start);
    }

    ngx_http_singleflight_tee_end(tee, complete, r->connection->log);
}


/* the leader's part as the fetch is over: complete, broken off, or none */

static void
ngx_http_singleflight_tee_end(ngx_http_singleflight_tee_t *tee,
    ngx_uint_t complete, ngx_log_t *log)
{
    ngx_int_t                     how;
    ngx_str_t                     trailers;
    ngx_uint_t                    reader;
    ngx_atomic_uint_t             seq;
    ngx_http_singleflight_ctx_t  *ctx;

    ngx_http_singleflight_wait_unpark(&tee->waiter);

    if (tee->event.posted) {
        ngx_delete_posted_event(&tee->event);
    }

    ngx_http_singleflight_store_unroom(&tee->writer);

    if (!tee->hosted) {
        return;
    }

    tee->hosted = 0;
    ctx = tee->ctx;

    /* its use as a reader goes with its use as the fetch, in one step */
    reader = (ctx->counted && ctx->fn == tee->fn);

    if (reader) {
        ctx->counted = 0;
        ctx->fn = NULL;
        ctx->cursor.fn = NULL;
    }

    if (tee->storing && !complete) {
        tee->storing = 0;
        ngx_http_singleflight_store_close(&tee->writer);

        how = ngx_http_singleflight_flight_dropped(tee->zone, tee->fn,
                                                   tee->generation, reader,
                                                   log);
        ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);
        return;
    }

    if (tee->storing) {
        tee->storing = 0;

        trailers.len = 0;
        trailers.data = ngx_http_singleflight_store_trailers(tee->r,
                                                             &trailers.len);

        how = ngx_http_singleflight_flight_body(tee->zone, tee->fn,
                                                tee->generation,
                                                tee->writer.stored, &trailers,
                                                &seq, log);
        if (how != NGX_ABORT && how != NGX_DECLINED) {
            ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);
        }

        ngx_http_singleflight_store_close(&tee->writer);
    }

    if (reader) {
        how = ngx_http_singleflight_flight_end_direct(tee->zone, tee->fn,
                                                      tee->generation, log);
    } else {
        how = ngx_http_singleflight_flight_unhost(tee->zone, tee->fn,
                                                  tee->generation, log);
    }

    ngx_http_singleflight_wait_wake(tee->zone, tee->fn, how);
}


/* the leader's request is over: a flight it still fetches is let go */

static void
ngx_http_singleflight_tee_cleanup(void *data)
{
    ngx_http_singleflight_tee_t  *tee = data;

    if (!tee->hosted) {
        return;
    }

    if (!tee->header) {
        /* gone before its header: a follower takes over */

        if (tee->r->upstream_states != NULL
            && tee->r->upstream_states->nelts)
        {
            /* an origin request, as a fetch that got no header counts */
            (void) ngx_atomic_fetch_add(&tee->zone->counters->origin_requests[
                                        NGX_HTTP_SINGLEFLIGHT_ORIGIN_FIRST],
                                        1);
        }

        ngx_http_singleflight_tee_orphan(tee, ngx_cycle->log);
        return;
    }

    ngx_http_singleflight_tee_end(tee, 0, ngx_cycle->log);
}


/*
 * The location's configuration, as nginx keeps it: never r->loc_conf,
 * which may be a copy in the request's pool (_reader.c hides a request's
 * mirrors so), gone with the leader while its readers restore it
 */

static void **
ngx_http_singleflight_tee_location(ngx_http_request_t *r)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    return clcf->loc_conf;
}


/*
 * The leader's tee, from the upstream's callbacks: through its context,
 * or, once a redirect cleared the module's contexts, its pool cleanup
 */

static ngx_http_singleflight_tee_t *
ngx_http_singleflight_tee_of(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_singleflight_module);

    if (ctx != NULL && ctx->tee != NULL) {
        return ctx->tee;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_singleflight_tee_cleanup) {
            return cln->data;
        }
    }

    /* not reached: the callbacks are the tee's only while it lives */
    return NULL;
}
