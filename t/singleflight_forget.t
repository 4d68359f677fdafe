#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_forget ZONE KEY: unlinks the GET and HEAD flights of a key
# and answers {"forgotten":N}.  A request arriving afterwards starts a
# fresh flight (a new origin request) while the old flight's followers
# still get the old leader's response; the old flight is freed when its
# last holder lets go.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sff '$pid|$singleflight_status|$status|$request_uri';
    access_log %%TESTDIR%%/sf.log sff;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        # the key leaves out the query: /f/k?a and /f/k?b are the same key
        location /f/ {
            singleflight sf;
            singleflight_key $uri;
            add_header X-SF $singleflight_status;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same, its first request going upstream on its own way
        location /fd/ {
            singleflight sf;
            singleflight_lone direct;
            singleflight_key $uri;
            add_header X-SF $singleflight_status;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /forget {
            singleflight_forget sf $arg_key;
        }

        location = /stats {
            singleflight_stats;
        }

        # an "if" or "limit_except" block runs its location's handler
        # with its own configuration: the location's settings in it
        location = /forget-if {
            singleflight_forget sf $arg_key;
            if ($arg_debug) {
                add_header X-Debug 1;
            }
            limit_except GET {
                deny all;
            }
        }

        location = /stats-if {
            singleflight_stats prometheus;
            if ($arg_debug) {
                add_header X-Debug 1;
            }
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

sub sf { $_[0]{headers}{'x-sf'} // '' }

# ------------------------------------------------------------ in an "if"

# Each answered as without the "if" (the worker crashed in the forget
# location; the stats came as JSON).
{
    my $r = $t->get('/forget-if?key=/f/none&debug=1');
    is("$r->{status} " . ($r->{headers}{'x-debug'} // '-') . " $r->{body}",
       qq(200 1 {"forgotten":0}\n), 'forget in an if block: answered');
    $r = $t->get('/forget-if?key=/f/none');
    is("$r->{status} $r->{body}", qq(200 {"forgotten":0}\n), 'forget beside it: answered');
    $r = $t->get('/stats-if?debug=1');
    like("$r->{status} " . ($r->{headers}{'x-debug'} // '-') . " $r->{body}",
         qr/^200 1 # HELP nginx_singleflight_/, 'stats in an if block: the Prometheus format');
}

# ------------------------------------------------------------ forget in flight

my $s0 = $t->zone_stats;

my $old = '/f/k1?delay=1500&size=500';
my $leader = $t->start_request('GET', $old);
$t->wait_for(sub { $t->origin_uri_hits($old) == 1 }, what => 'old leader at the origin');
my @of = map { $t->start_request('GET', $old) } 1 .. 10;
is(($t->wait_waiters(10))[1]{waiters}, 10, 'in flight: 10 followers wait on the old flight');

my $r = $t->get('/forget?key=/f/k1');
is($r->{status}, 200, 'forget: 200');
is($r->{body}, qq({"forgotten":1}\n), 'forget: {"forgotten":1}');
like($r->{headers}{'content-type'} // '', qr{^application/json}, 'forget: JSON');

# the same key again: a new flight, a new origin request, with followers of its own
my $new = '/f/k1?delay=300&size=500';
my $nl = $t->start_request('GET', $new);
ok($t->wait_for(sub { $t->origin_uri_hits($new) == 1 }, timeout => 3,
                what => 'new leader at the origin'),
   'after forget: the key went to the origin again while the old flight runs');
my @nf = map { $t->start_request('GET', $new) } 1 .. 5;
is(($t->wait_waiters(15))[1]{waiters}, 15, 'after forget: 5 new followers wait (15 in all)');

my @nres = map { $t->finish_request($_) } $nl, @nf;
my $nbody = SFTest::origin_body(2, $new, 500);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $nbody } @nres), 6,
   "after forget: the new flight's 6 clients got the new response (hit 2)");
is(join(',', map { sf($_) } @nres), join(',', 'LEADER', ('FOLLOWER') x 5),
   'after forget: new LEADER and its 5 FOLLOWERs');
ok(!grep({ $t->poll_request($_) } $leader, @of), 'after forget: ... before the old flight ended');

my @ores = map { $t->finish_request($_) } $leader, @of;
my $obody = SFTest::origin_body(1, $old, 500);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $obody } @ores), 11,
   "old flight: its leader and 10 followers got the old leader's response (hit 1)");
is(join(',', map { sf($_) } @ores), join(',', 'LEADER', ('FOLLOWER') x 10),
   'old flight: LEADER and 10 FOLLOWERs');
is($t->origin_hits->{total}, 2, '2 origin requests in all');

my $s1 = $t->zone_stats;
is($s1->{forgotten} - $s0->{forgotten}, 1, 'stats forgotten + 1');
is($s1->{flights} - $s0->{flights}, 2, 'stats flights + 2');
is($s1->{served} - $s0->{served}, 15, 'stats served + 15');
$t->zone_baseline_ok('forget in flight: zone back to baseline');

# ------------------------------------------------------------ nothing to forget

$s0 = $t->zone_stats;
$r = $t->get('/forget?key=/f/nothing');
is($r->{body}, qq({"forgotten":0}\n), 'unknown key: {"forgotten":0}');
$r = $t->get('/forget?key=/f/k1');
is($r->{body}, qq({"forgotten":0}\n), 'a key whose flights ended: {"forgotten":0}');
is($t->zone_stats->{forgotten} - $s0->{forgotten}, 0, 'stats forgotten unchanged');

# ------------------------------------------------------------ GET and HEAD

# A HEAD request first (a HEAD flight), then a GET (a GET flight of its own:
# a GET never follows a HEAD flight): forget drops both.

$t->origin_reset;
$s0 = $t->zone_stats;
my $uri = '/f/k2?delay=1000&size=300';
my $head = $t->start_request('HEAD', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'HEAD leader at the origin');
my $get = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 2 }, what => 'GET leader at the origin');

$r = $t->get('/forget?key=/f/k2');
is($r->{body}, qq({"forgotten":2}\n), 'GET and HEAD flights: {"forgotten":2}');

# a new GET now leads a third flight
my $third = $t->get('/f/k2?delay=10&size=300');
is(sf($third), 'LEADER', 'GET and HEAD flights: a new GET leads a fresh flight');
is($t->origin_uri_hits('/f/k2?delay=10&size=300'), 1, '... with its own origin request');

my $hr = $t->finish_request($head);
my $gr = $t->finish_request($get);
ok($hr->{status} == 200 && $hr->{complete} && $hr->{body} eq '' && sf($hr) eq 'LEADER',
   'GET and HEAD flights: the HEAD leader got its headers');
ok($gr->{status} == 200 && $gr->{complete} && sf($gr) eq 'LEADER'
   && $gr->{body} eq SFTest::origin_body(2, $uri, 300),
   'GET and HEAD flights: the GET leader got its response');
is($t->zone_stats->{forgotten} - $s0->{forgotten}, 2, 'stats forgotten + 2');
$t->zone_baseline_ok('GET and HEAD: zone back to baseline');

# ------------------------------------------------------------ its own way

# The first request went upstream on its own way and 5 more wait for its
# header in a flight: forgotten, that flight still gets the first one's
# response at its header (not singleflight_timeout's 10 s later), and a
# request arriving afterwards starts a fresh one.

$t->origin_reset;
$s0 = $t->zone_stats;
$old = '/fd/k?delay=1500&size=500';
$leader = $t->start_request('GET', $old);
$t->wait_for(sub { $t->origin_uri_hits($old) == 1 }, what => 'first request at the origin');
@of = map { $t->start_request('GET', $old) } 1 .. 5;
$t->wait_waiters(5);

$r = $t->get('/forget?key=/fd/k');
is($r->{body}, qq({"forgotten":1}\n), 'own way: {"forgotten":1}');

$new = '/fd/k?delay=300&size=500';
my $fresh = $t->get($new);
is($t->origin_uri_hits($new), 1, 'own way: a request after forget went to the origin');

@ores = map { $t->finish_request($_, timeout => 8) } $leader, @of;
$obody = SFTest::origin_body(1, $old, 500);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $obody } @ores), 6,
   "own way: the first request and its 5 followers got its response");
is(join(',', map { sf($_) } @ores), join(',', 'LEADER', ('FOLLOWER') x 5),
   'own way: LEADER and 5 FOLLOWERs');
is(scalar(grep { ($_->{time} // 99) < 4 } @ores), 6,
   'own way: at the first one\'s header, not at singleflight_timeout');
is($t->origin_hits->{total}, 2, 'own way: 2 origin requests in all');
$t->zone_baseline_ok('own way: zone back to baseline');

done_testing;
