/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The clone: what a fetch's request is (_fetch.c), and what its upstream
 * leaves for the request that hosts it.
 *
 * A fetch is a background subrequest of its host, cloned at this
 * module's phase (NGX_HTTP_SUBREQUEST_BACKGROUND|NGX_HTTP_SUBREQUEST_CLONE):
 * it runs the rest of the location as its host would have, with the
 * host's variables, body and headers.  Three things differ, each so that
 * the response is the one every client's own request would have had:
 *
 *   - its request headers lack the conditional and Range ones, which
 *     every reader's own filters answer from the shared response, and
 *     carry CDN-Loop with this nginx's name, so that a fetch that comes
 *     back here is recognised (_handler.c);
 *   - the variables of those headers are taken again for it, when the
 *     host took them already (a map in the key, a log variable);
 *   - a resume begins where the first fetch began, whatever the host did
 *     since.
 *
 * Back the other way, the host's $upstream_... variables must tell of
 * the fetch's upstream as they would of the host's own: while its header
 * is made it reads a copy of the fetch's upstream and states (a copy, so
 * that nothing it does can finalize the running fetch), and the fetch's
 * own once it is over.
 */


#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_origin.h"


static void ngx_http_singleflight_clone_lend_ctx(ngx_http_request_t *host,
    ngx_http_request_t *r);
static void ngx_http_singleflight_clone_begin_set(ngx_http_request_t *r,
    ngx_http_singleflight_begin_t *b);
static ngx_int_t ngx_http_singleflight_clone_headers_shared(
    ngx_http_request_t *r, ngx_list_t *headers);
static void ngx_http_singleflight_clone_states_final(ngx_http_request_t *host,
    ngx_array_t *states, ngx_http_singleflight_vars_t *vars);


static ngx_str_t  ngx_http_singleflight_no_uri = ngx_null_string;


/* the modules whose context the leader borrows from its fetch */
static char  *ngx_http_singleflight_lent_names[] = {
    "ngx_http_proxy_module",
    "ngx_http_fastcgi_module"
};

#define NGX_HTTP_SINGLEFLIGHT_LENT                                            \
    (sizeof(ngx_http_singleflight_lent_names) / sizeof(char *))

static ngx_uint_t  ngx_http_singleflight_lent[NGX_HTTP_SINGLEFLIGHT_LENT];
static ngx_uint_t  ngx_http_singleflight_nlent;

/*
 * their variables ($http_range...), whose cached values a fetch must not
 * see: the indexes, or NGX_ERROR, set in init_module
 */
static ngx_int_t  ngx_http_singleflight_condition_vars[6] = {
    NGX_ERROR, NGX_ERROR, NGX_ERROR, NGX_ERROR, NGX_ERROR, NGX_ERROR
};


/*
 * The condition headers' variables ($http_if_none_match...) that the
 * configuration indexed, whose values a fetch must not share with its
 * host (clone_variables()); NGX_ERROR for one nobody indexed.  From the
 * master's init_module: the configuration is complete then, and a
 * configuration that fails to load never gets here.
 */

void
ngx_http_singleflight_clone_init_module(ngx_cycle_t *cycle)
{
    u_char      *p, name[64];
    size_t       len;
    ngx_str_t   *h;
    ngx_uint_t   i;

    for (i = 0, h = ngx_http_singleflight_conditions; h->len; i++, h++) {

        len = sizeof("http_") - 1 + h->len;

        p = ngx_cpymem(name, "http_", sizeof("http_") - 1);
        ngx_strlow(p, h->data, h->len);

        for ( /* void */ ; p < name + len; p++) {
            if (*p == '-') {
                *p = '_';
            }
        }

        ngx_http_singleflight_condition_vars[i] =
                     ngx_http_singleflight_variable_index(cycle, name, len);
    }
}


/*
 * The content handlers' modules whose request context their variables
 * read ($proxy_host, $proxy_port, $fastcgi_script_name...): found by
 * name, as nginx may be built without them.
 */

void
ngx_http_singleflight_clone_init(ngx_conf_t *cf)
{
    ngx_int_t   index;
    ngx_uint_t  i, n;

    n = 0;

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_LENT; i++) {
        index = ngx_http_singleflight_module_index(cf,
                                        ngx_http_singleflight_lent_names[i]);
        if (index != NGX_ERROR) {
            ngx_http_singleflight_lent[n++] = index;
        }
    }

    ngx_http_singleflight_nlent = n;
}


/*
 * The leader's variables from its fetch's content handler: its context
 * lent while the leader has none of its own.
 */

static void
ngx_http_singleflight_clone_lend_ctx(ngx_http_request_t *host,
    ngx_http_request_t *r)
{
    ngx_uint_t  i, idx;

    for (i = 0; i < ngx_http_singleflight_nlent; i++) {
        idx = ngx_http_singleflight_lent[i];

        if (host->ctx[idx] == NULL) {
            host->ctx[idx] = r->ctx[idx];
        }
    }
}


/*
 * The fetch's subrequest of "r", NULL on an error, ending in "ps".  It
 * takes its pool from its parent: the host's is swapped for "pool", the
 * fetches' one, around the call.  Where it begins goes into "begin".  A
 * resume ("prev": where the first began) begins there, whatever the host
 * did since (its own error_page, or the location its reading took): the
 * rest is asked for through the same location, redirects and all.
 */

ngx_http_request_t *
ngx_http_singleflight_clone_subrequest(ngx_http_request_t *r,
    ngx_pool_t *pool, ngx_http_post_subrequest_t *ps,
    ngx_http_singleflight_begin_t *begin, ngx_http_singleflight_begin_t *prev)
{
    ngx_int_t                       rc;
    ngx_pool_t                     *host_pool;
    ngx_http_request_t             *sr;
    ngx_http_request_body_t        *body;
    ngx_http_singleflight_begin_t   now;

    /*
     * a host that read no body gives the fetch an empty one, as
     * auth_request gives its subrequest: modules that a redirect of the
     * fetch meets read the body of every request they run for
     * (ModSecurity's handler, echo_location's wait for it)
     */

    body = r->request_body;

    if (body == NULL) {
        body = ngx_pcalloc(pool, sizeof(ngx_http_request_body_t));
        if (body == NULL) {
            return NULL;
        }
    }

    host_pool = r->pool;
    r->pool = pool;

    /* "begin": what clone_where() sees a redirect change */

    if (prev != NULL) {
        ngx_http_singleflight_clone_begin_get(r, &now);
        ngx_http_singleflight_clone_begin_set(r, prev);
        *begin = *prev;

    } else {
        ngx_http_singleflight_clone_begin_get(r, begin);
    }

    /*
     * The clone's URI is the one the fetch begins with, and so is its
     * extension, which ngx_http_subrequest() would look for along all of
     * it: it is given an empty one, and both are set after.
     */

    rc = ngx_http_subrequest(r, &ngx_http_singleflight_no_uri, &r->args, &sr,
                             ps, NGX_HTTP_SUBREQUEST_BACKGROUND
                                         |NGX_HTTP_SUBREQUEST_CLONE);

    r->pool = host_pool;

    if (prev != NULL) {
        ngx_http_singleflight_clone_begin_set(r, &now);
    }

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "singleflight fetch of \"%V\" not started",
                      &begin->uri);
        return NULL;
    }

    sr->uri = begin->uri;
    sr->request_body = body;

    if (prev == NULL) {
        sr->exten = r->exten;

    } else {
        /* the host may have moved on since (its own error_page) */
        ngx_http_set_exten(sr);
    }

    return sr;
}


/* what ngx_http_subrequest() clones of "r", and its URI and arguments */

void
ngx_http_singleflight_clone_begin_get(ngx_http_request_t *r,
    ngx_http_singleflight_begin_t *b)
{
    b->uri = r->uri;
    b->args = r->args;
    b->loc_conf = r->loc_conf;
    b->content_handler = r->content_handler;
    b->phase_handler = r->phase_handler;
#if (NGX_PCRE)
    b->captures = r->captures;
    b->captures_data = r->captures_data;
    b->ncaptures = r->ncaptures;
#endif
    b->valid_location = r->valid_location;
    b->valid_unparsed_uri = r->valid_unparsed_uri;
}


static void
ngx_http_singleflight_clone_begin_set(ngx_http_request_t *r,
    ngx_http_singleflight_begin_t *b)
{
    r->uri = b->uri;
    r->args = b->args;
    r->loc_conf = b->loc_conf;
    r->content_handler = b->content_handler;
    r->phase_handler = b->phase_handler;
#if (NGX_PCRE)
    r->captures = b->captures;
    r->captures_data = b->captures_data;
    r->ncaptures = b->ncaptures;
#endif
    r->valid_location = b->valid_location;
    r->valid_unparsed_uri = b->valid_unparsed_uri;
}


/*
 * Where a response was made (by a fetch's subrequest, or by a request
 * on its own way, _tee.c): the location it ended in, and what a
 * redirect on the way changed of the URI and arguments it began with
 * (their data then are the request's).
 */

void
ngx_http_singleflight_clone_where(ngx_http_request_t *sr, ngx_str_t *uri,
    ngx_str_t *args, ngx_http_singleflight_where_t *where)
{
    where->loc_conf = sr->loc_conf;
    where->made = sr;
    where->uri = sr->uri.data;
    where->args = sr->args.data;
    where->moved.flags = 0;
    where->moved.uri_len = 0;
    where->moved.args_len = 0;

    /* a subrequest starts with NGX_HTTP_MAX_URI_CHANGES + 1 of them */
    where->moved.redirects = NGX_HTTP_MAX_URI_CHANGES + 1 - sr->uri_changes;

    if (sr->uri.data != uri->data || sr->uri.len != uri->len) {
        where->moved.flags |= NGX_HTTP_SINGLEFLIGHT_MOVED_URI;
        where->moved.uri_len = sr->uri.len;
    }

    if (sr->args.data != args->data || sr->args.len != args->len) {
        where->moved.flags |= NGX_HTTP_SINGLEFLIGHT_MOVED_ARGS;
        where->moved.args_len = sr->args.len;
    }
}


/*
 * The fetch's request headers: the leader's, less the conditional and
 * Range ones (but the Range with "range"), plus CDN-Loop (RFC 8586) with
 * this nginx's name.
 */

ngx_int_t
ngx_http_singleflight_clone_headers(ngx_http_request_t *r,
    ngx_http_singleflight_request_headers_t *rh, ngx_uint_t range)
{
    ngx_uint_t                     n;
    ngx_list_t                    *headers;
    ngx_list_part_t               *part;
    ngx_table_elt_t               *h, *nh;
    ngx_http_singleflight_walk_t   walk;

    headers = &rh->headers;
    *headers = r->headers_in.headers;
    rh->stripped = 0;

    if (r->headers_in.if_modified_since == NULL
        && r->headers_in.if_unmodified_since == NULL
        && r->headers_in.if_none_match == NULL
        && r->headers_in.if_match == NULL
        && r->headers_in.if_range == NULL
        && (r->headers_in.range == NULL || range)
        && r->headers_in.headers.part.next == NULL
        && r->headers_in.headers.part.nelts)
    {
        /* nothing to strip: the leader's elements, and CDN-Loop after */
        return ngx_http_singleflight_clone_headers_shared(r, headers);
    }

    rh->stripped = 1;

    n = 1;

    for (part = &r->headers_in.headers.part; part; part = part->next) {
        n += part->nelts;
    }

    if (ngx_list_init(headers, r->pool, n, sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(&r->headers_in.headers,
                                                &walk))
           != NULL)
    {
        if (ngx_http_singleflight_conditional(&h->key)
            && !(range && h == r->headers_in.range))
        {
            continue;
        }

        nh = ngx_list_push(headers);
        if (nh == NULL) {
            return NGX_ERROR;
        }

        *nh = *h;
    }

    return ngx_http_singleflight_loop_header(r, headers);
}


/*
 * The fetch's header list reads the leader's single part of elements,
 * without a copy, and goes on into a part of its own with CDN-Loop: a
 * push on either list never writes into the other's part.
 */

static ngx_int_t
ngx_http_singleflight_clone_headers_shared(ngx_http_request_t *r,
    ngx_list_t *headers)
{
    ngx_str_t        *token;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *nh;

    token = ngx_http_singleflight_loop_token(r);

    if (token->len == 0) {
        /* no name to add: a part of its own, empty, for what is pushed */
        headers->nalloc = headers->part.nelts;
        headers->last = &headers->part;
        return NGX_OK;
    }

    part = ngx_palloc(r->pool, sizeof(ngx_list_part_t)
                               + sizeof(ngx_table_elt_t));
    if (part == NULL) {
        return NGX_ERROR;
    }

    nh = (ngx_table_elt_t *) (part + 1);

    ngx_http_singleflight_loop_element(nh, token);

    part->elts = nh;
    part->nelts = 1;
    part->next = NULL;

    headers->part.next = part;
    headers->last = part;
    headers->nalloc = 1;

    return NGX_OK;
}


/*
 * The subrequest starts with a copy of its leader's headers_in: it takes
 * the fetch's list, and no conditional or Range header but a resume's.
 */

void
ngx_http_singleflight_clone_headers_set(ngx_http_request_t *sr,
    ngx_http_singleflight_request_headers_t *rh)
{
    ngx_http_headers_in_t  *hi;

    hi = &sr->headers_in;

    hi->headers = rh->headers;
    hi->if_modified_since = NULL;
    hi->if_unmodified_since = NULL;
    hi->if_none_match = NULL;
    hi->if_match = NULL;
    hi->if_range = rh->if_range;
    hi->range = rh->range;
}


/*
 * A subrequest shares its parent's variable values.  Those of the headers
 * it does not send may have been taken already (a map used in the key, a
 * log variable): then it gets a copy in which they are taken again.
 */

void
ngx_http_singleflight_clone_variables(ngx_http_request_t *r,
    ngx_http_request_t *sr)
{
    ngx_int_t                   index;
    ngx_uint_t                  i, stale;
    ngx_http_variable_value_t  *vv;
    ngx_http_core_main_conf_t  *cmcf;

    stale = 0;

    for (i = 0; i < 6; i++) {
        index = ngx_http_singleflight_condition_vars[i];

        if (index == NGX_ERROR) {
            continue;
        }

        if (r->variables[index].valid || r->variables[index].not_found) {
            stale = 1;
            break;
        }
    }

    if (!stale) {
        return;
    }

    cmcf = ngx_http_get_module_main_conf(r, ngx_http_core_module);

    vv = ngx_pnalloc(r->pool, cmcf->variables.nelts
                              * sizeof(ngx_http_variable_value_t));
    if (vv == NULL) {
        /* shared then: the values taken stay what they were */
        return;
    }

    ngx_memcpy(vv, r->variables,
               cmcf->variables.nelts * sizeof(ngx_http_variable_value_t));

    for (i = 0; i < 6; i++) {
        index = ngx_http_singleflight_condition_vars[i];

        if (index != NGX_ERROR) {
            vv[index].valid = 0;
            vv[index].not_found = 0;
        }
    }

    sr->variables = vv;
}


/*
 * The leader's headers are made while its fetch runs: its $upstream_...
 * variables there (add_header $upstream_cookie_..., $upstream_http_...)
 * must tell of the upstream response as they would without the module.
 * The leader gets a copy of the fetch's upstream with no cleanup, so that
 * nothing it does can finalize the running fetch; the fetch's own is
 * given at its end (ngx_http_singleflight_clone_upstream_vars()).
 */

void
ngx_http_singleflight_clone_header_vars(ngx_http_request_t *host,
    ngx_http_request_t *r, ngx_http_singleflight_vars_t *vars)
{
    ngx_http_upstream_t  *u;

    if (r->upstream == NULL) {
        return;
    }

    u = ngx_palloc(host->pool, sizeof(ngx_http_upstream_t));
    if (u == NULL) {
        return;
    }

    *u = *r->upstream;
    u->cleanup = NULL;

    host->upstream = u;
    vars->lent = u;

    ngx_http_singleflight_clone_lend_ctx(host, r);
}


/*
 * A host that went upstream in a location before this one (its own
 * request, or a fetch, before an error_page or another redirect): the
 * fetch's upstreams follow those, after the " : " nginx writes between
 * the upstreams of a redirected request, so its states begin with a copy
 * of the host's (ngx_http_upstream_init_request() adds the separator).
 * Not "again", a fetch made again in the same location: those follow
 * the tries before as proxy_next_upstream's do (clone_upstream_vars()).
 */

void
ngx_http_singleflight_clone_states_seed(ngx_http_request_t *host,
    ngx_http_request_t *sr, ngx_http_singleflight_vars_t *vars,
    ngx_uint_t again)
{
    ngx_array_t  *states, *seed;

    vars->had = host->upstream;
    vars->before = host->upstream_states;
    vars->pass = host->uri_changes;
    states = host->upstream_states;

    if (again || states == NULL || states->nelts == 0) {
        return;
    }

    seed = ngx_array_create(sr->pool, states->nelts + 2,
                            sizeof(ngx_http_upstream_state_t));
    if (seed == NULL) {
        return;
    }

    seed->nelts = states->nelts;
    ngx_memcpy(seed->elts, states->elts,
               states->nelts * sizeof(ngx_http_upstream_state_t));

    sr->upstream_states = seed;
    vars->seeded = states->nelts + 1;
}


/*
 * $upstream_response_time and the others while the leader's header is
 * made: as nginx's, the upstreams so far, the last one's response not
 * over ("-").  A copy, given its final values when the fetch ends.  Not
 * for a response that goes straight to its leader: the leader's are the
 * fetch's own then (fetch_direct()).
 */

void
ngx_http_singleflight_clone_states_seen(ngx_http_request_t *host,
    ngx_http_request_t *r, ngx_http_singleflight_vars_t *vars)
{
    ngx_array_t  *states, *seen;

    states = r->upstream_states;

    if (states == NULL || states->nelts == 0
        || (host->upstream_states != NULL
            && (!vars->seeded || vars->seen != NULL)))
    {
        /* a seeded fetch's states hold the host's before it */
        return;
    }

    seen = ngx_array_create(host->pool, states->nelts,
                            sizeof(ngx_http_upstream_state_t));
    if (seen == NULL) {
        return;
    }

    seen->nelts = states->nelts;
    ngx_memcpy(seen->elts, states->elts,
               states->nelts * sizeof(ngx_http_upstream_state_t));

    host->upstream_states = seen;
    vars->seen = seen;
}


/*
 * The leader's $upstream_... variables tell of its fetch.  Its upstream
 * is given only once the fetch is over (no cleanup left in it), so that
 * nothing the leader does later can touch a running fetch; after a fetch
 * made again, the last one's, whose response the leader got, as
 * $upstream_http_... tell of the last upstream with proxy_next_upstream.
 */

void
ngx_http_singleflight_clone_upstream_vars(ngx_http_request_t *host,
    ngx_http_request_t *sr, ngx_http_singleflight_vars_t *vars,
    ngx_uint_t header_sent)
{
    ngx_array_t                *states;
    ngx_http_upstream_state_t  *state;

    states = sr->upstream_states;

    if (host->upstream != NULL && host->upstream != vars->lent
        && host->upstream != vars->had)
    {
        /*
         * the leader went on to an upstream of its own meanwhile (an
         * error_page of one of its filters, image_filter's 415): that one
         * is its upstream, its states after the fetch's, as nginx keeps
         * them after a redirect; the fetch's only get their final values
         */
        ngx_http_singleflight_clone_states_final(host, states, vars);
        return;
    }

    if (host->upstream_states == NULL
        || (vars->seeded && states != NULL
            && host->upstream_states != vars->seen))
    {
        /* a seeded fetch's states hold the host's before it */
        host->upstream_states = states;

    } else if (host->upstream_states == vars->seen && states != NULL
               && states->nelts >= vars->seen->nelts)
    {
        /*
         * what the header saw, now over: the final values, for the log,
         * once the leader's header is out (fetch_header_out())
         */

        if (header_sent) {
            host->upstream_states = states;

        } else {
            vars->final = states;
        }

    } else if (states != NULL && states != host->upstream_states
               && states->nelts)
    {
        /*
         * the fetch made again (singleflight_promote): its upstreams follow
         * those of the tries before, as proxy_next_upstream's do
         */

        state = ngx_array_push_n(host->upstream_states, states->nelts);

        if (state != NULL) {
            ngx_memcpy(state, states->elts,
                       states->nelts * sizeof(ngx_http_upstream_state_t));
        }
    }

    if (sr->upstream != NULL && sr->upstream->cleanup == NULL) {
        host->upstream = sr->upstream;
    }
}


/* the fetch's states as the leader's header saw them, now final, in place */

static void
ngx_http_singleflight_clone_states_final(ngx_http_request_t *host,
    ngx_array_t *states, ngx_http_singleflight_vars_t *vars)
{
    ngx_uint_t    n;
    ngx_array_t  *seen;

    seen = vars->seen;

    if (seen == NULL || states == NULL
        || host->upstream_states != seen)
    {
        return;
    }

    n = ngx_min(seen->nelts, states->nelts);

    ngx_memcpy(seen->elts, states->elts,
               n * sizeof(ngx_http_upstream_state_t));
}
