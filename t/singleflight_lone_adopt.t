#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_lone direct, the default, when a herd comes: the first
# request went its own way (no key, no flight); the ones that come while
# it waits for its header make a flight that waits for that header rather than fetching.
# At its header the first request takes the flight over, and its upstream
# response feeds everybody: one origin request for the herd, each client
# getting what the module off gives.  When it cannot (its response is
# private, it failed, its client or its worker went away before its
# header), the flight is let go and a follower fetches it: the herd is
# never left waiting.  Where the first request could not feed a flight
# (a location whose response nginx does not buffer, a request redirected
# here by try_files, a HEAD), it leads one through a fetch instead.

use strict;
use warnings;

use IO::Socket::INET ();
use Socket ();
use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# a server that takes connections and never answers: proxy_read_timeout
# there, then proxy_next_upstream tries the origin
my $silent = IO::Socket::INET->new(Listen => 64, LocalAddr => '127.0.0.1',
                                   LocalPort => 0, Proto => 'tcp')
    or die "a silent server: $!\n";
my $SILENT = '127.0.0.1:' . $silent->sockport;

my %conf = (workers => 2, log_singleflight => 1);
$t->write_config($t->config_template(<<'EOT' =~ s/%%SILENT%%/$SILENT/r, %conf));
    upstream nexttry {
        server %%SILENT%% max_fails=0;
        server %%ORIGIN%% backup;
    }

    singleflight_zone zone=sf:1m;
    proxy_cache_path %%TESTDIR%%/cache levels=1:2 keys_zone=pc:1m;
    log_format loopvar '$status $request_uri [$http_cdn_loop]';

    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_2%% http2;
        listen 127.0.0.1:%%PORT_4%%;

        location / {
            singleflight sf;
            singleflight_timeout 30s;
            proxy_pass http://%%ORIGIN%%;
        }

        location /unbuffered/ {
            singleflight sf;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /tried/ {
            singleflight sf;
            try_files /nonexistent @named;
        }

        location @named {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /loopvar/ {
            singleflight sf;
            add_header X-CDN-Loop "[$http_cdn_loop]" always;
            access_log %%TESTDIR%%/access.log sftest;
            access_log %%TESTDIR%%/loopvar.log loopvar;
            proxy_pass http://%%ORIGIN%%;
        }

        location /cached/ {
            singleflight sf;
            add_header X-Key $singleflight_key;
            proxy_cache pc;
            proxy_cache_valid 200 1h;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mirrored/ {
            singleflight sf;
            mirror /slowmirror;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /slowmirror {
            internal;
            set $args "";
            proxy_pass http://%%ORIGIN%%/mirror?delay=1500;
        }

        location /plain/ {
            access_log %%TESTDIR%%/access.log sftest;
            access_log %%TESTDIR%%/loopvar.log loopvar;
            proxy_pass http://%%ORIGIN%%/;
        }

        location /nexttry/ {
            singleflight sf;
            singleflight_timeout 30s;
            proxy_read_timeout 2s;
            proxy_pass http://nexttry;
        }

        location = /stats {
            singleflight_stats;
        }
    }

    # a small send buffer, for a client that reads nothing
    server {
        listen 127.0.0.1:%%PORT_3%% sndbuf=16k;

        location / {
            singleflight sf;
            send_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
$t->start;

sub complete_200 {
    scalar grep { ($_->{status} // 0) == 200 && $_->{complete} } @{ $_[0] };
}


sub header_names {
    join ',', sort map { lc $_->[0] } @{ $_[0]{header_list} };
}

# ------------------------------------------------------------ a herd

# Ten at once, and the same ten without the module: one origin request
# with the module, every client the same response as the first one's.

my $uri = '/herd?delay=500';
my $res = $t->herd(n => 10, path => $uri);
is($t->origin_uri_hits($uri), 1, 'herd: 1 origin request for 10');
is(SFTest::with_hit($res, $uri, 1), 10, 'herd: 10 complete 200s, the first request\'s response');
is_deeply($t->sf_outcomes($uri, 10), { 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
          'herd: the first request LEADER, 9 FOLLOWER');

my $plain = $t->herd(n => 10, path => '/plain/herd?delay=500');
is(complete_200($plain), 10, 'herd without the module: 10 complete 200s');
is(scalar(grep { header_names($_) eq header_names($plain->[0]) } @$res), 10,
   'herd: every client the header lines of the module off');

# Requests on another port of the server (its key has the port) do not
# wait for the first request's header, which cannot feed them: the first
# of them goes its own way too, and the others share its response (they
# waited, then one of them fetched again: PROMOTED, an origin time late).

{
    my $u = '/ports?delay=1000';
    my $first = $t->start_request('GET', $u);
    $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, what => 'two ports: the first at the origin');
    my $second = $t->start_request('GET', $u, port => $t->port(4));
    $t->wait_for(sub { $t->origin_uri_hits($u) == 2 }, what => 'two ports: the other port\'s first at the origin');
    my @res = map { $t->finish_request($_) }
              $first, $second, map { $t->start_request('GET', $u, port => $t->port(4)) } 1 .. 3;
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @res), 5, 'two ports: 5 complete 200s');
    is($t->origin_uri_hits($u), 2, 'two ports: one origin request a port');
    is_deeply($t->sf_outcomes($u, 5), { 'DIRECT:200' => 1, 'LEADER:200' => 1, 'FOLLOWER:200' => 3 },
              'two ports: the first on each its own way, the others of the second port its followers');
}

# Where the first request could not feed a flight, it leads one through
# a fetch: one origin request all the same.

for my $c ([ '/unbuffered/herd?delay=500', 'proxy_buffering off' ],
           [ '/tried/herd?delay=500', 'try_files to a named location' ]) {
    my ($u, $name) = @$c;
    $t->origin_reset;
    my $r = $t->herd(n => 10, path => $u);
    is($t->origin_uri_hits($u), 1, "$name: 1 origin request for 10");
    is(SFTest::with_hit($r, $u, 1), 10, "$name: 10 complete 200s of it")
        or diag(explain([ @{$r}[0] ]));
    is_deeply($t->sf_outcomes($u, 10), { 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
              "$name: a LEADER, 9 FOLLOWER");
}

# HEADs arriving while a GET goes its own way: a HEAD never leads a GET
# flight, so they share a HEAD of their own.

$t->origin_reset;
$uri = '/headafter?delay=500&size=1000';
my $get = $t->start_request('GET', $uri);
$t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the GET at the origin');
my @heads = map { $t->start_request('HEAD', $uri) } 1 .. 5;
my $gr = $t->finish_request($get);
my @hr = map { $t->finish_request($_) } @heads;
is($gr->{status}, 200, 'HEAD after a lone GET: the GET gets its 200');
is(scalar(grep { ($_->{status} // 0) == 200 && ($_->{body} // '') eq '' } @hr), 5,
   'HEAD after a lone GET: 5 HEADs, 200 and no body');
is($t->origin_uri_hits($uri), 2, 'HEAD after a lone GET: the GET and one HEAD at the origin');

# the same over HTTP/2: the first stream's response feeds the others

$t->origin_reset;
$uri = '/h2herd?delay=500&size=3000';
my @h2 = (h2 => 1, port => $t->port(2));
my $h2first = $t->start_request('GET', $uri, @h2);
$t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the first stream at the origin');
my @h2rest = map { $t->start_request('GET', $uri, @h2) } 1 .. 4;
$t->wait_waiters(4);
my @h2res = map { $t->finish_request($_) } $h2first, @h2rest;
is(scalar(grep { ($_->{status} // 0) == 200 && ($_->{body} // '') eq SFTest::origin_body(1, $uri, 3000) } @h2res),
   5, 'HTTP/2 herd: 5 streams got the first one\'s response');
is($t->origin_uri_hits($uri), 1, 'HTTP/2 herd: 1 origin request');

# ------------------------------------------------------------ its header time

# The flight began when its first request went upstream, not when a
# second request came: the header histogram (which singleflight_hedge
# auto reads) has the origin's whole time.

{
    my $hist = sub { $t->stats('/stats')->{zones}{sf}{flight_header_seconds} };
    $t->origin_reset;
    my $h0 = $hist->();
    my $u = '/late?delay=1200';
    my $first = $t->start_request('GET', $u);
    $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, what => "$u at the origin");
    select(undef, undef, undef, 0.8);    # the second one comes late
    my $second = $t->start_request('GET', $u);
    my @r = map { $t->finish_request($_) } $first, $second;
    is(SFTest::with_hit(\@r, $u, 1), 2, 'late second: both get the one response');
    is_deeply($t->sf_outcomes($u, 2), { 'LEADER:200' => 1, 'FOLLOWER:200' => 1 },
              'late second: it followed the first');
    my $h1 = $hist->();
    is($h1->{count} - $h0->{count}, 1, 'late second: one header time');
    cmp_ok($h1->{sum} - $h0->{sum}, '>=', 1.1,
           'late second: the header time is the origin\'s, from the first request');
}

# The same when the first request's upstream tried twice
# (proxy_next_upstream: 2 s of a silent server, then the origin's 1 s),
# the second request coming during the second try: the header time
# counts from the first try.
{
    my $hist = sub { $t->stats('/stats')->{zones}{sf}{flight_header_seconds} };
    $t->origin_reset;
    my $h0 = $hist->();
    my $u = '/nexttry/x?delay=1000';
    my $first = $t->start_request('GET', $u);
    $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, timeout => 10,
                 what => "$u at the origin, its second try");
    select(undef, undef, undef, 0.3);    # the second one comes then
    my $second = $t->start_request('GET', $u);
    my @r = map { $t->finish_request($_, timeout => 10) } $first, $second;
    is(SFTest::with_hit(\@r, $u, 1), 2, 'second try: both get the one response');
    is_deeply($t->sf_outcomes($u, 2), { 'LEADER:200' => 1, 'FOLLOWER:200' => 1 },
              'second try: it followed the first');
    my $h1 = $hist->();
    is($h1->{count} - $h0->{count}, 1, 'second try: one header time');
    cmp_ok($h1->{sum} - $h0->{sum}, '>=', 2.8,
           'second try: the header time counts from the first try');
}

# ------------------------------------------------------------ private

# The first request's response is private: everybody else goes upstream
# itself, as without the module.

$t->origin_reset;
$uri = '/private?delay=500&hdr=Cache-Control:private';
$res = $t->herd(n => 10, path => $uri);
is(complete_200($res), 10, 'private: 10 complete 200s');
is($t->origin_uri_hits($uri), 10, 'private: 10 origin requests');
is(scalar(grep { SFTest::with_hit([$_], $uri, $_->{headers}{'x-hit'} // 0) } @$res), 10,
   'private: each client its own origin response');
my %hits = map { ($_->{headers}{'x-hit'} // 0) => 1 } @$res;
is(scalar(keys %hits), 10, 'private: 10 different responses');

# ------------------------------------------------------------ an origin error

# The first request gets the origin's error (its connection reset): it
# answers it as without the module, and the others fetch once more.

# The first request of $uri, once at the origin, then $n more waiting
# for its header (a fresh origin count): (first, [the others]), started.
sub first_and_herd {
    my ($uri, $n) = @_;
    $t->origin_reset;
    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 },
                 what => 'the first request at the origin');
    my @rest = map { $t->start_request('GET', $uri) } 1 .. $n;
    $t->wait_waiters($n);
    return ($first, \@rest);
}

$uri = '/reset?delay=300&fail=reset&fail_first=1';
my ($first, $rest) = first_and_herd($uri, 5);
my @rest = @$rest;
my $r = $t->finish_request($first);
is($r->{status}, 502, 'origin error: the first request gets its 502');
$t->poll_all(\@rest);
is(SFTest::with_hit([ map { $_->{res} } @rest ], $uri, 2), 5, 'origin error: the others the next response');
is($t->origin_uri_hits($uri), 2, 'origin error: 2 origin requests');

# Every request reset: the first request's failure was the flight's first
# try, the others' fetch its one retry (singleflight_promote tries=1),
# then their 502: 2 origin requests, as with a fetch.

$uri = '/resetall?delay=300&fail=reset';
($first, $rest) = first_and_herd($uri, 5);
@rest = @$rest;
$r = $t->finish_request($first);
is($r->{status}, 502, 'every request reset: the first request gets its 502');
$t->poll_all(\@rest);
is(scalar(grep { ($_->{res}{status} // 0) == 502 } @rest), 5, 'every request reset: the others a 502');
is($t->origin_uri_hits($uri), 2, 'every request reset: 2 origin requests');

# ------------------------------------------------------------ an abort

# The first request's client goes away before its header: the flight is
# let go, and one of the others fetches it for all.

$uri = '/abort?delay=800';
($first, $rest) = first_and_herd($uri, 5);
@rest = @$rest;
$t->abort_request($first);
ok($t->poll_all(\@rest, timeout => 10), 'abort: the others are answered');
is(SFTest::with_hit([ map { $_->{res} } @rest ], $uri, 2), 5, 'abort: 5 complete 200s of one fetch');
is($t->origin_uri_hits($uri), 2, 'abort: 2 origin requests');

# ------------------------------------------------------------ gone mid-body

# The first request's client goes away mid-body, on a response nobody
# could ask the rest of (chunked, no validator): the origin's response is
# read on for the others, who get all of it.

$t->origin_reset;
$uri = '/gone?delay=300&chunked=1&size=200000&pace=10000:50';
$first = $t->start_request('GET', $uri);
$t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the first request at the origin');
@rest = map { $t->start_request('GET', $uri) } 1 .. 5;
$t->wait_waiters(5);
$t->wait_for(sub { $t->poll_request($first); length($first->{res}{body}) > 0 },
             interval => 0.01, what => 'the first bytes of the body');
$t->abort_request($first, rst => 1);
ok($t->poll_all(\@rest, timeout => 10), 'gone mid-body: the others are answered');
my @got = map { $_->{res} } @rest;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && length($_->{body}) == 200000
                 && ($_->{headers}{'x-hit'} // 0) == 1 && $_->{body} eq $got[0]{body} } @got), 5,
   'gone mid-body: 5 whole bodies of the one response');
is($t->origin_uri_hits($uri), 1, 'gone mid-body: 1 origin request');
ok($t->log_count(qr/client of flight \d+ gone, its upstream response is read on/) >= 1,
   'gone mid-body: logged at info');

# ------------------------------------------------------------ timed out mid-body

# The first request's client reads nothing; the origin pauses longer than
# send_timeout mid-body, on a response nobody could ask the rest of: the
# client is timed out, and the origin's response is read on for the
# others, who get all of it.

{
    $t->origin_reset;
    $uri = '/stalled?delay=300&chunked=1&size=600000&pace=200000:1800';
    socket(my $s, Socket::PF_INET(), Socket::SOCK_STREAM(), 0) or die "socket: $!";
    setsockopt($s, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096);
    connect($s, Socket::pack_sockaddr_in($t->port(3), Socket::inet_aton('127.0.0.1')))
        or die "connect: $!";
    syswrite($s, "GET $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    $t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the first request at the origin');
    my @late = map { $t->start_request('GET', $uri, port => $t->port(3), timeout => 20) } 1 .. 4;
    $t->wait_waiters(4);
    ok($t->poll_all(\@late, timeout => 20), 'timed out mid-body: the others are answered');
    my @res = map { $_->{res} } @late;
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && length($_->{body}) == 600000
                     && $_->{body} eq $res[0]{body} } @res), 4,
       'timed out mid-body: 4 whole bodies of the one response')
        or diag(explain([ map { [ $_->{status}, $_->{complete}, length($_->{body} // '') ] } @res ]));
    is($t->origin_uri_hits($uri), 1, 'timed out mid-body: 1 origin request');
    ok($t->log_count(qr/client of flight \d+ timed out, its upstream response is read on/) >= 1,
       'timed out mid-body: logged at info');
    close($s);
}

# ------------------------------------------------------------ $http_cdn_loop

# The first request's upstream request carries CDN-Loop (so that, come
# back here, it is never made to wait for itself); its own
# $http_cdn_loop is what the client sent, as without the module.

{
    my $r = $t->get('/loopvar/a');
    is($r->{headers}{'x-cdn-loop'}, '[]', '$http_cdn_loop: empty, as the client sent none');
    $r = $t->get('/loopvar/b', headers => [ 'CDN-Loop' => 'other' ]);
    is($r->{headers}{'x-cdn-loop'}, '[other]', '$http_cdn_loop: the client\'s alone');
    is_deeply($t->sf_outcomes('/loopvar/a', 1), { 'DIRECT:200' => 1 },
              '$http_cdn_loop: of a request that went its own way');

    # logged too, of a request whose client goes away before its header,
    # as without the module
    my %logged;
    for my $uri ('/loopvar/gone?delay=2000', '/plain/loopvar/gone?delay=2000') {
        (my $at_origin = $uri) =~ s{^/plain}{};
        my $h = $t->start_request('GET', $uri);
        $t->wait_for(sub { $t->origin_uri_hits($at_origin) >= 1 },
                     what => "$uri at the origin");
        $t->abort_request($h);
        my ($rec) = $t->wait_log_records('loopvar.log', [qw(status uri cdn)], 1,
                                         uri => $uri);
        $logged{$uri} = join ' ', map { $_ // '' } @{$rec}{qw(status cdn)};
    }
    is($logged{'/loopvar/gone?delay=2000'}, '499 [-]',
       '$http_cdn_loop: none in the log of a request its client left (499)');
    is($logged{'/loopvar/gone?delay=2000'}, $logged{'/plain/loopvar/gone?delay=2000'},
       '$http_cdn_loop: logged as without the module');
}

# ------------------------------------------------------------ after its response

# A request on its own way gives its slot back when its upstream response
# is in, not when it ends: a mirror keeps the first request open 1.5 s
# after its client has the whole response, and the client's next request,
# on a new connection, still goes its own way rather than leading a
# flight.

{
    $t->origin_reset;
    $uri = '/mirrored/m?size=1000';
    my $r1 = $t->get($uri);
    $t->wait_for(sub { $t->origin_uri_hits('/mirror?delay=1500') == 1 },
                 what => 'its mirror at the origin');
    my $logged = () = $t->read_file('access.log') =~ m{"GET \Q$uri\E }g;
    is($logged, 0, 'after its response: the first request is still open (its mirror)');
    my $r2 = $t->get($uri);
    is($t->origin_uri_hits($uri), 2, 'after its response: the next request to the origin');
    is_deeply($t->sf_outcomes($uri, 2), { 'DIRECT:200' => 2 },
              'after its response: the next request goes its own way too');
}

# ------------------------------------------------------------ a cache hit

# A proxy_cache hit is not the module's: $singleflight_status empty, not
# counted; its miss went its own way (DIRECT).

{
    my $stats0 = $t->zone_stats;
    $uri = '/cached/c?size=4000';
    my $first = $t->get($uri);
    $t->wait_for(sub { my @f = glob($t->path('cache') . '/*/*/*'); @f },
                 what => 'the response in the cache');
    # nginx renames the file into place, then marks its cache node as
    # there: the first request's log line, written once its upstream
    # request is over, comes after both
    $t->sf_statuses($uri, 1);
    my $hit = $t->get($uri);
    is($hit->{body}, $first->{body}, 'cache hit: the cached body');
    is($t->origin_uri_hits($uri), 1, 'cache hit: the origin asked once');
    is_deeply([ $t->sf_statuses($uri, 2) ], [ 'DIRECT', '-' ],
              'cache hit: not the module\'s ($singleflight_status empty)');
    ok(length($hit->{headers}{'x-key'} // ''), 'cache hit: $singleflight_key all the same');
    my $stats = $t->zone_stats;
    is($stats->{direct} - ($stats0->{direct} // 0), 1, 'cache hit: not counted as DIRECT');
}

# ------------------------------------------------------------ a dead worker

# The first request's worker is killed before its header: a flight of
# the other worker that waited for it is let go at once (not at
# singleflight_timeout), and its followers fetch it.

$t->origin_reset;
$uri = '/dead?fail=hang&fail_first=1';
$first = $t->start_request('GET', $uri);
$t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the first request at the origin');
my $dead;
$t->wait_for(sub { $dead = $t->worker_of($first) }, what => 'the first request\'s worker');

# followers until a few are in the other worker
my (@other, @same);
$t->wait_for(sub {
    my $h = $t->start_request('GET', $uri);
    my $w;
    $t->wait_for(sub { $w = $t->worker_of($h) }, what => 'a follower\'s worker');
    push @{ $w == $dead ? \@same : \@other }, $h;
    @other >= 3;
}, timeout => 10, interval => 0.01, what => '3 followers in the other worker');
$t->wait_waiters(@other + @same);

$t->allow_log(qr/worker process $dead exited on signal 9/);
$t->kill_worker($dead);
ok($t->poll_all(\@other, timeout => 10), 'dead worker: the other worker\'s followers are answered');
is(SFTest::with_hit([ map { $_->{res} } @other ], $uri, 2), scalar(@other),
   'dead worker: each a complete 200 of one fetch');
is($t->origin_uri_hits($uri), 2, 'dead worker: 2 origin requests');
$t->abort_request($_) for @same;
$t->worker_respawned($dead);

$t->zone_baseline_ok('the zone is back to its baseline');

# ------------------------------------------------------------ everybody gone

# The first request and the two that joined before its header all go away
# mid-body: the upstream request ends at once, as without the module,
# whether the origin pauses (its connection quiet) or keeps sending.

for my $kind ('stall', 'pace') {
    $t->origin_reset;
    my $q = $kind eq 'stall' ? 'delay=500&fail=stall&cut=100000&size=400000'
                             : 'delay=500&pace=50000:300&size=3000000';
    my $u = "/gone-$kind?$q";
    my $s0 = $t->zone_stats;
    my $first = $t->start_request('GET', $u);
    $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, what => 'the first request at the origin');
    my @f = map { $t->start_request('GET', $u) } 1 .. 2;
    $t->wait_waiters(2);
    $t->wait_for(sub { $t->poll_request($_) for $first, @f;
                       !grep { !defined $_->{res}{status} } $first, @f },
                 what => 'the three headers');
    $t->abort_request($_) for $first, @f;
    ok($t->wait_for(sub { ($t->origin_hits->{aborted} // 0) >= 1 }, timeout => 5,
                    what => 'the origin request closed'),
       "everybody gone mid-body ($kind): the upstream request ends");
    is($t->zone_stats->{abandoned} - $s0->{abandoned}, 1,
       "everybody gone mid-body ($kind): counted as abandoned");
    $t->zone_baseline_ok("everybody gone mid-body ($kind): zone back to baseline");
}

done_testing;
