
/*
 * Leader capture.
 *
 * The filters sit at the top of the chain (the module is loaded after
 * nginx's own), so they see the response as the content handler made it:
 * before add_header, gzip, chunked or HTTP/2 framing, which each follower
 * then applies for itself.  The header goes into the zone as one block
 * (see ngx_http_singleflight_header_t); the body is appended to a list of
 * chunks, copied from memory buffers or read from the temporary file an
 * upstream spilled to.  The flight is done when the last buffer passes.
 */


#include "ngx_http_singleflight_filter.h"
#include "ngx_http_singleflight_handler.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_fanout.h"


#define NGX_HTTP_SINGLEFLIGHT_CHUNK  (64 * 1024)


static ngx_int_t ngx_http_singleflight_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_singleflight_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_uint_t ngx_http_singleflight_promote_status(ngx_uint_t status);
static ngx_uint_t ngx_http_singleflight_hop_by_hop(ngx_table_elt_t *h);
static ngx_uint_t ngx_http_singleflight_private(ngx_http_request_t *r,
    ngx_uint_t conditions);
static ngx_uint_t ngx_http_singleflight_has_token(ngx_str_t *value,
    char *token);
static ngx_int_t ngx_http_singleflight_store_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_array_t *vary);
static u_char *ngx_http_singleflight_put(u_char *p, ngx_str_t *s);
static ngx_int_t ngx_http_singleflight_append(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_buf_t *b);
static ssize_t ngx_http_singleflight_read(ngx_http_request_t *r,
    ngx_buf_t *b, u_char *buf, size_t size, off_t offset);
static ngx_http_singleflight_chunk_t *ngx_http_singleflight_new_chunk(
    ngx_http_request_t *r, ngx_http_singleflight_ctx_t *ctx, size_t need);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/* never stored: hop-by-hop, recomputed per response, or per connection */
static ngx_str_t  ngx_http_singleflight_skip_headers[] = {
    ngx_string("Content-Length"),
    ngx_string("Connection"),
    ngx_string("Keep-Alive"),
    ngx_string("Proxy-Connection"),
    ngx_string("Transfer-Encoding"),
    ngx_string("TE"),
    ngx_string("Trailer"),
    ngx_string("Upgrade"),
    ngx_string("Date"),
    ngx_null_string
};


ngx_int_t
ngx_http_singleflight_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_singleflight_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_singleflight_body_filter;

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_header_filter(ngx_http_request_t *r)
{
    ngx_int_t                     rc;
    ngx_uint_t                    status, header_only, reason;
    ngx_array_t                  *vary;
    ngx_http_singleflight_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx == NULL || !ctx->capturing) {
        return ngx_http_next_header_filter(r);
    }

    status = r->headers_out.status;

    if (r->err_status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {

        /*
         * an error nginx made itself (upstream unreachable, reset, timed
         * out, invalid): the flight has no response to share
         */

        reason = (r->err_status == NGX_HTTP_GATEWAY_TIME_OUT)
                 ? NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT
                 : NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR;

        if (ngx_http_singleflight_follow_own(r, ctx, reason, r->err_status)
            == NGX_OK)
        {
            /* the error page is not sent: the request waits instead */
            r->header_only = 1;
            return NGX_DONE;
        }

        ngx_http_singleflight_fail(ctx, reason, r->err_status,
                                   r->connection->log);

        return ngx_http_next_header_filter(r);
    }

    if (status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {

        /* the origin's own 5xx */

        reason = ngx_http_singleflight_promote_status(status);

        if (reason & ctx->conf->promote
            & ~NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF)
        {
            ngx_http_singleflight_fail(ctx, reason, status,
                                       r->connection->log);

            return ngx_http_next_header_filter(r);
        }

        if (!ctx->conf->share_errors) {
            ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_FAILED,
                                         ctx->conf->error_status,
                                         r->connection->log);

            return ngx_http_next_header_filter(r);
        }
    }

    if (status == NGX_HTTP_SWITCHING_PROTOCOLS
        || r->headers_out.content_length_n > (off_t) ctx->conf->max_size)
    {
        if (status != NGX_HTTP_SWITCHING_PROTOCOLS) {
            (void) ngx_atomic_fetch_add(&ctx->zone->counters->oversized,
                                        1);
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "singleflight response of %O bytes is larger than "
                          "singleflight_max_size, followers fetch on their "
                          "own", r->headers_out.content_length_n);
        }

        ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_NOSHARE, 0,
                                     r->connection->log);

        return ngx_http_next_header_filter(r);
    }

    if (ngx_http_singleflight_private(r, ctx->conf->private)) {

        /* one user's response: nobody else's, and not for a while */

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight response is private");

        ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_PRIVATE, 0,
                                     r->connection->log);

        return ngx_http_next_header_filter(r);
    }

    if (ctx->conf->lazy && ngx_http_singleflight_finish_alone(ctx) == NGX_OK) {

        /* nobody waits: nothing to capture (singleflight_lazy) */

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "singleflight flight has no followers, not captured");

        return ngx_http_next_header_filter(r);
    }

    rc = ngx_http_singleflight_vary_collect(r, &vary);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED
        || ngx_http_singleflight_store_header(r, ctx, vary) != NGX_OK)
    {
        ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_NOSHARE, 0,
                                     r->connection->log);

        return ngx_http_next_header_filter(r);
    }

    header_only = (r->method == NGX_HTTP_HEAD
                   || status == NGX_HTTP_NO_CONTENT
                   || status == NGX_HTTP_NOT_MODIFIED
                   || status < NGX_HTTP_OK);

    ctx->fn->header_only = header_only;

    rc = ngx_http_next_header_filter(r);

    if (header_only && ctx->capturing) {
        ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_DONE, 0,
                                     r->connection->log);
    }

    return rc;
}


static ngx_int_t
ngx_http_singleflight_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_chain_t                  *cl;
    ngx_http_singleflight_ctx_t  *ctx;

    if (r != r->main || in == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    ctx = ngx_http_singleflight_get_ctx(r);

    if (ctx == NULL || !ctx->capturing || ctx->fn->header == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    for (cl = in; cl; cl = cl->next) {

        if (ngx_http_singleflight_append(r, ctx, cl->buf) != NGX_OK) {
            ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_NOSHARE,
                                         0, r->connection->log);
            break;
        }

        if (cl->buf->last_buf) {
            ngx_http_singleflight_finish(ctx, NGX_HTTP_SINGLEFLIGHT_DONE, 0,
                                         r->connection->log);
            break;
        }
    }

    return ngx_http_next_body_filter(r, in);
}


/* the singleflight_promote condition an origin status matches, if any */

static ngx_uint_t
ngx_http_singleflight_promote_status(ngx_uint_t status)
{
    switch (status) {

    case NGX_HTTP_INTERNAL_SERVER_ERROR:
        return NGX_HTTP_SINGLEFLIGHT_PROMOTE_500;

    case NGX_HTTP_BAD_GATEWAY:
        return NGX_HTTP_SINGLEFLIGHT_PROMOTE_502;

    case NGX_HTTP_SERVICE_UNAVAILABLE:
        return NGX_HTTP_SINGLEFLIGHT_PROMOTE_503;

    case NGX_HTTP_GATEWAY_TIME_OUT:
        return NGX_HTTP_SINGLEFLIGHT_PROMOTE_504;

    default:
        return 0;
    }
}


static ngx_uint_t
ngx_http_singleflight_hop_by_hop(ngx_table_elt_t *h)
{
    ngx_str_t  *name;

    for (name = ngx_http_singleflight_skip_headers; name->len; name++) {
        if (h->key.len == name->len
            && ngx_strncasecmp(h->key.data, name->data, name->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_singleflight_store_header(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_array_t *vary)
{
    size_t                           len, n;
    u_char                          *block, *p;
    ngx_str_t                       *pair;
    ngx_uint_t                       i, nomem;
    ngx_list_part_t                 *part;
    ngx_table_elt_t                 *h;
    ngx_http_headers_out_t          *ho;
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_header_t   hdr;

    ho = &r->headers_out;

    ngx_memzero(&hdr, sizeof(ngx_http_singleflight_header_t));

    hdr.status = ho->status;
    hdr.content_length_n = ho->content_length_n;
    hdr.last_modified_time = ho->last_modified_time;
    hdr.status_line_len = ho->status_line.len;
    hdr.content_type_len = ho->content_type.len;
    hdr.content_type_base = ho->content_type_len;
    hdr.charset_len = ho->charset.len;
    hdr.allow_ranges = r->allow_ranges;

    len = sizeof(ngx_http_singleflight_header_t)
          + hdr.status_line_len + hdr.content_type_len + hdr.charset_len;

    part = &ho->headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash == 0 || ngx_http_singleflight_hop_by_hop(&h[i])) {
            continue;
        }

        len = ngx_align(len, sizeof(size_t))
              + 3 * sizeof(size_t) + 2 * h[i].key.len + h[i].value.len;

        hdr.nheaders++;
    }

    hdr.vary_offset = len;

    if (vary != NULL) {
        pair = vary->elts;
        hdr.nvary = vary->nelts;

        for (i = 0; i < vary->nelts; i++) {
            len = ngx_align(len, sizeof(size_t)) + 2 * sizeof(size_t)
                  + pair[2 * i].len + pair[2 * i + 1].len;
        }
    }

    zone = ctx->zone;

    ngx_http_singleflight_lock(zone);

    block = ngx_http_singleflight_alloc_locked(zone, len, &nomem);

    if (block != NULL) {
        ctx->fn->header = block;
        ctx->fn->header_len = len;
    }

    ngx_http_singleflight_unlock(zone);

    if (block == NULL) {
        ngx_http_singleflight_log_nomem(zone, r->connection->log, nomem);
        return NGX_ERROR;
    }

    /* only the leader touches the block until the flight is done */

    p = ngx_cpymem(block, &hdr, sizeof(ngx_http_singleflight_header_t));
    p = ngx_http_singleflight_put(p, &ho->status_line);
    p = ngx_http_singleflight_put(p, &ho->content_type);
    p = ngx_http_singleflight_put(p, &ho->charset);

    part = &ho->headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash == 0 || ngx_http_singleflight_hop_by_hop(&h[i])) {
            continue;
        }

        p = block + ngx_align((size_t) (p - block), sizeof(size_t));

        n = h[i].key.len;
        p = ngx_cpymem(p, &n, sizeof(size_t));
        n = h[i].value.len;
        p = ngx_cpymem(p, &n, sizeof(size_t));
        n = ngx_http_singleflight_linked(r, &h[i]);
        p = ngx_cpymem(p, &n, sizeof(size_t));

        p = ngx_http_singleflight_put(p, &h[i].key);
        ngx_strlow(p, h[i].key.data, h[i].key.len);
        p += h[i].key.len;
        p = ngx_http_singleflight_put(p, &h[i].value);
    }

    /* vary_offset was computed before the loops above, from the same sizes */

    p = block + hdr.vary_offset;

    for (i = 0; i < hdr.nvary; i++) {
        pair = (ngx_str_t *) vary->elts + 2 * i;

        p = block + ngx_align((size_t) (p - block), sizeof(size_t));

        n = pair[0].len;
        p = ngx_cpymem(p, &n, sizeof(size_t));
        n = pair[1].len;
        p = ngx_cpymem(p, &n, sizeof(size_t));

        p = ngx_http_singleflight_put(p, &pair[0]);
        p = ngx_http_singleflight_put(p, &pair[1]);
    }

    return NGX_OK;
}


/* does the response carry what singleflight_private lists? */

static ngx_uint_t
ngx_http_singleflight_private(ngx_http_request_t *r, ngx_uint_t conditions)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    if (conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_OFF) {
        return 0;
    }

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash == 0) {
            continue;
        }

        if (h[i].key.len == sizeof("Set-Cookie") - 1
            && ngx_strncasecmp(h[i].key.data, (u_char *) "Set-Cookie",
                               h[i].key.len) == 0)
        {
            if (conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_SET_COOKIE) {
                return 1;
            }

            continue;
        }

        if (h[i].key.len != sizeof("Cache-Control") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "Cache-Control",
                               h[i].key.len) != 0)
        {
            continue;
        }

        if (((conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_PRIVATE)
             && ngx_http_singleflight_has_token(&h[i].value, "private"))
            || ((conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_STORE)
                && ngx_http_singleflight_has_token(&h[i].value, "no-store"))
            || ((conditions & NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_CACHE)
                && ngx_http_singleflight_has_token(&h[i].value, "no-cache")))
        {
            return 1;
        }
    }

    return 0;
}


/* a Cache-Control directive, as a whole word, in any case */

static ngx_uint_t
ngx_http_singleflight_has_token(ngx_str_t *value, char *token)
{
    u_char  *p, *last;
    size_t   len;

    len = ngx_strlen(token);
    p = value->data;
    last = value->data + value->len;

    while (p + len <= last) {

        if (ngx_strncasecmp(p, (u_char *) token, len) == 0
            && (p == value->data || p[-1] == ' ' || p[-1] == ',')
            && (p + len == last || p[len] == ' ' || p[len] == ','
                || p[len] == '=' || p[len] == ';'))
        {
            return 1;
        }

        p++;
    }

    return 0;
}


/* an empty string may have no data pointer at all */

static u_char *
ngx_http_singleflight_put(u_char *p, ngx_str_t *s)
{
    return (s->len == 0) ? p : ngx_cpymem(p, s->data, s->len);
}


static ngx_int_t
ngx_http_singleflight_append(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_buf_t *b)
{
    off_t                           size, done, n;
    ssize_t                         rd;
    u_char                         *pos;
    ngx_http_singleflight_chunk_t  *chunk;

    if (ngx_buf_in_memory(b)) {
        pos = b->pos;
        size = b->last - b->pos;

    } else if (b->in_file) {
        pos = NULL;
        size = b->file_last - b->file_pos;

    } else {
        return NGX_OK;
    }

    if (size == 0) {
        return NGX_OK;
    }

    if (ctx->captured + size > (off_t) ctx->conf->max_size) {
        (void) ngx_atomic_fetch_add(&ctx->zone->counters->oversized, 1);
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "singleflight response is larger than "
                      "singleflight_max_size, followers fetch on their own");
        return NGX_DECLINED;
    }

    for (done = 0; done < size; done += n) {

        chunk = ctx->chunk;

        if (chunk == NULL || chunk->len == chunk->size) {
            chunk = ngx_http_singleflight_new_chunk(r, ctx, size - done);
            if (chunk == NULL) {
                return NGX_DECLINED;
            }
        }

        n = ngx_min((off_t) (chunk->size - chunk->len), size - done);

        if (pos != NULL) {
            ngx_memcpy(chunk->data + chunk->len, pos + done, (size_t) n);

        } else {
            rd = ngx_http_singleflight_read(r, b, chunk->data + chunk->len,
                                            (size_t) n, b->file_pos + done);

            if (rd != (ssize_t) n) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "singleflight could not read the response "
                              "from \"%V\"", &b->file->name);
                return NGX_DECLINED;
            }
        }

        chunk->len += (size_t) n;
    }

    ctx->captured += size;
    ctx->fn->body_len = ctx->captured;

    return NGX_OK;
}


/*
 * A file opened with directio (O_DIRECT) cannot be read into a buffer that
 * is not aligned: as nginx's own copy filter does, the flag is taken off
 * the descriptor for the read and put back after.
 */

static ssize_t
ngx_http_singleflight_read(ngx_http_request_t *r, ngx_buf_t *b, u_char *buf,
    size_t size, off_t offset)
{
    ssize_t  n;

#if (NGX_HAVE_ALIGNED_DIRECTIO)

    if (b->file->directio) {
        if (ngx_directio_off(b->file->fd) == NGX_FILE_ERROR) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, ngx_errno,
                          ngx_directio_off_n " \"%V\" failed",
                          &b->file->name);
            return NGX_ERROR;
        }
    }

#endif

    n = ngx_read_file(b->file, buf, size, offset);

#if (NGX_HAVE_ALIGNED_DIRECTIO)

    if (b->file->directio) {
        if (ngx_directio_on(b->file->fd) == NGX_FILE_ERROR) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, ngx_errno,
                          ngx_directio_on_n " \"%V\" failed",
                          &b->file->name);
        }
    }

#endif

    return n;
}


/*
 * The first chunk is sized to Content-Length when it is known, so most
 * bodies are one allocation; later chunks double, up to 64K, and are
 * rounded up to whole slab pages.
 */

static ngx_http_singleflight_chunk_t *
ngx_http_singleflight_new_chunk(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, size_t need)
{
    size_t                          size, hdr;
    ngx_uint_t                      nomem;
    ngx_http_singleflight_zone_t   *zone;
    ngx_http_singleflight_chunk_t  *chunk;

    hdr = offsetof(ngx_http_singleflight_chunk_t, data);

    if (ctx->chunk == NULL && r->headers_out.content_length_n > 0) {
        size = ngx_max(need, (size_t) r->headers_out.content_length_n);

    } else {
        size = (ctx->chunk == NULL) ? 4096 : ctx->chunk->size * 2;
        size = ngx_min(size, NGX_HTTP_SINGLEFLIGHT_CHUNK);
        size = ngx_max(size, need);
        size = ngx_min(size, ctx->conf->max_size - (size_t) ctx->captured);
        size = ngx_max(size, need);

        if (hdr + size > ngx_pagesize / 2) {
            size = ngx_align(hdr + size, ngx_pagesize) - hdr;
        }
    }

    zone = ctx->zone;

    ngx_http_singleflight_lock(zone);

    chunk = ngx_http_singleflight_alloc_locked(zone, hdr + size, &nomem);

    if (chunk != NULL) {
        chunk->next = NULL;
        chunk->size = size;
        chunk->len = 0;

        if (ctx->fn->last) {
            ctx->fn->last->next = chunk;

        } else {
            ctx->fn->first = chunk;
        }

        ctx->fn->last = chunk;
    }

    ngx_http_singleflight_unlock(zone);

    if (chunk == NULL) {
        ngx_http_singleflight_log_nomem(zone, r->connection->log, nomem);
        return NULL;
    }

    ctx->chunk = chunk;

    return chunk;
}
