/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The singleflight_stats content handler: every zone's counters and
 * gauges, in total and per instance (per NUMA node, per worker), as JSON
 * or in the Prometheus text exposition format.  Counters live in shared
 * memory, so they survive a reload with their zone.
 *
 * One table says what is shown, under Prometheus's names (prometheus.io,
 * "Metric and label naming"): "nginx_singleflight_" and the name, in base
 * units, "_total" on counters, one counter of requests with a "status"
 * label of $singleflight_status's words.  JSON uses the same names less
 * the prefix, a label's values as an object's keys.  Internal counters
 * and gauges are shown with ?diagnostics=1 only; the names of the release
 * before stay for one release, marked deprecated (docs/metrics.md).
 *
 * Three histograms of times sit with the counters: how long followers
 * waited for their header, and how long flights took to their header and
 * to their last byte.  Their buckets span a 1 ms origin and a 10 s one;
 * each observation is one atomic add to its bucket and one to the sum,
 * no lock, and a reader adds them up into Prometheus's cumulative form.
 */


#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_registry.h"


/* 0: not a singleflight_stats location */
#define NGX_HTTP_SINGLEFLIGHT_STATS_JSON        1
#define NGX_HTTP_SINGLEFLIGHT_STATS_PROMETHEUS  2

#define NGX_HTTP_SINGLEFLIGHT_PREFIX  "nginx_singleflight_"

/* the HELP of a name kept one release */
#define NGX_HTTP_SINGLEFLIGHT_USE                                             \
    "Deprecated, use " NGX_HTTP_SINGLEFLIGHT_PREFIX


/* a metric's kind, and where it is shown */
#define NGX_HTTP_SINGLEFLIGHT_COUNTER     0x01
#define NGX_HTTP_SINGLEFLIGHT_GAUGE       0x02
#define NGX_HTTP_SINGLEFLIGHT_HISTOGRAM   0x04
#define NGX_HTTP_SINGLEFLIGHT_KIND        0x07
#define NGX_HTTP_SINGLEFLIGHT_PAGES       0x08  /* slab pages, in bytes */
#define NGX_HTTP_SINGLEFLIGHT_MS          0x10  /* a histogram in ms (JSON) */
#define NGX_HTTP_SINGLEFLIGHT_DIAGNOSTIC  0x20  /* ?diagnostics=1 only */
#define NGX_HTTP_SINGLEFLIGHT_DEPRECATED  0x40  /* a name kept one release */


/* a snapshot of one instance, or of the zone's total */
typedef struct {
    ngx_str_t                          label;     /* Prometheus labels */
    ngx_str_t                          json;      /* its JSON key/value */
    ngx_http_singleflight_counters_t   counters;
    ngx_http_singleflight_gauges_t     gauges;
} ngx_http_singleflight_view_t;


typedef struct {
    ngx_str_t    json;          /* in JSON; empty: not there */
    ngx_str_t    metric;        /* in Prometheus, less the prefix; empty:
                                   not there */
    char        *help;
    ngx_uint_t   flags;
    ngx_uint_t   offset;        /* in a view: its value, or its label's
                                   first value's */
    ngx_str_t    label;         /* empty: one value */
    ngx_str_t   *values;        /* the label's values, one after another */
    ngx_uint_t   nvalues;
} ngx_http_singleflight_metric_t;


#define ngx_http_singleflight_c(field)                                        \
    offsetof(ngx_http_singleflight_view_t, counters.field)

/* an old name of one status's requests_total, the same value */
#define ngx_http_singleflight_st(status)                                      \
    ngx_http_singleflight_c(requests[NGX_HTTP_SINGLEFLIGHT_ST_ ## status])

#define ngx_http_singleflight_g(field)                                        \
    offsetof(ngx_http_singleflight_view_t, gauges.field)

/* under one name in both formats */
#define ngx_http_singleflight_metric(name, flags, offset, help)               \
    { ngx_string(name), ngx_string(name), help, flags, offset,                \
      ngx_null_string, NULL, 0 }

/* with a label: its name, its "n" values */
#define ngx_http_singleflight_labelled(name, flags, offset, label, values, n, \
                                       help)                                  \
    { ngx_string(name), ngx_string(name), help, flags, offset,                \
      ngx_string(label), values, n }

/* a name of the release before: its JSON field, its Prometheus name */
#define ngx_http_singleflight_old(json, metric, flags, offset, help)          \
    { ngx_string(json), ngx_string(metric), help,                             \
      (flags)|NGX_HTTP_SINGLEFLIGHT_DEPRECATED, offset,                       \
      ngx_null_string, NULL, 0 }

#define NGX_HTTP_SINGLEFLIGHT_C   NGX_HTTP_SINGLEFLIGHT_COUNTER
#define NGX_HTTP_SINGLEFLIGHT_G   NGX_HTTP_SINGLEFLIGHT_GAUGE
#define NGX_HTTP_SINGLEFLIGHT_H   NGX_HTTP_SINGLEFLIGHT_HISTOGRAM
#define NGX_HTTP_SINGLEFLIGHT_D   NGX_HTTP_SINGLEFLIGHT_DIAGNOSTIC


/* origin_requests_total's "reason", by NGX_HTTP_SINGLEFLIGHT_ORIGIN_... */
static ngx_str_t  ngx_http_singleflight_origins[] = {
    ngx_string("first"),
    ngx_string("retry"),
    ngx_string("hedge"),
    ngx_string("resume")
};

/*
 * requests_total's "status", by ngx_http_singleflight_status_e: the words
 * of $singleflight_status too
 */
ngx_str_t  ngx_http_singleflight_status_names[] = {
    ngx_null_string,
    ngx_string("LEADER"),
    ngx_string("FOLLOWER"),
    ngx_string("PROMOTED"),
    ngx_string("BYPASS"),
    ngx_string("TIMEOUT"),
    ngx_string("ERROR"),
    ngx_string("NOT_SHARED"),
    ngx_string("NO_MEMORY"),
    ngx_string("OVERFLOW"),
    ngx_string("PRIVATE"),
    ngx_string("LOOP"),
    ngx_string("DIRECT")
};


/* zone_bytes's "state": pages_used, then pages_free */
static ngx_str_t  ngx_http_singleflight_states[] = {
    ngx_string("used"),
    ngx_string("free")
};


static ngx_http_singleflight_metric_t  ngx_http_singleflight_metrics[] = {

    /* what an operator graphs */

    ngx_http_singleflight_labelled("requests_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(requests[1]), "status",
        &ngx_http_singleflight_status_names[1],
        NGX_HTTP_SINGLEFLIGHT_STATUSES - 1,
        "Requests the module looked at, by their final $singleflight_status, "
        "counted as they end."),
    ngx_http_singleflight_labelled("origin_requests_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(origin_requests[0]),
        "reason", ngx_http_singleflight_origins,
        NGX_HTTP_SINGLEFLIGHT_ORIGINS,
        "Fetches that went to the origin: a flight's first, a retry or "
        "takeover, a hedge, a resume."),
    ngx_http_singleflight_metric("shared_bytes_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(bytes_shared),
        "Body bytes sent to followers from their flights."),
    ngx_http_singleflight_metric("hedge_wins_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(hedge_wins),
        "Second fetches whose header came first (singleflight_hedge)."),
    ngx_http_singleflight_metric("resumes_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(resumes),
        "Broken responses resumed (singleflight_resume)."),
    ngx_http_singleflight_metric("resume_failures_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(resume_failures),
        "Resumes the origin did not answer with the rest of the same "
        "representation."),
    ngx_http_singleflight_metric("unstored_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(unstored),
        "Flights whose response went to their leader alone, not stored: "
        "nobody else waited at its header (singleflight_lazy)."),
    ngx_http_singleflight_metric("vary_mismatches_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(vary_mismatches),
        "Followers whose Vary values differed from their flight's."),
    ngx_http_singleflight_metric("oversized_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(oversized),
        "Responses larger than the zone's max_size=."),
    ngx_http_singleflight_metric("cut_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(cut),
        "Responses broken off because their flight's body broke off."),
    ngx_http_singleflight_metric("dead_leaders_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(dead_leaders),
        "Flights whose fetching worker process died."),
    ngx_http_singleflight_metric("abandoned_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(abandoned),
        "Fetches stopped because nobody read their flight any more."),
    ngx_http_singleflight_metric("forgotten_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(forgotten),
        "Flights unlinked by singleflight_forget."),
    ngx_http_singleflight_metric("no_memory_total", NGX_HTTP_SINGLEFLIGHT_C,
        ngx_http_singleflight_c(no_memory),
        "Allocations refused because the zone was full."),

    ngx_http_singleflight_metric("in_flight", NGX_HTTP_SINGLEFLIGHT_G,
        ngx_http_singleflight_g(in_flight),
        "Flights that requests can join."),
    ngx_http_singleflight_metric("waiters", NGX_HTTP_SINGLEFLIGHT_G,
        ngx_http_singleflight_g(waiters),
        "Followers waiting for their flight's response header."),
    ngx_http_singleflight_metric("readers", NGX_HTTP_SINGLEFLIGHT_G,
        ngx_http_singleflight_g(readers),
        "Requests reading a flight, leaders included."),
    ngx_http_singleflight_metric("workers", NGX_HTTP_SINGLEFLIGHT_G,
        ngx_http_singleflight_g(workers),
        "Worker processes using the zone (scope=numa: the node)."),
    ngx_http_singleflight_labelled("zone_bytes",
        NGX_HTTP_SINGLEFLIGHT_G|NGX_HTTP_SINGLEFLIGHT_PAGES,
        ngx_http_singleflight_g(pages_used), "state",
        ngx_http_singleflight_states, 2,
        "Memory of the zone's slab pages, used and free."),

    ngx_http_singleflight_metric("wait_seconds", NGX_HTTP_SINGLEFLIGHT_H,
        ngx_http_singleflight_c(wait),
        "How long followers waited for their flight's response header."),
    ngx_http_singleflight_metric("flight_header_seconds",
        NGX_HTTP_SINGLEFLIGHT_H, ngx_http_singleflight_c(header),
        "From a flight's start to a response header from its origin."),
    ngx_http_singleflight_metric("flight_seconds", NGX_HTTP_SINGLEFLIGHT_H,
        ngx_http_singleflight_c(body),
        "From a flight's start to the last byte of its response."),

    /* what a developer reads: ?diagnostics=1 */

    ngx_http_singleflight_metric("late_joins_total",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(late_joins),
        "Followers that joined a flight while its body streamed."),
    ngx_http_singleflight_metric("spilled_total",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(spilled),
        "Flights whose body went on in a temporary file."),
    ngx_http_singleflight_metric("nospill_total",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(nospill),
        "Flights that could have no temporary file and went on in the zone."),
    ngx_http_singleflight_metric("wakeups_total",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(wakeups),
        "Wake-up messages sent to other workers (one covers many flights)."),
    ngx_http_singleflight_metric("wakeup_failures_total",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(notify_failed),
        "Wake-ups of other workers that could not be sent."),
    ngx_http_singleflight_metric("private_marks",
        NGX_HTTP_SINGLEFLIGHT_G|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_g(marks),
        "Keys marked private for a while."),
    ngx_http_singleflight_metric("zone_baseline_bytes",
        NGX_HTTP_SINGLEFLIGHT_G|NGX_HTTP_SINGLEFLIGHT_PAGES
        |NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_g(pages_baseline),
        "Memory of the slab pages the idle zone uses."),

    /* the names of the release before, for one release */

    ngx_http_singleflight_old("flights", "flights_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(flights),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"LEADER\"}: "
        "flights started."),
    ngx_http_singleflight_old("followers", "followers_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(followers),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total: requests that joined a "
        "flight."),
    ngx_http_singleflight_old("served", "followers_served_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(served),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"FOLLOWER\"}: "
        "followers answered with their flight's response."),
    ngx_http_singleflight_old("hedges", "hedges_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(hedges),
        NGX_HTTP_SINGLEFLIGHT_USE "origin_requests_total{reason=\"hedge\"}: "
        "second fetches started."),
    ngx_http_singleflight_old("retries", "retries_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(retries),
        NGX_HTTP_SINGLEFLIGHT_USE "origin_requests_total{reason=\"retry\"}: "
        "fetches made again."),
    ngx_http_singleflight_old("promotions", "promotions_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(promotions),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"PROMOTED\"}."),
    ngx_http_singleflight_old("timeouts", "timeouts_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(timeouts),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"TIMEOUT\"}."),
    ngx_http_singleflight_old("errors", "errors_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(errors),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"ERROR\"}."),
    ngx_http_singleflight_old("not_shared", "not_shared_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(not_shared),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"NOT_SHARED\"}."),
    ngx_http_singleflight_old("bypassed", "bypassed_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_st(BYPASS),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"BYPASS\"}."),
    ngx_http_singleflight_old("direct", "direct_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_st(DIRECT),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"DIRECT\"}."),
    ngx_http_singleflight_old("loops", "loops_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_st(LOOP),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"LOOP\"}."),
    ngx_http_singleflight_old("overflows", "overflows_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_st(OVERFLOW),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"OVERFLOW\"}."),
    ngx_http_singleflight_old("private", "private_total",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_st(PRIVATE),
        NGX_HTTP_SINGLEFLIGHT_USE "requests_total{status=\"PRIVATE\"}."),
    ngx_http_singleflight_old("pages_used", "zone_pages_used",
        NGX_HTTP_SINGLEFLIGHT_G, ngx_http_singleflight_g(pages_used),
        NGX_HTTP_SINGLEFLIGHT_USE "zone_bytes{state=\"used\"}: slab pages "
        "in use."),
    ngx_http_singleflight_old("pages_free", "zone_pages_free",
        NGX_HTTP_SINGLEFLIGHT_G, ngx_http_singleflight_g(pages_free),
        NGX_HTTP_SINGLEFLIGHT_USE "zone_bytes{state=\"free\"}: slab pages "
        "free."),

    /* old JSON fields of metrics whose Prometheus name stays */

    ngx_http_singleflight_old("unstored", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(unstored), NULL),
    ngx_http_singleflight_old("resumes", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(resumes), NULL),
    ngx_http_singleflight_old("resume_failures", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(resume_failures),
        NULL),
    ngx_http_singleflight_old("hedge_wins", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(hedge_wins), NULL),
    ngx_http_singleflight_old("cut", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(cut), NULL),
    ngx_http_singleflight_old("dead_leaders", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(dead_leaders), NULL),
    ngx_http_singleflight_old("abandoned", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(abandoned), NULL),
    ngx_http_singleflight_old("oversized", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(oversized), NULL),
    ngx_http_singleflight_old("vary_mismatches", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(vary_mismatches),
        NULL),
    ngx_http_singleflight_old("forgotten", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(forgotten), NULL),
    ngx_http_singleflight_old("no_memory", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(no_memory), NULL),
    ngx_http_singleflight_old("bytes_shared", "",
        NGX_HTTP_SINGLEFLIGHT_C, ngx_http_singleflight_c(bytes_shared), NULL),
    ngx_http_singleflight_old("wait_ms", "",
        NGX_HTTP_SINGLEFLIGHT_H|NGX_HTTP_SINGLEFLIGHT_MS,
        ngx_http_singleflight_c(wait), NULL),
    ngx_http_singleflight_old("flight_header_ms", "",
        NGX_HTTP_SINGLEFLIGHT_H|NGX_HTTP_SINGLEFLIGHT_MS,
        ngx_http_singleflight_c(header), NULL),
    ngx_http_singleflight_old("flight_ms", "",
        NGX_HTTP_SINGLEFLIGHT_H|NGX_HTTP_SINGLEFLIGHT_MS,
        ngx_http_singleflight_c(body), NULL),

    /* and the old names of diagnostics, with ?diagnostics=1 */

    ngx_http_singleflight_old("late_joins", "",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(late_joins), NULL),
    ngx_http_singleflight_old("spilled", "",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(spilled), NULL),
    ngx_http_singleflight_old("nospill", "",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(nospill), NULL),
    ngx_http_singleflight_old("wakeups", "",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(wakeups), NULL),
    ngx_http_singleflight_old("notify_failed", "",
        NGX_HTTP_SINGLEFLIGHT_C|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_c(notify_failed), NULL),
    ngx_http_singleflight_old("marks", "",
        NGX_HTTP_SINGLEFLIGHT_G|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_g(marks), NULL),
    ngx_http_singleflight_old("pages_baseline", "zone_pages_baseline",
        NGX_HTTP_SINGLEFLIGHT_G|NGX_HTTP_SINGLEFLIGHT_D,
        ngx_http_singleflight_g(pages_baseline),
        NGX_HTTP_SINGLEFLIGHT_USE "zone_baseline_bytes: slab pages the "
        "idle zone uses."),

    { ngx_null_string, ngx_null_string, NULL, 0, 0, ngx_null_string, NULL,
      0 }
};


/* the buckets' upper bounds: milliseconds, and "le" in seconds */

static ngx_msec_int_t  ngx_http_singleflight_bounds[] = {
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000
};

static char  *ngx_http_singleflight_le[] = {
    "0.001", "0.002", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5", "1", "2.5", "5", "10", "30", "+Inf"
};


static ngx_uint_t ngx_http_singleflight_stats_format(ngx_http_request_t *r,
    ngx_uint_t *diagnostics);
static size_t ngx_http_singleflight_stats_size(
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n);
static size_t ngx_http_singleflight_metric_size(
    ngx_http_singleflight_metric_t *m, size_t line);
static u_char *ngx_http_singleflight_stats_prometheus(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n, ngx_uint_t diagnostics);
static u_char *ngx_http_singleflight_stats_json(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n, ngx_uint_t diagnostics);
static ngx_array_t *ngx_http_singleflight_views(ngx_http_request_t *r,
    ngx_http_singleflight_zone_conf_t *zc);
static ngx_int_t ngx_http_singleflight_view_instance(ngx_http_request_t *r,
    ngx_array_t *views, ngx_http_singleflight_zone_t *zone);
static ngx_int_t ngx_http_singleflight_view_worker(ngx_http_request_t *r,
    ngx_array_t *views, ngx_http_singleflight_worker_stats_t *ws,
    ngx_uint_t slot);
static ngx_uint_t ngx_http_singleflight_alive(ngx_uint_t slot,
    ngx_pid_t pid);
static ngx_uint_t ngx_http_singleflight_counted(
    ngx_http_singleflight_counters_t *c);
static void ngx_http_singleflight_read_instance(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_view_t *v);
static void ngx_http_singleflight_add_view(ngx_http_singleflight_view_t *sum,
    ngx_http_singleflight_view_t *v);
static ngx_atomic_uint_t ngx_http_singleflight_value(
    ngx_http_singleflight_view_t *v, ngx_http_singleflight_metric_t *m,
    ngx_uint_t i);
static u_char *ngx_http_singleflight_json_fields(u_char *p,
    ngx_http_singleflight_view_t *v, ngx_uint_t diagnostics);
static u_char *ngx_http_singleflight_json_histogram(u_char *p,
    ngx_http_singleflight_metric_t *m, ngx_http_singleflight_view_t *v);
static u_char *ngx_http_singleflight_prometheus(u_char *p,
    ngx_http_singleflight_metric_t *m, ngx_str_t *zone, ngx_array_t *views);
static u_char *ngx_http_singleflight_prometheus_histogram(u_char *p,
    ngx_http_singleflight_metric_t *m, ngx_str_t *zone, ngx_array_t *views);
static u_char *ngx_http_singleflight_prometheus_labels(u_char *p,
    ngx_str_t *metric, char *suffix, ngx_str_t *zone,
    ngx_http_singleflight_view_t *v);


char *
ngx_http_singleflight_stats(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    if (sfcf->stats_format) {
        return "is duplicate";
    }

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
    ngx_uint_t                           i, n, format, diagnostics;
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

    format = ngx_http_singleflight_stats_format(r, &diagnostics);

    if (format == NGX_HTTP_SINGLEFLIGHT_STATS_PROMETHEUS) {
        b->last = ngx_http_singleflight_stats_prometheus(b->last, zones,
                                                         views, n,
                                                         diagnostics);
        ngx_str_set(&r->headers_out.content_type,
                    "text/plain; version=0.0.4");

    } else {
        b->last = ngx_http_singleflight_stats_json(b->last, zones, views, n,
                                                   diagnostics);
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }

    if ((size_t) (b->last - b->pos) > size) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "singleflight stats of %uz bytes overran %uz",
                      (size_t) (b->last - b->pos), size);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_singleflight_stats_send(r, b);
}


/* a 200 of one buffer, of the content type set (and _forget.c's) */

ngx_int_t
ngx_http_singleflight_stats_send(ngx_http_request_t *r, ngx_buf_t *b)
{
    ngx_int_t    rc;
    ngx_chain_t  out;

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


/*
 * singleflight_stats's format, or the one ?format= asks for; and whether
 * ?diagnostics=1 asks for the internal counters and gauges too
 */

static ngx_uint_t
ngx_http_singleflight_stats_format(ngx_http_request_t *r,
    ngx_uint_t *diagnostics)
{
    ngx_str_t                          arg;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);

    *diagnostics = (ngx_http_arg(r, (u_char *) "diagnostics", 11, &arg)
                    == NGX_OK
                    && arg.len == 1 && arg.data[0] == '1');

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
 * The most either format takes, diagnostics and all: every zone's escaped
 * name (ngx_escape_json() makes up to 6 bytes of one) once per line it is
 * on, every metric of every view, the Prometheus HELP and TYPE lines.
 */

static size_t
ngx_http_singleflight_stats_size(ngx_http_singleflight_zone_conf_t **zones,
    ngx_array_t **views, ngx_uint_t n)
{
    size_t                           size, namelen, line;
    ngx_uint_t                       i, j;
    ngx_http_singleflight_view_t    *v;
    ngx_http_singleflight_metric_t  *m;

    size = sizeof("{\"build_info\":{\"version\":\"\",\"nginx\":\"\"},"
                  "\"zones\":{}}\n")
           + 2 * sizeof(NGX_HTTP_SINGLEFLIGHT_VERSION NGINX_VERSION)
           + 512;

    for (i = 0; i < n; i++) {
        namelen = 6 * zones[i]->name.len;
        size += namelen + 64;

        v = views[i]->elts;

        for (j = 0; j < views[i]->nelts; j++) {
            line = namelen + v[j].label.len + v[j].json.len + 64;

            for (m = ngx_http_singleflight_metrics; m->json.data; m++) {
                size += ngx_http_singleflight_metric_size(m, line);
            }
        }
    }

    for (m = ngx_http_singleflight_metrics; m->json.data; m++) {
        if (m->help) {
            size += ngx_strlen(m->help)
                    + 2 * (sizeof(NGX_HTTP_SINGLEFLIGHT_PREFIX)
                           + m->metric.len)
                    + 64;
        }
    }

    return size;
}


/* room for one metric of one view, in JSON and in Prometheus */

static size_t
ngx_http_singleflight_metric_size(ngx_http_singleflight_metric_t *m,
    size_t line)
{
    size_t      size, sample;
    ngx_uint_t  i, n;

    sample = m->json.len + m->metric.len + m->label.len
             + sizeof(NGX_HTTP_SINGLEFLIGHT_PREFIX) + NGX_ATOMIC_T_LEN + 16;

    if (m->flags & NGX_HTTP_SINGLEFLIGHT_HISTOGRAM) {
        /* a line per bucket, _sum and _count; the JSON's bounds */
        n = NGX_HTTP_SINGLEFLIGHT_BUCKETS + 2;
        return n * (sample + line + 16) + n * 16 + 64;
    }

    if (m->values == NULL) {
        return sample + line;
    }

    size = 0;

    for (i = 0; i < m->nvalues; i++) {
        size += sample + line + 2 * m->values[i].len;
    }

    return size + 16;
}


/* Prometheus' text format: each metric's HELP and TYPE, then its zones */

static u_char *
ngx_http_singleflight_stats_prometheus(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n, ngx_uint_t diagnostics)
{
    char                            *type;
    ngx_uint_t                       i;
    ngx_http_singleflight_metric_t  *m;

    p = ngx_sprintf(p, "# HELP " NGX_HTTP_SINGLEFLIGHT_PREFIX "build_info "
                    "The module's version, and the nginx it was built for.\n"
                    "# TYPE " NGX_HTTP_SINGLEFLIGHT_PREFIX "build_info gauge\n"
                    NGX_HTTP_SINGLEFLIGHT_PREFIX "build_info{version=\""
                    NGX_HTTP_SINGLEFLIGHT_VERSION "\",nginx=\""
                    NGINX_VERSION "\"} 1\n");

    for (m = ngx_http_singleflight_metrics; m->json.data; m++) {

        if (m->metric.len == 0
            || ((m->flags & NGX_HTTP_SINGLEFLIGHT_DIAGNOSTIC) && !diagnostics))
        {
            continue;
        }

        switch (m->flags & NGX_HTTP_SINGLEFLIGHT_KIND) {

        case NGX_HTTP_SINGLEFLIGHT_COUNTER:
            type = "counter";
            break;

        case NGX_HTTP_SINGLEFLIGHT_GAUGE:
            type = "gauge";
            break;

        default: /* NGX_HTTP_SINGLEFLIGHT_HISTOGRAM */
            type = "histogram";
            break;
        }

        p = ngx_sprintf(p, "# HELP " NGX_HTTP_SINGLEFLIGHT_PREFIX "%V %s\n"
                        "# TYPE " NGX_HTTP_SINGLEFLIGHT_PREFIX "%V %s\n",
                        &m->metric, m->help, &m->metric, type);

        for (i = 0; i < n; i++) {
            if (m->flags & NGX_HTTP_SINGLEFLIGHT_HISTOGRAM) {
                p = ngx_http_singleflight_prometheus_histogram(p, m,
                                                               &zones[i]->name,
                                                               views[i]);

            } else {
                p = ngx_http_singleflight_prometheus(p, m, &zones[i]->name,
                                                     views[i]);
            }
        }
    }

    return p;
}


/*
 * JSON: the build, then each zone: its total (the first view), then its
 * instances
 */

static u_char *
ngx_http_singleflight_stats_json(u_char *p,
    ngx_http_singleflight_zone_conf_t **zones, ngx_array_t **views,
    ngx_uint_t n, ngx_uint_t diagnostics)
{
    ngx_uint_t                     i, j;
    ngx_http_singleflight_view_t  *v;

    p = ngx_cpymem(p, "{\"build_info\":{\"version\":\""
                   NGX_HTTP_SINGLEFLIGHT_VERSION "\",\"nginx\":\""
                   NGINX_VERSION "\"},\"zones\":{",
                   sizeof("{\"build_info\":{\"version\":\""
                          NGX_HTTP_SINGLEFLIGHT_VERSION "\",\"nginx\":\""
                          NGINX_VERSION "\"},\"zones\":{") - 1);

    for (i = 0; i < n; i++) {
        v = views[i]->elts;

        if (i > 0) {
            *p++ = ',';
        }

        *p++ = '"';
        p = (u_char *) ngx_escape_json(p, zones[i]->name.data,
                                       zones[i]->name.len);
        p = ngx_sprintf(p, "\":{\"scope\":\"%V\"",
                        &ngx_http_singleflight_scopes[zones[i]->scope]);
        p = ngx_http_singleflight_json_fields(p, &v[0], diagnostics);
        p = ngx_cpymem(p, ",\"instances\":[", sizeof(",\"instances\":[") - 1);

        for (j = 1; j < views[i]->nelts; j++) {
            if (j > 1) {
                *p++ = ',';
            }

            p = ngx_sprintf(p, "{%V", &v[j].json);
            p = ngx_http_singleflight_json_fields(p, &v[j], diagnostics);
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
    ngx_http_singleflight_worker_stats_t  *ws, gone;

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

        if (ws->pid != 0 && !ngx_http_singleflight_alive(i, ws->pid)) {
            /*
             * killed, with no exit_process() to clear its gauges (an old
             * worker after a reload is not replaced): its instance went
             * with it, shown as a worker's that exited
             */
            gone = *ws;
            gone.pid = 0;
            ngx_memzero(&gone.gauges, sizeof(ngx_http_singleflight_gauges_t));
            ws = &gone;
        }

        if (ws->pid == 0 && !ngx_http_singleflight_counted(&ws->counters)) {
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


/* does the worker that "slot" had still live */

static ngx_uint_t
ngx_http_singleflight_alive(ngx_uint_t slot, ngx_pid_t pid)
{
    if (!ngx_http_singleflight_registry_has(slot, pid)) {
        return 0;
    }

    return kill(pid, 0) == 0 || ngx_errno != NGX_ESRCH;
}


/* did a worker's slot count anything: is it worth a view */

static ngx_uint_t
ngx_http_singleflight_counted(ngx_http_singleflight_counters_t *c)
{
    ngx_uint_t     i;
    ngx_atomic_t  *a;

    a = (ngx_atomic_t *) c;

    for (i = 0; i < sizeof(ngx_http_singleflight_counters_t)
                    / sizeof(ngx_atomic_t); i++)
    {
        if (a[i]) {
            return 1;
        }
    }

    return 0;
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


/* a view added to the sum: every counter and gauge, as arrays */

static void
ngx_http_singleflight_add_view(ngx_http_singleflight_view_t *sum,
    ngx_http_singleflight_view_t *v)
{
    ngx_uint_t     i;
    ngx_uint_t    *x, *y;
    ngx_atomic_t  *a, *b;

    a = (ngx_atomic_t *) &sum->counters;
    b = (ngx_atomic_t *) &v->counters;

    for (i = 0; i < sizeof(ngx_http_singleflight_counters_t)
                    / sizeof(ngx_atomic_t); i++)
    {
        a[i] += b[i];
    }

    x = (ngx_uint_t *) &sum->gauges;
    y = (ngx_uint_t *) &v->gauges;

    for (i = 0; i < sizeof(ngx_http_singleflight_gauges_t)
                    / sizeof(ngx_uint_t); i++)
    {
        x[i] += y[i];
    }
}


/* a metric's value in a view: its label's i-th, in the metric's unit */

static ngx_atomic_uint_t
ngx_http_singleflight_value(ngx_http_singleflight_view_t *v,
    ngx_http_singleflight_metric_t *m, ngx_uint_t i)
{
    u_char             *p;
    ngx_atomic_uint_t   n;

    p = (u_char *) v + m->offset;

    if (m->flags & NGX_HTTP_SINGLEFLIGHT_GAUGE) {
        n = ((ngx_uint_t *) p)[i];

    } else {
        n = ((ngx_atomic_t *) p)[i];
    }

    if (m->flags & NGX_HTTP_SINGLEFLIGHT_PAGES) {
        n *= ngx_pagesize;
    }

    return n;
}


/* ,"name":value ... ; a label's values as an object's keys */

static u_char *
ngx_http_singleflight_json_fields(u_char *p, ngx_http_singleflight_view_t *v,
    ngx_uint_t diagnostics)
{
    ngx_uint_t                       i;
    ngx_http_singleflight_metric_t  *m;

    for (m = ngx_http_singleflight_metrics; m->json.data; m++) {

        if (m->json.len == 0
            || ((m->flags & NGX_HTTP_SINGLEFLIGHT_DIAGNOSTIC) && !diagnostics))
        {
            continue;
        }

        if (m->flags & NGX_HTTP_SINGLEFLIGHT_HISTOGRAM) {
            p = ngx_http_singleflight_json_histogram(p, m, v);
            continue;
        }

        p = ngx_sprintf(p, ",\"%V\":", &m->json);

        if (m->values == NULL) {
            p = ngx_sprintf(p, "%uA", ngx_http_singleflight_value(v, m, 0));
            continue;
        }

        for (i = 0; i < m->nvalues; i++) {
            p = ngx_sprintf(p, "%c\"%V\":%uA", i ? ',' : '{', &m->values[i],
                            ngx_http_singleflight_value(v, m, i));
        }

        *p++ = '}';
    }

    return p;
}


/*
 * ,"wait_seconds":{"le":[0.001,...],"buckets":[cumulative...],"sum":S,
 * "count":C}, in seconds; or in milliseconds for the old "wait_ms"
 */

static u_char *
ngx_http_singleflight_json_histogram(u_char *p,
    ngx_http_singleflight_metric_t *m, ngx_http_singleflight_view_t *v)
{
    ngx_uint_t                          i, ms;
    ngx_atomic_uint_t                   n;
    ngx_http_singleflight_histogram_t  *hg;

    hg = (ngx_http_singleflight_histogram_t *) ((u_char *) v + m->offset);
    ms = m->flags & NGX_HTTP_SINGLEFLIGHT_MS;

    p = ngx_sprintf(p, ",\"%V\":{\"le\":[", &m->json);

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS - 1; i++) {
        if (i) {
            *p++ = ',';
        }

        if (ms) {
            p = ngx_sprintf(p, "%M", ngx_http_singleflight_bounds[i]);

        } else {
            p = ngx_sprintf(p, "%s", ngx_http_singleflight_le[i]);
        }
    }

    p = ngx_cpymem(p, "],\"buckets\":[", sizeof("],\"buckets\":[") - 1);

    n = 0;

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_BUCKETS; i++) {
        n += hg->bucket[i];
        p = ngx_sprintf(p, "%s%uA", i ? "," : "", n);
    }

    if (ms) {
        return ngx_sprintf(p, "],\"sum\":%uA,\"count\":%uA}", hg->sum, n);
    }

    return ngx_sprintf(p, "],\"sum\":%uA.%03uA,\"count\":%uA}",
                       hg->sum / 1000, hg->sum % 1000, n);
}


/* a metric's samples, one per instance: the zone's total is JSON's alone */

static u_char *
ngx_http_singleflight_prometheus(u_char *p, ngx_http_singleflight_metric_t *m,
    ngx_str_t *zone, ngx_array_t *views)
{
    ngx_uint_t                     i, j, n;
    ngx_http_singleflight_view_t  *v;

    v = views->elts;
    n = (m->values != NULL) ? m->nvalues : 1;

    for (i = 1; i < views->nelts; i++) {
        for (j = 0; j < n; j++) {
            p = ngx_http_singleflight_prometheus_labels(p, &m->metric, "",
                                                        zone, &v[i]);

            if (m->values != NULL) {
                p = ngx_sprintf(p, ",%V=\"%V\"", &m->label, &m->values[j]);
            }

            p = ngx_sprintf(p, "} %uA\n",
                            ngx_http_singleflight_value(&v[i], m, j));
        }
    }

    return p;
}


/* a histogram of each instance, cumulative, in seconds */

static u_char *
ngx_http_singleflight_prometheus_histogram(u_char *p,
    ngx_http_singleflight_metric_t *m, ngx_str_t *zone, ngx_array_t *views)
{
    ngx_uint_t                          i, j;
    ngx_atomic_uint_t                   n;
    ngx_http_singleflight_view_t       *v;
    ngx_http_singleflight_histogram_t  *hg;

    v = views->elts;

    for (i = 1; i < views->nelts; i++) {
        hg = (ngx_http_singleflight_histogram_t *)
                 ((u_char *) &v[i] + m->offset);
        n = 0;

        for (j = 0; j < NGX_HTTP_SINGLEFLIGHT_BUCKETS; j++) {
            n += hg->bucket[j];

            p = ngx_http_singleflight_prometheus_labels(p, &m->metric,
                                                        "_bucket", zone,
                                                        &v[i]);
            p = ngx_sprintf(p, ",le=\"%s\"} %uA\n",
                            ngx_http_singleflight_le[j], n);
        }

        p = ngx_http_singleflight_prometheus_labels(p, &m->metric, "_sum",
                                                    zone, &v[i]);
        p = ngx_sprintf(p, "} %uA.%03uA\n", hg->sum / 1000, hg->sum % 1000);

        p = ngx_http_singleflight_prometheus_labels(p, &m->metric, "_count",
                                                    zone, &v[i]);
        p = ngx_sprintf(p, "} %uA\n", n);
    }

    return p;
}


/* a sample's name and labels up to its own: name{zone="z",node="0" */

static u_char *
ngx_http_singleflight_prometheus_labels(u_char *p, ngx_str_t *metric,
    char *suffix, ngx_str_t *zone, ngx_http_singleflight_view_t *v)
{
    u_char  *s, *last;

    p = ngx_sprintf(p, NGX_HTTP_SINGLEFLIGHT_PREFIX "%V%s{zone=\"", metric,
                    suffix);

    /*
     * a label value as the text format escapes it: a backslash, a double
     * quote and a line feed, and nothing else (not the JSON way: a "\t"
     * or "\u0001" there is not an escape a scraper knows)
     */

    last = zone->data + zone->len;

    for (s = zone->data; s < last; s++) {
        switch (*s) {

        case '\\':
        case '"':
            *p++ = '\\';
            *p++ = *s;
            break;

        case '\n':
            *p++ = '\\';
            *p++ = 'n';
            break;

        default:
            *p++ = *s;
        }
    }

    return ngx_sprintf(p, "\"%V", &v->label);
}
