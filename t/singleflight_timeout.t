#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_timeout: a follower that waits longer than the timeout goes
# upstream on its own (TIMEOUT in $singleflight_status); the leader and
# its flight go on undisturbed.  Followers of a flight that ends in time
# get the leader's response.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sft '$pid $singleflight_status $singleflight_wait_time '
                   '$status $body_bytes_sent $request_uri';
    access_log %%TESTDIR%%/sf.log sft;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_timeout 300ms;
            proxy_pass http://%%ORIGIN%%;
        }

        location /later/ {
            singleflight sf;
            singleflight_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same, its first request going upstream on its own way
        location /laterd/ {
            singleflight sf;
            singleflight_lone direct;
            singleflight_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        location /patient/ {
            singleflight sf;
            singleflight_timeout 2s;
            proxy_pass http://%%ORIGIN%%;
        }

        # the default: 60 s, as nginx's proxy_read_timeout
        location /default/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# the logged requests of one URI: [{status, wait, code, bytes, ...}, ...]
sub wait_logged {
    my ($uri, $n) = @_;
    return $t->wait_log_records('sf.log', [qw(pid status wait code bytes uri)], $n, uri => $uri);
}

sub count_status { SFTest::tally(map { $_->{status} } @_) }

my $stats0 = $t->zone_stats;

# ------------------------------------------------------------ timeout

# 10 requests on a 1500 ms origin with a 300 ms timeout: the leader fetches
# hit 1; the 9 followers give up after 300 ms and fetch hits 2..10 alone.

my $uri = '/slow?delay=1500&size=2000';
my @h = map { $t->start_request('GET', $uri) } 1 .. 10;

# while the leader is still waiting for the origin

ok($t->wait_for(sub { $t->origin_hits->{total} == 10 }, timeout => 5,
                what => '10 origin requests'),
   'timeout: the followers went upstream');
my $zone = $t->zone_stats;
is($zone->{in_flight}, 1, 'timeout: ... while the leader\'s flight is still in the air');
is($zone->{waiters}, 0, 'timeout: with no follower left waiting');

my $res = [ map { $t->finish_request($_) } @h ];

is($t->origin_hits->{total}, 10, 'timeout: 10 origin requests in all');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 10,
   'timeout: 10 complete 200 responses');
is(join(',', sort { $a <=> $b } map { $_->{headers}{'x-hit'} // 0 } @$res),
   join(',', 1 .. 10), 'timeout: each got its own origin response');
is(scalar(grep { $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uri, 2000) }
          @$res), 10, 'timeout: every body complete, of its own hit');

my ($leader) = grep { ($_->{headers}{'x-hit'} // 0) == 1 } @$res;
ok($leader && $leader->{complete} && $leader->{status} == 200
   && $leader->{body} eq SFTest::origin_body(1, $uri, 2000),
   'timeout: the leader got hit 1, complete');

my @log = wait_logged($uri, 10);
is_deeply(count_status(@log), { LEADER => 1, TIMEOUT => 9 }, 'timeout: 1 LEADER, 9 TIMEOUT');

my ($lead) = grep { $_->{status} eq 'LEADER' } @log;
ok($lead && $lead->{code} == 200 && $lead->{bytes} == 2000,
   'timeout: the leader\'s response was not cut short');

my @waits = map { $_->{wait} } grep { $_->{status} eq 'TIMEOUT' } @log;
is(scalar(grep { /^\d+$/ && $_ >= 300 && $_ < 1500 } @waits), 9,
   'timeout: $singleflight_wait_time of TIMEOUT is >= 300 and < 1500')
    or diag("wait times: @waits");

$zone = $t->zone_stats;
is($zone->{timeouts} - $stats0->{timeouts}, 9, 'timeout: stats count 9 timeouts');
is($zone->{served} - $stats0->{served}, 0, 'timeout: stats count none served');
is($zone->{in_flight}, 0, 'timeout: nothing in flight afterwards');

# ------------------------------------------------------------ flight goes on

# After its followers timed out the flight is still there to be followed:
# a request arriving then waits for the leader's response (1 s timeout,
# 1500 ms origin: the late one arrives at about 1 s, is served at 1.5 s).

$stats0 = $zone;
$t->origin_reset;
$uri = '/later/x?delay=1500&size=2000';
@h = map { $t->start_request('GET', $uri) } 1 .. 5;

$t->wait_for(sub { $t->zone_stats->{timeouts} - $stats0->{timeouts} == 4 },
             what => '4 timeouts');
my $late = $t->finish_request($t->start_request('GET', $uri));
$res = [ map { $t->finish_request($_) } @h ];

is($t->origin_hits->{total}, 5, 'flight goes on: 1 leader + 4 timed out, 5 origin requests');
is($late->{status}, 200, 'flight goes on: the late request got 200');
is($late->{body}, SFTest::origin_body(1, $uri, 2000),
   'flight goes on: ... and the leader\'s response');
is(scalar(grep { $_->{complete} && $_->{body} eq
                 SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uri, 2000) } @$res), 5,
   'flight goes on: the first 5 got complete responses');

@log = wait_logged($uri, 6);
is_deeply(count_status(@log), { LEADER => 1, TIMEOUT => 4, FOLLOWER => 1 },
          'flight goes on: 1 LEADER, 4 TIMEOUT, 1 FOLLOWER');
$zone = $t->zone_stats;

# The same where the first request went upstream on its own way and the
# others waited for its header: once they timed out, a late request still
# waits for that header rather than going to the origin itself.

$stats0 = $zone;
$t->origin_reset;
$uri = '/laterd/x?delay=1500&size=2000';
@h = map { $t->start_request('GET', $uri) } 1 .. 5;

$t->wait_for(sub { $t->zone_stats->{timeouts} - $stats0->{timeouts} == 4 },
             what => '4 timeouts');
$late = $t->finish_request($t->start_request('GET', $uri));
$res = [ map { $t->finish_request($_) } @h ];

is($t->origin_hits->{total}, 5, 'own way, flight goes on: 5 origin requests');
is($late->{body}, SFTest::origin_body(1, $uri, 2000),
   'own way, flight goes on: the late request got the first one\'s response');
@log = wait_logged($uri, 6);
is_deeply(count_status(@log), { LEADER => 1, TIMEOUT => 4, FOLLOWER => 1 },
          'own way, flight goes on: 1 LEADER, 4 TIMEOUT, 1 FOLLOWER');
$zone = $t->zone_stats;

# ------------------------------------------------------------ in time

# a 200 ms flight and a 2 s timeout: everyone gets the leader's response

$stats0 = $zone;
$t->origin_reset;
$uri = '/patient/x?delay=200&size=2000';
$res = $t->herd(n => 10, path => $uri);

is($t->origin_hits->{total}, 1, 'in time: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 2000) } @$res), 10,
   'in time: every client got the leader\'s response');

@log = wait_logged($uri, 10);
is_deeply(count_status(@log), { LEADER => 1, FOLLOWER => 9 }, 'in time: 1 LEADER, 9 FOLLOWER');
@waits = map { $_->{wait} } grep { $_->{status} eq 'FOLLOWER' } @log;
is(scalar(grep { /^\d+$/ && $_ < 2000 } @waits), 9,
   'in time: $singleflight_wait_time of followers is below the timeout')
    or diag("wait times: @waits");

$zone = $t->zone_stats;
is($zone->{timeouts} - $stats0->{timeouts}, 0, 'in time: no timeouts');
is($zone->{served} - $stats0->{served}, 9, 'in time: 9 served');

# ------------------------------------------------------------ the default

# an origin that takes 10.5 s: by default the followers wait for it, as
# long as nginx's upstream would wait for a header (60 s), rather than
# give up at 10 s and ask it themselves, 10 s late

$t->origin_reset;
$uri = '/default/x?delay=10500&size=2000';
$res = $t->herd(n => 5, path => $uri, timeout => 30);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 5,
   'default: every client got a 200');
is($t->origin_hits->{total}, 1, 'default: 1 origin request');
@log = wait_logged($uri, 5);
is_deeply(count_status(@log), { LEADER => 1, FOLLOWER => 4 }, 'default: 1 LEADER, 4 FOLLOWER');

done_testing;
