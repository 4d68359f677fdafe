# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
package SFTest::Flight;

# SFTest::Flight - what the singleflight module shows of its flights: the
# stats JSON of its zone, the $singleflight_status it logs, its debug log
# lines; and a flight of a leader and followers, started in order.  SFTest
# inherits these methods (see the API summary at the top of SFTest.pm);
# they are not used on their own.
#
# Zone stats come from a "singleflight_stats" location: zone "sf" at
# /stats unless given (zone => NAME, path => PATH, where there are options),
# asked for with ?diagnostics=1: the tests read internal gauges too
# (pages_baseline, marks, spilled, wakeups...).

use strict;
use warnings;

use Test::More ();
use Time::HiRes qw(time);

# ------------------------------------------------------------ zone stats

# The stats of one zone, as the JSON of singleflight_stats at $path has
# them; {} if there is no such zone or no stats.
sub zone_stats {
    my ($self, $zone, $path) = @_;
    $path //= '/stats';
    $path .= ($path =~ /\?/ ? '&' : '?') . 'diagnostics=1';
    return (($self->stats($path) // {})->{zones} // {})->{ $zone // 'sf' } // {};
}

# Polls the zone's stats until $cond->($zone) is true.  Returns ($ok, the
# last stats seen) ($ok alone in scalar context).  Options: zone, path, and
# wait_for's timeout (10 s), interval and what.
sub wait_zone {
    my ($self, $cond, %opt) = @_;
    my $zone;
    my $ok = $self->wait_for(sub {
        $zone = $self->zone_stats($opt{zone}, $opt{path});
        $cond->($zone);
    }, timeout => $opt{timeout} // 10, interval => $opt{interval},
       what => $opt{what} // 'zone stats');
    return wantarray ? ($ok, $zone) : $ok;
}

# wait_zone() until exactly $n followers wait in the zone (timeout 5 s).
sub wait_waiters {
    my ($self, $n, %opt) = @_;
    return $self->wait_zone(sub { ($_[0]{waiters} // -1) == $n },
        timeout => 5, what => "$n waiters", %opt);
}

# wait_zone() until the zone is idle: nothing in flight, nobody waiting,
# and its memory back to the baseline (pages_used == pages_baseline), and
# with instances => 1 the memory of each of its instances too.  No stats
# at all is not idle.
sub wait_zone_idle {
    my ($self, %opt) = @_;
    return $self->wait_zone(sub {
        my ($z) = @_;
        %$z && $z->{in_flight} == 0 && $z->{waiters} == 0
            && $z->{pages_used} == $z->{pages_baseline}
            && !($opt{instances}
                 && grep { $_->{pages_used} != $_->{pages_baseline} } @{ $z->{instances} });
    }, what => 'zone back to baseline', %opt);
}

# A test: the zone gets idle (wait_zone_idle), named $name; on failure the
# last stats seen are shown.  Returns whether it passed.
sub zone_baseline_ok {
    my ($self, $name, %opt) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;    # failures at the caller
    my ($ok, $zone) = $self->wait_zone_idle(%opt);
    Test::More::ok($ok, $name) or Test::More::diag(Test::More::explain($zone));
    return $ok;
}

# A test: the zone's origin_requests_total (zone_stats) rose from $before
# (that hash, as it was) by $want ({reason => n}: the reasons that did not
# rise left out), once it has, in 5 s at most: a fetch is counted as it
# ends, a hedge's loser maybe after the herd.  Returns whether it passed.
sub origin_requests_ok {
    my ($self, $before, $want, $name, %opt) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my $d;
    my $same = sub { join(',', map { "$_=$_[0]{$_}" } sort keys %{ $_[0] }) };
    $self->wait_zone(sub {
        my $now = $_[0]{origin_requests_total} // {};
        $d = { map { $_ => $now->{$_} - ($before->{$_} // 0) }
               grep { $now->{$_} != ($before->{$_} // 0) } keys %$now };
        $same->($d) eq $same->($want);
    }, timeout => 5, what => $name, %opt);
    return Test::More::is_deeply($d, $want, $name);
}

# ------------------------------------------------------------ a flight

# Starts the leader request, waits until the origin has it (the origin
# requests for target, default the leader's path, went up), waits until
# gap seconds have passed since the start if given, starts the followers,
# waits until waiters more (default: all of them) wait in zone "sf", and
# returns every result, the leader's first.  Requests are [METHOD, PATH,
# option => value, ...] as for start_request().
sub flight {
    my ($self, %a) = @_;
    my ($lm, $lp, %lo) = @{ $a{leader} };
    my $target = $a{target} // $lp;
    my $before = $self->origin_uri_hits($target);
    my $w0 = $self->zone_stats->{waiters} // 0;
    my $t0 = time;

    my $lh = $self->start_request($lm, $lp, %lo);
    $self->wait_for(sub { $self->origin_uri_hits($target) > $before },
        what => "origin to get $target");
    $self->wait_for(sub { time - $t0 >= $a{gap} }, timeout => $a{gap} + 1) if $a{gap};

    my @fh = map { my ($m, $p, %o) = @$_; $self->start_request($m, $p, %o) }
        @{ $a{followers} };
    my $n = $a{waiters} // scalar @fh;
    $self->wait_zone(sub { ($_[0]{waiters} // 0) >= $w0 + $n },
        what => "$n followers waiting") if $n;

    return [ map { $self->finish_request($_) } $lh, @fh ];
}

# ------------------------------------------------------------ log lines

# The access.log lines (config_template(log_singleflight => 1)) of GET
# $uri (a string, or a qr// the whole URI matches), once there are $n of
# them: ([HTTP status, $singleflight_status], ...).
sub _sf_access_log {
    my ($self, $uri, $n) = @_;
    my $re = ref $uri ? $uri : qr/\Q$uri\E/;
    my @lines;
    $self->wait_for(sub {
        @lines = map {
            my ($code) = /^\S+ "[^"]*" (\d+) /;
            my ($sf) = /sf=(\S*)/;
            [ $code // '?', $sf // '?' ]
        } grep { /"GET $re HTTP/ } split /\n/, $self->read_file('access.log');
        @lines >= $n;
    }, what => "$n access log lines for $uri");
    return @lines;
}

# The $singleflight_status values of those lines.
sub sf_statuses { map { $_->[1] } _sf_access_log(@_) }

# { "STATUS:CODE" => count } over those lines: each $singleflight_status
# with the HTTP status it ended with.
sub sf_outcomes { SFTest::tally(map { "$_->[1]:$_->[0]" } _sf_access_log(@_)) }

# From the debug log (log_level => 'debug') after $offset: the pid of the
# worker of the first flight's leader, and that flight's id ("PID#TID: *N
# singleflight leader of flight ID,"), once it is there (else empty).
sub wait_leader {
    my ($self, $offset) = @_;
    my ($pid, $id);
    $self->wait_for(sub {
        ($pid, $id) = $self->error_log_since($offset)
            =~ /(\d+)#\d+: \*\d+ singleflight leader of flight (\d+),/;
        defined $id;
    }, what => 'the leader');
    return ($pid, $id);
}

# From the debug log after $offset: how many requests joined flight $id
# as its readers per worker, { pid => count }, once they are $n in all (or
# at the timeout): followers, come before its header, and late readers,
# come after it (clients slow to start, curl's over HTTP/2, can be late).
sub wait_followers {
    my ($self, $id, $n, $offset) = @_;
    my %per;
    $self->wait_for(sub {
        %per = ();
        my $log = $self->error_log_since($offset);
        $per{$1}++ while $log =~ /(\d+)#\d+: \*\d+ singleflight (?:follower|late reader) of flight $id,/g;
        my $sum = 0;
        $sum += $_ for values %per;
        $sum >= $n;
    }, what => "$n followers");
    return \%per;
}

1;
