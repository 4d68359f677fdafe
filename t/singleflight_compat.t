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
# A module compiled into the binary (OpenResty's lua, with ndk) is used as
# it is, and then a binary other than Debian's runs this file too, with
# those modules only (lua finds resty.core on its own default path, as in
# OpenResty).
#
# lua (content_by_lua with ngx.sleep, ngx.header, ngx.exit,
# ngx.location.capture, a cosocket; access_by_lua, header_filter_by_lua,
# body_filter_by_lua, balancer_by_lua), njs (js_content), perl, echo,
# headers-more, fancyindex; and:
#
# ModSecurity: a herd mixing requests a rule blocks (by a request header,
# so that they have the allowed ones' flight key) with allowed ones, the
# blocked first: each blocked client gets plain nginx's 403, each allowed
# one its 200.  A phase 1 rule denies before this module's phase (the
# allowed ones alone collapse); a phase 3 rule denies in each client's
# header filter (blocked and allowed share one origin request).
# srcache: lookups that miss and stores, both to the origin: the content
# collapses, and each client still makes its lookup and its store, for a
# body in the zone and one read from a temporary file.
# cache_purge: a herd fills a proxy_cache with one origin request and the
# next is answered from it; PURGE, and the herd after it going to the
# origin once, only where a purge does not crash nginx by itself (Debian
# 12's does: see $purge_works).
# brotli: herds asking for br, and mixed with identity: each client gets
# its own encoding, and a br body decodes to plain nginx's body.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $MODULES = $ENV{TEST_NGINX_MODULES} // '/usr/lib/nginx/modules';

my $t = SFTest->new;
$t->skip_without_module;

# modules compiled in, by the directory configure took them from
my $V = `@{[ $t->nginx_binary ]} -V 2>&1`;
my %static;
$static{lua} = 1 if $V =~ m{--add-module=(?:\S*/)?(?:lua-nginx-module|ngx_lua)\b};

# Debian's modules are built for Debian's nginx only
my $debian = $t->nginx_binary eq '/usr/sbin/nginx' || $ENV{TEST_NGINX_MODULES};
plan skip_all => "Debian's modules load into /usr/sbin/nginx only, not "
                 . $t->nginx_binary . ", which has none compiled in"
    unless $debian || %static;

$t->start_origin;

# name => [ .so files ], per module family
my %so = (
    lua          => [ 'ndk_http_module.so', 'ngx_http_lua_module.so' ],
    njs          => [ 'ngx_http_js_module.so' ],
    perl         => [ 'ngx_http_perl_module.so' ],
    echo         => [ 'ngx_http_echo_module.so' ],
    headers_more => [ 'ngx_http_headers_more_filter_module.so' ],
    fancyindex   => [ 'ngx_http_fancyindex_module.so' ],
    modsecurity  => [ 'ngx_http_modsecurity_module.so' ],
    srcache      => [ 'ngx_http_srcache_filter_module.so' ],
    cache_purge  => [ 'ngx_http_cache_purge_module.so' ],
    brotli       => [ 'ngx_http_brotli_filter_module.so' ],
    image_filter => [ 'ngx_http_image_filter_module.so' ],
);

my %have;
for my $m (sort keys %so) {
    $have{$m} = $static{$m}
        || $debian && !grep { !-f "$MODULES/$_" } @{ $so{$m} };
    diag("$m: not installed ($MODULES), skipped")
        if !$have{$m} && $debian;
    diag("$m: not compiled into " . $t->nginx_binary . ", skipped")
        if !$have{$m} && !$debian;
}

plan skip_all => 'none of the third-party modules is installed'
    unless grep { $_ } values %have;

my $load = join "\n", map { "load_module $MODULES/$_;" }
    map { @{ $so{$_} } } grep { $have{$_} && !$static{$_} } sort keys %so;

$t->write_file('njs.js', <<'EOT');
function hit(r) {
    setTimeout(function () {
        r.headersOut['X-Njs'] = 'yes';
        r.return(200, 'njs hit ' + r.uri + '\n');
    }, 300);
}
export default { hit };
EOT

# ModSecurity: a request header decides, so that a blocked request and an
# allowed one have the same flight key; X-Attack is checked with the
# request headers (phase 1, ModSecurity's rewrite phase handler), X-Late
# with the response headers (phase 3, its header filter).
$t->write_file('modsec.conf', <<'EOT');
SecRuleEngine On
SecRequestBodyAccess Off
SecResponseBodyAccess Off
SecAuditEngine Off
SecRule REQUEST_HEADERS:X-Attack "@streq 1" \
    "id:900001,phase:1,deny,status:403,log,msg:'sftest attack header'"
SecRule REQUEST_HEADERS:X-Late "@streq 1" \
    "id:900002,phase:3,deny,status:403,log,msg:'sftest late header'"
EOT

# phase 4: a response body naming SECRET is denied, where nginx has sent
# its header already (each client's own ModSecurity judges it at the end)
$t->write_file('modsec_body.conf', <<'EOT');
SecRuleEngine On
SecRequestBodyAccess Off
SecResponseBodyAccess On
SecResponseBodyMimeType text/plain
SecResponseBodyLimit 1048576
SecAuditEngine Off
SecRule RESPONSE_BODY "@contains SECRET" \
    "id:900003,phase:4,deny,status:403,log,msg:'sftest body'"
EOT

mkdir $t->path('www');
$t->write_file("www/$_.txt", "file $_\n") for qw(a b c);

# a PNG of 256x256 noise (196 KB, which deflate cannot shrink), for
# image_filter: read in pieces, as from any network, over 2 s
{
    require Compress::Zlib;
    srand(42);
    my $raw = join '', map { "\0" . join('', map { chr(int rand 256) } 1 .. 768) } 1 .. 256;
    my $chunk = sub {
        my ($type, $data) = @_;
        pack('N', length $data) . $type . $data . pack('N', Compress::Zlib::crc32($type . $data));
    };
    $t->write_file('www/noise.png', "\x89PNG\r\n\x1a\n"
        . $chunk->('IHDR', pack('NNCCCCC', 256, 256, 8, 2, 0, 0, 0))
        . $chunk->('IDAT', Compress::Zlib::compress($raw)) . $chunk->('IEND', ''));
}

my $origin = $t->origin_port;

# Debian 12's cache_purge (2.3-4) takes nginx 1.22.1's worker down
# (SIGSEGV in ngx_http_file_cache_create_key(), called from
# ngx_http_cache_purge_init()) on a purge of any kind, without this module
# loaded as with it.  An nginx of its own, without this module, asks first:
# a purge that works is tested against this module, one that crashes is
# skipped.
my $purge_works;
if ($have{cache_purge}) {
    my $p = SFTest->new;
    # its crash, and under make test-asan the sanitizer's report of it
    # (this nginx does not load our module)
    $p->allow_log(qr/worker process \d+ exited on signal/, qr/AddressSanitizer/);
    $p->write_config($p->config_template(<<"EOT", module => 0,
    proxy_cache_path %%TESTDIR%%/cache keys_zone=probe:1m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_cache probe;
            proxy_cache_key \$uri;
            proxy_cache_valid 200 1h;
            proxy_cache_purge PURGE from 127.0.0.1;
            proxy_pass http://127.0.0.1:$origin;
        }
    }
EOT
        main => "load_module $MODULES/ngx_http_cache_purge_module.so;"));
    $p->start;
    $p->get('/purge-probe');
    my $status = $p->http('PURGE', '/purge-probe')->{status};
    $purge_works = ($status // 0) == 200;
    my ($crash) = $p->error_log_since(0) =~ /(exited on signal \d+)/;
    diag("cache_purge: a purge does not work without this module ("
         . ($crash // 'status ' . ($status // 'none')) . "), PURGE not tested")
        unless $purge_works;
    $p->stop;
}

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

        # $r->sleep: a delay on the request's connection, in the fetch
        # the module's own; it must end as nginx ends one
        location /perl_sleep/ {
            perl 'sub {
                my $r = shift;
                $r->sleep(200, sub {
                    my $r = shift;
                    $r->send_http_header("text/plain");
                    $r->print("perl slept ", $r->uri, "\n");
                    return OK;
                });
                return OK;
            }';
        }
EOT

$loc{echo} = <<'EOT';
        location /echo/after/ {
            echo_after_body "echo after";
            proxy_pass http://%%ORIGIN%%;
        }

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

$loc{modsecurity} = <<'EOT';
        location /modsec/ {
            modsecurity on;
            modsecurity_rules_file %%TESTDIR%%/modsec.conf;
            proxy_pass http://%%ORIGIN%%;
        }

        # an X-Accel-Redirect of the origin into /modsec/, whose handler
        # reads the request body of every request it runs for
        location /modsec_xa/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /modsec_body/ {
            modsecurity on;
            modsecurity_rules_file %%TESTDIR%%/modsec_body.conf;
            proxy_pass http://%%ORIGIN%%;
        }
EOT

# srcache: every lookup misses (the origin answers 404), every store is a
# PUT to the origin; both are subrequests, counted by the origin per URI.
# A store starts once its client has the whole response: a client that
# then closes would abort it (499), module or not, but for
# proxy_ignore_client_abort.
$loc{srcache} = <<'EOT';
        location /src/ {
            srcache_fetch GET /sc_fetch status=404&key=$server_port$uri;
            srcache_store PUT /sc_store key=$server_port$uri;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /sc_fetch {
            internal;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /sc_store {
            internal;
            proxy_ignore_client_abort on;
            proxy_pass http://%%ORIGIN%%;
        }
EOT

# cache_purge: a PURGE in the cached location itself (its handler wraps
# proxy_pass's); the port in the cache key keeps the two servers apart
$loc{cache_purge} = <<'EOT';
        location /purge/ {
            proxy_cache purge;
            proxy_cache_key $server_port$uri$is_args$args;
            proxy_cache_valid 200 1h;
            proxy_cache_purge PURGE from 127.0.0.1;
            proxy_pass http://%%ORIGIN%%;
        }
EOT

$loc{image_filter} = <<'EOT';
        location /img/ {
            image_filter resize 50 40;
            proxy_pass http://127.0.0.1:%%PORT_2%%/;
        }
EOT

$loc{brotli} = <<'EOT';
        location /br/ {
            brotli on;
            brotli_types text/plain;
            proxy_pass http://%%ORIGIN%%;
        }
EOT

my $locations = join '', map { $loc{$_} } grep { $have{$_} } sort keys %loc;

my $servers = '';
for my $i (0, 1) {
    # other modules' content is collapsed when asked (content=any)
    my $sf = $i == 0 ? 'sf content=any' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF \$singleflight_status always;

$locations
    }
EOT
}

# the image's server: its header after 400 ms (an auth_request to the
# origin), its body at 100 KB/s
$servers .= <<"EOT" if $have{image_filter};
    server {
        listen 127.0.0.1:%%PORT_2%%;

        location / {
            auth_request /img-wait;
            root %%TESTDIR%%/www;
            limit_rate 100k;
        }

        location = /img-wait {
            proxy_pass http://%%ORIGIN%%/img-wait?delay=400;
        }
    }
EOT

my $http = <<"EOT";
    singleflight_zone zone=sf:1m;
EOT
$http .= "    js_import main from %%TESTDIR%%/njs.js;\n" if $have{njs};
$http .= "    proxy_cache_path %%TESTDIR%%/purge_cache keys_zone=purge:1m;\n"
    if $have{cache_purge};
$http .= <<"EOT" if $have{lua};
    upstream lua_balanced {
        server 0.0.0.1:1;
        balancer_by_lua_block {
            local balancer = require "ngx.balancer"
            assert(balancer.set_current_peer("127.0.0.1", $origin))
        }
    }
EOT

# ModSecurity's phase 4 deny, with the module or without: nginx has sent
# the header already
$t->allow_log(qr/header already sent/);

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

# Requests of several kinds at once: on port 0 one per element of
# @$herd_opts, on port 1 one per element of @$plain_opts (request options,
# e.g. headers), each list in that order.  Returns both lists' results.
sub mixed_herd {
    my ($path, $herd_opts, $plain_opts) = @_;
    my @h = map { $t->start_request('GET', $path, timeout => 10, %$_) } @$herd_opts;
    my @p = map { $t->start_request('GET', $path, port => $t->port(1), timeout => 10, %$_) }
        @$plain_opts;
    my @res = @{ $t->finish_all([ @h, @p ]) };
    return ([ @res[ 0 .. $#h ] ], [ @res[ @h .. $#res ] ]);
}

# A body with its hit stamp made anonymous (each origin request has its own).
sub norm { (my $b = $_[0] // '') =~ s/\bhit=\d+/hit=N/gi; $b }

# Requests the origin got for one "/path?query" (0 if none).
sub uri_hits { $t->origin_uri_hits($_[0]) }

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

    # alone: nobody waits, so it goes its own way, through its own
    # filters (lua's among them) as without the module
    my @lone = map { $t->get('/lua/filters?size=2000', port => $t->port($_)) } 0, 1;
    is($lone[0]{headers}{'x-sf'} // '', 'DIRECT', 'lua filters, alone: its own way');
    is($lone[0]{headers}{'x-hf'} // '', 'seen', 'lua filters, alone: header filter');
    is(norm($lone[0]{body}), norm($lone[1]{body}),
       'lua filters, alone: body filter, as plain nginx');
    like($lone[0]{body} // '', qr/^[^a-z]+$/, 'lua filters, alone: upper case');

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
    my ($herd) = same_as_plain('perl $r->sleep', '/perl_sleep/a');
    collapsed('perl $r->sleep', $herd);

    # perl's responses answer no conditionals (disable_not_modified):
    # nginx answers If-Match with the 200, for every reader too
    ($herd) = same_as_plain('perl If-Match', '/perl_sleep/if-match',
                            headers => [ 'If-Match' => '"other"' ]);
    is($herd->[0]{status}, 200, 'perl If-Match: 200, as plain nginx');
}

SKIP: {
    skip 'echo not installed', 1 unless $have{echo};
    my ($herd) = same_as_plain('echo', '/echo/a');
    collapsed('echo', $herd);

    ($herd) = same_as_plain('echo_after_body', '/echo/after/a?delay=300');
    collapsed('echo_after_body', $herd);

    # alone, its own way, through echo's filter as without the module
    my @lone = map { $t->get('/echo/after/b', port => $t->port($_)) } 0, 1;
    is($lone[0]{headers}{'x-sf'} // '', 'DIRECT', 'echo_after_body, alone: its own way');
    is(norm($lone[0]{body}), norm($lone[1]{body}),
       'echo_after_body, alone: as plain nginx');
    like($lone[0]{body} // '', qr/echo after\n\z/, 'echo_after_body, alone: appended');

    # the fetch redirected into echo_location, whose content takes in its
    # subrequest's output below this module's filter: each client its own
    # way, with plain nginx's answer.  An nginx with echo alone (with lua
    # or ModSecurity loaded too, every redirect counts as checked
    # elsewhere, and nobody reads such a fetch).
    my $e = SFTest->new;
    $e->start_origin;
    my $eservers = '';
    for my $i (0, 1) {
        $eservers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight @{[ $i ? 'off' : 'sf' ]};

        location /xa/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /loc/ {
            echo_location /inner;
            echo "echo after the location";
        }

        location = /inner {
            echo "echo inner";
        }

        location /any/ {
            singleflight @{[ $i ? 'off' : 'sf content=any' ]};
            echo_sleep 0.3;
            echo_location /inner;
            echo "echo after the location";
        }
    }
EOT
    }
    $e->write_config($e->config_template("    singleflight_zone zone=sf:1m;\n" . $eservers,
        main => "load_module $MODULES/ngx_http_echo_module.so;"));
    $e->start;
    my $path = '/xa/a?delay=300&hdr=X-Accel-Redirect:/loc/';
    my @h = map { $e->start_request('GET', $path, timeout => 10) } 1 .. 5;
    my $p = $e->get($path, port => $e->port(1));
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{body} eq $p->{body} }
              map { $e->finish_request($_) } @h), 5,
       'X-Accel-Redirect to echo_location: 5 of 5 as plain nginx');

    # content=any where echo_location makes the content: not collapsed
    @h = map { $e->start_request('GET', '/any/a', timeout => 10) } 1 .. 5;
    $p = $e->get('/any/a', port => $e->port(1));
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{body} eq $p->{body} }
              map { $e->finish_request($_) } @h), 5,
       'echo_location with content=any: 5 of 5 as plain nginx');
    $e->stop;
}

SKIP: {
    skip 'image_filter not installed', 1 unless $have{image_filter};

    # it gathers the whole image before it resizes it: followers feed it
    # on, they do not wait for their socket
    my ($herd, $plain) = same_as_plain('image_filter', '/img/noise.png');
    collapsed('image_filter', $herd);
    like($plain->{body} // '', qr/^\x89PNG/, 'image_filter: a PNG, resized');
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

SKIP: {
    skip 'modsecurity not installed', 1 unless $have{modsecurity};

    # Blocked requests first and in between: one that the module took for
    # a flight's leader or follower before ModSecurity saw it would get
    # the origin's 200.  Phase 1 denies before this module's phase (no
    # flight: the allowed ones collapse alone); phase 3 denies in each
    # client's own header filter (blocked and allowed share a flight, and
    # each blocked client still gets its 403).
    my @order = (1, 0, 1, 0, 1, 0, 0);    # 1: blocked
    for my $rule (['X-Attack', 'phase 1', 2], ['X-Late', 'phase 3', 3]) {
        my ($name, $phase, $origin_hits) = @$rule;
        my $what = "modsecurity $phase ($name)";
        my $path = '/modsec/a?delay=300&rule=' . lc $name;
        my $bad = { headers => [ $name => '1' ] };
        $t->origin_reset;
        my ($herd, $plain) = mixed_herd($path, [ map { $_ ? $bad : {} } @order ],
                                        [ {}, $bad ]);
        my ($ok, $no) = @$plain;
        is($ok->{status}, 200, "$what: plain nginx allows");
        is($no->{status}, 403, "$what: plain nginx blocks");
        my @blocked = @$herd[ grep { $order[$_] } 0 .. $#order ];
        my @allowed = @$herd[ grep { !$order[$_] } 0 .. $#order ];
        is(scalar(grep { ($_->{status} // 0) == 403 && $_->{body} eq $no->{body} }
                  @blocked), scalar(@blocked),
           "$what: every blocked request gets plain nginx's 403")
            or diag(explain([ map { [ $_->{status}, $_->{headers}{'x-sf'}, $_->{body} ] }
                              @blocked ]));
        is(scalar(grep { ($_->{status} // 0) == 200 && norm($_->{body}) eq norm($ok->{body}) }
                  @allowed), scalar(@allowed),
           "$what: every allowed request gets plain nginx's 200")
            or diag(explain([ map { [ $_->{status}, $_->{headers}{'x-sf'} ] } @allowed ]));
        # phase 3: a blocked first request, going its own way
        # (singleflight_lone direct), cannot feed the flight the others
        # made: one of them fetches it, one origin request more
        my $hits = uri_hits($path);
        ok($hits == $origin_hits || ($phase eq 'phase 3' && $hits == $origin_hits + 1),
           "$what: origin requests: 1 for the herd (2 if its first was blocked), "
           . "1 per plain request let through")
            or diag("got $hits");
        if ($phase eq 'phase 1') {
            is(scalar(grep { ($_->{headers}{'x-sf'} // '') =~ /^(LEADER|FOLLOWER)$/ }
                      @blocked), 0, "$what: no blocked request is in a flight");
            collapsed($what, \@allowed);
        }
    }

    # the fetch redirected into a location with ModSecurity: its answer,
    # not a worker gone (its handler read the fetch's request body)
    same_as_plain('modsecurity behind X-Accel-Redirect',
                  '/modsec_xa/a?delay=300&hdr=X-Accel-Redirect:/modsec/xa');

    # a phase 4 deny after the header: each client gets every byte, as
    # plain nginx sends them (its end comes in a buffer of its own)
    my ($herd, $plain) = same_as_plain('modsecurity phase 4',
        '/modsec_body/SECRET?delay=300&size=300000&pace=20000:50');
    is(scalar(grep { length($_->{body} // '') == 300000 } @$herd, $plain), 6,
       'modsecurity phase 4: every body whole');
}

SKIP: {
    skip 'srcache not installed', 1 unless $have{srcache};

    # 2000 bytes are kept in the zone; 600000 are past singleflight_memory
    # (256k), and readers get the rest from a temporary file: srcache
    # stores only what it sees in memory (filter_need_in_memory)
    for my $size (2000, 600000) {
        my $what = "srcache, $size bytes";
        my $uri = "/src/s$size";
        my $path = "$uri?delay=300&size=$size";
        $t->origin_reset;
        my $log = $t->log_offset;
        # each client waits for nginx to close its connection: srcache
        # stores once the body has gone, and a client that left at the
        # last byte would cut that store short, with or without us
        my ($herd) = same_as_plain($what, $path, until_close => 1);
        collapsed($what, $herd);
        is(uri_hits($path), 2, "$what: one content request each way");
        my %want = map {
            my ($port, $n) = @$_;
            ("/sc_fetch?status=404&key=$port$uri" => $n, "/sc_store?key=$port$uri" => $n)
        } [ $t->port(0), 5 ], [ $t->port(1), 1 ];
        my $got = sub { +{ map { $_ => uri_hits($_) } keys %want } };
        $t->wait_for(sub { !grep { $got->()->{$_} < $want{$_} } keys %want },
                     what => "$what: srcache's subrequests");
        is_deeply($got->(), \%want,
                  "$what: a srcache lookup and a store per client, as plain nginx");
        is($t->log_count(qr/srcache_store: skipped|srcache_store subrequest failed/, $log),
           0, "$what: no store skipped");
    }
}

SKIP: {
    skip 'cache_purge not installed', 1 unless $have{cache_purge};

    my $what = 'cache_purge';
    my $path = '/purge/a?delay=300';
    my $files = sub { my @f = glob($t->path('purge_cache') . '/*'); scalar @f };
    $t->origin_reset;
    my ($herd) = same_as_plain("$what: a herd fills the cache", $path);
    collapsed("$what: the herd that fills the cache", $herd);
    is(uri_hits($path), 2, "$what: one origin request each way");
    $t->wait_for(sub { $files->() == 2 }, what => 'both servers\' cache entries');

    same_as_plain("$what: from the cache", $path);
    is(uri_hits($path), 2, "$what: from the cache, no origin request");

    skip 'cache_purge: PURGE crashes nginx without this module', 10 unless $purge_works;

    my @purge = map { $t->http('PURGE', $path, port => $t->port($_)) } 0, 1;
    is($purge[1]{status}, 200, "$what: PURGE, plain nginx");
    is($purge[0]{status}, $purge[1]{status}, "$what: PURGE as plain nginx");
    is($files->(), 0, "$what: the entries are gone");

    @purge = map { $t->http('PURGE', $path, port => $t->port($_)) } 0, 1;
    is($purge[1]{status}, 404, "$what: PURGE again, nothing there, plain nginx");
    is($purge[0]{status}, $purge[1]{status}, "$what: PURGE again as plain nginx");

    ($herd) = same_as_plain("$what: after the purge", $path);
    collapsed("$what: after the purge", $herd);
    is(uri_hits($path), 4, "$what: after the purge, the origin once more each way");
}

SKIP: {
    skip 'brotli not installed', 1 unless $have{brotli};

    my $decoder = grep { -x "$_/brotli" } split /:/, $ENV{PATH};
    diag('brotli: no brotli command (package brotli), bodies not decoded')
        unless $decoder;
    my $n = 0;
    my $unbr = sub {
        my ($body) = @_;
        return undef unless $decoder;
        my $file = $t->write_file('br-' . ++$n, $body);
        open(my $fh, '-|', 'brotli', '-d', '-c', $file) or return undef;
        local $/;
        my $out = <$fh>;
        close($fh) or return undef;
        return $out;
    };

    my $br = { headers => [ 'Accept-Encoding' => 'br' ] };
    my $id = { headers => [ 'Accept-Encoding' => 'identity' ] };
    my $size = 3000;
    my $path = "/br/a?delay=300&size=$size";

    # the herd asks for br, and a herd where every other client does not
    for my $round ([ 'brotli', [ ($br) x 5 ] ],
                   [ 'brotli, mixed with identity', [ $br, $id, $br, $id, $br ] ]) {
        my ($what, $opts) = @$round;
        $t->origin_reset;
        my ($herd, $plain) = mixed_herd($path, $opts, [ $br, $id ]);
        my ($pbr, $pid) = @$plain;
        is($pbr->{headers}{'content-encoding'} // '', 'br', "$what: plain nginx compresses");
        is(length($pid->{body}), $size, "$what: plain nginx, identity");
        my $want = norm($unbr->($pbr->{body}) // $pid->{body});
        is(norm($unbr->($pbr->{body}) // ''), norm($pid->{body}),
           "$what: plain nginx's br decodes to its identity body") if $decoder;
        my @bad;
        for my $i (0 .. $#$herd) {
            my ($r, $asks_br) = ($herd->[$i], $opts->[$i] == $br);
            my $ce = $r->{headers}{'content-encoding'} // '';
            my $body = $asks_br ? $unbr->($r->{body}) : $r->{body};
            push @bad, [ $i, $r->{status}, $ce, length($r->{body} // '') ]
                if ($r->{status} // 0) != 200 || $ce ne ($asks_br ? 'br' : '')
                || ($decoder || !$asks_br) && norm($body) ne $want;
        }
        is(scalar(@bad), 0, "$what: 5 of 5 as plain nginx (encoding and body)")
            or diag(explain(\@bad));
        collapsed($what, $herd);
        is(uri_hits($path), 3, "$what: one origin request for the herd");
    }

    # A body in pieces: nginx's upstream flushes none of them before the
    # end, and no reader does either (a flush ends a brotli block), so
    # the compressed bytes are those without the module.
    $path = '/br/b?fixed=1&size=300000&fail=slowbody&pieces=6&delay=150';
    my ($herd, $plain) = mixed_herd($path, [ ($br) x 5 ], [ $br ]);
    is(scalar(grep { ($_->{headers}{'content-encoding'} // '') eq 'br' && $_->{complete}
                     && $_->{body} eq $plain->[0]{body} } @$herd), 5,
       'brotli, a body in pieces: the bytes plain nginx sends, 5 of 5')
        or diag(length($plain->[0]{body}) . ' bytes without the module, with it: '
                . join(' ', map { length($_->{body} // '') } @$herd));
    is(uri_hits($path), 2, 'brotli, a body in pieces: one origin request for the herd');
}

done_testing;
