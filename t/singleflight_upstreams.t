#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_upstreams: capture and fan-out do not depend on the content
# handler that makes the leader's response.  The module captures at the
# top of the output filter chain, so a flight led through fastcgi_pass,
# uwsgi_pass, scgi_pass, grpc_pass or the static file handler must give
# every follower the leader's complete response, like proxy_pass does.
#
#   * fastcgi_pass, uwsgi_pass, scgi_pass to t/fcgi_origin.pl (a Perl
#     FastCGI/uwsgi/SCGI responder that counts hits), buffered and, for
#     FastCGI and uwsgi, with *_buffering off and a body that trickles in:
#     a herd of 30 costs one application request, and all 30 get its body
#     and its X-Hit: 1;
#   * FastCGI answering with X-Accel-Redirect: the leader's response is
#     made by the static handler of an internal location;
#   * static files (alias, a 200 KB file) with sendfile on and off: a
#     herd gets the file byte for byte, with the headers the static
#     handler gives without the module (ETag, Last-Modified, Content-Type,
#     Content-Length, Accept-Ranges);
#   * a flight whose response the static handler makes, with followers:
#     the origin answers after a delay with X-Accel-Redirect to an internal
#     static location (sendfile on, off, directio), so the fetch's body is
#     file-backed buffers and the followers, waiting meanwhile, get them
#     byte for byte from the flight, with the leader's headers;
#   * grpc_pass to nghttpd --no-tls (package nghttp2-server), an HTTP/2
#     server that serves files: skipped if it is not installed; and
#     grpc_pass to a slow HTTP/2 upstream (an h2c server of the same nginx
#     proxying to the origin), so that a flight through grpc_pass has
#     followers;
#   * return 200 "...": answered in the rewrite phase, never collapsed.
#
# A static file or nghttpd answers in microseconds, and the fetch does not
# depend on any client, so nothing can hold such a flight: a request for a
# static file that arrives alone is answered at once (singleflight_lazy),
# and a herd of them overlaps only by chance.  Followers are made to wait
# where they would in production: at a slow upstream.

use strict;
use warnings;

use Test::More;
use Fcntl qw(O_RDONLY);
use POSIX qw(WNOHANG);
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

sub which {
    my ($prog) = @_;
    for (split /:/, $ENV{PATH} // '/usr/bin:/bin', -1) {
        return "$_/$prog" if length && -x "$_/$prog";
    }
    for (qw(/usr/sbin /usr/bin /sbin /bin)) {
        return "$_/$prog" if -x "$_/$prog";
    }
    return undef;
}

# ------------------------------------------------------------ peers

my %peer_pids;    # pid => name, killed in END

END {
    local $?;
    for my $pid (keys %peer_pids) {
        kill 'TERM', $pid;
    }
    for my $pid (keys %peer_pids) {
        my $deadline = time + 3;
        while (waitpid($pid, WNOHANG) == 0) {
            if (time > $deadline) { kill 'KILL', $pid; waitpid($pid, 0); last }
            Time::HiRes::sleep(0.02);
        }
    }
}

# forks and execs @cmd with output to TESTDIR/$name.err; the child gets
# SIGTERM if this process dies (PR_SET_PDEATHSIG, kept across exec)
sub spawn {
    my ($name, @cmd) = @_;
    my $err = $t->path("$name.err");
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>>', $err) or POSIX::_exit(126);
        open(STDERR, '>&', \*STDOUT);
        $SIG{$_} = 'DEFAULT' for qw(PIPE INT TERM HUP);
        eval {
            package SFTest::Sys;
            require 'syscall.ph';
            syscall(SFTest::Sys::SYS_prctl(), 1, 15, 0, 0, 0);    # PDEATHSIG=TERM
        };
        exec(@cmd) or POSIX::_exit(127);
    }
    $peer_pids{$pid} = $name;
    return $pid;
}

sub peer_alive {
    my ($pid) = @_;
    return 0 if waitpid($pid, WNOHANG) == $pid;
    return kill 0, $pid;
}

# the FastCGI/uwsgi/SCGI responder
my $ports_file = $t->path('fcgi-origin.ports');
my $fpid = spawn('fcgi-origin', $^X, "$SFTest::REPO/t/fcgi_origin.pl",
    '--port-file', $ports_file, '--log', $t->path('fcgi-origin.hits'), '--ppid', $$);
my %pp;
$t->wait_for(sub {
    %pp = $t->read_file($ports_file) =~ /^(\w+)=(\d+)$/mg;
    return $pp{control} || !peer_alive($fpid);
}, what => 'fcgi_origin.pl to listen');
if (!$pp{control}) {
    fail('t/fcgi_origin.pl starts');
    diag($t->read_file('fcgi-origin.err'));
    die "t/fcgi_origin.pl did not start\n";
}

sub peer_hits { $t->stats('/_hits', port => $pp{control}) // die "fcgi_origin: /_hits failed" }
sub peer_reset {
    my $r = $t->get('/_reset', port => $pp{control});
    die "fcgi_origin: /_reset failed" unless ($r->{status} // 0) == 200;
}

# a 200 KB static file, not periodic at any buffer size
my $FILE = join '', map { pack 'N', ($_ * 2654435761 + 12345) % 4294967296 } 0 .. 51199;
mkdir $t->path('html');
$t->write_file('html/big.bin', $FILE);

# nghttpd serving the same file over h2c
my $nghttpd = which('nghttpd');
my $h2_port = $t->port(1);
my $h2_why;
if (!$nghttpd) {
    $h2_why = 'nghttpd not found (Debian package nghttp2-server)';
}
else {
    mkdir $t->path('h2');
    mkdir $t->path('h2/grpc');
    mkdir $t->path('h2/grpc-plain');
    $t->write_file("h2/$_/big.bin", $FILE) for qw(grpc grpc-plain);
    my $hpid = spawn('nghttpd', $nghttpd, '--no-tls', '-d', $t->path('h2'), $h2_port);
    $t->wait_for(sub { !peer_alive($hpid) || SFTest::_can_connect($h2_port) },
                 what => 'nghttpd to listen');
    $h2_why = 'nghttpd did not start: ' . $t->read_file('nghttpd.err')
        unless peer_alive($hpid) && SFTest::_can_connect($h2_port);
}

# ------------------------------------------------------------ nginx

my $conf = <<'EOT';
    log_format sf '$pid [$singleflight_status] $request_uri';
    access_log %%TESTDIR%%/sf.log sf;

    singleflight_zone zone=sf:4m;

    map $http_user_agent $device { ~Mobile mobile; default desktop; }

    upstream fcgi  { server 127.0.0.1:__FASTCGI__; }
    upstream uwsgi { server 127.0.0.1:__UWSGI__; }
    upstream scgi  { server 127.0.0.1:__SCGI__; }

    fastcgi_param REQUEST_METHOD $request_method;
    fastcgi_param REQUEST_URI    $request_uri;
    fastcgi_param QUERY_STRING   $query_string;
    uwsgi_param   REQUEST_METHOD $request_method;
    uwsgi_param   REQUEST_URI    $request_uri;
    uwsgi_param   QUERY_STRING   $query_string;
    scgi_param    REQUEST_METHOD $request_method;
    scgi_param    REQUEST_URI    $request_uri;
    scgi_param    QUERY_STRING   $query_string;
    scgi_param    SCGI           1;

    server {
        listen 127.0.0.1:%%PORT%%;

        add_header X-SF $singleflight_status always;

        location /fcgi/ {
            singleflight sf;
            fastcgi_pass fcgi;
        }

        # X-Accel-Redirect: the response a request going its own way gets
        # is the static handler's, which cannot feed a flight; a fetch can
        location /fcgi-accel/ {
            singleflight sf;
            singleflight_lone fetch;
            fastcgi_pass fcgi;
        }

        # the application varies on a header the location sets: its
        # parameter, not the client's header (t/singleflight_vary_config.t)
        location /fcgi-device/ {
            singleflight sf;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param REQUEST_URI    $request_uri;
            fastcgi_param QUERY_STRING   $query_string;
            fastcgi_param HTTP_X_DEVICE  $device;
            fastcgi_pass fcgi;
        }

        # a parameter named with a "-": nginx sends the client's X-Device
        # as HTTP_X_DEVICE all the same
        location /fcgi-hyphen/ {
            singleflight sf;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param REQUEST_URI    $request_uri;
            fastcgi_param QUERY_STRING   $query_string;
            fastcgi_param HTTP_X-DEVICE  $device;
            fastcgi_pass fcgi;
        }

        location /fcgi-unbuffered/ {
            singleflight sf;
            fastcgi_pass fcgi;
            fastcgi_buffering off;
        }

        location /uwsgi/ {
            singleflight sf;
            uwsgi_pass uwsgi;
        }

        location /uwsgi-unbuffered/ {
            singleflight sf;
            uwsgi_pass uwsgi;
            uwsgi_buffering off;
        }

        location /scgi/ {
            singleflight sf;
            scgi_pass scgi;
        }

        # the static handler's content collapsed only when asked to
        location /static-sendfile/ {
            singleflight sf content=any;
            sendfile on;
            alias %%TESTDIR%%/html/;
        }

        location /static-nosendfile/ {
            singleflight sf content=any;
            sendfile off;
            alias %%TESTDIR%%/html/;
        }

        # the file without the module: the headers to expect
        location /static-plain/ {
            alias %%TESTDIR%%/html/;
        }

        # by default, a static file is not collapsed: as without the module
        location /static-default/ {
            singleflight sf;
            alias %%TESTDIR%%/html/;
        }

        # X-Accel-Redirect targets
        location /protected/ {
            internal;
            alias %%TESTDIR%%/html/;
        }

        location /protected-sendfile/ {
            internal;
            sendfile on;
            alias %%TESTDIR%%/html/;
        }

        location /protected-nosendfile/ {
            internal;
            sendfile off;
            alias %%TESTDIR%%/html/;
        }

        location /protected-directio/ {
            internal;
            directio 4k;
            alias %%TESTDIR%%/html/;
        }

        # the origin answers with X-Accel-Redirect (hdr=), after its delay
        location /accel/ {
            singleflight sf;
            singleflight_lone fetch;    # as /fcgi-accel/
            proxy_pass http://%%ORIGIN%%;
        }

        location /grpc/ {
            singleflight sf;
            grpc_pass grpc://127.0.0.1:__H2__;
        }

        # a slow HTTP/2 upstream: the h2c server below, in front of the origin
        location /grpc-slow/ {
            singleflight sf;
            grpc_pass grpc://127.0.0.1:%%PORT_2%%;
        }

        location /grpc-plain/ {
            grpc_pass grpc://127.0.0.1:__H2__;
        }

        # "return" answers in the rewrite phase: the module never sees it
        location /return/ {
            singleflight sf;
            return 200 "returned\n";
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
$conf .= <<'EOT';

    # HTTP/2 without TLS (prior knowledge) in front of the origin
    server {
        listen 127.0.0.1:%%PORT_2%% http2;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
$conf =~ s/__FASTCGI__/$pp{fastcgi}/g;
$conf =~ s/__UWSGI__/$pp{uwsgi}/g;
$conf =~ s/__SCGI__/$pp{scgi}/g;
$conf =~ s/__H2__/$h2_port/g;

$t->write_config($t->config_template($conf));
$t->start;

# the sf.log lines of one URI: list of statuses ('-' if the module did not look)
sub logged {
    my ($uri) = @_;
    return map { /^\d+ \[(.*?)\] (\S+)$/ && $2 eq $uri ? $1 : () }
        split /\n/, $t->read_file('sf.log');
}

sub count_sf { SFTest::tally(map { $_->{headers}{'x-sf'} // '' } @{ $_[0] }) }

sub ok_responses {
    my ($res) = @_;
    return scalar grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res;
}

# ------------------------------------------------------------ FastCGI, uwsgi, SCGI

# A herd of $n on one URI: one application request, every client gets it.
sub app_herd {
    my ($name, $proto, $uri, $size, $n, $body) = @_;
    my $stamped = !defined $body;    # the peer's own body and headers
    $body //= SFTest::origin_body(1, $uri, $size);
    peer_reset();
    my $res = $t->herd(n => $n, path => $uri);

    is(ok_responses($res), $n, "$name: $n complete 200 responses");
    is(scalar(grep { $_->{body} eq $body } @$res), $n,
       "$name: every body is the first application response");
    my $hits = peer_hits();
    is($hits->{$proto}, 1, "$name: one $proto request");
    if ($stamped) {
        is(scalar(grep { ($_->{headers}{'x-hit'} // '') eq '1' } @$res), $n,
           "$name: every response has X-Hit: 1");
        is(scalar(grep { ($_->{headers}{'content-type'} // '') eq 'text/plain' } @$res), $n,
           "$name: every response has the Content-Type");
    }
    my $sf = count_sf($res);
    is($sf->{LEADER} // 0, 1, "$name: one leader");
    is($sf->{FOLLOWER} // 0, $n - 1, "$name: " . ($n - 1) . " followers");
}

app_herd('fastcgi', 'fastcgi', '/fcgi/herd?delay=300&size=20000', 20000, 30);
app_herd('fastcgi buffering off', 'fastcgi',
         '/fcgi-unbuffered/herd?delay=300&size=100000&pieces=5&gap=40', 100000, 30);
app_herd('uwsgi', 'uwsgi', '/uwsgi/herd?delay=300&size=20000', 20000, 30);
app_herd('uwsgi buffering off', 'uwsgi',
         '/uwsgi-unbuffered/herd?delay=300&size=100000&pieces=5&gap=40', 100000, 30);
app_herd('scgi', 'scgi', '/scgi/herd?delay=300&size=20000', 20000, 30);

# "Vary: X-Device" on a fastcgi_param HTTP_X_DEVICE the location sets from
# the User-Agent: 5 desktop and 5 mobile clients, one application request
# per device, each client its own device's body
{
    peer_reset();
    my $uri = '/fcgi-device/v?delay=300&vary=X-Device';
    my @ua = map { $_ % 2 ? 'Phone Mobile' : 'Desktop' } 0 .. 9;
    my $res = $t->finish_all([ map { $t->start_request('GET', $uri,
                                         headers => { 'User-Agent' => $_ })
                                   } @ua ]);
    my @bad = grep { my $want = $ua[$_] =~ /Mobile/ ? 'mobile' : 'desktop';
                     ($res->[$_]{body} // '') !~ /^X-Device=$want$/m } 0 .. 9;
    is(scalar(@bad), 0, 'fastcgi_param HTTP_X_DEVICE: every client its '
                        . "own device's body");
    is(peer_hits()->{fastcgi}, 2,
       'fastcgi_param HTTP_X_DEVICE: one application request per device');
}

# The same with a parameter named HTTP_X-DEVICE, which does not stand for
# the client's header: clients of one device that send X-Device a and b
# get the application's answer to their own
{
    peer_reset();
    my $uri = '/fcgi-hyphen/v?delay=300&vary=X-Device';
    my @dev = map { $_ % 2 ? 'a' : 'b' } 0 .. 9;
    my $res = $t->finish_all([ map { $t->start_request('GET', $uri,
                                         headers => { 'User-Agent' => 'Desktop', 'X-Device' => $_ })
                                   } @dev ]);
    my @bad = grep { ($res->[$_]{body} // '') !~ /^X-Device=$dev[$_]$/m } 0 .. 9;
    is(scalar(@bad), 0, 'fastcgi_param HTTP_X-DEVICE: every client the answer to its own X-Device');
    is(peer_hits()->{fastcgi}, 2, 'fastcgi_param HTTP_X-DEVICE: one application request per X-Device');
}

# FastCGI answers with X-Accel-Redirect: the leader's response is made by
# the static handler of an internal location, after an internal redirect
app_herd('fastcgi X-Accel-Redirect', 'fastcgi',
         '/fcgi-accel/accel?delay=300&accel=/protected/big.bin', undef, 30, $FILE);

# The same with singleflight_lone's default (direct): the first request
# went its own way and cannot feed the flight the others made; one of
# them fetches it, and every client still gets the file.
{
    peer_reset();
    my $res = $t->herd(n => 10, path => '/fcgi/accel?delay=300&accel=/protected/big.bin');
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $FILE }
              @$res), 10, 'fastcgi X-Accel-Redirect, direct: 10 times the file');
    is(peer_hits()->{fastcgi}, 2,
       'fastcgi X-Accel-Redirect, direct: the first request\'s and one fetch');
}

# ------------------------------------------------------------ flights with followers

# A flight held at the origin ($uri delays its answer): the leader, then
# $n followers once the origin has the leader's request, returned once
# they all wait.  Checks that the origin was asked once.
sub slow_flight {
    my ($name, $uri, $n) = @_;
    my $before = $t->origin_uri_hits($uri);
    my $res = $t->flight(leader => [ 'GET', $uri ],
                         followers => [ map { [ 'GET', $uri ] } 1 .. $n ]);
    is($t->origin_uri_hits($uri) - $before, 1, "$name: one origin request");
    return @$res;
}

# ------------------------------------------------------------ static files

my $plain = $t->get('/static-plain/big.bin');
ok(($plain->{status} // 0) == 200 && $plain->{body} eq $FILE
   && $plain->{headers}{etag} && $plain->{headers}{'last-modified'},
   'static without the module: the file, with ETag and Last-Modified');
my %want = map { $_ => $plain->{headers}{$_} // 'none' }
    qw(etag last-modified content-type content-length accept-ranges);

# the responses whose ETag, Last-Modified, Content-Type, Content-Length and
# Accept-Ranges are those of the file without the module
sub static_headers_ok {
    my ($res) = @_;
    return scalar grep { my $h = $_->{headers};
                         !grep { ($h->{$_} // 'none') ne $want{$_} } keys %want } @$res;
}

for my $sendfile (qw(sendfile nosendfile)) {
    my $uri = "/static-$sendfile/big.bin";
    my $name = "static, $sendfile";

    # a lone request: answered at once, as the static handler made it
    my $before = $t->zone_stats;
    my $r = $t->get("$uri?alone");
    ok(($r->{status} // 0) == 200 && $r->{complete} && $r->{body} eq $FILE
       && ($r->{headers}{'x-sf'} // '') eq 'LEADER',
       "$name: alone: LEADER, the file byte for byte");
    is(static_headers_ok([ $r ]), 1, "$name: alone: the headers of the file without the module");

    # a herd: whether or not they overlap, all get the whole file
    my $res = $t->herd(n => 30, path => $uri);
    is(ok_responses($res), 30, "$name: herd: 30 complete 200 responses");
    is(scalar(grep { $_->{body} eq $FILE } @$res), 30,
       "$name: herd: every body is the file, byte for byte");
    my $sf = count_sf($res);
    is(($sf->{LEADER} // 0) + ($sf->{FOLLOWER} // 0), 30,
       "$name: herd: every request led or followed a flight");
    is(static_headers_ok($res), 30,
       "$name: herd: every response has the headers of the file without the module");
}

# Without content=any a static file is nobody's flight: every request is
# answered by the static handler as without the module, nothing counted.
{
    my $before = $t->zone_stats;
    my $res = $t->herd(n => 20, path => '/static-default/big.bin');
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                     && $_->{body} eq $FILE } @$res), 20,
       'static, default: 20 complete 200 responses, the file byte for byte');
    is(static_headers_ok($res), 20,
       'static, default: the headers of the file without the module');
    is(scalar(grep { ($_->{headers}{'x-sf'} // '') ne '' } @$res), 0,
       'static, default: no request is in a flight ($singleflight_status empty)');
    my $after = $t->zone_stats;
    is($after->{flights} - $before->{flights}, 0,
       'static, default: no flight counted');
}

# The static handler makes the flight's response after X-Accel-Redirect;
# the followers wait for it at the origin.
my $o_direct = eval {
    my $flag = Fcntl::O_DIRECT();
    my $fh;
    sysopen($fh, $t->path('html/big.bin'), O_RDONLY | $flag) && close $fh;
};
for my $how (qw(sendfile nosendfile directio)) {
    my $name = "static, $how, X-Accel-Redirect";
  SKIP: {
    skip 'O_DIRECT is not supported here', 10 if $how eq 'directio' && !$o_direct;
    my $off = $t->log_offset;
    my $uri = "/accel/$how?delay=500&hdr=X-Accel-Redirect:/protected-$how/big.bin";
    my ($l, @f) = slow_flight($name, $uri, 20);

    ok(($l->{status} // 0) == 200 && $l->{complete} && $l->{body} eq $FILE
       && ($l->{headers}{'x-sf'} // '') eq 'LEADER',
       "$name: the leader got the file");
    is(ok_responses(\@f), 20, "$name: 20 complete 200 followers");
    is(scalar(grep { $_->{body} eq $FILE } @f), 20,
       "$name: every follower got the file, byte for byte");
    is(count_sf(\@f)->{FOLLOWER} // 0, 20, "$name: all 20 were followers");
    is(static_headers_ok([ $l, @f ]), 21,
       "$name: leader and followers have the file's ETag, Last-Modified, "
       . "Content-Type, Content-Length, Accept-Ranges");
    # directio: the store reads the O_DIRECT file into unaligned memory
    # with directio taken off the descriptor for the read
    unlike($t->error_log_since($off), qr/could not read the response|pread\(\) .* failed/,
           "$name: the fetch could read the file");
  }
}

# ------------------------------------------------------------ grpc_pass

# a slow HTTP/2 upstream: a flight through grpc_pass with followers
{
    my $name = 'grpc, slow upstream';
    my $lm = 'Tue, 01 Jan 2030 00:00:00 GMT';
    (my $lmq = $lm) =~ s/([^A-Za-z0-9])/sprintf '%%%02X', ord $1/ge;
    my $uri = "/grpc-slow/x?delay=500&size=100000&hdr=Last-Modified:$lmq";
    my ($l, @f) = slow_flight($name, $uri, 20);
    my $body = SFTest::origin_body($l->{headers}{'x-hit'} // 0, $uri, 100000);
    ok(($l->{status} // 0) == 200 && $l->{complete} && $l->{body} eq $body
       && ($l->{headers}{'x-sf'} // '') eq 'LEADER', "$name: the leader got the body");
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @f),
       20, "$name: every follower got it, byte for byte");
    is(count_sf(\@f)->{FOLLOWER} // 0, 20, "$name: all 20 were followers");
    is(scalar(grep { ($_->{headers}{'last-modified'} // '') eq $lm } $l, @f), 21,
       "$name: leader and followers have the origin's Last-Modified");
}

SKIP: {
    if (!$h2_why) {
        my $r = $t->get('/grpc-plain/big.bin');
        $h2_why = "grpc_pass cannot talk to nghttpd: status "
            . ($r->{status} // 'none') . ", " . ($r->{error} // length($r->{body}) . ' bytes')
            unless ($r->{status} // 0) == 200 && $r->{complete} && $r->{body} eq $FILE;
    }
    skip $h2_why, 4 if $h2_why;

    my $lm = $t->get('/grpc-plain/big.bin')->{headers}{'last-modified'} // 'none';
    my $uri = '/grpc/big.bin';
    my $res = $t->herd(n => 20, path => $uri);
    is(ok_responses($res), 20, 'grpc: herd: 20 complete 200 responses');
    is(scalar(grep { $_->{body} eq $FILE } @$res), 20,
       'grpc: herd: every body is the file, byte for byte');
    my $sf = count_sf($res);
    is(($sf->{LEADER} // 0) + ($sf->{FOLLOWER} // 0), 20,
       'grpc: herd: every request led or followed a flight');
    is(scalar(grep { ($_->{headers}{'last-modified'} // '') eq $lm } @$res), 20,
       "grpc: herd: every response has nghttpd's Last-Modified ($lm)");
}

# ------------------------------------------------------------ return

# "return" and "rewrite ... redirect" answer in the rewrite phase, before
# access checks and before this module's precontent handler (README,
# Limitations): collapsing there would let followers skip allow/deny and
# auth_request.  So such a response is never collapsed, and the module
# does not even look at the request: $singleflight_status stays empty.
{
    my $before = $t->zone_stats;
    my $uri = '/return/x';
    my $res = $t->herd(n => 20, path => $uri);
    is(ok_responses($res), 20, 'return: 20 complete 200 responses');
    is(scalar(grep { $_->{body} eq "returned\n" } @$res), 20, 'return: every body is right');
    is(scalar(grep { exists $_->{headers}{'x-sf'} } @$res), 0,
       'return: no $singleflight_status on any response');
    $t->wait_for(sub { logged($uri) >= 20 }, what => '20 log lines');
    # nginx logs a variable without a value as "-"
    is(scalar(grep { $_ eq '-' } logged($uri)), 20,
       'return: $singleflight_status is empty in the log');
    my $after = $t->zone_stats;
    is($after->{flights} - $before->{flights}, 0, 'return: no flight started');
}

# ------------------------------------------------------------ zone is empty

my (undef, $zone) = $t->wait_zone_idle;
is($zone->{in_flight}, 0, 'stats: nothing in flight');
is($zone->{waiters}, 0, 'stats: nobody waiting');
is($zone->{pages_used}, $zone->{pages_baseline}, 'stats: zone memory back to baseline');
is($zone->{errors} + $zone->{timeouts} + $zone->{no_memory}, 0,
   'stats: no errors, timeouts or zone exhaustion');
is($zone->{not_shared}, 0, 'stats: no unshared responses');

done_testing;
