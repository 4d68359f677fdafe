#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Bodies larger than singleflight_memory: the first singleflight_memory
# bytes stay in the zone, the rest goes to the flight's own temporary file
# under singleflight_temp_path, which every reader sends from (with
# sendfile() where it is on).  The file must hold exactly the bytes past
# the memory part, every client must get the byte-identical complete body
# (Content-Length or chunked from the origin, sendfile on or off), and the
# file must be gone once the flight is over.  A body that fits in memory
# makes no file.  The same for a flight fed by a herd's first request that
# went its own way (singleflight_lone direct, the default).
#
# To see the file while it exists, the clients read nothing (and the
# listener's send buffer is small) until the fetch is complete: the flight
# lives as long as it has readers.  The fetch must complete, and the
# followers be served, without any client reading: the fetch does not
# depend on any client.

use strict;
use warnings;

use Test::More;
use File::Find qw(find);
use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:16m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;

    server {
        listen 127.0.0.1:%%PORT%% sndbuf=16k;

        # small proxy buffers: the body reaches the store in many pieces
        location /spill/ {
            singleflight sf;
            sendfile off;
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

        # the default: a herd's first request goes its own way and feeds
        # the flight from its own upstream response
        location /direct/ {
            singleflight sf;
            singleflight_lone direct;
            sendfile off;
            proxy_buffer_size 4k;
            proxy_buffers 2 4k;
            proxy_busy_buffers_size 4k;
            proxy_pass http://%%ORIGIN%%;
        }

        location /direct-sendfile/ {
            singleflight sf;
            singleflight_lone direct;
            sendfile on;
            proxy_buffer_size 4k;
            proxy_buffers 2 4k;
            proxy_busy_buffers_size 4k;
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
my $MEMORY = 256 * 1024;    # singleflight_memory's default

sub stats { $t->zone_stats('sf', '/sf_stats') }

# the files under singleflight_temp_path: { name => size }
sub temp_files {
    my %f;
    find(sub { $f{$File::Find::name} = -s _ if -f }, $t->path('sf_temp'))
        if -d $t->path('sf_temp');
    return \%f;
}

# All responses: 200, complete, the body of origin hit 1, byte for byte.
sub check_bodies {
    my ($name, $uri, $res, $size) = @_;
    my $want = SFTest::origin_body(1, $uri, $size // $SIZE);
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

ok(-d $t->path('sf_temp'), 'nginx created singleflight_temp_path');
is(scalar(keys %{ temp_files() }), 0, 'no temporary file before any flight');

for my $case (
    [ 'spill, Content-Length', "/spill/cl?delay=300&size=$SIZE", $SIZE ],
    [ 'spill, chunked', "/spill/chunked?delay=300&size=$SIZE&chunked=1", $SIZE ],
    [ 'spill, sendfile on', "/spill-sendfile/cl?delay=300&size=$SIZE", $SIZE ],
    [ 'spill, sendfile on, chunked', "/spill-sendfile/chunked?delay=300&size=$SIZE&chunked=1",
      $SIZE ],
    [ 'in memory, Content-Length', "/spill/small?delay=300&size=200000", 200000 ],
    [ 'in memory, sendfile on, chunked', "/spill-sendfile/small?delay=300&size=200000&chunked=1",
      200000 ],
) {
    my ($name, $uri, $size) = @$case;
    my $spills = $size > $MEMORY;
    $t->origin_reset;
    my $before = stats();

    # Nobody reads: the fetch goes on without them, into the store.
    my @h = map { $t->start_request('GET', $uri) } 1 .. $N;
    ok($t->wait_for(sub { stats()->{served} - $before->{served} == $N - 1 },
        timeout => 3, what => "$name: followers served"),
        "$name: the flight completed and its followers were served while no client read");

    # The fetch is complete (the origin sent everything at once after its
    # delay): the flight's file holds the body past the memory part.
    my $files;
    my $want = $spills ? [ $size - $MEMORY ] : [];
    $t->wait_for(sub { $files = temp_files(); "@{[ values %$files ]}" eq "@$want" },
                 timeout => 3, quiet => 1);
    is_deeply([ values %$files ], $want, $spills
        ? "$name: one file under singleflight_temp_path, the " . ($size - $MEMORY)
          . " bytes past singleflight_memory"
        : "$name: no file: the body fits in singleflight_memory")
        or diag(explain($files));
    is(stats()->{spilled} - $before->{spilled}, $spills ? 1 : 0,
       "$name: stats spilled + " . ($spills ? 1 : 0));

    my $res = [ map { $t->finish_request($_) } @h ];
    check_bodies($name, $uri, $res, $size);
    is($t->origin_hits->{total}, 1, "$name: 1 origin hit");

    ok($t->wait_for(sub { !%{ temp_files() } }, timeout => 3, what => "$name: no temp file"),
       "$name: the file is removed once the flight is over");

    my $after = stats();
    is($after->{not_shared} - $before->{not_shared}, 0, "$name: nothing not shared");
    is($after->{oversized} - $before->{oversized}, 0, "$name: not oversized");
    is($after->{bytes_shared} - $before->{bytes_shared}, ($N - 1) * $size,
        "$name: bytes_shared == " . ($N - 1) . " x $size");
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
    is($after->{served} - $before->{served}, $N - 1, "$name: followers served from the flight");
    is($after->{spilled} - $before->{spilled}, 1, "$name: the body went on in a file");
    ok($t->wait_for(sub { !%{ temp_files() } }, timeout => 3, what => "$name: no temp file"),
       "$name: the file is removed once the flight is over");
    is($after->{bytes_shared} - $before->{bytes_shared}, ($N - 1) * $SIZE,
        "$name: bytes_shared == " . ($N - 1) . " x $SIZE");
    is(join(' ', sort $t->sf_statuses($uri, $N)), join(' ', ('FOLLOWER') x ($N - 1), 'LEADER'),
        "$name: \$singleflight_status LEADER + FOLLOWER");
}

# ---------------------------------------------------- the first request on its own way

# singleflight_lone direct: the first request goes upstream itself and the
# others wait for its header; at its header it feeds the flight from its
# own upstream response (the tee), which spills past singleflight_memory
# as a fetch's does.  Its client reads nothing either: nginx's event pipe
# reads on into its own temporary file, and feeds the flight as it reads.

for my $case (
    [ 'its own way, spill, Content-Length', "/direct/cl?delay=300&size=$SIZE" ],
    [ 'its own way, spill, sendfile on, chunked', "/direct-sendfile/chunked?delay=300&size=$SIZE&chunked=1" ],
) {
    my ($name, $uri) = @$case;
    $t->origin_reset;
    my $before = stats();

    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => "$name: the first request at the origin");
    my @h = ($first, map { $t->start_request('GET', $uri) } 2 .. $N);
    $t->wait_waiters($N - 1, path => '/sf_stats');
    ok($t->wait_for(sub { stats()->{served} - $before->{served} == $N - 1 },
        timeout => 3, what => "$name: followers served"),
        "$name: the flight completed and its followers were served while no client read");

    my $files;
    my $want = [ $SIZE - $MEMORY ];
    $t->wait_for(sub { $files = temp_files(); "@{[ values %$files ]}" eq "@$want" },
                 timeout => 3, quiet => 1);
    is_deeply([ values %$files ], $want,
              "$name: one file under singleflight_temp_path, the " . ($SIZE - $MEMORY)
              . " bytes past singleflight_memory")
        or diag(explain($files));
    is(stats()->{spilled} - $before->{spilled}, 1, "$name: stats spilled + 1");

    my $res = [ map { $t->finish_request($_) } @h ];
    check_bodies($name, $uri, $res);
    is($t->origin_hits->{total}, 1, "$name: 1 origin hit");
    ok($t->wait_for(sub { !%{ temp_files() } }, timeout => 3, what => "$name: no temp file"),
       "$name: the file is removed once the flight is over");
    is(stats()->{bytes_shared} - $before->{bytes_shared}, ($N - 1) * $SIZE,
        "$name: bytes_shared == " . ($N - 1) . " x $SIZE");
    is(join(' ', sort $t->sf_statuses($uri, $N)), join(' ', ('FOLLOWER') x ($N - 1), 'LEADER'),
        "$name: \$singleflight_status LEADER + FOLLOWER");
}

$t->zone_baseline_ok('zone back to baseline', path => '/sf_stats');

done_testing;
