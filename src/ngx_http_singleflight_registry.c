/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The worker registry and the wake-up transport.
 *
 * A worker's registry slot is its nginx process slot, ngx_process_slot:
 * the master gives each live process a distinct one, and a crashed worker
 * is respawned into the slot it had.  So a worker never has to look for a
 * slot, nothing limits them but nginx's own NGX_MAX_PROCESSES, and the
 * replacement of a dead worker finds the dead pid in its own record and
 * gives back what it held (_wait.c).
 *
 * Wake-ups travel over pipes.  The master makes one per process slot in
 * init_module, before it forks, so every worker of every generation has
 * the write end of every other's pipe and the read end of its own: there
 * are no socket names to collide between nginx instances, and no process
 * outside this nginx can write to them.  A wake-up carries no data: it
 * tells a worker to look at the flights its requests wait on (_wait.c).
 * It is level-triggered and coalesced: a sender sets the receiver's
 * "pending" flag and writes a byte only if the flag was clear, and not at
 * once: at the end of the sender's round of events (a posted event), so
 * that all it changed in one round costs each receiver one byte at most.
 * The receiver drains its pipe, then clears the flag, then looks.  So a
 * burst of changes costs a worker one wake-up per round of its senders,
 * and no change made before the flag was cleared can go unseen.
 */


#include "ngx_http_singleflight_registry.h"


typedef struct {
    ngx_atomic_t                     pid;
    ngx_atomic_t                     start;     /* the pid's start time */
    ngx_atomic_t                     pending;
    ngx_atomic_t                     beat;
} ngx_http_singleflight_slot_t;


typedef struct {
    uint64_t                         nonce;
    ngx_http_singleflight_slot_t     slots[NGX_MAX_PROCESSES];
} ngx_http_singleflight_registry_t;


typedef struct {
    ngx_uint_t                         slot;
    ngx_http_singleflight_counters_t  *counters;   /* of the first change */
} ngx_http_singleflight_send_t;


static ngx_int_t ngx_http_singleflight_registry_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static void ngx_http_singleflight_registry_handler(ngx_event_t *rev);
static void ngx_http_singleflight_registry_flush(ngx_event_t *ev);
static void ngx_http_singleflight_registry_drain(void);
static ngx_int_t ngx_http_singleflight_registry_stat(ngx_pid_t pid,
    u_char *state, ngx_atomic_uint_t *start);


/* the master's pipes, inherited by every worker it forks */
static ngx_fd_t  ngx_http_singleflight_pipes[NGX_MAX_PROCESSES][2];
static ngx_uint_t  ngx_http_singleflight_npipes;

static ngx_http_singleflight_registry_t  *ngx_http_singleflight_reg;
static ngx_connection_t  *ngx_http_singleflight_wake_conn;

/* drains of this worker's pipe; at the last beat that found its flag set,
   their number + 1, else 0 (_registry_beat) */
static ngx_uint_t  ngx_http_singleflight_drains;
static ngx_uint_t  ngx_http_singleflight_flagged;
static ngx_http_singleflight_wake_pt  ngx_http_singleflight_wake_handler;
static ngx_str_t  ngx_http_singleflight_token;
static ngx_uint_t  ngx_http_singleflight_fresh;
static u_char  ngx_http_singleflight_token_buf[sizeof("singleflight-") + 16];

/* the wake-ups to send at the end of this round of events */
/* how the kernel tells this process from a later one with its pid */
static ngx_atomic_uint_t  ngx_http_singleflight_start;

static ngx_http_singleflight_send_t  ngx_http_singleflight_sends[
                                                         NGX_MAX_PROCESSES];
static ngx_uint_t  ngx_http_singleflight_nsends;
static u_char  ngx_http_singleflight_queued[NGX_MAX_PROCESSES];
static ngx_event_t  ngx_http_singleflight_flush_ev;


static ngx_str_t  ngx_http_singleflight_registry_name =
    ngx_string("#singleflight");


ngx_int_t
ngx_http_singleflight_registry_add(ngx_conf_t *cf)
{
    ngx_shm_zone_t                     *shm_zone;
    ngx_http_singleflight_main_conf_t  *smcf;

    smcf = ngx_http_conf_get_module_main_conf(cf,
                                              ngx_http_singleflight_module);

    if (smcf->registry != NULL) {
        return NGX_OK;
    }

    shm_zone = ngx_shared_memory_add(cf, &ngx_http_singleflight_registry_name,
                     ngx_align(sizeof(ngx_http_singleflight_registry_t)
                               + 8 * ngx_pagesize, ngx_pagesize),
                     &ngx_http_singleflight_module);
    if (shm_zone == NULL) {
        return NGX_ERROR;
    }

    shm_zone->init = ngx_http_singleflight_registry_init_zone;
    shm_zone->data = smcf;

    smcf->registry = shm_zone;

    return NGX_OK;
}


static ngx_int_t
ngx_http_singleflight_registry_init_zone(ngx_shm_zone_t *shm_zone,
    void *data)
{
    ngx_slab_pool_t                   *shpool;
    ngx_http_singleflight_registry_t  *reg;

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (data != NULL || shm_zone->shm.exists) {
        reg = shpool->data;

    } else {
        reg = ngx_slab_calloc(shpool,
                              sizeof(ngx_http_singleflight_registry_t));
        if (reg == NULL) {
            return NGX_ERROR;
        }

        reg->nonce = ((uint64_t) ngx_random() << 32)
                     ^ ((uint64_t) ngx_random() << 8)
                     ^ (uint64_t) ngx_time() ^ (uint64_t) ngx_pid;

        shpool->data = reg;

        ngx_http_singleflight_fresh = 1;
    }

    ngx_http_singleflight_reg = reg;

    ngx_http_singleflight_token.data = ngx_http_singleflight_token_buf;
    ngx_http_singleflight_token.len =
        ngx_sprintf(ngx_http_singleflight_token_buf, "singleflight-%016xL",
                    reg->nonce)
        - ngx_http_singleflight_token_buf;

    return NGX_OK;
}


/*
 * In the master, for a configuration without zones: the registry's zone
 * is not in it, and the master unmaps it, so its workers must not reach
 * for it (at their exit, say)
 */

void
ngx_http_singleflight_registry_forget(void)
{
    ngx_http_singleflight_reg = NULL;
}


/* a first start: no live flight can have left anything behind */

ngx_uint_t
ngx_http_singleflight_registry_fresh(void)
{
    ngx_uint_t  fresh;

    fresh = ngx_http_singleflight_fresh;
    ngx_http_singleflight_fresh = 0;

    return fresh;
}


/*
 * In the master, before it forks the workers of a configuration: enough
 * pipes for the slots they and the workers still draining may take.  The
 * master gives a new process the first free slot: past the highest one in
 * use now (old workers still draining after reloads) there are at most
 * the new workers and the cache manager and loader.
 */

ngx_int_t
ngx_http_singleflight_registry_init_module(ngx_cycle_t *cycle)
{
    ngx_uint_t          need, i;
    ngx_core_conf_t    *ccf;

    if (ngx_http_singleflight_reg == NULL) {
        return NGX_OK;
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    need = 2 * (ngx_uint_t) ngx_max(ccf->worker_processes, 1) + 8;
    need = ngx_max(need, (ngx_uint_t) ngx_last_process
                         + (ngx_uint_t) ngx_max(ccf->worker_processes, 1)
                         + 4);
    need = ngx_min(need, NGX_MAX_PROCESSES);

    for (i = ngx_http_singleflight_npipes; i < need; i++) {

        if (pipe(ngx_http_singleflight_pipes[i]) == -1) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                          "singleflight: pipe() failed, workers in slots "
                          "from %ui on are woken by their poll", i);
            break;
        }

        if (ngx_nonblocking(ngx_http_singleflight_pipes[i][0]) == -1
            || ngx_nonblocking(ngx_http_singleflight_pipes[i][1]) == -1
            || fcntl(ngx_http_singleflight_pipes[i][0], F_SETFD, FD_CLOEXEC)
               == -1
            || fcntl(ngx_http_singleflight_pipes[i][1], F_SETFD, FD_CLOEXEC)
               == -1)
        {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                          "singleflight: setting up a wake-up pipe failed");
            (void) close(ngx_http_singleflight_pipes[i][0]);
            (void) close(ngx_http_singleflight_pipes[i][1]);
            break;
        }

        ngx_http_singleflight_npipes = i + 1;
    }

    return NGX_OK;
}


ngx_uint_t
ngx_http_singleflight_registry_slot(void)
{
    return (ngx_process_slot >= 0) ? (ngx_uint_t) ngx_process_slot : 0;
}


/*
 * A worker takes its record.  Returns the pid found there, if any: the
 * process that had the slot before is dead (the master reuses a slot only
 * once its process is reaped), even with this process's pid, and what it
 * held is to be given back.
 */

ngx_pid_t
ngx_http_singleflight_registry_init_process(ngx_cycle_t *cycle,
    ngx_http_singleflight_wake_pt handler)
{
    ngx_pid_t                      old;
    ngx_uint_t                     slot, i;
    ngx_connection_t              *c;
    ngx_http_singleflight_slot_t  *sl;

    if (ngx_http_singleflight_reg == NULL) {
        return 0;
    }

    slot = ngx_http_singleflight_registry_slot();
    sl = &ngx_http_singleflight_reg->slots[slot];

    old = (ngx_pid_t) sl->pid;

    if (ngx_http_singleflight_registry_stat(ngx_pid, NULL,
                                            &ngx_http_singleflight_start)
        != NGX_OK)
    {
        ngx_http_singleflight_start = 0;
    }

    sl->pending = 0;
    sl->beat = (ngx_atomic_uint_t) ngx_current_msec;
    sl->start = ngx_http_singleflight_start;
    ngx_memory_barrier();
    sl->pid = (ngx_atomic_uint_t) ngx_pid;

    ngx_http_singleflight_wake_handler = handler;

    ngx_http_singleflight_flush_ev.handler =
                                       ngx_http_singleflight_registry_flush;
    ngx_http_singleflight_flush_ev.log = cycle->log;
    ngx_http_singleflight_flush_ev.data = cycle;

    /* the read ends of the others' pipes are theirs */

    for (i = 0; i < ngx_http_singleflight_npipes; i++) {
        if (i != slot) {
            (void) close(ngx_http_singleflight_pipes[i][0]);
            ngx_http_singleflight_pipes[i][0] = NGX_INVALID_FILE;
        }
    }

    if (slot >= ngx_http_singleflight_npipes) {
        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "singleflight: no wake-up pipe for process slot %ui, "
                      "this worker's requests are woken by their poll",
                      slot);

    } else {
        c = ngx_get_connection(ngx_http_singleflight_pipes[slot][0],
                               cycle->log);

        if (c != NULL) {
            c->read->handler = ngx_http_singleflight_registry_handler;
            c->read->log = cycle->log;
            c->write->log = cycle->log;

            if (ngx_add_event(c->read, NGX_READ_EVENT, 0) == NGX_ERROR) {
                ngx_free_connection(c);
                c = NULL;
            }
        }

        if (c == NULL) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "singleflight: the wake-up pipe cannot be watched, "
                          "this worker's requests are woken by their poll");
        }

        ngx_http_singleflight_wake_conn = c;
    }

    /*
     * any pid there is a predecessor's, this process's own too: the
     * kernel may give a dead worker's pid to its replacement, which then
     * gives back what that pid held before it holds anything
     */

    return old;
}


void
ngx_http_singleflight_registry_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_singleflight_slot_t  *sl;

    /* what this worker changed last is still to be told */

    if (ngx_http_singleflight_flush_ev.posted) {
        ngx_delete_posted_event(&ngx_http_singleflight_flush_ev);
    }

    ngx_http_singleflight_registry_flush(&ngx_http_singleflight_flush_ev);

    if (ngx_http_singleflight_wake_conn != NULL) {
        ngx_close_connection(ngx_http_singleflight_wake_conn);
        ngx_http_singleflight_wake_conn = NULL;
    }

    if (ngx_http_singleflight_reg == NULL) {
        return;
    }

    sl = &ngx_http_singleflight_reg->slots[
                                   ngx_http_singleflight_registry_slot()];

    (void) ngx_atomic_cmp_set(&sl->pid, (ngx_atomic_uint_t) ngx_pid, 0);
}


/*
 * Under a zone's lock, from a flight's change: the slot is to be woken.
 * Returns 1 when the caller must send the wake-up (after unlocking), 0
 * when one is already on its way.
 */

ngx_uint_t
ngx_http_singleflight_registry_mark(ngx_uint_t slot)
{
    if (ngx_http_singleflight_reg == NULL || slot >= NGX_MAX_PROCESSES) {
        return 0;
    }

    return ngx_atomic_cmp_set(&ngx_http_singleflight_reg->slots[slot].pending,
                              0, 1);
}


void
ngx_http_singleflight_registry_notify(uint16_t *slots, ngx_uint_t n,
    ngx_http_singleflight_counters_t *counters, ngx_log_t *log)
{
    ngx_uint_t  i, slot;

    for (i = 0; i < n; i++) {
        slot = slots[i];

        if (slot >= NGX_MAX_PROCESSES || ngx_http_singleflight_queued[slot]) {
            continue;
        }

        ngx_http_singleflight_queued[slot] = 1;
        ngx_http_singleflight_sends[ngx_http_singleflight_nsends].slot = slot;
        ngx_http_singleflight_sends[ngx_http_singleflight_nsends].counters =
                                                                    counters;
        ngx_http_singleflight_nsends++;
    }

    if (ngx_http_singleflight_nsends
        && !ngx_http_singleflight_flush_ev.posted
        && ngx_http_singleflight_flush_ev.handler != NULL)
    {
        ngx_post_event(&ngx_http_singleflight_flush_ev, &ngx_posted_events);
    }
}


/* before this worker serves its own: what it owes the others, at once */

void
ngx_http_singleflight_registry_flush_now(void)
{
    if (ngx_http_singleflight_flush_ev.posted) {
        ngx_delete_posted_event(&ngx_http_singleflight_flush_ev);
        ngx_http_singleflight_registry_flush(&ngx_http_singleflight_flush_ev);
    }
}


/* the end of a round of events: the wake-ups it made */

static void
ngx_http_singleflight_registry_flush(ngx_event_t *ev)
{
    u_char                         c;
    ngx_uint_t                     i, slot;
    ngx_http_singleflight_send_t  *send;

    c = '!';

    for (i = 0; i < ngx_http_singleflight_nsends; i++) {
        send = &ngx_http_singleflight_sends[i];
        slot = send->slot;

        ngx_http_singleflight_queued[slot] = 0;

        if (slot < ngx_http_singleflight_npipes
            && write(ngx_http_singleflight_pipes[slot][1], &c, 1) == 1)
        {
            (void) ngx_atomic_fetch_add(&send->counters->wakeups, 1);

            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                           "singleflight wake-up of process slot %ui sent",
                           slot);
            continue;
        }

        /* the receiver's poll will find out; let the next change retry */

        ngx_http_singleflight_reg->slots[slot].pending = 0;
        (void) ngx_atomic_fetch_add(&send->counters->notify_failed, 1);

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ev->log, ngx_errno,
                       "singleflight wake-up of process slot %ui not sent",
                       slot);
    }

    ngx_http_singleflight_nsends = 0;
}


static void
ngx_http_singleflight_registry_handler(ngx_event_t *rev)
{
    ngx_http_singleflight_registry_drain();

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, rev->log, 0,
                   "singleflight wake-up");

    if (ngx_http_singleflight_wake_handler) {
        ngx_http_singleflight_wake_handler((ngx_cycle_t *) ngx_cycle);
    }
}


/*
 * First the pipe, then the flag; the caller then looks at what changed.
 * The other order loses wake-ups for good: a sender that sets the flag
 * after it was cleared and writes before the pipe is drained has its byte
 * read here, and the flag stays set with nothing on its way, so nobody
 * sends again.  In this order a byte is only ever read while the flag
 * still covers it; a sender whose flag is cleared before it writes costs
 * one spurious wake-up, and its change is seen by the look, since it made
 * the change before setting the flag.
 */

static void
ngx_http_singleflight_registry_drain(void)
{
    u_char  buf[64];

    if (ngx_http_singleflight_wake_conn != NULL) {
        while (read(ngx_http_singleflight_wake_conn->fd, buf, sizeof(buf))
               > 0)
        {
            /* void */
        }
    }

    ngx_http_singleflight_drains++;

    ngx_memory_barrier();
    ngx_http_singleflight_reg->slots[
                          ngx_http_singleflight_registry_slot()].pending = 0;
    ngx_memory_barrier();
}


/*
 * Every beat, before the beat's look at this worker's flights.  A sender
 * sets the flag under a zone's lock and writes its byte at the end of its
 * round of events; one that dies in between (SIGKILL, a crash) leaves the
 * flag set with nothing on its way, and every other sender then takes the
 * wake-up for sent: this worker would hear of no change but by its beat,
 * for as long as it lives.  A live sender writes within its round, and the
 * byte is read before the next beat; so a flag set at two beats with no
 * drain between them is such a dead sender's, and is cleared here.
 */

void
ngx_http_singleflight_registry_beat(ngx_log_t *log)
{
    ngx_http_singleflight_slot_t  *sl;

    if (ngx_http_singleflight_reg == NULL) {
        return;
    }

    sl = &ngx_http_singleflight_reg->slots[
                                       ngx_http_singleflight_registry_slot()];

    sl->beat = (ngx_atomic_uint_t) ngx_current_msec;

    if (!sl->pending) {
        ngx_http_singleflight_flagged = 0;
        return;
    }

    if (ngx_http_singleflight_flagged != ngx_http_singleflight_drains + 1) {
        ngx_http_singleflight_flagged = ngx_http_singleflight_drains + 1;
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, log, 0,
                  "singleflight: a wake-up of this worker was never sent, "
                  "its sender died; wake-ups resume");

    ngx_http_singleflight_registry_drain();
    ngx_http_singleflight_flagged = 0;
}


/*
 * Is the process that was in "slot" with "pid" possibly gone?  Read
 * without any lock: the slot was taken over by another process, or its
 * owner has not beaten its heart for a while.  Only then is it worth a
 * system call (ngx_http_singleflight_registry_dead()).
 */

ngx_uint_t
ngx_http_singleflight_registry_suspect(ngx_uint_t slot, ngx_pid_t pid)
{
    ngx_http_singleflight_slot_t  *sl;

    if (ngx_http_singleflight_reg == NULL || slot >= NGX_MAX_PROCESSES) {
        return 0;
    }

    sl = &ngx_http_singleflight_reg->slots[slot];

    /* ngx_current_msec: CLOCK_MONOTONIC, the same in every process */

    return (ngx_pid_t) sl->pid != pid
           || (ngx_msec_int_t) (ngx_current_msec - (ngx_msec_t) sl->beat)
              > NGX_HTTP_SINGLEFLIGHT_STALE;
}


/* does "slot" still hold "pid"?  Without a lock, no system call */

ngx_uint_t
ngx_http_singleflight_registry_has(ngx_uint_t slot, ngx_pid_t pid)
{
    return ngx_http_singleflight_reg == NULL
           || slot >= NGX_MAX_PROCESSES
           || (ngx_pid_t) ngx_http_singleflight_reg->slots[slot].pid == pid;
}


/* the pid in "slot" if it has been silent for longer than "age" */

ngx_pid_t
ngx_http_singleflight_registry_silent(ngx_uint_t slot, ngx_msec_t age)
{
    ngx_pid_t                      pid;
    ngx_http_singleflight_slot_t  *sl;

    if (ngx_http_singleflight_reg == NULL || slot >= NGX_MAX_PROCESSES) {
        return 0;
    }

    sl = &ngx_http_singleflight_reg->slots[slot];
    pid = (ngx_pid_t) sl->pid;

    if (pid == 0 || pid == ngx_pid
        || (ngx_msec_int_t) (ngx_current_msec - (ngx_msec_t) sl->beat)
           <= (ngx_msec_int_t) age)
    {
        return 0;
    }

    return pid;
}


void
ngx_http_singleflight_registry_clear(ngx_uint_t slot, ngx_pid_t pid)
{
    if (ngx_http_singleflight_reg != NULL && slot < NGX_MAX_PROCESSES) {
        (void) ngx_atomic_cmp_set(&ngx_http_singleflight_reg->slots[slot].pid,
                                  (ngx_atomic_uint_t) pid, 0);
    }
}


/*
 * Whether the process "pid", last seen in "slot", is gone.  A worker that
 * crashed is a zombie until the master reaps it, and kill(pid, 0) still
 * succeeds on a zombie: on Linux its state in /proc tells.  Once reaped,
 * its pid may be given to another process: the start time the slot
 * recorded tells them apart.  A slot taken by another pid means the one
 * it had was reaped (the master reuses a slot only then) or has left.
 * System calls: never under a zone's lock.
 */

ngx_uint_t
ngx_http_singleflight_registry_dead(ngx_uint_t slot, ngx_pid_t pid)
{
    u_char                         state;
    ngx_atomic_uint_t              start, now;
    ngx_http_singleflight_slot_t  *sl;

    if (pid <= 0) {
        return 1;
    }

    start = 0;

    if (ngx_http_singleflight_reg != NULL && slot < NGX_MAX_PROCESSES) {
        sl = &ngx_http_singleflight_reg->slots[slot];
        start = sl->start;

        ngx_memory_barrier();

        if ((ngx_pid_t) sl->pid != pid) {
            return 1;
        }
    }

    if (kill(pid, 0) == -1) {
        return (ngx_errno == NGX_ESRCH);
    }

    if (ngx_http_singleflight_registry_stat(pid, &state, &now) != NGX_OK) {
        return 0;
    }

    return state == 'Z' || state == 'X' || (start != 0 && now != start);
}


/*
 * The state and the start time (field 22, clock ticks since boot) of a
 * process, from /proc/PID/stat.  NGX_DECLINED where there is no /proc.
 */

static ngx_int_t
ngx_http_singleflight_registry_stat(ngx_pid_t pid, u_char *state,
    ngx_atomic_uint_t *start)
{
#if (NGX_LINUX)
    u_char      *p, *last, buf[NGX_INT64_LEN + sizeof("/proc//stat")];
    u_char       stat[1024];
    ssize_t      n;
    ngx_fd_t     fd;
    ngx_uint_t   field;

    ngx_sprintf(buf, "/proc/%P/stat%Z", pid);

    fd = ngx_open_file(buf, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return NGX_DECLINED;
    }

    n = read(fd, stat, sizeof(stat));
    (void) ngx_close_file(fd);

    if (n <= 0) {
        return NGX_DECLINED;
    }

    /* "pid (comm) S ppid ...": the fields count from the last ')' */

    last = stat + n;

    for (p = last - 1; p > stat && *p != ')'; p--) { /* void */ }

    if (p + 2 >= last) {
        return NGX_DECLINED;
    }

    if (state != NULL) {
        *state = p[2];
    }

    /* p + 1 is the space before field 3, the state */

    for (field = 2; field < 22; field++) {
        p = ngx_strlchr(p + 1, last, ' ');
        if (p == NULL) {
            return NGX_DECLINED;
        }
    }

    *start = 0;

    for (p++; p < last && *p >= '0' && *p <= '9'; p++) {
        *start = *start * 10 + (*p - '0');
    }

    return NGX_OK;

#else

    return NGX_DECLINED;

#endif
}


/* the default name fetches carry in CDN-Loop, unique to this instance */

ngx_str_t *
ngx_http_singleflight_registry_token(void)
{
    return &ngx_http_singleflight_token;
}


