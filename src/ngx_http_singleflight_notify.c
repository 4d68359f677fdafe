
/*
 * Cross-worker wake-up.
 *
 * Each worker binds a datagram socket in Linux's abstract namespace, named
 * after its pid ("nginx-singleflight/<pid>"), and watches it on its event
 * loop like any connection.  When a flight ends, the leader's worker sends
 * one 16-byte datagram {zone tag, flight id} to each worker whose slot is
 * set in the flight's wait_mask; the receiver posts the write events of its
 * followers of that flight, which run in the same event loop iteration.
 * Nothing polls and nothing blocks: a send that cannot go through at once
 * (the receiver's queue is full, or it is gone) is counted and left to the
 * receiver's safety poll.
 *
 * Abstract sockets need no file system clean-up and vanish with their
 * process; pids are unique among live processes, so workers of an old
 * generation (after a reload) keep being reachable while they drain.
 */


#include "ngx_http_singleflight_notify.h"
#include "ngx_http_singleflight_handler.h"

#include <sys/un.h>


typedef struct {
    uint32_t   tag;
    uint32_t   reserved;
    uint64_t   id;
} ngx_http_singleflight_msg_t;


static socklen_t ngx_http_singleflight_notify_addr(ngx_pid_t pid,
    struct sockaddr_un *sun);
static void ngx_http_singleflight_notify_handler(ngx_event_t *rev);


static ngx_connection_t  *ngx_http_singleflight_notify_conn;


static socklen_t
ngx_http_singleflight_notify_addr(ngx_pid_t pid, struct sockaddr_un *sun)
{
    u_char  *p;

    ngx_memzero(sun, sizeof(struct sockaddr_un));
    sun->sun_family = AF_UNIX;

    /* sun_path[0] stays '\0': the abstract namespace */

    p = ngx_sprintf((u_char *) sun->sun_path + 1, "nginx-singleflight/%P",
                    pid);

    return (socklen_t) (offsetof(struct sockaddr_un, sun_path)
                        + (p - (u_char *) sun->sun_path));
}


ngx_int_t
ngx_http_singleflight_notify_init_process(ngx_cycle_t *cycle)
{
    socklen_t                           len;
    ngx_socket_t                        s;
    ngx_connection_t                   *c;
    struct sockaddr_un                  sun;
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL || smcf->zones.nelts == 0) {
        return NGX_OK;
    }

    s = socket(AF_UNIX, SOCK_DGRAM, 0);

    if (s == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_CRIT, cycle->log, ngx_socket_errno,
                      "singleflight: socket() failed, followers in other "
                      "workers will be woken by polling");
        return NGX_OK;
    }

    if (ngx_nonblocking(s) == -1) {
        ngx_log_error(NGX_LOG_CRIT, cycle->log, ngx_socket_errno,
                      "singleflight: " ngx_nonblocking_n " failed");
        goto failed;
    }

    len = ngx_http_singleflight_notify_addr(ngx_pid, &sun);

    if (bind(s, (struct sockaddr *) &sun, len) == -1) {
        ngx_log_error(NGX_LOG_CRIT, cycle->log, ngx_socket_errno,
                      "singleflight: bind() to \"@%s\" failed",
                      sun.sun_path + 1);
        goto failed;
    }

    c = ngx_get_connection(s, cycle->log);
    if (c == NULL) {
        goto failed;
    }

    c->read->handler = ngx_http_singleflight_notify_handler;
    c->read->log = cycle->log;
    c->write->log = cycle->log;

    if (ngx_add_event(c->read, NGX_READ_EVENT, 0) == NGX_ERROR) {
        ngx_free_connection(c);
        goto failed;
    }

    ngx_http_singleflight_notify_conn = c;

    return NGX_OK;

failed:

    if (ngx_close_socket(s) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_socket_errno,
                      ngx_close_socket_n " failed");
    }

    return NGX_OK;
}


void
ngx_http_singleflight_notify_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_http_singleflight_notify_conn != NULL) {
        ngx_close_connection(ngx_http_singleflight_notify_conn);
        ngx_http_singleflight_notify_conn = NULL;
    }
}


void
ngx_http_singleflight_notify(ngx_http_singleflight_zone_t *zone,
    ngx_pid_t *pids, ngx_uint_t n, uint64_t id, ngx_log_t *log)
{
    socklen_t                     len;
    ngx_uint_t                    i;
    ngx_socket_t                  s;
    struct sockaddr_un            sun;
    ngx_http_singleflight_msg_t   msg;

    if (n == 0) {
        return;
    }

    if (ngx_http_singleflight_notify_conn == NULL) {
        (void) ngx_atomic_fetch_add(&zone->counters->notify_failed, n);
        return;
    }

    s = ngx_http_singleflight_notify_conn->fd;

    msg.tag = zone->tag;
    msg.reserved = 0;
    msg.id = id;

    for (i = 0; i < n; i++) {

        len = ngx_http_singleflight_notify_addr(pids[i], &sun);

        if (sendto(s, &msg, sizeof(msg), 0, (struct sockaddr *) &sun, len)
            != (ssize_t) sizeof(msg))
        {
            /* the receiver's poll will find the flight over */

            (void) ngx_atomic_fetch_add(&zone->counters->notify_failed, 1);

            ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, ngx_socket_errno,
                           "singleflight wake-up of worker %P for flight "
                           "%uL not sent", pids[i], id);
        }
    }
}


static void
ngx_http_singleflight_notify_handler(ngx_event_t *rev)
{
    ssize_t                              n;
    ngx_uint_t                           i;
    ngx_connection_t                    *c;
    ngx_http_singleflight_msg_t          msg;
    ngx_http_singleflight_zone_t        *zone;
    ngx_http_singleflight_zone_conf_t  **zones;
    ngx_http_singleflight_main_conf_t   *smcf;

    c = rev->data;

    smcf = ngx_http_cycle_get_module_main_conf((ngx_cycle_t *) ngx_cycle,
                                               ngx_http_singleflight_module);
    if (smcf == NULL) {
        return;
    }

    zones = smcf->zones.elts;

    for ( ;; ) {
        n = recv(c->fd, &msg, sizeof(msg), 0);

        if (n == -1) {
            if (ngx_socket_errno != NGX_EAGAIN
                && ngx_socket_errno != NGX_EINTR)
            {
                ngx_log_error(NGX_LOG_ALERT, rev->log, ngx_socket_errno,
                              "singleflight: recv() failed");
            }

            return;
        }

        if (n != (ssize_t) sizeof(msg)) {
            continue;
        }

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, rev->log, 0,
                       "singleflight wake-up for flight %uL", msg.id);

        for (i = 0; i < smcf->zones.nelts; i++) {
            zone = zones[i]->mine;

            if (zone != NULL && zone->tag == msg.tag) {
                ngx_http_singleflight_wake_group(zone, msg.id);
            }
        }
    }
}
