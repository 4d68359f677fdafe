#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Headers a location hides from its clients (proxy_hide_header) still say
# whom a response is for, as they do to proxy_cache, which reads the
# upstream's own: a hidden "Vary: X-Dev" still makes a variant per value,
# a hidden "Cache-Control: private" or Set-Cookie still keeps the
# response its leader's.  A hidden header that proxy_ignore_headers names
# too is ignored, as by proxy_cache ("proxy_hide_header Set-Cookie;
# proxy_ignore_headers Set-Cookie;" shares).  Each on both paths: the
# first request's own upstream request (the default) and a fetch
# (singleflight_lone fetch); each client's body against the same request
# through a server without the module.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $servers = '';
for my $i (0, 1) {
    my ($sf, $port) = $i == 0 ? ('sf', '%%PORT%%') : ('off', '%%PORT_1%%');
    my $stats = $i == 0 ? "location = /stats {\n            singleflight_stats;\n        }" : '';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:$port;
        singleflight $sf;
        add_header X-SF "[\$singleflight_status]" always;

        location /vary/ {
            proxy_hide_header Vary;
            proxy_pass http://%%ORIGIN%%;
        }

        location /cc/ {
            proxy_hide_header Cache-Control;
            proxy_pass http://%%ORIGIN%%;
        }

        location /sc/ {
            proxy_hide_header Set-Cookie;
            proxy_pass http://%%ORIGIN%%;
        }

        location /exp/ {
            proxy_hide_header Expires;
            proxy_pass http://%%ORIGIN%%;
        }

        # the origin answers with X-Accel-Redirect to a file
        location /xar/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /files/ {
            internal;
            alias %%TESTDIR%%/files/;
        }

        location /sci/ {
            proxy_hide_header Set-Cookie;
            proxy_ignore_headers Set-Cookie;
            proxy_pass http://%%ORIGIN%%;
        }

        $stats
    }
EOT
}

mkdir $t->path('files') or die "files: $!";
$t->write_file('files/f.txt', "the file\n");

my $n = 0;

sub norm { (my $b = $_[0] // '') =~ s/\bhit=\d+/hit=N/; $b }

for my $lone (qw(direct fetch)) {
    $t->stop;
    $t->write_config($t->config_template(<<"EOT" . $servers, log_singleflight => 1));
    singleflight_zone zone=sf:4m;
    singleflight_lone $lone;
EOT
    $t->start;

    # a hidden "Vary: X-Dev": the first request X-Dev a, the others b;
    # each gets the body of its own value, as without the module
    {
        my $path = '/vary/' . ++$n . '?delay=500&echo=1&hdr=Vary:X-Dev';
        $t->origin_reset;
        my $res = $t->flight(leader => [ 'GET', $path, headers => [ 'X-Dev' => 'a' ] ],
                             followers => [ map { [ 'GET', $path, headers => [ 'X-Dev' => 'b' ] ] } 1 .. 3 ]);
        my $off = $t->get($path, port => $t->port(1), headers => [ 'X-Dev' => 'b' ]);
        like(norm($off->{body}), qr/x-dev: b/i, "$lone, hidden Vary: without the module, b's own body");
        is(scalar(grep { norm($_->{body}) eq norm($off->{body}) } @$res[1 .. 3]), 3,
           "$lone, hidden Vary: the b requests get b's body, not a's")
            or diag(explain([ map { $_->{body} } @$res ]));
        is(($res->[0]{body} // '') =~ /x-dev: a/i ? 1 : 0, 1, "$lone, hidden Vary: a gets a's");
    }

    # a hidden "Cache-Control: private", a hidden Set-Cookie: the
    # leader's alone; the others go upstream on their own
    for my $c ([ 'cc', 'hdr=Cache-Control:private' ], [ 'sc', 'hdr=Set-Cookie:id%3D1' ]) {
        my ($where, $q) = @$c;
        my $path = "/$where/" . ++$n . "?delay=300&fixed=1&$q";
        $t->origin_reset;
        my $res = $t->flight(leader => [ 'GET', $path ], followers => [ ([ 'GET', $path ]) x 3 ]);
        is(join(' ', map { $_->{headers}{'x-sf'} // '' } @$res), '[LEADER] ' . join(' ', ('[NOT_SHARED]') x 3),
           "$lone, hidden $where: the leader's alone");
        is($t->origin_uri_hits($path), 4, "$lone, hidden $where: an origin request each");
    }

    # an Expires gone by, hidden: no fresh response for requests with a
    # cookie ("public" alone would be)
    {
        my $path = '/exp/' . ++$n . '?delay=300&fixed=1&hdr=Cache-Control:public'
                 . '&hdr=Expires:Thu,%2001%20Jan%202015%2000:00:00%20GMT';
        $t->origin_reset;
        my $res = $t->flight(leader => [ 'GET', $path ],
                             followers => [ ([ 'GET', $path, headers => [ Cookie => 'a=1' ] ]) x 3 ]);
        is(join(' ', map { $_->{headers}{'x-sf'} // '' } @$res), '[LEADER] ' . join(' ', ('[NOT_SHARED]') x 3),
           "$lone, hidden Expires gone by: not for requests with a cookie");
    }

    # the origin's X-Accel-Redirect to a file: what its own response hid
    # (X-Accel-Expires, hidden by default) says nothing of the file's
    {
        my $path = '/xar/' . ++$n . '?delay=300&hdr=X-Accel-Redirect:/files/f.txt&hdr=X-Accel-Expires:60';
        $t->origin_reset;
        my $res = $t->flight(leader => [ 'GET', $path ],
                             followers => [ ([ 'GET', $path, headers => [ Cookie => 'a=1' ] ]) x 3 ]);
        is(join(' ', map { ($_->{status} // 0) . ($_->{body} // '') } @$res), join(' ', ("200the file\n") x 4),
           "$lone, X-Accel-Redirect: the file for each");
        unlike(join(' ', map { $_->{headers}{'x-sf'} // '' } @$res[1 .. 3]), qr/FOLLOWER/,
               "$lone, X-Accel-Redirect: the file, without a freshness of its own, not for requests with a cookie");
    }

    # hidden and ignored, as proxy_cache ignores it: shared
    {
        my $path = '/sci/' . ++$n . '?delay=300&fixed=1&hdr=Set-Cookie:id%3D1';
        $t->origin_reset;
        my $res = $t->flight(leader => [ 'GET', $path ], followers => [ ([ 'GET', $path ]) x 3 ]);
        is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 4, "$lone, hidden and ignored Set-Cookie: answered");
        is($t->origin_uri_hits($path), 1, "$lone, hidden and ignored Set-Cookie: 1 origin request");
    }
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing;
