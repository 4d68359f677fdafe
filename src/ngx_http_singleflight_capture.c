/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The capture: what a fetch does with its response's body, and how it
 * hears of its flight's readers.
 *
 * The fetch's subrequest writes its body at the origin's pace into the
 * module's body filter, first in the chain (_filter.c), which hands it
 * here.  A shared response is taken into the store (_store.c), in
 * memory or a temporary file, and published to the flight: no buffer
 * goes further, and no client paces it.  Its framing is checked on the
 * way: no reader ever gets more than its Content-Length, nor a body that
 * ends before it.  A response that is its leader's alone (direct mode,
 * _fetch.c decides) goes on through the leader's own filters instead,
 * paced by the leader's connection, and its leader pumps it from its
 * reader (fetch_pump()).
 *
 * The fetch also listens to its flight (_wait.c): each change it makes
 * wakes the readers of this worker that wait for it, and when nobody
 * reads the flight any more the fetch stops, as nginx stops an upstream
 * request whose client went away.
 *
 * The fetch's own structure is defined in the header, for the files
 * above that start it (_launch.c) and decide on its header (_fetch.c).
 */


#include "ngx_http_singleflight_fake.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_capture.h"
#include "ngx_http_singleflight_flight.h"


/* at most this much of a file buffer is copied per event */
#define NGX_HTTP_SINGLEFLIGHT_FILE_SLICE (1024 * 1024)


static ngx_int_t ngx_http_singleflight_capture_compare(
    ngx_http_singleflight_fetch_t *fetch, ngx_chain_t *in);
static ngx_int_t ngx_http_singleflight_capture_take(
    ngx_http_singleflight_fetch_t *fetch, ngx_chain_t **cl, ngx_uint_t *last);
static ngx_int_t ngx_http_singleflight_capture_framed(off_t length, off_t at,
    off_t size, ngx_uint_t end);
static void ngx_http_singleflight_capture_misframed(
    ngx_http_singleflight_fetch_t *fetch, off_t length, off_t end);
static void ngx_http_singleflight_capture_drop(ngx_chain_t *in);
static ngx_int_t ngx_http_singleflight_capture_publish(
    ngx_http_singleflight_fetch_t *fetch, ngx_uint_t last);
static ngx_int_t ngx_http_singleflight_capture_leader(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_uint_t ngx_http_singleflight_capture_answered(ngx_chain_t *in);
static void ngx_http_singleflight_capture_end_trailers(
    ngx_http_singleflight_fetch_t *fetch, ngx_str_t *trailers);
static void ngx_http_singleflight_capture_trailers(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_capture_wake(
    ngx_http_singleflight_waiter_t *w);
static void ngx_http_singleflight_capture_event(ngx_event_t *ev);
static void ngx_http_singleflight_capture_stop(
    ngx_http_singleflight_fetch_t *fetch);
static void ngx_http_singleflight_capture_halt(
    ngx_http_singleflight_fetch_t *fetch);


static ngx_http_output_body_filter_pt  ngx_http_singleflight_filter_self;
static ngx_http_output_body_filter_pt  ngx_http_singleflight_filter_next;

/* what a fetch asks of its host's reader (_reader.c), see capture_init() */
static ngx_http_singleflight_fetch_host_t  *ngx_http_singleflight_host_reader;


/* what a fetch asks of its host's reader (_reader.c) */

void
ngx_http_singleflight_capture_init(ngx_http_singleflight_fetch_host_t *host)
{
    ngx_http_singleflight_host_reader = host;
}


/* the module's body filter, and the one after it (_filter.c) */

void
ngx_http_singleflight_capture_filters(ngx_http_output_body_filter_pt self,
    ngx_http_output_body_filter_pt next)
{
    ngx_http_singleflight_filter_self = self;
    ngx_http_singleflight_filter_next = next;
}


/* ------------------------------------------------------------ body */

ngx_int_t
ngx_http_singleflight_capture_body(ngx_http_singleflight_fetch_t *fetch,
    ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t     rc;
    ngx_uint_t    last;
    ngx_chain_t  *cl;

    if (!fetch->header || fetch->retry || fetch->complete || fetch->stopping
        || fetch->resume.failed || fetch->lost)
    {
        /* nothing to keep: a body after a header-only response, say */
        ngx_http_singleflight_capture_drop(in);

        return fetch->stopping ? NGX_ERROR : NGX_OK;
    }

    if (fetch->resume.skip
        && ngx_http_singleflight_capture_compare(fetch, in) != NGX_OK)
    {
        /* not the same response: the flight ends as cut */
        return NGX_ERROR;
    }

    last = 0;

    if (fetch->pending == NULL) {

        /* the usual case: all of "in" stored now, no copy of its links */

        cl = in;

        rc = ngx_http_singleflight_capture_take(fetch, &cl, &last);

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

        rc = ngx_http_singleflight_capture_take(fetch, &fetch->pending, &last);

        if (rc == NGX_DECLINED) {
            fetch->pending = NULL;
            return NGX_ERROR;
        }

        if (rc != NGX_OK) {
            goto failed;
        }
    }

    rc = ngx_http_singleflight_capture_publish(fetch, last);

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
ngx_http_singleflight_capture_compare(ngx_http_singleflight_fetch_t *fetch,
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
                ngx_http_singleflight_capture_unresumed(fetch,
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
            ngx_http_singleflight_capture_unresumed(fetch, fetch->writer.log,
                                                  "is shorter");
            return NGX_ERROR;
        }
    }

    if (rs->skip == 0) {
        ngx_http_singleflight_capture_same(fetch, fetch->writer.log);
    }

    return NGX_OK;
}


/* a whole response asked for again goes on: its first bytes were those */

void
ngx_http_singleflight_capture_same(ngx_http_singleflight_fetch_t *fetch,
    ngx_log_t *log)
{
    (void) ngx_atomic_fetch_add(&fetch->zone->counters->resumes, 1);
    ngx_http_singleflight_flight_resumed(fetch->zone, fetch->fn);

    ngx_log_error(NGX_LOG_INFO, log, 0,
                  "singleflight flight %uL resumed at byte %O: the "
                  "response asked for again has the same first bytes",
                  fetch->fn->id, fetch->resume.from);
}


/* a whole response asked for again is not used: the flight ends as cut */

void
ngx_http_singleflight_capture_unresumed(ngx_http_singleflight_fetch_t *fetch,
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


/*
 * The buffers from "*cl" on go into the store, a file's at most
 * NGX_HTTP_SINGLEFLIGHT_FILE_SLICE bytes at a time: "*cl" is left at the
 * first buffer not wholly taken, NULL when all were.  NGX_DECLINED: a
 * buffer would take the body past the stored header's Content-Length, or
 * end it before, and is not taken (capture_misframed()).
 */

static ngx_int_t
ngx_http_singleflight_capture_take(ngx_http_singleflight_fetch_t *fetch,
    ngx_chain_t **cl, ngx_uint_t *last)
{
    off_t       size;
    size_t      budget, done;
    ngx_buf_t  *b;

    budget = NGX_HTTP_SINGLEFLIGHT_FILE_SLICE;

    for ( /* void */ ; *cl; *cl = (*cl)->next) {
        b = (*cl)->buf;
        size = ngx_buf_size(b);

        if (ngx_http_singleflight_capture_framed(fetch->writer.length,
                                               fetch->writer.stored, size,
                                               b->last_buf || b->last_in_chain)
            != NGX_OK)
        {
            ngx_http_singleflight_capture_misframed(fetch, fetch->writer.length,
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
ngx_http_singleflight_capture_framed(off_t length, off_t at, off_t size,
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
ngx_http_singleflight_capture_misframed(ngx_http_singleflight_fetch_t *fetch,
    off_t length, off_t end)
{
    ngx_log_t  *log;

    log = fetch->writer.log;

    fetch->resume.failed = 1;
    fetch->resume.skip = 0;

    if (fetch->resuming) {
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
ngx_http_singleflight_capture_drop(ngx_chain_t *in)
{
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
    }
}


/* what the body filter stored is published to the readers */

static ngx_int_t
ngx_http_singleflight_capture_publish(ngx_http_singleflight_fetch_t *fetch,
    ngx_uint_t last)
{
    ngx_int_t                          rc;
    ngx_str_t                          trailers, *end;
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

        if (ngx_http_singleflight_flight_seal(fetch->zone, fetch->fn,
                                              fetch->generation, log))
        {
            (void) ngx_atomic_fetch_add(&fetch->zone->counters->oversized,
                                        1);
        }
    }

    end = NULL;

    if (last) {
        end = &trailers;
        ngx_http_singleflight_capture_end_trailers(fetch, end);
    }

    rc = ngx_http_singleflight_flight_body(fetch->zone, fetch->fn,
                                           fetch->generation,
                                           fetch->writer.stored, end, &seq,
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
        ngx_http_singleflight_capture_tell(fetch, rc);

    } else {
        /* a lone leader's body costs no group per buffer */
        ngx_http_singleflight_capture_changed(fetch, rc, seq);
    }

    return NGX_OK;
}


/* ------------------------------------------------------------ direct */

/*
 * A direct response's body into its leader's filters.  The module's body
 * filter has nothing to do for a leader: the ones after it, unless a
 * filter loaded after this module sits above it, when the leader's output
 * starts at the top as any.
 */

static ngx_int_t
ngx_http_singleflight_capture_leader(ngx_http_request_t *r, ngx_chain_t *in)
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

ngx_int_t
ngx_http_singleflight_capture_direct(ngx_http_singleflight_fetch_t *fetch,
    ngx_chain_t *in)
{
    off_t                size;
    ngx_int_t            rc;
    ngx_buf_t           *end;
    ngx_chain_t         *cl;
    ngx_http_request_t  *host;

    host = fetch->host;

    if (fetch->last || fetch->resume.failed) {
        ngx_http_singleflight_capture_drop(in);
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

    if (ngx_http_singleflight_capture_framed(fetch->length, fetch->sent, size,
                                           end != NULL)
        != NGX_OK)
    {
        /*
         * none of it goes to the leader: what it had goes out, as nginx's
         * upstream flushes a response cut short, then its connection is
         * closed when the fetch ends (fetch_pump())
         */

        ngx_http_singleflight_capture_drop(in);

        ngx_http_singleflight_capture_misframed(fetch, fetch->length,
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
        ngx_http_singleflight_capture_trailers(fetch);
    }

    rc = ngx_http_singleflight_capture_leader(host, in);

    if (end == NULL && ngx_http_singleflight_capture_answered(in)) {
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
 * (capture_framed()).  The leader's answer is complete there; whatever the
 * fetch still reads is nobody's.
 */

static ngx_uint_t
ngx_http_singleflight_capture_answered(ngx_chain_t *in)
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
 * this, and they follow the origin's, as without the module.  None after
 * a resume by Range: those are the rest's, not the whole response's.
 */

static void
ngx_http_singleflight_capture_trailers(ngx_http_singleflight_fetch_t *fetch)
{
    ngx_http_request_t  *host, *sr;

    sr = fetch->sr;

    if (sr->headers_out.trailers.part.nelts == 0
        || (fetch->resuming && !fetch->resume.whole))
    {
        return;
    }

    host = fetch->host;
    host->headers_out.trailers = sr->headers_out.trailers;

    if (sr->headers_out.trailers.last == &sr->headers_out.trailers.part) {
        host->headers_out.trailers.last = &host->headers_out.trailers.part;
    }
}


/*
 * The origin's trailers, for the readers of the stored response: none
 * after a resume by Range, as for a leader of its own (above).
 */

static void
ngx_http_singleflight_capture_end_trailers(
    ngx_http_singleflight_fetch_t *fetch, ngx_str_t *trailers)
{
    trailers->len = 0;

    if (fetch->resuming && !fetch->resume.whole) {
        return;
    }

    trailers->data = ngx_http_singleflight_store_trailers(fetch->sr,
                                                          &trailers->len);
}


/* ------------------------------------------------------------ readers */

/* a new fetch's events: the flight's changes, nobody reading it */

void
ngx_http_singleflight_capture_events(ngx_http_singleflight_fetch_t *fetch)
{
    fetch->event.handler = ngx_http_singleflight_capture_event;
    fetch->event.data = fetch;
    fetch->event.log = &fetch->fake->log;

    fetch->waiter.handler = ngx_http_singleflight_capture_wake;
    fetch->waiter.data = fetch;
}


/*
 * After a change the fetch made itself: the requests of this worker that
 * wait on the flight are woken (its host first, if it waits for the
 * header), the fetch is not (its own change is not news to it); it stays
 * where it listens, or listens again.
 */

void
ngx_http_singleflight_capture_changed(ngx_http_singleflight_fetch_t *fetch,
    ngx_int_t how, ngx_atomic_uint_t seq)
{
    ngx_http_singleflight_waiter_t  *host;

    host = ngx_http_singleflight_host_reader->host_waiter(fetch->ctx,
                                                          fetch->fn);

    if (ngx_http_singleflight_wait_own(fetch->zone, fetch->fn, how,
                                       &fetch->waiter, seq, host)
        != NGX_OK)
    {
        ngx_http_singleflight_capture_listen(fetch);
    }
}


/*
 * After a change the fetch made: this worker's requests parked on the
 * flight are woken, and its host if it waits for the header (the host is
 * not parked: until the header only its own fetch changes its flight),
 * first among them.
 */

void
ngx_http_singleflight_capture_tell(ngx_http_singleflight_fetch_t *fetch,
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

void
ngx_http_singleflight_capture_listen(ngx_http_singleflight_fetch_t *fetch)
{
    if (fetch->finished || fetch->stopping) {
        return;
    }

    if (fetch->ctx->counted && fetch->ctx->fn == fetch->fn
        && (!fetch->header || fetch->direct))
    {
        return;
    }

    ngx_http_singleflight_wait_listen(fetch->zone, fetch->fn,
                                      fetch->generation, &fetch->waiter,
                                      &fetch->event);
}


static void
ngx_http_singleflight_capture_wake(ngx_http_singleflight_waiter_t *w)
{
    ngx_http_singleflight_fetch_t  *fetch = w->data;

    if (!fetch->event.posted) {
        ngx_post_event(&fetch->event, &ngx_posted_events);
    }
}


static void
ngx_http_singleflight_capture_event(ngx_event_t *ev)
{
    ngx_http_singleflight_fetch_t  *fetch = ev->data;

    if (fetch->finished || fetch->stopping) {
        return;
    }

    if (fetch->lost) {
        ngx_http_singleflight_capture_halt(fetch);
        return;
    }

    if (ngx_http_singleflight_flight_abandoned(fetch->zone, fetch->fn,
                                               fetch->generation))
    {
        ngx_http_singleflight_capture_stop(fetch);
        return;
    }

    ngx_http_singleflight_capture_listen(fetch);
}


/*
 * Nobody reads the flight: its fetch stops as nginx stops an upstream
 * request whose client went away (unless proxy_ignore_client_abort, or a
 * response being cached, keeps it going).
 */

static void
ngx_http_singleflight_capture_stop(ngx_http_singleflight_fetch_t *fetch)
{
    (void) ngx_atomic_fetch_add(&fetch->zone->counters->abandoned, 1);

    ngx_http_singleflight_capture_halt(fetch);
}


/* the fetch's upstream request ends as for a client gone: closed */

static void
ngx_http_singleflight_capture_halt(ngx_http_singleflight_fetch_t *fetch)
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
