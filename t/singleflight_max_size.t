#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_max_size: a response whose Content-Length is larger than the
# limit is delivered in full to its leader, and its followers go upstream
# themselves (each counted in not_shared, the flight in oversized) instead
# of getting a truncated copy.  A chunked body that crosses the limit
# mid-stream is read to its end by those already reading it (oversized
# counted), and nobody joins it after that.  A response within the limit
# is shared.

use strict;
use warnings;

use Test::More;
use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:4m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_max_size 64k;
            # chunked bodies reach nginx chunked (the default before 1.29.7
            # was HTTP/1.0, which the origin answers with a length)
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /sf_stats {
            singleflight_stats;
        }
    }
EOT
$t->start;

my $N = 10;

sub stats { $t->zone_stats('sf', '/sf_stats') }

# Fires a herd of $N at $uri and checks every response is the origin's full
# body of $size bytes for the hit that produced it.  Returns the responses.
sub herd_ok {
    my ($name, $uri, $size) = @_;
    my $res = $t->herd(n => $N, path => $uri);
    my @bad = grep {
        my $r = $res->[$_];
        !(($r->{status} // 0) == 200 && $r->{complete}
            && defined $r->{headers}{'x-hit'}
            && $r->{body} eq SFTest::origin_body($r->{headers}{'x-hit'}, $uri, $size));
    } 0 .. $#$res;
    ok(!@bad, "$name: all $N responses are 200 with the complete body of their hit")
        or diag(join "\n", map {
            my $r = $res->[$_];
            "client $_: status " . ($r->{status} // 'none') . ', ' . length($r->{body})
                . ' bytes, x-hit ' . ($r->{headers}{'x-hit'} // 'none')
                . ($r->{error} ? ", error: $r->{error}" : '')
        } @bad);
    return $res;
}

# ---------------------------------------------------- larger than max_size

# 200000 bytes, and one byte over the limit; the size is known from the
# Content-Length, or only found out while the chunked body streams in.
for my $case (
    [ 'Content-Length', "/big?delay=300&size=200000", 200000 ],
    [ 'Content-Length 64k+1', "/over?delay=300&size=65537", 65537 ],
) {
    my ($name, $uri, $size) = @$case;
    $t->origin_reset;
    my $before = stats();

    my $res = herd_ok("$name ($size bytes)", $uri, $size);
    is($t->origin_hits->{total}, $N, "$name: each request went upstream");
    my %hits = map { $_->{headers}{'x-hit'} // 'none' => 1 } @$res;
    is(scalar(keys %hits), $N, "$name: $N distinct origin responses");

    my $d = SFTest::delta($before, stats());
    is($d->{flights}, 1, "$name: one flight");
    is($d->{followers}, $N - 1, "$name: the others joined it as followers");
    is($d->{oversized}, 1, "$name: stats oversized == 1");
    is($d->{not_shared}, $N - 1, "$name: stats not_shared == " . ($N - 1));
    is($d->{served}, 0, "$name: nothing served from the zone");
    is($d->{bytes_shared}, 0, "$name: no bytes shared");
    is(join(' ', sort $t->sf_statuses($uri, $N)), join(' ', 'LEADER', ('NOT_SHARED') x ($N - 1)),
        "$name: \$singleflight_status LEADER + NOT_SHARED");
}

# ---------------------------------------------------- growing past it

# Chunked: the size is found out while the body streams in.  Those reading
# it already read it to its end, one origin response for all.
for my $case (
    [ 'chunked', "/big-chunked?delay=300&size=200000&chunked=1", 200000 ],
    [ 'chunked 64k+1', "/over-chunked?delay=300&size=65537&chunked=1", 65537 ],
) {
    my ($name, $uri, $size) = @$case;
    $t->origin_reset;
    my $before = stats();

    my $res = herd_ok("$name ($size bytes)", $uri, $size);
    is($t->origin_hits->{total}, 1, "$name: one origin request");
    is(scalar(grep { ($_->{headers}{'x-hit'} // 0) == 1 } @$res), $N, "$name: everyone got hit 1");

    my $d = SFTest::delta($before, stats());
    is($d->{flights}, 1, "$name: one flight");
    is($d->{oversized}, 1, "$name: stats oversized == 1");
    is($d->{not_shared}, 0, "$name: nobody sent upstream");
    is($d->{served}, $N - 1, "$name: the followers served from the flight");
    is(join(' ', sort $t->sf_statuses($uri, $N)), join(' ', ('FOLLOWER') x ($N - 1), 'LEADER'),
        "$name: \$singleflight_status LEADER + FOLLOWER");
}

# A request that comes once the body has grown past the limit does not join:
# it starts a flight of its own.
{
    my $uri = '/late-chunked?delay=100&size=200000&chunked=1&fail=slowbody&pieces=4';
    $t->origin_reset;
    my $before = stats();
    my @first = map { $t->start_request('GET', $uri) } 1 .. 3;
    $t->wait_for(sub { stats()->{oversized} > $before->{oversized} },
                 what => 'the body past the limit');
    my $late = $t->finish_request($t->start_request('GET', $uri));
    my @res = map { $t->finish_request($_) } @first;
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                     && $_->{body} eq SFTest::origin_body(1, $uri, 200000) } @res),
       3, 'late: the three readers got the whole of hit 1');
    ok(($late->{status} // 0) == 200 && $late->{complete}
       && $late->{body} eq SFTest::origin_body(2, $uri, 200000),
       'late: the latecomer got a response of its own, hit 2');
    is($t->origin_hits->{total}, 2, 'late: two origin requests');
}

# Past the limit, then broken off: asked for again whole for the
# followers (a chunked body has no length to resume by a Range), the
# second response passes the limit too.  One response, counted once as
# oversized.
{
    my $uri = '/over-resumed?delay=300&size=200000&chunked=1&fixed=1'
        . '&hdr=ETag:%22v1%22&fail=cut&cut=100000&fail_first=1';
    $t->origin_reset;
    my $before = stats();
    my $res = $t->herd(n => 3, path => $uri);
    # the first request's own response is cut, as without the module
    is(join(' ', sort map { ($_->{status} // 'none') . ':' . length($_->{body} // '') } @$res),
       '200:100000 200:200000 200:200000',
       'oversized, resumed: the first request cut, its followers the whole body');
    is($t->origin_hits->{total}, 2, 'oversized, resumed: asked for again once');
    is(SFTest::delta($before, stats())->{oversized}, 1, 'oversized, resumed: counted once');
}

# ---------------------------------------------------- within the limit

# 60000 bytes, and exactly max_size (the limit is inclusive), with a
# Content-Length and chunked.
for my $case (
    [ '60000 bytes', "/small?delay=300&size=60000", 60000 ],
    [ '60000 bytes chunked', "/small-chunked?delay=300&size=60000&chunked=1", 60000 ],
    [ 'exactly 64k', "/edge?delay=300&size=65536", 65536 ],
    [ 'exactly 64k chunked', "/edge-chunked?delay=300&size=65536&chunked=1", 65536 ],
) {
    my ($name, $uri, $size) = @$case;
    $t->origin_reset;
    my $before = stats();

    my $res = herd_ok($name, $uri, $size);
    is($t->origin_hits->{total}, 1, "$name: shared, 1 origin hit");
    ok(!grep({ ($_->{headers}{'x-hit'} // 0) != 1 } @$res), "$name: everyone got hit 1");

    my $d = SFTest::delta($before, stats());
    is($d->{oversized}, 0, "$name: not oversized");
    is($d->{not_shared}, 0, "$name: no follower sent upstream");
    is($d->{served}, $N - 1, "$name: " . ($N - 1) . " followers served from the zone");
    is($d->{bytes_shared}, ($N - 1) * $size, "$name: bytes_shared");
}

# Nothing is left in the zone once the followers are gone.
$t->zone_baseline_ok('zone back to baseline', path => '/sf_stats');

done_testing;
