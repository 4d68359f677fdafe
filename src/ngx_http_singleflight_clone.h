/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The clone: a fetch's subrequest, made of the request that hosts it, and
 * what its upstream leaves in the host's variables.  Its request headers
 * are _resume.h's, included before this header.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_CLONE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_CLONE_H_INCLUDED_


#include "ngx_http_singleflight.h"


/*
 * What a cloned subrequest takes from its parent: the host's request as
 * the flight's first fetch began from it.
 */
typedef struct {
    ngx_str_t                        uri;
    ngx_str_t                        args;
    void                           **loc_conf;
    ngx_http_handler_pt              content_handler;
    ngx_int_t                        phase_handler;
#if (NGX_PCRE)
    int                             *captures;
    u_char                          *captures_data;
    ngx_uint_t                       ncaptures;
#endif
    unsigned                         valid_location:1;
    unsigned                         valid_unparsed_uri:1;
} ngx_http_singleflight_begin_t;


/* what the host's $upstream_... read of its fetch's upstream */
typedef struct {
    ngx_http_upstream_t             *lent;        /* the host's copy of the
                                                     fetch's upstream */
    ngx_array_t                     *seen;        /* states at the header */
    ngx_array_t                     *final;       /* and at the end */
    ngx_http_upstream_t             *had;         /* the host's upstream at
                                                     the launch */
    ngx_array_t                     *before;      /* its states */
    ngx_uint_t                       pass;        /* its uri_changes */
    ngx_uint_t                       seeded;      /* its states begin with
                                                     the host's before, and
                                                     nginx's empty one: how
                                                     many (0: none) */
} ngx_http_singleflight_vars_t;


void ngx_http_singleflight_clone_init(ngx_conf_t *cf);
void ngx_http_singleflight_clone_init_module(ngx_cycle_t *cycle);
ngx_http_request_t *ngx_http_singleflight_clone_subrequest(
    ngx_http_request_t *r, ngx_pool_t *pool, ngx_http_post_subrequest_t *ps,
    ngx_http_singleflight_begin_t *begin,
    ngx_http_singleflight_begin_t *prev);
void ngx_http_singleflight_clone_begin_get(ngx_http_request_t *r,
    ngx_http_singleflight_begin_t *b);
void ngx_http_singleflight_clone_where(ngx_http_request_t *sr, ngx_str_t *uri,
    ngx_str_t *args, ngx_http_singleflight_where_t *where);
ngx_int_t ngx_http_singleflight_clone_headers(ngx_http_request_t *r,
    ngx_http_singleflight_request_headers_t *rh, ngx_uint_t range);
void ngx_http_singleflight_clone_headers_set(ngx_http_request_t *sr,
    ngx_http_singleflight_request_headers_t *rh);
void ngx_http_singleflight_clone_variables(ngx_http_request_t *r,
    ngx_http_request_t *sr);
void ngx_http_singleflight_clone_states_seed(ngx_http_request_t *host,
    ngx_http_request_t *sr, ngx_http_singleflight_vars_t *vars,
    ngx_uint_t again);
void ngx_http_singleflight_clone_header_vars(ngx_http_request_t *host,
    ngx_http_request_t *r, ngx_http_singleflight_vars_t *vars);
void ngx_http_singleflight_clone_states_seen(ngx_http_request_t *host,
    ngx_http_request_t *r, ngx_http_singleflight_vars_t *vars);
void ngx_http_singleflight_clone_upstream_vars(ngx_http_request_t *host,
    ngx_http_request_t *sr, ngx_http_singleflight_vars_t *vars,
    ngx_uint_t header_sent);


#endif /* _NGX_HTTP_SINGLEFLIGHT_CLONE_H_INCLUDED_ */
