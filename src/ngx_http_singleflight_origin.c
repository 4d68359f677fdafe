/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * What nginx's upstream modules send to the origin.
 *
 * Which content handlers go to an origin.  A flight saves origin
 * requests; a static file, stub_status, a "return" or another module's
 * own content has none to save, and some (stub_status) would hand one
 * client's answer to others.  So by default only requests whose location
 * hands them to an upstream module (proxy_pass, fastcgi_pass,
 * uwsgi_pass, scgi_pass, grpc_pass, memcached_pass) are collapsed.
 * Those handlers are static functions of their modules: the module learns
 * them while the configuration is read, by wrapping the set handlers of
 * those directives in the command tables (ngx_http_singleflight_origin_
 * hook(), from the http block's preconfiguration): each wrapped directive
 * runs as before, then the location's content handler it set is noted.
 * The tables are given back as they were when the http block has been
 * read, and by a cleanup of the cycle's pool should reading fail, so that
 * no table ever points into this module once it may be unloaded.
 *
 * What request headers a location sets for the origin.  A response with
 * "Vary: X-Device" varies on the X-Device its origin received.  Where the
 * location sets that header itself (proxy_set_header X-Device $device;
 * grpc_set_header; fastcgi_param, uwsgi_param or scgi_param HTTP_X_DEVICE)
 * it is not the client's header: two clients without one would be sent
 * different values.  The directives' values, read from the modules'
 * location configurations through their commands' offsets, are compiled
 * again here.  Where the location's content is an upstream module's, only
 * that module's directives count, and the client's header with the same
 * name does not reach the origin: a request's value of such a header is
 * what they make for it.  Elsewhere (a location whose upstream module is
 * not known: the http and server levels) it is what each of them makes,
 * after the client's own header.  Two requests are the same variant only
 * if those values are the same (ngx_http_singleflight_origin_header()).
 */


#include "ngx_http_singleflight_origin.h"


/* the most *_pass directives wrapped, and content handlers noted */
#define NGX_HTTP_SINGLEFLIGHT_HOOKS  12


typedef char *(*ngx_http_singleflight_set_pt)(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);

typedef struct {
    ngx_command_t                   *cmd;
    ngx_http_singleflight_set_pt     set;
    ngx_uint_t                       index;       /* its module's
                                                     ctx_index */
    ngx_uint_t                       joins;       /* echo's */
} ngx_http_singleflight_hook_t;


/* a request header the location sets for its origin */
typedef struct {
    ngx_str_t                        name;        /* lowercase; "-" for "_"
                                                     of a parameter */
    ngx_http_complex_value_t         value;
    ngx_uint_t                       setter;
    ngx_uint_t                       shadows;     /* the client's header
                                                     is not sent */
} ngx_http_singleflight_set_t;


/* the directives that set a request header for the origin */
typedef struct {
    const char                      *module;
    const char                      *directive;
    ngx_uint_t                       params;      /* HTTP_ parameters */
} ngx_http_singleflight_setter_t;


static char *ngx_http_singleflight_origin_pass(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static void ngx_http_singleflight_origin_setters(ngx_conf_t *cf);
static ngx_int_t ngx_http_singleflight_origin_compile(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf);
static ngx_int_t ngx_http_singleflight_origin_add(ngx_conf_t *cf,
    ngx_array_t *sets, ngx_uint_t setter, ngx_str_t *key, ngx_str_t *value);
static ngx_uint_t ngx_http_singleflight_origin_is(ngx_str_t *name,
    ngx_http_singleflight_set_t *set);


static const char  *ngx_http_singleflight_passes[] = {
    "proxy_pass", "fastcgi_pass", "uwsgi_pass", "scgi_pass", "grpc_pass",
    "memcached_pass",

    /*
     * echo's: the content they make takes in its own subrequests' output,
     * which joins the response below this module's filter (nginx's
     * postpone filter), where a fetch's response is no longer taken
     */
    "echo_location", "echo_location_async", "echo_subrequest",
    "echo_subrequest_async", NULL
};

/* the first of them that is not a *_pass */
#define NGX_HTTP_SINGLEFLIGHT_JOINERS  6


static ngx_http_singleflight_setter_t
    ngx_http_singleflight_setters[NGX_HTTP_SINGLEFLIGHT_SETTERS] =
{
    { "ngx_http_proxy_module", "proxy_set_header", 0 },
    { "ngx_http_grpc_module", "grpc_set_header", 0 },
    { "ngx_http_fastcgi_module", "fastcgi_param", 1 },
    { "ngx_http_uwsgi_module", "uwsgi_param", 1 },
    { "ngx_http_scgi_module", "scgi_param", 1 }
};


static ngx_str_t  ngx_http_singleflight_origin_none = ngx_null_string;

static ngx_http_singleflight_hook_t
    ngx_http_singleflight_hooks[NGX_HTTP_SINGLEFLIGHT_HOOKS];
static ngx_uint_t  ngx_http_singleflight_nhooks;


/*
 * From the http block's preconfiguration: the *_pass directives of the
 * modules nginx has are wrapped until the block is read, and where the
 * header-setting ones keep their values is found.
 */

ngx_int_t
ngx_http_singleflight_origin_hook(ngx_conf_t *cf)
{
    ngx_uint_t           i, n;
    ngx_module_t        *m;
    ngx_command_t       *cmd;
    ngx_pool_cleanup_t  *cln;

    /* a configuration read before that never finished: as it was first */
    ngx_http_singleflight_origin_unhook(NULL);

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_singleflight_origin_unhook;

    for (i = 0; cf->cycle->modules[i]; i++) {
        m = cf->cycle->modules[i];

        if (m->type != NGX_HTTP_MODULE || m->commands == NULL) {
            continue;
        }

        for (cmd = m->commands; cmd->name.len; cmd++) {

            for (n = 0; ngx_http_singleflight_passes[n]; n++) {
                if (ngx_strcmp(cmd->name.data,
                               ngx_http_singleflight_passes[n])
                    == 0)
                {
                    break;
                }
            }

            if (ngx_http_singleflight_passes[n] == NULL
                || cmd->set == ngx_http_singleflight_origin_pass
                || ngx_http_singleflight_nhooks
                   == NGX_HTTP_SINGLEFLIGHT_HOOKS)
            {
                continue;
            }

            ngx_http_singleflight_hooks[ngx_http_singleflight_nhooks].cmd =
                                                                        cmd;
            ngx_http_singleflight_hooks[ngx_http_singleflight_nhooks].set =
                                                                   cmd->set;
            ngx_http_singleflight_hooks[ngx_http_singleflight_nhooks].index =
                                                                m->ctx_index;
            ngx_http_singleflight_hooks[ngx_http_singleflight_nhooks].joins =
                                           n >= NGX_HTTP_SINGLEFLIGHT_JOINERS;
            ngx_http_singleflight_nhooks++;

            cmd->set = ngx_http_singleflight_origin_pass;
        }
    }

    ngx_http_singleflight_origin_setters(cf);

    return NGX_OK;
}


/* the command tables as they were (postconfiguration, the pool's cleanup) */

void
ngx_http_singleflight_origin_unhook(void *data)
{
    ngx_uint_t  i;

    for (i = 0; i < ngx_http_singleflight_nhooks; i++) {
        ngx_http_singleflight_hooks[i].cmd->set =
                                            ngx_http_singleflight_hooks[i].set;
    }

    ngx_http_singleflight_nhooks = 0;
}


/*
 * A *_pass directive, or one of echo's subrequests: as it is, then its
 * location's handler is noted
 */

static char *
ngx_http_singleflight_origin_pass(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    char                               *rv;
    ngx_uint_t                          i, index;
    ngx_http_core_loc_conf_t           *clcf;
    ngx_http_singleflight_main_conf_t  *smcf;

    for (i = 0; i < ngx_http_singleflight_nhooks; i++) {
        if (ngx_http_singleflight_hooks[i].cmd == cmd) {
            break;
        }
    }

    if (i == ngx_http_singleflight_nhooks) {
        /* cannot happen: a wrapped directive is always on the list */
        return "is not known to the singleflight module";
    }

    rv = ngx_http_singleflight_hooks[i].set(cf, cmd, conf);
    index = ngx_http_singleflight_hooks[i].index;

    if (rv != NGX_CONF_OK) {
        return rv;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    if (clcf->handler == NULL) {
        return NGX_CONF_OK;
    }

    if (ngx_http_singleflight_hooks[i].joins) {
        smcf->joiner = clcf->handler;
        return NGX_CONF_OK;
    }

    for (i = 0; i < smcf->norigins; i++) {
        if (smcf->origins[i] == clcf->handler) {
            return NGX_CONF_OK;
        }
    }

    if (smcf->norigins
        < sizeof(smcf->origins) / sizeof(ngx_http_handler_pt))
    {
        smcf->origin_index[smcf->norigins] = index;
        smcf->origins[smcf->norigins++] = clcf->handler;
    }

    return NGX_CONF_OK;
}


/*
 * Is "handler" one whose response takes in its subrequests' output
 * (ngx_http_singleflight_origin_joins())?  Such a response is never a
 * flight's: what this module takes of it at the top of the filters lacks
 * those parts.
 */

ngx_uint_t
ngx_http_singleflight_origin_joiner(ngx_http_request_t *r,
    ngx_http_handler_pt handler)
{
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    return handler != NULL && handler == smcf->joiner;
}


/*
 * The upstream configuration of the location's content, an origin's, or
 * NULL: whether nginx's event pipe buffers its response (proxy_buffering
 * and the like, on), which a request going its own way needs to feed a
 * flight (_tee.c), and whether a cache answers there.  It is the first
 * member of each *_pass module's location configuration (nginx 1.22 to
 * 1.31), which is not ours to include; the modules are merged before
 * this one, which is loaded after them.
 */

ngx_http_upstream_conf_t *
ngx_http_singleflight_origin_upstream(ngx_conf_t *cf,
    ngx_http_core_loc_conf_t *clcf)
{
    ngx_uint_t                          i;
    ngx_http_conf_ctx_t                *ctx;
    ngx_http_singleflight_main_conf_t  *smcf;

    if (clcf->handler == NULL) {
        return NULL;
    }

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    for (i = 0; i < smcf->norigins; i++) {
        if (smcf->origins[i] == clcf->handler) {
            ctx = cf->ctx;
            return ctx->loc_conf[smcf->origin_index[i]];
        }
    }

    return NULL;
}


/*
 * Where each header-setting directive keeps its values: its module's
 * location configuration and the offset its command names, for the
 * stock slots whose values are known (ngx_keyval_t, and
 * ngx_http_upstream_param_t); NGX_ERROR where nginx has no such module
 * or directive, or sets it otherwise.
 */

static void
ngx_http_singleflight_origin_setters(ngx_conf_t *cf)
{
    ngx_uint_t                          i, k;
    ngx_module_t                       *m;
    ngx_command_t                      *cmd;
    ngx_http_singleflight_setter_t     *st;
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    for (k = 0; k < NGX_HTTP_SINGLEFLIGHT_SETTERS; k++) {
        st = &ngx_http_singleflight_setters[k];
        smcf->setter_index[k] = NGX_ERROR;

        m = NULL;

        for (i = 0; cf->cycle->modules[i]; i++) {
            if (cf->cycle->modules[i]->type == NGX_HTTP_MODULE
                && cf->cycle->modules[i]->commands != NULL
                && ngx_strcmp(cf->cycle->modules[i]->name, st->module) == 0)
            {
                m = cf->cycle->modules[i];
                break;
            }
        }

        if (m == NULL) {
            continue;
        }

        for (cmd = m->commands; cmd->name.len; cmd++) {
            if (ngx_strcmp(cmd->name.data, st->directive) != 0) {
                continue;
            }

            if (cmd->conf == NGX_HTTP_LOC_CONF_OFFSET
                && cmd->set == (st->params ? ngx_http_upstream_param_set_slot
                                           : ngx_conf_set_keyval_slot))
            {
                smcf->setter_index[k] = m->ctx_index;
                smcf->setter_offset[k] = cmd->offset;
            }

            break;
        }
    }
}


/*
 * The location's header-setting directives, as their modules merged them
 * (before this module: it is loaded after them): the parent's compiled
 * values where every one is its parent's, compiled anew otherwise.
 */

ngx_int_t
ngx_http_singleflight_origin_merge(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *prev,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_int_t                           own;
    ngx_uint_t                          i, k, same;
    ngx_array_t                        *src;
    ngx_http_conf_ctx_t                *ctx;
    ngx_http_core_loc_conf_t           *clcf;
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);
    ctx = cf->ctx;
    clcf = ctx->loc_conf[ngx_http_core_module.ctx_index];

    /*
     * the setter of the location's upstream module (none for
     * memcached_pass: NGX_HTTP_SINGLEFLIGHT_SETTERS), or NGX_ERROR where
     * the location's content is not known to be an upstream module's
     */

    own = NGX_ERROR;

    if ((clcf->noname || clcf->lmt_excpt) && clcf->handler == NULL) {
        /* an "if" or limit_except block with its location's content */
        own = prev->sets_for;
    }

    for (i = 0; clcf->handler != NULL && i < smcf->norigins; i++) {
        if (smcf->origins[i] != clcf->handler) {
            continue;
        }

        own = NGX_HTTP_SINGLEFLIGHT_SETTERS;

        for (k = 0; k < NGX_HTTP_SINGLEFLIGHT_SETTERS; k++) {
            if (smcf->setter_index[k] == (ngx_int_t) smcf->origin_index[i]) {
                own = k;
            }
        }

        break;
    }

    conf->sets_for = own;
    same = (own == prev->sets_for);

    for (k = 0; k < NGX_HTTP_SINGLEFLIGHT_SETTERS; k++) {
        src = NULL;

        if (smcf->setter_index[k] != NGX_ERROR) {
            src = *(ngx_array_t **)
                      ((u_char *) ctx->loc_conf[smcf->setter_index[k]]
                       + smcf->setter_offset[k]);

            if (src == NGX_CONF_UNSET_PTR) {
                /* not merged yet: its parent's, as its module will do */
                src = prev->set_source[k];
            }
        }

        conf->set_source[k] = src;

        if (src != prev->set_source[k]) {
            same = 0;
        }
    }

    if (same && prev->sets_done) {
        conf->sets = prev->sets;
        conf->sets_done = 1;
        return NGX_OK;
    }

    conf->sets_done = 1;

    return ngx_http_singleflight_origin_compile(cf, conf);
}


static ngx_int_t
ngx_http_singleflight_origin_compile(ngx_conf_t *cf,
    ngx_http_singleflight_loc_conf_t *conf)
{
    ngx_uint_t                  i, k;
    ngx_keyval_t               *kv;
    ngx_http_upstream_param_t  *param;

    conf->sets = NULL;

    for (k = 0; k < NGX_HTTP_SINGLEFLIGHT_SETTERS; k++) {

        if (conf->set_source[k] == NULL
            || conf->set_source[k] == NGX_CONF_UNSET_PTR
            || (conf->sets_for != NGX_ERROR
                && conf->sets_for != (ngx_int_t) k))
        {
            /* none, or another module's, which never reach this origin */
            continue;
        }

        if (conf->sets == NULL) {
            conf->sets = ngx_array_create(cf->pool, 4,
                                          sizeof(ngx_http_singleflight_set_t));
            if (conf->sets == NULL) {
                return NGX_ERROR;
            }
        }

        if (ngx_http_singleflight_setters[k].params) {
            param = conf->set_source[k]->elts;

            for (i = 0; i < conf->set_source[k]->nelts; i++) {
                if (ngx_http_singleflight_origin_add(cf, conf->sets, k,
                                                     &param[i].key,
                                                     &param[i].value)
                    != NGX_OK)
                {
                    return NGX_ERROR;
                }
            }

            continue;
        }

        kv = conf->set_source[k]->elts;

        for (i = 0; i < conf->set_source[k]->nelts; i++) {
            if (ngx_http_singleflight_origin_add(cf, conf->sets, k,
                                                 &kv[i].key, &kv[i].value)
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    return NGX_OK;
}


/* one directive's header and its value, compiled; a parameter's "HTTP_" */

static ngx_int_t
ngx_http_singleflight_origin_add(ngx_conf_t *cf, ngx_array_t *sets,
    ngx_uint_t setter, ngx_str_t *key, ngx_str_t *value)
{
    size_t                             i, skip;
    ngx_http_singleflight_set_t       *set;
    ngx_http_compile_complex_value_t   ccv;

    skip = 0;

    if (ngx_http_singleflight_setters[setter].params) {
        if (key->len <= 5 || ngx_strncmp(key->data, "HTTP_", 5) != 0) {
            /* not a request header */
            return NGX_OK;
        }

        skip = 5;
    }

    set = ngx_array_push(sets);
    if (set == NULL) {
        return NGX_ERROR;
    }

    /*
     * nginx keeps a client's header from the origin by its parameter's
     * name with "_" for "-": one named with a "-" (HTTP_X-DEVICE) keeps
     * none, the client's X-Device goes as HTTP_X_DEVICE all the same
     */

    set->shadows = (skip == 0
                    || ngx_strlchr(key->data + skip, key->data + key->len, '-')
                       == NULL);
    set->setter = setter;
    set->name.len = key->len - skip;
    set->name.data = ngx_pnalloc(cf->pool, set->name.len);
    if (set->name.data == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < set->name.len; i++) {
        set->name.data[i] = ngx_tolower(key->data[skip + i]);

        if (skip && set->name.data[i] == '_') {
            set->name.data[i] = '-';
        }
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = value;
    ccv.complex_value = &set->value;

    return ngx_http_compile_complex_value(&ccv) == NGX_OK ? NGX_OK
                                                          : NGX_ERROR;
}


/* is "handler" one that a *_pass directive set? */

ngx_uint_t
ngx_http_singleflight_origin_handler(ngx_http_request_t *r,
    ngx_http_handler_pt handler)
{
    ngx_uint_t                          i;
    ngx_http_singleflight_main_conf_t  *smcf;

    if (handler == NULL) {
        return 0;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_singleflight_module);

    for (i = 0; i < smcf->norigins; i++) {
        if (smcf->origins[i] == handler) {
            return 1;
        }
    }

    return 0;
}


/*
 * Does the location of "loc_conf" set request header "name" itself: 0, it
 * does not; 1, to the same value for every request, the client's kept
 * from the origin; 2, to a value made of variables, or with the client's
 * own sent as well.
 */

ngx_uint_t
ngx_http_singleflight_origin_sets(void **loc_conf, ngx_str_t *name)
{
    ngx_uint_t                         i, rc;
    ngx_http_singleflight_set_t       *set;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    sfcf = loc_conf[ngx_http_singleflight_module.ctx_index];

    if (sfcf->sets == NULL) {
        return 0;
    }

    set = sfcf->sets->elts;
    rc = 0;

    for (i = 0; i < sfcf->sets->nelts; i++) {
        if (!ngx_http_singleflight_origin_is(name, &set[i])) {
            continue;
        }

        if (set[i].value.lengths != NULL || !set[i].shadows
            || sfcf->sets_for == NGX_ERROR)
        {
            return 2;
        }

        rc = 1;
    }

    return rc;
}


/*
 * The value of request header "name" as far as the origin can tell, for
 * request "r" in the location of "loc_conf": the client's ("client"),
 * unless the location sets it; then each value the location's directives
 * make of it, each after a NUL byte (which no header value holds) and the
 * setter's number, after the client's where the location's upstream
 * module is not known or the client's is sent as well.
 */

ngx_int_t
ngx_http_singleflight_origin_header(ngx_http_request_t *r, void **loc_conf,
    ngx_str_t *name, ngx_str_t *client, ngx_str_t *value)
{
    u_char                            *p;
    size_t                             len;
    ngx_str_t                         *made;
    ngx_uint_t                         i, n, keep;
    ngx_http_singleflight_set_t       *set;
    ngx_http_singleflight_loc_conf_t  *sfcf;

    *value = *client;

    sfcf = loc_conf[ngx_http_singleflight_module.ctx_index];

    if (sfcf->sets == NULL) {
        return NGX_OK;
    }

    set = sfcf->sets->elts;
    n = 0;

    /* the location's upstream module sends the origin these alone */
    keep = (sfcf->sets_for == NGX_ERROR);

    for (i = 0; i < sfcf->sets->nelts; i++) {
        if (ngx_http_singleflight_origin_is(name, &set[i])) {
            keep |= !set[i].shadows;
            n++;
        }
    }

    if (n == 0) {
        return NGX_OK;
    }

    made = ngx_palloc(r->pool, n * sizeof(ngx_str_t));
    if (made == NULL) {
        return NGX_ERROR;
    }

    if (!keep) {
        client = &ngx_http_singleflight_origin_none;
    }

    len = client->len;
    n = 0;

    for (i = 0; i < sfcf->sets->nelts; i++) {
        if (!ngx_http_singleflight_origin_is(name, &set[i])) {
            continue;
        }

        if (ngx_http_complex_value(r, &set[i].value, &made[n]) != NGX_OK) {
            return NGX_ERROR;
        }

        len += 2 + made[n].len;
        n++;
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    value->data = p;

    if (client->len) {
        p = ngx_cpymem(p, client->data, client->len);
    }

    n = 0;

    for (i = 0; i < sfcf->sets->nelts; i++) {
        if (!ngx_http_singleflight_origin_is(name, &set[i])) {
            continue;
        }

        *p++ = '\0';
        *p++ = (u_char) ('0' + set[i].setter);

        if (made[n].len) {
            p = ngx_cpymem(p, made[n].data, made[n].len);
        }

        n++;
    }

    value->len = len;

    return NGX_OK;
}


/* is header "name" the one "set" sets? */

static ngx_uint_t
ngx_http_singleflight_origin_is(ngx_str_t *name,
    ngx_http_singleflight_set_t *set)
{
    u_char      c;
    ngx_uint_t  i, params;

    if (name->len != set->name.len) {
        return 0;
    }

    params = ngx_http_singleflight_setters[set->setter].params;

    for (i = 0; i < name->len; i++) {
        c = ngx_tolower(name->data[i]);

        if (params && c == '_') {
            c = '-';
        }

        if (c != set->name.data[i]) {
            return 0;
        }
    }

    return 1;
}


/* another HTTP module's ctx_index by its name, or NGX_ERROR without it */

ngx_int_t
ngx_http_singleflight_module_index(ngx_conf_t *cf, const char *name)
{
    ngx_uint_t     i;
    ngx_module_t  *m;

    for (i = 0; cf->cycle->modules[i]; i++) {
        m = cf->cycle->modules[i];

        if (m->type == NGX_HTTP_MODULE && ngx_strcmp(m->name, name) == 0) {
            return m->ctx_index;
        }
    }

    return NGX_ERROR;
}
