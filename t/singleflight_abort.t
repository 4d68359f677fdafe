#!/usr/bin/perl
#
# Client aborts.  A follower whose client goes away (FIN or RST) leaves its
# flight at once: the zone's waiters gauge drops, the other followers and
# the leader are not disturbed, and the zone is back to its baseline after.
# A leader whose client goes away makes nginx abort the upstream request
# (499): that is the "abort" promote condition, one follower is promoted
# and fetches for the others; without "abort" in singleflight_promote the
# followers get 502 at once.

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

    server {
        listen 127.0.0.1:%%PORT%%;

        location /ab/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /ab-noabort/ {
            singleflight sf;
            singleflight_promote error timeout;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

sub waiters_ok {
    my ($n, $what) = @_;
    my ($ok, $zone) = $t->wait_waiters($n);
    ok($ok, "$what: waiters is $n") or diag(explain($zone));
    return $zone;
}

# Starts the leader of URI and waits for it at the origin, then N followers
# and waits until they all wait.
sub flight {
    my ($uri, $n, $what) = @_;
    my $leader = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
    my @f = map { $t->start_request('GET', $uri) } 1 .. $n;
    waiters_ok($n, "$what, all joined");
    return ($leader, @f);
}

# ------------------------------------------------------------ follower abort

my $s0 = $t->zone_stats;
my $uri = '/ab/f?delay=1500&size=2000';
my ($leader, @f) = flight($uri, 20, 'follower abort');

# 5 close normally (FIN), 5 with RST
$t->abort_request($_) for @f[0 .. 4];
$t->abort_request($_, rst => 1) for @f[5 .. 9];

my $zone = waiters_ok(10, 'follower abort, 10 gone');
is($zone->{in_flight}, 1, 'follower abort: the flight is still in the air');

my $lr = $t->finish_request($leader);
my @rest = map { $t->finish_request($_) } @f[10 .. 19];
my $body = SFTest::origin_body(1, $uri, 2000);

ok($lr->{status} == 200 && $lr->{complete} && $lr->{body} eq $body,
   'follower abort: the leader got its complete response');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @rest),
   10, "follower abort: the 10 remaining followers got the leader's response");
is($t->origin_uri_hits($uri), 1, 'follower abort: 1 origin request');
is(($t->origin_hits->{aborted} // 0), 0, 'follower abort: no upstream request was aborted');
is_deeply($t->sf_outcomes($uri, 21),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => 10, 'FOLLOWER:499' => 10 },
          'follower abort: logged LEADER:200, 10 FOLLOWER:200, 10 FOLLOWER:499');

my $s1 = $t->zone_stats;
is($s1->{followers} - $s0->{followers}, 20, 'follower abort: stats followers + 20');
is($s1->{served} - $s0->{served}, 10, 'follower abort: stats served + 10');
is($s1->{errors} - $s0->{errors}, 0, 'follower abort: stats errors + 0');
$t->zone_baseline_ok('follower abort: zone back to baseline');

# ------------------------------------------------------------ leader abort

# The leader's client goes away while the origin is still thinking: nginx
# aborts the upstream request (499), a follower is promoted and refetches.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/l?delay=1000&size=2000';
($leader, @f) = flight($uri, 20, 'leader abort');

$t->abort_request($leader);
ok($t->wait_for(sub { $t->origin_hits->{aborted} == 1 }, what => 'upstream aborted'),
   'leader abort: nginx aborted the upstream request');

my @res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(2, $uri, 2000);

is($t->origin_uri_hits($uri), 2, 'leader abort: 2 origin requests (leader + promoted)');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, "leader abort: all 20 followers got the promoted leader's response");
is_deeply($t->sf_outcomes($uri, 21),
          { 'LEADER:499' => 1, 'PROMOTED:200' => 1, 'FOLLOWER:200' => 19 },
          'leader abort: logged LEADER:499, PROMOTED:200, 19 FOLLOWER:200');

$s1 = $t->zone_stats;
is($s1->{promotions} - $s0->{promotions}, 1, 'leader abort: stats promotions + 1');
is($s1->{served} - $s0->{served}, 19, 'leader abort: stats served + 19');
$t->zone_baseline_ok('leader abort: zone back to baseline');

# ------------------------------------------------------------ leader abort mid-body

# The leader's client goes away after the header, while the origin is still
# sending the body slowly: what was captured is dropped, a follower is
# promoted and the followers get its complete response, never the first
# leader's partial one.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/m?fail=slowbody&fail_first=1&pieces=4&delay=300&size=200000';
($leader, @f) = flight($uri, 20, 'leader abort mid-body');

ok($t->wait_for(sub { $t->poll_request($leader); defined $leader->{res}{status} },
                what => "the leader's header"), 'leader abort mid-body: the leader got the header');
ok(!$leader->{res}{complete}, 'leader abort mid-body: ... but not the whole body yet');
$t->abort_request($leader, rst => 1);

@res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(2, $uri, 200000);

is($t->origin_uri_hits($uri), 2, 'leader abort mid-body: 2 origin requests');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, "leader abort mid-body: all 20 followers got the promoted leader's complete body");
my $o = $t->sf_outcomes($uri, 21);
is(($o->{'PROMOTED:200'} // 0) . '/' . ($o->{'FOLLOWER:200'} // 0), '1/19',
   'leader abort mid-body: logged PROMOTED:200 and 19 FOLLOWER:200')
    or diag(explain($o));
is($t->zone_stats->{promotions} - $s0->{promotions}, 1,
   'leader abort mid-body: stats promotions + 1');
$t->zone_baseline_ok('leader abort mid-body: zone back to baseline');

# ------------------------------------------------------------ abort not listed

# singleflight_promote error timeout: the leader's abort fails the flight,
# every follower gets 502 at once instead of waiting for a refetch.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab-noabort/l?delay=1500';
($leader, @f) = flight($uri, 20, 'abort not listed');

my $ta = time;
$t->abort_request($leader);
@res = map { $t->finish_request($_) } @f;
my $took = time - $ta;

is(scalar(grep { ($_->{status} // 0) == 502 && $_->{complete} } @res), 20,
   'abort not listed: all 20 followers got 502');
ok($took < 1, sprintf('abort not listed: at once (%.3fs after the abort)', $took));
is($t->origin_uri_hits($uri), 1, 'abort not listed: 1 origin request');
is_deeply($t->sf_outcomes($uri, 21), { 'LEADER:499' => 1, 'ERROR:502' => 20 },
          'abort not listed: logged LEADER:499, 20 ERROR:502');

$s1 = $t->zone_stats;
is($s1->{promotions} - $s0->{promotions}, 0, 'abort not listed: stats promotions + 0');
is($s1->{errors} - $s0->{errors}, 20, 'abort not listed: stats errors + 20');
$t->zone_baseline_ok('abort not listed: zone back to baseline');

done_testing;
