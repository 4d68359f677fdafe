#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# The demo behind `make demo`: one nginx with the module, a bundled slow
# origin (t/origin.pl, 200 ms a response), and herds of identical requests
# sent both through `singleflight` and through plain `proxy_pass` on the
# same nginx, wave after wave, interleaved.  Prints what the origin saw and
# what the clients waited, then stops everything.
#
#   perl -I t/lib bench/demo.pl [--waves 5] [--clients 200] [--delay 200]

use strict;
use warnings;

use Getopt::Long;
use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my ($waves, $clients, $delay, $size) = (5, 200, 200, 10000);
GetOptions('waves=i' => \$waves, 'clients=i' => \$clients,
           'delay=i' => \$delay, 'size=i' => \$size)
    or die "usage: $0 [--waves N] [--clients N] [--delay MS]\n";

my $t = SFTest->new;
die "no module at " . $t->module_path . ": run make build\n"
    unless $t->has_module;

my $sf = $t->start_origin;
my $plain = $t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=demo:1m;

    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight demo;
            proxy_pass http://%%ORIGIN%%;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_1%%;
        location / {
            proxy_pass http://%%ORIGIN_1%%;
        }
    }
EOT

$t->start;

printf "nginx %s with ngx_http_singleflight_module, 2 workers; "
       . "the origin takes %d ms per response\n",
       (`$t->{nginx} -v 2>&1` =~ m{nginx/(\S+)})[0] // '?', $delay;
printf "%d waves of %d simultaneous identical requests "
       . "(a fresh flight each wave)\n\n", $waves, $clients;

my %lat = (sf => [], plain => []);
my %bad = (sf => 0, plain => 0);

for my $wave (1 .. $waves) {
    my $uri = "/demo?wave=$wave&delay=$delay&size=$size";

    for my $run ([sf => $t->port(0)], [plain => $t->port(1)]) {
        my ($name, $port) = @$run;
        my $res = $t->herd(n => $clients, path => $uri, port => $port,
                           timeout => 30);

        for (@$res) {
            if ($_->{status} && $_->{status} == 200 && $_->{complete}
                && length($_->{body}) == $size)
            {
                push @{ $lat{$name} }, $_->{latency};

            } else {
                $bad{$name}++;
            }
        }
    }
}

sub pct {
    my ($list, $p) = @_;
    my @s = sort { $a <=> $b } @$list;
    return 0 unless @s;
    my $i = int($p / 100 * @s + 0.5) - 1;
    $i = 0 if $i < 0;
    $i = $#s if $i > $#s;
    return $s[$i] * 1000;
}

my %hits = (sf => $sf->hits->{total}, plain => $plain->hits->{total});
my $n = $waves * $clients;

printf "%-18s %9s %15s %9s %9s %9s %7s\n",
       '', 'requests', 'origin fetches', 'p50 ms', 'p99 ms', 'max ms', 'failed';

for my $run (['plain proxy_pass', 'plain'], ['singleflight', 'sf']) {
    my ($label, $name) = @$run;
    printf "%-18s %9d %15d %9.1f %9.1f %9.1f %7d\n", $label, $n, $hits{$name},
           pct($lat{$name}, 50), pct($lat{$name}, 99), pct($lat{$name}, 100),
           $bad{$name};
}

printf "\nsingleflight: %d requests -> %d origin fetches\n", $n, $hits{sf};

exit($bad{sf} || $hits{sf} != $waves ? 1 : 0);
