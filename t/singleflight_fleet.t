#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A fleet: 2 edges and 3 shields, each a separate nginx on its own
# loopback address (127.0.0.2 ... 127.0.0.6), one origin.  The edges
# collapse their clients' requests and send each key to one shield by
# consistent hashing (upstream { hash ... consistent; }); the shields
# collapse the edges' fetches again, so a herd over both edges costs one
# origin fetch per key.  Then a shield is killed (kill -9, master and
# workers) while every flight waits on the origin: the edges' fetches go
# on to the next shield (proxy_next_upstream), every client gets a whole
# response, and the dead shield's keys cost one origin fetch more, the
# others none.  The README's "A fleet of edges and shields" is this configuration.

use strict;
use warnings;

use Test::More;
use Time::HiRes ();

use lib 't/lib';
use SFTest;

my $o = SFTest->new;
$o->skip_without_module;
my $origin = $o->start_origin;

my @shields = map { SFTest->new(addr => "127.0.0.$_") } 4 .. 6;
my @edges = map { SFTest->new(addr => "127.0.0.$_") } 2 .. 3;
my @all = (@edges, @shields);

my $servers = join '', map {
    '        server ' . $_->addr . ':' . $_->port . " max_fails=1 fail_timeout=30s;\n"
} @shields;
my $origin_addr = $origin->addr;
my $edge0 = $edges[0]->addr . ':' . $edges[0]->port;

# what every instance logs: its $singleflight_status, the CDN-Loop it was
# sent, the shields it went to
my $log = <<'EOT';
    log_format fleet '$singleflight_status|$status|$upstream_addr|$http_cdn_loop|$request_uri';
    access_log %%TESTDIR%%/fleet.log fleet;

    singleflight_zone zone=sf:4m;
EOT

my $stats = <<'EOT';
        location = /stats {
            singleflight_stats;
        }
EOT

for my $i (0 .. $#edges) {
    my $name = $i == 0 ? "    singleflight_loop_name edge-a;\n" : '';
    $edges[$i]->write_config($edges[$i]->config_template(<<"EOT"));
$log$name
    upstream shields {
        hash \$scheme\$host\$request_uri consistent;
$servers        keepalive 8;
    }

    # /back/: the first pass goes to the shields, which send it back here
    map \$http_x_hop \$edge_next {
        ""       shields;
        default  $origin_addr;
    }

    server {
        listen %%ADDR%%:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_timeout 20s;
            proxy_pass http://shields;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 2;
            proxy_connect_timeout 2s;
            proxy_read_timeout 15s;
            singleflight_promote error timeout dead http_502 http_504;
        }

        location /back/ {
            singleflight sf;
            proxy_pass http://\$edge_next;
            proxy_set_header Host \$host;
        }

        # shields slower than the edge waits
        location /slow/ {
            singleflight sf;
            proxy_pass http://shields;
            proxy_set_header Host \$host;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 2;
            proxy_read_timeout 1s;
        }
$stats    }
EOT
}

for my $s (@shields) {
    $s->write_config($s->config_template(<<"EOT"));
$log
    server {
        listen %%ADDR%%:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_timeout 20s;
            proxy_pass http://$origin_addr;
            proxy_set_header Host \$host;
        }

        # a shield that proxies back to an edge: a loop there
        location /back/ {
            singleflight sf;
            proxy_pass http://$edge0;
            proxy_set_header Host \$host;
            proxy_set_header X-Hop 1;
        }
$stats    }
EOT
}

$_->start for @all;

my @fields = qw(sf status ua loop uri);

# n requests over keys /PREFIX/kK, 20 at a time on each edge in turn
sub herd {
    my ($prefix, $n, $query) = @_;
    my (@paths, @h);
    for my $j (0 .. $n - 1) {
        my $path = "/$prefix/k" . ($j % 20) . "?$query";
        push @paths, $path;
        push @h, $edges[ int($j / 20) % 2 ]->start_request('GET', $path, timeout => 30);
    }
    return (\@paths, $o->finish_all(\@h));
}

# every response a whole one of the origin's, and one body per key
sub check_bodies {
    my ($what, $paths, $res, $size) = @_;
    my (%bodies, @bad);
    for my $i (0 .. $#$res) {
        my $r = $res->[$i];
        my ($hit) = ($r->{body} // '') =~ /^hit=(\d+) /;
        if (($r->{status} // 0) != 200 || !$r->{complete} || !defined $hit
            || $r->{body} ne SFTest::origin_body($hit, $paths->[$i], $size))
        {
            push @bad, "$paths->[$i]: " . ($r->{status} // 'none') . ' '
                . ($r->{error} // 'complete') . ' ' . length($r->{body} // '') . ' bytes';
            next;
        }
        $bodies{ $paths->[$i] }{$hit}++;
    }
    is(scalar(@bad), 0, "$what: every response 200 with a whole body of the origin's")
        or diag(join "\n", @bad[ 0 .. ($#bad < 9 ? $#bad : 9) ]);
    return \%bodies;
}

sub zones { map { $_->zone_stats } @_ }

sub records {
    my ($t, $re) = @_;
    return $t->log_records('fleet.log', \@fields, sep => '|', uri => $re);
}

# ------------------------------------------------------------ the herd

my $size = 50000;
my @before = zones(@all);
my ($paths, $res) = herd('a', 400, "delay=2500&size=$size");
my $bodies = check_bodies('herd', $paths, $res, $size);

my %keys = map { $_ => 1 } @$paths;
my @hits = map { $o->origin_uri_hits($_) } sort keys %keys;
is(scalar(grep { $_ == 1 } @hits), 20, 'herd: one origin fetch for each of 20 keys')
    or diag("origin fetches per key: @hits");
is(scalar(grep { keys %{ $bodies->{$_} } == 1 } keys %keys), 20,
    'herd: one body per key, on both edges');

for my $i (0 .. $#all) {
    $all[$i]->zone_baseline_ok("herd: zone back to baseline on instance $i");
}
my @after = zones(@all);
my @d = map { SFTest::delta($before[$_], $after[$_], qw(flights followers loops)) } 0 .. $#all;
is(join(' ', map { "$_->{flights}/$_->{followers}" } @d[0, 1]), '20/180 20/180',
    'herd: each edge collapsed its 200 requests into 20 flights');
my ($sf, $sfl) = (0, 0);
$sf += $_->{flights}, $sfl += $_->{followers} for @d[2 .. 4];
is("$sf/$sfl", '20/20', "herd: the shields collapsed the edges' 40 fetches into 20 flights");
is(scalar(grep { $_->{loops} } @d), 0, 'herd: no instance took a fetch for a loop');

# each key on one shield: its leader and the other edge's fetch, following
my %owner;
for my $k (0 .. 2) {
    for my $r (records($shields[$k], qr{^/a/})) {
        push @{ $owner{ $r->{uri} } }, "$k:$r->{sf}";
    }
}
my @one = grep { my $o = $owner{$_} // [];
    "@{[ sort @$o ]}" =~ /^(\d):FOLLOWER \1:LEADER$/ } keys %keys;
is(scalar(@one), 20, 'herd: every key went to one shield, leader and follower there')
    or diag(explain(\%owner));
my %load;
$load{ substr($owner{$_}[0], 0, 1) }++ for @one;
cmp_ok(scalar(keys %load), '>=', 2, 'herd: the keys spread over the shields')
    or diag(explain(\%load));

my @loops = map { $_->{loop} } records($shields[0], qr{^/a/}), records($shields[1], qr{^/a/}),
    records($shields[2], qr{^/a/});
is(scalar(grep { $_ eq 'edge-a' } @loops), 20, 'herd: 20 fetches named edge-a (singleflight_loop_name)');
is(scalar(grep { /^singleflight-[0-9a-f]{16}$/ } @loops), 20,
    'herd: 20 named by the other edge, by its own token');

# ------------------------------------------------------------ a loop across the tiers

my $back = '/back/x?delay=100';
my $r = $edges[0]->get($back, timeout => 10);
is($r->{status} // 0, 200, 'loop: a shield proxying back to an edge is answered');
my @e = $edges[0]->wait_log_records('fleet.log', \@fields, 2, sep => '|', uri => $back);
is(join(' ', sort map { $_->{sf} } @e), 'DIRECT LOOP',
    'loop: the edge took its own request coming back for a loop, and only that');
# a shield writes its line after its response went out: polled, as the
# edge's lines are
my @s;
$edges[0]->wait_for(sub { @s = map { records($_, $back) } @shields; @s >= 1 },
    what => "the shield's log line", quiet => 1);
is(join(' ', map { $_->{sf} } @s), 'DIRECT', 'loop: the shield let the edge\'s lone request through');
is($o->origin_uri_hits($back), 1, 'loop: one origin fetch');

# ------------------------------------------------------------ a far range over both tiers

# A Range past the first byte has a flight of that Range on each tier: the
# edges' fetches send it to the shield, which collapses them again and
# sends it to the origin.  40 clients: one origin request, each a 206
# with its bytes.
{
    my $far = "/r/far?fixed=1&ranges=1&size=$size&delay=1000";
    my @fh = map { $edges[ $_ % 2 ]->start_request('GET', $far, timeout => 30,
        headers => [ Range => 'bytes=40000-40099' ]) } 0 .. 39;
    my $fres = $o->finish_all(\@fh);
    my $whole = $o->get($far, port => $origin->port)->{body} // '';
    is(length $whole, $size, 'far range: the whole body, from the origin');
    is(scalar(grep { ($_->{status} // 0) == 206
                     && ($_->{headers}{'content-range'} // '') eq "bytes 40000-40099/$size"
                     && ($_->{body} // '') eq substr($whole, 40000, 100) } @$fres), 40,
       'far range: 40 x 206 with bytes 40000-40099, over both edges');
    is($o->origin_uri_hits($far), 1 + 1, 'far range: one origin request (and the check\'s)');
    my @st = map { my $e = $_;
        $e->wait_log_records('fleet.log', \@fields, 20, sep => '|', uri => $far) } @edges;
    is(scalar(grep { $_->{sf} eq 'LEADER' } @st) . '/' . scalar(grep { $_->{sf} eq 'FOLLOWER' } @st),
       '2/38', 'far range: a flight of it on each edge');
    my @sh;
    $o->wait_for(sub { @sh = map { records($_, $far) } @shields; @sh >= 2 },
        what => "the shield's log lines", quiet => 1);
    is(join(' ', sort map { "$_->{sf}:$_->{status}" } @sh), 'FOLLOWER:206 LEADER:206',
       'far range: the shield collapsed the edges\' two fetches of it');
}

# ------------------------------------------------------------ one origin failure

# The origin resets the first request of a key.  The shield's first
# request, an edge's fetch, gets nginx's 502, as without the module; the
# shield's followers fetch again.  To that edge the 502 is a response:
# with http_502 (README's edges) its followers fetch it again once, and
# get the 200, where they all had the 502.
{
    my $path = "/f/one?fail=reset&fail_first=1&delay=500&size=100";
    my @fh = map { $edges[ $_ % 2 ]->start_request('GET', $path, timeout => 30) } 0 .. 39;
    my $fres = $o->finish_all(\@fh);
    my @bad = grep { ($_->{status} // 0) != 200 } @$fres;
    ok(@bad <= 1, 'one origin failure: at most one client gets the 502, as without the module')
        or diag(scalar(@bad) . ' clients: ' . join(' ', map { $_->{status} // 'none' } @bad));
    cmp_ok($o->origin_uri_hits($path), '<=', 3, 'one origin failure: at most 3 origin requests');
}

# ------------------------------------------------------------ a shield killed mid-herd

my $slow = "delay=4000&size=$size";
my @h;
for my $j (0 .. 399) {
    push @h, $edges[ int($j / 20) % 2 ]->start_request('GET', "/b/k" . ($j % 20) . "?$slow",
        timeout => 30);
}
my @bpaths = map { "/b/k" . ($_ % 20) . "?$slow" } 0 .. 399;
my %bkeys = map { $_ => 1 } @bpaths;

# every shield flight is waiting on the origin
my @inflight;
my $ready = $o->wait_for(sub {
    @inflight = map { $_->zone_stats->{in_flight} // 0 } @shields;
    my $sum = 0;
    $sum += $_ for @inflight;
    $sum == 20 && (grep { $o->origin_uri_hits($_) } keys %bkeys) == 20;
}, timeout => 10, what => '20 shield flights at the origin');
ok($ready, 'kill: 20 flights in the air on the shields') or diag("in flight: @inflight");

my ($victim) = sort { $inflight[$b] <=> $inflight[$a] } 0 .. 2;
my $lost = $inflight[$victim];
my @pids = ($shields[$victim]->master_pid, $shields[$victim]->child_pids);
kill 'KILL', @pids;
$o->wait_for(sub { waitpid($_, POSIX::WNOHANG()) for @pids; !grep { kill 0, $_ } @pids },
    timeout => 5, what => 'the shield to die');

my $bres = $o->finish_all(\@h);
my $bbodies = check_bodies('kill', \@bpaths, $bres, $size);
my %bhits = map { $_ => $o->origin_uri_hits($_) } keys %bkeys;
my @twice = grep { $bhits{$_} == 2 } keys %bkeys;
is(scalar(grep { $_ > 2 } values %bhits), 0, 'kill: at most one more origin fetch per key');
is(scalar(@twice), $lost, "kill: one more for each of the $lost keys of the dead shield, none for the others")
    or diag(explain(\%bhits));
is(scalar(grep { keys %{ $bbodies->{$_} } == 1 } grep { $bhits{$_} == 1 } keys %bkeys),
    20 - $lost, 'kill: the surviving shields\' keys: one body per key on both edges');
my $dead = $shields[$victim]->addr . ':' . $shields[$victim]->port;
my @retried = grep { $_->{sf} eq 'LEADER' && $_->{ua} =~ /^\Q$dead\E, / }
    map { records($_, qr{^/b/}) } @edges;
is(scalar(@retried), 2 * $lost, 'kill: each edge\'s fetch of those keys went on to the next shield');

my @left = grep { $_ != $victim } 0 .. 2;
for my $i (0, 1, map { 2 + $_ } @left) {
    $all[$i]->zone_baseline_ok("kill: zone back to baseline on instance $i");
}

# ------------------------------------------------------------ after the kill

# the first herd's keys again (nothing is cached): those of the surviving
# shields stay where they were, the dead shield's go to the others
my %home = map { $_ => substr($owner{$_}[0], 0, 1) } @one;
my %off = map { $_ => $shields[$_]->log_offset('fleet.log') } @left;
($paths, $res) = herd('a', 400, "delay=2500&size=$size");
$bodies = check_bodies('after', $paths, $res, $size);
@hits = map { $o->origin_uri_hits($_) } sort keys %keys;
is(scalar(grep { $_ == 2 } @hits), 20, 'after: one more origin fetch per key on the two shields left')
    or diag("origin fetches per key, both herds: @hits");
is(scalar(grep { keys %{ $bodies->{$_} } == 1 } keys %keys), 20, 'after: one body per key');
my (%now, %led);
for my $k (@left) {
    for my $r (grep { $_->{sf} eq 'LEADER' } $shields[$k]->log_records('fleet.log', \@fields,
        sep => '|', uri => qr{^/a/}, offset => $off{$k}))
    {
        $now{ $r->{uri} } .= $k;
        $led{$k}++;
    }
}
is(scalar(grep { defined $now{$_} && length $now{$_} == 1 } keys %keys), 20,
    'after: every key led on one surviving shield') or diag(explain(\%now));
my @stayed = grep { $home{$_} != $victim } keys %keys;
is(scalar(grep { ($now{$_} // '') eq $home{$_} } @stayed), scalar(@stayed),
    'after: the surviving shields\' keys stayed where they were');
SKIP: {
    # a precondition too: a shield's share of the ring depends on the
    # ports it got, and once (CI, under ASan) a surviving shield had owned
    # none of the 20 keys, nor got any of the dead one's
    my %owned;
    $owned{ $home{$_} }++ for keys %keys;
    skip 'after: a surviving shield owned none of the first herd\'s keys', 1
        unless $owned{ $left[0] } && $owned{ $left[1] };
    ok($led{ $left[0] } && $led{ $left[1] }, 'after: both surviving shields own keys')
        or diag(explain(\%led));
}
SKIP: {
    # a precondition, not the module's doing: which keys a shield owns is
    # the hash's
    skip 'after: the dead shield owned none of the first herd\'s keys', 1
        if @stayed == 20;
    my @moved = grep { $home{$_} == $victim } keys %keys;
    is(scalar(grep { defined $now{$_} && $now{$_} ne $victim } @moved), scalar(@moved),
       'after: the dead shield\'s ' . scalar(@moved) . ' keys are led by the others now');
}
for my $i (0, 1, map { 2 + $_ } @left) {
    $all[$i]->zone_baseline_ok("after: zone back to baseline on instance $i");
}

# ------------------------------------------------------------ slow shields

# Last: a read timeout counts against max_fails, so the shields it met
# are out for every key for fail_timeout.  Read timeout 1 s, 2 shields a
# try, the flight fetched again once (singleflight_promote timeout):
# about 4 s, whatever the origin takes; 504, or 502 when the promoted
# fetch finds no shield left that is not marked failed.
my $t0 = Time::HiRes::time();
my $slowres = $edges[1]->herd(n => 10, path => '/slow/x?delay=9000', timeout => 15);
my $took = Time::HiRes::time() - $t0;
my %st = map { ($_->{status} // 'none') . ($_->{complete} ? '' : '-incomplete') => 1 } @$slowres;
# The first request goes its own way (singleflight_lone direct) and gets
# its own 504; the others' flight is fetched again once, and may find no
# shield left (502).
ok(!grep({ !/^50[24]$/ } keys %st), 'slow: every client gets a complete 502 or 504')
    or diag(explain(\%st));
cmp_ok($took, '<', 7, sprintf('slow: bounded by the edge\'s timeouts (%.1f s)', $took));
$edges[1]->zone_baseline_ok('slow: zone back to baseline on the edge');

done_testing;
