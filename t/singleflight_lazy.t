#!/usr/bin/perl
#
# singleflight_lazy: a flight whose response header arrives with nobody
# waiting is not captured; it ends there, so a request arriving while that
# response's body still streams starts a flight of its own.  With
# singleflight_lazy off, every flight is captured and such a request
# follows it.  Followers that joined before the header are served either
# way.

use strict;
use warnings;

use Test::More;

use SFTest;

my $t = SFTest->new;
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

# the body comes in 4 pieces, 400 ms apart, after an immediate header
for my $case (['/lazy?', 2, 'LEADER', 'lazy: a late request leads its own flight'],
              ['/eager/x?', 1, 'FOLLOWER', 'lazy off: a late request follows'])
{
    my ($prefix, $hits, $sf, $what) = @$case;
    my $uri = "${prefix}fail=slowbody&delay=400&size=4000";

    my $first = $t->start_request('GET', $uri, timeout => 10);

    # the header (and the first piece) reached the client: the body streams
    $t->wait_for(sub { $t->poll_request($first);
                       ($first->{res}{status} // 0) == 200 },
                 what => 'the first response header');

    my $late = $t->get($uri);
    my $r = $t->finish_request($first);

    is($r->{status}, 200, "$what: the first request answered");
    is($late->{status}, 200, "$what: the late request answered");
    is(length $late->{body}, 4000, "$what: a complete body");
    is($late->{headers}{'x-sf'}, $sf, "$what ($sf)");
    is($t->origin_hits->{uris}{$uri}, $hits, "$what: $hits origin request(s)");
}

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
