/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */
/*
 * bench/origin.c - a small, fast origin for the benchmarks.
 *
 * The same requests and the same bodies as t/origin.pl (the test origin),
 * but with epoll instead of select(), so that it keeps up with nginx's
 * plain proxy_pass at tens of thousands of requests per second and with
 * 10,000 connections at once.  A single process; a response waits for
 * its delay on a timer heap, never blocking the loop.
 *
 * Built by bench/bench.pl:  cc -O2 -o build/bench/origin bench/origin.c
 *
 * usage: origin --listen 127.0.0.1:PORT [--port-file FILE] [--ppid PID]
 *               [--delay MS (added to every request's delay=)]
 *               [--log FILE (ignored)]
 *
 * Query parameters of a request:
 *   delay=MS        answer MS milliseconds later
 *   size=N          a body of exactly N bytes: "hit=H uri=URI\n", then
 *                   the padding pattern of t/origin.pl
 *   status=CODE     response status (default 200)
 *   hdr=Name:Value  an extra response header (repeatable, URL-decoded;
 *                   may replace Content-Type)
 *   close=1         "Connection: close", and close after the response
 *   pace=MS         send the body over MS milliseconds, evenly (in 10 ms
 *                   steps), from its first byte on after the delay; the
 *                   header goes at once.  A reader slower than that
 *                   paces the body itself
 *   fixed=1         the same body on every hit (its stamp says hit=0),
 *                   generated as it is written, with ETag: "fixed" and
 *                   Accept-Ranges; a request with "Range: bytes=N-" (and
 *                   no If-Range, or If-Range: "fixed") gets a 206 with
 *                   the rest from byte N
 *   cut=N           (fixed=1) close the connection after N body bytes,
 *                   unless the request has a Range header
 *   hold=1          hold the response (after its delay) until
 *                   GET /_release: every held response is then written
 *                   in one loop, so that they all complete at once
 *
 * A body larger than 1 MiB, or a paced one, is not built in memory: it is
 * generated as it is written (the same bytes), so 50 responses of 256 MiB
 * at once cost nothing.
 *
 * Control endpoints (not counted as hits):
 *   GET /_hits   {"total":N,"inflight":N,"max_inflight":N,
 *                 "connections":N,"aborted":N,"held":N,"ranges":N,
 *                 "body_bytes":N,"uris":{}}
 *                (ranges: 206s sent; body_bytes: bytes of generated
 *                bodies written)
 *   GET /_reset  zeroes the counters
 *   GET /_release  writes every held response now; answers {"released":N}
 *
 * "inflight" counts requests read whose response is not yet written in
 * full; "max_inflight" is its peak since the last reset.
 */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEAD  65536

static const char  PATTERN[] = "abcdefghijklmnopqrstuvwxyz0123456789\n";

#define LAZY_BODY  (1 << 20)
#define PACE_STEP  10000      /* microseconds between paced writes */

enum { ST_READ, ST_WAIT, ST_WRITE, ST_HELD };

typedef struct {
    int        used;
    unsigned   gen;           /* bumped when the fd is reused */
    int        state;
    int        keepalive;
    int        is_control;
    char      *rbuf;
    size_t     rlen, rcap;
    size_t     skip;          /* request body bytes still to discard */
    char      *wbuf;
    size_t     wlen, woff;
    /* a body generated as it is written, after wbuf (the header) */
    long long  gen_len, gen_off;
    long long  pace_us, t_body;   /* paced: spread over pace_us from t_body */
    int        paced_wait;        /* a pace timer is set */
    char      *stamp;
    size_t     stamp_len;
    long long  cut_at;        /* close once gen_off reaches it; -1: never */
} conn_t;

typedef struct {
    long long  due;           /* microseconds, monotonic */
    int        fd;
    unsigned   gen;
} timer_t_;

static conn_t     *conns;
static int         maxfd;
static int         ep, lfd;
static timer_t_   *heap;
static size_t      heap_len, heap_cap;
static volatile sig_atomic_t  stop;

static unsigned long long  total, aborted, inflight, max_inflight, nconn;
static unsigned long long  ranges, body_bytes;
static long long           base_delay;    /* --delay: this server's own */

/* held responses (hold=1), released by /_release */
static int        *held_fd;
static unsigned   *held_gen;
static size_t      held_len, held_cap;

/* the padding pattern, repeated: a generated body is written from here */
static char       *pattern_buf;
#define PATTERN_BUF  (1 << 20)

static long long
now_us(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* ---------------------------------------------------------- timer heap */

static void
heap_push(long long due, int fd, unsigned gen)
{
    size_t    i, p;
    timer_t_  t = { due, fd, gen };

    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, heap_cap * sizeof(timer_t_));
    }
    for (i = heap_len++; i > 0; i = p) {
        p = (i - 1) / 2;
        if (heap[p].due <= due) {
            break;
        }
        heap[i] = heap[p];
    }
    heap[i] = t;
}

static timer_t_
heap_pop(void)
{
    size_t    i, c;
    timer_t_  top = heap[0], last = heap[--heap_len];

    for (i = 0; (c = 2 * i + 1) < heap_len; i = c) {
        if (c + 1 < heap_len && heap[c + 1].due < heap[c].due) {
            c++;
        }
        if (last.due <= heap[c].due) {
            break;
        }
        heap[i] = heap[c];
    }
    if (heap_len) {
        heap[i] = last;
    }
    return top;
}

/* ------------------------------------------------------------ helpers */

static const char *
http_date(void)
{
    static time_t  cached;
    static char    buf[64];
    time_t         t = time(NULL);
    struct tm      tm;

    if (t != cached) {
        cached = t;
        gmtime_r(&t, &tm);
        strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    }
    return buf;
}

static size_t
url_decode(char *s, size_t n)
{
    size_t  i, o = 0;
    char    hex[3] = { 0, 0, 0 };

    for (i = 0; i < n; i++) {
        if (s[i] == '+') {
            s[o++] = ' ';
        } else if (s[i] == '%' && i + 2 < n) {
            hex[0] = s[i + 1];
            hex[1] = s[i + 2];
            s[o++] = (char) strtol(hex, NULL, 16);
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

static const char *
reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 304: return "Not Modified";
    case 404: return "Not Found";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
    }
}

static void
close_conn(int fd)
{
    conn_t  *c = &conns[fd];

    if (!c->used) {
        return;
    }
    if (c->state != ST_READ && !c->is_control) {
        inflight--;
        if (c->state == ST_WAIT || c->state == ST_HELD) {
            aborted++;
        }
    }
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(c->rbuf);
    free(c->wbuf);
    free(c->stamp);
    c->stamp = NULL;
    c->gen_len = c->gen_off = 0;
    c->rbuf = c->wbuf = NULL;
    c->rlen = c->rcap = c->wlen = c->woff = 0;
    c->used = 0;
    c->gen++;
    nconn--;
}

static void
want_write(int fd, int on)
{
    struct epoll_event  ev;

    ev.events = on ? EPOLLIN | EPOLLOUT : EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

static void parse_requests(int fd);
static void hold_conn(int fd);
static void heap_push(long long due, int fd, unsigned gen);


/*
 * The generated body: the stamp, then the pattern from its first byte.
 * Returns 0 when all of it is written, 1 when it waits (for the socket or
 * the pace), -1 when the connection is gone.
 */

static int
write_generated(int fd)
{
    conn_t     *c = &conns[fd];
    ssize_t     n;
    long long   allowed, want, now;
    const char *p;

    if (c->t_body == 0) {
        c->t_body = now_us();
    }

    allowed = c->gen_len;
    if (c->cut_at >= 0 && allowed > c->cut_at) {
        allowed = c->cut_at;
    }
    if (c->pace_us > 0) {
        now = now_us();
        if (now - c->t_body < c->pace_us) {
            allowed = (long long) ((double) c->gen_len
                                   * (now - c->t_body + PACE_STEP)
                                   / c->pace_us);
            if (allowed > c->gen_len) {
                allowed = c->gen_len;
            }
        }
    }

    while (c->gen_off < allowed) {
        if (c->gen_off < (long long) c->stamp_len) {
            p = c->stamp + c->gen_off;
            want = c->stamp_len - c->gen_off;
        } else {
            p = pattern_buf + (c->gen_off - c->stamp_len)
                              % (long long) (sizeof(PATTERN) - 1);
            want = PATTERN_BUF - 64;
        }
        if (want > allowed - c->gen_off) {
            want = allowed - c->gen_off;
        }
        n = write(fd, p, want);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                want_write(fd, 1);
                return 1;
            }
            close_conn(fd);
            return -1;
        }
        c->gen_off += n;
        body_bytes += n;
    }

    if (c->cut_at >= 0 && c->gen_off >= c->cut_at && c->gen_off < c->gen_len)
    {
        /* cut=N: the origin breaks off mid-body */
        close_conn(fd);
        return -1;
    }

    if (c->gen_off < c->gen_len) {
        /* ahead of the pace: the next step, from the timer heap */
        want_write(fd, 0);
        if (!c->paced_wait) {
            c->paced_wait = 1;
            heap_push(now_us() + PACE_STEP, fd, c->gen);
        }
        return 1;
    }

    return 0;
}

/* write what we can; on completion go back to reading */

static void
flush_conn(int fd)
{
    conn_t   *c = &conns[fd];
    ssize_t   n;

    while (c->woff < c->wlen) {
        n = write(fd, c->wbuf + c->woff, c->wlen - c->woff);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                want_write(fd, 1);
                return;
            }
            close_conn(fd);
            return;
        }
        c->woff += n;
    }

    if (c->gen_off < c->gen_len) {
        if (write_generated(fd) != 0) {
            return;
        }
    }

    free(c->wbuf);
    c->wbuf = NULL;
    c->wlen = c->woff = 0;
    free(c->stamp);
    c->stamp = NULL;
    c->gen_len = c->gen_off = 0;
    if (!c->is_control) {
        inflight--;
    }
    c->state = ST_READ;
    want_write(fd, 0);

    if (!c->keepalive) {
        shutdown(fd, SHUT_WR);
        close_conn(fd);
        return;
    }
    parse_requests(fd);
}

static void
respond_now(int fd, char *buf, size_t len)
{
    conn_t  *c = &conns[fd];

    c->wbuf = buf;
    c->wlen = len;
    c->woff = 0;
    c->state = ST_WRITE;
    flush_conn(fd);
}

static void
control(int fd, const char *path)
{
    char  body[512], *out;
    int   blen, olen;

    if (strcmp(path, "/_hits") == 0) {
        blen = snprintf(body, sizeof(body),
                        "{\"aborted\":%llu,\"connections\":%llu,"
                        "\"held\":%zu,"
                        "\"inflight\":%llu,\"max_inflight\":%llu,"
                        "\"ranges\":%llu,\"body_bytes\":%llu,"
                        "\"total\":%llu,\"uris\":{}}\n",
                        aborted, nconn, held_len, inflight, max_inflight,
                        ranges, body_bytes, total);
    } else if (strcmp(path, "/_release") == 0) {
        size_t  i, released = 0, len = held_len;

        held_len = 0;
        for (i = 0; i < len; i++) {
            conn_t  *h = &conns[held_fd[i]];

            if (h->used && h->gen == held_gen[i] && h->state == ST_HELD) {
                h->state = ST_WRITE;
                flush_conn(held_fd[i]);
                released++;
            }
        }
        blen = snprintf(body, sizeof(body), "{\"released\":%zu}\n",
                        released);
    } else {
        total = aborted = max_inflight = ranges = body_bytes = 0;
        blen = snprintf(body, sizeof(body), "ok\n");
    }
    out = malloc(blen + 1024);
    olen = sprintf(out, "HTTP/1.1 200 OK\r\nDate: %s\r\n"
                   "Content-Type: application/json\r\n"
                   "Content-Length: %d\r\n%s\r\n%s", http_date(), blen,
                   conns[fd].keepalive ? "" : "Connection: close\r\n", body);
    conns[fd].is_control = 1;
    respond_now(fd, out, olen);
}

/*
 * One request head (NUL-terminated, without the blank line): build the
 * whole response now, send it now or when its delay is over.
 */

static void
handle(int fd, char *head)
{
    conn_t     *c = &conns[fd];
    char       *line_end, *method, *target, *proto, *path, *query, *p, *q;
    char       *extra, *ctype = "text/plain", stamp[4200], *out, *b;
    size_t      extra_len = 0, extra_cap = 1024, stamp_len, hl;
    long long   size = -1, delay = 0, body_len, i, pace = 0;
    long long   range_from = -1, cut = -1, from = 0;
    int         status = 200, close_it = 0, is_head, http10, hold = 0, lazy;
    int         fixed = 0, if_range_other = 0;
    const char *conn_hdr;

    line_end = strstr(head, "\r\n");
    if (line_end) {
        *line_end = '\0';
    }
    method = head;
    target = strchr(method, ' ');
    proto = target ? strchr(target + 1, ' ') : NULL;
    if (proto == NULL) {
        c->keepalive = 0;
        c->is_control = 1;
        out = strdup("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n"
                     "Content-Length: 0\r\n\r\n");
        respond_now(fd, out, strlen(out));
        return;
    }
    *target++ = '\0';
    *proto++ = '\0';
    http10 = strcmp(proto, "HTTP/1.0") == 0;
    is_head = strcmp(method, "HEAD") == 0;

    /* request headers: Connection and a body to skip */
    c->keepalive = !http10;
    for (p = line_end ? line_end + 2 : NULL; p && *p; p = q) {
        q = strstr(p, "\r\n");
        if (q) {
            *q = '\0';
            q += 2;
        }
        if (strncasecmp(p, "Connection:", 11) == 0) {
            if (strcasestr(p + 11, "close")) {
                c->keepalive = 0;
            } else if (strcasestr(p + 11, "keep-alive")) {
                c->keepalive = 1;
            }
        } else if (strncasecmp(p, "Content-Length:", 15) == 0) {
            c->skip = strtoull(p + 15, NULL, 10);
        } else if (strncasecmp(p, "Range:", 6) == 0) {
            char  *b = strcasestr(p + 6, "bytes=");

            range_from = b ? atoll(b + 6) : -1;
        } else if (strncasecmp(p, "If-Range:", 9) == 0) {
            if_range_other = strstr(p + 9, "\"fixed\"") == NULL;
        }
        if (q == NULL) {
            break;
        }
    }

    path = target;
    query = strchr(target, '?');

    {
        char  pbuf[256];
        size_t plen = query ? (size_t) (query - path) : strlen(path);

        if (plen < sizeof(pbuf)) {
            memcpy(pbuf, path, plen);
            pbuf[plen] = '\0';
            if (strcmp(pbuf, "/_hits") == 0 || strcmp(pbuf, "/_reset") == 0
                || strcmp(pbuf, "/_release") == 0)
            {
                control(fd, pbuf);
                return;
            }
        }
    }

    c->is_control = 0;
    total++;
    inflight++;
    if (inflight > max_inflight) {
        max_inflight = inflight;
    }

    stamp_len = snprintf(stamp, sizeof(stamp), "hit=%llu uri=%s\n", total,
                         target);
    if (stamp_len >= sizeof(stamp)) {
        stamp_len = sizeof(stamp) - 1;
    }

    extra = malloc(extra_cap);
    extra[0] = '\0';

    if (query) {
        char  *qs = strdup(query + 1), *kv, *save = NULL;

        for (kv = strtok_r(qs, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
            char   *v = strchr(kv, '=');
            size_t  vlen;

            if (v == NULL) {
                continue;
            }
            *v++ = '\0';
            vlen = url_decode(v, strlen(v));
            v[vlen] = '\0';

            if (strcmp(kv, "delay") == 0) {
                delay = atoll(v);
            } else if (strcmp(kv, "size") == 0) {
                size = atoll(v);
            } else if (strcmp(kv, "status") == 0) {
                status = atoi(v);
            } else if (strcmp(kv, "pace") == 0) {
                pace = atoll(v);
            } else if (strcmp(kv, "hold") == 0) {
                hold = atoi(v) != 0;
            } else if (strcmp(kv, "fixed") == 0) {
                fixed = atoi(v) != 0;
            } else if (strcmp(kv, "cut") == 0) {
                cut = atoll(v);
            } else if (strcmp(kv, "close") == 0) {
                close_it = atoi(v) != 0;
            } else if (strcmp(kv, "hdr") == 0) {
                char  *colon = strchr(v, ':'), *val;

                if (colon == NULL || colon == v) {
                    continue;
                }
                *colon = '\0';
                for (val = colon + 1; *val == ' '; val++) { }
                if (strcasecmp(v, "Content-Type") == 0) {
                    static char  ct[256];

                    snprintf(ct, sizeof(ct), "%s", val);
                    ctype = ct;
                    continue;
                }
                while (extra_len + strlen(v) + strlen(val) + 8 > extra_cap) {
                    extra_cap *= 2;
                    extra = realloc(extra, extra_cap);
                }
                extra_len += sprintf(extra + extra_len, "%s: %s\r\n", v, val);
            }
        }
        free(qs);
    }
    if (close_it) {
        c->keepalive = 0;
    }

    delay += base_delay;

    if (status < 200 || status == 204 || status == 304) {
        body_len = 0;
    } else {
        body_len = size >= 0 ? size : (long long) stamp_len;
    }

    lazy = !is_head && body_len > 0
           && (pace > 0 || fixed || body_len > LAZY_BODY);

    if (fixed) {
        /* one representation: the same stamp on every hit */
        stamp_len = snprintf(stamp, sizeof(stamp), "hit=0 uri=%s\n", target);
        if (stamp_len >= sizeof(stamp)) {
            stamp_len = sizeof(stamp) - 1;
        }

        if (status == 200 && range_from >= 0 && !if_range_other
            && range_from < body_len)
        {
            status = 206;
            from = range_from;
            ranges++;
        }

        extra = realloc(extra, extra_len + 128);
        extra_len += sprintf(extra + extra_len,
                             "ETag: \"fixed\"\r\nAccept-Ranges: bytes\r\n");
        if (status == 206) {
            extra_len += sprintf(extra + extra_len,
                                 "Content-Range: bytes %lld-%lld/%lld\r\n",
                                 from, body_len - 1, body_len);
        }
    }

    out = malloc(512 + extra_len + strlen(ctype)
                 + (is_head || lazy ? 0 : body_len));
    hl = sprintf(out, "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: %s\r\n"
                 "X-Hit: %llu\r\n", status, reason(status), http_date(),
                 ctype, total);
    if (!(status < 200 || status == 204 || status == 304)) {
        hl += sprintf(out + hl, "Content-Length: %lld\r\n", body_len - from);
    }
    conn_hdr = !c->keepalive ? "Connection: close\r\n"
               : http10 ? "Connection: keep-alive\r\n" : "";
    hl += sprintf(out + hl, "%s%s\r\n", conn_hdr, extra);
    free(extra);

    if (lazy) {
        c->gen_len = body_len;
        c->gen_off = from;
        c->cut_at = (fixed && range_from < 0) ? cut : -1;
        c->pace_us = pace * 1000;
        c->t_body = 0;
        c->paced_wait = 0;
        c->stamp_len = stamp_len < (size_t) body_len ? stamp_len
                                                     : (size_t) body_len;
        c->stamp = malloc(c->stamp_len + 1);
        memcpy(c->stamp, stamp, c->stamp_len);

    } else if (!is_head && body_len > 0) {
        b = out + hl;
        if (body_len <= (long long) stamp_len) {
            memcpy(b, stamp, body_len);
        } else {
            memcpy(b, stamp, stamp_len);
            for (i = stamp_len; i < body_len; ) {
                long long  n = sizeof(PATTERN) - 1;

                if (n > body_len - i) {
                    n = body_len - i;
                }
                memcpy(b + i, PATTERN, n);
                i += n;
            }
        }
        hl += body_len;
    }

    if (delay <= 0 && !hold) {
        respond_now(fd, out, hl);
        return;
    }

    c->wbuf = out;
    c->wlen = hl;
    c->woff = 0;
    c->state = ST_WAIT;
    if (delay > 0) {
        c->paced_wait = hold ? 2 : 0;
        heap_push(now_us() + delay * 1000, fd, c->gen);
        return;
    }
    hold_conn(fd);
}

static void
hold_conn(int fd)
{
    if (held_len == held_cap) {
        held_cap = held_cap ? held_cap * 2 : 1024;
        held_fd = realloc(held_fd, held_cap * sizeof(int));
        held_gen = realloc(held_gen, held_cap * sizeof(unsigned));
    }
    held_fd[held_len] = fd;
    held_gen[held_len++] = conns[fd].gen;
    conns[fd].state = ST_HELD;
}


static void
parse_requests(int fd)
{
    conn_t  *c = &conns[fd];
    char    *end;
    size_t   n;

    while (c->used && c->state == ST_READ && c->rlen) {
        if (c->skip) {
            n = c->skip < c->rlen ? c->skip : c->rlen;
            memmove(c->rbuf, c->rbuf + n, c->rlen - n);
            c->rlen -= n;
            c->skip -= n;
            continue;
        }
        c->rbuf[c->rlen] = '\0';
        end = strstr(c->rbuf, "\r\n\r\n");
        if (end == NULL) {
            if (c->rlen > MAX_HEAD) {
                close_conn(fd);
            }
            return;
        }
        *end = '\0';
        n = end + 4 - c->rbuf;
        {
            char  *head = malloc(n);

            memcpy(head, c->rbuf, n);
            memmove(c->rbuf, c->rbuf + n, c->rlen - n);
            c->rlen -= n;
            handle(fd, head);
            free(head);
        }
    }
}

static void
on_readable(int fd)
{
    conn_t   *c = &conns[fd];
    ssize_t   n;

    for ( ;; ) {
        if (c->rcap - c->rlen < 4097) {
            c->rcap = c->rcap ? c->rcap * 2 : 8192;
            c->rbuf = realloc(c->rbuf, c->rcap);
        }
        n = read(fd, c->rbuf + c->rlen, c->rcap - c->rlen - 1);
        if (n > 0) {
            c->rlen += n;
            if (c->rlen > MAX_HEAD * 2) {
                close_conn(fd);
                return;
            }
            continue;
        }
        if (n == 0) {
            close_conn(fd);
            return;
        }
        if (errno == EAGAIN || errno == EINTR) {
            break;
        }
        close_conn(fd);
        return;
    }
    parse_requests(fd);
}

static void
accept_all(void)
{
    int                 fd, one = 1;
    struct epoll_event  ev;

    for ( ;; ) {
        fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0) {
            return;
        }
        if (fd >= maxfd) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        memset(&conns[fd].state, 0,
               sizeof(conn_t) - offsetof(conn_t, state));
        conns[fd].used = 1;
        conns[fd].state = ST_READ;
        nconn++;
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

static void
on_signal(int sig)
{
    (void) sig;
    stop = 1;
}

int
main(int argc, char **argv)
{
    int                  i, n, one = 1, timeout, port;
    pid_t                ppid = 0;
    char                *listen_arg = NULL, *port_file = NULL, *colon;
    long long            now, last_check = 0;
    struct rlimit        rl;
    struct sockaddr_in   sa;
    socklen_t            len;
    struct epoll_event   ev, events[1024];

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
            listen_arg = argv[++i];
        } else if (strcmp(argv[i], "--port-file") == 0 && i + 1 < argc) {
            port_file = argv[++i];
        } else if (strcmp(argv[i], "--delay") == 0 && i + 1 < argc) {
            base_delay = atoll(argv[++i]);
        } else if (strcmp(argv[i], "--ppid") == 0 && i + 1 < argc) {
            ppid = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--log") == 0 && i + 1 < argc) {
            i++;
        } else {
            fprintf(stderr, "usage: origin --listen HOST:PORT "
                    "[--port-file F] [--ppid PID]\n");
            return 2;
        }
    }
    if (listen_arg == NULL || (colon = strrchr(listen_arg, ':')) == NULL) {
        fprintf(stderr, "origin: --listen HOST:PORT is required\n");
        return 2;
    }
    *colon = '\0';
    port = atoi(colon + 1);

    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    maxfd = rl.rlim_cur > 1048576 ? 1048576 : (int) rl.rlim_cur;
    conns = calloc(maxfd, sizeof(conn_t));
    pattern_buf = malloc(PATTERN_BUF);
    for (i = 0; i < PATTERN_BUF; i++) {
        pattern_buf[i] = PATTERN[i % (sizeof(PATTERN) - 1)];
    }

    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    if (inet_pton(AF_INET, listen_arg, &sa.sin_addr) != 1
        || bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) < 0
        || listen(lfd, 65535) < 0)
    {
        perror("origin: listen");
        return 1;
    }
    len = sizeof(sa);
    getsockname(lfd, (struct sockaddr *) &sa, &len);

    if (port_file) {
        char   tmp[4096];
        FILE  *f;

        snprintf(tmp, sizeof(tmp), "%s.tmp.%d", port_file, (int) getpid());
        f = fopen(tmp, "w");
        if (f == NULL) {
            perror("origin: port file");
            return 1;
        }
        fprintf(f, "%d\n", ntohs(sa.sin_port));
        fclose(f);
        rename(tmp, port_file);
    }

    ep = epoll_create1(0);
    ev.events = EPOLLIN;
    ev.data.fd = lfd;
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);

    while (!stop) {
        now = now_us();

        /* leave when the process that started us is gone */
        if (ppid && now - last_check > 500000) {
            last_check = now;
            if (getppid() != ppid) {
                break;
            }
        }

        /* responses whose delay is over */
        while (heap_len && heap[0].due <= now) {
            timer_t_  t = heap_pop();
            conn_t   *c = &conns[t.fd];

            if (!c->used || c->gen != t.gen) {
                continue;
            }
            if (c->state == ST_WAIT) {
                if (c->paced_wait == 2) {           /* delay over, hold */
                    c->paced_wait = 0;
                    hold_conn(t.fd);
                    continue;
                }
                c->state = ST_WRITE;
                flush_conn(t.fd);

            } else if (c->state == ST_WRITE && c->paced_wait == 1) {
                c->paced_wait = 0;
                flush_conn(t.fd);
            }
        }

        timeout = 500;
        if (heap_len) {
            long long  d = heap[0].due - now_us();

            timeout = d <= 0 ? 0 : (int) ((d + 999) / 1000);
            if (timeout > 500) {
                timeout = 500;
            }
        }

        n = epoll_wait(ep, events, 1024, timeout);
        for (i = 0; i < n; i++) {
            int  fd = events[i].data.fd;

            if (fd == lfd) {
                accept_all();
                continue;
            }
            if (!conns[fd].used) {
                continue;
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                on_readable(fd);
            }
            if (conns[fd].used && (events[i].events & EPOLLOUT)
                && conns[fd].state == ST_WRITE)
            {
                flush_conn(fd);
            }
        }
    }

    return 0;
}
