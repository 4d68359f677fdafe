#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# An origin's X-Accel-Limit-Rate paces every reader of its response, as
# nginx paces each request that reads it without the module: the
# followers, and the leader whose fetch is a subrequest
# (singleflight_lone fetch).  With proxy_ignore_headers
# X-Accel-Limit-Rate nobody is paced, as without the module.  Herds of 3
# through "singleflight sf" (port 0), one request through "singleflight
# off" (port 1), all at once.

use strict;
use warnings;

use Test::More;

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF \$singleflight_status always;

        location /d/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /f/ {
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
        }

        location /i/ {
            proxy_ignore_headers X-Accel-Limit-Rate;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
}

$t->write_config($t->config_template(<<"EOT"));
    singleflight_zone zone=sf:4m;

$servers
EOT

$t->start;

# 30000 bytes at 5000 bytes/s: 5 s or more paced (nginx lets the first
# second's worth go at once), well under that when not
my $q = 'delay=300&size=30000&hdr=X-Accel-Limit-Rate:5000';
my %h;
for my $loc (qw(d f i)) {
    $h{$loc}{on} = [ map { $t->start_request('GET', "/$loc/r?$q", timeout => 30) } 1 .. 3 ];
    $h{$loc}{off} = $t->start_request('GET', "/$loc/r?$q", port => $t->port(1), timeout => 30);
}

# driven together: each one's time is when it ended
$t->finish_all([ map { (@{ $h{$_}{on} }, $h{$_}{off}) } keys %h ]);

for my $loc (qw(d f i)) {
    my @on = map { $_->{res} } @{ $h{$loc}{on} };
    my $off = $h{$loc}{off}{res};
    my $paced = $loc ne 'i';
    my $what = "/$loc/" . ($paced ? '' : ', ignored');

    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == 30000
                     && $_->{complete} } @on, $off),
       4, "$what: 4 whole bodies");
    is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @on), 2,
       "$what: 2 followers");
    is($t->origin_uri_hits("/$loc/r?$q"), 2, "$what: one origin request with the module, one without");

    if ($paced) {
        is(scalar(grep { $_->{time} >= 3.5 } @on, $off), 4,
           "$what: every client paced, with the module and without")
            or diag(join ' ', map { sprintf '%.2f', $_->{time} } @on, $off);
    } else {
        is(scalar(grep { $_->{time} < 3.5 } @on, $off), 4,
           "$what: nobody paced, with the module and without")
            or diag(join ' ', map { sprintf '%.2f', $_->{time} } @on, $off);
    }
}

done_testing;
