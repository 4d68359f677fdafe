#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A bounded randomized soak over 4 workers: rounds of concurrent herds on
# fresh keys, each round mixing the failures the module must survive:
# leaders reset, every attempt reset, responses cut mid-body, origin 5xx,
# upstream timeouts, oversized and private responses, nginx proxying to
# itself, unbuffered slow responses and large private ones whose leader's
# client reads nothing until the end, Vary on a header the fetch does not
# send, a temporary path that cannot be written, an origin's 103 Early
# Hints before its response, flights of a scope=worker zone (whose files
# a killed worker must not leave behind), clients going away (the
# leader, then the next one), floods of private marks, bursts of flights
# completing at the same moment across the workers, a worker (or all but
# one) killed mid-flight, the worker fetching a resumable response killed
# mid-body (its readers elsewhere must get all of it, its rest asked for
# by a Range or, with a weak ETag, whole), a response with a
# weak ETag cut mid-body (asked for again whole: its readers must get all
# of it), reloads and forgets during herds.
#
# Invariants, checked per round and at the end:
#   every request is answered (a status, or its connection closed by a
#   worker we killed) before its timeout;
#   a client going away costs nobody else anything: no extra origin
#   request, no error;
#   every 200 body is byte-identical to an origin response of its key;
#   when the worker fetching a resumable response is killed, every client
#   answered by another worker gets the whole body;
#   origin requests per round stay within what the round's faults allow;
#   the zone is back to its baseline, nothing in flight;
#   no temporary file is left, whichever worker was killed;
#   no alert and no sanitizer report in the logs (the harness checks).
#
#   SOAK_SECONDS=150 SOAK_SEED=42 prove -v -I t/lib t/soak/soak.t
#
# `make soak` runs it with the module built with ASan and UBSan.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);
use File::Find ();
use List::Util ();

use SFTest;

my $seconds = $ENV{SOAK_SECONDS} // 150;
my $seed = $ENV{SOAK_SEED} // int(time);
srand($seed);
diag("soak: $seconds s, seed $seed (SOAK_SEED=$seed to replay)");

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->allow_log(qr/exited on signal 9/);

$t->write_config($t->config_template(<<'EOT', workers => 4));
    singleflight_zone zone=sf:4m;
    singleflight_zone zone=sfw:4m scope=worker;

    # nginx proxying to itself: the first pass comes back here, the
    # second goes to the origin
    map $http_x_hop $next_hop {
        ""       127.0.0.1:%%PORT%%;
        default  %%ORIGIN%%;
    }

    server {
        listen 127.0.0.1:%%PORT%%;

        # how each client's request went: a far range's 502 is the
        # module's only where its flight's worker was killed (ERROR)
        add_header X-SF $singleflight_status always;
        # which worker answered, and (to the origin) which one fetches
        add_header X-SF-Pid $pid always;

        location / {
            singleflight sf;
            singleflight_max_size 256k;
            singleflight_timeout 4s;
            proxy_read_timeout 2s;
            proxy_set_header X-SF-Worker $pid;
            proxy_pass http://%%ORIGIN%%;
            # every request mirrored, the module making a collapsed one's
            mirror /soakmirror;
        }

        location = /soakmirror {
            internal;
            return 204;
        }

        # a lone request goes upstream itself, the others in a flight
        location /direct/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_set_header X-SF-Worker $pid;
            proxy_pass http://%%ORIGIN%%;
        }

        location /short/ {
            singleflight sf;
            proxy_read_timeout 300ms;
            proxy_pass http://%%ORIGIN%%;
        }

        location /self/ {
            singleflight sf;
            proxy_set_header Host $host;
            proxy_set_header X-Hop 1;
            proxy_pass http://$next_hop;
        }

        location /unbuf/ {
            singleflight sf;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        # its temporary path is made a file once nginx runs: bodies past
        # singleflight_memory stay in the zone
        location /nospill/ {
            singleflight sf;
            singleflight_memory 64k;
            singleflight_temp_path %%TESTDIR%%/nospill_temp;
            proxy_pass http://%%ORIGIN%%;
        }

        # each worker its own flights; bodies past 64k in files
        location /w/ {
            singleflight sfw;
            singleflight_memory 64k;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /forget {
            singleflight_forget sf $scheme$host$arg_uri;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

rmdir $t->path('nospill_temp') or die "nospill_temp: $!";
$t->write_file('nospill_temp', "not a directory\n");

# kind => [weight, sub returning (uri, max origin requests for n clients)]
my %kinds = (
    plain      => [10, sub { ("/p?delay=" . (150 + int rand 300)
                              . '&size=' . int(rand 60000)
                              . (rand() < 0.3 ? '&chunked=1' : ''), 1) }],
    reset1     => [3, sub { ('/r?delay=200&fail=reset&fail_first=1', 2) }],
    resetall   => [2, sub { ('/ra?delay=150&fail=reset', 2) }],
    midbody    => [2, sub { ('/m?delay=150&size=50000&fail=midbody&fail_first=1',
                             2) }],
    error5xx   => [2, sub { ('/e?delay=150&status=' . (500 + int rand 4), 1) }],
    timeout    => [2, sub { ('/short/t?fail=hang&fail_first=1', 2) }],
    # singleflight_lone direct: the first client's own request and a flight
    direct     => [3, sub { ("/direct/d?delay=" . (150 + int rand 300)
                              . '&size=' . int(rand 60000), 2) }],
    oversized  => [1, sub { ('/o?delay=150&size=300000', undef) }],
    private    => [2, sub { ('/c?delay=150&hdr=Set-Cookie:a%3Db', undef) }],
    self       => [2, sub { ('/self/s?delay=' . (150 + int rand 200), 1) }],
    unbuffered => [2, sub { ('/unbuf/u?delay=100&size=' . (300000 + int rand 700000)
                             . '&fail=slowbody&pieces=8', 1) }],
    # a large private response whose leader's client reads late
    privslow   => [1, sub { ('/cs?delay=100&size=' . (1000000 + int rand 2000000)
                             . '&hdr=Set-Cookie:a%3Db&fail=slowbody&pieces=4', undef) }],
    # Vary on a header the fetch does not send, half the clients send it
    # (a leader that sends it leaves its own fetch to its followers: n + 1)
    stripvary  => [1, sub { ('/sv?delay=150&size=20000&hdr=Vary:Range', undef) }],
    # far ranges, two of them: a flight of each Range, its fetch sends it
    farrange   => [1, sub { ('/fr?delay=150&fixed=1&ranges=1&size=' . (100000 + int rand 300000),
                             2) }],
    # resumable (strong ETag, a length, the same bytes every hit; under
    # singleflight_max_size) and slow: a worker killed under it mid-body
    # leaves its rest to a reader
    resumable  => [3, sub { ('/rs?delay=100&fixed=1&ranges=1&hdr=ETag:%22r%22&size='
                             . (100000 + int rand 150000) . '&fail=slowbody&pieces=8', 1) }],
    # a weak ETag, the same bytes every hit, cut mid-body once: asked for
    # again whole and its first bytes compared, it goes on for every
    # reader (not for the first request, which went its own way: nginx's
    # answer, as without the module)
    weakcut    => [2, sub { my $size = 60000 + int rand 140000;
                            ("/wc?delay=150&fixed=1&hdr=ETag:W/%22w%22&size=$size"
                             . '&fail=cut&cut=' . int($size * (0.2 + rand 0.6))
                             . '&fail_first=1', 2) }],
    # the same, slow and not cut: only for a kill of its fetching worker
    # mid-body (weight 0: killfetch picks it), its rest asked for whole
    weakslow   => [0, sub { ('/ws?delay=100&fixed=1&hdr=ETag:W/%22w%22&size='
                             . (100000 + int rand 150000) . '&fail=slowbody&pieces=8', 1) }],
    # no temporary file can be had
    nospill    => [1, sub { ('/nospill/n?delay=100&size=' . (200000 + int rand 600000)
                             . '&fail=slowbody&pieces=4', 1) }],
    # a 103 before the response: shared from nginx 1.29 on, before that
    # its followers go upstream on their own
    hints      => [1, sub { ('/h?delay=150&hints=1&size=' . int(rand 20000), undef) }],
    # scope=worker: a flight per worker, 4 workers
    perworker  => [2, sub { ('/w/w?delay=100&size=' . (100000 + int rand 300000)
                             . '&fail=slowbody&pieces=4', 4) }],
);

# kinds whose first client reads nothing until the others are done
my %late = (unbuffered => 1, privslow => 1);

my @bag = map { ($_) x $kinds{$_}[0] } sort keys %kinds;

my ($rounds, $requests, $answered, $bodies_ok, $bodies) = (0, 0, 0, 0, 0);
my (@problems, %seen_kind, %seen_event);

# the farrange kind's two Range headers (a 206 each)
my @FAR = ('bytes=30000-89999', 'bytes=-20000');

# a far range's answer: the origin's 206, the bytes it names, whole
# unless a worker was killed under it; or, when the worker that led its
# flight was killed, singleflight_error_status (502, ERROR), as a dead
# leader's followers get
sub far_check {
    my ($r, $uri, $killed) = @_;
    my ($from, $to) = ($r->{headers}{'content-range'} // '') =~ /^bytes (\d+)-(\d+)\//;
    if ($killed && $r->{status} == 502 && ($r->{headers}{'x-sf'} // '') eq 'ERROR') {
        return;
    } elsif ($r->{status} != 206 || !defined $from) {
        push @problems, "round $rounds farrange: $r->{status} without a range";
    } elsif ($r->{complete}) {
        $bodies++;
        my ($size) = $uri =~ /size=(\d+)/;
        if ($r->{body} eq substr(SFTest::origin_body(0, $uri, $size), $from, $to - $from + 1)) {
            $bodies_ok++;
        } else {
            push @problems, "round $rounds farrange: the range's bytes differ";
        }
    } elsif (!$killed) {
        push @problems, "round $rounds farrange: 206 incomplete";
    }
}

# kills the worker that fetches herd $hd's resumable response, mid-body
# (its header comes 100 ms after its request, then a piece every 100 ms,
# 8 of them); returns whether it killed one
sub kill_fetch {
    my ($hd) = @_;
    my $pid;
    $t->wait_for(sub { $pid = $t->origin_hits->{workers}{ $hd->{uri} } },
                 timeout => 5, what => 'the resumable fetch', quiet => 1)
        or return 0;
    Time::HiRes::sleep(0.15 + rand 0.6);
    return 0 unless grep { $_ == $pid } $t->worker_pids;
    $hd->{killpid} = $pid;
    return $t->kill_worker($pid);
}

my $start = time;

while (time - $start < $seconds) {
    $rounds++;

    # now and then the worker fetching a resumable response (by a Range,
    # or asked for again whole) is killed mid-body: the round's first
    # herd is one
    my $killfetch = rand() < 0.06;

    # one to three herds at once, on fresh keys
    my @herds;
    for my $k (1 .. 1 + int rand 3) {
        my $kind = $killfetch && $k == 1
                   ? (rand() < 0.5 ? 'resumable' : 'weakslow')
                   : $bag[int rand @bag];
        my ($uri, $max) = $kinds{$kind}[1]->();
        $uri .= ($uri =~ /\?/ ? '&' : '?') . "k=$rounds.$k";
        my $n = 5 + int rand 60;
        # the unbuffered leader's client reads nothing until the others
        # are done (a small receive buffer: it stalls for real; not below
        # loopback's MSS of 64k, where TCP itself crawls once it reads)
        my @h = map { $t->start_request('GET', $uri, timeout => 15,
                                        ($late{$kind} && $_ == 1
                                         ? (rcvbuf => 65536) : ()),
                                        ($kind eq 'stripvary' && $_ % 2
                                         ? (headers => [ Range => 'bytes=0-' ])
                                         : ()),
                                        ($kind eq 'farrange'
                                         ? (headers => [ Range => $FAR[$_ % 2] ])
                                         : ())) } 1 .. $n;
        push @h, shift @h if $late{$kind};
        push @herds, { kind => $kind, uri => $uri, n => $n,
                       max => ($max // $n) + ($kind eq 'stripvary'), h => \@h };
        $seen_kind{$kind}++;
    }

    # now and then a flood of private marks: keys of their own, a follower
    # each, and no key of the round is slowed by them
    if (rand() < 0.1) {
        $seen_event{marks}++;
        my @p = map { ("/c?delay=100&hdr=Set-Cookie:a%3Db&flood=$rounds.$_") x 2 } 1 .. 40;
        push @herds, { kind => 'marks', uri => $_, n => 2, max => 2,
                       h => [ map { $t->start_request('GET', $_, timeout => 15) } ($_) x 2 ] }
            for map { $p[2 * $_] } 0 .. 39;
    }

    # now and then a burst: 40 flights completing at the same moment
    if (rand() < 0.1) {
        $seen_event{burst}++;
        my $at = int((time + 1) * 1000);
        for my $k (1 .. 40) {
            my $uri = "/b?size=3000&at=$at&k=$rounds.b$k";
            push @herds, { kind => 'burst', uri => $uri, n => 3, max => 1,
                           h => [ map { $t->start_request('GET', $uri, timeout => 15) } 1 .. 3 ] };
        }
    }

    # now and then: a client goes away, a worker dies, a reload, a forget
    my $event = rand();
    my $killed = 0;
    my %old;
    my $what = $killfetch ? 'killfetch'
               : $event < 0.10 ? 'abort' : $event < 0.15 ? 'abort2'
               : $event < 0.19 ? 'kill'
               : $event < 0.24 ? 'reload' : $event < 0.30 ? 'forget' : 'none';
    $seen_event{$what}++;

    if ($killfetch) {
        $killed = kill_fetch($herds[0]);
        $_->{max} += 2 for @herds;

    } elsif ($event < 0.10) {
        # clients go away: that costs the others nothing, but for the
        # first request's (singleflight_lone direct), one in each zone
        # instance (4 with scope=worker): gone before its header, its
        # upstream request goes with it, and a follower fetches the
        # flight that waited for it
        my $hd = $herds[0];
        $t->abort_request($_, rst => rand() < 0.5)
            for grep { rand() < 0.3 } @{ $hd->{h} };
        $hd->{max} += $hd->{kind} eq 'perworker' ? 4 : 1;

    } elsif ($event < 0.15) {
        # the leader's client goes away, then the next one's (as above)
        my $hd = $herds[0];
        unless ($late{ $hd->{kind} }) {
            $t->abort_request($hd->{h}[0], rst => rand() < 0.5);
            Time::HiRes::sleep(0.05 + rand 0.1);
            $t->abort_request($hd->{h}[1], rst => rand() < 0.5);
            $hd->{max} += $hd->{kind} eq 'perworker' ? 2 : 1;
        }

    } elsif ($event < 0.19) {
        # before the header, or mid-body of the slower herds; one time in
        # three every worker but one at once (the survivor's readers are
        # left with the flights of three dead workers)
        Time::HiRes::sleep(rand 0.6);
        my @w = List::Util::shuffle($t->worker_pids);
        if (@w > 1 && rand() < 1 / 3) {
            $seen_event{killmany}++;
            $t->kill_worker(@w[1 .. $#w]);
        } elsif (@w) {
            $t->kill_worker($w[0]);
        }
        $killed = 1;
        # a flight it led is led again, and readers it had cut or failed
        # may rejoin once more
        $_->{max} += 2 for @herds;

    } elsif ($event < 0.24) {
        # flights go on in the old workers and the new configuration
        # starts its own (README): a herd the reload splits costs one
        # origin request more, one per worker with scope=worker.  The
        # next round waits for the new workers, or the reload, slow to
        # come, would split its herds too
        %old = map { $_ => 1 } $t->worker_pids;
        $t->signal('HUP');
        $_->{max} += $_->{kind} eq 'perworker' ? 4 : 1 for @herds;

    } elsif ($event < 0.30) {
        my $hd = $herds[0];
        (my $u = $hd->{uri}) =~ s/([^A-Za-z0-9\/])/sprintf('%%%02X', ord $1)/ge;
        $t->get("/forget?uri=$u");
        $hd->{max} += 1;
    }

    for my $hd (@herds) {
        my $before = $hd->{uri};

        for my $h (@{ $hd->{h} }) {
            my $r = $t->finish_request($h);
            $requests++;

            if ($r->{error} && $r->{error} eq 'aborted by client') {
                $answered++;
                next;
            }

            if (!defined $r->{status}) {
                if ($killed && ($r->{error} // '') !~ /timeout/i) {
                    $answered++;        # its worker was killed under it
                    next;
                }

                push @problems, "round $rounds $hd->{kind}: no answer "
                                . "($r->{error})";
                next;
            }

            $answered++;

            if ($hd->{kind} eq 'farrange') {
                far_check($r, $before, $killed);
                next;
            }

            # a reader in a surviving worker: its flight is taken over
            # before the header, resumed mid-body, or was complete
            if ($hd->{killpid} && ($r->{headers}{'x-sf-pid'} // '') ne $hd->{killpid}
                && ($r->{status} != 200 || !$r->{complete}))
            {
                push @problems, "round $rounds $hd->{kind}, its fetching worker "
                                . "killed: a reader in worker "
                                . ($r->{headers}{'x-sf-pid'} // '?') . " got "
                                . "$r->{status}" . ($r->{complete} ? '' : ' incomplete');
            }

            next unless $r->{status} == 200;

            if (!$r->{complete}) {

                # the origin broke off mid-body: whoever had bytes of it
                # has the connection closed, as nginx does without us;
                # nobody is handed a short body as complete

                if ($hd->{kind} eq 'weakcut') {
                    $hd->{short}++;
                    # not the first request, which went its own way
                    # (singleflight_lone direct) and gets what nginx
                    # gives it, as without the module
                    $hd->{short_read}++
                        if ($r->{headers}{'x-sf'} // '') !~ /^(?:LEADER|DIRECT)$/;
                    next;
                }

                push @problems, "round $rounds $hd->{kind}: 200 incomplete"
                    unless $killed || $hd->{kind} eq 'midbody';
                next;
            }

            $bodies++;
            # fixed=1: the same body, hit=0, on every hit
            my $hit = $before =~ /[?&]fixed=1/ ? 0 : $r->{headers}{'x-hit'} // 0;
            my ($size) = $before =~ /size=(\d+)/;
            my $want = SFTest::origin_body($hit, $before, $size);

            if ($r->{body} eq $want) {
                $bodies_ok++;
            } else {
                push @problems, "round $rounds $hd->{kind}: body differs "
                                . "from origin response $hit";
            }
        }
    }

    # a response asked for again whole: cut only for its first request
    # (its own way), where nobody followed it, or where a worker was killed
    for my $hd (grep { $_->{kind} eq 'weakcut' && $_->{short_read} } @herds) {
        my $followed = grep { ($_->{res}{headers}{'x-sf'} // '') eq 'FOLLOWER' }
                       @{ $hd->{h} };
        push @problems, "round $rounds weakcut: $hd->{short_read} of $hd->{n} "
                        . "readers cut, $followed followers"
            if $followed && !$killed;
    }

    # origin requests per herd, from the origin's own counters
    my $hits = $t->origin_hits->{uris};

    for my $hd (@herds) {
        my $got = $hits->{ $hd->{uri} } // 0;
        push @problems, "round $rounds $hd->{kind} ($what): $got origin "
                        . "requests for $hd->{n} clients, at most $hd->{max} "
                        . "expected"
            if $got > $hd->{max};
    }

    # a killed worker is replaced, a reload's are new; wait for them
    # before the next round
    $t->wait_for(sub { $t->worker_pids == 4 }, what => 'workers')
        if $killed;
    $t->wait_for(sub { my @w = $t->worker_pids;
                       @w == 4 && !grep { $old{$_} } @w }, what => 'the reload')
        if %old;
}

$seen_event{adopted} = $t->log_count(qr/mid-body are resumed by their readers/);
$seen_event{refetched} = $t->log_count(qr/resumed at byte \d+: the response asked for again has the same first bytes/);
# a worker killed between setting another's wake-up flag and writing its
# byte: that worker cleared the flag at a beat
$seen_event{unstuck} = $t->log_count(qr/a wake-up of this worker was never sent/);

diag(sprintf "soak: %d rounds, %d requests, %d bodies, kinds: %s; "
     . "events: %s", $rounds, $requests, $bodies,
     join(' ', map { "$_=$seen_kind{$_}" } sort keys %seen_kind),
     join(' ', map { "$_=$seen_event{$_}" } sort keys %seen_event));

is($answered, $requests, 'every request answered');
is($bodies_ok, $bodies, 'every 200 body is an origin response of its key');
is_deeply([ @problems[0 .. ($#problems < 19 ? $#problems : 19)] ], [],
          'no round broke an invariant');

$t->zone_baseline_ok('zone back to baseline, nothing in flight', timeout => 15);

# every flight's file is gone, the killed workers' too (scope=worker ones
# included)
my @left;
$t->wait_for(sub {
    @left = ();
    File::Find::find(sub { push @left, $File::Find::name if -f $_ },
                     $t->path('singleflight_temp'));
    !@left;
}, timeout => 5, what => 'temporary files gone');
is(scalar(@left), 0, 'no temporary file left behind') or diag("@left[0 .. ($#left < 4 ? $#left : 4)]");

done_testing;
