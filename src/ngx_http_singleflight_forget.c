/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * singleflight_forget zone key;
 *
 * Unlinks the GET and HEAD flights whose singleflight_key value is "key",
 * in every location, from every shared instance of the zone (with
 * scope=worker, from the instance of the worker that answers).  Requests
 * arriving afterwards start a fresh flight; requests already in the old
 * one keep it, and its fetch finishes as it would have (the "forget" of
 * Elixir's SingleFlight).  Only the tree entry goes: the flight itself is
 * freed, as always, when the last request that holds it lets go.
 */


#include "ngx_http_singleflight_forget.h"
#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_stats.h"


static ngx_int_t ngx_http_singleflight_forget_handler(ngx_http_request_t *r);


char *
ngx_http_singleflight_forget(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t                         *value;
    ngx_http_core_loc_conf_t          *clcf;
    ngx_http_compile_complex_value_t   ccv;

    if (sfcf->forget_zone_name.len) {
        return "is duplicate";
    }

    value = cf->args->elts;

    /* the zone may be declared further down: it is looked up in merge */
    sfcf->forget_zone_name = value[1];

    sfcf->forget_key = ngx_palloc(cf->pool, sizeof(ngx_http_complex_value_t));
    if (sfcf->forget_key == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = &value[2];
    ccv.complex_value = sfcf->forget_key;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_singleflight_forget_handler;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_singleflight_forget_handler(ngx_http_request_t *r)
{
    uint32_t                            hash;
    ngx_int_t                           rc;
    ngx_buf_t                          *b;
    ngx_str_t                           value;
    ngx_uint_t                          n, i, ni;
    ngx_http_singleflight_zone_t      **zp, *zone;
    ngx_http_singleflight_zone_conf_t  *zc;
    ngx_http_singleflight_loc_conf_t   *sfcf;

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    sfcf = ngx_http_get_module_loc_conf(r, ngx_http_singleflight_module);

    if (ngx_http_complex_value(r, sfcf->forget_key, &value) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    hash = ngx_murmur_hash2(value.data, value.len);

    n = 0;
    zc = sfcf->forget_zone;

    if (zc->instances.nelts) {
        zp = zc->instances.elts;
        ni = zc->instances.nelts;

    } else {
        zp = &zc->mine;
        ni = (zc->mine != NULL) ? 1 : 0;
    }

    for (i = 0; i < ni; i++) {
        n += ngx_http_singleflight_flight_forget(zp[i], &value, hash,
                                                 r->connection->log);
    }

    zone = zc->mine;

    if (zone == NULL) {
        return NGX_HTTP_SERVICE_UNAVAILABLE;
    }

    (void) ngx_atomic_fetch_add(&zone->counters->forgotten, n);

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "singleflight forgot %ui flight(s) of key \"%V\" "
                  "in zone \"%V\"", n, &value, &zc->name);

    b = ngx_create_temp_buf(r->pool, sizeof("{\"forgotten\":}\n")
                                     + NGX_INT_T_LEN);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"forgotten\":%ui}\n", n);
    ngx_str_set(&r->headers_out.content_type, "application/json");

    return ngx_http_singleflight_stats_send(r, b);
}
