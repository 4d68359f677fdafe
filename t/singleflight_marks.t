#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Private marks cannot be used to fill the zone (issue 11): a mark is made
# only when a private response had followers, it holds a hash and not the
# key, and marks are the first thing dropped when the zone is short of
# memory, so that collapsing for other keys goes on however many there are.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_zone zone=small:64k;

    server {
        listen 127.0.0.1:%%PORT%%;
        large_client_header_buffers 4 16k;

        location / {
            singleflight sf;
            singleflight_private_ttl 60s;
            proxy_pass http://%%ORIGIN%%;
        }

        location /small/ {
            singleflight small;
            singleflight_private_ttl 60s;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
$t->start;

my $COOKIE = 'hdr=Set-Cookie:s%3D1';

# ------------------------------------------------------------ no followers

# 300 quick requests for private responses, each a key of its own with a
# 4 KB URI: nobody waited, so nothing is marked
my $pad = 'x' x 4000;
my @paths = map { "/flood/$_/$pad?$COOKIE" } 1 .. 300;
my $ok = 0;
for my $i (0 .. 5) {
    my $r = $t->herd(paths => [ @paths[$i * 50 .. $i * 50 + 49] ]);
    $ok += grep { ($_->{status} // 0) == 200 && $_->{complete} } @$r;
}
is($ok, 300, 'flood: 300 private responses served');
my $z = $t->zone_stats('sf');
is($z->{marks}, 0, 'flood: no mark made without followers');

my $res = $t->herd(n => 20, path => '/after-flood?delay=300');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 20, 'after the flood: 20 responses');
is($t->origin_uri_hits('/after-flood?delay=300'), 1, 'after the flood: a herd on another key is collapsed');

# ------------------------------------------------------------ with followers

my $uri = "/priv?delay=200&$COOKIE";
$res = $t->herd(n => 3, path => $uri);
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 3, 'private with followers: 3 responses');
is($t->origin_uri_hits($uri), 3, 'private with followers: each went upstream');
$z = $t->zone_stats('sf');
is($z->{marks}, 1, 'private with followers: the key is marked');
my $before = $z->{private};
$res = $t->herd(n => 3, path => $uri);
is($t->origin_uri_hits($uri), 6, 'marked: requests go upstream at once');
$z = $t->zone_stats('sf');
is($z->{private} - $before, 3, 'marked: counted as private');

# ------------------------------------------------------------ eviction

# a zone filled with marks: each round, 20 private flights with a
# follower each, until a round finds no room for all of its marks; the
# flights themselves never lack memory, marks are dropped for them
my $small = $t->zone_stats('small');
my $nomem = $small->{no_memory};
my ($round, $made) = (0, 0);
my $full = 0;
while ($round < 60) {
    $round++;
    my $marks = $small->{marks};
    my @p = map { ("/small/m$round-$_?delay=100&$COOKIE") x 2 } 1 .. 20;
    $t->herd(paths => \@p);
    $made += 20;
    $small = $t->zone_stats("small");
    diag("round $round: marks $small->{marks} free $small->{pages_free} nomem $small->{no_memory}")
        if $ENV{MARKS_DEBUG};
    if ($small->{marks} < $marks + 20) {
        $full = 1;
        last;
    }
}
ok($full, "eviction: the zone filled up with marks ($small->{marks} marks after $round rounds)");
cmp_ok($small->{marks}, '<', $made, "eviction: marks were dropped ($made made, $small->{marks} kept)");
is($small->{no_memory} - $nomem, 0, 'eviction: no flight was refused memory meanwhile');

$res = $t->herd(n => 20, path => '/small/busy?delay=300');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 20, 'eviction: 20 responses');
is($t->origin_uri_hits('/small/busy?delay=300'), 1, 'eviction: a herd on another key is still collapsed');
is($t->zone_stats('small')->{no_memory} - $nomem, 0, 'eviction: no allocation refused');

done_testing;
