/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * singleflight_forget: a content handler that makes a key's flight
 * invisible to new requests, like Go's Forget and Elixir's forget/2.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_FORGET_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_FORGET_H_INCLUDED_


#include "ngx_http_singleflight.h"


char *ngx_http_singleflight_forget(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_SINGLEFLIGHT_FORGET_H_INCLUDED_ */
