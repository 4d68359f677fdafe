/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * Embedded variables.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_VARIABLES_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_VARIABLES_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_add_variables(ngx_conf_t *cf);


#endif /* _NGX_HTTP_SINGLEFLIGHT_VARIABLES_H_INCLUDED_ */
