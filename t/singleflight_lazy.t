#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_lazy: a response whose header arrives while nobody but its
# leader waits, and whose whole body came with the header, is not stored:
# it goes straight to its leader.  Any other response is stored, so that a
# request arriving while its body still comes joins it and gets the whole
# body from its first byte.  With singleflight_lazy off, every response is
# stored.  Followers that joined before the header are served either way.

use strict;
use warnings;

use Test::More;

use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
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

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

my $NOT_STORED = qr/singleflight flight has no followers, not stored/;
my $STORED = qr/singleflight flight \d+ header stored/;

# ------------------------------------------------------------ a slow body

# the body comes in 4 pieces, 400 ms apart, after an immediate header: the
# response is stored even with nobody waiting, and a late request joins
for my $prefix ('/lazy?', '/eager/x?') {
    my $uri = "${prefix}fail=slowbody&delay=400&size=4000";
    my $what = $prefix eq '/lazy?' ? 'lazy, slow body' : 'lazy off, slow body';

    my $first = $t->start_request('GET', $uri, timeout => 10);

    # the header (and the first piece) reached the client: the body streams
    $t->wait_for(sub { $t->poll_request($first);
                       ($first->{res}{status} // 0) == 200 },
                 what => 'the first response header');

    my $late = $t->get($uri);
    my $r = $t->finish_request($first);

    is($r->{status}, 200, "$what: the first request answered");
    is($late->{status}, 200, "$what: the late request answered");
    is($late->{body}, SFTest::origin_body($r->{headers}{'x-hit'} // 0, $uri,
                                          4000),
       "$what: the late request got the whole body of the one response");
    is($late->{body}, $r->{body}, "$what: the same as the first request");
    is($late->{headers}{'x-sf'}, 'FOLLOWER', "$what: the late request joined");
    is($t->origin_hits->{uris}{$uri}, 1, "$what: 1 origin request");
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
    $z = $t->stats('/stats')->{zones}{sf};
    $z->{in_flight} == 0 && $z->{pages_used} == $z->{pages_baseline};
}, what => 'baseline'), 'zone back to baseline');

done_testing;
