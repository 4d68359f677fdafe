#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_differential: a follower only ever gets what its own
# request would have produced.  Each scenario runs the same configuration
# with the module on and with no module at all (t/lib/SFTest/Diff.pm), the
# same requests at the same moments, against an origin that echoes the
# request it got (t/origin.pl echo=1).  Every response with the module
# must equal the same request's response without it, and where collapsing
# is safe it must cost fewer origin requests.
#
#   DIFF_ONLY=rewrite,slice prove -v -I t/lib t/singleflight_differential.t
#
# runs only those scenarios; a failure prints a reproduction.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest::Diff qw(enc);

my $d = SFTest::Diff->new;
$d->skip_without_module;

my $LM = 'Mon, 01 Jan 2024 00:00:00 GMT';
my $VALIDATORS = '&hdr=ETag:%22v1%22&hdr=Last-Modified:' . enc($LM);

# everything proxied, nothing else
my $PLAIN_CONFIG = <<'EOT';
    server {
        listen 127.0.0.1:%%PORT%%;
        location / { proxy_pass http://o; }
    }
EOT

# SSI pages, and their includes elsewhere
my $SSI_CONFIG = <<'EOT';
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            ssi on;
            proxy_pass http://o;
        }
        location /inc/ {
            proxy_pass http://o;
        }
    }
EOT

# nginx proxying to itself, the second pass (X-Hop) to the origin;
# $extra: more in its location
sub self_proxy_config {
    my ($extra) = @_;
    return <<"EOT";
    map \$http_x_hop \$next_hop {
        ""       127.0.0.1:%%PORT%%;
        default  o;
    }
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            $extra
            singleflight_timeout 2s;
            proxy_set_header Host \$host;
            proxy_set_header X-Hop 1;
            proxy_pass http://\$next_hop;
        }
    }
EOT
}

my @scenarios = (

    # ------------------------------------------------ what a flight is

    {
        # Two servers with the same name on two ports proxy to different
        # paths: a client of one never gets the other's response.
        name     => 'servers',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        server_name localhost;
        location / { proxy_pass http://o/public/; }
    }
    server {
        listen 127.0.0.1:%%PORT_1%%;
        server_name localhost;
        location / { proxy_pass http://o/internal/; }
    }
EOT
        requests => [ map {
            ({ path => '/doc?echo=1&delay=300', port => 0, status => 200, like => qr{^GET /public/doc} },
             { path => '/doc?echo=1&delay=300', port => 1, status => 200, like => qr{^GET /internal/doc} })
        } 1 .. 3 ],
        fetches  => 'fewer',
    },
    {
        # One server on two ports, the port sent upstream.
        name     => 'ports',
        config   => <<'EOT',
    map $server_port $port_name {
        %%PORT%%    first;
        %%PORT_1%%  second;
    }
    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_1%%;
        location / {
            proxy_set_header X-Port $port_name;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            ({ path => '/p?echo=1&delay=300', port => 0, status => 200, like => qr/\nx-port: first\n/ },
             { path => '/p?echo=1&delay=300', port => 1, status => 200, like => qr/\nx-port: second\n/ })
        } 1 .. 3 ],
        fetches  => 'fewer',
    },
    {
        # A rewrite by a request header: the effective URI differs while
        # $request_uri does not.
        name     => 'rewrite',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            if ($http_x_mobile) {
                rewrite ^ /m$uri last;
            }
            proxy_pass http://o;
        }
        location /m/ {
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            ({ path => '/page?echo=1&delay=300', status => 200, like => qr{^GET /page\?} },
             { path => '/page?echo=1&delay=300', headers => [ 'X-Mobile' => 1 ], status => 200,
               like => qr{^GET /m/page\?} })
        } 1 .. 3 ],
        fetches  => 'fewer',
    },
    {
        # A rewrite within the location: the arguments sent upstream come
        # from a header.
        name     => 'rewrite_args',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location /r/ {
            rewrite ^/r/(.*)$ /$1?v=$http_x_v break;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            ({ path => '/r/a?echo=1&delay=300', headers => [ 'X-V' => 1 ], status => 200 },
             { path => '/r/a?echo=1&delay=300', headers => [ 'X-V' => 2 ], status => 200 })
        } 1 .. 3 ],
        fetches  => 'fewer',
    },
    {
        # An empty key: not collapsed, every URL gets its own response.
        name     => 'empty_key',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight_key $arg_k;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            (map { { path => "/$_?echo=1&delay=300", status => 200, like => qr{^GET /$_\?} } } 'a' .. 'd'),
            { path => '/e?echo=1&delay=300&k=1', n => 3, status => 200 },
        ],
        fetches  => 'fewer',
    },
    {
        # A key that merges URIs still never merges different requests:
        # the effective URI and arguments are part of a flight.
        name     => 'coarse_key',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight_key $host;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            ({ path => '/x?echo=1&delay=300', status => 200 },
             { path => '/y?echo=1&delay=300', status => 200 },
             { path => '/x?echo=1&delay=300&z=1', status => 200 })
        } 1 .. 2 ],
        fetches  => 'fewer',
    },

    # ------------------------------------------------ bodies, credentials

    {
        # POSTs collapse on a key with the body: different bodies never.
        name     => 'post_body',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight_methods GET HEAD POST;
            singleflight_key $request_uri$request_body;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            { method => 'POST', path => '/form?echo=1&delay=300', body => "a=$_", status => 200,
              like => qr/\n\na=$_\z/ }
        } (1 .. 3) x 3 ],
        fetches  => 'fewer',
    },
    {
        # The same on $singleflight_body_hash, with bodies in temp files.
        name     => 'body_hash',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        client_body_buffer_size 8k;
        location / {
            singleflight_methods GET HEAD POST;
            singleflight_key $scheme$host$singleflight_body_hash;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            { method => 'POST', path => '/up?echo=1&delay=300', body => "$_" x 20000,
              status => 200, like => qr/\nbody: 20000 bytes\n\n$_/ }
        } (1 .. 2) x 3 ],
        fetches  => 'fewer',
    },
    {
        # Proxy-Authorization is a credential: never collapsed.
        name     => 'proxy_authorization',
        config   => $PLAIN_CONFIG,
        requests => [ map {
            { path => '/pa?echo=1&delay=300', headers => [ 'Proxy-Authorization' => "Basic dXNlcj$_" ],
              status => 200, like => qr/proxy-authorization: Basic dXNlcj$_\n/ }
        } 1 .. 4 ],
        fetches  => 'same',
    },
    {
        # Authorization and Cookie, as before.
        name     => 'authorization_cookie',
        config   => $PLAIN_CONFIG,
        requests => [
            (map { { path => '/ac?echo=1&delay=300', headers => [ Authorization => "Bearer t$_" ],
                     status => 200 } } 1 .. 3),
            (map { { path => '/ac?echo=1&delay=300', headers => [ Cookie => "s=$_" ],
                     status => 200 } } 1 .. 3),
        ],
        fetches  => 'same',
    },
    {
        # HTTP/2 clients' credentials: their header names come lowercase,
        # and nginx makes the request's cookie header anew from the HTTP/2
        # cookie fields (one each here); credentials all the same.
        name     => 'http2_credentials',
        # the plain server, with a port for HTTP/2 before its location
        config   => $PLAIN_CONFIG =~ s/(\n        location)/\n        listen 127.0.0.1:%%PORT_1%% http2;$1/r,
        requests => [
            (map { { path => '/h2c?echo=1&delay=300', h2 => 1, port => 1,
                     headers => [ Cookie => "s=$_" ], status => 200, like => qr/\ncookie: s=$_\n/ } } 1 .. 3),
            (map { { path => '/h2c?echo=1&delay=300', h2 => 1, port => 1,
                     headers => [ Authorization => "Bearer t$_" ], status => 200,
                     like => qr/\nauthorization: Bearer t$_\n/ } } 1 .. 3),
        ],
        fetches  => 'same',
    },
    {
        # singleflight_credentials NAME: more headers that are credentials.
        name     => 'credentials_names',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight_credentials X-Api-Key X-Session;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            (map { { path => '/k?echo=1&delay=300', headers => [ 'X-Api-Key' => "key$_" ],
                     status => 200 } } 1 .. 3),
            (map { { path => '/k?echo=1&delay=300', headers => [ 'X-Session' => "s$_" ],
                     status => 200 } } 1 .. 2),
        ],
        fetches  => 'same',
    },

    {
        # singleflight_lone direct: the first request goes upstream on its
        # own, the others share a flight; each gets its own request's answer.
        name     => 'lone_direct',
        config   => <<'EOT',
    singleflight_lone direct;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://o;
        }
    }
EOT
        requests => [ { path => '/l?echo=1&delay=300', n => 8, status => 200,
                        like => qr{^GET /l\?} } ],
        fetches  => 'fewer',
    },
    {
        # The same where error_page sends the answers to a named location
        # that collapses too.
        name     => 'lone_direct_error_page',
        config   => <<'EOT',
    singleflight_lone direct;
    server {
        listen 127.0.0.1:%%PORT%%;
        error_page 502 @fb;
        location / {
            proxy_pass http://127.0.0.1:1;
        }
        location @fb {
            rewrite ^ /fallback?echo=1&delay=300? break;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ { path => '/ld', n => 8, status => 502, like => qr{^GET /fallback\?} } ],
        fetches  => 'not_more',
    },

    # ------------------------------------------------ errors

    {
        # error_page to a named location that collapses: each client gets
        # the 502 with the fallback's body, as without the module.
        name     => 'error_page',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        error_page 502 @fb;
        location / {
            singleflight off;
            proxy_pass http://127.0.0.1:1;
        }
        location @fb {
            rewrite ^ /fallback?echo=1&delay=300? break;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ { path => '/x', n => 8, status => 502, like => qr{^GET /fallback\?} } ],
        fetches  => 'fewer',
    },
    {
        # The same where the failing location collapses too.
        name     => 'error_page_both',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        error_page 502 @fb;
        location / {
            proxy_pass http://127.0.0.1:1;
        }
        location @fb {
            rewrite ^ /fallback?echo=1&delay=300? break;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ { path => '/y', n => 8, status => 502, like => qr{^GET /fallback\?} } ],
        fetches  => 'fewer',
    },
    {
        # An upstream that resets after a while, and a per-location
        # error_page: the location's own page.
        name     => 'error_reset',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            error_page 502 = /sorry;
            proxy_pass http://o;
        }
        location = /sorry {
            rewrite ^ /sorry?echo=1 break;
            proxy_pass http://o;
        }
    }
EOT
        requests => [ { path => '/z?delay=300&fail=reset', n => 6, status => 200,
                        like => qr{^GET /sorry\?} } ],
        fetches  => 'not_more',
    },
    {
        # try_files: a static file, a file that is not there (=404 and its
        # error_page), and the origin as the fallback.
        name     => 'try_files',
        files    => { 'static/a.txt' => "static a\n", 'nf.html' => "not found page\n" },
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        root %%DOCROOT%%;
        location / {
            try_files $uri @o;
        }
        location /only/ {
            try_files $uri =404;
            error_page 404 /nf.html;
        }
        location = /nf.html {
        }
        location @o {
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => '/static/a.txt', n => 3, status => 200, like => qr/^static a$/ },
            { path => '/dyn?echo=1&delay=300', n => 3, status => 200, like => qr{^GET /dyn\?} },
            { path => '/only/missing', n => 3, status => 404, like => qr/^not found page$/ },
        ],
        fetches  => 'fewer',
    },

    # ------------------------------------------------ nginx features around

    {
        name     => 'proxy_cache',
        config   => <<'EOT',
    proxy_cache_path %%TESTDIR%%/cache keys_zone=pc:1m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_cache pc;
            proxy_cache_valid 200 1m;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => '/c?echo=1&delay=300&hdr=Cache-Control:max-age=60', n => 5, status => 200 },
            { path => '/c?echo=1&delay=300&hdr=Cache-Control:max-age=60', n => 3, at => 0.8, status => 200 },
        ],
        fetches  => 'fewer',
    },
    {
        # X-Accel-Redirect to an internal location.
        name     => 'x_accel',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://o;
        }
        location /protected/ {
            internal;
            proxy_pass http://o/files/;
        }
    }
EOT
        requests => [
            { path => '/dl?delay=200&hdr=X-Accel-Redirect:' . enc('/protected/a?echo=1&delay=200'), n => 3,
              status => 200, like => qr{^GET /files/a\?} },
            { path => '/dl?delay=200&hdr=X-Accel-Redirect:' . enc('/protected/b?echo=1&delay=200'), n => 3,
              status => 200, like => qr{^GET /files/b\?} },
        ],
        fetches  => 'fewer',
    },
    {
        # SSI: every client's own include.
        name     => 'ssi',
        config   => $SSI_CONFIG,
        requests => [ { path => '/page?echo=1&delay=300&hdr=Content-Type:text/html&prefix='
                            . enc('<!--# include virtual="/inc/part?echo=1" -->' . "\n"),
                        n => 4, status => 200, like => qr{^GET /inc/part\?echo=1\n.*\nGET /page\?}s } ],
        fetches  => 'fewer',
    },
    {
        # The same page to a lone client: unstored, through its own SSI.
        name     => 'ssi_alone',
        config   => $SSI_CONFIG,
        requests => [
            # the include ends before the page's fetch, and after it
            { path => '/page?echo=1&delay=300&hdr=Content-Type:text/html&prefix='
                  . enc('<!--# include virtual="/inc/part?echo=1" -->' . "\n"),
              status => 200, like => qr{^GET /inc/part\?echo=1\n.*\nGET /page\?}s },
            { path => '/page2?echo=1&delay=100&hdr=Content-Type:text/html&prefix='
                  . enc('<!--# include virtual="/inc/slow?echo=1&delay=500" -->' . "\n"),
              status => 200, like => qr{^GET /inc/slow\?echo=1&delay=500\n.*\nGET /page2\?}s },
        ],
        fetches  => 'not_more',
    },
    {
        # auth_request: refused clients never get the response.
        name     => 'auth_request',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            auth_request /auth;
            proxy_pass http://o;
        }
        location = /auth {
            internal;
            if ($http_x_token != "good") {
                return 403;
            }
            return 204;
        }
    }
EOT
        requests => [ map {
            ({ path => '/secret?echo=1&delay=300', headers => [ 'X-Token' => 'good' ], status => 200 },
             { path => '/secret?echo=1&delay=300', headers => [ 'X-Token' => 'bad' ], status => 403 })
        } 1 .. 3 ],
        fetches  => 'fewer',
    },
    {
        # gzip by each client's own Accept-Encoding.
        name     => 'gzip',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            gzip on;
            gzip_types text/plain;
            gzip_min_length 1;
            proxy_set_header Accept-Encoding "";
            proxy_pass http://o;
        }
    }
EOT
        requests => [ map {
            ({ path => '/gz?echo=1&delay=300&size=5000', status => 200 },
             { path => '/gz?echo=1&delay=300&size=5000', headers => [ 'Accept-Encoding' => 'gzip' ],
               status => 200 })
        } 1 .. 3 ],
        fetches  => 'fewer',
    },
    {
        # slice: clients without Range get the whole response, one with a
        # Range its part.  A location with slice on is not collapsed
        # (BYPASS): nginx fetches slices, each with its own Range, as
        # without the module (a fetch would have asked for everything).
        name     => 'slice',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            slice 64k;
            proxy_set_header Range $slice_range;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => '/big?echo=1&ranges=1&size=200000&delay=300&hdr=ETag:%22s1%22', n => 4,
              status => 200 },
            { path => '/big?echo=1&ranges=1&size=200000&delay=300&hdr=ETag:%22s1%22',
              headers => [ Range => 'bytes=70000-70099' ], at => 0.05, status => 206 },
        ],
        fetches  => 'same',
    },

    {
        # slice on, but nothing in the configuration sends $slice_range:
        # nginx then asks for the whole response and slice passes it on
        # untouched, so the location is collapsed as any.  (Until
        # 2026-11-28 the module indexed $slice_range itself, and so
        # found it set here and let every request go upstream.)
        name     => 'slice_unsent',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            slice 64k;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => '/big?echo=1&ranges=1&size=200000&delay=300&hdr=ETag:%22s2%22', n => 4,
              status => 200 },
        ],
        fetches  => 'fewer',
    },

    {
        # A location without slice whose request a redirect takes to one
        # with it: the leader's own error_page, or its fetch's try_files.
        # nginx fetches in slices there only for a main request; the
        # collapsed requests go there on their own, as without the
        # module (nginx-tests' slice.t 79).
        name     => 'slice_redirect',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        root %%DOCROOT%%;
        location /ep/ {
            error_page 404 = @sliced;
        }
        location /tf/ {
            try_files /nonexistent @sliced;
        }
        location @sliced {
            slice 64k;
            proxy_set_header Range $slice_range;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            map({ { path => "/$_/big?echo=1&ranges=1&size=200000&delay=300&hdr=ETag:%22s1%22",
                    n => 2, status => 200 } } 'ep', 'tf'),
        ],
        fetches  => 'same',
    },
    {
        # The same with singleflight_lone own: the leader taken into the
        # sliced location fetches its first slice itself, a 206 of the
        # location's own asking, which is not the representation: a
        # follower fetches it (_tee.c).
        name     => 'slice_redirect_own',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        root %%DOCROOT%%;
        singleflight_lone own;
        location /ep/ {
            error_page 404 = @sliced;
        }
        location @sliced {
            slice 64k;
            proxy_set_header Range $slice_range;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => "/ep/bigo?echo=1&ranges=1&size=200000&delay=300&hdr=ETag:%22s1%22",
              n => 4, status => 200 },
        ],
        fetches  => 'same',
    },

    # ------------------------------------------------ methods, conditionals, ranges

    {
        # HEAD and GET mixed: a HEAD gets the GET's headers.
        name     => 'head_get',
        config   => $PLAIN_CONFIG,
        requests => [
            { path => '/hg?echo=1&delay=300&size=700', n => 2, status => 200 },
            { method => 'HEAD', path => '/hg?echo=1&delay=300&size=700', n => 2, status => 200 },
            { method => 'HEAD', path => '/hg?echo=1&delay=300&size=700', after_hits => 1, n => 2,
              status => 200 },
            { path => '/hg?echo=1&delay=300&size=700', after_hits => 1, n => 2, status => 200 },
        ],
        fetches  => 'fewer',
    },
    {
        # Conditional requests: each client's own If-None-Match or
        # If-Modified-Since, the first one's too.
        name     => 'conditional',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            if_modified_since before;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => "/cond?echo=1&delay=300$VALIDATORS", headers => [ 'If-None-Match' => '"v1"' ],
              status => 304 },
            map({ { path => "/cond?echo=1&delay=300$VALIDATORS", after_hits => 1, %$_ } }
                { status => 200 },
                { headers => [ 'If-None-Match' => '"v1"' ], status => 304 },
                { headers => [ 'If-None-Match' => 'W/"v1", "v0"' ], status => 304 },
                { headers => [ 'If-None-Match' => '"v2"' ], status => 200 },
                { headers => [ 'If-Modified-Since' => $LM ], status => 304 },
                { headers => [ 'If-Modified-Since' => 'Sun, 31 Dec 2023 00:00:00 GMT' ], status => 200 },
                { headers => [ 'If-Modified-Since' => 'Tue, 02 Jan 2024 00:00:00 GMT' ], status => 304 }),
        ],
        fetches  => 'fewer',
    },
    {
        # A leader's own conditional or Range headers, which its fetch does
        # not send, are answered by its own filters when its response
        # goes to it unstored (nobody else waits) as when stored: HEAD and
        # GET, alone, and with a follower that has none.
        name     => 'leader_conditional',
        config   => $PLAIN_CONFIG,
        requests => [
            { method => 'HEAD', path => "/hc1?echo=1&delay=300$VALIDATORS",
              headers => [ 'If-Modified-Since' => $LM ], status => 304 },
            { method => 'HEAD', path => "/hc2?echo=1&delay=300$VALIDATORS",
              headers => [ 'If-None-Match' => '"v1"' ], status => 304 },
            { method => 'HEAD', path => "/hc3?echo=1&delay=300$VALIDATORS",
              headers => [ 'If-None-Match' => '"v1"' ], status => 304 },
            { method => 'HEAD', path => "/hc3?echo=1&delay=300$VALIDATORS", after_hits => 2,
              status => 200 },
            { method => 'HEAD', path => "/hc4?echo=1&delay=300$VALIDATORS", status => 200 },
            { method => 'HEAD', path => "/hc4?echo=1&delay=300$VALIDATORS", after_hits => 3,
              headers => [ 'If-Modified-Since' => $LM ], status => 304 },
            { path => "/gc5?echo=1&delay=300$VALIDATORS",
              headers => [ 'If-Modified-Since' => $LM ], status => 304 },
            { path => "/gc6?echo=1&delay=300$VALIDATORS",
              headers => [ 'If-None-Match' => '"v1"' ], status => 304 },
            { path => '/gr7?echo=1&ranges=1&size=3000&delay=300',
              headers => [ Range => 'bytes=100-199' ], status => 206 },
            { path => '/gr8?echo=1&ranges=1&size=3000&delay=300&hdr=ETag:%22r1%22',
              headers => [ Range => 'bytes=-50', 'If-Range' => '"r1"' ], status => 206 },
            { path => '/gr9?echo=1&size=3000&delay=300',
              headers => [ Range => 'bytes=100-199' ], status => 200 },
        ],
        fetches  => 'not_more',
    },
    {
        # Range requests: each client's own range, the first one's too.
        name     => 'range',
        config   => $PLAIN_CONFIG,
        requests => [
            { path => '/rg?echo=1&ranges=1&size=3000&delay=300&hdr=ETag:%22r1%22',
              headers => [ Range => 'bytes=0-99' ], status => 206 },
            map({ { path => '/rg?echo=1&ranges=1&size=3000&delay=300&hdr=ETag:%22r1%22',
                    after_hits => 1, %$_ } }
                { status => 200 },
                { status => 200 },
                { headers => [ Range => 'bytes=100-199' ], status => 206 },
                { headers => [ Range => 'bytes=-50' ], status => 206 },
                { headers => [ Range => 'bytes=2990-' ], status => 206 },
                { headers => [ Range => 'bytes=10-19', 'If-Range' => '"r1"' ], status => 206 },
                { headers => [ Range => 'bytes=10-19', 'If-Range' => '"r0"' ], status => 200 }),
        ],
        fetches  => 'fewer',
    },
    {
        # HTTP/2 clients (curl, cleartext, on a port of their own: their
        # flights are that port's) beside HTTP/1.1 ones: the plain
        # response, HEAD, a Range, a conditional, a body of several DATA
        # frames, gzip (the origin varies on Accept-Encoding, which its
        # echo shows), and a POST that is not collapsed.
        # The origin waits 1 s for its header: the HTTP/2 clients are
        # processes, and under load they took 400 ms to reach it.
        name     => 'http2',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_1%% http2;
        location / {
            gzip on;
            gzip_types text/plain;
            gzip_min_length 0;
            gzip_proxied any;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => "/h2?echo=1&ranges=1&size=200000&delay=1000$VALIDATORS&hdr=Vary:Accept-Encoding", h2 => 1, port => 1,
              status => 200 },
            map({ { path => "/h2?echo=1&ranges=1&size=200000&delay=1000$VALIDATORS&hdr=Vary:Accept-Encoding", after_hits => 1,
                    h2 => 1, port => 1, %$_ } }
                { status => 200 },
                { method => 'HEAD', status => 200 },
                { headers => [ Range => 'bytes=100-199' ], status => 206 },
                { headers => [ 'If-None-Match' => '"v1"' ], status => 304 },
                { headers => [ 'Accept-Encoding' => 'gzip' ], status => 200 },
                { method => 'POST', body => "a body\n", status => 200 }),
            map({ { path => "/h2?echo=1&ranges=1&size=200000&delay=1000$VALIDATORS&hdr=Vary:Accept-Encoding", after_hits => 1,
                    %$_ } }
                { status => 200 },
                { headers => [ Range => 'bytes=-50' ], status => 206 }),
        ],
        fetches  => 'fewer',
    },

    {
        # Range requests on a response without a length (the origin's
        # chunked 200 says Accept-Ranges: bytes): nginx's range filter
        # needs the length, so no flight can answer them as the origin
        # would (206); they go upstream on their own.  A Range leader,
        # alone, with followers and of a private response, and Range
        # followers.  Each Range leader costs one origin request more than
        # without the module (its fetch, stopped once nobody reads it).
        name     => 'range_chunked',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_http_version 1.1;
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => '/rc?echo=1&ranges=1&chunked=1&size=3000&delay=300', status => 200 },
            map({ { path => '/rc?echo=1&ranges=1&chunked=1&size=3000&delay=300', after_hits => 1,
                    %$_ } }
                { status => 200 },
                { headers => [ Range => 'bytes=100-199' ], status => 206 },
                { headers => [ Range => 'bytes=-50' ], http10 => 1, status => 206 }),
            { path => '/rl?echo=1&ranges=1&chunked=1&size=3000&delay=300',
              headers => [ Range => 'bytes=10-19' ], status => 206 },
            { path => '/rf?echo=1&ranges=1&chunked=1&size=3000&delay=300',
              headers => [ Range => 'bytes=10-19' ], status => 206 },
            { path => '/rf?echo=1&ranges=1&chunked=1&size=3000&delay=300', after_hits => 3,
              status => 200 },
            # a private response: its leader's alone, the others on their own
            { path => '/rp?echo=1&ranges=1&chunked=1&size=3000&delay=300&hdr=Cache-Control:private',
              headers => [ Range => 'bytes=10-19' ], status => 206 },
            { path => '/rp?echo=1&ranges=1&chunked=1&size=3000&delay=300&hdr=Cache-Control:private',
              after_hits => 5, status => 200 },
        ],
        fetches  => undef,
    },

    # ------------------------------------------------ Vary, loops

    {
        # One flight per User-Agent, in parallel: nobody waits for
        # another variant's flight.  Cold, the Vary is learnt from the
        # first response: one origin delay (0.4 s) more at most.
        name     => 'vary',
        config   => $PLAIN_CONFIG,
        requests => [ map {
            { path => '/v?echo=1&delay=400&hdr=Vary:User-Agent', headers => [ 'User-Agent' => "ua$_" ],
              n => 2, status => 200, like => qr/\nuser-agent: ua$_\n/ }
        } 1 .. 6 ],
        fetches  => 'fewer',
        latency  => 0.6,
    },
    {
        # nginx proxying to itself, to the same location (X-Hop tells the
        # second pass to go to the origin): the second pass must not wait
        # for the flight it is the fetch of.
        name     => 'self_proxy',
        config   => self_proxy_config(''),
        requests => [ { path => '/loop?echo=1&delay=300', n => 4, status => 200,
                        like => qr/\nx-hop: 1\n/ } ],
        fetches  => 'fewer',
        latency  => 1,
    },
    {
        # the same with singleflight_lone direct: the first request goes
        # its own way, and the flight the others make waits for its
        # header; its upstream request, coming back, must not wait for
        # that flight (it carries CDN-Loop, as a fetch does)
        name     => 'self_proxy_direct',
        config   => self_proxy_config('singleflight_lone direct;'),
        requests => [ { path => '/loop?echo=1&delay=300', n => 4, status => 200,
                        like => qr/\nx-hop: 1\n/ } ],
        fetches  => 'fewer',
        latency  => 1,
    },
    # ------------------------------------------------ nginx-tests' classes

    {
        # A leader's $upstream_* variables in its own headers (add_header)
        # tell of the upstream response as without the module, whether the
        # response is its own (Set-Cookie: private) or stored.
        name     => 'upstream_variables',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        server_name localhost;
        location / {
            add_header X-Upstream "$upstream_cookie_tc|$upstream_http_x_v";
            proxy_pass http://o;
        }
    }
EOT
        requests => [
            { path => '/v1?echo=1&hdr=Set-Cookie:tc%3Done&hdr=X-V:a', status => 200 },
            { path => '/v2?status=204&hdr=Set-Cookie:tc%3Dtwo&hdr=X-V:b', at => 0.3, status => 204 },
            { path => '/v3?echo=1&hdr=X-V:c', at => 0.6, status => 200 },
        ],
    },
    {
        # Responses without a body (204, 304, HEAD) keep their status line
        # and framing, whether the leader's own or stored.
        name     => 'bodiless_framing',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        server_name localhost;
        location / { proxy_pass http://o; }
    }
EOT
        requests => [
            { path => '/n1?status=204', status => 204 },
            { path => '/n2?status=204&hdr=Set-Cookie:a%3Db', at => 0.3, status => 204 },
            { path => '/n3?status=304&hdr=ETag:%22e%22', at => 0.6, status => 304 },
            { path => '/n4?status=304&hdr=ETag:%22e%22&hdr=Set-Cookie:a%3Db', at => 0.9, status => 304 },
            { method => 'HEAD', path => '/n5?echo=1&hdr=Set-Cookie:a%3Db', at => 1.2, status => 200 },
        ],
    },
    {
        # An upstream 401 intercepted by error_page keeps the upstream's
        # WWW-Authenticate, as nginx keeps it (proxy_intercept_errors):
        # for a leader, and for each of a herd.
        name     => 'intercepted_401',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        server_name localhost;
        location / {
            proxy_pass http://o;
            proxy_intercept_errors on;
            error_page 401 /e401;
        }
        location = /e401 { return 200 "denied\n"; }
    }
EOT
        requests => [
            { path => '/a1?status=401&hdr=WWW-Authenticate:Basic%20realm%3D%22a%22', status => 401 },
            { path => '/a2?status=401&hdr=WWW-Authenticate:Basic%20realm%3D%22b%22', at => 0.3, status => 401 },
            { path => '/a3?status=401&delay=300&hdr=WWW-Authenticate:Basic%20realm%3D%22c%22',
              at => 0.6, n => 3, status => 401 },
        ],
    },
    {
        # A stale cache entry, proxy_cache_use_stale updating with
        # proxy_cache_background_update: nginx answers with the entry
        # (STALE) and updates it in the background; it refuses to serve
        # stale to a background subrequest, which a fetch is, and the
        # client waited for the origin's new response.
        name     => 'cache_stale',
        config   => <<'EOT',
    proxy_cache_path %%TESTDIR%%/stale keys_zone=stale:1m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://o;
            proxy_cache stale;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
            add_header X-Upstream $upstream_cache_status always;
        }
    }
EOT
        requests => [
            { path => '/st?size=100', status => 200 },
            { path => '/st?size=100', at => 2.5, status => 200,
              like => qr/^hit=1 / },
        ],
    },
    {
        # A stale entry that proxy_cache_use_stale updating gives while
        # one request updates it: the others get it at once (UPDATING),
        # not the origin's new response after it.
        name     => 'cache_updating',
        config   => <<'EOT',
    proxy_cache_path %%TESTDIR%%/upd keys_zone=upd:1m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://o;
            proxy_cache upd;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale updating;
            add_header X-Diff-Cache $upstream_cache_status always;
        }
    }
EOT
        requests => [
            { path => '/u?echo=1&delay=1000', status => 200 },
            { path => '/u?echo=1&delay=1000', at => 3.2, status => 200 },
            { path => '/u?echo=1&delay=1000', at => 3.6, n => 3, status => 200 },
        ],
        fetches  => 'same',
        latency  => 0.5,
    },
    {
        # proxy_cache_bypass for one request: the others are hits at once
        name     => 'cache_bypass',
        config   => <<'EOT',
    proxy_cache_path %%TESTDIR%%/byp keys_zone=byp:1m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://o;
            proxy_cache byp;
            proxy_cache_valid 200 1m;
            proxy_cache_bypass $http_x_bypass;
            add_header X-Diff-Cache $upstream_cache_status always;
        }
    }
EOT
        requests => [
            { path => '/b?echo=1&delay=1000', status => 200 },
            { path => '/b?echo=1&delay=1000', at => 1.5, headers => [ 'X-Bypass' => '1' ], status => 200 },
            { path => '/b?echo=1&delay=1000', at => 1.9, n => 3, status => 200 },
        ],
        fetches  => 'same',
        latency  => 0.5,
    },
    {
        # proxy_cache_bypass for two requests (a browser's reload) while
        # the origin fails: the others are hits at once, not the 503
        name     => 'cache_bypass_error',
        config   => <<'EOT',
    proxy_cache_path %%TESTDIR%%/bye keys_zone=bye:1m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://o;
            proxy_cache bye;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1m;
            proxy_cache_bypass $http_pragma;
            add_header X-Diff-Cache $upstream_cache_status always;
        }
    }
EOT
        requests => [
            { path => '/be?echo=1', status => 200 },
            { path => '/be?echo=1&status=503&delay=1500', at => 1.0, n => 2,
              headers => [ 'Pragma' => 'no-cache' ], status => 503 },
            { path => '/be?echo=1&status=503&delay=1500', at => 1.4, n => 4, status => 200 },
        ],
        fetches  => 'fewer',
        latency  => 0.5,
    },
    {
        # An empty file: nginx 1.22's static handler ends a subrequest's
        # (a fetch's) with its header alone; the fetch ends its body for
        # it, sent straight to the leader or stored.
        name     => 'empty_file',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        root %%DOCROOT%%;
        location / { }
        location /stored/ {
            singleflight_lazy off;
        }
    }
EOT
        files    => { 'e' => '', 'stored/e' => '' },
        requests => [
            { path => '/e', status => 200 },
            { path => '/e', http10 => 1, at => 0.1, status => 200 },
            { path => '/stored/e', at => 0.2, status => 200 },
            { path => '/stored/e', http10 => 1, at => 0.3, status => 200 },
        ],
    },
    {
        # gzip_static on answers a subrequest (a fetch) with the plain
        # file, whatever its client takes: such a location is not
        # collapsed, and a client that takes gzip gets the .gz.
        name     => 'gzip_static',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        root %%DOCROOT%%;
        gzip_static on;
        location / { }
    }
EOT
        files    => { 't.html' => "plain\n", 't.html.gz' => "GZ-BYTES\n" },
        requests => [
            { path => '/t.html', headers => [ 'Accept-Encoding' => 'gzip' ], n => 2,
              status => 200, like => qr/^GZ-BYTES/ },
            { path => '/t.html', n => 2, at => 0.1, status => 200, like => qr/^plain/ },
        ],
    },
    {
        # autoindex cuts a long UTF-8 name by characters where the
        # charset filter told it the charset: in a fetch it does not, so
        # such a location is not collapsed.
        name     => 'autoindex',
        config   => <<'EOT',
    server {
        listen 127.0.0.1:%%PORT%%;
        root %%DOCROOT%%;
        charset utf-8;
        location /d/ { autoindex on; }
    }
EOT
        files    => { 'd/' . ("\xd1\x84" x 45) . '.txt' => "x\n" },
        requests => [
            { path => '/d/', n => 2, status => 200 },
        ],
    },
);

$d->run($_) for @scenarios;

done_testing;
