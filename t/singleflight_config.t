#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Configuration checking: `nginx -t` rejects every misuse of the module's
# directives with an [emerg] message that names the directive, and accepts
# a valid configuration using all of them.

use strict;
use warnings;

use Test::More;
use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;

# A config with $http at http level and $loc inside location /, plus a
# valid zone "sf" unless $http declares zones itself.
sub conf {
    my (%a) = @_;
    my $zone = $a{zone} // 'singleflight_zone zone=sf:1m;';
    my $http = $a{http} // '';
    my $srv = $a{server} // '';
    my $loc = $a{loc} // '';
    return $t->config_template(<<"EOT");
    $zone
    $http

    server {
        listen 127.0.0.1:%%PORT%%;
        $srv

        location / {
            $loc
            proxy_pass http://127.0.0.1:1;
        }

        location = /sf_stats {
            singleflight_stats;
        }
    }
EOT
}

# nginx -t must fail with an [emerg] naming $directive (and matching every
# extra pattern in @more).
sub rejected {
    my ($name, $conf, $directive, @more) = @_;
    $t->write_config($conf);
    my ($ok, $out) = $t->test_config;
    my $emerg = join "\n", grep { /\[emerg\]/ } split /\n/, $out;
    subtest "rejected: $name" => sub {
        ok(!$ok, 'nginx -t fails');
        like($emerg, qr/\[emerg\]/, 'an [emerg] message');
        like($emerg, qr/"\Q$directive\E"|\b\Q$directive\E\b(?!_)/,
            "the [emerg] message names \"$directive\"");
        like($emerg, $_, "the [emerg] message matches $_") for @more;
    } or diag("nginx -t output:\n$out");
}

# ---------------------------------------------------- valid

$t->write_config(conf(
    zone => 'singleflight_zone zone=sf:1m; singleflight_zone zone=other:64k;',
    http => 'singleflight_timeout 5s; singleflight_max_size 2m;',
    server => 'singleflight other; singleflight_key $host$uri;',
    loc => join(' ', 'singleflight sf;',
        'singleflight_key $scheme$host$request_uri$singleflight_body_hash;',
        'singleflight_methods GET HEAD POST;', 'singleflight_bypass $http_x_nocache $arg_nc;',
        'singleflight_timeout 500ms;', 'singleflight_max_size 64k;',
        'singleflight_lazy 4m;', 'singleflight_lone direct;', 'singleflight_resume on tries=3;',
        'singleflight_max_range_offset 64k;',
        'singleflight_hedge auto min=20ms;',
        'singleflight_promote error timeout dead http_503;'),
));
my ($ok, $out) = $t->test_config;
ok($ok, 'a valid configuration passes nginx -t') or diag($out);
unlike($out, qr/\[(?:emerg|warn)\]/, 'valid configuration: no [emerg] or [warn]');

# POST collapsed by a key that leaves the body out: valid, but requests
# with different bodies would share one response, and nginx -t says so.
$t->write_config(conf(loc => 'singleflight sf; singleflight_key $scheme$host$request_uri; '
    . 'singleflight_methods GET HEAD POST;'));
($ok, $out) = $t->test_config;
ok($ok, 'POST with a key without the body passes nginx -t') or diag($out);
like($out, qr/\[warn\] "singleflight_methods" collapses requests with a body, but "singleflight_key"/,
    'POST with a key without the body: a [warn] naming singleflight_methods and singleflight_key');

# A zone may be declared after the server that uses it.
$t->write_config($t->config_template(<<'EOT'));
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight late;
            proxy_pass http://127.0.0.1:1;
        }
    }
    singleflight_zone zone=late:1m;
EOT
($ok, $out) = $t->test_config;
ok($ok, 'a zone declared after its use passes nginx -t') or diag($out);

$t->write_config(conf(loc => 'singleflight off;'));
($ok, $out) = $t->test_config;
ok($ok, '"singleflight off" passes nginx -t') or diag($out);

# ---------------------------------------------------- singleflight_promote

rejected('singleflight_promote with an unknown condition',
    conf(loc => 'singleflight sf; singleflight_promote error died;'), 'singleflight_promote');
rejected('singleflight_promote dead off',
    conf(loc => 'singleflight sf; singleflight_promote dead off;'), 'singleflight_promote',
    qr/"off" cannot be combined/);

# ---------------------------------------------------- singleflight_zone

rejected('singleflight_zone without arguments',
    conf(zone => 'singleflight_zone;'), 'singleflight_zone');
rejected('singleflight_zone with a size but no zone=',
    conf(zone => 'singleflight_zone 1m;'), 'singleflight_zone');
rejected('singleflight_zone zone=:1m (empty name)',
    conf(zone => 'singleflight_zone zone=:1m;'), 'singleflight_zone');
rejected('singleflight_zone with a parameter other than zone=',
    conf(zone => 'singleflight_zone foo=bar;'), 'singleflight_zone');
rejected('singleflight_zone zone=x (no size)',
    conf(zone => 'singleflight_zone zone=x;'), 'singleflight_zone');
rejected('singleflight_zone zone=x:abc (bad size)',
    conf(zone => 'singleflight_zone zone=x:abc;'), 'singleflight_zone');
rejected('singleflight_zone zone=x:1k (too small)',
    conf(zone => 'singleflight_zone zone=x:1k;'), 'singleflight_zone');
rejected('singleflight_zone with an unknown extra parameter',
    conf(zone => 'singleflight_zone zone=x:1m foo=bar;'), 'singleflight_zone');
rejected('duplicate zone name',
    conf(zone => 'singleflight_zone zone=x:1m; singleflight_zone zone=x:1m;'),
    'singleflight_zone', qr/"x"/);
rejected('duplicate zone name with another size',
    conf(zone => 'singleflight_zone zone=x:1m; singleflight_zone zone=x:2m;'),
    'singleflight_zone', qr/"x"/);
rejected('singleflight_zone in a server block',
    conf(server => 'singleflight_zone zone=x:1m;'), 'singleflight_zone', qr/not allowed here/);
rejected('singleflight_zone in a location block',
    conf(loc => 'singleflight_zone zone=x:1m;'), 'singleflight_zone', qr/not allowed here/);

# ---------------------------------------------------- singleflight

rejected('singleflight naming an unknown zone',
    conf(loc => 'singleflight nosuchzone;'), 'singleflight', qr/nosuchzone/);
rejected('singleflight naming an unknown zone at http level',
    conf(http => 'singleflight nosuchzone;'), 'singleflight', qr/nosuchzone/);
rejected('singleflight without arguments',
    conf(loc => 'singleflight;'), 'singleflight');
rejected('singleflight twice in one location',
    conf(loc => 'singleflight sf; singleflight sf;'), 'singleflight', qr/is duplicate/);
rejected('singleflight sf and off in one location',
    conf(loc => 'singleflight sf; singleflight off;'), 'singleflight', qr/is duplicate/);

# ---------------------------------------------------- singleflight_loop_name

$t->write_config(conf(http => 'singleflight_loop_name edge-1.example.com:8080;'));
($ok, $out) = $t->test_config;
ok($ok, 'singleflight_loop_name host:port passes nginx -t') or diag($out);

rejected('singleflight_loop_name with a space',
    conf(http => 'singleflight_loop_name "edge 1";'), 'singleflight_loop_name', qr/"edge 1"/);
rejected('singleflight_loop_name with a comma',
    conf(http => 'singleflight_loop_name "a,b";'), 'singleflight_loop_name');
rejected('singleflight_loop_name empty',
    conf(http => 'singleflight_loop_name "";'), 'singleflight_loop_name');
rejected('singleflight_loop_name longer than 255',
    conf(http => 'singleflight_loop_name ' . ('x' x 256) . ';'), 'singleflight_loop_name');
rejected('singleflight_loop_name twice',
    conf(http => 'singleflight_loop_name a; singleflight_loop_name b;'),
    'singleflight_loop_name', qr/is duplicate/);
rejected('singleflight_loop_name in a server block',
    conf(server => 'singleflight_loop_name a;'), 'singleflight_loop_name', qr/not allowed here/);

# ---------------------------------------------------- the others

rejected('singleflight_timeout abc',
    conf(loc => 'singleflight sf; singleflight_timeout abc;'), 'singleflight_timeout');
rejected('singleflight_max_size abc',
    conf(loc => 'singleflight sf; singleflight_max_size abc;'), 'singleflight_max_size');
rejected('singleflight_methods FOO',
    conf(loc => 'singleflight sf; singleflight_methods FOO;'), 'singleflight_methods');
rejected('singleflight_methods without arguments',
    conf(loc => 'singleflight sf; singleflight_methods;'), 'singleflight_methods');
rejected('singleflight_key without arguments',
    conf(loc => 'singleflight sf; singleflight_key;'), 'singleflight_key');
rejected('singleflight_bypass without arguments',
    conf(loc => 'singleflight sf; singleflight_bypass;'), 'singleflight_bypass');
rejected('singleflight_lone maybe',
    conf(loc => 'singleflight sf; singleflight_lone maybe;'), 'singleflight_lone',
    qr/invalid value "maybe"/);
rejected('singleflight_lone twice',
    conf(loc => 'singleflight sf; singleflight_lone direct; singleflight_lone fetch;'),
    'singleflight_lone', qr/is duplicate/);
rejected('singleflight_lone direct in a zone too small for its slots',
    conf(zone => 'singleflight_zone zone=sf:64k;', loc => 'singleflight sf; singleflight_lone direct;'),
    'singleflight_lone', qr/zone "sf" of at least \d+k/);

rejected('singleflight_lazy maybe',
    conf(loc => 'singleflight sf; singleflight_lazy maybe;'), 'singleflight_lazy',
    qr/"on", "off" or a size/);
rejected('singleflight_lazy twice',
    conf(loc => 'singleflight sf; singleflight_lazy on; singleflight_lazy 1m;'),
    'singleflight_lazy', qr/is duplicate/);
rejected('singleflight_max_range_offset far',
    conf(loc => 'singleflight sf; singleflight_max_range_offset far;'),
    'singleflight_max_range_offset', qr/an offset or "off"/);
rejected('singleflight_max_range_offset twice',
    conf(loc => 'singleflight sf; singleflight_max_range_offset 1m; singleflight_max_range_offset off;'),
    'singleflight_max_range_offset', qr/is duplicate/);
rejected('singleflight_resume maybe',
    conf(loc => 'singleflight sf; singleflight_resume maybe;'), 'singleflight_resume',
    qr/"on" or "off"/);
rejected('singleflight_resume on tries=0',
    conf(loc => 'singleflight sf; singleflight_resume on tries=0;'), 'singleflight_resume',
    qr/tries=/);
rejected('singleflight_resume off tries=2',
    conf(loc => 'singleflight sf; singleflight_resume off tries=2;'), 'singleflight_resume',
    qr/after "on"/);
rejected('singleflight_hedge soon',
    conf(loc => 'singleflight sf; singleflight_hedge soon;'), 'singleflight_hedge',
    qr/a time, "auto" or "off"/);
rejected('singleflight_hedge auto min=x',
    conf(loc => 'singleflight sf; singleflight_hedge auto min=x;'), 'singleflight_hedge',
    qr/min=/);
rejected('singleflight_hedge 100ms 200ms',
    conf(loc => 'singleflight sf; singleflight_hedge 100ms 200ms;'), 'singleflight_hedge');
rejected('singleflight_stats with an argument',
    conf(loc => 'singleflight_stats on;'), 'singleflight_stats');
rejected('singleflight_stats at server level',
    conf(server => 'singleflight_stats;'), 'singleflight_stats', qr/not allowed here/);

done_testing;
