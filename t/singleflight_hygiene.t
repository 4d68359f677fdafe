#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Process hygiene and configuration that must not silently do something
# else (issue 11):
#
#   - contradictory directives fail nginx -t, naming the directive;
#   - only worker processes attach to a zone: the cache manager and loader
#     do not, and there is no fixed limit of 64 workers;
#   - a zone name of any length and with any characters comes out whole
#     and escaped in the Prometheus output, on every line;
#   - a filter below the capture that changes the response (image_filter's
#     415) runs for each reader on its own, and leaves nothing in the zone.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

# ------------------------------------------------------------ nginx -t

my %bad = (
    'zone= twice' => [ 'singleflight_zone zone=z:1m zone=y:2m;',
                       qr/"singleflight_zone".*duplicate|duplicate.*"singleflight_zone"|"zone=" .*twice|twice.*"singleflight_zone"/i ],
    'scope= twice' => [ 'singleflight_zone zone=z:1m scope=process scope=worker;',
                        qr/scope.*singleflight_zone|singleflight_zone.*scope/i ],
    'timeout 0'    => [ "singleflight_zone zone=z:1m;\n    singleflight_timeout 0;",
                        qr/singleflight_timeout/ ],
    'no zone size' => [ 'singleflight_zone zone=z;', qr/singleflight_zone/ ],
    'unknown zone' => [ "singleflight_zone zone=z:1m;\n    singleflight nosuch;",
                        qr/nosuch/ ],
);

for my $name (sort keys %bad) {
    my ($conf, $re) = @{ $bad{$name} };
    my $t = SFTest->new;
    $t->skip_without_module;
    $t->write_config($t->config_template(<<"EOT"));
    $conf
    server {
        listen 127.0.0.1:%%PORT%%;
        location / { proxy_pass http://127.0.0.1:1; }
    }
EOT
    my ($ok, $out) = $t->test_config;
    ok(!$ok, "nginx -t rejects $name");
    like($out, qr/\[emerg\].*$re/, "$name: the message names the directive")
        or diag($out);
}

# ------------------------------------------------------------ processes

my $t = SFTest->new;
$t->skip_without_module;
my $o = $t->start_origin;

# a name of 1500 bytes with the characters Prometheus labels escape
my $long = 'z' . ('a\\b"c' x 300);
(my $conf_name = $long) =~ s/(["\\])/\\$1/g;

$t->write_config($t->config_template(<<"EOT", workers => 4));
    proxy_cache_path %%TESTDIR%%/cache keys_zone=c:1m;

    singleflight_zone zone=sf:1m;
    singleflight_zone "zone=$conf_name:1m";

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /long/ {
            singleflight "$conf_name";
            proxy_pass http://%%ORIGIN%%;
        }

        location /image/ {
            singleflight sf;
            image_filter resize 10 10;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }

        location = /metrics {
            singleflight_stats prometheus;
        }
    }
EOT
# image_filter as the nginx under test has it: built in, a dynamic module
# of its own build, or not at all
my $V = `$t->{nginx} -V 2>&1`;
my ($modules) = $V =~ /--modules-path=(\S+)/;
($modules) = $V =~ /--prefix=(\S+)/ and $modules .= '/modules' unless $modules;
my $image_module = $V =~ /--with-http_image_filter_module=dynamic/
    ? ($modules // '/usr/lib/nginx/modules') . '/ngx_http_image_filter_module.so' : '';
my $have_image = $V =~ /--with-http_image_filter_module(?!=)/ || ($image_module && -f $image_module);
if ($have_image) {
    if ($image_module) {
        my $conf = $t->read_file('nginx.conf');
        $t->write_file('nginx.conf', "load_module $image_module;\n$conf");
    }
} else {
    my $conf = $t->read_file('nginx.conf');
    $conf =~ s/^\s*image_filter .*\n//m;
    $t->write_file('nginx.conf', $conf);
}
$t->start;

my @pids;
$t->wait_for(sub { @pids = $t->worker_pids; @pids == 4 }, what => '4 workers');
my ($ok, $zone) = $t->wait_zone(sub { ($_[0]{workers} // 0) == 4 },
                                what => 'the workers attached');
is($zone->{workers}, 4, 'workers: the 4 workers attached, not the cache manager or loader');
my @helpers = grep { /cache (manager|loader)/ } map { `cat /proc/$_/cmdline 2>/dev/null` } $t->child_pids;
cmp_ok(scalar(@helpers), '>=', 1, 'workers: a cache helper process is running beside them');

my $res = $t->herd(n => 20, path => '/h?delay=300');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 20, 'herd: 20 complete responses');
is($t->origin_uri_hits('/h?delay=300'), 1, 'herd: one origin request');

# ------------------------------------------------------------ Prometheus

$res = $t->herd(n => 5, path => '/long/x?delay=200');
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 5, 'long name: its zone serves');
my $metrics = $t->get('/metrics');
is($metrics->{status}, 200, 'long name: /metrics answers');
(my $escaped = $long) =~ s/(["\\])/\\$1/g;
my @lines = grep { /^nginx_singleflight_\w+\{/ } split /\n/, $metrics->{body};
my @long_lines = grep { index($_, qq{zone="$escaped"}) >= 0 } @lines;
cmp_ok(scalar(@long_lines), '>=', 20, 'long name: its whole escaped name on every one of its lines ('
       . scalar(@long_lines) . ')');
my @broken = grep { !/^nginx_singleflight_\w+\{[^\n]*\} -?\d+(\.\d+)?$/ } @lines;
is(scalar(@broken), 0, 'long name: every sample line is well formed') or diag(substr($broken[0], 0, 200));
my ($flights) = map { /\} (\d+)$/ ? $1 : () }
    grep { /^nginx_singleflight_flights_total\{/ && index($_, qq{zone="$escaped"}) >= 0 } @lines;
is($flights, 1, 'long name: its flight counted');

# ------------------------------------------------------------ image_filter

SKIP: {
    skip 'no image_filter module', 9 unless $have_image;

    my $before = $t->zone_stats('sf');
    my $bad = 0;
    my $total = 0;
    for my $round (1 .. 12) {
        my @paths = map { my $k = "$round-$_"; ("/image/i$k?delay=150") x 3 } 1 .. 20;
        my $r = $t->herd(paths => \@paths, timeout => 10);
        $total += @$r;
        $bad += grep { ($_->{status} // 0) != 415 || !$_->{complete} } @$r;
    }
    is($bad, 0, "image_filter: all $total clients got 415, as without the module");
    my $single = $t->get('/image/alone?delay=1');
    is($single->{status}, 415, 'image_filter: a lone request gets 415 too');
    # its first bytes refused while the origin still sends: the header
    # filters run twice, then the upstream ends
    my $paced = $t->get('/image/paced?size=20000&pace=1000:200', timeout => 5);
    is($paced->{status}, 415, 'image_filter: a lone request refused at its first bytes gets 415');
    $t->wait_for(sub { $t->origin_uri_hits('/image/paced?size=20000&pace=1000:200') }, what => 'the origin asked');
    for my $i (1 .. 4) {
        is($t->get("/image/after$i?delay=1", timeout => 5)->{status}, 415, "image_filter: nginx answers after it ($i)");
    }
    my $after = $t->zone_stats('sf');
    cmp_ok($after->{flights} - $before->{flights}, '>=', 200, 'image_filter: the requests were collapsed');
    $t->zone_baseline_ok('sf');
}

$t->stop;

# ------------------------------------------------------------ 70 workers

# more workers than the 64 worker records the zone starts with
{
    my $w = SFTest->new;
    $w->start_origin;
    $w->write_config($w->config_template(<<'EOT', workers => 70));
    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
    $w->start;
    my ($ok, $z) = $w->wait_zone(sub { ($_[0]{workers} // 0) == 70 },
                                 what => '70 workers attached', timeout => 20);
    is($z->{workers}, 70, '70 workers: all attached');
    my $r = $w->herd(n => 140, path => '/w?delay=500');
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$r), 140,
       '70 workers: 140 complete responses');
    is($w->origin_uri_hits('/w?delay=500'), 1, '70 workers: one origin request');
    $w->zone_baseline_ok('sf');
}

done_testing;
