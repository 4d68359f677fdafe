
/*
 * Where a zone's flights live: singleflight_zone's scope=.
 *
 *   process  one shared instance for all workers: the most collapsing;
 *   numa     one shared instance per NUMA node, each bound to its node's
 *            memory; a worker uses the instance of the node its CPU is on,
 *            so its lock is only ever taken by workers of its node;
 *   worker   an instance in each worker's own memory, no lock at all;
 *            only counters go to a small shared zone, for the stats.
 *
 * The NUMA topology is read from sysfs when the configuration is read,
 * or from the SINGLEFLIGHT_NUMA_CPUS environment variable if it is set:
 * the CPU lists of the nodes, separated by ';' (e.g. "0-3;4-7"), which
 * lets a one-node machine test several nodes.  A worker picks its node at
 * start-up from the CPU it runs on, which stays put under
 * worker_cpu_affinity.
 *
 * Every worker also takes a slot in each shared instance it uses (see
 * wait_mask in _handler.c), giving back first what workers that died held.
 */


#include "ngx_http_singleflight_scope.h"
#include "ngx_http_singleflight_zone.h"

#include <sys/syscall.h>


#define NGX_HTTP_SINGLEFLIGHT_NUMA_ENV    "SINGLEFLIGHT_NUMA_CPUS"
#define NGX_HTTP_SINGLEFLIGHT_MAX_CPUS    4096

/* from <linux/mempolicy.h>, not to need libnuma */
#define NGX_HTTP_SINGLEFLIGHT_MPOL_PREFERRED  1
#define NGX_HTTP_SINGLEFLIGHT_MPOL_MF_MOVE    (1 << 1)


static ngx_int_t ngx_http_singleflight_numa_topology(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc);
static ngx_int_t ngx_http_singleflight_cpulist(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc, u_char *p, u_char *last,
    ngx_int_t node);
static ngx_http_singleflight_zone_t *ngx_http_singleflight_add_instance(
    ngx_conf_t *cf, ngx_http_singleflight_zone_conf_t *zc, ngx_str_t *name,
    ngx_int_t node);
static ngx_int_t ngx_http_singleflight_init_node_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_int_t ngx_http_singleflight_init_stats_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_http_singleflight_zone_t *ngx_http_singleflight_local_instance(
    ngx_cycle_t *cycle, ngx_http_singleflight_zone_conf_t *zc);
static void ngx_http_singleflight_take_slot(ngx_cycle_t *cycle,
    ngx_http_singleflight_zone_conf_t *zc);


/* indexed by NGX_HTTP_SINGLEFLIGHT_SCOPE_*; also named in the stats */
ngx_str_t  ngx_http_singleflight_scopes[] = {
    ngx_string("process"),
    ngx_string("numa"),
    ngx_string("worker")
};


char *
ngx_http_singleflight_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_singleflight_main_conf_t  *smcf = conf;

    u_char                              *p;
    ssize_t                              size;
    ngx_str_t                           *value, name, s;
    ngx_int_t                            node;
    ngx_uint_t                           i, scope, nodes;
    ngx_http_singleflight_zone_conf_t   *zc, **zcp;

    value = cf->args->elts;

    size = 0;
    name.len = 0;
    scope = NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {

            name.data = value[i].data + 5;

            p = (u_char *) ngx_strchr(name.data, ':');

            if (p == NULL || p == name.data) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\" in \"%V\" "
                                   "directive", &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            name.len = p - name.data;

            s.data = p + 1;
            s.len = value[i].data + value[i].len - s.data;

            size = ngx_parse_size(&s);

            if (size == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\" in \"%V\" "
                                   "directive", &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            if (size < (ssize_t) (8 * ngx_pagesize)) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "zone \"%V\" is too small in \"%V\" "
                                   "directive", &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "scope=", 6) == 0) {

            s.data = value[i].data + 6;
            s.len = value[i].len - 6;

            for (scope = 0; scope < 3; scope++) {
                if (s.len == ngx_http_singleflight_scopes[scope].len
                    && ngx_strncmp(s.data,
                                   ngx_http_singleflight_scopes[scope].data,
                                   s.len) == 0)
                {
                    break;
                }
            }

            if (scope == 3) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid scope \"%V\" in \"%V\" directive, "
                                   "it must be \"process\", \"numa\" or "
                                   "\"worker\"", &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive",
                           &value[i], &cmd->name);
        return NGX_CONF_ERROR;
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

    zc = ngx_pcalloc(cf->pool, sizeof(ngx_http_singleflight_zone_conf_t));
    if (zc == NULL) {
        return NGX_CONF_ERROR;
    }

    zc->name = name;
    zc->size = size;
    zc->scope = scope;

    if (ngx_array_init(&zc->instances, cf->pool, 1,
                       sizeof(ngx_http_singleflight_zone_t *))
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    switch (scope) {

    case NGX_HTTP_SINGLEFLIGHT_SCOPE_PROCESS:

        if (ngx_http_singleflight_add_instance(cf, zc, &name, -1) == NULL) {
            return NGX_CONF_ERROR;
        }

        break;

    case NGX_HTTP_SINGLEFLIGHT_SCOPE_NUMA:

        if (ngx_http_singleflight_numa_topology(cf, zc) != NGX_OK) {
            return NGX_CONF_ERROR;
        }

        nodes = 0;

        for (i = 0; i < zc->ncpus; i++) {
            if (zc->cpu_node[i] >= (ngx_int_t) nodes) {
                nodes = zc->cpu_node[i] + 1;
            }
        }

        for (node = 0; node < (ngx_int_t) ngx_max(nodes, 1); node++) {
            s.len = name.len + sizeof("#node") - 1 + NGX_INT_T_LEN;
            s.data = ngx_pnalloc(cf->pool, s.len);
            if (s.data == NULL) {
                return NGX_CONF_ERROR;
            }

            s.len = ngx_sprintf(s.data, "%V#node%i", &name, node) - s.data;

            if (ngx_http_singleflight_add_instance(cf, zc, &s, node) == NULL) {
                return NGX_CONF_ERROR;
            }
        }

        break;

    default: /* NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER */

        s.len = name.len + sizeof("#workers") - 1;
        s.data = ngx_pnalloc(cf->pool, s.len);
        if (s.data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_sprintf(s.data, "%V#workers", &name);

        zc->stats_zone = ngx_shared_memory_add(cf, &s,
                             ngx_max(8 * ngx_pagesize,
                                     ngx_align(2 * NGX_HTTP_SINGLEFLIGHT_SLOTS
                                     * sizeof(
                                         ngx_http_singleflight_worker_stats_t),
                                               ngx_pagesize)),
                             &ngx_http_singleflight_module);
        if (zc->stats_zone == NULL) {
            return NGX_CONF_ERROR;
        }

        zc->stats_zone->init = ngx_http_singleflight_init_stats_zone;
        zc->stats_zone->data = zc;

        break;
    }

    zcp = ngx_array_push(&smcf->zones);
    if (zcp == NULL) {
        return NGX_CONF_ERROR;
    }

    *zcp = zc;

    return NGX_CONF_OK;
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
    zone->tag = ngx_crc32_short(name->data, name->len);
    zone->slot = -1;
    zone->node = node;

    ngx_rbtree_init(&zone->groups, &zone->groups_sentinel,
                    ngx_http_singleflight_group_insert_value);

    zp = ngx_array_push(&zc->instances);
    if (zp == NULL) {
        return NULL;
    }

    *zp = zone;

    shm_zone->init = (node == -1) ? ngx_http_singleflight_init_zone
                                  : ngx_http_singleflight_init_node_zone;
    shm_zone->data = zone;

    return zone;
}


/* a node's instance: its pages preferably on its node, then as any */

static ngx_int_t
ngx_http_singleflight_init_node_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    unsigned long                  mask[NGX_HTTP_SINGLEFLIGHT_MAX_NODES
                                        / (8 * sizeof(unsigned long))];
    ngx_http_singleflight_zone_t  *zone;

    zone = shm_zone->data;

    if (data == NULL && !shm_zone->shm.exists
        && zone->node < NGX_HTTP_SINGLEFLIGHT_MAX_NODES)
    {
        ngx_memzero(mask, sizeof(mask));
        mask[zone->node / (8 * sizeof(unsigned long))] =
                           1UL << (zone->node % (8 * sizeof(unsigned long)));

        if (syscall(SYS_mbind, shm_zone->shm.addr, shm_zone->shm.size,
                    NGX_HTTP_SINGLEFLIGHT_MPOL_PREFERRED, mask,
                    (unsigned long) NGX_HTTP_SINGLEFLIGHT_MAX_NODES + 1,
                    NGX_HTTP_SINGLEFLIGHT_MPOL_MF_MOVE)
            == -1)
        {
            /* no such node here (a simulated topology), or no NUMA */
            ngx_log_error(NGX_LOG_INFO, shm_zone->shm.log, ngx_errno,
                          "singleflight: memory of zone \"%V\" not bound "
                          "to node %i", &zone->name, zone->node);
        }
    }

    return ngx_http_singleflight_init_zone(shm_zone, data);
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

    zc->stats = ngx_slab_calloc(shpool, NGX_HTTP_SINGLEFLIGHT_SLOTS
                               * sizeof(ngx_http_singleflight_worker_stats_t));
    if (zc->stats == NULL) {
        return NGX_ERROR;
    }

    shpool->data = zc->stats;

    return NGX_OK;
}


/* the CPU lists of the NUMA nodes: from the environment, or from sysfs */

static ngx_int_t
ngx_http_singleflight_numa_topology(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc)
{
    u_char      *p, *last, *env, buf[1024];
    ssize_t      n;
    ngx_fd_t     fd;
    ngx_int_t    node;
    ngx_uint_t   i;

    zc->ncpus = NGX_HTTP_SINGLEFLIGHT_MAX_CPUS;
    zc->cpu_node = ngx_palloc(cf->pool, zc->ncpus * sizeof(ngx_int_t));
    if (zc->cpu_node == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < zc->ncpus; i++) {
        zc->cpu_node[i] = -1;
    }

    env = (u_char *) getenv(NGX_HTTP_SINGLEFLIGHT_NUMA_ENV);

    if (env != NULL) {
        p = env;
        last = env + ngx_strlen(env);

        for (node = 0; p < last; node++) {
            u_char  *end;

            end = ngx_strlchr(p, last, ';');
            if (end == NULL) {
                end = last;
            }

            if (node >= NGX_HTTP_SINGLEFLIGHT_MAX_NODES
                || ngx_http_singleflight_cpulist(cf, zc, p, end, node)
                   != NGX_OK)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid " NGX_HTTP_SINGLEFLIGHT_NUMA_ENV
                                   " \"%s\" for \"singleflight_zone\"", env);
                return NGX_ERROR;
            }

            p = end + 1;
        }

        return NGX_OK;
    }

    for (node = 0; node < NGX_HTTP_SINGLEFLIGHT_MAX_NODES; node++) {

        ngx_sprintf(buf, "/sys/devices/system/node/node%i/cpulist%Z", node);

        fd = ngx_open_file(buf, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
        if (fd == NGX_INVALID_FILE) {
            continue;
        }

        n = read(fd, buf, sizeof(buf) - 1);
        (void) ngx_close_file(fd);

        if (n <= 0) {
            continue;
        }

        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) {
            n--;
        }

        if (ngx_http_singleflight_cpulist(cf, zc, buf, buf + n, node)
            != NGX_OK)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid cpulist of NUMA node %i", node);
            return NGX_ERROR;
        }
    }

    /* no topology at all: one node */

    return NGX_OK;
}


/* "0-3,8,10-11": these CPUs are on "node" */

static ngx_int_t
ngx_http_singleflight_cpulist(ngx_conf_t *cf,
    ngx_http_singleflight_zone_conf_t *zc, u_char *p, u_char *last,
    ngx_int_t node)
{
    u_char     *end, *dash;
    ngx_int_t   from, to, cpu;

    while (p < last) {
        end = ngx_strlchr(p, last, ',');
        if (end == NULL) {
            end = last;
        }

        dash = ngx_strlchr(p, end, '-');

        if (dash != NULL) {
            from = ngx_atoi(p, dash - p);
            to = ngx_atoi(dash + 1, end - dash - 1);

        } else {
            from = ngx_atoi(p, end - p);
            to = from;
        }

        if (from == NGX_ERROR || to == NGX_ERROR || from > to
            || to >= (ngx_int_t) zc->ncpus)
        {
            return NGX_ERROR;
        }

        for (cpu = from; cpu <= to; cpu++) {
            zc->cpu_node[cpu] = node;
        }

        p = end + 1;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_singleflight_scope_init_process(ngx_cycle_t *cycle)
{
    int                                  cpu;
    ngx_int_t                            node;
    ngx_uint_t                           n;
    ngx_http_singleflight_zone_t       **zp;
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
            cpu = sched_getcpu();
            node = (cpu >= 0 && (ngx_uint_t) cpu < zc->ncpus)
                   ? zc->cpu_node[cpu] : -1;

            if (node < 0 || (ngx_uint_t) node >= zc->instances.nelts) {
                node = 0;
            }

            zc->mine = zp[node];

            ngx_log_error(NGX_LOG_INFO, cycle->log, 0,
                          "singleflight zone \"%V\": worker on cpu %d "
                          "uses node %i", &zc->name, cpu, node);
            break;

        default: /* NGX_HTTP_SINGLEFLIGHT_SCOPE_WORKER */
            zc->mine = ngx_http_singleflight_local_instance(cycle, zc);

            if (zc->mine == NULL) {
                ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                              "singleflight zone \"%V\": no memory for this "
                              "worker's instance, not collapsing", &zc->name);
            }

            break;
        }

        if (zc->mine != NULL) {
            ngx_http_singleflight_take_slot(cycle, zc);
        }
    }

    return NGX_OK;
}


void
ngx_http_singleflight_scope_exit_process(ngx_cycle_t *cycle)
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

        if (zone == NULL) {
            continue;
        }

        if (zone->local) {
            /* its counters stay, to be added up with the others' */
            if (zone->wstats != NULL && zone->wstats->pid == ngx_pid) {
                ngx_memzero(&zone->wstats->gauges,
                            sizeof(ngx_http_singleflight_gauges_t));
                zone->wstats->pid = 0;
            }

            continue;
        }

        if (zone->slot == -1) {
            continue;
        }

        ngx_http_singleflight_lock(zone);

        if (zone->sh->slots[zone->slot] == ngx_pid) {
            zone->sh->slots[zone->slot] = 0;
        }

        ngx_http_singleflight_unlock(zone);

        zone->slot = -1;
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
    zone->tag = ngx_crc32_short(zc->name.data, zc->name.len);
    zone->slot = 0;
    zone->node = -1;
    zone->local = 1;

    ngx_rbtree_init(&zone->groups, &zone->groups_sentinel,
                    ngx_http_singleflight_group_insert_value);

    if (ngx_http_singleflight_init_shctx(zone) != NGX_OK) {
        ngx_free(addr);
        return NULL;
    }

    zone->sh->slots[0] = ngx_pid;

    return zone;
}


/*
 * A worker's slot: in its shared instance (reclaiming first what dead
 * workers held in every instance of the zone), or for scope=worker in the
 * zone's shared stats, whose counters a new worker carries on from.
 */

static void
ngx_http_singleflight_take_slot(ngx_cycle_t *cycle,
    ngx_http_singleflight_zone_conf_t *zc)
{
    ngx_pid_t                               pid;
    ngx_uint_t                              i, j, led;
    ngx_slab_pool_t                        *shpool;
    ngx_http_singleflight_zone_t          **zp, *zone;
    ngx_http_singleflight_worker_stats_t   *ws;

    zone = zc->mine;

    if (zone->local) {
        shpool = (ngx_slab_pool_t *) zc->stats_zone->shm.addr;

        ngx_shmtx_lock(&shpool->mutex);

        ws = NULL;

        for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_SLOTS; i++) {
            pid = zc->stats[i].pid;

            if (pid == 0 || pid == ngx_pid || ngx_http_singleflight_dead(pid))
            {
                ws = &zc->stats[i];
                ws->pid = ngx_pid;
                break;
            }
        }

        ngx_shmtx_unlock(&shpool->mutex);

        if (ws != NULL) {
            zone->wstats = ws;
            zone->counters = &ws->counters;
        }

        return;
    }

    zp = zc->instances.elts;

    for (j = 0; j < zc->instances.nelts; j++) {

        ngx_http_singleflight_lock(zp[j]);

        for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_SLOTS; i++) {
            pid = zp[j]->sh->slots[i];

            if (pid != 0 && pid != ngx_pid && ngx_http_singleflight_dead(pid)) {
                led = ngx_http_singleflight_reclaim_locked(zp[j], pid);

                /* logged under the lock: a worker starts rarely */
                ngx_http_singleflight_log_dead(zp[j], cycle->log, pid, led);
            }
        }

        ngx_http_singleflight_unlock(zp[j]);
    }

    zone->slot = -1;

    ngx_http_singleflight_lock(zone);

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_SLOTS; i++) {
        pid = zone->sh->slots[i];

        if (pid == 0 || pid == ngx_pid) {
            zone->sh->slots[i] = ngx_pid;
            zone->slot = i;
            break;
        }
    }

    ngx_http_singleflight_unlock(zone);

    if (zone->slot == -1) {
        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "singleflight zone \"%V\" has no free worker slot, "
                      "this worker's followers will be woken by polling",
                      &zone->name);
    }
}


/*
 * A worker that crashed is a zombie until the master reaps it, and
 * kill(pid, 0) still succeeds on a zombie: its state in /proc tells.
 */

ngx_uint_t
ngx_http_singleflight_dead(ngx_pid_t pid)
{
    u_char    *p, buf[NGX_INT64_LEN + sizeof("/proc//stat")], stat[256];
    ssize_t    n;
    ngx_fd_t   fd;

    if (kill(pid, 0) == -1) {
        return (ngx_errno == NGX_ESRCH);
    }

    ngx_sprintf(buf, "/proc/%P/stat%Z", pid);

    fd = ngx_open_file(buf, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return 0;
    }

    n = read(fd, stat, sizeof(stat) - 1);
    (void) ngx_close_file(fd);

    if (n <= 0) {
        return 0;
    }

    /* "pid (comm) S ...": the state follows the last ')' */

    for (p = stat + n - 1; p > stat && *p != ')'; p--) { /* void */ }

    return (p + 2 < stat + n && (p[2] == 'Z' || p[2] == 'X'));
}
