#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A burst of completions across workers (issue 11): 300 flights whose
# responses all arrive at the same moment, each with followers spread over
# 4 workers.  Wake-ups are coalesced per worker (at most one on its way to
# a worker, re-armed once it is drained), so the burst costs fewer
# wake-ups than flights, not one per flight and worker; none is lost (no
# follower is left for the safety poll), and none fails to be sent.

use strict;
use warnings;

use Test::More;
use Time::HiRes ();

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
# bench/origin.c: its held responses (hold=1) leave when released
$t->start_origin(program => SFTest::c_origin());

$t->write_config($t->config_template(<<'EOT', workers => 4));
    log_format burst '$pid $msec $singleflight_status $request_uri';
    access_log %%TESTDIR%%/burst.log burst;

    singleflight_zone zone=sf:8m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            access_log off;
            singleflight_stats;
        }
    }
EOT
$t->start;

my $FLIGHTS = 300;
my $PER = 3;

# three bursts: a worker that stopped being woken stays so
for my $round (1 .. 3) {
    burst($round);
}

done_testing;

sub burst {
    my ($round) = @_;

    # every response held at the origin until the last follower has
    # joined, then all written at once; a key's clients far apart in the
    # herd, so that they land in different workers
    my @paths = map { my $k = $_; map { "/r$round-b$_?size=2000&hold=1" } 1 .. $FLIGHTS } 1 .. $PER;

    $t->origin_reset;
    my $before = $t->zone_stats('sf');
    my @h = map { $t->start_request('GET', $_, timeout => 30) } @paths;

    ok($t->wait_for(sub { ($t->origin_hits->{held} // 0) == $FLIGHTS }, timeout => 20,
                    what => 'the leaders at the origin'),
       "burst $round: every key's request is held at the origin");
    my ($joined, $zone) = $t->wait_waiters($FLIGHTS * ($PER - 1), timeout => 20);
    ok($joined, "burst $round: every follower waits") or diag(explain($zone));

    # The workers are stopped while the origin writes, and go on once every
    # response is in their sockets: each sees the whole burst in one look
    # at its events, however busy the machine (under prove -j2, workers
    # that each got a few responses per turn once cost 524 wake-ups).
    my @workers = $t->worker_pids;
    kill 'STOP', @workers;
    # nothing between STOP and CONT may die: stopped workers would outlive
    # the test
    my $released = eval { $t->origin->release } // 0;
    my $reached = $t->wait_for(sub { $t->origin_unread == $FLIGHTS }, timeout => 10,
                               what => 'every response in nginx\'s sockets');
    kill 'CONT', @workers;
    is($released, $FLIGHTS, "burst $round: the origin wrote $FLIGHTS responses at once");
    ok($reached, "burst $round: every response reached nginx");

    my $res = $t->finish_all(\@h);

    my $good = 0;
    my %body;
    for my $i (0 .. $#paths) {
        my $r = $res->[$i];
        next unless ($r->{status} // 0) == 200 && $r->{complete} && length($r->{body}) == 2000;
        $good++;
        $body{ $paths[$i] }{ $r->{body} }++;
    }
    is($good, $FLIGHTS * $PER, "burst $round: every client got a complete response");
    is(scalar(grep { keys %{ $body{$_} } != 1 } keys %body), 0,
       "burst $round: the clients of a key got the same body");
    is($t->origin_hits->{total}, $FLIGHTS, "burst $round: one origin request per key ($FLIGHTS)");

    my @recs = $t->wait_log_records('burst.log', [qw(pid msec status uri)],
                                    $FLIGHTS * $PER, uri => qr{^/r$round-});
    my (%leader, @lag, %workers);
    for (@recs) {
        $workers{ $_->{pid} } = 1;
        $leader{ $_->{uri} } = $_ if $_->{status} eq 'LEADER';
    }
    for (grep { $_->{status} eq 'FOLLOWER' } @recs) {
        my $l = $leader{ $_->{uri} } or next;
        push @lag, { lag => $_->{msec} - $l->{msec},
                     other => $_->{pid} != $l->{pid} };
    }
    is(scalar(keys %leader), $FLIGHTS, "burst $round: one leader per key");
    is(scalar(@lag), $FLIGHTS * ($PER - 1), "burst $round: the others followed it");
    cmp_ok(scalar(keys %workers), '>=', 3, "burst $round: the clients were spread over the workers");

    my @other = sort { $a <=> $b } map { $_->{lag} } grep { $_->{other} } @lag;
    cmp_ok(scalar(@other), '>=', $FLIGHTS / 2,
           "burst $round: many followers were in another worker than their leader (" . scalar(@other) . ')');

    # a follower left to the safety poll would be about 0.5 s late
    my $max = @other ? $other[-1] : 0;
    cmp_ok($max, '<', 0.4, sprintf("burst $round: no follower in another worker waited for the poll (latest %.3f s after its leader)", $max));

    my $after = $t->zone_stats('sf');
    my $d = SFTest::delta($before, $after, qw(wakeups notify_failed flights));
    is($d->{notify_failed}, 0, "burst $round: no wake-up failed to be sent");
    # one wake-up per flight and worker it has followers in would be
    # several hundred; coalesced, a worker gets one per round of its event
    # loop in which some of its flights completed: a handful when the
    # origin's writes land at once, more when a loaded machine spreads them
    cmp_ok($d->{wakeups}, '<', $FLIGHTS,
           "burst $round: the burst cost fewer wake-ups than flights ($d->{wakeups} for $FLIGHTS flights)");
    $t->zone_baseline_ok("burst $round: the zone back to its baseline");
}
