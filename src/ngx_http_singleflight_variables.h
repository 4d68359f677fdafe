/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Embedded variables.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_VARIABLES_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_VARIABLES_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_add_variables(ngx_conf_t *cf);
ngx_int_t ngx_http_singleflight_variable_index(ngx_cycle_t *cycle,
    u_char *name, size_t len);


/* $singleflight_status's words, by ngx_http_singleflight_status_e */
extern ngx_str_t  ngx_http_singleflight_status_names[];


#endif /* _NGX_HTTP_SINGLEFLIGHT_VARIABLES_H_INCLUDED_ */
