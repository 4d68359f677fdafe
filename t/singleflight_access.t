#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A fetch redirected to another location (the origin's X-Accel-Redirect,
# try_files to a named location): nginx runs no access phase for a
# subrequest, so a fetch meets none of that location's allow, deny,
# auth_basic or auth_request.  Where the location has checks of its own,
# the fetch's response is nobody's: every client goes its own way and is
# checked as without the module (403, 401), one origin request more than
# without it.  Where it has none, or only those inherited from where the
# clients came in (and met there), the herd is one origin request as
# before.  Each herd is compared with the same requests on a server
# without the module.  So too for a leader that goes upstream itself and
# meets such a location's checks after a redirect: its response is its
# own.

use strict;
use warnings;

use Test::More;
use File::Path qw(make_path);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

for my $d (qw(denied basic open)) {
    make_path($t->path("html/$d"));
    $t->write_file("html/$d/f", "the $d file\n");
}
$t->write_file('htpasswd', "user:{PLAIN}secret\n");
$t->write_file('htpasswd-admins', "admin:{PLAIN}secret\n");

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        root %%TESTDIR%%/html;

        location /fetch/ {
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
        }

        location /default/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /tf/ {
            try_files /nonexistent \@closed;
        }

        location \@closed {
            deny all;
            proxy_pass http://%%ORIGIN%%;
        }

        location /denied/ {
            internal;
            deny all;
        }

        location /basic/ {
            internal;
            auth_basic "files";
            auth_basic_user_file %%TESTDIR%%/htpasswd;
        }

        location /open/ {
            internal;
        }

        location /own/ {
            singleflight_lone own;
            proxy_pass http://%%ORIGIN%%;
        }

        location /priv/ {
            internal;
            auth_request /auth;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /auth {
            internal;
            if (\$http_x_token = "good") {
                return 204;
            }
            return 403;
        }
    }

    # checks at the server's level, inherited by every location
    server {
        listen 127.0.0.1:%%PORT_${\($i + 2)}%%;
        singleflight $sf;
        root %%TESTDIR%%/html;
        allow 127.0.0.1;
        deny all;

        location /fetch/ {
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
        }

        location /open/ {
            internal;
        }
    }

    # auth_basic and satisfy of the server's, a location with other users
    # or another satisfy
    server {
        listen 127.0.0.1:%%PORT_${\($i + 4)}%%;
        singleflight $sf;
        root %%TESTDIR%%/html;
        allow 127.0.0.1;
        deny all;
        auth_basic "files";
        auth_basic_user_file %%TESTDIR%%/htpasswd;

        location /fetch/ {
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
        }

        location /any/ {
            satisfy any;
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
        }

        location /basic/ {
            internal;
            auth_basic_user_file %%TESTDIR%%/htpasswd-admins;
        }

        location /denied/ {
            internal;
        }
    }
EOT
}

$t->write_config($t->config_template(<<"EOT" . $servers, log_singleflight => 1));
    singleflight_zone zone=sf:4m;
EOT
$t->start;

sub enc { (my $v = $_[0]) =~ s/([^A-Za-z0-9_.~-])/sprintf('%%%02X', ord $1)/ge; $v }

my $n = 0;

# a herd of $count on the module's port and on the plain one, at once
sub both {
    my ($path, $count, $on, $off) = @_;
    my @h;
    for my $port ($t->port($on), $t->port($off)) {
        push @h, map { $t->start_request('GET', $path, port => $port, timeout => 20) }
            1 .. $count;
    }
    my $res = $t->finish_all(\@h);
    return ([ @$res[0 .. $count - 1] ], [ @$res[$count .. 2 * $count - 1] ]);
}

sub codes { join ' ', map { $_->{status} // 'none' } @{ $_[0] } }

for my $c ([ 'X-Accel-Redirect to deny all, singleflight_lone fetch', '/fetch/', '/denied/f', 1, 403 ],
           [ 'X-Accel-Redirect to deny all, a herd', '/default/', '/denied/f', 5, 403 ],
           [ 'X-Accel-Redirect to auth_basic, a herd', '/fetch/', '/basic/f', 5, 401 ]) {
    my ($what, $loc, $to, $count, $code) = @$c;
    my $path = $loc . ++$n . '?delay=300&hdr=X-Accel-Redirect:' . enc($to);
    $t->origin_reset;
    my ($on, $off) = both($path, $count, 0, 1);
    is(codes($off), join(' ', ($code) x $count), "$what: $code without the module");
    is(codes($on), codes($off), "$what: $code with it");
    is(scalar(grep { ($_->{body} // '') =~ /the \w+ file/ } @$on), 0,
       "$what: the file to nobody");
    ok($t->origin_uri_hits($path) <= 2 * $count + 1,
       "$what: at most one origin request more than without the module");
}

{
    my $what = 'try_files to a named location with deny all, a herd';
    my $path = '/tf/' . ++$n . '?delay=300&size=100';
    $t->origin_reset;
    my ($on, $off) = both($path, 5, 0, 1);
    is(codes($off), '403 403 403 403 403', "$what: 403 without the module");
    is(codes($on), codes($off), "$what: 403 with it");
}

# A leader that goes upstream itself (singleflight_lone own) and is
# redirected to a location with auth_request, which lets it in (its
# X-Token) and would not let its followers in: its response is its own,
# the followers are checked themselves.
for my $c ([ 'on', 0 ], [ 'off', 1 ]) {
    my ($what, $port) = @$c;
    my $path = '/own/' . ++$n . '?delay=500&hdr=X-Accel-Redirect:'
               . enc('/priv/' . $n . '?size=100');
    $t->origin_reset;
    my $leader = $t->start_request('GET', $path, port => $t->port($port), timeout => 20,
                                   headers => [ 'X-Token' => 'good' ]);
    $t->wait_for(sub { $t->origin_uri_hits($path) >= 1 }, what => 'the leader upstream');
    my @f = map { $t->start_request('GET', $path, port => $t->port($port), timeout => 20) }
        1 .. 4;
    my $res = $t->finish_all([ $leader, @f ]);
    is(codes($res), '200 403 403 403 403',
       "auth_request after the leader's own redirect, module $what: the leader in, the others 403");
}

# The same realm with another user file; the same rules with satisfy all
# where the clients came in with satisfy any: a lone request through a
# fetch gets 401 as without the module, not the file.
use MIME::Base64 qw(encode_base64);
for my $c ([ 'auth_basic with another user file', '/fetch/', '/basic/f',
             [ Authorization => 'Basic ' . encode_base64('user:secret', '') ] ],
           [ 'satisfy all after satisfy any', '/any/', '/denied/f', [] ]) {
    my ($what, $loc, $to, $hdr) = @$c;
    my $path = $loc . ++$n . '?hdr=X-Accel-Redirect:' . enc($to);
    my ($on, $off) = map { $t->get($path, port => $t->port($_), headers => $hdr) } 4, 5;
    is($off->{status}, 401, "$what: 401 without the module");
    is($on->{status}, $off->{status}, "$what: 401 with it");
}

# no checks of its own there: shared as before
for my $c ([ 'X-Accel-Redirect to an internal location', 0, 1 ],
           [ 'X-Accel-Redirect, checks inherited from the server', 2, 3 ]) {
    my ($what, $on_port, $off_port) = @$c;
    my $path = '/fetch/' . ++$n . '?delay=300&hdr=X-Accel-Redirect:' . enc('/open/f');
    $t->origin_reset;
    my ($on, $off) = both($path, 5, $on_port, $off_port);
    is(codes($off), '200 200 200 200 200', "$what: 200 without the module");
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{body} eq "the open file\n" } @$on), 5,
       "$what: the file to each with it");
    is($t->origin_uri_hits($path), 1 + 5, "$what: one origin request with the module, 5 without");
}

done_testing;
