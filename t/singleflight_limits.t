#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Limits on waiting.  singleflight_timeout TIME status=CODE: a follower that
# waited TIME is answered CODE while the leader's flight goes on.
# singleflight_max_waiters N: a flight takes at most N followers; the
# overflow goes upstream on its own (OVERFLOW), or with status=CODE is
# answered CODE at once.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /to504/ {
            singleflight sf;
            singleflight_timeout 300ms status=504;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mw/ {
            singleflight sf;
            singleflight_max_waiters 5;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same, its first request going upstream on its own way
        location /mwd/ {
            singleflight sf;
            singleflight_lone direct;
            singleflight_max_waiters 5;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mw503/ {
            singleflight sf;
            singleflight_max_waiters 5 status=503;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# ------------------------------------------------------------ timeout status=

# A 1200 ms origin, followers give up after 300 ms with 504; the leader
# carries on and gets its 200.

my $s0 = $t->zone_stats;
my $uri = '/to504/x?delay=1200&size=1000';

my $leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
my @f = map { $t->start_request('GET', $uri) } 1 .. 10;

# all followers answered while the leader is still waiting for the origin
my $zone;
ok($t->poll_all(\@f, timeout => 5, what => 'followers answered'),
   'timeout status=504: the followers were answered');
ok(!$t->poll_request($leader), 'timeout status=504: ... while the leader still waits');
$zone = $t->zone_stats;
is($zone->{in_flight}, 1, 'timeout status=504: ... and its flight is still in the air');

my @res = map { $_->{res} } @f;
my $lr = $t->finish_request($leader);

is(scalar(grep { ($_->{status} // 0) == 504 && $_->{complete} } @res), 10,
   'timeout status=504: 10 followers got 504');
my @times = map { $_->{time} } @res;
is(scalar(grep { $_ >= 0.29 && $_ < 1.1 } @times), 10,
   'timeout status=504: after about 300 ms, well before the origin answered')
    or diag(join ' ', map { sprintf '%.3f', $_ } @times);
ok($lr->{status} == 200 && $lr->{complete}
   && $lr->{body} eq SFTest::origin_body($t->origin_hits->{total}, $uri, 1000),
   'timeout status=504: the leader got its complete 200');
is($t->origin_uri_hits($uri), 1, 'timeout status=504: 1 origin request');
is_deeply($t->sf_outcomes($uri, 11), { 'LEADER:200' => 1, 'TIMEOUT:504' => 10 },
          'timeout status=504: logged LEADER:200, 10 TIMEOUT:504');

my $s1 = $t->zone_stats;
is($s1->{timeouts} - $s0->{timeouts}, 10, 'timeout status=504: stats timeouts + 10');
is($s1->{served} - $s0->{served}, 0, 'timeout status=504: stats served + 0');
$t->zone_baseline_ok('timeout status=504: zone back to baseline');

# ------------------------------------------------------------ max_waiters

# A herd of 20 on a flight that takes 5 followers: the leader, 5 followers
# served from the flight, 14 overflow requests fetch on their own.

$s0 = $t->zone_stats;
$uri = '/mw/x?delay=800&size=1000';
my $res = $t->herd(n => 20, path => $uri);

is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uri, 1000) }
          @$res), 20, 'max_waiters 5: 20 complete 200 responses');
is($t->origin_uri_hits($uri), 15, 'max_waiters 5: 15 origin requests (1 leader + 14 overflow)');
my %by_hit;
$by_hit{ $_->{headers}{'x-hit'} // 0 }++ for @$res;
is((sort { $b <=> $a } values %by_hit)[0], 6,
   "max_waiters 5: 6 clients (leader + 5 followers) share one origin response");
is_deeply($t->sf_outcomes($uri, 20),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => 5, 'OVERFLOW:200' => 14 },
          'max_waiters 5: logged 1 LEADER, 5 FOLLOWER, 14 OVERFLOW');

$s1 = $t->zone_stats;
is($s1->{overflows} - $s0->{overflows}, 14, 'max_waiters 5: stats overflows + 14');
is($s1->{followers} - $s0->{followers}, 5, 'max_waiters 5: stats followers + 5');
$t->zone_baseline_ok('max_waiters 5: zone back to baseline');

# The same where the first request went upstream on its own way and the
# others wait for its header: 5 followers still

$uri = '/mwd/x?delay=800&size=1000';
$res = $t->herd(n => 20, path => $uri);

is($t->origin_uri_hits($uri), 15, 'max_waiters 5, own way: 15 origin requests');
is_deeply($t->sf_outcomes($uri, 20),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => 5, 'OVERFLOW:200' => 14 },
          'max_waiters 5, own way: logged 1 LEADER, 5 FOLLOWER, 14 OVERFLOW');
$t->zone_baseline_ok('max_waiters 5, own way: zone back to baseline');

# ------------------------------------------------------------ status=

# the same with status=503: the overflow is answered 503 at once

$s0 = $t->zone_stats;
$uri = '/mw503/x?delay=800&size=1000';
my $t0 = time;
$res = $t->herd(n => 20, path => $uri);

my @ok = grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res;
my @over = grep { ($_->{status} // 0) == 503 && $_->{complete} } @$res;
my $body = SFTest::origin_body($t->origin_hits->{total}, $uri, 1000);

is(scalar(@ok), 6, 'max_waiters 5 status=503: 6 got 200');
is(scalar(grep { $_->{body} eq $body } @ok), 6, '... all the one origin response');
is(scalar(@over), 14, 'max_waiters 5 status=503: 14 got 503');
is(scalar(grep { $_->{time} < 0.6 } @over), 14,
   'max_waiters 5 status=503: at once, not after the 800 ms origin')
    or diag(join ' ', map { sprintf '%.3f', $_->{time} } @over);
is($t->origin_uri_hits($uri), 1, 'max_waiters 5 status=503: 1 origin request');
is_deeply($t->sf_outcomes($uri, 20),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => 5, 'OVERFLOW:503' => 14 },
          'max_waiters 5 status=503: logged 1 LEADER, 5 FOLLOWER, 14 OVERFLOW:503');

$s1 = $t->zone_stats;
is($s1->{overflows} - $s0->{overflows}, 14, 'max_waiters 5 status=503: stats overflows + 14');
$t->zone_baseline_ok('max_waiters 5 status=503: zone back to baseline');

done_testing;
