#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/cachehit.pl - a hot key that proxy_cache answers, under load: the
# module beside proxy_cache (README, "Behind proxy_cache") against the
# same proxy_cache without the module, in one nginx (2 workers, the
# default singleflight_lone), in one run.  Every request asks for one URI,
# in the cache after the first two; wrk's connections overlap, so a
# request often finds another of its key still in progress in its slot.
#
# Rounds alternate the two locations (each first in turn); the medians of
# the rounds' requests/s and p99, their ratio, and what the zone counted
# meanwhile: a cache hit is not the module's, so requests_total and the
# wait histogram must not move, and the origin sees 1 request.
#
#   perl -I t/lib bench/cachehit.pl [--rounds 5] [--duration 4]
#       [--conns 50] [--size 1024] [--out FILE]
#
# Writes bench/results/YYYY-MM-DD-HOST-cachehit.md (or --out), also printed.

use strict;
use warnings;

use Getopt::Long;
use POSIX qw(strftime);

use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my %opt = (rounds => 5, duration => 4, conns => 50, size => 1024);
GetOptions(\%opt, 'rounds=i', 'duration=i', 'conns=i', 'size=i', 'out=s')
    or die "usage: $0 [--rounds N] [--duration S] [--conns N] [--size B] [--out FILE]\n";

system('command -v wrk >/dev/null 2>&1') == 0 or die "wrk is needed (apt-get install wrk)\n";

my $t = SFTest->new;
$t->start_origin;
$t->write_config($t->config_template(<<'EOT', workers => 2));
    singleflight_zone zone=sf:4m;
    proxy_cache_path %%TESTDIR%%/cache keys_zone=pc:1m;
    access_log off;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /sf/ {
            singleflight sf;
            proxy_cache pc;
            proxy_cache_valid 200 10m;
            proxy_pass http://%%ORIGIN%%;
        }

        location /plain/ {
            proxy_cache pc;
            proxy_cache_valid 200 10m;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
$t->start;

my %uri = map { $_ => "/$_/hot?size=$opt{size}" } qw(sf plain);
for my $u (values %uri) {
    $t->get($u) for 1 .. 2;
}

sub total { my $n = 0; $n += $_ for values %{ $_[0]{requests_total} // {} }; $n }

sub by_status {
    my ($a, $b) = @_;
    my @d = grep { $_->[1] } map { [ $_, ($b->{requests_total}{$_} // 0) - ($a->{requests_total}{$_} // 0) ] }
            sort keys %{ $b->{requests_total} // {} };
    return @d ? ' (' . join(', ', map { "$_->[0] $_->[1]" } @d) . ')' : '';
}

sub median {
    my @v = sort { $a <=> $b } @_;
    return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

sub wrk {
    my ($path) = @_;
    my $url = 'http://127.0.0.1:' . $t->port . $path;
    my $out = `wrk -t2 -c$opt{conns} -d$opt{duration}s --latency $url 2>&1`;
    my ($rps) = $out =~ /Requests\/sec:\s+([\d.]+)/;
    my ($p99, $unit) = $out =~ /^\s+99%\s+([\d.]+)(us|ms|s)\b/m;
    $p99 *= { us => 0.001, ms => 1, s => 1000 }->{$unit // 'ms'} if defined $p99;
    return ($rps // 0, $p99 // 0);
}

my $z0 = $t->zone_stats;
my (%rps, %p99);
for my $round (1 .. $opt{rounds}) {
    for my $name ($round % 2 ? qw(sf plain) : qw(plain sf)) {
        my ($r, $p) = wrk($uri{$name});
        push @{ $rps{$name} }, $r;
        push @{ $p99{$name} }, $p;
    }
}
my $z1 = $t->zone_stats;

my $facts = SFTest::machine_facts($t->nginx_binary);
my @ratios = map { $rps{sf}[$_] / ($rps{plain}[$_] || 1) } 0 .. $opt{rounds} - 1;
my @out = (
    "# A hot key that proxy_cache answers, " . strftime('%Y-%m-%d', localtime) . ", $facts->{host}",
    '',
    '* date: ' . strftime('%Y-%m-%d %H:%M:%S %Z', localtime),
    "* machine: $facts->{machine}",
    "* nginx: $facts->{nginx_v}, module $facts->{git}, 2 workers, the default singleflight_lone",
    "* command: `perl -I t/lib bench/cachehit.pl --rounds $opt{rounds} --duration $opt{duration}"
        . " --conns $opt{conns} --size $opt{size}`",
    "* wrk -t2 -c$opt{conns} -d$opt{duration}s, one URI, a $opt{size} B body in the cache;"
        . " rounds alternate the two locations",
    '',
    '| location | requests/s, median | p99 ms, median | rounds (requests/s) |',
    '|---|--:|--:|---|',
    (map { sprintf '| %s | %.0f | %.2f | %s |', $_ eq 'sf' ? 'singleflight + proxy_cache'
                                                         : 'proxy_cache alone',
               median(@{ $rps{$_} }), median(@{ $p99{$_} }),
               join(', ', map { sprintf '%.0f', $_ } @{ $rps{$_} }) } qw(sf plain)),
    '',
    sprintf('Requests/s with the module, the median of the rounds\' ratios: %.3f (%s).',
            median(@ratios), join(', ', map { sprintf '%.3f', $_ } @ratios)),
    sprintf('p99 ratio of the medians: %.2f.', median(@{ $p99{sf} }) / (median(@{ $p99{plain} }) || 1)),
    '',
    sprintf('Counted by the zone during the runs: requests_total +%d%s, wait histogram +%d,'
            . ' flights (deprecated) +%d; origin requests for the module\'s URI: %d.',
            total($z1) - total($z0), by_status($z0, $z1),
            ($z1->{wait_seconds}{count} // 0) - ($z0->{wait_seconds}{count} // 0),
            ($z1->{flights} // 0) - ($z0->{flights} // 0), $t->origin_uri_hits($uri{sf})),
);

my $text = join("\n", @out) . "\n";
print $text;
my $file = $opt{out} // SFTest::results_file(strftime('%Y-%m-%d', localtime) . "-$facts->{host}-cachehit");
if (open(my $fh, '>', $file)) {
    print $fh $text;
    close($fh);
    print STDERR "# results: $file\n";
}
