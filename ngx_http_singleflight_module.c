/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * ngx_http_singleflight_module
 *
 * Collapses concurrent requests for the same key into one upstream fetch:
 * the first request (the leader) starts the fetch through the location's
 * content handler, the others (followers) wait on the event loop, and
 * every one of them gets the response through its own filters, taking it
 * from the flight's store while it arrives.  Nothing is cached: a
 * flight's state lives in a shared-memory zone only while the flight
 * does.
 *
 * This file is the table of contents: directives, configuration, and the
 * hooks that hand over to the parts in src/.
 */


#include "ngx_http_singleflight.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_wait.h"
#include "ngx_http_singleflight_handler.h"
#include "ngx_http_singleflight_key.h"
#include "ngx_http_singleflight_filter.h"
#include "ngx_http_singleflight_fetch.h"
#include "ngx_http_singleflight_reader.h"
#include "ngx_http_singleflight_resume.h"
#include "ngx_http_singleflight_clone.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_stats.h"
#include "ngx_http_singleflight_forget.h"
#include "ngx_http_singleflight_variables.h"
#include "ngx_http_singleflight_origin.h"

#if (NGX_HTTP_SINGLEFLIGHT_HAVE_DLADDR)
#include <dlfcn.h>
#endif


static ngx_int_t ngx_http_singleflight_preconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_singleflight_postconfiguration(ngx_conf_t *cf);
static void *ngx_http_singleflight_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_singleflight_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_singleflight_merge_loc_conf(ngx_conf_t *cf,
    void *parent, void *child);
static void ngx_http_singleflight_merge_waiting(
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static char *ngx_http_singleflight_merge_failures(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static char *ngx_http_singleflight_merge_private(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static void ngx_http_singleflight_merge_fetch(
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static char *ngx_http_singleflight_merge_store(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static char *ngx_http_singleflight(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_singleflight_limit(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_singleflight_bitmask(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_singleflight_conditions(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_singleflight_condition_param(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_singleflight_loc_conf_t *sfcf,
    ngx_str_t *value);
static char *ngx_http_singleflight_deprecated(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_singleflight_tries_check(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_singleflight_status_check(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_singleflight_lazy(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_singleflight_lone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_singleflight_range_offset(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_singleflight_hedge(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_uint_t ngx_http_singleflight_header_name(ngx_str_t *name);
static char *ngx_http_singleflight_credentials(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_singleflight_resolve_zone(ngx_conf_t *cf,
    ngx_str_t *name, ngx_http_singleflight_zone_conf_t **zc,
    char *directive);
static char *ngx_http_singleflight_merge_lone(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_uint_t ngx_http_singleflight_lone_default(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_uint_t ngx_http_singleflight_merge_alone(ngx_conf_t *cf);
static void ngx_http_singleflight_merge_content(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf, ngx_http_core_loc_conf_t *clcf,
    ngx_uint_t inherited);
static char *ngx_http_singleflight_resolve_on(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_uint_t ngx_http_singleflight_other_on(ngx_conf_t *cf,
    const char *name);
static char *ngx_http_singleflight_merge_key(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_uint_t ngx_http_singleflight_key_uses(ngx_str_t *value,
    char *name);
static ngx_int_t ngx_http_singleflight_key_default(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf);
static char *ngx_http_singleflight_check_key(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_int_t ngx_http_singleflight_add_temp_path(ngx_conf_t *cf,
    ngx_path_t *path);
static ngx_int_t ngx_http_singleflight_init_module(ngx_cycle_t *cycle);
static void ngx_http_singleflight_check_file(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_singleflight_init_process(ngx_cycle_t *cycle);
static void ngx_http_singleflight_exit_process(ngx_cycle_t *cycle);


static ngx_conf_bitmask_t  ngx_http_singleflight_methods_mask[] = {
    { ngx_string("GET"), NGX_HTTP_GET },
    { ngx_string("HEAD"), NGX_HTTP_HEAD },
    { ngx_string("POST"), NGX_HTTP_POST },
    { ngx_string("PUT"), NGX_HTTP_PUT },
    { ngx_string("DELETE"), NGX_HTTP_DELETE },
    { ngx_string("OPTIONS"), NGX_HTTP_OPTIONS },
    { ngx_string("PATCH"), NGX_HTTP_PATCH },
    { ngx_string("PROPFIND"), NGX_HTTP_PROPFIND },
    { ngx_null_string, 0 }
};


static ngx_conf_bitmask_t  ngx_http_singleflight_promote_mask[] = {
    { ngx_string("error"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR },
    { ngx_string("timeout"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT },
    { ngx_string("abort"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_ABORT },
    { ngx_string("http_500"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_500 },
    { ngx_string("http_502"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_502 },
    { ngx_string("http_503"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_503 },
    { ngx_string("http_504"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_504 },
    { ngx_string("dead"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEAD },
    { ngx_string("off"), NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF },
    { ngx_null_string, 0 }
};


static ngx_conf_bitmask_t  ngx_http_singleflight_private_mask[] = {
    { ngx_string("set-cookie"), NGX_HTTP_SINGLEFLIGHT_PRIVATE_SET_COOKIE },
    { ngx_string("private"), NGX_HTTP_SINGLEFLIGHT_PRIVATE_PRIVATE },
    { ngx_string("no-store"), NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_STORE },
    { ngx_string("no-cache"), NGX_HTTP_SINGLEFLIGHT_PRIVATE_NO_CACHE },
    { ngx_string("off"), NGX_HTTP_SINGLEFLIGHT_PRIVATE_OFF },
    { ngx_null_string, 0 }
};


/*
 * A directive kept for old configurations: a warning that says what to
 * write instead, then the stock slot it always had (with "post").
 */
typedef struct {
    char                          *(*set)(ngx_conf_t *cf, ngx_command_t *cmd,
                                          void *conf);
    char                            *instead;
    void                            *post;
} ngx_http_singleflight_deprecated_t;


/* the conditions of singleflight_promote and _private when none is said */
#define NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEFAULT                                 \
    (NGX_HTTP_SINGLEFLIGHT_PROMOTE_ERROR|NGX_HTTP_SINGLEFLIGHT_PROMOTE_TIMEOUT \
     |NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEAD)
#define NGX_HTTP_SINGLEFLIGHT_PRIVATE_DEFAULT                                 \
    (NGX_HTTP_SINGLEFLIGHT_PRIVATE_SET_COOKIE                                 \
     |NGX_HTTP_SINGLEFLIGHT_PRIVATE_PRIVATE)


static ngx_conf_post_t  ngx_http_singleflight_tries_post = {
    ngx_http_singleflight_tries_check
};

static ngx_conf_post_t  ngx_http_singleflight_status_post = {
    ngx_http_singleflight_status_check
};


static ngx_http_singleflight_deprecated_t
    ngx_http_singleflight_old_promote_tries =
{
    ngx_conf_set_num_slot, "\"singleflight_promote ... tries=N\"",
    &ngx_http_singleflight_tries_post
};

static ngx_http_singleflight_deprecated_t
    ngx_http_singleflight_old_error_status =
{
    ngx_conf_set_num_slot, "\"singleflight_promote ... status=CODE\"",
    &ngx_http_singleflight_status_post
};

static ngx_http_singleflight_deprecated_t
    ngx_http_singleflight_old_private_ttl =
{
    ngx_conf_set_msec_slot, "\"singleflight_private ... ttl=TIME\"", NULL
};

static ngx_http_singleflight_deprecated_t
    ngx_http_singleflight_old_max_size =
{
    ngx_conf_set_off_slot, "\"singleflight_zone ... max_size=SIZE\"", NULL
};

static ngx_http_singleflight_deprecated_t
    ngx_http_singleflight_old_memory =
{
    ngx_conf_set_size_slot, "\"singleflight_zone ... memory=SIZE\"", NULL
};

static ngx_http_singleflight_deprecated_t
    ngx_http_singleflight_old_temp_path =
{
    ngx_conf_set_path_slot, "\"singleflight_zone ... temp_path=PATH\"", NULL
};


static ngx_path_init_t  ngx_http_singleflight_temp_path = {
    ngx_string("singleflight_temp"), { 1, 2, 0 }
};


static ngx_command_t  ngx_http_singleflight_commands[] = {

    { ngx_string("singleflight_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_singleflight_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_loop_name"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_loop_name,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_singleflight,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, key),
      NULL },

    { ngx_string("singleflight_methods"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_singleflight_bitmask,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, methods),
      &ngx_http_singleflight_methods_mask },

    { ngx_string("singleflight_bypass"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_set_predicate_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, bypass),
      NULL },

    { ngx_string("singleflight_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_singleflight_limit,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, timeout),
      NULL },

    { ngx_string("singleflight_max_waiters"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_singleflight_limit,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, max_waiters),
      NULL },

    { ngx_string("singleflight_promote"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_singleflight_conditions,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, promote),
      &ngx_http_singleflight_promote_mask },

    { ngx_string("singleflight_share_errors"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, share_errors),
      NULL },


    { ngx_string("singleflight_max_range_offset"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_range_offset,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, range_offset),
      NULL },

    { ngx_string("singleflight_private"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_singleflight_conditions,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, private),
      &ngx_http_singleflight_private_mask },

    { ngx_string("singleflight_credentials"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_singleflight_credentials,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_resume"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_singleflight_resume_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_hedge"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_singleflight_hedge,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_lazy"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_lazy,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_lone"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_lone,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_stats"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_singleflight_stats,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("singleflight_forget"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE2,
      ngx_http_singleflight_forget,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    /* deprecated: parameters of another directive now */

    { ngx_string("singleflight_promote_tries"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_deprecated,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, promote_tries),
      &ngx_http_singleflight_old_promote_tries },

    { ngx_string("singleflight_error_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_deprecated,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, error_status),
      &ngx_http_singleflight_old_error_status },

    { ngx_string("singleflight_private_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_deprecated,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, private_ttl),
      &ngx_http_singleflight_old_private_ttl },

    { ngx_string("singleflight_max_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_deprecated,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, max_size_set),
      &ngx_http_singleflight_old_max_size },

    { ngx_string("singleflight_memory"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_singleflight_deprecated,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, memory_set),
      &ngx_http_singleflight_old_memory },

    { ngx_string("singleflight_temp_path"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1234,
      ngx_http_singleflight_deprecated,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_singleflight_loc_conf_t, temp_path_set),
      &ngx_http_singleflight_old_temp_path },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_singleflight_module_ctx = {
    ngx_http_singleflight_preconfiguration, /* preconfiguration */
    ngx_http_singleflight_postconfiguration, /* postconfiguration */

    ngx_http_singleflight_create_main_conf, /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_singleflight_create_loc_conf, /* create location configuration */
    ngx_http_singleflight_merge_loc_conf   /* merge location configuration */
};


ngx_module_t  ngx_http_singleflight_module = {
    NGX_MODULE_V1,
    &ngx_http_singleflight_module_ctx,     /* module context */
    ngx_http_singleflight_commands,        /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_singleflight_init_module,     /* init module */
    ngx_http_singleflight_init_process,    /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_singleflight_exit_process,    /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_int_t
ngx_http_singleflight_preconfiguration(ngx_conf_t *cf)
{
    if (ngx_http_singleflight_origin_hook(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_singleflight_add_variables(cf);
}


static ngx_int_t
ngx_http_singleflight_postconfiguration(ngx_conf_t *cf)
{
    ngx_http_singleflight_main_conf_t  *smcf;

    /* the http block is read: the *_pass directives as they were */
    ngx_http_singleflight_origin_unhook(NULL);

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    /* the token is drawn with the registry's zone; empty with no zone */
    smcf->loop = smcf->loop_name.len ? &smcf->loop_name
                                     : ngx_http_singleflight_registry_token();

    if (smcf->zones.nelts
        && ngx_http_singleflight_registry_add(cf) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_singleflight_handler_init(cf) != NGX_OK
        || ngx_http_singleflight_fetch_init(cf,
                                     &ngx_http_singleflight_reader_host)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_singleflight_store_init(cf);

    return ngx_http_singleflight_filter_init(cf);
}


static void *
ngx_http_singleflight_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_singleflight_main_conf_t));
    if (smcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&smcf->zones, cf->pool, 4,
                       sizeof(ngx_http_singleflight_zone_t *))
        != NGX_OK
        || ngx_array_init(&smcf->temp_paths, cf->pool, 2,
                          sizeof(ngx_path_t *))
           != NGX_OK)
    {
        return NULL;
    }

    return smcf;
}


static void *
ngx_http_singleflight_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_singleflight_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_singleflight_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->zone = NULL;
     *     conf->zone_name = { 0, NULL };
     *     conf->key = NULL;
     *     conf->methods = 0;
     *     conf->promote = 0;
     *     conf->private = 0;
     *     conf->forget_zone = NULL;
     *     conf->forget_zone_name = { 0, NULL };
     *     conf->forget_key = NULL;
     *     conf->key_body = 0;
     *     conf->temp_path_set = NULL;
     */

    conf->enable = NGX_CONF_UNSET;
    conf->bypass = NGX_CONF_UNSET_PTR;
    conf->timeout = NGX_CONF_UNSET_MSEC;
    conf->timeout_status = NGX_CONF_UNSET_UINT;
    conf->max_waiters = NGX_CONF_UNSET_UINT;
    conf->max_waiters_status = NGX_CONF_UNSET_UINT;
    conf->max_size_set = NGX_CONF_UNSET;
    conf->range_offset = NGX_CONF_UNSET;
    conf->memory_set = NGX_CONF_UNSET_SIZE;
    conf->credential_headers = NGX_CONF_UNSET_PTR;
    conf->promote_tries = NGX_CONF_UNSET_UINT;
    conf->error_status = NGX_CONF_UNSET_UINT;
    conf->share_errors = NGX_CONF_UNSET;
    conf->private_ttl = NGX_CONF_UNSET_MSEC;
    conf->credentials = NGX_CONF_UNSET_UINT;
    conf->lazy = NGX_CONF_UNSET;
    conf->lazy_max = NGX_CONF_UNSET;
    conf->lone_conf = NGX_CONF_UNSET_UINT;
    conf->resume = NGX_CONF_UNSET;
    conf->hedge = NGX_CONF_UNSET_MSEC;
    conf->hedge_auto = NGX_CONF_UNSET;
    conf->sliced = NGX_CONF_UNSET;
    conf->resume_tries = NGX_CONF_UNSET_UINT;

    return conf;
}


static char *
ngx_http_singleflight_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child)
{
    ngx_http_singleflight_loc_conf_t *prev = parent;
    ngx_http_singleflight_loc_conf_t *conf = child;

    ngx_http_core_loc_conf_t  *clcf;

    ngx_uint_t                 inherited;

    inherited = 0;

    if (conf->enable == NGX_CONF_UNSET) {
        conf->enable = prev->enable;
        conf->zone = prev->zone;
        conf->zone_name = prev->zone_name;
        conf->content_any = prev->content_any;
        inherited = 1;
    }

    if (ngx_http_singleflight_origin_merge(cf, prev, conf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->noname) {
        /*
         * an "if" or "limit_except" block: its location's content handler
         * runs with the block's configuration, so the handler's settings
         * are the location's (as proxy_pass's are)
         */

        if (conf->forget_key == NULL) {
            conf->forget_key = prev->forget_key;
            conf->forget_zone_name = prev->forget_zone_name;
        }

        if (conf->stats_format == 0) {
            conf->stats_format = prev->stats_format;
        }
    }

    if (ngx_http_singleflight_resolve_on(cf, conf) != NGX_CONF_OK
        || ngx_http_singleflight_resolve_zone(cf, &conf->zone_name,
                                              &conf->zone, "singleflight")
           != NGX_CONF_OK
        || ngx_http_singleflight_resolve_zone(cf, &conf->forget_zone_name,
                                              &conf->forget_zone,
                                              "singleflight_forget")
           != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    ngx_conf_merge_bitmask_value(conf->methods, prev->methods,
                                 (NGX_CONF_BITMASK_SET
                                  |NGX_HTTP_GET|NGX_HTTP_HEAD));

    if (ngx_http_singleflight_merge_key(cf, prev, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    ngx_conf_merge_ptr_value(conf->bypass, prev->bypass, NULL);

    ngx_http_singleflight_merge_waiting(prev, conf);

    if (ngx_http_singleflight_merge_failures(cf, prev, conf) != NGX_CONF_OK
        || ngx_http_singleflight_merge_private(cf, prev, conf) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    ngx_http_singleflight_merge_fetch(prev, conf);

    ngx_conf_merge_uint_value(conf->lone_conf, prev->lone_conf,
                              NGX_CONF_UNSET_UINT);

    if (ngx_http_singleflight_merge_lone(cf, prev, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_singleflight_merge_alone(cf)) {
        conf->sliced = 1;
    }

    if (ngx_http_singleflight_merge_store(cf, prev, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (clcf->handler == ngx_http_singleflight_stats_handler
        || conf->stats_format)
    {
        /* the module's own page is never a flight, nor counted in one */
        conf->zone = NULL;
    }

    ngx_http_singleflight_merge_content(cf, conf, clcf, inherited);

    return NGX_CONF_OK;
}


/*
 * A location that collapses only what goes to an origin, whose own
 * content does not (a static file, stub_status, another module's): said
 * at notice level, where singleflight came from an outer level.  Not for
 * "if" and limit_except blocks, whose content is their location's.
 */

static void
ngx_http_singleflight_merge_content(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf, ngx_http_core_loc_conf_t *clcf,
    ngx_uint_t inherited)
{
    ngx_uint_t                          i, level;
    ngx_http_singleflight_main_conf_t  *smcf;

    if (conf->zone == NULL || clcf->name.len == 0) {
        return;
    }

    if (ngx_http_singleflight_other_on(cf, "ngx_http_slice_filter_module")
        && !clcf->noname)
    {
        level = inherited ? NGX_LOG_NOTICE : NGX_LOG_WARN;

        ngx_log_error(level, cf->log, 0,
                      "location \"%V\" has \"slice\": nginx fetches its "
                      "responses in slices, each a request of its own, "
                      "which \"singleflight\"%s does not collapse; remove "
                      "one of the two", &clcf->name,
                      inherited ? " (inherited)" : "");
        return;
    }

    if (conf->content_any || clcf->noname || clcf->lmt_excpt) {
        return;
    }

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    for (i = 0; i < smcf->norigins; i++) {
        if (clcf->handler == smcf->origins[i]) {
            return;
        }
    }

    ngx_log_error(NGX_LOG_NOTICE, cf->log, 0,
                  "location \"%V\" has no proxy_pass, fastcgi_pass, "
                  "uwsgi_pass, scgi_pass, grpc_pass or memcached_pass: "
                  "\"singleflight\"%s does not collapse its own responses, "
                  "\"singleflight %V content=any;\" would",
                  &clcf->name, inherited ? " (inherited)" : "",
                  &conf->zone->name);
}


/*
 * singleflight_lone direct, the default where a request going its own way
 * can feed a flight (_tee.c): the zone's instances get the slots
 * (_zone.h), which a small zone may not hold besides its flights.
 */

static char *
ngx_http_singleflight_merge_lone(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    size_t                     need;
    ngx_http_core_loc_conf_t  *clcf;
    ngx_http_upstream_conf_t  *ucf;

    conf->lone = conf->lone_conf;

    /* a flight may wait for the header of a request on its own way */
    conf->pend = (conf->hedge == 0 && conf->lazy);

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if ((clcf->noname || clcf->lmt_excpt) && clcf->handler == NULL) {
        /* an "if" or limit_except block with its location's content */
        conf->ignore_abort = prev->ignore_abort;
#if (NGX_HTTP_CACHE)
        conf->cached = prev->cached;
        conf->cache_bypass = prev->cache_bypass;
#endif

    } else {
        ucf = ngx_http_singleflight_origin_upstream(cf, clcf);
        conf->ignore_abort = (ucf != NULL && ucf->ignore_client_abort);
#if (NGX_HTTP_CACHE)
        conf->cached = (ucf != NULL && ucf->cache == 1);
        conf->cache_bypass = conf->cached ? ucf->cache_bypass : NULL;
#endif
    }

    if (conf->zone == NULL) {
        return NGX_CONF_OK;
    }

    if (conf->lone == NGX_CONF_UNSET_UINT) {
        conf->lone = ngx_http_singleflight_lone_default(cf, prev, conf);
    }

    if (conf->lone != NGX_HTTP_SINGLEFLIGHT_LONE_DIRECT) {
        return NGX_CONF_OK;
    }

    need = NGX_HTTP_SINGLEFLIGHT_CLAIMS * sizeof(ngx_atomic_t)
           + 8 * ngx_pagesize;

    if (conf->zone->size < need) {

        if (conf->lone_conf == NGX_CONF_UNSET_UINT) {
            conf->lone = NGX_HTTP_SINGLEFLIGHT_LONE_FETCH;
            return NGX_CONF_OK;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"singleflight_lone direct\" needs zone \"%V\" "
                           "of at least %uzk", &conf->zone->name,
                           need / 1024);
        return NGX_CONF_ERROR;
    }

    conf->zone->claims = 1;

    return NGX_CONF_OK;
}


/*
 * Unset, "direct" where a request going its own way gets its response
 * from an origin, buffered (proxy_buffering on and the like), in this
 * location; "fetch" where the content is not an origin's (content=any, a
 * static location redirecting by try_files or index) or not buffered
 * (proxy_buffering off, grpc_pass, memcached_pass): there the first
 * request could not feed a flight, and a herd would cost one origin
 * request more; and where singleflight_hedge or "singleflight_lazy off"
 * would have every request lead or follow a flight all the same (the
 * handler's check, _handler.c), which a slot would only slow down.  An
 * "if" or limit_except block with its location's content has its
 * location's.
 */

static ngx_uint_t
ngx_http_singleflight_lone_default(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_http_core_loc_conf_t  *clcf;
    ngx_http_upstream_conf_t  *ucf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if ((clcf->noname || clcf->lmt_excpt) && clcf->handler == NULL
        && prev->zone == conf->zone && prev->lone != NGX_CONF_UNSET_UINT)
    {
        return prev->lone;
    }

    ucf = ngx_http_singleflight_origin_upstream(cf, clcf);

    if (ucf == NULL || ucf->buffering != 1
        || conf->hedge
        || !conf->lazy)
    {
        return NGX_HTTP_SINGLEFLIGHT_LONE_FETCH;
    }

    return NGX_HTTP_SINGLEFLIGHT_LONE_DIRECT;
}


/*
 * Handlers that answer a subrequest otherwise than the request it was
 * made for, and so a fetch: gzip_static on sends the uncompressed file
 * to every subrequest (and its .gz, to the clients that take it, has no
 * Vary unless gzip_vary says so); autoindex cuts UTF-8 names by bytes
 * (the charset filter, which tells it the charset, does not run on a
 * fetch).  A location with either is not collapsed.  Their modules are
 * merged before this one (it is loaded after them).
 */

static ngx_uint_t
ngx_http_singleflight_merge_alone(ngx_conf_t *cf)
{
    return ngx_http_singleflight_other_on(cf, "ngx_http_gzip_static_module")
               == 1                                   /* "on", not "always" */
           || ngx_http_singleflight_other_on(cf, "ngx_http_autoindex_module")
               == 1;
}


/*
 * The switch of another module's location configuration here, or 0 if
 * nginx has no such module: the first member of gzip_static's, of
 * autoindex's and of slice's (its size, as wide; nginx 1.22 to 1.31),
 * which are not ours to include.
 */

static ngx_uint_t
ngx_http_singleflight_other_on(ngx_conf_t *cf, const char *name)
{
    ngx_int_t              index;
    ngx_http_conf_ctx_t   *ctx;

    index = ngx_http_singleflight_module_index(cf, name);

    if (index == NGX_ERROR) {
        return 0;
    }

    ctx = cf->ctx;

    return *(ngx_uint_t *) ctx->loc_conf[index];
}


/* singleflight_timeout and singleflight_max_waiters, with their statuses */

static void
ngx_http_singleflight_merge_waiting(ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    if (conf->timeout == NGX_CONF_UNSET_MSEC) {
        conf->timeout = prev->timeout;
        conf->timeout_status = prev->timeout_status;
    }

    /* as long as nginx's upstreams wait for a header by default */
    ngx_conf_merge_msec_value(conf->timeout, prev->timeout, 60000);
    ngx_conf_merge_uint_value(conf->timeout_status, prev->timeout_status, 0);

    if (conf->max_waiters == NGX_CONF_UNSET_UINT) {
        conf->max_waiters = prev->max_waiters;
        conf->max_waiters_status = prev->max_waiters_status;
    }

    ngx_conf_merge_uint_value(conf->max_waiters, prev->max_waiters, 0);
    ngx_conf_merge_uint_value(conf->max_waiters_status,
                              prev->max_waiters_status, 0);
}


/* what a failed fetch does: singleflight_promote and the error statuses */

static char *
ngx_http_singleflight_merge_failures(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    /*
     * given at this level, singleflight_promote is all of it: what it does
     * not say is its default, not an outer level's ("tries=5" there)
     */

    if (conf->promote) {
        ngx_conf_init_uint_value(conf->promote_tries, 1);
        ngx_conf_init_uint_value(conf->error_status, NGX_HTTP_BAD_GATEWAY);
    }

    ngx_conf_merge_bitmask_value(conf->promote, prev->promote,
                                 (NGX_CONF_BITMASK_SET
                                  |NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEFAULT));

    if (conf->promote & NGX_HTTP_SINGLEFLIGHT_PROMOTE_ABORT) {
        /* kept for old configurations: a client going away fails nothing */
        conf->promote &= ~NGX_HTTP_SINGLEFLIGHT_PROMOTE_ABORT;
    }

    ngx_conf_merge_uint_value(conf->promote_tries, prev->promote_tries, 1);
    ngx_conf_merge_uint_value(conf->error_status, prev->error_status,
                              NGX_HTTP_BAD_GATEWAY);
    ngx_conf_merge_value(conf->share_errors, prev->share_errors, 1);

    return NGX_CONF_OK;
}


/* singleflight_private, its marks' time, singleflight_credentials */

static char *
ngx_http_singleflight_merge_private(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    if (conf->private) {
        /* as singleflight_promote's parameters */
        ngx_conf_init_msec_value(conf->private_ttl, 5000);
    }

    ngx_conf_merge_bitmask_value(conf->private, prev->private,
                                 (NGX_CONF_BITMASK_SET
                                  |NGX_HTTP_SINGLEFLIGHT_PRIVATE_DEFAULT));

    ngx_conf_merge_msec_value(conf->private_ttl, prev->private_ttl, 5000);

    if (conf->credentials == NGX_CONF_UNSET_UINT) {
        conf->credentials = prev->credentials;
        conf->credential_headers = prev->credential_headers;
    }

    ngx_conf_merge_uint_value(conf->credentials, prev->credentials,
                              NGX_HTTP_SINGLEFLIGHT_CRED_HTTP);
    ngx_conf_merge_ptr_value(conf->credential_headers,
                             prev->credential_headers, NULL);

    ngx_http_singleflight_scan_init(conf);

    return NGX_CONF_OK;
}


/* how the fetch goes: singleflight_lazy, _resume and _hedge */

static void
ngx_http_singleflight_merge_fetch(ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    if (conf->lazy == NGX_CONF_UNSET) {
        conf->lazy = prev->lazy;
        conf->lazy_max = prev->lazy_max;
    }

    ngx_conf_merge_value(conf->lazy, prev->lazy, 1);
    ngx_conf_merge_off_value(conf->lazy_max, prev->lazy_max, 0);

    if (conf->resume == NGX_CONF_UNSET) {
        conf->resume = prev->resume;
        conf->resume_tries = prev->resume_tries;
    }

    ngx_conf_merge_value(conf->resume, prev->resume, 1);
    ngx_conf_merge_uint_value(conf->resume_tries, prev->resume_tries, 2);

    if (conf->hedge == NGX_CONF_UNSET_MSEC) {
        conf->hedge = prev->hedge;
        conf->hedge_auto = prev->hedge_auto;
    }

    ngx_conf_merge_msec_value(conf->hedge, prev->hedge, 0);
    ngx_conf_merge_value(conf->hedge_auto, prev->hedge_auto, 0);
}


/* where the body goes: singleflight_max_size, _memory and _temp_path */

static char *
ngx_http_singleflight_merge_store(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_http_singleflight_zone_conf_t  *zc;

    ngx_conf_merge_off_value(conf->range_offset, prev->range_offset, 0);

    /* the location's own, else its zone's parameters, else the defaults */

    ngx_conf_merge_off_value(conf->max_size_set, prev->max_size_set,
                             NGX_CONF_UNSET);
    ngx_conf_merge_size_value(conf->memory_set, prev->memory_set,
                              NGX_CONF_UNSET_SIZE);

    if (conf->temp_path_set == NULL) {
        conf->temp_path_set = prev->temp_path_set;
    }

    zc = conf->zone;

    conf->max_size = conf->max_size_set != NGX_CONF_UNSET
                     ? conf->max_size_set
                     : (zc && zc->max_size != NGX_CONF_UNSET) ? zc->max_size
                                                              : 0;

    conf->memory = conf->memory_set != NGX_CONF_UNSET_SIZE
                   ? conf->memory_set
                   : (zc && zc->memory != NGX_CONF_UNSET_SIZE) ? zc->memory
                                                               : 256 * 1024;

    conf->temp_path = conf->temp_path_set ? conf->temp_path_set
                      : zc ? zc->temp_path : NULL;

    if (ngx_conf_merge_path_value(cf, &conf->temp_path, NULL,
                                  &ngx_http_singleflight_temp_path)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (zc && conf->memory_set != NGX_CONF_UNSET_SIZE
        && conf->memory_set > zc->size && conf->memory_set != prev->memory_set)
    {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"singleflight_memory %uzk\" is more than zone "
                           "\"%V\" of %uzk holds: bodies go on in temporary "
                           "files once the zone is full",
                           conf->memory_set / 1024, &zc->name,
                           zc->size / 1024);
    }

    if (ngx_http_singleflight_add_temp_path(cf, conf->temp_path) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * singleflight_key: $scheme$host by default, compiled once at the
 * outermost level and shared.  What a key refers to is checked here:
 * a key without variables, a key with the request body that cannot
 * work.
 */

static char *
ngx_http_singleflight_merge_key(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_str_t  *value;

    if (conf->key == NULL) {

        if (prev->key == NULL
            && ngx_http_singleflight_key_default(cf, prev) != NGX_OK)
        {
            return NGX_CONF_ERROR;
        }

        conf->key = prev->key;
        conf->key_default = prev->key_default;
    }

    value = &conf->key->value;

    conf->key_body = 0;

    if (ngx_http_singleflight_key_uses(value, "request_body")) {
        conf->key_body |= 1;
    }

    if (ngx_http_singleflight_key_uses(value, "singleflight_body_hash")) {
        conf->key_body |= 2;
    }

    if (conf->enable != 1 || conf->zone_name.len == 0) {
        return NGX_CONF_OK;
    }

    return ngx_http_singleflight_check_key(cf, conf);
}


/*
 * Whether the key has the variable "name", as $name or ${name}: the whole
 * name, read as nginx's script engine reads it (ngx_http_script_compile()),
 * so that $http_x_request_body_sha is not $request_body; a "name" that
 * ends in "_" is a prefix ("upstream_")
 */

static ngx_uint_t
ngx_http_singleflight_key_uses(ngx_str_t *value, char *name)
{
    u_char  *p, *last, *start;
    size_t   len;

    len = ngx_strlen(name);
    p = value->data;
    last = value->data + value->len;

    while (p < last) {

        if (*p++ != '$') {
            continue;
        }

        if (p < last && *p == '{') {
            p++;
        }

        for (start = p; p < last; p++) {
            if ((*p < 'A' || *p > 'Z') && (*p < 'a' || *p > 'z')
                && (*p < '0' || *p > '9') && *p != '_')
            {
                break;
            }
        }

        if (((size_t) (p - start) == len
             || (name[len - 1] == '_' && (size_t) (p - start) > len))
            && ngx_strncasecmp(start, (u_char *) name, len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* $scheme$host, made without the script engine at run time (_key.c) */

static ngx_int_t
ngx_http_singleflight_key_default(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_str_t                          value;
    ngx_http_compile_complex_value_t   ccv;

    conf->key = ngx_palloc(cf->pool, sizeof(ngx_http_complex_value_t));
    if (conf->key == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ngx_str_set(&value, "$scheme$host");

    ccv.cf = cf;
    ccv.value = &value;
    ccv.complex_value = conf->key;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_ERROR;
    }

    conf->key_default = 1;

    return NGX_OK;
}


/* the key of a location that collapses: what cannot work, what may not */

static char *
ngx_http_singleflight_check_key(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf)
{
    char                      **late;
    ngx_str_t                  *value;
    ngx_http_core_loc_conf_t   *clcf;

    /* nginx's and ours, set once the request is answered ("_": a prefix) */
    static char  *ngx_http_singleflight_late_vars[] = {
        "upstream_addr", "upstream_status", "upstream_connect_time",
        "upstream_header_time", "upstream_response_time",
        "upstream_response_length", "upstream_bytes_received",
        "upstream_bytes_sent", "upstream_cache_status",
        "upstream_queue_time", "upstream_http_", "upstream_cookie_",
        "upstream_trailer_", "singleflight_status", "singleflight_key",
        "singleflight_wait_time", "singleflight_resumes",
        "singleflight_hedged", NULL
    };

    value = &conf->key->value;

    if (value->len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"singleflight_key\" is empty, so no request "
                           "would be collapsed: remove it for the default "
                           "key ($scheme$host with the location and URI), or "
                           "give it variables");
        return NGX_CONF_ERROR;
    }

    if (ngx_http_singleflight_key_uses(value, "request_body_file")) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"singleflight_key\" \"%V\" uses "
                           "$request_body_file, the name of a temporary "
                           "file and not the body, use "
                           "$singleflight_body_hash", value);
        return NGX_CONF_ERROR;
    }

    if (conf->key->lengths == NULL) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"singleflight_key\" \"%V\" has no variables: "
                           "requests of a location differ only by their URI",
                           value);
    }

    for (late = ngx_http_singleflight_late_vars; *late; late++) {
        if (ngx_http_singleflight_key_uses(value, *late)) {
            break;
        }
    }

    if (*late) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"singleflight_key\" \"%V\" uses a variable "
                           "that is set only once the request is answered, "
                           "and is empty when the key is made: use the "
                           "request's variables", value);
    }

    if (conf->key_body
        && !(conf->methods & NGX_HTTP_SINGLEFLIGHT_BODY_METHODS))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"singleflight_key\" \"%V\" uses the request "
                           "body, but \"singleflight_methods\" allows no "
                           "method with a body", value);
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if ((conf->key_body & 1) && clcf->client_body_in_file_only) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"singleflight_key\" \"%V\" uses "
                           "$request_body, which is empty with "
                           "\"client_body_in_file_only\", use "
                           "$singleflight_body_hash", value);
        return NGX_CONF_ERROR;
    }

    if (!conf->key_body
        && (conf->methods & NGX_HTTP_SINGLEFLIGHT_BODY_METHODS))
    {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"singleflight_methods\" collapses requests "
                           "with a body, but \"singleflight_key\" \"%V\" "
                           "does not use it: requests with different bodies "
                           "share one response", value);
    }

    return NGX_CONF_OK;
}


/* the temporary paths, for the sweep of a fresh start */

static ngx_int_t
ngx_http_singleflight_add_temp_path(ngx_conf_t *cf, ngx_path_t *path)
{
    ngx_uint_t                          i;
    ngx_path_t                        **pp;
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);
    pp = smcf->temp_paths.elts;

    for (i = 0; i < smcf->temp_paths.nelts; i++) {
        if (pp[i] == path) {
            return NGX_OK;
        }
    }

    pp = ngx_array_push(&smcf->temp_paths);
    if (pp == NULL) {
        return NGX_ERROR;
    }

    *pp = path;

    return NGX_OK;
}


static char *
ngx_http_singleflight(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t  *value;

    if (sfcf->enable != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {

        if (cf->args->nelts > 2) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\" in \"singleflight\" "
                               "directive, \"off\" takes none", &value[2]);
            return NGX_CONF_ERROR;
        }

        sfcf->enable = 0;
        return NGX_CONF_OK;
    }

    if (cf->args->nelts > 2) {

        if (ngx_strcmp(value[2].data, "content=any") == 0) {
            sfcf->content_any = 1;

        } else if (ngx_strcmp(value[2].data, "content=upstream") != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\" in \"singleflight\" "
                               "directive, it must be \"content=upstream\" "
                               "or \"content=any\"", &value[2]);
            return NGX_CONF_ERROR;
        }
    }

    /* the zone may be declared further down: it is looked up in merge */

    sfcf->enable = 1;
    sfcf->zone_name = value[1];

    return NGX_CONF_OK;
}


/*
 * The zone a directive names, declared at http level.  A name written as
 * singleflight_zone takes it ("zone=flights" or "zone=flights:10m") is
 * told the name alone.
 */

static char *
ngx_http_singleflight_resolve_zone(ngx_conf_t *cf, ngx_str_t *name,
    ngx_http_singleflight_zone_conf_t **zc, char *directive)
{
    u_char     *p;
    ngx_str_t   alone;

    if (name->len == 0 || *zc != NULL) {
        return NGX_CONF_OK;
    }

    *zc = ngx_http_singleflight_zone_find(cf, name);

    if (*zc != NULL) {
        return NGX_CONF_OK;
    }

    if (name->len < 5 || ngx_strncmp(name->data, "zone=", 5) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%s\" uses unknown zone \"%V\", declare it "
                           "at http level: \"singleflight_zone zone=%V:10m;\"",
                           directive, name, name);
        return NGX_CONF_ERROR;
    }

    alone.data = name->data + 5;
    p = ngx_strlchr(alone.data, name->data + name->len, ':');
    alone.len = (p != NULL ? p : name->data + name->len) - alone.data;

    if (alone.len && ngx_http_singleflight_zone_find(cf, &alone) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%s\" uses unknown zone \"%V\", name the zone "
                           "without \"zone=\": \"%V\"",
                           directive, name, &alone);
        return NGX_CONF_ERROR;
    }

    if (alone.len == 0) {
        ngx_str_set(&alone, "flights");
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%s\" uses unknown zone \"%V\", name the zone "
                       "without \"zone=\" (\"%V\") and declare it at http "
                       "level: \"singleflight_zone zone=%V:10m;\"",
                       directive, name, &alone, &alone);
    return NGX_CONF_ERROR;
}


/*
 * "singleflight on": the one zone declared, or, if none is, a zone of its
 * own ("singleflight", 10 MiB, scope=process), made once.  A zone named
 * "on" is that zone.
 */

static char *
ngx_http_singleflight_resolve_on(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_http_singleflight_zone_conf_t  **zcp;
    ngx_http_singleflight_main_conf_t   *smcf;

    if (conf->zone != NULL || conf->zone_name.len != 2
        || ngx_strncmp(conf->zone_name.data, "on", 2) != 0
        || ngx_http_singleflight_zone_find(cf, &conf->zone_name) != NULL)
    {
        return NGX_CONF_OK;
    }

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    if (smcf->zones.nelts > 1) {
        zcp = smcf->zones.elts;

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"singleflight on\" cannot tell which of the "
                           "%ui zones declared to use, name one: "
                           "\"singleflight %V;\"", smcf->zones.nelts,
                           &zcp[0]->name);
        return NGX_CONF_ERROR;
    }

    if (smcf->zones.nelts == 0
        && ngx_http_singleflight_zone_default(cf) == NULL)
    {
        return NGX_CONF_ERROR;
    }

    zcp = smcf->zones.elts;
    conf->zone = zcp[0];
    conf->zone_name = zcp[0]->name;

    return NGX_CONF_OK;
}


/*
 * ngx_conf_set_bitmask_slot(), with errors that name the directive and
 * the values it takes
 */

static char *
ngx_http_singleflight_bitmask(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    u_char              *p, buf[NGX_MAX_CONF_ERRSTR];
    ngx_str_t           *value;
    ngx_uint_t           i;
    ngx_conf_bitmask_t  *m;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        for (m = cmd->post; m->name.len; m++) {
            if (m->name.len == value[i].len
                && ngx_strcasecmp(m->name.data, value[i].data) == 0)
            {
                break;
            }
        }

        if (m->name.len == 0) {
            p = buf;

            for (m = cmd->post; m->name.len; m++) {
                p = ngx_slprintf(p, buf + sizeof(buf), "%s\"%V\"",
                                 (m == cmd->post) ? ""
                                 : (m[1].name.len ? ", " : " and "),
                                 &m->name);
            }

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"%V\" directive, "
                               "it must be among %*s",
                               &value[i], &cmd->name, (size_t) (p - buf), buf);
            return NGX_CONF_ERROR;
        }
    }

    return ngx_conf_set_bitmask_slot(cf, cmd, conf);
}


/*
 * singleflight_promote and singleflight_private: conditions, as a bitmask
 * slot takes them, and their parameters: "tries=" and "status=" of
 * singleflight_promote, "ttl=" of singleflight_private.  Parameters alone
 * take the default conditions; parameters left out take their defaults
 * at merge, not an outer level's.
 */

static char *
ngx_http_singleflight_conditions(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    char                *rv;
    u_char              *eq;
    ngx_str_t           *value;
    ngx_uint_t           i, j, *np, mask, params;
    ngx_conf_bitmask_t  *m;

    np = (ngx_uint_t *) ((char *) conf + cmd->offset);

    if (*np) {
        return "is duplicate";
    }

    value = cf->args->elts;
    mask = 0;
    params = 0;

    for (i = 1; i < cf->args->nelts; i++) {

        eq = ngx_strlchr(value[i].data, value[i].data + value[i].len, '=');

        if (eq != NULL) {

            for (j = 1; j < i; j++) {
                if (value[j].len > (size_t) (eq - value[i].data)
                    && ngx_strncmp(value[j].data, value[i].data,
                                   eq - value[i].data + 1)
                       == 0)
                {
                    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                       "duplicate parameter \"%V\" in "
                                       "\"%V\" directive, give it once",
                                       &value[i], &cmd->name);
                    return NGX_CONF_ERROR;
                }
            }

            rv = ngx_http_singleflight_condition_param(cf, cmd, sfcf,
                                                       &value[i]);
            if (rv != NGX_CONF_OK) {
                return rv;
            }

            params = 1;
            continue;
        }

        if (cmd->offset == offsetof(ngx_http_singleflight_loc_conf_t, promote)
            && ngx_strcmp(value[i].data, "abort") == 0)
        {
            ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                               "\"abort\" in \"singleflight_promote\" has "
                               "no effect: a client that goes away never "
                               "fails a flight, remove it");
            continue;
        }

        for (m = cmd->post; m->name.len; m++) {
            if (m->name.len == value[i].len
                && ngx_strcasecmp(m->name.data, value[i].data) == 0)
            {
                break;
            }
        }

        if (m->name.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"%V\" directive, "
                               "it must be %s", &value[i], &cmd->name,
                               cmd->offset
                               == offsetof(ngx_http_singleflight_loc_conf_t,
                                           promote)
                               ? "\"off\" or conditions among \"error\", "
                                 "\"timeout\", \"http_500\", \"http_502\", "
                                 "\"http_503\", \"http_504\" and \"dead\", "
                                 "then \"tries=\" and \"status=\""
                               : "\"off\" or conditions among "
                                 "\"set-cookie\", \"private\", \"no-store\" "
                                 "and \"no-cache\", then \"ttl=\"");
            return NGX_CONF_ERROR;
        }

        mask |= m->mask;
    }

    /* the same bit, 0x1000, in both */

    if ((mask & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF)
        && mask != NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" \"off\" cannot be combined with "
                           "conditions, write \"%V off;\" alone",
                           &cmd->name, &cmd->name);
        return NGX_CONF_ERROR;
    }

    if ((mask & NGX_HTTP_SINGLEFLIGHT_PROMOTE_OFF) && params) {
        /* accepted by older versions */
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"%V\" \"off\" has no parameters, write "
                           "\"%V off;\" alone", &cmd->name, &cmd->name);
    }

    /* parameters alone: the default conditions (merge: their defaults) */

    if (mask == 0) {
        mask = (cmd->offset
                == offsetof(ngx_http_singleflight_loc_conf_t, promote))
               ? NGX_HTTP_SINGLEFLIGHT_PROMOTE_DEFAULT
               : NGX_HTTP_SINGLEFLIGHT_PRIVATE_DEFAULT;
    }

    *np = NGX_CONF_BITMASK_SET | mask;

    return NGX_CONF_OK;
}


/* "tries=N" and "status=CODE" (promote), "ttl=TIME" (private) */

static char *
ngx_http_singleflight_condition_param(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_singleflight_loc_conf_t *sfcf, ngx_str_t *value)
{
    ngx_int_t   n;
    ngx_str_t   v;
    ngx_msec_t  ms;

    if (cmd->offset == offsetof(ngx_http_singleflight_loc_conf_t, private)) {

        if (value->len > 4 && ngx_strncmp(value->data, "ttl=", 4) == 0) {
            v.data = value->data + 4;
            v.len = value->len - 4;

            ms = ngx_parse_time(&v, 0);

            if (ms != (ngx_msec_t) NGX_ERROR) {
                sfcf->private_ttl = ms;
                return NGX_CONF_OK;
            }
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "it must be \"ttl=\" and a time, as \"ttl=5s\"",
                           value, &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (value->len > 6 && ngx_strncmp(value->data, "tries=", 6) == 0) {
        n = ngx_atoi(value->data + 6, value->len - 6);

        if (n >= 1 && n <= 100) {
            sfcf->promote_tries = n;
            return NGX_CONF_OK;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "it must be \"tries=\" and a number from 1 to "
                           "100", value, &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (value->len > 7 && ngx_strncmp(value->data, "status=", 7) == 0) {
        n = ngx_atoi(value->data + 7, value->len - 7);

        if (n >= 400 && n <= 599) {
            sfcf->error_status = n;
            return NGX_CONF_OK;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "it must be \"status=\" and a status from 400 to "
                           "599", value, &cmd->name);
        return NGX_CONF_ERROR;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" in \"%V\" directive, it "
                       "takes \"tries=\" and \"status=\"", value, &cmd->name);
    return NGX_CONF_ERROR;
}


/* a directive of old configurations: what to write now, then as before */

static char *
ngx_http_singleflight_deprecated(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_command_t                        real;
    ngx_http_singleflight_deprecated_t  *old;

    old = cmd->post;

    ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                       "the \"%V\" directive is deprecated, use %s instead",
                       &cmd->name, old->instead);

    real = *cmd;
    real.post = old->post;

    return old->set(cf, &real, conf);
}


/*
 * singleflight_promote_tries's value: at most as "tries=" of
 * singleflight_promote; 0 (no try, the flight fails) as it always was
 */

static char *
ngx_http_singleflight_tries_check(ngx_conf_t *cf, void *post, void *data)
{
    ngx_uint_t  *np = data;

    if (*np <= 100) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%ui\" in "
                       "\"singleflight_promote_tries\" directive, "
                       "it must be a number from 0 to 100", *np);

    return NGX_CONF_ERROR;
}


/* singleflight_error_status's value: an error status */

static char *
ngx_http_singleflight_status_check(ngx_conf_t *cf, void *post, void *data)
{
    ngx_uint_t  *np = data;

    if (*np >= 400 && *np <= 599) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%ui\" in \"singleflight_error_status\" "
                       "directive, it must be a status from 400 to 599", *np);

    return NGX_CONF_ERROR;
}


/* a header name: a token of RFC 9110 5.1, as nginx's parser takes one */

static ngx_uint_t
ngx_http_singleflight_header_name(ngx_str_t *name)
{
    u_char      c;
    ngx_uint_t  i;

    if (name->len == 0) {
        return 0;
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if ((c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            || (c != '\0' && ngx_strchr("!#$%&'*+-.^_`|~", c) != NULL))
        {
            continue;
        }

        return 0;
    }

    return 1;
}


/*
 * singleflight_credentials http | off | on | name ...;
 *
 * http (the default): requests with Cookie, Authorization or
 * Proxy-Authorization are collapsed, and given a response only where a
 * shared cache could give it to them (RFC 9111 3, 3.5; _fetch.c); off:
 * they are not collapsed; names add headers to that list (and mean off
 * for all of them); on: credentials do not stop collapsing (the key or
 * the response says whose it is).
 */

static char *
ngx_http_singleflight_credentials(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t   *value, *name;
    ngx_uint_t   i;

    if (sfcf->credentials != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    /* the keywords in any case, as nginx's flags ("ON") */

    if (cf->args->nelts == 2
        && (ngx_strcasecmp(value[1].data, (u_char *) "on") == 0
            || ngx_strcasecmp(value[1].data, (u_char *) "off") == 0
            || ngx_strcasecmp(value[1].data, (u_char *) "http") == 0))
    {
        sfcf->credentials = ((value[1].data[0] | 0x20) == 'h')
                            ? NGX_HTTP_SINGLEFLIGHT_CRED_HTTP
                            : ((value[1].data[1] | 0x20) == 'n')
                              ? NGX_HTTP_SINGLEFLIGHT_CRED_ON
                              : NGX_HTTP_SINGLEFLIGHT_CRED_OFF;
        sfcf->credential_headers = NULL;
        return NGX_CONF_OK;
    }

    sfcf->credentials = NGX_HTTP_SINGLEFLIGHT_CRED_OFF;

    sfcf->credential_headers = ngx_array_create(cf->pool,
                                                cf->args->nelts - 1,
                                                sizeof(ngx_str_t));
    if (sfcf->credential_headers == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strcasecmp(value[i].data, (u_char *) "on") == 0
            || ngx_strcasecmp(value[i].data, (u_char *) "off") == 0
            || ngx_strcasecmp(value[i].data, (u_char *) "http") == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"%V\" directive, "
                               "\"on\", \"off\" and \"http\" cannot be "
                               "combined with header names or with each "
                               "other", &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        if (!ngx_http_singleflight_header_name(&value[i])) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid header name \"%V\" in \"%V\" "
                               "directive, it must be \"on\", \"off\", "
                               "\"http\" or the names of request headers",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        name = ngx_array_push(sfcf->credential_headers);
        if (name == NULL) {
            return NGX_CONF_ERROR;
        }

        /* lowercase, as a request's header names are compared */

        name->len = value[i].len;
        name->data = ngx_pnalloc(cf->pool, value[i].len);
        if (name->data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_strlow(name->data, value[i].data, value[i].len);
    }

    return NGX_CONF_OK;
}


/*
 * singleflight_lazy on | off | size;
 *
 * on: a response nobody else waits for at its header goes straight to its
 * leader when its length is at most singleflight_memory (lazy_max 0); a
 * size sets that limit instead, larger or smaller.
 */

static char *
ngx_http_singleflight_lazy(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    off_t       size;
    ngx_str_t  *value;

    if (sfcf->lazy != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    sfcf->lazy = 1;
    sfcf->lazy_max = 0;

    if (ngx_strcmp(value[1].data, "on") == 0) {
        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value[1].data, "off") == 0) {
        sfcf->lazy = 0;
        return NGX_CONF_OK;
    }

    size = ngx_parse_offset(&value[1]);

    if (size <= 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be \"on\", \"off\" or a size",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    sfcf->lazy_max = size;

    return NGX_CONF_OK;
}


/* singleflight_lone own | fetch | direct; */

static char *
ngx_http_singleflight_lone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t  *value;

    if (sfcf->lone_conf != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "fetch") == 0) {
        sfcf->lone_conf = NGX_HTTP_SINGLEFLIGHT_LONE_FETCH;
        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value[1].data, "direct") == 0) {
        sfcf->lone_conf = NGX_HTTP_SINGLEFLIGHT_LONE_DIRECT;
        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value[1].data, "own") == 0) {
        sfcf->lone_conf = NGX_HTTP_SINGLEFLIGHT_LONE_OWN;
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be \"own\", \"fetch\" or \"direct\"",
                       &value[1], &cmd->name);

    return NGX_CONF_ERROR;
}


/*
 * singleflight_max_range_offset offset | off;
 *
 * off: a Range request is collapsed wherever its range starts (kept as
 * NGX_MAX_OFF_T_VALUE, as nginx keeps proxy_cache_max_range_offset off).
 */

static char *
ngx_http_singleflight_range_offset(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t  *value;

    if (sfcf->range_offset != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        sfcf->range_offset = NGX_MAX_OFF_T_VALUE;
        return NGX_CONF_OK;
    }

    sfcf->range_offset = ngx_parse_offset(&value[1]);

    if (sfcf->range_offset < 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be an offset or \"off\"",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * singleflight_hedge time | auto [min=time] | off;
 *
 * auto: at the p95 of the zone's header times, never below min (50ms by
 * default), which is kept in "hedge".
 */

static char *
ngx_http_singleflight_hedge(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_loc_conf_t  *sfcf = conf;

    ngx_str_t   *value, min;
    ngx_msec_t   ms;
    ngx_uint_t   valid;

    if (sfcf->hedge != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    sfcf->hedge = 0;
    sfcf->hedge_auto = 0;

    if (ngx_strcmp(value[1].data, "off") == 0 && cf->args->nelts == 2) {
        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value[1].data, "auto") == 0) {
        sfcf->hedge_auto = 1;
        sfcf->hedge = 50;

        if (cf->args->nelts == 2) {
            return NGX_CONF_OK;
        }

        if (ngx_strncmp(value[2].data, "min=", 4) == 0) {
            min.data = value[2].data + 4;
            min.len = value[2].len - 4;

            ms = ngx_parse_time(&min, 0);

            if (ms != (ngx_msec_t) NGX_ERROR) {
                /* 0 is off: no floor is nginx's clock's, 1 ms */
                sfcf->hedge = ngx_max(ms, 1);
                return NGX_CONF_OK;
            }
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "it must be \"min=\" and a time",
                           &value[2], &cmd->name);
        return NGX_CONF_ERROR;
    }

    ms = ngx_parse_time(&value[1], 0);

    /* a time, or "off" with a parameter */

    valid = (ms != (ngx_msec_t) NGX_ERROR && ms > 0)
            || ngx_strcmp(value[1].data, "off") == 0;

    if (valid && cf->args->nelts == 2) {
        sfcf->hedge = ms;
        return NGX_CONF_OK;
    }

    if (valid && ngx_strncmp(value[2].data, "min=", 4) == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "\"min=\" goes with \"auto\" only",
                           &value[2], &cmd->name);
        return NGX_CONF_ERROR;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, it must "
                       "be a time, \"auto\" or \"off\"",
                       &value[1], &cmd->name);
    return NGX_CONF_ERROR;
}


/*
 * singleflight_timeout time [status=code];
 * singleflight_max_waiters number [status=code];
 *
 * The value, and what a request past the limit gets: by default it goes
 * upstream on its own, with status= it is answered with that status.
 * The status field follows the value's in the configuration structure.
 */

static char *
ngx_http_singleflight_limit(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_int_t    n;
    ngx_str_t   *value, s;
    ngx_uint_t  *status;
    ngx_msec_t  *msp;

    value = cf->args->elts;

    if (cmd->offset == offsetof(ngx_http_singleflight_loc_conf_t, timeout)) {
        msp = (ngx_msec_t *) (p + cmd->offset);
        status = &((ngx_http_singleflight_loc_conf_t *) conf)->timeout_status;

        if (*msp != NGX_CONF_UNSET_MSEC) {
            return "is duplicate";
        }

        *msp = ngx_parse_time(&value[1], 0);

        if (*msp == (ngx_msec_t) NGX_ERROR || *msp == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid time \"%V\" in \"%V\" directive, "
                               "it must be a time above zero",
                               &value[1], &cmd->name);
            return NGX_CONF_ERROR;
        }

    } else {
        status = &((ngx_http_singleflight_loc_conf_t *) conf)
                     ->max_waiters_status;

        if (*(ngx_uint_t *) (p + cmd->offset) != NGX_CONF_UNSET_UINT) {
            return "is duplicate";
        }

        n = ngx_atoi(value[1].data, value[1].len);

        if (n == NGX_ERROR || n == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid number \"%V\" in \"%V\" directive, "
                               "it must be a number of at least 1",
                               &value[1], &cmd->name);
            return NGX_CONF_ERROR;
        }

        *(ngx_uint_t *) (p + cmd->offset) = n;
    }

    *status = 0;

    if (cf->args->nelts == 2) {
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value[2].data, "status=", 7) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive, "
                           "it must be \"status=\" and a status from 400 to "
                           "599", &value[2], &cmd->name);
        return NGX_CONF_ERROR;
    }

    s.data = value[2].data + 7;
    s.len = value[2].len - 7;

    n = ngx_atoi(s.data, s.len);

    if (n < 400 || n > 599) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid status \"%V\" in \"%V\" directive, "
                           "it must be between 400 and 599",
                           &value[2], &cmd->name);
        return NGX_CONF_ERROR;
    }

    *status = n;

    return NGX_CONF_OK;
}


/*
 * In the master, before the workers of a configuration are forked: the
 * wake-up pipes (_registry.c), and at the first start the temporary files
 * an nginx killed as a whole left behind.  Not after a binary upgrade
 * (its listening sockets inherited): the old generation's workers still
 * stream their flights' files, and remove them as their flights end.
 */

static ngx_int_t
ngx_http_singleflight_init_module(ngx_cycle_t *cycle)
{
    ngx_uint_t                          i;
    ngx_path_t                        **pp;
    ngx_http_singleflight_main_conf_t  *smcf;

    ngx_http_singleflight_check_file(cycle);

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL || smcf->zones.nelts == 0) {
        /* the registry's zone of a configuration before is unmapped */
        ngx_http_singleflight_registry_forget();
    }

    if (smcf == NULL) {
        return NGX_OK;
    }

    ngx_http_singleflight_handler_init_module(cycle);
    ngx_http_singleflight_clone_init_module(cycle);

    if (smcf->zones.nelts == 0) {
        return NGX_OK;
    }

    ngx_http_singleflight_key_init_generation();

    if (ngx_http_singleflight_registry_fresh() && !ngx_test_config) {

        if (ngx_inherited) {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "singleflight leaves the temporary files of the "
                          "nginx it upgrades");
            return ngx_http_singleflight_registry_init_module(cycle);
        }

        pp = smcf->temp_paths.elts;

        for (i = 0; i < smcf->temp_paths.nelts; i++) {
            ngx_http_singleflight_store_sweep(pp[i], cycle->log);
        }
    }

    return ngx_http_singleflight_registry_init_module(cycle);
}


/*
 * A reload keeps running the module this master loaded first: load_module
 * of the same path finds the object already in memory and never reads the
 * file again, so a package upgrade followed by a reload (what dpkg does)
 * runs the old code with the new configuration.  Say so when the file was
 * replaced since; a restart or a binary upgrade loads the new one.  A
 * module built into nginx has no file of its own: nothing to say.
 */

static void
ngx_http_singleflight_check_file(ngx_cycle_t *cycle)
{
#if (NGX_HTTP_SINGLEFLIGHT_HAVE_DLADDR)

    static ngx_uint_t       known;
    static ngx_file_info_t  loaded;

    Dl_info          mine, nginx;
    ngx_file_info_t  fi;

    if (dladdr((void *) &ngx_http_singleflight_module, &mine) == 0
        || dladdr((void *) &ngx_cycle, &nginx) == 0
        || mine.dli_fbase == nginx.dli_fbase
        || mine.dli_fname == NULL || mine.dli_fname[0] != '/')
    {
        return;
    }

    if (ngx_file_info(mine.dli_fname, &fi) == NGX_FILE_ERROR) {
        if (known) {
            ngx_log_error(NGX_LOG_WARN, cycle->log, ngx_errno,
                          "singleflight: \"%s\" is gone since nginx loaded "
                          "it; nginx keeps running the module it loaded",
                          mine.dli_fname);
        }

        return;
    }

    if (!known) {
        loaded = fi;
        known = 1;
        return;
    }

    if (fi.st_dev == loaded.st_dev && fi.st_ino == loaded.st_ino
        && fi.st_size == loaded.st_size && fi.st_mtime == loaded.st_mtime)
    {
        return;
    }

    ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                  "singleflight: \"%s\" changed since nginx loaded it; a "
                  "reload keeps running the module loaded then: restart "
                  "nginx, or upgrade its binary, to run the new one",
                  mine.dli_fname);

#endif
}


/* workers only: not the cache manager and loader, not the master */

static ngx_int_t
ngx_http_singleflight_init_process(ngx_cycle_t *cycle)
{
    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (ngx_http_singleflight_zone_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_singleflight_wait_init_process(cycle);
}


static void
ngx_http_singleflight_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return;
    }

    ngx_http_singleflight_wait_exit_process(cycle);
    ngx_http_singleflight_zone_exit_process(cycle);
}
