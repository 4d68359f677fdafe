/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */

/*
 * The flight: every change of a flight's node, one function per
 * transition, in the spirit of ngx_http_file_cache.c owning its nodes.
 *
 *   join        a request arrives with a key: it leads a new flight,
 *               follows one waiting for its header, joins one already
 *               streaming (late, from byte 0), or takes over an orphan;
 *   takeover    a waiting follower takes over an orphaned flight;
 *   adopt       a reader asks for the rest of a flight whose fetching
 *               worker died mid-body (adrift);
 *   header      the fetch stored the header: readers may start;
 *   body        the fetch stored more of the body, or all of it;
 *   seal        the body outgrew singleflight_max_size: no late joins;
 *   fail        the fetch failed: readers get a status, or their
 *               connection closed if the body broke off;
 *   retry       the fetch failed but is worth another try;
 *   alone       the response is its host's only: the others go alone;
 *   orphan      the fetch is gone without a result;
 *   defer       a new flight waits for the header of a request that went
 *               its own way before it (singleflight_lone direct), which
 *               then takes it over (take) or lets it go (a follower
 *               fetches);
 *   unhost      the fetch's request lets go of the flight;
 *   leave       a reader lets go; the last one stops a fetch nobody
 *               reads any more (abandon);
 *   park        a reader waits for the flight to change;
 *   reclaim     what a dead worker held is given back.
 *
 * Each takes the zone's lock, checks what must hold (and says so at
 * "alert" when it does not, instead of clamping), changes the node, and
 * bumps fn->seq when readers must look again.  Nothing slow is done under
 * the lock: the log lines, the removal of a temporary file and the
 * wake-ups of other workers come after unlocking (ngx_http_singleflight_
 * flight_done()).  Wake-ups go to the workers whose hold on the flight is
 * parked; the flag is cleared as they are sent, and set again by a reader
 * parking under the same lock that publishes changes, so a change is
 * never missed (the race uv's OnceMap describes between registering and
 * finishing).
 */


#include "ngx_http_singleflight_flight.h"
#include "ngx_http_singleflight_zone.h"
#include "ngx_http_singleflight_registry.h"
#include "ngx_http_singleflight_store.h"
#include "ngx_http_singleflight_vary.h"
#include "ngx_http_singleflight_key.h"


/* what became of a flight whose fetching worker is gone */
#define NGX_HTTP_SINGLEFLIGHT_DEAD_NONE    0   /* it fetched nothing */
#define NGX_HTTP_SINGLEFLIGHT_DEAD_FAILED  1
#define NGX_HTTP_SINGLEFLIGHT_DEAD_AGAIN   2   /* a follower takes it over */
#define NGX_HTTP_SINGLEFLIGHT_DEAD_RESUME  3   /* a reader asks for the rest */
#define NGX_HTTP_SINGLEFLIGHT_DEAD_LONE    4   /* one waiting for a lone
                                                  request: let go */


/* the work left for after unlocking */
typedef struct {
    ngx_http_singleflight_zone_t    *zone;
    uint64_t                         id;
    ngx_uint_t                       local;
    ngx_uint_t                       nslots;
    const char                      *broken;
    ngx_uint_t                       unlink;
    u_char                           file[NGX_MAX_PATH];
    uint16_t                         slots[NGX_MAX_PROCESSES];
} ngx_http_singleflight_change_t;


/* what an arriving request finds among the flights of its key */
typedef struct {
    ngx_http_singleflight_node_t    *streaming;   /* of its variant */
    ngx_http_singleflight_node_t    *pending;     /* waiting for a header */
    ngx_http_singleflight_node_t    *orphan;
    u_char                          *names;       /* the key's Vary */
    uint32_t                         hash;        /* of the last pass */
} ngx_http_singleflight_found_t;


static void ngx_http_singleflight_change_init(
    ngx_http_singleflight_change_t *ch, ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn);
static ngx_uint_t ngx_http_singleflight_flight_done(
    ngx_http_singleflight_change_t *ch, ngx_log_t *log);
static ngx_http_singleflight_worker_t *
    ngx_http_singleflight_worker_find_locked(
    ngx_http_singleflight_zone_t *zone, ngx_uint_t slot, ngx_pid_t pid);
static ngx_uint_t ngx_http_singleflight_give_back_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_hold_t *hold,
    ngx_pid_t pid, ngx_http_singleflight_change_t *ch);
static ngx_uint_t ngx_http_singleflight_dead_host_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_worker_remove_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_worker_t *w,
    ngx_uint_t clean, ngx_uint_t *led, ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_keep_name(ngx_array_t *files, u_char *file);
static void ngx_http_singleflight_delete_files(ngx_array_t *files,
    ngx_log_t *log);
static void ngx_http_singleflight_reclaim_log(
    ngx_http_singleflight_zone_t *zone, ngx_pid_t pid, ngx_uint_t *led,
    ngx_log_t *log);
static void ngx_http_singleflight_find_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_arrival_t *a,
    ngx_http_singleflight_found_t *f);
static void ngx_http_singleflight_find_pass_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_arrival_t *a,
    ngx_http_singleflight_found_t *f, ngx_http_singleflight_node_t **guess,
    ngx_uint_t pass);
static ngx_http_singleflight_join_e ngx_http_singleflight_follow_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_arrival_t *a,
    ngx_http_singleflight_node_t *fn, ngx_uint_t *nomem);
static ngx_http_singleflight_join_e ngx_http_singleflight_take_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t *nomem);
static ngx_http_singleflight_join_e ngx_http_singleflight_lead_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_arrival_t *a,
    u_char *names, ngx_http_singleflight_node_t **pfn, ngx_uint_t *nomem);
static void ngx_http_singleflight_undefer_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_orphan_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_rehost_locked(
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_hold_t *hold);
static void ngx_http_singleflight_fail_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t reason);
static void ngx_http_singleflight_node_init_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_arrival_t *a, u_char *names);
static ngx_http_singleflight_node_t *ngx_http_singleflight_first_locked(
    ngx_http_singleflight_zone_t *zone, ngx_str_t *key, uint32_t hash);
static ngx_http_singleflight_node_t *ngx_http_singleflight_next_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static ngx_http_singleflight_hold_t *ngx_http_singleflight_hold_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t create);
static void ngx_http_singleflight_hold_free_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_hold_t *hold);
static void ngx_http_singleflight_hold_put_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_hold_t *hold,
    ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_reader_add_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_hold_t *hold, ngx_uint_t follower);
static void ngx_http_singleflight_notify_locked(
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_bump_locked(
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_waiting_done_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_unhost_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t generation, ngx_http_singleflight_change_t *ch);
static ngx_uint_t ngx_http_singleflight_leave_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_uint_t host, ngx_uint_t keep, ngx_http_singleflight_change_t *ch);
static u_char *ngx_http_singleflight_failure_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_where_t *where,
    size_t len, ngx_uint_t *nomem);
static void ngx_http_singleflight_unlink_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_untree_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn);
static void ngx_http_singleflight_abandon_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_free_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_change_t *ch);
static void ngx_http_singleflight_unheld_locked(
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_change_t *ch);
static ngx_uint_t ngx_http_singleflight_share_locked(
    ngx_http_singleflight_node_t *fn);


#if (NGX_DEBUG)

/* debug names of the states */
static char  *ngx_http_singleflight_states[] = {
    "fetching", "streaming", "complete", "orphaned", "failed", "alone"
};


#define ngx_http_singleflight_state_name(s)                                   \
    ((s) < 6 ? ngx_http_singleflight_states[s] : "?")


/* debug names of what a join did, by ngx_http_singleflight_join_e */
static char  *ngx_http_singleflight_join_names[] = {
    "leader of", "promoted leader of", "follower of", "late reader of",
    "private", "too many readers of", "no room for"
};

#endif


static void
ngx_http_singleflight_change_init(ngx_http_singleflight_change_t *ch,
    ngx_http_singleflight_zone_t *zone, ngx_http_singleflight_node_t *fn)
{
    ch->zone = zone;
    ch->id = (fn != NULL) ? fn->id : 0;
    ch->local = 0;
    ch->nslots = 0;
    ch->broken = NULL;
    ch->unlink = 0;
}


/* after unlocking: logs, the temporary file, the other workers */

static ngx_uint_t
ngx_http_singleflight_flight_done(ngx_http_singleflight_change_t *ch,
    ngx_log_t *log)
{
    if (ch->broken) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "singleflight flight %uL in zone \"%V\": %s",
                      ch->id, &ch->zone->name, ch->broken);
    }

    if (ch->unlink) {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                       "singleflight flight %uL removes \"%s\"",
                       ch->id, ch->file);

        if (ngx_delete_file(ch->file) == NGX_FILE_ERROR
            && ngx_errno != NGX_ENOENT)
        {
            ngx_log_error(NGX_LOG_CRIT, log, ngx_errno,
                          ngx_delete_file_n " \"%s\" failed", ch->file);
        }
    }

    if (ch->nslots) {
        ngx_http_singleflight_registry_notify(ch->slots, ch->nslots,
                                              ch->zone->counters, log);
    }

    return ch->local ? NGX_HTTP_SINGLEFLIGHT_WAKE_LOCAL : 0;
}


/* ------------------------------------------------------------ workers */

/* this worker's record in a zone instance, at start */

ngx_int_t
ngx_http_singleflight_flight_attach(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log)
{
    ngx_uint_t                        nomem, i, n;
    ngx_queue_t                      *q;
    ngx_http_singleflight_worker_t   *w;
    ngx_http_singleflight_records_t  *b;

    n = (ngx_pagesize - offsetof(ngx_http_singleflight_records_t, rec))
        / sizeof(ngx_http_singleflight_worker_t);

    ngx_http_singleflight_lock(zone);

    w = NULL;
    b = NULL;

    for (i = 0; i < NGX_HTTP_SINGLEFLIGHT_SPARE_WORKERS; i++) {
        if (zone->sh->spare[i].pid == 0) {
            w = &zone->sh->spare[i];
            break;
        }
    }

    for (q = ngx_queue_head(&zone->sh->blocks);
         w == NULL && q != ngx_queue_sentinel(&zone->sh->blocks);
         q = ngx_queue_next(q))
    {
        b = ngx_queue_data(q, ngx_http_singleflight_records_t, queue);

        for (i = 0; b->used < n && i < n; i++) {
            if (b->rec[i].pid == 0) {
                w = &b->rec[i];
                break;
            }
        }
    }

    if (w == NULL) {
        /* a whole page: more than half a page is never a slab chunk */

        b = ngx_http_singleflight_alloc_locked(zone, ngx_pagesize, &nomem);

        if (b != NULL) {
            ngx_memzero(b, ngx_pagesize);
            ngx_queue_insert_tail(&zone->sh->blocks, &b->queue);
            zone->sh->block_pages++;
            w = &b->rec[0];
        }
    }

    if (w != NULL) {
        w->block = (w >= zone->sh->spare
                    && w < zone->sh->spare
                           + NGX_HTTP_SINGLEFLIGHT_SPARE_WORKERS)
                   ? NULL : b;

        if (w->block) {
            w->block->used++;
        }

        w->slot = ngx_http_singleflight_registry_slot();
        w->pid = ngx_pid;
        ngx_queue_init(&w->holds);
        ngx_queue_insert_tail(&zone->sh->workers, &w->queue);

        /*
         * scope=numa: a worker has a record in every node's instance (it
         * attaches to them all at start), but uses its own node's alone:
         * there it counts as a worker, so that the nodes add up to the
         * zone's workers
         */
        w->home = (zone->conf->mine == zone);

        if (w->home) {
            zone->sh->nhome++;
        }
    }

    ngx_http_singleflight_unlock(zone);

    if (w == NULL) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "singleflight zone \"%V\" has no memory for a worker, "
                      "this worker does not collapse", &zone->name);
        return NGX_ERROR;
    }

    zone->me = w;

    return NGX_OK;
}


/* at exit: whatever is still held goes back, like a dead worker's */

void
ngx_http_singleflight_flight_detach(ngx_http_singleflight_zone_t *zone,
    ngx_log_t *log)
{
    if (zone->me == NULL) {
        return;
    }

    ngx_http_singleflight_flight_reclaim(zone, zone->me->slot, ngx_pid, log);
    zone->me = NULL;
}


/*
 * Gives back what the process "pid" in "slot" held in this instance: its
 * readers leave their flights, the flights it fetched are fetched again
 * by a follower or fail for everybody else (dead_host_locked()), and its
 * record goes.  Only its own holds are walked.
 */

void
ngx_http_singleflight_flight_reclaim(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t slot, ngx_pid_t pid, ngx_log_t *log)
{
    ngx_uint_t                       led[5];
    ngx_queue_t                     *q;
    ngx_pool_t                      *pool;
    ngx_array_t                      files;
    ngx_http_singleflight_hold_t    *hold;
    ngx_http_singleflight_worker_t  *w;
    ngx_http_singleflight_change_t   ch;

    /* memory for the names of files to remove, taken before locking */

    pool = ngx_create_pool(16384, log);
    if (pool == NULL) {
        return;
    }

    if (ngx_array_init(&files, pool, 16, sizeof(ngx_str_t)) != NGX_OK) {
        ngx_destroy_pool(pool);
        return;
    }

    ngx_http_singleflight_change_init(&ch, zone, NULL);

    ngx_memzero(led, sizeof(led));

    ngx_http_singleflight_lock(zone);

    w = ngx_http_singleflight_worker_find_locked(zone, slot, pid);

    if (w == NULL) {
        ngx_http_singleflight_unlock(zone);
        ngx_destroy_pool(pool);
        return;
    }

    while (!ngx_queue_empty(&w->holds)) {
        q = ngx_queue_head(&w->holds);
        hold = ngx_queue_data(q, ngx_http_singleflight_hold_t, worker);

        led[ngx_http_singleflight_give_back_locked(zone, hold, pid, &ch)]++;

        if (ch.unlink) {
            ngx_http_singleflight_keep_name(&files, ch.file);
            ch.unlink = 0;
        }
    }

    /*
     * a worker that quits gracefully has ended its requests, each leaving
     * its slot (_zone.h): the slots of the others' requests stay
     */

    ngx_http_singleflight_worker_remove_locked(zone, w,
                                               pid == ngx_pid
                                               && zone->me != NULL
                                               && !ngx_terminate,
                                               led, &ch);

    ngx_http_singleflight_unlock(zone);

    /* the others were notified per flight; our own parked ones, too */

    (void) ngx_http_singleflight_flight_done(&ch, log);

    ngx_http_singleflight_delete_files(&files, log);

    ngx_destroy_pool(pool);

    if (pid != ngx_pid || zone->me == NULL) {
        /* not this worker's own exit: a dead one's, its pid reused maybe */
        ngx_http_singleflight_reclaim_log(zone, pid, led, log);
    }
}


/*
 * Up to "max" processes with a record in this instance whose slot the
 * registry no longer gives them: a worker that does not share the
 * instance (of a zone resized at a reload) found them dead and cleared
 * their slot, or their replacement took it and reclaimed elsewhere.  Only
 * the workers of this instance can still give back what they held here.
 */

ngx_uint_t
ngx_http_singleflight_flight_strays(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t *slots, ngx_pid_t *pids, ngx_uint_t max)
{
    ngx_uint_t                       n;
    ngx_queue_t                     *q;
    ngx_http_singleflight_worker_t  *w;

    n = 0;

    ngx_http_singleflight_lock(zone);

    for (q = ngx_queue_head(&zone->sh->workers);
         q != ngx_queue_sentinel(&zone->sh->workers) && n < max;
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_singleflight_worker_t, queue);

        if (w->pid != ngx_pid
            && !ngx_http_singleflight_registry_has(w->slot, w->pid))
        {
            slots[n] = w->slot;
            pids[n++] = w->pid;
        }
    }

    ngx_http_singleflight_unlock(zone);

    return n;
}


/* the record of the process "pid" in "slot" */

static ngx_http_singleflight_worker_t *
ngx_http_singleflight_worker_find_locked(ngx_http_singleflight_zone_t *zone,
    ngx_uint_t slot, ngx_pid_t pid)
{
    ngx_queue_t                     *q;
    ngx_http_singleflight_worker_t  *w;

    for (q = ngx_queue_head(&zone->sh->workers);
         q != ngx_queue_sentinel(&zone->sh->workers);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_singleflight_worker_t, queue);

        if (w->slot == slot && w->pid == pid) {
            return w;
        }
    }

    return NULL;
}


/*
 * One hold of a gone process goes as a whole: its readers leave, the
 * flight it fetched is orphaned or fails, then the others hear of it.
 * Returns what became of a flight it was fetching (NGX_HTTP_SINGLEFLIGHT_
 * DEAD_...).  The flight may be freed (ch->unlink: its file is to be
 * removed).
 */

static ngx_uint_t
ngx_http_singleflight_give_back_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_hold_t *hold, ngx_pid_t pid,
    ngx_http_singleflight_change_t *ch)
{
    ngx_uint_t                     led, state;
    ngx_http_singleflight_node_t  *fn;

    fn = hold->fn;
    state = fn->state;
    led = NGX_HTTP_SINGLEFLIGHT_DEAD_NONE;

    if (hold->readers > fn->readers || hold->readers > zone->sh->readers
        || hold->waiting > fn->waiting
        || hold->waiting > zone->sh->waiters)
    {
        ch->broken = "reader counts below a dead worker's share";
        fn->readers = 0;
        fn->waiting = 0;

    } else {
        fn->readers -= hold->readers;
        fn->waiting -= hold->waiting;
        zone->sh->readers -= hold->readers;
        zone->sh->waiters -= hold->waiting;
    }

    if (hold->host && fn->hosted && fn->host_pid == pid) {
        fn->hosted = 0;

        if (state == NGX_HTTP_SINGLEFLIGHT_FETCHING
            || state == NGX_HTTP_SINGLEFLIGHT_STREAMING)
        {
            led = ngx_http_singleflight_dead_host_locked(zone, fn);
        }
    }

    if (fn->readers == 0
        && (state == NGX_HTTP_SINGLEFLIGHT_ORPHANED || fn->hosted
            || fn->deferred))
    {
        ngx_http_singleflight_abandon_locked(zone, fn, ch);

    } else if (fn->readers == 0 && fn->adrift) {
        ngx_http_singleflight_fail_locked(zone, fn,
                                          NGX_HTTP_SINGLEFLIGHT_R_DEAD);
    }

    ch->id = fn->id;

    ngx_http_singleflight_hold_free_locked(zone, hold);

    ngx_http_singleflight_bump_locked(fn, ch);
    ngx_http_singleflight_unheld_locked(zone, fn, ch);

    return led;
}


/*
 * The flight's fetching worker is gone.  Before its header, with followers
 * waiting and tries left (singleflight_promote dead), it is orphaned: a
 * follower takes it over and fetches it again, as nginx's cache lock lets
 * its waiters go to the origin when the lock's holder is gone
 * (NGX_HTTP_SINGLEFLIGHT_DEAD_AGAIN).  Otherwise it fails for everybody
 * (singleflight_error_status: uniflight's LeaderPanicked).  The tries
 * bound a response that kills every worker fetching it to 1 + tries
 * deaths per flight.
 */

static ngx_uint_t
ngx_http_singleflight_dead_host_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (fn->state == NGX_HTTP_SINGLEFLIGHT_FETCHING
        && fn->promote_dead
        && fn->waiting
        && !fn->abandon
        && fn->retries < fn->max_retries)
    {
        fn->retries++;
        fn->state = NGX_HTTP_SINGLEFLIGHT_ORPHANED;
        return NGX_HTTP_SINGLEFLIGHT_DEAD_AGAIN;
    }

    if (fn->state == NGX_HTTP_SINGLEFLIGHT_STREAMING
        && fn->promote_dead
        && fn->readers
        && !fn->abandon
        && fn->retries < fn->max_retries
        && ngx_http_singleflight_store_resumable(fn->store.header))
    {
        /* mid-body: the readers have what was published, one asks for
         * the rest (flight_adopt()) */
        fn->retries++;
        fn->adrift = 1;
        return NGX_HTTP_SINGLEFLIGHT_DEAD_RESUME;
    }

    ngx_http_singleflight_waiting_done_locked(zone, fn);
    ngx_http_singleflight_fail_locked(zone, fn, NGX_HTTP_SINGLEFLIGHT_R_DEAD);

    return NGX_HTTP_SINGLEFLIGHT_DEAD_FAILED;
}


/* a gone process's record goes, and its block when nobody else uses it */

static void
ngx_http_singleflight_worker_remove_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_worker_t *w, ngx_uint_t clean, ngx_uint_t *led,
    ngx_http_singleflight_change_t *ch)
{
    ngx_queue_t                   *q;
    ngx_http_singleflight_node_t  *fn;

    ngx_queue_remove(&w->queue);

    if (w->home) {
        zone->sh->nhome--;
        w->home = 0;
    }

    w->pid = 0;

    /*
     * unless it ended them ("clean"), what its requests counted for
     * singleflight_lone goes with it; a flight waiting for the header of
     * one of them waits no more (which one is not known: every deferred
     * flight is let go).  With singleflight_promote dead, the request it
     * waited for died, as far as it knows: that was its first try, as
     * for a first request that failed (flight_spend_try()), and the
     * follower's fetch its next, so that a response that kills every
     * worker taking it still costs 1 + tries of them.
     */

    if (!clean) {
        ngx_http_singleflight_claims_reset_locked(zone);

        while (!ngx_queue_empty(&zone->sh->deferred)) {
            q = ngx_queue_head(&zone->sh->deferred);
            fn = ngx_queue_data(q, ngx_http_singleflight_node_t, deferral);

            if (fn->promote_dead && fn->retries < fn->max_retries) {
                fn->retries++;
            }

            ngx_http_singleflight_undefer_locked(zone, fn, ch);

            if (fn->state == NGX_HTTP_SINGLEFLIGHT_ORPHANED) {
                led[NGX_HTTP_SINGLEFLIGHT_DEAD_LONE]++;
            }
        }
    }

    if (w->block != NULL && --w->block->used == 0) {
        ngx_queue_remove(&w->block->queue);
        ngx_slab_free_locked(zone->shpool, w->block);
        zone->sh->block_pages--;
    }
}


/* a file's name, kept to remove it after unlocking (the pool's memory) */

static void
ngx_http_singleflight_keep_name(ngx_array_t *files, u_char *file)
{
    ngx_str_t  *name;

    name = ngx_array_push(files);
    if (name == NULL) {
        return;
    }

    name->len = ngx_strlen(file);
    name->data = ngx_pnalloc(files->pool, name->len + 1);

    if (name->data == NULL) {
        files->nelts--;
        return;
    }

    ngx_memcpy(name->data, file, name->len + 1);
}


static void
ngx_http_singleflight_delete_files(ngx_array_t *files, ngx_log_t *log)
{
    ngx_str_t   *name;
    ngx_uint_t   i;

    name = files->elts;

    for (i = 0; i < files->nelts; i++) {
        if (ngx_delete_file(name[i].data) == NGX_FILE_ERROR
            && ngx_errno != NGX_ENOENT)
        {
            ngx_log_error(NGX_LOG_CRIT, log, ngx_errno,
                          ngx_delete_file_n " \"%s\" failed", name[i].data);
        }
    }
}


static void
ngx_http_singleflight_reclaim_log(ngx_http_singleflight_zone_t *zone,
    ngx_pid_t pid, ngx_uint_t *led, ngx_log_t *log)
{
    ngx_uint_t  failed, again, resume, lone;

    failed = led[NGX_HTTP_SINGLEFLIGHT_DEAD_FAILED];
    again = led[NGX_HTTP_SINGLEFLIGHT_DEAD_AGAIN];
    resume = led[NGX_HTTP_SINGLEFLIGHT_DEAD_RESUME];
    lone = led[NGX_HTTP_SINGLEFLIGHT_DEAD_LONE];

    if (failed + again + resume) {
        (void) ngx_atomic_fetch_add(&zone->counters->dead_leaders,
                                    failed + again + resume);
    }

    if (again + resume) {
        (void) ngx_atomic_fetch_add(&zone->counters->retries,
                                    again + resume);
    }

    if (again) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "singleflight leader process %P is gone, "
                      "%ui flight(s) it led in zone \"%V\" are fetched "
                      "again by their followers", pid, again, &zone->name);
    }

    if (resume) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "singleflight leader process %P is gone, "
                      "%ui flight(s) it led in zone \"%V\" mid-body are "
                      "resumed by their readers", pid, resume, &zone->name);
    }

    if (failed) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "singleflight leader process %P is gone, "
                      "%ui flight(s) it led in zone \"%V\" failed",
                      pid, failed, &zone->name);
    }

    if (lone) {
        /* which process's request fed them is not known */
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "singleflight worker process %P is gone: the %ui "
                      "flight(s) in zone \"%V\" waiting for a lone "
                      "request's header (of any worker) were let go, their "
                      "followers fetch them",
                      pid, lone, &zone->name);
    }

    if (failed + again + resume + lone == 0) {
        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "singleflight worker process %P is gone, its share "
                      "of zone \"%V\" was given back", pid, &zone->name);
    }
}


/* ------------------------------------------------------------ arriving */

/*
 * A request arrives with its key.  Among the flights of the key (the
 * variants of one response, next to each other in the tree) it prefers
 * one already streaming whose Vary values are its own, then one still
 * waiting for its header (whose Vary is not known yet), then an orphan to
 * take over; otherwise it leads a new flight.  A HEAD request may follow
 * a GET flight of its key, but leads only HEAD flights.
 */

ngx_http_singleflight_join_e
ngx_http_singleflight_flight_join(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_arrival_t *a, ngx_http_singleflight_node_t **pfn,
    ngx_uint_t *generation)
{
    ngx_uint_t                      nomem;
    ngx_http_singleflight_node_t   *fn;
    ngx_http_singleflight_join_e    rc;
    ngx_http_singleflight_found_t   f;

    *pfn = NULL;
    nomem = 0;
    fn = NULL;

    ngx_http_singleflight_lock(zone);

    if (ngx_http_singleflight_marked_locked(zone, a->mark)
        || ((a->creds & NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE) && a->mark
            && ngx_http_singleflight_marked_locked(zone,
                    a->mark ^ NGX_HTTP_SINGLEFLIGHT_CREDS_MARK
                    ^ NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE))
        || ((a->creds & NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH) && a->mark
            && ngx_http_singleflight_marked_locked(zone,
                    a->mark ^ NGX_HTTP_SINGLEFLIGHT_CREDS_MARK
                    ^ NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH)))
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_HTTP_SINGLEFLIGHT_JOIN_PRIVATE;
    }

    ngx_http_singleflight_expire_locked(zone, 2);

    ngx_http_singleflight_find_locked(zone, a, &f);

    if (f.streaming != NULL || f.pending != NULL) {
        fn = f.streaming ? f.streaming : f.pending;
        rc = ngx_http_singleflight_follow_locked(zone, a, fn, &nomem);

    } else if (f.orphan != NULL) {
        fn = f.orphan;
        rc = ngx_http_singleflight_take_locked(zone, fn, &nomem);

    } else {
        rc = ngx_http_singleflight_lead_locked(zone, a, f.names, &fn,
                                               &nomem);
    }

    if (rc != NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM
        && rc != NGX_HTTP_SINGLEFLIGHT_JOIN_OVERFLOW)
    {
        a->seq = fn->seq;
        *generation = fn->generation;
    }

    ngx_http_singleflight_unlock(zone);

    if (rc == NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM) {
        ngx_http_singleflight_log_nomem(zone, a->request->connection->log,
                                        nomem);
        return rc;
    }

    *pfn = fn;

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, a->request->connection->log, 0,
                   "singleflight %s flight %uL, hash %uD, readers %ui",
                   ngx_http_singleflight_join_names[rc], fn->id, f.hash,
                   fn->readers);

    return rc;
}


/*
 * The flights of the key, by what they are to the request: one streaming
 * with its Vary values, one waiting for its header that foresees its
 * variant (or whose variant is not known yet), an orphan; and the Vary
 * names of the key if a flight knows them.
 */

static void
ngx_http_singleflight_find_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_arrival_t *a, ngx_http_singleflight_found_t *f)
{
    ngx_uint_t                     pass;
    ngx_http_singleflight_node_t  *guess;

    ngx_memzero(f, sizeof(ngx_http_singleflight_found_t));
    f->names = a->predict;
    f->hash = a->hash;          /* of the key's value: a HEAD's is its GET's */
    guess = NULL;

    for (pass = a->head ? 0 : 1; pass < 2; pass++) {

        if (pass == 0) {
            /* a HEAD request first looks at the GET flights of its key */
            a->key->data[0] = NGX_HTTP_SINGLEFLIGHT_CLASS_GET;

        } else if (a->head) {
            a->key->data[0] = NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD;
        }

        ngx_http_singleflight_find_pass_locked(zone, a, f, &guess, pass);

        if (f->streaming || f->pending || guess) {
            break;
        }
    }

    if (f->pending == NULL) {
        f->pending = guess;
    }

    if (a->head) {
        a->key->data[0] = NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD;
    }
}


/* one class of the key's flights (GET for a HEAD request's first pass) */

static void
ngx_http_singleflight_find_pass_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_arrival_t *a, ngx_http_singleflight_found_t *f,
    ngx_http_singleflight_node_t **guess, ngx_uint_t pass)
{
    ngx_uint_t                     state;
    ngx_http_singleflight_node_t  *fn;

    for (fn = ngx_http_singleflight_first_locked(zone, a->key, f->hash);
         fn;
         fn = ngx_http_singleflight_next_locked(zone, fn))
    {
        state = fn->state;

        if (state == NGX_HTTP_SINGLEFLIGHT_STREAMING) {
            if (f->streaming == NULL
                && ngx_http_singleflight_vary_match(a->request,
                                                    fn->store.header))
            {
                f->streaming = fn;
            }

            if (f->names == NULL
                && ngx_http_singleflight_vary_names(fn->store.header))
            {
                f->names = fn->store.header;
            }

        } else if (state == NGX_HTTP_SINGLEFLIGHT_FETCHING) {

            if (fn->store.predict == NULL) {
                /* its variant is not known yet: it may be ours */
                if (*guess == NULL
                    && ngx_http_singleflight_share_locked(fn))
                {
                    *guess = fn;
                }

            } else if (f->pending == NULL
                       && ngx_http_singleflight_vary_match(a->request,
                                                          fn->store.predict)
                       && ngx_http_singleflight_share_locked(fn))
            {
                /* it foresees our variant */
                f->pending = fn;
            }

        } else if (state == NGX_HTTP_SINGLEFLIGHT_ORPHANED && pass == 1) {
            if (f->orphan == NULL) {
                f->orphan = fn;
            }
        }
    }
}


/* the request reads "fn": it follows it, or reads it late */

static ngx_http_singleflight_join_e
ngx_http_singleflight_follow_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_arrival_t *a, ngx_http_singleflight_node_t *fn,
    ngx_uint_t *nomem)
{
    ngx_uint_t                     waiting;
    ngx_http_singleflight_hold_t  *hold;

    /* its leader reads it too, but for a request on its own way (deferred) */

    if (a->max_waiters && fn->readers + fn->deferred > a->max_waiters) {
        return NGX_HTTP_SINGLEFLIGHT_JOIN_OVERFLOW;
    }

    hold = ngx_http_singleflight_hold_locked(zone, fn, 1);

    if (hold == NULL) {
        *nomem = ngx_http_singleflight_nomem_locked(zone);
        return NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM;
    }

    waiting = (fn->state == NGX_HTTP_SINGLEFLIGHT_FETCHING);

    ngx_http_singleflight_reader_add_locked(zone, fn, hold, 1);
    fn->had_followers = 1;

    if (waiting) {
        hold->parked = 1;
        return NGX_HTTP_SINGLEFLIGHT_JOIN_FOLLOW;
    }

    return NGX_HTTP_SINGLEFLIGHT_JOIN_LATE;
}


/* the request takes the orphaned flight "fn" over: it fetches it */

static ngx_http_singleflight_join_e
ngx_http_singleflight_take_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t *nomem)
{
    ngx_http_singleflight_hold_t  *hold;

    hold = ngx_http_singleflight_hold_locked(zone, fn, 1);

    if (hold == NULL) {
        *nomem = ngx_http_singleflight_nomem_locked(zone);
        return NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM;
    }

    ngx_http_singleflight_reader_add_locked(zone, fn, hold, 0);

    ngx_http_singleflight_rehost_locked(fn, hold);
    fn->seq++;
    hold->parked = 1;

    return NGX_HTTP_SINGLEFLIGHT_JOIN_TAKEOVER;
}


/*
 * A new flight, led by the request.  If the Vary of its key is known, it
 * foresees its variant, so that requests of other variants do not wait
 * on it.  Room for its temporary file's name comes with it: a body
 * spilling to a file must not need zone memory at the moment it is short.
 */

static ngx_http_singleflight_join_e
ngx_http_singleflight_lead_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_arrival_t *a, u_char *names,
    ngx_http_singleflight_node_t **pfn, ngx_uint_t *nomem)
{
    size_t                          size;
    ngx_http_singleflight_node_t   *fn;
    ngx_http_singleflight_hold_t   *hold;

    size = offsetof(ngx_http_singleflight_node_t, key) + a->key->len
           + a->file_room;

    fn = ngx_http_singleflight_alloc_locked(zone, size, nomem);

    if (fn == NULL) {
        return NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM;
    }

    ngx_http_singleflight_node_init_locked(zone, fn, a, names);

    hold = ngx_http_singleflight_hold_locked(zone, fn, 1);

    if (hold == NULL) {
        if (fn->store.predict) {
            ngx_slab_free_locked(zone->shpool, fn->store.predict);
        }

        ngx_slab_free_locked(zone->shpool, fn);
        *nomem = ngx_http_singleflight_nomem_locked(zone);
        return NGX_HTTP_SINGLEFLIGHT_JOIN_NOMEM;
    }

    ngx_http_singleflight_reader_add_locked(zone, fn, hold, 0);

    hold->host = 1;
    hold->users++;
    hold->parked = 1;

    ngx_rbtree_insert(&zone->sh->rbtree, &fn->node);
    fn->linked = 1;
    (void) ngx_atomic_fetch_add(&zone->sh->in_flight, 1);

    *pfn = fn;

    return NGX_HTTP_SINGLEFLIGHT_JOIN_LEAD;
}


/* a new flight's node, fetched by this worker, with its foreseen variant */

static void
ngx_http_singleflight_node_init_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_arrival_t *a,
    u_char *names)
{
    size_t   plen;
    u_char  *predict;

    ngx_memzero(fn, offsetof(ngx_http_singleflight_node_t, key));

    fn->node.key = a->hash;
    fn->id = ++zone->sh->next_id;
    fn->state = NGX_HTTP_SINGLEFLIGHT_FETCHING;
    fn->hosted = 1;
    fn->host_slot = ngx_http_singleflight_registry_slot();
    fn->host_pid = ngx_pid;
    fn->generation = 1;
    fn->max_retries = a->max_retries;
    fn->promote_dead = a->promote_dead;
    fn->start = ngx_current_msec;
    fn->key_len = a->key->len;
    ngx_memcpy(fn->key, a->key->data, a->key->len);
    fn->store.file_room = a->file_room;
    ngx_queue_init(&fn->holds);

    predict = NULL;
    plen = 0;

    if (a->predict) {
        predict = a->predict;
        plen = a->predict_len;

    } else if (names != NULL) {
        predict = ngx_http_singleflight_vary_predict(a->request, names, &plen);
    }

    if (predict != NULL) {
        fn->store.predict = ngx_http_singleflight_alloc_locked(zone, plen,
                                                               NULL);
        if (fn->store.predict != NULL) {
            ngx_memcpy(fn->store.predict, predict, plen);
        }
    }
}


/* a follower woken by an orphaned flight takes it over */

ngx_uint_t
ngx_http_singleflight_flight_takeover(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t *generation,
    ngx_uint_t *how, ngx_log_t *log)
{
    ngx_http_singleflight_hold_t    *hold;
    ngx_http_singleflight_change_t   ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    if (fn->state != NGX_HTTP_SINGLEFLIGHT_ORPHANED) {
        /* another follower was quicker, or the flight is over */
        ngx_http_singleflight_unlock(zone);
        return 0;
    }

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL || hold->waiting == 0 || fn->waiting == 0
        || zone->sh->waiters == 0)
    {
        ngx_http_singleflight_unlock(zone);
        ch.broken = "a follower taking over holds no waiting reader";
        (void) ngx_http_singleflight_flight_done(&ch, log);
        return 0;
    }

    /* the follower becomes the leader: it waits no more as a follower */

    hold->waiting--;
    fn->waiting--;
    zone->sh->waiters--;

    ngx_http_singleflight_rehost_locked(fn, hold);

    *generation = fn->generation;

    ngx_http_singleflight_bump_locked(fn, &ch);

    ngx_http_singleflight_unlock(zone);

    /* the waiters it unparked learn of the new leader (wait_wake()) */
    *how = ngx_http_singleflight_flight_done(&ch, log);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight promoted leader of flight %uL, "
                   "generation %ui", fn->id, *generation);

    return 1;
}


/*
 * An orphaned flight is fetched again, by a request of the worker of
 * "hold": a new generation, hosted here.
 */

static void
ngx_http_singleflight_rehost_locked(ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_hold_t *hold)
{
    fn->state = NGX_HTTP_SINGLEFLIGHT_FETCHING;
    fn->hosted = 1;
    fn->hollow = 0;
    fn->abandon = 0;
    fn->host_slot = hold->slot;
    fn->host_pid = ngx_pid;
    fn->generation++;

    hold->host = 1;
    hold->users++;
}


/*
 * A reader of a flight adrift (its fetching worker died mid-body) asks
 * for the rest: the flight is hosted here, a new generation, and stays
 * STREAMING with what was published.  0: another reader was quicker, or
 * the flight is over.
 */

ngx_uint_t
ngx_http_singleflight_flight_adopt(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t *generation,
    ngx_uint_t *how, ngx_log_t *log)
{
    ngx_http_singleflight_hold_t    *hold;
    ngx_http_singleflight_change_t   ch;

    *how = 0;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    if (!fn->adrift) {
        ngx_http_singleflight_unlock(zone);
        return 0;
    }

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (fn->state != NGX_HTTP_SINGLEFLIGHT_STREAMING || fn->abandon
        || hold == NULL || hold->readers == 0)
    {
        if (hold == NULL || hold->readers == 0) {
            ch.broken = "a reader adopting a flight holds no reader";
        }

        ngx_http_singleflight_fail_locked(zone, fn,
                                          NGX_HTTP_SINGLEFLIGHT_R_DEAD);
        ngx_http_singleflight_bump_locked(fn, &ch);
        ngx_http_singleflight_unlock(zone);
        *how = ngx_http_singleflight_flight_done(&ch, log);
        return 0;
    }

    fn->adrift = 0;
    ngx_http_singleflight_rehost_locked(fn, hold);
    fn->state = NGX_HTTP_SINGLEFLIGHT_STREAMING;

    *generation = fn->generation;

    ngx_http_singleflight_bump_locked(fn, &ch);

    ngx_http_singleflight_unlock(zone);

    *how = ngx_http_singleflight_flight_done(&ch, log);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL adopted at byte %O",
                   fn->id, (off_t) fn->body_len);

    return 1;
}


/*
 * singleflight_lone direct: the new flight "fn", led by this request, is
 * to wait for the header of the request that found the slot empty and
 * went its own way (_zone.h), rather than be fetched.  Its leader becomes
 * a follower, waiting for the header.  NGX_DECLINED: that request has had
 * its header already (or another flight waits for it), fetch it.
 */

ngx_int_t
ngx_http_singleflight_flight_defer(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_atomic_t *slot, ngx_atomic_uint_t epoch, ngx_atomic_uint_t mark,
    ngx_atomic_uint_t *seq)
{
    ngx_http_singleflight_hold_t  *hold;

    ngx_http_singleflight_lock(zone);

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    /*
     * Only in the current epoch: a dead worker's reclaim (under this lock)
     * may have started a new one since the request counted itself, and
     * let go every flight deferred before it; the slot still reads as
     * the old epoch's, but nothing would ever let go a flight deferred
     * now, and the request it would wait for may be the dead one's.
     */

    if (fn->generation != generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_FETCHING
        || !fn->hosted || fn->deferred || fn->abandon
        || hold == NULL || !hold->host || hold->users < 2
        || epoch != ((ngx_atomic_uint_t) zone->sh->claim_epoch
                     << NGX_HTTP_SINGLEFLIGHT_CLAIM_SHIFT)
        || !ngx_http_singleflight_claim_want_locked(slot, epoch, mark))
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    /* nobody fetches it; its leader's request waits as a follower does */

    fn->hosted = 0;
    fn->deferred = 1;
    fn->claim = slot;
    fn->claim_epoch = epoch;
    ngx_queue_insert_tail(&zone->sh->deferred, &fn->deferral);

    hold->host = 0;
    hold->users--;
    hold->waiting++;
    fn->waiting++;
    zone->sh->waiters++;

    /* it has a follower: the request taking it over cannot go solo */
    fn->had_followers = 1;
    (void) ngx_http_singleflight_share_locked(fn);

    *seq = fn->seq;

    ngx_http_singleflight_unlock(zone);

    return NGX_OK;
}


/*
 * The request that went its own way has its header, and a flight of its
 * slot waits for it: if the flight's key is "key", the request takes it
 * over as its fetch (*pfn); otherwise, or with no key (the request cannot
 * share its response), the flight is let go (*gone) and a follower
 * fetches it.  "failed": the request's upstream failed before a header
 * for a singleflight_promote condition, and an error_page took it
 * elsewhere: that was the flight's first try, as for one that fails at
 * its header (flight_spend_try()), and the follower's fetch its next.
 */

ngx_uint_t
ngx_http_singleflight_flight_take(ngx_http_singleflight_zone_t *zone,
    ngx_atomic_t *slot, ngx_str_t *key, uint32_t hash, ngx_uint_t failed,
    ngx_http_singleflight_node_t **pfn, ngx_http_singleflight_node_t **gone,
    ngx_uint_t *generation, ngx_atomic_uint_t *seq, ngx_log_t *log)
{
    ngx_queue_t                     *q;
    ngx_http_singleflight_hold_t    *hold;
    ngx_http_singleflight_node_t    *fn, *mine, *other;
    ngx_http_singleflight_change_t   ch;

    *pfn = NULL;
    *gone = NULL;
    mine = NULL;

    ngx_http_singleflight_change_init(&ch, zone, NULL);

    ngx_http_singleflight_lock(zone);

    if (key != NULL) {
        for (fn = ngx_http_singleflight_first_locked(zone, key, hash);
             fn;
             fn = ngx_http_singleflight_next_locked(zone, fn))
        {
            if (fn->deferred && fn->claim == slot) {
                mine = fn;
                break;
            }
        }
    }

    other = NULL;

    if (mine == NULL) {
        /* out of the tree (singleflight_forget), or another key's */

        for (q = ngx_queue_head(&zone->sh->deferred);
             q != ngx_queue_sentinel(&zone->sh->deferred);
             q = ngx_queue_next(q))
        {
            fn = ngx_queue_data(q, ngx_http_singleflight_node_t, deferral);

            if (fn->claim != slot) {
                continue;
            }

            if (key != NULL
                && ngx_memn2cmp(key->data, fn->key, key->len, fn->key_len)
                   == 0)
            {
                mine = fn;

            } else {
                other = fn;
            }

            break;
        }
    }

    hold = (mine != NULL) ? ngx_http_singleflight_hold_locked(zone, mine, 1)
                          : NULL;

    if (hold != NULL) {
        ngx_queue_remove(&mine->deferral);
        mine->deferred = 0;

        mine->hosted = 1;
        mine->host_slot = ngx_http_singleflight_registry_slot();
        mine->host_pid = ngx_pid;

        ngx_http_singleflight_reader_add_locked(zone, mine, hold, 0);
        hold->host = 1;
        hold->users++;

        *pfn = mine;
        *generation = mine->generation;
        *seq = mine->seq;

    } else {
        /* another key of the slot's (or no memory for a hold): let go */

        fn = (mine != NULL) ? mine : other;

        if (fn != NULL) {
            ch.id = fn->id;
            *gone = fn;

            if (failed && fn->retries < fn->max_retries) {
                fn->retries++;
            }

            ngx_http_singleflight_undefer_locked(zone, fn, &ch);
        }
    }

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL %s", ch.id,
                   (*pfn != NULL) ? "taken by the request it waited for"
                                  : "waits no more, a follower fetches it");

    return ngx_http_singleflight_flight_done(&ch, log);
}


/* a deferred flight waits no more: a follower takes it over */

static void
ngx_http_singleflight_undefer_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_change_t *ch)
{
    ngx_queue_remove(&fn->deferral);
    fn->deferred = 0;

    ngx_http_singleflight_orphan_locked(zone, fn);
    ngx_http_singleflight_bump_locked(fn, ch);
}


/*
 * A flight left without a fetch before its header: a follower waiting
 * takes it over, or, with nobody waiting, it fails
 */

static void
ngx_http_singleflight_orphan_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (fn->waiting && !fn->abandon) {
        fn->state = NGX_HTTP_SINGLEFLIGHT_ORPHANED;
        return;
    }

    ngx_http_singleflight_waiting_done_locked(zone, fn);
    ngx_http_singleflight_fail_locked(zone, fn,
                                      NGX_HTTP_SINGLEFLIGHT_R_ABANDONED);
}


/*
 * A flight fails for "reason" (R_DEAD: also one adrift that nobody asks
 * the rest of): its readers are cut, or before its header answered with
 * each one's singleflight_error_status (status 0)
 */

static void
ngx_http_singleflight_fail_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t reason)
{
    fn->adrift = 0;
    fn->reason = reason;
    fn->status = 0;
    fn->state = NGX_HTTP_SINGLEFLIGHT_FAILED;
    ngx_http_singleflight_unlink_locked(zone, fn);
}


/* ------------------------------------------------------------ the fetch */

/*
 * The header is stored: readers may take it.  "complete" when the
 * response has no body.  NGX_DECLINED: the flight is no longer this
 * fetch's; NGX_ABORT: no memory for the header in the zone.
 */

ngx_int_t
ngx_http_singleflight_flight_header(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, u_char *block,
    size_t len, ngx_uint_t complete, ngx_log_t *log)
{
    u_char                          *p;
    ngx_uint_t                       nomem;
    ngx_http_singleflight_change_t   ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    if (fn->generation != generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_FETCHING)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    if (fn->store.header != NULL) {
        ngx_http_singleflight_unlock(zone);
        ch.broken = "a header stored twice";
        (void) ngx_http_singleflight_flight_done(&ch, log);
        return NGX_DECLINED;
    }

    p = ngx_http_singleflight_alloc_locked(zone, len, &nomem);

    if (p == NULL) {
        ngx_http_singleflight_unlock(zone);
        ngx_http_singleflight_log_nomem(zone, log, nomem);
        return NGX_ABORT;
    }

    ngx_memcpy(p, block, len);

    fn->store.header = p;

    ngx_http_singleflight_waiting_done_locked(zone, fn);

    if (complete) {
        fn->state = NGX_HTTP_SINGLEFLIGHT_COMPLETE;
        ngx_http_singleflight_unlink_locked(zone, fn);

    } else {
        fn->state = NGX_HTTP_SINGLEFLIGHT_STREAMING;
    }

    ngx_http_singleflight_bump_locked(fn, &ch);

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL header stored, %uz bytes, %s",
                   fn->id, len, complete ? "complete" : "streaming");

    return ngx_http_singleflight_flight_done(&ch, log);
}


/*
 * "len" bytes of the body are stored, and all of it if "trailers" is not
 * NULL: the origin's trailers then (_store.c), stored with the end, or an
 * empty string for none.  "seq" is the flight's seq this change made.
 * NGX_ABORT: nobody reads the flight any more, the fetch should stop;
 * NGX_DECLINED: the flight is no longer this fetch's.
 */

ngx_int_t
ngx_http_singleflight_flight_body(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, off_t len,
    ngx_str_t *trailers, ngx_atomic_uint_t *seq, ngx_log_t *log)
{
    u_char                          *p;
    ngx_uint_t                       nomem;
    ngx_http_singleflight_change_t   ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    if (fn->generation != generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_STREAMING)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    if (fn->abandon) {
        ngx_http_singleflight_unlock(zone);
        return NGX_ABORT;
    }

    if (len < (off_t) fn->body_len) {
        ngx_http_singleflight_unlock(zone);
        ch.broken = "a body published shorter than before";
        (void) ngx_http_singleflight_flight_done(&ch, log);
        return NGX_DECLINED;
    }

    fn->body_len = (ngx_atomic_uint_t) len;
    nomem = 0;

    if (trailers != NULL) {
        if (trailers->len) {
            p = ngx_http_singleflight_alloc_locked(zone, trailers->len,
                                                   &nomem);
            if (p != NULL) {
                ngx_memcpy(p, trailers->data, trailers->len);
                fn->store.trailers = p;
            }
        }

        fn->state = NGX_HTTP_SINGLEFLIGHT_COMPLETE;
        ngx_http_singleflight_unlink_locked(zone, fn);
    }

    ngx_http_singleflight_bump_locked(fn, &ch);

    *seq = fn->seq;

    ngx_http_singleflight_unlock(zone);

    if (nomem) {
        /* at most once a minute, as the zone's other shortages */
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "singleflight flight %uL: no room in zone \"%V\" for "
                      "the origin's trailers (%uz bytes), its readers get "
                      "none; a larger zone keeps them",
                      fn->id, &zone->name, trailers->len);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL body %O bytes%s",
                   fn->id, len, trailers ? ", complete" : "");

    return ngx_http_singleflight_flight_done(&ch, log);
}


/*
 * The body outgrew the zone's max_size=: who reads it goes on, no one
 * joins.  1: sealed now, not before (by a fetch its resume replaced).
 */

ngx_uint_t
ngx_http_singleflight_flight_seal(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, ngx_log_t *log)
{
    ngx_uint_t  now;

    now = 0;

    ngx_http_singleflight_lock(zone);

    if (fn->generation == generation) {
        now = !fn->sealed;
        fn->sealed = 1;
        ngx_http_singleflight_unlink_locked(zone, fn);
    }

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL sealed%s", fn->id,
                   now ? "" : " again");

    return now;
}


/*
 * The fetch failed.  Before the header, readers get "status" (0: their
 * singleflight_error_status), made "where" the fetch failed (NULL: in
 * their own location); after it (R_CUT) their connections close.
 */

ngx_int_t
ngx_http_singleflight_flight_fail(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_uint_t reason, ngx_uint_t status,
    ngx_http_singleflight_where_t *where, ngx_log_t *log)
{
    size_t                          len;
    ngx_uint_t                      state, nomem;
    ngx_http_singleflight_change_t  ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    len = (where != NULL && reason != NGX_HTTP_SINGLEFLIGHT_R_CUT)
          ? ngx_http_singleflight_store_failure_size(where) : 0;

    ngx_http_singleflight_lock(zone);

    state = fn->state;

    if (fn->generation != generation
        || (state != NGX_HTTP_SINGLEFLIGHT_FETCHING
            && state != NGX_HTTP_SINGLEFLIGHT_STREAMING))
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    if (state == NGX_HTTP_SINGLEFLIGHT_STREAMING) {
        reason = NGX_HTTP_SINGLEFLIGHT_R_CUT;

    } else {
        ngx_http_singleflight_waiting_done_locked(zone, fn);
    }

    fn->state = NGX_HTTP_SINGLEFLIGHT_FAILED;
    fn->reason = reason;
    fn->status = status;
    fn->status_conf = NULL;
    nomem = 0;

    if (where != NULL && reason != NGX_HTTP_SINGLEFLIGHT_R_CUT) {
        fn->status_conf = where->loc_conf;
        fn->store.failure = ngx_http_singleflight_failure_locked(zone, where,
                                                                 len, &nomem);
    }

    ngx_http_singleflight_unlink_locked(zone, fn);
    ngx_http_singleflight_bump_locked(fn, &ch);

    ngx_http_singleflight_unlock(zone);

    if (nomem) {
        /* its readers keep their own URI, arguments and headers */
        ngx_http_singleflight_log_nomem(zone, log, nomem);
    }

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL failed in state %s, "
                   "reason %ui, status %ui",
                   fn->id, ngx_http_singleflight_state_name(state),
                   reason, status);

    return ngx_http_singleflight_flight_done(&ch, log);
}


/*
 * A failed flight's record (its URI and arguments, the headers set with
 * its status), for its readers to take with its status; NULL if there is
 * nothing to keep (len 0), or if the zone has no room ("nomem" says why).
 */

static u_char *
ngx_http_singleflight_failure_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_where_t *where, size_t len, ngx_uint_t *nomem)
{
    u_char  *block;

    if (len == 0) {
        return NULL;
    }

    block = ngx_http_singleflight_alloc_locked(zone, len, nomem);
    if (block == NULL) {
        return NULL;
    }

    ngx_http_singleflight_store_put_failure(block, len, where);

    return block;
}


/*
 * The fetch failed before its header with a singleflight_promote
 * condition: another fetch, while tries last and followers wait.
 * NGX_OK and the new generation, or NGX_DECLINED.
 */

ngx_int_t
ngx_http_singleflight_flight_retry(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t *generation, ngx_log_t *log)
{
    ngx_http_singleflight_hold_t  *hold;

    ngx_http_singleflight_lock(zone);

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL
        || fn->generation != *generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_FETCHING
        || fn->retries >= fn->max_retries
        || fn->waiting == 0
        || fn->abandon)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    /* the new fetch's use of the hold; the old one lets go of its own */
    hold->users++;

    fn->retries++;
    fn->generation++;
    *generation = fn->generation;

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL fetched again, try %ui of %ui",
                   fn->id, fn->retries, fn->max_retries);

    return NGX_OK;
}


/*
 * The first request of a flight, gone its own way (singleflight_lone
 * direct, own), failed before its header with a singleflight_promote
 * condition: that was the flight's first try.  NGX_OK: a try is left, and
 * taken (a follower fetches it, _tee.c); NGX_DECLINED: the flight fails.
 */

ngx_int_t
ngx_http_singleflight_flight_spend_try(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation)
{
    ngx_int_t  rc;

    ngx_http_singleflight_lock(zone);

    rc = NGX_DECLINED;

    if (fn->generation == generation
        && fn->state == NGX_HTTP_SINGLEFLIGHT_FETCHING
        && fn->retries < fn->max_retries)
    {
        fn->retries++;
        rc = NGX_OK;
    }

    ngx_http_singleflight_unlock(zone);

    return rc;
}


/*
 * A second fetch of the same request starts while the first has no header
 * yet (singleflight_hedge): it takes a use of the hold, as the first; the
 * first header wins, and the other lets go with a release, leaving the
 * flight hosted by the winner.  NGX_DECLINED: not while fetching.
 */

ngx_int_t
ngx_http_singleflight_flight_hedge(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation)
{
    ngx_http_singleflight_hold_t  *hold;

    ngx_http_singleflight_lock(zone);

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL
        || fn->generation != generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_FETCHING
        || fn->abandon)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    hold->users++;
    fn->hedged = 1;

    ngx_http_singleflight_unlock(zone);

    return NGX_OK;
}


/* a resuming fetch's 206 was taken (singleflight_resume) */

void
ngx_http_singleflight_flight_resumed(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    ngx_http_singleflight_lock(zone);
    fn->resumes++;
    ngx_http_singleflight_unlock(zone);
}


/*
 * The response is its host's only (private, Vary: *, too large, a cache
 * hit, no memory): everybody else goes alone.  A private response that
 * had followers marks its key for a while.  "seq" (if not NULL): the
 * flight's, after this change.
 */

ngx_int_t
ngx_http_singleflight_flight_alone(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_uint_t reason, ngx_msec_t mark_ttl, ngx_atomic_uint_t *seq,
    ngx_log_t *log)
{
    ngx_http_singleflight_change_t  ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    if (fn->generation != generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_FETCHING)
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    ngx_http_singleflight_waiting_done_locked(zone, fn);

    fn->state = NGX_HTTP_SINGLEFLIGHT_ALONE;
    fn->reason = reason;

    ngx_http_singleflight_unlink_locked(zone, fn);

    if (reason == NGX_HTTP_SINGLEFLIGHT_R_PRIVATE && fn->had_followers) {
        ngx_http_singleflight_mark_locked(zone,
                           ngx_http_singleflight_hash64(fn->key, fn->key_len),
                           mark_ttl);
    }

    ngx_http_singleflight_bump_locked(fn, &ch);

    if (seq != NULL) {
        *seq = fn->seq;
    }

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL is its leader's alone, "
                   "reason %ui", fn->id, reason);

    return ngx_http_singleflight_flight_done(&ch, log);
}


/*
 * A follower with credentials that its flight's response may not go to
 * (_share.c): the key is marked for requests with those credentials
 * ("creds": a Cookie, an Authorization, or both) for a while, so that the
 * next ones go upstream at once instead of waiting for a header that is
 * not theirs, as a private response marks its key for all.  Requests with
 * the other kind still join: a response that may go to a Cookie and not
 * to an Authorization is still shared with browsers.
 */

void
ngx_http_singleflight_flight_mark_creds(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t creds, ngx_msec_t ttl)
{
    uint64_t  hash;

    hash = ngx_http_singleflight_hash64(fn->key, fn->key_len)
           ^ NGX_HTTP_SINGLEFLIGHT_CREDS_MARK;

    ngx_http_singleflight_lock(zone);

    if (creds & NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE) {
        ngx_http_singleflight_mark_locked(zone,
                                    hash ^ NGX_HTTP_SINGLEFLIGHT_CREDS_COOKIE,
                                    ttl);
    }

    if (creds & NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH) {
        ngx_http_singleflight_mark_locked(zone,
                                      hash ^ NGX_HTTP_SINGLEFLIGHT_CREDS_AUTH,
                                      ttl);
    }

    ngx_http_singleflight_unlock(zone);
}


/*
 * singleflight_lazy, the usual case: the header came and nobody ever
 * followed the flight, so that nobody but its leader, in this worker,
 * knows of it.  The flight becomes its leader's (ALONE) without the lock:
 * "solo" taken, nobody can follow it (share_locked()), and it leaves the
 * tree when its last hold goes (unheld_locked()).  NGX_DECLINED: somebody
 * follows or followed it (or the leader is gone): flight_header() as
 * usual.
 */

ngx_int_t
ngx_http_singleflight_flight_solo(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, ngx_log_t *log)
{
    if (fn->generation != generation
        || fn->state != NGX_HTTP_SINGLEFLIGHT_FETCHING
        || fn->hollow
        || !ngx_atomic_cmp_set(&fn->solo, NGX_HTTP_SINGLEFLIGHT_SOLO_OPEN,
                               NGX_HTTP_SINGLEFLIGHT_SOLO_ALONE))
    {
        return NGX_DECLINED;
    }

    /* nobody but this worker looks at the flight's state from now on */

    fn->reason = NGX_HTTP_SINGLEFLIGHT_R_NONE;
    fn->state = NGX_HTTP_SINGLEFLIGHT_ALONE;

    (void) ngx_atomic_fetch_add(&zone->sh->in_flight, -1);
    ngx_http_singleflight_publish(zone);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL is its leader's alone, solo",
                   fn->id);

    return NGX_OK;
}


/*
 * The fetch is gone without a result and without failing (its request
 * was terminated): a follower takes over, or the body is cut.
 */

ngx_int_t
ngx_http_singleflight_flight_orphan(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, ngx_log_t *log)
{
    ngx_uint_t                      state;
    ngx_http_singleflight_change_t  ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    state = fn->state;

    if (fn->generation != generation
        || (state != NGX_HTTP_SINGLEFLIGHT_FETCHING
            && state != NGX_HTTP_SINGLEFLIGHT_STREAMING))
    {
        ngx_http_singleflight_unlock(zone);
        return NGX_DECLINED;
    }

    fn->hosted = 0;

    if (state == NGX_HTTP_SINGLEFLIGHT_STREAMING) {
        fn->state = NGX_HTTP_SINGLEFLIGHT_FAILED;
        fn->reason = NGX_HTTP_SINGLEFLIGHT_R_CUT;
        ngx_http_singleflight_unlink_locked(zone, fn);

    } else {
        ngx_http_singleflight_orphan_locked(zone, fn);
    }

    ngx_http_singleflight_bump_locked(fn, &ch);

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL lost its fetch, now %s",
                   fn->id, ngx_http_singleflight_state_name(fn->state));

    return ngx_http_singleflight_flight_done(&ch, log);
}


/* the fetch's request lets go of the flight (its part of our hold) */

ngx_int_t
ngx_http_singleflight_flight_unhost(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, ngx_log_t *log)
{
    ngx_http_singleflight_change_t  ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);
    ngx_http_singleflight_unhost_locked(zone, fn, generation, &ch);
    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL fetch %ui done",
                   ch.id, generation);

    return ngx_http_singleflight_flight_done(&ch, log);
}


static void
ngx_http_singleflight_unhost_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_http_singleflight_change_t *ch)
{
    ngx_http_singleflight_hold_t  *hold;

    if (fn->generation == generation && fn->host_pid == ngx_pid) {
        fn->hosted = 0;
    }

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL || hold->users == 0) {
        ch->broken = "a fetch lets go of a flight it did not hold";
        return;
    }

    if (fn->generation == generation) {
        hold->host = 0;
    }

    ngx_http_singleflight_hold_put_locked(zone, hold, ch);
}


/*
 * A leader that was its own fetch (_tee.c) is gone before the body's end
 * (its client went away, its upstream broke off): the readers have what
 * was published, and one asks for the rest when the stored response may
 * be resumed (flight_adopt()), as when a fetching worker dies mid-body;
 * otherwise the body is cut for them.  With "reader", the leader's use
 * as a reader goes too, in the same step.
 */

ngx_int_t
ngx_http_singleflight_flight_dropped(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation,
    ngx_uint_t reader, ngx_log_t *log)
{
    ngx_uint_t                      others;
    ngx_http_singleflight_change_t  ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    if (fn->generation == generation && fn->hosted
        && fn->host_pid == ngx_pid
        && fn->state == NGX_HTTP_SINGLEFLIGHT_STREAMING)
    {
        others = fn->readers - (reader && fn->readers ? 1 : 0);

        if (others && !fn->abandon && fn->retries < fn->max_retries
            && ngx_http_singleflight_store_resumable(fn->store.header))
        {
            fn->retries++;
            fn->adrift = 1;

        } else {
            ngx_http_singleflight_fail_locked(zone, fn,
                                              NGX_HTTP_SINGLEFLIGHT_R_CUT);
        }

        ngx_http_singleflight_bump_locked(fn, &ch);
    }

    ngx_http_singleflight_unhost_locked(zone, fn, generation, &ch);

    if (reader) {
        /* the flight may be freed here */
        (void) ngx_http_singleflight_leave_locked(zone, fn, 1, 0, &ch);
    }

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL lost its leader's fetch %ui",
                   ch.id, generation);

    return ngx_http_singleflight_flight_done(&ch, log);
}


/*
 * A direct response's fetch is over and its leader, the flight's only
 * reader, lets go with it: fetch_unhost() and the leader's leave() in one
 * step.  Nothing of the flight is read from the zone afterwards.
 */

ngx_int_t
ngx_http_singleflight_flight_end_direct(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation, ngx_log_t *log)
{
    ngx_http_singleflight_change_t  ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    ngx_http_singleflight_unhost_locked(zone, fn, generation, &ch);
    (void) ngx_http_singleflight_leave_locked(zone, fn, 1, 0, &ch);

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight flight %uL fetch %ui done, leader leaves",
                   ch.id, generation);

    return ngx_http_singleflight_flight_done(&ch, log);
}


/* ------------------------------------------------------------ readers */

/*
 * A reader lets go.  "host": the reader whose request hosts the fetch;
 * once it goes, the fetch carries on for the others, and once the last
 * reader is gone it is abandoned.
 */

ngx_int_t
ngx_http_singleflight_flight_leave(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t host, ngx_uint_t keep,
    ngx_log_t *log)
{
    ngx_http_singleflight_change_t   ch;
#if (NGX_DEBUG)
    ngx_uint_t                       readers;
#endif

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

#if (NGX_DEBUG)
    readers =
#endif
    ngx_http_singleflight_leave_locked(zone, fn, host, keep, &ch);

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight %s leaves flight %uL, readers %ui",
                   host ? "leader" : "reader", ch.id, readers);

    return ngx_http_singleflight_flight_done(&ch, log);
}


/* the readers left, for the debug log */

static ngx_uint_t
ngx_http_singleflight_leave_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t host, ngx_uint_t keep,
    ngx_http_singleflight_change_t *ch)
{
    ngx_uint_t                     state, readers;
    ngx_http_singleflight_hold_t  *hold;

    state = fn->state;
    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL || hold->readers == 0 || fn->readers == 0
        || zone->sh->readers == 0)
    {
        ch->broken = "a reader leaves a flight it was not counted in";
        return 0;
    }

    hold->readers--;
    fn->readers--;
    zone->sh->readers--;

    if (!host
        && (state == NGX_HTTP_SINGLEFLIGHT_FETCHING
            || state == NGX_HTTP_SINGLEFLIGHT_ORPHANED))
    {
        if (hold->waiting == 0 || fn->waiting == 0
            || zone->sh->waiters == 0)
        {
            ch->broken = "a follower leaves a flight it was not waiting on";

        } else {
            hold->waiting--;
            fn->waiting--;
            zone->sh->waiters--;
        }
    }

    if (host) {
        fn->hollow = 1;
    }

    if (fn->readers == 0) {
        if ((fn->hosted || fn->deferred)
            && (state == NGX_HTTP_SINGLEFLIGHT_FETCHING
                || state == NGX_HTTP_SINGLEFLIGHT_STREAMING
                || state == NGX_HTTP_SINGLEFLIGHT_ALONE))
        {
            /* an ALONE response's reader is its host: nobody else reads */
            ngx_http_singleflight_abandon_locked(zone, fn, ch);

        } else if (state == NGX_HTTP_SINGLEFLIGHT_ORPHANED) {
            /* nobody left to take it over */
            ngx_http_singleflight_fail_locked(zone, fn,
                                             NGX_HTTP_SINGLEFLIGHT_R_ABANDONED);

        } else if (fn->adrift) {
            ngx_http_singleflight_fail_locked(zone, fn,
                                              NGX_HTTP_SINGLEFLIGHT_R_DEAD);
        }
    }

    readers = fn->readers;

    /*
     * a reader that sent some of the body keeps its use of the flight
     * until its request goes: its output may still point into the zone
     */

    if (!keep) {
        /* the flight may be freed here */
        ngx_http_singleflight_hold_put_locked(zone, hold, ch);
    }

    return readers;
}


/* a request that left its flight earlier lets go of it for good */

ngx_int_t
ngx_http_singleflight_flight_release(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_log_t *log)
{
    ngx_http_singleflight_hold_t    *hold;
    ngx_http_singleflight_change_t   ch;

    ngx_http_singleflight_change_init(&ch, zone, fn);

    ngx_http_singleflight_lock(zone);

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL || hold->users == 0) {
        ch.broken = "a request lets go of a flight it did not hold";

    } else {
        ngx_http_singleflight_hold_put_locked(zone, hold, &ch);
    }

    ngx_http_singleflight_unlock(zone);

    return ngx_http_singleflight_flight_done(&ch, log);
}


/*
 * A reader waits for the flight to change after "seen".  NGX_AGAIN: it
 * already has.  NGX_OK: the next change wakes this worker.
 */

ngx_int_t
ngx_http_singleflight_flight_park(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_atomic_uint_t seen)
{
    ngx_http_singleflight_hold_t  *hold;

    ngx_http_singleflight_lock(zone);

    if (fn->seq != seen) {
        ngx_http_singleflight_unlock(zone);
        return NGX_AGAIN;
    }

    hold = ngx_http_singleflight_hold_locked(zone, fn, 0);

    if (hold == NULL) {
        ngx_http_singleflight_unlock(zone);
        return NGX_ERROR;
    }

    hold->parked = 1;

    ngx_http_singleflight_unlock(zone);

    return NGX_OK;
}


/* should this fetch stop: nobody reads its flight any more */

ngx_uint_t
ngx_http_singleflight_flight_abandoned(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t generation)
{
    ngx_uint_t  abandon;

    ngx_http_singleflight_lock(zone);

    abandon = (fn->abandon && fn->generation == generation);

    ngx_http_singleflight_unlock(zone);

    return abandon;
}


/*
 * singleflight_forget: the GET and HEAD flights whose singleflight_key
 * value is "value", in whatever location, are unlinked: requests from
 * now on start afresh, those already in them carry on.
 */

ngx_uint_t
ngx_http_singleflight_flight_forget(ngx_http_singleflight_zone_t *zone,
    ngx_str_t *value, uint32_t hash, ngx_log_t *log)
{
    ngx_str_t                      key, v;
    ngx_uint_t                     n;
    ngx_rbtree_node_t             *node, *sentinel, *next;
    ngx_http_singleflight_node_t  *fn;

    n = 0;

    ngx_http_singleflight_lock(zone);

    node = zone->sh->rbtree.root;
    sentinel = zone->sh->rbtree.sentinel;
    next = NULL;

    while (node != sentinel) {

        if (hash != node->key) {
            node = (hash < node->key) ? node->left : node->right;
            continue;
        }

        next = node;
        node = node->left;
    }

    for (node = next; node && node->key == hash; node = next) {

        next = ngx_rbtree_next(&zone->sh->rbtree, node);

        fn = (ngx_http_singleflight_node_t *) node;

        key.data = fn->key;
        key.len = fn->key_len;

        ngx_http_singleflight_key_value(&key, &v);

        if ((fn->key[0] == NGX_HTTP_SINGLEFLIGHT_CLASS_GET
             || fn->key[0] == NGX_HTTP_SINGLEFLIGHT_CLASS_HEAD)
            && v.len == value->len
            && ngx_memcmp(v.data, value->data, v.len) == 0)
        {
            /*
             * one waiting for a request on its own way keeps waiting for
             * its header (flight_take())
             */
            ngx_http_singleflight_untree_locked(zone, fn);
            n++;
        }
    }

    ngx_http_singleflight_unlock(zone);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, log, 0,
                   "singleflight forgot %ui flight(s), hash %uD", n, hash);

    return n;
}


/* ------------------------------------------------------------ helpers */

/* the first flight of "key" in the tree, or NULL */

static ngx_http_singleflight_node_t *
ngx_http_singleflight_first_locked(ngx_http_singleflight_zone_t *zone,
    ngx_str_t *key, uint32_t hash)
{
    ngx_int_t                      rc;
    ngx_rbtree_node_t             *node, *sentinel;
    ngx_http_singleflight_node_t  *fn, *first;

    node = zone->sh->rbtree.root;
    sentinel = zone->sh->rbtree.sentinel;
    first = NULL;

    while (node != sentinel) {

        if (hash != node->key) {
            node = (hash < node->key) ? node->left : node->right;
            continue;
        }

        fn = (ngx_http_singleflight_node_t *) node;

        rc = ngx_memn2cmp(key->data, fn->key, key->len, fn->key_len);

        if (rc == 0) {
            /* the leftmost of the equal ones: keep looking left */
            first = fn;
            node = node->left;
            continue;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return first;
}


static ngx_http_singleflight_node_t *
ngx_http_singleflight_next_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    ngx_rbtree_node_t             *next;
    ngx_http_singleflight_node_t  *nfn;

    next = ngx_rbtree_next(&zone->sh->rbtree, &fn->node);

    if (next == NULL) {
        return NULL;
    }

    nfn = (ngx_http_singleflight_node_t *) next;

    if (nfn->node.key != fn->node.key
        || ngx_memn2cmp(nfn->key, fn->key, nfn->key_len, fn->key_len) != 0)
    {
        return NULL;
    }

    return nfn;
}


/* this worker's hold on a flight; with "create", a new one if none */

static ngx_http_singleflight_hold_t *
ngx_http_singleflight_hold_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_uint_t create)
{
    ngx_uint_t                     slot;
    ngx_queue_t                   *q;
    ngx_http_singleflight_hold_t  *hold;

    if (zone->me == NULL) {
        return NULL;
    }

    slot = zone->me->slot;

    for (q = ngx_queue_head(&fn->holds);
         q != ngx_queue_sentinel(&fn->holds);
         q = ngx_queue_next(q))
    {
        hold = ngx_queue_data(q, ngx_http_singleflight_hold_t, flight);

        if (hold->slot == slot) {
            return hold;
        }
    }

    if (!create) {
        return NULL;
    }

    if (fn->hold.fn == NULL) {
        /* the one that comes with the node: no allocation */
        hold = &fn->hold;

    } else {
        hold = ngx_http_singleflight_alloc_locked(zone,
                                        sizeof(ngx_http_singleflight_hold_t),
                                        NULL);
        if (hold == NULL) {
            return NULL;
        }
    }

    ngx_memzero(hold, sizeof(ngx_http_singleflight_hold_t));

    hold->fn = fn;
    hold->slot = slot;

    ngx_queue_insert_tail(&fn->holds, &hold->flight);
    ngx_queue_insert_tail(&zone->me->holds, &hold->worker);

    return hold;
}


static void
ngx_http_singleflight_hold_put_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_hold_t *hold, ngx_http_singleflight_change_t *ch)
{
    ngx_http_singleflight_node_t  *fn;

    fn = hold->fn;

    if (--hold->users) {
        return;
    }

    if (hold->readers || hold->waiting) {
        ch->broken = "a hold without users still counts readers";
    }

    ngx_http_singleflight_hold_free_locked(zone, hold);
    ngx_http_singleflight_unheld_locked(zone, fn, ch);
}


/* a hold leaves its queues; the node's own is marked free, not freed */

static void
ngx_http_singleflight_hold_free_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_hold_t *hold)
{
    ngx_queue_remove(&hold->flight);
    ngx_queue_remove(&hold->worker);

    if (hold == &hold->fn->hold) {
        hold->fn = NULL;
        return;
    }

    ngx_slab_free_locked(zone->shpool, hold);
}


/* a request of ours reads the flight; a follower waits for its header */

static void
ngx_http_singleflight_reader_add_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_hold_t *hold,
    ngx_uint_t follower)
{
    hold->users++;
    hold->readers++;
    fn->readers++;
    zone->sh->readers++;

    if (follower
        && (fn->state == NGX_HTTP_SINGLEFLIGHT_FETCHING
            || fn->state == NGX_HTTP_SINGLEFLIGHT_ORPHANED))
    {
        hold->waiting++;
        fn->waiting++;
        zone->sh->waiters++;
    }
}


/* the header came, or never will: nobody waits for it any more */

static void
ngx_http_singleflight_waiting_done_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    ngx_queue_t                   *q;
    ngx_http_singleflight_hold_t  *hold;

    for (q = ngx_queue_head(&fn->holds);
         q != ngx_queue_sentinel(&fn->holds);
         q = ngx_queue_next(q))
    {
        hold = ngx_queue_data(q, ngx_http_singleflight_hold_t, flight);
        hold->waiting = 0;
    }

    zone->sh->waiters -= ngx_min(zone->sh->waiters, fn->waiting);
    fn->waiting = 0;
}


/* every worker with a parked reader is to look at the flight again */

static void
ngx_http_singleflight_notify_locked(ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_change_t *ch)
{
    ngx_uint_t                     self;
    ngx_queue_t                   *q;
    ngx_http_singleflight_hold_t  *hold;

    self = ngx_http_singleflight_registry_slot();

    for (q = ngx_queue_head(&fn->holds);
         q != ngx_queue_sentinel(&fn->holds);
         q = ngx_queue_next(q))
    {
        hold = ngx_queue_data(q, ngx_http_singleflight_hold_t, flight);

        if (!hold->parked) {
            continue;
        }

        hold->parked = 0;

        if (hold->slot == self || ch->zone->local) {
            ch->local = 1;
            continue;
        }

        if (ngx_http_singleflight_registry_mark(hold->slot)
            && ch->nslots < NGX_MAX_PROCESSES)
        {
            ch->slots[ch->nslots++] = (uint16_t) hold->slot;
        }
    }
}


static void
ngx_http_singleflight_bump_locked(ngx_http_singleflight_node_t *fn,
    ngx_http_singleflight_change_t *ch)
{
    /* the order of changes in the instance: waiters are woken in it */
    fn->stamp = ++ch->zone->sh->clock;

    ngx_memory_barrier();
    fn->seq++;
    ngx_memory_barrier();

    ngx_http_singleflight_notify_locked(fn, ch);
}


static void
ngx_http_singleflight_unlink_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (fn->deferred) {
        ngx_queue_remove(&fn->deferral);
        fn->deferred = 0;
    }

    ngx_http_singleflight_untree_locked(zone, fn);
}


static void
ngx_http_singleflight_untree_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn)
{
    if (fn->linked) {
        ngx_rbtree_delete(&zone->sh->rbtree, &fn->node);
        fn->linked = 0;

        /*
         * out of the tree, it cannot go solo any more; a solo flight left
         * the count when it went (flight_solo())
         */

        if (ngx_http_singleflight_share_locked(fn)) {
            (void) ngx_atomic_fetch_add(&zone->sh->in_flight, -1);
        }
    }
}


/*
 * Nobody reads the flight any more while its fetch goes on: the fetch is
 * to stop (its host is told, even without a parked reader), and requests
 * from now on start afresh.
 */

static void
ngx_http_singleflight_abandon_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_change_t *ch)
{
    ngx_queue_t                   *q;
    ngx_http_singleflight_hold_t  *hold;

    fn->abandon = 1;

    if (fn->deferred) {
        /* the next request may wait for the same header */
        ngx_http_singleflight_claim_unwant(fn->claim, fn->claim_epoch);
    }

    ngx_http_singleflight_unlink_locked(zone, fn);

    for (q = ngx_queue_head(&fn->holds);
         q != ngx_queue_sentinel(&fn->holds);
         q = ngx_queue_next(q))
    {
        hold = ngx_queue_data(q, ngx_http_singleflight_hold_t, flight);

        if (hold->host) {
            hold->parked = 1;
        }
    }

    ngx_http_singleflight_bump_locked(fn, ch);
}


static void
ngx_http_singleflight_free_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_change_t *ch)
{
    if (fn->readers || fn->waiting) {
        ch->broken = "a flight freed with readers";
    }

    ch->id = fn->id;
    ch->unlink = ngx_http_singleflight_store_free_locked(zone, fn, ch->file);

    ngx_slab_free_locked(zone->shpool, fn);
}


/*
 * Nobody holds the flight any more: it goes, unless it is still in the
 * tree for requests to join.  A solo flight is still in it, and nobody
 * can join it: it leaves the tree now.
 */

static void
ngx_http_singleflight_unheld_locked(ngx_http_singleflight_zone_t *zone,
    ngx_http_singleflight_node_t *fn, ngx_http_singleflight_change_t *ch)
{
    if (!ngx_queue_empty(&fn->holds)) {
        return;
    }

    if (fn->state == NGX_HTTP_SINGLEFLIGHT_ALONE) {
        ngx_http_singleflight_unlink_locked(zone, fn);
    }

    if (!fn->linked) {
        ngx_http_singleflight_free_locked(zone, fn, ch);
    }
}


/*
 * A request is about to follow the flight, still waiting for its header,
 * or the flight leaves the tree: from now on its leader cannot make it
 * its own without the lock (flight_solo()).  0: it has already, nobody
 * can follow it.
 */

static ngx_uint_t
ngx_http_singleflight_share_locked(ngx_http_singleflight_node_t *fn)
{
    return fn->solo == NGX_HTTP_SINGLEFLIGHT_SOLO_SHARED
           || ngx_atomic_cmp_set(&fn->solo, NGX_HTTP_SINGLEFLIGHT_SOLO_OPEN,
                                 NGX_HTTP_SINGLEFLIGHT_SOLO_SHARED);
}
