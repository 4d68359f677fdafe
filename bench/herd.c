/* SPDX-License-Identifier: BSD-2-Clause (see LICENSE) */
/*
 * bench/herd.c - a thundering herd of identical HTTP requests, with epoll.
 *
 * Opens N connections to one server, and once every one is established,
 * writes the same GET request on all of them in one tight loop.  Then it
 * reads every response and records, per connection: the time its request
 * was written, the time its response was complete, the status, the body
 * length, a 64-bit hash of the body and the values of a few response
 * headers chosen with -c.  The Perl herd client of t/lib/SFTest.pm uses
 * select() and cannot go past ~1000 sockets; this one is meant for 10,000
 * and more.
 *
 * Built by bench/bench.pl:  cc -O2 -o build/bench/herd bench/herd.c
 *
 * usage: herd -p PORT (-u PATH | -f FILE) [-n N] [-h HOST] [-H HOSTHDR]
 *             [-t MS] [-a NADDR] [-b BATCH] [-s MS] [-c HEADER]...
 *
 *   -p PORT     server port on 127.0.0.1 (or -h HOST, an IPv4 address)
 *   -u PATH     request target, e.g. "/x?delay=200&size=10000"
 *   -f FILE     request targets, one per line: connection I asks for line
 *               I modulo their number (-n defaults to that number)
 *   -n N        number of connections (default 100)
 *   -H HOSTHDR  Host header (default "localhost")
 *   -t MS       give up on responses not complete after MS (default 30000)
 *   -a NADDR    spread the connections over the source addresses
 *               127.0.0.1 .. 127.0.0.NADDR (default: 1 per 20,000 conns)
 *   -b BATCH    at most BATCH connects in progress at once (default 500),
 *               so that the server's accept queue never overflows
 *   -s MS       settle time between the last connect and the sends
 *               (default 20 + 2 per 1000 connections)
 *   -c HEADER   report this response header's value (up to 4, e.g. X-SF)
 *
 * Output, one line per connection, then one summary line:
 *
 *   c IDX STATUS BODYLEN HASH SENT_US DONE_US ERR [HDR1 [HDR2 ...]]
 *   summary n=N ok=N errors=N connect_ms=F send_ms=F total_ms=F
 *
 * Times are microseconds since the first request was written (DONE_US is
 * -1 for a failed one).  STATUS is 0 without a status line, ERR is "-" or
 * one word (timeout, eof, reset, connect, write, parse), a missing header
 * value is "-".
 */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#define MAX_CAPTURE  4
#define MAX_HEAD     16384

enum { S_CONNECTING, S_CONNECTED, S_HEAD, S_BODY, S_DONE };
enum { B_LENGTH, B_CHUNKED, B_CLOSE };
enum { C_SIZE, C_DATA, C_DATA_CRLF, C_TRAILER };

typedef struct {
    int        fd;
    int        state;
    int        status;
    int        mode;             /* B_* */
    int        cstate;           /* C_* while chunked */
    long long  left;             /* body (B_LENGTH) or chunk bytes left */
    long long  body_len;
    uint64_t   hash;
    uint64_t   carry;            /* bytes not yet hashed, below 8 */
    int        ncarry;
    char      *head;             /* header bytes until the blank line */
    int        head_len;
    char       line[64];         /* chunk size line being read */
    int        line_len;
    long long  t_sent, t_done;
    const char *err;
    char      *cap[MAX_CAPTURE];
} conn_t;

static conn_t       *conns;
static int           nconns = 100;
static const char   *capture[MAX_CAPTURE];
static int           ncapture;
static int           ep;
static int           done_count;
static struct timespec t_origin;

static long long
now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (ts.tv_sec - t_origin.tv_sec) * 1000000LL
           + (ts.tv_nsec - t_origin.tv_nsec) / 1000;
}

/* a 64-bit multiplicative hash of the body, 8 bytes at a time */

static void
hash_bytes(conn_t *c, const unsigned char *p, size_t n)
{
    uint64_t  w;

    c->body_len += n;

    while (n && c->ncarry) {            /* finish a partial word */
        c->carry |= (uint64_t) *p++ << (8 * c->ncarry);
        n--;
        if (++c->ncarry == 8) {
            c->hash = (c->hash ^ c->carry) * 0x100000001b3ULL;
            c->hash ^= c->hash >> 29;
            c->carry = 0;
            c->ncarry = 0;
        }
    }

    while (n >= 8) {
        memcpy(&w, p, 8);
        c->hash = (c->hash ^ w) * 0x100000001b3ULL;
        c->hash ^= c->hash >> 29;
        p += 8;
        n -= 8;
    }

    while (n) {
        c->carry |= (uint64_t) *p++ << (8 * c->ncarry++);
        n--;
    }
}

static uint64_t
hash_final(conn_t *c)
{
    uint64_t  h = c->hash;

    if (c->ncarry) {
        h = (h ^ c->carry ^ ((uint64_t) c->ncarry << 56)) * 0x100000001b3ULL;
    }
    return h ^ (uint64_t) c->body_len;
}

static void
finish(conn_t *c, const char *err)
{
    if (c->state == S_DONE) {
        return;
    }
    c->state = S_DONE;
    c->err = err;
    c->t_done = err ? -1 : now_us();
    free(c->head);
    c->head = NULL;
    done_count++;
    /* the socket is closed at exit: close() here would slow the loop */
}

/* parse the header block; returns the offset of the body in it, or -1 */

static int
parse_head(conn_t *c)
{
    char  *p, *end, *eol, *colon, *v, *ve;
    int    i, chunked = 0;
    long long  length = -1;

    end = memmem(c->head, c->head_len, "\r\n\r\n", 4);
    if (end == NULL) {
        return -1;
    }

    if (c->head_len < 12 || memcmp(c->head, "HTTP/1.", 7) != 0) {
        finish(c, "parse");
        return -2;
    }
    c->status = atoi(c->head + 9);

    for (p = memchr(c->head, '\n', end - c->head) + 1; p < end; p = eol + 2) {
        eol = memmem(p, end + 2 - p, "\r\n", 2);
        colon = memchr(p, ':', eol - p);
        if (colon == NULL) {
            continue;
        }
        for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); v++) { }
        for (ve = eol; ve > v && (ve[-1] == ' ' || ve[-1] == '\t'); ve--) { }

        if (colon - p == 14 && strncasecmp(p, "Content-Length", 14) == 0) {
            length = strtoll(v, NULL, 10);
        } else if (colon - p == 17
                   && strncasecmp(p, "Transfer-Encoding", 17) == 0
                   && memmem(v, ve - v, "chunked", 7) != NULL)
        {
            chunked = 1;
        }

        for (i = 0; i < ncapture; i++) {
            if ((size_t) (colon - p) == strlen(capture[i])
                && strncasecmp(p, capture[i], colon - p) == 0
                && c->cap[i] == NULL)
            {
                c->cap[i] = strndup(v, ve - v);
            }
        }
    }

    if (c->status >= 100 && c->status < 200) {     /* interim: skip it */
        memmove(c->head, end + 4, c->head_len - (end + 4 - c->head));
        c->head_len -= end + 4 - c->head;
        for (i = 0; i < ncapture; i++) {
            free(c->cap[i]);
            c->cap[i] = NULL;
        }
        return parse_head(c);
    }

    if (chunked) {
        c->mode = B_CHUNKED;
        c->cstate = C_SIZE;
    } else if (length >= 0) {
        c->mode = B_LENGTH;
        c->left = length;
    } else {
        c->mode = B_CLOSE;
    }
    if (c->status == 204 || c->status == 304) {
        c->mode = B_LENGTH;
        c->left = 0;
    }
    c->state = S_BODY;
    return (int) (end + 4 - c->head);
}

/* feed body bytes; finishes the connection when the body is complete */

static void
body(conn_t *c, const unsigned char *p, size_t n)
{
    size_t  take;

    if (c->mode == B_CLOSE) {
        hash_bytes(c, p, n);
        return;
    }

    if (c->mode == B_LENGTH) {
        take = (long long) n < c->left ? n : (size_t) c->left;
        hash_bytes(c, p, take);
        c->left -= take;
        if (c->left == 0) {
            finish(c, NULL);
        }
        return;
    }

    while (n && c->state != S_DONE) {                /* chunked */
        switch (c->cstate) {

        case C_DATA:
            take = (long long) n < c->left ? n : (size_t) c->left;
            hash_bytes(c, p, take);
            p += take;
            n -= take;
            c->left -= take;
            if (c->left == 0) {
                c->cstate = C_DATA_CRLF;
                c->line_len = 0;
            }
            break;

        default:                        /* a line: size, CRLF or trailer */
            if (*p != '\n') {
                if (c->line_len < (int) sizeof(c->line) - 1) {
                    c->line[c->line_len++] = *p;
                }
                p++;
                n--;
                break;
            }
            p++;
            n--;
            c->line[c->line_len] = '\0';

            if (c->cstate == C_DATA_CRLF) {
                c->cstate = C_SIZE;

            } else if (c->cstate == C_SIZE) {
                c->left = strtoll(c->line, NULL, 16);
                c->cstate = c->left ? C_DATA : C_TRAILER;

            } else if (c->line_len <= 1) {        /* end of the trailer */
                finish(c, NULL);
            }
            c->line_len = 0;
            break;
        }
    }
}

static void
on_data(conn_t *c, unsigned char *p, size_t n)
{
    int     off;
    size_t  take;

    if (c->state == S_HEAD) {
        if (c->head == NULL) {
            c->head = malloc(MAX_HEAD);
        }
        take = MAX_HEAD - c->head_len;
        take = n < take ? n : take;
        memcpy(c->head + c->head_len, p, take);
        c->head_len += take;

        off = parse_head(c);
        if (off == -1 && c->head_len == MAX_HEAD) {
            finish(c, "parse");                    /* header too large */
        }
        if (off < 0) {
            return;
        }

        /* the body so far: after the header in c->head, then the rest */
        if (c->mode == B_LENGTH && c->left == 0) {
            finish(c, NULL);
            return;
        }
        if (c->head_len > off) {
            body(c, (unsigned char *) c->head + off, c->head_len - off);
        }
        p += take;
        n -= take;
    }

    if (n && c->state == S_BODY) {
        body(c, p, n);
    }
}

static void
on_readable(conn_t *c, unsigned char *buf, size_t size)
{
    ssize_t  n;

    while (c->state != S_DONE) {
        n = read(c->fd, buf, size);
        if (n > 0) {
            on_data(c, buf, n);
            continue;
        }
        if (n == 0) {
            if (c->state == S_BODY && c->mode == B_CLOSE) {
                finish(c, NULL);
            } else {
                finish(c, "eof");
            }
            return;
        }
        if (errno == EAGAIN || errno == EINTR) {
            return;
        }
        finish(c, errno == ECONNRESET ? "reset" : "read");
        return;
    }
}

static void
usage(void)
{
    fprintf(stderr, "usage: herd -p PORT (-u PATH | -f FILE) [-n N] [-h HOST] "
            "[-H HOSTHDR] [-t MS] [-a NADDR] [-b BATCH] [-s MS] "
            "[-c HEADER]...\n");
    exit(2);
}

int
main(int argc, char **argv)
{
    int                 opt, i, k, port = 0, timeout_ms = 30000, naddr = 0;
    int                 batch = 500, settle_ms = -1, started, inprogress;
    int                 nev, one = 1, ok = 0, errors = 0;
    char               *path = NULL, *host = "127.0.0.1", *hosthdr = "localhost";
    char               *file = NULL, line[4096], **reqs;
    size_t             *reqlens, len;
    int                 nreqs = 0, nset = 0;
    FILE               *fp;
    long long           t_connected, t_sent_all, deadline, t_end;
    struct rlimit       rl;
    struct sockaddr_in  sa, src;
    struct epoll_event  ev, *events;
    unsigned char      *buf;
    conn_t             *c;

    while ((opt = getopt(argc, argv, "p:u:f:n:h:H:t:a:b:s:c:")) != -1) {
        switch (opt) {
        case 'p': port = atoi(optarg); break;
        case 'u': path = optarg; break;
        case 'f': file = optarg; break;
        case 'n': nconns = atoi(optarg); nset = 1; break;
        case 'h': host = optarg; break;
        case 'H': hosthdr = optarg; break;
        case 't': timeout_ms = atoi(optarg); break;
        case 'a': naddr = atoi(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 's': settle_ms = atoi(optarg); break;
        case 'c':
            if (ncapture == MAX_CAPTURE) {
                usage();
            }
            capture[ncapture++] = optarg;
            break;
        default: usage();
        }
    }
    if (port <= 0 || (path == NULL) == (file == NULL) || nconns <= 0
        || batch <= 0)
    {
        usage();
    }

    /* the requests: one target, or one per line of the file */

    reqs = NULL;
    reqlens = NULL;
    fp = NULL;
    if (file && (fp = fopen(file, "r")) == NULL) {
        perror(file);
        return 2;
    }

    while (file ? fgets(line, sizeof(line), fp) != NULL : nreqs == 0) {
        if (file) {
            line[strcspn(line, "\r\n")] = '\0';
            if (line[0] == '\0') {
                continue;
            }
            path = line;
        }
        len = strlen(path) + strlen(hosthdr) + 80;
        reqs = realloc(reqs, (nreqs + 1) * sizeof(char *));
        reqlens = realloc(reqlens, (nreqs + 1) * sizeof(size_t));
        if (reqs == NULL || reqlens == NULL
            || (reqs[nreqs] = malloc(len)) == NULL)
        {
            perror("herd: requests");
            return 1;
        }
        reqlens[nreqs] = snprintf(reqs[nreqs], len,
                                  "GET %s HTTP/1.1\r\nHost: %s\r\n"
                                  "User-Agent: herd\r\nConnection: close"
                                  "\r\n\r\n", path, hosthdr);
        nreqs++;
    }
    if (fp) {
        fclose(fp);
    }
    if (nreqs == 0) {
        fprintf(stderr, "herd: no requests in %s\n", file);
        return 2;
    }
    if (file && !nset) {
        nconns = nreqs;
    }
    if (naddr <= 0) {
        naddr = 1 + nconns / 20000;
    }
    if (settle_ms < 0) {
        settle_ms = 20 + 2 * nconns / 1000;
    }

    /* as many descriptors as we are allowed */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0
        && rl.rlim_cur < (rlim_t) nconns + 16)
    {
        fprintf(stderr, "herd: %d connections need %d descriptors, "
                "the limit is %llu\n", nconns, nconns + 16,
                (unsigned long long) rl.rlim_cur);
        return 1;
    }

    conns = calloc(nconns, sizeof(conn_t));
    events = calloc(4096, sizeof(struct epoll_event));
    buf = malloc(1 << 18);
    ep = epoll_create1(0);
    if (conns == NULL || events == NULL || buf == NULL || ep < 0) {
        perror("herd: setup");
        return 1;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "herd: bad host %s\n", host);
        return 2;
    }

    clock_gettime(CLOCK_MONOTONIC, &t_origin);

    /*
     * Phase 1: connect everything, at most "batch" handshakes at a time.
     */

    started = inprogress = 0;
    deadline = now_us() + timeout_ms * 1000LL;

    while (started < nconns || inprogress) {

        while (started < nconns && inprogress < batch) {
            c = &conns[started];
            c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (c->fd < 0) {
                perror("herd: socket");
                return 1;
            }
            setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

            if (naddr > 1) {
                /* source 127.0.0.x, the port chosen only at connect() */
                setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT,
                           &one, sizeof(one));
                memset(&src, 0, sizeof(src));
                src.sin_family = AF_INET;
                src.sin_addr.s_addr = htonl(0x7f000001 + started % naddr);
                if (bind(c->fd, (struct sockaddr *) &src, sizeof(src)) < 0) {
                    perror("herd: bind");
                    return 1;
                }
            }

            if (connect(c->fd, (struct sockaddr *) &sa, sizeof(sa)) < 0
                && errno != EINPROGRESS)
            {
                finish(c, "connect");
                started++;
                continue;
            }

            c->state = S_CONNECTING;
            ev.events = EPOLLOUT;
            ev.data.ptr = c;
            epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
            started++;
            inprogress++;
        }

        if (!inprogress) {
            break;
        }

        nev = epoll_wait(ep, events, 4096, 100);
        for (i = 0; i < nev; i++) {
            int        err = 0;
            socklen_t  len = sizeof(err);

            c = events[i].data.ptr;
            if (c->state != S_CONNECTING) {
                continue;
            }
            inprogress--;
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err) {
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                finish(c, "connect");
                continue;
            }
            c->state = S_CONNECTED;
            /* from now on: readable, edge-triggered */
            ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
            ev.data.ptr = c;
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }

        if (now_us() > deadline) {
            fprintf(stderr, "herd: connect phase timed out\n");
            break;
        }
    }

    t_connected = now_us();

    /* let the server accept what is still in its queue */
    usleep(settle_ms * 1000);

    /*
     * Phase 2: the same request on every connection, as fast as we can.
     * Time zero is the first write.
     */

    clock_gettime(CLOCK_MONOTONIC, &t_origin);

    for (i = 0; i < nconns; i++) {
        ssize_t  n;

        c = &conns[i];
        if (c->state != S_CONNECTED) {
            if (c->state != S_DONE) {
                finish(c, "connect");
            }
            continue;
        }
        c->t_sent = now_us();
        n = write(c->fd, reqs[i % nreqs], reqlens[i % nreqs]);
        if (n != (ssize_t) reqlens[i % nreqs]) {
            finish(c, "write");
            continue;
        }
        c->state = S_HEAD;
    }

    t_sent_all = now_us();

    /*
     * Phase 3: read until every response is complete or the time is up.
     */

    deadline = timeout_ms * 1000LL;

    while (done_count < nconns) {
        long long  left = deadline - now_us();

        if (left <= 0) {
            break;
        }
        nev = epoll_wait(ep, events, 4096, (int) (left / 1000) + 1);
        for (i = 0; i < nev; i++) {
            c = events[i].data.ptr;
            if (c->state == S_HEAD || c->state == S_BODY) {
                on_readable(c, buf, 1 << 18);
            }
        }
    }

    t_end = now_us();

    for (i = 0; i < nconns; i++) {
        c = &conns[i];
        if (c->state != S_DONE) {
            finish(c, "timeout");
        }
        if (c->err == NULL && c->status > 0) {
            ok++;
        } else {
            errors++;
        }
        printf("c %d %d %lld %016llx %lld %lld %s", i, c->status,
               c->body_len, (unsigned long long) hash_final(c), c->t_sent,
               c->t_done, c->err ? c->err : "-");
        for (k = 0; k < ncapture; k++) {
            char  *v = c->cap[k];

            for (; v && *v; v++) {          /* one word per field */
                if (*v == ' ' || *v == '\t') {
                    *v = '_';
                }
            }
            printf(" %s", c->cap[k] && *c->cap[k] ? c->cap[k] : "-");
        }
        printf("\n");
    }

    printf("summary n=%d ok=%d errors=%d connect_ms=%.1f send_ms=%.3f "
           "total_ms=%.1f\n", nconns, ok, errors, t_connected / 1000.0,
           t_sent_all / 1000.0, t_end / 1000.0);

    for (i = 0; i < nconns; i++) {
        if (conns[i].fd > 0) {
            close(conns[i].fd);
        }
    }

    return 0;
}
