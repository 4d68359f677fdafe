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
    zone => 'singleflight_zone zone=sf:1m memory=128k max_size=2m temp_path=sf_temp; '
          . 'singleflight_zone zone=other:64k scope=worker;',
    http => 'singleflight_timeout 5s;',
    server => 'singleflight other; singleflight_key $host$uri;',
    loc => join(' ', 'singleflight sf;',
        'singleflight_key $scheme$host$request_uri$singleflight_body_hash;',
        'singleflight_methods GET HEAD POST;', 'singleflight_bypass $http_x_nocache $arg_nc;',
        'singleflight_timeout 500ms;',
        'singleflight_private set-cookie private ttl=10s;',
        'singleflight_credentials http;',
        'singleflight_lazy 4m;', 'singleflight_lone direct;', 'singleflight_resume on tries=3;',
        'singleflight_max_range_offset 64k;',
        'singleflight_hedge auto min=20ms;',
        'singleflight_promote error timeout dead http_503 tries=2 status=503;'),
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

# a key with a variable set only once the request is answered: a [warn]
for my $v (qw($upstream_status $upstream_http_etag ${singleflight_status} $singleflight_wait_time)) {
    $t->write_config(conf(loc => "singleflight sf; singleflight_key \$uri$v;"));
    ($ok, $out) = $t->test_config;
    ok($ok, "a key with $v passes nginx -t") or diag($out);
    like($out, qr/\[warn\] "singleflight_key" "\$uri\Q$v\E" uses a variable that is set only once the request is answered/,
        "a key with $v: a [warn] saying it is empty when the key is made");
}

# a variable of the configuration's own named upstream_...: no [warn]
$t->write_config(conf(loc => 'singleflight sf; set $upstream_host x; singleflight_key $uri$upstream_host;'));
($ok, $out) = $t->test_config;
ok($ok, 'a key with a set $upstream_host passes nginx -t') or diag($out);
unlike($out, qr/set only once the request is answered/, 'a key with a set $upstream_host: no [warn]');

# so are DELETE, OPTIONS and PROPFIND, whose bodies are read and sent too
for my $m (qw(DELETE OPTIONS PROPFIND)) {
    $t->write_config(conf(loc => "singleflight sf; singleflight_methods GET HEAD $m;"));
    ($ok, $out) = $t->test_config;
    ok($ok, "$m with the default key passes nginx -t") or diag($out);
    like($out, qr/\[warn\] "singleflight_methods" collapses requests with a body, but "singleflight_key"/,
        "$m with the default key: the same [warn]");
}

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

# ---------------------------------------------------- old spellings

# kept working, each with a [warn] that says what to write instead
for my $old (['singleflight_promote_tries 2', 'singleflight_promote ... tries=N'],
             ['singleflight_error_status 503', 'singleflight_promote ... status=CODE'],
             ['singleflight_private_ttl 10s', 'singleflight_private ... ttl=TIME'],
             ['singleflight_max_size 1m', 'singleflight_zone ... max_size=SIZE'],
             ['singleflight_memory 64k', 'singleflight_zone ... memory=SIZE'],
             ['singleflight_temp_path sf_old 1 2', 'singleflight_zone ... temp_path=PATH']) {
    my ($line, $instead) = @$old;
    (my $name = $line) =~ s/ .*//;
    $t->write_config(conf(loc => "singleflight sf; $line;"));
    ($ok, $out) = $t->test_config;
    ok($ok, "$name still passes nginx -t") or diag($out);
    like($out, qr/\[warn\] the "\Q$name\E" directive is deprecated, use "\Q$instead\E" instead/,
         "$name: a [warn] saying what to write instead");
}
# the old spelling's 0 (no try, the flight fails) is kept, as before
for my $n (101, 1000000) {
    rejected("singleflight_promote_tries $n",
        conf(loc => "singleflight sf; singleflight_promote_tries $n;"),
        'singleflight_promote_tries',
        qr/invalid value "$n" in "singleflight_promote_tries" directive, it must be a number from 0 to 100/);
}
for my $n (0, 100) {
    $t->write_config(conf(loc => "singleflight sf; singleflight_promote_tries $n;"));
    ($ok, $out) = $t->test_config;
    ok($ok, "singleflight_promote_tries $n passes nginx -t") or diag($out);
}
rejected('singleflight_error_status 200',
    conf(loc => 'singleflight sf; singleflight_error_status 200;'), 'singleflight_error_status',
    qr/invalid value "200" in "singleflight_error_status" directive, it must be a status from 400 to 599/);

# ---------------------------------------------------- singleflight on

$t->write_config($t->config_template(<<'EOT'));
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight on;
            proxy_pass http://127.0.0.1:1;
        }
    }
EOT
($ok, $out) = $t->test_config;
ok($ok, '"singleflight on" without a zone declared passes nginx -t') or diag($out);

$t->write_config(conf(loc => 'singleflight on;'));
($ok, $out) = $t->test_config;
ok($ok, '"singleflight on" with one zone declared passes nginx -t') or diag($out);

rejected('"singleflight on" with two zones declared',
    conf(zone => 'singleflight_zone zone=a:1m; singleflight_zone zone=b:1m;',
         loc => 'singleflight on;'),
    'singleflight', qr/cannot tell which of the 2 zones declared to use, name one: "singleflight a;"/);
rejected('singleflight naming an unknown zone: what to write',
    conf(loc => 'singleflight flights;'), 'singleflight',
    qr/unknown zone "flights", declare it at http level: "singleflight_zone zone=flights:10m;"/);
rejected('singleflight zone=flights: the zone name without "zone="',
    conf(loc => 'singleflight zone=flights;'), 'singleflight',
    qr/unknown zone "zone=flights", name the zone without "zone=" \("flights"\) and declare it at http level: "singleflight_zone zone=flights:10m;"/);
rejected('singleflight zone=sf:1m, zone "sf" declared: its name alone',
    conf(loc => 'singleflight zone=sf:1m;'), 'singleflight',
    qr/unknown zone "zone=sf:1m", name the zone without "zone=": "sf" in /);
rejected('singleflight sf content=maybe',
    conf(loc => 'singleflight sf content=maybe;'), 'singleflight',
    qr/"content=upstream" or "content=any"/);

# ---------------------------------------------------- singleflight_promote

$t->write_config(conf(loc => 'singleflight sf; singleflight_promote error abort;'));
($ok, $out) = $t->test_config;
ok($ok, 'singleflight_promote abort still passes nginx -t') or diag($out);
like($out, qr/\[warn\] "abort" in "singleflight_promote" has no effect.*remove it/,
     'singleflight_promote abort: a [warn] saying it has no effect');
rejected('singleflight_promote status=200',
    conf(loc => 'singleflight sf; singleflight_promote error status=200;'), 'singleflight_promote',
    qr/"status=200".*a status from 400 to 599/);
rejected('singleflight_promote tries=0',
    conf(loc => 'singleflight sf; singleflight_promote error tries=0;'), 'singleflight_promote',
    qr/"tries=0".*a number from 1 to 100/);
rejected('singleflight_private ttl=soon',
    conf(loc => 'singleflight sf; singleflight_private private ttl=soon;'), 'singleflight_private',
    qr/"ttl=soon".*a time/);

rejected('singleflight_promote with an unknown condition',
    conf(loc => 'singleflight sf; singleflight_promote error died;'), 'singleflight_promote');
# "off" with conditions: said at the directive's own line; with
# parameters, which older versions took, a [warn]
for my $c ([ 'singleflight_promote', 'dead off' ], [ 'singleflight_private', 'off set-cookie' ]) {
    my ($d, $args) = @$c;
    rejected("$d $args", conf(loc => "singleflight sf;\n            $d $args;"), $d,
        qr/"off" cannot be combined with conditions, write "$d off;" alone/);
    my @lines = split /\n/, $t->read_file('nginx.conf');
    my ($line) = grep { $lines[$_ - 1] =~ /\Q$d $args\E/ } 1 .. @lines;
    my (undef, $out) = $t->test_config;
    like($out, qr/nginx\.conf:$line\b/, "$d $args: the [emerg] names the directive's line $line");
}
for my $c ([ 'singleflight_promote', 'off tries=3' ], [ 'singleflight_private', 'off ttl=5s' ]) {
    my ($d, $args) = @$c;
    $t->write_config(conf(loc => "singleflight sf; $d $args;"));
    my ($ok, $out) = $t->test_config;
    ok($ok, "$d $args passes nginx -t, as in older versions") or diag($out);
    like($out, qr/\[warn\] "$d" "off" has no parameters, write "$d off;" alone/,
        "$d $args: a [warn] says to write off alone");
}

rejected('singleflight_promote tries=2 tries=3',
    conf(loc => 'singleflight sf; singleflight_promote http_500 tries=2 tries=3;'), 'singleflight_promote',
    qr/duplicate parameter "tries=3" in "singleflight_promote" directive, give it once/);
rejected('singleflight_private ttl=1s ttl=2s',
    conf(loc => 'singleflight sf; singleflight_private private ttl=1s ttl=2s;'), 'singleflight_private',
    qr/duplicate parameter "ttl=2s"/);
rejected('singleflight_stats twice',
    conf(loc => 'singleflight sf; location /s { singleflight_stats json; singleflight_stats prometheus; }'),
    'singleflight_stats', qr/"singleflight_stats" directive is duplicate/);

# ---------------------------------------------------- singleflight_zone

rejected('singleflight_zone zone=off:1m',
    conf(zone => 'singleflight_zone zone=off:1m;'), 'singleflight_zone',
    qr/invalid zone name "off" in "singleflight_zone" directive, "singleflight off;" could not name it/);

# a zone named "on" is the one "singleflight on" takes
$t->write_config(conf(zone => 'singleflight_zone zone=on:1m; singleflight_zone zone=two:1m;',
                      loc => 'singleflight on;'));
($ok, $out) = $t->test_config;
ok($ok, 'a zone named "on", which "singleflight on" names, passes nginx -t') or diag($out);

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
rejected('singleflight_zone zone=flights (no size): the form',
    conf(zone => 'singleflight_zone zone=flights;'), 'singleflight_zone',
    qr/invalid zone size "zone=flights" in "singleflight_zone" directive, it must be "zone=name:size", as "zone=flights:10m"/);
rejected('singleflight_zone zone=x:abc (bad size)',
    conf(zone => 'singleflight_zone zone=x:abc;'), 'singleflight_zone',
    qr/invalid zone size "zone=x:abc" in "singleflight_zone" directive, it must be "zone=name:size", as "zone=x:10m"/);
rejected('singleflight_zone zone=x:1k (too small)',
    conf(zone => 'singleflight_zone zone=x:1k;'), 'singleflight_zone',
    qr/it must be at least \d+k/);
rejected('singleflight_zone memory=lots',
    conf(zone => 'singleflight_zone zone=x:1m memory=lots;'), 'singleflight_zone',
    qr/"memory=lots".*a size/);
rejected('singleflight_zone max_size=big',
    conf(zone => 'singleflight_zone zone=x:1m max_size=big;'), 'singleflight_zone',
    qr/"max_size=big".*a size/);
rejected('singleflight_zone memory= twice',
    conf(zone => 'singleflight_zone zone=x:1m memory=1k memory=2k;'), 'singleflight_zone',
    qr/duplicate parameter/);

# memory larger than its zone: said, not refused
$t->write_config(conf(zone => 'singleflight_zone zone=sf:32k memory=10m;', loc => 'singleflight sf;'));
($ok, $out) = $t->test_config;
ok($ok, 'memory larger than the zone passes nginx -t') or diag($out);
like($out, qr/\[warn\] "memory=10240k" is more than zone "sf" of 32k holds/,
     'memory larger than the zone: a [warn]');
$t->write_config(conf(zone => 'singleflight_zone zone=sf:32k;',
                      loc => 'singleflight sf; singleflight_memory 10m;'));
($ok, $out) = $t->test_config;
like($out, qr/\[warn\] "singleflight_memory 10240k" is more than zone "sf" of 32k holds/,
     'singleflight_memory larger than the zone: a [warn]');
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
rejected('singleflight_timeout 0',
    conf(loc => 'singleflight sf; singleflight_timeout 0;'), 'singleflight_timeout',
    qr/invalid time "0" in "singleflight_timeout" directive, it must be a time above zero/);
rejected('singleflight_timeout 1s x',
    conf(loc => 'singleflight sf; singleflight_timeout 1s x;'), 'singleflight_timeout',
    qr/invalid parameter "x" in "singleflight_timeout" directive, it must be "status=" and a status from 400 to 599/);
rejected('singleflight_max_waiters 0',
    conf(loc => 'singleflight sf; singleflight_max_waiters 0;'), 'singleflight_max_waiters',
    qr/invalid number "0" in "singleflight_max_waiters" directive, it must be a number of at least 1/);
rejected('singleflight_max_waiters 5 x',
    conf(loc => 'singleflight sf; singleflight_max_waiters 5 x;'), 'singleflight_max_waiters',
    qr/invalid parameter "x" in "singleflight_max_waiters" directive, it must be "status=" and a status from 400 to 599/);
rejected('singleflight_credentials on X-Key',
    conf(loc => 'singleflight sf; singleflight_credentials on X-Key;'), 'singleflight_credentials',
    qr/invalid value "on" in "singleflight_credentials" directive, "on", "off" and "http" cannot be combined with header names/);

# the body variables are told by their names: $http_x_request_body_sha
# is a request header, not the body
$t->write_config(conf(loc => 'singleflight sf; singleflight_key $scheme$host$http_x_request_body_sha;'));
($ok, $out) = $t->test_config;
ok($ok, 'a key with $http_x_request_body_sha passes nginx -t') or diag($out);
unlike($out, qr/\[(?:emerg|warn)\]/, 'a key with $http_x_request_body_sha: no [emerg] or [warn]');
for my $var ('$request_body', '${request_body}', '$singleflight_body_hash') {
    rejected("a GET-only key with $var",
        conf(loc => "singleflight sf; singleflight_key \$scheme\$host$var;"), 'singleflight_key',
        qr/uses the request body, but "singleflight_methods" allows no method with a body/);
}
rejected('a key with $request_body_file',
    conf(loc => 'singleflight sf; singleflight_key $scheme$host$request_body_file;'), 'singleflight_key',
    qr/uses \$request_body_file/);
rejected('singleflight_max_size abc',
    conf(loc => 'singleflight sf; singleflight_max_size abc;'), 'singleflight_max_size');
rejected('singleflight_key ""',
    conf(loc => 'singleflight sf; singleflight_key "";'), 'singleflight_key',
    qr/is empty, so no request would be collapsed: remove it for the default key/);
rejected('singleflight_methods FOO',
    conf(loc => 'singleflight sf; singleflight_methods FOO;'), 'singleflight_methods',
    qr/invalid value "FOO" in "singleflight_methods" directive, it must be among "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH" and "PROPFIND"/);
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
$t->write_config(conf(loc => 'singleflight sf; singleflight_hedge auto min=0;'));
($ok, $out) = $t->test_config;
ok($ok, 'singleflight_hedge auto min=0 passes nginx -t') or diag($out);
rejected('singleflight_hedge auto min=x',
    conf(loc => 'singleflight sf; singleflight_hedge auto min=x;'), 'singleflight_hedge',
    qr/min=/);
for my $v ('off', '200ms') {
    rejected("singleflight_hedge $v min=50ms",
        conf(loc => "singleflight sf; singleflight_hedge $v min=50ms;"), 'singleflight_hedge',
        qr/invalid parameter "min=50ms" in "singleflight_hedge" directive, "min=" goes with "auto" only/);
}
rejected('singleflight_hedge 100ms 200ms',
    conf(loc => 'singleflight sf; singleflight_hedge 100ms 200ms;'), 'singleflight_hedge');
rejected('singleflight_stats with an argument',
    conf(loc => 'singleflight_stats on;'), 'singleflight_stats');
rejected('singleflight_stats at server level',
    conf(server => 'singleflight_stats;'), 'singleflight_stats', qr/not allowed here/);

# slice beside singleflight: said at nginx -t
$t->write_config(conf(loc => 'singleflight sf; slice 1m;'));
($ok, $out) = $t->test_config;
SKIP: {
    skip 'nginx has no slice module', 2 if $out =~ /unknown directive "slice"/;
    ok($ok, 'slice beside singleflight passes nginx -t') or diag($out);
    like($out, qr/\[warn\] .*location "\/" has "slice".*"singleflight" does not collapse; remove one of the two/,
         'slice beside singleflight: a [warn]');
}

done_testing;
