#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_bypass: a request for which any of the values is non-empty
# and not "0" is not collapsed: it neither leads nor follows a flight,
# goes upstream on its own, shows BYPASS in $singleflight_status and is
# counted in the stats' "bypassed".  "0" or an empty value changes nothing.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfb '$pid $singleflight_status $request_uri';
    access_log %%TESTDIR%%/sf.log sfb;

    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_bypass $http_x_nocollapse $arg_nocache;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# $singleflight_status of the logged requests of one URI: { STATUS => n }
sub wait_logged {
    my ($uri, $n) = @_;
    return SFTest::tally(map { $_->{sf} }
        $t->wait_log_records('sf.log', [qw(pid sf uri)], $n, uri => $uri));
}

# number of complete 200 responses that are their own origin response
sub own_responses {
    my ($res, $uri) = @_;
    return scalar grep {
        ($_->{status} // 0) == 200 && $_->{complete}
            && $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uri)
    } @$res;
}

# number of complete 200 responses carrying hit $hit of $uri
sub hit_responses {
    my ($res, $uri, $hit) = @_;
    return scalar grep {
        ($_->{status} // 0) == 200 && $_->{complete}
            && $_->{body} eq SFTest::origin_body($hit, $uri)
    } @$res;
}

my $stats0 = $t->zone_stats;
is($stats0->{bypassed}, 0, 'stats: nothing bypassed yet');

my $bypassed = 0;    # requests expected to be bypassed so far

# ------------------------------------------------------------ bypassed

for my $case (
    [ 'header 1',   '/h1?delay=400',           { 'X-Nocollapse' => '1' } ],
    [ 'header yes', '/hy?delay=400',           { 'X-Nocollapse' => 'yes' } ],
    [ 'arg 1',      '/a1?delay=400&nocache=1', {} ],
    [ 'header 0, arg 1', '/a2?delay=400&nocache=1', { 'X-Nocollapse' => '0' } ],
) {
    my ($name, $uri, $headers) = @$case;

    $t->origin_reset;
    my $res = $t->herd(n => 10, path => $uri, headers => $headers);
    $bypassed += 10;

    is($t->origin_hits->{total}, 10, "$name: 10 requests, 10 origin requests");
    is(own_responses($res, $uri), 10, "$name: each got its own origin response");
    is_deeply(wait_logged($uri, 10), { BYPASS => 10 }, "$name: 10 x BYPASS");
}

# ------------------------------------------------------------ not bypassed

for my $case (
    [ 'header 0',       '/n0?delay=400',           { 'X-Nocollapse' => '0' } ],
    [ 'header empty',   '/ne?delay=400',           { 'X-Nocollapse' => '' } ],
    [ 'arg 0',          '/n1?delay=400&nocache=0', {} ],
    [ 'arg empty',      '/n2?delay=400&nocache=',  {} ],
    [ 'header and arg 0', '/n3?delay=400&nocache=0', { 'X-Nocollapse' => '0' } ],
) {
    my ($name, $uri, $headers) = @$case;

    $t->origin_reset;
    my $res = $t->herd(n => 10, path => $uri, headers => $headers);

    is($t->origin_hits->{total}, 1, "$name: collapsed, 1 origin request");
    is(hit_responses($res, $uri, 1), 10, "$name: every client got that response");
    is_deeply(wait_logged($uri, 10), { LEADER => 1, FOLLOWER => 9 },
              "$name: 1 leader, 9 followers");
}

# ------------------------------------------------------------ mixed

# Bypassed requests among collapsed ones on one URI: the bypassed neither
# lead nor follow.  A bypassed request goes first, so a module that let it
# lead would collapse the others into it.

$t->origin_reset;
my $uri = '/mixed?delay=400';

my @by = map { $t->start_request('GET', $uri, headers => { 'X-Nocollapse' => 1 }) } 1 .. 5;
$t->wait_for(sub { $t->origin_hits->{total} >= 1 }, what => 'a bypassed request at the origin');
my $res = $t->herd(n => 5, path => $uri);
my $byres = [ map { $t->finish_request($_) } @by ];
$bypassed += 5;

is($t->origin_hits->{total}, 6, 'mixed: 5 bypassed + 1 flight = 6 origin requests');
is(own_responses($byres, $uri), 5, 'mixed: each bypassed request got its own response');
my %hits = map { ($_->{headers}{'x-hit'} // 0) => 1 } @$res;
my ($hit) = keys %hits;
is(scalar keys %hits, 1, 'mixed: the others share one response');
is(hit_responses($res, $uri, $hit), 5, 'mixed: ... and got its body');
ok(!grep({ ($_->{headers}{'x-hit'} // 0) == $hit } @$byres),
   'mixed: which is none of the bypassed ones');
is_deeply(wait_logged($uri, 10), { BYPASS => 5, LEADER => 1, FOLLOWER => 4 },
          'mixed: 5 BYPASS, 1 LEADER, 4 FOLLOWER');

# ------------------------------------------------------------ stats

my $stats = $t->zone_stats;
is($stats->{bypassed} - $stats0->{bypassed}, $bypassed, "stats: bypassed = $bypassed");
is($stats->{flights} - $stats0->{flights}, 5 + 1, 'stats: flights of the collapsed herds only');
is($stats->{followers} - $stats0->{followers}, 5 * 9 + 4, 'stats: followers of those only');

done_testing;
