#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_promote: a fetch that fails before its header with one of
# the listed conditions (error, timeout, http_5xx), while followers wait,
# is made again by the same leader (counted in retries), and everybody
# keeps waiting on the flight: the leader's client too, which never sees
# the failed attempt.  singleflight_promote_tries bounds how often; when
# the tries are used up, or the condition is not listed, every request of
# the flight gets the failure's status at once (the followers ERROR).  An
# origin 5xx that is not fetched again is shared as is, unless
# singleflight_share_errors is off.  A body that breaks off mid-way cuts
# the responses that had some of it; the others look for a flight again
# by the same rules ("error").

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
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    proxy_read_timeout 5s;

    log_format uph '$request_uri $singleflight_status $upstream_http_x_uri_hit '
                   '$upstream_cache_status';

    server {
        listen 127.0.0.1:%%PORT%%;

        # default: singleflight_promote error timeout; tries 1
        location /p/ {
            singleflight sf;
            access_log %%TESTDIR%%/access.log sftest;
            access_log %%TESTDIR%%/p_upstream.log uph;
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

        # the same, its first request going upstream on its own way
        location /p503d/ {
            singleflight sf;
            singleflight_lone direct;
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

        # singleflight_promote at an inner level is all of it: its
        # status= is the default (502), not the outer level's
        location /outer/ {
            singleflight_promote error timeout tries=3 status=504;

            location /outer/inner/ {
                singleflight sf;
                singleflight_share_errors off;
                singleflight_promote http_502;
                proxy_pass http://%%ORIGIN%%;
            }
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

        location /mid-off/ {
            singleflight sf;
            singleflight_promote off;
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

# ------------------------------------------------------------ (a) fetched again

# The origin resets the first request of each URI, after 300 ms, while the
# herd waits.  The leader fetches again (hit 2 of the URI) and its
# response goes to every follower, and to the leader's own client, which
# never sees nginx's 502 of the first attempt.

my ($ok200, $right, $any502, $attempts) = (0, 0, 0, 0);
my $outcome_ok = 0;

for my $wave (1 .. 5) {
    my $uri = "/p/a?wave=$wave&fail=reset&fail_first=1&delay=300&size=3000";
    my $res = $t->herd(n => $N, path => $uri);

    my $second = $t->origin_hits->{total};    # the last hit is the second attempt
    my $body = SFTest::origin_body($second, $uri, 3000);

    $ok200 += grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res;
    $right += grep { ($_->{status} // 0) == 200 && $_->{body} eq $body
                     && ($_->{headers}{'x-uri-hit'} // '') eq '2' } @$res;
    $any502 += grep { ($_->{status} // 0) == 502 } @$res;
    $attempts += $t->origin_uri_hits($uri);

    my $o = $t->sf_outcomes($uri, $N);
    $outcome_ok++ if ($o->{'LEADER:200'} // 0) == 1
                     && ($o->{'FOLLOWER:200'} // 0) == $N - 1 && keys %$o == 2;
    diag(explain($o)) unless keys %$o == 2;
}

is($ok200, 5 * $N, 'fetched again: every client got a complete 200');
is($right, 5 * $N, "fetched again: ... with the second attempt's body (uri hit 2)");
is($any502, 0, "fetched again: no client saw nginx's 502, not even the leaders");
is($attempts, 10, 'fetched again: exactly 2 origin attempts per wave, 10 in all');
is($outcome_ok, 5, 'fetched again: per wave 1 LEADER:200, 99 FOLLOWER:200');

# The leader's $upstream_status tells of both attempts, as with
# proxy_next_upstream; the followers did not go upstream.
my %us = map { /"GET \S+ HTTP[^"]*" \d+ .* us=(.*?) ua=.* sf=(\S+)/ ? ("$2 $1" => 1) : () }
    grep { m{"GET /p/a\?wave=} } split /\n/, $t->read_file('access.log');
is(join(' | ', sort keys %us), 'FOLLOWER - | LEADER 502, 200',
   'fetched again: the leaders\' $upstream_status is "502, 200", the followers\' empty');

# ... and its $upstream_http_* are those of the attempt whose response it
# got (uri hit 2), as proxy_next_upstream's are of the last upstream; so
# are the followers', who got that response too
my %uph = map { my @f = split ' '; ("$f[1] $f[2]" => 1) }
    grep { m{^/p/a\?wave=} } split /\n/, $t->read_file('p_upstream.log');
is(join(' | ', sort keys %uph), 'FOLLOWER 2 | LEADER 2',
   'fetched again: every $upstream_http_x_uri_hit is the second attempt\'s');

my $s1 = $t->zone_stats;
is_deeply(SFTest::delta($s0, $s1, qw(flights retries promotions errors served)),
          { flights => 5, retries => 5, promotions => 0, errors => 0, served => 5 * ($N - 1) },
          'fetched again: stats flights 5, retries 5, promotions 0, errors 0, served 495');

# ------------------------------------------------------------ (b) all fail

# Every attempt is reset: the leader's fetch fails, its second attempt
# fails too, then everybody gets 502 at once.

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
    $outcome_b++ if ($o->{'LEADER:502'} // 0) == 1
                    && ($o->{'ERROR:502'} // 0) == $N - 1 && keys %$o == 2;
    diag(explain($o)) unless keys %$o == 2;
}

is($all502, 3 * $N, 'all fail: every client got a complete 502');
is($attempts, 6, 'all fail: 2 origin attempts per wave (1 + 1 try)');
is($slow, 0, 'all fail: each wave answered in under 2 s');
is($outcome_b, 3, 'all fail: per wave 1 LEADER (its own 502), 99 ERROR');

my $s2 = $t->zone_stats;
is_deeply(SFTest::delta($s1, $s2, qw(retries promotions errors served)),
          { retries => 3, promotions => 0, errors => 3 * ($N - 1), served => 0 },
          'all fail: stats retries 3, errors 297');

# ------------------------------------------------------------ (c) tries 2

my $uri = '/tries2/c?fail=reset&delay=200';
my $res = $t->herd(n => $N, path => $uri);

is_deeply(codes(@$res), { 502 => $N }, 'tries 2: all 502 when every attempt fails');
is($t->origin_uri_hits($uri), 3, 'tries 2: 3 origin attempts (1 + 2 tries)');
is_deeply($t->sf_outcomes($uri, $N),
          { 'LEADER:502' => 1, 'ERROR:502' => $N - 1 },
          'tries 2: the leader answers its 502, 99 ERROR');

# the second try succeeds: everybody gets its response
$uri = '/tries2/c2?fail=reset&fail_first=2&delay=200&size=500';
$res = $t->herd(n => $N, path => $uri);
my $last = $t->origin_hits->{total};

is($t->origin_uri_hits($uri), 3, 'tries 2, third attempt succeeds: 3 origin attempts');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($last, $uri, 500) } @$res), $N,
   'tries 2, third attempt succeeds: every client got its response');
is_deeply($t->sf_outcomes($uri, $N),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => $N - 1 },
          'tries 2, third attempt succeeds: 1 LEADER, 99 FOLLOWER');

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
   . '(slowest %.3fs, another attempt would take 1.2s)', $max));

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

# (e2) singleflight_promote http_503: fetched again; the second 503 is not
# fetched again (tries used up), so it is shared as is
$uri = '/p503/e?status=503&delay=300';
my $o0 = $t->zone_stats->{origin_requests_total};
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 2, 'promote http_503: 2 origin requests');
$t->origin_requests_ok($o0, { first => 1, retry => 1 },
                       'promote http_503: origin_requests_total, the first and the retry');
is(scalar(grep { ($_->{status} // 0) == 503 && $_->{complete}
                 && ($_->{headers}{'x-uri-hit'} // '') eq '2'
                 && $_->{body} eq SFTest::origin_body($t->origin_hits->{total}, $uri) } @$res), $N,
   "promote http_503: every client got the second attempt's 503 and body");
is_deeply($t->sf_outcomes($uri, $N),
          { 'LEADER:503' => 1, 'FOLLOWER:503' => $N - 1 },
          'promote http_503: 1 LEADER, 99 FOLLOWER');

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
is_deeply(SFTest::delta($s0, $s1, qw(retries promotions errors served)),
          { retries => 1, promotions => 0, errors => $N - 1, served => 2 * ($N - 1) },
          'origin 5xx: stats retries 1, errors 99 (share_errors off), served 198');

# (e3i) singleflight_promote given again in an inner location: what it
# does not say is its default (status 502, 1 try), not the outer one's
{
    my $u = '/outer/inner/e?status=503&delay=300';
    my $r = $t->herd(n => 5, path => $u);
    is(join(' ', sort map { $_->{status} // 'none' } @$r), '502 502 502 502 503',
       'promote given again inside: the followers get the default status=, 502');
    is($t->origin_uri_hits($u), 1, 'promote given again inside: 1 origin request');
}

# (e2d) the same where the first request went upstream on its own way:
# its client gets its own 503, as without the module; the others wait for
# the second attempt, fetched by one of them
$uri = '/p503d/e?status=503&delay=300';
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 2, 'promote http_503, own way: 2 origin requests');
is(scalar(grep { ($_->{status} // 0) == 503 && $_->{complete}
                 && ($_->{headers}{'x-uri-hit'} // '') eq '2' } @$res), $N - 1,
   "promote http_503, own way: the others got the second attempt's 503");
is_deeply($t->sf_outcomes($uri, $N),
          { 'LEADER:503' => 1, 'PROMOTED:503' => 1, 'FOLLOWER:503' => $N - 2 },
          'promote http_503, own way: 1 LEADER, 1 PROMOTED, 98 FOLLOWER');

# ------------------------------------------------------------ (f) timeout

# proxy_read_timeout 300ms, the origin hangs on the first request: nginx
# makes a 504, that is the "timeout" condition: fetched again.

$uri = '/to/f?fail=hang&fail_first=1&size=1000';
$res = $t->herd(n => $N, path => $uri);
$last = $t->origin_hits->{total};

is($t->origin_uri_hits($uri), 2, 'timeout: 2 origin attempts');
is(scalar(grep { ($_->{status} // 0) == 504 } @$res), 0,
   'timeout: nobody got 504, not even the leader that timed out');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($last, $uri, 1000) } @$res), $N,
   'timeout: everybody got the second attempt\'s response');
is_deeply($t->sf_outcomes($uri, $N),
          { 'LEADER:200' => 1, 'FOLLOWER:200' => $N - 1 },
          'timeout: 1 LEADER, 99 FOLLOWER');

# "timeout" not listed: followers get the leader's 504 at once
$uri = '/to-error-only/f?fail=hang&fail_first=1';
$res = $t->herd(n => $N, path => $uri);

is($t->origin_uri_hits($uri), 1, 'timeout not listed: 1 origin attempt');
is_deeply(codes(@$res), { 504 => $N }, "timeout not listed: everyone got nginx's 504");
is_deeply($t->sf_outcomes($uri, $N), { 'LEADER:504' => 1, 'ERROR:504' => $N - 1 },
          'timeout not listed: 1 LEADER, 99 ERROR');

# ------------------------------------------------------------ (g) midbody

# The origin sends the header and half of a 100000-byte body, then, 500 ms
# later, closes.  By then every reader has sent its client the header and
# the half: each response is cut, as the response of a request of its own
# would have been, and nothing is fetched again (a client that had some of
# one response cannot be given another).

$s0 = $t->zone_stats;
$uri = '/p/g?fail=midbody&body_delay=500&fail_first=1&size=100000&delay=300';
$res = $t->herd(n => $N, path => $uri);
my $half = substr(SFTest::origin_body($t->origin_hits->{total}, $uri, 100000), 0, 50000);

is($t->origin_uri_hits($uri), 1, 'midbody, all had some: 1 origin attempt');
is(scalar(grep { ($_->{status} // 0) == 200 && !$_->{complete} && $_->{body} eq $half } @$res), $N,
   'midbody, all had some: every response cut after the half the origin sent')
    or diag(explain([ map { { status => $_->{status}, error => $_->{error},
                              len => length $_->{body} } } @$res[0 .. 4] ]));
is_deeply($t->sf_outcomes($uri, $N), { 'LEADER:200' => 1, 'FOLLOWER:200' => $N - 1 },
          'midbody, all had some: 1 LEADER, 99 FOLLOWER');
$s1 = $t->zone_stats;
is_deeply(SFTest::delta($s0, $s1, qw(cut retries)), { cut => $N, retries => 0 },
          'midbody, all had some: stats cut 100, retries 0');

# Without the pause, the close comes with the half body: readers that had
# some of it are cut, and those that had nothing yet (still at the header
# when the flight failed) look for a flight again by the promote rules,
# "error" being listed: a second origin request, whose complete response
# they get.  How many are which is a race; whatever it is, no client gets
# a complete response other than the second attempt's.  With promote off,
# those get nginx's 502 (ERROR) instead.

for my $loc (qw(p mid-error-only mid-off)) {
    $s0 = $t->zone_stats;
    $uri = "/$loc/g?fail=midbody&fail_first=1&size=100000&delay=300";
    $res = $t->herd(n => $N, path => $uri);
    my $attempts = $t->origin_uri_hits($uri);
    my ($cut, $whole, $e502, $other) = (0, 0, 0, 0);
    for (@$res) {
        my $status = $_->{status} // 0;
        my $hit = $_->{headers}{'x-hit'} // 0;
        my $full = SFTest::origin_body($hit, $uri, 100000);
        if ($status == 200 && !$_->{complete} && ($_->{headers}{'x-uri-hit'} // '') eq '1'
            && length $_->{body} <= 50000 && $_->{body} eq substr($full, 0, length $_->{body})) {
            $cut++;
        }
        elsif ($status == 200 && $_->{complete} && ($_->{headers}{'x-uri-hit'} // '') eq '2'
               && $_->{body} eq $full) {
            $whole++;
        }
        elsif ($status == 502 && $_->{complete}) { $e502++ }
        else { $other++ }
    }
    my $o = $t->sf_outcomes($uri, $N);
    $s1 = $t->zone_stats;
    my $d = SFTest::delta($s0, $s1, qw(cut errors));
    my $again = $cut < $N;    # some had nothing yet when the body broke off

    note("midbody ($loc): $cut cut, $whole complete, $e502 502");
    is($other, 0, "midbody ($loc): every other response is a complete one");
    is($d->{cut}, $cut, "midbody ($loc): stats cut counts the cut responses");
    if ($loc eq 'mid-off') {
        is($attempts, 1, "midbody ($loc): promote off, 1 origin attempt");
        is($cut + $e502, $N, "midbody ($loc): the others got 502 ($e502)");
        is(($o->{'ERROR:502'} // 0), $e502, "midbody ($loc): they are ERROR:502")
            or diag(explain($o));
    }
    else {
        is($attempts, $again ? 2 : 1,
           "midbody ($loc): a second origin attempt exactly when some had nothing yet");
        is($cut + $whole, $N,
           "midbody ($loc): the others got the second attempt's complete response ($whole)");
        is(($o->{'LEADER:200'} // 0) + ($o->{'FOLLOWER:200'} // 0), $N,
           "midbody ($loc): every request a LEADER or FOLLOWER") or diag(explain($o));
    }
}

# ------------------------------------------------------------ (h) HEAD

# HEAD requests may follow a GET flight; when its fetch is made again, it
# is made again as the GET: 5 HEAD followers join first, then 20 GET
# followers; the GET leader's first attempt is reset.

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
my $body = SFTest::origin_body($t->origin_hits->{total}, $uri, 5000);

is($t->origin_uri_hits($uri), 2, 'HEAD: 2 origin attempts');
is(join(' ', map { (split / /)[2] } grep { / \Q$uri\E$/ }
        split /\n/, $t->read_file($t->origin->log_file)),
   'GET GET', 'HEAD: both attempts are GETs');
ok(($glr->{status} // 0) == 200 && $glr->{complete} && $glr->{body} eq $body
   && ($glr->{headers}{'x-sf'} // '') eq 'LEADER',
   'HEAD: the GET leader got the second attempt\'s response');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body
                 && ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @gr), 20,
   'HEAD: all 20 GET followers got its complete body');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq ''
                 && ($_->{headers}{'content-length'} // '') eq '5000'
                 && ($_->{headers}{'x-uri-hit'} // '') eq '2'
                 && ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @hr), 5,
   'HEAD: the 5 HEAD followers got its 200 headers, Content-Length 5000');

# ------------------------------------------------------------ zone is empty

$t->zone_baseline_ok('zone back to baseline after all failures');

done_testing;
