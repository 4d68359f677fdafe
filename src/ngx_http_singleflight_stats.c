
/*
 * The singleflight_stats content handler: per zone counters and gauges as
 * JSON.  Counters live in the zone, so they survive a reload with it.
 */


#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_zone.h"


typedef struct {
    ngx_str_t   name;
    ngx_uint_t  offset;
} ngx_http_singleflight_counter_t;


#define ngx_http_singleflight_counter(name)                                   \
    { ngx_string(#name),                                                      \
      offsetof(ngx_http_singleflight_counters_t, name) }

static ngx_http_singleflight_counter_t  ngx_http_singleflight_counters[] = {
    ngx_http_singleflight_counter(flights),
    ngx_http_singleflight_counter(followers),
    ngx_http_singleflight_counter(served),
    ngx_http_singleflight_counter(promotions),
    ngx_http_singleflight_counter(timeouts),
    ngx_http_singleflight_counter(errors),
    ngx_http_singleflight_counter(dead_leaders),
    ngx_http_singleflight_counter(not_shared),
    ngx_http_singleflight_counter(oversized),
    ngx_http_singleflight_counter(bypassed),
    ngx_http_singleflight_counter(overflows),
    ngx_http_singleflight_counter(private),
    ngx_http_singleflight_counter(vary_mismatches),
    ngx_http_singleflight_counter(forgotten),
    ngx_http_singleflight_counter(no_memory),
    ngx_http_singleflight_counter(bytes_shared),
    ngx_http_singleflight_counter(notify_failed),
    { ngx_null_string, 0 }
};


/* gauges, read under the zone's lock */
typedef struct {
    ngx_uint_t  in_flight;
    ngx_uint_t  waiters;
    ngx_uint_t  pages_used;
    ngx_uint_t  pages_free;
    ngx_uint_t  pages_baseline;
} ngx_http_singleflight_gauges_t;


static void ngx_http_singleflight_gauges(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_gauges_t *g);
static u_char *ngx_http_singleflight_json_zone(u_char *p,
    ngx_http_singleflight_zone_t *zone);


char *
ngx_http_singleflight_stats(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_singleflight_stats_handler;

    return NGX_CONF_OK;
}


ngx_int_t
ngx_http_singleflight_stats_handler(ngx_http_request_t *r)
{
    size_t                              size;
    ngx_int_t                           rc;
    ngx_buf_t                          *b;
    ngx_uint_t                          i;
    ngx_chain_t                         out;
    ngx_http_singleflight_zone_t      **zones;
    ngx_http_singleflight_counter_t    *c;
    ngx_http_singleflight_main_conf_t  *smcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);
    zones = smcf->zones.elts;

    size = sizeof("{\"zones\":{}}\n");

    for (i = 0; i < smcf->zones.nelts; i++) {
        size += sizeof("\"\":{},") + 6 * zones[i]->name.len;

        for (c = ngx_http_singleflight_counters; c->name.len; c++) {
            size += sizeof("\"\":,") + c->name.len + NGX_ATOMIC_T_LEN;
        }

        size += sizeof(ngx_http_singleflight_gauges_t) / sizeof(ngx_uint_t)
                * (sizeof("\"pages_baseline\":,") + NGX_ATOMIC_T_LEN);
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_cpymem(b->last, "{\"zones\":{", sizeof("{\"zones\":{") - 1);

    for (i = 0; i < smcf->zones.nelts; i++) {
        if (i > 0) {
            *b->last++ = ',';
        }

        b->last = ngx_http_singleflight_json_zone(b->last, zones[i]);
    }

    b->last = ngx_cpymem(b->last, "}}\n", sizeof("}}\n") - 1);

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static u_char *
ngx_http_singleflight_json_zone(u_char *p, ngx_http_singleflight_zone_t *zone)
{
    ngx_atomic_t                     *v;
    ngx_http_singleflight_gauges_t    g;
    ngx_http_singleflight_counter_t  *c;

    ngx_http_singleflight_gauges(zone, &g);

    *p++ = '"';
    p = (u_char *) ngx_escape_json(p, zone->name.data, zone->name.len);
    *p++ = '"';
    *p++ = ':';
    *p++ = '{';

    for (c = ngx_http_singleflight_counters; c->name.len; c++) {
        v = (ngx_atomic_t *) ((char *) &zone->sh->counters + c->offset);
        p = ngx_sprintf(p, "\"%V\":%uA,", &c->name, *v);
    }

    p = ngx_sprintf(p, "\"in_flight\":%ui,\"waiters\":%ui,"
                    "\"pages_used\":%ui,\"pages_free\":%ui,"
                    "\"pages_baseline\":%ui}",
                    g.in_flight, g.waiters, g.pages_used, g.pages_free,
                    g.pages_baseline);

    return p;
}


static void
ngx_http_singleflight_gauges(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_gauges_t *g)
{
    ngx_rbtree_node_t             *node, *root, *sentinel;
    ngx_http_singleflight_node_t  *fn;

    ngx_memzero(g, sizeof(ngx_http_singleflight_gauges_t));

    ngx_shmtx_lock(&zone->shpool->mutex);

    ngx_http_singleflight_expire_locked(zone, NGX_MAX_UINT32_VALUE);

    root = zone->sh->rbtree.root;
    sentinel = zone->sh->rbtree.sentinel;

    if (root != sentinel) {
        for (node = ngx_rbtree_min(root, sentinel);
             node;
             node = ngx_rbtree_next(&zone->sh->rbtree, node))
        {
            fn = (ngx_http_singleflight_node_t *) node;
            g->in_flight++;
            g->waiters += fn->waiters;
        }
    }

    g->pages_used = ngx_http_singleflight_pages_used(zone->shpool);
    g->pages_free = zone->shpool->pfree;
    g->pages_baseline = zone->sh->baseline;

    ngx_shmtx_unlock(&zone->shpool->mutex);
}
