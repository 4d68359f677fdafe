#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# What the histograms and origin_requests_total say of the origin, on
# both paths (the first request's own upstream, the default; a fetch,
# singleflight_lone fetch):
#   - flight_header_seconds times a header from the origin, not nginx's
#     own 504 for an origin that timed out, nor its 502 for one that reset;
#   - a flight fetched again after an origin 500 (singleflight_promote)
#     is one flight in flight_seconds, not its leader's 500 and the retry;
#   - a stale cache entry served after an origin 500 is the cache's answer
#     after asking the origin, not a hit: one origin request counted (the
#     flight's; the others' own requests not), whatever the path.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(sleep);

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $locations = '';
for my $p ([ 'd', '' ], [ 'f', 'singleflight_lone fetch;' ]) {
    my ($l, $lone) = @$p;
    $locations .= <<"EOT";
        location /$l/ {
            $lone
            singleflight_promote off;
            proxy_read_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        location /${l}p/ {
            $lone
            singleflight_promote http_500;
            proxy_pass http://%%ORIGIN%%;
        }

        location /${l}s/ {
            $lone
            proxy_cache c;
            proxy_cache_key \$uri;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale error timeout http_500;
            proxy_pass http://%%ORIGIN%%;
        }

EOT
}

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    proxy_cache_path %%TESTDIR%%/cache levels=1 keys_zone=c:1m;

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;

$locations
        location = /stats {
            singleflight off;
            singleflight_stats;
        }
    }
EOT

$t->start;

sub zone { $t->zone_stats('sf') }
sub total { my $s = 0; $s += $_ for values %{ $_[0] }; $s }

# a herd of $n on $path, collapsed; the zone once $counted requests (all
# by default) are counted
sub herd {
    my ($path, $n, $counted) = @_;
    $counted //= $n;
    my $z0 = zone();
    my @h = map { $t->start_request('GET', $path, timeout => 10) } 1 .. $n;
    $t->wait_waiters($n - 1);
    my $res = $t->finish_all(\@h);
    my (undef, $z) = $t->wait_zone(sub { total($_[0]{requests_total}) - total($z0->{requests_total}) >= $counted
                                         && $_[0]{in_flight} == 0 },
                                   what => 'the herd counted');
    return ($res, $z0, $z);
}

for my $l (qw(d f)) {
    my $path = $l eq 'd' ? 'default path' : 'a fetch';

    for my $case ([ 'timeout', 'delay=3000', 504 ], [ 'reset', 'delay=300&fail=reset', 502 ],
                  [ 'answered', 'delay=300&size=10', 200 ]) {
        my ($what, $q, $status) = @$case;
        my ($res, $z0, $z) = herd("/$l/h-$what?$q", 3);
        is(scalar(grep { ($_->{status} // 0) == $status } @$res), 3, "$path, origin $what: 3 $status");
        is($z->{flight_header_seconds}{count} - $z0->{flight_header_seconds}{count},
           $status == 200 ? 1 : 0,
           "$path, origin $what: " . ($status == 200 ? 'its header timed' : 'no header timed'));
    }

    {
        my $u = "/${l}p/x?delay=300&status=500";
        my ($res, $z0, $z) = herd($u, 4);
        is($t->origin_uri_hits($u), 2, "$path, promoted 500: 2 origin requests");
        is($z->{flight_seconds}{count} - $z0->{flight_seconds}{count}, 1,
           "$path, promoted 500: one flight timed in flight_seconds");
    }

    {
        my $u = "/${l}s/x";
        my $cached = Time::HiRes::time();
        is($t->get("$u?status=200")->{status}, 200, "$path, stale: cached");
        # proxy_cache_valid 1s, in whole seconds: stale after 2
        $t->wait_for(sub { Time::HiRes::time() - $cached > 2.2 }, what => 'the entry stale');
        my $h0 = $t->origin_uri_hits("$u?status=500&delay=300");
        my ($res, $z0, $z) = herd("$u?status=500&delay=300", 3, 3);
        ok($t->origin_uri_hits("$u?status=500&delay=300") > $h0, "$path, stale: the origin asked");
        is(total($z->{origin_requests_total}) - total($z0->{origin_requests_total}), 1,
           "$path, stale: the flight's origin request counted");
    }
}

done_testing;
