/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * singleflight_resume: when a fetch's response breaks off after N body
 * bytes (the upstream closed or reset the connection, timed out, sent
 * fewer bytes than its Content-Length), and the response has a strong
 * validator and a known length, the flight asks the origin for the rest:
 * "Range: bytes=N-" with "If-Range: <validator>" (RFC 9110 14.2, 13.1.5).
 * Only a 206 for exactly those bytes of the same representation (the
 * same validator, length and Content-Encoding, and a Content-Length of
 * those bytes) is appended; anything else ends the flight as the break
 * would have, so no reader ever gets a body spliced from two
 * representations, nor one longer or shorter than it was told.
 *
 * A 200 with a validator but no strong one, or without a length
 * (chunked), is asked for again whole, with the first request's headers
 * (one without any validator is taken for a page made anew each time,
 * whose bytes would not be the same: not resumed); the answer is used only
 * if its status, length, Content-Encoding, ETag and Last-Modified are the
 * first one's and its first N bytes are byte for byte those the readers
 * had (_fetch.c compares them with the store): the body is then the new
 * response's, all of it.
 *
 * This file knows HTTP; _fetch.c starts the resuming fetch and feeds its
 * body on, to the store or to its leader.
 */


#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_store.h"


static ngx_int_t ngx_http_singleflight_resume_range(ngx_http_request_t *r,
    off_t *from, off_t *last, off_t *total);
static ngx_int_t ngx_http_singleflight_resume_push(ngx_list_t *headers,
    char *name, char *lowcase, ngx_str_t *value, ngx_table_elt_t **ph);
static ngx_uint_t ngx_http_singleflight_resume_equal(ngx_str_t *a,
    ngx_table_elt_t *h);
static ngx_int_t ngx_http_singleflight_resume_strong(
    ngx_http_singleflight_resume_t *rs, ngx_http_request_t *r);
static void ngx_http_singleflight_resume_value(ngx_str_t *v,
    ngx_table_elt_t *h);
static ngx_int_t ngx_http_singleflight_resume_copy(u_char *block,
    char *lowcase, ngx_str_t *to, ngx_pool_t *pool);


/*
 * A Last-Modified is strong, for If-Range, only this many seconds or more
 * before the response's Date (RFC 9110 8.8.2.2 and 13.1.5)
 */
#define NGX_HTTP_SINGLEFLIGHT_STRONG_AGE  60


/*
 * The first response's header: is it resumable, and by what?  A 200 with
 * a length and a strong validator by a Range: an ETag not marked weak,
 * or a Last-Modified at least 60 seconds before the origin's Date; a 200
 * with a weaker validator, or without a length, by asking for all of it
 * again ("whole").  A response with no validator at all is made anew
 * for each request, as far as anyone can tell: not resumed.  The values
 * are the fetch's own, in the host request's pool, which every fetch of
 * the flight shares: they are kept as they are, not copied.
 */

void
ngx_http_singleflight_resume_note(ngx_http_singleflight_resume_t *rs,
    ngx_http_request_t *r)
{
    ngx_str_null(&rs->validator);
    rs->whole = 0;

    if (r->headers_out.status != NGX_HTTP_OK || r->header_only
        || (r->headers_out.etag == NULL
            && r->headers_out.last_modified == NULL))
    {
        /* no validator: made anew for each request, as far as we know */
        return;
    }

    rs->total = r->headers_out.content_length_n;

    ngx_http_singleflight_resume_value(&rs->encoding,
                                       r->headers_out.content_encoding);

    if (rs->total > 0 && ngx_http_singleflight_resume_strong(rs, r) == NGX_OK)
    {
        return;
    }

    /* a validator, weak as it may be, names the representation */

    ngx_http_singleflight_resume_value(&rs->tag, r->headers_out.etag);
    ngx_http_singleflight_resume_value(&rs->modified,
                                       r->headers_out.last_modified);

    rs->whole = (rs->total != 0 && (rs->tag.len || rs->modified.len));
}


/*
 * Its strong validator, if it has one.  A Last-Modified has a second's
 * precision: a representation changed twice within the second it names
 * keeps it, and an origin that compares If-Range's date exactly answers a
 * Range from the newer one, whose bytes would follow the older one's.
 * Only a date far enough before the origin's Date tells that it has not
 * changed since: 60 seconds, the RFC's margin for a Date and a
 * Last-Modified taken from clocks or at moments that differ.  A newer one
 * is weak: such a response is asked for again whole, and its first bytes
 * compared with the readers' (the body is then the new response's, all
 * of it, whichever file it is).
 */

static ngx_int_t
ngx_http_singleflight_resume_strong(ngx_http_singleflight_resume_t *rs,
    ngx_http_request_t *r)
{
    time_t            date, lm;
    ngx_table_elt_t  *h;

    h = r->headers_out.etag;

    if (h != NULL && h->value.len >= 2 && h->value.data[0] == '"') {
        rs->validator = h->value;
        rs->etag = 1;
        return NGX_OK;
    }

    h = r->headers_out.last_modified;

    if (h == NULL || r->upstream == NULL
        || r->upstream->headers_in.date == NULL)
    {
        return NGX_DECLINED;
    }

    lm = ngx_parse_http_time(h->value.data, h->value.len);
    date = ngx_parse_http_time(r->upstream->headers_in.date->value.data,
                               r->upstream->headers_in.date->value.len);

    if (lm == NGX_ERROR || date == NGX_ERROR
        || date - lm < NGX_HTTP_SINGLEFLIGHT_STRONG_AGE)
    {
        /* weak: it may have changed since, within the second it names */
        return NGX_DECLINED;
    }

    rs->validator = h->value;
    rs->etag = 0;

    return NGX_OK;
}


static void
ngx_http_singleflight_resume_value(ngx_str_t *v, ngx_table_elt_t *h)
{
    if (h != NULL && h->value.len) {
        *v = h->value;

    } else {
        ngx_str_null(v);
    }
}


/*
 * The same, read back from a stored header block that the first fetch
 * marked resumable (it judged the validator strong, as above) or to be
 * asked for again whole: for a fetch in another worker, whose first
 * fetch died with its own worker.  The values are copied into "pool".
 * NGX_DECLINED: neither.
 */

ngx_int_t
ngx_http_singleflight_resume_stored(ngx_http_singleflight_resume_t *rs,
    u_char *block, ngx_pool_t *pool)
{
    ngx_http_singleflight_header_t  hdr;

    ngx_memzero(rs, sizeof(ngx_http_singleflight_resume_t));

    ngx_http_singleflight_store_parse(block, &hdr);

    if (hdr.flags & NGX_HTTP_SINGLEFLIGHT_H_WHOLE) {
        rs->whole = 1;

    } else if (!(hdr.flags & NGX_HTTP_SINGLEFLIGHT_H_RESUMABLE)
               || hdr.content_length_n <= 0)
    {
        return NGX_DECLINED;
    }

    rs->total = hdr.content_length_n;

    if (ngx_http_singleflight_resume_copy(block, "content-encoding",
                                          &rs->encoding, pool) != NGX_OK
        || ngx_http_singleflight_resume_copy(block, "etag", &rs->tag, pool)
           != NGX_OK
        || ngx_http_singleflight_resume_copy(block, "last-modified",
                                             &rs->modified, pool) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (rs->whole) {
        return NGX_OK;
    }

    if (rs->tag.len >= 2 && rs->tag.data[0] == '"') {
        rs->validator = rs->tag;
        rs->etag = 1;

    } else if (rs->modified.len) {
        rs->validator = rs->modified;

    } else {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* a stored header's value, copied; empty where it has none */

static ngx_int_t
ngx_http_singleflight_resume_copy(u_char *block, char *lowcase,
    ngx_str_t *to, ngx_pool_t *pool)
{
    ngx_str_t  v;

    ngx_str_null(to);

    if (ngx_http_singleflight_store_find(block, lowcase, &v) != NGX_OK
        || v.len == 0)
    {
        return NGX_OK;
    }

    to->data = ngx_pstrdup(pool, &v);
    if (to->data == NULL) {
        return NGX_ERROR;
    }

    to->len = v.len;

    return NGX_OK;
}


/* a resuming fetch's request asks for the rest of that representation */

ngx_int_t
ngx_http_singleflight_resume_headers(ngx_http_singleflight_resume_t *rs,
    ngx_http_singleflight_request_headers_t *rh, ngx_pool_t *pool)
{
    u_char     *p;
    ngx_str_t   range;

    p = ngx_pnalloc(pool, sizeof("bytes=-") - 1 + NGX_OFF_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    range.data = p;
    range.len = ngx_sprintf(p, "bytes=%O-", rs->from) - p;

    if (ngx_http_singleflight_resume_push(&rh->headers, "Range", "range",
                                          &range, &rh->range)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_singleflight_resume_push(&rh->headers, "If-Range",
                                             "if-range", &rs->validator,
                                             &rh->if_range);
}


/*
 * A resuming fetch's response: NGX_OK for a 206 of exactly the bytes
 * asked for, of the same representation; NGX_DECLINED for anything else.
 * Its Content-Length must be those bytes' number: a 206 without one
 * (chunked) could end anywhere, and what is appended must end exactly
 * at the first response's length, which every reader was told.
 */

ngx_int_t
ngx_http_singleflight_resume_check(ngx_http_singleflight_resume_t *rs,
    ngx_http_request_t *r)
{
    off_t             from, last, total;
    ngx_table_elt_t  *h;

    if (r->headers_out.status != NGX_HTTP_PARTIAL_CONTENT) {
        return NGX_DECLINED;
    }

    if (ngx_http_singleflight_resume_range(r, &from, &last, &total)
        != NGX_OK
        || from != rs->from || total != rs->total || last != total - 1)
    {
        return NGX_DECLINED;
    }

    if (r->headers_out.content_length_n != total - from) {
        return NGX_DECLINED;
    }

    h = rs->etag ? r->headers_out.etag : r->headers_out.last_modified;

    if (h == NULL || !ngx_http_singleflight_resume_equal(&rs->validator, h)) {
        return NGX_DECLINED;
    }

    return ngx_http_singleflight_resume_equal(&rs->encoding,
                                          r->headers_out.content_encoding)
           ? NGX_OK : NGX_DECLINED;
}


/*
 * A whole response asked for again: NGX_OK for a 200 with the first
 * one's length (or none, as it had none), Content-Encoding, ETag and
 * Last-Modified, as they were; its first bytes are compared as they come.
 */

ngx_int_t
ngx_http_singleflight_resume_check_whole(ngx_http_singleflight_resume_t *rs,
    ngx_http_request_t *r)
{
    ngx_http_headers_out_t  *ho;

    ho = &r->headers_out;

    if (ho->status != NGX_HTTP_OK || r->header_only
        || ho->content_length_n != rs->total)
    {
        return NGX_DECLINED;
    }

    if (!ngx_http_singleflight_resume_equal(&rs->encoding,
                                            ho->content_encoding)
        || !ngx_http_singleflight_resume_equal(&rs->tag, ho->etag)
        || !ngx_http_singleflight_resume_equal(&rs->modified,
                                               ho->last_modified))
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* Content-Range: bytes FROM-LAST/TOTAL */

static ngx_int_t
ngx_http_singleflight_resume_range(ngx_http_request_t *r, off_t *from,
    off_t *last, off_t *total)
{
    u_char           *p, *end, *dash, *slash;
    ngx_table_elt_t  *h;

    h = r->headers_out.content_range;

    if (h == NULL || h->value.len < sizeof("bytes 0-0/1") - 1
        || ngx_strncasecmp(h->value.data, (u_char *) "bytes ", 6) != 0)
    {
        return NGX_ERROR;
    }

    p = h->value.data + 6;
    end = h->value.data + h->value.len;

    dash = ngx_strlchr(p, end, '-');
    slash = dash ? ngx_strlchr(dash, end, '/') : NULL;

    if (slash == NULL) {
        return NGX_ERROR;
    }

    *from = ngx_atoof(p, dash - p);
    *last = ngx_atoof(dash + 1, slash - dash - 1);
    *total = ngx_atoof(slash + 1, end - slash - 1);

    if (*from == NGX_ERROR || *last == NGX_ERROR || *total == NGX_ERROR) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_resume_push(ngx_list_t *headers, char *name,
    char *lowcase, ngx_str_t *value, ngx_table_elt_t **ph)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif
    h->key.data = (u_char *) name;
    h->key.len = ngx_strlen(name);
    h->lowcase_key = (u_char *) lowcase;
    h->value = *value;

    *ph = h;

    return NGX_OK;
}


/* the same value, or none where there was none */

static ngx_uint_t
ngx_http_singleflight_resume_equal(ngx_str_t *a, ngx_table_elt_t *h)
{
    if (a->len == 0) {
        return h == NULL || h->value.len == 0;
    }

    return h != NULL && h->value.len == a->len
           && ngx_strncmp(h->value.data, a->data, a->len) == 0;
}


/* singleflight_resume on | off [tries=N]; */

char *
ngx_http_singleflight_resume_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;

    if (sfcf->resume != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "on") == 0) {
        sfcf->resume = 1;

    } else if (ngx_strcmp(value[1].data, "off") == 0) {
        sfcf->resume = 0;

    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be \"on\" or \"off\"",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (cf->args->nelts == 2) {
        return NGX_CONF_OK;
    }

    if (sfcf->resume == 0
        || ngx_strncmp(value[2].data, "tries=", 6) != 0
        || (n = ngx_atoi(value[2].data + 6, value[2].len - 6)) == NGX_ERROR
        || n < 1 || n > 100)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "it must be \"tries=\" and a number from 1 to 100 "
                           "after \"on\"", &value[2], &cmd->name);
        return NGX_CONF_ERROR;
    }

    sfcf->resume_tries = n;

    return NGX_CONF_OK;
}
