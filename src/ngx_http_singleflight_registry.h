/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The worker registry: one record per nginx process slot (the index the
 * master gives each process, ngx_process_slot), with the pid, a heartbeat,
 * and the wake-up flag; and the wake-up transport between workers.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_REGISTRY_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_REGISTRY_H_INCLUDED_


#include "ngx_http_singleflight.h"


/* how long a silent worker is trusted before its pid is looked at, ms */
#define NGX_HTTP_SINGLEFLIGHT_STALE  1000


typedef void (*ngx_http_singleflight_wake_pt)(ngx_cycle_t *cycle);


ngx_int_t ngx_http_singleflight_registry_add(ngx_conf_t *cf);
ngx_int_t ngx_http_singleflight_registry_init_module(ngx_cycle_t *cycle);
ngx_uint_t ngx_http_singleflight_registry_fresh(void);
void ngx_http_singleflight_registry_forget(void);
ngx_pid_t ngx_http_singleflight_registry_init_process(ngx_cycle_t *cycle,
    ngx_http_singleflight_wake_pt handler);
void ngx_http_singleflight_registry_exit_process(ngx_cycle_t *cycle);

ngx_uint_t ngx_http_singleflight_registry_slot(void);
ngx_uint_t ngx_http_singleflight_registry_mark(ngx_uint_t slot);
void ngx_http_singleflight_registry_flush_now(void);
void ngx_http_singleflight_registry_notify(uint16_t *slots, ngx_uint_t n,
    ngx_http_singleflight_counters_t *counters, ngx_log_t *log);
void ngx_http_singleflight_registry_beat(ngx_log_t *log);
ngx_uint_t ngx_http_singleflight_registry_suspect(ngx_uint_t slot,
    ngx_pid_t pid);
ngx_uint_t ngx_http_singleflight_registry_has(ngx_uint_t slot, ngx_pid_t pid);
ngx_pid_t ngx_http_singleflight_registry_silent(ngx_uint_t slot,
    ngx_msec_t age);
void ngx_http_singleflight_registry_clear(ngx_uint_t slot, ngx_pid_t pid);
ngx_uint_t ngx_http_singleflight_registry_dead(ngx_uint_t slot,
    ngx_pid_t pid);
ngx_str_t *ngx_http_singleflight_registry_token(void);


/*
 * The name this nginx's fetches, and the upstream requests of requests on
 * their own way, carry in CDN-Loop: singleflight_loop_name, or the token
 * (the module file's postconfiguration sets which)
 */

static ngx_inline ngx_str_t *
ngx_http_singleflight_loop_token(ngx_http_request_t *r)
{
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    return smcf->loop;
}


/*
 * Its hash is 0: nginx's $http_... variables pass over such an element,
 * as over a header a module deleted, so that they read what the client
 * sent, in the log too; the upstream modules send every element all the
 * same.
 */

static ngx_inline void
ngx_http_singleflight_loop_element(ngx_table_elt_t *h, ngx_str_t *token)
{
    h->hash = 0;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif
    ngx_str_set(&h->key, "CDN-Loop");
    h->lowcase_key = (u_char *) "cdn-loop";
    h->value = *token;
}


/*
 * "CDN-Loop: <this nginx's name>" added to "headers" (the request's, or
 * a fetch's), for an upstream request: if that comes back here, it is
 * LOOP (_handler.c), never made to wait for the request it is part of.
 * Inline: every request on its own way comes here.
 */

static ngx_inline ngx_int_t
ngx_http_singleflight_loop_header(ngx_http_request_t *r, ngx_list_t *headers)
{
    ngx_str_t        *token;
    ngx_table_elt_t  *h;

    token = ngx_http_singleflight_loop_token(r);

    if (token->len == 0) {
        return NGX_OK;
    }

    h = ngx_list_push(headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    ngx_http_singleflight_loop_element(h, token);

    return NGX_OK;
}


#endif /* _NGX_HTTP_SINGLEFLIGHT_REGISTRY_H_INCLUDED_ */
