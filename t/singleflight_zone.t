#!/usr/bin/perl
#
# The shared zone's life cycle: memory taken by flights is all given back
# once their followers are served (gauges in_flight, waiters, pages_used
# vs pages_baseline), and a zone too small for the traffic degrades to not
# collapsing: every request still gets its complete response from
# upstream, counted in no_memory, with one rate-limited "is full" warning.

use strict;
use warnings;

use Test::More;
use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:16m;
    singleflight_zone zone=tiny:32k;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /w/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /full/ {
            singleflight tiny;
            singleflight_max_size 1m;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /sf_stats {
            singleflight_stats;
        }
    }
EOT
$t->start;

sub stats { $t->zone_stats($_[0], '/sf_stats') }

sub gauges {
    my ($zone) = @_;
    my $s = stats($zone);
    return join ', ', map { "$_=$s->{$_}" } qw(in_flight waiters pages_used pages_baseline);
}

# Indexes of responses that are not a complete 200 with the origin's body of
# $size bytes for the hit that made it.
sub bad_bodies {
    my ($res, $uris, $size) = @_;
    return grep {
        my $r = $res->[$_];
        !(($r->{status} // 0) == 200 && $r->{complete} && defined $r->{headers}{'x-hit'}
            && $r->{body} eq SFTest::origin_body($r->{headers}{'x-hit'}, $uris->[$_], $size));
    } 0 .. $#$res;
}

sub describe {
    my ($res, @idx) = @_;
    return join "\n", map {
        my $r = $res->[$_];
        "client $_: status " . ($r->{status} // 'none') . ', ' . length($r->{body}) . ' bytes'
            . ($r->{error} ? ", error: $r->{error}" : '')
    } @idx[ 0 .. ($#idx < 9 ? $#idx : 9) ];
}

# ---------------------------------------------------- waves: back to baseline

my $base = stats('sf');
ok($base->{pages_baseline} > 0, "zone sf: pages_baseline $base->{pages_baseline}");
is($base->{pages_used}, $base->{pages_baseline}, 'zone sf: idle at start');

my ($KEYS, $PER_KEY, $SIZE) = (5, 20, 50000);
for my $wave (1 .. 3) {
    $t->origin_reset;
    my @uris = map { my $k = $_; map { "/w/wave$wave-key$k?delay=500&size=$SIZE" } 1 .. $PER_KEY }
        1 .. $KEYS;
    my @h = map { $t->start_request('GET', $_) } @uris;

    # While the wave is held at the origin, the zone shows its flights.
    my $seen = $t->wait_for(sub {
        my $s = stats('sf');
        $s->{in_flight} == $KEYS && $s->{waiters} == $KEYS * ($PER_KEY - 1);
    }, timeout => 3, what => "wave $wave in flight");
    ok($seen, "wave $wave: in_flight $KEYS, waiters " . $KEYS * ($PER_KEY - 1))
        or diag(gauges('sf'));

    my $res = [ map { $t->finish_request($_) } @h ];
    my @bad = bad_bodies($res, \@uris, $SIZE);
    ok(!@bad, "wave $wave: all " . @uris . " responses complete and correct")
        or diag(describe($res, @bad));
    is($t->origin_hits->{total}, $KEYS, "wave $wave: one origin hit per key");

    $t->zone_baseline_ok("wave $wave: in_flight 0, waiters 0, pages_used == pages_baseline",
        zone => 'sf', path => '/sf_stats', what => "zone sf idle after wave $wave");
}

my $s = stats('sf');
is($s->{flights} - $base->{flights}, 3 * $KEYS, 'waves: flights');
is($s->{served} - $base->{served}, 3 * $KEYS * ($PER_KEY - 1), 'waves: all followers served');
is($s->{no_memory}, 0, 'zone sf never ran out of memory');

# ---------------------------------------------------- zone full

my $FULL_N = 20;
my $BIG = 200000;
my $tbase = stats('tiny');
is($tbase->{pages_used}, $tbase->{pages_baseline}, 'zone tiny: idle at start');
my $off = $t->log_offset;

# A herd whose response does not fit in the zone: the flight cannot store it,
# so every follower goes upstream on its own.
for my $herd (1 .. 2) {
    $t->origin_reset;
    my $uri = "/full/big$herd?delay=300&size=$BIG";
    my $before = stats('tiny');
    my $res = $t->herd(n => $FULL_N, path => $uri);
    my @bad = bad_bodies($res, [ ($uri) x $FULL_N ], $BIG);
    ok(!@bad, "full, herd $herd: all $FULL_N responses complete and correct")
        or diag(describe($res, @bad));
    is($t->origin_hits->{total}, $FULL_N, "full, herd $herd: not collapsed, $FULL_N origin hits");

    my $after = stats('tiny');
    ok($after->{no_memory} > $before->{no_memory}, "full, herd $herd: no_memory counted");
    is($after->{not_shared} - $before->{not_shared}, $FULL_N - 1,
        "full, herd $herd: followers counted in not_shared");
    is($after->{errors} - $before->{errors}, 0, "full, herd $herd: no errors");
    my $st = SFTest::tally($t->sf_statuses($uri, $FULL_N));
    is_deeply($st, { LEADER => 1, NOT_SHARED => $FULL_N - 1 },
        "full, herd $herd: \$singleflight_status LEADER + NOT_SHARED");

    $t->zone_baseline_ok("full, herd $herd: zone back to baseline",
        zone => 'tiny', path => '/sf_stats', what => "zone tiny idle after herd $herd");
}

# More distinct keys in flight at once than the zone has room for: the
# requests that cannot even create their flight go upstream (NO_MEMORY).
{
    $t->origin_reset;
    my $n = 300;
    my @uris = map { "/full/many$_?delay=300&size=100" } 1 .. $n;
    my $before = stats('tiny');
    my $res = $t->herd(paths => \@uris);
    my @bad = bad_bodies($res, \@uris, 100);
    ok(!@bad, "full, $n keys: all responses complete and correct")
        or diag(describe($res, @bad));
    is($t->origin_hits->{total}, $n, "full, $n keys: $n origin hits");
    my $st = SFTest::tally($t->sf_statuses(qr{/full/many\d+\S*}, $n));
    ok($st->{NO_MEMORY}, "full, $n keys: some requests could not create a flight ("
        . ($st->{NO_MEMORY} // 0) . ' NO_MEMORY)');
    is(($st->{LEADER} // 0) + ($st->{NO_MEMORY} // 0), $n,
        "full, $n keys: every request is LEADER or NO_MEMORY")
        or diag(explain($st));
    my $after = stats('tiny');
    # (leaders that could not store their response count there too)
    cmp_ok($after->{no_memory} - $before->{no_memory}, '>=', $st->{NO_MEMORY} // 1,
        "full, $n keys: stats no_memory counts them");
    $t->zone_baseline_ok("full, $n keys: zone back to baseline",
        zone => 'tiny', path => '/sf_stats', what => 'zone tiny idle');
}

my $log = $t->error_log_since($off);
my @full = $log =~ /^.*\[warn\].*singleflight zone "tiny" is full.*$/mg;
is(scalar @full, 1, 'exactly one "is full" warning for all the herds') or diag(join "\n", @full);
unlike($log, qr/singleflight zone "sf" is full/, 'no warning for zone sf');
unlike($log, qr/ngx_slab_alloc\(\) failed/, 'no slab allocator "no memory" messages');
is(stats('sf')->{no_memory}, 0, 'zone sf: no_memory still 0');

done_testing;
