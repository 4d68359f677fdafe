#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_http3: followers over HTTP/3 (QUIC) get their copies through
# their own filters, like HTTP/1.1 and HTTP/2 ones.
#
#   * a herd over QUIC: several connections, one of them with several
#     streams, on one key: one origin fetch, every client the full body;
#   * a mixed herd on one key: HTTP/1.1 and HTTP/2 (over TLS) and HTTP/3
#     clients of one server and port share one flight: one origin fetch, every client the full
#     body, each response carrying its own protocol (add_header runs per
#     client);
#   * mirrors: a herd over QUIC mirrored once a stream, as plain nginx;
#   * the worker fetching a resumable response killed mid-body: the
#     HTTP/3 readers of the other worker ask for the rest and get the
#     whole body;
#   * the worker fetching a flight killed before its header: one HTTP/3
#     follower of the other worker takes the flight over, and they all
#     get the response;
#   * the first client's QUIC connection closed mid-body: the others
#     still get the whole body.
#
# Needs an nginx built with --with-http_v3_module (1.25.0 and later:
# `make test NGINX_SRC=...` builds one), gtlsclient (package ngtcp2-client),
# curl and openssl; skipped, with the reason, when one is missing.

use strict;
use warnings;

use Test::More;
use POSIX qw(WNOHANG);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;

sub which {
    my ($prog) = @_;
    for (split /:/, $ENV{PATH} // '/usr/bin:/bin') {
        return "$_/$prog" if -x "$_/$prog";
    }
    return undef;
}

my $nginx = $t->nginx_binary;
my $v = `$nginx -V 2>&1`;
my ($version) = $v =~ m{nginx/(\S+)};
plan skip_all => "nginx " . ($version // '?') . " ($nginx) has no http_v3 module"
    unless $v =~ /--with-http_v3_module/;

my %have = map { $_ => which($_) } qw(gtlsclient curl openssl);
for (qw(gtlsclient curl openssl)) {
    plan skip_all => "$_ not found"
        . ($_ eq 'gtlsclient' ? ' (package ngtcp2-client)' : '') unless $have{$_};
}

plan skip_all => 'openssl could not make a certificate' unless $t->tls_certificate;

$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfp '$server_protocol $singleflight_status $status $body_bytes_sent $request_uri';
    log_format mirror '$server_protocol $args';
    access_log %%TESTDIR%%/sf.log sfp;

    singleflight_zone zone=sf:4m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_key $request_uri;

    # HTTP/1.1
    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
            add_header X-Proto $server_protocol always;
        }

        location = /stats {
            singleflight_stats;
        }
    }

    # HTTP/3 and, on the same port over TCP, HTTP/2 and HTTP/1.1 over TLS
    server {
        listen 127.0.0.1:%%PORT_1%% quic reuseport;
        listen 127.0.0.1:%%PORT_1%% ssl;
        http2 on;
        ssl_certificate %%TESTDIR%%/cert.pem;
        ssl_certificate_key %%TESTDIR%%/key.pem;

        # mirrored: with the module, and without it (/m3p/)
        location /m3/ {
            singleflight sf;
            mirror /mirror;
            proxy_pass http://%%ORIGIN%%;
        }

        location /m3p/ {
            mirror /mirror;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /mirror {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/mirror.log mirror;
            return 204;
        }

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
            add_header X-Proto $server_protocol always;
        }

        # the first request's own upstream request (the default path)
        location /gone3/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_pass http://%%ORIGIN%%;
        }

        # the origin learns which worker fetches, a client which answered
        location /dead/ {
            singleflight sf;
            proxy_set_header X-SF-Worker $pid;
            proxy_pass http://%%ORIGIN%%;
            add_header X-Pid $pid always;
            add_header X-SF $singleflight_status always;
        }
    }
EOT

$t->start;

my $h3port = $t->port(1);

# ------------------------------------------------------------ helpers

my $BG = 0;

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
    return { pid => $pid, out => $out, err => $err, cmd => "@cmd", n => $n };
}

sub wait_bg {
    my ($h, $timeout) = @_;
    my $rc;
    my $done = $t->wait_for(sub {
        return 0 unless waitpid($h->{pid}, WNOHANG) == $h->{pid};
        $rc = $? >> 8;
        return 1;
    }, timeout => $timeout // 30, what => "$h->{cmd} to finish");
    if (!$done) {
        kill 'KILL', $h->{pid};
        waitpid($h->{pid}, 0);
        $rc = -1;
    }
    return $rc;
}

# gtlsclient: $n streams of one URI on one QUIC connection.  It logs each
# stream's headers and a hexdump of each body chunk (on stderr).
sub h3_start {
    my ($uri, $n, $timeout) = @_;
    my $h = run_bg($have{gtlsclient}, '--exit-on-all-streams-close', '--no-quic-dump',
        '--timeout=' . ($timeout // '20s'), '-n', $n // 1, '127.0.0.1', $h3port,
        "https://localhost:$h3port$uri");
    return $h;
}

# -> list of { status, headers, body } per stream, the body rebuilt from
# the hexdumps ("hexdump -C" style: a "*" line stands for repeats of the
# line before it, up to the next offset)
sub h3_finish {
    my ($h) = @_;
    my $rc = wait_bg($h);
    my $log = $t->read_file($h->{err});
    diag("gtlsclient exit $rc: " . substr($log, -2000)) if $rc;
    my (%s, $cur, $chunk, $prev, $star);
    my $flush = sub {
        $s{$cur}{body} .= $chunk if defined $cur && defined $chunk;
        undef $chunk;
    };
    for (split /\n/, $log) {
        if (/^([0-9a-f]{8})(?:  (.*?)\s*(?:\|.*\|)?)?$/ && defined $chunk) {
            my ($off, $hex) = (hex $1, $2);
            if ($star) {
                $chunk .= $prev while length($chunk) < $off;
                $star = 0;
            }
            next unless defined $hex && length $hex;
            $prev = pack('H*', $hex =~ s/\s+//gr);
            $chunk .= $prev;
        }
        elsif ($_ eq '*' && defined $chunk) {
            $star = 1;
        }
        elsif (/^http: stream (0x[0-9a-f]+) body (\d+) bytes/) {
            $flush->();
            ($cur, $chunk, $star) = ($1, '', 0);
            $s{$cur}{size} += $2;
        }
        else {
            $flush->();
            if (/^http: stream (0x[0-9a-f]+) \[([^:\]]*|:status): (.*)\]$/) {
                $s{$1}{headers}{ lc $2 } = $3;
            }
        }
    }
    $flush->();
    return map {
        my $r = $s{$_};
        $r->{status} = delete $r->{headers}{':status'};
        $r->{body} //= '';
        $r->{size} //= 0;
        $r;
    } sort keys %s;
}

# curl over TLS, $proto '--http1.1' or '--http2': $n parallel transfers
# (HTTP/2: multiplexed on one connection) -> list of { status, proto, sf,
# body }
my $CURL_W = '%{http_code}|%header{x-proto}|%header{x-sf}|%{filename_effective}\n';

sub curl_start {
    my ($proto, $uri, $n) = @_;
    my $tag = $BG + 1;
    my @args = ($have{curl}, '-sS', '-k', $proto, '--max-time', 20, '--parallel',
        '--parallel-max', 50, '-w', $CURL_W);
    push @args, '-o', $t->path("curl-$tag-$_.body"), "https://127.0.0.1:$h3port$uri"
        for 1 .. $n;
    return run_bg(@args);
}

sub curl_finish {
    my ($h) = @_;
    my $rc = wait_bg($h);
    diag("curl exit $rc: " . $t->read_file($h->{err})) if $rc;
    return map {
        my %r;
        @r{qw(status proto sf file)} = split /\|/, $_, -1;
        $r{body} = $t->read_file($r{file}) // '';
        \%r;
    } grep { length } split /\n/, $t->read_file($h->{out});
}

sub wait_origin {
    my ($uri) = @_;
    $t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => "origin to get $uri");
}

# ------------------------------------------------------------ a herd over QUIC

{
    my $size = 120000;
    my $uri = "/h3/herd.bin?delay=1500&size=$size";
    my $body = SFTest::origin_body($t->origin_hits->{total} + 1, $uri, $size);

    my @h = map { h3_start($uri, 1) } 1 .. 8;
    wait_origin($uri);
    push @h, map { h3_start($uri, 4) } 1 .. 2;
    my @r = map { h3_finish($_) } @h;

    is(scalar @r, 16, 'QUIC herd: 16 streams on 10 connections answered');
    is($t->origin_uri_hits($uri), 1, 'QUIC herd: 1 origin fetch');
    is(scalar(grep { ($_->{status} // '') eq '200' } @r), 16, 'QUIC herd: 16 x 200');
    is(scalar(grep { $_->{size} == $size && $_->{body} eq $body } @r), 16,
        "QUIC herd: 16 x the origin's $size bytes")
        or diag(explain([ map { [ $_->{size}, length $_->{body} ] } @r ]));
    is(scalar(grep { ($_->{headers}{'x-proto'} // '') eq 'HTTP/3.0' } @r), 16,
        'QUIC herd: every response through its own add_header (HTTP/3.0)');
    my $roles = SFTest::tally(map { $_->{headers}{'x-sf'} // '-' } @r);
    is($roles->{LEADER}, 1, 'QUIC herd: 1 leader') or diag(explain($roles));
    is($roles->{FOLLOWER}, 15, 'QUIC herd: 15 followers');
}

# ------------------------------------------------------------ a mixed herd

# One server, one port (flights are per server block and port): HTTP/1.1
# and HTTP/2 over TLS, HTTP/3 over QUIC.

{
    my $size = 100000;
    my $uri = "/mixed/one.bin?delay=1500&size=$size";
    my $body = SFTest::origin_body($t->origin_hits->{total} + 1, $uri, $size);

    my @h1 = (curl_start('--http1.1', $uri, 1));
    wait_origin($uri);
    push @h1, curl_start('--http1.1', $uri, 5);
    my $h2 = curl_start('--http2', $uri, 6);
    my @h3 = map { h3_start($uri, 1) } 1 .. 5;
    push @h3, h3_start($uri, 3);

    my @r3 = map { h3_finish($_) } @h3;
    my @r2 = curl_finish($h2);
    my @r1 = map { curl_finish($_) } @h1;

    is($t->origin_uri_hits($uri), 1, 'mixed herd: 1 origin fetch for 20 requests');

    is(scalar(grep { $_->{status} eq '200' && $_->{body} eq $body } @r1), 6,
        'mixed herd: 6 HTTP/1.1 clients, the full body');
    is(scalar(grep { $_->{proto} eq 'HTTP/1.1' } @r1), 6,
        'mixed herd: HTTP/1.1 responses say HTTP/1.1');

    is(scalar(grep { $_->{status} eq '200' && $_->{body} eq $body } @r2), 6,
        'mixed herd: 6 HTTP/2 streams, the full body');
    is(scalar(grep { $_->{proto} eq 'HTTP/2.0' } @r2), 6,
        'mixed herd: HTTP/2 responses say HTTP/2.0');

    is(scalar(grep { ($_->{status} // '') eq '200' && $_->{body} eq $body } @r3), 8,
        'mixed herd: 8 HTTP/3 streams on 6 connections, the full body');
    is(scalar(grep { ($_->{headers}{'x-proto'} // '') eq 'HTTP/3.0' } @r3), 8,
        'mixed herd: HTTP/3 responses say HTTP/3.0');

    my @log = $t->wait_log_records('sf.log', [qw(proto sf status bytes uri)], 20,
        uri => $uri);
    my $roles = SFTest::tally(map { $_->{sf} } @log);
    is($roles->{LEADER}, 1, 'mixed herd: 1 leader in the log') or diag(explain($roles));
    is($roles->{FOLLOWER}, 19, 'mixed herd: 19 followers in the log');
    my $protos = SFTest::tally(map { $_->{proto} } @log);
    is_deeply($protos, { 'HTTP/1.1' => 6, 'HTTP/2.0' => 6, 'HTTP/3.0' => 8 },
        'mixed herd: the log has every protocol');
}

# ------------------------------------------------------------ mirrors

# Each HTTP/3 stream of a herd is mirrored once, as plain nginx mirrors
# each of its own.
{
    my $uri = '/m3/herd?k=m3&delay=1000&size=5000';
    my @h = (h3_start($uri, 1));
    wait_origin($uri);
    push @h, map { h3_start($uri, 1) } 1 .. 3;
    my @r = map { h3_finish($_) } @h;
    is(scalar(grep { ($_->{status} // '') eq '200' && $_->{size} == 5000 } @r), 4,
       'mirrors over HTTP/3: 4 x 200');
    is($t->origin_uri_hits($uri), 1, 'mirrors over HTTP/3: 1 origin fetch');
    h3_finish(h3_start('/m3p/plain?k=m3p&size=10', 1)) for 1 .. 2;
    my %n;
    $t->wait_for(sub {
        %n = ();
        $n{$_}++ for ($t->read_file('mirror.log') // '') =~ /^HTTP\/3\.0 k=(m3p?)&/mg;
        ($n{m3} // 0) >= 4 && ($n{m3p} // 0) >= 2;
    }, what => 'the mirrors in their log', quiet => 1);
    is(($n{m3p} // 0) . ' ' . ($n{m3} // 0), '2 4',
       'mirrors over HTTP/3: plain nginx 2 for 2, the herd 4 for 4');
}

# ------------------------------------------------------------ a dead worker

# A leader over HTTP/1.1 (TLS) for $uri, the worker that fetches it (the
# origin names it), then 10 QUIC readers: (leader, that pid, readers).
sub dead_start {
    my ($uri) = @_;
    my $leader = curl_start('--http1.1', $uri, 1);
    my $lpid;
    $t->wait_for(sub { $lpid = $t->origin_hits->{workers}{$uri} },
                 what => 'the fetching worker');
    return ($leader, $lpid, map { h3_start($uri, 1) } 1 .. 10);
}

# The worker fetching a resumable response (a strong ETag, a length) dies
# after the origin sent 40,000 bytes and stalled: the HTTP/3 readers of
# the other worker get the whole body, the rest asked for by one of them
# (a second origin request).  The leader asks over HTTP/1.1 (TLS, the
# same server and port), the readers over QUIC, spread over both
# workers by their addresses.
SKIP: {
    my $size = 200000;
    my $uri = "/dead/b.bin?delay=2000&size=$size&fixed=1&ranges=1&hdr=ETag:%22abc%22"
            . '&fail=stall&cut=40000&fail_first=1';
    my $body = SFTest::origin_body(0, $uri, $size);
    my $s0 = $t->zone_stats;
    my ($leader, $lpid, @h) = dead_start($uri);

    # all of them follow the flight before its header (QUIC handshakes on
    # a loaded machine can be slow: a reader come after it goes its own way)
    ok($t->wait_for(sub { ($t->zone_stats->{waiters} // 0) >= 10 },
                    what => '10 QUIC followers waiting'),
       'dead worker: the 10 QUIC readers follow the flight');

    # every reader has some of the body (the stream's first body line)
    my $reading = $t->wait_for(sub {
        !grep { ($t->read_file($_->{err}) // '') !~ /^http: stream \S+ body \d+ bytes/m } @h
    }, what => 'every QUIC reader to have body bytes');

    $t->allow_log(qr/worker process $lpid exited on signal \d+/);
    ok($reading && $t->kill_worker($lpid), "dead worker: worker $lpid killed mid-body");

    my @r = map { h3_finish($_) } @h;
    wait_bg($leader);       # cut with its worker: curl says so

    my @other = grep { ($_->{headers}{'x-pid'} // $lpid) ne $lpid } @r;
    skip 'dead worker: every QUIC client landed in the killed worker', 4 unless @other;

    is(scalar(grep { ($_->{status} // '') eq '200' && $_->{body} eq $body } @other),
       scalar(@other), 'dead worker: the ' . scalar(@other)
       . ' HTTP/3 readers of the other worker got the whole body');
    is($t->origin_uri_hits($uri), 2, 'dead worker: one more origin request, for the rest');
    my $s1 = $t->zone_stats;
    is($s1->{resumes} - $s0->{resumes}, 1, 'dead worker: stats resumes + 1');
    ok($t->worker_respawned($lpid), 'dead worker: the master respawned the worker');
}

# The worker fetching a flight dies before its header (the origin never
# answers that first request): one of the HTTP/3 followers of the other
# worker takes the flight over (PROMOTED, a second origin request), and
# every follower there gets the response, as over HTTP/1.1
# (singleflight_dead_leader.t).
SKIP: {
    my $size = 5000;
    my $uri = "/dead/h.bin?size=$size&fixed=1&fail=hang&fail_first=1";
    my $body = SFTest::origin_body(0, $uri, $size);
    my $s0 = $t->zone_stats;
    my ($leader, $lpid, @h) = dead_start($uri);
    my $waiting = $t->wait_for(sub { ($t->zone_stats->{waiters} // 0) >= 10 },
                               what => 'the 10 QUIC followers waiting');

    $t->allow_log(qr/worker process $lpid exited on signal \d+/);
    ok($waiting && $t->kill_worker($lpid), "dead worker before the header: worker $lpid killed");

    my @r = map { h3_finish($_) } @h;
    wait_bg($leader);

    my @other = grep { ($_->{headers}{'x-pid'} // $lpid) ne $lpid } @r;
    skip 'dead worker before the header: every QUIC client landed in the killed worker', 5
        unless @other;

    is(scalar(grep { ($_->{status} // '') eq '200' && $_->{body} eq $body } @other),
       scalar(@other), 'dead worker before the header: the ' . scalar(@other)
       . ' HTTP/3 followers of the other worker got the response');
    is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'PROMOTED' } @other), 1,
       'dead worker before the header: ... one of them fetched it (PROMOTED)');
    is($t->origin_uri_hits($uri), 2, 'dead worker before the header: one more origin request');
    my $s1 = $t->zone_stats;
    is($s1->{dead_leaders} - $s0->{dead_leaders}, 1,
       'dead worker before the header: stats dead_leaders + 1');
    ok($t->worker_respawned($lpid),
       'dead worker before the header: the master respawned the worker');
}

# ------------------------------------------------------------ a QUIC connection gone

# The first client's QUIC connection is closed by nginx mid-body (its
# peer went silent: the idle timeout it asked for, 2 s), while 3 others
# read the flight over HTTP/1.1 (TLS, the same server and port).  nginx
# ends each stream of a closed QUIC connection before any handler of its
# request runs; the response, not resumable here, is still read on for
# the others, as when an HTTP/1.1 or HTTP/2 client goes: each gets the
# whole body, from 1 origin request.  Both paths: the first request's
# own upstream request (/gone3/), and its fetch (singleflight_lone fetch).
for my $where (qw(gone3 h3)) {
    my $size = 1_500_000;
    my $uri = "/$where/quic-gone.bin?size=$size&delay=1500&pace=100000:400";
    my $body = SFTest::origin_body($t->origin_hits->{total} + 1, $uri, $size);
    my $leader = h3_start($uri, 1, '2s');
    wait_origin($uri);
    my $f = curl_start('--http1.1', $uri, 3);
    $t->wait_for(sub { ($t->zone_stats->{waiters} // 0) >= 3 }, what => '3 followers waiting');
    $t->wait_for(sub { ($t->read_file($leader->{err}) // '') =~ /^http: stream \S+ body \d+ bytes/m },
                 what => 'the first client to have body bytes');
    kill 'KILL', $leader->{pid};
    waitpid($leader->{pid}, 0);
    my @r = curl_finish($f);
    is(scalar(grep { $_->{status} eq '200' && $_->{body} eq $body } @r), 3,
       "$where, the first client's QUIC connection closed: the others get the whole body")
        or diag(join ' ', map { "$_->{status}:" . length $_->{body} } @r);
    is($t->origin_uri_hits($uri), 1, "$where, the first client's QUIC connection closed: 1 origin request");
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing;
