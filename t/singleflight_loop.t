#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# CDN-Loop: a flight's fetch carries "CDN-Loop: singleflight-<hex token>"
# (RFC 8586) towards the origin, and a request that comes back to the same
# nginx with its token is not collapsed ($singleflight_status LOOP): nginx
# proxying to itself never waits for the flight it is the fetch of.

use strict;
use warnings;

use Test::More;
use Time::HiRes ();

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfl '$remote_port $singleflight_status $http_x_hop $request_uri';
    access_log %%TESTDIR%%/sf.log sfl;

    singleflight_zone zone=sf:1m;

    # the first pass goes to this nginx again, the second to the origin
    map $http_x_hop $next_hop {
        ""       127.0.0.1:%%PORT%%;
        default  127.0.0.1:%%PORT_1%%;
    }

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_timeout 3s;
            proxy_set_header Host $host;
            proxy_set_header X-Hop 1;
            proxy_pass http://$next_hop;
        }
    }

    # what the origin is sent, in X-Seen-Loop
    server {
        listen 127.0.0.1:%%PORT_1%%;
        access_log off;

        location / {
            proxy_pass http://%%ORIGIN%%;
            add_header X-Seen-Loop "[$http_cdn_loop]" always;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_2%%;

        location / {
            singleflight sf;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ the header

my $uri = '/mark?delay=300';
my $res = $t->herd(n => 5, path => $uri, port => $t->port(2));
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 5, 'mark: 5 complete responses');
is($t->origin_uri_hits($uri), 1, 'mark: one origin request');
my %seen = map { ($_->{headers}{'x-seen-loop'} // 'none') => 1 } @$res;
is(scalar(keys %seen), 1, 'mark: the one fetch');
like((keys %seen)[0], qr/^\[singleflight-[0-9a-f]+\]$/, 'mark: it carried CDN-Loop: singleflight-<hex>');

my $r = $t->get('/mark-alone?delay=10', port => $t->port(2), headers => [ 'CDN-Loop' => 'other-cdn' ]);
like($r->{headers}{'x-seen-loop'} // '', qr/\bother-cdn\b/, "mark: a client's own CDN-Loop is kept");

# ------------------------------------------------------------ a loop

my $t0 = Time::HiRes::time();
$uri = '/loop?delay=300';
$res = $t->herd(n => 4, path => $uri, timeout => 8);
my $took = Time::HiRes::time() - $t0;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 4, 'loop: 4 complete responses');
cmp_ok($took, '<', 1.5, sprintf('loop: answered without waiting for itself (%.2f s)', $took));
is($t->origin_uri_hits($uri), 1, 'loop: one origin request');

my @log;
$t->wait_for(sub {
    @log = grep { $_->[3] eq $uri } map { [ split ' ' ] } split /\n/, $t->read_file('sf.log');
    @log >= 5;
}, what => '5 access log lines');
my @second = map { $_->[1] } grep { $_->[2] eq '1' } @log;
my @first = sort map { $_->[1] } grep { $_->[2] eq '-' } @log;
is("@second", 'LOOP', 'loop: the second pass is LOOP');
is("@first", 'FOLLOWER FOLLOWER FOLLOWER LEADER', 'loop: the clients share one flight');

# ------------------------------------------------------------ a name

my $n = SFTest->new;
my $origin = $t->origin->addr;
$n->write_config($n->config_template(<<"EOT"));
    log_format sfl '\$singleflight_status \$request_uri';
    access_log %%TESTDIR%%/sf.log sfl;

    singleflight_zone zone=sf:1m;
    singleflight_loop_name sf-edge;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_1%%;
        access_log off;

        location / {
            proxy_pass http://$origin;
            add_header X-Seen-Loop "[\$http_cdn_loop]" always;
        }
    }
EOT
$n->start;

sub named {
    my ($uri, $loop) = @_;
    my $res = $n->herd(n => 3, path => $uri, headers => [ 'CDN-Loop' => $loop ]);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 3,
        "name: $loop: 3 complete responses");
    my @l = $n->wait_log_records('sf.log', [qw(sf uri)], 3, uri => $uri);
    return ($res, join ' ', sort map { $_->{sf} } @l);
}

$uri = '/named-other?delay=300';
($res, my $st) = named($uri, 'sf-edge-2, other');
is($st, 'FOLLOWER FOLLOWER LEADER', 'name: a name that only contains this one is collapsed');
is($t->origin_uri_hits($uri), 1, 'name: one origin request');
like($res->[0]{headers}{'x-seen-loop'} // '', qr/^\[sf-edge-2, other\b/,
    'name: the fetch carried the client\'s CDN-Loop');
$r = $n->get('/named-alone?delay=10');
is($r->{headers}{'x-seen-loop'} // '', '[sf-edge]', 'name: the fetch carried singleflight_loop_name');

$uri = '/named-self?delay=300';
($res, $st) = named($uri, 'other, SF-Edge; v=1');
is($st, 'LOOP LOOP LOOP', 'name: this name as an element, with a parameter, is LOOP');
is($t->origin_uri_hits($uri), 3, 'name: each went on its own');

done_testing;
