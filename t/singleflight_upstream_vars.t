#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# $upstream_http_... and $upstream_cache_status for followers.  Without
# the module every client's request went upstream, and a location that
# shows an origin header it hides (proxy_hide_header X-Backend; add_header
# X-From $upstream_http_x_backend), or the cache status, shows it to
# each.  With the module a follower got the fetch's response, and those
# variables are the fetch's: in its headers and its access log line, as
# the leader's.  It went nowhere itself: $upstream_addr stays empty.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $locations = <<'EOT';
        proxy_hide_header X-Backend;
        add_header X-From "$upstream_http_x_backend" always;
        add_header X-Cache "$upstream_cache_status" always;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }

        location /c/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
        }
EOT

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    proxy_cache_path %%TESTDIR%%/cache keys_zone=one:1m;
    log_format uv '\$request_uri b=[\$upstream_http_x_backend] '
                  'c=[\$upstream_cache_status] a=[\$upstream_addr] '
                  'lm=[\$upstream_cache_last_modified] '
                  'sf=\$singleflight_status';

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
        access_log %%TESTDIR%%/uv.log uv;
$locations
        location = /stats {
            singleflight_stats;
        }
    }

    # plain nginx, for the answers
    server {
        listen 127.0.0.1:%%PORT_1%%;
$locations
    }
EOT

$t->start;

my $port1 = $t->port(1);

# what a client sees of them
sub shown {
    my ($r) = @_;
    return join(' ', $r->{status} // 'none', map { "$_=" . ($r->{headers}{$_} // '-') }
                qw(x-from x-cache x-backend));
}

for my $c ([ '/u/herd', 'not cached' ], [ '/c/herd', 'cached' ]) {
    my ($path, $name) = @$c;
    my $uri = "$path?size=3000&delay=300&hdr=X-Backend:b1";
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri ],
                         followers => [ map { [ 'GET', $uri ] } 1 .. 4 ]);
    my $plain = $t->get("$path-plain?size=3000&delay=0&hdr=X-Backend:b1", port => $port1);
    like(shown($plain), qr/^200 x-from=b1 /, "$name: plain nginx shows the hidden header");
    is(join(', ', map { shown($_) } @$res), join(', ', (shown($plain)) x 5),
       "$name: leader and followers, as plain nginx");
    is($t->origin_uri_hits($uri), 1, "$name: one origin request");

    # the access log: each line with the fetch's header and cache status
    my @lines;
    $t->wait_for(sub {
        @lines = grep { /^\Q$uri\E / } split /\n/, $t->read_file('uv.log');
        @lines >= 5;
    }, what => "5 log lines for $uri");
    my $cache = $path =~ m{^/c/} ? 'MISS' : '-';
    is(scalar(grep { /b=\[b1\] c=\[\Q$cache\E\] / } @lines), 5,
       "$name: every log line has the origin's header and the cache status")
        or diag(join("\n", @lines));
    is(scalar(grep { /a=\[-\] lm=\[-\] sf=FOLLOWER/ } @lines), 4,
       "$name: followers went to no upstream address");
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing();
