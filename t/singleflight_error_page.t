#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A herd whose first request goes its own way, times out and is taken
# by error_page to a fallback.  Without the module each client times out
# once, then gets the fallback.  With it the followers do not wait for
# the fallback's header to know that the first request cannot feed their
# flight: a follower fetches it as the first is redirected.  With
# singleflight_promote's default (timeout, tries=1) the first request's
# timeout was the flight's first try, so the follower's is its last: the
# slow origin gets 2 requests, not 3; with singleflight_promote off, the
# follower's fetch is not made again either.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $locations = <<'EOT';
        error_page 502 504 = @fallback;

        location /default/ {
            proxy_read_timeout 300ms;
            proxy_pass http://%%ORIGIN%%;
        }

        location /off/ {
            proxy_read_timeout 300ms;
            singleflight_promote off;
            proxy_pass http://%%ORIGIN%%;
        }

        # the origin's own 502 or 504, made an error page by nginx: the
        # http_502 and http_504 conditions, which are not the default's,
        # not "error" and "timeout", nginx's own
        location /icpt/ {
            proxy_intercept_errors on;
            proxy_pass http://%%ORIGIN%%;
        }

        location /icptf/ {
            singleflight_lone fetch;
            proxy_intercept_errors on;
            proxy_pass http://%%ORIGIN%%;
        }

        # singleflight_share_errors off has no origin body to keep from
        # the followers: each one's error_page answers the origin's status
        location /icpto/ {
            singleflight_lone fetch;
            singleflight_share_errors off;
            proxy_intercept_errors on;
            error_page 404 503 = @fallback;
            proxy_pass http://%%ORIGIN%%;
        }

        location /icptod/ {
            singleflight_share_errors off;
            proxy_intercept_errors on;
            error_page 404 503 = @fallback;
            proxy_pass http://%%ORIGIN%%;
        }

        location @fallback {
            rewrite ^ /fallback?size=50&delay=500? break;
            proxy_pass http://%%ORIGIN%%;
        }
EOT

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
$locations
    }

    # plain nginx, for the answers
    server {
        listen 127.0.0.1:%%PORT_1%%;
$locations
    }
EOT

$t->start;

# a herd of 10, 20 ms apart: the answers, the slowest client's time (from
# its own start), and the origin requests for the slow URI
sub herd {
    my ($port, $uri) = @_;
    my @h;
    for (1 .. 10) {
        push @h, $t->start_request('GET', $uri, port => $port);
        select(undef, undef, undef, 0.02);
    }
    my $res = $t->finish_all(\@h);
    my ($slowest) = sort { $b <=> $a } map { $_->{time} // 99 } @$res;
    diag("$uri: " . join(" ", map { sprintf "%.2f", $_->{time} // 99 } @$res)) if $ENV{TEST_VERBOSE};
    my @bodies = map { ($_->{status} // 'none') . ' ' . length($_->{body} // '') }
                 @$res;
    is($bodies[0], '200 50', "$uri: the fallback's answer");
    return (\@bodies, $slowest, $t->origin_uri_hits($uri));
}

for my $c ([ 'default', 2 ], [ 'off', 2 ]) {
    my ($where, $tries) = @$c;
    my $uri = "/$where/x?size=100&delay=1000";

    my ($off, $off_time, $off_hits) = herd($t->port(1), "$uri&plain=1");
    my ($on, $on_time, $on_hits) = herd($t->port(0), $uri);

    is_deeply($on, $off, "$where: every client gets the fallback, as without the module");
    is($off_hits, 10, "$where: without the module, each client times out on its own");
    is($on_hits, $tries, "$where: with it, the slow origin gets $tries");

    # the first timeout, the follower's, the fallback: 1.1 s, where the
    # followers waited for the fallback's header (0.8 s) before fetching
    cmp_ok($on_time, '<', 1.35, "$where: followers have the fallback after one more try");
}

# the first request gone its own way (direct) has the origin's 502, which
# its error_page takes to the fallback: a follower fetches the flight (the
# documented cost of an error_page), and that fetch's 502 is the origin's
# too, not fetched again; a fetch's (singleflight_lone fetch) at once
for my $c ([ 'icpt', 502, 2 ], [ 'icpt', 504, 2 ], [ 'icptf', 502, 1 ],
           [ 'icptf', 504, 1 ], [ 'icpto', 404, 1 ], [ 'icpto', 503, 1 ],
           [ 'icptod', 404, 2 ], [ 'icptod', 503, 2 ])
{
    my ($where, $status, $hits) = @$c;
    my $uri = "/$where/y?size=100&delay=1000&status=$status";

    my ($off, undef, $off_hits) = herd($t->port(1), "$uri&plain=1");
    my ($on, undef, $on_hits) = herd($t->port(0), $uri);

    is_deeply($on, $off, "$where $status: every client gets the fallback, as without the module");
    is($off_hits, 10, "$where $status: without the module, each client asks the origin");
    is($on_hits, $hits, "$where $status: with it, the origin's own $status is not fetched again");
}

done_testing;
