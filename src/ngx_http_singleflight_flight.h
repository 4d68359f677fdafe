/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The flight: the only code that changes a flight's node.  Each function
 * is one transition, taken under the zone's lock, with its invariants
 * checked; after unlocking it logs, removes what must be removed and wakes
 * the other workers the change concerns.  A transition that concerns this
 * worker's parked requests returns so (NGX_HTTP_SINGLEFLIGHT_WAKE_LOCAL),
 * and the caller wakes them (_wait.c): this file never calls into the
 * wait side.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_FLIGHT_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_FLIGHT_H_INCLUDED_


#include "ngx_http_singleflight.h"


/* what a request that arrives with a key does (flight_join) */
typedef enum {
    NGX_HTTP_SINGLEFLIGHT_JOIN_LEAD = 0,   /* a new flight: fetch it */
    NGX_HTTP_SINGLEFLIGHT_JOIN_TAKEOVER,   /* an orphaned one: fetch it */
    NGX_HTTP_SINGLEFLIGHT_JOIN_FOLLOW,     /* wait for its header */
    NGX_HTTP_SINGLEFLIGHT_JOIN_LATE,       /* read it: it is streaming */
    NGX_HTTP_SINGLEFLIGHT_JOIN_PRIVATE,    /* the key is marked private */
    NGX_HTTP_SINGLEFLIGHT_JOIN_OVERFLOW,   /* singleflight_max_waiters */
    NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM       /* the zone is full */
} ngx_http_singleflight_join_e;


/* the request's side of a join */
typedef struct {
    ngx_http_request_t              *request;
    ngx_str_t                       *key;         /* class byte first */
    uint32_t                         hash;
    uint64_t                         mark;        /* 64-bit hash of key */
    ngx_atomic_uint_t                seq;         /* out: what was seen */
    ngx_uint_t                       max_waiters;
    ngx_uint_t                       max_retries;
    size_t                           file_room;   /* a temp file's name */
    u_char                          *predict;     /* its variant, foreseen */
    size_t                           predict_len;
    unsigned                         head:1;      /* may follow a GET */
    unsigned                         promote_dead:1;
    unsigned                         creds:2;     /* its credentials */
} ngx_http_singleflight_arrival_t;


/*
 * The mark of a key whose responses requests with credentials may not
 * have (_share.c): its hash, so changed, and changed again by the kind
 * (NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE or _AUTH)
 */
#define NGX_HTTP_SINGLEFLIGHT_CREDS_MARK  0x5bd1e9955bd1e995ULL


#define NGX_HTTP_SINGLEFLIGHT_WAKE_LOCAL  1


ngx_int_t ngx_http_singleflight_flight_attach(
    ngx_http_singleflight_zone_t *zone, ngx_log_t *log);
void ngx_http_singleflight_flight_detach(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log);
ngx_uint_t ngx_http_singleflight_flight_strays(
    ngx_http_singleflight_zone_t *zone, ngx_uint_t *slots, ngx_pid_t *pids,
    ngx_uint_t max);
void ngx_http_singleflight_flight_reclaim(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t slot, ngx_pid_t pid, ngx_log_t *log);

ngx_http_singleflight_join_e ngx_http_singleflight_flight_join(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_arrival_t *a,
    ngx_http_singleflight_node_t **pfn, ngx_uint_t *generation);
ngx_uint_t ngx_http_singleflight_flight_takeover(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t *generation, ngx_uint_t *how, ngx_log_t *log);

ngx_uint_t ngx_http_singleflight_flight_adopt(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t *generation, ngx_uint_t *how, ngx_log_t *log);

ngx_int_t ngx_http_singleflight_flight_defer(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_atomic_t *slot, ngx_atomic_uint_t epoch,
    ngx_atomic_uint_t mark, ngx_atomic_uint_t *seq);
ngx_uint_t ngx_http_singleflight_flight_take(
    ngx_http_singleflight_zone_t *zone, ngx_atomic_t *slot, ngx_str_t *key,
    uint32_t hash, ngx_uint_t failed, ngx_http_singleflight_node_t **pfn,
    ngx_http_singleflight_node_t **gone, ngx_uint_t *generation,
    ngx_atomic_uint_t *seq, ngx_log_t *log);

ngx_int_t ngx_http_singleflight_flight_header(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, u_char *block, size_t len, ngx_uint_t complete,
    ngx_log_t *log);
ngx_uint_t ngx_http_singleflight_flight_seal(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_body(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, off_t len, ngx_str_t *trailers,
    ngx_atomic_uint_t *seq, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_fail(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_uint_t reason, ngx_uint_t status,
    ngx_http_singleflight_where_t *where, ngx_log_t *log);
void ngx_http_singleflight_flight_mark_creds(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t creds, ngx_msec_t ttl);
ngx_int_t ngx_http_singleflight_flight_retry(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t *generation, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_spend_try(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation);
ngx_int_t ngx_http_singleflight_flight_hedge(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation);
void ngx_http_singleflight_flight_resumed(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn);
ngx_int_t ngx_http_singleflight_flight_alone(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_uint_t reason, ngx_msec_t mark_ttl,
    ngx_atomic_uint_t *seq, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_solo(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_orphan(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_unhost(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_dropped(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_uint_t reader, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_end_direct(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_leave(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t host, ngx_uint_t keep, ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_release(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_log_t *log);
ngx_int_t ngx_http_singleflight_flight_park(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_atomic_uint_t seen);
ngx_uint_t ngx_http_singleflight_flight_abandoned(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation);
ngx_uint_t ngx_http_singleflight_flight_forget(
    ngx_http_singleflight_zone_t *zone, ngx_str_t *value, uint32_t hash,
    ngx_log_t *log);


/* what a waiter may read without the lock */

/* is the fetch of "generation" to stop, as last published */

static ngx_inline ngx_uint_t
ngx_http_singleflight_flight_abandoning(ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation)
{
    ngx_memory_barrier();

    return fn->abandon && fn->generation == generation;
}


static ngx_inline ngx_atomic_uint_t
ngx_http_singleflight_flight_seq(ngx_http_singleflight_node_t *fn)
{
    ngx_atomic_uint_t  seq;

    seq = fn->seq;
    ngx_memory_barrier();

    return seq;
}


static ngx_inline ngx_uint_t
ngx_http_singleflight_flight_state(ngx_http_singleflight_node_t *fn)
{
    ngx_uint_t  state;

    state = (ngx_uint_t) fn->state;
    ngx_memory_barrier();

    return state;
}


/* is a reader to ask for the rest (flight_adopt()), as last published */

static ngx_inline ngx_uint_t
ngx_http_singleflight_flight_adrift(ngx_http_singleflight_node_t *fn)
{
    ngx_memory_barrier();

    return fn->adrift;
}


/* how many requests read the flight, as last published: a hint */

static ngx_inline ngx_uint_t
ngx_http_singleflight_flight_readers(ngx_http_singleflight_node_t *fn)
{
    ngx_memory_barrier();

    return fn->readers;
}


static ngx_inline off_t
ngx_http_singleflight_flight_length(ngx_http_singleflight_node_t *fn)
{
    off_t  len;

    len = (off_t) fn->body_len;
    ngx_memory_barrier();

    return len;
}


/* the singleflight_promote condition an origin status matches, if any */

static ngx_inline ngx_uint_t
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


#endif /* _NGX_HTTP_SINGLEFLIGHT_FLIGHT_H_INCLUDED_ */
