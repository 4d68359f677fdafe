/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The capture: a fetch's response body taken into the store, or passed
 * to its leader alone, and the flight's readers told; and the fetch
 * itself, which the files above it (_launch.c, _fetch.c) share.  Its
 * members' types are those of _fake.h, _store.h, _resume.h and _clone.h,
 * included before this header.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_CAPTURE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_CAPTURE_H_INCLUDED_


#include "ngx_http_singleflight.h"


/* r->buffered of a fetch: a file buffer still being copied */
#define NGX_HTTP_SINGLEFLIGHT_BUFFERED   0x04

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
    unsigned                         timed:1;     /* its times are an
                                                     origin's, observed */
    unsigned                         held:1;      /* its use of the flight */
    unsigned                         sealed:1;
    unsigned                         stopping:1;
    unsigned                         hedge:1;     /* the second fetch */
    unsigned                         resuming:1;  /* asks for the rest */
    unsigned                         lost:1;      /* its partner's header
                                                     came first */
    unsigned                         creds:2;     /* the credentials its
                                                     response may go to */
};


void ngx_http_singleflight_capture_init(
    ngx_http_singleflight_fetch_host_t *host);
void ngx_http_singleflight_capture_filters(ngx_http_output_body_filter_pt self,
    ngx_http_output_body_filter_pt next);
void ngx_http_singleflight_capture_events(ngx_http_singleflight_fetch_t *fetch);
ngx_int_t ngx_http_singleflight_capture_body(
    ngx_http_singleflight_fetch_t *fetch, ngx_http_request_t *r,
    ngx_chain_t *in);
ngx_int_t ngx_http_singleflight_capture_direct(
    ngx_http_singleflight_fetch_t *fetch, ngx_chain_t *in);
void ngx_http_singleflight_capture_same(ngx_http_singleflight_fetch_t *fetch,
    ngx_log_t *log);
void ngx_http_singleflight_capture_unresumed(
    ngx_http_singleflight_fetch_t *fetch, ngx_log_t *log, char *why);
void ngx_http_singleflight_capture_changed(
    ngx_http_singleflight_fetch_t *fetch, ngx_int_t how,
    ngx_atomic_uint_t seq);
void ngx_http_singleflight_capture_tell(ngx_http_singleflight_fetch_t *fetch,
    ngx_int_t how);
void ngx_http_singleflight_capture_listen(
    ngx_http_singleflight_fetch_t *fetch);


#endif /* _NGX_HTTP_SINGLEFLIGHT_CAPTURE_H_INCLUDED_ */
