#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_compat: the third-party modules operators run beside ours,
# as Debian packages them (libnginx-mod-*).  For each module installed, a
# location that uses it runs in a server with "singleflight sf" (port 0)
# and one with "singleflight off" (port 1) in one nginx: a herd of 5 on
# port 0 and one request on port 1 at the same moment.  Every client of
# the herd gets what the plain request got (status, body, the module's
# headers); where the module's content is collapsible, the herd has one
# leader and followers, and its origin requests or handler runs drop to 1.
# A module that is not installed is skipped, and says so.
#
# lua (content_by_lua with ngx.sleep, ngx.header, ngx.exit,
# ngx.location.capture, a cosocket; access_by_lua, header_filter_by_lua,
# body_filter_by_lua, balancer_by_lua), njs (js_content), perl, echo,
# headers-more, fancyindex.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $MODULES = $ENV{TEST_NGINX_MODULES} // '/usr/lib/nginx/modules';

my $t = SFTest->new;
$t->skip_without_module;

# Debian's modules are built for Debian's nginx only
plan skip_all => "Debian's modules load into /usr/sbin/nginx only, not "
                 . $t->nginx_binary
    if $t->nginx_binary ne '/usr/sbin/nginx' && !$ENV{TEST_NGINX_MODULES};

$t->start_origin;

# name => [ .so files ], per module family
my %so = (
    lua          => [ 'ndk_http_module.so', 'ngx_http_lua_module.so' ],
    njs          => [ 'ngx_http_js_module.so' ],
    perl         => [ 'ngx_http_perl_module.so' ],
    echo         => [ 'ngx_http_echo_module.so' ],
    headers_more => [ 'ngx_http_headers_more_filter_module.so' ],
    fancyindex   => [ 'ngx_http_fancyindex_module.so' ],
);

my %have;
for my $m (sort keys %so) {
    $have{$m} = !grep { !-f "$MODULES/$_" } @{ $so{$m} };
    diag("$m: not installed ($MODULES), skipped") unless $have{$m};
}

plan skip_all => 'none of the third-party modules is installed'
    unless grep { $_ } values %have;

my $load = join "\n", map { "load_module $MODULES/$_;" }
    map { @{ $so{$_} } } grep { $have{$_} } sort keys %so;

$t->write_file('njs.js', <<'EOT');
function hit(r) {
    setTimeout(function () {
        r.headersOut['X-Njs'] = 'yes';
        r.return(200, 'njs hit ' + r.uri + '\n');
    }, 300);
}
export default { hit };
EOT

mkdir $t->path('www');
$t->write_file("www/$_.txt", "file $_\n") for qw(a b c);

my $origin = $t->origin_port;

my %loc;

$loc{lua} = <<"EOT";
        location /lua/sleep {
            content_by_lua_block {
                ngx.sleep(0.3)
                ngx.header["X-Lua"] = "n1"
                ngx.say("lua hit ", ngx.var.uri)
            }
        }

        location /lua/exit {
            content_by_lua_block {
                ngx.sleep(0.3)
                ngx.exit(403)
            }
        }

        location /lua/capture {
            content_by_lua_block {
                local res = ngx.location.capture("/lua/sub",
                                                 { args = "delay=300" })
                ngx.status = res.status
                ngx.print(res.body)
            }
        }

        location /lua/sub {
            internal;
            proxy_pass http://127.0.0.1:$origin/lua-capture;
        }

        location /lua/cosocket {
            content_by_lua_block {
                local sock = ngx.socket.tcp()
                local ok, err = sock:connect("127.0.0.1", $origin)
                if not ok then
                    ngx.exit(502)
                end
                sock:send("GET /lua-cosocket?delay=300 HTTP/1.0\\r\\n\\r\\n")
                local data = sock:receive("*a")
                sock:close()
                local body = data:match("\\r\\n\\r\\n(.*)\$")
                ngx.print(body)
            }
        }

        location /lua/access {
            access_by_lua_block {
                if ngx.var.arg_deny then
                    ngx.exit(403)
                end
            }
            proxy_pass http://%%ORIGIN%%;
        }

        location /lua/filters {
            header_filter_by_lua_block {
                ngx.header["X-Hf"] = "seen"
                ngx.header.content_length = nil
            }
            body_filter_by_lua_block {
                ngx.arg[1] = string.upper(ngx.arg[1])
            }
            proxy_pass http://%%ORIGIN%%;
        }

        location /lua/balancer {
            proxy_pass http://lua_balanced;
        }
EOT

$loc{njs} = <<'EOT';
        location /njs/ {
            js_content main.hit;
        }
EOT

$loc{perl} = <<'EOT';
        location /perl/ {
            perl 'sub {
                my $r = shift;
                $r->header_out("X-Perl", "yes");
                $r->send_http_header("text/plain");
                $r->print("perl hit ", $r->uri, "\n");
                return OK;
            }';
        }
EOT

$loc{echo} = <<'EOT';
        location /echo/ {
            echo_sleep 0.3;
            echo "echo hit $uri";
        }
EOT

$loc{headers_more} = <<'EOT';
        location /more/ {
            more_set_headers "X-More: yes";
            more_clear_headers "X-Uri-Hit";
            proxy_pass http://%%ORIGIN%%;
        }
EOT

$loc{fancyindex} = <<'EOT';
        location /fancy/ {
            alias %%TESTDIR%%/www/;
            fancyindex on;
            fancyindex_exact_size on;
        }
EOT

my $locations = join '', map { $loc{$_} } grep { $have{$_} } sort keys %loc;

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF \$singleflight_status always;

$locations
    }
EOT
}

my $http = <<"EOT";
    singleflight_zone zone=sf:1m;
EOT
$http .= "    js_import main from %%TESTDIR%%/njs.js;\n" if $have{njs};
$http .= <<"EOT" if $have{lua};
    upstream lua_balanced {
        server 0.0.0.1:1;
        balancer_by_lua_block {
            local balancer = require "ngx.balancer"
            assert(balancer.set_current_peer("127.0.0.1", $origin))
        }
    }
EOT

$t->write_config($t->config_template($http . $servers, main => $load));
$t->start;

# The herd (5 on port 0) and the plain request (port 1), at once.
# Returns the herd's results and the plain one.
sub herd_and_plain {
    my ($path, %opt) = @_;
    my @h = map { $t->start_request('GET', $path, timeout => 10, %opt) } 1 .. 5;
    my $p = $t->start_request('GET', $path, port => $t->port(1), timeout => 10, %opt);
    my @res = map { $t->finish_request($_) } @h, $p;
    my $plain = pop @res;
    return (\@res, $plain);
}

# Every client of the herd got the plain answer: status, body (its hit
# stamp aside: each origin request has its own), and the named headers.
sub same_as_plain {
    my ($what, $path, %opt) = @_;
    my $headers = delete $opt{headers_same} // [];
    my ($herd, $plain) = herd_and_plain($path, %opt);
    my $norm = sub { (my $b = $_[0] // '') =~ s/\bhit=\d+/hit=N/gi; $b };
    ok(defined $plain->{status}, "$what: plain nginx answers")
        or return ($herd, $plain);
    my @bad = grep {
        my $r = $_;
        ($r->{status} // 0) != $plain->{status}
        || $norm->($r->{body}) ne $norm->($plain->{body})
        || grep { ($r->{headers}{$_} // '') ne ($plain->{headers}{$_} // '') } @$headers
    } @$herd;
    is(scalar(@bad), 0, "$what: 5 of 5 as plain nginx ($plain->{status})")
        or diag(explain([ map { [ $_->{status}, $_->{error}, $_->{body} ] } @bad[0 .. 0] ]),
                "plain: $plain->{status} $plain->{body}");
    return ($herd, $plain);
}

sub collapsed {
    my ($what, $herd) = @_;
    my %by = SFTest::tally(map { $_->{headers}{'x-sf'} // '' } @$herd)->%*;
    is($by{LEADER} // 0, 1, "$what: one leader")
        or diag(explain(\%by));
    ok(($by{FOLLOWER} // 0) >= 1, "$what: followers");
}

SKIP: {
    skip 'lua not installed', 1 unless $have{lua};

    my ($herd) = same_as_plain('lua ngx.sleep + ngx.header', '/lua/sleep',
                               headers_same => ['x-lua']);
    collapsed('lua content', $herd);

    same_as_plain('lua ngx.exit(403)', '/lua/exit');

    $t->origin_reset;
    ($herd) = same_as_plain('lua ngx.location.capture', '/lua/capture');
    collapsed('lua capture', $herd);
    is($t->origin_hits->{total}, 2, 'lua capture: one origin request each way');

    $t->origin_reset;
    ($herd) = same_as_plain('lua cosocket', '/lua/cosocket');
    collapsed('lua cosocket', $herd);
    is($t->origin_hits->{total}, 2, 'lua cosocket: one origin request each way');

    same_as_plain('access_by_lua allows', '/lua/access?delay=300');
    same_as_plain('access_by_lua denies', '/lua/access?delay=300&deny=1');

    ($herd) = same_as_plain('header_filter_by_lua + body_filter_by_lua',
                            '/lua/filters?delay=300&size=2000',
                            headers_same => ['x-hf']);
    collapsed('lua filters', $herd);

    $t->origin_reset;
    ($herd) = same_as_plain('balancer_by_lua', '/lua/balancer?delay=300');
    collapsed('balancer_by_lua', $herd);
}

SKIP: {
    skip 'njs not installed', 1 unless $have{njs};
    my ($herd) = same_as_plain('njs js_content', '/njs/a', headers_same => ['x-njs']);
    collapsed('njs', $herd);
}

SKIP: {
    skip 'perl not installed', 1 unless $have{perl};
    same_as_plain('perl handler', '/perl/a', headers_same => ['x-perl']);
}

SKIP: {
    skip 'echo not installed', 1 unless $have{echo};
    my ($herd) = same_as_plain('echo', '/echo/a');
    collapsed('echo', $herd);
}

SKIP: {
    skip 'headers-more not installed', 1 unless $have{headers_more};
    my ($herd) = same_as_plain('headers-more', '/more/a?delay=300',
                               headers_same => ['x-more', 'x-uri-hit']);
    collapsed('headers-more', $herd);
}

SKIP: {
    skip 'fancyindex not installed', 1 unless $have{fancyindex};
    same_as_plain('fancyindex', '/fancy/');
}

done_testing;
