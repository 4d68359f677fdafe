/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Vary.
 *
 * When a fetched response names request headers in Vary, the fetch's
 * values of those headers are stored with it (_store.c).  A reader is
 * given the response only if its own values are the same, byte for byte
 * (several lines of one header are joined with ", "; a missing header is
 * the empty value).  The others start or join the flight of their own
 * variant at once, in parallel (_reader.c), and a request that arrives
 * later goes straight to the flight of its variant (_flight.c), so
 * clients split between N values of a header cost N origin requests,
 * none of them queued behind another.  "Vary: *" is never shared.
 *
 * A flight started by a request that already knows the Vary names of its
 * key (from the flight it left, or another flight of the key) foresees
 * its variant, as Varnish's busy objects do: a prediction block (the
 * header block's Vary part alone) with the names and the request's
 * values.  Requests match a flight still waiting for its header against
 * it, so that another variant never queues behind it.
 */


#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_origin.h"


static u_char *ngx_http_singleflight_vary_pair(u_char *block, u_char *p,
    ngx_str_t *name, ngx_str_t *value);
static ngx_int_t ngx_http_singleflight_vary_value(ngx_http_request_t *r,
    void **loc_conf, ngx_str_t *name, ngx_str_t *value);
static ngx_int_t ngx_http_singleflight_request_header(ngx_http_request_t *r,
    ngx_str_t *name, ngx_str_t *value);


/* the request headers a fetch never sends */
ngx_str_t  ngx_http_singleflight_conditions[] = {
    ngx_string("If-Modified-Since"),
    ngx_string("If-Unmodified-Since"),
    ngx_string("If-None-Match"),
    ngx_string("If-Match"),
    ngx_string("If-Range"),
    ngx_string("Range"),
    ngx_null_string
};


static ngx_uint_t ngx_http_singleflight_vary_ignored(ngx_http_upstream_t *u,
    ngx_table_elt_t *h);
static ngx_int_t ngx_http_singleflight_vary_coding(ngx_http_request_t *r,
    ngx_http_request_t *host, ngx_array_t **pairs);
static ngx_uint_t ngx_http_singleflight_vary_offers(ngx_str_t *value);
static ngx_table_elt_t *ngx_http_singleflight_vary_content_coding(
    ngx_http_request_t *r);
static ngx_str_t *ngx_http_singleflight_vary_push(ngx_http_request_t *r,
    ngx_array_t **pairs, ngx_str_t *name);


static ngx_str_t  ngx_http_singleflight_accept_encoding =
    ngx_string("Accept-Encoding");


/*
 * The response's header lines, one a call, NULL after the last: r's, then
 * those of its upstream's response that the location hides from clients
 * (proxy_hide_header and the like).  A Vary, a Cache-Control or a
 * Set-Cookie so hidden still says whom the body is for, as it does to
 * proxy_cache, which reads the upstream's own.
 */

ngx_table_elt_t *
ngx_http_singleflight_vary_header(ngx_http_request_t *r,
    ngx_http_singleflight_walk_t *w)
{
    ngx_list_t           *list;
    ngx_table_elt_t      *h;
    ngx_http_upstream_t  *u;

    u = ngx_http_singleflight_vary_upstream(r);

    for ( ;; ) {

        list = w->hidden ? &u->headers_in.headers : &r->headers_out.headers;
        h = ngx_http_singleflight_list_next(list, w);

        if (h == NULL) {

            if (w->hidden || u == NULL
                || u->conf->hide_headers_hash.buckets == NULL)
            {
                return NULL;
            }

            w->hidden = 1;
            w->part = NULL;
            continue;
        }

        if (h->hash == 0) {
            continue;
        }

        if (w->hidden
            && (ngx_hash_find(&u->conf->hide_headers_hash, h->hash,
                              h->lowcase_key, h->key.len)
                == NULL
                || ngx_http_singleflight_vary_ignored(u, h)))
        {
            /* passed on (seen in r's), or one proxy_cache ignores too */
            continue;
        }

        return h;
    }
}


/*
 * The upstream whose response this is, or NULL: not after its
 * X-Accel-Redirect or an error_page, which made another response (nginx
 * leaves r->upstream set)
 */

ngx_http_upstream_t *
ngx_http_singleflight_vary_upstream(ngx_http_request_t *r)
{
    ngx_http_upstream_t  *u;

    u = r->upstream;

    if (u == NULL || u->conf == NULL || r->error_page
        || (u->headers_in.x_accel_redirect != NULL
            && !(u->conf->ignore_headers
                 & NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT)))
    {
        return NULL;
    }

    return u;
}


/* a hidden header line that proxy_ignore_headers (and the like) names */

static ngx_uint_t
ngx_http_singleflight_vary_ignored(ngx_http_upstream_t *u, ngx_table_elt_t *h)
{
    ngx_uint_t  i;

    static struct {
        ngx_str_t   name;
        ngx_uint_t  flag;
    }  ignorable[] = {
        { ngx_string("Set-Cookie"), NGX_HTTP_UPSTREAM_IGN_SET_COOKIE },
        { ngx_string("Cache-Control"), NGX_HTTP_UPSTREAM_IGN_CACHE_CONTROL },
        { ngx_string("Vary"), NGX_HTTP_UPSTREAM_IGN_VARY }
    };

    for (i = 0; i < sizeof(ignorable) / sizeof(ignorable[0]); i++) {
        if (h->key.len == ignorable[i].name.len
            && ngx_strncasecmp(h->key.data, ignorable[i].name.data,
                               h->key.len)
               == 0)
        {
            return (u->conf->ignore_headers & ignorable[i].flag) != 0;
        }
    }

    return 0;
}


/*
 * The (name, fetch's value) pairs of the response's Vary headers, for
 * the fetch "r" of "host": NGX_OK (*pairs is NULL when there is no Vary),
 * NGX_DECLINED for "Vary: *", NGX_ERROR.  A value is what the origin got
 * (ngx_http_singleflight_origin_header()): the fetch's header, and what
 * the location where the response was made sets, made for its host as it
 * is for every reader.
 */

ngx_int_t
ngx_http_singleflight_vary_collect(ngx_http_request_t *r,
    ngx_http_request_t *host, ngx_array_t **pairs)
{
    u_char                        *p, *last, *start;
    ngx_str_t                     *pair, name, client;
    ngx_table_elt_t               *h;
    ngx_http_singleflight_walk_t   walk;

    *pairs = NULL;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_vary_header(r, &walk)) != NULL) {

        if (h->key.len != sizeof("Vary") - 1
            || ngx_strncasecmp(h->key.data, (u_char *) "Vary", 4) != 0)
        {
            continue;
        }

        p = h->value.data;
        last = p + h->value.len;

        while (p < last) {

            while (p < last && (*p == ' ' || *p == '\t' || *p == ',')) {
                p++;
            }

            start = p;

            while (p < last && *p != ',' && *p != ' ' && *p != '\t') {
                p++;
            }

            if (p == start) {
                continue;
            }

            name.data = start;
            name.len = p - start;

            if (name.len == 1 && name.data[0] == '*') {
                return NGX_DECLINED;
            }

            pair = ngx_http_singleflight_vary_push(r, pairs, &name);
            if (pair == NULL) {
                return NGX_ERROR;
            }

            if (ngx_http_singleflight_request_header(r, &name, &client)
                != NGX_OK
                || ngx_http_singleflight_origin_header(host, r->loc_conf,
                                                       &name, &client,
                                                       &pair[1])
                   != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    return ngx_http_singleflight_vary_coding(r, host, pairs);
}


/*
 * An origin that encodes by Accept-Encoding without naming it in Vary
 * (nginx's gzip_vary off, its default): a response that has a
 * Content-Encoding, or that an origin made for a fetch that offered no
 * coding, is taken as varying on it, as plain proxying would give each
 * client the answer to its own Accept-Encoding.  Not where the location
 * sets the header itself to one value: every fetch then offers the origin
 * the same; to a value of variables, it varies on what the directive
 * makes.  A fetch that offered codings and got none shows an origin that
 * encodes nothing here: everybody shares it.  "identity" alone, or
 * codings refused by "q=0", offer none.
 */

static ngx_int_t
ngx_http_singleflight_vary_coding(ngx_http_request_t *r,
    ngx_http_request_t *host, ngx_array_t **pairs)
{
    ngx_str_t        *pair, *name, value;
    ngx_uint_t        i, sets;
    ngx_table_elt_t  *ce;

    name = &ngx_http_singleflight_accept_encoding;

    sets = ngx_http_singleflight_origin_sets(r->loc_conf, name);

    if (sets == 1) {
        return NGX_OK;
    }

    if (*pairs != NULL) {
        pair = (*pairs)->elts;

        for (i = 0; i < (*pairs)->nelts; i++) {
            if (pair[2 * i].len == name->len
                && ngx_strncasecmp(pair[2 * i].data, name->data, name->len)
                   == 0)
            {
                return NGX_OK;
            }
        }
    }

    if (ngx_http_singleflight_request_header(r, name, &value) != NGX_OK) {
        return NGX_ERROR;
    }

    if (sets) {
        /* what the directive makes, whatever the response */

        pair = ngx_http_singleflight_vary_push(r, pairs, name);
        if (pair == NULL) {
            return NGX_ERROR;
        }

        return ngx_http_singleflight_origin_header(host, r->loc_conf, name,
                                                   &value, &pair[1]);
    }

    ce = ngx_http_singleflight_vary_content_coding(r);

    if ((ce == NULL || ce->value.len == 0
         || (ce->value.len == sizeof("identity") - 1
             && ngx_strncasecmp(ce->value.data, (u_char *) "identity",
                                sizeof("identity") - 1) == 0))
        && (ngx_http_singleflight_vary_offers(&value)
            || ngx_http_singleflight_vary_upstream(r) == NULL))
    {
        return NGX_OK;
    }

    pair = ngx_http_singleflight_vary_push(r, pairs, name);
    if (pair == NULL) {
        return NGX_ERROR;
    }

    pair[1] = value;

    return NGX_OK;
}


/*
 * Does an Accept-Encoding value offer a coding: an element other than
 * "identity" that no "q=0" (or "q=0.0" and the like) refuses?
 */

static ngx_uint_t
ngx_http_singleflight_vary_offers(ngx_str_t *value)
{
    u_char  *p, *last, *start, *end;

    last = value->data + value->len;

    for (p = value->data; p < last; p = (end < last) ? end + 1 : last) {

        end = ngx_strlchr(p, last, ',');
        if (end == NULL) {
            end = last;
        }

        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }

        start = p;

        while (p < end && *p != ';' && *p != ' ' && *p != '\t') {
            p++;
        }

        if (p == start
            || (p - start == sizeof("identity") - 1
                && ngx_strncasecmp(start, (u_char *) "identity",
                                   sizeof("identity") - 1) == 0))
        {
            continue;
        }

        /* its parameters: is one of them "q" and 0? */

        for ( ;; ) {
            while (p < end && (*p == ' ' || *p == '\t' || *p == ';')) {
                p++;
            }

            if (p == end) {
                return 1;
            }

            if (end - p >= 3 && (*p == 'q' || *p == 'Q') && p[1] == '='
                && p[2] == '0')
            {
                for (p += 3; p < end && (*p == '.' || *p == '0'); p++) {
                    /* void */
                }

                if (p == end || *p == ' ' || *p == '\t' || *p == ';') {
                    break;
                }
            }

            while (p < end && *p != ';') {
                p++;
            }
        }
    }

    return 0;
}


/*
 * The response's Content-Encoding, one proxy_hide_header keeps from the
 * client included: the body is still what the origin encoded.
 */

static ngx_table_elt_t *
ngx_http_singleflight_vary_content_coding(ngx_http_request_t *r)
{
    ngx_table_elt_t               *h;
    ngx_http_singleflight_walk_t   walk;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_vary_header(r, &walk)) != NULL) {
        if (h->key.len == sizeof("Content-Encoding") - 1
            && ngx_strncasecmp(h->key.data, (u_char *) "Content-Encoding",
                               sizeof("Content-Encoding") - 1)
               == 0)
        {
            return h;
        }
    }

    return NULL;
}


/* a (name, value) pair more, its name set; the array made at the first */

static ngx_str_t *
ngx_http_singleflight_vary_push(ngx_http_request_t *r, ngx_array_t **pairs,
    ngx_str_t *name)
{
    ngx_str_t  *pair;

    if (*pairs == NULL) {
        *pairs = ngx_array_create(r->pool, 2, 2 * sizeof(ngx_str_t));
        if (*pairs == NULL) {
            return NULL;
        }
    }

    pair = ngx_array_push(*pairs);
    if (pair == NULL) {
        return NULL;
    }

    pair[0] = *name;

    return pair;
}


/*
 * Are the request's values those of a header block's, or of a prediction
 * block's?  A header block's are compared as made where its response
 * was, a prediction's (which names no location) where the request is.
 */

ngx_uint_t
ngx_http_singleflight_vary_match(ngx_http_request_t *r, u_char *block)
{
    u_char                         *p;
    void                          **loc_conf;
    ngx_str_t                       name, value, mine;
    ngx_uint_t                      i;
    ngx_http_singleflight_header_t  hdr;

    if (block == NULL) {
        return 0;
    }

    ngx_http_singleflight_store_parse(block, &hdr);

    loc_conf = hdr.loc_conf ? hdr.loc_conf : r->loc_conf;
    p = block + hdr.vary_offset;

    for (i = 0; i < hdr.nvary; i++) {

        p = ngx_http_singleflight_vary_pair(block, p, &name, &value);

        if (ngx_http_singleflight_vary_value(r, loc_conf, &name, &mine)
            != NGX_OK)
        {
            return 0;
        }

        if (mine.len != value.len
            || (value.len && ngx_memcmp(mine.data, value.data, value.len) != 0))
        {
            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "singleflight request differs in \"%V\"", &name);
            return 0;
        }
    }

    return 1;
}


/*
 * Does the response vary on a header this request sends and a fetch never
 * does (Range, the conditional ones)?  Then no flight can ever answer it.
 */

ngx_uint_t
ngx_http_singleflight_vary_unfetchable(ngx_http_request_t *r, u_char *block)
{
    u_char                         *p;
    ngx_str_t                       name, value, mine;
    ngx_uint_t                      i;
    ngx_http_singleflight_header_t  hdr;

    if (block == NULL) {
        return 0;
    }

    ngx_http_singleflight_store_parse(block, &hdr);

    p = block + hdr.vary_offset;

    for (i = 0; i < hdr.nvary; i++) {

        p = ngx_http_singleflight_vary_pair(block, p, &name, &value);

        if (ngx_http_singleflight_conditional(&name)
            && ngx_http_singleflight_request_header(r, &name, &mine) == NGX_OK
            && mine.len)
        {
            return 1;
        }
    }

    return 0;
}


/* how many request headers a header block's response varies on */

ngx_uint_t
ngx_http_singleflight_vary_names(u_char *block)
{
    ngx_http_singleflight_header_t  hdr;

    if (block == NULL) {
        return 0;
    }

    ngx_http_singleflight_store_parse(block, &hdr);

    return hdr.nvary;
}


/*
 * The variant a request of the key will be, from the Vary names of
 * "block": a block like a header block with only its Vary part, the
 * names and this request's values.  In the request's pool.
 */

u_char *
ngx_http_singleflight_vary_predict(ngx_http_request_t *r, u_char *block,
    size_t *plen)
{
    size_t                          len;
    u_char                         *p, *out;
    ngx_str_t                       name, value, mine, *values;
    ngx_uint_t                      i;
    ngx_http_singleflight_header_t  hdr, phdr;

    ngx_http_singleflight_store_parse(block, &hdr);

    if (hdr.nvary == 0) {
        return NULL;
    }

    values = ngx_palloc(r->pool, 2 * hdr.nvary * sizeof(ngx_str_t));
    if (values == NULL) {
        return NULL;
    }

    len = sizeof(ngx_http_singleflight_header_t);
    p = block + hdr.vary_offset;

    for (i = 0; i < hdr.nvary; i++) {

        p = ngx_http_singleflight_vary_pair(block, p, &name, &value);

        if (ngx_http_singleflight_vary_value(r, r->loc_conf, &name, &mine)
            != NGX_OK)
        {
            return NULL;
        }

        values[2 * i] = name;
        values[2 * i + 1] = mine;

        len = ngx_align(len, sizeof(size_t)) + 2 * sizeof(size_t)
              + name.len + mine.len;
    }

    out = ngx_pnalloc(r->pool, len);
    if (out == NULL) {
        return NULL;
    }

    ngx_memzero(&phdr, sizeof(ngx_http_singleflight_header_t));
    phdr.nvary = hdr.nvary;
    phdr.vary_offset = sizeof(ngx_http_singleflight_header_t);

    ngx_memcpy(out, &phdr, sizeof(ngx_http_singleflight_header_t));

    ngx_http_singleflight_store_put_vary(out, out + phdr.vary_offset,
                                         values, hdr.nvary);

    *plen = len;

    return out;
}


/* what the origin would get of a header from the request */

static ngx_int_t
ngx_http_singleflight_vary_value(ngx_http_request_t *r, void **loc_conf,
    ngx_str_t *name, ngx_str_t *value)
{
    ngx_str_t  client;

    if (ngx_http_singleflight_request_header(r, name, &client) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_singleflight_origin_header(r, loc_conf, name, &client,
                                               value);
}


/* a request header's value, all its lines joined with ", " */

static ngx_int_t
ngx_http_singleflight_request_header(ngx_http_request_t *r, ngx_str_t *name,
    ngx_str_t *value)
{
    u_char                        *p;
    size_t                         len;
    ngx_uint_t                     n;
    ngx_list_t                    *list;
    ngx_table_elt_t               *h, *one;
    ngx_http_singleflight_walk_t   walk;

    len = 0;
    n = 0;
    one = NULL;
    list = &r->headers_in.headers;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(list, &walk)) != NULL) {
        if (h->key.len == name->len
            && ngx_strncasecmp(h->key.data, name->data, name->len) == 0)
        {
            len += (n ? 2 : 0) + h->value.len;
            one = h;
            n++;
        }
    }

    if (n <= 1) {
        if (one != NULL) {
            *value = one->value;

        } else {
            ngx_str_null(value);
        }

        return NGX_OK;
    }

    value->data = ngx_pnalloc(r->pool, len);
    if (value->data == NULL) {
        return NGX_ERROR;
    }

    p = value->data;
    n = 0;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(list, &walk)) != NULL) {
        if (h->key.len == name->len
            && ngx_strncasecmp(h->key.data, name->data, name->len) == 0)
        {
            if (n++) {
                *p++ = ','; *p++ = ' ';
            }

            p = ngx_cpymem(p, h->value.data, h->value.len);
        }
    }

    value->len = p - value->data;

    return NGX_OK;
}


/*
 * One (name, value) pair of a block's Vary part at "p" (aligned there):
 * the next pair's place.
 */

static u_char *
ngx_http_singleflight_vary_pair(u_char *block, u_char *p, ngx_str_t *name,
    ngx_str_t *value)
{
    p = block + ngx_align((size_t) (p - block), sizeof(size_t));

    ngx_memcpy(&name->len, p, sizeof(size_t));
    p += sizeof(size_t);
    ngx_memcpy(&value->len, p, sizeof(size_t));
    p += sizeof(size_t);

    name->data = p;
    value->data = p + name->len;

    return p + name->len + value->len;
}


/* is "name" a request header a fetch never sends? */

ngx_uint_t
ngx_http_singleflight_conditional(ngx_str_t *name)
{
    ngx_str_t  *c;

    for (c = ngx_http_singleflight_conditions; c->len; c++) {
        if (name->len == c->len
            && ngx_strncasecmp(name->data, c->data, c->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}
