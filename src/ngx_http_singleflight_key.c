/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The flight key: what makes two requests the same.
 *
 * Two requests share a flight only if the location's content handler
 * would send the same upstream request for both.  So a key is made of
 * what decides that, which the configured singleflight_key only adds to:
 *
 *   a class byte: 'G' for GET, 'H' for HEAD, 'M' for other methods, and
 *   for those the method's name (a HEAD request may still follow a GET
 *   flight, see _flight.c; a POST never joins a GET flight);
 *
 *   whether the request skips the location's cache (proxy_cache_bypass):
 *   such a request shares only with others that do, and a hit never
 *   waits for its origin;
 *
 *   the identity: the configuration generation, the location block (its
 *   configuration, not its name), the server block and the port the
 *   request came in on, and the
 *   URI the content handler sees: the original one as the client sent
 *   it while no rewrite changed it (proxy_pass sends it as it is), the
 *   effective URI and arguments after a rewrite;
 *
 *   the value of singleflight_key ($scheme$host by default).
 *
 * Keys may hold any bytes and be of any length: they are compared in
 * full.  The tree is ordered by a hash of the singleflight_key value
 * alone, so that singleflight_forget finds every flight of a value,
 * whatever its location.
 */


#include "ngx_http_singleflight_key.h"
#include <ngx_sha1.h>


/*
 * Blocks are told apart by their addresses, and an address means nothing
 * in another configuration: after a reload the master frees the previous
 * configuration while its workers still finish their flights, and a
 * later one may reuse its memory.  So every configuration gets its own
 * random generation, set in the master before its workers are forked, and
 * a flight never crosses a reload (the old workers' followers are served
 * by their flight, the new workers start their own).
 */

static uint64_t  ngx_http_singleflight_generation;


/* hash64()'s multiplier */
#define NGX_HTTP_SINGLEFLIGHT_HASH_M  0x9fb21c651e98df25ULL


static size_t ngx_http_singleflight_key_identity_len(ngx_http_request_t *r);
static u_char *ngx_http_singleflight_key_identity(ngx_http_request_t *r,
    u_char *p);
static uint64_t ngx_http_singleflight_hash64_more(uint64_t h, u_char *data,
    size_t len);
static uint64_t ngx_http_singleflight_hash64_end(uint64_t h);


void
ngx_http_singleflight_key_init_generation(void)
{
    ngx_http_singleflight_generation =
        ((uint64_t) ngx_random() << 32)
        ^ ((uint64_t) ngx_random() << 8)
        ^ ((uint64_t) ngx_pid << 16)
        ^ (uint64_t) ngx_current_msec;
}


/* the key from its value, and the tree's hash */

ngx_int_t
ngx_http_singleflight_key_make(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value)
{
    u_char      *p, *v, class;
    size_t       len;
    ngx_str_t    method, *range;

    ngx_str_null(&method);

    if (r->method == NGX_HTTP_GET) {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_GET;

    } else if (r->method == NGX_HTTP_HEAD) {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD;

    } else {
        class = NGX_HTTP_SINGLEFLIGHT_CLASS_OTHER;
        method = r->method_name;
    }

    len = ngx_http_singleflight_key_identity_len(r);

    /* a Range the fetch sends (range_sent), after the URI (which has no NUL) */

    range = ctx->range_sent ? &r->headers_in.range->value : NULL;

    if (range != NULL) {
        len += 1 + range->len;
    }

    /* class, method name, ' ' or '\1', the identity's length, identity, value */

    ctx->key.len = 1 + method.len + 1 + sizeof(size_t) + len
                   + value[0].len + value[1].len;

    ctx->key.data = ngx_pnalloc(r->pool, ctx->key.len);
    if (ctx->key.data == NULL) {
        return NGX_ERROR;
    }

    p = ctx->key.data;
    *p++ = class;

    if (method.len) {
        p = ngx_cpymem(p, method.data, method.len);
    }

    /* no method has a control character: skips_cache, keys of their own */
    *p++ = ctx->skips_cache ? '\1' : ' ';
    p = ngx_cpymem(p, &len, sizeof(size_t));
    p = ngx_http_singleflight_key_identity(r, p);

    if (range != NULL) {
        *p++ = '\0';
        p = ngx_cpymem(p, range->data, range->len);
    }

    v = p;
    p = ngx_cpymem(p, value[0].data, value[0].len);

    if (value[1].len) {
        p = ngx_cpymem(p, value[1].data, value[1].len);
    }

    /* the tree's hash, of the value alone: the same for GET and HEAD */

    ctx->hash = ngx_murmur_hash2(v, p - v);

    return NGX_OK;
}


/*
 * singleflight_lone direct: a 64-bit hash of what a request's key is made
 * of, taken from the request without making the key, for its slot
 * (_zone.h).  Not the hash of the key's bytes: every request of such a
 * location takes its slot by this one, and requests with one key have one
 * sketch.  (Two keys of one sketch, which the 64 bits make rare, only
 * make the second request look for a flight.)  The configuration's
 * generation is left out of the slot, chosen by the low bits (_zone.h):
 * slots are counted across reloads alike.  It is in the top 16 bits, the
 * slot's mark, so that a flight of a new configuration does not wait for
 * the header of a request of the old one, which could not feed it.  The
 * port is in, as in the key: a flight of another port would wait for a
 * header that cannot feed it.
 */

uint64_t
ngx_http_singleflight_key_sketch(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_str_t *value)
{
    uint64_t             h;
    struct sockaddr_in  *sin;

    /*
     * the location, by its configuration of this module: each location
     * has its own, and a location is in one server
     */

    h = (uint64_t) (uintptr_t) ctx->conf ^ r->method;

    /*
     * the port, in network order: sin_port and sin6_port are at one
     * offset; a unix socket has none (its path's bytes there), as in the
     * key
     */

    sin = (struct sockaddr_in *) r->connection->local_sockaddr;

    if (sin->sin_family != AF_UNIX) {
        h ^= (uint64_t) sin->sin_port << 48;
    }

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_HEAD) {
        h = ngx_http_singleflight_hash64_more(h, r->method_name.data,
                                              r->method_name.len);
    }

    /* the URI and arguments as the key has them (key_identity()) */

    if (r->valid_unparsed_uri) {
        h = ngx_http_singleflight_hash64_more(h, r->unparsed_uri.data,
                                              r->unparsed_uri.len);

    } else {
        h = ngx_http_singleflight_hash64_more(h, r->uri.data, r->uri.len);

        if (r->args.len) {
            h = ngx_http_singleflight_hash64_more(h, r->args.data,
                                                  r->args.len);
        }
    }

    if (ctx->range_sent) {
        h = ngx_http_singleflight_hash64_more(h,
                                         r->headers_in.range->value.data,
                                         r->headers_in.range->value.len);
    }

    if (ctx->conf->key_default) {
        /* "http" or "https": told apart by their lengths */
        h ^= (uint64_t) value[0].len << 56;

    } else {
        h = ngx_http_singleflight_hash64_more(h, value[0].data, value[0].len);
    }

    h = ngx_http_singleflight_hash64_more(h, value[1].data, value[1].len);

    if (ctx->skips_cache) {
        /* a slot of its own: a hit does not wait for its header */
        h = ~h;
    }

    return ngx_http_singleflight_hash64_end(h)
           ^ (ngx_http_singleflight_generation & ((uint64_t) 0xffff << 48));
}


/*
 * A request's identity in its key: this configuration's generation, its
 * location and server, the port, and the URI with its arguments as the
 * client sent them.  Its length first.
 */

static size_t
ngx_http_singleflight_key_identity_len(ngx_http_request_t *r)
{
    size_t  len;

    len = sizeof(uint64_t) + 2 * sizeof(void *) + sizeof(in_port_t);

    if (r->valid_unparsed_uri) {
        return len + r->unparsed_uri.len;
    }

    return len + r->uri.len + 1 + r->args.len;
}


static u_char *
ngx_http_singleflight_key_identity(ngx_http_request_t *r, u_char *p)
{
    in_port_t                  port;
    ngx_http_core_loc_conf_t  *clcf;
    ngx_http_core_srv_conf_t  *cscf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    cscf = ngx_http_get_module_srv_conf(r, ngx_http_core_module);

    /*
     * the port, not the listening socket: HTTP/1.1, HTTP/2 and HTTP/3
     * clients of one server on port 443 are the same to its locations
     */
    port = ngx_inet_get_port(r->connection->local_sockaddr);

    p = ngx_cpymem(p, &ngx_http_singleflight_generation, sizeof(uint64_t));
    p = ngx_cpymem(p, &clcf, sizeof(void *));
    p = ngx_cpymem(p, &cscf, sizeof(void *));
    p = ngx_cpymem(p, &port, sizeof(in_port_t));

    if (r->valid_unparsed_uri) {
        return ngx_cpymem(p, r->unparsed_uri.data, r->unparsed_uri.len);
    }

    p = ngx_cpymem(p, r->uri.data, r->uri.len);
    *p++ = '?';

    if (r->args.len) {
        p = ngx_cpymem(p, r->args.data, r->args.len);
    }

    return p;
}


/*
 * A 64-bit hash of the whole key, for the private marks: the length
 * first, then eight bytes at a time, each word xored into the hash turned
 * by 23 bits and the sum multiplied (the turn brings high bits down, the
 * product takes low ones up), the last eight bytes (or all of a shorter
 * key) last, and a final mix.  key_sketch() hashes several parts the same
 * way before its final mix.  Not for an adversary: a collision only makes
 * a request go upstream on its own, or look for a flight.
 */

uint64_t
ngx_http_singleflight_hash64(u_char *data, size_t len)
{
    return ngx_http_singleflight_hash64_end(
               ngx_http_singleflight_hash64_more(0x6a09e667f3bcc908ULL,
                                                 data, len));
}


/* the words of one more part, for a hash of several: hash64_end() last */

static ngx_inline uint64_t
ngx_http_singleflight_hash64_more(uint64_t h, u_char *data, size_t len)
{
    size_t    i;
    uint64_t  w;

    h ^= len;

    if (len < 8) {
        w = 0;

        for (i = 0; i < len; i++) {
            w |= (uint64_t) data[i] << (i * 8);
        }

    } else {
        for (i = 0; i + 8 < len; i += 8) {
            ngx_memcpy(&w, data + i, 8);
            h = ((h << 23 | h >> 41) ^ w) * NGX_HTTP_SINGLEFLIGHT_HASH_M;
        }

        /* the last eight bytes, overlapping the word before if need be */
        ngx_memcpy(&w, data + len - 8, 8);
    }

    return ((h << 23 | h >> 41) ^ w) * NGX_HTTP_SINGLEFLIGHT_HASH_M;
}


static ngx_inline uint64_t
ngx_http_singleflight_hash64_end(uint64_t h)
{
    h ^= h >> 32;
    h *= NGX_HTTP_SINGLEFLIGHT_HASH_M;
    h ^= h >> 29;

    return h;
}


/* the singleflight_key value in a key */

void
ngx_http_singleflight_key_value(ngx_str_t *key, ngx_str_t *value)
{
    u_char  *p, *last;
    size_t   len;

    last = key->data + key->len;

    /* past the method's name, to its ' ' (or skips_cache's '\1') */

    for (p = key->data + 1; p < last && *p != ' ' && *p != '\1'; p++) {
        /* void */
    }

    if ((size_t) (last - p) < 1 + sizeof(size_t)) {
        ngx_str_null(value);
        return;
    }

    p++;

    ngx_memcpy(&len, p, sizeof(size_t));
    p += sizeof(size_t);

    if ((size_t) (last - p) < len) {
        ngx_str_null(value);
        return;
    }

    p += len;

    value->data = p;
    value->len = last - p;
}


/*
 * $singleflight_body_hash: the SHA-1 of the request body in hex, read
 * from memory and from the temporary file alike; empty before the body
 * is read.
 */

ngx_int_t
ngx_http_singleflight_body_hash(ngx_http_request_t *r, ngx_str_t *hex)
{
    u_char        digest[20], buf[4096];
    off_t         offset;
    size_t        n;
    ssize_t       rd;
    ngx_buf_t    *b;
    ngx_sha1_t    sha1;
    ngx_chain_t  *cl;

    ngx_str_null(hex);

    if (r->request_body == NULL) {
        return NGX_DECLINED;
    }

    ngx_sha1_init(&sha1);

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            ngx_sha1_update(&sha1, b->pos, b->last - b->pos);
            continue;
        }

        if (!b->in_file) {
            continue;
        }

        for (offset = b->file_pos; offset < b->file_last; offset += rd) {
            n = (size_t) ngx_min((off_t) sizeof(buf), b->file_last - offset);

            rd = ngx_read_file(b->file, buf, n, offset);

            if (rd != (ssize_t) n) {
                ngx_log_error(NGX_LOG_CRIT, r->connection->log, ngx_errno,
                              "singleflight could not read the request body "
                              "from \"%V\"", &b->file->name);
                return NGX_ERROR;
            }

            ngx_sha1_update(&sha1, buf, n);
        }
    }

    ngx_sha1_final(digest, &sha1);

    hex->data = ngx_pnalloc(r->pool, 2 * sizeof(digest));
    if (hex->data == NULL) {
        return NGX_ERROR;
    }

    hex->len = ngx_hex_dump(hex->data, digest, sizeof(digest)) - hex->data;

    return NGX_OK;
}


/*
 * The index of a variable some part of the configuration has indexed
 * (a script, proxy_set_header, a log format...), or NGX_ERROR when none
 * has: then no request keeps a value of it.  Looked up once the
 * configuration is complete, never made: an index of our own would grow
 * every request's array of values, in every location, by 16 bytes.
 * name is lowercase, as nginx keeps it.
 */

ngx_int_t
ngx_http_singleflight_variable_index(ngx_cycle_t *cycle, u_char *name,
    size_t len)
{
    ngx_uint_t                  i;
    ngx_http_variable_t        *v;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_core_module);

    if (cmcf == NULL) {
        return NGX_ERROR;
    }

    v = cmcf->variables.elts;

    for (i = 0; i < cmcf->variables.nelts; i++) {
        if (v[i].name.len == len
            && ngx_strncmp(v[i].name.data, name, len) == 0)
        {
            return i;
        }
    }

    return NGX_ERROR;
}
