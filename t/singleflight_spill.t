#!/usr/bin/perl
#
# Leader responses that do not stay in memory buffers: with tiny proxy
# buffers and a client that does not keep up, nginx spills the upstream
# response to a proxy temporary file and the module must capture it from
# there; with proxy_buffering off the body arrives as many small buffers.
# Either way every follower gets the byte-identical, complete body.
#
# On loopback a reading client absorbs everything at once and nginx never
# needs the temp file, so the spill cases hold all clients unread (and lock
# the listener's send buffer small) until the flight is over; the "buffered
# to a temporary file" warning proves the spill happened.  The flight must
# complete, and its followers be served, without waiting for the leader's
# client: the leader's body is captured from the temp file, whether nginx
# then sends it with sendfile or reads it back into memory buffers.

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

    server {
        listen 127.0.0.1:%%PORT%% sndbuf=16k;

        location /spill/ {
            singleflight sf;
            proxy_buffer_size 4k;
            proxy_buffers 2 4k;
            proxy_busy_buffers_size 4k;
            proxy_pass http://%%ORIGIN%%;
        }

        location /spill-sendfile/ {
            singleflight sf;
            sendfile on;
            proxy_buffer_size 4k;
            proxy_buffers 2 4k;
            proxy_busy_buffers_size 4k;
            proxy_pass http://%%ORIGIN%%;
        }

        location /nobuf/ {
            singleflight sf;
            proxy_buffering off;
            proxy_buffer_size 4k;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /sf_stats {
            singleflight_stats;
        }
    }
EOT
$t->start;

my $N = 20;
my $SIZE = 300000;

sub stats { $t->zone_stats('sf', '/sf_stats') }

# All responses: 200, complete, the body of origin hit 1, byte for byte.
sub check_bodies {
    my ($name, $uri, $res) = @_;
    my $want = SFTest::origin_body(1, $uri, $SIZE);
    my @bad = grep { my $r = $res->[$_];
        !(($r->{status} // 0) == 200 && $r->{complete} && $r->{body} eq $want) } 0 .. $#$res;
    ok(!@bad, "$name: all $N responses are 200 with the complete body of hit 1")
        or diag(join "\n", map {
            my $r = $res->[$_];
            my $b = $r->{body};
            my $i = 0;
            $i++ while $i < length($b) && $i < length($want)
                && substr($b, $i, 1) eq substr($want, $i, 1);
            "client $_: status " . ($r->{status} // 'none') . ', ' . length($b)
                . " bytes, first difference at byte $i"
                . ($r->{error} ? ", error: $r->{error}" : '')
        } @bad[ 0 .. ($#bad < 9 ? $#bad : 9) ]);
    my %distinct = map { $_->{body} => 1 } @$res;
    is(scalar(keys %distinct), 1, "$name: the bodies are byte-identical");
}

# ---------------------------------------------------- spilled to a temp file

for my $case (
    [ 'spill, Content-Length', "/spill/cl?delay=300&size=$SIZE" ],
    [ 'spill, chunked', "/spill/chunked?delay=300&size=$SIZE&chunked=1" ],
    [ 'spill, sendfile on', "/spill-sendfile/cl?delay=300&size=$SIZE" ],
    [ 'spill, sendfile on, chunked', "/spill-sendfile/chunked?delay=300&size=$SIZE&chunked=1" ],
) {
    my ($name, $uri) = @$case;
    $t->origin_reset;
    my $off = $t->log_offset;
    my $before = stats();

    # Nobody reads: the leader's response can only go to the temp file.
    my @h = map { $t->start_request('GET', $uri) } 1 .. $N;
    ok($t->wait_for(sub { stats()->{served} - $before->{served} == $N - 1 },
        timeout => 3, what => "$name: followers served"),
        "$name: the flight completed and its followers were served while no client read");
    like($t->error_log_since($off), qr/an upstream response is buffered to a temporary file/,
        "$name: the leader's response went through a proxy temp file");

    my $res = [ map { $t->finish_request($_) } @h ];
    check_bodies($name, $uri, $res);
    is($t->origin_hits->{total}, 1, "$name: 1 origin hit");

    my $after = stats();
    is($after->{not_shared} - $before->{not_shared}, 0, "$name: nothing not shared");
    is($after->{oversized} - $before->{oversized}, 0, "$name: not oversized");
    is($after->{bytes_shared} - $before->{bytes_shared}, ($N - 1) * $SIZE,
        "$name: bytes_shared == " . ($N - 1) . " x $SIZE");
    is(join(' ', sort $t->sf_statuses($uri, $N)), join(' ', ('FOLLOWER') x ($N - 1), 'LEADER'),
        "$name: \$singleflight_status LEADER + FOLLOWER");
}

# ---------------------------------------------------- proxy_buffering off

for my $case (
    [ 'unbuffered, Content-Length', "/nobuf/cl?delay=300&size=$SIZE" ],
    [ 'unbuffered, chunked', "/nobuf/chunked?delay=300&size=$SIZE&chunked=1" ],
) {
    my ($name, $uri) = @$case;
    $t->origin_reset;
    my $before = stats();

    my $res = $t->herd(n => $N, path => $uri);
    check_bodies($name, $uri, $res);
    is($t->origin_hits->{total}, 1, "$name: 1 origin hit");

    my $after = stats();
    is($after->{served} - $before->{served}, $N - 1, "$name: followers served from the zone");
    is($after->{bytes_shared} - $before->{bytes_shared}, ($N - 1) * $SIZE,
        "$name: bytes_shared == " . ($N - 1) . " x $SIZE");
    is(join(' ', sort $t->sf_statuses($uri, $N)), join(' ', ('FOLLOWER') x ($N - 1), 'LEADER'),
        "$name: \$singleflight_status LEADER + FOLLOWER");
}

$t->zone_baseline_ok('zone back to baseline', path => '/sf_stats');

done_testing;
