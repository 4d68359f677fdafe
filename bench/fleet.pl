#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/fleet.pl - a fleet's herds, the fleet table of `make bench`, and
# `make fleet-demo` (--demo).
#
# Five nginx instances on their own loopback addresses, as in the README's
# "A fleet of edges and shields" and t/singleflight_fleet.t: edges on 127.0.0.2 and
# 127.0.0.3, shields on 127.0.0.4 ... 127.0.0.6, one origin (bench/origin.c)
# on 127.0.0.1.  Started once; every row runs on the same processes:
#
#   (a)  2 edges, no shields: each edge collapses, then goes to the origin;
#   (a') 2 edges + 3 plain proxies (the shields' nginx, module off there):
#        the cost of one more loopback proxy hop, nothing collapsed on it;
#   (b)  2 edges + 3 shields (hash $scheme$host$request_uri consistent);
#   (c)  (b), with the shield that holds the most flights killed (-9, its
#        master and workers) once every flight waits on the origin; it is
#        started again after the wave, and given its keys back (recover()).
#
# A wave: --clients requests over --keys keys, half on each edge at once
# (bench/herd.c, one per edge, connection I asking for key I mod keys),
# fresh keys each wave.  Per row: origin fetches per herd, per key, client
# latency p50/p99 (request written to response complete), responses that
# were not a 200 with the whole body, keys whose clients got more than one
# body.  Rows are interleaved wave by wave.
#
#   perl -I t/lib bench/fleet.pl [--waves 3] [--clients 400] [--keys 20]
#       [--delay 1000] [--size 10000] [--out FILE] [--demo]
#
# --demo (`make fleet-demo`): one herd through one edge, through two, and
# through the shielded fleet, origin fetches against requests; no file.

use strict;
use warnings;

use File::Basename qw(dirname);
use Getopt::Long;
use POSIX qw(WNOHANG strftime);
use Time::HiRes qw(time sleep);

use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my %opt = (waves => 3, clients => 400, keys => 20, delay => 1000, size => 10000);
GetOptions(\%opt, 'waves=i', 'clients=i', 'keys=i', 'delay=i', 'size=i', 'out=s', 'demo')
    or die "usage: $0 [--waves N] [--clients N] [--keys N] [--delay MS] [--size B]"
        . " [--out FILE] [--demo]\n";
$opt{waves} = 1 if $opt{demo};

my $REPO = $SFTest::REPO;
my $T0 = time;

sub note { printf STDERR "[%4.0fs] %s\n", time - $T0, join('', @_) }

# ---------------------------------------------------------- tools

# bench/herd.c and bench/origin.c, built into build/bench if need be
SFTest::c_tool($_) for qw(herd origin);
my $BIN = "$REPO/build/bench";

# ---------------------------------------------------------- the fleet

my $main = SFTest->new;
die "no module at " . $main->module_path . ": run make build\n" unless $main->has_module;
my $origin = $main->start_origin(program => "$BIN/origin");
my $ORIGIN = $origin->addr;

my @shields = map { SFTest->new(addr => "127.0.0.$_") } 4 .. 6;
my @edges = map { SFTest->new(addr => "127.0.0.$_") } 2 .. 3;

sub peers {
    my ($n) = @_;
    return join '', map { '        server ' . $_->addr . ':' . $_->port($n)
        . " max_fails=1 fail_timeout=2s;\n" } @shields;
}

my ($shielded, $plain) = (peers(0), peers(1));

# every instance: the origin, with keepalive
my $common = <<"EOT";
    access_log off;
    singleflight_zone zone=sf:16m;

    upstream origin {
        server $ORIGIN;
        keepalive 64;
    }
EOT

# a location's proxying to an upstream{} with keepalive; an edge's retries
my $keepalive = <<'EOT';
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
EOT
my $proxy = $keepalive . <<'EOT';
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 2;
            proxy_read_timeout 30s;
EOT

# port 0: (b) and (c); port 1: (a); port 2: (a')
for my $e (@edges) {
    $e->write_config($e->config_template(<<"EOT", events => 'multi_accept on;'));
$common
    upstream shields {
        hash \$scheme\$host\$request_uri consistent;
$shielded        keepalive 64;
    }

    upstream hop {
        hash \$scheme\$host\$request_uri consistent;
$plain        keepalive 64;
    }

    server {
        listen %%ADDR%%:%%PORT%%;
        location / {
            singleflight sf;
            proxy_pass http://shields;
$proxy        }
        location = /stats { singleflight_stats; }
    }

    server {
        listen %%ADDR%%:%%PORT_1%%;
        location / {
            singleflight sf;
            proxy_pass http://origin;
$proxy        }
    }

    server {
        listen %%ADDR%%:%%PORT_2%%;
        location / {
            singleflight sf;
            proxy_pass http://hop;
$proxy        }
    }
EOT
}

for my $s (@shields) {
    $s->write_config($s->config_template(<<"EOT", events => 'multi_accept on;'));
$common
    server {
        listen %%ADDR%%:%%PORT%%;
        location / {
            singleflight sf;
            proxy_pass http://origin;
$keepalive        }
        location = /stats { singleflight_stats; }
    }

    server {
        listen %%ADDR%%:%%PORT_1%%;
        location / {
            proxy_pass http://origin;
$keepalive        }
    }
EOT
}

$_->start for @shields, @edges;
note("fleet up: edges ", join(' ', map { $_->addr } @edges), ", shields ",
    join(' ', map { $_->addr } @shields), ", origin $ORIGIN");

# ---------------------------------------------------------- a wave

# bench/herd.c on one edge in the background: its pid and output file
sub start_herd {
    my ($edge, $port, $n, $targets, $tag) = @_;
    my $out = $main->path("herd-$tag.out");
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDOUT, '>', $out) or POSIX::_exit(126);
        exec("$BIN/herd", '-h', $edge->addr, '-p', $port, '-n', $n, '-f', $targets,
            '-t', 60000) or POSIX::_exit(127);
    }
    return [ $pid, $out ];
}

sub read_herd {
    my ($out) = @_;
    my @res;
    open(my $fh, '<', $out) or die "no herd output: $!";
    while (<$fh>) {
        next unless /^c (\d+) (\d+) (\d+) (\S+) (-?\d+) (-?\d+) (\S+)/;
        push @res, { idx => $1, status => $2, len => $3, hash => $4,
            ms => ($6 - $5) / 1000, err => $7 eq '-' ? undef : $7 };
    }
    return @res;
}

sub in_flight {
    return map { ($_->zone_stats->{in_flight} // 0) } @shields;
}

# One wave of a row: its numbers added to $acc.  $kill: kill a shield once
# all flights wait on the origin, start it again afterwards.
sub wave {
    my ($row, $port, $w, $acc, $kill) = @_;
    my @keys = map { "/fleet/$$-$row-$w-k$_?delay=$opt{delay}&size=$opt{size}" }
        0 .. $opt{keys} - 1;
    my $targets = $main->write_file("targets-$row-$w", join("\n", @keys) . "\n");
    my $before = $origin->hits->{total};
    my $per = int($opt{clients} / @edges);
    my $t0 = time;
    my @herds = map { start_herd($edges[$_], $edges[$_]->port($port), $per, $targets,
        "$row-$w-$_") } 0 .. $#edges;

    my $victim;
    if ($kill) {
        my @f;
        $main->wait_for(sub { @f = in_flight(); my $s = 0; $s += $_ for @f; $s >= @keys },
            timeout => 10, interval => 0.005, what => 'every flight on a shield');
        ($victim) = sort { $f[$b] <=> $f[$a] } 0 .. $#shields;
        my $s = $shields[$victim];
        my @pids = ($s->master_pid, $s->child_pids);
        kill 'KILL', @pids;
        $main->wait_for(sub { waitpid($_, WNOHANG) for @pids; !grep { kill 0, $_ } @pids },
            timeout => 5, what => 'the shield to die');
        $acc->{killed_flights} += $f[$victim];
        push @{ $acc->{kill_ms} }, (time - $t0) * 1000;
    }

    my @res;
    for my $h (@herds) {
        waitpid($h->[0], 0);
        push @res, read_herd($h->[1]);
    }
    my $fetches = $origin->hits->{total} - $before;

    my %bodies;
    my @ok = grep { !$_->{err} && $_->{status} == 200 && $_->{len} == $opt{size} } @res;
    $bodies{ $_->{idx} % @keys }{ $_->{hash} } = 1 for @ok;
    $acc->{requests} += @res;
    $acc->{bad} += @res - @ok;
    $acc->{mixed} += grep { keys %{ $bodies{$_} } > 1 } keys %bodies;
    $acc->{fetches} += $fetches;
    $acc->{keys} += @keys;
    $acc->{waves}++;
    push @{ $acc->{per_wave} }, $fetches;
    push @{ $acc->{ms} }, map { $_->{ms} } @ok;
    note(sprintf('%-3s wave %d: %d requests, %d origin fetches, %d not 200/whole%s',
        $row, $w, scalar @res, $fetches, @res - @ok,
        defined $victim ? ", shield $victim killed" : ''));

    if (defined $victim) {
        recover($victim, "$row-$w");
    }
}

# Starts a killed shield again, and gets it its keys back before the next
# row: after fail_timeout an edge's worker lets one request through to it
# and sends the others for its keys to the next shield until that one
# has succeeded, so a herd at that moment would split flights.
sub recover {
    my ($victim, $tag) = @_;
    $shields[$victim]->start;
    sleep 2.2;    # the edges' fail_timeout
    for my $e (@edges) {
        $e->get("/warm/$$-$tag-$_?delay=0&size=10") for 1 .. 60;
    }
}

# ---------------------------------------------------------- the demo

if ($opt{demo}) {
    my @runs = (
        [ 'one edge', sub { demo_edges(1, 1) } ],
        [ 'two edges', sub { demo_edges(2, 1) } ],
        [ 'two edges + three shields', sub { demo_edges(2, 0) } ],
    );
    printf "%d requests over %d keys, origin %d ms a response\n\n",
        $opt{clients}, $opt{keys}, $opt{delay};
    printf "%-28s %9s %15s %9s %9s %7s\n", '', 'requests', 'origin fetches', 'p50 ms',
        'p99 ms', 'failed';
    for my $run (@runs) {
        my $acc = $run->[1]->();
        printf "%-28s %9d %15d %9.1f %9.1f %7d\n", $run->[0], $acc->{requests},
            $acc->{fetches}, SFTest::pct($acc->{ms}, 50), SFTest::pct($acc->{ms}, 99), $acc->{bad};
    }
    exit 0;
}

sub demo_edges {
    my ($n, $port) = @_;
    my @keep = @edges;
    @edges = @edges[ 0 .. $n - 1 ];
    my $acc = {};
    wave("d$n$port", $port, 1, $acc);
    @edges = @keep;
    return $acc;
}

# ---------------------------------------------------------- the rows

my @ROWS = (
    [ 'a', '(a) 2 edges, no shields', 1 ],
    [ "a'", "(a') 2 edges + 3 plain proxies (one more hop)", 2 ],
    [ 'b', '(b) 2 edges + 3 shields', 0 ],
    [ 'c', '(c) (b), a shield killed mid-herd', 0, 1 ],
);

my %acc;
for my $w (1 .. $opt{waves}) {
    for my $r (@ROWS) {
        wave($r->[0], $r->[2], $w, $acc{ $r->[0] } //= {}, $r->[3]);
    }
}

my @lines;
push @lines, '| row | herds | requests | origin fetches per herd | per key | client p50 ms '
    . '| client p99 ms | not 200/whole | keys with 2 bodies |',
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|';
for my $r (@ROWS) {
    my $x = $acc{ $r->[0] };
    push @lines, sprintf('| %s | %d | %d | %s | %.2f | %.1f | %.1f | %d | %d |', $r->[1],
        $x->{waves}, $x->{requests}, join(', ', @{ $x->{per_wave} }),
        $x->{fetches} / $x->{keys}, SFTest::pct($x->{ms}, 50), SFTest::pct($x->{ms}, 99),
        $x->{bad}, $x->{mixed});
}
my $c = $acc{c};
my $hop = SFTest::pct($acc{"a'"}{ms}, 50) - SFTest::pct($acc{a}{ms}, 50);
my $tier = SFTest::pct($acc{b}{ms}, 50) - SFTest::pct($acc{a}{ms}, 50);
push @lines, '', sprintf('(c): killed %s ms after the herds started (every flight waiting '
    . 'on the origin); %d flights were on the killed shields, %d origin fetches more than '
    . '%d keys.', join(', ', map { sprintf '%.0f', $_ } @{ $c->{kill_ms} }),
    $c->{killed_flights}, $c->{fetches} - $c->{keys}, $c->{keys}),
    sprintf('Added at p50 by the shield tier: %.1f ms; by one plain proxy hop: %.1f ms.',
        $tier, $hop);

my $table = join("\n", @lines) . "\n";
print "\n$table";

chomp(my $host = `hostname -s 2>/dev/null` || 'host');
chomp(my $cpu = `grep -m1 'model name' /proc/cpuinfo 2>/dev/null` // '');
$cpu =~ s/^.*?:\s*//;
chomp(my $cores = `nproc 2>/dev/null` // '?');
chomp(my $git = `git -C $REPO describe --always --dirty 2>/dev/null` // '?');
my ($nginx_v) = `@{[ $main->nginx_binary ]} -v 2>&1` =~ m{nginx/(\S+)};
my $out = $opt{out} // SFTest::results_file(strftime('%Y-%m-%d', gmtime) . "-$host-fleet");
my $args = join ' ', map { "--$_ $opt{$_}" } grep { $_ ne 'out' } sort keys %opt;
$main->write_file("report", <<"EOT" . $table);
# ngx_http_singleflight_module fleet benchmark, @{[ strftime('%Y-%m-%d', gmtime) ]}, $host

* date: @{[ strftime('%Y-%m-%d %H:%M:%S UTC', gmtime) ]}
* machine: $host, $cores cores, $cpu
* nginx: @{[ $nginx_v // '?' ]} (@{[ $main->nginx_binary ]}), 2 workers each; module at git $git
* fleet: edges 127.0.0.2-3, shields 127.0.0.4-6 (hash \$scheme\$host\$request_uri consistent, max_fails=1 fail_timeout=2s, proxy_next_upstream error timeout, 2 tries, keepalive 64), origin bench/origin.c on 127.0.0.1
* herds: $opt{clients} requests over $opt{keys} keys, half on each edge at once (bench/herd.c), origin $opt{delay} ms, body $opt{size} bytes, $opt{waves} waves per row, rows interleaved
* command: `perl -I t/lib bench/fleet.pl $args` (`make bench` runs it with the defaults)
* run time: @{[ sprintf('%.0f s', time - $T0) ]}

Latency: request written to response complete, every client of the row's waves.

EOT
system('cp', $main->path('report'), $out) == 0 or die "cannot write $out\n";
note("written to $out");
