#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# The core promise: concurrent identical requests become one origin
# request, and every client gets the full response, in whichever worker it
# landed.  Modelled on nginx-tests' proxy_cache_lock.t: the origin numbers
# its responses, requests start together, all must carry the same number.

use strict;
use warnings;

use Test::More;

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sf '$pid $singleflight_status $request_uri';
    access_log %%TESTDIR%%/sf.log sf;

    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status;
        }

        location /off/ {
            singleflight off;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ one herd

my $uri = '/herd?delay=300&size=20000';
my $res = $t->herd(n => 200, path => $uri);

is(scalar(grep { $_->{status} && $_->{status} == 200 && $_->{complete} }
          @$res), 200, 'herd: 200 complete 200 responses');
is(scalar(grep { $_->{body} eq SFTest::origin_body(1, $uri, 20000) } @$res),
   200, 'herd: every body is the first origin response');
is($t->origin_hits->{total}, 1, 'herd: one origin request');

my %sf = %{ SFTest::tally(map { $_->{headers}{'x-sf'} // '' } @$res) };
is($sf{LEADER}, 1, 'herd: one leader');
is($sf{FOLLOWER}, 199, 'herd: 199 followers');

# add_header and the origin's own headers reach followers too
is(scalar(grep { ($_->{headers}{'x-hit'} // '') eq '1'
                 && ($_->{headers}{'content-type'} // '') eq 'text/plain'
                 && ($_->{headers}{'content-length'} // '') eq '20000' }
          @$res), 200, 'herd: origin headers on every response');

# the log lines of the herd: {pid, sf, uri}
my @log = $t->wait_log_records('sf.log', [qw(pid sf uri)], 200, uri => $uri);
my ($leader) = map { $_->{pid} } grep { $_->{sf} eq 'LEADER' } @log;
my %fpids = map { $_->{pid} => 1 } grep { $_->{sf} eq 'FOLLOWER' } @log;

SKIP: {
    skip 'all requests landed in one worker', 1 if keys %fpids < 2;
    ok(grep({ $_ ne $leader } keys %fpids),
       'herd: followers in another worker than the leader were served');
}

# ------------------------------------------------------------ waves

# 5 waves of 200 on the same URI: each wave is one flight of its own
$t->origin_reset;
$uri = '/waves?delay=200&size=1000';

my ($complete, $right) = (0, 0);

for my $wave (1 .. 5) {
    $res = $t->herd(n => 200, path => $uri);
    $complete += grep { $_->{status} && $_->{status} == 200
                        && $_->{complete} } @$res;
    $right += grep { $_->{body} eq SFTest::origin_body($wave, $uri, 1000) }
              @$res;
}

is($complete, 1000, 'waves: 1000 complete responses');
is($right, 1000, "waves: each wave got its own flight's body");
is($t->origin_hits->{total}, 5, 'waves: 5 origin requests');

# ------------------------------------------------------------ not a cache

$t->origin_reset;

my $r1 = $t->get('/seq?delay=10');
my $r2 = $t->get('/seq?delay=10');
is($r1->{headers}{'x-hit'}, 1, 'sequential: first hit');
is($r2->{headers}{'x-hit'}, 2, 'sequential: the second request goes to the origin');
is($r2->{headers}{'x-sf'}, 'DIRECT', 'sequential: on its own way, as without the module');

# ------------------------------------------------------------ off

$t->origin_reset;
$res = $t->herd(n => 20, path => '/off/x?delay=200');
is($t->origin_hits->{total}, 20, 'singleflight off: not collapsed');

# ------------------------------------------------------------ zone is empty

my (undef, $zone) = $t->wait_zone_idle;

is($zone->{in_flight}, 0, 'stats: nothing in flight');
is($zone->{pages_used}, $zone->{pages_baseline},
   'stats: zone memory back to baseline');
is($zone->{flights}, 1 + 5, 'stats: flights counted, of herds only');
is($zone->{followers}, 199 + 5 * 199, 'stats: followers counted');
is($zone->{served}, 199 + 5 * 199, 'stats: followers served');

done_testing;
