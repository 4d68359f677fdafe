#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Client aborts never fail a flight.  A follower whose client goes away (FIN
# or RST) leaves its flight at once: the zone's waiters gauge drops, and the
# others are not disturbed (with proxy_ignore_client_abort on, as in nginx,
# when its response is sent to it; a client that closed only its side of
# the connection reads it all).  A leader whose client goes away before the
# header, or in the middle of the body, costs nobody anything: its flight's
# fetch goes on for the followers, with no second origin request, and again
# when a follower's client goes away too.  Only when every client is gone
# is the fetch stopped, the way nginx stops an upstream request whose
# client went away (and not with proxy_ignore_client_abort on).  The same
# over HTTP/2: a leader whose connection goes (a killed curl) costs nobody
# anything either, nor does one that resets its stream (RST_STREAM CANCEL,
# what a browser does), nor one that resets its stream and then closes its
# connection while a mirror of its request runs on.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    proxy_cache_path %%TESTDIR%%/cache keys_zone=one:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /ab/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /ab-ignore/ {
            singleflight sf;
            proxy_ignore_client_abort on;
            proxy_pass http://%%ORIGIN%%;
        }

        location /ab-ignore-plain/ {
            singleflight off;
            proxy_ignore_client_abort on;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_1%% http2;

        location /ab/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        # a mirror that ends after the first client left (its fetch)
        location /abm/ {
            singleflight sf;
            mirror /mirror_slow;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same, the first request going upstream itself
        location /abmt/ {
            singleflight sf;
            singleflight_lone direct;
            mirror /mirror_slow;
            proxy_pass http://%%ORIGIN%%;
        }

        # a lone response straight from its fetch, which reads on for
        # the cache once its client left
        location /abd/ {
            singleflight sf;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /mirror_slow {
            internal;
            set $args "delay=1500";
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

sub waiters_ok {
    my ($n, $what) = @_;
    my ($ok, $zone) = $t->wait_waiters($n);
    ok($ok, "$what: waiters is $n") or diag(explain($zone));
    return $zone;
}

# Every client of a flight is gone: its fetch stops (the origin sees its
# request aborted), counted once in abandoned ($s0: the stats before).
sub fetch_stopped_ok {
    my ($s0, $what) = @_;
    ok($t->wait_for(sub { ($t->origin_hits->{aborted} // 0) == 1 }, timeout => 5,
                    what => 'the fetch stopped'),
       "$what: the origin request was aborted");
    my $s1 = $t->zone_stats;
    is($s1->{abandoned} - $s0->{abandoned}, 1, "$what: stats abandoned + 1");
    $t->zone_baseline_ok("$what: zone back to baseline");
}

# Starts the leader of URI and waits for it at the origin, then N followers
# and waits until they all wait.
sub flight {
    my ($uri, $n, $what) = @_;
    my $leader = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
    my @f = map { $t->start_request('GET', $uri) } 1 .. $n;
    waiters_ok($n, "$what, all joined");
    return ($leader, @f);
}

# ------------------------------------------------------------ follower abort

my $s0 = $t->zone_stats;
my $uri = '/ab/f?delay=1500&size=2000';
my ($leader, @f) = flight($uri, 20, 'follower abort');

# 5 close normally (FIN), 5 with RST
$t->abort_request($_) for @f[0 .. 4];
$t->abort_request($_, rst => 1) for @f[5 .. 9];

my $zone = waiters_ok(10, 'follower abort, 10 gone');
is($zone->{in_flight}, 1, 'follower abort: the flight is still in the air');

my $lr = $t->finish_request($leader);
my @rest = map { $t->finish_request($_) } @f[10 .. 19];
my $body = SFTest::origin_body(1, $uri, 2000);

ok($lr->{status} == 200 && $lr->{complete} && $lr->{body} eq $body,
   'follower abort: the leader got its complete response');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @rest),
   10, "follower abort: the 10 remaining followers got the leader's response");
is($t->origin_uri_hits($uri), 1, 'follower abort: 1 origin request');
is(($t->origin_hits->{aborted} // 0), 0, 'follower abort: no upstream request was aborted');
is_deeply($t->sf_outcomes($uri, 21),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => 10, 'FOLLOWER:499' => 10 },
          'follower abort: logged LEADER:200, 10 FOLLOWER:200, 10 FOLLOWER:499');

my $s1 = $t->zone_stats;
is($s1->{followers} - $s0->{followers}, 20, 'follower abort: stats followers + 20');
is($s1->{served} - $s0->{served}, 10, 'follower abort: stats served + 10');
is($s1->{errors} - $s0->{errors}, 0, 'follower abort: stats errors + 0');
$t->zone_baseline_ok('follower abort: zone back to baseline');

# ------------------------------------------------------------ leader abort

# The leader's client goes away while the origin is still thinking: the
# fetch goes on, every follower gets its response, one origin request.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/l?delay=1000&size=2000';
($leader, @f) = flight($uri, 20, 'leader abort');

$t->abort_request($leader);

my @res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(1, $uri, 2000);

is($t->origin_uri_hits($uri), 1, 'leader abort: 1 origin request');
is(($t->origin_hits->{aborted} // 0), 0, 'leader abort: the fetch was not aborted');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, "leader abort: all 20 followers got the one response");
is_deeply($t->sf_outcomes($uri, 21),
          { 'LEADER:499' => 1, 'FOLLOWER:200' => 20 },
          'leader abort: logged LEADER:499, 20 FOLLOWER:200');

$s1 = $t->zone_stats;
is($s1->{promotions} - $s0->{promotions}, 0, 'leader abort: stats promotions + 0');
is($s1->{retries} - $s0->{retries}, 0, 'leader abort: stats retries + 0');
is($s1->{served} - $s0->{served}, 20, 'leader abort: stats served + 20');
$t->zone_baseline_ok('leader abort: zone back to baseline');

# ------------------------------------------------------------ two aborts

# The leader's client goes away after 0.1 s, then a follower's too: the
# others still get the one response (it used to cost them a 502).

$t->origin_reset;
$uri = '/ab/two?delay=1000&size=2000';
($leader, @f) = flight($uri, 21, 'two aborts');

Time::HiRes::sleep(0.1);    # the order of the aborts, not a synchronisation
$t->abort_request($leader);
$t->abort_request($f[0], rst => 1);

@res = map { $t->finish_request($_) } @f[1 .. 20];
$body = SFTest::origin_body(1, $uri, 2000);

is($t->origin_uri_hits($uri), 1, 'two aborts: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, 'two aborts: the 20 other followers got the one response');
$t->zone_baseline_ok('two aborts: zone back to baseline');

# ------------------------------------------------------------ leader abort, then a retry

# The leader's client goes away, then the origin resets the fetch: the
# leader's request, which has left the flight, makes the fetch again for
# the followers (it used to crash its worker: every follower got 502).

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/retry?delay=500&size=2000&fail=reset&fail_first=1';
($leader, @f) = flight($uri, 10, 'leader abort, retry');

$t->abort_request($leader, rst => 1);
$t->wait_for(sub { $t->log_count(qr/client prematurely closed connection.*ab\/retry/) >= 1 },
             what => "nginx saw the leader's client go");

@res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(2, $uri, 2000);

is($t->origin_uri_hits($uri), 2, 'leader abort, retry: 2 origin requests');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   10, 'leader abort, retry: the 10 followers got the second response');
$s1 = $t->zone_stats;
is($s1->{retries} - $s0->{retries}, 1, 'leader abort, retry: stats retries + 1');
is($s1->{dead_leaders} - $s0->{dead_leaders}, 0, 'leader abort, retry: no dead leader');
$t->zone_baseline_ok('leader abort, retry: zone back to baseline');

# ------------------------------------------------------------ leader abort mid-body

# The leader's client goes away after the header, while the origin is still
# sending the body slowly: the followers, who have been getting the body as
# it came, get all of it.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/m?fail=slowbody&pieces=4&delay=300&size=200000';
($leader, @f) = flight($uri, 20, 'leader abort mid-body');

ok($t->wait_for(sub { $t->poll_request($leader); defined $leader->{res}{status} },
                what => "the leader's header"), 'leader abort mid-body: the leader got the header');
ok(!$leader->{res}{complete}, 'leader abort mid-body: ... but not the whole body yet');
$t->abort_request($leader, rst => 1);

@res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(1, $uri, 200000);

is($t->origin_uri_hits($uri), 1, 'leader abort mid-body: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, 'leader abort mid-body: all 20 followers got the complete body');
my $o = $t->sf_outcomes($uri, 21);
is($o->{'FOLLOWER:200'} // 0, 20, 'leader abort mid-body: logged 20 FOLLOWER:200')
    or diag(explain($o));
$t->zone_baseline_ok('leader abort mid-body: zone back to baseline');

# ------------------------------------------------------------ everybody gone

# When every client is gone, the fetch stops: the origin sees its request
# go away, as it would without the module.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/gone?delay=3000&size=2000';
($leader, @f) = flight($uri, 5, 'everybody gone');

$t->abort_request($_) for $leader, @f;
fetch_stopped_ok($s0, 'everybody gone');

# a request for the key afterwards starts afresh
my $r = $t->get($uri);
is($r->{status}, 200, 'everybody gone: the key works again at once');
is($t->origin_uri_hits($uri), 2, 'everybody gone: with a fetch of its own');

# ------------------------------------------------------------ everybody gone mid-body

# The same once the body has begun: the origin sends the header and the
# first 100,000 bytes, then nothing (its connection stays open).  Every
# client goes; the fetch, idle between two pieces of its body, is told and
# stops, without waiting for a next piece or proxy_read_timeout.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/gone-mid?delay=500&fail=stall&cut=100000&size=400000';
($leader, @f) = flight($uri, 4, 'everybody gone mid-body');

ok($t->wait_for(sub {
        for my $q ($leader, @f) { $t->poll_request($q) }
        !grep { !defined $_->{res}{status} } $leader, @f
    }, what => 'every client has the header'),
   'everybody gone mid-body: every client got the header');
$t->abort_request($_) for $leader, @f;
fetch_stopped_ok($s0, 'everybody gone mid-body');

# ------------------------------------------------------------ a lone leader gone mid-body

# A lone leader's response goes straight to it (nobody else reads it);
# its client goes while the origin sends nothing more: its fetch stops
# then, as nginx stops the upstream request of a client gone, and does not
# wait for proxy_read_timeout (60 s) with the origin's connection and the
# client's open.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/lone-mid?fail=stall&cut=5000&size=100000';
$leader = $t->start_request('GET', $uri);
ok($t->wait_for(sub { $t->poll_request($leader); defined $leader->{res}{status} },
                what => 'the header'), 'lone leader gone mid-body: the header came');
$t->abort_request($leader);
fetch_stopped_ok($s0, 'lone leader gone mid-body');

# ------------------------------------------------------------ proxy_ignore_client_abort

# With proxy_ignore_client_abort on, the fetch goes on to its end even
# when everybody is gone, as nginx's upstream request would.

$t->origin_reset;
$uri = '/ab-ignore/x?delay=1000&size=2000';
($leader, @f) = flight($uri, 5, 'ignore client abort');

$t->abort_request($_) for $leader, @f;

ok($t->wait_for(sub { my $z = $t->zone_stats; $z->{readers} == 0 && $z->{in_flight} == 0 },
                timeout => 5, what => 'the flight over'),
   'ignore client abort: the flight ended');
is(($t->origin_hits->{aborted} // 0), 0, 'ignore client abort: the origin request was not aborted');
$t->zone_baseline_ok('ignore client abort: zone back to baseline');

# With proxy_ignore_client_abort on, a client that closed its side of the
# connection after its request (shutdown(SHUT_WR), what "nc -N" does) is
# still reading, and gets the whole response, as without the module:
# followers, the leader, and a follower that closes its side mid-body.
# Without it, each is gone (499), as without the module.

sub half_close {
    my ($h) = @_;
    $t->wait_for(sub { $t->poll_request($h); defined $h->{t_sent} && !length $h->{wbuf} },
                 what => 'the request sent');
    shutdown($h->{sock}, 1) if $h->{sock};
    return $h;
}

sub half_closed { half_close($t->start_request('GET', $_[0])) }

# a complete 200 with the body of the origin's response it names
sub whole {
    my ($r, $uri, $size) = @_;
    return ($r->{status} // 0) == 200 && $r->{complete}
        && $r->{body} eq SFTest::origin_body($r->{headers}{'x-hit'} // 0, $uri, $size);
}

$t->origin_reset;
$s0 = $t->zone_stats;
for my $case ([ 'ab-ignore-plain', 'module off' ], [ 'ab-ignore', 'followers' ]) {
    my ($loc, $what) = @$case;
    $uri = "/$loc/half?delay=800&size=3000";
    my $lead = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the leader at the origin');
    my @half = map { half_closed($uri) } 1 .. 3;
    waiters_ok(3, "half-closed $what, all joined") if $loc eq 'ab-ignore';
    my @res = map { $t->finish_request($_) } $lead, @half;
    is(scalar(grep { whole($_, $uri, 3000) } @res[1 .. 3]), 3,
       "proxy_ignore_client_abort, half-closed $what: the whole response")
        or diag(explain([ map { { status => $_->{status}, error => $_->{error} } } @res ]));
    is($t->origin_uri_hits($uri), $loc eq 'ab-ignore' ? 1 : 4,
       "proxy_ignore_client_abort, half-closed $what: " . ($loc eq 'ab-ignore' ? '1 origin request' : '4 origin requests'));
}

# the leader (its request hosts the fetch) half-closed
$uri = '/ab-ignore/half-leader?delay=800&size=3000';
my $hl = half_closed($uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the half-closed leader at the origin');
my @hf = map { $t->start_request('GET', $uri) } 1 .. 2;
my @hres = map { $t->finish_request($_) } $hl, @hf;
is(scalar(grep { whole($_, $uri, 3000) } @hres), 3,
   'proxy_ignore_client_abort, half-closed leader: it and its followers get the whole response');
is($t->origin_uri_hits($uri), 1, 'proxy_ignore_client_abort, half-closed leader: 1 origin request');

# a follower that closes its side mid-body, reading on
$uri = '/ab-ignore/half-mid?delay=300&size=2000000&pace=65536:50';
my $ml = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the leader at the origin');
my $mf = $t->start_request('GET', $uri);
waiters_ok(1, 'half-closed mid-body, joined');
ok($t->wait_for(sub { $t->poll_request($mf); $mf->{state} ne 'done' && length($mf->{res}{body} // '') > 200000 },
                what => 'the follower mid-body'), 'half-closed mid-body: the follower mid-body');
half_close($mf);
my ($mlr, $mfr) = map { $t->finish_request($_) } $ml, $mf;
ok(whole($mfr, $uri, 2000000), 'proxy_ignore_client_abort, a follower half-closed mid-body: the whole response')
    or diag(explain({ status => $mfr->{status}, error => $mfr->{error}, complete => $mfr->{complete},
                      length => length($mfr->{body} // '') }));

# without it: a half-closed follower is gone, as without the module
$uri = '/ab/half?delay=800&size=3000';
my $nl = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the leader at the origin');
my $nf = half_closed($uri);
ok($t->wait_for(sub { ($t->read_file('access.log') // '') =~ m{"GET /ab/half\S* HTTP/1.1" 499 } },
                what => 'the 499'),
   'half-closed follower without proxy_ignore_client_abort: 499, as without the module');
$t->finish_request($_) for $nl, $nf;
$t->zone_baseline_ok('half-closed clients: zone back to baseline');

# ------------------------------------------------------------ HTTP/2 leader abort

# An HTTP/2 leader whose connection goes away (its curl killed) while the
# origin thinks, HTTP/2 followers on the same port: the fetch goes on for
# them, one origin request, the leader logged 499.

SKIP: {
    my $curl = `curl -V 2>/dev/null`;
    skip 'curl with HTTP/2 not found', 4 unless $curl =~ /\bHTTP2\b/;

    $t->origin_reset;
    $s0 = $t->zone_stats;
    $uri = '/ab/h2?delay=1500&size=3000';
    my $url = 'http://127.0.0.1:' . $t->port(1) . $uri;
    my $h2 = sub {
        my ($out) = @_;
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            open(STDOUT, '>', $out) or POSIX::_exit(1);
            open(STDERR, '>', '/dev/null');
            { exec('curl', '-s', '--http2-prior-knowledge', '--max-time', '10', '-o', "$out.body",
                   '-w', '%{http_code} %{http_version}', $url) }
            POSIX::_exit(127);
        }
        return $pid;
    };

    my $lead = $h2->($t->path('h2-leader'));
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'HTTP/2 leader at the origin');
    my @pids = map { $h2->($t->path("h2-f$_")) } 1 .. 5;
    waiters_ok(5, 'HTTP/2 leader abort, all joined');

    kill 'KILL', $lead;
    waitpid($lead, 0);
    waitpid($_, 0) for @pids;

    $body = SFTest::origin_body(1, $uri, 3000);
    my $good = grep {
        $t->read_file("h2-f$_") eq '200 2' && $t->read_file("h2-f$_.body") eq $body
    } 1 .. 5;
    is($good, 5, 'HTTP/2 leader abort: 5 HTTP/2 followers got the one response');
    is($t->origin_uri_hits($uri), 1, 'HTTP/2 leader abort: 1 origin request');
    is_deeply($t->sf_outcomes($uri, 6), { 'LEADER:499' => 1, 'FOLLOWER:200' => 5 },
              'HTTP/2 leader abort: logged LEADER:499, 5 FOLLOWER:200');
    $t->zone_baseline_ok('HTTP/2 leader abort: zone back to baseline');
}

# ------------------------------------------------------------ HTTP/2 leader cancels its stream

# What a browser does with a request it no longer wants: RST_STREAM
# (CANCEL) on the leader's stream, its connection staying open.  The same:
# the fetch goes on for the followers, one origin request.

{
    $t->origin_reset;
    $uri = '/ab/rst?delay=1500&size=3000';
    my $port = $t->port(1);
    my $c = h2_get($port, $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'HTTP/2 leader at the origin');
    my @f2 = map { h2_get($port, $uri) } 1 .. 5;
    waiters_ok(5, 'HTTP/2 stream reset, all joined');

    # RST_STREAM, stream 1, error code 8 (CANCEL)
    syswrite($c, pack('CnCCNN', 0, 4, 3, 0, 1, 8));

    $body = SFTest::origin_body(1, $uri, 3000);
    my $good = grep { my ($st, $b) = h2_read($_); $st eq '200' && $b eq $body } @f2;
    is($good, 5, 'HTTP/2 stream reset: 5 HTTP/2 followers got the one response');
    is($t->origin_uri_hits($uri), 1, 'HTTP/2 stream reset: 1 origin request');
    is_deeply($t->sf_outcomes($uri, 6), { 'LEADER:499' => 1, 'FOLLOWER:200' => 5 },
              'HTTP/2 stream reset: logged LEADER:499, 5 FOLLOWER:200');
    close $c;
    $t->zone_baseline_ok('HTTP/2 stream reset: zone back to baseline');
}

# The leader's stream reset, then its whole connection closed, while its
# mirror runs on: HTTP/2 marks the stream's connection failed a second
# time.  The mirror's end after that is not the end of the response the
# followers read (its fetch, or its own upstream request).
for my $where ('abm', 'abmt') {
    $t->origin_reset;
    $uri = "/$where/rstclose?size=60000&delay=300&pace=20000:800";
    my $port = $t->port(1);
    my $off = $t->log_offset;
    my $headers = sub { $t->stats('/stats')->{zones}{sf}{flight_header_seconds}{count} };
    my $h0 = $headers->();
    my $c = h2_get($port, $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'HTTP/2 leader at the origin');
    my @f = map { h2_get($port, $uri) } 1 .. 3;
    waiters_ok(3, "$where reset and closed, all joined");
    $t->wait_for(sub { $headers->() > $h0 }, what => 'the response header');
    syswrite($c, pack('CnCCNN', 0, 4, 3, 0, 1, 8));    # RST_STREAM, CANCEL
    $t->wait_for(sub { $t->error_log_since($off) =~ /client canceled stream 1/ },
                 what => 'the stream reset');
    close $c;
    my @res = map { [ h2_read($_, 20) ] } @f;
    is(scalar(grep { $_->[0] eq '200' && length($_->[1]) == 60000 } @res), 3,
       "$where reset and closed: the followers get the whole body past the mirror's end")
        or diag(join ' ', map { "$_->[0]:" . length($_->[1]) } @res);
    is($t->origin_uri_hits($uri), 1, "$where reset and closed: 1 origin request");
}

# A lone leader whose response comes straight from its fetch (nobody else
# reads it) resets its stream; the fetch reads on for the cache, as nginx
# does.  Nothing more is written to that stream.
{
    $uri = '/abd/lone?size=200000&delay=100&pace=40000:400';
    my $off = $t->log_offset;
    my $unstored = sub { $t->stats('/stats')->{zones}{sf}{unstored_total} // 0 };
    my $u0 = $unstored->();
    my $c = h2_get($t->port(1), $uri);
    $t->wait_for(sub { $unstored->() > $u0 }, what => 'the response straight to its leader');
    syswrite($c, pack('CnCCNN', 0, 4, 3, 0, 1, 8));    # RST_STREAM, CANCEL
    ok($t->wait_for(sub { $t->stats('/stats')->{zones}{sf}{in_flight} == 0
                          && `find ${\ $t->path('cache')} -type f` ne '' },
                    what => 'the response cached'),
       'lone, stream reset: its fetch read on for the cache');
    unlike($t->error_log_since($off), qr/output on closed stream/,
           'lone, stream reset: nothing written to the closed stream');
    close $c;
}

# A minimal HTTP/2 client over cleartext (prior knowledge), on Perl's core
# modules: the preface, an empty SETTINGS, one GET on stream 1 whose
# header block uses HPACK literals without Huffman coding.
sub h2_get {
    my ($port, $path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die "connect: $!";
    my $hpack = pack('CC', 0x82, 0x86)                              # :method GET, :scheme http
        . pack('CC', 0x04, length $path) . $path                    # :path
        . pack('CC', 0x01, length "127.0.0.1:$port") . "127.0.0.1:$port";    # :authority
    syswrite($s, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                 . pack('CnCCN', 0, 0, 4, 0, 0)                   # SETTINGS
                 . pack('CnCCN', 0, length $hpack, 1, 0x05, 1)    # HEADERS, END_STREAM|END_HEADERS
                 . $hpack);
    return $s;
}

# Reads frames until stream 1 ends: (":status", body); the status from
# nginx's HPACK: an indexed 200 (0x88), or the literal digits.
sub h2_read {
    my ($s, $timeout) = @_;
    my ($status, $body, $buf) = ('', '', '');
    my $deadline = time + ($timeout // 10);
    while (time < $deadline) {
        while (length $buf >= 9) {
            my ($hi, $lo, $type, $flags, $sid) = unpack('CnCCN', $buf);
            my $len = ($hi << 16) | $lo;
            last if length $buf < 9 + $len;
            my $payload = substr($buf, 9, $len);
            substr($buf, 0, 9 + $len, '');
            if ($type == 4 && !($flags & 1)) {
                syswrite($s, pack('CnCCN', 0, 0, 4, 1, 0));      # SETTINGS ACK
            }
            next unless ($sid & 0x7fffffff) == 1;
            if ($type == 1) {
                $status = '200' if substr($payload, 0, 1) eq "\x88";
                $status = $1 if !$status && $payload =~ /^[\x00-\x0f]?.?\x03(\d{3})/s;
            } elsif ($type == 0) {
                $body .= $payload;
            }
            return ($status, $body) if $flags & 1;    # END_STREAM
        }
        my $n = sysread($s, $buf, 65536, length $buf);
        last unless $n;
    }
    return ($status, $body);
}

done_testing;
