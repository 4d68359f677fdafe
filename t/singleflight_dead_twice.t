#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A flight whose fetching worker dies twice: with singleflight_promote dead
# (the default) and one try (singleflight_promote_tries 1, the default),
# the first death hands the flight to a follower in another worker, which
# fetches it again; the second death, of that worker, fails the flight for
# the followers left in the third worker (singleflight_error_status 502,
# ERROR), and nobody fetches it a third time.  So a response that kills
# every worker that fetches it costs at most 1 + tries of them per flight.
#
# Three workers, clients spread over them by reuseport; the origin never
# answers the first two requests for the URI (fail=hang&fail_first=2).  The
# workers of the leader and of the follower that took over are read from
# the debug log.  Skipped when the followers did not land in all three.
# By default (singleflight_lone direct) the first request goes upstream
# on its own way and the others wait for its header: its death is the
# flight's first try, as its failure would be, and the bound is the same.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

$t->allow_log(qr/^AddressSanitizer:DEADLYSIGNAL$/);

$t->write_config($t->config_template(<<'EOT', workers => 3,
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        location / {
            singleflight sf;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        # the default: a lone request goes its own way, and those that
        # come while it waits for its header wait for that header
        location /d/ {
            singleflight sf;
            singleflight_lone direct;
            add_header X-SF $singleflight_status always;
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

my $N = 150;
my $path = '/k?fail=hang&fail_first=2';
my $off = $t->log_offset;
my $s0 = $t->zone_stats;

my $leader = $t->start_request('GET', $path, timeout => 15);
my ($apid, $id) = $t->wait_leader($off);
ok($apid, "leader of flight " . ($id // '?') . " in worker " . ($apid // '?'))
    or BAIL_OUT('no leader');
$t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'the leader at the origin');

my @h = map { $t->start_request('GET', $path, timeout => 15) } 1 .. $N;
my %per = %{ $t->wait_followers($id, $N, $off) };
my @others = grep { $_ != $apid } keys %per;

SKIP: {
    skip "followers in " . scalar(@others) . " other worker(s), not 2", 11 unless @others == 2;

    $t->allow_log(qr/worker process $apid exited on signal \d+/);
    ok($t->kill_worker($apid), "the leader's worker $apid killed");

    # a follower of another worker takes the flight over and fetches it
    my $bpid;
    $t->wait_for(sub {
        ($bpid) = $t->error_log_since($off)
            =~ /(\d+)#\d+: \*\d+ singleflight promoted leader of flight $id,/;
        defined $bpid;
    }, what => 'the follower that took over');
    ok($bpid && grep({ $_ == $bpid } @others),
       "a follower in worker " . ($bpid // '?') . " took the flight over");
    ok($t->wait_for(sub { $t->origin_uri_hits($path) == 2 }, what => 'the second fetch'),
       'it fetches the flight again');

    my ($cpid) = grep { $_ != ($bpid // 0) } @others;
    $t->allow_log(qr/worker process $bpid exited on signal \d+/) if $bpid;
    ok($bpid && $t->kill_worker($bpid), "its worker " . ($bpid // '?') . " killed too");

    $t->poll_all([ $leader, @h ], timeout => 5);

    my @c = grep { ($_->{res}{status} // 0) == 502 && $_->{res}{complete}
                   && ($_->{res}{headers}{'x-sf'} // '') eq 'ERROR' } @h;
    is(scalar(@c), $per{$cpid}, "the $per{$cpid} followers of worker $cpid got 502 (ERROR)");
    is(scalar(grep { $_->{state} eq 'done' && !defined $_->{res}{status} } @h),
       $N - $per{$cpid}, 'those of the two dead workers went unanswered');
    is($t->origin_uri_hits($path), 2, 'no third fetch');

    my $again = qr/\[warn\] [^\n]*singleflight leader process $apid is gone, 1 flight\(s\) it led in zone "sf" are fetched again/;
    my $failed = qr/\[error\] [^\n]*singleflight leader process $bpid is gone, 1 flight\(s\) it led in zone "sf" failed/;
    ok($t->log_count($again, $off) == 1, "the first death: fetched again ([warn])");
    ok($t->wait_for(sub { $t->log_count($failed, $off) == 1 }, timeout => 3,
                    what => 'the second death logged'),
       'the second death: failed ([error])');

    my $s1 = $t->zone_stats;
    is($s1->{dead_leaders} - $s0->{dead_leaders}, 2, 'stats dead_leaders + 2');
    is($s1->{retries} - $s0->{retries}, 1, 'stats retries + 1');
}

$t->abort_request($_) for $leader, @h;
ok($t->wait_for(sub { $t->worker_pids == 3 }, what => 'respawned workers'),
   'the master respawned the workers');
$t->zone_baseline_ok('zone back to baseline');

# ------------------------------------------------------------ on its own way

# The same by default (singleflight_lone direct): the first request goes
# upstream on its own way, with no flight, and the followers' flight
# waits for its header.  Its worker killed, the flight is let go and a
# follower in another worker takes it over (PROMOTED); that worker killed
# too, the followers of the third get 502 (ERROR): the first request and
# the takeover's fetch, no third origin request.  The first request's
# worker and each follower's are found from their sockets.

$t->origin_reset;
$path = '/d/k?fail=hang&fail_first=2';
$off = $t->log_offset;

my $first = $t->start_request('GET', $path, timeout => 15);
$apid = undef;
ok($t->wait_for(sub { $t->origin_uri_hits($path) == 1
                      and $apid = $t->worker_of($first) },
                what => 'the first request at the origin'),
   "default: the first request at the origin, from worker " . ($apid // '?'));

@h = map { $t->start_request('GET', $path, timeout => 15) } 1 .. $N;
my @w;
$t->wait_for(sub { @w = $t->worker_of(@h); !grep { !defined } @w },
             what => "the followers' workers");
%per = %{ SFTest::tally(@w) };
@others = grep { $_ != $apid } keys %per;
ok($t->wait_waiters($N), "default: $N followers wait");

SKIP: {
    skip "default: followers in " . scalar(@others) . " other worker(s), not 2", 9
        unless @others == 2;

    $t->allow_log(qr/worker process $apid exited on signal \d+/);
    ok($t->kill_worker($apid), "default: the first request's worker $apid killed");

    my $bpid;
    $t->wait_for(sub {
        ($bpid) = $t->error_log_since($off)
            =~ /(\d+)#\d+: \*\d+ singleflight promoted leader of flight \d+,/;
        defined $bpid;
    }, what => 'the follower that took over');
    ok($bpid && grep({ $_ == $bpid } @others),
       "default: a follower in worker " . ($bpid // '?') . " took the flight over");
    ok($t->wait_for(sub { $t->origin_uri_hits($path) == 2 }, what => 'its fetch'),
       'default: it fetches the flight');

    my ($cpid) = grep { $_ != ($bpid // 0) } @others;
    $t->allow_log(qr/worker process $bpid exited on signal \d+/) if $bpid;
    ok($bpid && $t->kill_worker($bpid), "default: its worker " . ($bpid // '?') . " killed too");

    $t->poll_all([ $first, @h ], timeout => 5);

    my @c = grep { ($_->{res}{status} // 0) == 502 && $_->{res}{complete}
                   && ($_->{res}{headers}{'x-sf'} // '') eq 'ERROR' } @h;
    is(scalar(@c), $per{$cpid}, "default: the $per{$cpid} followers of worker $cpid got 502 (ERROR)");
    is(scalar(grep { $_->{state} eq 'done' && !defined $_->{res}{status} } $first, @h),
       $N + 1 - $per{$cpid}, 'default: those of the two dead workers went unanswered');
    is($t->origin_uri_hits($path), 2, 'default: no third origin request');
    is_deeply($t->sf_outcomes($path, $per{$cpid}), { 'ERROR:502' => $per{$cpid} },
              'default: the access log: ERROR 502 for each');
    my $failed2 = qr/\[error\] [^\n]*singleflight leader process $bpid is gone, 1 flight\(s\) it led in zone "sf" failed/;
    ok($t->wait_for(sub { $t->log_count($failed2, $off) == 1 }, timeout => 3,
                    what => 'the second death logged'),
       'default: the second death: failed ([error])');
}

$t->abort_request($_) for $first, @h;
ok($t->wait_for(sub { $t->worker_pids == 3 }, what => 'respawned workers'),
   'default: the master respawned the workers');
$t->zone_baseline_ok('default: zone back to baseline');

done_testing;
