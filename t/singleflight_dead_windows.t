#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A worker that dies at one exact line, stopped there by gdb, leaves
# nothing behind that outlasts the next beat; nor does an allocation
# refused at one (gdb makes the function return NULL).
#
# A wake-up whose sender died.  A worker that changes a flight other
# workers' requests wait on sets each of those workers' "pending" flag
# under the zone's lock, and writes a byte to its pipe at the end of its
# round of events; the flag tells the next senders that a byte is on its
# way.  A sender killed between the two (SIGKILL, a crash) leaves the flag
# set with nothing on its way: without a remedy that worker hears of no
# change again but by its twice-a-second beat, for as long as it lives,
# and every follower there is answered up to half a second late.  The
# leader's worker is stopped at that very point (a breakpoint on the
# function that queues the bytes, reached only when a flag was newly set)
# and killed there.  Expected: the followers in the other worker are
# answered by a takeover; that worker logs, at a beat, that it cleared the
# flag left by a dead sender; and from then on its followers of flights
# fetched in the respawned worker are answered as soon as the leader is
# (within 100 ms of the origin's answer, against up to 500 ms when they
# wait for a beat), in most of 8 flights (the median).
#
# A death between a request's count and its flight (singleflight_lone
# direct).  The first request of a key goes its own way and marks its
# slot; a request of the same key in the other worker counts itself
# there, and is stopped before it makes its flight, which would wait for
# the first request's header.  The first request's worker is killed; its
# replacement starts the slots over and lets go every flight that waited
# for a first request.  Then the stopped request goes on.  Expected: its
# flight does not wait for the dead request (it would wait for good: no
# later reset would let it go) but fetches, and it and a herd after it are
# answered by the origin's second response, none of them TIMEOUT.
#
# An old worker dies after a reload that resized the zone.  The new
# workers, which have a zone of their own, may find it dead first and
# clear its slot in the registry; the other old workers must still find
# its record in the old zone and give back what it held there: a flight
# waiting for a first request the dead worker held is let go and fetched,
# not left to singleflight_timeout.
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

my $conf = $t->config_template(<<'EOT');
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

        # the default: a lone request goes its own way
        location /d/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_timeout 3s;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        location /dz/ {
            singleflight sf;
            singleflight_key $uri;
            singleflight_timeout 20s;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->write_config($conf);
$t->start;

my $N = 16;
my $RUN = 0;
my $GDB = 0;

sub ms_from_now { int((time + $_[0]) * 1000) }

# gdb attached to worker $pid with a breakpoint on $function, then the
# commands @then once it is reached: { pid, out (its output's file) };
# undef, with gdb's output in a diag, if it could not attach
sub gdb_break {
    my ($pid, $function, @then) = @_;
    my $name = 'gdb' . ++$GDB . '.out';
    my $g = { out => $name };
    $g->{pid} = fork // die "fork: $!";
    if (!$g->{pid}) {
        open(STDOUT, '>', $t->path($name)) or die;
        open(STDERR, '>&', \*STDOUT) or die;
        exec('gdb', '-q', '-nx', '-batch', '-p', $pid,
             '-ex', 'set pagination off',
             '-ex', "break $function",
             '-ex', 'continue',
             map { ('-ex', $_) } @then) or exit 1;
    }

    # (gdb's "Continuing." may sit in its buffer; the worker is stopped
    # from the attach until gdb continues)
    return $g if $t->wait_for(sub { $t->read_file($name) =~ /^Breakpoint 1 at/m },
                              timeout => 6, what => 'gdb attached');
    kill 'KILL', $g->{pid};
    waitpid($g->{pid}, 0);
    diag($t->read_file($name));
    return;
}

sub gdb_reached { $_[0] && $t->read_file($_[0]{out}) =~ /^Breakpoint 1, /m }

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

# The first request of $path, on its own way and at the origin (a test):
# (its handle, its worker, the other worker); () if it is not
sub first_request {
    my ($path) = @_;
    my $h = $t->start_request('GET', $path, timeout => 60);
    my $w;
    $t->wait_for(sub { $t->poll_request($h);
                       $w = $t->worker_of($h);
                       $w && $t->origin_uri_hits($path) == 1 },
                 what => 'the first request at the origin');
    my ($other) = grep { $_ != ($w // 0) } $t->worker_pids;
    ok($w && $other, "$path: the first request on its own way, in worker "
                     . ($w // '?')) or return;
    return ($h, $w, $other);
}

# ------------------------------------------------ the sender killed

SKIP: {
    my $f = flight('dead', ms_from_now(8));
    ok($f, 'a flight and its leader') or skip 'no flight', 5;

    my $A = $f->{lpid};
    my ($B) = grep { $_ != $A } $t->worker_pids;
    my @inB = grep { ($f->{w}[$_] // 0) == ($B // -1) } 0 .. $#{ $f->{h} };

    if (!@inB) {
        $t->poll_all([ $f->{leader}, @{ $f->{h} } ], timeout => 15);
        skip 'every follower landed in the leader\'s worker', 5;
    }

    # gdb stops worker A where it is about to write the bytes whose flags
    # it set (any change it makes: the header is the first), and kills it
    $t->allow_log(qr/worker process $A exited on signal 9/);
    $t->{killed}{$A} = $t->log_offset;

    my $g = gdb_break($A, 'ngx_http_singleflight_registry_notify', 'kill');
    if (!$g) {
        $t->poll_all([ $f->{leader}, @{ $f->{h} } ], timeout => 15);
        skip 'gdb could not attach to a worker', 5;
    }

    ok($t->worker_respawned($A), "worker $A, killed between a flag and its "
                                 . 'byte, is respawned');
    waitpid($g->{pid}, 0);
    like($t->read_file($g->{out}),
         qr/Breakpoint 1, .*ngx_http_singleflight_registry_notify/,
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
    for my $try (1 .. 40) {
        last if @lags >= 8;
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

    skip 'fewer than 8 flights fetched in the other worker with followers '
         . "in $B", 1 if @lags < 8;
    # the fifth of eight: a slow flight or three on a loaded machine are
    # not the beat
    my $fifth = (sort { $a <=> $b } @lags)[4];
    ok($fifth < 0.1, "followers in worker $B answered within 100 ms of "
                      . 'the origin in most of 8 flights fetched elsewhere '
                      . '(took: ' . join(', ', map { sprintf '%.0f ms', $_ * 1000 } @lags)
                      . ')');
}

# ------------------------ a death between a request's count and its flight

SKIP: {
    # the first request hangs at the origin; the ones after it are
    # answered in 1 s
    my $path = '/d/x?fail=hang&fail_first=1&delay=1000';
    my ($D, $WD, $WG) = first_request($path) or skip 'no first request', 4;

    # worker WG stops the first request of the key it gets, counted in
    # the slot, before it makes its flight; it goes on once "go" exists
    my $go = $t->path('go');
    my $g = gdb_break($WG, 'ngx_http_singleflight_flight_join',
                      "shell while [ ! -e $go ]; do sleep 0.05; done",
                      'detach');
    skip 'gdb could not attach to a worker', 4 unless $g;

    my @G;
    for (1 .. 60) {
        push @G, $t->start_request('GET', $path, timeout => 30);
        last if $t->wait_for(sub { gdb_reached($g) }, timeout => 0.1, quiet => 1);
    }
    ok(gdb_reached($g), "a request of the key stopped in worker $WG, "
                        . 'counted, before its flight');

    $t->allow_log(qr/worker process $WD exited on signal 9/);
    $t->kill_worker($WD);
    ok($t->worker_respawned($WD), "the first request's worker $WD killed "
                                  . 'and respawned');

    # its replacement has started the slots over before its first cycle
    my ($new) = grep { $_ != $WG } $t->worker_pids;
    $t->wait_for(sub { $t->log_count(qr/ $new#\d+: worker cycle/) >= 1 },
                 what => 'the new worker');

    open(my $fh, '>', $go) or die "$go: $!";
    close $fh;
    waitpid($g->{pid}, 0);

    my @H = map { $t->start_request('GET', $path, timeout => 30) } 1 .. 5;
    $t->poll_all([ @G, @H ], timeout => 15);
    $t->poll_all([ $D ], timeout => 1, what => 'the first request, closed');

    my @answered = grep { defined $_->{res}{status} } @G, @H;
    my @wrong = grep { $_->{res}{status} != 200
                       || ($_->{res}{headers}{'x-sf'} // '') eq 'TIMEOUT' } @answered;
    ok(@answered >= 6 && !@wrong, scalar(@answered) . ' requests after the '
       . 'stop answered 200, none after waiting for the dead request ('
       . join(' ', map { ($_->{res}{status} // '-') . ' '
                         . ($_->{res}{headers}{'x-sf'} // '-') } @answered) . ')');
}

# ------------------------ the leader's own header cannot be copied

# The first request of a key goes its own way; the requests that come
# before its header wait for it, and at its header it feeds them its own
# response.  Memory for the copy of that header is refused (gdb makes the
# function that builds it return NULL, as when the worker's allocation
# fails): that request fails, as it would without the module.  Expected:
# the flight is let go and a follower fetches it; the followers, and a
# request of the key after them, get 200, none after waiting for
# singleflight_timeout (20 s) on a flight nobody fetched any more.

SKIP: {
    # every request the same: the origin answers at one moment
    my $path = '/dz/t?size=1000&run=' . ++$RUN . '&at=' . ms_from_now(6);
    my ($L, $W) = first_request($path) or skip 'no first request', 2;

    my $g = gdb_break($W, 'ngx_http_singleflight_store_serialize',
                      'set confirm off', 'return 0', 'detach');
    skip 'gdb could not attach to a worker', 2 unless $g;

    my @F = map { $t->start_request('GET', $path, timeout => 40) } 1 .. 8;
    if (!$t->wait_for(sub { gdb_reached($g) }, timeout => 10, what => 'the breakpoint')) {
        # the header came before gdb was ready: nothing to test
        $t->allow_log(qr/worker process $W exited on signal 9/);
        kill 'KILL', $W;
        waitpid($g->{pid}, 0);
        $t->poll_all([ $L, @F ], timeout => 25);
        skip 'gdb was not ready before the header', 2;
    }
    waitpid($g->{pid}, 0);
    $t->poll_all([ $L, @F ], timeout => 25);
    my $after = $t->get($path, timeout => 25);

    my @wrong = grep { ($_->{res}{status} // 0) != 200
                       || ($_->{res}{headers}{'x-sf'} // '') eq 'TIMEOUT' } @F;
    ok(gdb_reached($g) && !@wrong, 'the header not copied: 8 followers '
       . 'answered 200 by a fetch (' . join(' ', map { ($_->{res}{status} // '-')
       . ' ' . ($_->{res}{headers}{'x-sf'} // '-') } @F) . ')');
    ok(($after->{status} // 0) == 200 && ($after->{headers}{'x-sf'} // '') ne 'TIMEOUT',
       'the header not copied: a request after them answered at once ('
       . ($after->{status} // '-') . ' ' . ($after->{headers}{'x-sf'} // '-') . ')');
}

# ------------------------ an old worker dies, its zone unknown to the new

# After a reload that resizes the zone, the new workers have a zone of
# their own.  An old worker dies holding a first request that a flight in
# the other old worker waits for.  A new worker finds it dead first (the
# other old worker is stopped meanwhile, so that it does) and clears its
# slot in the registry, but has nothing of it to give back.  Expected: the
# other old worker still finds the dead worker's record in the old zone,
# lets the flight go, and its followers are answered by a fetch, not
# after singleflight_timeout (20 s).

SKIP: {
    my $path = '/dz/x?fail=hang&fail_first=1&delay=500';
    my ($R, $A, $B) = first_request($path) or skip 'no first request', 3;

    # followers in the other worker, their flight waiting for R's header
    my @F;
    for (1 .. 40) {
        my $h = $t->start_request('GET', $path, timeout => 60);
        $t->wait_for(sub { $t->poll_request($h); $t->worker_of($h) },
                     timeout => 2, quiet => 1);
        push @F, $h if ($t->worker_of($h) // 0) == $B;
        last if @F >= 3;
    }
    skip 'no follower landed in the other worker', 3 unless @F;

    $t->write_config($conf =~ s/zone=sf:1m/zone=sf:2m/r);
    ok($t->reload, 'a reload with the zone resized');

    # the new workers wait for a first request too: they look for dead
    # workers at every beat
    my $other = '/dz/y?fail=hang&fail_first=1&delay=500';
    my @Y = map { $t->start_request('GET', $other, timeout => 60) } 1 .. 8;
    $t->wait_for(sub { $t->origin_uri_hits($other) >= 1 }, what => 'the new workers');

    kill 'STOP', $B;
    $t->allow_log(qr/worker process $A exited on signal 9/);
    $t->kill_worker($A);
    my $killed = time;
    # the new workers find it dead within a beat or two
    sleep 3;
    kill 'CONT', $B;

    $t->poll_all(\@F, timeout => 25);
    my @wrong = grep { ($_->{res}{status} // 0) != 200
                       || ($_->{res}{headers}{'x-sf'} // '') eq 'TIMEOUT' } @F;
    my $last = 0;
    for (@F) {
        my $done = $_->{t0} + ($_->{res}{time} // 99) - $killed;
        $last = $done if $done > $last;
    }
    ok(!@wrong && $last < 6, scalar(@F) . " followers in old worker $B "
       . 'answered 200 by a fetch, not after singleflight_timeout ('
       . join(' ', map { ($_->{res}{status} // '-') . ' '
                         . ($_->{res}{headers}{'x-sf'} // '-') } @F)
       . sprintf(', the last %.1f s after the kill)', $last));
    $t->abort_request($_) for $R, @Y;
}

done_testing();
