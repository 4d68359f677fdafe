#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_never_worse: what a hostile client, an unlucky operator or
# a misbehaving origin gets is never less than the same nginx gives it
# without the module.  Each case runs the same requests against a server
# with "singleflight sf" and one with "singleflight off" in one nginx.
#
#   1. a response for its leader alone (Set-Cookie) to a slow HTTP/1.x
#      client completes, paced by the client's connection (sndbuf=16k,
#      a client that pauses), and send_timeout still applies;
#   2. a keep-alive leader that stops reading until send_timeout while its
#      fetch goes on for a follower: its connection is closed as plain
#      nginx closes it, never reused, the worker lives; 2b. a leader whose
#      own response feeds followers half-closes with its socket full: its
#      send_timeout does not cut the followers (and the end of its
#      mirror after it left: t/singleflight_mirror.t); 2c. nor does that
#      leader's client reading slowly pace them, with
#      proxy_max_temp_file_size 0; 2d. alone, such a leader's response is
#      not written to a temporary file, as without the module;
#   3. a fetch that stops (its origin's Vary names a header the fetch
#      does not send: Range, If-None-Match) never takes its leader down,
#      and a request that sends such a header goes upstream on its own;
#   6. a 103 Early Hints before the final response: every client gets the
#      final response;
#   8. a 204 or a 304 with a Content-Length (it has no body whatever it
#      says): every client gets it, from one origin request.
# (4, 5 and 7 of issue 21: t/singleflight_temp_path.t, _upgrade.t and
# _scope.t.)

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use IO::Select;
use POSIX ();
use Time::HiRes qw(time sleep);
use Socket qw(SOL_SOCKET SO_RCVBUF);

use lib 't/lib';
use SFTest;

$SIG{PIPE} = 'IGNORE';

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# nginx 1.29 and later pass an origin's 103 on where early_hints says so
my ($nginx_v) = `${\ $t->nginx_binary} -v 2>&1` =~ m{nginx/(\d+)\.(\d+)}
    ? sprintf('%d.%03d', $1, $2) : ('0');
my $early = $nginx_v >= 1.029 ? 'early_hints 1;' : '';

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%% sndbuf=16k;
        singleflight $sf;
        add_header X-SF \$singleflight_status always;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }

        location /early/ {
            $early
            proxy_pass http://%%ORIGIN%%;
        }

        location /pvars/ {
            add_header X-Proxy-Host \$proxy_host;
            add_header X-Proxy-Port \$proxy_port;
            proxy_pass http://%%ORIGIN%%;
        }

        location /extra/ {
            proxy_pass http://127.0.0.1:\$arg_p;
        }

        location /grpc/ {
            singleflight_methods POST;
            proxy_pass http://%%ORIGIN%%;
        }

        location /rt/ {
            add_header X-Response \$upstream_response_time;
            add_header X-Status \$upstream_status;
            proxy_pass http://rt_next;
        }

        location /rts/ {
            singleflight_lazy off;
            add_header X-Response \$upstream_response_time;
            add_header X-Status \$upstream_status;
            proxy_pass http://rt_next;
        }

        location /st/ {
            send_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        # a leader whose own response feeds the others (case 2b)
        location /stg/ {
            send_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        # a leader whose own response feeds the others, no temporary file
        # (case 2c)
        location /ntf/ {
            proxy_max_temp_file_size 0;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same leader alone, its response stored all the same (2d)
        location /ntfo/ {
            singleflight_lone own;
            proxy_max_temp_file_size 0;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }

        # a leader through a fetch (case 2)
        location /stf/ {
            singleflight_lone fetch;
            send_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
}
$servers =~ s/%%PORT_0%%/%%PORT%%/;

my $dead = $t->port(7);    # nothing listens there

$t->write_config($t->config_template(<<"EOT"));
    singleflight_zone zone=sf:1m;

    log_format rt '\$server_port \$request_uri \$upstream_response_time';
    access_log %%TESTDIR%%/rt.log rt;

    # the first server refuses, always: proxy_next_upstream tries the
    # origin
    upstream rt_next {
        server 127.0.0.1:$dead max_fails=0;
        server %%ORIGIN%% backup;
    }

$servers
EOT
$t->start;

# ------------------------------------------------------------ helpers

sub connect_to {
    my ($port, %opt) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => $t->addr, PeerPort => $port,
        Proto => 'tcp') or die "connect: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, $opt{rcvbuf}) if $opt{rcvbuf};
    $s->blocking(0);
    return $s;
}

sub send_request {
    my ($s, $path, @headers) = @_;
    my $text = "GET $path HTTP/1.1\r\nHost: localhost\r\n"
        . join('', map { "$_\r\n" } @headers) . "\r\n";
    my $n = syswrite($s, $text);
    return defined $n && $n == length $text;
}

# Reads what arrives until EOF or $timeout seconds; pauses => [at, for]:
# reads nothing for "for" seconds once "at" bytes arrived.  Returns
# (bytes, eof).
sub read_all {
    my ($s, $timeout, %opt) = @_;
    my ($buf, $eof, $paused) = ('', 0, 0);
    my $end = time + $timeout;
    my $sel = IO::Select->new($s);
    while (time < $end) {
        if (!$paused && $opt{pause} && length $buf >= $opt{pause}[0]) {
            sleep $opt{pause}[1];
            $paused = 1;
        }
        next unless $sel->can_read(0.2);
        my $n = sysread($s, $buf, 65536, length $buf);
        if (!defined $n) { next if $!{EAGAIN}; $eof = 1; last }
        if ($n == 0) { $eof = 1; last }
        last if $opt{until} && $buf =~ $opt{until};
    }
    return ($buf, $eof);
}

# status, headers (lower-case names), body of a complete response text
sub parse {
    my ($text) = @_;
    my ($head, $body) = split /\r\n\r\n/, $text, 2;
    return (0, {}, '') unless defined $head && $head =~ m{^HTTP/1\.\d (\d+)};
    my $status = $1;
    my %h = map { /^([^:]+):\s*(.*)$/ ? (lc $1 => $2) : () } split /\r\n/, $head;
    return ($status, \%h, $body // '');
}

sub body_length { my ($text) = @_; my (undef, undef, $b) = parse($text); length $b }

# ------------------------------------------------------------ 1. slow client

# A 2 MB response for its leader alone, through sndbuf=16k: module off
# completes it; so must the module.
for my $i (0, 1) {
    my $name = $i ? 'off' : 'on';
    my $size = 2_000_000;
    my $s = connect_to($t->port($i));
    send_request($s, "/private$i?size=$size&hdr=Set-Cookie:a%3D1",
                 'Connection: close');
    my ($text, $eof) = read_all($s, 15);
    my ($status, $h) = parse($text);
    is($status, 200, "1 sndbuf $name: 200");
    is(body_length($text), $size, "1 sndbuf $name: the whole body");
    ok($eof, "1 sndbuf $name: closed after it");
}

# A private response whose client stops reading for 2 s once.
for my $i (0, 1) {
    my $name = $i ? 'off' : 'on';
    my $size = 8_000_000;
    my $s = connect_to($t->port($i), rcvbuf => 65536);
    send_request($s, "/pause$i?size=$size&hdr=Set-Cookie:a%3D1",
                 'Connection: close');
    my ($text, $eof) = read_all($s, 20, pause => [100_000, 2]);
    is(body_length($text), $size, "1 pause $name: the whole body");
}

# send_timeout still applies to a leader alone that reads nothing: its
# connection is closed within send_timeout (1 s) of its last progress.
for my $i (0, 1) {
    my $name = $i ? 'off' : 'on';
    my $s = connect_to($t->port($i), rcvbuf => 4096);
    send_request($s, "/st/private$i?size=8000000&hdr=Set-Cookie:a%3D1",
                 'Connection: close');
    my $t0 = time;
    sleep 3.5;
    # what the socket holds, then EOF: the server gave up.  nginx's pipe
    # arms the send timer again at each read from the origin, so it fires
    # a second after the origin's last byte: seconds after the request
    # when the origin is slow to make 8 MB (a loaded machine)
    my ($text, $eof) = read_all($s, 20);
    ok($eof, "1 send_timeout $name: the connection is closed");
    cmp_ok(body_length($text), '<', 8_000_000, "1 send_timeout $name: cut");
}

# ------------------------------------------------------------ 2. keep-alive

# A keep-alive leader stops reading; send_timeout (1 s) fires while its
# fetch (singleflight_lone fetch: with the default, its own upstream
# response is paced by it, as without the module) still streams (8
# pieces, 400 ms apart) to a follower.  Its
# connection must close (never be reused after a cut body), the follower
# gets everything, and the next request on the connection, if it could
# be sent at all, crashes nothing.
{
    my $size = 4_000_000;
    my $path = "/stf/ka?size=$size&fail=slowbody&pieces=8&delay=400";
    my $leader = connect_to($t->port(0), rcvbuf => 4096);
    send_request($leader, $path);
    sleep 0.2;
    my $f = $t->start_request('GET', $path);
    my $r = $t->finish_request($f, timeout => 15);
    is($r->{status}, 200, '2 follower: 200');
    is(length $r->{body}, $size, '2 follower: the whole body');

    # the fetch is over: the leader's connection must be closed
    send_request($leader, '/st/next?size=10');
    my ($text, $eof) = read_all($leader, 5);
    ok($eof, '2 leader: its connection is closed');
    is($t->log_count(qr{"GET /st/next}, 0, 'access.log'), 0,
       '2 leader: no next request on a cut connection');

    # and the worker still answers
    my $ok = $t->get('/alive?size=10');
    is($ok->{status}, 200, '2 nginx still answers');
}

# 2b. A leader whose own upstream response feeds 3 followers (the
# default) reads its header, then half-closes and reads nothing more, its
# socket full (sndbuf=16k, rcvbuf 4 KB).  The origin pauses 1.5 s between
# pieces, longer than send_timeout (1 s), and sends no validator to
# resume by.  The response is read on for the followers to its end: the
# gone client's send_timeout must not end the upstream request.
{
    my $size = 1_000_000;
    my $path = "/stg/half?size=$size&delay=400&pace=200000:1500";
    my $leader = connect_to($t->port(0), rcvbuf => 4096);
    send_request($leader, $path);
    $t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'the leader upstream');
    my @f = map { $t->start_request('GET', $path, timeout => 20) } 1 .. 3;
    $t->wait_waiters(3);
    my ($head) = read_all($leader, 5, until => qr/\r\n\r\n/);
    like($head, qr{^HTTP/1\.1 200}, '2b leader: its header');
    shutdown($leader, 1);
    my @res = @{ $t->finish_all(\@f) };
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == $size } @res),
       3, '2b followers: the whole body, past pauses longer than the gone leader\'s send_timeout')
        or diag(join ' ', map { ($_->{status} // 'none') . ':' . length($_->{body} // '') } @res);
    is($t->origin_uri_hits($path), 1, '2b: one origin request');
}

# 2c. The leader's client reads nothing for a while (a 4 KiB receive
# buffer) and its location buffers no response to a temporary file: nginx
# reads the origin at that client's pace.  The followers read what the
# origin sends, at once; the leader, reading at last, gets all of it.
{
    my $size = 600_000;
    my $path = "/ntf/slow?size=$size&delay=300";
    my $leader = connect_to($t->port(0), rcvbuf => 4096);
    send_request($leader, $path, 'Connection: close');
    $t->wait_for(sub { $t->origin_uri_hits($path) == 1 }, what => 'the leader upstream');
    my @f = map { $t->start_request('GET', $path, timeout => 8) } 1 .. 2;
    my @res = @{ $t->finish_all(\@f) };
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == $size } @res),
       2, '2c followers: the whole body, not at the pace of the leader\'s client')
        or diag(join ' ', map { ($_->{status} // 'none') . ':' . length($_->{body} // '') } @res);
    my ($text, $eof) = read_all($leader, 30);    # 4 KiB at a time
    my ($status, undef, $body) = parse($text);
    is("$status " . length($body // '') . ($eof ? ' eof' : ''), "200 $size eof",
       '2c leader: its whole response, read at its pace');
    is($t->origin_uri_hits($path), 1, '2c: one origin request');
}

# 2d. The same slow client alone (its response stored for a flight
# nobody joins): no temporary file, the origin read at its pace, as
# without the module.
{
    my $size = 600_000;
    my $path = "/ntfo/alone?size=$size&delay=100";
    my $off = $t->log_offset;
    my $leader = connect_to($t->port(0), rcvbuf => 4096);
    send_request($leader, $path, 'Connection: close');
    my ($text, $eof) = read_all($leader, 30);
    my ($status, undef, $body) = parse($text);
    is("$status " . length($body // '') . ($eof ? ' eof' : ''), "200 $size eof",
       '2d: its whole response');
    unlike($t->error_log_since($off), qr/buffered to a temporary file/,
           '2d: nothing written to a temporary file');
}

# ------------------------------------------------------------ 3. stripped Vary

# The origin varies on a header the fetch does not send: the leader, who
# sent it, gets what plain nginx gives.  (A Range to the end: the fetch
# of a bounded one sends it, t/singleflight_range_probe.t.)
for my $case (['Range', 'Range: bytes=0-'],
              ['If-None-Match', 'If-None-Match: "x"'])
{
    my ($name, $header) = @$case;
    my %got;
    for my $i (0, 1) {
        my $s = connect_to($t->port($i));
        send_request($s, "/vary-$name-$i?size=100000&fail=slowbody"
                     . "&pieces=4&delay=200&hdr=Vary:$name",
                     $header, 'Connection: close');
        my ($text, $eof) = read_all($s, 10);
        my ($status, $h, $body) = parse($text);
        $got{$i} = [$status, length $body];
    }
    is($got{0}[0], $got{1}[0], "3 Vary: $name: the status of plain nginx")
        or diag("on $got{0}[0], off $got{1}[0]");
    is($got{0}[1], $got{1}[1], "3 Vary: $name: the body of plain nginx");
}

# Followers that send the header: none can ever share a flight, each goes
# upstream once on its own (not first through a fetch of its own variant).
{
    my $path = '/vary-f?size=20000&delay=300&hdr=Vary:Range';
    my $lead = $t->start_request('GET', $path);
    $t->wait_for(sub { $t->origin_uri_hits($path) >= 1 }, what => 'the leader');
    my @f = map { $t->start_request('GET', $path, headers => [ Range => 'bytes=0-' ]) }
        1 .. 2;
    my @res = map { $t->finish_request($_) } $lead, @f;
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body}) == 20000 } @res),
       3, '3 Vary: Range followers: every response whole');
    is($t->origin_uri_hits($path), 3,
       '3 Vary: Range followers: one origin request each, none wasted');
}

# With early_hints (nginx 1.29 and later), a lone leader gets the 103 and
# then its response, as without the module.
SKIP: {
    skip "nginx $nginx_v has no early_hints", 2 unless $early;
    my %got;
    for my $i (0, 1) {
        my $s = connect_to($t->port($i));
        send_request($s, "/early/e$i?size=100&delay=100&hints=1", 'Connection: close');
        my ($text) = read_all($s, 10);
        $got{$i} = join ' ', $text =~ m{^HTTP/1\.1 (\d+)}mg;
    }
    is($got{1}, '103 200', 'early hints, off: 103 then 200');
    is($got{0}, $got{1}, 'early hints, on: as off');
}

# ------------------------------------------------------------ cut short

# The origin closes before the length it announced: a lone leader gets
# what plain nginx gives, the header and what came, then the connection
# closed; with nothing after the header, the header all the same.
for my $case (['half', 'size=1000&fail=midbody'], ['empty', 'size=1&fail=midbody']) {
    my ($name, $q) = @$case;
    my %got;
    for my $i (0, 1) {
        my $s = connect_to($t->port($i));
        send_request($s, "/cut-$name-$i?$q", 'Connection: close');
        my ($text, $eof) = read_all($s, 10);
        my ($status, $h, $body) = parse($text);
        $got{$i} = "$status " . length($body) . ($eof ? ' closed' : ' open');
    }
    is($got{0}, $got{1}, "cut short ($name): as plain nginx ($got{1})");
}

# ------------------------------------------------------------ too long

# An origin that sends more than its Content-Length: nginx gives the
# client the announced length only, module or not.
{
    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                       Listen => 16, ReuseAddr => 1)
        or die "listen: $!";
    my $port = $listen->sockport;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        # the harness's handlers and END blocks are the parent's
        $SIG{$_} = 'DEFAULT' for qw(TERM INT HUP);
        while (my $c = $listen->accept) {
            my $req = '';
            while (<$c>) { $req .= $_; last if /^\r?\n$/ }
            select undef, undef, undef, 0.2;
            print $c "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                . "Content-Length: 8\r\nConnection: close\r\n\r\n"
                . "SEE-THIS-BUT-NOT-THIS\n";
            close $c;
        }
        POSIX::_exit(0);
    }
    close $listen;
    my %got;
    for my $i (0, 1) {
        my $s = connect_to($t->port($i));
        send_request($s, "/extra/long-$i?p=$port", 'Connection: close');
        my ($text) = read_all($s, 10);
        my ($status, $h, $body) = parse($text);
        $got{$i} = "$status $body";
    }
    kill 'KILL', $pid;
    waitpid $pid, 0;
    is($got{1}, '200 SEE-THIS', 'too long, off: the announced length');
    is($got{0}, $got{1}, 'too long, on: as plain nginx');
}

# ------------------------------------------------------------ variables

# $upstream_response_time in the leader's own header: the upstreams so
# far, the last one's response not over ("-"), as nginx says; its access
# log line has the final time.  The body comes 100 ms after the header:
# the leader's header goes out before the fetch is over, straight from
# the fetch (/rt/, a lone response unstored) or from the store (/rts/,
# singleflight_lazy off).
for my $loc ('rt', 'rts') {
    my %x;
    for my $i (0, 1) {
        my $r = $t->get("/$loc/p$i?size=100&body_delay=100", port => $t->port($i));
        $x{$i} = [ $r->{status}, $r->{headers}{'x-response'} // '(none)',
                   $r->{headers}{'x-status'} // '(none)' ];
    }
    like($x{1}[1], qr/^\d+\.\d{3}, -$/, "/$loc/: upstream_response_time, off: \"T, -\"");
    like($x{0}[1], qr/^\d+\.\d{3}, -$/, "/$loc/: upstream_response_time, on: \"T, -\" as off")
        or diag("on: @{ $x{0} }, off: @{ $x{1} }");
    is($x{0}[2], $x{1}[2], "/$loc/: upstream_status as off");
    my @log = $t->wait_log_records('rt.log', [qw(port uri rt)], 1, uri => "/$loc/p0?size=100&body_delay=100");
    like($log[0]{rt} // '', qr/^\d+\.\d{3}, \d+\.\d{3}$/,
         "/$loc/: upstream_response_time, on: the log has the final time");
}

# $proxy_host and $proxy_port in the leader's own header, and an origin's
# Upgrade on a 200 (nginx passes it to HTTP/1.x clients since 1.29): as
# without the module.
{
    my %x;
    for my $i (0, 1) {
        my $r = $t->get("/pvars/p$i?size=100&body_delay=100&hdr=Upgrade:websocket",
                        port => $t->port($i));
        $x{$i} = join ' | ', map { $r->{headers}{$_} // '(none)' }
            qw(x-proxy-host x-proxy-port upgrade);
    }
    like($x{1}, qr/^127\.0\.0\.1:\d+ \| \d+ \| /, 'proxy variables, off');
    is($x{0}, $x{1}, 'proxy variables and Upgrade, on: as off');
}

# ------------------------------------------------------------ gRPC

# A gRPC call's status comes in trailers, which a flight does not keep:
# identical calls are not collapsed; the same POSTs of another type are.
for my $type ('application/grpc', 'application/json') {
    my $path = "/grpc/call-$type?delay=300";
    my @h = map { $t->start_request('POST', $path, body => 'same',
                                    headers => [ 'Content-Type' => $type ]) } 1 .. 3;
    my @res = map { $t->finish_request($_) } @h;
    is(scalar(grep { ($_->{status} // 0) == 200 } @res), 3, "$type: 3 answers");
    is($t->origin_uri_hits($path), $type =~ /grpc/ ? 3 : 1,
       $type =~ /grpc/ ? "$type: not collapsed" : "$type: collapsed");
}

# ------------------------------------------------------------ 6. 103

# The origin sends 103 Early Hints, then its 200: every client, leader
# and followers, gets the final response that plain nginx gives (nginx
# before 1.29 passes the 103 on, the rest after it; 1.29 and later drop
# it unless early_hints allows it).
{
    my $path = '/hints?size=5000&delay=300&hints=1';
    my (@on, $off);
    for my $n (1 .. 3) {
        my $s = connect_to($t->port(0));
        send_request($s, $path, 'Connection: close');
        push @on, $s;
        sleep 0.05;
    }
    my $s = connect_to($t->port(1));
    send_request($s, $path, 'Connection: close');
    ($off) = read_all($s, 10);
    my $final = sub {
        my ($text) = @_;
        $text =~ s{^HTTP/1\.1 1\d\d [^\r]*\r\n(?:[^\r]+\r\n)*\r\n}{} while $text =~ m{^HTTP/1\.1 1\d\d };
        my ($status, $h, $body) = parse($text);
        return "$status " . length($body) . ' ' . ($body =~ /^hit=\d+ uri=(\S+)/ ? $1 : '');
    };
    like($final->($off), qr{^200 5000 /hints}, '6 off: the final 200 after the 103');
    for my $i (0 .. $#on) {
        my ($text) = read_all($on[$i], 10);
        is($final->($text), $final->($off), "6 on, client $i: the final response");
    }
}

# ------------------------------------------------------------ 8. 204/304

# A 204 or 304 that announces a Content-Length has no body all the same:
# the flight is complete with its header, rather than cut at byte 0 of
# that length and fetched again.
for my $status (204, 304) {
    my $path = "/nobody$status?status=$status&delay=300&hdr=Content-Length:100";
    my @h = map { $t->start_request('GET', $path, timeout => 10) } 1 .. 4;
    my $off = $t->start_request('GET', $path, port => $t->port(1), timeout => 10);
    my $res = $t->finish_all([ @h, $off ]);
    my $plain = pop @$res;
    is($plain->{status}, $status, "8 off: $status");
    is(scalar(grep { ($_->{status} // 0) == $status && ($_->{body} // '') eq ''
                     && $_->{complete} } @$res), 4, "8 on: 4 whole ${status}s");
    is($t->origin_uri_hits($path), 2, "8 $status: one origin request with the module, one without");
}

done_testing;
