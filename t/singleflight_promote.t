#!/usr/bin/perl
#
# Promotion: a leader that fails without a usable response hands its flight
# to exactly one waiting follower (PROMOTED), and the rest keep waiting on
# that new leader.  singleflight_promote lists the conditions (error,
# timeout, abort, http_5xx) and singleflight_promote_tries bounds how often;
# when the tries are used up, or the condition is not listed, every
# remaining follower gets the failure's status at once (ERROR).  An origin
# 5xx that is not a promote condition is shared as is, unless
# singleflight_share_errors is off.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_file('err504.txt', "custom 504 page\n");

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:1m;

    proxy_read_timeout 5s;

    server {
        listen 127.0.0.1:%%PORT%%;

        # default: singleflight_promote error timeout abort; tries 1
        location /p/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /ph/ {
            singleflight sf;
            add_header X-SF $singleflight_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        location /tries2/ {
            singleflight sf;
            singleflight_promote_tries 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /nopromote/ {
            singleflight sf;
            singleflight_promote off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /p503/ {
            singleflight sf;
            singleflight_promote http_503;
            proxy_pass http://%%ORIGIN%%;
        }

        location /noshare/ {
            singleflight sf;
            singleflight_share_errors off;
            singleflight_error_status 504;
            error_page 504 /err504.txt;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /err504.txt {
            root %%TESTDIR%%;
        }

        location /to/ {
            singleflight sf;
            proxy_read_timeout 300ms;
            proxy_pass http://%%ORIGIN%%;
        }

        location /to-error-only/ {
            singleflight sf;
            singleflight_promote error;
            proxy_read_timeout 300ms;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mid-error-only/ {
            singleflight sf;
            singleflight_promote error;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# upstream failures are logged at [error]; nothing else is expected
my $N = 100;

# ------------------------------------------------------------ helpers

sub codes { SFTest::tally(map { $_->{status} // 'none' } @_) }

my $s0 = $t->zone_stats;

# ------------------------------------------------------------ (a) promoted

# The origin resets the first request of each URI, after 300 ms, while the
# herd waits.  One follower is promoted, fetches again (hit 2 of the URI)
# and its response goes to every other follower, and to the failed leader,
# which follows the flight instead of answering nginx's 502.

my ($ok200, $right, $leaders502, $attempts) = (0, 0, 0, 0);
my $outcome_ok = 0;

for my $wave (1 .. 5) {
    my $uri = "/p/a?wave=$wave&fail=reset&fail_first=1&delay=300&size=3000";
    my $res = $t->herd(n => $N, path => $uri);

    my $promoted_hit = $t->origin_hits->{total};    # the last hit is the promoted one
    my $body = SFTest::origin_body($promoted_hit, $uri, 3000);

    $ok200 += grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res;
    $right += grep { ($_->{status} // 0) == 200 && $_->{body} eq $body
                     && ($_->{headers}{'x-uri-hit'} // '') eq '2' } @$res;
    $leaders502 += grep { ($_->{status} // 0) == 502 } @$res;
    $attempts += $t->origin_uri_hits($uri);

    my $o = $t->sf_outcomes($uri, $N);
    $outcome_ok++ if ($o->{'PROMOTED:200'} // 0) == 1
                     && ($o->{'FOLLOWER:200'} // 0) == $N - 1 && keys %$o == 2;
    diag(explain($o)) unless keys %$o == 2;
}

is($ok200, 5 * $N, 'promoted: every client got a complete 200');
is($right, 5 * $N, "promoted: ... with the promoted leader's body (uri hit 2)");
is($leaders502, 0, "promoted: no client saw nginx's 502, not even the failed leaders");
is($attempts, 10, 'promoted: exactly 2 origin attempts per wave, 10 in all');
is($outcome_ok, 5, 'promoted: per wave 1 PROMOTED:200, 99 FOLLOWER:200');

my $s1 = $t->zone_stats;
is_deeply(SFTest::delta($s0, $s1, qw(flights promotions errors served)),
          { flights => 5, promotions => 5, errors => 0, served => 5 * ($N - 1) },
          'promoted: stats flights 5, promotions 5, errors 0, served 495');

# ------------------------------------------------------------ (b) all fail

# Every attempt is reset: the leader fails, one follower is promoted and
# fails too, then all others get 502 at once.

my ($all502, $slow, $outcome_b) = (0, 0, 0);
$attempts = 0;

for my $wave (1 .. 3) {
    my $uri = "/p/b?wave=$wave&fail=reset&delay=200";
    my $t0 = time;
    my $res = $t->herd(n => $N, path => $uri, timeout => 10);
    my $took = time - $t0;

    $all502 += grep { ($_->{status} // 0) == 502 && $_->{complete} } @$res;
    $slow++ if $took >= 2;
    diag(sprintf('wave %d took %.3fs', $wave, $took)) if $took >= 2;
    $attempts += $t->origin_uri_hits($uri);

    my $o = $t->sf_outcomes($uri, $N);
    $outcome_b++ if ($o->{'PROMOTED:502'} // 0) == 1
                    && ($o->{'ERROR:502'} // 0) == $N - 1 && keys %$o == 2;
    diag(explain($o)) unless keys %$o == 2;
}

is($all502, 3 * $N, 'all fail: every client got a complete 502');
is($attempts, 6, 'all fail: 2 origin attempts per wave (leader + 1 promotion)');
is($slow, 0, 'all fail: each wave answered in under 2 s');
is($outcome_b, 3, 'all fail: per wave 1 PROMOTED (its own 502), 99 ERROR '
                  . '(the failed leader among them)');

my $s2 = $t->zone_stats;
is_deeply(SFTest::delta($s1, $s2, qw(promotions errors served)),
          { promotions => 3, errors => 3 * ($N - 1), served => 0 },
          'all fail: stats promotions 3, errors 297');

# ------------------------------------------------------------ (c) tries 2

my $uri = '/tries2/c?fail=reset&delay=200';
my $res = $t->herd(n => $N, path => $uri);

is_deeply(codes(@$res), { 502 => $N }, 'tries 2: all 502 when every attempt fails');
is($t->origin_uri_hits($uri), 3, 'tries 2: 3 origin attempts (leader + 2 promotions)');
is_deeply($t->sf_outcomes($uri, $N),
          { 'PROMOTED:502' => 1, 'ERROR:502' => $N - 1 },
          'tries 2: the last promoted leader answers its 502, 99 ERROR');

# the second promotion succeeds: everybody else gets its response
$uri = '/tries2/c2?fail=reset&fail_first=2&delay=200&size=500';
$res = $t->herd(n => $N, path => $uri);
my $last = $t->origin_hits->{total};

is($t->origin_uri_hits($uri), 3, 'tries 2, third attempt succeeds: 3 origin attempts');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($last, $uri, 500) } @$res), $N,
   'tries 2, third attempt succeeds: every client got its response');
is_deeply($t->sf_outcomes($uri, $N),
          { 'PROMOTED:200' => 1, 'FOLLOWER:200' => $N - 1 },
          'tries 2, third attempt succeeds: 1 PROMOTED, 99 FOLLOWER (both failed '
          . 'leaders among them)');

# ------------------------------------------------------------ (d) off

$uri = '/nopromote/d?fail=reset&fail_first=1&delay=600';
$res = $t->herd(n => $N, path => $uri);

is_deeply(codes(@$res), { 502 => $N }, 'promote off: every client got 502');
is($t->origin_uri_hits($uri), 1, 'promote off: 1 origin attempt');
is_deeply($t->sf_outcomes($uri, $N), { 'LEADER:502' => 1, 'ERROR:502' => $N - 1 },
          'promote off: 1 LEADER, 99 ERROR');
my $max = 0;
for (@$res) { $max = $_->{time} if $_->{time} > $max }
ok($max < 1.1, sprintf('promote off: the followers were answered with the leader '
   . '(slowest %.3fs, a promotion would take 1.2s)', $max));

# ------------------------------------------------------------ (e) origin 503

$s0 = $t->zone_stats;

# (e1) not a promote condition: shared as is
$uri = '/p/e?status=503&delay=300';
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 1, 'origin 503 shared: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 503 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($t->origin_hits->{total}, $uri) } @$res), $N,
   "origin 503 shared: every client got the origin's 503 and body");
is_deeply($t->sf_outcomes($uri, $N), { 'LEADER:503' => 1, 'FOLLOWER:503' => $N - 1 },
          'origin 503 shared: 1 LEADER, 99 FOLLOWER');

# (e2) singleflight_promote http_503: a promotion, then ERROR for the rest
$uri = '/p503/e?status=503&delay=300';
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 2, 'promote http_503: 2 origin requests');
is_deeply(codes(@$res), { 503 => $N }, 'promote http_503: every client got 503');
is_deeply($t->sf_outcomes($uri, $N),
          { 'LEADER:503' => 1, 'PROMOTED:503' => 1, 'ERROR:503' => $N - 2 },
          'promote http_503: 1 LEADER, 1 PROMOTED, 98 ERROR');

# (e3) share_errors off, error_status 504: followers get 504, via error_page
$uri = '/noshare/e?status=503&delay=300';
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 1, 'share_errors off: 1 origin request');
is(scalar(grep { ($_->{status} // 0) == 503
                 && $_->{body} eq SFTest::origin_body($t->origin_hits->{total}, $uri) } @$res), 1,
   "share_errors off: the leader got the origin's 503");
is(scalar(grep { ($_->{status} // 0) == 504 && $_->{complete}
                 && $_->{body} eq "custom 504 page\n" } @$res), $N - 1,
   'share_errors off: 99 followers got 504 through error_page');
is_deeply($t->sf_outcomes($uri, $N), { 'LEADER:503' => 1, 'ERROR:504' => $N - 1 },
          'share_errors off: 1 LEADER, 99 ERROR');

$s1 = $t->zone_stats;
is_deeply(SFTest::delta($s0, $s1, qw(promotions errors served)),
          { promotions => 1, errors => 2 * $N - 3, served => $N - 1 },
          'origin 5xx: stats promotions 1, errors 197, served 99');

# ------------------------------------------------------------ (f) timeout

# proxy_read_timeout 300ms, the origin hangs on the first request: nginx
# gives the leader 504, that is the "timeout" condition: promotion.

$uri = '/to/f?fail=hang&fail_first=1&size=1000';
$res = $t->herd(n => $N, path => $uri);
$last = $t->origin_hits->{total};

is($t->origin_uri_hits($uri), 2, 'timeout: 2 origin attempts');
is(scalar(grep { ($_->{status} // 0) == 504 } @$res), 0,
   'timeout: nobody got 504, not even the leader that timed out');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($last, $uri, 1000) } @$res), $N,
   'timeout: everybody got the promoted response');
is_deeply($t->sf_outcomes($uri, $N),
          { 'PROMOTED:200' => 1, 'FOLLOWER:200' => $N - 1 },
          'timeout: 1 PROMOTED, 99 FOLLOWER');

# "timeout" not listed: followers get the leader's 504 at once
$uri = '/to-error-only/f?fail=hang&fail_first=1';
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 1, 'timeout not listed: 1 origin attempt');
is_deeply(codes(@$res), { 504 => $N }, "timeout not listed: everyone got nginx's 504");
is_deeply($t->sf_outcomes($uri, $N), { 'LEADER:504' => 1, 'ERROR:504' => $N - 1 },
          'timeout not listed: 1 LEADER, 99 ERROR');

# ------------------------------------------------------------ (g) midbody

# The origin sends the header and half of a 100000-byte body, then closes.
# The leader's client gets a truncated response (nothing else is possible
# once the header went out), its followers must not: they get the promoted
# leader's complete response.

for my $loc (qw(p mid-error-only)) {
    $uri = "/$loc/g?fail=midbody&fail_first=1&size=100000&delay=300";
    $res = $t->herd(n => $N, path => $uri);
    $last = $t->origin_hits->{total};
    my $body = SFTest::origin_body($last, $uri, 100000);

    is($t->origin_uri_hits($uri), 2, "midbody ($loc): 2 origin attempts");
    is(scalar(grep { ($_->{status} // 0) == 200 && !$_->{complete} } @$res), 1,
       "midbody ($loc): only the leader's response was cut short");
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body }
              @$res), $N - 1,
       "midbody ($loc): 99 complete 100000-byte bodies of the promoted leader");
    is(scalar(grep { $_->{complete} && $_->{body} ne $body } @$res), 0,
       "midbody ($loc): no complete response with another body");
    my $o = $t->sf_outcomes($uri, $N);
    is(($o->{'PROMOTED:200'} // 0) + ($o->{'FOLLOWER:200'} // 0), $N - 1,
       "midbody ($loc): 1 PROMOTED + 98 FOLLOWER")
        or diag(explain($o));
}

# ------------------------------------------------------------ (h) HEAD

# HEAD requests may follow a GET flight, but a HEAD is never promoted to
# lead one: its fetch would have no body for the GET followers.  5 HEAD
# followers join first (so they are first in their workers' queues), then
# 20 GET followers; the GET leader's first attempt is reset.

$uri = '/ph/h?fail=reset&fail_first=1&delay=300&size=5000';
my $gl = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'GET leader at the origin');
my @heads = map { $t->start_request('HEAD', $uri) } 1 .. 5;
$t->wait_for(sub { $t->zone_stats->{waiters} == 5 }, what => '5 HEAD followers');
my @gets = map { $t->start_request('GET', $uri) } 1 .. 20;
$t->wait_for(sub { $t->zone_stats->{waiters} == 25 }, what => '25 followers');

my $glr = $t->finish_request($gl);
my @hr = map { $t->finish_request($_) } @heads;
my @gr = map { $t->finish_request($_) } @gets;
my ($pget) = grep { ($_->{headers}{'x-sf'} // '') eq 'PROMOTED' } @gr;
my $hit = $pget ? $pget->{headers}{'x-hit'} // 0 : 0;

ok(($glr->{status} // 0) == 200 && $glr->{complete}
   && $glr->{body} eq SFTest::origin_body($hit, $uri, 5000),
   'HEAD: the failed GET leader got the promoted GET\'s response');
is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'PROMOTED' } @gr), 1,
   'HEAD: one GET follower was promoted');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($hit, $uri, 5000) } @gr), 20,
   'HEAD: all 20 GET followers got the complete body of the promoted GET');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq ''
                 && ($_->{headers}{'content-length'} // '') eq '5000' } @hr), 5,
   'HEAD: the 5 HEAD followers got 200 headers, Content-Length 5000');
is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'PROMOTED' } @hr), 0,
   'HEAD: no HEAD request was promoted');

# ------------------------------------------------------------ zone is empty

$t->zone_baseline_ok('zone back to baseline after all failures');

done_testing;
