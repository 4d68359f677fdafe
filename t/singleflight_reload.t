#!/usr/bin/perl
#
# Reload during a herd: the old workers finish every request they hold
# (leader and followers), requests that reach the new workers meanwhile
# join the same flight (the zone and its flights survive a reload of the
# same size), every client gets the complete response of the one origin
# request, the zone returns to its baseline, and the new workers collapse
# as before.

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

my $s0 = $t->zone_stats;
my $uri = '/r/x?delay=1500&size=50000';

my $leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
my @h = map { $t->start_request('GET', $uri) } 1 .. 99;
is(($t->wait_waiters(99))[1]{waiters}, 99, 'herd: 99 followers wait');

my %old = map { $_ => 1 } $t->worker_pids;
ok($t->reload, 'reload during the herd');
my @new = $t->worker_pids;
ok(@new == 2 && !grep({ $old{$_} } @new), 'reload: 2 new workers');

# latecomers reach the new workers and join the same flight
my @late = map { $t->start_request('GET', $uri) } 1 .. 50;
is(($t->wait_waiters(149))[1]{waiters}, 149,
   'reload: 50 latecomers joined the old flight (149 waiting)');

my @res = map { $t->finish_request($_) } $leader, @h, @late;
my $body = SFTest::origin_body(1, $uri, 50000);

is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @res), 150,
   'reload: 150 complete 200 responses');
is(scalar(grep { $_->{body} eq $body } @res), 150, "reload: every body is the one origin response");
is($t->origin_uri_hits($uri), 1, 'reload: 1 origin request');

my @log = logged($uri, 150);
is_deeply(SFTest::tally(map { $_->{sf} } @log), { LEADER => 1, FOLLOWER => 149 },
          'reload: logged 1 LEADER, 149 FOLLOWER');
is(scalar(grep { $_->{code} == 200 && $_->{bytes} == 50000 } @log), 150,
   'reload: 150 logged as complete 200 responses');
my ($lead) = grep { $_->{sf} eq 'LEADER' } @log;
ok($lead && $old{ $lead->{pid} }, 'reload: the leader was in an old worker');
my %newpid = map { $_ => 1 } @new;
is(scalar(grep { $newpid{ $_->{pid} } } @log), 50, 'reload: the 50 latecomers were served by new workers');

ok($t->wait_for(sub { !grep { SFTest::_alive($_) } keys %old }, what => 'old workers to exit'),
   'reload: the old workers exited');

my $s1 = $t->zone_stats;
is($s1->{flights} - $s0->{flights}, 1, 'reload: stats flights + 1 (counters kept across reload)');
is($s1->{served} - $s0->{served}, 149, 'reload: stats served + 149');
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

# A second reload while the flight's leader is in a worker that is itself
# replaced, and latecomers in a third generation of workers.

$t->origin_reset;
$uri = '/r/z?delay=1500&size=3000';
$leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
@h = map { $t->start_request('GET', $uri) } 1 .. 30;
$t->wait_waiters(30);
ok($t->reload, 'first reload');
push @h, map { $t->start_request('GET', $uri) } 1 .. 30;
$t->wait_waiters(60);
ok($t->reload, 'second reload');
push @h, map { $t->start_request('GET', $uri) } 1 .. 30;
is(($t->wait_waiters(90))[1]{waiters}, 90, 'two reloads: 90 followers from 3 generations wait');

@res = map { $t->finish_request($_) } $leader, @h;
$body = SFTest::origin_body(1, $uri, 3000);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res), 91,
   'two reloads: 91 complete responses of the one origin request');
is($t->origin_uri_hits($uri), 1, 'two reloads: 1 origin request');
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

done_testing;
