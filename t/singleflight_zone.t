#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# The shared zone's life cycle: memory taken by flights is all given back
# once their followers are served (gauges in_flight, waiters, pages_used
# vs pages_baseline), and a zone too small for the traffic degrades to not
# collapsing: every request still gets its complete response from
# upstream, counted in no_memory, with one rate-limited "is full" warning.
# A body larger than the zone is no such case: it goes on in its flight's
# temporary file, and the herd is collapsed all the same.

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
    singleflight_zone zone=small:128k;

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

        # a response header larger than the zone: through a fetch (a zone
        # under 96 KiB), and the first request's own (singleflight_lone
        # direct, a flight adopted at its header)
        location /hdr/ {
            singleflight tiny;
            proxy_buffer_size 256k;
            proxy_buffers 4 256k;
            proxy_busy_buffers_size 256k;
            proxy_pass http://%%ORIGIN%%;
        }

        location /hdrd/ {
            singleflight small;
            proxy_buffer_size 256k;
            proxy_buffers 4 256k;
            proxy_busy_buffers_size 256k;
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

# A herd whose response does not fit in the zone: the body goes on in the
# flight's temporary file (docs/directives.md, singleflight_zone), so the herd is
# still collapsed, and silently: no "is full" warning for that.
for my $herd (1 .. 2) {
    $t->origin_reset;
    my $uri = "/full/big$herd?delay=300&size=$BIG";
    my $before = stats('tiny');
    my $res = $t->herd(n => $FULL_N, path => $uri);
    my @bad = bad_bodies($res, [ ($uri) x $FULL_N ], $BIG);
    ok(!@bad, "big body, herd $herd: all $FULL_N responses complete and correct")
        or diag(describe($res, @bad));
    is($t->origin_hits->{total}, 1, "big body, herd $herd: collapsed, 1 origin hit");

    my $after = stats('tiny');
    is($after->{spilled} - $before->{spilled}, 1,
        "big body, herd $herd: the body went on in a file");
    ok($after->{no_memory} > $before->{no_memory},
        "big body, herd $herd: the refused memory is counted in no_memory");
    is($after->{errors} - $before->{errors}, 0, "big body, herd $herd: no errors");
    is($after->{not_shared} - $before->{not_shared}, 0, "big body, herd $herd: all shared");
    my $st = SFTest::tally($t->sf_statuses($uri, $FULL_N));
    is_deeply($st, { LEADER => 1, FOLLOWER => $FULL_N - 1 },
        "big body, herd $herd: \$singleflight_status LEADER + FOLLOWER");

    $t->zone_baseline_ok("big body, herd $herd: zone back to baseline",
        zone => 'tiny', path => '/sf_stats', what => "zone tiny idle after herd $herd");
}
unlike($t->error_log_since($off), qr/singleflight zone "tiny" is full/,
       'big body: no "is full" warning for a body that goes on in a file');

# More distinct keys in flight at once than the zone has room for: the
# requests that cannot even create their flight go upstream (NO_MEMORY).
# While the zone is full of them, a herd on another key is not collapsed:
# every request goes upstream on its own, as if the module were off, and
# still gets its complete response.
{
    $t->origin_reset;
    my $n = 300;
    my @uris = map { "/full/many$_?delay=4000&size=100" } 1 .. $n;
    my $before = stats('tiny');
    my @fill = map { $t->start_request('GET', $_) } @uris;
    # every filler has a flight or was refused one, and some were refused
    my ($full, $z) = $t->wait_zone(sub {
        $_[0]{no_memory} > $before->{no_memory}
        && $_[0]{in_flight} + $_[0]{no_memory} - $before->{no_memory} >= $n
    }, zone => 'tiny', path => '/sf_stats', what => 'zone tiny full');
    ok($full, "full, $n keys: the zone is full ($z->{in_flight} flights)")
        or diag(explain($z));

    my $huri = "/full/herd?delay=300&size=$BIG";
    my $hbefore = stats('tiny');
    my $res = $t->herd(n => $FULL_N, path => $huri);
    my @bad = bad_bodies($res, [ ($huri) x $FULL_N ], $BIG);
    ok(!@bad, "full, herd: all $FULL_N responses complete and correct")
        or diag(describe($res, @bad));
    is($t->origin_uri_hits($huri), $FULL_N, "full, herd: not collapsed, $FULL_N origin hits");
    my $hst = SFTest::tally($t->sf_statuses($huri, $FULL_N));
    is_deeply($hst, { NO_MEMORY => $FULL_N }, "full, herd: \$singleflight_status NO_MEMORY");
    my $hafter = stats('tiny');
    cmp_ok($hafter->{no_memory} - $hbefore->{no_memory}, '>=', $FULL_N,
        "full, herd: stats no_memory counts them");
    is($hafter->{errors} - $hbefore->{errors}, 0, 'full, herd: no errors');
    is($hafter->{flights} - $hbefore->{flights}, 0, 'full, herd: no flight started');
    is(scalar(grep { $_->{status} != 200 } @$res), 0, 'full, herd: never an error status');

    my $fres = [ map { $t->finish_request($_) } @fill ];
    @bad = bad_bodies($fres, \@uris, 100);
    ok(!@bad, "full, $n keys: all responses complete and correct")
        or diag(describe($fres, @bad));
    is($t->origin_hits->{total}, $n + $FULL_N, "full, $n keys: " . ($n + $FULL_N) . " origin hits, the herd's included");
    my $st = SFTest::tally($t->sf_statuses(qr{/full/many\d+\S*}, $n));
    ok($st->{NO_MEMORY}, "full, $n keys: some requests could not create a flight ("
        . ($st->{NO_MEMORY} // 0) . ' NO_MEMORY)');
    is(($st->{LEADER} // 0) + ($st->{NO_MEMORY} // 0), $n,
        "full, $n keys: every request is LEADER or NO_MEMORY")
        or diag(explain($st));
    my $after = stats('tiny');
    cmp_ok($after->{no_memory} - $before->{no_memory}, '>=', ($st->{NO_MEMORY} // 1) + $FULL_N,
        "full, $n keys: stats no_memory counts them");
    $t->zone_baseline_ok("full, $n keys: zone back to baseline",
        zone => 'tiny', path => '/sf_stats', what => 'zone tiny idle');
}

my $log = $t->error_log_since($off);
my @full = $log =~ /^.*\[warn\].*singleflight zone "tiny" is full.*$/mg;
is(scalar @full, 1, 'exactly one "is full" warning for the full zone and its herd') or diag(join "\n", @full);
unlike($log, qr/singleflight zone "sf" is full/, 'no warning for zone sf');
unlike($log, qr/ngx_slab_alloc\(\) failed/, 'no slab allocator "no memory" messages');
is(stats('sf')->{no_memory}, 0, 'zone sf: no_memory still 0');

# A flight whose response header does not fit in the zone: its leader
# gets the response, and its followers, which waited for that header, go
# upstream on their own, NO_MEMORY as the requests that find no room for
# a flight (not NOT_SHARED, which says the response could not be shared);
# through a fetch, and through the first request's own response
for my $case ([ '/hdr/h', 'tiny', 'a fetch' ],
              [ '/hdrd/h', 'small', 'its own response' ]) {
    my ($path, $zone, $how) = @$case;
    my $what = "header larger than the zone, $how";
    $t->origin_reset;
    my $uri = "$path?delay=300&size=100&big_hdr=150000";
    my $before = stats($zone);
    my $res = $t->herd(n => $FULL_N, path => $uri);
    my @bad = bad_bodies($res, [ ($uri) x $FULL_N ], 100);
    ok(!@bad, "$what: all $FULL_N responses complete and correct")
        or diag(describe($res, @bad));
    is(scalar(grep { length($_->{headers}{'x-big'} // '') == 150000 } @$res),
       $FULL_N, "$what: every client has it");
    my $st = SFTest::tally($t->sf_statuses(qr{\Q$path\E\S*}, $FULL_N));
    is_deeply($st, { LEADER => 1, NO_MEMORY => $FULL_N - 1 },
              "$what: LEADER and NO_MEMORY") or diag(explain($st));
    is($t->origin_uri_hits($uri), $FULL_N, "$what: $FULL_N origin requests");
    my $after = stats($zone);
    my %d = map { $_ => ($after->{requests_total}{$_} // 0)
                        - ($before->{requests_total}{$_} // 0) } qw(NOT_SHARED NO_MEMORY);
    is_deeply(\%d, { NOT_SHARED => 0, NO_MEMORY => $FULL_N - 1 },
              "$what: requests_total counts them NO_MEMORY");
    $t->zone_baseline_ok("$what: zone back to baseline",
        zone => $zone, path => '/sf_stats', what => "zone $zone idle");
}

done_testing;
