#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Reload during a herd: the old workers finish every request they hold
# (leader and followers) on their flight; requests that reach the new
# workers meanwhile start a flight of their own (flights never cross a
# reload: docs/design.md, "Failures in detail"), so each generation costs one
# origin request; every client gets a complete response, the zone and its
# counters survive the reload, the zone returns to its baseline, and the
# new workers collapse as before.  The old workers, quitting once their
# requests are over, do not let the new generation's flight go.  And a
# reload to a configuration without zones, then back, crashes no worker.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $conf = $t->config_template(<<'EOT');
    log_format sfr '$pid|$singleflight_status|$status|$body_bytes_sent|$request_uri';
    access_log %%TESTDIR%%/sf.log sfr;

    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /r/ {
            singleflight sf;
            add_header X-SF $singleflight_status;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->write_config($conf);
$t->start;

# ------------------------------------------------------------ helpers

# the access log lines of one URI, once n are there: [{pid, sf, code, bytes, uri}, ...]
sub logged {
    my ($uri, $n) = @_;
    return $t->wait_log_records('sf.log', [qw(pid sf code bytes uri)], $n, sep => '|', uri => $uri);
}

# ------------------------------------------------------------ reload in a herd

# Flights never cross a reload (docs/design.md, "Failures in detail"): a
# reloaded location may send a different upstream request.  The old
# workers finish their flight for the requests they hold; requests of the
# new configuration start a flight of their own, which costs one more
# origin request and no more.

my $s0 = $t->zone_stats;
my $uri = '/r/x?delay=2000&size=50000';

my $leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
my @h = map { $t->start_request('GET', $uri) } 1 .. 99;
is(($t->wait_waiters(99))[1]{waiters}, 99, 'herd: 99 followers wait');
# (the flight is counted at the first request's header: singleflight_lone
# direct, the default, lets that request go its own way until then)

my %old = map { $_ => 1 } $t->worker_pids;
ok($t->reload, 'reload during the herd');
my @new = $t->worker_pids;
ok(@new == 2 && !grep({ $old{$_} } @new), 'reload: 2 new workers');

# latecomers reach the new workers: one flight of their own, while the
# old flight still holds its 99 followers
my @late = map { $t->start_request('GET', $uri) } 1 .. 50;
ok($t->wait_for(sub { $t->origin_uri_hits($uri) == 2 }, what => 'the new flight at the origin'),
   'reload: the latecomers started a flight of their own');
is(($t->wait_waiters(99 + 49))[1]{waiters}, 99 + 49,
   'reload: the old flight\'s 99 followers still wait, and 49 latecomers wait on the new one');

my @res = map { $t->finish_request($_) } $leader, @h;
my @lres = map { $t->finish_request($_) } @late;
my $body1 = SFTest::origin_body(1, $uri, 50000);
my $body2 = SFTest::origin_body(2, $uri, 50000);

is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @res, @lres), 150,
   'reload: 150 complete 200 responses');
is(scalar(grep { $_->{body} eq $body1 } @res), 100,
   'reload: the old generation\'s 100 requests share the first origin response');
is(scalar(grep { $_->{body} eq $body2 } @lres), 50,
   'reload: the 50 latecomers share the second origin response');
is($t->origin_uri_hits($uri), 2, 'reload: 2 origin requests, one per generation');

my @log = logged($uri, 150);
is_deeply(SFTest::tally(map { $_->{sf} } @log), { LEADER => 2, FOLLOWER => 148 },
          'reload: logged 2 LEADER, 148 FOLLOWER');
is(scalar(grep { $_->{code} == 200 && $_->{bytes} == 50000 } @log), 150,
   'reload: 150 logged as complete 200 responses');
my %newpid = map { $_ => 1 } @new;
is_deeply(SFTest::tally(map { ($newpid{ $_->{pid} } ? 'new' : $old{ $_->{pid} } ? 'old' : '?')
                              . " $_->{sf}" } @log),
          { 'old LEADER' => 1, 'old FOLLOWER' => 99, 'new LEADER' => 1, 'new FOLLOWER' => 49 },
          'reload: one leader and its followers in each generation of workers');

ok($t->wait_for(sub { !grep { SFTest::_alive($_) } keys %old }, what => 'old workers to exit'),
   'reload: the old workers exited');

my $s1 = $t->zone_stats;
is($s1->{flights} - $s0->{flights}, 2, 'reload: stats flights + 2 (counters kept across reload)');
is($s1->{served} - $s0->{served}, 148, 'reload: stats served + 148');
$t->zone_baseline_ok('reload: zone back to baseline');

# ------------------------------------------------------------ after

$t->origin_reset;
$uri = '/r/y?delay=300&size=2000';
my $res = $t->herd(n => 100, path => $uri);

is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 2000) } @$res), 100,
   'after reload: 100 complete responses of the one origin request');
is($t->origin_uri_hits($uri), 1, 'after reload: 1 origin request');
@log = logged($uri, 100);
is_deeply(SFTest::tally(map { $_->{sf} } @log), { LEADER => 1, FOLLOWER => 99 },
          'after reload: 1 LEADER, 99 FOLLOWER');
is(scalar(grep { $newpid{ $_->{pid} } } @log), 100, 'after reload: all in the new workers');
$t->zone_baseline_ok('after reload: zone back to baseline');

# ------------------------------------------------------------ two reloads

# A second reload while the first generation's flight is still on its
# way, and while the second generation's workers are themselves being
# replaced: three generations, three flights at once, each with its own
# followers, none of them left waiting.

$t->origin_reset;
my $s2 = $t->zone_stats;
$uri = '/r/z?delay=4000&size=3000';
my @gen;    # [handles] per generation
$leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
$gen[0] = [ $leader, map { $t->start_request('GET', $uri) } 1 .. 30 ];
$t->wait_waiters(30);
my @pids = ({ map { $_ => 1 } $t->worker_pids });
ok($t->reload, 'first reload');
push @pids, { map { $_ => 1 } $t->worker_pids };
$gen[1] = [ map { $t->start_request('GET', $uri) } 1 .. 30 ];
$t->wait_for(sub { $t->origin_uri_hits($uri) == 2 }, what => 'generation 2 at the origin');
$t->wait_waiters(30 + 29);
ok($t->reload, 'second reload');
push @pids, { map { $_ => 1 } $t->worker_pids };
$gen[2] = [ map { $t->start_request('GET', $uri) } 1 .. 30 ];
$t->wait_for(sub { $t->origin_uri_hits($uri) == 3 }, what => 'generation 3 at the origin');
is(($t->wait_waiters(30 + 29 + 29))[1]{waiters}, 88,
   'two reloads: the followers of 3 generations wait, each on its own flight');
is($t->zone_stats->{in_flight}, 3, 'two reloads: 3 flights in flight');

for my $g (0 .. 2) {
    my @r = map { $t->finish_request($_) } @{ $gen[$g] };
    my $want = SFTest::origin_body($g + 1, $uri, 3000);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $want } @r),
       scalar @r, "two reloads: generation " . ($g + 1) . ": " . @r
       . " complete responses of origin request " . ($g + 1));
}
is($t->origin_uri_hits($uri), 3, 'two reloads: 3 origin requests, one per generation');
@log = logged($uri, 91);
my %by;
for my $r (@log) {
    my ($g) = grep { $pids[$_]{ $r->{pid} } } 0 .. 2;
    $by{ (defined $g ? $g + 1 : '?') . " $r->{sf}" }++;
}
is_deeply(\%by, { '1 LEADER' => 1, '1 FOLLOWER' => 30, '2 LEADER' => 1, '2 FOLLOWER' => 29,
                  '3 LEADER' => 1, '3 FOLLOWER' => 29 },
          'two reloads: each generation\'s workers led one flight, followed by their own');
my $s3 = $t->zone_stats;
is($s3->{flights} - $s2->{flights}, 3, 'two reloads: stats flights + 3 (counters kept)');
is($s3->{served} - $s2->{served}, 88, 'two reloads: stats served + 88');
$t->zone_baseline_ok('two reloads: zone back to baseline');

# ------------------------------------------------------------ new zone size

# A reload that changes the zone's size makes a new zone: the old workers
# finish their flight in the old one, latecomers start a fresh flight in
# the new one.  Nobody is left hanging.

$t->origin_reset;
$uri = '/r/s?delay=1000&size=3000';
$leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
@h = map { $t->start_request('GET', $uri) } 1 .. 30;
$t->wait_waiters(30);

$t->write_config($conf =~ s/zone=sf:1m/zone=sf:2m/r);
ok($t->reload, 'reload with a new zone size');
is($t->zone_stats->{flights}, 0, 'new zone size: a new zone (counters start at 0)');

my @late2 = map { $t->start_request('GET', $uri) } 1 .. 30;
ok($t->wait_for(sub { $t->origin_uri_hits($uri) == 2 }, what => 'a second flight'),
   'new zone size: latecomers started a flight of their own');

@res = map { $t->finish_request($_) } $leader, @h;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 3000) } @res), 31,
   'new zone size: the old flight answered its 31 clients');
@res = map { $t->finish_request($_) } @late2;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(2, $uri, 3000) } @res), 30,
   'new zone size: the new flight answered its 30 clients');
is($t->origin_uri_hits($uri), 2, 'new zone size: 2 origin requests');
$t->zone_baseline_ok('new zone size: zone back to baseline');

# ------------------------------------------------------------ no zone, and back

# A reload to a configuration without singleflight_zone (the module still
# loaded, switched off in the configuration), then back: the workers
# without zones serve, and exit cleanly at the next reload (they once
# reached, at their exit, for the registry's zone, which the master had
# unmapped: SIGSEGV).

my $off = $t->log_offset;
$t->write_config($t->config_template(<<'EOT'));
    server {
        listen 127.0.0.1:%%PORT%%;
        location /r/ { proxy_pass http://%%ORIGIN%%; }
    }
EOT
ok($t->reload(wait_old => 1), 'reload to a configuration without zones');
is($t->get('/r/n?size=100')->{status}, 200, 'without zones: served');

$t->write_config($conf);
ok($t->reload(wait_old => 1), 'reload back to a zone');
is($t->log_count(qr/exited on signal/, $off), 0,
   'the workers without zones exited cleanly');
is($t->get('/r/n2?size=100')->{status}, 200, 'a zone again: served');

done_testing;
