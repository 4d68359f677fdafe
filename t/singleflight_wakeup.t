#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A wake-up whose sender died.  A worker that changes a flight other
# workers' requests wait on sets each of those workers' "pending" flag
# under the zone's lock, and writes a byte to its pipe at the end of its
# round of events; the flag tells the next senders that a byte is on its
# way.  A sender killed between the two (SIGKILL, a crash) leaves the flag
# set with nothing on its way: without a remedy that worker hears of no
# change again but by its twice-a-second beat, for as long as it lives,
# and every follower there is answered up to half a second late.
#
# The test stops the leader's worker at that very point with gdb (a
# breakpoint on the function that queues the bytes, reached only when a
# flag was newly set) and kills it there.  Expected: the followers in the
# other worker are answered by a takeover; that worker logs, at a beat,
# that it cleared the flag left by a dead sender; and from then on its
# followers of flights fetched in the respawned worker are answered as
# soon as the leader is (within 150 ms of the origin's answer, against up
# to 500 ms when they wait for a beat), in each of 5 flights.
#
# Skipped where gdb cannot attach to a worker (no ptrace).

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use lib 't/lib';
use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;

plan skip_all => 'gdb is not installed (tools/deps.sh test installs it)'
    unless grep { -x "$_/gdb" } split /:/, $ENV{PATH} // '';

$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;

    server {
        # reuseport spreads the clients over both workers
        listen 127.0.0.1:%%PORT%% reuseport;

        location /w/ {
            singleflight sf;
            singleflight_key $uri;
            # every request through a fetch, whose worker the log names
            singleflight_lone fetch;
            singleflight_timeout 30s;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->start;

my $N = 16;
my $RUN = 0;

sub ms_from_now { int((time + $_[0]) * 1000) }

# A flight on /w/NAME whose origin answers at AT (epoch ms): its leader,
# then $N followers; { leader, lpid, id, h (followers), w (their workers) }
sub flight {
    my ($name, $at) = @_;
    my $path = "/w/$name?at=$at&size=2000&run=" . ++$RUN;
    my $off = $t->log_offset;
    my %f = (path => $path);

    $f{leader} = $t->start_request('GET', $path, timeout => 20);
    @f{qw(lpid id)} = $t->wait_leader($off);
    return unless $f{id};

    $f{h} = [ map { $t->start_request('GET', $path, timeout => 20) } 1 .. $N ];
    $t->wait_followers($f{id}, $N, $off);
    $f{w} = [ $t->worker_of(@{ $f{h} }) ];
    return \%f;
}

# ------------------------------------------------ the sender killed

my $f = flight('dead', ms_from_now(8));
ok($f, 'a flight and its leader') or done_testing(), exit;

my $A = $f->{lpid};
my ($B) = grep { $_ != $A } $t->worker_pids;
my @inB = grep { ($f->{w}[$_] // 0) == ($B // -1) } 0 .. $#{ $f->{h} };

SKIP: {
    skip 'every follower landed in the leader\'s worker', 1 unless @inB;

    # gdb stops worker A where it is about to write the bytes whose flags
    # it set (any change it makes: the header is the first), and kills it
    my $out = $t->path('gdb.out');
    $t->allow_log(qr/worker process $A exited on signal 9/);
    $t->{killed}{$A} = $t->log_offset;

    my $gdb = fork // die "fork: $!";
    if (!$gdb) {
        open(STDOUT, '>', $out) or die;
        open(STDERR, '>&', \*STDOUT) or die;
        exec('gdb', '-q', '-nx', '-batch', '-p', $A,
             '-ex', 'set pagination off',
             '-ex', 'break ngx_http_singleflight_registry_notify',
             '-ex', 'continue',
             '-ex', 'kill') or exit 1;
    }

    # (gdb's "Continuing." may sit in its buffer; the worker is stopped
    # from the attach until gdb continues)
    my $attached = $t->wait_for(sub { $t->read_file('gdb.out') =~ /^Breakpoint 1 at/m },
                                timeout => 6, what => 'gdb attached');
    if (!$attached) {
        kill 'KILL', $gdb;
        waitpid($gdb, 0);
        diag($t->read_file('gdb.out'));
        $t->poll_all([ $f->{leader}, @{ $f->{h} } ], timeout => 15);
        skip 'gdb could not attach to a worker', 1;
    }

    ok($t->worker_respawned($A), "worker $A, killed between a flag and its "
                                 . 'byte, is respawned');
    waitpid($gdb, 0);
    like($t->read_file('gdb.out'), qr/Breakpoint 1, .*ngx_http_singleflight_registry_notify/,
         'it was killed at the breakpoint');

    $t->poll_all([ @{ $f->{h} }[@inB] ], timeout => 10);
    my @ok = grep { ($f->{h}[$_]{res}{status} // 0) == 200 } @inB;
    is(scalar @ok, scalar @inB, scalar(@inB) . " followers in worker $B "
                                . 'answered 200 by a takeover');
    $t->poll_all([ $f->{leader}, @{ $f->{h} } ], timeout => 5);

    ok($t->wait_for(sub {
           $t->log_count(qr/\[notice\] $B#\d+: singleflight: a wake-up of this worker was never sent/) >= 1
       }, timeout => 3, what => 'the notice'),
       "worker $B clears the flag a dead sender left set, within two beats");

    # ------------------------------------ wake-ups reach that worker again

    my @lags;
    for my $try (1 .. 30) {
        last if @lags >= 5;
        my $at = ms_from_now(0.6);
        my $p = flight("p$try", $at) or next;
        my @mine = grep { ($p->{w}[$_] // 0) == $B } 0 .. $#{ $p->{h} };
        $t->poll_all([ $p->{leader}, @{ $p->{h} } ], timeout => 10);

        # a flight fetched in worker B wakes its own followers there
        next if $p->{lpid} == $B || !@mine;

        my $lag = 0;
        for (@{ $p->{h} }[@mine]) {
            my $done = $_->{t0} + ($_->{res}{time} // 99);
            $lag = $done - $at / 1000 if $done - $at / 1000 > $lag;
        }
        push @lags, $lag;
    }

    SKIP: {
        skip 'fewer than 5 flights fetched in the other worker with followers '
             . "in $B", 1 if @lags < 5;
        my @late = grep { $_ > 0.15 } @lags;
        ok(!@late, "followers in worker $B answered within 150 ms of the "
                   . 'origin in each of 5 flights fetched elsewhere (took: '
                   . join(', ', map { sprintf '%.0f ms', $_ * 1000 } @lags) . ')');
    }
}

done_testing();
