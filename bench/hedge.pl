#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/hedge.pl - a slow and a fast server behind one upstream (round
# robin): bench/origin.c twice, one with --delay 2000, one with --delay
# 50.  Herds of N identical requests (bench/herd.c), a fresh key each,
# through:
#
#   singleflight, hedge off       the module as it is by default
#   singleflight, hedge 100ms     singleflight_hedge 100ms
#   singleflight, hedge auto      singleflight_hedge auto (the zone first
#                                 learns its header times from waves that
#                                 the fast server answers)
#   plain, next_upstream timeout  nginx without the module, with
#                                 proxy_next_upstream timeout and
#                                 proxy_read_timeout 200ms, so that each
#                                 request goes around the slow server on
#                                 its own
#
# For each: client latency p50/p99/max, origin requests per herd, and
# responses that were not a whole 200.  Every row sends its waves to its
# own upstream block, one worker, so round robin alternates predictably:
# each herd's first fetch goes to the slow server.
#
#   perl -I t/lib bench/hedge.pl [--clients 200] [--waves 3] [--out FILE]

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use Getopt::Long;
use POSIX qw(strftime WNOHANG);
use Time::HiRes qw(time sleep);

use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my $REPO = abs_path(dirname(abs_path($0)) . '/..');

my %opt = (clients => 200, waves => 3, size => 10000);
my @GIVEN = @ARGV;
GetOptions('clients=i' => \$opt{clients}, 'waves=i' => \$opt{waves},
           'out=s' => \$opt{out}, 'quick' => \$opt{quick})
    or die "usage: see the head of bench/hedge.pl\n";
$opt{quick} = 1 if ($ENV{SF_BENCH_ARGS} // '') =~ /(?:^|\s)--quick\b/;
$opt{waves} = 2 if $opt{quick} && !grep { /^--waves/ } @GIVEN;

my $MODULE = $ENV{SF_MODULE} // "$REPO/build/ngx_http_singleflight_module.so";
-f $MODULE or die "no module at $MODULE: run make build\n";

# bench/herd.c and bench/origin.c, built into build/bench if need be
SFTest::c_tool($_) for qw(herd origin);
my $BIN = "$REPO/build/bench";

my $t = SFTest->new(module => $MODULE);

# the two servers: bench/origin.c with a delay of its own
my @origins;
for my $d (2000, 50) {
    my $wrapper = $t->path("origin-$d.sh");
    $t->write_file("origin-$d.sh", "#!/bin/sh\nexec $BIN/origin --delay $d \"\$@\"\n");
    chmod 0755, $wrapper;
    push @origins, $t->start_origin(program => $wrapper);
}
my ($SLOW, $FAST) = map { $_->addr } @origins;

# auto first: the zone's histogram is its whole life, and the slow headers
# of the other rows would raise its p95
my @ROWS = (
    [ 'singleflight, singleflight_hedge auto (after 40 fast flights)', 'auto',
      'singleflight sf; singleflight_hedge auto;' ],
    [ 'singleflight, singleflight_hedge off', 'off', 'singleflight sf;' ],
    [ 'singleflight, singleflight_hedge 100ms', 'fixed', 'singleflight sf; singleflight_hedge 100ms;' ],
    [ 'plain, proxy_next_upstream timeout, proxy_read_timeout 200ms', 'plain',
      'proxy_next_upstream timeout; proxy_read_timeout 200ms;' ],
);

my $conf = "    singleflight_zone zone=sf:16m;\n";
for my $row (@ROWS) {
    my ($name, $tag, $dirs) = @$row;
    $conf .= "    upstream u_$tag { server $SLOW max_fails=0; server $FAST max_fails=0; keepalive 32; }\n"
           . "    upstream learn_$tag { server $FAST; keepalive 8; }\n";
}
$conf .= "    proxy_http_version 1.1;\n    proxy_set_header Connection \"\";\n"
       . "    server {\n        listen 127.0.0.1:%%PORT%% backlog=4096;\n"
       . "        add_header X-SF \$singleflight_status always;\n";
for my $row (@ROWS) {
    my ($name, $tag, $dirs) = @$row;
    $conf .= "        location /$tag/ { $dirs proxy_pass http://u_$tag; }\n"
           . "        location /learn-$tag/ { $dirs proxy_pass http://learn_$tag; }\n";
}
$conf .= "        location = /stats { singleflight_stats; }\n    }\n";

$t->write_config($t->config_template($conf, workers => 1));
$t->start;
my $PORT = $t->port(0);

sub origin_total { my $n = 0; $n += $_->hits->{total} for @origins; $n }

sub herd {
    my ($path, $n) = @_;
    my $out = $t->path('herd.out');
    system("$BIN/herd -p $PORT -u '$path' -n $n -t 20000 -c X-SF > $out") == 0
        or die "herd failed\n";
    my @res;
    open(my $fh, '<', $out) or die;
    while (<$fh>) {
        push @res, { status => $2, len => $3, sent => $5 / 1000, done => $6 / 1000,
                     err => $7 eq '-' ? undef : $7 }
            if /^c (\d+) (\d+) (\d+) (\S+) (-?\d+) (-?\d+) (\S+)/;
    }
    return \@res;
}

sub pct {
    my ($p, @v) = @_;
    @v = sort { $a <=> $b } @v or return 0;
    return $v[ int(($p / 100) * $#v + 0.5) ];
}

my %result;
for my $row (@ROWS) {
    my ($name, $tag) = @$row;
    if ($tag eq 'auto') {
        # the zone learns fast header times: 40 flights the fast server answers
        herd("/learn-$tag/k-$_?size=$opt{size}", 5) for 1 .. 40;
    }
    my (@lat, @per_wave, $bad);
    for my $w (1 .. $opt{waves}) {
        my $before = origin_total();
        my $res = herd("/$tag/$$-$w?size=$opt{size}", $opt{clients});
        push @per_wave, origin_total() - $before;
        for (@$res) {
            if (!$_->{err} && $_->{status} == 200 && $_->{len} == $opt{size}) {
                push @lat, $_->{done} - $_->{sent};
            } else {
                $bad++;
            }
        }
        # the slow server's late answer, or the stopped fetch, out of the way
        sleep 0.1;
    }
    $result{$tag} = { name => $name, lat => \@lat, per_wave => \@per_wave, bad => $bad // 0 };
}

my $stats = $t->stats('/stats')->{zones}{sf};

# ---------------------------------------------------------- report

my $nginx = $t->nginx_binary;
my $facts = SFTest::machine_facts($nginx);
my ($host, $nginx_v, $git) = @$facts{qw(host nginx_v git)};

my @out = (
    '# Hedging a slow fetch, ' . strftime('%Y-%m-%d', localtime) . ", $host", '',
    '* date: ' . strftime('%Y-%m-%d %H:%M:%S %Z', localtime),
    "* machine: $facts->{machine}",
    "* nginx: $nginx_v ($nginx), 1 worker; module at git $git",
    "* origins: bench/origin.c --delay 2000 (slow) and --delay 50 (fast), round robin, "
        . "body $opt{size} bytes; each herd's first fetch goes to the slow one",
    "* herds: $opt{clients} identical requests at once (bench/herd.c), a fresh key each, "
        . "$opt{waves} waves per row",
    '* command: `perl -I t/lib bench/hedge.pl' . (@GIVEN ? " @GIVEN" : '') . '`'
        . ($ENV{MAKELEVEL} ? ' (from `make bench`)' : ''),
    '',
    '| configuration | client p50 ms | p99 ms | max ms | origin requests per herd | not a whole 200 |',
    '|---|--:|--:|--:|--:|--:|',
    (map { my $r = $result{ $_->[1] };
           sprintf('| %s | %.0f | %.0f | %.0f | %s | %d |', $r->{name}, pct(50, @{ $r->{lat} }),
               pct(99, @{ $r->{lat} }), pct(100, @{ $r->{lat} }), join(', ', @{ $r->{per_wave} }),
               $r->{bad}) } @ROWS),
    '',
    "Zone counters after the run: origin_requests_total{reason=\"hedge\"} "
        . ($stats->{origin_requests_total}{hedge} // 0)
        . ", hedge_wins_total " . ($stats->{hedge_wins_total} // 0) . '.',
    '',
);

my $text = join("\n", @out) . "\n";
print $text;
my $file = $opt{out} // SFTest::results_file(strftime('%Y-%m-%d', localtime) . "-$host-hedge");
if (open(my $fh, '>', $file)) {
    print $fh $text;
    close($fh);
    print STDERR "# results: $file\n";
}
