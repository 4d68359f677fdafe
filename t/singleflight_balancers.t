#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_balancers: upstream balancing with the module is nginx's
# own.  nginx's upstream_max_conns.t and upstream_least_conn.t send
# identical requests at once and count which server answered each: with
# the module on, one fetch answers them all, which is what collapsing is
# for (tools/nginx-tests.intended lists those tests).  Here the same kind
# of requests, made distinct, go to the same servers with the module on
# as with it off (max_conns, least_conn, backup, weight, hash), in one
# worker as nginx-tests runs; made identical, they cost one origin request.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;
$t->start_origin;

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF \$singleflight_status always;

        location /some/ { proxy_pass http://u_some; }
        location /lc/ { proxy_pass http://u_lc; }
        location /backup/ { proxy_pass http://u_backup; }
        location /weight/ { proxy_pass http://u_weight; }
        location /hash/ { proxy_pass http://u_hash; }
    }
EOT
}

$t->write_config($t->config_template(<<"EOT", workers => 1));
    singleflight_zone zone=sf:1m;

    upstream u_some {
        server %%ORIGIN_0%% max_conns=1;
        server %%ORIGIN_1%%;
    }

    upstream u_lc {
        least_conn;
        server %%ORIGIN_0%%;
        server %%ORIGIN_1%%;
    }

    upstream u_backup {
        server %%ORIGIN_0%% max_conns=2;
        server %%ORIGIN_1%% backup;
    }

    upstream u_weight {
        server %%ORIGIN_0%% max_conns=1;
        server %%ORIGIN_1%% weight=2;
    }

    upstream u_hash {
        hash \$arg_h;
        server %%ORIGIN_0%% max_conns=1;
        server %%ORIGIN_1%%;
    }

$servers
EOT
$t->start;

# n requests at once to port $i, each made distinct by n=; the hits each
# origin got for them, as "o0:N o1:M"
sub spread {
    my ($i, $path, $n) = @_;
    $t->origin_reset(0);
    $t->origin_reset(1);
    my @h = map { $t->start_request('GET', "$path&n=$_", port => $t->port($i)) } 1 .. $n;
    my @res = map { $t->finish_request($_) } @h;
    my $ok = grep { ($_->{status} // 0) == 200 } @res;
    return "$ok answers, o0:" . $t->origin_hits(0)->{total}
        . ' o1:' . $t->origin_hits(1)->{total};
}

for my $case (['/some/x?delay=300', 4], ['/lc/x?delay=300', 4],
              ['/backup/x?delay=300', 6], ['/weight/x?delay=300', 4],
              ['/hash/x?delay=300&h=1', 4])
{
    my ($path, $n) = @$case;
    my $off = spread(1, $path, $n);
    my $on = spread(0, $path, $n);
    is($on, $off, "$path, $n distinct requests: the servers of plain nginx ($off)");
}

# the same requests made identical: one fetch for all of them
for my $path ('/some/y?delay=300', '/lc/y?delay=300') {
    $t->origin_reset(0);
    $t->origin_reset(1);
    my @h = map { $t->start_request('GET', $path) } 1 .. 4;
    my @res = map { $t->finish_request($_) } @h;
    is(scalar(grep { ($_->{status} // 0) == 200 } @res), 4, "$path identical: 4 answers");
    is($t->origin_hits(0)->{total} + $t->origin_hits(1)->{total}, 1,
       "$path identical: one origin request");
}

done_testing;
