/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The phase handler: whether a request is collapsed at all.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_handler_init(ngx_conf_t *cf);


#endif /* _NGX_HTTP_SINGLEFLIGHT_HANDLER_H_INCLUDED_ */
