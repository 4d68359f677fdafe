#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Binary upgrade during flights: USR2 starts a new master (and its own new
# zone), WINCH retires the old workers gracefully, QUIT ends the old
# master.  Every request of a herd in flight across the upgrade is
# answered, and collapsing works in the new generation.

use strict;
use warnings;

use Test::More;
use File::Find ();
use POSIX qw(WNOHANG);

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# the new master is exec'd with only the environment "env" keeps: keep
# the sanitizer runtime for make test-asan
$t->write_config($t->config_template(<<'EOT',
    singleflight_zone zone=sf:1m;

    server {
        # a small send buffer: a client that reads nothing holds its place
        listen 127.0.0.1:%%PORT%% sndbuf=64k;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        # a flight past its memory streams from a temporary file
        location /spill/ {
            singleflight sf;
            singleflight_memory 1m;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
    main => "env LD_PRELOAD;\nenv ASAN_OPTIONS;\nenv UBSAN_OPTIONS;"));

$t->start;

my $old = $t->master_pid;

# A flight that spills to its temporary file and outlives the upgrade, and
# a follower that reads nothing until the new master has started: it opens
# the file then.  The new master must not have deleted it.
my $spill = '/spill/f?size=4000000&fail=slowbody&pieces=8&delay=300';
my $spill_leader = $t->start_request('GET', $spill, timeout => 30);
$t->wait_for(sub { $t->origin_uri_hits($spill) >= 1 },
             what => 'the spilling flight reached the origin');
my $slow = $t->start_request('GET', $spill, timeout => 30, rcvbuf => 65536);
ok($t->wait_for(sub {
    my @f;
    File::Find::find(sub { push @f, $_ if -f $_ }, $t->path('singleflight_temp'));
    @f;
}, what => 'the temporary file'), 'the flight spilled to its file');

# a flight of 50 that outlives the upgrade
my $uri = '/up?delay=1500&size=5000';
my @h = map { $t->start_request('GET', $uri, timeout => 15) } 1 .. 50;

$t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 },
             what => 'the leader reached the origin');

# USR2: a new master from the same binary, beside the old one
$t->signal('USR2');

ok($t->wait_for(sub { -e $t->path('nginx.pid.oldbin')
                      && -e $t->path('nginx.pid')
                      && $t->master_pid != $old },
                what => 'the new master'),
   'USR2: a new master started');

my $new = $t->master_pid;

# WINCH: the old workers stop taking connections and finish what they have
kill 'WINCH', $old;

my @res = map { $t->finish_request($_) } @h;

# the old generation's flight, its slow follower reading only now
my $sl = $t->finish_request($spill_leader);
my $sf = $t->finish_request($slow);
is(length($sl->{body} // ''), 4000000, 'spilled flight: its leader complete');
is(length($sf->{body} // ''), 4000000,
   'spilled flight: a follower reading its file after USR2 complete');

is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @res), 50,
   'the herd in flight across the upgrade: 50 complete answers');
my ($hit) = ($res[0]{body} // '') =~ /^hit=(\d+) /;
is(scalar(grep { $_->{body} eq SFTest::origin_body($hit // 0, $uri, 5000) } @res), 50,
   'all with the one origin response');
is($t->origin_hits->{uris}{$uri}, 1, 'one origin request for it');

# the new generation collapses on its own zone
my $uri2 = '/up2?delay=300';
my $res = $t->herd(n => 50, path => $uri2);
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 50,
   'new generation: 50 answers');
is($t->origin_hits->{uris}{$uri2}, 1, 'new generation: collapsed');

# QUIT the old master
kill 'QUIT', $old;
# the harness adopts daemonized masters (a subreaper): reap the old one
ok($t->wait_for(sub { waitpid($old, WNOHANG) == $old || !kill 0, $old },
                what => 'the old master exits'),
   'the old master exited');

my $z;
ok($t->wait_for(sub {
    $z = $t->stats('/stats?diagnostics=1')->{zones}{sf};
    $z->{in_flight} == 0 && $z->{pages_used} == $z->{pages_baseline};
}, what => 'baseline'), 'new zone back to baseline');

done_testing;
