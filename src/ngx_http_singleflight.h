/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * ngx_http_singleflight_module: the types every part of the module shares.
 *
 * A flight is one fetch of one key and the response it stores.  Its node
 * lives in a shared-memory zone (_zone.c); only _flight.c changes a node.
 * The fetch is a background subrequest of the request that hosts it
 * (_fetch.c), and every client of the flight, the first one included, is a
 * reader of the stored response (_reader.c), which it takes by offset while
 * it grows (_store.c).  Readers waiting for more are parked in their own
 * worker (_wait.c) and woken directly or, from another worker, through the
 * worker registry's wake-up pipes (_registry.c).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* the module's version: debian/changelog's, in the stats' build_info */
#define NGX_HTTP_SINGLEFLIGHT_VERSION  "0.1.0"


/* singleflight_zone scope= */
#define NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS  0
#define NGX_HTTP_SINGLEFLIGHT_SCOPE_NUMA     1
#define NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER   2

/* key classes: a HEAD request may follow a GET flight, not the reverse */
#define NGX_HTTP_SINGLEFLIGHT_CLASS_GET      'G'
#define NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD     'H'
#define NGX_HTTP_SINGLEFLIGHT_CLASS_OTHER    'M'


/*
 * States of a flight, published in fn->state with fn->seq bumped, so that
 * a waiter can tell without the lock that something happened.
 */
#define NGX_HTTP_SINGLEFLIGHT_FETCHING   0  /* a fetch is on its way */
#define NGX_HTTP_SINGLEFLIGHT_STREAMING  1  /* header stored, body coming */
#define NGX_HTTP_SINGLEFLIGHT_COMPLETE   2  /* the whole response stored */
#define NGX_HTTP_SINGLEFLIGHT_ORPHANED   3  /* its fetch is gone, unfinished:
                                               a waiting request takes over */
#define NGX_HTTP_SINGLEFLIGHT_FAILED     4  /* no response to share */
#define NGX_HTTP_SINGLEFLIGHT_ALONE      5  /* a response for its host only:
                                               everybody else goes alone */

/* a flight's "solo": may its leader still make it its own without the lock */
#define NGX_HTTP_SINGLEFLIGHT_SOLO_OPEN    0  /* nobody followed it yet */
#define NGX_HTTP_SINGLEFLIGHT_SOLO_ALONE   1  /* its leader's: nobody joins */
#define NGX_HTTP_SINGLEFLIGHT_SOLO_SHARED  2  /* followed: never solo */


/* singleflight_lone: how a request with nobody to share with goes */
#define NGX_HTTP_SINGLEFLIGHT_LONE_FETCH   0  /* a flight fetched by a
                                                subrequest */
#define NGX_HTTP_SINGLEFLIGHT_LONE_DIRECT  1  /* upstream itself, no flight */
#define NGX_HTTP_SINGLEFLIGHT_LONE_OWN     2  /* a flight its leader's own
                                                request fetches (_tee.c) */


/* why a flight failed or went alone (fn->reason) */
#define NGX_HTTP_SINGLEFLIGHT_R_NONE        0
#define NGX_HTTP_SINGLEFLIGHT_R_ERROR       1  /* nginx made an error */
#define NGX_HTTP_SINGLEFLIGHT_R_TIMEOUT     2  /* an upstream timed out */
#define NGX_HTTP_SINGLEFLIGHT_R_ORIGIN      3  /* an origin 5xx, unshared */
#define NGX_HTTP_SINGLEFLIGHT_R_STATUS      4  /* nginx's own status, shared */
#define NGX_HTTP_SINGLEFLIGHT_R_CUT         5  /* broke off after the header */
#define NGX_HTTP_SINGLEFLIGHT_R_DEAD        6  /* the host's worker died */
#define NGX_HTTP_SINGLEFLIGHT_R_PRIVATE     7  /* singleflight_private */
#define NGX_HTTP_SINGLEFLIGHT_R_UNSHARED    8  /* Vary: *, 101, too large */
#define NGX_HTTP_SINGLEFLIGHT_R_ABANDONED   9  /* nobody left to read it */
#define NGX_HTTP_SINGLEFLIGHT_R_CACHED     10  /* a cache hit: each one
                                               reads the cache itself */
#define NGX_HTTP_SINGLEFLIGHT_R_NOMEM      11  /* no room in the zone for
                                               the header */


/* singleflight_credentials */
#define NGX_HTTP_SINGLEFLIGHT_CRED_OFF   0   /* such requests not collapsed */
#define NGX_HTTP_SINGLEFLIGHT_CRED_ON    1   /* credentials ignored */
#define NGX_HTTP_SINGLEFLIGHT_CRED_HTTP  2   /* shared as a shared cache
                                                would (RFC 9111 3, 3.5) */

/* a request's credentials, and whom a stored response may go to */
#define NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE  0x01
#define NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH    0x02


/* methods whose requests may carry a body the key can cover */
#define NGX_HTTP_SINGLEFLIGHT_BODY_METHODS                                    \
    (NGX_HTTP_POST|NGX_HTTP_PUT|NGX_HTTP_PATCH|NGX_HTTP_DELETE                \
     |NGX_HTTP_OPTIONS|NGX_HTTP_PROPFIND)


/* singleflight_promote conditions */
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR     0x0002
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT   0x0004
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_ABORT     0x0008  /* no longer means
                                                           anything */
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_500       0x0010
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_502       0x0020
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_503       0x0040
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_504       0x0080
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEAD      0x0100  /* its fetching
                                                           worker died */
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF       0x1000


/* singleflight_private conditions */
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_SET_COOKIE  0x0002
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_PRIVATE     0x0004
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_STORE    0x0008
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_CACHE    0x0010
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_OFF         0x1000


/* outcomes shown in $singleflight_status */
typedef enum {
    NGX_HTTP_SINGLEFLIGHT_ST_NONE = 0,
    NGX_HTTP_SINGLEFLIGHT_ST_LEADER,
    NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER,
    NGX_HTTP_SINGLEFLIGHT_ST_PROMOTED,
    NGX_HTTP_SINGLEFLIGHT_ST_BYPASS,
    NGX_HTTP_SINGLEFLIGHT_ST_TIMEOUT,
    NGX_HTTP_SINGLEFLIGHT_ST_ERROR,
    NGX_HTTP_SINGLEFLIGHT_ST_NOT_SHARED,
    NGX_HTTP_SINGLEFLIGHT_ST_NO_MEMORY,
    NGX_HTTP_SINGLEFLIGHT_ST_OVERFLOW,
    NGX_HTTP_SINGLEFLIGHT_ST_PRIVATE,
    NGX_HTTP_SINGLEFLIGHT_ST_LOOP,
    NGX_HTTP_SINGLEFLIGHT_ST_DIRECT
} ngx_http_singleflight_status_e;

#define NGX_HTTP_SINGLEFLIGHT_STATUSES  (NGX_HTTP_SINGLEFLIGHT_ST_DIRECT + 1)


/* what a fetch that went to the origin was, for the stats */
#define NGX_HTTP_SINGLEFLIGHT_ORIGIN_FIRST   0  /* a flight's first fetch */
#define NGX_HTTP_SINGLEFLIGHT_ORIGIN_RETRY   1  /* fetched again: promote,
                                                   a takeover */
#define NGX_HTTP_SINGLEFLIGHT_ORIGIN_HEDGE   2  /* a hedge's second fetch */
#define NGX_HTTP_SINGLEFLIGHT_ORIGIN_RESUME  3  /* the rest of a response */
#define NGX_HTTP_SINGLEFLIGHT_ORIGINS        4


/*
 * A histogram of times, for singleflight_stats: how many fell in each
 * bucket (not cumulative; the last bucket has no upper bound) and their
 * sum, in milliseconds of nginx's clock.  Updated with atomics.
 */
#define NGX_HTTP_SINGLEFLIGHT_BUCKETS  15

typedef struct {
    ngx_atomic_t                     bucket[NGX_HTTP_SINGLEFLIGHT_BUCKETS];
    ngx_atomic_t                     sum;
} ngx_http_singleflight_histogram_t;


/*
 * Counters kept in the zone; updated with atomics, read without the lock.
 * Nothing but ngx_atomic_t in it, the histograms' included: the stats add
 * two of them up as arrays.
 */
typedef struct {
    ngx_atomic_t                     requests[NGX_HTTP_SINGLEFLIGHT_STATUSES];
                                                  /* by $singleflight_status,
                                                     as they end */
    ngx_atomic_t                     origin_requests[
                                               NGX_HTTP_SINGLEFLIGHT_ORIGINS];
    ngx_atomic_t                     flights;
    ngx_atomic_t                     followers;
    ngx_atomic_t                     served;
    ngx_atomic_t                     late_joins;
    ngx_atomic_t                     unstored;
    ngx_atomic_t                     resumes;
    ngx_atomic_t                     resume_failures;
    ngx_atomic_t                     hedges;
    ngx_atomic_t                     hedge_wins;
    ngx_atomic_t                     retries;
    ngx_atomic_t                     promotions;
    ngx_atomic_t                     timeouts;
    ngx_atomic_t                     errors;
    ngx_atomic_t                     cut;
    ngx_atomic_t                     dead_leaders;
    ngx_atomic_t                     abandoned;
    ngx_atomic_t                     not_shared;
    ngx_atomic_t                     oversized;
    ngx_atomic_t                     no_memory;
    ngx_atomic_t                     vary_mismatches;
    ngx_atomic_t                     forgotten;
    ngx_atomic_t                     bytes_shared;
    ngx_atomic_t                     spilled;
    ngx_atomic_t                     nospill;
    ngx_atomic_t                     notify_failed;
    ngx_atomic_t                     wakeups;

    ngx_http_singleflight_histogram_t  wait;      /* a follower's wait for
                                                     its header */
    ngx_http_singleflight_histogram_t  header;    /* a flight's start to
                                                     its header */
    ngx_http_singleflight_histogram_t  body;      /* to its last byte */
} ngx_http_singleflight_counters_t;


/* gauges of a zone instance */
typedef struct {
    ngx_uint_t                       in_flight;   /* linked flights */
    ngx_uint_t                       waiters;     /* waiting for a header */
    ngx_uint_t                       readers;     /* reading a response */
    ngx_uint_t                       marks;       /* private marks */
    ngx_uint_t                       workers;     /* processes using it */
    ngx_uint_t                       pages_used;
    ngx_uint_t                       pages_free;
    ngx_uint_t                       pages_baseline;
} ngx_http_singleflight_gauges_t;


/*
 * What a fetch's location changed of its request: its URI (index,
 * try_files, error_page, rewrite) and its arguments (set $args), as
 * flags and lengths.  In a header block, and in a failed flight's
 * record, the URI's bytes follow, then the arguments'.
 */
#define NGX_HTTP_SINGLEFLIGHT_MOVED_URI   0x01
#define NGX_HTTP_SINGLEFLIGHT_MOVED_ARGS  0x02

typedef struct {
    ngx_uint_t                       flags;
    size_t                           uri_len;
    size_t                           args_len;
    ngx_uint_t                       redirects;   /* internal redirects and
                                                     rewrites "last" */
} ngx_http_singleflight_moved_t;


/*
 * The mirror module's location configuration (nginx 1.13.4 to 1.31),
 * which is not ours to include: its first members.
 */
typedef struct {
    ngx_array_t                     *mirror;      /* of ngx_str_t, or NULL */
    ngx_flag_t                       request_body;
} ngx_http_singleflight_mirror_conf_t;


/* where a fetch's response, or its failure, was made */
typedef struct {
    void                           **loc_conf;
    ngx_http_singleflight_moved_t    moved;
    u_char                          *uri;         /* if moved */
    u_char                          *args;        /* if moved */
    ngx_http_request_t              *made;        /* its headers_out */
} ngx_http_singleflight_where_t;


typedef struct ngx_http_singleflight_chunk_s  ngx_http_singleflight_chunk_t;

/*
 * A piece of a stored body in the zone.  It covers the body bytes from
 * "start" to "start + size"; which of them are there is told by the
 * flight's published body_len, never by the chunk.
 */
struct ngx_http_singleflight_chunk_s {
    ngx_http_singleflight_chunk_t   *next;
    off_t                            start;
    size_t                           size;
    u_char                           data[1];
};


/*
 * A flight's stored response: the header block (see _store.c), the first
 * bytes of the body in chunks of the zone, the rest in a temporary file
 * whose name readers open.  Written by the fetch alone; what readers may
 * read is what the flight has published.
 */
typedef struct {
    u_char                          *header;
    ngx_http_singleflight_chunk_t   *first;
    ngx_http_singleflight_chunk_t   *last;
    off_t                            mem_len;     /* bytes the chunks hold */
    u_char                          *file;        /* name, '\0'-terminated */
    size_t                           file_len;
    size_t                           file_room;   /* after the node's key */
    u_char                          *predict;     /* its variant, foreseen */
    u_char                          *failure;     /* a failed status's
                                                     record (_store.c) */
    u_char                          *trailers;    /* the origin's, at the
                                                     body's end (_store.c) */
    ngx_fd_t                         fd;          /* scope=worker: the file */
    unsigned                         has_fd:1;    /* its name is unlinked */
} ngx_http_singleflight_store_t;


typedef struct ngx_http_singleflight_node_s   ngx_http_singleflight_node_t;
typedef struct ngx_http_singleflight_hold_s   ngx_http_singleflight_hold_t;
typedef struct ngx_http_singleflight_zone_s   ngx_http_singleflight_zone_t;
typedef struct ngx_http_singleflight_tee_s    ngx_http_singleflight_tee_t;
typedef struct ngx_http_singleflight_fetch_s  ngx_http_singleflight_fetch_t;
typedef struct ngx_http_singleflight_group_s  ngx_http_singleflight_group_t;
typedef struct ngx_http_singleflight_zone_conf_s
    ngx_http_singleflight_zone_conf_t;


/*
 * A worker's part in a flight: how many of its requests use the flight
 * (readers, and the fetch if it hosts it), and whether one of them is
 * parked waiting for the flight to change.  What a dead worker held is
 * found through its holds alone, never by walking every flight.
 */
struct ngx_http_singleflight_hold_s {
    ngx_queue_t                      flight;      /* in fn->holds */
    ngx_queue_t                      worker;      /* in the worker's holds */
    ngx_http_singleflight_node_t    *fn;
    ngx_uint_t                       slot;
    ngx_uint_t                       users;
    ngx_uint_t                       readers;
    ngx_uint_t                       waiting;     /* readers before header */
    unsigned                         parked:1;
    unsigned                         host:1;
};


/*
 * A flight, in shared memory.  Every field is written under the zone's
 * lock; seq, state and body_len are also read without it (by waiters
 * deciding whether to look closer, and by readers taking the body), and
 * readers as a hint (by a leader's own upstream request, _tee.c).
 * Except: the leader of a flight nobody ever followed makes it its own
 * (ALONE) without the lock, by taking "solo" (flight_solo()); requests
 * that follow a flight first make it SHARED under the lock, and whoever
 * comes first decides.
 */
struct ngx_http_singleflight_node_s {
    ngx_rbtree_node_t                node;        /* key: hash of the key */
    ngx_queue_t                      holds;       /* a hold per worker */
    uint64_t                         id;          /* unique in the zone */
    ngx_atomic_t                     seq;         /* bumped on every change */
    ngx_atomic_uint_t                stamp;       /* the zone's clock then */
    ngx_atomic_t                     state;
    ngx_atomic_t                     body_len;    /* bytes published */
    ngx_atomic_t                     solo;        /* NGX_HTTP_SINGLEFLIGHT_
                                                     SOLO_... */
    ngx_uint_t                       readers;     /* requests reading it */
    ngx_uint_t                       waiting;     /* waiting for its header */
    ngx_uint_t                       host_slot;
    ngx_pid_t                        host_pid;
    ngx_uint_t                       generation;  /* bumped per fetch */
    ngx_uint_t                       retries;
    ngx_uint_t                       max_retries;
    ngx_uint_t                       status;      /* for FAILED readers */
    void                           **status_conf; /* the location that
                                                     failed: its error
                                                     pages, its filters */
    ngx_msec_t                       start;
    ngx_uint_t                       reason;
    unsigned                         linked:1;
    unsigned                         hosted:1;    /* a fetch runs for it */
    unsigned                         hollow:1;    /* its host reads no more */
    unsigned                         abandon:1;   /* stop the fetch */
    unsigned                         had_followers:1;
    unsigned                         hedged:1;    /* a second fetch ran */
    unsigned                         sealed:1;    /* past max_size=, counted
                                                     (flight_seal()) */
    unsigned                         promote_dead:1; /* fetched again when
                                                     its host's worker dies
                                                     before the header */
    unsigned                         adrift:1;    /* its host's worker died
                                                     mid-body: a reader is
                                                     to ask for the rest */
    unsigned                         deferred:1;  /* it waits for the header
                                                     of the request in its
                                                     claim (flight_defer()) */
    ngx_uint_t                       resumes;     /* Range requests used */
    ngx_atomic_t                    *claim;       /* deferred: its slot */
    ngx_atomic_uint_t                claim_epoch; /* and the slot's epoch */
    ngx_queue_t                      deferral;    /* deferred: in
                                                     sh->deferred */

    ngx_http_singleflight_store_t    store;

    /* the first worker's hold comes with the node: fn NULL while free */
    ngx_http_singleflight_hold_t     hold;

    size_t                           key_len;
    u_char                           key[1];
};


typedef struct ngx_http_singleflight_records_s
    ngx_http_singleflight_records_t;


/* a worker's record in a zone instance */
typedef struct {
    ngx_queue_t                      queue;       /* in sh->workers */
    ngx_queue_t                      holds;
    ngx_uint_t                       slot;
    ngx_pid_t                        pid;         /* 0: the record is free */
    ngx_http_singleflight_records_t *block;       /* NULL: in sh->spare */
    unsigned                         home:1;      /* the instance the worker
                                                     uses (scope=numa: of
                                                     its node) */
} ngx_http_singleflight_worker_t;


/*
 * Records past the spare ones (more workers than that, or old and new
 * ones during a reload) come a page at a time, so that the pages an idle
 * zone uses stay known: the baseline grows by the page and shrinks again
 * when its last record is given back.
 */
struct ngx_http_singleflight_records_s {
    ngx_queue_t                      queue;       /* in sh->blocks */
    ngx_uint_t                       used;
    ngx_http_singleflight_worker_t   rec[1];
};


/* worker records kept in the shared context, so they never move the pages */
#define NGX_HTTP_SINGLEFLIGHT_SPARE_WORKERS  64


/* a private mark: a key whose last response was private, for a while */
typedef struct {
    ngx_rbtree_node_t                node;        /* key: low bits of hash */
    ngx_queue_t                      queue;       /* oldest first */
    uint64_t                         hash;        /* of the whole key */
    ngx_msec_t                       expire;
} ngx_http_singleflight_mark_t;


/*
 * The shared part of a zone instance: the whole zone for scope=process,
 * one per NUMA node for scope=numa, and for scope=worker one in each
 * worker's own memory.
 */
typedef struct {
    ngx_rbtree_t                     rbtree;
    ngx_rbtree_node_t                sentinel;
    ngx_rbtree_t                     marks;
    ngx_rbtree_node_t                marks_sentinel;
    ngx_queue_t                      mark_queue;
    ngx_queue_t                      workers;
    ngx_queue_t                      blocks;      /* of worker records */
    ngx_uint_t                       block_pages;
    uint64_t                         next_id;
    ngx_atomic_uint_t                clock;       /* counts changes */
    time_t                           nomem_logged;
    ngx_uint_t                       baseline;    /* pages used when idle */
    ngx_atomic_t                     in_flight;   /* flights one can join */
    ngx_uint_t                       waiters;
    ngx_uint_t                       readers;
    ngx_uint_t                       nmarks;
    ngx_uint_t                       nhome;       /* workers using it */
    ngx_http_singleflight_counters_t counters;
    ngx_http_singleflight_worker_t   spare[NGX_HTTP_SINGLEFLIGHT_SPARE_WORKERS];

    /* singleflight_lone direct, see _zone.h; NULL: no location uses it */
    ngx_atomic_t                    *claims;
    ngx_atomic_t                     claim_epoch;
    ngx_queue_t                      deferred;    /* flights that wait for
                                                     a first request's
                                                     header */
} ngx_http_singleflight_shctx_t;


/*
 * scope=worker: each worker's counters and gauges, in a small shared zone
 * so that whichever worker answers singleflight_stats can report them all.
 */
typedef struct {
    ngx_pid_t                        pid;
    ngx_http_singleflight_counters_t counters;
    ngx_http_singleflight_gauges_t   gauges;
} ngx_http_singleflight_worker_stats_t;


/* a zone instance, in each process's own memory */
struct ngx_http_singleflight_zone_s {
    ngx_http_singleflight_shctx_t   *sh;
    ngx_slab_pool_t                 *shpool;
    ngx_shm_zone_t                  *shm_zone;    /* NULL: scope=worker */
    ngx_http_singleflight_zone_conf_t *conf;
    ngx_http_singleflight_counters_t *counters;
    ngx_http_singleflight_worker_stats_t *wstats; /* scope=worker */
    ngx_http_singleflight_worker_t  *me;          /* this worker's record */
    ngx_str_t                        name;
    ngx_int_t                        node;        /* scope=numa, else -1 */
    unsigned                         local:1;     /* no lock needed */

    /* this worker's groups of parked requests, keyed by flight id */
    ngx_rbtree_t                     groups;
    ngx_rbtree_node_t                groups_sentinel;
};


/* a zone as configured by singleflight_zone */
struct ngx_http_singleflight_zone_conf_s {
    ngx_str_t                        name;
    size_t                           size;
    ngx_uint_t                       scope;
    ngx_uint_t                       claims;      /* singleflight_lone direct
                                                     uses it */

    /* memory=, max_size=, temp_path=: for its locations (NGX_CONF_UNSET,
       NULL: not given) */
    size_t                           memory;
    off_t                            max_size;
    ngx_path_t                      *temp_path;
    ngx_array_t                      instances;   /* shared ones */
    ngx_http_singleflight_zone_t    *mine;        /* this worker's */

    /* scope=worker */
    ngx_shm_zone_t                  *stats_zone;
    ngx_http_singleflight_worker_stats_t *stats;
    ngx_uint_t                       nstats;
};


/* proxy_set_header, grpc_set_header, fastcgi_, uwsgi_ and scgi_param */
#define NGX_HTTP_SINGLEFLIGHT_SETTERS  5


typedef struct {
    ngx_array_t                      zones;       /* of zone_conf pointers */
    ngx_array_t                      temp_paths;  /* of ngx_path_t * */
    ngx_shm_zone_t                  *registry;
    ngx_str_t                        loop_name;   /* empty: the token */
    ngx_str_t                       *loop;        /* the name in CDN-Loop:
                                                     loop_name, or the
                                                     token (_registry.c) */
    ngx_int_t                        slice_index; /* $slice_range, or -1 */
    ngx_int_t                        slice_conf;  /* its module's, or -1 */
    ngx_int_t                        mirror_conf; /* mirror's, or -1 */
    ngx_int_t                        access_conf; /* allow and deny's */
    ngx_int_t                        basic_conf;  /* auth_basic's */
    ngx_int_t                        request_conf;/* auth_request's */
    ngx_uint_t                       access_other;/* an access module
                                                     nginx has besides */

    /*
     * proxy's, fastcgi's, uwsgi's and scgi's location configurations, by
     * their ctx_index (-1: nginx has no such module), for the cache's
     * max_range_offset
     */
    ngx_int_t                        cache_index[4];

    /*
     * the configuration reads $upstream_http_... or $upstream_cache_status:
     * a stored response keeps the fetch's, for its followers
     */
    ngx_uint_t                       upstream_vars;

    /*
     * the content handlers that go to an origin (proxy_pass and the other
     * *_pass directives) and their modules' ctx_index, and where the
     * header-setting directives keep their values: their modules'
     * ctx_index (-1: none) and offsets (_origin.c)
     */
    ngx_http_handler_pt              origins[8];
    ngx_uint_t                       origin_index[8];
    ngx_uint_t                       norigins;
    ngx_http_handler_pt              joiner;      /* echo_location's */
    ngx_int_t                 setter_index[NGX_HTTP_SINGLEFLIGHT_SETTERS];
    size_t                    setter_offset[NGX_HTTP_SINGLEFLIGHT_SETTERS];
} ngx_http_singleflight_main_conf_t;


typedef struct {
    ngx_http_singleflight_zone_conf_t *zone;      /* NULL: off */
    ngx_str_t                        zone_name;
    ngx_http_complex_value_t        *key;
    ngx_uint_t                       methods;
    ngx_array_t                     *bypass;
    ngx_msec_t                       timeout;
    ngx_uint_t                       timeout_status;     /* 0: fetch */
    ngx_uint_t                       max_waiters;        /* 0: no limit */
    ngx_uint_t                       max_waiters_status; /* 0: fetch */
    off_t                            max_size;           /* 0: no limit */
    off_t                            range_offset;  /* NGX_MAX_OFF_T_VALUE:
                                                       off */
    size_t                           memory;
    ngx_path_t                      *temp_path;

    /*
     * the location's own singleflight_max_size, _memory and _temp_path
     * (deprecated), which win over its zone's parameters
     */
    off_t                            max_size_set;
    size_t                           memory_set;
    ngx_path_t                      *temp_path_set;
    ngx_uint_t                       promote;
    ngx_uint_t                       promote_tries;
    ngx_uint_t                       error_status;
    ngx_flag_t                       share_errors;
    ngx_uint_t                       private;
    ngx_msec_t                       private_ttl;
    ngx_uint_t                       credentials;        /* NGX_HTTP_
                                                     SINGLEFLIGHT_CRED_... */
    ngx_array_t                     *credential_headers; /* of ngx_str_t */
    uint64_t                         scan_lengths; /* _handler.c */
    ngx_flag_t                       lazy;
    ngx_uint_t                       lone;        /* NGX_HTTP_SINGLEFLIGHT_
                                                     LONE_..., in effect */
    ngx_uint_t                       lone_conf;   /* as written, or unset */
    ngx_flag_t                       pend;        /* a lone request may
                                                     feed a flight: no
                                                     hedge, lazy on */
    ngx_flag_t                       cached;      /* a cache answers in
                                                     the location's
                                                     upstream */
    ngx_array_t                     *cache_bypass; /* its predicates
                                                     (proxy_cache_bypass),
                                                     where it has some */
    ngx_flag_t                       ignore_abort; /* the upstream's
                                                     *_ignore_client_abort */
    ngx_flag_t                       resume;
    ngx_uint_t                       resume_tries;
    ngx_msec_t                       hedge;       /* 0: off */
    ngx_flag_t                       hedge_auto;  /* hedge is the floor */
    off_t                            lazy_max;    /* 0: memory */
    ngx_flag_t                       enable;      /* NGX_CONF_UNSET: unset */
    ngx_flag_t                       content_any; /* singleflight ...
                                                     content=any */
    ngx_http_handler_pt              origin;      /* the content handler
                                                     last found to be an
                                                     origin's, per worker */
    ngx_uint_t                       key_body;    /* the key uses the body */
    ngx_uint_t                       key_default; /* $scheme$host, unset */

    /*
     * the location's requests go upstream on their own: gzip_static on or
     * autoindex on here (set at merge), or slice on (each worker's, found
     * at its first request)
     */
    ngx_int_t                        sliced;      /* NGX_CONF_UNSET: not yet */

    /* singleflight_forget */
    ngx_http_singleflight_zone_conf_t *forget_zone;
    ngx_str_t                        forget_zone_name;
    ngx_http_complex_value_t        *forget_key;

    /* singleflight_stats */
    ngx_uint_t                       stats_format;

    /* the request headers the location sets for its origin (_origin.c) */
    ngx_array_t              *set_source[NGX_HTTP_SINGLEFLIGHT_SETTERS];
    ngx_array_t                     *sets;
    ngx_uint_t                       sets_done;
    ngx_int_t                        sets_for;    /* whose "sets" are */
} ngx_http_singleflight_loc_conf_t;


/* ------------------------------------------------------------ requests */

typedef struct ngx_http_singleflight_waiter_s
    ngx_http_singleflight_waiter_t;

typedef void (*ngx_http_singleflight_waiter_pt)(
    ngx_http_singleflight_waiter_t *w);


/*
 * Something parked on a flight (_wait.c): a reader, or a fetch listening
 * for its flight being abandoned.  Its handler is called when the flight
 * changed; it must not park again from there, it posts an event that does.
 */
struct ngx_http_singleflight_waiter_s {
    ngx_queue_t                      queue;
    ngx_http_singleflight_group_t   *group;
    ngx_http_singleflight_waiter_pt  handler;
    void                            *data;
};


/* a reader's place in a stored response (_store.c) */
typedef struct {
    ngx_http_singleflight_node_t    *fn;
    ngx_http_singleflight_chunk_t   *chunk;       /* where "offset" is */
    off_t                            offset;      /* bytes taken */
    ngx_file_t                      *file;        /* opened on first need */
    ngx_chain_t                     *free;
    ngx_chain_t                     *busy;
} ngx_http_singleflight_cursor_t;


/* where a request is with its flight */
typedef enum {
    NGX_HTTP_SINGLEFLIGHT_RD_NONE = 0,    /* not (yet) in a flight */
    NGX_HTTP_SINGLEFLIGHT_RD_BODY,        /* reading its body for its key */
    NGX_HTTP_SINGLEFLIGHT_RD_WAITING,     /* for the header */
    NGX_HTTP_SINGLEFLIGHT_RD_SENDING,     /* the stored response */
    NGX_HTTP_SINGLEFLIGHT_RD_DIRECT,      /* its own fetch's response */
    NGX_HTTP_SINGLEFLIGHT_RD_ALONE,    /* went on as if no module */
    NGX_HTTP_SINGLEFLIGHT_RD_DONE         /* answered, or gone */
} ngx_http_singleflight_phase_e;


/*
 * per request: every request the module looked at has one.  The fields
 * up to "key" are zeroed when it is made; the others, which only a
 * request in a flight uses, once it looks for one
 * (ngx_http_singleflight_ctx_warm(), _reader.c): a request on its own way
 * never pays for them.
 */
typedef struct {
    ngx_http_request_t              *request;
    ngx_http_singleflight_loc_conf_t *conf;       /* where it was collapsed */
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;          /* while it holds a flight */
    ngx_http_singleflight_fetch_t   *fetch;       /* the fetch it hosts */
    ngx_http_singleflight_tee_t     *tee;         /* its own request as its
                                                     flight's fetch
                                                     (_tee.c) */
    ngx_http_singleflight_mirror_conf_t *mirror;  /* mirrors made, this pass */
    ngx_atomic_t                    *claim;       /* its slot (_zone.h) */
    ngx_atomic_uint_t                claim_epoch;
    ngx_atomic_uint_t                claim_mark;
    void                           (*finalize)(ngx_http_request_t *r,
                                               ngx_int_t rc);
                                                  /* its upstream's, which
                                                     _filter.c wraps */
    ngx_uint_t                       status;      /* $singleflight_status */
    ngx_uint_t                       phase;

    unsigned                         warm:1;      /* all its fields are set */
    unsigned                         host:1;      /* reads its own fetch */
    unsigned                         pending:1;   /* it set its slot's
                                                     PENDING (_zone.h) */
    unsigned                         direct:1;    /* went its own way
                                                     (singleflight_lone
                                                     direct) */
    unsigned                         counted:1;   /* a reader of fn */
    unsigned                         woken:1;
    unsigned                         waited:1;    /* its wait is recorded */
    unsigned                         header_sent:1;
    unsigned                         last_sent:1;
    unsigned                         body_read:1;
    unsigned                         hedged:1;    /* its one hedge began */
    unsigned                         was_hedged:1; /* its flight's, kept */
    unsigned                         skips_cache:1; /* proxy_cache_bypass
                                                      holds for it: it
                                                      shares flights only
                                                      with such requests */
    unsigned                         range_sent:1; /* its fetch sends its
                                                      Range (a far or a
                                                      bounded one) */
    unsigned                         buffered:1;  /* its response: no
                                                     flush but its filters'
                                                     (_store.h) */
    unsigned                         creds:2;     /* NGX_HTTP_SINGLEFLIGHT_
                                                     CREDS_..., with
                                                     singleflight_credentials
                                                     http */

    /* zeroed by ngx_http_singleflight_ctx_warm() */

    ngx_str_t                        key;         /* class byte first */
    ngx_uint_t                       redirects;   /* its response's */
    ngx_msec_t                       wait_start;
    ngx_msec_t                       wait_time;
    ngx_uint_t                       resumes;     /* its flight's, kept */
    ngx_http_singleflight_fetch_t   *fetches;     /* every one it hosted,
                                                     oldest first */
    ngx_pool_t                      *pool;        /* theirs (_fetch.c) */
    ngx_http_singleflight_waiter_t   waiter;
    ngx_http_singleflight_cursor_t   cursor;
    u_char                          *predict;     /* its variant, foreseen */
    size_t                           predict_len;
    uint32_t                         hash;
    ngx_atomic_uint_t                seen;        /* fn->seq when looked */
    ngx_uint_t                       generation;
    ngx_uint_t                       rejoins;
    ngx_uint_t                       cut_retries;
    ngx_uint_t                       uri_changes; /* r's, when it joined */
    off_t                            until;       /* its answer ends at this
                                                     offset of the body (a
                                                     range nginx cut from
                                                     it), 0: at its end */

    ngx_pool_cleanup_t               cln;         /* in its request's pool's
                                                     list; last, not zeroed */
} ngx_http_singleflight_ctx_t;


/*
 * What a fetch asks of its host's reader (_reader.c): calls run from the
 * reader down to its fetch, and come back up only through these, given to
 * _fetch.c at postconfiguration (as nginx's upstream calls back into the
 * module that made it only through the callbacks it was given).
 */
typedef struct {
    ngx_int_t                      (*arm)(ngx_http_request_t *r);
    ngx_int_t                      (*direct_done)(
                                        ngx_http_singleflight_ctx_t *ctx,
                                        ngx_http_singleflight_node_t *fn,
                                        ngx_uint_t generation);
    ngx_http_singleflight_waiter_t *(*host_waiter)(
                                        ngx_http_singleflight_ctx_t *ctx,
                                        ngx_http_singleflight_node_t *fn);
} ngx_http_singleflight_fetch_host_t;


/*
 * A walk over a list of header lines, zeroed first: list_next() below, and
 * vary_header() (_vary.c), which goes on into the hidden upstream ones.
 */
typedef struct {
    ngx_list_part_t                 *part;
    ngx_uint_t                       i;
    ngx_uint_t                       hidden;
} ngx_http_singleflight_walk_t;


extern ngx_module_t  ngx_http_singleflight_module;


/*
 * The next header line of "list", one a call, NULL after the last: nginx's
 * walk over a list's parts.  It skips none (hash 0 is the caller's).
 */

static ngx_inline ngx_table_elt_t *
ngx_http_singleflight_list_next(ngx_list_t *list,
    ngx_http_singleflight_walk_t *w)
{
    if (w->part == NULL) {
        w->part = &list->part;
        w->i = 0;
    }

    while (w->i >= w->part->nelts) {

        if (w->part->next == NULL) {
            return NULL;
        }

        w->part = w->part->next;
        w->i = 0;
    }

    return (ngx_table_elt_t *) w->part->elts + w->i++;
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_H_INCLUDED_ */
