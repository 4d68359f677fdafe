/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The zone.
 *
 * singleflight_zone zone=name:size [scope=process|numa|worker]
 *     [memory=size] [max_size=size] [temp_path=path];
 *
 * memory=, max_size= and temp_path= are the zone's locations' (unless a
 * location sets its own with the older directives).
 *
 *   process  one shared instance for all workers: the most collapsing;
 *   numa     one shared instance per NUMA node, bound to its node's memory;
 *            a worker uses the instance of the node its CPU is on
 *            (_numa.c), so requests take only their node's lock; every
 *            worker has a record in every instance, whose lock it takes
 *            at start and exit, to reclaim a dead worker's share, and for
 *            the stats and singleflight_forget;
 *   worker   an instance in each worker's own memory and no lock at all;
 *            only its counters go to a small shared zone ("name#workers"),
 *            so that the stats can show every worker.
 *
 * An instance is a slab pool whose data is an ngx_http_singleflight_shctx_t:
 * the tree of flights, keyed by the hash of their key (the whole key is
 * compared, so equal hashes of different keys never mix), the private
 * marks (small records keyed by a 64-bit hash of the key, evicted first
 * when memory is short), the workers' records (_flight.c), the counters.
 */


#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_numa.h"


#define NGX_HTTP_SINGLEFLIGHT_EVICT  8


static ngx_http_singleflight_zone_conf_t *ngx_http_singleflight_zone_add(
    ngx_conf_t *cf, ngx_http_singleflight_main_conf_t *smcf, ngx_str_t *name,
    size_t size, ngx_uint_t scope);
static char *ngx_http_singleflight_zone_params(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_str_t *name, ssize_t *size, ngx_uint_t *scope,
    ngx_http_singleflight_zone_conf_t *params);
static char *ngx_http_singleflight_zone_temp_path(ngx_conf_t *cf,
    ngx_str_t *value, ngx_http_singleflight_zone_conf_t *params);
static char *ngx_http_singleflight_zone_scope(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_str_t *value, ngx_uint_t *scope);
static ngx_int_t ngx_http_singleflight_zone_instances(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc);
static ngx_int_t ngx_http_singleflight_zone_worker_stats(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc);
static char *ngx_http_singleflight_zone_size(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_str_t *value, ngx_str_t *name, ssize_t *size);
static ngx_http_singleflight_zone_t *ngx_http_singleflight_add_instance(
    ngx_conf_t *cf, ngx_http_singleflight_zone_conf_t *zc, ngx_str_t *name,
    ngx_int_t node);
static ngx_int_t ngx_http_singleflight_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_singleflight_init_shctx(
    ngx_http_singleflight_zone_t *zone);
static ngx_int_t ngx_http_singleflight_init_stats_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_http_singleflight_zone_t *ngx_http_singleflight_local_instance(
    ngx_cycle_t *cycle, ngx_http_singleflight_zone_conf_t *zc);
static void ngx_http_singleflight_rbtree_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_http_singleflight_mark_t *ngx_http_singleflight_mark_lookup(
    ngx_http_singleflight_zone_t *zone, uint64_t hash);
static void ngx_http_singleflight_mark_free_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_mark_t *m);


/* indexed by NGX_HTTP_SINGLEFLIGHT_SCOPE_*; also named in the stats */
ngx_str_t  ngx_http_singleflight_scopes[] = {
    ngx_string("process"),
    ngx_string("numa"),
    ngx_string("worker"),
    ngx_null_string
};


/* scope=numa: the topology, read with the first configuration that has it */
static ngx_http_singleflight_numa_t  ngx_http_singleflight_topology;


char *
ngx_http_singleflight_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_main_conf_t  *smcf = conf;

    char                                *rv;
    ssize_t                              size;
    ngx_str_t                            name;
    ngx_uint_t                           scope;
    ngx_http_singleflight_zone_conf_t    params, *zc;

    size = 0;
    name.len = 0;
    scope = NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS;

    params.memory = NGX_CONF_UNSET_SIZE;
    params.max_size = NGX_CONF_UNSET;
    params.temp_path = NULL;

    rv = ngx_http_singleflight_zone_params(cf, cmd, &name, &size, &scope,
                                           &params);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    if (name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_singleflight_zone_find(cf, &name) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate zone \"%V\" in \"%V\" directive",
                           &name, &cmd->name);
        return NGX_CONF_ERROR;
    }

    zc = ngx_http_singleflight_zone_add(cf, smcf, &name, size, scope);
    if (zc == NULL) {
        return NGX_CONF_ERROR;
    }

    zc->memory = params.memory;
    zc->max_size = params.max_size;
    zc->temp_path = params.temp_path;

    if (zc->memory != NGX_CONF_UNSET_SIZE && zc->memory > zc->size) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"memory=%uzk\" is more than zone \"%V\" of "
                           "%uzk holds: bodies go on in temporary files once "
                           "the zone is full", zc->memory / 1024, &zc->name,
                           zc->size / 1024);
    }

    return NGX_CONF_OK;
}


/*
 * "singleflight on" where no zone is declared: one of 10 MiB, for
 * every process, named "singleflight" (in the statistics too).
 */

ngx_http_singleflight_zone_conf_t *
ngx_http_singleflight_zone_default(ngx_conf_t *cf)
{
    ngx_http_singleflight_main_conf_t  *smcf;

    static ngx_str_t  name = ngx_string("singleflight");

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    return ngx_http_singleflight_zone_add(cf, smcf, &name, 10 * 1024 * 1024,
                                          NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS);
}


static ngx_http_singleflight_zone_conf_t *
ngx_http_singleflight_zone_add(ngx_conf_t *cf,
    ngx_http_singleflight_main_conf_t *smcf, ngx_str_t *name, size_t size,
    ngx_uint_t scope)
{
    ngx_http_singleflight_zone_conf_t  *zc, **zcp;

    zc = ngx_pcalloc(cf->pool, sizeof(ngx_http_singleflight_zone_conf_t));
    if (zc == NULL) {
        return NULL;
    }

    zc->name = *name;
    zc->size = size;
    zc->scope = scope;
    zc->memory = NGX_CONF_UNSET_SIZE;
    zc->max_size = NGX_CONF_UNSET;

    if (ngx_array_init(&zc->instances, cf->pool, 1,
                       sizeof(ngx_http_singleflight_zone_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_http_singleflight_zone_instances(cf, zc) != NGX_OK) {
        return NULL;
    }

    zcp = ngx_array_push(&smcf->zones);
    if (zcp == NULL) {
        return NULL;
    }

    *zcp = zc;

    return zc;
}


/*
 * The directive's parameters, once each: "zone=name:size", "scope=", and
 * for the zone's locations "memory=", "max_size=" and "temp_path=".
 */

static char *
ngx_http_singleflight_zone_params(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_str_t *name, ssize_t *size, ngx_uint_t *scope,
    ngx_http_singleflight_zone_conf_t *params)
{
    char        *rv;
    ngx_str_t   *value, v;
    ngx_uint_t   i, seen, bit;

    static const char  *names[] = {
        "zone=", "scope=", "memory=", "max_size=", "temp_path=", NULL
    };

    value = cf->args->elts;
    seen = 0;

    for (i = 1; i < cf->args->nelts; i++) {

        for (bit = 0; names[bit]; bit++) {
            if (ngx_strncmp(value[i].data, names[bit],
                            ngx_strlen(names[bit]))
                == 0)
            {
                break;
            }
        }

        if (names[bit] == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\" in \"%V\" directive, "
                               "it takes \"zone=\", \"scope=\", \"memory=\", "
                               "\"max_size=\" and \"temp_path=\"",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        if (seen & (1 << bit)) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate parameter \"%V\" in \"%V\" "
                               "directive", &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        seen |= 1 << bit;

        v.data = value[i].data + ngx_strlen(names[bit]);
        v.len = value[i].len - ngx_strlen(names[bit]);
        rv = NGX_CONF_OK;

        switch (bit) {

        case 0:
            rv = ngx_http_singleflight_zone_size(cf, cmd, &value[i], name,
                                                 size);
            break;

        case 1:
            rv = ngx_http_singleflight_zone_scope(cf, cmd, &value[i], scope);
            break;

        case 2:
            params->memory = ngx_parse_size(&v);

            if (params->memory == (size_t) NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid parameter \"%V\" in \"%V\" "
                                   "directive, it must be \"memory=\" and "
                                   "a size, as \"memory=256k\"",
                                   &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            break;

        case 3:
            params->max_size = ngx_parse_offset(&v);

            if (params->max_size == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid parameter \"%V\" in \"%V\" "
                                   "directive, it must be \"max_size=\" and "
                                   "a size, as \"max_size=100m\"",
                                   &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            break;

        default: /* 4 */
            rv = ngx_http_singleflight_zone_temp_path(cf, &v, params);
            break;
        }

        if (rv != NGX_CONF_OK) {
            return rv;
        }
    }

    return NGX_CONF_OK;
}


/* "temp_path=path": a directory as singleflight_temp_path's, levels 1:2 */

static char *
ngx_http_singleflight_zone_temp_path(ngx_conf_t *cf, ngx_str_t *value,
    ngx_http_singleflight_zone_conf_t *params)
{
    ngx_path_t  *path;

    if (value->len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "empty \"temp_path=\" in \"singleflight_zone\" "
                           "directive, it must name a directory");
        return NGX_CONF_ERROR;
    }

    path = ngx_pcalloc(cf->pool, sizeof(ngx_path_t));
    if (path == NULL) {
        return NGX_CONF_ERROR;
    }

    path->name = *value;

    if (path->name.data[path->name.len - 1] == '/') {
        path->name.len--;
    }

    if (ngx_conf_full_name(cf->cycle, &path->name, 0) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    path->conf_file = cf->conf_file->file.name.data;
    path->line = cf->conf_file->line;
    path->level[0] = 1;
    path->level[1] = 2;
    path->len = 1 + 1 + 2 + 1;

    if (ngx_add_path(cf, &path) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    params->temp_path = path;

    return NGX_CONF_OK;
}


/* "scope=process|numa|worker" */

static char *
ngx_http_singleflight_zone_scope(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_str_t *value, ngx_uint_t *scope)
{
    ngx_str_t   s;
    ngx_uint_t  i;

    s.data = value->data + 6;
    s.len = value->len - 6;

    for (i = 0; ngx_http_singleflight_scopes[i].len; i++) {
        if (s.len == ngx_http_singleflight_scopes[i].len
            && ngx_strncmp(s.data, ngx_http_singleflight_scopes[i].data,
                           s.len) == 0)
        {
            *scope = i;
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid scope \"%V\" in \"%V\" directive, "
                       "it must be \"process\", \"numa\" or \"worker\"",
                       value, &cmd->name);

    return NGX_CONF_ERROR;
}


/*
 * A zone's shared memory by its scope: one instance (process), one per
 * NUMA node (numa, "name#nodeN"), or the per-worker statistics only
 * (worker: each worker's instance is its own memory, "name#workers").
 */

static ngx_int_t
ngx_http_singleflight_zone_instances(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc)
{
    ngx_str_t  s;
    ngx_int_t  node;

    switch (zc->scope) {

    case NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS:

        if (ngx_http_singleflight_add_instance(cf, zc, &zc->name, -1)
            == NULL)
        {
            return NGX_ERROR;
        }

        return NGX_OK;

    case NGX_HTTP_SINGLEFLIGHT_SCOPE_NUMA:

        if (ngx_http_singleflight_topology.cpu_node == NULL
            && ngx_http_singleflight_numa_topology(cf,
                                          &ngx_http_singleflight_topology)
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        for (node = 0;
             node < (ngx_int_t) ngx_http_singleflight_topology.nodes;
             node++)
        {
            s.len = zc->name.len + sizeof("#node") - 1 + NGX_INT_T_LEN;
            s.data = ngx_pnalloc(cf->pool, s.len);
            if (s.data == NULL) {
                return NGX_ERROR;
            }

            s.len = ngx_sprintf(s.data, "%V#node%i", &zc->name, node)
                    - s.data;

            if (ngx_http_singleflight_add_instance(cf, zc, &s, node) == NULL) {
                return NGX_ERROR;
            }
        }

        return NGX_OK;

    default: /* NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER */
        return ngx_http_singleflight_zone_worker_stats(cf, zc);
    }
}


/* scope=worker: the shared record of every worker's statistics */

static ngx_int_t
ngx_http_singleflight_zone_worker_stats(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc)
{
    size_t     size;
    ngx_str_t  s;

    s.len = zc->name.len + sizeof("#workers") - 1;
    s.data = ngx_pnalloc(cf->pool, s.len);
    if (s.data == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(s.data, "%V#workers", &zc->name);

    /* one record per nginx process slot, see _registry.c */

    zc->nstats = NGX_MAX_PROCESSES;

    size = ngx_align(zc->nstats * sizeof(ngx_http_singleflight_worker_stats_t)
                     + 8 * ngx_pagesize, ngx_pagesize);

    zc->stats_zone = ngx_shared_memory_add(cf, &s, size,
                                           &ngx_http_singleflight_module);
    if (zc->stats_zone == NULL) {
        return NGX_ERROR;
    }

    zc->stats_zone->init = ngx_http_singleflight_init_stats_zone;
    zc->stats_zone->data = zc;

    return NGX_OK;
}


/* "zone=name:size" */

static char *
ngx_http_singleflight_zone_size(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_str_t *value, ngx_str_t *name, ssize_t *size)
{
    u_char     *p;
    ngx_str_t   s;

    static ngx_str_t  example = ngx_string("flights");

    name->data = value->data + 5;

    p = (u_char *) ngx_strlchr(name->data, value->data + value->len, ':');

    if (p == NULL || p == name->data) {
        /* "zone=flights": the name given, for the example */
        name->len = (p == NULL) ? value->len - 5 : 0;
        goto invalid;
    }

    name->len = p - name->data;

    if (ngx_strlchr(name->data, p, '#') != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid zone name \"%V\" in \"%V\" directive, "
                           "\"#\" is reserved", name, &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (name->len == 3 && ngx_strncmp(name->data, "off", 3) == 0) {
        /* "singleflight off" would not name it ("on" does: resolve_on()) */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid zone name \"off\" in \"%V\" directive, "
                           "\"singleflight off;\" could not name it, name "
                           "it otherwise, as \"zone=flights:10m\"",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    s.data = p + 1;
    s.len = value->data + value->len - s.data;

    *size = ngx_parse_size(&s);

    if (*size == NGX_ERROR) {
        goto invalid;
    }

    if (*size < (ssize_t) (8 * ngx_pagesize)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "zone \"%V\" is too small in \"%V\" directive, "
                           "it must be at least %uzk",
                           value, &cmd->name, 8 * ngx_pagesize / 1024);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid zone size \"%V\" in \"%V\" directive, "
                       "it must be \"zone=name:size\", as \"zone=%V:10m\"",
                       value, &cmd->name, name->len ? name : &example);
    return NGX_CONF_ERROR;
}


ngx_http_singleflight_zone_conf_t *
ngx_http_singleflight_zone_find(ngx_conf_t *cf, ngx_str_t *name)
{
    ngx_uint_t                           i;
    ngx_http_singleflight_zone_conf_t  **zcp;
    ngx_http_singleflight_main_conf_t   *smcf;

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);
    zcp = smcf->zones.elts;

    for (i = 0; i < smcf->zones.nelts; i++) {
        if (zcp[i]->name.len == name->len
            && ngx_strncmp(zcp[i]->name.data, name->data, name->len) == 0)
        {
            return zcp[i];
        }
    }

    return NULL;
}


static ngx_http_singleflight_zone_t *
ngx_http_singleflight_add_instance(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc, ngx_str_t *name, ngx_int_t node)
{
    ngx_shm_zone_t                 *shm_zone;
    ngx_http_singleflight_zone_t   *zone, **zp;

    shm_zone = ngx_shared_memory_add(cf, name, zc->size,
                                     &ngx_http_singleflight_module);
    if (shm_zone == NULL) {
        return NULL;
    }

    if (shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "shared memory zone \"%V\" is already used",
                           name);
        return NULL;
    }

    zone = ngx_pcalloc(cf->pool, sizeof(ngx_http_singleflight_zone_t));
    if (zone == NULL) {
        return NULL;
    }

    zone->shm_zone = shm_zone;
    zone->conf = zc;
    zone->name = *name;
    zone->node = node;

    ngx_rbtree_init(&zone->groups, &zone->groups_sentinel,
                    ngx_rbtree_insert_value);

    zp = ngx_array_push(&zc->instances);
    if (zp == NULL) {
        return NULL;
    }

    *zp = zone;

    shm_zone->init = ngx_http_singleflight_init_zone;
    shm_zone->data = zone;

    return zone;
}


static ngx_int_t
ngx_http_singleflight_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_singleflight_zone_t  *ozone = data;

    ngx_http_singleflight_zone_t  *zone;

    zone = shm_zone->data;

    if (ozone) {
        /* a reload with the same size: adopt the live zone and its flights */
        zone->sh = ozone->sh;
        zone->shpool = ozone->shpool;
        zone->counters = &zone->sh->counters;
        return ngx_http_singleflight_claims_init(zone, 0);
    }

    zone->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        zone->sh = zone->shpool->data;
        zone->counters = &zone->sh->counters;
        return NGX_OK;
    }

    if (zone->node != -1) {
        ngx_http_singleflight_numa_bind(shm_zone, zone->node, &zone->name);
    }

    return ngx_http_singleflight_init_shctx(zone);
}


/* a fresh instance: its trees, queues and counters in its slab pool */

static ngx_int_t
ngx_http_singleflight_init_shctx(ngx_http_singleflight_zone_t *zone)
{
    size_t  len;

    /* _locked: a scope=worker instance has no mutex; nobody else runs yet */

    zone->sh = ngx_slab_calloc_locked(zone->shpool,
                                      sizeof(ngx_http_singleflight_shctx_t));
    if (zone->sh == NULL) {
        return NGX_ERROR;
    }

    zone->shpool->data = zone->sh;
    zone->counters = &zone->sh->counters;

    ngx_rbtree_init(&zone->sh->rbtree, &zone->sh->sentinel,
                    ngx_http_singleflight_rbtree_insert_value);
    ngx_rbtree_init(&zone->sh->marks, &zone->sh->marks_sentinel,
                    ngx_rbtree_insert_value);
    ngx_queue_init(&zone->sh->mark_queue);
    ngx_queue_init(&zone->sh->workers);
    ngx_queue_init(&zone->sh->blocks);
    ngx_queue_init(&zone->sh->deferred);

    len = sizeof(" in singleflight zone \"\"") + zone->name.len;

    zone->shpool->log_ctx = ngx_slab_alloc_locked(zone->shpool, len);
    if (zone->shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(zone->shpool->log_ctx, " in singleflight zone \"%V\"%Z",
                &zone->name);

    /* exhaustion is reported by us, rate-limited */
    zone->shpool->log_nomem = 0;

    if (ngx_http_singleflight_claims_init(zone, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    zone->sh->baseline = ngx_http_singleflight_pages_used(zone->shpool);

    return NGX_OK;
}


/*
 * The slots of singleflight_lone direct, when a location uses the zone
 * so: made once, and kept by an instance that a reload adopts (a new
 * configuration may be the first to want them: "locked" is 0 then, as
 * the old workers use the instance).
 */

ngx_int_t
ngx_http_singleflight_claims_init(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t locked)
{
    size_t         size;
    ngx_uint_t     used;
    ngx_atomic_t  *claims;

    if (!zone->conf->claims || zone->sh->claims != NULL) {
        return NGX_OK;
    }

    size = NGX_HTTP_SINGLEFLIGHT_CLAIMS * sizeof(ngx_atomic_t);

    if (locked) {
        zone->sh->claims = ngx_slab_calloc_locked(zone->shpool, size);

    } else {
        /* the live instance's idle baseline grows by the slots' pages */

        ngx_shmtx_lock(&zone->shpool->mutex);

        used = ngx_http_singleflight_pages_used(zone->shpool);
        claims = ngx_slab_calloc_locked(zone->shpool, size);

        if (claims != NULL) {
            zone->sh->baseline += ngx_http_singleflight_pages_used(
                                                        zone->shpool) - used;
            zone->sh->claims = claims;
        }

        ngx_shmtx_unlock(&zone->shpool->mutex);
    }

    if (zone->sh->claims == NULL) {
        ngx_log_error(NGX_LOG_EMERG, ngx_cycle->log, 0,
                      "singleflight zone \"%V\" is too small for "
                      "\"singleflight_lone direct\", it needs %uzK more",
                      &zone->name, size / 1024);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_init_stats_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_singleflight_zone_conf_t  *ozc = data;

    ngx_slab_pool_t                    *shpool;
    ngx_http_singleflight_zone_conf_t  *zc;

    zc = shm_zone->data;

    if (ozc) {
        zc->stats = ozc->stats;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        zc->stats = shpool->data;
        return NGX_OK;
    }

    zc->stats = ngx_slab_calloc(shpool, zc->nstats
                               * sizeof(ngx_http_singleflight_worker_stats_t));
    if (zc->stats == NULL) {
        return NGX_ERROR;
    }

    shpool->data = zc->stats;

    return NGX_OK;
}


/* a worker picks its instance of every zone */

ngx_int_t
ngx_http_singleflight_zone_init_process(ngx_cycle_t *cycle)
{
    ngx_int_t                            node;
    ngx_uint_t                           n;
    ngx_http_singleflight_zone_t       **zp, *zone;
    ngx_http_singleflight_zone_conf_t  **zcp, *zc;
    ngx_http_singleflight_main_conf_t   *smcf;

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL) {
        return NGX_OK;
    }

    zcp = smcf->zones.elts;

    for (n = 0; n < smcf->zones.nelts; n++) {
        zc = zcp[n];
        zp = zc->instances.elts;

        switch (zc->scope) {

        case NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS:
            zc->mine = zp[0];
            break;

        case NGX_HTTP_SINGLEFLIGHT_SCOPE_NUMA:
            node = ngx_http_singleflight_numa_node(
                                 &ngx_http_singleflight_topology, cycle->log);

            if (node < 0 || (ngx_uint_t) node >= zc->instances.nelts) {
                node = 0;
            }

            zc->mine = zp[node];
            break;

        default: /* NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER */

            zone = ngx_http_singleflight_local_instance(cycle, zc);

            if (zone == NULL) {
                ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                              "singleflight zone \"%V\": no memory for this "
                              "worker's instance, not collapsing", &zc->name);
                break;
            }

            if (ngx_process_slot >= 0
                && (ngx_uint_t) ngx_process_slot < zc->nstats)
            {
                /* a new worker in the slot carries on with its counters */
                zone->wstats = &zc->stats[ngx_process_slot];
                zone->wstats->pid = ngx_pid;
                zone->counters = &zone->wstats->counters;
            }

            zc->mine = zone;
            break;
        }
    }

    return NGX_OK;
}


void
ngx_http_singleflight_zone_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                           n;
    ngx_http_singleflight_zone_t        *zone;
    ngx_http_singleflight_zone_conf_t  **zcp;
    ngx_http_singleflight_main_conf_t   *smcf;

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL) {
        return;
    }

    zcp = smcf->zones.elts;

    for (n = 0; n < smcf->zones.nelts; n++) {
        zone = zcp[n]->mine;

        if (zone != NULL && zone->wstats != NULL
            && zone->wstats->pid == ngx_pid)
        {
            /* the counters stay, to be added up with the others' */
            ngx_memzero(&zone->wstats->gauges,
                        sizeof(ngx_http_singleflight_gauges_t));
            zone->wstats->pid = 0;
        }
    }
}


/*
 * scope=worker: an instance in the worker's own memory, laid out like a
 * shared one (a slab pool) but never locked.
 */

static ngx_http_singleflight_zone_t *
ngx_http_singleflight_local_instance(ngx_cycle_t *cycle,
    ngx_http_singleflight_zone_conf_t *zc)
{
    u_char                        *addr;
    ngx_slab_pool_t               *sp;
    ngx_http_singleflight_zone_t  *zone;

    zone = ngx_pcalloc(cycle->pool, sizeof(ngx_http_singleflight_zone_t));
    if (zone == NULL) {
        return NULL;
    }

    addr = ngx_memalign(ngx_pagesize, zc->size, cycle->log);
    if (addr == NULL) {
        return NULL;
    }

    sp = (ngx_slab_pool_t *) addr;
    ngx_memzero(sp, sizeof(ngx_slab_pool_t));

    sp->end = addr + zc->size;
    sp->min_shift = 3;
    sp->addr = addr;

    ngx_slab_init(sp);

    zone->shpool = sp;
    zone->conf = zc;
    zone->name = zc->name;
    zone->node = -1;
    zone->local = 1;

    ngx_rbtree_init(&zone->groups, &zone->groups_sentinel,
                    ngx_rbtree_insert_value);

    if (ngx_http_singleflight_init_shctx(zone) != NGX_OK) {
        ngx_free(addr);
        return NULL;
    }

    return zone;
}


/*
 * Flights are ordered by the hash of their key, then by the key, then by
 * id, so that the flights of one key (its variants) sit next to each
 * other in the tree.
 */

static void
ngx_http_singleflight_rbtree_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_int_t                      rc;
    ngx_rbtree_node_t            **p;
    ngx_http_singleflight_node_t  *fn, *fnt;

    fn = (ngx_http_singleflight_node_t *) node;

    for ( ;; ) {

        if (node->key < temp->key) {
            p = &temp->left;

        } else if (node->key > temp->key) {
            p = &temp->right;

        } else { /* node->key == temp->key */

            fnt = (ngx_http_singleflight_node_t *) temp;

            rc = ngx_memn2cmp(fn->key, fnt->key, fn->key_len, fnt->key_len);

            if (rc == 0) {
                rc = (fn->id < fnt->id) ? -1 : 1;
            }

            p = (rc < 0) ? &temp->left : &temp->right;
        }

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


/*
 * Zone memory.  When the slab pool is out of pages, the oldest private
 * marks go first: a mark only saves requests a short wait, a flight saves
 * the origin a request.
 */

void *
ngx_http_singleflight_alloc_locked(ngx_http_singleflight_zone_t *zone,
    size_t size, ngx_uint_t *nomem)
{
    void                          *p;
    ngx_uint_t                     n;
    ngx_queue_t                   *q;
    ngx_http_singleflight_mark_t  *m;

    if (nomem != NULL) {
        *nomem = 0;
    }

    for ( ;; ) {
        p = ngx_slab_alloc_locked(zone->shpool, size);

        if (p != NULL || ngx_queue_empty(&zone->sh->mark_queue)) {
            break;
        }

        for (n = 0; n < NGX_HTTP_SINGLEFLIGHT_EVICT; n++) {
            if (ngx_queue_empty(&zone->sh->mark_queue)) {
                break;
            }

            q = ngx_queue_head(&zone->sh->mark_queue);
            m = ngx_queue_data(q, ngx_http_singleflight_mark_t, queue);
            ngx_http_singleflight_mark_free_locked(zone, m);
        }
    }

    if (p == NULL) {
        (void) ngx_atomic_fetch_add(&zone->counters->no_memory, 1);

        if (nomem != NULL) {
            *nomem = ngx_http_singleflight_nomem_locked(zone);
        }
    }

    return p;
}


/*
 * Is a "zone is full" warning due?  At most one a minute per zone, logged
 * after unlocking by a caller that gives up collapsing (one that falls
 * back silently, to a file say, does not ask).
 */

ngx_uint_t
ngx_http_singleflight_nomem_locked(ngx_http_singleflight_zone_t *zone)
{
    if (ngx_time() - zone->sh->nomem_logged >= 60) {
        zone->sh->nomem_logged = ngx_time();
        return 1;
    }

    return 0;
}


void
ngx_http_singleflight_log_nomem(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log, ngx_uint_t nomem)
{
    if (nomem) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "singleflight zone \"%V\" is full, "
                      "requests are not collapsed", &zone->name);
    }
}


/*
 * Private marks.  A key whose response was private (and had followers
 * waiting for it) is marked for singleflight_private_ttl, so that requests
 * for it go upstream at once instead of waiting on a flight whose
 * response they could not have.  A mark holds no key, only its hash: a
 * collision costs a request its collapsing, never its response.
 */

void
ngx_http_singleflight_mark_locked(ngx_http_singleflight_zone_t *zone,
    uint64_t hash, ngx_msec_t ttl)
{
    ngx_http_singleflight_mark_t  *m;

    if (ttl == 0) {
        return;
    }

    m = ngx_http_singleflight_mark_lookup(zone, hash);

    if (m == NULL) {
        m = ngx_http_singleflight_alloc_locked(zone,
                                        sizeof(ngx_http_singleflight_mark_t),
                                        NULL);
        if (m == NULL) {
            /* not worth a warning: collapsing just carries on */
            return;
        }

        m->node.key = (ngx_rbtree_key_t) hash;
        m->hash = hash;

        ngx_rbtree_insert(&zone->sh->marks, &m->node);
        zone->sh->nmarks++;

    } else {
        ngx_queue_remove(&m->queue);
    }

    m->expire = ngx_current_msec + ttl;
    ngx_queue_insert_tail(&zone->sh->mark_queue, &m->queue);
}


ngx_uint_t
ngx_http_singleflight_marked_locked(ngx_http_singleflight_zone_t *zone,
    uint64_t hash)
{
    ngx_http_singleflight_mark_t  *m;

    if (zone->sh->nmarks == 0) {
        return 0;
    }

    m = ngx_http_singleflight_mark_lookup(zone, hash);

    if (m == NULL) {
        return 0;
    }

    if ((ngx_msec_int_t) (m->expire - ngx_current_msec) > 0) {
        return 1;
    }

    ngx_http_singleflight_mark_free_locked(zone, m);

    return 0;
}


/* drops up to "n" expired marks, oldest first */

void
ngx_http_singleflight_expire_locked(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t n)
{
    ngx_queue_t                   *q;
    ngx_http_singleflight_mark_t  *m;

    while (n-- && !ngx_queue_empty(&zone->sh->mark_queue)) {
        q = ngx_queue_head(&zone->sh->mark_queue);
        m = ngx_queue_data(q, ngx_http_singleflight_mark_t, queue);

        if ((ngx_msec_int_t) (m->expire - ngx_current_msec) > 0) {
            return;
        }

        ngx_http_singleflight_mark_free_locked(zone, m);
    }
}


static ngx_http_singleflight_mark_t *
ngx_http_singleflight_mark_lookup(ngx_http_singleflight_zone_t *zone,
    uint64_t hash)
{
    ngx_rbtree_key_t               key;
    ngx_rbtree_node_t             *node, *sentinel;
    ngx_http_singleflight_mark_t  *m;

    key = (ngx_rbtree_key_t) hash;
    node = zone->sh->marks.root;
    sentinel = zone->sh->marks.sentinel;

    while (node != sentinel) {

        if (key != node->key) {
            node = (key < node->key) ? node->left : node->right;
            continue;
        }

        m = (ngx_http_singleflight_mark_t *) node;

        if (m->hash == hash) {
            return m;
        }

        /* ngx_rbtree_insert_value() puts equal keys to the right */
        node = node->right;
    }

    return NULL;
}


static void
ngx_http_singleflight_mark_free_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_mark_t *m)
{
    ngx_queue_remove(&m->queue);
    ngx_rbtree_delete(&zone->sh->marks, &m->node);
    zone->sh->nmarks--;
    ngx_slab_free_locked(zone->shpool, m);
}


void
ngx_http_singleflight_zone_gauges(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_gauges_t *g)
{
    ngx_slab_pool_t  *sp;

    sp = zone->shpool;

    g->in_flight = zone->sh->in_flight;
    g->waiters = zone->sh->waiters;
    g->readers = zone->sh->readers;
    g->marks = zone->sh->nmarks;
    g->workers = zone->sh->nhome;
    g->pages_free = sp->pfree;
    g->pages_used = ngx_http_singleflight_pages_used(sp);
    g->pages_baseline = zone->sh->baseline + zone->sh->block_pages;
}
