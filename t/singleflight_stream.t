#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_stream: the body goes to every reader as it arrives, at the
# origin's pace, whatever the other clients do.
#
#   * followers get the first bytes of a body long before its end;
#   * a request that arrives while the body streams joins and gets the
#     whole body, from its first byte (a body past singleflight_memory is
#     read back from its temporary file);
#   * readers paced by limit_rate get each part of the body when their
#     rate allows, not when their parked timer goes off;
#   * a follower whose client reads nothing holds nobody else;
#   * a leader whose client reads nothing holds nobody either, with
#     proxy_buffering on and off, nor when send_timeout closes it;
#   * the same where the first request of a herd went its own way
#     (singleflight_lone direct, the default) and feeds the flight from
#     its own upstream response: the others get its bytes as they come,
#     and its client, stalled or timed out, holds nobody;
#   * when the origin breaks off mid-body, every reader that had some of it
#     sees its connection closed, none is handed a short body as complete,
#     and nobody hangs;
#   * the temporary file of a flight whose fetching worker is killed goes
#     once its readers are gone.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);
use File::Find qw(find);

use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:4m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;
    singleflight_memory 64k;

    server {
        # a small send buffer: a client that reads nothing stalls nginx soon
        listen 127.0.0.1:%%PORT%% sndbuf=32k;

        location /s/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /u/ {
            singleflight sf;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /lr/ {
            singleflight sf;
            limit_rate 40k;
            proxy_pass http://%%ORIGIN%%;
        }

        location /st/ {
            singleflight sf;
            send_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        # the default: a lone request goes its own way, and a herd's
        # first request feeds the flight from its own upstream response
        location /d/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_pass http://%%ORIGIN%%;
        }

        location /du/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /dst/ {
            singleflight sf;
            singleflight_lone direct;
            send_timeout 500ms;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# the kill -9 below
$t->allow_log(qr/exited on signal 9/);

# the files under the temporary path
sub temp_files {
    my @f;
    find(sub { push @f, $File::Find::name if -f }, $t->path('sf_temp'))
        if -d $t->path('sf_temp');
    return @f;
}

sub complete_bodies {
    my ($uri, $size, @res) = @_;
    return scalar grep {
        ($_->{status} // 0) == 200 && $_->{complete}
        && length($_->{body}) == $size
        && $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uri, $size)
    } @res;
}

# 4 MB in 8 pieces, 200 ms apart (1.8 s) from $path: one client with a
# small receive buffer (and nginx's send buffer small) reads nothing, the
# first request ($who "leader") or a follower; the others finish at the
# origin's pace, from $o{hits} origin requests (1), and the stalled client
# still gets all of it once it reads.  "wait": the 5 others wait for the
# header first; "outcomes": the access log's statuses.
sub stalled_case {
    my ($what, $path, $who, %o) = @_;
    my $bsize = 4_000_000;
    my $hits = $o{hits} // 1;

    $t->origin_reset;
    my $u = "$path?fail=slowbody&pieces=8&delay=200&size=$bsize";

    my ($stalled, @others);
    my $tstart = time;

    if ($who eq 'leader') {
        $stalled = $t->start_request('GET', $u, timeout => 30, rcvbuf => 65536);
        $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, what => 'the leader at the origin');
        @others = map { $t->start_request('GET', $u, timeout => 30) } 1 .. 5;
        $t->wait_waiters(5) if $o{wait};

    } else {
        my $l = $t->start_request('GET', $u, timeout => 30);
        $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, what => 'the leader at the origin');
        $stalled = $t->start_request('GET', $u, timeout => 30, rcvbuf => 65536);
        @others = ($l, map { $t->start_request('GET', $u, timeout => 30) } 1 .. 4);
    }

    # only the others are read
    $t->poll_all(\@others, timeout => 20);
    my $took = time - $tstart;

    is(complete_bodies($u, $bsize, map { $_->{res} } @others), 5,
       "$what: the 5 others got the whole body");
    cmp_ok($took, '<', 3.2, sprintf("$what: at the origin's pace (%.2f s for 1.8 s)", $took));
    is($t->origin_uri_hits($u), $hits, "$what: $hits origin request" . ($hits > 1 ? 's' : ''));

    # it was held: it has not all of it
    $t->poll_request($stalled);
    ok(!$stalled->{res}{complete}, "$what: the stalled client had not all of it");

    # and still gets all of it once it reads
    my $sr = $t->finish_request($stalled, timeout => 20);
    is(complete_bodies($u, $bsize, $sr), 1, "$what: the stalled client, reading at last, too")
        or diag(sprintf('status %s, %d bytes, complete %s, error %s',
                        $sr->{status} // 'none', length $sr->{body},
                        $sr->{complete} // 0, $sr->{error} // 'none'));

    is_deeply($t->sf_outcomes($u, 6), $o{outcomes}, "$what: \$singleflight_status")
        if $o{outcomes};
}

# A first client that reads nothing (a small receive buffer) while 5
# others read $path&size=4000000: the 5 get the whole body from 1 origin
# request, the first client is timed out ($timed_out in the log) and
# closed with part of it; with $outcomes, the access log's statuses.
sub send_timeout_case {
    my ($what, $path, $timed_out, $outcomes) = @_;
    my $bsize = 4_000_000;
    $t->origin_reset;
    my $u = "$path&size=$bsize";
    my $off = $t->log_offset;
    my $stalled = $t->start_request('GET', $u, timeout => 30, rcvbuf => 65536);
    $t->wait_for(sub { $t->origin_uri_hits($u) == 1 }, what => 'the first request at the origin');
    my @others = map { $t->start_request('GET', $u, timeout => 30) } 1 .. 5;
    $t->wait_waiters(5);
    $t->poll_all(\@others, timeout => 20);

    is(complete_bodies($u, $bsize, map { $_->{res} } @others), 5,
       "$what: the 5 others got the whole body");
    is($t->origin_uri_hits($u), 1, "$what: 1 origin request");
    ok($t->wait_for(sub { $t->log_count($timed_out, $off) > 0 }, timeout => 5,
                    what => 'the timeout'),
       "$what: the first client timed out");
    my $sr = $t->finish_request($stalled, timeout => 10);
    ok(!$sr->{complete} && length($sr->{body}) < $bsize,
       "$what: the first client was closed with part of the body");
    is_deeply($t->sf_outcomes($u, 6), $outcomes, "$what: \$singleflight_status")
        if $outcomes;
}

# ------------------------------------------------------------ first bytes

# 1 MB in 10 pieces, 250 ms apart (2.75 s in all): the followers have bytes
# of it while the origin is still sending

my $s0 = $t->zone_stats;
my $size = 1_000_000;
my $uri = "/s/first?fail=slowbody&pieces=10&delay=250&size=$size";

my $leader = $t->start_request('GET', $uri, timeout => 20);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the leader at the origin');
my @f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 10;
$t->wait_waiters(10);

my $t0 = time;
ok($t->wait_for(sub {
    $t->poll_request($_) for $leader, @f;
    !grep { length($_->{res}{body}) == 0 } $leader, @f;
}, timeout => 10, what => 'the first bytes'), 'first bytes: every client has some of the body');
my $first = time - $t0;

my @partial = grep { !$_->{res}{complete} } $leader, @f;
is(scalar @partial, 11, sprintf('first bytes: ... while it is still coming (after %.2f s)', $first));

my @res = map { $t->finish_request($_) } $leader, @f;
is(complete_bodies($uri, $size, @res), 11, 'first bytes: 11 complete bodies of the one response');
is($t->origin_uri_hits($uri), 1, 'first bytes: 1 origin request');

my $s1 = $t->zone_stats;
is($s1->{spilled} - $s0->{spilled}, 1, 'first bytes: the body past 64k went to a file');
$t->zone_baseline_ok('first bytes: zone back to baseline');
is(scalar(temp_files()), 0, 'first bytes: its file is gone');

# ------------------------------------------------------------ late join

# a request that arrives in the middle of the body joins, from byte 0

$t->origin_reset;
$uri = "/s/late?fail=slowbody&pieces=8&delay=250&size=$size";
$leader = $t->start_request('GET', $uri, timeout => 20);
ok($t->wait_for(sub { $t->poll_request($leader); length($leader->{res}{body}) > $size / 3 },
                timeout => 10, what => 'a third of the body'),
   'late join: the leader has a third of the body');
my $late = $t->start_request('GET', $uri, timeout => 20);
@res = map { $t->finish_request($_) } $leader, $late;

is(complete_bodies($uri, $size, @res), 2, 'late join: both got the whole body');
is_deeply(SFTest::tally($t->sf_statuses($uri, 2)), { LEADER => 1, FOLLOWER => 1 },
          'late join: the late request followed');
is($t->origin_uri_hits($uri), 1, 'late join: 1 origin request');

# The same by default (singleflight_lone direct): nobody waited for the
# first request's header, so its response is not stored and the late
# request starts a flight of its own (docs/directives.md).  It goes
# upstream with its own request, not a fetch, as the first one did, and
# one more arriving while it waits for its header follows it: 2 origin
# requests for 3 clients.

$t->origin_reset;
$uri = "/d/late?fail=slowbody&pieces=8&delay=250&size=$size";
my $loff = $t->log_offset;
$leader = $t->start_request('GET', $uri, timeout => 20);
ok($t->wait_for(sub { $t->poll_request($leader); length($leader->{res}{body}) > $size / 3 },
                timeout => 10, what => 'a third of the body'),
   'late join, default: the first request has a third of the body');
$late = $t->start_request('GET', $uri, timeout => 20);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 2 }, what => 'the late request at the origin');
my $later = $t->start_request('GET', $uri, timeout => 20);
@res = map { $t->finish_request($_) } $leader, $late, $later;
is(complete_bodies($uri, $size, @res[0, 1]), 2, 'late join, default: the first two got the whole body');
is($res[2]{body}, $res[1]{body}, 'late join, default: the third the second one\'s');
is_deeply(SFTest::tally($t->sf_statuses($uri, 3)), { DIRECT => 1, LEADER => 1, FOLLOWER => 1 },
          'late join, default: the late request led, the next one followed it');
like($t->error_log_since($loff), qr/singleflight leader fetches flight \d+ itself/,
     'late join, default: with its own request, not a fetch');
is($t->origin_uri_hits($uri), 2, 'late join, default: 2 origin requests');

# ------------------------------------------------------------ limit_rate

# readers paced by limit_rate keep up with a body that comes in 4 pieces,
# 250 ms apart: each sends a piece, waits for limit_rate's timer, and has
# caught up with the flight when the next piece comes.  That piece goes
# out when the timer says so; before, the reader waited for its parked
# timer (60 s) instead, and no client got the whole body in time.

$t->origin_reset;
$uri = "/lr/r?fail=slowbody&pieces=4&delay=250&size=40000";
$leader = $t->start_request('GET', $uri, timeout => 15);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the leader at the origin');
@f = map { $t->start_request('GET', $uri, timeout => 15) } 1 .. 5;
@res = map { $t->finish_request($_) } $leader, @f;
is(complete_bodies($uri, 40_000, @res), 6, 'limit_rate: 6 complete bodies, each at its rate');
is($t->origin_uri_hits($uri), 1, 'limit_rate: 1 origin request');

# ------------------------------------------------------------ stalled clients

# a leader or a follower reads nothing; the others finish at the origin's
# pace (stalled_case())

for my $case (['/s/', 'follower', 'buffered'], ['/u/', 'follower', 'unbuffered'],
              ['/s/', 'leader', 'buffered'], ['/u/', 'leader', 'unbuffered'])
{
    my ($prefix, $who, $mode) = @$case;
    stalled_case("stalled $who, $mode", "${prefix}stall-$who", $who);
}

$t->zone_baseline_ok('stalled clients: zone back to baseline');

# ------------------------------------------------------------ send_timeout

# a leader whose client reads nothing until send_timeout (1 s) closes it,
# while the body is still coming: the fetch goes on for the followers

send_timeout_case('send_timeout', '/st/leader?fail=slowbody&pieces=8&delay=300',
                  qr/client timed out/);

$t->zone_baseline_ok('send_timeout: zone back to baseline');

# ------------------------------------------------------------ the first request on its own way

# singleflight_lone direct: the first request goes upstream itself, the
# others make a flight that waits for its header, and at its header it
# feeds that flight from its own upstream response (the tee), not from a
# fetch.  The others get its bytes while the origin still sends them: the
# origin sends half the body at once and the rest 1.5 s later, and every
# follower has bytes well before that.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = "/d/first?delay=200&pace=500000:1500&size=$size";
my $firstreq = $t->start_request('GET', $uri, timeout => 20);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the first request at the origin');
my $tfirst = time;
@f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 5;
$t->wait_waiters(5);
ok($t->wait_for(sub {
    $t->poll_request($_) for @f;
    !grep { length($_->{res}{body}) == 0 } @f;
}, timeout => 10, what => 'the first bytes'), 'its own way, first bytes: every follower has some of the body');
my $tbytes = time - $tfirst;
is(scalar(grep { !$_->{res}{complete} } @f), 5, 'its own way, first bytes: ... while it is still coming');
cmp_ok($tbytes, '<', 1.3,
       sprintf('its own way, first bytes: ... before the origin sends the rest (%.2f s, the rest at 1.7 s)', $tbytes));
@res = map { $t->finish_request($_) } $firstreq, @f;
is(complete_bodies($uri, $size, @res), 6, 'its own way, first bytes: 6 complete bodies of the one response');
is($t->origin_uri_hits($uri), 1, 'its own way, first bytes: 1 origin request');
is_deeply($t->sf_outcomes($uri, 6), { 'LEADER:200' => 1, 'FOLLOWER:200' => 5 },
          'its own way, first bytes: the first request LEADER, the others FOLLOWER');
is($t->zone_stats->{spilled} - $s0->{spilled}, 1, 'its own way, first bytes: the body past 64k went to a file');
$t->zone_baseline_ok('its own way, first bytes: zone back to baseline');
ok($t->wait_for(sub { scalar(temp_files()) == 0 }, timeout => 5, what => 'no file'),
   'its own way, first bytes: its file is gone');

# Its client reads nothing: the others finish at the origin's pace.  With
# proxy_buffering on the first request's event pipe reads on into
# nginx's own temporary file, and feeds the flight as it reads.  With
# proxy_buffering off it cannot feed a flight: the flight is let go at
# its header and a follower fetches it (one origin request more), and the
# first client holds nobody either way.

for my $case (['/d/', 'buffered', 1], ['/du/', 'unbuffered', 2]) {
    my ($prefix, $mode, $hits) = @$case;
    # unbuffered, one of the others took the flight over (PROMOTED)
    stalled_case("its own way, stalled first client, $mode", "${prefix}stall", 'leader',
                 hits => $hits, wait => 1,
                 outcomes => $hits == 1
                     ? { 'LEADER:200' => 1, 'FOLLOWER:200' => 5 }
                     : { 'LEADER:200' => 1, 'PROMOTED:200' => 1, 'FOLLOWER:200' => 4 });
}

$t->zone_baseline_ok('its own way, stalled first client: zone back to baseline');

# Its client reads nothing until send_timeout (500 ms) closes it, while
# the body is still coming: the origin's response is read on for the
# others.  The origin pauses 700 ms between its pieces of 1 MB: each piece
# it reads would put the timer off again, so the client is timed out in
# a pause, mid-body.

send_timeout_case('its own way, send_timeout', '/dst/first?delay=300&pace=1000000:700',
                  qr/client of flight \d+ timed out, its upstream response is read on/,
                  { 'LEADER:200' => 1, 'FOLLOWER:200' => 5 });

$t->zone_baseline_ok('its own way, send_timeout: zone back to baseline');

# ------------------------------------------------------------ origin breaks off

# the origin sends the header and half the body, then closes (every time):
# every reader that had some of it sees its connection closed; one that had
# nothing yet tries a flight again (singleflight_promote_tries 1), then
# gets a 502; nobody is handed a short body as complete, nobody hangs

$t->origin_reset;
$uri = "/s/cut?fail=midbody&delay=300&size=200000";
my $tc = time;
@res = @{ $t->herd(n => 10, path => $uri, timeout => 10) };
is(scalar(grep { !$_->{complete} && length($_->{body}) < 200000
                 && ($_->{status} // 0) == 200 } @res)
   + scalar(grep { ($_->{status} // 0) == 502 && $_->{complete} } @res), 10,
   'origin breaks off: each client cut short or answered 502, none given a short body');
cmp_ok(time - $tc, '<', 3, 'origin breaks off: nobody waited for more');
cmp_ok($t->origin_uri_hits($uri), '<=', 2,
       'origin breaks off: at most 1 + singleflight_promote_tries origin requests');
$t->zone_baseline_ok('origin breaks off: zone back to baseline');

# ------------------------------------------------------------ kill -9

# a body spilled to a file; the fetching worker is killed mid-body: its
# readers elsewhere are closed, and the file goes

$t->origin_reset;
$uri = "/s/kill?fail=slowbody&pieces=10&delay=300&size=$size";
my $off = $t->log_offset;
$leader = $t->start_request('GET', $uri, timeout => 20);
my ($lpid) = $t->wait_leader($off);
@f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 20;
$t->wait_waiters(20);

# the file named in the zone (its debug line comes after): a worker
# killed between making a file and naming it leaves it behind, a window
# this test would otherwise hit under a slow build (nginx under ASan)
ok($t->wait_for(sub { $t->poll_request($_) for @f;
                      scalar(temp_files()) == 1
                      && $t->error_log_since($off) =~ /singleflight flight \d+ spills to/ },
                timeout => 10, what => 'the temporary file'),
   'kill -9: the body went to a temporary file');
ok($t->kill_worker($lpid), "kill -9: the leader's worker $lpid killed");

$t->poll_all(\@f, timeout => 10);
is(scalar(grep { $_->{state} eq 'done' } @f), 20, 'kill -9: every follower was answered or closed');
is(scalar(grep { $_->{res}{complete} && length($_->{res}{body}) == $size } @f), 0,
   'kill -9: none was handed a short body as complete');
ok($t->wait_for(sub { scalar(temp_files()) == 0 }, timeout => 5, what => 'no file'),
   'kill -9: the temporary file is gone')
    or diag(join "\n", temp_files());
ok($t->worker_respawned($lpid), 'kill -9: the worker was respawned');
$t->zone_baseline_ok('kill -9: zone back to baseline');

done_testing;
