#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Dead leader mid-body: the worker process fetching a flight dies (kill -9)
# after its readers in the other worker have some of the body.  Without
# the module each of their requests would have got the whole response, so
# by default (singleflight_promote dead, singleflight_resume on) one of
# them asks the origin for the rest of a resumable response (a strong
# validator and a length): "Range: bytes=N-" with "If-Range", N being what
# the dead worker had published, and every reader of the other worker gets
# the whole body, byte for byte.  The rest goes on in the zone's memory or
# in the temporary file the dead worker wrote, opened again by its name;
# readers still far behind (limit_rate) ask for it once they catch up, and
# readers over HTTP/2 adopt it as those over HTTP/1.1 do.  A response
# with a weak validator, or without a length, is asked for again whole, and
# the rest taken from it once its first bytes are found to be those the
# dead worker published.
#
# So too by default (singleflight_lone direct), where the first request
# goes upstream on its own way and, at its header, feeds the flight of
# those that came meanwhile: its worker killed mid-body, the readers of
# the other worker resume as from a dead fetch.
#
# The same herd and kill without the module (a location without it), over
# HTTP/1.1 and over HTTP/2, gives the clients of the surviving worker the
# same whole body, with an origin request each.
#
# Without `dead`, or when the origin's answer is not the rest of the same
# representation (another ETag; for a response asked for again whole,
# other first bytes), the readers are cut as before: their connections
# close before the body's end, and nothing hangs.  Every case
# ends with the zone at its baseline.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT',
    singleflight_zone zone=sf:2m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;
    singleflight_memory 64k;

    server {
        # reuseport spreads the clients over both workers
        listen 127.0.0.1:%%PORT%% reuseport;
        listen 127.0.0.1:%%PORT_1%% reuseport http2;

        # X-Pid: the worker that answered each client
        add_header X-SF $singleflight_status always;
        add_header X-Pid $pid always;

        location /m/ {
            singleflight sf;
            singleflight_key $uri;
            proxy_pass http://%%ORIGIN%%;
        }

        # the default: a lone request goes its own way, and at its header
        # it feeds the flight of those that came meanwhile
        location /dm/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_lone direct;
            proxy_pass http://%%ORIGIN%%;
        }

        # readers far behind the fetch when its worker dies
        location /c11/ {
            singleflight sf;
            singleflight_key $uri;
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        location /slow/ {
            singleflight sf;
            singleflight_key $uri;
            limit_rate 15k;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same without the module: each client its own request
        location /off/ {
            proxy_set_header X-SF-Worker $pid;
            proxy_pass http://%%ORIGIN%%;
        }

        # without "dead": the readers are cut as before
        location /nd/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_promote error timeout;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
    log_singleflight => 1,
    main => "worker_rlimit_core 0;\nworking_directory %%TESTDIR%%;"));

$t->start;

my $N = 40;
my $RUN = 0;

# The flight of $path (header after 300 ms, then $cut bytes of the body,
# then nothing while the connection stays open) with $N followers; its
# leader's worker is killed once the readers of the other worker have
# the published body.  Returns the readers of the other worker, the
# results of all, and the flight, or nothing after skipping $skip tests.
# With $h2, every client asks over HTTP/2 (the port is part of a flight's
# identity: all on the HTTP/2 one).
sub killed_midbody {
    my ($what, $path, $cut, $skip, $h2) = @_;
    my @via = $h2 ? (h2 => 1, port => $t->port(1)) : ();
    my $off = $t->log_offset;
    my %f = (s0 => $t->zone_stats, off => $off);

    my $leader = $t->start_request('GET', $path, timeout => 20, @via);
    my ($lpid, $id) = $t->wait_leader($off);
    my @h = map { $t->start_request('GET', $path, timeout => 20, @via) } 1 .. $N;
    my %per = %{ $t->wait_followers($id, $N, $off) };
    my ($other) = grep { $_ != $lpid } keys %per;

    unless ($other) {
        $t->allow_log(qr/worker process $lpid exited on signal \d+/);
        $t->kill_worker($lpid);
        $t->poll_all([ $leader, @h ], timeout => 10);
        SKIP: { skip "$what: every follower landed in the leader's worker", $skip }
        return;
    }

    my $published = kill_published($what, $id, $lpid, $cut, $off, $leader, @h);

    return { %f, lpid => $lpid, id => $id, other => $other, n => $per{$other},
             h => \@h, leader => $leader, published => $published };
}

sub whole { SFTest::origin_body(0, $_[0], $_[1]) }

# The origin stalls after $cut bytes; flight $id's fetching worker $lpid
# published what its buffers passed on (at least half of them), and
# publishes no more: then it is killed (killed while it still publishes,
# it may die between a publication and its log line, and the readers
# resume from a byte the log never named), and the clients are polled
# to their end.  Returns what that worker published last.
sub kill_published {
    my ($what, $id, $lpid, $cut, $off, @clients) = @_;
    my ($published, $seen, $since) = (0, -1, time);
    ok($t->wait_for(sub {
        my $log = $t->error_log_since($off);
        $published = $1 while $log =~ /singleflight flight $id body (\d+) bytes/g;
        ($seen, $since) = ($published, time) if $published != $seen;
        $published >= $cut / 2 && time - $since >= 0.3;
    }, what => 'the body published'), "$what: the body published ($published bytes)");

    $t->allow_log(qr/worker process $lpid exited on signal \d+/);
    ok($t->kill_worker($lpid), "$what: worker $lpid killed");
    $t->poll_all(\@clients, timeout => 15);

    my $log = $t->error_log_since($off);
    $published = $1
        while $log =~ /$lpid#\d+: [^\n]*singleflight flight $id body (\d+) bytes/g;
    return $published;
}

sub end_case {
    my ($what, $f) = @_;
    $t->abort_request($_) for $f->{leader}, @{ $f->{h} };
    ok($t->worker_respawned($f->{lpid}), "$what: the master respawned the worker");
    $t->zone_baseline_ok("$what: zone back to baseline");
}

# ------------------------------------------------------------ resumed

# A response with a weak validator (or no length) is asked for again whole,
# and goes on where the dead worker stopped once its first bytes are
# found to be those published.
my $STRONG = 'ranges=1&hdr=ETag:%22abc%22';
my $WEAK = 'hdr=ETag:W/%22w%22';

for my $case (
    # name, location, size, cut at, readers over HTTP/2, validator
    [ 'in memory',             '/m',    200_000,  40_000 ],
    [ 'in the temp file',      '/m',    400_000, 200_000 ],
    [ 'readers far behind',    '/slow',  60_000,  40_000 ],
    [ 'HTTP/2 readers',        '/m',    200_000,  40_000, 1 ],
    [ 'a weak ETag, asked for again', '/m', 200_000, 40_000, 0, $WEAK ],
    [ 'a weak ETag, in the temp file', '/m', 400_000, 200_000, 0, $WEAK ],
    [ 'no length, asked for again', '/c11', 200_000, 40_000, 0, "chunked=1&$STRONG" ],
) {
    my ($name, $loc, $size, $cut, $h2, $v) = @$case;
    my $what = "mid-body, $name";
    $v //= $STRONG;
    my $path = "$loc/b?delay=300&size=$size&fixed=1" . ($v ne '' ? "&$v" : '')
             . "&fail=stall&cut=$cut&fail_first=1&run=" . ++$RUN;

    my $f = killed_midbody($what, $path, $cut, 10, $h2) or next;
    my @h = @{ $f->{h} };
    my $want = whole($path, $size);

    # by the worker that answered (X-Pid; the dead worker's clients may
    # have had no answer at all): a follower slow to come (a loaded
    # machine) may join after wait_followers() counted them, so at least
    # as many as it counted
    my $pid = sub { $_[0]{res}{headers}{'x-pid'} // '' };
    my @other = grep { $pid->($_) ne '' && $pid->($_) ne $f->{lpid} } @h;
    my @dead = grep { $pid->($_) eq '' || $pid->($_) eq $f->{lpid} } @h;
    my @whole = grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                       && $_->{res}{body} eq $want } @other;
    is(scalar(@whole), scalar(@other),
       "$what: the " . scalar(@other) . " readers of the other worker got the whole body");
    cmp_ok(scalar(@other), '>=', $f->{n}, "$what: $f->{n} or more of them");
    is(scalar(grep { $_->{state} eq 'done' && !$_->{res}{complete} } @dead),
       scalar(@dead), "$what: the dead worker's clients were cut");
    is($t->origin_uri_hits($path), 2, "$what: one more origin request, for the rest");
    is($t->log_count(qr/singleflight flight $f->{id} resumed at byte $f->{published}\b/, $f->{off}), 1,
       "$what: the rest asked for from byte $f->{published}");
    is($t->log_count(qr/\[warn\] [^\n]*singleflight leader process $f->{lpid} is gone, 1 flight\(s\) it led in zone "sf" mid-body are resumed by their readers/, $f->{off}),
       1, "$what: a [warn] line names the dead leader");

    my $s1 = $t->zone_stats;
    is($s1->{dead_leaders} - $f->{s0}{dead_leaders}, 1, "$what: stats dead_leaders + 1");
    is($s1->{resumes} - $f->{s0}{resumes}, 1, "$what: stats resumes + 1");

    end_case($what, $f);
}

# ------------------------------------------------------------ on its own way

# The default (singleflight_lone direct): the first request goes upstream
# on its own way, those that come while it waits for its header make a
# flight that waits for it, and at its header it takes that flight over:
# its upstream response feeds the store the others read.  Its worker
# killed mid-body, the readers of the other worker resume as from a dead
# fetch: the rest asked for from what the dead worker published, and the
# whole body, byte for byte, for each of them.  Over HTTP/1.1 and over
# HTTP/2.  The first request's worker and the flight are read from the
# line of its taking the flight over.
for my $h2 (0, 1) {
    my $what = 'mid-body, on its own way' . ($h2 ? ', HTTP/2' : '');
    my @via = $h2 ? (h2 => 1, port => $t->port(1)) : ();
    my ($size, $cut) = (200_000, 40_000);
    my $path = "/dm/b?delay=500&size=$size&fixed=1&$STRONG"
             . "&fail=stall&cut=$cut&fail_first=1&run=" . ++$RUN;
    my $off = $t->log_offset;
    my $s0 = $t->zone_stats;

    my $first = $t->start_request('GET', $path, timeout => 20, @via);
    ok($t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'the first request at the origin'),
       "$what: the first request at the origin");
    my @h = map { $t->start_request('GET', $path, timeout => 20, @via) } 1 .. $N;

    my ($lpid, $id);
    ok($t->wait_for(sub {
        ($lpid, $id) = $t->error_log_since($off)
            =~ /(\d+)#\d+: \*\d+ singleflight request on its own way fetches flight (\d+)/;
        defined $id;
    }, what => 'the first request feeding the flight'),
       "$what: the first request (worker " . ($lpid // '?') . ') feeds flight ' . ($id // '?'));

    # its readers per worker: the one that made the flight (its "leader",
    # waiting for the first request's header), followers, late readers
    my %per;
    $t->wait_for(sub {
        %per = ();
        my $log = $t->error_log_since($off);
        $per{$1}++ while defined $id
            && $log =~ /(\d+)#\d+: \*\d+ singleflight (?:leader|follower|late reader) of flight $id,/g;
        my $n = 0;
        $n += $_ for values %per;
        $n >= $N;
    }, what => "$N readers");
    my ($other) = grep { $_ != ($lpid // 0) } keys %per;

    SKIP: {
        unless ($other && $id) {
            $t->allow_log(qr/worker process $lpid exited on signal \d+/) if $lpid;
            $t->kill_worker($lpid);
            $t->poll_all([ $first, @h ], timeout => 10);
            skip "$what: every reader landed in the first request's worker", 13;
        }

        my $published = kill_published($what, $id, $lpid, $cut, $off, $first, @h);

        my $want = whole($path, $size);
        my $pid = sub { $_[0]{res}{headers}{'x-pid'} // '' };
        my @mine = grep { $pid->($_) ne '' && $pid->($_) ne $lpid } @h;
        my @dead = grep { $pid->($_) eq '' || $pid->($_) eq $lpid } @h;
        is(scalar(grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                         && $_->{res}{body} eq $want } @mine), scalar(@mine),
           "$what: the " . scalar(@mine) . ' readers of the other worker got the whole body');
        cmp_ok(scalar(@mine), '>=', $per{$other}, "$what: $per{$other} or more of them");
        is(scalar(grep { $_->{res}{complete} && $_->{res}{body} ne $want } $first, @h), 0,
           "$what: no client got a short body as a complete one");
        ok($first->{state} eq 'done' && !$first->{res}{complete},
           "$what: the first request's client was cut");
        is(scalar(grep { $_->{state} eq 'done' && !$_->{res}{complete}
                         && length($_->{res}{body}) < $size } @dead),
           scalar(@dead), "$what: the dead worker's clients were cut");
        is($t->origin_uri_hits($path), 2, "$what: one more origin request, for the rest");
        is($t->log_count(qr/singleflight flight $id resumed at byte $published\b/, $off), 1,
           "$what: the rest asked for from byte $published");
        is($t->log_count(qr/\[warn\] [^\n]*singleflight leader process $lpid is gone, 1 flight\(s\) it led in zone "sf" mid-body are resumed by their readers/, $off),
           1, "$what: a [warn] line names the dead worker");
        is_deeply($t->sf_outcomes($path, scalar(@mine)), { 'FOLLOWER:200' => scalar(@mine) },
                  "$what: the access log: FOLLOWER 200 for each");

        my $s1 = $t->zone_stats;
        is($s1->{dead_leaders} - $s0->{dead_leaders}, 1, "$what: stats dead_leaders + 1");
        is($s1->{resumes} - $s0->{resumes}, 1, "$what: stats resumes + 1");
    }
    end_case($what, { leader => $first, h => \@h, lpid => $lpid });
}

# ------------------------------------------------------------ module off

# The same herd and kill without the module, over HTTP/1.1 and over
# HTTP/2, with a strong ETag and a weak one: the clients of the surviving
# worker get the whole body (their own requests; only the first stalls),
# the killed worker's are cut.  The module's readers of the surviving
# worker got exactly that body above, with 2 origin requests, not N + 1.
# The first request's worker is the one the origin names (X-SF-Worker).
for my $case ([ 0, $STRONG ], [ 1, $STRONG ], [ 0, $WEAK ]) {
    my ($h2, $v) = @$case;
    my $what = 'module off, mid-body kill' . ($h2 ? ', HTTP/2' : '')
             . ($v eq $WEAK ? ', a weak ETag' : '');
    my @via = $h2 ? (h2 => 1, port => $t->port(1)) : ();
    my ($size, $cut) = (200_000, 40_000);
    my $path = "/off/b?delay=300&size=$size&fixed=1&$v"
             . "&fail=stall&cut=$cut&fail_first=1&run=" . ++$RUN;
    my $first = $t->start_request('GET', $path, timeout => 20, @via);
    my $pid;
    ok($t->wait_for(sub { $pid = $t->origin_hits->{workers}{$path} },
                    what => 'the first request at the origin'),
       "$what: the first request is at the origin (worker " . ($pid // '?') . ')');
    my @h = map { $t->start_request('GET', $path, timeout => 20, @via) } 1 .. $N;
    $t->poll_all(\@h, timeout => 15);
    $t->allow_log(qr/worker process $pid exited on signal \d+/);
    ok($t->kill_worker($pid), "$what: worker $pid killed");
    $t->poll_all([ $first ], timeout => 5);

    my $want = whole($path, $size);
    my @other = grep { ($_->{res}{headers}{'x-pid'} // '') ne $pid } @h;
    is(scalar(grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                     && $_->{res}{body} eq $want } @other), scalar(@other),
       "$what: the " . scalar(@other) . ' clients of the other worker got the whole body');
    ok(!$first->{res}{complete}, "$what: the killed worker's stalled client was cut");
    is($t->origin_uri_hits($path), $N + 1,
       "$what: " . ($N + 1) . ' origin requests (the module: 2)');
    $t->abort_request($_) for $first, @h;
    ok($t->worker_respawned($pid), "$what: the master respawned the worker");
}

# ------------------------------------------------------------ cut as before

for my $case (
    # name, location, ETag
    [ 'without dead',              '/nd', 'hdr=ETag:%22abc%22' ],
    [ 'another ETag for the rest', '/m',  'etag_hit=1' ],
    # asked for again whole, the origin's second answer has other bytes
    [ 'a weak ETag, other bytes', '/m',  'nofix' ],
) {
    my ($name, $loc, $etag) = @$case;
    my $what = "mid-body, $name";
    my $size = 200_000;
    my $q = $etag eq 'nofix' ? '&hdr=ETag:W/%22w%22' : "&fixed=1&ranges=1&$etag";
    my $path = "$loc/c?delay=300&size=$size$q"
             . "&fail=stall&cut=40000&fail_first=1&run=" . ++$RUN;

    my $f = killed_midbody($what, $path, 40_000, 5) or next;
    my @h = @{ $f->{h} };

    is(scalar(grep { $_->{state} eq 'done' && !$_->{res}{complete}
                     && length($_->{res}{body} // '') < $size } @h),
       $N, "$what: all $N readers cut before the body's end");
    is(scalar(grep { $_->{state} ne 'done' } @h), 0, "$what: none left hanging");
    is($t->origin_uri_hits($path), $name eq 'without dead' ? 1 : 2,
       "$what: origin requests");

    end_case($what, $f);
}

done_testing;
