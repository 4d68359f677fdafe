#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_temp_path that cannot be written: a file where its
# directory should be, or a disk with no room (a 1 MB tmpfs, where this
# machine lets us mount one); and one on a file system without
# fallocate() (ext2, where a loop mount works).  A flight whose body goes past
# singleflight_memory cannot spill: it keeps the rest in the zone, one
# [warn] line says so, and every reader completes as it does with the
# module off (its proxy_temp_path on a good disk); one of known length
# that the zone cannot hold either is not shared at all.  Bodies of
# unknown length and of known length, through the same nginx with
# "singleflight sf" (port 0) and "singleflight off" (port 1).

use strict;
use warnings;

use Test::More;
use File::Path qw(rmtree make_path);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $small = $t->path('small');
mkdir $small;
my $mounted = system("mount -t tmpfs -o size=1m tmpfs $small 2>/dev/null") == 0;
END { system("umount -l $small 2>/dev/null") if $mounted }

# 3 MB: room for one 2 MB body, not two
my $mid = $t->path('mid');
mkdir $mid;
my $mid_mounted = system("mount -t tmpfs -o size=3m tmpfs $mid 2>/dev/null") == 0;
END { system("umount -l $mid 2>/dev/null") if $mid_mounted }

# an ext2 file system, which has no fallocate(): glibc's posix_fallocate()
# would write the whole length there, in the worker, at once
my $ext2 = $t->path('ext2');
mkdir $ext2;
my $ext2_mounted = system("dd if=/dev/zero of=$ext2.img bs=1M count=48 2>/dev/null"
                          . " && mke2fs -q -t ext2 $ext2.img 2>/dev/null"
                          . " && mount -o loop $ext2.img $ext2 2>/dev/null") == 0;
END { system("umount -l $ext2 2>/dev/null") if $ext2_mounted }

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    my $tight = $i == 0 ? 'tight' : 'off';
    my $wee = $i == 0 ? 'wee' : 'off';
    my $mini = $i == 0 ? 'mini' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        singleflight_memory 64k;
        add_header X-SF \$singleflight_status always;

        location / {
            singleflight_temp_path %%TESTDIR%%/sftemp 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /full/ {
            singleflight_temp_path %%TESTDIR%%/small 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /tight/ {
            singleflight $tight;
            singleflight_temp_path %%TESTDIR%%/small 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /tightfetch/ {
            singleflight $tight;
            singleflight_lone fetch;
            singleflight_temp_path %%TESTDIR%%/small 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mini/ {
            singleflight $mini;
            singleflight_temp_path %%TESTDIR%%/small 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /wee/ {
            singleflight $wee;
            singleflight_memory 256k;
            singleflight_temp_path %%TESTDIR%%/small 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /race/ {
            singleflight $tight;
            singleflight_temp_path %%TESTDIR%%/mid 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /ext2/ {
            singleflight_temp_path %%TESTDIR%%/ext2 1 2;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight off;
            singleflight_stats;
        }
    }
EOT
}

$t->write_config($t->config_template(<<"EOT"));
    singleflight_zone zone=sf:16m;
    singleflight_zone zone=tight:1m;
    singleflight_zone zone=wee:256k;
    singleflight_zone zone=mini:64k;

$servers
EOT

# a file left by an nginx killed as a whole, and files of others in the
# same path by mistake (a cache's): only the first goes at start
$t->write_file($_, "x\n") or die "$_: $!"
    for map { File::Path::make_path($t->path($_ =~ s{/[^/]+$}{}r)); $_ }
        'sftemp/1/00/0000000001', 'sftemp/c/d3/3e5f0b4a1c2d3e4f5a6b7c8d9e0f1d3c', 'sftemp/notes.txt';

$t->start;

ok(!-e $t->path('sftemp/1/00/0000000001'), 'at start: a stale temporary file is removed');
is(scalar(grep { -e $t->path($_) } 'sftemp/c/d3/3e5f0b4a1c2d3e4f5a6b7c8d9e0f1d3c', 'sftemp/notes.txt'),
   2, 'at start: the files of others in the path are kept');

my (undef, $z0) = $t->wait_zone(sub { 1 });
my $base = $z0->{nospill} // 0;

# a herd of 3 on port 0, one request on port 1, all at once
sub herd_vs_plain {
    my ($path, $size, $what) = @_;
    my @on = map { $t->start_request('GET', $path, timeout => 20) } 1 .. 3;
    my $off = $t->start_request('GET', $path, port => $t->port(1), timeout => 20);
    my @res = map { $t->finish_request($_) } @on, $off;
    my $plain = pop @res;
    is($plain->{status}, 200, "$what, module off: 200");
    is(length($plain->{body} // ''), $size, "$what, module off: whole body");
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == $size
                     && $_->{complete} } @res),
       3, "$what, module on: 3 whole bodies");
    return \@res;
}

# ------------------------------------------------------------ no directory

rmtree($t->path('sftemp'));
$t->write_file('sftemp', "a file where the directory should be\n");

my $off = $t->log_offset;
herd_vs_plain('/a?size=1000000&fail=slowbody&pieces=4&delay=150', 1000000,
              'unwritable, known length');
herd_vs_plain('/b?size=1000000&fail=slowbody&pieces=4&delay=150&chunked=1', 1000000,
              'unwritable, chunked');
ok($t->log_count(qr/\[warn\].*keeps its body in zone "sf" past singleflight_memory/, $off) >= 1,
   'unwritable: a [warn] line says the body stays in the zone');
ok($t->origin_uri_hits('/a?size=1000000&fail=slowbody&pieces=4&delay=150') <= 2,
   'unwritable: still collapsed');

my (undef, $z) = $t->wait_zone(sub { $_[0]{in_flight} == 0 });
ok(($z->{nospill} // 0) - $base >= 2, 'stats: nospill counts them');

# ------------------------------------------------------------ disk full

SKIP: {
    skip 'cannot mount a tmpfs here', 4 unless $mounted;
    herd_vs_plain('/full/c?size=4000000&fail=slowbody&pieces=4&delay=150', 4000000,
                  'disk full, known length');
}

# A body of known length larger than both the zone's free memory and the
# disk's room is not shared (each reader goes its own way), rather than
# cut for its followers where the zone runs out.

SKIP: {
    skip 'cannot mount a tmpfs here', 12 unless $mounted;
    my $off = $t->log_offset;
    for my $where (qw(tight tightfetch)) {
        my $path = "/$where/d?size=3000000&fail=slowbody&pieces=4&delay=150";
        my $res = herd_vs_plain($path, 3000000, "$where: disk full, zone too small");
        is(join(' ', sort map { $_->{headers}{'x-sf'} // '-' } @$res),
           'LEADER NO_MEMORY NO_MEMORY',
           "$where: disk full, zone too small: the followers NO_MEMORY");
        is($t->origin_uri_hits($path), 4, "$where: disk full, zone too small: each on its own");
    }
    $t->zone_baseline_ok('disk full, zone too small: the zone back to its baseline',
                         zone => 'tight');
    # at most one a minute for the zone
    is($t->log_count(qr/\[warn\].*flight \d+ is not shared: its 3000000 bytes have no room in zone "tight" nor on the disk of its temporary files/, $off), 1,
       'disk full, zone too small: a [warn] line says why it is not shared');
}

# A body within singleflight_memory but larger than what the zone's free
# memory holds, on a full disk: not shared either, rather than cut for
# its followers where the zone runs out (its room on the disk is checked
# as a larger body's is).

SKIP: {
    skip 'cannot mount a tmpfs here', 9 unless $mounted;
    system("dd if=/dev/zero of=$small/fill bs=64k 2>/dev/null");
    my $path = '/wee/g?size=200000&fail=slowbody&pieces=4&delay=150';
    my $res = herd_vs_plain($path, 200000, 'wee: disk full, within memory=, zone too small');
    is(join(' ', sort map { $_->{headers}{'x-sf'} // '-' } @$res),
       'LEADER NO_MEMORY NO_MEMORY',
       'wee: disk full, within memory=, zone too small: the followers NO_MEMORY');
    # a small body in a small zone: the zone holds it, the disk is not asked
    $path = '/mini/h?size=2000&delay=300';
    $res = herd_vs_plain($path, 2000, 'mini: disk full, a small body');
    is(join(' ', sort map { $_->{headers}{'x-sf'} // '-' } @$res),
       'FOLLOWER FOLLOWER LEADER', 'mini: disk full, a small body: collapsed');
    unlink "$small/fill";
    $t->zone_baseline_ok('wee: the zone back to its baseline', zone => 'wee');
}

# Two bodies of 2 MB, larger than the zone's free memory, on a disk with
# room for one: a flight holds its room from its header on, so the
# second, whose header comes 100 ms after the first one's and 100 ms
# before its body, finds none left and is not shared rather than cut
# where the disk fills.  (Two room checks in the same instant can both
# fail, as fallocate() takes its pages one by one: then neither flight is
# shared.)  The file of a flight whose room was checked has a temporary
# file's own name (ten digits, which the start sweep knows).

SKIP: {
    skip 'cannot mount a tmpfs here', 11 unless $mid_mounted;
    my @paths = map { "/race/$_->[0]?size=2000000&fail=slowbody&pieces=10&delay=$_->[1]" }
                ['e', 200], ['f', 300];
    my @on = map { my $p = $_; map { $t->start_request('GET', $p, timeout => 20) } 1 .. 4 }
             @paths;
    my @names;
    $t->wait_for(sub {
        my $f = `find $mid -type f`;
        @names = map { s{.*/}{}r } split /\n/, $f;
        @names > 0;
    }, what => 'a temporary file');
    my @res = map { $t->finish_request($_) } @on;
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == 2000000
                     && $_->{complete} } @res),
       8, 'two flights, room on the disk for one: 8 whole bodies');
    ok(@names && !grep({ !/^\d{10}$/ } @names),
       'the spilled file has a temporary file\'s name')
        or diag("@names");
    is(join(' ', sort map { $_->{headers}{'x-sf'} // '-' } @res[4 .. 7]),
       'LEADER NO_MEMORY NO_MEMORY NO_MEMORY',
       'two flights, room for one: the second one\'s followers NO_MEMORY');
    is(join(' ', map { $t->origin_uri_hits($_) } @paths), '1 4',
       'two flights, room for one: the first shared, the second each on its own');
    for my $p (@paths) {
        my $plain = $t->get($p, port => $t->port(1), timeout => 20);
        is(length($plain->{body} // ''), 2000000, "$p, module off: whole body");
    }
    my (undef, $z) = $t->wait_zone(sub { $_[0]{in_flight} == 0 }, zone => 'tight');
    is($z->{in_flight}, 0, 'two flights, room for one: both over');
    $t->zone_baseline_ok('two flights, room for one: the zone back to its baseline',
                         zone => 'tight');
    is(`find $mid -type f | wc -l` + 0, 0, 'two flights, room for one: no file left');
}

# ------------------------------------------------------------ no fallocate()

# A body of 30 MB spills to a file system without fallocate(): its room
# is not reserved, rather than written out in full at once by the worker
# (glibc's stand-in for it); the file holds what came.
SKIP: {
    skip 'cannot mount an ext2 file system here', 2 unless $ext2_mounted;
    my $path = '/ext2/big?size=30000000&pace=200000:1500&delay=100';
    my $s0 = $t->zone_stats;
    my @h = map { $t->start_request('GET', $path, timeout => 30) } 1 .. 2;
    my ($spilled) = $t->wait_zone(sub { ($_[0]{spilled} // 0) > ($s0->{spilled} // 0) });
    my ($kb) = `du -sk $ext2` =~ /^(\d+)/;
    ok($spilled && defined $kb && $kb < 8000,
       'no fallocate(): the file holds what came, not 30 MB of zeros')
        or diag("du: " . ($kb // '?') . " KB");
    $t->abort_request($_) for @h;
    my (undef, $z) = $t->wait_zone(sub { $_[0]{in_flight} == 0 });
    is($z->{in_flight}, 0, 'no fallocate(): the flight ends with its readers');
}

$t->zone_baseline_ok('the zone back to its baseline');

# the test directory goes at done_testing: the mounts first
$t->stop;
$mounted = 0 if $mounted && system("umount -l $small") == 0;
$ext2_mounted = 0 if $ext2_mounted && system("umount -l $ext2") == 0;
$mid_mounted = 0 if $mid_mounted && system("umount -l $mid") == 0;

done_testing;
