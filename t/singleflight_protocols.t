#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_protocols: followers are served whatever the client speaks
# and however the origin frames its response.
#
#   * HTTP/1.0 clients (no chunked encoding: close-delimited, as without
#     the module, when the origin sent no Content-Length);
#   * HTTP/1.1 keep-alive: a connection's successive requests follow, lead,
#     follow again; pipelined requests follow in order;
#   * HTTP/2: many streams of one connection collapse into one origin
#     request (h2load, nghttp; curl --parallel over TLS), and HTTP/1.1 and HTTP/2
#     clients of one server and port (TLS, ALPN) share flights both ways;
#   * TLS: a "listen ... ssl http2" server, HTTP/2 and HTTP/1.1 over TLS,
#     and an https:// upstream;
#   * origin responses chunked or with Content-Length, with and without
#     "Connection: close", empty and over several buffers;
#   * gzip: each follower is compressed by its own Accept-Encoding from
#     one shared plain response.
#
# Needs curl, nghttp, h2load (nghttp2-client) and openssl; the parts that
# need a missing one are skipped.

use strict;
use warnings;

use Test::More;
use IO::Select;
use IO::Socket::INET;
use IO::Uncompress::Gunzip qw(gunzip $GunzipError);
use POSIX qw(WNOHANG);
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

sub which {
    my ($prog) = @_;
    for (split /:/, $ENV{PATH} // '/usr/bin:/bin') {
        return "$_/$prog" if -x "$_/$prog";
    }
    return undef;
}

my %have = map { $_ => which($_) } qw(curl nghttp h2load openssl);

# a self-signed certificate for the TLS servers
my $tls = $have{openssl} && $t->tls_certificate;
diag('openssl failed: ' . $t->read_file('openssl.out')) if $have{openssl} && !$tls;

my $tls_servers = !$tls ? '' : <<'EOT';
    # an https:// upstream in front of the origin
    server {
        listen 127.0.0.1:%%PORT_1%% ssl;
        ssl_certificate %%TESTDIR%%/cert.pem;
        ssl_certificate_key %%TESTDIR%%/key.pem;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }

    # TLS with HTTP/2 and HTTP/1.1 clients
    server {
        listen 127.0.0.1:%%PORT_3%% ssl http2;
        ssl_certificate %%TESTDIR%%/cert.pem;
        ssl_certificate_key %%TESTDIR%%/key.pem;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /xgz/ {
            singleflight sf;
            gzip on;
            gzip_types text/plain;
            gzip_min_length 0;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /xgzoff/ {
            singleflight off;
            gzip on;
            gzip_types text/plain;
            gzip_min_length 0;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

my $tls_upstream = !$tls ? '' : <<'EOT';
        location /tlsup/ {
            singleflight sf;
            proxy_pass https://127.0.0.1:%%PORT_1%%;
            proxy_ssl_verify off;
            add_header X-SF $singleflight_status always;
        }
EOT

$t->write_config($t->config_template(<<"EOT"));
    log_format sfp '\$pid \$connection \$server_protocol \$singleflight_status \$status \$request_uri';
    access_log %%TESTDIR%%/sf.log sfp;

    singleflight_zone zone=sf:4m;

    # the key leaves the scheme and host out; a flight is still one
    # server's, on one port (docs/directives.md, singleflight_key): HTTP/1 and HTTP/2
    # clients share it where one server and port speak both (TLS, ALPN)
    singleflight_key \$request_uri;

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        add_header X-SF \$singleflight_status always;
        add_header X-Conn "\$connection/\$connection_requests" always;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        # HTTP/1.1 to the origin: chunked=1 is honoured
        location /v11/ {
            singleflight sf;
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        location /gz/ {
            singleflight sf;
            gzip on;
            gzip_types text/plain;
            gzip_min_length 0;
            proxy_pass http://%%ORIGIN%%;
        }

        location /gzoff/ {
            singleflight off;
            gzip on;
            gzip_types text/plain;
            gzip_min_length 0;
            proxy_pass http://%%ORIGIN%%;
        }

$tls_upstream
        location = /stats {
            singleflight_stats;
        }
    }

    # HTTP/2 without TLS (prior knowledge)
    server {
        listen 127.0.0.1:%%PORT_2%% http2;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF \$singleflight_status always;
        }
    }

$tls_servers
EOT

$t->start;

# ------------------------------------------------------------ helpers

sub wait_origin {
    my ($target, $n) = @_;
    $t->wait_for(sub { $t->origin_uri_hits($target) >= ($n // 1) },
                 what => "origin to get $target");
}

sub wait_waiters {
    my ($n) = @_;
    $t->wait_zone(sub { ($_[0]{waiters} // 0) >= $n }, what => "$n followers waiting");
}

# the access log lines of one URI, once n are there: [pid, connection,
# protocol, sf, status]
sub wait_logged {
    my ($uri, $n) = @_;
    return map { [ @$_{qw(pid conn proto sf status)} ] }
        $t->wait_log_records('sf.log', [qw(pid conn proto sf status uri)], $n, uri => $uri);
}

sub show {
    my ($r) = @_;
    return { status => $r->{status}, error => $r->{error}, headers => $r->{headers},
        body_len => length($r->{body} // '') };
}

my ($BG, $CURL) = (0, 0);

# Runs a command in the background, output to files; returns a handle.
sub run_bg {
    my (@cmd) = @_;
    my $n = ++$BG;
    my ($out, $err) = ($t->path("cmd-$n.out"), $t->path("cmd-$n.err"));
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $out) or POSIX::_exit(126);
        open(STDERR, '>', $err) or POSIX::_exit(126);
        exec(@cmd) or POSIX::_exit(127);
    }
    return { pid => $pid, out => $out, err => $err, cmd => "@cmd" };
}

# Waits for a background command: (exit code, stdout, stderr).
sub wait_bg {
    my ($h, $timeout) = @_;
    my $rc;
    my $done = $t->wait_for(sub {
        return 0 unless waitpid($h->{pid}, WNOHANG) == $h->{pid};
        $rc = $? >> 8;
        return 1;
    }, timeout => $timeout // 20, what => "$h->{cmd} to finish");
    if (!$done) {
        kill 'KILL', $h->{pid};
        waitpid($h->{pid}, 0);
        $rc = -1;
    }
    return ($rc, $t->read_file($h->{out}), $t->read_file($h->{err}));
}

sub run_cmd { wait_bg(run_bg(@_)) }

# curl with N transfers of one URL in parallel (multiplexed on one
# connection when the protocol allows); returns a list of
# { code, size, version, sf, hit, length, connects, body }.
my $CURL_W = '%{http_code}|%{size_download}|%{http_version}|%header{x-sf}|%header{x-hit}'
    . '|%header{content-length}|%{num_connects}|%header{content-encoding}|%{filename_effective}\n';

sub curl_start {
    my ($n, $url, @opt) = @_;
    my $tag = ++$CURL;
    my @args = ($have{curl}, '-sS', '--max-time', 15, '--parallel', '--parallel-max', 100,
        '-w', $CURL_W, @opt);
    push @args, '-o', $t->path("curl-$tag-$_.body"), $url for 1 .. $n;
    return run_bg(@args);
}

sub curl_finish {
    my ($h) = @_;
    my ($rc, $out, $err) = wait_bg($h);
    diag("curl exit $rc: $err") if $rc;
    return map {
        my %r;
        @r{qw(code size version sf hit length connects encoding file)} = split /\|/, $_, -1;
        $r{body} = $t->read_file($r{file});
        \%r;
    } grep { length } split /\n/, $out;
}

sub curl { curl_finish(curl_start(@_)) }

# A raw HTTP/1.1 connection for keep-alive and pipelining.
sub conn_open {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0),
        Proto => 'tcp', Timeout => 5) or die "connect: $!";
    binmode $s;
    return { sock => $s, buf => '' };
}

sub conn_send {
    my ($c, $bytes) = @_;
    my $off = 0;
    while ($off < length $bytes) {
        my $n = syswrite($c->{sock}, $bytes, length($bytes) - $off, $off);
        die "write: $!" unless defined $n;
        $off += $n;
    }
}

sub req {
    my ($uri, $close) = @_;
    return "GET $uri HTTP/1.1\r\nHost: localhost\r\n"
        . ($close ? "Connection: close\r\n" : '') . "\r\n";
}

# Reads one response off a connection (Content-Length or chunked; a
# close-delimited one up to EOF).  Returns {status, headers, body,
# chunked, eof} or {error}.
sub conn_read {
    my ($c, $timeout) = @_;
    my $deadline = time + ($timeout // 10);
    my $sel = IO::Select->new($c->{sock});
    my $res;
    while (1) {
        $res = parse_one(\$c->{buf}, $c->{eof});
        return $res if $res;
        return { error => 'eof before a complete response' } if $c->{eof};
        my $left = $deadline - time;
        return { error => 'timeout' } if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($c->{sock}, $c->{buf}, 65536, length $c->{buf});
        return { error => "read: $!" } unless defined $n;
        $c->{eof} = 1 if $n == 0;
    }
}

# EOF on the connection within $timeout?
sub conn_eof {
    my ($c, $timeout) = @_;
    return 1 if $c->{eof} && !length $c->{buf};
    my $sel = IO::Select->new($c->{sock});
    return 0 unless $sel->can_read($timeout // 3);
    my $n = sysread($c->{sock}, my $junk, 65536);
    return defined $n && $n == 0;
}

sub parse_one {
    my ($buf, $eof) = @_;
    my $end = index($$buf, "\r\n\r\n");
    return undef if $end < 0;
    my $head = substr($$buf, 0, $end + 4);
    my ($line, @lines) = split /\r\n/, $head;
    my ($status) = $line =~ m{^HTTP/\d\.\d (\d{3})} or return { error => "bad status line $line" };
    my %h;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*?)\s*$/ or next;
        $h{ lc $k } = exists $h{ lc $k } ? "$h{lc $k}, $v" : $v;
    }
    my $pos = $end + 4;
    my $body = '';
    if (($h{'transfer-encoding'} // '') =~ /chunked/i) {
        while (1) {
            my $eol = index($$buf, "\r\n", $pos);
            return undef if $eol < 0;
            my $size = hex substr($$buf, $pos, $eol - $pos);
            if ($size == 0) {
                my $tend = index($$buf, "\r\n", $eol + 2);    # no trailers expected
                return undef if $tend < 0;
                $pos = $tend + 2;
                last;
            }
            return undef if length($$buf) < $eol + 2 + $size + 2;
            $body .= substr($$buf, $eol + 2, $size);
            $pos = $eol + 2 + $size + 2;
        }
    }
    elsif (defined $h{'content-length'}) {
        return undef if length($$buf) < $pos + $h{'content-length'};
        $body = substr($$buf, $pos, $h{'content-length'});
        $pos += $h{'content-length'};
    }
    elsif ($status =~ /^(?:1|204|304)/) { }
    else {
        return undef unless $eof;
        $body = substr($$buf, $pos);
        $pos = length $$buf;
    }
    substr($$buf, 0, $pos, '');
    return { status => $status, headers => \%h, body => $body,
        chunked => (($h{'transfer-encoding'} // '') =~ /chunked/i ? 1 : 0) };
}

# ------------------------------------------------------------ HTTP/1.0

# The origin chunks (proxy_http_version 1.1); HTTP/1.0 clients cannot be
# sent chunked: every response, the leader's and the followers', ends with
# the connection, as without the module.  A flight passes Content-Length
# on only as the origin gave it (a client gets what its own request would
# have produced): it does not make one up for followers that happen to
# arrive after the body is complete.

my $uri = '/v11/ten?delay=500&size=5000&chunked=1';
my $res = $t->herd(n => 20, path => $uri, http10 => 1);

is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 5000) } @$res), 20,
   'HTTP/1.0: 20 complete responses with the body');
is(scalar(grep { $_->{chunked} } @$res), 0, 'HTTP/1.0: none chunked');
my @fol = grep { ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @$res;
is(scalar(@fol), 19, 'HTTP/1.0: 19 followers');
is(scalar(grep { !defined $_->{headers}{'content-length'} } @$res), 20,
   'HTTP/1.0: no response carries a Content-Length the origin did not send, '
   . 'all are close-delimited');
is($t->origin_uri_hits($uri), 1, 'HTTP/1.0: one origin request');

# ------------------------------------------------------------ HTTP/0.9

# An HTTP/0.9 request has no header, and nginx gives it no header list:
# it goes its own way, as without the module (its worker once died on
# adding CDN-Loop there), alone and while a flight of its URI waits.

sub http09 {
    my ($path) = @_;
    my $c = conn_open();
    conn_send($c, "GET $path\r\n");
    my $sel = IO::Select->new($c->{sock});
    my $deadline = time + 10;
    while ($sel->can_read($deadline - time)) {
        my $n = sysread($c->{sock}, $c->{buf}, 65536, length $c->{buf});
        last unless $n;
    }
    return $c->{buf};
}

$t->origin_reset;
is(http09('/h09/a?size=50'), SFTest::origin_body(1, '/h09/a?size=50', 50),
   'HTTP/0.9: a lone request gets the body, no header');

my @h09 = map { $t->start_request('GET', '/h09/b?delay=600&size=60') } 1 .. 2;
wait_origin('/h09/b?delay=600&size=60');
is(http09('/h09/b?delay=600&size=60'),
   SFTest::origin_body(3, '/h09/b?delay=600&size=60', 60),
   'HTTP/0.9: beside a flight of its URI, its own origin request');
is(scalar(grep { ($_->{status} // 0) == 200 } map { $t->finish_request($_) } @h09),
   2, 'HTTP/0.9: the flight beside it is whole');
is($t->origin_hits->{total}, 3, 'HTTP/0.9: 3 origin requests, 2 of them its own');

# ------------------------------------------------------------ keep-alive

# One keep-alive connection: follows a flight, follows another, leads a
# third that others follow, then closes.

$t->origin_reset;
my $c = conn_open();
my @conn_res;

my $l = $t->start_request('GET', '/ka/a?delay=600');
wait_origin('/ka/a?delay=600');
conn_send($c, req('/ka/a?delay=600'));
wait_waiters(1);
push @conn_res, conn_read($c);
my $lr = $t->finish_request($l);

$l = $t->start_request('GET', '/ka/b?delay=600&chunked=1&size=3000');
wait_origin('/ka/b?delay=600&chunked=1&size=3000');
conn_send($c, req('/ka/b?delay=600&chunked=1&size=3000'));
wait_waiters(1);
push @conn_res, conn_read($c);
$t->finish_request($l);

conn_send($c, req('/ka/c?delay=600&size=2000'));
wait_origin('/ka/c?delay=600&size=2000');
my @others = map { $t->start_request('GET', '/ka/c?delay=600&size=2000') } 1 .. 3;
wait_waiters(3);
push @conn_res, conn_read($c);
my @ores = map { $t->finish_request($_) } @others;

conn_send($c, req('/ka/d', 1));
push @conn_res, conn_read($c);

is(join(' ', map { $_->{status} // $_->{error} } @conn_res), '200 200 200 200',
   'keep-alive: 4 responses on one connection');
is(join(' ', map { $_->{headers}{'x-sf'} // '-' } @conn_res), 'FOLLOWER FOLLOWER LEADER DIRECT',
   'keep-alive: followed, followed, led, alone');
is($conn_res[0]{body}, SFTest::origin_body(1, '/ka/a?delay=600'), 'keep-alive: 1st body');
is($conn_res[1]{body}, SFTest::origin_body(2, '/ka/b?delay=600&chunked=1&size=3000', 3000),
   'keep-alive: 2nd body');
is($conn_res[2]{body}, SFTest::origin_body(3, '/ka/c?delay=600&size=2000', 2000), 'keep-alive: 3rd body');
is($conn_res[3]{body}, SFTest::origin_body(4, '/ka/d'), 'keep-alive: 4th body');
my ($cn) = ($conn_res[0]{headers}{'x-conn'} // '') =~ m{^(\d+)/};
is(join(' ', map { $_->{headers}{'x-conn'} // '-' } @conn_res),
   join(' ', map { ($cn // 'x') . "/$_" } 1 .. 4), 'keep-alive: one connection, requests 1 to 4');
ok(conn_eof($c), 'keep-alive: closed after "Connection: close"');
is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER'
                 && $_->{body} eq SFTest::origin_body(3, '/ka/c?delay=600&size=2000', 2000) } @ores), 3,
   'keep-alive: the followers of the keep-alive leader got its response');
is($t->origin_hits->{total}, 4, 'keep-alive: 4 origin requests');

# ------------------------------------------------------------ pipelining

# Two pipelined requests, each following a flight of another client; then
# the same URI pipelined twice during a flight: the first follows it, the
# second (read only after the first was answered) leads a new one.

$t->origin_reset;
my ($ua, $ub) = ('/pipe/a?delay=700&size=1000', '/pipe/b?delay=1500&size=1000');
my $la = $t->start_request('GET', $ua);
my $lb = $t->start_request('GET', $ub);
wait_origin($ua);
wait_origin($ub);
$c = conn_open();
conn_send($c, req($ua) . req($ub, 1));
my @p = (conn_read($c), conn_read($c));
$t->finish_request($_) for $la, $lb;

is(join(' ', map { $_->{status} // $_->{error} } @p), '200 200', 'pipelining: two responses');
is(join(' ', map { $_->{headers}{'x-sf'} // '-' } @p), 'FOLLOWER FOLLOWER', 'pipelining: both followed');
my %hit = map { $_->[3] => $_->[1] } map { [ split / / ] } split /\n/, $t->read_file($t->origin->log_file);
is($p[0]{body}, SFTest::origin_body($hit{$ua} // 0, $ua, 1000), 'pipelining: 1st body, of flight a');
is($p[1]{body}, SFTest::origin_body($hit{$ub} // 0, $ub, 1000), 'pipelining: 2nd body, of flight b');
ok(conn_eof($c), 'pipelining: closed after the second');
is($t->origin_hits->{total}, 2, 'pipelining: 2 origin requests');

$t->origin_reset;
my $uc = '/pipe/c?delay=600&size=1000';
$l = $t->start_request('GET', $uc);
wait_origin($uc);
$c = conn_open();
conn_send($c, req($uc) . req($uc, 1));
@p = (conn_read($c), conn_read($c));
$t->finish_request($l);
is(join(' ', map { $_->{headers}{'x-sf'} // '-' } @p), 'FOLLOWER DIRECT',
   'pipelining the same URI: follows, then goes alone');
is(join(' ', map { $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uc, 1000) ? 'ok' : 'bad' } @p),
   'ok ok', 'pipelining the same URI: bodies');
is(join(' ', map { $_->{headers}{'x-hit'} // '-' } @p), '1 2', 'pipelining the same URI: responses 1 and 2, in order');

# ------------------------------------------------------------ origin framing

# Content-Length or chunked, keep-alive or "Connection: close", empty, one
# buffer or many: every client gets the whole body, framed as the origin
# framed it: with its Content-Length, or chunked (HTTP/1.1 clients) where
# the origin chunked, the leader and the followers alike.

for my $case ([ 0, 0, 70000 ], [ 1, 0, 70000 ], [ 0, 1, 70000 ], [ 1, 1, 70000 ],
              [ 1, 0, 0 ], [ 0, 1, 0 ], [ 1, 1, 1 ]) {
    my ($chunked, $close, $size) = @$case;
    $t->origin_reset;
    $uri = "/v11/frame?delay=300&size=$size&chunked=$chunked&close=$close";
    my $name = ($chunked ? 'chunked' : 'Content-Length') . ($close ? ', close' : '') . ", $size bytes";
    $res = $t->herd(n => 20, path => $uri);
    my $body = SFTest::origin_body(1, $uri, $size);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @$res), 20,
       "origin $name: 20 complete responses with the body")
        or diag(explain([ map { show($_) } @$res ]));
    @fol = grep { ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @$res;
    is(scalar(@fol), 19, "origin $name: 19 followers");
    if ($chunked) {
        is(scalar(grep { $_->{chunked} && !defined $_->{headers}{'content-length'} } @$res), 20,
           "origin $name: all 20 chunked, without Content-Length, as the origin sent it");
    }
    else {
        is(scalar(grep { ($_->{headers}{'content-length'} // '') eq $size && !$_->{chunked} }
                  @$res), 20, "origin $name: all 20 carry the origin's Content-Length: $size");
    }
    is($t->origin_uri_hits($uri), 1, "origin $name: one origin request");
}

# HTTP/1.0 upstream (the default), close-delimited by the origin
$t->origin_reset;
$uri = '/frame10?delay=500&size=30000&close=1';
$res = $t->herd(n => 20, path => $uri);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 30000) } @$res), 20,
   'HTTP/1.0 upstream: 20 complete responses');
is($t->origin_uri_hits($uri), 1, 'HTTP/1.0 upstream: one origin request');

# ------------------------------------------------------------ gzip

# Half the clients accept gzip; the origin sends no Vary, and answers
# the first one, which offered gzip, unencoded (a response made for a
# request that offered no coding would go to such requests alone).  One
# origin request; the gzip clients get it compressed, the others plain.

$t->origin_reset;
$uri = '/gz/a?delay=600&size=20000&hdr=ETag:%22g1%22';
my $body = SFTest::origin_body(1, $uri, 20000);
my @h = map { $t->start_request('GET', $uri,
    headers => $_ % 2 ? [ 'Accept-Encoding' => 'gzip' ] : []) } 1;
$t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => 'the first request upstream');
push @h, map { $t->start_request('GET', $uri,
    headers => $_ % 2 ? [ 'Accept-Encoding' => 'gzip' ] : []) } 2 .. 20;
$res = [ map { $t->finish_request($_) } @h ];

my (@gz, @plain);
push @{ $_ % 2 ? \@plain : \@gz }, $res->[$_] for 0 .. 19;    # even index: odd request: gzip
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 20, 'gzip: 20 complete responses');
is(scalar(grep { ($_->{headers}{'content-encoding'} // '') eq 'gzip' } @gz), 10,
   'gzip: the gzip clients got Content-Encoding: gzip');
is(scalar(grep {
        my $out;
        gunzip(\$_->{body} => \$out) && defined $out && $out eq $body && length($_->{body}) < 20000
    } @gz), 10, 'gzip: their bodies decompress to the origin body');
is(scalar(grep { !defined $_->{headers}{'content-encoding'} && $_->{body} eq $body } @plain), 10,
   'gzip: the others got it plain');
is(join(' ', sort keys %{ SFTest::tally(map { $_->{headers}{'x-sf'} // '-' } @$res) }),
   'FOLLOWER LEADER', 'gzip: one flight');
is(scalar(grep { ($_->{headers}{etag} // '') eq 'W/"g1"' } @gz), 10, 'gzip: the gzip clients\' ETag is weak');
is(scalar(grep { ($_->{headers}{etag} // '') eq '"g1"' } @plain), 10, 'gzip: the others\' ETag is intact');
is($t->origin_uri_hits($uri), 1, 'gzip: one origin request');

# A body that comes in pieces is compressed into the same bytes as without
# the module: nginx's upstream, buffering, flushes none of them before the
# end, and no reader does either (a flush ends a deflate block).

$uri = '/gz/b?fixed=1&stamp=gz&size=300000&fail=slowbody&pieces=6&delay=150';
$res = $t->herd(n => 4, path => $uri, headers => [ 'Accept-Encoding' => 'gzip' ], timeout => 20);
my $off = $t->get($uri =~ s{^/gz/}{/gzoff/}r, headers => [ 'Accept-Encoding' => 'gzip' ],
                  timeout => 20);
my $unzipped;
ok(($off->{headers}{'content-encoding'} // '') eq 'gzip'
   && gunzip(\$off->{body} => \$unzipped) && length($unzipped // '') == 300000,
   'gzip, a body in pieces: module off, 300000 bytes compressed');
is(scalar(grep { $_->{complete} && $_->{body} eq $off->{body} } @$res), 4,
   'gzip, a body in pieces: every client gets the bytes it gets without the module')
    or diag(length($off->{body}) . ' bytes without the module, with it: '
            . join(' ', map { ($_->{headers}{'x-sf'} // '-') . ':' . length($_->{body} // '') } @$res));
is($t->origin_uri_hits($uri), 1, 'gzip, a body in pieces: one origin request');

# ------------------------------------------------------------ HTTP/2

my $h2 = 'http://127.0.0.1:' . $t->port(2);

SKIP: {
    skip 'h2load not found (package nghttp2-client)', 4 unless $have{h2load};

    $t->origin_reset;
    $uri = '/h2/load?delay=800&size=10000';
    my ($rc, $out) = run_cmd($have{h2load}, '-n', 20, '-c', 1, '-m', 20, "$h2$uri");
    like($out, qr/status codes: 20 2xx/, 'h2load: 20 streams on one connection, 20 x 2xx')
        or diag($out);
    is($t->origin_uri_hits($uri), 1, 'h2load: one origin request');
    my @log = wait_logged($uri, 20);
    is_deeply(SFTest::tally(map { $_->[3] } @log), { LEADER => 1, FOLLOWER => 19 },
              'h2load: 1 leader, 19 followers');
    is(scalar(keys %{ SFTest::tally(map { "$_->[0]/$_->[1]/$_->[2]" } @log) }), 1,
       'h2load: all over one HTTP/2 connection');
}

SKIP: {
    skip 'nghttp not found (package nghttp2-client)', 6 unless $have{nghttp};

    # 20 streams on one connection; per stream, from the verbose frame log:
    # status, headers, and the DATA bytes received
    $t->origin_reset;
    $uri = '/h2/nghttp?delay=800&size=30000';
    my ($rc, $out, $err) = run_cmd($have{nghttp}, '-nv', '-m', 20, "$h2$uri");
    is($rc, 0, 'nghttp: 20 streams') or diag($err);
    my %st;
    for (split /\n/, $out) {
        if (/recv \(stream_id=(\d+)\) ([^:\s][^:]*|:status): (.*)$/) { $st{$1}{$2} = $3 }
        elsif (/recv DATA frame <length=(\d+), flags=0x[0-9a-f]+, stream_id=(\d+)>/) {
            $st{$2}{data} += $1;
        }
    }
    my @streams = values %st;
    is(scalar(grep { ($_->{':status'} // '') eq '200' && ($_->{data} // 0) == 30000
                     && ($_->{'x-hit'} // '') eq '1' } @streams), 20,
       'nghttp: 20 streams, 200 with 30000 bytes of the one origin response')
        or diag(explain(\%st));
    is_deeply(SFTest::tally(map { $_->{'x-sf'} // '-' } @streams), { LEADER => 1, FOLLOWER => 19 },
              'nghttp: 1 leader, 19 followers');
    is(scalar(grep { ($_->{'x-sf'} // '') eq 'FOLLOWER' && ($_->{'content-length'} // '') eq '30000' }
              @streams), 19, 'nghttp: the followers carry content-length');
    my @log = wait_logged($uri, 20);
    is(scalar(keys %{ SFTest::tally(map { "$_->[0]/$_->[1]/$_->[2]" } @log) }), 1,
       'nghttp: all over one HTTP/2 connection');
    is($t->origin_uri_hits($uri), 1, 'nghttp: one origin request');
}

# ------------------------------------------------------------ TLS

SKIP: {
    skip 'openssl not found (package openssl) or failed', 9 unless $tls;

    # an https:// upstream
    $t->origin_reset;
    $uri = '/tlsup/a?delay=600&size=300000';
    $res = $t->herd(n => 20, path => $uri);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                     && $_->{body} eq SFTest::origin_body(1, $uri, 300000) } @$res), 20,
       'https upstream: 20 complete responses with the body');
    is_deeply(SFTest::tally(map { $_->{headers}{'x-sf'} // '-' } @$res),
              { LEADER => 1, FOLLOWER => 19 }, 'https upstream: 1 leader, 19 followers');
    is($t->origin_uri_hits($uri), 1, 'https upstream: one origin request');

    skip 'curl not found (package curl)', 6 unless $have{curl};

    my $https = 'https://127.0.0.1:' . $t->port(3);

    $t->origin_reset;
    $uri = '/tls/h2?delay=800&size=50000';
    my @r = curl(20, "$https$uri", '-k', '--http2');
    $body = SFTest::origin_body(1, $uri, 50000);
    is(scalar(grep { $_->{code} == 200 && $_->{version} eq '2' && $_->{body} eq $body } @r), 20,
       'TLS h2: 20 x 200 over HTTP/2 with the body');
    my $connects = 0;
    $connects += $_->{connects} || 0 for @r;
    is($connects, 1, 'TLS h2: one connection');
    is_deeply(SFTest::tally(map { $_->{sf} } @r), { LEADER => 1, FOLLOWER => 19 },
              'TLS h2: 1 leader, 19 followers');
    is($t->origin_uri_hits($uri), 1, 'TLS h2: one origin request');

    $t->origin_reset;
    $uri = '/tls/h1?delay=800&size=50000';
    @r = curl(10, "$https$uri", '-k', '--http1.1', '--parallel-immediate');
    is(scalar(grep { $_->{code} == 200 && $_->{version} eq '1.1'
                     && $_->{body} eq SFTest::origin_body(1, $uri, 50000) } @r), 10,
       'TLS HTTP/1.1: 10 x 200 with the body');
    is($t->origin_uri_hits($uri), 1, 'TLS HTTP/1.1: one origin request');
}

# ------------------------------------------------------------ HTTP/1.1 and HTTP/2 mixed

# HTTP/1.1 and HTTP/2 clients share a flight when they reach the same
# server on the same port: a flight never spans two server blocks or two
# ports (docs/directives.md, singleflight_key), so the mixed herds go to the TLS
# server, where ALPN gives each client the protocol it asks for.  nghttp
# checks no certificate; curl is told not to (-k).

SKIP: {
    skip 'openssl not found (package openssl) or failed', 8 unless $tls;
    skip 'nghttp or curl not found (packages nghttp2-client, curl)', 8
        unless $have{nghttp} && $have{curl};

    my $https = 'https://127.0.0.1:' . $t->port(3);

    # an HTTP/1.1 leader, HTTP/2 followers: 5 streams of one connection,
    # bodies small enough for one DATA frame each, so nghttp's output is
    # the 5 bodies one after the other.  The leader offers the codings
    # nghttp offers: a response made for a request that offered none is
    # not given to requests that offer some.
    $t->origin_reset;
    $uri = '/x/h1lead?delay=1500&size=5000';
    my $ch = curl_start(1, "$https$uri", '-k', '--http1.1',
                        '-H', 'Accept-Encoding: gzip, deflate');
    wait_origin($uri);
    my $nh = run_bg($have{nghttp}, '-m', 5, "$https$uri");
    wait_waiters(5);
    my ($nrc, $nout, $nerr) = wait_bg($nh);
    my ($lr) = curl_finish($ch);
    ok($lr && $lr->{version} eq '1.1' && $lr->{sf} eq 'LEADER'
       && $lr->{body} eq SFTest::origin_body(1, $uri, 5000),
       'HTTP/1.1 leader: led the flight over HTTP/1.1 and got the body')
        or diag(explain($lr));
    ok($nrc == 0 && $nout eq SFTest::origin_body(1, $uri, 5000) x 5,
       'HTTP/1.1 leader: 5 HTTP/2 streams got its body') or diag($nerr);
    is_deeply(SFTest::tally(map { "$_->[2] $_->[3]" } wait_logged($uri, 6)),
              { 'HTTP/1.1 LEADER' => 1, 'HTTP/2.0 FOLLOWER' => 5 }, 'HTTP/1.1 leader: HTTP/2 followers');

    # HTTP/1.1 over TLS, gzip, a body in pieces: what SSL keeps of an
    # unflushed write waits for the next, as without the module (gzip
    # passes no empty call through); every follower gets plain nginx's
    # bytes, none waits for a write event that never comes
    $t->origin_reset;
    $uri = '/xgz/b?fixed=1&numbered=1&stamp=xgz&size=600000&fail=slowbody&pieces=6&delay=300';
    my ($off) = curl(1, "$https/xgzoff/b?fixed=1&numbered=1&stamp=xgz&size=600000&fail=slowbody&pieces=6&delay=300",
                     '-k', '--http1.1', '-H', 'Accept-Encoding: gzip');
    my @tg = curl(4, "$https$uri", '-k', '--http1.1', '-H', 'Accept-Encoding: gzip');
    ok($off && $off->{code} == 200 && ($off->{encoding} // '') eq 'gzip',
       'HTTP/1.1 over TLS, gzip, a body in pieces: module off, compressed');
    is(scalar(grep { $_->{code} == 200 && $_->{body} eq $off->{body} } @tg), 4,
       'HTTP/1.1 over TLS, gzip, a body in pieces: 4 of 4 with plain nginx\'s bytes')
        or diag(explain([ map { { code => $_->{code}, sf => $_->{sf}, size => $_->{size} } } @tg ]));
    is($t->origin_uri_hits($uri), 1, 'HTTP/1.1 over TLS, gzip, a body in pieces: one origin request');

    # an HTTP/2 leader, HTTP/1.1 followers
    $t->origin_reset;
    $uri = '/x/h2lead?delay=1500&size=20000';
    $nh = run_bg($have{nghttp}, "$https$uri");
    wait_origin($uri);
    $ch = curl_start(5, "$https$uri", '-k', '--http1.1', '--parallel-immediate');
    wait_waiters(5);
    my @r = curl_finish($ch);
    ($nrc, $nout) = wait_bg($nh);
    is($nout, SFTest::origin_body(1, $uri, 20000), 'HTTP/2 leader: got the body');
    is(scalar(grep { $_->{code} == 200 && $_->{version} eq '1.1' && $_->{sf} eq 'FOLLOWER'
                     && $_->{body} eq SFTest::origin_body(1, $uri, 20000) } @r), 5,
       'HTTP/2 leader: 5 HTTP/1.1 followers got its response');
}

done_testing;
