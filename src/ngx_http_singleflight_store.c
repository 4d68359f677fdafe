/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The store: a flight's response, captured by its fetch and read by
 * offset while it grows.
 *
 * The header is one block: a ngx_http_singleflight_header_t, then the
 * status line, the content type and the charset, then per header (each
 * aligned to size_t) the key's length, the value's length, whether the
 * fetch's headers_out pointed at it (a Location that proxy_redirect
 * rewrote, say), the key, the lower-case key and the value; then, at
 * vary_offset, per header named in Vary: the name's length, the value's
 * length, the name and the fetch's request value.  It is built in the
 * fetch's pool and copied into the zone when the flight publishes it.
 *
 * The body's first bytes go to chunks in the zone, up to
 * singleflight_memory or until the zone has no room; the rest to a
 * temporary file under singleflight_temp_path, which readers open by its
 * name and send with sendfile() where their connection can.  Only the
 * fetch writes; a reader reads what the flight has published (its
 * body_len, under the lock that also links chunks and names the file), so
 * it never needs the lock to read.
 */


#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_zone.h"


#define NGX_HTTP_SINGLEFLIGHT_CHUNK_MIN   4096
#define NGX_HTTP_SINGLEFLIGHT_CHUNK_MAX   (64 * 1024)


typedef struct {
    ngx_str_t   name;
    ngx_uint_t  offset;
} ngx_http_singleflight_known_header_t;


/* a stored header's "linked": not linked (0), linked (1), linked, no hash */
#define NGX_HTTP_SINGLEFLIGHT_HIDDEN  2


static u_char *ngx_http_singleflight_restore_header(ngx_http_request_t *r,
    u_char *block, u_char *p, ngx_uint_t replace);
static u_char *ngx_http_singleflight_store_put_moved(u_char *p,
    ngx_http_singleflight_where_t *where);
static ngx_uint_t ngx_http_singleflight_accept_ranges(ngx_table_elt_t *h);
static ngx_uint_t ngx_http_singleflight_store_cuts(ngx_http_request_t *r,
    ngx_str_t *range);
static ngx_uint_t ngx_http_singleflight_skip(ngx_table_elt_t *h);
static ngx_uint_t ngx_http_singleflight_linked(ngx_http_request_t *r,
    ngx_table_elt_t *h);
static ngx_int_t ngx_http_singleflight_link(ngx_http_request_t *r,
    ngx_table_elt_t *h, ngx_uint_t linked, ngx_uint_t replace);
static size_t ngx_http_singleflight_headers_size(ngx_http_headers_out_t *ho,
    size_t len, ngx_http_singleflight_header_t *hdr);
static ngx_uint_t ngx_http_singleflight_stored(ngx_http_headers_out_t *ho,
    ngx_table_elt_t *h);
static size_t ngx_http_singleflight_store_size(ngx_http_headers_out_t *ho,
    ngx_array_t *vary, ngx_http_singleflight_header_t *hdr);
static u_char *ngx_http_singleflight_store_put_headers(ngx_http_request_t *r,
    u_char *block, u_char *p);
static u_char *ngx_http_singleflight_put(u_char *p, ngx_str_t *s);
static size_t ngx_http_singleflight_upstream_size(ngx_http_request_t *r,
    size_t len, ngx_http_singleflight_header_t *hdr);
static void ngx_http_singleflight_store_put_upstream(ngx_http_request_t *r,
    u_char *block, ngx_http_singleflight_header_t *hdr);
static size_t ngx_http_singleflight_upstream_walk(ngx_list_t *list,
    u_char *block, size_t len, ngx_uint_t *n);

static ngx_http_singleflight_chunk_t *ngx_http_singleflight_store_chunk(
    ngx_http_singleflight_writer_t *w, size_t need);
static void ngx_http_singleflight_store_nospill(
    ngx_http_singleflight_writer_t *w);
static ngx_int_t ngx_http_singleflight_store_reserve(
    ngx_http_singleflight_writer_t *w);
static void ngx_http_singleflight_store_unname(
    ngx_http_singleflight_writer_t *w);
static ngx_int_t ngx_http_singleflight_store_spill(
    ngx_http_singleflight_writer_t *w);
static ngx_int_t ngx_http_singleflight_store_same(
    ngx_http_singleflight_writer_t *w, off_t offset, u_char *data,
    size_t size);
static ssize_t ngx_http_singleflight_read_file(ngx_buf_t *b, u_char *buf,
    size_t size, off_t offset, ngx_log_t *log);
static ngx_int_t ngx_http_singleflight_open(ngx_http_request_t *r,
    ngx_http_singleflight_cursor_t *cur);
static ngx_int_t ngx_http_singleflight_sweep_file(ngx_tree_ctx_t *ctx,
    ngx_str_t *path);
static ngx_int_t ngx_http_singleflight_sweep_noop(ngx_tree_ctx_t *ctx,
    ngx_str_t *path);


/*
 * never stored: made again for each response, or hop-by-hop ones that
 * nginx's upstream does not pass on either (TE, Trailer and
 * Proxy-Connection it passes: followers get them too)
 */
static ngx_str_t  ngx_http_singleflight_skip_headers[] = {
    ngx_string("Content-Length"),
    ngx_string("Connection"),
    ngx_string("Keep-Alive"),
    ngx_string("Transfer-Encoding"),
    ngx_null_string
};


/*
 * headers whose headers_out pointer other filters look at; a Date is in
 * the list only when the content handler passed the origin's on
 * (proxy_pass_header Date), and then it is everybody's
 */
static ngx_http_singleflight_known_header_t  ngx_http_singleflight_known[] = {
    { ngx_string("Server"),
      offsetof(ngx_http_headers_out_t, server) },
    { ngx_string("Date"),
      offsetof(ngx_http_headers_out_t, date) },
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


/*
 * A failed flight's record, when its fetch ended with a status nginx made
 * (a 404, a 301 to a directory's URI with its slash): what its location
 * changed of the URI and arguments, and the headers its handler set with
 * the status (the 301's Location), which nginx's special response sends.
 * After this, the URI's bytes, the arguments', and the headers, aligned,
 * as in a header block.
 */
typedef struct {
    size_t                           len;         /* the whole record's */
    ngx_http_singleflight_moved_t    moved;
    ngx_uint_t                       nheaders;
} ngx_http_singleflight_failure_t;


/* ------------------------------------------------------------ header */

u_char *
ngx_http_singleflight_store_serialize(ngx_http_request_t *r,
    ngx_http_singleflight_where_t *where, ngx_array_t *vary,
    ngx_uint_t flags, size_t *plen)
{
    size_t                           len;
    u_char                          *block, *p;
    ngx_http_headers_out_t          *ho;
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
    hdr.flags = flags;
    hdr.loc_conf = where->loc_conf;
    hdr.moved = where->moved;
    hdr.allow_ranges = r->allow_ranges;
    hdr.no_conditionals = ngx_http_singleflight_store_unconditional(r);
    hdr.limit_rate = ngx_http_singleflight_store_limit_rate(r);
    hdr.buffered = (r->upstream && r->upstream->buffering);

    len = ngx_http_singleflight_store_size(ho, vary, &hdr);
    len = ngx_http_singleflight_upstream_size(r, len, &hdr);

    if (ngx_http_singleflight_store_cache(r)) {
        /*
         * the origin was asked no Range there, whatever its Accept-Ranges:
         * nginx cuts a Range only from a response it may cache
         * (allow_ranges)
         */
        hdr.accept_ranges = 0;
    }

    block = ngx_pnalloc(r->pool, len);
    if (block == NULL) {
        return NULL;
    }

    p = ngx_cpymem(block, &hdr, sizeof(ngx_http_singleflight_header_t));
    p = ngx_http_singleflight_put(p, &ho->status_line);
    p = ngx_http_singleflight_put(p, &ho->content_type);
    p = ngx_http_singleflight_put(p, &ho->charset);

    if (hdr.moved.flags) {
        p = ngx_http_singleflight_store_put_moved(p, where);
    }

    (void) ngx_http_singleflight_store_put_headers(r, block, p);

    /* vary_offset was computed with the sizes the headers took */

    ngx_http_singleflight_store_put_vary(block, block + hdr.vary_offset,
                                         vary ? vary->elts : NULL,
                                         hdr.nvary);

    ngx_http_singleflight_store_put_upstream(r, block, &hdr);

    *plen = len;

    return block;
}


/*
 * The block's length for the response headers that are stored, and then
 * the Vary pairs; their counts and where the pairs start go into "hdr".
 */

static size_t
ngx_http_singleflight_store_size(ngx_http_headers_out_t *ho,
    ngx_array_t *vary, ngx_http_singleflight_header_t *hdr)
{
    size_t      len;
    ngx_str_t  *pair;
    ngx_uint_t  i;

    len = sizeof(ngx_http_singleflight_header_t)
          + hdr->status_line_len + hdr->content_type_len + hdr->charset_len
          + hdr->moved.uri_len + hdr->moved.args_len;

    len = ngx_http_singleflight_headers_size(ho, len, hdr);

    hdr->vary_offset = len;

    if (vary != NULL) {
        pair = vary->elts;
        hdr->nvary = vary->nelts;

        for (i = 0; i < vary->nelts; i++) {
            len = ngx_align(len, sizeof(size_t)) + 2 * sizeof(size_t)
                  + pair[2 * i].len + pair[2 * i + 1].len;
        }
    }

    return len;
}


/*
 * "len" grown by the stored headers of a list, aligned each; their count
 * and whether one says "Accept-Ranges: bytes" go into "hdr".
 */

static size_t
ngx_http_singleflight_headers_size(ngx_http_headers_out_t *ho, size_t len,
    ngx_http_singleflight_header_t *hdr)
{
    ngx_table_elt_t               *h;
    ngx_http_singleflight_walk_t   walk;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(&ho->headers, &walk))
           != NULL)
    {
        if (!ngx_http_singleflight_stored(ho, h)) {
            continue;
        }

        if (ngx_http_singleflight_accept_ranges(h)) {
            hdr->accept_ranges = 1;
        }

        len = ngx_align(len, sizeof(size_t))
              + 3 * sizeof(size_t) + 2 * h->key.len + h->value.len;

        hdr->nheaders++;
    }

    return len;
}


/*
 * Each stored response header at "p", aligned: its key's and value's
 * lengths, whether it links to the next of its name, the key, the key
 * in lowercase, the value.
 */

static u_char *
ngx_http_singleflight_store_put_headers(ngx_http_request_t *r, u_char *block,
    u_char *p)
{
    size_t                         n;
    ngx_table_elt_t               *h;
    ngx_http_headers_out_t        *ho;
    ngx_http_singleflight_walk_t   walk;

    ho = &r->headers_out;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(&ho->headers, &walk))
           != NULL)
    {
        if (!ngx_http_singleflight_stored(ho, h)) {
            continue;
        }

        p = block + ngx_align((size_t) (p - block), sizeof(size_t));

        n = h->key.len;
        p = ngx_cpymem(p, &n, sizeof(size_t));
        n = h->value.len;
        p = ngx_cpymem(p, &n, sizeof(size_t));
        n = (h->hash == 0) ? NGX_HTTP_SINGLEFLIGHT_HIDDEN
                           : ngx_http_singleflight_linked(r, h);
        p = ngx_cpymem(p, &n, sizeof(size_t));

        p = ngx_http_singleflight_put(p, &h->key);
        if (h->key.len) {
            ngx_strlow(p, h->key.data, h->key.len);
        }
        p += h->key.len;
        p = ngx_http_singleflight_put(p, &h->value);
    }

    return p;
}


/*
 * The Vary pairs (a header's name and the request's value) at "p": of a
 * response, or what a request would make of them (_vary.c).
 */

void
ngx_http_singleflight_store_put_vary(u_char *block, u_char *p,
    ngx_str_t *pairs, ngx_uint_t nvary)
{
    size_t      n;
    ngx_str_t  *pair;
    ngx_uint_t  i;

    for (i = 0; i < nvary; i++) {
        pair = pairs + 2 * i;

        p = block + ngx_align((size_t) (p - block), sizeof(size_t));

        n = pair[0].len;
        p = ngx_cpymem(p, &n, sizeof(size_t));
        n = pair[1].len;
        p = ngx_cpymem(p, &n, sizeof(size_t));

        p = ngx_http_singleflight_put(p, &pair[0]);
        p = ngx_http_singleflight_put(p, &pair[1]);
    }
}


void
ngx_http_singleflight_store_parse(u_char *block,
    ngx_http_singleflight_header_t *hdr)
{
    ngx_memcpy(hdr, block, sizeof(ngx_http_singleflight_header_t));
}


/* may a fetch in any worker ask for the rest (or all) of this response? */

ngx_uint_t
ngx_http_singleflight_store_resumable(u_char *block)
{
    ngx_http_singleflight_header_t  hdr;

    if (block == NULL) {
        return 0;
    }

    ngx_memcpy(&hdr, block, sizeof(ngx_http_singleflight_header_t));

    return (hdr.flags & (NGX_HTTP_SINGLEFLIGHT_H_RESUMABLE
                         |NGX_HTTP_SINGLEFLIGHT_H_WHOLE))
           != 0;
}


/*
 * The value of the first stored header named "lowcase" (in lowercase),
 * pointing into the block.  NGX_DECLINED: there is none.
 */

ngx_int_t
ngx_http_singleflight_store_find(u_char *block, char *lowcase,
    ngx_str_t *value)
{
    u_char                          *p;
    size_t                           n, len[3];
    ngx_uint_t                       i;
    ngx_http_singleflight_header_t   hdr;

    ngx_memcpy(&hdr, block, sizeof(ngx_http_singleflight_header_t));

    n = ngx_strlen(lowcase);

    p = block + sizeof(ngx_http_singleflight_header_t)
        + hdr.status_line_len + hdr.content_type_len + hdr.charset_len
        + hdr.moved.uri_len + hdr.moved.args_len;

    for (i = 0; i < hdr.nheaders; i++) {
        p = block + ngx_align((size_t) (p - block), sizeof(size_t));

        /* the key's and the value's lengths, and the link */
        ngx_memcpy(len, p, sizeof(len));
        p += sizeof(len);

        if (len[0] == n && ngx_strncmp(p + len[0], lowcase, n) == 0) {
            value->data = p + 2 * len[0];
            value->len = len[1];
            return NGX_OK;
        }

        p += 2 * len[0] + len[1];
    }

    return NGX_DECLINED;
}


/*
 * A reader's headers_out from a header block.  The values point into the
 * block, which lives as long as the reader holds its flight.
 * "range_sent": the fetch sent the reader's Range, the response answers
 * it as the origin did.
 */

ngx_int_t
ngx_http_singleflight_store_restore(ngx_http_request_t *r, u_char *block,
    ngx_uint_t range_sent)
{
    u_char                          *p;
    ngx_uint_t                       i;
    ngx_http_headers_out_t          *ho;
    ngx_http_singleflight_header_t   hdr;

    ho = &r->headers_out;
    p = block;

    ngx_memcpy(&hdr, p, sizeof(ngx_http_singleflight_header_t));
    p += sizeof(ngx_http_singleflight_header_t);

    ho->status = hdr.status;

    ho->status_line.len = hdr.status_line_len;
    ho->status_line.data = p;
    p += hdr.status_line_len;

    ho->content_type.len = hdr.content_type_len;
    ho->content_type.data = p;
    ho->content_type_len = hdr.content_type_base;
    ho->content_type_hash = 0;
    ho->content_type_lowcase = NULL;
    p += hdr.content_type_len;

    ho->charset.len = hdr.charset_len;
    ho->charset.data = p;
    p += hdr.charset_len;

    if (ngx_http_singleflight_store_move(r, &hdr.moved, p,
                                         p + hdr.moved.uri_len)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    p += hdr.moved.uri_len + hdr.moved.args_len;

    ho->last_modified_time = hdr.last_modified_time;

    /* the origin's framing: a length only if it gave one */

    ho->content_length_n = hdr.content_length_n;

    for (i = 0; i < hdr.nheaders; i++) {
        p = ngx_http_singleflight_restore_header(r, block, p, 0);
        if (p == NULL) {
            return NGX_ERROR;
        }
    }

    /* after the headers: the range filter reads its ETag, Last-Modified */

    ngx_http_singleflight_store_allow_ranges(r, hdr.allow_ranges,
                                             hdr.accept_ranges && !range_sent);

    if (hdr.no_conditionals) {
        r->disable_not_modified = 1;
    }

    if (hdr.limit_rate != NGX_ERROR) {
        r->limit_rate = (size_t) hdr.limit_rate;
        r->limit_rate_set = 1;
    }

    ngx_http_singleflight_store_location(r, hdr.loc_conf);

    return NGX_OK;
}


/* ------------------------------------------------------------ $upstream_ */

/* the configuration of a follower's upstream: nothing set */
static ngx_http_upstream_conf_t  ngx_http_singleflight_no_upstream;


/*
 * A follower did not go upstream, and nginx gives it no $upstream_...
 * variables.  Where the configuration reads the origin's headers
 * ($upstream_http_x_backend, in add_header or a log format, often with
 * proxy_hide_header for that header) or $upstream_cache_status, the
 * response it got was the fetch's, and so are those: the fetch's
 * upstream headers and cache status are kept in the header block, and a
 * follower gets an upstream of its own with them (no peer, no states:
 * $upstream_addr, $upstream_status and the times stay empty, as it went
 * nowhere).  The names are those nginx indexed while it read the
 * configuration; a variable looked up only by name at run time (SSI's
 * echo, perl) does not count.
 */

void
ngx_http_singleflight_store_init(ngx_conf_t *cf)
{
    ngx_uint_t                          i;
    ngx_http_variable_t                *v;
    ngx_http_core_main_conf_t          *cmcf;
    ngx_http_singleflight_main_conf_t  *smcf;

    static ngx_str_t  http = ngx_string("upstream_http_");
    static ngx_str_t  cache = ngx_string("upstream_cache_status");

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    v = cmcf->variables.elts;

    for (i = 0; i < cmcf->variables.nelts; i++) {
        if ((v[i].name.len > http.len
             && ngx_strncasecmp(v[i].name.data, http.data, http.len) == 0)
            || (v[i].name.len == cache.len
                && ngx_strncasecmp(v[i].name.data, cache.data, cache.len)
                   == 0))
        {
            smcf->upstream_vars = 1;
            return;
        }
    }
}


/* "len" grown by the fetch's upstream headers, if they are kept */

static size_t
ngx_http_singleflight_upstream_size(ngx_http_request_t *r, size_t len,
    ngx_http_singleflight_header_t *hdr)
{
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    if (!smcf->upstream_vars || r->upstream == NULL) {
        return len;
    }

#if (NGX_HTTP_CACHE)
    hdr->cache_status = r->upstream->cache_status;
#endif

    hdr->upstream_offset = len;

    return ngx_http_singleflight_upstream_walk(&r->upstream->headers_in.headers,
                                               NULL, len, &hdr->nupstream);
}


static void
ngx_http_singleflight_store_put_upstream(ngx_http_request_t *r,
    u_char *block, ngx_http_singleflight_header_t *hdr)
{
    ngx_uint_t  n;

    if (hdr->nupstream != 0) {
        (void) ngx_http_singleflight_upstream_walk(
                          &r->upstream->headers_in.headers, block,
                          hdr->upstream_offset, &n);
    }
}


/*
 * The upstream headers of a list, each aligned from the block's start:
 * their lengths, the key, the value.  Without a block, it only counts
 * them ("n") and the length they take; with one, it writes them there
 * from "len" on.  Returns the length after them.
 */

static size_t
ngx_http_singleflight_upstream_walk(ngx_list_t *list, u_char *block,
    size_t len, ngx_uint_t *n)
{
    size_t                         kv[2];
    u_char                        *p;
    ngx_table_elt_t               *h;
    ngx_http_singleflight_walk_t   walk;

    *n = 0;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(list, &walk)) != NULL) {

        if (h->hash == 0) {
            continue;
        }

        len = ngx_align(len, sizeof(size_t));
        kv[0] = h->key.len;
        kv[1] = h->value.len;

        if (block != NULL) {
            p = ngx_cpymem(block + len, kv, sizeof(kv));
            p = ngx_http_singleflight_put(p, &h->key);
            (void) ngx_http_singleflight_put(p, &h->value);
        }

        len += sizeof(kv) + kv[0] + kv[1];
        (*n)++;
    }

    return len;
}


/*
 * A follower's upstream, with the fetch's headers and cache status, all
 * in its own pool: its log handler runs after it let go of the block.  A
 * request with an upstream already keeps it.  Not for a leader: its
 * upstream is its fetch's own (ngx_http_singleflight_clone_header_vars()).
 */

ngx_int_t
ngx_http_singleflight_store_upstream(ngx_http_request_t *r, u_char *block)
{
    size_t                           len[2];
    u_char                          *p;
    ngx_uint_t                       i;
    ngx_table_elt_t                 *h;
    ngx_http_upstream_t             *u;
    ngx_http_singleflight_header_t   hdr;

    ngx_memcpy(&hdr, block, sizeof(ngx_http_singleflight_header_t));

    if ((hdr.nupstream == 0 && hdr.cache_status == 0)
        || r->upstream != NULL)
    {
        return NGX_OK;
    }

    u = ngx_pcalloc(r->pool, sizeof(ngx_http_upstream_t));
    if (u == NULL) {
        return NGX_ERROR;
    }

    /* $upstream_cache_last_modified and _etag read its configuration */
    u->conf = &ngx_http_singleflight_no_upstream;

    if (ngx_list_init(&u->headers_in.headers, r->pool, hdr.nupstream + 1,
                      sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

#if (NGX_HTTP_CACHE)
    u->cache_status = hdr.cache_status;
#endif

    p = block + hdr.upstream_offset;

    for (i = 0; i < hdr.nupstream; i++) {
        p = block + ngx_align((size_t) (p - block), sizeof(size_t));

        ngx_memcpy(len, p, 2 * sizeof(size_t));
        p += 2 * sizeof(size_t);

        h = ngx_list_push(&u->headers_in.headers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        h->key.data = ngx_pnalloc(r->pool, len[0] + len[1]);
        if (h->key.data == NULL) {
            return NGX_ERROR;
        }

        h->hash = 1;
        h->key.len = len[0];
        h->value.len = len[1];
        h->value.data = ngx_cpymem(h->key.data, p, len[0] + len[1]) - len[1];
        h->lowcase_key = h->key.data;
#if (nginx_version >= 1023000)
        h->next = NULL;
#endif

        p += len[0] + len[1];
    }

    r->upstream = u;

    return NGX_OK;
}


/*
 * The rate an origin's X-Accel-Limit-Rate set for the request that read
 * it, as nginx's upstream sets it (not ignored with proxy_ignore_headers,
 * a number; a response not buffered is sent at once, whatever it said):
 * each reader is paced by it, as its own request would have been without
 * the module.  NGX_ERROR: none.
 */

ngx_int_t
ngx_http_singleflight_store_limit_rate(ngx_http_request_t *r)
{
    ngx_table_elt_t      *h;
    ngx_http_upstream_t  *u;

    u = r->upstream;

    if (u == NULL || !u->buffering
        || (u->conf->ignore_headers & NGX_HTTP_UPSTREAM_IGN_XA_LIMIT_RATE))
    {
        return NGX_ERROR;
    }

    h = u->headers_in.x_accel_limit_rate;

    return (h == NULL) ? NGX_ERROR : ngx_atoi(h->value.data, h->value.len);
}


/*
 * Whether the fetch's content handler said its response answers no
 * conditionals (perl's does): then nginx answers none for any reader, as
 * without the module.  nginx's upstream says so too for a response it
 * may not cache, because the origin answered the request's conditionals;
 * a fetch sends none, so nginx answers them from the response (README,
 * "Conditional and range requests").  Not where the location has a
 * cache: its upstream sends the origin no conditionals, and answers none
 * for a response it may not cache, as for every reader then.
 */

ngx_uint_t
ngx_http_singleflight_store_unconditional(ngx_http_request_t *r)
{
    return r->disable_not_modified
           && (r->upstream == NULL || ngx_http_singleflight_store_cache(r));
}


/*
 * Did the upstream make its request for a cache (proxy_cache and the
 * like): one that sends the origin no Range and no conditionals, whatever
 * the client sent, and lets nginx answer them only from a response it
 * may cache?  nginx makes it so where it looked in the cache, or skipped
 * it (proxy_cache_bypass); not with no cache for the request (a variable
 * that says "off", a method not cached) nor before proxy_cache_min_uses
 * (its file was never made a temporary one: nothing will be stored).
 */

ngx_uint_t
ngx_http_singleflight_store_cache(ngx_http_request_t *r)
{
#if (NGX_HTTP_CACHE)
    return r->upstream != NULL && r->cache != NULL
           && (r->cache->temp_file
               || r->upstream->cache_status == NGX_HTTP_CACHE_BYPASS);
#else
    return 0;
#endif
}


/*
 * The location whose content handler made the response.  The fetch may
 * have left the reader's location (try_files, index, error_page, a named
 * location); without the module the request would have followed it, and
 * the response would have gone through that location's filters
 * (add_header, expires, gzip, ...) and log.  So does the reader's: its
 * configuration becomes that location's, as after the same redirect.
 * Every reader of a flight is in one location, of one configuration
 * (flights never cross a reload), so the pointer is good in every worker.
 */

void
ngx_http_singleflight_store_location(ngx_http_request_t *r, void **loc_conf)
{
    if (loc_conf == NULL || loc_conf == r->loc_conf) {
        return;
    }

    r->loc_conf = loc_conf;
    ngx_http_update_location_config(r);
}


/* the bytes of the URI and arguments "where" says were changed */

static u_char *
ngx_http_singleflight_store_put_moved(u_char *p,
    ngx_http_singleflight_where_t *where)
{
    if (where->moved.uri_len) {
        p = ngx_cpymem(p, where->uri, where->moved.uri_len);
    }

    if (where->moved.args_len) {
        p = ngx_cpymem(p, where->args, where->moved.args_len);
    }

    return p;
}


/*
 * The URI and arguments the fetch's location changed (index, try_files,
 * error_page, rewrite, set $args) become the reader's, as after the same
 * redirect without the module: its $uri, $args and what uses them (map,
 * add_header, the access log).  Copied: the block goes with the flight.
 */

ngx_int_t
ngx_http_singleflight_store_move(ngx_http_request_t *r,
    ngx_http_singleflight_moved_t *m, u_char *uri, u_char *args)
{
    u_char  *p;

    if (m->flags == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, m->uri_len + m->args_len + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    r->valid_unparsed_uri = 0;

    if (m->flags & NGX_HTTP_SINGLEFLIGHT_MOVED_URI) {
        r->uri.len = m->uri_len;
        r->uri.data = p;
        p = ngx_cpymem(p, uri, m->uri_len);

        ngx_http_set_exten(r);
    }

    if (m->flags & NGX_HTTP_SINGLEFLIGHT_MOVED_ARGS) {
        r->args.len = m->args_len;
        r->args.data = (m->args_len) ? p : NULL;

        if (m->args_len) {
            ngx_memcpy(p, args, m->args_len);
        }
    }

    return NGX_OK;
}


/* ------------------------------------------------------------ failure */

/* the length of a failed flight's record, 0 when there is nothing to keep */

size_t
ngx_http_singleflight_store_failure_size(ngx_http_singleflight_where_t *where)
{
    size_t                          len;
    ngx_http_singleflight_header_t  hdr;

    ngx_memzero(&hdr, sizeof(ngx_http_singleflight_header_t));

    len = sizeof(ngx_http_singleflight_failure_t)
          + where->moved.uri_len + where->moved.args_len;

    if (where->made != NULL) {
        len = ngx_http_singleflight_headers_size(&where->made->headers_out,
                                                 len, &hdr);
    }

    return (where->moved.flags == 0 && hdr.nheaders == 0) ? 0 : len;
}


void
ngx_http_singleflight_store_put_failure(u_char *block, size_t len,
    ngx_http_singleflight_where_t *where)
{
    u_char                           *p;
    ngx_http_singleflight_header_t    hdr;
    ngx_http_singleflight_failure_t   f;

    ngx_memzero(&hdr, sizeof(ngx_http_singleflight_header_t));

    if (where->made != NULL) {
        (void) ngx_http_singleflight_headers_size(&where->made->headers_out,
                                                  0, &hdr);
    }

    f.len = len;
    f.moved = where->moved;
    f.nheaders = hdr.nheaders;

    p = ngx_cpymem(block, &f, sizeof(ngx_http_singleflight_failure_t));
    p = ngx_http_singleflight_store_put_moved(p, where);

    if (f.nheaders) {
        (void) ngx_http_singleflight_store_put_headers(where->made, block, p);
    }
}


/*
 * A failed flight's URI, arguments and headers become the reader's, as
 * its request would have had them after the same handler without the
 * module.  A header the handler set in place of one (its Location) takes
 * that one's place, as nginx's handlers clear the old.  Copied: the
 * record goes with the flight, before the reader's response is made.
 */

ngx_int_t
ngx_http_singleflight_store_restore_failure(ngx_http_request_t *r,
    u_char *block)
{
    u_char                           *p, *copy;
    ngx_uint_t                        i;
    ngx_http_singleflight_failure_t   f;

    ngx_memcpy(&f, block, sizeof(ngx_http_singleflight_failure_t));

    copy = ngx_palloc(r->pool, f.len);
    if (copy == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(copy, block, f.len);
    p = copy + sizeof(ngx_http_singleflight_failure_t);

    if (ngx_http_singleflight_store_move(r, &f.moved, p,
                                         p + f.moved.uri_len)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    p += f.moved.uri_len + f.moved.args_len;

    for (i = 0; i < f.nheaders; i++) {
        p = ngx_http_singleflight_restore_header(r, copy, p, 1);
        if (p == NULL) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the header element at "p" in the block, for "r"; NULL on an error */

static u_char *
ngx_http_singleflight_restore_header(ngx_http_request_t *r, u_char *block,
    u_char *p, ngx_uint_t replace)
{
    size_t            key_len, value_len, linked;
    ngx_table_elt_t  *h;

    p = block + ngx_align((size_t) (p - block), sizeof(size_t));

    ngx_memcpy(&key_len, p, sizeof(size_t));
    p += sizeof(size_t);
    ngx_memcpy(&value_len, p, sizeof(size_t));
    p += sizeof(size_t);
    ngx_memcpy(&linked, p, sizeof(size_t));
    p += sizeof(size_t);

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NULL;
    }

    h->hash = (linked == NGX_HTTP_SINGLEFLIGHT_HIDDEN) ? 0 : 1;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif
    h->key.len = key_len;
    h->key.data = p;
    h->lowcase_key = p + key_len;
    h->value.len = value_len;
    h->value.data = p + 2 * key_len;

    p += 2 * key_len + value_len;

    if (r->http_version >= NGX_HTTP_VERSION_20
        && key_len == sizeof("Upgrade") - 1
        && ngx_strncmp(h->lowcase_key, "upgrade", key_len) == 0)
    {
        /* nginx passes an upstream's Upgrade on to HTTP/1.x only */
        h->hash = 0;
    }

    if (ngx_http_singleflight_link(r, h, linked, replace) != NGX_OK) {
        return NULL;
    }

    return p;
}


/*
 * Ranges for a reader of a stored response, or a leader of its own: where
 * its fetch's response allowed them ("allowed", as for a response nginx's
 * cache takes in), or where the origin takes ranges and its fetch did not
 * send the reader's ("taken").  One range only, as nginx allows on a
 * response its cache is still receiving: the range filter cannot cut
 * several from buffers that come one after another.  Several ranges of a
 * response the origin would have cut get all of it ("taken" alone), with
 * the origin's Accept-Ranges (the range filter would add its own).
 */

void
ngx_http_singleflight_store_allow_ranges(ngx_http_request_t *r,
    ngx_uint_t allowed, ngx_uint_t taken)
{
    ngx_str_t  *range;

    if (!allowed) {
        if (!taken || r->headers_in.range == NULL) {
            return;
        }

        range = &r->headers_in.range->value;

        if (ngx_strlchr(range->data, range->data + range->len, ',') != NULL
            || !ngx_http_singleflight_store_cuts(r, range))
        {
            return;
        }
    }

    r->allow_ranges = 1;
    r->single_range = 1;
}


/*
 * Does nginx's range filter cut the Range, as the origin would have?
 * Where it does not (another unit, an If-Range the response fails), it
 * adds an Accept-Ranges of its own beside the origin's; the response then
 * goes whole, with the origin's alone, as the origin sends it.
 */

static ngx_uint_t
ngx_http_singleflight_store_cuts(ngx_http_request_t *r, ngx_str_t *range)
{
    time_t      modified;
    ngx_str_t  *if_range, *etag;

    if (range->len < 7
        || ngx_strncasecmp(range->data, (u_char *) "bytes=", 6) != 0)
    {
        return 0;
    }

    if (r->headers_in.if_range == NULL) {
        return 1;
    }

    if_range = &r->headers_in.if_range->value;

    if (if_range->len >= 2 && if_range->data[0] == 'W'
        && if_range->data[1] == '/')
    {
        /* a weak tag never matches (RFC 9110, 13.1.5): the origin's 200 */
        return 0;
    }

    if (if_range->len >= 2 && if_range->data[if_range->len - 1] == '"') {

        if (r->headers_out.etag == NULL) {
            return 0;
        }

        etag = &r->headers_out.etag->value;

        return etag->len == if_range->len
               && ngx_strncmp(etag->data, if_range->data, etag->len) == 0;
    }

    modified = r->headers_out.last_modified_time;

    return modified != (time_t) -1
           && ngx_parse_http_time(if_range->data, if_range->len) == modified;
}


/*
 * Does a response's header list say "Accept-Ranges: bytes"?  Then
 * nginx's range filter answers a client's Range from it, as the origin
 * would have answered the Range the fetch did not send.
 */

ngx_uint_t
ngx_http_singleflight_store_ranges(ngx_list_t *headers)
{
    ngx_table_elt_t               *h;
    ngx_http_singleflight_walk_t   walk;

    ngx_memzero(&walk, sizeof(ngx_http_singleflight_walk_t));

    while ((h = ngx_http_singleflight_list_next(headers, &walk)) != NULL) {
        if (h->hash != 0 && ngx_http_singleflight_accept_ranges(h)) {
            return 1;
        }
    }

    return 0;
}


/*
 * Does the response of header block "block" leave a Range of "r"
 * unanswered where the origin would have answered it?  A 200 without a
 * length (the origin's was chunked) that takes ranges: nginx's range
 * filter needs the length and sends the whole 200; the origin, asked
 * with the Range the fetch did not send, would have sent a 206.
 */

ngx_uint_t
ngx_http_singleflight_store_unrangeable(ngx_http_request_t *r, u_char *block)
{
    ngx_http_singleflight_header_t  hdr;

    if (r->headers_in.range == NULL || block == NULL) {
        return 0;
    }

    ngx_memcpy(&hdr, block, sizeof(ngx_http_singleflight_header_t));

    return ngx_http_singleflight_store_uncut(hdr.status, hdr.content_length_n,
                                             hdr.allow_ranges
                                             || hdr.accept_ranges);
}


/*
 * The rule itself, for a request with a Range and a response of "status"
 * and "length" (-1: none) that takes ranges or not ("ranges"): the
 * fetch's leader states it on its headers_out, a reader on a header
 * block.
 */

ngx_uint_t
ngx_http_singleflight_store_uncut(ngx_uint_t status, off_t length,
    ngx_uint_t ranges)
{
    return status == NGX_HTTP_OK && length == -1 && ranges;
}


/* an Accept-Ranges element that names "bytes" */

static ngx_uint_t
ngx_http_singleflight_accept_ranges(ngx_table_elt_t *h)
{
    return h->key.len == sizeof("Accept-Ranges") - 1
           && ngx_strncasecmp(h->key.data, (u_char *) "Accept-Ranges",
                              h->key.len)
              == 0
           && ngx_strlcasestrn(h->value.data, h->value.data + h->value.len,
                               (u_char *) "bytes", 5 - 1)
              != NULL;
}


static ngx_uint_t
ngx_http_singleflight_skip(ngx_table_elt_t *h)
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


/*
 * A Server or Date the origin did not send where the location passes the
 * origin's on (proxy_pass_header): nginx's upstream leaves an element
 * with no hash that headers_out points at, and the header filter then
 * adds none of its own.  It is stored as such (linked HIDDEN).
 */

static ngx_uint_t
ngx_http_singleflight_hidden(ngx_http_headers_out_t *ho, ngx_table_elt_t *h)
{
    return h->hash == 0 && (ho->server == h || ho->date == h);
}


/*
 * Is the header in a stored block?  The block's size and its writing ask
 * this one question, so that they agree.
 */

static ngx_uint_t
ngx_http_singleflight_stored(ngx_http_headers_out_t *ho, ngx_table_elt_t *h)
{
    return (h->hash != 0 || ngx_http_singleflight_hidden(ho, h))
           && !ngx_http_singleflight_skip(h);
}


/*
 * Did the fetch's headers_out point at this header?  Filters act on those
 * pointers: the header filter makes a linked Location absolute, so a
 * reader links exactly what the fetch had.
 */

static ngx_uint_t
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
ngx_http_singleflight_link(ngx_http_request_t *r, ngx_table_elt_t *h,
    ngx_uint_t linked, ngx_uint_t replace)
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

#endif

        return NGX_OK;
    }

    if (!linked) {
        return NGX_OK;
    }

    for (k = ngx_http_singleflight_known; k->name.len; k++) {
        if (h->key.len == k->name.len
            && ngx_strncasecmp(h->key.data, k->name.data, k->name.len) == 0)
        {
            ph = (ngx_table_elt_t **) ((char *) &r->headers_out + k->offset);

            if (replace && *ph != NULL) {
                (*ph)->hash = 0;
            }

            *ph = h;
            break;
        }
    }

    return NGX_OK;
}


/* an empty string may have no data pointer at all */

static u_char *
ngx_http_singleflight_put(u_char *p, ngx_str_t *s)
{
    return (s->len == 0) ? p : ngx_cpymem(p, s->data, s->len);
}


/* ------------------------------------------------------------ writing */

ngx_int_t
ngx_http_singleflight_store_append(ngx_http_singleflight_writer_t *w,
    u_char *data, size_t size)
{
    size_t                          n;
    ngx_http_singleflight_chunk_t  *chunk;

    while (size) {

        if (!w->spilled && !w->memory_full) {

            chunk = w->chunk;

            if (chunk == NULL
                || w->stored >= chunk->start + (off_t) chunk->size)
            {
                chunk = ngx_http_singleflight_store_chunk(w, size);
            }

            if (chunk != NULL) {
                n = ngx_min(size, (size_t) (chunk->start + chunk->size
                                            - w->stored));

                ngx_memcpy(chunk->data + (w->stored - chunk->start), data, n);

                w->stored += n;
                data += n;
                size -= n;

                continue;
            }

            /* the memory part is over: the rest goes to a file */
            w->memory_full = 1;
        }

        if (w->nospill) {
            /* no file, and the zone is full too: the flight is cut */
            ngx_log_error(NGX_LOG_CRIT, w->log, 0,
                          "singleflight zone \"%V\" has no room for the "
                          "body of flight %uL", &w->zone->name, w->fn->id);
            return NGX_ERROR;
        }

        if (!w->spilled && ngx_http_singleflight_store_spill(w) != NGX_OK) {
            ngx_http_singleflight_store_nospill(w);
            continue;
        }

        if (ngx_write_file(&w->file, data, size,
                           w->stored - w->fn->store.mem_len)
            != (ssize_t) size)
        {
            return NGX_ERROR;
        }

        w->stored += size;
        size = 0;
    }

    return NGX_OK;
}


/*
 * A body buffer in a file (a static file, a response an upstream kept in
 * a temporary file): at most "limit" bytes of it are copied this time, so
 * that a large file does not hold the worker; "done" says how many.
 */

ngx_int_t
ngx_http_singleflight_store_append_file(ngx_http_singleflight_writer_t *w,
    ngx_buf_t *b, size_t limit, size_t *done)
{
    u_char   buf[16384];
    off_t    left;
    size_t   n;
    ssize_t  rd;

    *done = 0;

    left = b->file_last - b->file_pos;

    while (left > 0 && *done < limit) {
        n = (size_t) ngx_min(left, (off_t) sizeof(buf));

        rd = ngx_http_singleflight_read_file(b, buf, n, b->file_pos + *done,
                                             w->log);

        if (rd != (ssize_t) n) {
            ngx_log_error(NGX_LOG_CRIT, w->log, 0,
                          "singleflight could not read the response "
                          "from \"%V\"", &b->file->name);
            return NGX_ERROR;
        }

        if (ngx_http_singleflight_store_append(w, buf, n) != NGX_OK) {
            return NGX_ERROR;
        }

        *done += n;
        left -= n;
    }

    return NGX_OK;
}


/*
 * Are the first "size" bytes of the buffer "b" (in memory or in a file)
 * those the writer stored from "offset" on?  For a response asked for
 * again whole, whose first bytes must be those the readers had (_fetch.c):
 * NGX_OK the same, NGX_DECLINED not, NGX_ERROR a file could not be read.
 */

ngx_int_t
ngx_http_singleflight_store_same_buf(ngx_http_singleflight_writer_t *w,
    off_t offset, ngx_buf_t *b, size_t size)
{
    u_char     buf[16384];
    off_t      pos;
    size_t     n;
    ngx_int_t  rc;

    if (ngx_buf_in_memory(b)) {
        return ngx_http_singleflight_store_same(w, offset, b->pos, size);
    }

    for (pos = b->file_pos; size; pos += n, offset += n, size -= n) {
        n = ngx_min(size, sizeof(buf));

        if (ngx_http_singleflight_read_file(b, buf, n, pos, w->log)
            != (ssize_t) n)
        {
            ngx_log_error(NGX_LOG_CRIT, w->log, 0,
                          "singleflight could not read the response "
                          "from \"%V\"", &b->file->name);
            return NGX_ERROR;
        }

        rc = ngx_http_singleflight_store_same(w, offset, buf, n);

        if (rc != NGX_OK) {
            return rc;
        }
    }

    return NGX_OK;
}


/* the same for bytes in memory: the zone's chunks, then the file */

static ngx_int_t
ngx_http_singleflight_store_same(ngx_http_singleflight_writer_t *w,
    off_t offset, u_char *data, size_t size)
{
    u_char                          buf[4096];
    off_t                           end;
    size_t                          n;
    ngx_http_singleflight_store_t  *st;
    ngx_http_singleflight_chunk_t  *c;

    st = &w->fn->store;

    for (c = st->first; c != NULL && size; c = c->next) {
        end = ngx_min(c->start + (off_t) c->size, st->mem_len);

        if (offset >= end) {
            continue;
        }

        n = (size_t) ngx_min((off_t) size, end - offset);

        if (ngx_memcmp(c->data + (offset - c->start), data, n) != 0) {
            return NGX_DECLINED;
        }

        offset += n;
        data += n;
        size -= n;
    }

    for ( /* void */ ; size; offset += n, data += n, size -= n) {

        if (!w->spilled || offset < st->mem_len) {
            ngx_log_error(NGX_LOG_ALERT, w->log, 0,
                          "singleflight flight %uL has no byte %O stored",
                          w->fn->id, offset);
            return NGX_ERROR;
        }

        n = ngx_min(size, sizeof(buf));

        if (ngx_read_file(&w->file, buf, n, offset - st->mem_len)
            != (ssize_t) n)
        {
            return NGX_ERROR;
        }

        if (ngx_memcmp(buf, data, n) != 0) {
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


/*
 * A file opened with directio (O_DIRECT) cannot be read into a buffer that
 * is not aligned: as nginx's own copy filter does, the flag is taken off
 * the descriptor for the read and put back after.
 */

static ssize_t
ngx_http_singleflight_read_file(ngx_buf_t *b, u_char *buf, size_t size,
    off_t offset, ngx_log_t *log)
{
    ssize_t  n;

#if (NGX_HAVE_ALIGNED_DIRECTIO)

    if (b->file->directio) {
        if (ngx_directio_off(b->file->fd) == NGX_FILE_ERROR) {
            ngx_log_error(NGX_LOG_ALERT, log, ngx_errno,
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
            ngx_log_error(NGX_LOG_ALERT, log, ngx_errno,
                          ngx_directio_on_n " \"%V\" failed",
                          &b->file->name);
        }
    }

#endif

    return n;
}


/*
 * The next chunk of the memory part.  The first is sized to the bytes of
 * the write that asks for it (at least 4K); later ones double, up to 64K,
 * or a write's bytes up to 64K; none goes past singleflight_memory.
 * NULL: the memory part is full.
 */

static ngx_http_singleflight_chunk_t *
ngx_http_singleflight_store_chunk(ngx_http_singleflight_writer_t *w,
    size_t need)
{
    size_t                          size, hdr, left;
    ngx_http_singleflight_zone_t   *zone;
    ngx_http_singleflight_chunk_t  *chunk;

    if (w->stored >= (off_t) w->memory) {
        return NULL;
    }

    left = w->memory - (size_t) w->stored;
    hdr = offsetof(ngx_http_singleflight_chunk_t, data);

    if (w->chunk == NULL) {
        size = ngx_max(need, NGX_HTTP_SINGLEFLIGHT_CHUNK_MIN);

    } else {
        size = ngx_min(w->chunk->size * 2, NGX_HTTP_SINGLEFLIGHT_CHUNK_MAX);
        size = ngx_max(size, ngx_min(need, NGX_HTTP_SINGLEFLIGHT_CHUNK_MAX));
    }

    size = ngx_min(size, left);

    if (hdr + size > ngx_pagesize / 2 && size < left) {
        /* whole slab pages */
        size = ngx_min(ngx_align(hdr + size, ngx_pagesize) - hdr, left);
    }

    zone = w->zone;

    ngx_http_singleflight_lock(zone);

    chunk = ngx_http_singleflight_alloc_locked(zone, hdr + size, NULL);

    if (chunk != NULL) {
        chunk->next = NULL;
        chunk->start = w->stored;
        chunk->size = size;

        ngx_memory_barrier();

        if (w->fn->store.last) {
            w->fn->store.last->next = chunk;

        } else {
            w->fn->store.first = chunk;
        }

        w->fn->store.last = chunk;
        w->fn->store.mem_len = w->stored + size;
    }

    ngx_http_singleflight_unlock(zone);

    /* no warning: the body goes on in the file */

    if (chunk != NULL) {
        w->chunk = chunk;
    }

    return chunk;
}


/*
 * No file can be had (singleflight_temp_path unwritable, its disk full):
 * the flight's readers must not be cut for it.  The rest of the body goes
 * on in the zone, past singleflight_memory, for as long as it has room.
 */

static void
ngx_http_singleflight_store_nospill(ngx_http_singleflight_writer_t *w)
{
    ngx_log_error(NGX_LOG_WARN, w->log, 0,
                  "singleflight flight %uL keeps its body in zone \"%V\" "
                  "past singleflight_memory: no temporary file",
                  w->fn->id, &w->zone->name);

    w->nospill = 1;
    w->memory_full = 0;
    w->memory = NGX_MAX_SIZE_T_VALUE / 2;

    (void) ngx_atomic_fetch_add(&w->zone->counters->nospill, 1);
}


/*
 * A body that can have no temporary file stays in the zone; where the
 * zone has no room for it either, its readers would be cut where the room
 * runs out, though each would have had it whole without the module.  So
 * before its header is shared, a body of known length larger than the
 * zone's free memory has a temporary file made, unnamed at once, and the
 * part past singleflight_memory, or past that free memory, reserved in it
 * (fallocate()); that room is held until the spill makes the flight's own
 * file and reserves it there
 * (let go just before: a flight checking in that instant may count on
 * it), so that flights checking meanwhile each count only what is left.
 * Without fallocate(), the disk's free space is looked at instead.
 * NGX_DECLINED: neither could hold it, and the response is its leader's
 * alone.  The zone's free memory is an estimate (read without the lock):
 * a body that then finds no room is cut as before, but a disk already
 * full or unwritable, with a zone too small, no longer cuts anybody.
 */

ngx_int_t
ngx_http_singleflight_store_room(ngx_http_singleflight_writer_t *w)
{
    off_t          room;
    ngx_int_t      rc;
    ngx_uint_t     warn;
    ngx_file_t     file;
#if (NGX_LINUX)
    off_t          need;
    ngx_err_t      err;
    struct statfs  fs;
#endif

    if (w->length <= 0) {
        /* none, or of unknown length: cut if it finds no room (design.md) */
        return NGX_OK;
    }

    /*
     * what the zone's free pages hold of this body: less a chunk, as the
     * last one it asks for (up to 64K, whole pages) may not fit in them
     */

    room = (off_t) (w->zone->shpool->pfree << ngx_pagesize_shift)
           - (off_t) ngx_align((size_t) ngx_min(w->length,
                                   (off_t) NGX_HTTP_SINGLEFLIGHT_CHUNK_MAX)
                               + offsetof(ngx_http_singleflight_chunk_t,
                                          data),
                               ngx_pagesize);

    if (w->length <= room) {
        return NGX_OK;
    }

    ngx_memzero(&file, sizeof(ngx_file_t));
    file.fd = NGX_INVALID_FILE;
    file.log = w->log;

    if (w->temp_path == NULL
        || ngx_create_temp_file(&file, w->temp_path, w->pool, 1, 0, 0600)
           != NGX_OK)
    {
        rc = NGX_DECLINED;

    } else {
        rc = NGX_OK;

        /* nameless: what it holds goes with its descriptor */

        if (ngx_delete_file(file.name.data) == NGX_FILE_ERROR) {
            ngx_log_error(NGX_LOG_CRIT, w->log, ngx_errno,
                          ngx_delete_file_n " \"%V\" failed", &file.name);
        }

#if (NGX_LINUX)
        /*
         * what goes past singleflight_memory, or past the zone's free
         * memory when that is less, goes to the file
         */
        need = w->length - ngx_max(ngx_min((off_t) w->memory, room), 0);

        if (fallocate(file.fd, 0, 0, need) == 0) {
            /*
             * the room, held until the spill makes the flight's file, so
             * that another flight checking meanwhile does not count on it
             */
            w->held = file.fd;
            w->holding = 1;
            return NGX_OK;

        } else {
            err = ngx_errno;

            if (err != NGX_EOPNOTSUPP && err != NGX_ENOSYS
                && err != NGX_EINVAL)
            {
                rc = NGX_DECLINED;

            } else if (fstatfs(file.fd, &fs) == 0
                       && (off_t) fs.f_bavail * (off_t) fs.f_bsize < need)
            {
                /* nothing to reserve with: the free space, as it is */
                rc = NGX_DECLINED;
            }
        }
#endif

        ngx_pool_run_cleanup_file(w->pool, file.fd);
    }

    if (rc == NGX_OK) {
        return NGX_OK;
    }

    /* at most once a minute, as "is full" */

    ngx_http_singleflight_lock(w->zone);
    warn = ngx_http_singleflight_nomem_locked(w->zone);
    ngx_http_singleflight_unlock(w->zone);

    if (warn) {
        ngx_log_error(NGX_LOG_WARN, w->log, 0,
                      "singleflight flight %uL is not shared: its %O bytes "
                      "have no room in zone \"%V\" nor on the disk of its "
                      "temporary files", w->fn->id, w->length,
                      &w->zone->name);
    }

    return NGX_DECLINED;
}


/* the memory part is over: the temporary file, named for the readers */

static ngx_int_t
ngx_http_singleflight_store_spill(ngx_http_singleflight_writer_t *w)
{
    u_char                        *name;
    ngx_uint_t                     nomem;
    ngx_http_singleflight_zone_t  *zone;

    /* the room held since the header, for the file's own (reserve()) */
    ngx_http_singleflight_store_unroom(w);

    w->file.fd = NGX_INVALID_FILE;
    w->file.log = w->log;

    /* persistent: the file outlives its descriptor, until the flight goes */

    if (w->temp_path == NULL
        || ngx_create_temp_file(&w->file, w->temp_path, w->pool, 1, 0, 0600)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_singleflight_store_reserve(w) != NGX_OK) {
        (void) ngx_delete_file(w->file.name.data);
        return NGX_ERROR;
    }

    zone = w->zone;

    ngx_http_singleflight_lock(zone);

    if (w->file.name.len < w->fn->store.file_room) {
        /* the room that came with the node, after its key */
        name = w->fn->key + w->fn->key_len;

    } else {
        name = ngx_http_singleflight_alloc_locked(zone, w->file.name.len + 1,
                                                  &nomem);
    }

    if (name != NULL) {
        ngx_memcpy(name, w->file.name.data, w->file.name.len);
        name[w->file.name.len] = '\0';

        w->fn->store.file = name;
        w->fn->store.file_len = w->file.name.len;
        w->fn->store.mem_len = w->stored;
    }

    ngx_http_singleflight_unlock(zone);

    if (name == NULL) {
        ngx_log_error(NGX_LOG_CRIT, w->log, 0,
                      "singleflight zone \"%V\" has no room for a file name",
                      &zone->name);

        (void) ngx_delete_file(w->file.name.data);
        return NGX_ERROR;
    }

    if (zone->shm_zone == NULL) {
        ngx_http_singleflight_store_unname(w);
    }

    (void) ngx_atomic_fetch_add(&zone->counters->spilled, 1);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, w->log, 0,
                   "singleflight flight %uL spills to \"%V\"",
                   w->fn->id, &w->file.name);

    w->spilled = 1;

    return NGX_OK;
}


/*
 * scope=worker: all the readers of the flight are in this worker, and the
 * zone dies with it.  The flight keeps a descriptor of its own and the
 * name goes at once, so that a worker killed leaves no file behind (its
 * replacement cannot know the names); readers duplicate the descriptor.
 * Without one, the file keeps its name and goes with the flight.
 */

/*
 * The rest of a body of known length gets its room on disk now, while the
 * flight can still keep it in the zone instead: a disk that fills up
 * later cannot cut it.  fallocate() itself, not posix_fallocate(): where
 * the file system has none (NFSv3, ext2, older ZFS), glibc's stand-in
 * writes the whole length, in the worker, before anything else runs; the
 * room is then not reserved.
 */

static ngx_int_t
ngx_http_singleflight_store_reserve(ngx_http_singleflight_writer_t *w)
{
#if (NGX_LINUX)
    off_t      len;
    ngx_err_t  err;

    if (w->length <= w->stored) {
        return NGX_OK;
    }

    len = w->length - w->stored;

    if (fallocate(w->file.fd, 0, 0, len) == 0) {
        return NGX_OK;
    }

    err = ngx_errno;

    if (err != NGX_EOPNOTSUPP && err != NGX_ENOSYS && err != NGX_EINVAL) {
        ngx_log_error(NGX_LOG_CRIT, w->log, err,
                      "fallocate(\"%V\", %O) failed", &w->file.name, len);
        return NGX_ERROR;
    }
#endif

    return NGX_OK;
}


static void
ngx_http_singleflight_store_unname(ngx_http_singleflight_writer_t *w)
{
    ngx_fd_t                        fd;
    ngx_http_singleflight_store_t  *st;

    st = &w->fn->store;

    fd = dup(w->file.fd);

    if (fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_CRIT, w->log, ngx_errno,
                      "dup() of \"%V\" failed", &w->file.name);
        return;
    }

    if (ngx_delete_file(w->file.name.data) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_CRIT, w->log, ngx_errno,
                      ngx_delete_file_n " \"%V\" failed", &w->file.name);
        (void) ngx_close_file(fd);
        return;
    }

    st->fd = fd;
    st->has_fd = 1;
}


void
ngx_http_singleflight_store_close(ngx_http_singleflight_writer_t *w)
{
    /* the file's descriptor is closed with the fetch's pool */
    w->chunk = NULL;

    ngx_http_singleflight_store_unroom(w);
}


/*
 * The room store_room() held on the disk goes: the spill reserves its own,
 * or the response is no longer stored (its leader's alone, its fetch over)
 */

void
ngx_http_singleflight_store_unroom(ngx_http_singleflight_writer_t *w)
{
    if (w->holding) {
        w->holding = 0;
        ngx_pool_run_cleanup_file(w->pool, w->held);
    }
}


/*
 * A writer for the store of a flight whose fetch is gone mid-body (its
 * worker died, or its leader's own upstream broke off), to go on at
 * "from" (what the flight published): in the last chunk, or in the
 * temporary file, opened again.  Bytes the gone fetch wrote past "from"
 * were never published, and are written over.  NGX_DECLINED: the store
 * cannot be gone on with here (the fetch had begun a chunk or a file past
 * what it published); NGX_ERROR: the file could not be opened.  The
 * caller set the writer's zone, flight, memory, length, path, pool and
 * log.
 */

ngx_int_t
ngx_http_singleflight_store_adopt(ngx_http_singleflight_writer_t *w,
    off_t from)
{
    ngx_pool_cleanup_t              *cln;
    ngx_pool_cleanup_file_t         *clnf;
    ngx_http_singleflight_store_t   *st;
    ngx_http_singleflight_chunk_t   *last;

    st = &w->fn->store;
    last = st->last;
    w->stored = from;

    if (st->file == NULL) {
        if (last == NULL ? from != 0
                         : from < last->start
                           || from > last->start + (off_t) last->size)
        {
            return NGX_DECLINED;
        }

        w->chunk = last;
        return NGX_OK;
    }

    if (from < st->mem_len) {
        return NGX_DECLINED;
    }

    cln = ngx_pool_cleanup_add(w->pool, sizeof(ngx_pool_cleanup_file_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    /*
     * Read too: a response asked for again is compared with it.  With
     * scope=worker the file has no name, but its flight's descriptor is
     * in this worker: the adopting reader is this worker's too.
     */

    if (st->has_fd) {
        w->file.fd = dup(st->fd);

    } else {
        w->file.fd = ngx_open_file(st->file, NGX_FILE_RDWR, NGX_FILE_OPEN,
                                   0);
    }

    if (w->file.fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_CRIT, w->log, ngx_errno,
                      "%s \"%s\" failed",
                      st->has_fd ? "dup()" : ngx_open_file_n, st->file);
        return NGX_ERROR;
    }

    w->file.name.data = st->file;
    w->file.name.len = st->file_len;
    w->file.log = w->log;
    w->spilled = 1;

    cln->handler = ngx_pool_cleanup_file;
    clnf = cln->data;
    clnf->fd = w->file.fd;
    clnf->name = st->file;
    clnf->log = w->log;

    return NGX_OK;
}


/* ------------------------------------------------------------ reading */

/*
 * The next bytes for a reader, from its offset up to "upto" (what the
 * flight has published), at most "limit": buffers pointing into the
 * zone's chunks, and a file buffer for what is in the file.
 */

ngx_chain_t *
ngx_http_singleflight_store_read(ngx_http_request_t *r,
    ngx_http_singleflight_cursor_t *cur, off_t upto, size_t limit)
{
    off_t                           end, n;
    ngx_buf_t                      *b;
    ngx_chain_t                    *out, **ll, *cl;
    ngx_http_singleflight_chunk_t  *chunk;
    ngx_http_singleflight_store_t  *st;

    st = &cur->fn->store;

    end = ngx_min(upto, cur->offset + (off_t) limit);

    out = NULL;
    ll = &out;

    while (cur->offset < end) {

        chunk = cur->chunk ? cur->chunk : st->first;

        while (chunk && cur->offset >= chunk->start + (off_t) chunk->size) {
            chunk = chunk->next;
        }

        cl = ngx_chain_get_free_buf(r->pool, &cur->free);
        if (cl == NULL) {
            return NGX_CHAIN_ERROR;
        }

        b = cl->buf;
        ngx_memzero(b, sizeof(ngx_buf_t));
        b->tag = (ngx_buf_tag_t) &ngx_http_singleflight_module;

        if (chunk != NULL && cur->offset >= chunk->start) {
            cur->chunk = chunk;

            n = ngx_min(end, chunk->start + (off_t) chunk->size) - cur->offset;

            /* read-only memory of the zone: filters that change it copy it */

            b->memory = 1;
            b->pos = chunk->data + (cur->offset - chunk->start);
            b->last = b->pos + n;

        } else {
            if (cur->file == NULL && ngx_http_singleflight_open(r, cur)
                                     != NGX_OK)
            {
                return NGX_CHAIN_ERROR;
            }

            n = end - cur->offset;

            b->in_file = 1;
            b->file = cur->file;
            b->file_pos = cur->offset - st->mem_len;
            b->file_last = b->file_pos + n;
        }

        cur->offset += n;

        *ll = cl;
        ll = &cl->next;
    }

    *ll = NULL;

    return out;
}


static ngx_int_t
ngx_http_singleflight_open(ngx_http_request_t *r,
    ngx_http_singleflight_cursor_t *cur)
{
    ngx_file_t                *file;
    ngx_pool_cleanup_t        *cln;
    ngx_pool_cleanup_file_t   *clnf;
    ngx_http_singleflight_store_t  *st;

    st = &cur->fn->store;

    if (st->file == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "singleflight flight %uL has bytes past its memory "
                      "and no file", cur->fn->id);
        return NGX_ERROR;
    }

    file = ngx_pcalloc(r->pool, sizeof(ngx_file_t));
    if (file == NULL) {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_pool_cleanup_file_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    file->name.data = st->file;
    file->name.len = st->file_len;
    file->log = r->connection->log;

    if (st->has_fd) {
        file->fd = dup(st->fd);

        if (file->fd == NGX_INVALID_FILE) {
            ngx_log_error(NGX_LOG_CRIT, r->connection->log, ngx_errno,
                          "dup() of \"%s\" failed", st->file);
            return NGX_ERROR;
        }

    } else {
        file->fd = ngx_open_file(st->file, NGX_FILE_RDONLY, NGX_FILE_OPEN,
                                 0);

        if (file->fd == NGX_INVALID_FILE) {
            ngx_log_error(NGX_LOG_CRIT, r->connection->log, ngx_errno,
                          ngx_open_file_n " \"%s\" failed", st->file);
            return NGX_ERROR;
        }
    }

    cln->handler = ngx_pool_cleanup_file;
    clnf = cln->data;
    clnf->fd = file->fd;
    clnf->name = st->file;
    clnf->log = r->pool->log;

    cur->file = file;

    return NGX_OK;
}


/* ------------------------------------------------------------ trailers */

/*
 * The origin's trailers as nginx passes them on to a client (pass_trailers,
 * but the hidden ones), for the flight's readers: a block of their count,
 * then per trailer the key's and the value's lengths and bytes.  NULL
 * where there are none.
 */

u_char *
ngx_http_singleflight_store_trailers(ngx_http_request_t *r, size_t *len)
{
    u_char               *block, *p;
    size_t                n, size;
    ngx_uint_t            i, pass;
    ngx_list_part_t      *part;
    ngx_table_elt_t      *h;
    ngx_http_upstream_t  *u;

    u = r->upstream;

    if (u == NULL || !u->conf->pass_trailers) {
        return NULL;
    }

    block = NULL;
    size = 0;

    /* the size, then the block */

    for (pass = 0; pass < 2; pass++) {
        n = 0;
        p = (pass == 0) ? NULL : block + sizeof(size_t);

        for (part = &u->headers_in.trailers.part; part; part = part->next) {
            h = part->elts;

            for (i = 0; i < part->nelts; i++) {
                if (ngx_hash_find(&u->conf->hide_headers_hash, h[i].hash,
                                  h[i].lowcase_key, h[i].key.len))
                {
                    continue;
                }

                n++;

                if (pass == 0) {
                    size += 2 * sizeof(size_t) + h[i].key.len
                            + h[i].value.len;
                    continue;
                }

                p = ngx_cpymem(p, &h[i].key.len, sizeof(size_t));
                p = ngx_cpymem(p, &h[i].value.len, sizeof(size_t));
                p = ngx_cpymem(p, h[i].key.data, h[i].key.len);
                p = ngx_cpymem(p, h[i].value.data, h[i].value.len);
            }
        }

        if (n == 0) {
            return NULL;
        }

        if (pass == 0) {
            size += sizeof(size_t);

            block = ngx_palloc(r->pool, size);
            if (block == NULL) {
                return NULL;
            }
        }
    }

    ngx_memcpy(block, &n, sizeof(size_t));
    *len = size;

    return block;
}


/*
 * A reader's copy of the stored trailers, sent after its last byte by its
 * own filters (chunked, HTTP/2), before those of add_trailer, as without
 * the module.
 */

ngx_int_t
ngx_http_singleflight_store_restore_trailers(ngx_http_request_t *r,
    u_char *block)
{
    u_char           *p;
    size_t            n, key_len, value_len;
    ngx_uint_t        i;
    ngx_table_elt_t  *h;

    ngx_memcpy(&n, block, sizeof(size_t));
    p = block + sizeof(size_t);

    for (i = 0; i < n; i++) {
        ngx_memcpy(&key_len, p, sizeof(size_t));
        p += sizeof(size_t);
        ngx_memcpy(&value_len, p, sizeof(size_t));
        p += sizeof(size_t);

        h = ngx_list_push(&r->headers_out.trailers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        h->key.data = ngx_pnalloc(r->pool, 2 * key_len + value_len);
        if (h->key.data == NULL) {
            return NGX_ERROR;
        }

        h->hash = 1;
#if (nginx_version >= 1023000)
        h->next = NULL;
#endif
        h->key.len = key_len;
        ngx_memcpy(h->key.data, p, key_len);
        h->lowcase_key = h->key.data + key_len;
        ngx_strlow(h->lowcase_key, p, key_len);
        h->value.len = value_len;
        h->value.data = h->lowcase_key + key_len;
        ngx_memcpy(h->value.data, p + key_len, value_len);

        p += key_len + value_len;
    }

    return NGX_OK;
}


/* ------------------------------------------------------------ freeing */

/*
 * Under the lock, as the flight is freed: its memory goes back to the
 * zone, and the name of its file is copied to "file" (NGX_MAX_PATH) for
 * the caller to remove after unlocking.  Returns 1 if there is a file.
 */

ngx_uint_t
ngx_http_singleflight_store_free_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, u_char *file)
{
    ngx_http_singleflight_store_t  *st = &fn->store;

    ngx_uint_t                      has_file;
    ngx_http_singleflight_chunk_t  *cl, *next;

    for (cl = st->first; cl; cl = next) {
        next = cl->next;
        ngx_slab_free_locked(zone->shpool, cl);
    }

    if (st->header) {
        ngx_slab_free_locked(zone->shpool, st->header);
    }

    if (st->predict) {
        ngx_slab_free_locked(zone->shpool, st->predict);
    }

    if (st->failure) {
        ngx_slab_free_locked(zone->shpool, st->failure);
    }

    if (st->trailers) {
        ngx_slab_free_locked(zone->shpool, st->trailers);
    }

    has_file = 0;

    if (st->has_fd) {
        /* scope=worker: the name is gone already */
        (void) ngx_close_file(st->fd);

    } else if (st->file && st->file_len < NGX_MAX_PATH) {
        ngx_memcpy(file, st->file, st->file_len + 1);
        has_file = 1;
    }

    if (st->file && st->file != fn->key + fn->key_len) {
        ngx_slab_free_locked(zone->shpool, st->file);
    }

    ngx_memzero(st, sizeof(ngx_http_singleflight_store_t));

    return has_file;
}


/*
 * Files left by a previous run (nginx was killed as a whole): at the
 * first start, every temporary file under the temporary path is stale.
 * Only nginx's temporary files (ngx_create_temp_file(): ten digits) go:
 * a path shared by mistake with other files (a cache's) keeps those.
 */

void
ngx_http_singleflight_store_sweep(ngx_path_t *path, ngx_log_t *log)
{
    ngx_tree_ctx_t  tree;

    tree.init_handler = NULL;
    tree.file_handler = ngx_http_singleflight_sweep_file;
    tree.pre_tree_handler = ngx_http_singleflight_sweep_noop;
    tree.post_tree_handler = ngx_http_singleflight_sweep_noop;
    tree.spec_handler = ngx_http_singleflight_sweep_noop;
    tree.data = NULL;
    tree.alloc = 0;
    tree.log = log;

    (void) ngx_walk_tree(&tree, &path->name);
}


static ngx_int_t
ngx_http_singleflight_sweep_file(ngx_tree_ctx_t *ctx, ngx_str_t *path)
{
    u_char  *p, *name;

    name = path->data + path->len;

    while (name > path->data && name[-1] != '/') {
        name--;
    }

    for (p = name; p < path->data + path->len; p++) {
        if (*p < '0' || *p > '9') {
            return NGX_OK;
        }
    }

    if (p - name != 10) {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_NOTICE, ctx->log, 0,
                  "singleflight removes stale file \"%s\"", path->data);

    if (ngx_delete_file(path->data) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_CRIT, ctx->log, ngx_errno,
                      ngx_delete_file_n " \"%s\" failed", path->data);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_sweep_noop(ngx_tree_ctx_t *ctx, ngx_str_t *path)
{
    return NGX_OK;
}
