#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# t/origin.pl - scriptable HTTP/1.1 origin server for the singleflight tests.
#
# A single process, non-blocking event loop (t/lib/SFOrigin.pm).  Every
# response is shaped by the query string of its request (see usage() below),
# so a test only has to build the right URL.  Control endpoints /_hits and /_reset are
# not counted as hits.
#
# Usage: perl t/origin.pl --listen 127.0.0.1:PORT [--port-file F] [--log F]
#                         [--ppid PID]

use strict;
use warnings;

use FindBin;
use Getopt::Long qw(GetOptions);
use JSON::PP;
use Socket qw(SOL_SOCKET SO_LINGER);
use sort 'stable';    # echoed repeats of a header keep their order
use Time::HiRes qw(time);

use lib "$FindBin::Bin/lib";
use SFOrigin;

sub usage {
    print STDERR <<'EOT';
usage: origin.pl --listen HOST:PORT [--port-file FILE] [--log FILE] [--ppid PID]

query parameters understood on every request:
  delay=MS        wait MS milliseconds before responding
  slow=PORT:MS    (repeatable) the origin listening on PORT waits MS
                  milliseconds more: one slow server among several
  at=EPOCH_MS     respond at that moment (Unix time in ms), not before;
                  many requests given the same at= are answered at once
  size=N          body of exactly N bytes (stamp line + padding pattern)
  status=CODE     response status (default 200)
  chunked=1       Transfer-Encoding: chunked instead of Content-Length
  trailer=N:V     with chunked=1, a trailer field after the last chunk
  close=1         "Connection: close" and close after the response
  body_delay=MS   send the header (after delay=), the body MS ms later;
                  with fail=midbody, close MS ms after the half body
  pace=N:MS       send the body N bytes at a time, the first N with the
                  header (after delay=), each next one MS ms after the
                  last: a large body that takes a while, whose first
                  bytes (or a short 206) come at once
  pieces=K        number of body pieces for fail=slowbody (default 4)
  fail=KIND       reset | close | hang | midbody | slowbody | cut | stall
  cut=N           with fail=cut, close after the header and N body bytes;
                  with fail=stall, send nothing more after them (the
                  connection stays open)
  fail_first=K    apply fail= only to the first K requests for this path+query
  size_after=N    with fail_first=K, the requests after the first K get a
                  body of N bytes instead of size= (the same bytes, fewer)
  hdr=Name:Value  extra response header (repeatable, URL-decoded)
  big_hdr=N       an X-Big response header of N bytes ("x" repeated)
  echo=1          the body echoes the request (see echo_body()): the method
                  (a HEAD as the GET it stands for), the target, the
                  request headers but those in %NOT_ECHOED, sorted, and the
                  request body; with size=N it is padded to at least N
                  bytes.  The response then honours If-None-Match and
                  If-Modified-Since against its ETag and Last-Modified
                  (given with hdr=): 304.  Hit numbers stay in X-Hit.
  ranges=1        (echo=1 or fixed=1) Accept-Ranges: bytes, and a
                  single-range Range (with If-Range) is answered 206, or 416
  fixed=1         the same body on every hit (its stamp says hit=0), and
                  conditional and range requests answered as for echo=1
  stamp=TEXT      (fixed=1) the body's first line names TEXT instead of
                  the request's target: requests that differ in other
                  parameters (a cut, a delay) get the same bytes
  numbered=1      (fixed=1) after the first line, lines that each name
                  their own offset (SFOrigin::numbered_body()) instead of
                  the repeating pattern
  change=K        (fixed=1) the requests after the first K for this
                  path+query get another body of the same size, the first
                  one in upper case, with the same headers: the
                  representation changed within the second of its
                  Last-Modified; a Range is answered from the new one
  change_hdr=Name:Value  (repeatable, with change=K) a header of the other
                  body instead of hdr='s of that name (its own ETag, say)
  multi=1         (ranges=1) several ranges are answered too: a 206
                  multipart/byteranges (boundary "sfmulti"), or a 416
  range_status=S  (ranges=1) a Range is answered S: 416 (Content-Range:
                  bytes */length) or 200 (the whole body)
  range_chunked=1 (ranges=1) a 206 is sent chunked, without Content-Length
                  (with proxy_http_version 1.1), whatever chunked= says
  range_len=N     (ranges=1) a 206's body is N bytes whatever its
                  Content-Range says: the representation's from the
                  range's first byte, then the pattern past its end
  range_start=N   (ranges=1) a 206 is of the bytes from N, whatever the
                  range asked for starts at (its Content-Range says so)
  range_total=N   (ranges=1) a 206's Content-Range names N as the
                  representation's length, whatever it is
  etag_hit=1      ETag: "v<hit of this path+query>", another on every hit
  prefix=TEXT     (echo=1) TEXT (URL-decoded) before the echo, e.g. an SSI
                  command
  hints=1         a "103 Early Hints" (Link: </hint.css>) before the response
control endpoints: GET /_hits (JSON counters; "workers": for each
                  path+query, the X-SF-Worker header of its last request
                  that had one), GET /_reset (zero counters)
EOT
    exit 2;
}

my ($listen_arg, $port_file, $log_file, $watch_ppid);
GetOptions(
    'listen=s'    => \$listen_arg,
    'port-file=s' => \$port_file,
    'log=s'       => \$log_file,
    'ppid=i'      => \$watch_ppid,
) or usage();
usage() unless defined $listen_arg && $listen_arg =~ /^([\w.:-]+):(\d+)$/;
my ($listen_host, $listen_port) = ($1, $2);

my %REASON = (
    200 => 'OK', 201 => 'Created', 204 => 'No Content', 206 => 'Partial Content',
    301 => 'Moved Permanently', 302 => 'Found', 304 => 'Not Modified',
    400 => 'Bad Request', 403 => 'Forbidden', 404 => 'Not Found', 412 => 'Precondition Failed',
    416 => 'Range Not Satisfiable',
    429 => 'Too Many Requests', 500 => 'Internal Server Error',
    502 => 'Bad Gateway', 503 => 'Service Unavailable', 504 => 'Gateway Timeout',
);

my $CHUNK = 4096;          # chunk size for chunked=1 responses
my $MAX_HEADER = 65536;    # refuse larger request header blocks

# Request headers an echo (echo=1) leaves out.  Hop-by-hop and framing
# headers differ with the path a request took, not with what it asks for
# (the body itself is echoed).  CDN-Loop is the mark the singleflight
# module's fetch carries (RFC 8586): the one difference it makes on
# purpose.  Conditional and range headers are answered (304, 206), not
# echoed: the same body then comes whether a client's own If-None-Match
# or Range reached the origin or was answered by nginx from a full 200.
my %NOT_ECHOED = map { $_ => 1 } qw(
    connection keep-alive te upgrade proxy-connection
    content-length transfer-encoding
    cdn-loop
    if-none-match if-modified-since if-match if-unmodified-since if-range range
);

# Counters reported by /_hits.
my $total = 0;             # global hit number H
my %uri_hits;              # "path?query" => count
my %workers;               # "path?query" => its last request's X-SF-Worker
my $aborted = 0;           # requests whose client went away before completion

my $loop = SFOrigin->new(ppid => $watch_ppid);
my $listener = $loop->listen($listen_host, $listen_port, backlog => 4096);

our $MY_PORT = $listener->sockport;
SFOrigin::write_file_atomic($port_file, $listener->sockport . "\n") if defined $port_file;

my $log_fh;
if (defined $log_file) {
    open($log_fh, '>>', $log_file) or die "origin: cannot open $log_file: $!\n";
    $log_fh->autoflush(1);
}

# ---------------------------------------------------------------- main loop

$loop->run(
    new_conn => sub { (jobs => []) },    # responses in request order (pipelining)
    readable => \&on_readable,
    writable => \&flush_conn,
    wake_at  => sub {                    # a pending write is woken by writability
        my ($c) = @_;
        return undef if length $c->{wbuf} || !@{ $c->{jobs} } || $c->{hung};
        return $c->{jobs}[0]{at};
    },
    on_time  => sub {
        my ($c, $now) = @_;
        run_conn($c) if @{ $c->{jobs} } && $c->{jobs}[0]{at} <= $now;
    },
);
exit 0;

# ------------------------------------------------------------------ helpers

sub on_readable {
    my ($c) = @_;
    my $got = $loop->read($c) // return;
    return client_gone($c) unless $got;

    # After close/hang we only watch for EOF; input is discarded.
    if ($c->{closing} || $c->{hung}) {
        $c->{rbuf} = '';
        return;
    }
    parse_requests($c);
    run_conn($c);
}

# The peer closed (or reset) the connection.
sub client_gone {
    my ($c) = @_;
    $aborted += scalar(grep { !$_->{control} } @{ $c->{jobs} }) + ($c->{pending} ? 1 : 0);
    $loop->close_conn($c);
}

# Close with SO_LINGER {1,0} so the kernel sends RST instead of FIN.
sub reset_conn {
    my ($c) = @_;
    setsockopt($c->{fh}, SOL_SOCKET, SO_LINGER, pack('ii', 1, 0));
    $loop->close_conn($c);
}

sub flush_conn {
    my ($c) = @_;
    $loop->flush($c) or return client_gone($c);
    run_conn($c) unless $c->{dead};
}

# ------------------------------------------------------ request parsing

sub parse_requests {
    my ($c) = @_;
    while (!$c->{closing} && !$c->{hung}) {
        if ($c->{body_left}) {                      # Content-Length body
            my $take = length $c->{rbuf};
            $take = $c->{body_left} if $take > $c->{body_left};
            last unless $take;
            my $got = substr($c->{rbuf}, 0, $take, '');
            $c->{collect} .= $got if defined $c->{collect};
            $c->{body_left} -= $take;
            body_done($c) unless $c->{body_left};
            next;
        }
        if ($c->{in_chunked}) {                     # chunked request body
            last unless skip_chunked_body($c);
            body_done($c);
            next;
        }
        $c->{rbuf} =~ s/^(?:\r?\n)+//;              # tolerate stray CRLFs
        my $end = index($c->{rbuf}, "\r\n\r\n");
        if ($end < 0) {
            bad_request($c) if length $c->{rbuf} > $MAX_HEADER;
            last;
        }
        my $head = substr($c->{rbuf}, 0, $end + 4, '');
        handle_request($c, $head);
    }
}

# Consume a chunked request body; returns true when it is complete.
sub skip_chunked_body {
    my ($c) = @_;
    while (1) {
        if ($c->{chunk_left}) {
            my $take = length $c->{rbuf};
            $take = $c->{chunk_left} if $take > $c->{chunk_left};
            return 0 unless $take;
            my $got = substr($c->{rbuf}, 0, $take, '');
            $c->{collect} .= $got if defined $c->{collect};
            $c->{chunk_left} -= $take;
            next;
        }
        my $eol = index($c->{rbuf}, "\r\n");
        return 0 if $eol < 0;
        my $line = substr($c->{rbuf}, 0, $eol + 2, '');
        if ($c->{in_trailer}) {
            next unless $line eq "\r\n";
            $c->{in_chunked} = $c->{in_trailer} = 0;
            return 1;
        }
        next if $line eq "\r\n";                    # CRLF after chunk data
        my ($hex) = $line =~ /^([0-9a-fA-F]+)/ or return bad_request($c);
        my $size = hex $hex;
        if ($size == 0) { $c->{in_trailer} = 1 }
        else { $c->{chunk_left} = $size }
    }
}

# A request body is complete: an echo waiting for it is answered now.
sub body_done {
    my ($c) = @_;
    my $req = delete $c->{pending} or return;
    push @{ $c->{jobs} }, build_job(%$req, req_body => delete $c->{collect});
    $c->{closing} = 1 unless $c->{jobs}[-1]{keepalive};
}

sub bad_request {
    my ($c) = @_;
    my $body = "bad request\n";
    push @{ $c->{jobs} }, {
        control => 1,
        at      => 0,
        steps   => [
            [ write => "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n"
                . "Content-Length: " . length($body) . "\r\n\r\n$body" ],
            ['close'],
        ],
    };
    $c->{closing} = 1;
    return 0;
}

sub handle_request {
    my ($c, $head) = @_;
    my ($line, @lines) = split /\r\n/, $head;
    my ($method, $target, $proto) =
        ($line // '') =~ m{^([A-Z]+) (\S+) HTTP/(1\.[01])$} or return bad_request($c);

    my (%h, @pairs);
    for (@lines) {
        my ($name, $value) = /^([^:\s]+):\s*(.*?)\s*$/ or return bad_request($c);
        $name = lc $name;
        $h{$name} = exists $h{$name} ? "$h{$name}, $value" : $value;
        push @pairs, [ $name, $value ];
    }

    # Request body framing: read and ignore.
    if (($h{'transfer-encoding'} // '') =~ /chunked/i) { $c->{in_chunked} = 1 }
    elsif (($h{'content-length'} // '') =~ /^(\d+)$/) { $c->{body_left} = $1 }

    # Keep-alive semantics of HTTP/1.1 and HTTP/1.0.
    my $conn_hdr = lc($h{connection} // '');
    my $keepalive = $proto eq '1.1' ? $conn_hdr !~ /\bclose\b/ : $conn_hdr =~ /\bkeep-alive\b/;

    my ($path, $query) = split /\?/, $target, 2;
    if ($path eq '/_hits' || $path eq '/_reset') {
        return control_request($c, $path, $keepalive);
    }

    my $hit = ++$total;
    my $uri_hit = ++$uri_hits{$target};
    $workers{$target} = $h{'x-sf-worker'} if defined $h{'x-sf-worker'};
    printf $log_fh "%.3f %d %s %s\n", time, $hit, $method, $target if $log_fh;

    my (%p, @extra, @slow, @changed);
    for my $kv (SFOrigin::parse_query($query)) {
        my ($k, $v) = @$kv;
        if ($k eq 'slow') { push @slow, $v }
        elsif ($k eq 'big_hdr' && $v =~ /^\d+$/) { push @extra, [ 'X-Big', 'x' x $v ] }
        elsif ($k eq 'hdr' || $k eq 'change_hdr') {
            my ($n, $val) = split /:/, $v, 2;
            push @{ $k eq 'hdr' ? \@extra : \@changed }, [ $n, ($val // '') =~ s/^\s+//r ]
                if length $n;
        }
        else { $p{$k} = $v }
    }
    # the other body's headers instead of hdr='s of the same names
    if (@changed && ($p{change} // '') =~ /^(\d+)$/ && $uri_hit > $1) {
        my %new = map { lc $_->[0] => 1 } @changed;
        @extra = ((grep { !$new{ lc $_->[0] } } @extra), @changed);
    }

    my $fail = $p{fail} // '';
    if (defined $p{fail_first} && $uri_hit > $p{fail_first}) {
        $fail = '';
        $p{size} = $p{size_after} if defined $p{size_after};
    }

    my %req = (
        method    => $method,
        target    => $target,
        hit       => $hit,
        uri_hit   => $uri_hit,
        params    => \%p,
        extra     => \@extra,
        slow      => \@slow,
        fail      => $fail,
        keepalive => $keepalive && !$p{close},
        http10    => $proto eq '1.0',
        req_headers => \@pairs,
        req         => \%h,
    );

    # An echo is built once its request body is in (body_done()), and
    # the connection is marked closing only then: input after that is
    # not read.
    if ($p{echo} && ($c->{in_chunked} || $c->{body_left})) {
        $c->{pending} = \%req;
        $c->{collect} = '';
        return;
    }
    push @{ $c->{jobs} }, build_job(%req, req_body => '');
    $c->{closing} = 1 unless $c->{jobs}[-1]{keepalive};
}

sub control_request {
    my ($c, $path, $keepalive) = @_;
    my $body;
    if ($path eq '/_hits') {
        $body = JSON::PP->new->canonical->encode({
            total       => $total,
            uris        => \%uri_hits,
            workers     => \%workers,
            aborted     => $aborted,
            connections => scalar(() = $loop->conns),
        }) . "\n";
    }
    else {
        $total = $aborted = 0;
        %uri_hits = ();
        %workers = ();
        $body = "ok\n";
    }
    my $type = $path eq '/_hits' ? 'application/json' : 'text/plain';
    my $head = "HTTP/1.1 200 OK\r\nDate: " . http_date() . "\r\nContent-Type: $type\r\n"
        . "Content-Length: " . length($body) . "\r\n"
        . ($keepalive ? '' : "Connection: close\r\n") . "\r\n";
    push @{ $c->{jobs} }, {
        control   => 1,
        at        => 0,
        keepalive => $keepalive,
        steps     => [ [ write => $head . $body ], ($keepalive ? () : ['close']) ],
    };
    $c->{closing} = 1 unless $keepalive;
}

# ------------------------------------------------------ response building

sub http_date {
    my @t = gmtime(shift // time);
    my @day = qw(Sun Mon Tue Wed Thu Fri Sat);
    my @mon = qw(Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec);
    return sprintf('%s, %02d %s %04d %02d:%02d:%02d GMT',
        $day[ $t[6] ], $t[3], $mon[ $t[4] ], $t[5] + 1900, @t[ 2, 1, 0 ]);
}

sub chunk_encode {
    my ($data, $last, $trailer) = @_;
    my $out = '';
    for (my $off = 0; $off < length $data; $off += $CHUNK) {
        my $piece = substr($data, $off, $CHUNK);
        $out .= sprintf("%x\r\n", length $piece) . $piece . "\r\n";
    }
    $out .= "0\r\n" . ($trailer // '') . "\r\n" if $last;
    return $out;
}

# A job is a response: a start time and a list of steps executed in order:
#   [write => $bytes]  [wait => $ms]  ['close']  ['reset']  ['hang']
sub build_job {
    my %a = @_;
    my $p = $a{params};
    my $status = ($p->{status} // '') =~ /^(\d{3})$/ ? $1 : 200;
    my $delay = ($p->{delay} // 0) / 1000;
    for (@{ $a{slow} }) {
        $delay += $2 / 1000 if /^(\d+):(\d+)$/ && $1 == $MY_PORT;
    }
    my $chunked = $p->{chunked} ? 1 : 0;
    my $is_head = $a{method} eq 'HEAD';
    my $size = ($p->{size} // '') =~ /^(\d+)$/ ? $1 : undef;

    my %hdr = (date => http_date(), 'content-type' => 'text/plain');
    my @extra;
    for (@{ $a{extra} }) {                          # hdr= may override these two
        my $lc = lc $_->[0];
        if (exists $hdr{$lc}) { $hdr{$lc} = $_->[1] }
        else { push @extra, $_ }
    }

    push @extra, [ 'ETag', qq{"v$a{uri_hit}"} ] if $p->{etag_hit};

    my ($body, $range_hdr, $type);
    if ($p->{echo} || $p->{fixed}) {
        my $stamp = $p->{stamp} // $a{target};
        $body = $p->{echo} ? echo_body(\%a, $size)
            : $p->{numbered} && defined $size ? SFOrigin::numbered_body(0, $stamp, $size)
            : SFOrigin::body(0, $stamp, $size);
        $body = uc $body if ($p->{change} // '') =~ /^(\d+)$/ && $a{uri_hit} > $1;
        my $whole = $body;
        ($status, $body, $range_hdr, $type) = answer_conditional(\%a, $status, $body, \@extra);
        $hdr{'content-type'} = $type if defined $type;
        if ($status == 206) {
            ($body, $range_hdr) = misframed_range($whole, $range_hdr, $p) if defined $range_hdr;
            $chunked = 1 if $p->{range_chunked};
        }
        push @extra, [ 'Accept-Ranges', 'bytes' ] if $p->{ranges} && $status =~ /^(?:200|206)$/;
        push @extra, [ 'Content-Range', $range_hdr ] if defined $range_hdr;
    }
    my $no_body = $status < 200 || $status == 204 || $status == 304;
    my $chunked_ok = $chunked && !$a{http10} && !$no_body;
    $body = $no_body ? '' : $body // SFOrigin::body($a{hit}, $a{target}, $size);

    my $head = "HTTP/1.1 $status " . ($REASON{$status} // 'Status') . "\r\n"
        . "Date: $hdr{date}\r\n"
        . ($status == 304 ? '' : "Content-Type: $hdr{'content-type'}\r\n")
        . "X-Hit: $a{hit}\r\nX-Uri-Hit: $a{uri_hit}\r\n";
    if (!$no_body) {
        $head .= $chunked_ok ? "Transfer-Encoding: chunked\r\n"
            : "Content-Length: " . length($body) . "\r\n";
    }
    if (!$a{keepalive}) { $head .= "Connection: close\r\n" }
    elsif ($a{http10}) { $head .= "Connection: keep-alive\r\n" }
    $head .= "$_->[0]: $_->[1]\r\n" for @extra;
    $head .= "\r\n";

    # hints=1: a 103 Early Hints first (RFC 8297), then the response
    $head = "HTTP/1.1 103 Early Hints\r\nLink: </hint.css>; rel=preload\r\n\r\n"
        . $head if $p->{hints};

    # HEAD: same headers as GET, but no body bytes (not even a last-chunk).
    $body = '' if $is_head;
    my $trailer = ($p->{trailer} // '') =~ /^([^:]+):\s*(.*)$/ ? "$1: $2\r\n" : '';
    my $encode = sub { $is_head ? '' : $chunked_ok ? chunk_encode(@_, $trailer) : $_[0] };
    my @end = $a{keepalive} ? () : ['close'];
    my @steps;
    my $fail = $a{fail};

    if ($fail eq 'reset') { @steps = (['reset']) }
    elsif ($fail eq 'close') { @steps = (['close']) }
    elsif ($fail eq 'hang') { @steps = (['hang']) }
    elsif ($fail eq 'midbody') {
        my $half = substr($body, 0, int(length($body) / 2));
        my @pause = ($p->{body_delay} // '') =~ /^([1-9]\d*)$/ ? ([ wait => $1 / 1000 ]) : ();
        @steps = ([ write => $head . $encode->($half, 0) ], @pause, ['close']);
    }
    elsif ($fail eq 'cut' || $fail eq 'stall') {
        my $n = ($p->{cut} // '') =~ /^(\d+)$/ ? $1 : int(length($body) / 2);
        @steps = ([ write => $head . $encode->(substr($body, 0, $n), 0) ],
                  [ $fail eq 'cut' ? 'close' : 'hang' ]);
    }
    elsif ($fail eq 'slowbody') {
        my $pieces = ($p->{pieces} // '') =~ /^([1-9]\d*)$/ ? $1 : 4;
        my $len = int((length($body) + $pieces - 1) / $pieces) || 1;
        @steps = ([ write => $head ]);
        for (my $off = 0; $off < length $body; $off += $len) {
            my $last = $off + $len >= length $body;
            push @steps, [ wait => $delay ],
                [ write => $encode->(substr($body, $off, $len), $last) ];
        }
        push @steps, [ write => $encode->('', 1) ] unless length $body;
        push @steps, @end;
    }
    elsif (($p->{pace} // '') =~ /^([1-9]\d*):(\d+)$/) {
        my ($n, $wait) = ($1, $2 / 1000);
        @steps = ([ write => $head . $encode->(substr($body, 0, $n), length $body <= $n) ]);
        for (my $off = $n; $off < length $body; $off += $n) {
            push @steps, [ wait => $wait ],
                [ write => $encode->(substr($body, $off, $n), $off + $n >= length $body) ];
        }
        push @steps, @end;
    }
    elsif (($p->{body_delay} // '') =~ /^([1-9]\d*)$/) {
        @steps = ([ write => $head ], [ wait => $1 / 1000 ], [ write => $encode->($body, 1) ], @end);
    }
    else { @steps = ([ write => $head . $encode->($body, 1) ], @end) }

    # Failures other than slowbody drop the connection, never keep it alive.
    my $keepalive = $a{keepalive} && ($fail eq '' || $fail eq 'slowbody');
    my $at = time + $delay;
    if (($p->{at} // '') =~ /^(\d+)$/ && $1 / 1000 > $at) {
        $at = $1 / 1000;
    }
    return { at => $at, steps => \@steps, keepalive => $keepalive };
}

# The body of an echo=1 response: what the request asked for, so that two
# responses are equal exactly when the origin was asked the same.
#   "GET /path?query"           (a HEAD as the GET it stands for: a HEAD
#                                response is the GET's, without the body)
#   "name: value" ...           request headers but %NOT_ECHOED, names in
#                                lower case, sorted (repeats in order)
#   "body: N bytes", an empty line, the request body
# then the pattern up to $size bytes if given, all after prefix=.
sub echo_body {
    my ($job, $size) = @_;
    my $method = $job->{method} eq 'HEAD' ? 'GET' : $job->{method};
    my @h = map { "$_->[0]: $_->[1]" }
        sort { $a->[0] cmp $b->[0] } grep { !$NOT_ECHOED{ $_->[0] } } @{ $job->{req_headers} };
    my $rb = $job->{req_body} // '';
    my $body = ($job->{params}{prefix} // '')
        . join("\n", "$method $job->{target}", @h, 'body: ' . length($rb) . ' bytes')
        . "\n\n" . $rb;
    if (defined $size && $size > length $body) {
        my $pad = $size - length $body;
        $body .= substr($SFOrigin::PATTERN x (int($pad / length $SFOrigin::PATTERN) + 1), 0, $pad);
    }
    return $body;
}

# Seconds since the epoch of an HTTP date (IMF-fixdate only), or undef.
sub parse_http_date {
    my ($s) = @_;
    my %mon = (Jan => 0, Feb => 1, Mar => 2, Apr => 3, May => 4, Jun => 5,
        Jul => 6, Aug => 7, Sep => 8, Oct => 9, Nov => 10, Dec => 11);
    my ($d, $m, $y, $hh, $mm, $ss) =
        ($s // '') =~ /^\w{3}, (\d\d) (\w{3}) (\d{4}) (\d\d):(\d\d):(\d\d) GMT$/ or return undef;
    return undef unless exists $mon{$m};
    require Time::Local;
    return Time::Local::timegm($ss, $mm, $hh, $d, $mon{$m}, $y);
}

# An entity tag list (If-None-Match) has $etag, compared weakly.
sub etag_listed {
    my ($list, $etag) = @_;
    return 0 unless defined $list && defined $etag;
    return 1 if $list =~ /^\s*\*\s*$/;
    my $opaque = $etag =~ s{^W/}{}r;
    return scalar grep { s{^\s*W/}{}r =~ s/^\s+|\s+$//gr eq $opaque } split /,/, $list;
}

# An echo's answer to a conditional or range request, as an origin
# following RFC 9110 gives it: ($status, $body, $content_range).
# If-None-Match (weak comparison) or else If-Modified-Since against the
# response's ETag or Last-Modified (hdr=) turn a 200 into a 304.  With
# ranges=1, one byte range (a-b, a-, -n) turns it into a 206, unless
# If-Range names another validator (ETag compared strongly, or a date
# equal to Last-Modified); an unsatisfiable one into a 416.  Several
# ranges: the whole 200, or with multi=1 a multipart/byteranges 206 of
# the satisfiable ones (returned with its Content-Type) or a 416.
# range_status= answers any Range so instead.
sub answer_conditional {
    my ($job, $status, $body, $extra) = @_;
    return ($status, $body) unless $status == 200 && $job->{method} =~ /^(?:GET|HEAD)$/;
    my $req = $job->{req};
    my ($etag, $lm);
    for (@$extra) {
        $etag = $_->[1] if lc $_->[0] eq 'etag';
        $lm = $_->[1] if lc $_->[0] eq 'last-modified';
    }
    if (defined $req->{'if-none-match'}) {
        return (304, '') if etag_listed($req->{'if-none-match'}, $etag);
    }
    elsif (defined $req->{'if-modified-since'} && defined $lm) {
        my ($since, $mod) = (parse_http_date($req->{'if-modified-since'}), parse_http_date($lm));
        return (304, '') if defined $since && defined $mod && $mod <= $since;
    }
    return ($status, $body) unless $job->{params}{ranges} && defined $req->{range};
    if (defined(my $ir = $req->{'if-range'})) {
        my $fresh = $ir =~ /^(?:W\/)?"/
            ? defined $etag && $etag !~ m{^W/} && $ir eq $etag
            : defined $lm && (parse_http_date($ir) // -1) == (parse_http_date($lm) // -2);
        return ($status, $body) unless $fresh;
    }
    my ($specs) = $req->{range} =~ /^\s*bytes=\s*(.*?)\s*$/i or return ($status, $body);
    my @specs = split /\s*,\s*/, $specs;
    return ($status, $body) unless @specs && (@specs == 1 || $job->{params}{multi});
    my $len = length $body;
    my @ranges;
    for my $spec (@specs) {
        my ($from, $to);
        if ($spec =~ /^(\d+)-(\d*)$/) {
            ($from, $to) = ($1, length $2 ? $2 : $len - 1);
            return ($status, $body) if length $2 && $to < $from;     # invalid: ignored
        }
        elsif ($spec =~ /^-(\d+)$/) { ($from, $to) = ($len - $1, $len - 1); $from = 0 if $from < 0 }
        else { return ($status, $body) }
        next if $from >= $len || $to < $from;                      # unsatisfiable
        $to = $len - 1 if $to >= $len;
        push @ranges, [ $from, $to ];
    }
    my $as = $job->{params}{range_status} // '';
    return ($status, $body) if $as eq '200';
    return (416, '', "bytes */$len") if !@ranges || $as eq '416';
    if (@specs == 1) {
        my ($from, $to) = @{ $ranges[0] };
        return (206, substr($body, $from, $to - $from + 1), "bytes $from-$to/$len");
    }
    my $parts = join '', map {
        "\r\n--sfmulti\r\nContent-Type: text/plain\r\nContent-Range: bytes $_->[0]-$_->[1]/$len\r\n\r\n"
            . substr($body, $_->[0], $_->[1] - $_->[0] + 1)
    } @ranges;
    return (206, "$parts\r\n--sfmulti--\r\n", undef, 'multipart/byteranges; boundary=sfmulti');
}

# A 206's body and Content-Range, of the representation $whole, as the
# parameters have them: from byte range_start= on, whatever was asked
# for; with range_total= for its length; range_len=N: N bytes from the
# range's first byte on, padded with the pattern past the representation's
# end; without them, the range's own bytes.
sub misframed_range {
    my ($whole, $content_range, $p) = @_;
    my ($from, $to, $total) = $content_range =~ /^bytes (\d+)-(\d+)\/(\d+)$/;
    if (($p->{range_start} // '') =~ /^(\d+)$/ && $1 < length $whole) {
        $from = $1;
        $to = length($whole) - 1 if $to < $from;
    }
    $total = $1 if ($p->{range_total} // '') =~ /^(\d+)$/;
    $content_range = "bytes $from-$to/$total";
    return (substr($whole, $from, $to - $from + 1), $content_range)
        unless ($p->{range_len} // '') =~ /^(\d+)$/;
    my $body = substr($whole, $from, $1);
    my $pad = $1 - length $body;
    $body .= substr($SFOrigin::PATTERN x (int($pad / length $SFOrigin::PATTERN) + 1), 0, $pad)
        if $pad > 0;
    return ($body, $content_range);
}

# ----------------------------------------------------- response sending

# Advance the head job of a connection as far as its timers allow.
sub run_conn {
    my ($c) = @_;
    while (!$c->{dead} && !$c->{hung} && !$c->{draining} && @{ $c->{jobs} }) {
        my $job = $c->{jobs}[0];
        last if $job->{at} > time;
        my $step = $job->{steps}[0];
        if (!$step) {                               # job finished
            shift @{ $c->{jobs} };
            next;
        }
        my $op = $step->[0];
        if ($op eq 'write') {
            $c->{wbuf} .= $step->[1];
            shift @{ $job->{steps} };
            flush_conn($c);
            return;                                 # flush_conn re-enters us
        }
        if ($op eq 'wait') {
            $job->{at} = time + $step->[1];
            shift @{ $job->{steps} };
            next;
        }
        if ($op eq 'hang') {
            $c->{hung} = 1;
            last;
        }
        last if length $c->{wbuf};                  # close/reset after flush
        if ($op eq 'reset') { reset_conn($c); last }
        if ($op eq 'close') {
            $c->{jobs} = [];
            $loop->drain($c);
            last;
        }
        die "origin: unknown step $op";
    }
}
