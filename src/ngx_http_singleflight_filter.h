/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The filters: first in the chain, they take a fetch's response into its
 * flight's store and let every other response pass.
 */


#ifndef _NGX_HTTP_SINGLEFLIGHT_FILTER_H_INCLUDED_
#define _NGX_HTTP_SINGLEFLIGHT_FILTER_H_INCLUDED_


#include "ngx_http_singleflight.h"


ngx_int_t ngx_http_singleflight_filter_init(ngx_conf_t *cf);


#endif /* _NGX_HTTP_SINGLEFLIGHT_FILTER_H_INCLUDED_ */
