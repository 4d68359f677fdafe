#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# The fetches' pool (src/ngx_http_singleflight_fake.c): a fetch
# subrequest allocates from a pool of its own, reset and kept for the next
# request when its host request ends.  What nginx hangs on that pool must
# still be let go when its host ends: here the temporary file that
# proxy_cache writes every response to (closed by a cleanup of the pool).
# One worker, 80 requests with nobody to share with, each a new cache
# entry: the worker's open descriptors do not grow with them, every
# answer is whole, and a second round is served from the cache.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<"EOT", workers => 1));
    singleflight_zone zone=sf:4m;
    proxy_cache_path %%TESTDIR%%/cache keys_zone=pc:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_cache pc;
            proxy_cache_valid 200 10m;
            add_header X-Cache \$upstream_cache_status always;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight off;
            singleflight_stats;
        }
    }
EOT
$t->start;

my ($pid) = $t->worker_pids;
ok($pid, 'one worker');

sub fds { my @f = glob("/proc/$pid/fd/*"); scalar @f }

my $size = 30000;
$t->get("/warm$_?size=$size") for 1 .. 3;
my $before = fds();

my ($whole, $miss) = (0, 0);
for my $i (1 .. 80) {
    my $r = $t->get("/k$i?size=$size");
    $whole++ if ($r->{status} // 0) == 200 && length($r->{body} // '') == $size;
    $miss++ if ($r->{headers}{'x-cache'} // '') eq 'MISS';
}
is($whole, 80, '80 lone requests: 80 whole bodies');
is($miss, 80, 'each one a cache miss, fetched once');

my $after = fds();
cmp_ok($after - $before, '<=', 4,
       "the worker's open descriptors: $before before, $after after")
    or diag(join "\n", map { readlink($_) // $_ } glob("/proc/$pid/fd/*"));

my $hits = 0;
for my $i (1 .. 80) {
    my $r = $t->get("/k$i?size=$size");
    $hits++ if ($r->{headers}{'x-cache'} // '') eq 'HIT'
        && length($r->{body} // '') == $size;
}
is($hits, 80, 'the second round: 80 whole bodies from the cache');
is($t->origin_hits->{total}, 83, 'the origin saw each URI once');

$t->zone_baseline_ok('the zone back to its baseline');

done_testing();
