#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_vary_config: a response that varies on a request header the
# location itself sets for the origin.  The common device-detection setup:
#
#   map $http_user_agent $device { ~Mobile mobile; default desktop; }
#   proxy_set_header X-Device $device;
#
# with an origin that answers per X-Device and says "Vary: X-Device".  No
# client sends X-Device; what the origin gets is the configuration's.  A
# follower is given a variant only when the request it would itself have
# sent carries the same value: a herd of 5 desktop and 5 mobile clients
# costs 2 origin requests (one per device), and every client gets its own
# device's body, as each gets it with the module off (10 requests).
#
# The same through auth_request_set (a value the access phase sets, then
# proxy_set_header) and through headers-more's more_set_input_headers
# (which changes the request's own header before this module looks), if
# that module is installed.  fastcgi_param HTTP_X_DEVICE is tested with the
# other FastCGI cases in t/singleflight_upstreams.t.
#
# With nginx 1.29 or later, the same over HTTP/2 to the origin
# (proxy_http_version 2, through a relay of the same nginx), whose
# request headers are made from the same proxy_set_header values.
#
# Clients that send an X-Device of their own share as those that send
# none: proxy_set_header keeps theirs from the origin.
#
# Each herd is compared with the same clients through a server without the
# module, in the same nginx, at the same moment.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $MODULES = $ENV{TEST_NGINX_MODULES} // '/usr/lib/nginx/modules';

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# headers-more, as Debian packages it, loads into Debian's nginx only
my $more = -f "$MODULES/ngx_http_headers_more_filter_module.so"
    && ($t->nginx_binary eq '/usr/sbin/nginx' || $ENV{TEST_NGINX_MODULES});
my $main = $more
    ? "load_module $MODULES/ngx_http_headers_more_filter_module.so;" : '';

# proxy_http_version 2: nginx 1.29 and later
my ($major, $minor) = `@{[ $t->nginx_binary ]} -v 2>&1` =~ m{nginx/(\d+)\.(\d+)};
my $h2 = defined $minor && ($major > 1 || $minor >= 29);

my $h2_loc = $h2 ? <<'EOT' : '';
        location /h2/ {
            proxy_http_version 2;
            proxy_set_header X-Device $device;
            proxy_pass http://127.0.0.1:%%PORT_2%%;
        }
EOT

# the relay: HTTP/2 in, HTTP/1.1 to the origin, headers passed on
my $relay = $h2 ? <<'EOT' : '';
    server {
        listen 127.0.0.1:%%PORT_2%%;
        http2 on;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

my $more_loc = $more ? <<'EOT' : '';
        location /more/ {
            more_set_input_headers "X-Device: $device";
            proxy_set_header X-Other 1;    # not the server's X-Device
            proxy_pass http://%%ORIGIN%%;
        }
EOT

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF \$singleflight_status always;

        location /dev/ {
            proxy_set_header X-Device \$device;
            proxy_pass http://%%ORIGIN%%;
        }

        # the value the access phase sets
        location /auth/ {
            auth_request /authz;
            auth_request_set \$dev "\$device";
            proxy_set_header X-Device \$dev;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /authz {
            internal;
            return 204;
        }

        # set at server level, inherited by the location
        location /inherit/ {
            proxy_pass http://%%ORIGIN%%;
        }

        proxy_set_header X-Device \$device;

$more_loc
$h2_loc
        location = /stats {
            singleflight_stats;
        }
    }
EOT
}

$t->write_config($t->config_template(<<"EOT" . $servers . $relay, main => $main));
    map \$http_user_agent \$device { ~Mobile mobile; default desktop; }

    singleflight_zone zone=sf:1m;
EOT
$t->start;

my $DESKTOP = 'Mozilla/5.0 (X11; Linux x86_64)';
my $MOBILE = 'Mozilla/5.0 (iPhone) Mobile';

# The device a body was made for, from the origin's echo of its request.
sub device_of {
    my ($body) = @_;
    my ($d) = ($body // '') =~ /^X-Device: (\S+)$/mi;
    return $d // 'none';
}

# A herd of 5 desktop and 5 mobile clients on port 0 (module on) and the
# same 10 on port 1 (off), interleaved, all at once.
# With "own", each client sends an X-Device of its own, which
# proxy_set_header keeps from the origin.
sub herd_both {
    my ($path, $own) = @_;
    my @agents = map { $_ % 2 ? $MOBILE : $DESKTOP } 0 .. 9;
    my @h;
    for my $port ($t->port(0), $t->port(1)) {
        push @h, map { $t->start_request('GET', $path, port => $port,
                                         headers => { 'User-Agent' => $agents[$_],
                                                      $own ? ('X-Device' => "own$_") : () })
                     } 0 .. 9;
    }
    my $res = $t->finish_all(\@h);
    return ([ @$res[0 .. 9] ], [ @$res[10 .. 19] ], \@agents);
}

sub check {
    my ($what, $path, $uri, $own) = @_;

    $t->origin_reset;
    my ($on, $off, $agents) = herd_both($path, $own);
    my $hits = $t->origin_uri_hits($uri);

    my @want = map { $_ eq $MOBILE ? 'mobile' : 'desktop' } @$agents;
    is(scalar(grep { ($off->[$_]{status} // 0) == 200
                     && device_of($off->[$_]{body}) eq $want[$_] } 0 .. 9),
       10, "$what: module off: every client its own device's body");
    my @wrong = grep { ($on->[$_]{status} // 0) != 200 || !$on->[$_]{complete}
                       || device_of($on->[$_]{body}) ne $want[$_] } 0 .. 9;
    is(scalar(@wrong), 0,
       "$what: module on: every client its own device's body, as module off")
        or diag(explain([ map { [ $want[$_], device_of($on->[$_]{body}),
                                  $on->[$_]{headers}{'x-sf'} ] } @wrong ]));
    is($hits, 12, "$what: 2 origin requests with the module (one per "
                  . "device), 10 without")
        or diag("origin requests for $uri: $hits");
}

my $q = 'delay=400&echo=1&hdr=Vary:X-Device';

check('proxy_set_header $device', "/dev/a?$q", "/dev/a?$q");
check('auth_request_set, proxy_set_header', "/auth/a?$q", "/auth/a?$q");
check('proxy_set_header at server level', "/inherit/a?$q", "/inherit/a?$q");
check('clients sending X-Device of their own', "/dev/own?$q", "/dev/own?$q", 1);

SKIP: {
    skip 'headers-more not installed', 3 unless $more;
    check('more_set_input_headers', "/more/a?$q", "/more/a?$q");
}

SKIP: {
    skip 'proxy_http_version 2 needs nginx 1.29 or later', 3 unless $h2;
    check('proxy_http_version 2, proxy_set_header', "/h2/a?$q", "/h2/a?$q");
}

# Requests that would send the same value still share: 10 desktop
# clients, one origin request.
{
    $t->origin_reset;
    my $path = "/dev/same?$q";
    my $res = $t->herd(n => 10, path => $path,
                       headers => { 'User-Agent' => $DESKTOP });
    is(scalar(grep { ($_->{status} // 0) == 200
                     && device_of($_->{body}) eq 'desktop' } @$res), 10,
       'one device: 10 desktop bodies');
    is($t->origin_uri_hits($path), 1, 'one device: one origin request');
}

# A client that sends X-Device itself gets what its own request got: the
# origin saw the configuration's value, not the client's.
{
    $t->origin_reset;
    my $path = "/dev/sent?$q";
    my @h = map { $t->start_request('GET', $path,
                      headers => { 'User-Agent' => $DESKTOP,
                                   'X-Device' => $_ }) } qw(mobile desktop tv);
    my $res = $t->finish_all(\@h);
    is(scalar(grep { device_of($_->{body}) eq 'desktop' } @$res), 3,
       'client X-Device replaced by the configuration: desktop for all');
}

$t->zone_baseline_ok('sf');

done_testing;
