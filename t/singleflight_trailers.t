#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_trailers: the origin's trailers, where nginx passes them on
# (proxy_pass_trailers, HTTP/2 to the origin: nginx 1.29 and later).  A
# lone leader whose response goes straight to it (a body with its length)
# gets them after its last chunk, with its own (add_trailer), as without
# the module.  A stored
# response's readers do not (README, Limitations).

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;

my ($major, $minor) = `@{[ $t->nginx_binary ]} -v 2>&1` =~ m{nginx/(\d+)\.(\d+)};
plan(skip_all => 'proxy_http_version 2 needs nginx 1.29 or later')
    unless defined $minor && ($major > 1 || $minor >= 29);

$t->write_file('index.html', 'SEE-THIS');
$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
        proxy_http_version 2;
        proxy_pass_trailers on;
        add_trailer X-Own bar; # its own, and the client's response chunked

        location / {
            proxy_pass http://127.0.0.1:%%PORT_2%%;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_1%%;
        proxy_http_version 2;
        proxy_pass_trailers on;
        add_trailer X-Own bar;

        location / {
            proxy_pass http://127.0.0.1:%%PORT_2%%;
        }
    }

    # the origin: HTTP/2, a body with its length, then trailers
    server {
        listen 127.0.0.1:%%PORT_2%%;
        http2 on;
        root %%TESTDIR%%;
        add_header Trailer "X-Trailer";
        add_trailer X-Trailer foo;
    }
EOT
$t->start;

# the whole response as sent, chunks and trailers
sub raw_get {
    my ($port, $path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 10)
        or return '';
    print $s "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    local $/;
    my $raw = <$s> // '';
    return $raw;
}

my ($sf, $plain) = (raw_get($t->port, '/index.html'), raw_get($t->port(1), '/index.html'));

like($plain, qr/SEE-THIS\r\n0\r\nX-Trailer: foo\r\nX-Own: bar\r\n\r\n\z/i,
     'plain nginx: the origin\'s trailer and its own after the last chunk');
like($sf, qr/SEE-THIS\r\n0\r\nX-Trailer: foo\r\nX-Own: bar\r\n\r\n\z/i,
     'a lone leader, its response straight from its fetch: both too');

done_testing();
