/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The store: a flight's response as the fetch captures it, read by every
 * reader by offset while it grows.  The header is one block in the zone;
 * the body's first bytes go to chunks in the zone, up to singleflight_memory
 * (or until the zone has no room), the rest to a temporary file.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_STORE_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_STORE_H_INCLUDED_


#include "ngx_http_singleflight.h"


/* what a header block says beyond the response itself */
#define NGX_HTTP_SINGLEFLIGHT_H_RESUMABLE  0x04  /* its rest may be asked
                                                    for by any worker */
#define NGX_HTTP_SINGLEFLIGHT_H_WHOLE      0x08  /* or all of it again, its
                                                    first bytes compared */

/* the credentials of requests it may go to (_share.c): Cookie, and others */
#define NGX_HTTP_SINGLEFLIGHT_H_CREDS(creds)  ((creds) << 4)
#define NGX_HTTP_SINGLEFLIGHT_H_COOKIE                                        \
    NGX_HTTP_SINGLEFLIGHT_H_CREDS(NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE)
#define NGX_HTTP_SINGLEFLIGHT_H_AUTH                                          \
    NGX_HTTP_SINGLEFLIGHT_H_CREDS(NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH)


/* the fixed part of a header block */
typedef struct {
    ngx_uint_t                       status;
    off_t                            content_length_n;
    time_t                           last_modified_time;
    size_t                           status_line_len;
    size_t                           content_type_len;  /* the whole value */
    size_t                           content_type_base; /* before "; ..." */
    size_t                           charset_len;
    ngx_uint_t                       nheaders;
    size_t                           vary_offset;       /* from the block */
    ngx_uint_t                       nvary;
    size_t                           upstream_offset;   /* from the block */
    ngx_uint_t                       nupstream;   /* the origin's headers */
    ngx_uint_t                       cache_status;      /* the fetch's */
    ngx_uint_t                       flags;
    void                           **loc_conf;    /* where it was made */
    ngx_http_singleflight_moved_t    moved;       /* and its URI there */
    unsigned                         allow_ranges:1;
    unsigned                         accept_ranges:1;   /* bytes */
    unsigned                         no_conditionals:1; /* its handler's
                                                    disable_not_modified */
    unsigned                         buffered:1;  /* by nginx's upstream,
                                                     which flushes nothing
                                                     before the end */
    ngx_int_t                        limit_rate;  /* X-Accel-Limit-Rate
                                                     applied, or -1 */
} ngx_http_singleflight_header_t;


/* the fetch's side of a store */
typedef struct {
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;
    ngx_http_singleflight_chunk_t   *chunk;       /* appending here */
    off_t                            stored;      /* bytes written */
    size_t                           memory;      /* singleflight_memory */
    off_t                            length;      /* expected, -1 unknown */
    ngx_path_t                      *temp_path;
    ngx_file_t                       file;
    ngx_fd_t                         held;        /* room on the disk, kept
                                                     until the spill */
    ngx_pool_t                      *pool;        /* closes the files */
    ngx_log_t                       *log;
    unsigned                         holding:1;   /* "held" is open */
    unsigned                         spilled:1;
    unsigned                         memory_full:1;
    unsigned                         nospill:1;   /* no file: all in zone */
} ngx_http_singleflight_writer_t;


u_char *ngx_http_singleflight_store_serialize(ngx_http_request_t *r,
    ngx_http_singleflight_where_t *where, ngx_array_t *vary,
    ngx_uint_t flags, size_t *len);
void ngx_http_singleflight_store_location(ngx_http_request_t *r,
    void **loc_conf);
size_t ngx_http_singleflight_store_failure_size(
    ngx_http_singleflight_where_t *where);
void ngx_http_singleflight_store_put_failure(u_char *block, size_t len,
    ngx_http_singleflight_where_t *where);
ngx_int_t ngx_http_singleflight_store_restore_failure(ngx_http_request_t *r,
    u_char *block);
ngx_int_t ngx_http_singleflight_store_move(ngx_http_request_t *r,
    ngx_http_singleflight_moved_t *m, u_char *uri, u_char *args);
ngx_uint_t ngx_http_singleflight_store_unconditional(ngx_http_request_t *r);
ngx_uint_t ngx_http_singleflight_store_cache(ngx_http_request_t *r);
ngx_int_t ngx_http_singleflight_store_limit_rate(ngx_http_request_t *r);
void ngx_http_singleflight_store_put_vary(u_char *block, u_char *p,
    ngx_str_t *pairs, ngx_uint_t nvary);
void ngx_http_singleflight_store_parse(u_char *block,
    ngx_http_singleflight_header_t *hdr);
ngx_uint_t ngx_http_singleflight_store_resumable(u_char *block);
ngx_int_t ngx_http_singleflight_store_find(u_char *block, char *lowcase,
    ngx_str_t *value);
ngx_uint_t ngx_http_singleflight_store_ranges(ngx_list_t *headers);
void ngx_http_singleflight_store_allow_ranges(ngx_http_request_t *r,
    ngx_uint_t allowed, ngx_uint_t taken);
ngx_uint_t ngx_http_singleflight_store_unrangeable(ngx_http_request_t *r,
    u_char *block);
ngx_uint_t ngx_http_singleflight_store_uncut(ngx_uint_t status, off_t length,
    ngx_uint_t ranges);
void ngx_http_singleflight_store_init(ngx_conf_t *cf);
ngx_int_t ngx_http_singleflight_store_upstream(ngx_http_request_t *r,
    u_char *block);
ngx_int_t ngx_http_singleflight_store_restore(ngx_http_request_t *r,
    u_char *block, ngx_uint_t range_sent);

u_char *ngx_http_singleflight_store_trailers(ngx_http_request_t *r,
    size_t *len);
ngx_int_t ngx_http_singleflight_store_restore_trailers(ngx_http_request_t *r,
    u_char *block);

ngx_int_t ngx_http_singleflight_store_room(
    ngx_http_singleflight_writer_t *w);
ngx_int_t ngx_http_singleflight_store_append(
    ngx_http_singleflight_writer_t *w, u_char *data, size_t size);
ngx_int_t ngx_http_singleflight_store_append_file(
    ngx_http_singleflight_writer_t *w, ngx_buf_t *b, size_t limit,
    size_t *done);
ngx_int_t ngx_http_singleflight_store_same_buf(
    ngx_http_singleflight_writer_t *w, off_t offset, ngx_buf_t *b,
    size_t size);
void ngx_http_singleflight_store_close(ngx_http_singleflight_writer_t *w);
void ngx_http_singleflight_store_unroom(ngx_http_singleflight_writer_t *w);
ngx_int_t ngx_http_singleflight_store_adopt(
    ngx_http_singleflight_writer_t *w, off_t from);

ngx_chain_t *ngx_http_singleflight_store_read(ngx_http_request_t *r,
    ngx_http_singleflight_cursor_t *cur, off_t upto, size_t limit);

ngx_uint_t ngx_http_singleflight_store_free_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    u_char *file);
void ngx_http_singleflight_store_sweep(ngx_path_t *path, ngx_log_t *log);


#endif /* _NGX_HTTP_SINGLEFLIGHT_STORE_H_INCLUDED_ */
