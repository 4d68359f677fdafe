#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_stats: the JSON is parsed, the Prometheus text exposition is
# parsed line by line, and the counters match exactly what the test did.
# Also the embedded variables in an access log.

use strict;
use warnings;

use Test::More;
use JSON::PP;

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sf '$singleflight_status|$singleflight_key|$singleflight_wait_time|$request_uri';
    access_log %%TESTDIR%%/sf.log sf;

    singleflight_zone zone=sf:1m;
    singleflight_zone zone=other:64k scope=worker;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_key $uri;
            singleflight_bypass $arg_nocollapse;
            proxy_pass http://%%ORIGIN%%;
        }

        location /other/ {
            singleflight other;
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

$t->start;

# ------------------------------------------------------------ traffic

my $res = $t->herd(n => 10, path => '/a?delay=300&size=1000');
is(scalar(grep { $_->{status} == 200 } @$res), 10, 'herd answered');

$t->get('/b?nocollapse=1');
$t->get('/other/c');

# ------------------------------------------------------------ JSON

my $raw = $t->get('/stats');
is($raw->{headers}{'content-type'}, 'application/json', 'JSON: content type');

my $json = eval { decode_json($raw->{body}) };
ok($json, 'JSON: parses') or diag($raw->{body});

my $sf = $json->{zones}{sf};
is($sf->{scope}, 'process', 'JSON: scope');
is($sf->{flights}, 1, 'JSON: one flight');
is($sf->{followers}, 9, 'JSON: nine followers');
is($sf->{served}, 9, 'JSON: nine served');
is($sf->{bytes_shared}, 9 * 1000, 'JSON: bytes shared');
is($sf->{bypassed}, 1, 'JSON: one bypass');
is($sf->{in_flight}, 0, 'JSON: nothing in flight');
ok($sf->{pages_used} > 0 && $sf->{pages_free} > 0, 'JSON: pages');
is(scalar @{ $sf->{instances} }, 1, 'JSON: one instance');
is($json->{zones}{other}{scope}, 'worker', 'JSON: second zone');
is($json->{zones}{other}{flights}, 1, 'JSON: second zone counted');

# the histograms: the origin takes 300 ms, so the flight's header and end
# come no sooner; every follower's wait is counted once
for my $h (qw(wait_ms flight_header_ms flight_ms)) {
    my $hg = $sf->{$h};
    ok($hg && ref $hg->{buckets} eq 'ARRAY', "JSON: histogram $h")
        or next;
    is(scalar @{ $hg->{buckets} }, @{ $hg->{le} } + 1,
       "JSON: $h has a bucket per bound and +Inf");
    is($hg->{buckets}[-1], $hg->{count}, "JSON: $h +Inf is the count");
    ok(!grep({ $hg->{buckets}[$_] > $hg->{buckets}[$_ + 1] }
             0 .. $#{ $hg->{buckets} } - 1),
       "JSON: $h cumulative");
}
is($sf->{wait_ms}{count}, 9, 'JSON: nine followers\' waits');
is($sf->{flight_header_ms}{count}, 1, 'JSON: one flight header');
is($sf->{flight_ms}{count}, 1, 'JSON: one flight ended');
for my $h (qw(flight_header_ms flight_ms)) {
    my ($i) = grep { $sf->{$h}{le}[$_] == 250 } 0 .. $#{ $sf->{$h}{le} };
    is($sf->{$h}{buckets}[$i], 0, "JSON: $h: none within 250 ms");
    ok($sf->{$h}{sum} >= 300, "JSON: $h: sum at least the origin's 300 ms");
}

for my $f (qw(flights followers served promotions timeouts errors
              dead_leaders not_shared oversized bypassed overflows private
              vary_mismatches forgotten no_memory bytes_shared notify_failed
              in_flight waiters pages_used pages_free pages_baseline))
{
    ok(exists $sf->{$f}, "JSON: field $f");
}

# ------------------------------------------------------------ Prometheus

my $prom = $t->get('/metrics');
like($prom->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4},
     'Prometheus: content type');
is($t->get('/stats?format=prometheus')->{body} =~ /^# TYPE/m ? 1 : 0, 1,
   'Prometheus: ?format=prometheus');

my (%type, %help, %sample, @bad);
my $name = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
my $label = qr/[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"/;

for my $line (split /\n/, $prom->{body}) {
    if ($line =~ /^# HELP ($name) \S.*$/) {
        $help{$1}++;
    } elsif ($line =~ /^# TYPE ($name) (counter|gauge|histogram)$/) {
        $type{$1} = $2;
    } elsif ($line =~ /^($name)\{($label(?:,$label)*)\} (\d+(?:\.\d+)?)$/) {
        my ($m, $labels, $v) = ($1, $2, $3);
        (my $family = $m) =~ s/_(?:bucket|sum|count)$//;
        $family = $m unless ($type{$family} // '') eq 'histogram';
        push @bad, "sample before its TYPE: $line" unless $type{$family};
        $sample{"$m\{$labels\}"} = $v;
    } else {
        push @bad, $line;
    }
}

is_deeply(\@bad, [], 'Prometheus: every line parses');
ok(keys %type >= 20, 'Prometheus: TYPE lines');
is_deeply([ sort keys %help ], [ sort keys %type ], 'Prometheus: HELP for each');
ok(!grep({ $type{$_} eq 'counter' && !/_total$/ } keys %type),
   'Prometheus: counters end in _total');
ok(!grep({ !/^nginx_singleflight_/ } keys %type),
   'Prometheus: names start nginx_singleflight_');

is($sample{'nginx_singleflight_flights_total{zone="sf"}'}, 1,
   'Prometheus: flights');
is($sample{'nginx_singleflight_followers_served_total{zone="sf"}'}, 9,
   'Prometheus: served');
is($sample{'nginx_singleflight_shared_bytes_total{zone="sf"}'}, 9000,
   'Prometheus: bytes');
is($sample{'nginx_singleflight_bypassed_total{zone="sf"}'}, 1,
   'Prometheus: bypassed');
is($sample{'nginx_singleflight_in_flight{zone="sf"}'}, 0,
   'Prometheus: in flight');

is($type{nginx_singleflight_wait_seconds}, 'histogram',
   'Prometheus: wait_seconds is a histogram');
is($sample{'nginx_singleflight_wait_seconds_count{zone="sf"}'}, 9,
   'Prometheus: wait count');
is($sample{'nginx_singleflight_wait_seconds_bucket{zone="sf",le="+Inf"}'}, 9,
   'Prometheus: wait +Inf bucket');
is($sample{'nginx_singleflight_flight_header_seconds_bucket{zone="sf",le="0.25"}'},
   0, 'Prometheus: no header within 0.25 s');
ok($sample{'nginx_singleflight_flight_seconds_sum{zone="sf"}'} >= 0.3,
   'Prometheus: flight time sum in seconds');
is(scalar(grep { /^# TYPE nginx_singleflight_wait_seconds / } split /\n/,
                 $prom->{body}), 1,
   'Prometheus: one TYPE per family with two zones');

my @other = grep { /^nginx_singleflight_flights_total\{zone="other",worker="\d+"\}$/ }
            keys %sample;
ok(@other >= 1, 'Prometheus: per-worker samples of a scope=worker zone');

# ------------------------------------------------------------ variables

$t->wait_for(sub { $t->log_count(qr/\|\/a\?/, 0, 'sf.log'); 1 },
             what => 'access log');
$t->wait_for(sub { $t->log_count(qr/\|\/a\?/, 0, 'sf.log') >= 10 },
             what => 'herd logged');

my @lines = map { [ split /\|/ ] } grep { /\|\/a\?/ } split /\n/, $t->read_file('sf.log');
is(scalar(grep { $_->[0] eq 'LEADER' } @lines), 1, '$singleflight_status LEADER');
is(scalar(grep { $_->[0] eq 'FOLLOWER' } @lines), 9, '$singleflight_status FOLLOWER');
is(scalar(grep { $_->[1] eq '/a' } @lines), 10, '$singleflight_key');
ok(!grep({ $_->[0] eq 'FOLLOWER' && ($_->[2] !~ /^\d+$/ || $_->[2] > 1000) } @lines),
   '$singleflight_wait_time of followers in ms');
is((grep { $_->[0] eq 'LEADER' } @lines)[0][2], '-',
   '$singleflight_wait_time empty for the leader');

my ($b) = grep { /\|\/b\?/ } split /\n/, $t->read_file('sf.log');
like($b, qr/^BYPASS\|/, '$singleflight_status BYPASS');

# ------------------------------------------------------------ every wait

# A private response: its followers waited for its header, then went
# upstream themselves (NOT_SHARED).  Their waits are theirs all the same:
# in $singleflight_wait_time, and in the wait histogram, each once.

my $w0 = $t->zone_stats->{wait_ms};
$res = $t->herd(n => 20, path => '/p?delay=300&hdr=Cache-Control:private');
is(scalar(grep { $_->{status} == 200 } @$res), 20, 'private herd answered');

my @p;
$t->wait_for(sub {
    @p = map { [ split /\|/ ] } grep { /\|\/p\?/ } split /\n/, $t->read_file('sf.log');
    @p >= 20;
}, what => 'private herd logged');
my @ns = grep { $_->[0] eq 'NOT_SHARED' } @p;
ok(@ns >= 10, 'private herd: followers refused (' . scalar(@ns) . ')')
    or diag(explain(\@p));
ok(!grep({ $_->[2] !~ /^\d+$/ || $_->[2] <= 0 || $_->[2] > 1300 } @ns),
   'private herd: each refused follower logs its wait, about the origin\'s 300 ms')
    or diag(explain([ map { $_->[2] } @ns ]));

my $w1 = $t->zone_stats->{wait_ms};
is($w1->{count} - $w0->{count}, scalar @ns,
   'private herd: the wait histogram counts each refused follower');
my $logged = 0;
$logged += $_->[2] for @ns;
is($w1->{sum} - $w0->{sum}, $logged,
   'private herd: the histogram\'s sum is the waits logged');

done_testing;
