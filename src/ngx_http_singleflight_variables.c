/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Embedded variables: $singleflight_status, $singleflight_key,
 * $singleflight_wait_time, $singleflight_body_hash, and of the flight a
 * request read, $singleflight_resumes and $singleflight_hedged.
 */


#include "ngx_http_singleflight_variables.h"
#include "ngx_http_singleflight_reader.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_stats.h"


static ngx_int_t ngx_http_singleflight_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_singleflight_key_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_singleflight_key_again(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_variable_value_t *v);
static ngx_int_t ngx_http_singleflight_wait_time_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_singleflight_body_hash_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_singleflight_fetch_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_singleflight_variable(ngx_http_variable_value_t *v,
    u_char *data, size_t len);


static ngx_http_variable_t  ngx_http_singleflight_vars[] = {

    { ngx_string("singleflight_status"), NULL,
      ngx_http_singleflight_status_variable, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("singleflight_key"), NULL,
      ngx_http_singleflight_key_variable, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("singleflight_wait_time"), NULL,
      ngx_http_singleflight_wait_time_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("singleflight_body_hash"), NULL,
      ngx_http_singleflight_body_hash_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("singleflight_resumes"), NULL,
      ngx_http_singleflight_fetch_variable, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("singleflight_hedged"), NULL,
      ngx_http_singleflight_fetch_variable, 1, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_singleflight_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_singleflight_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r->main);

    if (ctx == NULL || ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    return ngx_http_singleflight_variable(v,
                          ngx_http_singleflight_status_names[ctx->status].data,
                          ngx_http_singleflight_status_names[ctx->status].len);
}


/* the singleflight_key value of a request that made no key, made again */

static ngx_int_t
ngx_http_singleflight_key_again(ngx_http_request_t *r,
    ngx_http_singleflight_ctx_t *ctx, ngx_http_variable_value_t *v)
{
    u_char     *p, *start;
    ngx_str_t   value[2];

    if (ngx_http_singleflight_key_values(r, ctx, value) == NGX_ERROR) {
        return NGX_ERROR;
    }

    start = ngx_pnalloc(r->pool, value[0].len + value[1].len);
    if (start == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(start, value[0].data, value[0].len);

    if (value[1].len) {
        p = ngx_cpymem(p, value[1].data, value[1].len);
    }

    return ngx_http_singleflight_variable(v, start, p - start);
}


static ngx_int_t
ngx_http_singleflight_key_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t                     value;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r->main);

    if (ctx != NULL && ctx->direct && (!ctx->warm || ctx->key.len == 0)) {
        /* alone, it made no key (singleflight_lone direct) */
        return ngx_http_singleflight_key_again(r->main, ctx, v);
    }

    if (ctx == NULL || !ctx->warm || ctx->key.len == 0) {
        v->not_found = 1;
        return NGX_OK;
    }

    ngx_http_singleflight_key_value(&ctx->key, &value);

    return ngx_http_singleflight_variable(v, value.data, value.len);
}


static ngx_int_t
ngx_http_singleflight_wait_time_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                       *p;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r->main);

    if (ctx == NULL || !ctx->warm || ctx->wait_start == 0
        || ctx->status == NGX_HTTP_SINGLEFLIGHT_ST_LEADER)
    {
        v->not_found = 1;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_TIME_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_singleflight_variable(v, p,
                                   ngx_sprintf(p, "%M", ctx->wait_time) - p);
}


static ngx_int_t
ngx_http_singleflight_body_hash_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_int_t  rc;
    ngx_str_t  hex;

    rc = ngx_http_singleflight_body_hash(r->main, &hex);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        v->not_found = 1;
        return NGX_OK;
    }

    return ngx_http_singleflight_variable(v, hex.data, hex.len);
}


/*
 * $singleflight_resumes: how many times the response the request read from
 * its flight was resumed (singleflight_resume); $singleflight_hedged: 1 if
 * its flight's fetch was hedged (singleflight_hedge), else 0.  Not found
 * for a request that read no flight.
 */

static ngx_int_t
ngx_http_singleflight_fetch_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                       *p;
    ngx_uint_t                    n;
    ngx_http_singleflight_ctx_t  *ctx;

    ctx = ngx_http_singleflight_get_ctx(r->main);

    if (ctx == NULL
        || (ctx->status != NGX_HTTP_SINGLEFLIGHT_ST_LEADER
            && ctx->status != NGX_HTTP_SINGLEFLIGHT_ST_FOLLOWER
            && ctx->status != NGX_HTTP_SINGLEFLIGHT_ST_PROMOTED))
    {
        v->not_found = 1;
        return NGX_OK;
    }

    if (ctx->fn != NULL) {
        /* still its reader: the flight is there */
        n = data ? ctx->fn->hedged : ctx->fn->resumes;

    } else {
        n = data ? ctx->was_hedged : ctx->resumes;
    }

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_singleflight_variable(v, p, ngx_sprintf(p, "%ui", n) - p);
}


/* a value found, made for this request alone (never cached) */

static ngx_int_t
ngx_http_singleflight_variable(ngx_http_variable_value_t *v, u_char *data,
    size_t len)
{
    v->len = len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = data;

    return NGX_OK;
}
