/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The phase handler: whether a request is collapsed at all.
 *
 * It runs in the precontent phase, after rewrites and access checks
 * (allow/deny, auth_basic, auth_request, limit_req), so a request only
 * ever gets a response its own request was allowed to get.  A request is
 * not collapsed, and goes on as if the module were off, when
 *
 *   its method is not in singleflight_methods, or it is a protocol
 *   switch (Upgrade);
 *   it is one of this nginx's own fetches coming back: LOOP;
 *   singleflight_bypass says so: BYPASS;
 *   it carries credentials (singleflight_credentials): PRIVATE;
 *   it is a GET or HEAD with a body (nothing in the key covers it),
 *   or its key is empty, or the key uses $request_body and the body did
 *   not fit in memory, or its location has slice on: BYPASS;
 *   singleflight_lone is direct and no other request with its key is in
 *   progress there (_zone.h): DIRECT.
 *
 * slice: nginx fetches such a response in slices, each a subrequest with
 * its own Range ($slice_range), which no flight ever collapses; a fetch,
 * a subrequest itself, would have asked for the whole response at once.
 *
 * A request with a body has it read before its key is made: the key may
 * use it ($request_body, $singleflight_body_hash), and the fetch sends
 * it.  Then the reader (_reader.c) takes the request into a flight.
 *
 * A fetch carries "CDN-Loop: <name>" (RFC 8586) with this nginx's name:
 * singleflight_loop_name, or by default "singleflight-<token>", a random
 * token drawn when the registry's zone is first made (_registry.c), so
 * that two nginx instances differ even on one host with the same
 * configuration.  A request is LOOP only if one of its CDN-Loop elements
 * is that name, whole.  So in a fleet an edge's fetch reaching a shield,
 * which names the edge, is collapsed there as any request; a shield's
 * fetch sent back to an edge, or any request that comes back to an
 * instance it went through, is LOOP there.
 */


#include "ngx_http_singleflight_handler.h"
#include "ngx_http_singleflight_fetch.h"
#include "ngx_http_singleflight_reader.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_origin.h"
#include "ngx_http_singleflight_share.h"


static ngx_int_t ngx_http_singleflight_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_again(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_excluded(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_request_body(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx);
static ngx_int_t ngx_http_singleflight_bypass(
    ngx_http_singleflight_ctx_t *ctx);
static ngx_uint_t ngx_http_singleflight_lone(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value);
static void ngx_http_singleflight_body_handler(ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_scan(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *sfcf);
static ngx_uint_t ngx_http_singleflight_scan_header(ngx_http_request_t *r,
    ngx_table_elt_t *h, ngx_http_singleflight_loc_conf_t *sfcf);
static ngx_uint_t ngx_http_singleflight_grpc(ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_sliced(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_int_t ngx_http_singleflight_subrequest(ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_range(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf, ngx_uint_t *cached);
static ngx_uint_t ngx_http_singleflight_range_last(u_char **pp,
    u_char *last);
static off_t ngx_http_singleflight_range_limit(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf, ngx_uint_t *cached);
static ngx_uint_t ngx_http_singleflight_range_flight(ngx_http_request_t *r);
static void ngx_http_singleflight_cache_init(ngx_conf_t *cf);
static ngx_uint_t ngx_http_singleflight_list_has(ngx_str_t *value,
    ngx_str_t *element);
static ngx_uint_t ngx_http_singleflight_cdn_id(ngx_str_t *name);


/* what a request's Range makes of it (ngx_http_singleflight_range()) */
#define NGX_HTTP_SINGLEFLIGHT_RANGE_WHOLE       0
#define NGX_HTTP_SINGLEFLIGHT_RANGE_FAR         1
#define NGX_HTTP_SINGLEFLIGHT_RANGE_BOUNDED     2

/* what one pass over the request's headers found */
#define NGX_HTTP_SINGLEFLIGHT_SCAN_LOOP         1   /* our CDN-Loop name */
#define NGX_HTTP_SINGLEFLIGHT_SCAN_CREDENTIALS  2   /* not collapsed */
#define NGX_HTTP_SINGLEFLIGHT_SCAN_COOKIE       4   /* collapsed, shared */
#define NGX_HTTP_SINGLEFLIGHT_SCAN_AUTH         8   /* by RFC 9111's rules */

/* a header name's length as a bit of scan_lengths, modulo 64 */
#define ngx_http_singleflight_scan_bit(len)                                   \
    ((uint64_t) 1 << ((len) & 63))

/*
 * a header whose name is "len" bytes long: is it "lc", in lowercase?  Its
 * lowercase copy, which nginx makes as it reads the header (HTTP/1, 2
 * and 3), compared as bytes: a few compares of a word each, not a call
 * per letter; a header another module added may have none, and is
 * compared letter by letter
 */
#define ngx_http_singleflight_name_eq(h, lc, len)                             \
    ((h)->lowcase_key != NULL                                                 \
     ? ngx_memcmp((h)->lowcase_key, lc, len) == 0                             \
     : ngx_strncasecmp((h)->key.data, (u_char *) (lc), len) == 0)

/* the same for a lowercase literal of the header's length */
#define ngx_http_singleflight_name_is(h, lc)                                  \
    ngx_http_singleflight_name_eq(h, lc, sizeof(lc) - 1)


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

    ngx_http_singleflight_cache_init(cf);

    return NGX_OK;
}


/*
 * Other modules this one reads: the upstream modules whose location
 * configuration begins with an ngx_http_upstream_conf_t (nginx 1.22 to
 * 1.31), and so has the cache's switch and its max_range_offset in
 * nginx's public structure; the mirror module (see
 * ngx_http_singleflight_reader_mirror()); the slice module, if nginx has
 * it: a location with slice on is not collapsed, by its $slice_range
 * (the variable's index is found in init_module, handler_init_module()),
 * and a fetch redirected there stops, by the size its configuration
 * begins with; and nginx's access modules, whose configurations a
 * redirected fetch compares (ngx_http_singleflight_share_checked()).
 */

static void
ngx_http_singleflight_cache_init(ngx_conf_t *cf)
{
    ngx_uint_t                          n;
    ngx_http_singleflight_main_conf_t  *smcf;

    static const char  *names[] = {
        "ngx_http_proxy_module", "ngx_http_fastcgi_module",
        "ngx_http_uwsgi_module", "ngx_http_scgi_module"
    };

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    for (n = 0; n < 4; n++) {
        smcf->cache_index[n] = ngx_http_singleflight_module_index(cf,
                                                                  names[n]);
    }

    smcf->mirror_conf = ngx_http_singleflight_module_index(cf,
                                                    "ngx_http_mirror_module");

    smcf->slice_index = NGX_ERROR;
    smcf->slice_conf = ngx_http_singleflight_module_index(cf,
                                              "ngx_http_slice_filter_module");

    smcf->access_conf = ngx_http_singleflight_module_index(cf,
                                                    "ngx_http_access_module");
    smcf->basic_conf = ngx_http_singleflight_module_index(cf,
                                                "ngx_http_auth_basic_module");
    smcf->request_conf = ngx_http_singleflight_module_index(cf,
                                              "ngx_http_auth_request_module");
}


/*
 * What the request's Range makes of it.  The fetch of the whole response
 * asks the origin for all of it, and each reader's range is cut from it
 * as it arrives:
 *
 *   a range far into it would wait for all that comes before: one that
 *   starts after the limit, or a suffix ("bytes=-N", where it starts
 *   depends on the length): FAR;
 *
 *   a bounded one ("bytes=0-99", "bytes=0-0", every range with its last
 *   byte), or several ranges, would be answered early, but a flight led
 *   by it would download everything, all that time holding the leader's
 *   request, and with it its keep-alive connection, which nobody reads
 *   any more: a probe of a player or a download manager, costing the
 *   origin the whole response where without the module it sends a few
 *   bytes: BOUNDED;
 *
 *   any other (open-ended, "bytes=0-", within the limit) reads what the
 *   whole response's flight fetches: WHOLE.
 *
 * FAR and BOUNDED are asked of the origin as the request asks, unless the
 * location's cache fetches whole responses itself (see excluded()).  A
 * Range that is not of bytes, or that nginx would not take, is left to the
 * range filter, as before.  With singleflight_max_range_offset off, and no
 * cache limit (range_limit()), every range is WHOLE.
 */

static ngx_uint_t
ngx_http_singleflight_range(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf, ngx_uint_t *cached)
{
    off_t       limit, start;
    u_char     *p, *last;
    ngx_uint_t  ranges, bounded;

    limit = ngx_http_singleflight_range_limit(r, conf, cached);

    if (limit == NGX_MAX_OFF_T_VALUE) {
        return NGX_HTTP_SINGLEFLIGHT_RANGE_WHOLE;
    }

    p = r->headers_in.range->value.data;
    last = p + r->headers_in.range->value.len;

    if (last - p < 6 || ngx_strncasecmp(p, (u_char *) "bytes=", 6) != 0) {
        return NGX_HTTP_SINGLEFLIGHT_RANGE_WHOLE;
    }

    ranges = 0;
    bounded = 0;

    for (p += 6; p < last; p++) {

        while (p < last && (*p == ' ' || *p == ',')) {
            p++;
        }

        if (p == last) {
            break;
        }

        if (*p == '-') {
            return NGX_HTTP_SINGLEFLIGHT_RANGE_FAR;
        }

        for (start = 0; p < last && *p >= '0' && *p <= '9'; p++) {
            if (start > (NGX_MAX_OFF_T_VALUE - 9) / 10) {
                return NGX_HTTP_SINGLEFLIGHT_RANGE_FAR;
            }

            start = start * 10 + (*p - '0');
        }

        if (start > limit) {
            return NGX_HTTP_SINGLEFLIGHT_RANGE_FAR;
        }

        ranges++;
        bounded += ngx_http_singleflight_range_last(&p, last);

        while (p < last && *p != ',') {
            p++;
        }
    }

    /*
     * several ranges are the origin's to answer too (a multipart 206, or
     * a 200): cut from a response that grows, nginx answers only one
     */

    return (ranges > 1 || (ranges && bounded == ranges))
           ? NGX_HTTP_SINGLEFLIGHT_RANGE_BOUNDED
           : NGX_HTTP_SINGLEFLIGHT_RANGE_WHOLE;
}


/*
 * After a range's first byte: does it name its last one, "-<digits>", with
 * nothing but spaces around the dash and before the next range?  "*pp" is
 * moved past what was read.  A last byte before the first is bounded too:
 * an origin ignores such a Range, or refuses it, as it would without the
 * module.
 */

static ngx_uint_t
ngx_http_singleflight_range_last(u_char **pp, u_char *last)
{
    u_char  *p, *digits;

    p = *pp;

    while (p < last && *p == ' ') {
        p++;
    }

    if (p == last || *p++ != '-') {
        *pp = p;
        return 0;
    }

    while (p < last && *p == ' ') {
        p++;
    }

    for (digits = p; p < last && *p >= '0' && *p <= '9'; p++) {
        /* void */
    }

    if (p == digits) {
        /* open-ended: to the end of the response */
        *pp = p;
        return 0;
    }

    while (p < last && *p == ' ') {
        p++;
    }

    *pp = p;

    return p == last || *p == ',';
}


/*
 * The furthest byte a collapsed range may start at: singleflight_max_
 * range_offset, and no further than the location's cache would fetch the
 * whole response for (proxy_cache_max_range_offset and the like: nginx passes a
 * range starting at it or after to the origin, and 0 any range), so that
 * what nginx's cache passes on stays passed on.  "cached": the location
 * has a cache on.
 */

static off_t
ngx_http_singleflight_range_limit(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf, ngx_uint_t *cached)
{
    off_t                               limit;
#if (NGX_HTTP_CACHE)
    ngx_uint_t                          n;
    ngx_http_upstream_conf_t           *ucf;
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);
#endif

    limit = conf->range_offset;
    *cached = 0;

#if (NGX_HTTP_CACHE)

    for (n = 0; n < 4; n++) {
        if (smcf->cache_index[n] == NGX_ERROR) {
            continue;
        }

        ucf = r->loc_conf[smcf->cache_index[n]];

        if (ucf->cache == 1) {
            *cached = 1;
        }

        if (ucf->cache == 1
            && ucf->cache_max_range_offset != NGX_MAX_OFF_T_VALUE
            && ucf->cache_max_range_offset <= limit)
        {
            limit = ucf->cache_max_range_offset - 1;
        }
    }

#endif

    return limit;
}


/*
 * A subrequest is never collapsed.  But nginx runs no access phase for a
 * subrequest: a fetch that a redirect took to another location (the
 * origin's X-Accel-Redirect, index, try_files or error_page there) met
 * none of that location's checks.  Where it has checks other than those
 * every reader met where it came in (share_checked()), what the fetch
 * got there is nobody's; so too in a location with slice on, where it
 * would ask for the whole response at once, and in one whose content
 * takes in its own subrequests' output (echo_location), which joins the
 * response below this module's filter.  The fetch stops there, and
 * its readers go their own way, the leader through the same redirect,
 * each checked as without the module.  A fetch begins in its leader's
 * location with a new subrequest's count of URI changes; a redirect
 * takes one.
 */

static ngx_int_t
ngx_http_singleflight_subrequest(ngx_http_request_t *r)
{
    ngx_http_singleflight_fetch_t      *fetch;
    ngx_http_singleflight_main_conf_t  *smcf;

    if (r->uri_changes == NGX_HTTP_MAX_URI_CHANGES + 1) {
        /* not redirected */
        return NGX_DECLINED;
    }

    fetch = ngx_http_singleflight_fetch_of(r);

    if (fetch == NULL) {
        return NGX_DECLINED;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    if (!ngx_http_singleflight_share_checked(r,
                                       ngx_http_singleflight_fetch_began(fetch))
        && (smcf->slice_index == NGX_ERROR
            || *(size_t *) r->loc_conf[smcf->slice_conf] == 0)
        && !ngx_http_singleflight_origin_joiner(r, r->content_handler))
    {
        return NGX_DECLINED;
    }

    return ngx_http_singleflight_fetch_unshare(fetch, r);
}


/*
 * The index of $slice_range, when the configuration indexed it: slice
 * asks for its slices with proxy_set_header Range $slice_range (or a
 * fastcgi_param...).  Nobody indexed it, nobody sends it: slice then asks
 * for the whole response, and passes it on untouched.  Found, not made
 * (see variable_index()).
 */

void
ngx_http_singleflight_handler_init_module(ngx_cycle_t *cycle)
{
    ngx_http_core_main_conf_t          *cmcf;
    ngx_http_singleflight_main_conf_t  *smcf;

    static ngx_str_t  name = ngx_string("slice_range");

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);

    if (smcf == NULL) {
        return;
    }

    /* each of the three pushes one handler, set or not */

    cmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_core_module);

    smcf->access_other = cmcf->phases[NGX_HTTP_ACCESS_PHASE].handlers.nelts
                         > (ngx_uint_t) ((smcf->access_conf != NGX_ERROR)
                                         + (smcf->basic_conf != NGX_ERROR)
                                         + (smcf->request_conf != NGX_ERROR));

    if (smcf->slice_conf == NGX_ERROR) {
        return;
    }

    smcf->slice_index = ngx_http_singleflight_variable_index(cycle,
                                                             name.data,
                                                             name.len);
}


/*
 * Does the request's location have slice on?  The variable is what
 * proxy_set_header Range $slice_range would make of it, evaluated once
 * more; empty (not found) without slice.  A main request's value before
 * any response depends on its location only, so each worker evaluates it
 * once per location and keeps the answer in the location's configuration.
 */

static ngx_uint_t
ngx_http_singleflight_sliced(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_uint_t                          on;
    ngx_http_variable_value_t          *v;
    ngx_http_singleflight_main_conf_t  *smcf;

    if (conf->sliced != NGX_CONF_UNSET) {
        return conf->sliced;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    if (smcf->slice_index == NGX_ERROR) {
        conf->sliced = 0;
        return 0;
    }

    v = ngx_http_get_flushed_variable(r, smcf->slice_index);

    if (v == NULL) {
        return 0;
    }

    on = !v->not_found && v->len != 0;

    if (!on) {
        /*
         * not kept for the request: a redirect later (error_page to a
         * named location with slice on) must find it unevaluated, or
         * proxy_set_header Range $slice_range there gets this one's
         * "not found", and the origin the whole response
         */
        v->valid = 0;
        v->not_found = 0;
    }

    if (r->headers_out.status == 0) {
        /* not an error page's request: the location's own answer */
        conf->sliced = on;
    }

    return on;
}


static ngx_int_t
ngx_http_singleflight_handler(ngx_http_request_t *r)
{
    ngx_int_t                          rc;
    ngx_str_t                          value[2];
    ngx_http_singleflight_ctx_t       *ctx;
    ngx_http_singleflight_zone_t      *zone;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    if (r != r->main) {
        /* a fetch, or any other subrequest: never collapsed */
        return ngx_http_singleflight_subrequest(r);
    }

    if (r->internal && r->upstream != NULL) {
        ctx = ngx_http_singleflight_get_ctx(r);

        if (ctx != NULL && ctx->pending) {
            /*
             * on its own way, redirected after its upstream, before its
             * header (an error_page, X-Accel-Redirect): its answer is no
             * flight's, and one waiting for it need not wait for that
             * answer's header
             */
            (void) ngx_http_singleflight_reader_pending(r, ctx);
        }
    }

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);

    if (sfcf->zone == NULL) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx != NULL && ngx_http_singleflight_again(r, ctx) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (!(r->method & sfcf->methods)) {
        return NGX_DECLINED;
    }

    if (sfcf->origin == NULL || r->content_handler != sfcf->origin) {

        if ((!sfcf->content_any
             && !ngx_http_singleflight_origin_handler(r, r->content_handler))
            || ngx_http_singleflight_origin_joiner(r, r->content_handler))
        {
            /*
             * its content is not from an origin: nothing to save; or it
             * takes in its subrequests' output, which no flight stores
             */
            return NGX_DECLINED;
        }

        /* this worker's: the next request here tests one pointer */
        sfcf->origin = r->content_handler;
    }

    zone = sfcf->zone->mine;

    if (zone == NULL || zone->me == NULL) {
        /* this worker has no instance of the zone: plain proxying */
        return NGX_DECLINED;
    }

    if (r->headers_in.upgrade != NULL
        || r->http_version < NGX_HTTP_VERSION_10)
    {
        /*
         * a WebSocket or other protocol switch is nobody else's; an
         * HTTP/0.9 request has no header list to add CDN-Loop to
         */
        return NGX_DECLINED;
    }

    if (ctx == NULL) {
        ctx = ngx_http_singleflight_create_ctx(r);
        if (ctx == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    ctx->zone = zone;
    ctx->conf = sfcf;

    rc = ngx_http_singleflight_excluded(r, ctx);

    if (rc == NGX_OK) {
        rc = ngx_http_singleflight_request_body(r, ctx);
    }

    if (rc != NGX_OK) {
        return rc;
    }

    rc = ngx_http_singleflight_key_values(r, ctx, value);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        /* an empty key makes no flight of everything */
        return ngx_http_singleflight_bypass(ctx);
    }

#if (NGX_HTTP_CACHE)
    /*
     * a request that skips the cache shares only with others that do:
     * a follower that would have been a hit must not wait for its origin
     * and get its answer (an error where the cache had a 200).  Unset
     * until here (a new context, or again())
     */

    if (sfcf->cache_bypass != NULL
        && ngx_http_test_predicates(r, sfcf->cache_bypass) == NGX_DECLINED)
    {
        if (r->headers_in.range != NULL
            || r->headers_in.if_range != NULL
            || r->headers_in.if_none_match != NULL
            || r->headers_in.if_modified_since != NULL
            || r->headers_in.if_match != NULL
            || r->headers_in.if_unmodified_since != NULL)
        {
            /*
             * a fetch drops these headers, and with them maybe what made
             * it skip the cache ($http_if_none_match): on its own
             */
            return ngx_http_singleflight_bypass(ctx);
        }

        ctx->skips_cache = 1;
    }
#endif

    if (sfcf->lone == NGX_HTTP_SINGLEFLIGHT_LONE_DIRECT
        && ngx_http_singleflight_lone(r, ctx, value))
    {
        /* on its own way, as without the module: nobody to share with */
        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_DIRECT;
        ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_ALONE;
        ctx->direct = 1;
        return NGX_DECLINED;
    }

    if (r->connection->read->pending_eof && !sfcf->ignore_abort) {
        /*
         * its client closed with its request (HTTP/1.x, epoll): nginx's
         * upstream sees that and sends the origin nothing (499), unless
         * told to go on (proxy_ignore_client_abort, where its client
         * still reads, as a reader's does); a fetch would have sent it,
         * a POST too
         */
        return NGX_DECLINED;
    }

    ngx_http_singleflight_ctx_warm(ctx);

    if (ngx_http_singleflight_key_make(r, ctx, value) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the location's mirrors, made before the request waits */

    ngx_http_singleflight_reader_mirror_join(r, ctx);

    rc = ngx_http_singleflight_reader_join(r, ctx);

    if (rc == NGX_DECLINED) {
        /* on through the phases, past the mirror module's handler */
        ngx_http_singleflight_reader_mirror_skip(r, ctx);
    }

    return rc;
}


/*
 * The handler again for a request that has a context: NGX_OK when it is
 * to look for a flight (its body is read, or error_page sent it here),
 * NGX_DECLINED when it is on its own or in a flight already.
 */

static ngx_int_t
ngx_http_singleflight_again(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    switch (ctx->phase) {

    case NGX_HTTP_SINGLEFLIGHT_RD_BODY:
        /* its body is read: on to the key */
        ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_NONE;
        break;

    case NGX_HTTP_SINGLEFLIGHT_RD_DONE:

        if (!r->internal || ctx->counted
            || ngx_http_singleflight_reader_again(r, ctx) != NGX_OK)
        {
            return NGX_DECLINED;
        }

        /*
         * answered with its flight's status, and sent by error_page
         * into this location: a flight here, as for anybody
         */

        ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_NONE;
        ctx->host = 0;
        ctx->header_sent = 0;
        ctx->last_sent = 0;
        ctx->fetch = NULL;
        ctx->wait_start = 0;
        ctx->waited = 0;
        ctx->rejoins = 0;
        break;

    case NGX_HTTP_SINGLEFLIGHT_RD_NONE:
        break;

    default:
        /* gone on its own (ALONE), or in a flight already */
        return NGX_DECLINED;
    }

    /* what excluded() finds, found again (a new context has neither) */

    ctx->range_sent = 0;
    ctx->creds = 0;
    ctx->skips_cache = 0;

    return NGX_OK;
}


/*
 * What keeps a request out of every flight, whatever its key: it is one
 * of our fetches come back, singleflight_bypass, credentials, gRPC.
 * NGX_OK when none does.
 */

static ngx_int_t
ngx_http_singleflight_excluded(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_uint_t                 found, cached;
    ngx_http_core_loc_conf_t  *clcf;

    found = ngx_http_singleflight_scan(r, ctx->conf);

    if (found & NGX_HTTP_SINGLEFLIGHT_SCAN_LOOP) {

        /* a fetch of this nginx come back: never made to wait on itself */

        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_LOOP;

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight request is one of our fetches");

        return NGX_DECLINED;
    }

    if (ctx->conf->bypass != NULL) {

        switch (ngx_http_test_predicates(r, ctx->conf->bypass)) {

        case NGX_ERROR:
            return NGX_HTTP_INTERNAL_SERVER_ERROR;

        case NGX_DECLINED:
            return ngx_http_singleflight_bypass(ctx);

        default: /* NGX_OK */
            break;
        }
    }

    if (found & NGX_HTTP_SINGLEFLIGHT_SCAN_CREDENTIALS) {

        /* one user's credentials, maybe one user's response */

        ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_PRIVATE;
        return NGX_DECLINED;
    }

    /*
     * a Cookie or Authorization with singleflight_credentials http: in a
     * flight, given what a shared cache would give it (_fetch.c, _reader.c)
     */

    if (found & (NGX_HTTP_SINGLEFLIGHT_SCAN_COOKIE
                 |NGX_HTTP_SINGLEFLIGHT_SCAN_AUTH))
    {
        ctx->creds = ((found & NGX_HTTP_SINGLEFLIGHT_SCAN_COOKIE)
                      ? NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE : 0)
                     | ((found & NGX_HTTP_SINGLEFLIGHT_SCAN_AUTH)
                        ? NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH : 0);
    }

    if (ngx_http_singleflight_grpc(r)) {
        /* a call of its own: its request body is a stream */
        return ngx_http_singleflight_bypass(ctx);
    }

    if (ngx_http_singleflight_sliced(r, ctx->conf)) {
        /* fetched in slices by nginx itself (see the top of the file) */
        return ngx_http_singleflight_bypass(ctx);
    }

    if (r->headers_in.range == NULL) {
        return NGX_OK;
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (clcf->max_ranges == 0) {
        /* nginx cuts no range here: the origin's answer, as it is */
        return ngx_http_singleflight_bypass(ctx);
    }

    switch (ngx_http_singleflight_range(r, ctx->conf, &cached)) {

    case NGX_HTTP_SINGLEFLIGHT_RANGE_FAR:

        if (cached) {
            /* the cache passes it on: the origin sends that range alone */
            return ngx_http_singleflight_bypass(ctx);
        }

        break;

    case NGX_HTTP_SINGLEFLIGHT_RANGE_BOUNDED:

        if (cached) {
            /*
             * the cache asks for the whole response, with the module or
             * without: the whole response's flight, as before
             */
            return NGX_OK;
        }

        break;

    default: /* NGX_HTTP_SINGLEFLIGHT_RANGE_WHOLE */
        return NGX_OK;
    }

    if (!ngx_http_singleflight_range_flight(r)) {
        /* the origin sends its range alone, as without the module */
        return ngx_http_singleflight_bypass(ctx);
    }

    /* a flight of that range: its fetch asks for it (key.c, fetch.c) */
    ctx->range_sent = 1;

    return NGX_OK;
}


/*
 * May a far or bounded Range have a flight of its own, shared with the
 * requests that send the same Range: a GET without a conditional, whose
 * answer is the origin's to that Range alone?  If-Range and the other
 * conditionals make the answer depend on validators that each client
 * holds; those go upstream on their own, and so does a request with two
 * Range headers (the key and the fetch would have only the first).
 */

static ngx_uint_t
ngx_http_singleflight_range_flight(ngx_http_request_t *r)
{
    ngx_uint_t                     n;
    ngx_table_elt_t               *h;
    ngx_http_headers_in_t         *hi;
    ngx_http_singleflight_walk_t   walk;

    hi = &r->headers_in;

    if (r->method != NGX_HTTP_GET
        || hi->if_range != NULL
        || hi->if_match != NULL
        || hi->if_none_match != NULL
        || hi->if_modified_since != NULL
        || hi->if_unmodified_since != NULL)
    {
        return 0;
    }

    n = 0;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(&hi->headers, &walk)) != NULL) {
        if (h->key.len == sizeof("Range") - 1
            && ngx_strncasecmp(h->key.data, (u_char *) "Range",
                               sizeof("Range") - 1)
               == 0)
        {
            n++;
        }
    }

    return n == 1;
}


/*
 * A request with a body: its key may cover it ($request_body), so it is
 * read first (NGX_DONE: the handler runs again once it is).  NGX_OK when
 * there is none or it is read.
 */

static ngx_int_t
ngx_http_singleflight_request_body(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t  rc;

    if (r->headers_in.content_length_n <= 0 && !r->headers_in.chunked) {
        return NGX_OK;
    }

    if (!(r->method & NGX_HTTP_SINGLEFLIGHT_BODY_METHODS)) {
        /* a GET or HEAD with a body: no key covers it */
        return ngx_http_singleflight_bypass(ctx);
    }

    if (!ctx->body_read) {
        ctx->phase = NGX_HTTP_SINGLEFLIGHT_RD_BODY;

        rc = ngx_http_read_client_request_body(r,
                                        ngx_http_singleflight_body_handler);

        if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
            return rc;
        }

        ngx_http_finalize_request(r, NGX_DONE);
        return NGX_DONE;
    }

    if ((ctx->conf->key_body & 1)
        && (r->request_body == NULL || r->request_body->temp_file != NULL))
    {
        /* $request_body is empty for a body in a file: no key */
        return ngx_http_singleflight_bypass(ctx);
    }

    return NGX_OK;
}


/* on its own way, counted as bypassed */

static ngx_int_t
ngx_http_singleflight_bypass(ngx_http_singleflight_ctx_t *ctx)
{
    ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_BYPASS;

    return NGX_DECLINED;
}


/*
 * singleflight_lone direct: does the request go its own way?  It is
 * counted in its slot (_zone.h) until its upstream response is in
 * (_filter.c) or it ends, whichever way it goes;
 * once only, when error_page brings it to another location.  A GET
 * without a Range, not redirected here, goes its own way when it is alone
 * with its key, as without the module.  If its response may be a
 * flight's (unconditional), its key is made only if a flight of its slot
 * then waits for its header (_tee.c).  A conditional cannot feed a
 * flight: the GET after it leads one, so such a herd costs one origin
 * request more than a herd of unconditional GETs.  Any other request (a
 * HEAD, a Range, a POST, one redirected here) leads or follows a flight,
 * as with "fetch", so that a herd of them costs one origin request.
 */

static ngx_uint_t
ngx_http_singleflight_lone(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value)
{
    ngx_uint_t  get, pending;

    if (ctx->claim != NULL || ctx->zone->sh->claims == NULL) {
        return 0;
    }

    get = r->method == NGX_HTTP_GET
          && !r->internal
          && r->headers_in.range == NULL
          && r->headers_in.if_range == NULL
          && ctx->conf->pend;

    /* the common checks only; the others at its header (_tee.c) */

    pending = get
              && r->headers_in.if_none_match == NULL
              && r->headers_in.if_modified_since == NULL
              && r->headers_in.if_match == NULL
              && r->headers_in.if_unmodified_since == NULL;

    if (!ngx_http_singleflight_claim(ctx->zone,
                             ngx_http_singleflight_key_sketch(r, ctx, value),
                             pending, &ctx->claim, &ctx->claim_epoch,
                             &ctx->claim_mark))
    {
        return 0;
    }

    if (!pending) {
        /* a conditional: its response (a 304, a 412) is no flight's */
        return get;
    }

    /*
     * a flight may wait for its header, which it gives or lets go at its
     * header or end (_reader.c, _filter.c); its upstream request, if it
     * came back here, must not wait for that flight (LOOP).  Without the
     * header (no memory), such a loop waits singleflight_timeout.
     */

    ctx->pending = 1;

    (void) ngx_http_singleflight_loop_header(r, &r->headers_in.headers);

    if (ctx->conf->cached && r->content_handler != NULL
        && r->content_handler == ctx->conf->origin)
    {
        /* after its cache lookup: must the flight wait for it? */
        r->content_handler = ngx_http_singleflight_reader_content;
    }

    return 1;
}


/* the body is read: the phases again, from this handler */

static void
ngx_http_singleflight_body_handler(ngx_http_request_t *r)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx != NULL) {
        ctx->body_read = 1;
    }

    /* kept for the fetch, which sends it again */
    r->preserve_body = 1;

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


char *
ngx_http_singleflight_loop_name(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_singleflight_main_conf_t  *smcf = conf;

    ngx_str_t  *value;

    if (smcf->loop_name.len) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (!ngx_http_singleflight_cdn_id(&value[1])) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid \"singleflight_loop_name\" \"%V\": "
                           "a token or host[:port] of at most 255 "
                           "characters", &value[1]);
        return NGX_CONF_ERROR;
    }

    smcf->loop_name = value[1];

    return NGX_CONF_OK;
}


/* an RFC 8586 cdn-id: a token (RFC 9110) or host[:port] */

static ngx_uint_t
ngx_http_singleflight_cdn_id(ngx_str_t *name)
{
    u_char      c;
    ngx_uint_t  i;

    static u_char  tchar[] = "!#$%&'*+-.^_`|~:[]";

    if (name->len == 0 || name->len > 255) {
        return 0;
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9'))
        {
            continue;
        }

        if (ngx_strlchr(tchar, tchar + sizeof(tchar) - 1, c) == NULL) {
            return 0;
        }
    }

    return 1;
}


/*
 * The lengths of the header names that the scan looks at, one bit each
 * (ngx_http_singleflight_scan_bit()): CDN-Loop's, and unless
 * singleflight_credentials is on, those of Proxy-Authorization and of the
 * names the directive adds.  A header of any other length costs the scan
 * one test.
 */

void
ngx_http_singleflight_scan_init(ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_str_t   *name;
    ngx_uint_t   i;

    conf->scan_lengths =
        ngx_http_singleflight_scan_bit(sizeof("CDN-Loop") - 1);

    if (conf->credentials == NGX_HTTP_SINGLEFLIGHT_CRED_ON) {
        return;
    }

    /* Cookie and Authorization: nginx has found them (scan()) */

    conf->scan_lengths |=
        ngx_http_singleflight_scan_bit(sizeof("Proxy-Authorization") - 1);

    if (conf->credential_headers == NULL) {
        return;
    }

    name = conf->credential_headers->elts;

    for (i = 0; i < conf->credential_headers->nelts; i++) {
        conf->scan_lengths |= ngx_http_singleflight_scan_bit(name[i].len);
    }
}


/*
 * One pass over the request's headers: does it carry this nginx's name in
 * CDN-Loop (one of our fetches come back), and credentials (Authorization,
 * Proxy-Authorization, Cookie, and the names singleflight_credentials
 * adds) unless singleflight_credentials is on?
 */

static ngx_uint_t
ngx_http_singleflight_scan(ngx_http_request_t *r,
    ngx_http_singleflight_loc_conf_t *sfcf)
{
    uint64_t          lengths;
    ngx_uint_t        i, found, cookie;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    lengths = sfcf->scan_lengths;
    found = 0;

#if (nginx_version >= 1023000)
    cookie = (r->headers_in.cookie != NULL);
#else
    cookie = (r->headers_in.cookies.nelts != 0);
#endif

    if ((cookie || r->headers_in.authorization != NULL)
        && sfcf->credentials != NGX_HTTP_SINGLEFLIGHT_CRED_ON)
    {
        /* Cookie and Authorization as nginx found them, with no lookup */

        if (cookie) {
            found = (sfcf->credentials == NGX_HTTP_SINGLEFLIGHT_CRED_HTTP)
                    ? NGX_HTTP_SINGLEFLIGHT_SCAN_COOKIE
                    : NGX_HTTP_SINGLEFLIGHT_SCAN_CREDENTIALS;
        }

        if (r->headers_in.authorization != NULL) {
            found |= (sfcf->credentials == NGX_HTTP_SINGLEFLIGHT_CRED_HTTP)
                     ? NGX_HTTP_SINGLEFLIGHT_SCAN_AUTH
                     : NGX_HTTP_SINGLEFLIGHT_SCAN_CREDENTIALS;
        }
    }

    /* every request's path: two plain loops, not list_next() */

    for (part = &r->headers_in.headers.part; part; part = part->next) {
        h = part->elts;

        for (i = 0; i < part->nelts; i++) {
            if (lengths & ngx_http_singleflight_scan_bit(h[i].key.len)) {
                found |= ngx_http_singleflight_scan_header(r, &h[i], sfcf);
            }
        }
    }

    return found;
}


/* this nginx's name for CDN-Loop is looked up only for such a header */

static ngx_uint_t
ngx_http_singleflight_scan_header(ngx_http_request_t *r, ngx_table_elt_t *h,
    ngx_http_singleflight_loc_conf_t *sfcf)
{
    ngx_str_t   *name, *token;
    ngx_uint_t   i;

    switch (h->key.len) {

    case sizeof("CDN-Loop") - 1:
        if (!ngx_http_singleflight_name_is(h, "cdn-loop")) {
            break;
        }

        token = ngx_http_singleflight_loop_token(r);

        if (token->len && ngx_http_singleflight_list_has(&h->value, token)) {
            return NGX_HTTP_SINGLEFLIGHT_SCAN_LOOP;
        }
        break;

    case sizeof("Proxy-Authorization") - 1:
        if (sfcf->credentials != NGX_HTTP_SINGLEFLIGHT_CRED_ON
            && ngx_http_singleflight_name_is(h, "proxy-authorization"))
        {
            return (sfcf->credentials == NGX_HTTP_SINGLEFLIGHT_CRED_HTTP)
                   ? NGX_HTTP_SINGLEFLIGHT_SCAN_AUTH
                   : NGX_HTTP_SINGLEFLIGHT_SCAN_CREDENTIALS;
        }
        break;
    }

    if (sfcf->credentials != NGX_HTTP_SINGLEFLIGHT_CRED_OFF
        || sfcf->credential_headers == NULL)
    {
        return 0;
    }

    name = sfcf->credential_headers->elts;

    /* the names are stored in lowercase (singleflight_credentials) */

    for (i = 0; i < sfcf->credential_headers->nelts; i++) {
        if (h->key.len == name[i].len
            && ngx_http_singleflight_name_eq(h, name[i].data, name[i].len))
        {
            return NGX_HTTP_SINGLEFLIGHT_SCAN_CREDENTIALS;
        }
    }

    return 0;
}


/*
 * Is "element" one of the comma-separated elements of "value", whole and
 * case-insensitively?  An element ends at its first ';' (RFC 8586
 * parameters) or whitespace.
 */

static ngx_uint_t
ngx_http_singleflight_list_has(ngx_str_t *value, ngx_str_t *element)
{
    u_char  *p, *last, *start;

    p = value->data;
    last = p + value->len;

    while (p < last) {

        while (p < last && (*p == ' ' || *p == '\t' || *p == ',')) {
            p++;
        }

        start = p;

        while (p < last && *p != ',' && *p != ';' && *p != ' '
               && *p != '\t')
        {
            p++;
        }

        if ((size_t) (p - start) == element->len
            && ngx_strncasecmp(start, element->data, element->len) == 0)
        {
            return 1;
        }

        while (p < last && *p != ',') {
            p++;
        }
    }

    return 0;
}


/* a gRPC call: "Content-Type: application/grpc", "application/grpc+proto"... */

static ngx_uint_t
ngx_http_singleflight_grpc(ngx_http_request_t *r)
{
    ngx_str_t  *type;

    if (r->headers_in.content_type == NULL) {
        return 0;
    }

    type = &r->headers_in.content_type->value;

    return type->len >= sizeof("application/grpc") - 1
           && ngx_strncasecmp(type->data, (u_char *) "application/grpc",
                              sizeof("application/grpc") - 1) == 0;
}
