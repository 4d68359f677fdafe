/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Whom a fetched response may go to.
 *
 * Nobody but its leader, when it carries what singleflight_private lists
 * (Set-Cookie, Cache-Control: private by default): it was made for one
 * client.
 *
 * Requests with credentials (a Cookie, an Authorization or
 * Proxy-Authorization), with singleflight_credentials http, the default:
 * whatever a shared cache could give them, by RFC 9111's rules, and no
 * more.  A response may go to requests with a Cookie when a shared cache
 * could store it (section 3) and give it without asking the origin
 * again: no "private", "no-store", "no-cache" or Set-Cookie, no Vary on
 * Cookie, and fresh by its own say (section 4.2.1: "s-maxage", else
 * "max-age", else Expires, still to come; X-Accel-Expires before them,
 * as for proxy_cache) or, saying none, "public"; most
 * browser requests carry some cookie, and a response that says it is
 * everybody's for a while is shared with them as nginx's proxy_cache
 * would.  To requests with an Authorization, only when it also says
 * "public", "s-maxage" or "must-revalidate" (section 3.5), fresh as
 * well.  A response led by a request with
 * credentials that may not go to such requests is its leader's alone;
 * requests with credentials that follow a flight whose response may not
 * go to them go upstream on their own (_reader.c).
 */


#include "ngx_http_singleflight_share.h"
#include "ngx_http_singleflight_vary.h"


/*
 * How the location configurations of nginx's access modules begin (nginx
 * 1.22 to 1.31): allow and deny's, auth_basic's.
 */

typedef struct {
    ngx_array_t                     *rules;
#if (NGX_HAVE_INET6)
    ngx_array_t                     *rules6;
#endif
#if (NGX_HAVE_UNIX_DOMAIN)
    ngx_array_t                     *rules_un;
#endif
} ngx_http_singleflight_rules_t;


typedef struct {
    ngx_http_complex_value_t        *realm;
    ngx_http_complex_value_t        *user_file;
} ngx_http_singleflight_basic_t;


static ngx_uint_t ngx_http_singleflight_share_live(ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_share_type(ngx_http_request_t *r,
    char *type);
static ngx_table_elt_t *ngx_http_singleflight_share_expires(
    ngx_http_request_t *r);
static ngx_uint_t ngx_http_singleflight_share_vary(ngx_str_t *value);
static ngx_uint_t ngx_http_singleflight_share_control(ngx_str_t *value);
static ngx_uint_t ngx_http_singleflight_share_accel(ngx_str_t *value);
static ngx_uint_t ngx_http_singleflight_share_token(ngx_str_t *value,
    char *token);
static ngx_int_t ngx_http_singleflight_share_seconds(ngx_str_t *value,
    char *token);
static ngx_uint_t ngx_http_singleflight_share_list(ngx_str_t *value,
    char *token, size_t len);


/*
 * A live stream, whose bytes depend on when it was asked for: server-sent
 * events, or a multipart stream of replaced parts (a camera's).  A late
 * arrival would get its past from the first byte, and its store would
 * grow as long as anybody reads it; each client gets its own, as without
 * the module, unless singleflight_private is off.
 */

static ngx_uint_t
ngx_http_singleflight_share_live(ngx_http_request_t *r)
{
    return ngx_http_singleflight_share_type(r, "text/event-stream")
           || ngx_http_singleflight_share_type(r,
                                               "multipart/x-mixed-replace");
}


/* is the response's type "type", with or without parameters? */

static ngx_uint_t
ngx_http_singleflight_share_type(ngx_http_request_t *r, char *type)
{
    size_t      len;
    ngx_str_t  *ct;

    ct = &r->headers_out.content_type;
    len = ngx_strlen(type);

    return ct->len >= len
           && ngx_strncasecmp(ct->data, (u_char *) type, len) == 0
           && (ct->len == len || ct->data[len] == ';'
               || ct->data[len] == ' ' || ct->data[len] == '\t');
}


/* what a response's header says of its reuse */
#define NGX_HTTP_SINGLEFLIGHT_CC_NOT       0x001  /* private, no-store,
                                                     Set-Cookie */
#define NGX_HTTP_SINGLEFLIGHT_CC_PUBLIC    0x002
#define NGX_HTTP_SINGLEFLIGHT_CC_REVALID   0x004  /* must-revalidate */
#define NGX_HTTP_SINGLEFLIGHT_CC_NO_CACHE  0x008
#define NGX_HTTP_SINGLEFLIGHT_CC_SMAXAGE   0x010  /* s-maxage=, any value */
#define NGX_HTTP_SINGLEFLIGHT_CC_SFRESH    0x020  /* s-maxage above 0 */
#define NGX_HTTP_SINGLEFLIGHT_CC_MAXAGE    0x040  /* max-age=, any value */
#define NGX_HTTP_SINGLEFLIGHT_CC_FRESH     0x080  /* max-age above 0 */
#define NGX_HTTP_SINGLEFLIGHT_CC_VARY_C    0x100  /* Vary: Cookie, * */
#define NGX_HTTP_SINGLEFLIGHT_CC_VARY_A    0x200  /* Vary: Authorization */
#define NGX_HTTP_SINGLEFLIGHT_CC_ACCEL     0x400  /* X-Accel-Expires */
#define NGX_HTTP_SINGLEFLIGHT_CC_AFRESH    0x800  /* ... still to come */


/*
 * Whom the response may go to, in one pass over its header: 1 when it
 * carries what singleflight_private lists ("conditions"), else 0 and in
 * "creds" the requests with credentials it may go to:
 * NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE, _AUTH, or both (the top of the
 * file).
 */

ngx_uint_t
ngx_http_singleflight_share(ngx_http_request_t *r, ngx_uint_t conditions,
    ngx_uint_t *creds)
{
    time_t                         expires;
    ngx_uint_t                     cc, fresh;
    ngx_table_elt_t               *h;
    ngx_http_singleflight_walk_t   walk;

    *creds = 0;

    if (conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_OFF) {
        conditions = 0;
    }

    cc = 0;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    /* the response's header lines, and those its location hides */

    while ((h = ngx_http_singleflight_vary_header(r, &walk)) != NULL) {

        switch (h->key.len) {

        case sizeof("Set-Cookie") - 1:

            if (ngx_strncasecmp(h->key.data, (u_char *) "Set-Cookie",
                                h->key.len)
                != 0)
            {
                break;
            }

            if (conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_SET_COOKIE) {
                return 1;
            }

            cc |= NGX_HTTP_SINGLEFLIGHT_CC_NOT;
            break;

        case sizeof("Vary") - 1:

            if (ngx_strncasecmp(h->key.data, (u_char *) "Vary", 4) == 0) {
                cc |= ngx_http_singleflight_share_vary(&h->value);
            }

            break;

        case sizeof("Cache-Control") - 1:

            if (ngx_strncasecmp(h->key.data, (u_char *) "Cache-Control",
                                h->key.len)
                != 0)
            {
                break;
            }

            if (((conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_PRIVATE)
                 && ngx_http_singleflight_share_token(&h->value, "private"))
                || ((conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_STORE)
                    && ngx_http_singleflight_share_token(&h->value,
                                                         "no-store"))
                || ((conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_CACHE)
                    && ngx_http_singleflight_share_token(&h->value,
                                                         "no-cache")))
            {
                return 1;
            }

            cc |= ngx_http_singleflight_share_control(&h->value);
            break;

        case sizeof("X-Accel-Expires") - 1:

            if (ngx_strncasecmp(h->key.data, (u_char *) "X-Accel-Expires",
                                h->key.len)
                == 0
                && (r->upstream == NULL || r->upstream->conf == NULL
                    || !(r->upstream->conf->ignore_headers
                         & NGX_HTTP_UPSTREAM_IGN_XA_EXPIRES)))
            {
                cc |= ngx_http_singleflight_share_accel(&h->value);
            }

            break;
        }
    }

    if (cc & (NGX_HTTP_SINGLEFLIGHT_CC_NOT|NGX_HTTP_SINGLEFLIGHT_CC_NO_CACHE)) {
        /* no-cache: not without asking the origin, with one's own */
        return 0;
    }

    /*
     * fresh for a shared cache (RFC 9111 section 4.2.1): s-maxage, else
     * max-age, else Expires; with none, "public" lets a cache guess.
     * Before them all, X-Accel-Expires, nginx's own cache's time, as
     * proxy_cache takes it (hidden from clients, it is still read).
     */

    if (cc & NGX_HTTP_SINGLEFLIGHT_CC_ACCEL) {
        fresh = cc & NGX_HTTP_SINGLEFLIGHT_CC_AFRESH;

    } else if (cc & NGX_HTTP_SINGLEFLIGHT_CC_SMAXAGE) {
        fresh = cc & NGX_HTTP_SINGLEFLIGHT_CC_SFRESH;

    } else if (cc & NGX_HTTP_SINGLEFLIGHT_CC_MAXAGE) {
        fresh = cc & NGX_HTTP_SINGLEFLIGHT_CC_FRESH;

    } else if ((h = ngx_http_singleflight_share_expires(r)) != NULL) {
        expires = ngx_parse_http_time(h->value.data, h->value.len);

        fresh = (expires != NGX_ERROR && expires > ngx_time());

    } else {
        fresh = cc & NGX_HTTP_SINGLEFLIGHT_CC_PUBLIC;
    }

    if (!fresh) {
        return 0;
    }

    if (!(cc & NGX_HTTP_SINGLEFLIGHT_CC_VARY_C)) {
        *creds |= NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE;
    }

    if ((cc & (NGX_HTTP_SINGLEFLIGHT_CC_PUBLIC
               |NGX_HTTP_SINGLEFLIGHT_CC_SMAXAGE
               |NGX_HTTP_SINGLEFLIGHT_CC_REVALID))
        && !(cc & NGX_HTTP_SINGLEFLIGHT_CC_VARY_A))
    {
        *creds |= NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH;
    }

    return 0;
}


/*
 * The response's Expires: the client's, else the upstream's hidden from
 * it (proxy_hide_header), unless proxy_ignore_headers names it
 */

static ngx_table_elt_t *
ngx_http_singleflight_share_expires(ngx_http_request_t *r)
{
    ngx_table_elt_t      *h;
    ngx_http_upstream_t  *u;

    h = r->headers_out.expires;

    if (h != NULL && h->hash) {
        return h;
    }

    u = ngx_http_singleflight_vary_upstream(r);

    if (u == NULL
        || (u->conf->ignore_headers & NGX_HTTP_UPSTREAM_IGN_EXPIRES))
    {
        return NULL;
    }

    h = u->headers_in.expires;

    return (h != NULL && h->hash) ? h : NULL;
}


/* what a Vary header says of requests with credentials */

static ngx_uint_t
ngx_http_singleflight_share_vary(ngx_str_t *value)
{
    ngx_uint_t  cc;

    cc = 0;

    if (ngx_http_singleflight_share_list(value, "cookie", 6)
        || ngx_http_singleflight_share_list(value, "*", 1))
    {
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_VARY_C|NGX_HTTP_SINGLEFLIGHT_CC_VARY_A;
    }

    if (ngx_http_singleflight_share_list(value, "authorization", 13)) {
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_VARY_A;
    }

    return cc;
}


/* what a Cache-Control header says of a shared cache's reuse */

static ngx_uint_t
ngx_http_singleflight_share_control(ngx_str_t *value)
{
    ngx_uint_t  cc;

    cc = 0;

    if (ngx_http_singleflight_share_token(value, "private")
        || ngx_http_singleflight_share_token(value, "no-store"))
    {
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_NOT;
    }

    if (ngx_http_singleflight_share_token(value, "public")) {
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_PUBLIC;
    }

    if (ngx_http_singleflight_share_token(value, "no-cache")) {
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_NO_CACHE;
    }

    if (ngx_http_singleflight_share_token(value, "must-revalidate")) {
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_REVALID;
    }

    switch (ngx_http_singleflight_share_seconds(value, "s-maxage")) {
    case 1:
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_SFRESH;
        /* fall through */
    case 0:
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_SMAXAGE;
    }

    switch (ngx_http_singleflight_share_seconds(value, "max-age")) {
    case 1:
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_FRESH;
        /* fall through */
    case 0:
        cc |= NGX_HTTP_SINGLEFLIGHT_CC_MAXAGE;
    }

    return cc;
}


/*
 * X-Accel-Expires: seconds, or "@" and a time; one nginx cannot read is
 * ignored, as proxy_cache ignores it
 */

static ngx_uint_t
ngx_http_singleflight_share_accel(ngx_str_t *value)
{
    ngx_int_t  n;

    if (value->len > 1 && value->data[0] == '@') {
        n = ngx_atoi(value->data + 1, value->len - 1);

        if (n == NGX_ERROR) {
            return 0;
        }

        return NGX_HTTP_SINGLEFLIGHT_CC_ACCEL
               | (n > ngx_time() ? NGX_HTTP_SINGLEFLIGHT_CC_AFRESH : 0);
    }

    n = ngx_atoi(value->data, value->len);

    if (n == NGX_ERROR) {
        return 0;
    }

    return NGX_HTTP_SINGLEFLIGHT_CC_ACCEL
           | (n > 0 ? NGX_HTTP_SINGLEFLIGHT_CC_AFRESH : 0);
}


/* a Cache-Control directive, as a whole word, in any case */

static ngx_uint_t
ngx_http_singleflight_share_token(ngx_str_t *value, char *token)
{
    u_char  *p, *last;
    size_t   len;

    len = ngx_strlen(token);
    p = value->data;
    last = value->data + value->len;

    while (p + len <= last) {

        if (ngx_strncasecmp(p, (u_char *) token, len) == 0
            && (p == value->data || p[-1] == ' ' || p[-1] == '\t'
                || p[-1] == ',')
            && (p + len == last || p[len] == ' ' || p[len] == '\t'
                || p[len] == ',' || p[len] == '=' || p[len] == ';'))
        {
            return 1;
        }

        p++;
    }

    return 0;
}


/*
 * "token=N" among a Cache-Control's directives: 1, N above 0; 0, N is 0
 * or no number (stale, RFC 9111 section 1.2.2); -1, no such directive
 */

static ngx_int_t
ngx_http_singleflight_share_seconds(ngx_str_t *value, char *token)
{
    u_char  *p, *last;
    size_t   len;

    len = ngx_strlen(token);
    p = value->data;
    last = value->data + value->len;

    while (p + len < last) {

        if (ngx_strncasecmp(p, (u_char *) token, len) == 0
            && (p == value->data || p[-1] == ' ' || p[-1] == '\t'
                || p[-1] == ',')
            && p[len] == '=')
        {
            for (p += len + 1; p < last && (*p == '"' || *p == '0'); p++) {
                /* void */
            }

            return p < last && *p >= '1' && *p <= '9';
        }

        p++;
    }

    return -1;
}


/* a list header's element, whole, in any case */

static ngx_uint_t
ngx_http_singleflight_share_list(ngx_str_t *value, char *token, size_t len)
{
    u_char  *p, *last, *start;

    p = value->data;
    last = p + value->len;

    while (p < last) {

        while (p < last && (*p == ' ' || *p == '\t' || *p == ',')) {
            p++;
        }

        start = p;

        while (p < last && *p != ',' && *p != ' ' && *p != '\t') {
            p++;
        }

        if ((size_t) (p - start) == len
            && ngx_strncasecmp(start, (u_char *) token, len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/*
 * Is a response to "ctx"'s request (made by "r": the request itself, or
 * its fetch) its leader's alone, and why: an interim one, a private one,
 * one made for the leader's credentials, one too large, a cache hit,
 * "Vary: *".  NGX_HTTP_SINGLEFLIGHT_R_NONE: it may be shared, with "creds"
 * the requests with credentials it may go to and "vary" the headers it
 * varies on; R_ERROR: no memory.
 */

ngx_uint_t
ngx_http_singleflight_share_reason(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_uint_t *creds, ngx_array_t **vary)
{
    ngx_int_t                          rc;
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = ctx->conf;
    *creds = 0;

    if (r->headers_out.status < NGX_HTTP_OK) {
        /*
         * 101, or an interim response nginx passes on as if final (a 103
         * Early Hints before nginx 1.29): what follows is not a stored
         * body, the leader gets it all as without the module
         */
        return NGX_HTTP_SINGLEFLIGHT_R_UNSHARED;
    }

    if (!(conf->private & NGX_HTTP_SINGLEFLIGHT_PRIVATE_OFF)
        && !ngx_http_singleflight_share_header_only(r)
        && ngx_http_singleflight_share_live(r))
    {
        /* each its own; its key not marked: its other answers may share */
        return NGX_HTTP_SINGLEFLIGHT_R_UNSHARED;
    }

    if (ngx_http_singleflight_share(r, conf->private, creds)) {
        return NGX_HTTP_SINGLEFLIGHT_R_PRIVATE;
    }

    if (ctx->creds & ~*creds) {
        /*
         * made for its leader's credentials, and no shared cache would
         * give it to anybody else's: the leader's alone
         */
        return NGX_HTTP_SINGLEFLIGHT_R_PRIVATE;
    }

    if (conf->max_size && r->headers_out.content_length_n > conf->max_size) {
        (void) ngx_atomic_fetch_add(&ctx->zone->counters->oversized, 1);

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "singleflight response of %O bytes is larger than "
                      "singleflight_max_size, followers fetch on their own",
                      r->headers_out.content_length_n);

        return NGX_HTTP_SINGLEFLIGHT_R_UNSHARED;
    }

    if (ngx_http_singleflight_share_cached(r)) {

        /*
         * from the cache: no origin to spare, each one reads it itself.
         * Not a flight for its leader either: no status of the module's
         * ($singleflight_status empty, not counted), as a request the
         * module never saw
         */

        if (ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_LEADER) {
            ctx->status = NGX_HTTP_SINGLEFLIGHT_ST_NONE;
        }

        return NGX_HTTP_SINGLEFLIGHT_R_CACHED;
    }

#if (NGX_HTTP_CACHE)
    if (r->cached && r == r->main && r->upstream != NULL
        && r->upstream->cache_status)
    {
        /*
         * the cache's answer after asking the origin (revalidated, stale
         * after an error): sent from the cache's file, past the upstream's
         * reads that a leader stores from; each follower asks the cache
         */
        return NGX_HTTP_SINGLEFLIGHT_R_UNSHARED;
    }
#endif

    rc = ngx_http_singleflight_vary_collect(r, ctx->request, vary);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_SINGLEFLIGHT_R_ERROR;
    }

    if (rc == NGX_DECLINED) {
        return NGX_HTTP_SINGLEFLIGHT_R_UNSHARED;   /* Vary: * */
    }

    return NGX_HTTP_SINGLEFLIGHT_R_NONE;
}


/*
 * A response with no body, as nginx's header filter will make it (later
 * than the module's filters run): a HEAD's, a 204 or a 304, whatever
 * length the origin gave.
 */

ngx_uint_t
ngx_http_singleflight_share_header_only(ngx_http_request_t *r)
{
    return r->header_only || r->method == NGX_HTTP_HEAD
           || r->headers_out.status == NGX_HTTP_NO_CONTENT
           || r->headers_out.status == NGX_HTTP_NOT_MODIFIED;
}


/*
 * Did the origin answer: a response header from it, which nginx times in
 * the last try's state, not its own 502 or 504 for an origin that failed,
 * timed out or sent an invalid header, nor a cache's answer?
 */

ngx_uint_t
ngx_http_singleflight_share_answered(ngx_http_request_t *r)
{
    ngx_http_upstream_t  *u;

    u = r->upstream;

    /* not the empty state nginx puts between two locations' upstreams */
    return u != NULL && u->state != NULL && u->state->peer != NULL
           && u->state->header_time != (ngx_msec_t) -1
           && !ngx_http_singleflight_share_cached(r);
}


/*
 * Did a cache (proxy_cache and the like) answer without the origin: a
 * hit, or a stale response while another request updates it?  Not one it
 * gave after asking the origin (revalidated, stale after an error): the
 * upstream then has a state of its own, a try's; a hit has none.
 */

ngx_uint_t
ngx_http_singleflight_share_cached(ngx_http_request_t *r)
{
#if (NGX_HTTP_CACHE)
    ngx_http_upstream_t  *u;

    u = r->upstream;

    return u != NULL && u->cache_status != 0
           && u->cache_status != NGX_HTTP_CACHE_MISS
           && u->cache_status != NGX_HTTP_CACHE_BYPASS
           && u->cache_status != NGX_HTTP_CACHE_EXPIRED
           && (u->state == NULL || u->state->peer == NULL);
#else
    return 0;
#endif
}


/*
 * Will the cache answer the requests after r's without waiting for r's
 * origin: r updates a stale response that the cache gives the others
 * meanwhile (proxy_cache_use_stale updating, stale-while-revalidate)?
 * (One that skips the cache, proxy_cache_bypass, has flights of its own:
 * skips_cache.)
 */

ngx_uint_t
ngx_http_singleflight_share_unwaited(ngx_http_request_t *r)
{
#if (NGX_HTTP_CACHE)
    ngx_http_upstream_t  *u;

    u = r->upstream;

    return u != NULL && r->cache != NULL
           && u->cache_status == NGX_HTTP_CACHE_EXPIRED
           && r->cache->updating
           && ((u->conf->cache_use_stale & NGX_HTTP_UPSTREAM_FT_UPDATING)
               || r->cache->stale_updating);
#else
    return 0;
#endif
}


/*
 * A request redirected (X-Accel-Redirect, try_files, index, error_page)
 * from the location "from" to r's: does r's check clients with what
 * "from" does not have?  Its allow or deny rules, auth_basic,
 * auth_request or satisfy; with an access module of another kind in
 * nginx, any other location.  A location that sets none of them has its
 * parent's, the same pointers: the same checks, which every request of
 * "from" met there.  nginx runs no access phase for a subrequest, so a
 * fetch redirected to such a location met none of them; nor did the
 * followers of a leader that did.
 */

ngx_uint_t
ngx_http_singleflight_share_checked(ngx_http_request_t *r, void **from)
{
    void                              **to;
    ngx_str_t                          *uri;
    ngx_http_core_loc_conf_t           *clcf, *prev;
    ngx_http_singleflight_basic_t      *basic, *pbasic;
    ngx_http_singleflight_main_conf_t  *smcf;

    static ngx_http_singleflight_rules_t  none;

    to = r->loc_conf;
    clcf = to[ngx_http_core_module.ctx_index];
    prev = from[ngx_http_core_module.ctx_index];

    if (clcf->loc_conf == prev->loc_conf) {
        /* back where it came in */
        return 0;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    if (smcf->access_other || clcf->satisfy != prev->satisfy) {
        return 1;
    }

    if (smcf->access_conf != NGX_ERROR
        && ngx_memcmp(to[smcf->access_conf], &none, sizeof(none)) != 0
        && ngx_memcmp(to[smcf->access_conf], from[smcf->access_conf],
                      sizeof(none))
           != 0)
    {
        return 1;
    }

    if (smcf->basic_conf != NGX_ERROR) {
        basic = to[smcf->basic_conf];
        pbasic = from[smcf->basic_conf];

        if (basic->realm != NULL
            && (basic->realm != pbasic->realm
                || basic->user_file != pbasic->user_file))
        {
            return 1;
        }
    }

    if (smcf->request_conf != NGX_ERROR) {
        uri = to[smcf->request_conf];

        if (uri->len
            && uri->data != ((ngx_str_t *) from[smcf->request_conf])->data)
        {
            return 1;
        }
    }

    return 0;
}
