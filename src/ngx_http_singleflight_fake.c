/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * What a fetch runs on (_fetch.c): a connection with no client, and a
 * pool of its host's.  Both are kept per worker for the next fetch, so
 * that a lone fetch costs no socket, no malloc() and no free().
 */


#include "ngx_http_singleflight_fake.h"


static ngx_socket_t ngx_http_singleflight_fake_fd(ngx_log_t *log);
static void ngx_http_singleflight_fake_handler(ngx_event_t *ev);


static ngx_queue_t  ngx_http_singleflight_fakes;
static ngx_uint_t   ngx_http_singleflight_fakes_init;

/* the descriptor of every fetch's connection, see fake_fd() */
static ngx_socket_t  ngx_http_singleflight_fake_socket = (ngx_socket_t) -1;

/* the fetches' pools kept for the next hosts, see fake_pool() */
#if defined(__SANITIZE_ADDRESS__)
#define NGX_HTTP_SINGLEFLIGHT_ASAN         1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NGX_HTTP_SINGLEFLIGHT_ASAN         1
#endif
#endif
#ifndef NGX_HTTP_SINGLEFLIGHT_ASAN
#define NGX_HTTP_SINGLEFLIGHT_ASAN         0
#endif

#define NGX_HTTP_SINGLEFLIGHT_POOL_SIZE    16384
#define NGX_HTTP_SINGLEFLIGHT_POOL_BLOCKS  4
#define NGX_HTTP_SINGLEFLIGHT_POOLS_KEPT   64

static ngx_pool_t  *ngx_http_singleflight_pools[
                                         NGX_HTTP_SINGLEFLIGHT_POOLS_KEPT];
static ngx_uint_t   ngx_http_singleflight_npools;


/*
 * The fetch's connection: a copy of the leader's (addresses, TLS, HTTP/2
 * or HTTP/3 state: what variables read), without a socket, its events
 * never in the event loop, always ready for writing.
 */

ngx_http_singleflight_fake_t *
ngx_http_singleflight_fake_get(ngx_http_request_t *r)
{
    ngx_queue_t                   *q;
    ngx_connection_t              *c;
    ngx_http_singleflight_fake_t  *fake;

    if (!ngx_http_singleflight_fakes_init) {
        ngx_queue_init(&ngx_http_singleflight_fakes);
        ngx_http_singleflight_fake_socket =
                              ngx_http_singleflight_fake_fd(r->connection->log);
        ngx_http_singleflight_fakes_init = 1;
    }

    if (!ngx_queue_empty(&ngx_http_singleflight_fakes)) {
        q = ngx_queue_head(&ngx_http_singleflight_fakes);
        ngx_queue_remove(q);
        fake = ngx_queue_data(q, ngx_http_singleflight_fake_t, queue);

    } else {
        fake = ngx_alloc(sizeof(ngx_http_singleflight_fake_t),
                         r->connection->log);
        if (fake == NULL) {
            return NULL;
        }
    }

    c = &fake->c;

    /*
     * On a wildcard listen nginx asks the socket for the local address
     * when a variable first needs it ($server_addr, $server_port): asked
     * of the copy, it would be the fetch's socket's ("unix:", no port).
     * Asked now, of the client's connection, as without the module
     */

    (void) ngx_connection_local_sockaddr(r->connection, NULL, 0);

    *c = *r->connection;

    c->fd = ngx_http_singleflight_fake_socket;
    c->data = NULL;
    c->read = &fake->read;
    c->write = &fake->write;
    c->log = &fake->log;
    c->buffered = 0;
    c->sent = 0;
    c->destroyed = 0;
    c->error = 0;
    c->timedout = 0;
    c->close = 0;
    c->idle = 0;
    c->reusable = 0;
    c->sndlowat = 1;
    c->tcp_nodelay = NGX_TCP_NODELAY_DISABLED;
    c->tcp_nopush = NGX_TCP_NOPUSH_DISABLED;

    fake->log = *r->connection->log;
    fake->log.data = &fake->log_ctx;
    fake->log_ctx = *(ngx_http_log_ctx_t *) r->connection->log->data;
    fake->log_ctx.connection = c;

    ngx_memzero(&fake->read, sizeof(ngx_event_t));
    ngx_memzero(&fake->write, sizeof(ngx_event_t));

    fake->read.data = c;
    fake->read.log = &fake->log;
    fake->read.handler = ngx_http_singleflight_fake_handler;
    fake->read.active = 1;

    fake->write.data = c;
    fake->write.log = &fake->log;
    fake->write.handler = ngx_http_singleflight_fake_handler;
    fake->write.write = 1;
    fake->write.active = 1;
    fake->write.ready = 1;

    return fake;
}


/*
 * A fetch's connection has no client, but a descriptor: modules take -1
 * for a request of their own timers and refuse it their API (lua's
 * ngx.header, ngx.var...).  It is one end of a socket pair nobody writes
 * to, non-blocking, shared by every fetch of the worker: a peek at it for
 * a client gone (nginx without EPOLLRDHUP) finds it waiting, and nothing
 * else is done with it: the module's filters take the fetch's output, and
 * its connection is never closed by nginx.
 */

static ngx_socket_t
ngx_http_singleflight_fake_fd(ngx_log_t *log)
{
    int  sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == -1) {
        ngx_log_error(NGX_LOG_WARN, log, ngx_socket_errno,
                      "singleflight socketpair() failed");
        return (ngx_socket_t) -1;
    }

    if (ngx_nonblocking(sv[0]) == -1
        || fcntl(sv[0], F_SETFD, FD_CLOEXEC) == -1
        || fcntl(sv[1], F_SETFD, FD_CLOEXEC) == -1)
    {
        ngx_log_error(NGX_LOG_WARN, log, ngx_socket_errno,
                      "singleflight could not set up its socket pair");
        (void) close(sv[0]);
        (void) close(sv[1]);
        return (ngx_socket_t) -1;
    }

    /* the other end stays open: the pair never looks closed */
    return sv[0];
}


void
ngx_http_singleflight_fake_free(ngx_http_singleflight_fake_t *fake)
{
    if (fake->read.timer_set) {
        ngx_del_timer(&fake->read);
    }

    if (fake->write.timer_set) {
        ngx_del_timer(&fake->write);
    }

    if (fake->read.posted) {
        ngx_delete_posted_event(&fake->read);
    }

    if (fake->write.posted) {
        ngx_delete_posted_event(&fake->write);
    }

    /* a caller still on the stack may look: ngx_http_run_posted_requests() */
    fake->c.destroyed = 1;

    ngx_queue_insert_tail(&ngx_http_singleflight_fakes, &fake->queue);
}


/*
 * The fetches' pool.  What a fetch subrequest allocates (the request, its
 * module contexts, its upstream, its proxy_buffers and their links) comes
 * from a pool of its host's, not from the host request's own pool: a lone
 * request would otherwise need two more 4 KiB blocks, a malloc() and a
 * free() each, than without the module.  The pool lives as long as its
 * host request (memory of it is on the host's cleanup list and in
 * $upstream_* until the host is logged and freed); then it is reset and
 * kept for the next host, unless it grew past four blocks.
 *
 * nginx gives every pool allocation larger than a page a malloc() of its
 * own: the upstream's buffers (4 or 8 KiB each).  In a kept pool they
 * come from its blocks instead (its "max" raised to a block), so that a
 * kept pool serves a whole fetch of a few dozen KiB with no malloc() or
 * free() at all.  With a malloc() and a free() per buffer, freed at other
 * times than the requests' own, glibc gave the top of the heap back to
 * the kernel and took it again: a lone 64 KiB response cost 4 page faults
 * and 20-45% of plain proxy_pass's throughput (bench/lone.pl).
 */

ngx_pool_t *
ngx_http_singleflight_fake_pool(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx)
{
    ngx_pool_t  *pool;

    if (ctx->pool != NULL) {
        return ctx->pool;
    }

    if (ngx_http_singleflight_npools) {
        pool = ngx_http_singleflight_pools[--ngx_http_singleflight_npools];
        pool->log = r->connection->log;

    } else {
        pool = ngx_create_pool(NGX_HTTP_SINGLEFLIGHT_POOL_SIZE,
                               r->connection->log);
        if (pool == NULL) {
            return NULL;
        }

        pool->max = NGX_HTTP_SINGLEFLIGHT_POOL_SIZE - sizeof(ngx_pool_t);
    }

    ctx->pool = pool;

    return pool;
}


/*
 * The host request goes (its pool's cleanup, after nginx ran the
 * request's cleanups and logged it): the pool's own cleanups (temporary
 * files of its buffering) run, and the pool is kept or freed.
 */

void
ngx_http_singleflight_fake_pool_free(ngx_pool_t *pool)
{
    ngx_uint_t           n;
    ngx_pool_t          *p;
    ngx_pool_cleanup_t  *c;

    for (c = pool->cleanup; c; c = c->next) {
        if (c->handler) {
            c->handler(c->data);
        }
    }

    pool->cleanup = NULL;

    n = 0;

    for (p = pool; p; p = p->d.next) {
        n++;
    }

    if (n > NGX_HTTP_SINGLEFLIGHT_POOL_BLOCKS
        || ngx_http_singleflight_npools == NGX_HTTP_SINGLEFLIGHT_POOLS_KEPT
        || NGX_HTTP_SINGLEFLIGHT_ASAN)
    {
        /* under AddressSanitizer every pool is freed: a late use shows */
        ngx_destroy_pool(pool);
        return;
    }

    ngx_reset_pool(pool);

    pool->log = ngx_cycle->log;

    ngx_http_singleflight_pools[ngx_http_singleflight_npools++] = pool;
}


/*
 * A fetch's connection's events: the module posts them to go on copying a
 * file, and a content handler may set a timer on them (a delay).
 */

static void
ngx_http_singleflight_fake_handler(ngx_event_t *ev)
{
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    c = ev->data;

    if (c->destroyed) {
        return;
    }

    r = c->data;

    ngx_http_set_log_request(c->log, r);

    if (ev->delayed && ev->timedout) {
        /*
         * a delay a content handler set on the connection ran out (perl's
         * $r->sleep): over, as ngx_http_request_handler() says
         */
        ev->delayed = 0;
        ev->timedout = 0;
    }

    if (ev->write) {
        r->write_event_handler(r);

    } else {
        r->read_event_handler(r);
    }

    ngx_http_run_posted_requests(c);
}
