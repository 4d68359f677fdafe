#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_trailers: the origin's trailers, where nginx passes them on
# (grpc_pass; proxy_pass_trailers, nginx 1.29 and later), reach every
# client as without the module: a lone request and each of a herd's, the
# origin's first, then the location's own (add_trailer), after the last
# chunk; and the origin's Trailer header with them.  Module on against
# off, in one nginx.  A body resumed by Range has none of the origin's
# (those of its rest are not the whole response's); a zone with no room
# for them sends the body without them, and says so in the error log.
# HTTP/2 clients (nghttp, package nghttp2-client; skipped without it): a
# herd of streams on one connection, each with the trailers of a stream
# without the module.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my ($major, $minor) = `@{[ $t->nginx_binary ]} -v 2>&1` =~ m{nginx/(\d+)\.(\d+)};
my $h2proxy = defined $minor && ($major > 1 || $minor >= 29);

# proxy_http_version 2 and proxy_pass_trailers, where nginx has them
my $proxy = !$h2proxy ? '' : <<'EOT';
        location /h/ {
            singleflight sf;
            proxy_http_version 2;
            proxy_pass_trailers on;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        location /hp/ {
            proxy_http_version 2;
            proxy_pass_trailers on;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }
EOT

# a zone with no room for large trailers (its bodies go to the file)
my $big = !$h2proxy ? '' : join('', map { "        add_trailer X-Big$_ " . ('x' x 4000) . ";\n" } 0 .. 9);
my $small = !$h2proxy ? '' : <<"EOT";
        location /z/ {
            singleflight small;
            singleflight_lone fetch;
            proxy_buffer_size 64k;
            proxy_buffers 4 64k;
            proxy_busy_buffers_size 64k;
            proxy_pass_trailers on;
            proxy_http_version 1.1;
            proxy_pass http://127.0.0.1:%%PORT_2%%;
        }

        location /r/ {
            singleflight sf;
            singleflight_lone fetch;
            proxy_http_version 2;
            proxy_pass_trailers on;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }
EOT
my $small_origin = !$h2proxy ? '' : <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_2%%;
        large_client_header_buffers 4 64k;
        add_trailer X-Small s;
$big
        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->write_config($t->config_template(<<"EOT"));
    singleflight_zone zone=sf:1m;
    singleflight_zone zone=small:64k memory=1k;

    server {
        listen 127.0.0.1:%%PORT%%;
        add_trailer X-Own bar; # its own, and the client's response chunked

        # the module's default under grpc_pass: every request in a flight
        location /g/ {
            singleflight sf;
            grpc_pass grpc://127.0.0.1:%%PORT_1%%;
        }

        location /gp/ {
            grpc_pass grpc://127.0.0.1:%%PORT_1%%;
        }

        location = /stats {
            singleflight off;
            singleflight_stats;
        }
$proxy
$small
    }

    # HTTP/2 clients (h2c), each stream's trailers a HEADERS frame of its own
    server {
        listen 127.0.0.1:%%PORT_3%% http2;
        add_trailer X-Own bar;

        location /g/ {
            singleflight sf;
            grpc_pass grpc://127.0.0.1:%%PORT_1%%;
        }

        location /gp/ {
            grpc_pass grpc://127.0.0.1:%%PORT_1%%;
        }
    }

    # an HTTP/2 origin with a trailer: an h2c server before the test origin
    server {
        listen 127.0.0.1:%%PORT_1%% http2;
        add_header Trailer "X-Trailer";
        add_trailer X-Trailer foo;
        add_trailer X-Status \$status;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }
$small_origin
EOT
$t->start;

for my $p ([ 'g', 'gp', 'grpc_pass' ], $h2proxy ? [ 'h', 'hp', 'proxy_pass_trailers' ] : ()) {
    my ($sf, $plain, $name) = @$p;

    # a lone request
    my $uri = "/$sf/lone?size=3000";
    my ($one) = @{ $t->herd(path => $uri, n => 1) };
    my ($ref) = @{ $t->herd(path => "/$plain/lone?size=3000", n => 1) };
    like($ref->{trailers} // '', qr/^X-Trailer: foo\r\nX-Status: 200\r\nX-Own: bar\r\n\z/i,
       "$name, module off: the origin's trailer, then its own");
    is($one->{trailers}, $ref->{trailers}, "$name: a lone request gets both, as without the module");
    is($one->{body}, SFTest::origin_body($one->{headers}{'x-hit'} // 0, $uri, 3000),
       "$name: a lone request's body");
    is($one->{headers}{trailer}, 'X-Trailer', "$name: a lone request's Trailer header");

    # a herd
    $uri = "/$sf/herd?size=3000&delay=600";
    my $res = $t->herd(path => $uri, n => 8);
    my $pres = $t->herd(path => "/$plain/herd?size=3000&delay=600", n => 8);
    is($t->origin_uri_hits($uri), 1, "$name: a herd of 8 makes one origin request");
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 8, "$name: 8 answers");
    is(scalar(grep { ($_->{trailers} // '') eq $pres->[0]{trailers} } @$res), 8,
       "$name: each of the herd gets the trailers of a request without the module")
        or diag(explain([ map { $_->{trailers} } @$res ]));
    is(scalar(grep { ($_->{headers}{trailer} // '') eq 'X-Trailer' } @$res), 8,
       "$name: and the origin's Trailer header");
    my $hit = $res->[0]{headers}{'x-hit'} // 0;
    is(scalar(grep { $_->{body} eq SFTest::origin_body($hit, $uri, 3000) } @$res), 8,
       "$name: and the body");
}

# HTTP/2 clients: 8 streams on one connection, from nghttp's frame log
# per stream: its status, its DATA bytes, and the fields received after
# its DATA (its trailers), in their order
my ($nghttp) = grep { -x } map { "$_/nghttp" } split /:/, $ENV{PATH} // '/usr/bin';

sub h2_streams {
    my ($uri) = @_;
    open(my $fh, '-|', 'timeout', 20, $nghttp, '-nv', '-m', 8,
         'http://127.0.0.1:' . $t->port(3) . $uri) or die "nghttp: $!";
    my $out = do { local $/; <$fh> } // '';
    close($fh);
    my %st;
    for (split /\n/, $out) {
        if (/recv \(stream_id=(\d+)\) ([^:\s][^:]*|:status): (.*)$/) {
            if ($st{$1}{data}) { $st{$1}{trailers} .= "$2: $3\n" } else { $st{$1}{$2} = $3 }
        } elsif (/recv DATA frame <length=(\d+), flags=0x[0-9a-f]+, stream_id=(\d+)>/) {
            $st{$2}{data} += $1;
        }
    }
    return [ values %st ];
}

SKIP: {
    skip 'nghttp not found (package nghttp2-client)', 4 unless $nghttp;

    my $uri = '/g/h2?size=3000&delay=600';
    my $res = h2_streams($uri);
    my $ref = h2_streams('/gp/h2?size=3000&delay=600');
    is(scalar(grep { ($_->{':status'} // '') eq '200' && ($_->{data} // 0) == 3000 } @$ref), 8,
       'HTTP/2, module off: 8 streams, 200 with the whole body')
        or diag(explain($ref));
    is($ref->[0]{trailers}, "x-trailer: foo\nx-status: 200\nx-own: bar\n",
       "HTTP/2, module off: the origin's trailers, then its own");
    is(scalar(grep { ($_->{':status'} // '') eq '200' && ($_->{data} // 0) == 3000
                     && ($_->{trailers} // '') eq $ref->[0]{trailers} } @$res), 8,
       'HTTP/2: each of 8 streams gets the body and the trailers of a stream without the module')
        or diag(explain($res));
    is($t->origin_uri_hits($uri), 1, 'HTTP/2: the 8 streams make one origin request');
}

if ($h2proxy) {
    # a resume by Range: the trailers of the rest (a 206) are not the
    # whole response's; the readers get none of the origin's
    my $uri = '/r/x?delay=300&size=100000&fixed=1&ranges=1&hdr=ETag:%22abc%22&fail=cut&cut=50000&fail_first=1';
    my $res = $t->herd(path => $uri, n => 4);
    is($t->origin_uri_hits($uri), 2, 'resumed: 2 origin requests');
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == 100000 } @$res), 4,
       'resumed: every client has the whole body');
    is(scalar(grep { ($_->{trailers} // '') eq "X-Own: bar\r\n" } @$res), 4,
       'resumed: no trailer of the 206 for the rest, only their own')
        or diag(explain([ map { $_->{trailers} } @$res ]));

    # the same for a leader of its own (a private response, not stored)
    $uri = '/r/d?delay=300&size=100000&fixed=1&ranges=1&hdr=ETag:%22abc%22&hdr=Set-Cookie:a%3D1&fail=cut&cut=50000&fail_first=1';
    my ($one) = @{ $t->herd(path => $uri, n => 1) };
    is($t->origin_uri_hits($uri), 2, 'resumed, a leader of its own: 2 origin requests');
    is(length($one->{body} // ''), 100000, 'resumed, a leader of its own: the whole body');
    is($one->{trailers}, "X-Own: bar\r\n", 'resumed, a leader of its own: only its own trailer');

    # no room in the zone for the trailers: the body whole, without them,
    # and a line that says so
    $uri = '/z/full?size=30000&delay=600';
    $res = $t->herd(path => $uri, n => 4);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 4,
       'zone full: 4 complete answers');
    ok($t->wait_for(sub { $t->log_count(qr/no room in zone "small" for the origin's trailers/) },
                    what => 'the line'),
       'zone full: the error log says the trailers were not stored');
    $t->allow_log(qr/no room in zone "small" for the origin's trailers|prematurely|is full/);
    $t->zone_baseline_ok('zone full: the zone back to its baseline', zone => 'small');
}

# the stored trailers go with their flights
$t->zone_baseline_ok('the zone back to its baseline');

done_testing();
