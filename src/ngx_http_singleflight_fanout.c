
/*
 * Fan-out: a follower answers with the flight's stored response.
 *
 * The stored header block is read back into the follower's own
 * headers_out, and the body goes out as buffers that point straight into
 * the zone's chunks: a thousand followers of a 1 MiB response share one
 * copy.  The follower holds a reference on the flight until its request
 * is freed, so the chunks outlive every write.  Everything then passes the
 * follower's own filters: its add_header, gzip, chunked or HTTP/2 framing.
 */


#include "ngx_http_singleflight_fanout.h"


typedef struct {
    ngx_str_t   name;
    ngx_uint_t  offset;
} ngx_http_singleflight_known_header_t;


/* headers whose headers_out pointer other filters look at */
static ngx_http_singleflight_known_header_t  ngx_http_singleflight_known[] = {
    { ngx_string("Server"),
      offsetof(ngx_http_headers_out_t, server) },
    { ngx_string("Content-Encoding"),
      offsetof(ngx_http_headers_out_t, content_encoding) },
    { ngx_string("Location"),
      offsetof(ngx_http_headers_out_t, location) },
    { ngx_string("Refresh"),
      offsetof(ngx_http_headers_out_t, refresh) },
    { ngx_string("Last-Modified"),
      offsetof(ngx_http_headers_out_t, last_modified) },
    { ngx_string("Content-Range"),
      offsetof(ngx_http_headers_out_t, content_range) },
    { ngx_string("Accept-Ranges"),
      offsetof(ngx_http_headers_out_t, accept_ranges) },
    { ngx_string("WWW-Authenticate"),
      offsetof(ngx_http_headers_out_t, www_authenticate) },
    { ngx_string("Expires"),
      offsetof(ngx_http_headers_out_t, expires) },
    { ngx_string("ETag"),
      offsetof(ngx_http_headers_out_t, etag) },
    { ngx_null_string, 0 }
};


static ngx_int_t ngx_http_singleflight_restore_header(ngx_http_request_t *r,
    ngx_http_singleflight_node_t *fn);
static ngx_int_t ngx_http_singleflight_link_header(ngx_http_request_t *r,
    ngx_table_elt_t *h, ngx_uint_t linked);
static ngx_chain_t *ngx_http_singleflight_body(ngx_http_request_t *r,
    ngx_http_singleflight_node_t *fn);


ngx_int_t
ngx_http_singleflight_send(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_int_t                      rc;
    ngx_chain_t                   *out;
    ngx_http_singleflight_node_t  *fn;

    fn = ctx->fn;

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_singleflight_restore_header(r, fn) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }


    (void) ngx_atomic_fetch_add(&ctx->zone->counters->served, 1);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "singleflight follower served from flight %uL, "
                   "%O body bytes", fn->id, fn->body_len);

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out = ngx_http_singleflight_body(r, fn);
    if (out == NULL) {
        return NGX_ERROR;
    }

    (void) ngx_atomic_fetch_add(&ctx->zone->counters->bytes_shared,
                                (ngx_atomic_int_t) fn->body_len);

    return ngx_http_output_filter(r, out);
}


static ngx_int_t
ngx_http_singleflight_restore_header(ngx_http_request_t *r,
    ngx_http_singleflight_node_t *fn)
{
    size_t                           key_len, value_len, linked;
    u_char                          *p;
    ngx_uint_t                       i;
    ngx_table_elt_t                 *h;
    ngx_http_headers_out_t          *ho;
    ngx_http_singleflight_header_t   hdr;

    ho = &r->headers_out;
    p = fn->header;

    ngx_memcpy(&hdr, p, sizeof(ngx_http_singleflight_header_t));
    p += sizeof(ngx_http_singleflight_header_t);

    ho->status = hdr.status;

    ho->status_line.len = hdr.status_line_len;
    ho->status_line.data = p;
    p += hdr.status_line_len;

    ho->content_type.len = hdr.content_type_len;
    ho->content_type.data = p;
    ho->content_type_len = hdr.content_type_base;
    ho->content_type_lowcase = NULL;
    p += hdr.content_type_len;

    ho->charset.len = hdr.charset_len;
    ho->charset.data = p;
    p += hdr.charset_len;

    ho->last_modified_time = hdr.last_modified_time;

    /*
     * ranges as the leader's content handler allowed them (a static file),
     * and for any follower that asks for one: the full response is in
     * memory, the range filter serves the part
     */

    if (hdr.allow_ranges || r->headers_in.range != NULL) {
        r->allow_ranges = 1;
    }

    /* a GET flight's length is what was stored, a HEAD flight's as told */

    ho->content_length_n = fn->header_only ? hdr.content_length_n
                                           : fn->body_len;

    for (i = 0; i < hdr.nheaders; i++) {

        p = fn->header + ngx_align((size_t) (p - fn->header),
                                   sizeof(size_t));

        ngx_memcpy(&key_len, p, sizeof(size_t));
        p += sizeof(size_t);
        ngx_memcpy(&value_len, p, sizeof(size_t));
        p += sizeof(size_t);
        ngx_memcpy(&linked, p, sizeof(size_t));
        p += sizeof(size_t);

        h = ngx_list_push(&ho->headers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        h->hash = 1;
#if (nginx_version >= 1023000)
        h->next = NULL;
#endif
        h->key.len = key_len;
        h->key.data = p;
        h->lowcase_key = p + key_len;
        h->value.len = value_len;
        h->value.data = p + 2 * key_len;

        p += 2 * key_len + value_len;

        if (ngx_http_singleflight_link_header(r, h, linked) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * Did the leader's headers_out point at this header?  Filters act on those
 * pointers: the header filter makes a linked Location absolute, so a
 * follower links exactly what the leader had (the proxy links a Location
 * only when proxy_redirect rewrote it).
 */

ngx_uint_t
ngx_http_singleflight_linked(ngx_http_request_t *r, ngx_table_elt_t *h)
{
    ngx_table_elt_t                       **ph;
    ngx_http_singleflight_known_header_t   *k;

    for (k = ngx_http_singleflight_known; k->name.len; k++) {
        ph = (ngx_table_elt_t **) ((char *) &r->headers_out + k->offset);

        if (*ph == h) {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_singleflight_link_header(ngx_http_request_t *r, ngx_table_elt_t *h,
    ngx_uint_t linked)
{
    ngx_table_elt_t                       **ph;
    ngx_http_singleflight_known_header_t   *k;

    if (h->key.len == sizeof("Cache-Control") - 1
        && ngx_strncmp(h->lowcase_key, "cache-control", h->key.len) == 0)
    {
#if (nginx_version >= 1023000)
        /* since 1.23.0 repeated headers are chained by "next" */

        for (ph = &r->headers_out.cache_control; *ph; ph = &(*ph)->next) {
            /* void */
        }

        *ph = h;

        return NGX_OK;
#else
        if (r->headers_out.cache_control.elts == NULL
            && ngx_array_init(&r->headers_out.cache_control, r->pool, 1,
                              sizeof(ngx_table_elt_t *))
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        ph = ngx_array_push(&r->headers_out.cache_control);
        if (ph == NULL) {
            return NGX_ERROR;
        }

        *ph = h;

        return NGX_OK;
#endif
    }

    if (!linked) {
        return NGX_OK;
    }

    for (k = ngx_http_singleflight_known; k->name.len; k++) {
        if (h->key.len == k->name.len
            && ngx_strncasecmp(h->key.data, k->name.data, k->name.len) == 0)
        {
            ph = (ngx_table_elt_t **) ((char *) &r->headers_out + k->offset);
            *ph = h;
            break;
        }
    }

    return NGX_OK;
}


static ngx_chain_t *
ngx_http_singleflight_body(ngx_http_request_t *r,
    ngx_http_singleflight_node_t *fn)
{
    ngx_buf_t                      *b;
    ngx_chain_t                    *out, **ll, *cl;
    ngx_http_singleflight_chunk_t  *chunk;

    out = NULL;
    ll = &out;
    b = NULL;

    for (chunk = fn->first; chunk; chunk = chunk->next) {

        if (chunk->len == 0) {
            continue;
        }

        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NULL;
        }

        /* read-only memory in the zone: filters that change it copy it */

        b->memory = 1;
        b->pos = chunk->data;
        b->last = chunk->data + chunk->len;

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NULL;
        }

        cl->buf = b;
        *ll = cl;
        ll = &cl->next;
    }

    if (b == NULL) {
        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NULL;
        }

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NULL;
        }

        cl->buf = b;
        *ll = cl;
        ll = &cl->next;
    }

    *ll = NULL;

    b->last_buf = 1;
    b->last_in_chain = 1;

    return out;
}
