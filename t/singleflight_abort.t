#!/usr/bin/perl
#
# Client aborts never fail a flight.  A follower whose client goes away (FIN
# or RST) leaves its flight at once: the zone's waiters gauge drops, and the
# others are not disturbed.  A leader whose client goes away before the
# header, or in the middle of the body, costs nobody anything: its flight's
# fetch goes on for the followers, with no second origin request, and again
# when a follower's client goes away too.  Only when every client is gone
# is the fetch stopped, the way nginx stops an upstream request whose
# client went away (and not with proxy_ignore_client_abort on).

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

        location /ab-ignore/ {
            singleflight sf;
            proxy_ignore_client_abort on;
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

# The leader's client goes away while the origin is still thinking: the
# fetch goes on, every follower gets its response, one origin request.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/l?delay=1000&size=2000';
($leader, @f) = flight($uri, 20, 'leader abort');

$t->abort_request($leader);

my @res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(1, $uri, 2000);

is($t->origin_uri_hits($uri), 1, 'leader abort: 1 origin request');
is(($t->origin_hits->{aborted} // 0), 0, 'leader abort: the fetch was not aborted');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, "leader abort: all 20 followers got the one response");
is_deeply($t->sf_outcomes($uri, 21),
          { 'LEADER:499' => 1, 'FOLLOWER:200' => 20 },
          'leader abort: logged LEADER:499, 20 FOLLOWER:200');

$s1 = $t->zone_stats;
is($s1->{promotions} - $s0->{promotions}, 0, 'leader abort: stats promotions + 0');
is($s1->{retries} - $s0->{retries}, 0, 'leader abort: stats retries + 0');
is($s1->{served} - $s0->{served}, 20, 'leader abort: stats served + 20');
$t->zone_baseline_ok('leader abort: zone back to baseline');

# ------------------------------------------------------------ two aborts

# The leader's client goes away after 0.1 s, then a follower's too: the
# others still get the one response (it used to cost them a 502).

$t->origin_reset;
$uri = '/ab/two?delay=1000&size=2000';
($leader, @f) = flight($uri, 21, 'two aborts');

Time::HiRes::sleep(0.1);    # the order of the aborts, not a synchronisation
$t->abort_request($leader);
$t->abort_request($f[0], rst => 1);

@res = map { $t->finish_request($_) } @f[1 .. 20];
$body = SFTest::origin_body(1, $uri, 2000);

is($t->origin_uri_hits($uri), 1, 'two aborts: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, 'two aborts: the 20 other followers got the one response');
$t->zone_baseline_ok('two aborts: zone back to baseline');

# ------------------------------------------------------------ leader abort, then a retry

# The leader's client goes away, then the origin resets the fetch: the
# leader's request, which has left the flight, makes the fetch again for
# the followers (it used to crash its worker: every follower got 502).

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/retry?delay=500&size=2000&fail=reset&fail_first=1';
($leader, @f) = flight($uri, 10, 'leader abort, retry');

$t->abort_request($leader, rst => 1);
$t->wait_for(sub { $t->log_count(qr/client prematurely closed connection.*ab\/retry/) >= 1 },
             what => "nginx saw the leader's client go");

@res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(2, $uri, 2000);

is($t->origin_uri_hits($uri), 2, 'leader abort, retry: 2 origin requests');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   10, 'leader abort, retry: the 10 followers got the second response');
$s1 = $t->zone_stats;
is($s1->{retries} - $s0->{retries}, 1, 'leader abort, retry: stats retries + 1');
is($s1->{dead_leaders} - $s0->{dead_leaders}, 0, 'leader abort, retry: no dead leader');
$t->zone_baseline_ok('leader abort, retry: zone back to baseline');

# ------------------------------------------------------------ leader abort mid-body

# The leader's client goes away after the header, while the origin is still
# sending the body slowly: the followers, who have been getting the body as
# it came, get all of it.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/m?fail=slowbody&pieces=4&delay=300&size=200000';
($leader, @f) = flight($uri, 20, 'leader abort mid-body');

ok($t->wait_for(sub { $t->poll_request($leader); defined $leader->{res}{status} },
                what => "the leader's header"), 'leader abort mid-body: the leader got the header');
ok(!$leader->{res}{complete}, 'leader abort mid-body: ... but not the whole body yet');
$t->abort_request($leader, rst => 1);

@res = map { $t->finish_request($_) } @f;
$body = SFTest::origin_body(1, $uri, 200000);

is($t->origin_uri_hits($uri), 1, 'leader abort mid-body: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
   20, 'leader abort mid-body: all 20 followers got the complete body');
my $o = $t->sf_outcomes($uri, 21);
is($o->{'FOLLOWER:200'} // 0, 20, 'leader abort mid-body: logged 20 FOLLOWER:200')
    or diag(explain($o));
$t->zone_baseline_ok('leader abort mid-body: zone back to baseline');

# ------------------------------------------------------------ everybody gone

# When every client is gone, the fetch stops: the origin sees its request
# go away, as it would without the module.

$t->origin_reset;
$s0 = $t->zone_stats;
$uri = '/ab/gone?delay=3000&size=2000';
($leader, @f) = flight($uri, 5, 'everybody gone');

$t->abort_request($_) for $leader, @f;

ok($t->wait_for(sub { ($t->origin_hits->{aborted} // 0) == 1 }, timeout => 5,
                what => 'the fetch stopped'),
   'everybody gone: the origin request was aborted');
$s1 = $t->zone_stats;
is($s1->{abandoned} - $s0->{abandoned}, 1, 'everybody gone: stats abandoned + 1');
$t->zone_baseline_ok('everybody gone: zone back to baseline');

# a request for the key afterwards starts afresh
my $r = $t->get($uri);
is($r->{status}, 200, 'everybody gone: the key works again at once');
is($t->origin_uri_hits($uri), 2, 'everybody gone: with a fetch of its own');

# ------------------------------------------------------------ proxy_ignore_client_abort

# With proxy_ignore_client_abort on, the fetch goes on to its end even
# when everybody is gone, as nginx's upstream request would.

$t->origin_reset;
$uri = '/ab-ignore/x?delay=1000&size=2000';
($leader, @f) = flight($uri, 5, 'ignore client abort');

$t->abort_request($_) for $leader, @f;

ok($t->wait_for(sub { my $z = $t->zone_stats; $z->{readers} == 0 && $z->{in_flight} == 0 },
                timeout => 5, what => 'the flight over'),
   'ignore client abort: the flight ended');
is(($t->origin_hits->{aborted} // 0), 0, 'ignore client abort: the origin request was not aborted');
$t->zone_baseline_ok('ignore client abort: zone back to baseline');

done_testing;
