/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The singleflight_stats content handler: every zone's counters and
 * gauges, in total and per instance (per NUMA node, per worker), as JSON
 * or in the Prometheus text exposition format.  Counters live in shared
 * memory, so they survive a reload with their zone.
 *
 * Three histograms of times sit with the counters: how long followers
 * waited for their header, and how long flights took to their header and
 * to their last byte.  Their buckets span a 1 ms origin and a 10 s one;
 * each observation is one atomic add to its bucket and one to the sum,
 * no lock, and a reader adds them up into Prometheus's cumulative form.
 */


#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_zone.h"


#define NGX_HTTP_SINGLEFLIGHT_STATS_JSON        0
#define NGX_HTTP_SINGLEFLIGHT_STATS_PROMETHEUS  1


typedef struct {
    ngx_str_t   name;          /* in JSON */
    ngx_str_t   metric;        /* nginx_singleflight_... */
    char       *help;
    ngx_uint_t  offset;
} ngx_http_singleflight_field_t;


#define ngx_http_singleflight_counter(name, metric, help)                     \
    { ngx_string(#name), ngx_string("nginx_singleflight_" metric), help,      \
      offsetof(ngx_http_singleflight_counters_t, name) }

#define ngx_http_singleflight_gauge(name, metric, help)                       \
    { ngx_string(#name), ngx_string("nginx_singleflight_" metric), help,      \
      offsetof(ngx_http_singleflight_gauges_t, name) }


static ngx_http_singleflight_field_t  ngx_http_singleflight_counters[] = {
    ngx_http_singleflight_counter(flights, "flights_total",
        "Flights started: a leader's fetch went upstream."),
    ngx_http_singleflight_counter(followers, "followers_total",
        "Requests that joined a flight."),
    ngx_http_singleflight_counter(served, "followers_served_total",
        "Followers answered with their flight's response."),
    ngx_http_singleflight_counter(late_joins, "late_joins_total",
        "Followers that joined a flight while its body streamed."),
    ngx_http_singleflight_counter(unstored, "unstored_total",
        "Flights whose response went to their leader alone, not stored: "
        "nobody else waited at its header (singleflight_lazy)."),
    ngx_http_singleflight_counter(resumes, "resumes_total",
        "Broken responses resumed by a Range request (singleflight_resume)."),
    ngx_http_singleflight_counter(resume_failures, "resume_failures_total",
        "Resumes the origin did not answer with the rest of the same "
        "representation."),
    ngx_http_singleflight_counter(hedges, "hedges_total",
        "Second fetches started for a slow header (singleflight_hedge)."),
    ngx_http_singleflight_counter(hedge_wins, "hedge_wins_total",
        "Second fetches whose header came first."),
    ngx_http_singleflight_counter(retries, "retries_total",
        "Fetches made again after an origin failure (singleflight_promote)."),
    ngx_http_singleflight_counter(promotions, "promotions_total",
        "Followers that took over a flight whose fetch was gone."),
    ngx_http_singleflight_counter(timeouts, "timeouts_total",
        "Followers that gave up waiting (singleflight_timeout)."),
    ngx_http_singleflight_counter(errors, "errors_total",
        "Followers answered with an error status."),
    ngx_http_singleflight_counter(cut, "cut_total",
        "Responses broken off because their flight's body broke off."),
    ngx_http_singleflight_counter(dead_leaders, "dead_leaders_total",
        "Flights whose fetching worker process died."),
    ngx_http_singleflight_counter(abandoned, "abandoned_total",
        "Fetches stopped because nobody read their flight any more."),
    ngx_http_singleflight_counter(not_shared, "not_shared_total",
        "Followers sent upstream: their flight's response was not shareable."),
    ngx_http_singleflight_counter(oversized, "oversized_total",
        "Responses larger than singleflight_max_size."),
    ngx_http_singleflight_counter(bypassed, "bypassed_total",
        "Requests not collapsed: singleflight_bypass, an empty key, a body."),
    ngx_http_singleflight_counter(direct, "direct_total",
        "Requests that went upstream on their own with nobody to share "
        "with (singleflight_lone direct)."),
    ngx_http_singleflight_counter(loops, "loops_total",
        "Requests recognised as this nginx's own fetches, not collapsed."),
    ngx_http_singleflight_counter(overflows, "overflows_total",
        "Requests past singleflight_max_waiters."),
    ngx_http_singleflight_counter(private, "private_total",
        "Requests not collapsed: credentials, or a key marked private."),
    ngx_http_singleflight_counter(vary_mismatches, "vary_mismatches_total",
        "Followers whose Vary values differed from their flight's."),
    ngx_http_singleflight_counter(forgotten, "forgotten_total",
        "Flights unlinked by singleflight_forget."),
    ngx_http_singleflight_counter(no_memory, "no_memory_total",
        "Allocations refused because the zone was full."),
    ngx_http_singleflight_counter(bytes_shared, "shared_bytes_total",
        "Body bytes sent to followers from their flights."),
    ngx_http_singleflight_counter(spilled, "spilled_total",
        "Flights whose body went on in a temporary file."),
    ngx_http_singleflight_counter(nospill, "nospill_total",
        "Flights that could have no temporary file and went on in the zone."),
    ngx_http_singleflight_counter(wakeups, "wakeups_total",
        "Wake-up messages sent to other workers (one covers many flights)."),
    ngx_http_singleflight_counter(notify_failed, "wakeup_failures_total",
        "Wake-ups of other workers that could not be sent."),
    { ngx_null_string, ngx_null_string, NULL, 0 }
};


static ngx_http_singleflight_field_t  ngx_http_singleflight_gauges[] = {
    ngx_http_singleflight_gauge(in_flight, "in_flight",
        "Flights that requests can join."),
    ngx_http_singleflight_gauge(waiters, "waiters",
        "Followers waiting for their flight's response header."),
    ngx_http_singleflight_gauge(readers, "readers",
        "Requests reading a flight, leaders included."),
    ngx_http_singleflight_gauge(marks, "private_marks",
        "Keys marked private for a while."),
    ngx_http_singleflight_gauge(workers, "workers",
        "Worker processes attached to the zone."),
    ngx_http_singleflight_gauge(pages_used, "zone_pages_used",
        "Slab pages of the zone in use."),
    ngx_http_singleflight_gauge(pages_free, "zone_pages_free",
        "Slab pages of the zone free."),
    ngx_http_singleflight_gauge(pages_baseline, "zone_pages_baseline",
        "Slab pages the empty zone uses."),
    { ngx_null_string, ngx_null_string, NULL, 0 }
};


typedef struct {
    ngx_str_t   name;          /* in JSON */
    ngx_str_t   metric;        /* nginx_singleflight_..._seconds */
    char       *help;
    ngx_uint_t  offset;
} ngx_http_singleflight_hfield_t;


#define ngx_http_singleflight_hist(field, name, metric, help)                 \
    { ngx_string(name "_ms"), ngx_string("nginx_singleflight_" metric),       \
      help, offsetof(ngx_http_singleflight_counters_t, field) }


static ngx_http_singleflight_hfield_t  ngx_http_singleflight_histograms[] = {
    ngx_http_singleflight_hist(wait, "wait", "wait_seconds",
        "How long followers waited for their flight's response header."),
    ngx_http_singleflight_hist(header, "flight_header", "flight_header_seconds",
        "From a flight's start to a response header from its origin."),
    ngx_http_singleflight_hist(body, "flight", "flight_seconds",
        "From a flight's start to the last byte of its response."),
    { ngx_null_string, ngx_null_string, NULL, 0 }
};


/* the buckets' upper bounds: milliseconds, and "le" in seconds */

static ngx_msec_int_t  ngx_http_singleflight_bounds[] = {
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000
};

static char  *ngx_http_singleflight_le[] = {
    "0.001", "0.002", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5", "1", "2.5", "5", "10", "30", "+Inf"
};


/* a snapshot of one instance */
typedef struct {
    ngx_str_t                          label;     /* Prometheus labels */
    ngx_str_t                          json;      /* its JSON key/value */
    ngx_http_singleflight_counters_t   counters;
    ngx_http_singleflight_gauges_t     gauges;
} ngx_http_singleflight_view_t;


static ngx_uint_t ngx_http_singleflight_stats_format(ngx_http_request_t *r);
static size_t ngx_http_singleflight_stats_size(
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n);
static u_char *ngx_http_singleflight_stats_prometheus(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n);
static u_char *ngx_http_singleflight_stats_json(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n);
static ngx_array_t *ngx_http_singleflight_views(ngx_http_request_t *r,
    ngx_http_singleflight_zone_conf_t *zc);
static ngx_int_t ngx_http_singleflight_view_instance(ngx_http_request_t *r,
    ngx_array_t *views, ngx_http_singleflight_zone_t *zone);
static ngx_int_t ngx_http_singleflight_view_worker(ngx_http_request_t *r,
    ngx_array_t *views, ngx_http_singleflight_worker_stats_t *ws,
    ngx_uint_t slot);
static void ngx_http_singleflight_read_instance(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_view_t *v);
static void ngx_http_singleflight_add_view(ngx_http_singleflight_view_t *sum,
    ngx_http_singleflight_view_t *v);
static u_char *ngx_http_singleflight_json_fields(u_char *p,
    ngx_http_singleflight_view_t *v);
static u_char *ngx_http_singleflight_prometheus(u_char *p,
    ngx_http_singleflight_field_t *f, ngx_str_t *zone, ngx_array_t *views,
    ngx_uint_t counter);
static size_t ngx_http_singleflight_histograms_size(size_t line);
static u_char *ngx_http_singleflight_json_histograms(u_char *p,
    ngx_http_singleflight_view_t *v);
static u_char *ngx_http_singleflight_prometheus_histogram(u_char *p,
    ngx_http_singleflight_hfield_t *h, ngx_str_t *zone, ngx_array_t *views);


char *
ngx_http_singleflight_stats(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    value = cf->args->elts;

    sfcf->stats_format = NGX_HTTP_SINGLEFLIGHT_STATS_JSON;

    if (cf->args->nelts == 2) {
        if (ngx_strcmp(value[1].data, "prometheus") == 0) {
            sfcf->stats_format = NGX_HTTP_SINGLEFLIGHT_STATS_PROMETHEUS;

        } else if (ngx_strcmp(value[1].data, "json") != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid format \"%V\" in \"%V\" directive, "
                               "it must be \"json\" or \"prometheus\"",
                               &value[1], &cmd->name);
            return NGX_CONF_ERROR;
        }
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_singleflight_stats_handler;

    return NGX_CONF_OK;
}


/* one time into a histogram: its bucket, then its sum */

void
ngx_http_singleflight_stats_observe(ngx_http_singleflight_histogram_t *h,
    ngx_msec_int_t ms)
{
    ngx_uint_t  i;

    if (ms < 0) {
        ms = 0;
    }

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS - 1; i++) {
        if (ms <= ngx_http_singleflight_bounds[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&h->bucket[i], 1);
    (void) ngx_atomic_fetch_add(&h->sum, (ngx_atomic_int_t) ms);
}


/*
 * The upper bound of the bucket that holds the p-th percentile of a
 * histogram, in milliseconds; 0 with fewer than "min" observations.
 */

ngx_msec_t
ngx_http_singleflight_stats_percentile(ngx_http_singleflight_histogram_t *h,
    ngx_uint_t p, ngx_uint_t min)
{
    ngx_uint_t  i, total, seen, want;

    total = 0;

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS; i++) {
        total += h->bucket[i];
    }

    if (total < min || total == 0) {
        return 0;
    }

    want = (total * p + 99) / 100;
    seen = 0;

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS - 1; i++) {
        seen += h->bucket[i];

        if (seen >= want) {
            return (ngx_msec_t) ngx_http_singleflight_bounds[i];
        }
    }

    /* past the last bound */
    return (ngx_msec_t) ngx_http_singleflight_bounds[
                                          NGX_HTTP_SINGLEFLIGHT_BUCKETS - 2];
}


ngx_int_t
ngx_http_singleflight_stats_handler(ngx_http_request_t *r)
{
    size_t                               size;
    ngx_int_t                            rc;
    ngx_buf_t                           *b;
    ngx_uint_t                           i, n;
    ngx_chain_t                          out;
    ngx_array_t                        **views;
    ngx_http_singleflight_zone_conf_t  **zones;
    ngx_http_singleflight_main_conf_t   *smcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    zones = smcf->zones.elts;
    n = smcf->zones.nelts;

    /* snapshots first, each under its instance's lock; then the size */

    views = ngx_palloc(r->pool, (n + 1) * sizeof(ngx_array_t *));
    if (views == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    for (i = 0; i < n; i++) {
        views[i] = ngx_http_singleflight_views(r, zones[i]);
        if (views[i] == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    size = ngx_http_singleflight_stats_size(zones, views, n);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_singleflight_stats_format(r)
        == NGX_HTTP_SINGLEFLIGHT_STATS_PROMETHEUS)
    {
        b->last = ngx_http_singleflight_stats_prometheus(b->last, zones,
                                                         views, n);
        ngx_str_set(&r->headers_out.content_type,
                    "text/plain; version=0.0.4");

    } else {
        b->last = ngx_http_singleflight_stats_json(b->last, zones, views, n);
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
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


/* singleflight_stats's format, or the one ?format= asks for */

static ngx_uint_t
ngx_http_singleflight_stats_format(ngx_http_request_t *r)
{
    ngx_str_t                          arg;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);

    if (ngx_http_arg(r, (u_char *) "format", 6, &arg) == NGX_OK) {
        if (arg.len == 10 && ngx_strncmp(arg.data, "prometheus", 10) == 0) {
            return NGX_HTTP_SINGLEFLIGHT_STATS_PROMETHEUS;
        }

        if (arg.len == 4 && ngx_strncmp(arg.data, "json", 4) == 0) {
            return NGX_HTTP_SINGLEFLIGHT_STATS_JSON;
        }
    }

    return sfcf->stats_format;
}


/*
 * The most either format takes: every zone's escaped name
 * (ngx_escape_json() makes up to 6 bytes of one) once per line it is on,
 * every field of every view, the Prometheus HELP and TYPE lines.
 */

static size_t
ngx_http_singleflight_stats_size(ngx_http_singleflight_zone_conf_t **zones,
    ngx_array_t **views, ngx_uint_t n)
{
    size_t                          size, namelen, line;
    ngx_uint_t                      i, j, nviews;
    ngx_http_singleflight_view_t   *v;
    ngx_http_singleflight_field_t  *f;

    size = sizeof("{\"zones\":{}}\n");

    for (i = 0; i < n; i++) {
        nviews = views[i]->nelts;
        namelen = 6 * zones[i]->name.len;

        size += namelen + 64 + nviews * (NGX_INT_T_LEN + 64);

        v = views[i]->elts;

        for (j = 0; j < nviews; j++) {
            line = namelen + v[j].label.len + v[j].json.len
                   + NGX_ATOMIC_T_LEN + 64;

            for (f = ngx_http_singleflight_counters; f->name.len; f++) {
                size += f->metric.len + f->name.len + line;
            }

            for (f = ngx_http_singleflight_gauges; f->name.len; f++) {
                size += f->metric.len + f->name.len + line;
            }

            size += ngx_http_singleflight_histograms_size(line);
        }
    }

    for (f = ngx_http_singleflight_counters; f->name.len; f++) {
        size += ngx_strlen(f->help) + 2 * f->metric.len + 64;
    }

    for (f = ngx_http_singleflight_gauges; f->name.len; f++) {
        size += ngx_strlen(f->help) + 2 * f->metric.len + 64;
    }

    return size + ngx_http_singleflight_histograms_size(0);
}


/* Prometheus' text format: each metric's HELP and TYPE, then its zones */

static u_char *
ngx_http_singleflight_stats_prometheus(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n)
{
    ngx_uint_t                       i;
    ngx_http_singleflight_field_t   *f;
    ngx_http_singleflight_hfield_t  *h;

    for (f = ngx_http_singleflight_counters; f->name.len; f++) {
        p = ngx_sprintf(p, "# HELP %V %s\n# TYPE %V counter\n",
                        &f->metric, f->help, &f->metric);

        for (i = 0; i < n; i++) {
            p = ngx_http_singleflight_prometheus(p, f, &zones[i]->name,
                                                 views[i], 1);
        }
    }

    for (f = ngx_http_singleflight_gauges; f->name.len; f++) {
        p = ngx_sprintf(p, "# HELP %V %s\n# TYPE %V gauge\n",
                        &f->metric, f->help, &f->metric);

        for (i = 0; i < n; i++) {
            p = ngx_http_singleflight_prometheus(p, f, &zones[i]->name,
                                                 views[i], 0);
        }
    }

    for (h = ngx_http_singleflight_histograms; h->name.len; h++) {
        p = ngx_sprintf(p, "# HELP %V %s\n# TYPE %V histogram\n",
                        &h->metric, h->help, &h->metric);

        for (i = 0; i < n; i++) {
            p = ngx_http_singleflight_prometheus_histogram(p, h,
                                                           &zones[i]->name,
                                                           views[i]);
        }
    }

    return p;
}


/* JSON: each zone, its total (the first view), then its instances */

static u_char *
ngx_http_singleflight_stats_json(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n)
{
    ngx_uint_t                     i, j;
    ngx_http_singleflight_view_t  *v;

    p = ngx_cpymem(p, "{\"zones\":{", sizeof("{\"zones\":{") - 1);

    for (i = 0; i < n; i++) {
        v = views[i]->elts;

        if (i > 0) {
            *p++ = ',';
        }

        *p++ = '"';
        p = (u_char *) ngx_escape_json(p, zones[i]->name.data,
                                       zones[i]->name.len);
        p = ngx_sprintf(p, "\":{\"scope\":\"%V\",",
                        &ngx_http_singleflight_scopes[zones[i]->scope]);
        p = ngx_http_singleflight_json_fields(p, &v[0]);
        p = ngx_cpymem(p, ",\"instances\":[", sizeof(",\"instances\":[") - 1);

        for (j = 1; j < views[i]->nelts; j++) {
            if (j > 1) {
                *p++ = ',';
            }

            p = ngx_sprintf(p, "{%V,", &v[j].json);
            p = ngx_http_singleflight_json_fields(p, &v[j]);
            *p++ = '}';
        }

        p = ngx_cpymem(p, "]}", 2);
    }

    return ngx_cpymem(p, "}}\n", sizeof("}}\n") - 1);
}


/* the zone's views: its total first, then one per instance */

static ngx_array_t *
ngx_http_singleflight_views(ngx_http_request_t *r,
    ngx_http_singleflight_zone_conf_t *zc)
{
    ngx_uint_t                             i;
    ngx_array_t                           *views;
    ngx_http_singleflight_view_t          *sum;
    ngx_http_singleflight_zone_t         **zp;
    ngx_http_singleflight_worker_stats_t  *ws;

    views = ngx_array_create(r->pool, 4, sizeof(ngx_http_singleflight_view_t));
    if (views == NULL) {
        return NULL;
    }

    sum = ngx_array_push(views);
    if (sum == NULL) {
        return NULL;
    }

    ngx_memzero(sum, sizeof(ngx_http_singleflight_view_t));

    zp = zc->instances.elts;

    for (i = 0; i < zc->instances.nelts; i++) {
        if (ngx_http_singleflight_view_instance(r, views, zp[i]) != NGX_OK) {
            return NULL;
        }
    }

    for (i = 0; zc->stats != NULL && i < zc->nstats; i++) {
        ws = &zc->stats[i];

        if (ws->pid == 0 && ws->counters.flights == 0
            && ws->counters.followers == 0
            && ws->counters.bypassed == 0
            && ws->counters.direct == 0
            && ws->counters.private == 0)
        {
            continue;
        }

        if (ngx_http_singleflight_view_worker(r, views, ws, i) != NGX_OK) {
            return NULL;
        }
    }

    return views;
}


/* a view of one instance of the zone, added to the sum (the first view) */

static ngx_int_t
ngx_http_singleflight_view_instance(ngx_http_request_t *r,
    ngx_array_t *views, ngx_http_singleflight_zone_t *zone)
{
    u_char                        *p;
    ngx_http_singleflight_view_t  *v;

    v = ngx_array_push(views);
    if (v == NULL) {
        return NGX_ERROR;
    }

    ngx_http_singleflight_read_instance(zone, v);

    p = ngx_pnalloc(r->pool, 64);
    if (p == NULL) {
        return NGX_ERROR;
    }

    if (zone->node == -1) {
        v->label.len = 0;
        v->json.data = p;
        v->json.len = ngx_sprintf(p, "\"scope\":\"process\"") - p;

    } else {
        v->label.data = p;
        v->label.len = ngx_sprintf(p, ",node=\"%i\"", zone->node) - p;
        v->json.data = p + v->label.len;
        v->json.len = ngx_sprintf(v->json.data, "\"node\":%i", zone->node)
                      - v->json.data;
    }

    /* the array may have moved: the sum is its first element */
    ngx_http_singleflight_add_view(views->elts, v);

    return NGX_OK;
}


/*
 * A view of worker "slot"'s counters, added to the sum; a worker that has
 * exited keeps its counters in its slot.
 */

static ngx_int_t
ngx_http_singleflight_view_worker(ngx_http_request_t *r, ngx_array_t *views,
    ngx_http_singleflight_worker_stats_t *ws, ngx_uint_t slot)
{
    u_char                        *p;
    ngx_http_singleflight_view_t  *v;

    v = ngx_array_push(views);
    if (v == NULL) {
        return NGX_ERROR;
    }

    v->counters = ws->counters;
    v->gauges = ws->gauges;

    p = ngx_pnalloc(r->pool, 2 * NGX_INT_T_LEN + 64);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->label.data = p;
    v->label.len = ngx_sprintf(p, ",worker=\"%ui\"", slot) - p;
    v->json.data = p + v->label.len;
    v->json.len = ngx_sprintf(v->json.data, "\"worker\":%ui,\"pid\":%P",
                              slot, ws->pid)
                  - v->json.data;

    ngx_http_singleflight_add_view(views->elts, v);

    return NGX_OK;
}


static void
ngx_http_singleflight_read_instance(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_view_t *v)
{
    ngx_memzero(v, sizeof(ngx_http_singleflight_view_t));

    ngx_http_singleflight_lock(zone);

    /* marks that expired while nobody asked for their key */
    ngx_http_singleflight_expire_locked(zone, 64);

    v->counters = *zone->counters;
    ngx_http_singleflight_zone_gauges(zone, &v->gauges);

    ngx_http_singleflight_unlock(zone);
}


static void
ngx_http_singleflight_add_view(ngx_http_singleflight_view_t *sum,
    ngx_http_singleflight_view_t *v)
{
    ngx_uint_t                          i;
    ngx_atomic_t                       *a, *b;
    ngx_uint_t                         *x, *y;
    ngx_http_singleflight_field_t      *f;
    ngx_http_singleflight_hfield_t     *h;
    ngx_http_singleflight_histogram_t  *hs, *hv;

    for (f = ngx_http_singleflight_counters; f->name.len; f++) {
        a = (ngx_atomic_t *) ((char *) &sum->counters + f->offset);
        b = (ngx_atomic_t *) ((char *) &v->counters + f->offset);
        *a += *b;
    }

    for (f = ngx_http_singleflight_gauges; f->name.len; f++) {
        x = (ngx_uint_t *) ((char *) &sum->gauges + f->offset);
        y = (ngx_uint_t *) ((char *) &v->gauges + f->offset);
        *x += *y;
    }

    for (h = ngx_http_singleflight_histograms; h->name.len; h++) {
        hs = (ngx_http_singleflight_histogram_t *)
                 ((char *) &sum->counters + h->offset);
        hv = (ngx_http_singleflight_histogram_t *)
                 ((char *) &v->counters + h->offset);

        for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS; i++) {
            hs->bucket[i] += hv->bucket[i];
        }

        hs->sum += hv->sum;
    }
}


static u_char *
ngx_http_singleflight_json_fields(u_char *p, ngx_http_singleflight_view_t *v)
{
    ngx_http_singleflight_field_t  *f;

    for (f = ngx_http_singleflight_counters; f->name.len; f++) {
        p = ngx_sprintf(p, "\"%V\":%uA,", &f->name,
                        *(ngx_atomic_t *) ((char *) &v->counters + f->offset));
    }

    for (f = ngx_http_singleflight_gauges; f->name.len; f++) {
        p = ngx_sprintf(p, "%s\"%V\":%ui",
                        (f == ngx_http_singleflight_gauges) ? "" : ",",
                        &f->name,
                        *(ngx_uint_t *) ((char *) &v->gauges + f->offset));
    }

    return ngx_http_singleflight_json_histograms(p, v);
}


/* one sample per instance; the zone's total is for JSON only */

static u_char *
ngx_http_singleflight_prometheus(u_char *p, ngx_http_singleflight_field_t *f,
    ngx_str_t *zone, ngx_array_t *views, ngx_uint_t counter)
{
    ngx_uint_t                     i, value;
    ngx_http_singleflight_view_t  *v;

    v = views->elts;

    for (i = 1; i < views->nelts; i++) {
        value = counter
                ? *(ngx_atomic_t *) ((char *) &v[i].counters + f->offset)
                : *(ngx_uint_t *) ((char *) &v[i].gauges + f->offset);

        p = ngx_sprintf(p, "%V{zone=\"", &f->metric);
        p = (u_char *) ngx_escape_json(p, zone->data, zone->len);
        p = ngx_sprintf(p, "\"%V} %ui\n", &v[i].label, value);
    }

    return p;
}


/* room for the histograms: of one view ("line" per sample), or the HELPs */

static size_t
ngx_http_singleflight_histograms_size(size_t line)
{
    size_t                           size;
    ngx_http_singleflight_hfield_t  *h;

    size = 0;

    for (h = ngx_http_singleflight_histograms; h->name.len; h++) {
        if (line == 0) {
            size += ngx_strlen(h->help) + 2 * h->metric.len + 64;
            continue;
        }

        /* JSON: the name, each bucket's bound and count, sum and count */
        size += h->name.len + 64
                + NGX_HTTP_SINGLEFLIGHT_BUCKETS * (NGX_ATOMIC_T_LEN + 16);

        /* Prometheus: a bucket per line, then _sum and _count */
        size += (NGX_HTTP_SINGLEFLIGHT_BUCKETS + 2)
                * (h->metric.len + line + 32);
    }

    return size;
}


/* "wait_ms":{"le":[1,...],"buckets":[cumulative...],"sum":S,"count":C} */

static u_char *
ngx_http_singleflight_json_histograms(u_char *p,
    ngx_http_singleflight_view_t *v)
{
    ngx_uint_t                          i;
    ngx_atomic_uint_t                   n;
    ngx_http_singleflight_hfield_t     *h;
    ngx_http_singleflight_histogram_t  *hg;

    for (h = ngx_http_singleflight_histograms; h->name.len; h++) {
        hg = (ngx_http_singleflight_histogram_t *)
                 ((char *) &v->counters + h->offset);

        p = ngx_sprintf(p, ",\"%V\":{\"le\":[", &h->name);

        for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS - 1; i++) {
            p = ngx_sprintf(p, "%s%M", i ? "," : "",
                            ngx_http_singleflight_bounds[i]);
        }

        p = ngx_cpymem(p, "],\"buckets\":[", sizeof("],\"buckets\":[") - 1);

        n = 0;

        for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS; i++) {
            n += hg->bucket[i];
            p = ngx_sprintf(p, "%s%uA", i ? "," : "", n);
        }

        p = ngx_sprintf(p, "],\"sum\":%uA,\"count\":%uA}", hg->sum, n);
    }

    return p;
}


/* one histogram of each instance, cumulative, in seconds */

static u_char *
ngx_http_singleflight_prometheus_histogram(u_char *p,
    ngx_http_singleflight_hfield_t *h, ngx_str_t *zone, ngx_array_t *views)
{
    ngx_uint_t                          i, j;
    ngx_atomic_uint_t                   n;
    ngx_http_singleflight_view_t       *v;
    ngx_http_singleflight_histogram_t  *hg;

    v = views->elts;

    for (i = 1; i < views->nelts; i++) {
        hg = (ngx_http_singleflight_histogram_t *)
                 ((char *) &v[i].counters + h->offset);
        n = 0;

        for (j = 0; j < NGX_HTTP_SINGLEFLIGHT_BUCKETS; j++) {
            n += hg->bucket[j];

            p = ngx_sprintf(p, "%V_bucket{zone=\"", &h->metric);
            p = (u_char *) ngx_escape_json(p, zone->data, zone->len);
            p = ngx_sprintf(p, "\"%V,le=\"%s\"} %uA\n", &v[i].label,
                            ngx_http_singleflight_le[j], n);
        }

        p = ngx_sprintf(p, "%V_sum{zone=\"", &h->metric);
        p = (u_char *) ngx_escape_json(p, zone->data, zone->len);
        p = ngx_sprintf(p, "\"%V} %uA.%03uA\n", &v[i].label,
                        hg->sum / 1000, hg->sum % 1000);

        p = ngx_sprintf(p, "%V_count{zone=\"", &h->metric);
        p = (u_char *) ngx_escape_json(p, zone->data, zone->len);
        p = ngx_sprintf(p, "\"%V} %uA\n", &v[i].label, n);
    }

    return p;
}
