#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Dead leader: the worker process of a flight's leader dies mid-flight
# (kill -9, SIGSEGV), before the response's header.  By default
# (singleflight_promote dead) a follower in the surviving worker takes the
# flight over: one more origin request, and every follower there gets its
# response; one [warn] line names the dead process.  Without `dead`, or
# with no tries left, its followers in the surviving worker notice within
# the 200 ms poll and get singleflight_error_status (502 by default, 503
# where configured); dead_leaders counts it, one [error] line names the
# dead process, the key works again at once, and the zone returns to its
# baseline: nothing the dead worker held stays behind.  And the other way
# round: a dead worker that held only followers does not disturb the flight.
# A takeover and a failed flight are also run with every client over
# HTTP/2.  By default (singleflight_lone direct) the first request goes
# upstream on its own way and the others wait for its header: its worker
# dead, they are let go and one of them fetches (PROMOTED).
# And an old worker that dies after a reload, whose pid the kernel gives to
# another process before anyone looked: its followers are answered all the
# same (and the worker serving them, shutting down, does not crash waking
# more than one batch of them); and a worker whose replacement the kernel
# gives its pid: the replacement gives back what that pid held.  And
# followers that park in an old worker after a reload, once its beat found
# none parked there, learn of their old fetching worker's death from their
# own worker within the second.
#
# The leader's worker is found from the debug log ("PID#TID: *N singleflight
# leader of flight ID"), the followers per worker likewise; a case is
# skipped if no follower landed in the other worker.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);
use IO::Socket::INET;
use IO::Select;

use lib 't/lib';
use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

# Under ASan (make test-asan) the sanitizer catches the SIGSEGV we send and
# prints this to the worker's stderr (error.log); its full report, in
# asan.PID, is checked and set aside by expect_segv_report() below, so an
# unexpected crash still fails the log scan.
$t->allow_log(qr/^AddressSanitizer:DEADLYSIGNAL$/);

$t->write_config($t->config_template(<<'EOT',
    log_format sfd '$pid|$singleflight_status|$status|$request_uri';
    access_log %%TESTDIR%%/sf.log sfd;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        # reuseport spreads the clients over both workers
        listen 127.0.0.1:%%PORT%% reuseport;
        listen 127.0.0.1:%%PORT_1%% reuseport http2;

        location /dlt/ {
            singleflight sf;
            singleflight_key $uri;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        # the default: a lone request goes its own way, and those that
        # come while it waits for its header wait for that header
        location /dd/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_lone direct;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        # without "dead": a dead leader's flight fails
        location /dl/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_promote error timeout;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        # "dead", but no tries
        location /dl503/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_promote_tries 0;
            singleflight_error_status 503;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        # a follower here would wait 30 s for a header that never comes
        location /dlr/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_promote error timeout;
            singleflight_timeout 30s;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        # a lone leader's response, passed on as it comes
        location /dls/ {
            singleflight sf;
            singleflight_key $uri;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
    main => "worker_rlimit_core 0;\nworking_directory %%TESTDIR%%;"));

$t->start;

my $N = 100;
my $RUN = 0;

# ------------------------------------------------------------ helpers

# A flight on LOC whose origin never answers its leader's request (the
# first for its URI), with N followers: { path, off, s0, leader, lpid, id,
# h, elsewhere, with_leader, via }, the followers counted per worker from
# the debug log; undef, after SKIP tests skipped, when none landed in the
# other worker.  With $h2 every client asks over HTTP/2 (the port is part
# of a flight's identity: all on the HTTP/2 one).
sub hung_flight {
    my ($what, $loc, $skip, $h2) = @_;
    my @via = $h2 ? (h2 => 1, port => $t->port(1)) : ();
    my %f = (path => "$loc/k?fail=hang&fail_first=1&run=" . ++$RUN,
             off => $t->log_offset, s0 => $t->zone_stats, via => \@via);

    $f{leader} = $t->start_request('GET', $f{path}, timeout => 10, @via);
    @f{qw(lpid id)} = $t->wait_leader($f{off});
    ok($f{lpid}, "$what: leader of flight " . ($f{id} // '?') . ' in worker '
                 . ($f{lpid} // '?'))
        or return;
    ok($t->wait_for(sub { $t->origin_uri_hits($f{path}) == 1 },
                    what => 'leader at the origin'), "$what: the leader is at the origin");

    $f{h} = [ map { $t->start_request('GET', $f{path}, timeout => 10, @via) } 1 .. $N ];
    my %per = %{ $t->wait_followers($f{id}, $N, $f{off}) };
    $f{elsewhere} = 0;
    $f{elsewhere} += $per{$_} for grep { $_ != $f{lpid} } keys %per;
    $f{with_leader} = $per{ $f{lpid} } // 0;
    is($f{elsewhere} + $f{with_leader}, $N, "$what: $N followers joined "
       . "($f{elsewhere} in the other worker, $f{with_leader} with the leader)");

    return \%f if $f{elsewhere};

    SKIP: { skip "$what: every follower landed in the leader's worker", $skip }
    $t->poll_all([ $f{leader}, @{ $f{h} } ], timeout => 8);
    $t->abort_request($_) for $f{leader}, @{ $f{h} };
    return;
}

# The end of a case that killed worker $pid with SIG: it was respawned,
# the sanitizer's report of a SIGSEGV set aside, the zone at its baseline.
sub respawned {
    my ($what, $pid, $sig) = @_;
    ok($t->worker_respawned($pid), "$what: the master respawned the worker");
    expect_segv_report($pid) if $sig eq 'SEGV';
    $t->zone_baseline_ok("$what: zone back to baseline");
}

# Its leader's worker killed with SIG, without `dead` or tries: the
# followers in the other worker must get STATUS.
sub kill_leader {
    my ($loc, $sig, $status, $h2) = @_;
    my $what = "$loc, SIG$sig" . ($h2 ? ', HTTP/2' : '');
    my $f = hung_flight($what, $loc, 12, $h2) or return;
    my ($path, $off, $lpid, $leader, @h) = (@$f{qw(path off lpid leader)}, @{ $f->{h} });
    my ($elsewhere, $with_leader) = @$f{qw(elsewhere with_leader)};

    # the master's note about the worker we kill, and no other
    $t->allow_log(qr/worker process $lpid exited on signal \d+/);

    ok($t->signal_worker($sig, $lpid), "$what: worker $lpid signalled");

    # from its death: under ASan the worker catches a SIGSEGV and writes
    # its report first, which took 2 s in CI
    my $ts = time;
    while (kill(0, $lpid) && time - $ts < 10) {
        $t->poll_request($_) for $leader, @h;
        sleep 0.005;
    }
    my $tk = time;

    $t->poll_all([ $leader, @h ], timeout => 3);

    my @answered = grep { defined $_->{res}{status} } @h;
    my @lost = grep { $_->{state} eq 'done' && !defined $_->{res}{status} } @h;
    my @late = grep { $_->{t0} + $_->{res}{time} - $tk > 1.5 } @answered;

    ok($leader->{state} eq 'done' && !defined $leader->{res}{status}
       && ($leader->{res}{error} // 'timeout') ne 'timeout',
       "$what: the leader's client lost its connection");
    is(scalar(grep { $_->{res}{status} == $status && $_->{res}{complete}
                     && ($_->{res}{headers}{'x-sf'} // '') eq 'ERROR' } @answered),
       $elsewhere, "$what: the $elsewhere followers of the other worker got $status (ERROR)");
    is(scalar(@lost), $with_leader, "$what: only the dead worker's clients went unanswered");
    is(scalar(@late), 0, "$what: all answered within 1.5 s of its death")
        or diag(join ' ', map { sprintf '%.3f', $_->{t0} + $_->{res}{time} - $tk } @late);

    # the flight is free again at once: the same request now leads a new
    # one (the origin answers it), where it would follow the dead one
    my $r = $t->get($path, timeout => 3, @{ $f->{via} });
    ok(($r->{status} // 0) == 200 && ($r->{headers}{'x-sf'} // '') eq 'LEADER'
       && $r->{body} eq SFTest::origin_body($r->{headers}{'x-hit'} // 0, $path),
       "$what: the key works again right after (200 LEADER)")
        or diag(explain({ status => $r->{status}, sf => $r->{headers}{'x-sf'},
                          error => $r->{error} }));
    $t->abort_request($_) for $leader, @h;

    # Logged once, by whichever notices first (the surviving worker's poll,
    # or the respawned worker taking the dead one's slot), in one wording.
    my $gone = qr/\[error\] [^\n]*singleflight leader process $lpid is gone, 1 flight\(s\) it led in zone "sf" failed/;
    my $logged;
    $t->wait_for(sub { $logged = $t->log_count($gone, $off) },
                 timeout => 3, what => 'the dead leader logged');
    is($logged, 1, "$what: one [error] line names the dead leader");
    # give a second (duplicate) report the time of a few polls to show up
    $t->wait_for(sub { $t->log_count($gone, $off) > 1 }, timeout => 0.5, quiet => 1);
    is($t->log_count($gone, $off), 1, "$what: ... only once");

    my $s1 = $t->zone_stats;
    is($s1->{dead_leaders} - $f->{s0}{dead_leaders}, 1, "$what: stats dead_leaders + 1");
    is($s1->{errors} - $f->{s0}{errors}, $elsewhere, "$what: stats errors + $elsewhere");

    respawned($what, $lpid, $sig);
}

# Its leader's worker killed with SIG, with `dead` and a try left: a
# follower of the other worker takes the flight over (PROMOTED) and
# fetches it again: the origin sees one more request, and every follower
# of the other worker gets its response.
sub takeover_leader {
    my ($loc, $sig, $h2) = @_;
    my $what = "$loc, SIG$sig, taken over" . ($h2 ? ', HTTP/2' : '');
    my $f = hung_flight($what, $loc, 12, $h2) or return;
    my ($path, $off, $lpid, @h) = (@$f{qw(path off lpid)}, @{ $f->{h} });
    my $elsewhere = $f->{elsewhere};

    $t->allow_log(qr/worker process $lpid exited on signal \d+/);
    ok($t->signal_worker($sig, $lpid), "$what: worker $lpid signalled");
    $t->poll_all([ $f->{leader}, @h ], timeout => 5);

    my $body = SFTest::origin_body($t->origin_hits->{total}, $path);
    my @got = grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                     && $_->{res}{body} eq $body } @h;
    is(scalar(@got), $elsewhere,
       "$what: the $elsewhere followers of the other worker got the response");
    is(scalar(grep { ($_->{res}{headers}{'x-sf'} // '') eq 'PROMOTED' } @got), 1,
       "$what: ... one of them fetched it (PROMOTED)");
    is($t->origin_uri_hits($path), 2, "$what: one more origin request, for all of them");
    is(scalar(grep { $_->{state} eq 'done' && !defined $_->{res}{status} } @h),
       $f->{with_leader}, "$what: only the dead worker's clients went unanswered");

    my $again = qr/\[warn\] [^\n]*singleflight leader process $lpid is gone, 1 flight\(s\) it led in zone "sf" are fetched again by their followers/;
    ok($t->wait_for(sub { $t->log_count($again, $off) }, timeout => 3,
                    what => 'the dead leader logged'),
       "$what: a [warn] line names the dead leader");
    is($t->log_count(qr/singleflight leader process $lpid is gone, \d+ flight\(s\) it led in zone "sf" failed/, $off),
       0, "$what: ... and no flight failed");

    my $s1 = $t->zone_stats;
    is($s1->{dead_leaders} - $f->{s0}{dead_leaders}, 1, "$what: stats dead_leaders + 1");
    is($s1->{retries} - $f->{s0}{retries}, 1, "$what: stats retries + 1");
    is($s1->{errors} - $f->{s0}{errors}, 0, "$what: stats errors + 0");
    is($s1->{wait_seconds}{count} - $f->{s0}{wait_seconds}{count}, $elsewhere,
       "$what: the $elsewhere followers' waits in the histogram, the promoted one's too");

    $t->abort_request($_) for $f->{leader}, @h;
    respawned($what, $lpid, $sig);
}

# A sanitizer report of the SIGSEGV we sent to $pid (only under ASan) is
# expected: renamed so that the log scan does not count it.
sub expect_segv_report {
    my ($pid) = @_;
    my $file = $t->path("asan.$pid");
    return unless -e $file;
    my $report = $t->read_file($file);
    if ($report =~ /AddressSanitizer: SEGV on unknown address/
        && $report !~ /AddressSanitizer: (?!SEGV)/)
    {
        rename $file, $t->path("expected-segv-report.$pid.txt");
    }
}

# ------------------------------------------------------------ tests

takeover_leader('/dlt', 'KILL');
takeover_leader('/dlt', 'SEGV');
takeover_leader('/dlt', 'KILL', 'h2');
kill_leader('/dl', 'KILL', 502);
kill_leader('/dl503', 'KILL', 503);
kill_leader('/dl', 'SEGV', 502);
kill_leader('/dl', 'KILL', 502, 'h2');

# ------------------------------------------------------------ on its own way

# The default (singleflight_lone direct): the first request goes upstream
# on its own way, with no flight, and those that come while it waits for
# its header make a flight that waits for that header.  Its worker killed
# before the header: nothing in the zone names that worker as the
# flight's, but its removal lets go every flight waiting for a request on
# its own way, and a follower of the other worker fetches it (PROMOTED):
# one more origin request, every follower there answered with it soon
# after the kill, not at singleflight_timeout (10 s, as long as these
# clients wait), and one [warn] line says so.  The first request's
# worker is found from its socket: it logs nothing of a flight.

{
    my $what = 'own way, its worker killed before the header';
    my $path = "/dd/k?fail=hang&fail_first=1&run=" . ++$RUN;
    my $off = $t->log_offset;

    my $first = $t->start_request('GET', $path, timeout => 10);
    my $dead;
    ok($t->wait_for(sub { $t->origin_uri_hits($path) == 1
                          and $dead = $t->worker_of($first) },
                    what => 'the first request at the origin'),
       "$what: the first request at the origin, from worker " . ($dead // '?'));

    my @h = map { $t->start_request('GET', $path, timeout => 10) } 1 .. $N;
    my @w;
    $t->wait_for(sub { @w = $t->worker_of(@h); !grep { !defined } @w },
                 what => "the followers' workers");
    my @other = map { $h[$_] } grep { ($w[$_] // 0) != $dead } 0 .. $#h;
    my @same = map { $h[$_] } grep { ($w[$_] // 0) == $dead } 0 .. $#h;
    ok($t->wait_waiters($N), "$what: $N followers wait ("
       . scalar(@other) . " in the other worker)");
    is($t->log_count(qr/singleflight flight \d+ waits for a request on its own way/, $off), 1,
       "$what: their flight waits for the first request's header");

    SKIP: {
        skip "$what: every follower landed in the first request's worker", 10 unless @other;

        $t->allow_log(qr/worker process $dead exited on signal \d+/);
        ok($t->kill_worker($dead), "$what: worker $dead killed");
        my $tk = time;
        $t->poll_all([ $first, @h ], timeout => 5);

        my $body = SFTest::origin_body($t->origin_hits->{total}, $path);
        my @got = grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                         && $_->{res}{body} eq $body } @other;
        is(scalar(@got), scalar(@other),
           "$what: the " . scalar(@other) . ' followers of the other worker got the response');
        is(scalar(grep { ($_->{res}{headers}{'x-sf'} // '') eq 'PROMOTED' } @got), 1,
           "$what: ... one of them fetched it (PROMOTED)");
        is(scalar(grep { $_->{t0} + $_->{res}{time} - $tk > 2.5 } @got), 0,
           "$what: ... within 2.5 s of the kill");
        is($t->origin_uri_hits($path), 2, "$what: one more origin request, for all of them");
        ok($first->{state} eq 'done' && !defined $first->{res}{status},
           "$what: the first request's client lost its connection");
        is(scalar(grep { $_->{state} eq 'done' && !defined $_->{res}{status} } @same),
           scalar(@same), "$what: the " . scalar(@same) . " followers of the dead worker too");

        my @log = $t->wait_log_records('sf.log', [qw(pid sf status uri)], scalar(@other),
                                       sep => '|', uri => $path);
        is_deeply(SFTest::tally(map { "$_->{sf}:$_->{status}" } @log),
                  { 'PROMOTED:200' => 1, 'FOLLOWER:200' => @other - 1 },
                  "$what: the access log: one PROMOTED, the others FOLLOWER");
        is($t->log_count(qr/singleflight leader process $dead is gone, \d+ flight\(s\) it led in zone "sf" failed/, $off),
           0, "$what: no flight failed");
        is($t->log_count(qr/\[warn\] [^\n]*singleflight worker process $dead is gone: the 1 flight\(s\) in zone "sf" waiting for a lone request's header \(of any worker\) were let go, their followers fetch them/, $off),
           1, "$what: one [warn] line names the process and the flight let go");
    }
    $t->abort_request($_) for $first, @h;
    respawned($what, $dead, 'KILL');
}

# ------------------------------------------------------------ after the header

# The leader's worker dies after its flight's header, while the followers
# of the other worker have none of the response yet (that worker is
# stopped from before the header until the dead one's share was given
# back): with `dead` they look for a flight again, as requests that had
# nothing of a body the origin broke off do (singleflight_promote error),
# and get the response of one new fetch, where they would get 502.

{
    my $what = 'leader killed after the header';
    my $path = "/dlt/h?fail=slowbody&fail_first=1&delay=1500&size=3000&run=" . ++$RUN;
    my $off = $t->log_offset;

    my $leader = $t->start_request('GET', $path, timeout => 15);
    my ($lpid, $id) = $t->wait_leader($off);
    my @h = map { $t->start_request('GET', $path, timeout => 15) } 1 .. $N;
    my %per = %{ $t->wait_followers($id, $N, $off) };
    my ($other) = grep { $_ != $lpid } keys %per;
    my $stored = qr/singleflight flight $id header stored/;

    SKIP: {
        skip "$what: every follower landed in the leader's worker", 5 unless $other;
        kill 'STOP', $other;
        if ($t->log_count($stored, $off)) {
            kill 'CONT', $other;
            $t->poll_all([ $leader, @h ], timeout => 10);
            skip "$what: the header came before worker $other was stopped", 5;
        }

        ok($t->wait_for(sub { $t->log_count($stored, $off) }, what => 'the header'),
           "$what: the header stored while worker $other is stopped");
        $t->allow_log(qr/worker process $lpid exited on signal \d+/);
        ok($t->kill_worker($lpid), "$what: worker $lpid killed");
        my $gone = qr/singleflight leader process $lpid is gone, 1 flight\(s\) it led in zone "sf" failed/;
        ok($t->wait_for(sub { $t->log_count($gone, $off) }, what => 'the dead leader given back'),
           "$what: its flight failed (the respawned worker gave its share back)");
        kill 'CONT', $other;

        $t->poll_all([ $leader, @h ], timeout => 8);
        my $body = SFTest::origin_body($t->origin_hits->{total}, $path, 3000);
        is(scalar(grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                         && $_->{res}{body} eq $body } @h), $per{$other},
           "$what: the $per{$other} followers of worker $other got the response of a new fetch");
        is($t->origin_uri_hits($path), 2, "$what: one new fetch for all of them");
    }
    $t->abort_request($_) for $leader, @h;
    respawned($what, $lpid, 'KILL');
}

# ------------------------------------------------------------ dead follower

# The other way round: the worker that dies holds only followers.  The
# flight is not disturbed: the leader and the followers in its own worker
# get the response, and the dead worker's share of the zone is given back.

{
    my $what = 'follower worker killed';
    my $path = "/dl/f?delay=1500&size=2000&run=" . ++$RUN;
    my $off = $t->log_offset;
    my $s0 = $t->zone_stats;

    my $leader = $t->start_request('GET', $path);
    my ($lpid, $id) = $t->wait_leader($off);
    $t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'leader at the origin');

    my @h = map { $t->start_request('GET', $path) } 1 .. $N;
    my %per = %{ $t->wait_followers($id, $N, $off) };
    my ($other) = grep { $_ != $lpid } keys %per;

    SKIP: {
        skip "$what: every follower landed in the leader's worker", 6 unless $other;

        $t->allow_log(qr/worker process $other exited on signal \d+/);
        ok($t->kill_worker($other), "$what: worker $other (followers only) killed");
        $t->poll_all([ $leader, @h ], timeout => 5);

        my $body = SFTest::origin_body($t->origin_hits->{total}, $path, 2000);
        my $lr = $leader->{res};
        ok(($lr->{status} // 0) == 200 && $lr->{complete} && $lr->{body} eq $body,
           "$what: the leader got its response");
        is(scalar(grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete}
                         && $_->{res}{body} eq $body } @h), $per{$lpid} // 0,
           "$what: the " . ($per{$lpid} // 0) . " followers in the leader's worker got it too");
        is(scalar(grep { $_->{state} eq 'done' && !defined $_->{res}{status} } @h), $per{$other},
           "$what: the $per{$other} in the dead worker went unanswered");

        my $s1 = $t->zone_stats;
        is($s1->{dead_leaders} - $s0->{dead_leaders}, 0, "$what: stats dead_leaders + 0");
        is($s1->{errors} - $s0->{errors}, 0, "$what: stats errors + 0");
    }
    $t->abort_request($_) for $leader, @h;
    $t->zone_baseline_ok("$what: zone back to baseline");
}

# ------------------------------------------------------------ a lone leader

# A lone request's response goes straight to it, unstored: its flight
# became its leader's without the zone's lock (flight_solo()), is no
# longer counted in in_flight, and stays in the tree, where nobody can
# join it, until its last hold goes.  Its worker dies while the body
# streams: the surviving worker gives the dead one's share back, and the
# flight goes with it (it is no leader's failure: nobody else read it).

{
    my $what = 'lone leader killed mid-body';
    my $path = "/dls/lone?fail=slowbody&delay=1000&size=4000&run=" . ++$RUN;
    my $off = $t->log_offset;
    my $s0 = $t->zone_stats;

    my $leader = $t->start_request('GET', $path, timeout => 10);
    my ($lpid, $id) = $t->wait_leader($off);
    ok($t->wait_for(sub { $t->poll_request($leader);
                          ($leader->{res}{status} // 0) == 200 },
                    what => 'the header at the client'),
       "$what: the header reached the client, the body streams");
    ok($t->log_count(qr/singleflight flight has no followers, not stored/, $off) >= 1,
       "$what: not stored");
    is($t->zone_stats->{in_flight}, 0, "$what: in_flight 0 while the body streams");

    $t->allow_log(qr/worker process $lpid exited on signal \d+/);
    ok($t->kill_worker($lpid), "$what: worker $lpid killed");
    $t->poll_all([$leader], timeout => 3);
    ok($leader->{state} eq 'done' && !$leader->{res}{complete},
       "$what: the client lost its connection")
        or diag(explain({ state => $leader->{state}, res => { %{ $leader->{res} }, body => length($leader->{res}{body} // '') } }));

    respawned($what, $lpid, 'KILL');
    is($t->zone_stats->{dead_leaders} - $s0->{dead_leaders}, 0,
       "$what: stats dead_leaders + 0");
}

# ------------------------------------------------------------ a reused pid

# After a reload nobody replaces an old worker that dies: its followers in
# the other old worker find out from its silence and its pid.  Once the
# master has reaped it, the kernel may give that pid to another process;
# the pid alone would then say "alive" for as long as that process lives,
# and the followers would wait for their singleflight_timeout (30 s here).
# The start time the registry keeps tells the two apart.

sub reuse_pid {
    my ($pid) = @_;
    open(my $fh, '>', '/proc/sys/kernel/ns_last_pid') or return;
    print $fh $pid - 1;
    close($fh) or return;
    my $kid = fork;
    return unless defined $kid;
    if (!$kid) { exec 'sleep', '30'; exit 127 }
    return $kid;
}

{
    my $what = 'old worker killed after a reload, its pid reused';
    my $path = "/dlr/k?delay=8000&run=" . ++$RUN;
    my $off = $t->log_offset;
    my $s0 = $t->zone_stats;

    my $leader = $t->start_request('GET', $path, timeout => 20);
    my ($lpid, $id) = $t->wait_leader($off);
    $t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'leader at the origin');

    my @h = map { $t->start_request('GET', $path, timeout => 20) } 1 .. $N;
    my %per = %{ $t->wait_followers($id, $N, $off) };
    my ($other) = grep { $_ != $lpid } keys %per;

    SKIP: {
        skip "$what: every follower landed in the leader's worker", 6 unless $other;

        ok($t->reload, "$what: reloaded, the flight's workers are old ones now");

        $t->allow_log(qr/worker process $lpid exited on signal \d+/);
        ok($t->kill_worker($lpid), "$what: old worker $lpid (the leader's) killed");
        my $tk = time;

        # reaped by the master, and not replaced: an old worker
        $t->wait_for(sub { !-e "/proc/$lpid" }, what => 'the dead worker reaped');
        my $kid = reuse_pid($lpid);

        if (!$kid || $kid != $lpid) {
            if ($kid) { kill 'KILL', $kid; waitpid $kid, 0 }
            $t->poll_all([ $leader, @h ], timeout => 5);
            skip "$what: pid $lpid could not be given to another process", 4;
        }

        $t->poll_all([ $leader, @h ], timeout => 5);

        my @mine = grep { ($_->{res}{status} // 0) == 502 && $_->{res}{complete}
                          && ($_->{res}{headers}{'x-sf'} // '') eq 'ERROR' } @h;
        is(scalar(@mine), $per{$other},
           "$what: the $per{$other} followers in the other old worker got 502 (ERROR)");
        is(scalar(grep { $_->{t0} + $_->{res}{time} - $tk > 3 } @mine), 0,
           "$what: ... within 3 s of the kill, not at their 30 s timeout");

        my $gone = qr/\[error\] [^\n]*singleflight leader process $lpid is gone/;
        ok($t->wait_for(sub { $t->log_count($gone, $off) }, timeout => 3,
                        what => 'the dead leader logged'),
           "$what: one [error] line names the dead leader");
        is($t->zone_stats->{dead_leaders} - $s0->{dead_leaders}, 1,
           "$what: stats dead_leaders + 1");

        kill 'KILL', $kid;
        waitpid $kid, 0;
    }
    $t->abort_request($_) for $leader, @h;
    $t->zone_baseline_ok("$what: zone back to baseline");
}

# ------------------------------------------------------------ parked after a quiet beat

# An old worker shutting down still beats: its requests may park on a
# flight after one of its beats found none parked (here: requests whose
# header was still coming at the reload, a connection nginx keeps open
# while it shuts down), and when the flight's fetching worker, an old one
# too (not replaced), dies, they learn it from their own worker's look at
# it, within the second, not only from the new workers' sweep of silent
# workers (every 5 s) nor at their 30 s timeout.

{
    my $what = 'parked in a worker shutting down after a quiet beat';
    my $path = "/dlr/q?delay=8000&run=" . ++$RUN;
    my $off = $t->log_offset;
    my $s0 = $t->zone_stats;

    my $leader = $t->start_request('GET', $path, timeout => 20);
    my ($lpid, $id) = $t->wait_leader($off);
    $t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'leader at the origin');

    # the request line and a header now, the end of the header later
    my @raw = grep { defined } map {
        IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port,
                              Proto => 'tcp')
    } 1 .. 8;
    for my $s (@raw) {
        $s->autoflush(1);
        print $s "GET $path HTTP/1.1\r\nHost: localhost\r\n";
    }

    ok($t->reload, "$what: reloaded, the flight's workers are old ones now");

    # each old worker's beat (500 ms) has found nothing parked there
    select(undef, undef, undef, 1.2);

    print $_ "Connection: close\r\n\r\n" for @raw;
    my %per = %{ $t->wait_followers($id, scalar(@raw), $off) };
    my ($other) = grep { $_ != $lpid } keys %per;

    SKIP: {
        skip "$what: every follower landed in the leader's worker", 3 unless $other;

        $t->allow_log(qr/worker process $lpid exited on signal \d+/);
        ok($t->kill_worker($lpid), "$what: old worker $lpid (the leader's) killed");
        my $tk = time;

        # each connection's answer, and when it came
        my (%buf, %done);
        my $sel = IO::Select->new(@raw);
        while ($sel->count && time - $tk < 15) {
            for my $s ($sel->can_read(0.1)) {
                my $n = sysread($s, my $chunk, 65536);
                if ($n) { $buf{$s} .= $chunk; next }
                $done{$s} = time - $tk;
                $sel->remove($s);
            }
        }

        my @mine = grep { ($buf{$_} // '') =~ m{^HTTP/1\.1 502 .*\r\nX-SF: ERROR\r\n}s } @raw;
        is(scalar(@mine), $per{$other},
           "$what: the $per{$other} followers in the other old worker got 502 (ERROR)");
        is(scalar(grep { ($done{$_} // 99) > 3 } @mine), 0,
           "$what: ... within 3 s of the kill, not at the sweep nor their 30 s timeout")
            or diag(explain([ map { $done{$_} } @mine ]));
    }
    close($_) for @raw;
    $t->abort_request($leader);
    $t->zone_baseline_ok("$what: zone back to baseline");
}

# ------------------------------------------------------------ a pid given back

# A worker killed and respawned by the master: the kernel may give the
# new worker the dead one's pid (seen in CI), in the same process slot.
# The new worker gives back what that pid held before it holds anything:
# the followers in the other worker get 502 at once, not at their 30 s
# timeout, and no record of the dead one is left in the zone.
#
# The case sets the kernel's next pid, for the whole machine: the next
# processes of any test started meanwhile get pids freed moments ago, so
# it runs only with SF_TEST_PID_REUSE=1, alone (make test-pid-reuse).
SKIP: {
    my $what = 'worker killed, its replacement given its pid';
    skip "$what: sets the machine's next pid, run alone by make test-pid-reuse", 5
        unless $ENV{SF_TEST_PID_REUSE};
    my $f = hung_flight($what, '/dlr', 4);

    SKIP: {
        skip "$what: no follower in the other worker", 4 unless $f;
        my ($lpid, $leader, @h) = ($f->{lpid}, $f->{leader}, @{ $f->{h} });

        $t->allow_log(qr/worker process $lpid exited on signal \d+/);

        # the next pid is the leader's worker's, when the master forks
        my $fh;
        my $set = open($fh, '>', '/proc/sys/kernel/ns_last_pid')
                  && print($fh $lpid - 1) && close($fh);
        ok($t->kill_worker($lpid), "$what: worker $lpid killed");
        my $tk = time;

        my @w;
        $t->worker_respawned($lpid);
        @w = $t->worker_pids;

        if (!$set || !grep { $_ == $lpid } @w) {
            $t->poll_all([ $leader, @h ], timeout => 5);
            $t->abort_request($_) for $leader, @h;
            skip "$what: the new worker did not get pid $lpid", 3;
        }

        $t->poll_all([ $leader, @h ], timeout => 5);

        my @mine = grep { ($_->{res}{status} // 0) == 502 && $_->{res}{complete}
                          && ($_->{res}{headers}{'x-sf'} // '') eq 'ERROR' } @h;
        is(scalar(@mine), $f->{elsewhere},
           "$what: the $f->{elsewhere} followers in the other worker got 502 (ERROR)");
        is(scalar(grep { $_->{t0} + $_->{res}{time} - $tk > 3 } @mine), 0,
           "$what: ... within 3 s of the kill, not at their 30 s timeout");

        $t->abort_request($_) for $leader, @h;
    }
    $t->zone_baseline_ok("$what: zone back to baseline");
}

done_testing;
