#!/usr/bin/perl
#
# t/fcgi_origin.pl - a tiny FastCGI, uwsgi and SCGI responder for the
# singleflight tests (t/singleflight_upstreams.t).  Perl core modules only.
#
# One process, one non-blocking event loop over IO::Select, any number of
# concurrent connections.  It listens on up to three application ports,
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
# and the body "hit=N uri=URI\n", padded to size= bytes with the same
# pattern as t/origin.pl (so SFTest::origin_body() rebuilds it).  URI is
# the REQUEST_URI parameter.  Query arguments (from QUERY_STRING):
#
#   delay=MS    answer MS milliseconds after the request is complete (a
#               timer: other connections are served meanwhile)
#   size=N      body of exactly N bytes
#   pieces=K    send the head, then the body in K pieces ...
#   gap=MS      ... GAP ms apart (default 0)
#   accel=URI   add "X-Accel-Redirect: URI" (nginx then answers from URI)
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

use Errno qw(EAGAIN EWOULDBLOCK EINTR);
use Getopt::Long qw(GetOptions);
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time);

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

my $PATTERN = join('', 'a' .. 'z', 0 .. 9) . "\n";    # as in t/origin.pl

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

my $DRAIN_TIME = 2;    # seconds to wait for the peer's EOF after shutdown()

my %count = (total => 0, fastcgi => 0, uwsgi => 0, scgi => 0);
my %uri_hits;

my $log_fh;
if (defined $log_file) {
    open($log_fh, '>>', $log_file) or die "fcgi_origin: cannot open $log_file: $!\n";
    $log_fh->autoflush(1);
}

my $rsel = IO::Select->new;
my $wsel = IO::Select->new;
my %listeners;         # "$fh" => protocol
my %conns;             # "$fh" => connection state
my @ports;

for my $proto (qw(fastcgi uwsgi scgi control)) {
    next unless defined $addr{$proto};
    my ($host, $port) = $addr{$proto} =~ /^([\w.:-]+):(\d+)$/
        or die "fcgi_origin: bad address for --$proto: $addr{$proto}\n";
    my $l = IO::Socket::INET->new(LocalAddr => $host, LocalPort => $port,
        Proto => 'tcp', Listen => 1024, ReuseAddr => 1)
        or die "fcgi_origin: cannot listen on $addr{$proto}: $@\n";
    $l->blocking(0);
    $listeners{"$l"} = $proto;
    $rsel->add($l);
    push @ports, "$proto=" . $l->sockport . "\n";
}

if (defined $port_file) {
    my $tmp = "$port_file.tmp.$$";
    open(my $fh, '>', $tmp) or die "fcgi_origin: cannot write $tmp: $!\n";
    print $fh @ports;
    close($fh) or die "fcgi_origin: cannot write $tmp: $!\n";
    rename($tmp, $port_file) or die "fcgi_origin: cannot rename $tmp: $!\n";
}

my $stop = 0;
$SIG{TERM} = $SIG{INT} = sub { $stop = 1 };
$SIG{PIPE} = 'IGNORE';

# ---------------------------------------------------------------- main loop

my $last_ppid_check = 0;
while (!$stop) {
    my $now = time;
    if ($watch_ppid && $now - $last_ppid_check > 0.5) {
        $last_ppid_check = $now;
        last if getppid() != $watch_ppid;
    }

    my ($r, $w) = IO::Select->select($rsel, $wsel, undef, next_timeout($now));
    for my $fh (@{ $r || [] }) {
        if (my $proto = $listeners{"$fh"}) { accept_all($fh, $proto) }
        else { on_readable($conns{"$fh"} // next) }
    }
    for my $fh (@{ $w || [] }) {
        my $c = $conns{"$fh"} // next;
        flush($c) unless $c->{dead};
    }
    run_timers();
}
close_conn($_) for values %conns;
exit 0;

# ---------------------------------------------------------------- plumbing

sub next_timeout {
    my ($now) = @_;
    my $t = 0.5;
    for my $c (values %conns) {
        my $at = $c->{draining} // (@{ $c->{steps} } ? $c->{at} : undef);
        next unless defined $at;
        my $d = $at - $now;
        $t = $d if $d < $t;
    }
    return $t < 0 ? 0 : $t;
}

sub accept_all {
    my ($l, $proto) = @_;
    for (1 .. 256) {
        my $fh = $l->accept or last;
        $fh->blocking(0);
        $conns{"$fh"} = { fh => $fh, proto => $proto, rbuf => '', wbuf => '',
                          steps => [], at => 0, reqs => {} };
        $rsel->add($fh);
    }
}

sub on_readable {
    my ($c) = @_;
    my $n = sysread($c->{fh}, $c->{rbuf}, 65536, length $c->{rbuf});
    if (!defined $n) {
        return if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
        return close_conn($c);
    }
    return close_conn($c) if $n == 0;
    if ($c->{draining} || $c->{answered}) {
        $c->{rbuf} = '';           # input after our answer is ignored
        return;
    }
    my $parse = \&{"parse_$c->{proto}"};
    $parse->($c);
}

sub close_conn {
    my ($c) = @_;
    return if $c->{dead};
    $c->{dead} = 1;
    $rsel->remove($c->{fh});
    $wsel->remove($c->{fh});
    delete $conns{"$c->{fh}"};
    close($c->{fh});
}

sub flush {
    my ($c) = @_;
    while (length $c->{wbuf}) {
        my $n = syswrite($c->{fh}, $c->{wbuf});
        if (!defined $n) {
            last if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
            return close_conn($c);
        }
        substr($c->{wbuf}, 0, $n, '');
    }
    if (length $c->{wbuf}) { $wsel->add($c->{fh}) }
    else { $wsel->remove($c->{fh}); run_steps($c) }
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
            # half-close and wait for the peer's EOF, so that unread input
            # does not turn our FIN into an RST that loses the answer
            @{ $c->{steps} } = ();
            shutdown($c->{fh}, 1);
            $c->{draining} = time + $DRAIN_TIME;
            return;
        }
    }
}

sub run_timers {
    my $now = time;
    for my $c (values %conns) {
        next if $c->{dead};
        if ($c->{draining}) {
            close_conn($c) if $now >= $c->{draining};
            next;
        }
        run_steps($c) if @{ $c->{steps} } && $c->{at} <= $now;
    }
}

# ---------------------------------------------------------------- responses

sub url_decode {
    my ($s) = @_;
    $s =~ tr/+/ /;
    $s =~ s/%([0-9a-fA-F]{2})/chr hex $1/ge;
    return $s;
}

sub make_body {
    my ($stamp, $size) = @_;
    return $stamp unless defined $size;
    return substr($stamp, 0, $size) if $size <= length $stamp;
    my $pad = $size - length $stamp;
    return $stamp . substr($PATTERN x (int($pad / length $PATTERN) + 1), 0, $pad);
}

# Counts a hit and returns (delay seconds, head lines, body pieces, gap s)
# for the request described by the CGI-style variables in %$env.
sub answer {
    my ($proto, $env) = @_;
    my %p;
    for (grep { length } split /&/, $env->{QUERY_STRING} // '') {
        my ($k, $v) = split /=/, $_, 2;
        $p{ url_decode($k) } = url_decode($v // '');
    }
    my $uri = $env->{REQUEST_URI} // '';
    my $hit = ++$count{total};
    $count{$proto}++;
    $uri_hits{$uri}++;
    printf $log_fh "%.3f %d %s %s %s\n", time, $hit, $proto,
        $env->{REQUEST_METHOD} // '-', $uri if $log_fh;

    my $size = ($p{size} // '') =~ /^(\d+)$/ ? $1 : undef;
    my $body = make_body("hit=$hit uri=$uri\n", $size);
    $body = '' if ($env->{REQUEST_METHOD} // '') eq 'HEAD';
    my $pieces = ($p{pieces} // '') =~ /^([1-9]\d*)$/ ? $1 : 1;
    my $len = int((length($body) + $pieces - 1) / $pieces) || 1;
    my @body;
    for (my $off = 0; $off < length $body; $off += $len) {
        push @body, substr($body, $off, $len);
    }
    my $head = "Content-Type: text/plain\r\nX-Hit: $hit\r\n";
    $head .= "X-Accel-Redirect: $p{accel}\r\n" if defined $p{accel};
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
        return close_conn($c) if $ver != FCGI_VERSION_1;
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
            return close_conn($c);
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
    $c->{answered} = 1;
    my ($delay, $head, $body, $gap) = answer('uwsgi', \%env);
    # a raw HTTP response, delimited by the end of the connection
    my @steps = ([ write => "HTTP/1.1 200 OK\r\n$head\r\n" ]);
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
        close_conn($c) if length $c->{rbuf} > 10;
        return;
    };
    my $start = length($len) + 1;
    return if length $c->{rbuf} < $start + $len + 1;
    my $headers = substr($c->{rbuf}, $start, $len);
    return close_conn($c) if substr($c->{rbuf}, $start + $len, 1) ne ',';
    $c->{rbuf} = '';
    my @kv = split /\0/, $headers, -1;
    pop @kv if @kv % 2;            # the trailing NUL
    my %env = @kv;
    $c->{answered} = 1;
    my ($delay, $head, $body, $gap) = answer('scgi', \%env);
    my @steps = ([ write => "Status: 200 OK\r\n$head\r\n" ]);
    for (@$body) {
        push @steps, [ wait => $gap ] if $gap;
        push @steps, [ write => $_ ];
    }
    schedule($c, $delay, @steps, ['close']);
}

# ---------------------------------------------------------------- control

sub parse_control {
    my ($c) = @_;
    my $end = index($c->{rbuf}, "\r\n\r\n");
    if ($end < 0) {
        close_conn($c) if length $c->{rbuf} > 65536;
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
