#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_lazy: a response whose header arrives while nobody but its
# leader waits, and whose length is known and at most the lazy limit
# (singleflight_memory, or the size given), is not stored: it goes
# straight to its leader, and a request arriving while its body still
# comes starts a flight of its own (one more origin request, counted in
# "unstored").  A longer response, one without a length, or any response
# with singleflight_lazy off, is stored, and such a request joins it and
# gets the whole body from its first byte.  Followers that joined before
# the header are served either way.

use strict;
use warnings;

use Test::More;

use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /small/ {
            singleflight sf;
            singleflight_lazy 1000;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /eager/ {
            singleflight sf;
            singleflight_lazy off;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /slow/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%/;
            limit_rate 1k;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

my $NOT_STORED = qr/singleflight flight has no followers, not stored/;
my $STORED = qr/singleflight flight \d+ header stored/;

# ------------------------------------------------------------ a slow body

# the body comes in 4 pieces, 400 ms apart, after an immediate header,
# with nobody else waiting.  Not stored with lazy on: a late request leads
# a flight of its own.  Stored when it is longer than the lazy limit, or
# with lazy off: a late request joins it.
for my $case (['/lazy?', 0, 'lazy, slow body'],
              ['/small/x?', 1, 'lazy 1000, a longer slow body'],
              ['/eager/x?', 1, 'lazy off, slow body'])
{
    my ($prefix, $stored, $what) = @$case;
    my $uri = "${prefix}fail=slowbody&delay=400&size=4000";
    my $before = $t->stats('/stats')->{zones}{sf}{unstored} // -1;

    my $first = $t->start_request('GET', $uri, timeout => 10);

    # the header (and the first piece) reached the client: the body streams
    $t->wait_for(sub { $t->poll_request($first);
                       ($first->{res}{status} // 0) == 200 },
                 what => 'the first response header');

    my $late = $t->get($uri);
    my $r = $t->finish_request($first);

    is($r->{status}, 200, "$what: the first request answered");
    is($r->{body}, SFTest::origin_body($r->{headers}{'x-hit'} // 0, $uri,
                                       4000),
       "$what: the first request got its whole body");
    is($late->{status}, 200, "$what: the late request answered");
    is($late->{body}, SFTest::origin_body($late->{headers}{'x-hit'} // 0,
                                          $uri, 4000),
       "$what: the late request got a whole body");

    my $unstored = $t->stats('/stats')->{zones}{sf}{unstored};

    if ($stored) {
        is($late->{body}, $r->{body}, "$what: the same as the first request");
        is($late->{headers}{'x-sf'}, 'FOLLOWER',
           "$what: the late request joined");
        is($t->origin_hits->{uris}{$uri}, 1, "$what: 1 origin request");
        is($unstored, $before, "$what: not counted as unstored");

    } else {
        is($late->{headers}{'x-sf'}, 'LEADER',
           "$what: the late request led a flight of its own");
        is($t->origin_hits->{uris}{$uri}, 2, "$what: 2 origin requests");
        # both: the late one had nobody waiting either
        is($unstored, $before + 2, "$what: counted as unstored");
    }
}

# ------------------------------------------------------------ all at once

# a small response that came whole with its header, nobody else waiting:
# not stored with lazy on, stored with it off
for my $case (['/quick?size=100', $NOT_STORED, 'lazy'],
              ['/eager/quick?size=100', $STORED, 'lazy off'])
{
    my ($uri, $want, $what) = @$case;

    my $off = $t->log_offset;
    my $r = $t->get($uri);

    is($r->{status}, 200, "$what, quick response: answered");
    is($r->{body}, SFTest::origin_body($t->origin_hits->{total}, $uri, 100),
       "$what, quick response: its body");
    is($r->{headers}{'x-sf'}, 'LEADER', "$what, quick response: its leader");
    ok($t->wait_for(sub { $t->log_count($want, $off) >= 1 },
                    what => "$what: the debug line"),
       "$what, quick response: " . ($want == $NOT_STORED ? 'not stored'
                                                         : 'stored'));
}

# ------------------------------------------------------------ a herd

# followers waiting before the header are served as always
my $uri = '/herd?delay=300&size=2000';
my $res = $t->herd(n => 20, path => $uri);
is(scalar(grep { $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0,
                                                   $uri, 2000) } @$res),
   20, 'lazy: a herd gets complete bodies');
is($t->origin_hits->{uris}{$uri}, 1, 'lazy: a herd is still collapsed');

my $z;
ok($t->wait_for(sub {
    $z = $t->stats('/stats?diagnostics=1')->{zones}{sf};
    $z->{in_flight} == 0 && $z->{pages_used} == $z->{pages_baseline};
}, what => 'baseline'), 'zone back to baseline');

# A flight whose only follower left before the header: once followed, it
# is stored (whether a flight is its leader's alone is decided at the
# header without the lock, and a follower closes that for good).  Its
# leader gets its response all the same.
{
    my $uri = '/left?delay=800&size=100';
    my $off = $t->log_offset;
    my $leader = $t->start_request('GET', $uri, timeout => 10);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the leader at the origin');
    my $f = $t->start_request('GET', $uri, timeout => 10);
    ok(scalar $t->wait_zone(sub { ($_[0]{waiters} // 0) == 1 }, what => 'the follower waits'),
       'a follower that left: it waited');
    $t->abort_request($f);
    ok(scalar $t->wait_zone(sub { ($_[0]{waiters} // 1) == 0 }, what => 'the follower gone'),
       'a follower that left: it is gone before the header');
    my $r = $t->finish_request($leader);
    is(join(' ', $r->{status} // 'none', $r->{headers}{'x-sf'} // '-', $r->{body}),
       '200 LEADER ' . SFTest::origin_body($r->{headers}{'x-hit'} // 0, $uri, 100),
       'a follower that left: the leader got its response');
    ok($t->wait_for(sub { $t->log_count($STORED, $off) >= 1 }, what => 'stored'),
       'a follower that left: the response was stored');
    is($t->log_count($NOT_STORED, $off), 0, 'a follower that left: not sent unstored');
}

# A lone leader that goes away while its unstored response streams: the
# fetch stops, and the flight, still in the tree where nobody could join
# it, goes with its last hold: the zone is back to its baseline.
{
    my $uri = '/gone?fail=slowbody&delay=400&size=4000';
    my $off = $t->log_offset;
    my $h = $t->start_request('GET', $uri, timeout => 10);
    ok($t->wait_for(sub { $t->poll_request($h); ($h->{res}{status} // 0) == 200 },
                    what => 'the header at the client'),
       'a lone leader gone mid-body: the body streamed');
    ok($t->log_count($NOT_STORED, $off) >= 1, 'a lone leader gone mid-body: not stored');
    is($t->stats('/stats')->{zones}{sf}{in_flight}, 0,
       'a lone leader gone mid-body: in_flight 0 while it streams');
    $t->abort_request($h);
    $t->zone_baseline_ok('a lone leader gone mid-body: zone back to baseline');
    my $r = $t->get($uri);
    is(join(' ', $r->{status} // 'none', $r->{headers}{'x-sf'} // '-'), '200 LEADER',
       'a lone leader gone mid-body: the key works again');
}

# A response that goes straight to its lone leader, paced by limit_rate:
# its fetch is over while the rest still waits for the rate's timer, and
# that timer sends it (the leader's end left it alone).  Before, the last
# bytes never went and the connection hung.
{
    my $r = $t->get('/slow/lr?size=2048', timeout => 15);
    is(join(' ', $r->{status} // 'none', $r->{complete} ? 'complete' : 'cut',
            length($r->{body} // '')), '200 complete 2048',
       'limit_rate, a direct response: the whole of it');
}

done_testing;
