/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Resuming a fetch whose response broke off mid-body, by a Range request
 * for the rest, or by asking for all of it again where it has no
 * validator or length (singleflight_resume).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_RESUME_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_RESUME_H_INCLUDED_


#include "ngx_http_singleflight.h"


/*
 * What a fetch knows of its representation, from the first response's
 * header: its strong validator (an ETag, or a Last-Modified at least 60
 * seconds before its Date, RFC 9110 8.8.2.2), its whole length, its
 * Content-Encoding, and its ETag and Last-Modified as they were.  "from"
 * is the first byte a resuming fetch asks for; 0 for a first fetch.  A
 * 200 with a weak validator, or without a length, is "whole": its rest is
 * had by asking for all of it again, and the first "from" bytes of that
 * answer ("skip" of them still to come) must be those the first response
 * sent.
 */
typedef struct {
    ngx_str_t                        validator;   /* empty: no Range */
    ngx_str_t                        encoding;
    ngx_str_t                        tag;         /* the ETag, any */
    ngx_str_t                        modified;    /* the Last-Modified */
    off_t                            total;       /* -1: not known */
    off_t                            from;
    off_t                            skip;        /* left to compare */
    ngx_uint_t                       tries;       /* resumes left */
    unsigned                         etag:1;
    unsigned                         whole:1;     /* no Range: all again */
    unsigned                         waiting:1;   /* for its header */
    unsigned                         failed:1;    /* not the answer wanted */
} ngx_http_singleflight_resume_t;


/*
 * What a fetch's request headers differ in from its leader's, made before
 * its subrequest (which starts with a copy of the leader's headers_in):
 * the list of elements, and Range and If-Range, set only when resuming.
 * The other conditional headers are none.
 */
typedef struct {
    ngx_list_t                       headers;
    ngx_table_elt_t                 *range;
    ngx_table_elt_t                 *if_range;
    ngx_uint_t                       stripped;    /* some not sent, maybe */
} ngx_http_singleflight_request_headers_t;


void ngx_http_singleflight_resume_note(ngx_http_singleflight_resume_t *rs,
    ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_resume_stored(
    ngx_http_singleflight_resume_t *rs, u_char *block, ngx_pool_t *pool);
ngx_int_t ngx_http_singleflight_resume_headers(
    ngx_http_singleflight_resume_t *rs,
    ngx_http_singleflight_request_headers_t *rh, ngx_pool_t *pool);
ngx_int_t ngx_http_singleflight_resume_check(
    ngx_http_singleflight_resume_t *rs, ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_resume_check_whole(
    ngx_http_singleflight_resume_t *rs, ngx_http_request_t *r);
char *ngx_http_singleflight_resume_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_SINGLEFLIGHT_RESUME_H_INCLUDED_ */
