/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The filters.
 *
 * The module is loaded after nginx's own filters and so is first in the
 * chain (see "config"): it sees a fetch's response exactly as the content
 * handler made it, before not_modified, range, slice, gzip, SSI, sub,
 * addition, image_filter or add_header, which each reader then applies
 * for itself.  A fetch's response goes into its flight (_fetch.c) and no
 * further; every other response passes untouched.
 */


#include "ngx_http_singleflight_filter.h"
#include "ngx_http_singleflight_fetch.h"
#include "ngx_http_singleflight_reader.h"
#include "ngx_http_singleflight_tee.h"
#include "ngx_http_singleflight_share.h"
#include "ngx_http_singleflight_zone.h"


static ngx_int_t ngx_http_singleflight_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static void ngx_http_singleflight_direct_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static void ngx_http_singleflight_direct_finalize(ngx_http_request_t *r,
    ngx_int_t rc);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;

#if (nginx_version >= 1029000)
static ngx_int_t ngx_http_singleflight_early_hints_filter(
    ngx_http_request_t *r);

static ngx_http_output_header_filter_pt  ngx_http_next_early_hints_filter;
#endif


ngx_int_t
ngx_http_singleflight_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_singleflight_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_singleflight_body_filter;

    ngx_http_singleflight_fetch_filters(ngx_http_singleflight_body_filter,
                                        ngx_http_next_body_filter);

#if (nginx_version >= 1029000)
    ngx_http_next_early_hints_filter = ngx_http_top_early_hints_filter;
    ngx_http_top_early_hints_filter = ngx_http_singleflight_early_hints_filter;
#endif

    return NGX_OK;
}


/*
 * Every response passes here: the main request's, mostly refused by
 * nobody and with no mirrors in this worker, with two tests and no call
 */

static ngx_int_t
ngx_http_singleflight_header_filter(ngx_http_request_t *r)
{
    ngx_http_singleflight_ctx_t    *ctx;
    ngx_http_singleflight_fetch_t  *fetch;

    if (r != r->main) {
        fetch = ngx_http_singleflight_fetch_of(r);

        if (fetch != NULL) {
            return ngx_http_singleflight_fetch_header(fetch, r);
        }

    } else {
        ctx = ngx_http_singleflight_get_ctx(r);

        if (ctx != NULL) {

            if (ctx->pending) {
                /* went its own way: a flight may wait for this header */
                if (ngx_http_singleflight_reader_pending(r, ctx) != NGX_OK) {
                    return NGX_ERROR;
                }

            } else if (ctx->tee != NULL
                       && ngx_http_singleflight_tee_header(r, ctx) != NGX_OK)
            {
                return NGX_ERROR;
            }

            if (ctx->direct && ctx->tee == NULL && ctx->claim != NULL) {
                ngx_http_singleflight_direct_header(r, ctx);
            }
        }

        if (ngx_http_singleflight_mirror_made || r->filter_finalize) {

            if (r->filter_finalize) {
                /* what nginx answers a refused response with */
                ngx_http_singleflight_reader_refused(r);
            }

            /* a collapsed request's mirrors, as the mirror module's */
            ngx_http_singleflight_reader_mirror(r);
        }
    }

    return ngx_http_next_header_filter(r);
}


/*
 * The header of a request on its own way, which no flight took: it holds
 * its slot while its upstream response comes, so that a request arriving
 * meanwhile leads a flight for the ones after it.  A cache hit holds
 * nothing, and is not counted: as a request never seen.
 */

static void
ngx_http_singleflight_direct_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_http_upstream_t  *u;

    if (ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_DIRECT
        && ngx_http_singleflight_share_cached(r))
    {
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NONE;

        ngx_http_singleflight_unclaim(ctx->claim, ctx->claim_epoch);
        ctx->claim = NULL;
        return;
    }

    u = r->upstream;

    /*
     * once: a filter that finalizes the request (image_filter's 415)
     * runs the header filters again
     */

    if (u != NULL && u->finalize_request != NULL
        && u->finalize_request != ngx_http_singleflight_direct_finalize)
    {
        ctx->finalize = u->finalize_request;
        u->finalize_request = ngx_http_singleflight_direct_finalize;
    }
}


/*
 * Its upstream response is in (or broke off): the slot goes now, before
 * the last bytes reach the client, not when the request is logged and
 * freed.  The client's next request, on a new connection to another
 * worker, would otherwise find the slot still held and fetch as a
 * flight's leader what it fetches alone.
 */

static void
ngx_http_singleflight_direct_finalize(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx->claim != NULL) {
        ngx_http_singleflight_unclaim(ctx->claim, ctx->claim_epoch);
        ctx->claim = NULL;
    }

    ctx->finalize(r, rc);
}


static ngx_int_t
ngx_http_singleflight_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_http_singleflight_fetch_t  *fetch;

    if (r != r->main) {
        fetch = ngx_http_singleflight_fetch_of(r);

        if (fetch != NULL) {
            return ngx_http_singleflight_fetch_body(fetch, r, in);
        }
    }

    return ngx_http_next_body_filter(r, in);
}


#if (nginx_version >= 1029000)

/* a fetch's 103 goes to its leader, never to the fetch's connection */

static ngx_int_t
ngx_http_singleflight_early_hints_filter(ngx_http_request_t *r)
{
    ngx_http_singleflight_fetch_t  *fetch;

    if (r != r->main) {
        fetch = ngx_http_singleflight_fetch_of(r);

        if (fetch != NULL) {
            return ngx_http_singleflight_fetch_early_hints(fetch, r);
        }
    }

    return ngx_http_next_early_hints_filter(r);
}

#endif
