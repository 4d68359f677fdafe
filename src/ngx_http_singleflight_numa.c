/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * NUMA topology.
 *
 * The CPU lists of the nodes are read from sysfs when the first
 * configuration with scope=numa is read, or from the
 * SINGLEFLIGHT_NUMA_CPUS environment variable if it is set: the lists
 * separated by ';' (e.g. "0-3;4-7"), which lets a one-node machine test
 * several nodes.  A worker picks its node at start
 * from the CPU it runs on (sched_getcpu()), which stays put under
 * worker_cpu_affinity, and a node's zone is bound to the node's memory
 * with mbind().  These are Linux interfaces: elsewhere, and where the
 * "config" script found them missing, a zone with scope=numa has one
 * instance and behaves as scope=process, which "nginx -t" says.
 */


#include "ngx_http_singleflight_numa.h"

#if (NGX_LINUX)
#include <sys/syscall.h>
#endif


#define NGX_HTTP_SINGLEFLIGHT_NUMA_ENV    "SINGLEFLIGHT_NUMA_CPUS"
#define NGX_HTTP_SINGLEFLIGHT_MAX_CPUS    4096

/* from <linux/mempolicy.h>, so as not to need libnuma */
#define NGX_HTTP_SINGLEFLIGHT_MPOL_PREFERRED  1
#define NGX_HTTP_SINGLEFLIGHT_MPOL_MF_MOVE    (1 << 1)


static ngx_int_t ngx_http_singleflight_numa_env(ngx_conf_t *cf,
    ngx_http_singleflight_numa_t *numa, u_char *env);
#if (NGX_LINUX && NGX_HTTP_SINGLEFLIGHT_HAVE_NUMA)
static ngx_int_t ngx_http_singleflight_numa_sysfs(ngx_conf_t *cf,
    ngx_http_singleflight_numa_t *numa);
#endif
static ngx_int_t ngx_http_singleflight_numa_cpulist(
    ngx_http_singleflight_numa_t *numa, u_char *p, u_char *last,
    ngx_int_t node);


ngx_int_t
ngx_http_singleflight_numa_topology(ngx_conf_t *cf,
    ngx_http_singleflight_numa_t *numa)
{
    u_char      *env;
    ngx_int_t    rc;
    ngx_uint_t   i;

    numa->ncpus = NGX_HTTP_SINGLEFLIGHT_MAX_CPUS;
    numa->nodes = 1;

    /*
     * read once, for the master's life: not from the configuration's
     * pool, which a reload frees while workers of later configurations
     * still look their node up in it
     */

    numa->cpu_node = ngx_alloc(numa->ncpus * sizeof(ngx_int_t), cf->log);
    if (numa->cpu_node == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < numa->ncpus; i++) {
        numa->cpu_node[i] = -1;
    }

    env = (u_char *) getenv(NGX_HTTP_SINGLEFLIGHT_NUMA_ENV);

    if (env != NULL) {
        rc = ngx_http_singleflight_numa_env(cf, numa, env);

    } else {
#if (NGX_LINUX && NGX_HTTP_SINGLEFLIGHT_HAVE_NUMA)
        rc = ngx_http_singleflight_numa_sysfs(cf, numa);
#else
        ngx_conf_log_error(NGX_LOG_NOTICE, cf, 0,
                           "\"singleflight_zone\" scope=numa: this system "
                           "has no NUMA interfaces, the zone has one "
                           "instance as with scope=process");
        rc = NGX_OK;
#endif
    }

    if (rc != NGX_OK) {
        /* the next configuration reads it again */
        ngx_free(numa->cpu_node);
        numa->cpu_node = NULL;
        numa->nodes = 1;
    }

    return rc;
}


/* the nodes as the environment gives them: cpulists separated by ";" */

static ngx_int_t
ngx_http_singleflight_numa_env(ngx_conf_t *cf,
    ngx_http_singleflight_numa_t *numa, u_char *env)
{
    u_char     *p, *last, *end;
    ngx_int_t   node;

    p = env;
    last = env + ngx_strlen(env);

    for (node = 0; p < last; node++) {

        end = ngx_strlchr(p, last, ';');
        if (end == NULL) {
            end = last;
        }

        if (node >= NGX_HTTP_SINGLEFLIGHT_MAX_NODES
            || ngx_http_singleflight_numa_cpulist(numa, p, end, node)
               != NGX_OK)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid " NGX_HTTP_SINGLEFLIGHT_NUMA_ENV
                               " \"%s\" for \"singleflight_zone\"", env);
            return NGX_ERROR;
        }

        p = end + 1;
    }

    numa->nodes = ngx_max(node, 1);

    return NGX_OK;
}


#if (NGX_LINUX && NGX_HTTP_SINGLEFLIGHT_HAVE_NUMA)

/* the nodes as Linux has them, each with its cpulist */

static ngx_int_t
ngx_http_singleflight_numa_sysfs(ngx_conf_t *cf,
    ngx_http_singleflight_numa_t *numa)
{
    u_char     buf[1024];
    ssize_t    n;
    ngx_fd_t   fd;
    ngx_int_t  node;

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

        if (ngx_http_singleflight_numa_cpulist(numa, buf, buf + n, node)
            != NGX_OK)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid cpulist of NUMA node %i", node);
            return NGX_ERROR;
        }

        if ((ngx_uint_t) node + 1 > numa->nodes) {
            numa->nodes = node + 1;
        }
    }

    return NGX_OK;
}

#endif


static ngx_int_t
ngx_http_singleflight_numa_cpulist(ngx_http_singleflight_numa_t *numa,
    u_char *p, u_char *last, ngx_int_t node)
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
            || to >= (ngx_int_t) numa->ncpus)
        {
            return NGX_ERROR;
        }

        for (cpu = from; cpu <= to; cpu++) {
            numa->cpu_node[cpu] = node;
        }

        p = end + 1;
    }

    return NGX_OK;
}


/* the node this process runs on now, 0 when unknown */

ngx_int_t
ngx_http_singleflight_numa_node(ngx_http_singleflight_numa_t *numa,
    ngx_log_t *log)
{
    ngx_int_t  node;
#if (NGX_LINUX && NGX_HTTP_SINGLEFLIGHT_HAVE_NUMA)
    int        cpu;

    cpu = sched_getcpu();

    node = (cpu >= 0 && (ngx_uint_t) cpu < numa->ncpus)
           ? numa->cpu_node[cpu] : -1;

    if (node < 0 || (ngx_uint_t) node >= numa->nodes) {
        node = 0;
    }

    ngx_log_error(NGX_LOG_INFO, log, 0,
                  "singleflight worker on cpu %d uses NUMA node %i",
                  cpu, node);
#else
    node = 0;
#endif

    return node;
}


/* a node's instance: its pages preferably on its node, then anywhere */

void
ngx_http_singleflight_numa_bind(ngx_shm_zone_t *shm_zone, ngx_int_t node,
    ngx_str_t *name)
{
#if (NGX_LINUX && NGX_HTTP_SINGLEFLIGHT_HAVE_NUMA)
    unsigned long  mask[NGX_HTTP_SINGLEFLIGHT_MAX_NODES
                        / (8 * sizeof(unsigned long))];

    if (node < 0 || node >= NGX_HTTP_SINGLEFLIGHT_MAX_NODES) {
        return;
    }

    ngx_memzero(mask, sizeof(mask));
    mask[node / (8 * sizeof(unsigned long))] =
                                1UL << (node % (8 * sizeof(unsigned long)));

    if (syscall(SYS_mbind, shm_zone->shm.addr, shm_zone->shm.size,
                NGX_HTTP_SINGLEFLIGHT_MPOL_PREFERRED, mask,
                (unsigned long) NGX_HTTP_SINGLEFLIGHT_MAX_NODES + 1,
                NGX_HTTP_SINGLEFLIGHT_MPOL_MF_MOVE)
        == -1)
    {
        /* no such node here (a simulated topology), or no NUMA at all */
        ngx_log_error(NGX_LOG_INFO, shm_zone->shm.log, ngx_errno,
                      "singleflight: memory of zone \"%V\" not bound "
                      "to node %i", name, node);
    }
#endif
}
