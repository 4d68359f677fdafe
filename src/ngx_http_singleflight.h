
/*
 * ngx_http_singleflight_module: types shared by every part of the module.
 *
 * A flight is one in-progress fetch of one key.  Its state lives in a node
 * of the zone's shared rbtree; the requests that wait for it live in the
 * memory of their own worker, grouped per flight (see _handler.c), and are
 * woken either directly (same worker) or through a datagram (see
 * _notify.c).
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* registry slots in a zone: one per live worker that may wait on it */
#define NGX_HTTP_SINGLEFLIGHT_SLOTS      64

/* singleflight_zone scope= */
#define NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS  0
#define NGX_HTTP_SINGLEFLIGHT_SCOPE_NUMA     1
#define NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER   2

#define NGX_HTTP_SINGLEFLIGHT_MAX_NODES      64

/* how often a worker re-checks a flight its requests wait on */
#define NGX_HTTP_SINGLEFLIGHT_POLL       200

/* key classes: HEAD requests may follow a GET flight, not the reverse */
#define NGX_HTTP_SINGLEFLIGHT_CLASS_GET   'G'
#define NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD  'H'
#define NGX_HTTP_SINGLEFLIGHT_CLASS_OTHER 'M'


/* states of a flight */
typedef enum {
    NGX_HTTP_SINGLEFLIGHT_RUNNING = 0,   /* a leader is fetching */
    NGX_HTTP_SINGLEFLIGHT_ORPHANED,      /* the leader failed; promote one */
    NGX_HTTP_SINGLEFLIGHT_DONE,          /* response complete, shareable */
    NGX_HTTP_SINGLEFLIGHT_NOSHARE,       /* not shareable: each goes alone */
    NGX_HTTP_SINGLEFLIGHT_FAILED,        /* failed for good: error status */
    NGX_HTTP_SINGLEFLIGHT_PRIVATE        /* a private response: each goes
                                            alone, and the key stays marked
                                            until "expire" */
} ngx_http_singleflight_state_e;


/* singleflight_promote conditions */
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR     0x0002
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT   0x0004
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_ABORT     0x0008
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_500       0x0010
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_502       0x0020
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_503       0x0040
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_504       0x0080
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF       0x1000


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
    NGX_HTTP_SINGLEFLIGHT_ST_PRIVATE
} ngx_http_singleflight_status_e;


/* singleflight_private conditions */
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_SET_COOKIE  0x0002
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_PRIVATE     0x0004
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_STORE    0x0008
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_CACHE    0x0010
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_OFF         0x1000


/* counters kept in the zone; updated with atomics, read without the lock */
typedef struct {
    ngx_atomic_t                     flights;
    ngx_atomic_t                     followers;
    ngx_atomic_t                     served;
    ngx_atomic_t                     promotions;
    ngx_atomic_t                     timeouts;
    ngx_atomic_t                     errors;
    ngx_atomic_t                     dead_leaders;
    ngx_atomic_t                     not_shared;
    ngx_atomic_t                     oversized;
    ngx_atomic_t                     bypassed;
    ngx_atomic_t                     no_memory;
    ngx_atomic_t                     overflows;
    ngx_atomic_t                     private;
    ngx_atomic_t                     vary_mismatches;
    ngx_atomic_t                     forgotten;
    ngx_atomic_t                     bytes_shared;
    ngx_atomic_t                     notify_failed;
} ngx_http_singleflight_counters_t;


/*
 * A stored response header, one block in the zone: this fixed part, then
 * the status line, the content type and the charset, then per header
 * (each aligned to size_t): key length, value length, whether the leader's
 * headers_out pointed at it (a Location proxy_redirect rewrote, say), key,
 * lower-case key, value; then, at vary_offset, per header named in Vary (aligned alike):
 * name length, value length, name, the leader's request value.  Written by the leader's header filter (_filter.c), read back
 * into each follower's headers_out (_fanout.c).
 */
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
    ngx_uint_t                       allow_ranges;      /* the leader's */
} ngx_http_singleflight_header_t;


typedef struct ngx_http_singleflight_chunk_s  ngx_http_singleflight_chunk_t;

/* a piece of a stored response body; chunks are only ever appended */
struct ngx_http_singleflight_chunk_s {
    ngx_http_singleflight_chunk_t   *next;
    size_t                           size;
    size_t                           len;
    u_char                           data[1];
};


/*
 * A flight, in shared memory.  refs counts the leader (while it leads) and
 * every follower holding the flight; slot_refs and slot_waiters split the
 * followers' share by worker slot, so that what a dead worker held can be
 * given back.
 */
typedef struct {
    ngx_rbtree_node_t                node;        /* key: hash of the key */
    ngx_queue_t                      queue;       /* every node of the zone */
    ngx_queue_t                      mark;        /* private markers */
    ngx_msec_t                       expire;      /* of a private marker */
    uint64_t                         id;          /* unique in the zone */
    uint64_t                         wait_mask;   /* slots with waiters */
    ngx_pid_t                        leader_pid;
    ngx_uint_t                       generation;  /* bumped per leader */
    ngx_uint_t                       refs;        /* leader + followers */
    ngx_uint_t                       waiters;     /* followers waiting */
    ngx_uint_t                       promotions;
    ngx_uint_t                       promote_tries;
    ngx_uint_t                       fail_status; /* 0: error_status */
    ngx_msec_t                       start;
    unsigned                         state:4;
    unsigned                         linked:1;
    unsigned                         header_only:1;

    u_char                          *header;      /* see _filter.c */
    size_t                           header_len;
    ngx_http_singleflight_chunk_t   *first;
    ngx_http_singleflight_chunk_t   *last;
    off_t                            body_len;

    uint16_t                         slot_refs[NGX_HTTP_SINGLEFLIGHT_SLOTS];
    uint16_t                         slot_waiters[NGX_HTTP_SINGLEFLIGHT_SLOTS];

    size_t                           key_len;
    u_char                           key[1];
} ngx_http_singleflight_node_t;


/* gauges of a zone instance */
typedef struct {
    ngx_uint_t                       in_flight;   /* linked flights */
    ngx_uint_t                       waiters;
    ngx_uint_t                       pages_used;
    ngx_uint_t                       pages_free;
    ngx_uint_t                       pages_baseline;
} ngx_http_singleflight_gauges_t;


/*
 * The shared part of a zone instance: the whole zone for scope=process,
 * one per NUMA node for scope=numa, and for scope=worker one in each
 * worker's own memory.
 */
typedef struct {
    ngx_rbtree_t                     rbtree;
    ngx_rbtree_node_t                sentinel;
    ngx_queue_t                      nodes;
    ngx_queue_t                      marks;       /* by expiry */
    uint64_t                         next_id;
    time_t                           nomem_logged;
    ngx_pid_t                        slots[NGX_HTTP_SINGLEFLIGHT_SLOTS];
    ngx_uint_t                       baseline;    /* pages used when idle */
    ngx_uint_t                       in_flight;
    ngx_uint_t                       waiters;
    ngx_http_singleflight_counters_t counters;
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


typedef struct ngx_http_singleflight_zone_conf_s
    ngx_http_singleflight_zone_conf_t;


/* a zone instance, in each process's own memory */
typedef struct {
    ngx_http_singleflight_shctx_t   *sh;
    ngx_slab_pool_t                 *shpool;
    ngx_shm_zone_t                  *shm_zone;    /* NULL: scope=worker */
    ngx_http_singleflight_zone_conf_t *conf;
    ngx_http_singleflight_counters_t *counters;
    ngx_http_singleflight_worker_stats_t *wstats; /* scope=worker */
    ngx_str_t                        name;
    uint32_t                         tag;         /* crc32 of the name */
    ngx_int_t                        slot;        /* ours, or -1 */
    ngx_int_t                        node;        /* scope=numa */
    unsigned                         local:1;     /* no lock needed */

    /* per worker: groups of local requests waiting, keyed by flight id */
    ngx_rbtree_t                     groups;
    ngx_rbtree_node_t                groups_sentinel;
} ngx_http_singleflight_zone_t;


/* a zone as configured by singleflight_zone */
struct ngx_http_singleflight_zone_conf_s {
    ngx_str_t                        name;
    size_t                           size;
    ngx_uint_t                       scope;
    ngx_array_t                      instances;   /* shared ones */
    ngx_http_singleflight_zone_t    *mine;        /* this worker's */

    /* scope=worker */
    ngx_shm_zone_t                  *stats_zone;
    ngx_http_singleflight_worker_stats_t *stats;

    /* scope=numa: the node of each cpu */
    ngx_int_t                       *cpu_node;
    ngx_uint_t                       ncpus;
};


typedef struct {
    ngx_array_t                      zones;       /* of zone_conf pointers */
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
    size_t                           max_size;
    ngx_uint_t                       promote;
    ngx_uint_t                       promote_tries;
    ngx_uint_t                       error_status;
    ngx_flag_t                       share_errors;
    ngx_uint_t                       private;
    ngx_msec_t                       private_ttl;
    ngx_flag_t                       credentials;
    ngx_flag_t                       lazy;
    ngx_flag_t                       enable;      /* NGX_CONF_UNSET: unset */

    /* singleflight_forget */
    ngx_http_singleflight_zone_conf_t *forget_zone;
    ngx_str_t                        forget_zone_name;
    ngx_http_complex_value_t        *forget_key;

    /* singleflight_stats */
    ngx_uint_t                       stats_format;
} ngx_http_singleflight_loc_conf_t;


typedef struct ngx_http_singleflight_group_s  ngx_http_singleflight_group_t;

/* the requests of one worker waiting on one flight */
struct ngx_http_singleflight_group_s {
    ngx_rbtree_node_t                node;        /* key: flight id */
    uint64_t                         id;
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;
    ngx_queue_t                      waiters;
    ngx_event_t                      poll;
};


/* per request */
typedef struct {
    ngx_http_request_t              *request;
    ngx_http_singleflight_loc_conf_t *conf;       /* where it was collapsed */
    ngx_http_singleflight_zone_t    *zone;
    ngx_http_singleflight_node_t    *fn;          /* while we hold a ref */
    ngx_http_singleflight_group_t   *group;       /* while waiting */
    ngx_queue_t                      queue;
    ngx_str_t                        key;
    uint32_t                         hash;
    ngx_uint_t                       generation;  /* leader's stamp */
    ngx_uint_t                       status;      /* _status_e */
    ngx_msec_t                       wait_start;
    ngx_msec_t                       wait_time;
    ngx_http_singleflight_chunk_t   *chunk;       /* leader: append here */
    off_t                            captured;

    ngx_uint_t                       own_status;  /* see follow_own() */

    unsigned                         leader:1;
    unsigned                         capturing:1; /* leader, not yet done */
    unsigned                         no_lead:1;   /* a failed leader waiting */
    unsigned                         waiting:1;
    unsigned                         woken:1;
} ngx_http_singleflight_ctx_t;


extern ngx_module_t  ngx_http_singleflight_module;


#endif /* _NGX_HTTP_SINGLEFLIGHT_H_INCLUDED_ */
