#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# t/fcgi_origin.pl - a tiny FastCGI, uwsgi and SCGI responder for the
# singleflight tests (t/singleflight_upstreams.t).  Perl core modules only.
#
# One process, one non-blocking event loop (t/lib/SFOrigin.pm), any number
# of concurrent connections.  It listens on up to three application ports,
# one per protocol, and on a plain-HTTP control port:
#
#   GET /_hits    {"total":N,"fastcgi":N,"uwsgi":N,"scgi":N,"uris":{...}}
#   GET /_reset   zeroes the counters
#
# Every application request is one hit.  The answer is
#
#   Status: 200 OK              (uwsgi: "HTTP/1.1 200 OK", a raw HTTP head)
#   Content-Type: text/plain
#   X-Hit: N                    (N: the hit number over all protocols)
#
# and the body "hit=N uri=URI\n", padded to size= bytes as t/origin.pl
# pads it (SFOrigin::body(), which SFTest::origin_body() is).  URI is
# the REQUEST_URI parameter.  Query arguments (from QUERY_STRING):
#
#   delay=MS    answer MS milliseconds after the request is complete (a
#               timer: other connections are served meanwhile)
#   size=N      body of exactly N bytes
#   pieces=K    send the head, then the body in K pieces ...
#   gap=MS      ... GAP ms apart (default 0)
#   accel=URI   add "X-Accel-Redirect: URI" (nginx then answers from URI)
#   vary=NAME   add "Vary: NAME", and end the body with the line
#               "NAME=VALUE", VALUE being the request's HTTP_NAME
#               parameter ("-" for "_", as nginx makes header names)
#
# The actual ports are written, once all are listening, to --port-file as
# "fastcgi=P\nuwsgi=P\nscgi=P\ncontrol=P\n".  With --ppid, the process
# exits when that process is no longer its parent.
#
# Usage: perl t/fcgi_origin.pl [--fastcgi ADDR] [--uwsgi ADDR] [--scgi ADDR]
#            [--control ADDR] [--port-file F] [--log F] [--ppid PID]
# ADDR is HOST:PORT (port 0: any free port).  Without any of --fastcgi,
# --uwsgi, --scgi, all three are opened on 127.0.0.1:0.

use strict;
use warnings;

use FindBin;
use Getopt::Long qw(GetOptions);
use Time::HiRes qw(time);

use lib "$FindBin::Bin/lib";
use SFOrigin;

my %addr;
my ($port_file, $log_file, $watch_ppid);
GetOptions(
    'fastcgi=s'   => \$addr{fastcgi},
    'uwsgi=s'     => \$addr{uwsgi},
    'scgi=s'      => \$addr{scgi},
    'control=s'   => \$addr{control},
    'port-file=s' => \$port_file,
    'log=s'       => \$log_file,
    'ppid=i'      => \$watch_ppid,
) or die "usage: fcgi_origin.pl [--fastcgi|--uwsgi|--scgi|--control HOST:PORT]"
       . " [--port-file F] [--log F] [--ppid PID]\n";

if (!grep { defined $addr{$_} } qw(fastcgi uwsgi scgi)) {
    $addr{$_} = '127.0.0.1:0' for qw(fastcgi uwsgi scgi);
}
$addr{control} //= '127.0.0.1:0';

# FastCGI record types and constants
use constant {
    FCGI_VERSION_1       => 1,
    FCGI_BEGIN_REQUEST   => 1,
    FCGI_ABORT_REQUEST   => 2,
    FCGI_END_REQUEST     => 3,
    FCGI_PARAMS          => 4,
    FCGI_STDIN           => 5,
    FCGI_STDOUT          => 6,
    FCGI_GET_VALUES      => 9,
    FCGI_GET_VALUES_RESULT => 10,
    FCGI_UNKNOWN_TYPE    => 11,
    FCGI_KEEP_CONN       => 1,
    FCGI_REQUEST_COMPLETE => 0,
};

my %count = (total => 0, fastcgi => 0, uwsgi => 0, scgi => 0);
my %uri_hits;

my $log_fh;
if (defined $log_file) {
    open($log_fh, '>>', $log_file) or die "fcgi_origin: cannot open $log_file: $!\n";
    $log_fh->autoflush(1);
}

my $loop = SFOrigin->new(ppid => $watch_ppid);
my @ports;

for my $proto (qw(fastcgi uwsgi scgi control)) {
    next unless defined $addr{$proto};
    my ($host, $port) = $addr{$proto} =~ /^([\w.:-]+):(\d+)$/
        or die "fcgi_origin: bad address for --$proto: $addr{$proto}\n";
    my $l = $loop->listen($host, $port, backlog => 1024, tag => $proto, name => 'fcgi_origin');
    push @ports, "$proto=" . $l->sockport . "\n";
}

SFOrigin::write_file_atomic($port_file, join('', @ports)) if defined $port_file;

# ---------------------------------------------------------------- main loop

$loop->run(
    new_conn => sub { (steps => [], at => 0, reqs => {}) },
    readable => \&on_readable,
    writable => \&flush,
    wake_at  => sub { @{ $_[0]{steps} } ? $_[0]{at} : undef },
    on_time  => sub {
        my ($c, $now) = @_;
        run_steps($c) if @{ $c->{steps} } && $c->{at} <= $now;
    },
);
exit 0;

# ---------------------------------------------------------------- plumbing

sub on_readable {
    my ($c) = @_;
    my $got = $loop->read($c) // return;
    return $loop->close_conn($c) unless $got;
    if ($c->{answered}) {
        $c->{rbuf} = '';           # input after our answer is ignored
        return;
    }
    my $parse = \&{"parse_$c->{tag}"};
    $parse->($c);
}

sub flush {
    my ($c) = @_;
    $loop->flush($c) or return $loop->close_conn($c);
    run_steps($c) unless length $c->{wbuf};
}

# A response is a list of steps, run in order once {at} has come:
#   [write => bytes]  [wait => seconds]  ['close']  ['done']
sub schedule {
    my ($c, $delay, @steps) = @_;
    push @{ $c->{steps} }, @steps;
    $c->{at} = time + $delay;
    run_steps($c);
}

sub run_steps {
    my ($c) = @_;
    while (!$c->{dead} && !$c->{draining} && @{ $c->{steps} }) {
        return if $c->{at} > time || length $c->{wbuf};
        my $step = shift @{ $c->{steps} };
        my $op = $step->[0];
        if ($op eq 'write') {
            $c->{wbuf} .= $step->[1];
            return flush($c);
        }
        if ($op eq 'wait') {
            $c->{at} = time + $step->[1];
            next;
        }
        if ($op eq 'done') {             # a kept-alive FastCGI connection
            $c->{answered} = 0;
            next;
        }
        if ($op eq 'close') {
            @{ $c->{steps} } = ();
            $loop->drain($c);
            return;
        }
    }
}

# ---------------------------------------------------------------- responses

# Counts a hit and returns (delay seconds, head lines, body pieces, gap s)
# for the request described by the CGI-style variables in %$env.
sub answer {
    my ($proto, $env) = @_;
    my %p = map { @$_ } SFOrigin::parse_query($env->{QUERY_STRING});
    my $uri = $env->{REQUEST_URI} // '';
    my $hit = ++$count{total};
    $count{$proto}++;
    $uri_hits{$uri}++;
    printf $log_fh "%.3f %d %s %s %s\n", time, $hit, $proto,
        $env->{REQUEST_METHOD} // '-', $uri if $log_fh;

    my $size = ($p{size} // '') =~ /^(\d+)$/ ? $1 : undef;
    my $body = SFOrigin::body($hit, $uri, $size);
    if (defined $p{vary}) {
        (my $param = 'HTTP_' . uc $p{vary}) =~ tr/-/_/;
        $body .= "$p{vary}=" . ($env->{$param} // '') . "\n";
    }
    $body = '' if ($env->{REQUEST_METHOD} // '') eq 'HEAD';
    my $pieces = ($p{pieces} // '') =~ /^([1-9]\d*)$/ ? $1 : 1;
    my $len = int((length($body) + $pieces - 1) / $pieces) || 1;
    my @body;
    for (my $off = 0; $off < length $body; $off += $len) {
        push @body, substr($body, $off, $len);
    }
    my $head = "Content-Type: text/plain\r\nX-Hit: $hit\r\n";
    $head .= "X-Accel-Redirect: $p{accel}\r\n" if defined $p{accel};
    $head .= "Vary: $p{vary}\r\n" if defined $p{vary};
    return (($p{delay} // 0) / 1000, $head, \@body, ($p{gap} // 0) / 1000);
}

# ---------------------------------------------------------------- FastCGI

sub fcgi_record {
    my ($type, $id, $content) = @_;
    my $out = '';
    my $off = 0;
    do {
        my $piece = substr($content, $off, 65535);
        my $pad = (8 - length($piece) % 8) % 8;
        $out .= pack('CCnnCC', FCGI_VERSION_1, $type, $id, length $piece, $pad, 0)
            . $piece . ("\0" x $pad);
        $off += 65535;
    } while ($off < length $content);
    return $out;
}

sub fcgi_pairs {
    my ($data) = @_;
    my %env;
    my $off = 0;
    while ($off < length $data) {
        my @len;
        for (1 .. 2) {
            my $b = ord substr($data, $off, 1);
            if ($b & 0x80) {
                push @len, unpack('N', substr($data, $off, 4)) & 0x7fffffff;
                $off += 4;
            }
            else { push @len, $b; $off += 1 }
        }
        my $name = substr($data, $off, $len[0]);
        my $value = substr($data, $off + $len[0], $len[1]);
        $off += $len[0] + $len[1];
        $env{$name} = $value;
    }
    return \%env;
}

sub parse_fastcgi {
    my ($c) = @_;
    while (length $c->{rbuf} >= 8) {
        my ($ver, $type, $id, $clen, $plen) = unpack('CCnnC', $c->{rbuf});
        return $loop->close_conn($c) if $ver != FCGI_VERSION_1;
        last if length $c->{rbuf} < 8 + $clen + $plen;
        my $content = substr($c->{rbuf}, 8, $clen);
        substr($c->{rbuf}, 0, 8 + $clen + $plen, '');

        if ($type == FCGI_GET_VALUES) {
            schedule($c, 0, [ write => fcgi_record(FCGI_GET_VALUES_RESULT, 0, '') ]);
            next;
        }
        if ($type == FCGI_BEGIN_REQUEST) {
            my ($role, $flags) = unpack('nC', $content);
            $c->{reqs}{$id} = { params => '', keep => $flags & FCGI_KEEP_CONN };
            next;
        }
        my $req = $c->{reqs}{$id};
        if (!$req) {
            schedule($c, 0, [ write => fcgi_record(FCGI_UNKNOWN_TYPE, 0,
                pack('C8', $type, 0, 0, 0, 0, 0, 0, 0)) ]) if $id == 0;
            next;
        }
        if ($type == FCGI_ABORT_REQUEST) {
            delete $c->{reqs}{$id};
            return $loop->close_conn($c);
        }
        if ($type == FCGI_PARAMS) {
            if (length $content) { $req->{params} .= $content }
            else { $req->{env} = fcgi_pairs($req->{params}) }
            next;
        }
        if ($type == FCGI_STDIN && !length $content) {    # end of the request
            delete $c->{reqs}{$id};
            fastcgi_respond($c, $id, $req);
        }
    }
}

sub fastcgi_respond {
    my ($c, $id, $req) = @_;
    my ($delay, $head, $body, $gap) = answer('fastcgi', $req->{env} // {});
    my @steps = ([ write => fcgi_record(FCGI_STDOUT, $id, "Status: 200 OK\r\n$head\r\n") ]);
    for (@$body) {
        push @steps, [ wait => $gap ] if $gap;
        push @steps, [ write => fcgi_record(FCGI_STDOUT, $id, $_) ];
    }
    push @steps, [ write => pack('CCnnCC', FCGI_VERSION_1, FCGI_STDOUT, $id, 0, 0, 0)
        . fcgi_record(FCGI_END_REQUEST, $id, pack('NCC3', 0, FCGI_REQUEST_COMPLETE, 0, 0, 0)) ];
    push @steps, $req->{keep} ? ['done'] : ['close'];
    $c->{answered} = 1 unless $req->{keep};
    schedule($c, $delay, @steps);
}

# ---------------------------------------------------------------- uwsgi

sub parse_uwsgi {
    my ($c) = @_;
    return if length $c->{rbuf} < 4;
    my ($mod1, $size, $mod2) = unpack('CvC', $c->{rbuf});
    return if length $c->{rbuf} < 4 + $size;
    my $vars = substr($c->{rbuf}, 4, $size);
    $c->{rbuf} = '';               # a request body, if any, is ignored
    my %env;
    my $off = 0;
    while ($off + 2 <= length $vars) {
        my $kl = unpack('v', substr($vars, $off, 2));
        my $k = substr($vars, $off + 2, $kl);
        $off += 2 + $kl;
        my $vl = unpack('v', substr($vars, $off, 2));
        $env{$k} = substr($vars, $off + 2, $vl);
        $off += 2 + $vl;
    }
    # a raw HTTP response, delimited by the end of the connection
    answer_and_close($c, 'uwsgi', \%env, 'HTTP/1.1 200 OK');
}

# Answers the request in %$env (answer()) after the line $first, then
# closes the connection: the end of the connection ends the body.
sub answer_and_close {
    my ($c, $proto, $env, $first) = @_;
    $c->{answered} = 1;
    my ($delay, $head, $body, $gap) = answer($proto, $env);
    my @steps = ([ write => "$first\r\n$head\r\n" ]);
    for (@$body) {
        push @steps, [ wait => $gap ] if $gap;
        push @steps, [ write => $_ ];
    }
    schedule($c, $delay, @steps, ['close']);
}

# ---------------------------------------------------------------- SCGI

sub parse_scgi {
    my ($c) = @_;
    my ($len) = $c->{rbuf} =~ /^(\d+):/ or do {
        $loop->close_conn($c) if length $c->{rbuf} > 10;
        return;
    };
    my $start = length($len) + 1;
    return if length $c->{rbuf} < $start + $len + 1;
    my $headers = substr($c->{rbuf}, $start, $len);
    return $loop->close_conn($c) if substr($c->{rbuf}, $start + $len, 1) ne ',';
    $c->{rbuf} = '';
    my @kv = split /\0/, $headers, -1;
    pop @kv if @kv % 2;            # the trailing NUL
    my %env = @kv;
    answer_and_close($c, 'scgi', \%env, 'Status: 200 OK');
}

# ---------------------------------------------------------------- control

sub parse_control {
    my ($c) = @_;
    my $end = index($c->{rbuf}, "\r\n\r\n");
    if ($end < 0) {
        $loop->close_conn($c) if length $c->{rbuf} > 65536;
        return;
    }
    my ($path) = $c->{rbuf} =~ m{^[A-Z]+ (\S+) HTTP/1\.[01]\r\n};
    $c->{rbuf} = '';
    $c->{answered} = 1;
    my ($status, $body) = ('200 OK', "ok\n");
    if (($path // '') eq '/_hits') {
        $body = '{' . join(',', (map { qq("$_":$count{$_}) } sort keys %count),
            '"uris":{' . join(',', map { my $u = $_ =~ s/(["\\])/\\$1/gr; qq("$u":$uri_hits{$_}) }
                sort keys %uri_hits) . '}') . "}\n";
    }
    elsif (($path // '') eq '/_reset') {
        $count{$_} = 0 for keys %count;
        %uri_hits = ();
    }
    else { ($status, $body) = ('404 Not Found', "not found\n") }
    schedule($c, 0, [ write => "HTTP/1.1 $status\r\nContent-Type: application/json\r\n"
        . "Content-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body" ],
        ['close']);
}
