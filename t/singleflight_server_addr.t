#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# $server_addr and $server_port in a fetch, on a wildcard listen ("listen
# PORT;", the most common one): nginx asks the client's socket for the
# local address when a variable first needs it.  A fetch runs on a
# connection of its own; asked there, the address was that socket's
# ("unix:") and the port empty, in what the origin got (proxy_set_header,
# fastcgi_params' SERVER_ADDR and SERVER_PORT) and, the variables being
# the request's, in the leader's own response and log.  Each case is
# compared with the same request in a location without the module.
#
# The listen is a wildcard on purpose (the bug needs one): the test still
# talks over 127.0.0.1 only.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $loc = <<'EOT';
            proxy_set_header X-A $server_addr;
            proxy_set_header X-P $server_port;
            add_header X-SA "$server_addr:$server_port" always;
            proxy_pass http://%%ORIGIN%%;
EOT

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;

    server {
        listen %%PORT%%;

        location /fetch/ {
            singleflight sf;
            singleflight_lone fetch;
$loc        }

        location /default/ {
            singleflight sf;
$loc        }

        location /off/ {
$loc        }
    }
EOT
$t->start;

my $port = $t->port(0);

# what the origin was sent (echo=1: its request headers, lower case)
sub sent {
    my ($r, $name) = @_;
    my ($v) = ($r->{body} // '') =~ /^\Q$name\E: (.*)$/m;
    return $v // '(none)';
}

my $off = $t->get('/off/a?echo=1');
is(sent($off, 'x-a'), '127.0.0.1', 'without the module: the origin got 127.0.0.1');
is(sent($off, 'x-p'), $port, 'without the module: and the port');

for my $c ([ 'singleflight_lone fetch, a GET', 'GET', '/fetch/a?echo=1' ],
           [ 'the default, a lone HEAD (a fetch)', 'HEAD', '/default/b?echo=1' ],
           [ 'the default, a lone GET (its own)', 'GET', '/default/c?echo=1' ]) {
    my ($what, $method, $uri) = @$c;
    my $r = $t->http($method, $uri);
    is($r->{status}, 200, "$what: 200");
    is($r->{headers}{'x-sa'}, "127.0.0.1:$port",
       "$what: \$server_addr:\$server_port in its response as without the module");
    next if $method eq 'HEAD';
    is(sent($r, 'x-a'), '127.0.0.1', "$what: the origin got 127.0.0.1");
    is(sent($r, 'x-p'), $port, "$what: and the port");
}

done_testing;
