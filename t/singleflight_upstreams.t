#!/usr/bin/perl
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
#   * static files (alias, a 200 KB file) with sendfile on and off: the
#     leader's body is file-backed buffers, the followers get memory
#     copies, byte for byte, with the leader's ETag and Last-Modified;
#     and with directio (the capture reads O_DIRECT files too);
#   * grpc_pass to nghttpd --no-tls (package nghttp2-server), an HTTP/2
#     server that serves files: skipped if it is not installed;
#   * return 200 "...": answered in the rewrite phase, never collapsed.
#
# Static files and nghttpd answer in microseconds, so a herd of them
# rarely overlaps.  To observe real followers there, the leader is held
# in the precontent phase after this module: the locations have
# "mirror ... ; mirror_request_body on;", whose handler runs after
# singleflight's (a dynamic module's phase handler is registered last and
# so runs first), and the leader sends a GET with "Content-Length: 1" and
# holds back that byte until all followers are seen waiting in the stats.

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

        location /static-sendfile/ {
            singleflight sf;
            sendfile on;
            alias %%TESTDIR%%/html/;
            mirror /_hold;
            mirror_request_body on;
        }

        location /static-directio/ {
            singleflight sf;
            directio 4k;
            alias %%TESTDIR%%/html/;
            mirror /_hold;
            mirror_request_body on;
        }

        # X-Accel-Redirect target
        location /protected/ {
            internal;
            alias %%TESTDIR%%/html/;
        }

        location /static-nosendfile/ {
            singleflight sf;
            sendfile off;
            alias %%TESTDIR%%/html/;
            mirror /_hold;
            mirror_request_body on;
        }

        location /grpc/ {
            singleflight sf;
            grpc_pass grpc://127.0.0.1:__H2__;
            mirror /_hold;
            mirror_request_body on;
        }

        location /grpc-plain/ {
            grpc_pass grpc://127.0.0.1:__H2__;
        }

        # "return" answers in the rewrite phase: the module never sees it
        location /return/ {
            singleflight sf;
            return 200 "returned\n";
        }

        location = /_hold {
            internal;
            return 204;
        }

        location = /stats {
            singleflight_stats;
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

# FastCGI answers with X-Accel-Redirect: the leader's response is made by
# the static handler of an internal location, after an internal redirect
app_herd('fastcgi X-Accel-Redirect', 'fastcgi',
         '/fcgi/accel?delay=300&accel=/protected/big.bin', undef, 30, $FILE);

# ------------------------------------------------------------ held flights

# A flight whose leader is held in precontent (see the top of the file)
# until $n followers wait, then released.  Returns the leader's result and
# the followers' results.
sub held_flight {
    my ($name, $uri, $n) = @_;
    my $base = $t->zone_stats;
    my $leader = $t->start_request('GET', $uri, raw => "GET $uri HTTP/1.1\r\n"
        . "Host: localhost\r\nConnection: close\r\nContent-Length: 1\r\n\r\n");
    ok($t->wait_for(sub { $t->zone_stats->{in_flight} == $base->{in_flight} + 1 },
                    timeout => 5, what => "$name: the leader's flight"),
       "$name: the held leader has a flight");
    my @f = map { $t->start_request('GET', $uri) } 1 .. $n;
    ok($t->wait_for(sub { $t->zone_stats->{waiters} == $base->{waiters} + $n },
                    timeout => 5, what => "$name: $n waiters"),
       "$name: $n followers wait for it");
    # release the leader: the byte of its body, on the harness's socket
    syswrite($leader->{sock}, 'x') if $leader->{sock};
    return ($t->finish_request($leader), map { $t->finish_request($_) } @f);
}

# ------------------------------------------------------------ static files

for my $sendfile (qw(sendfile nosendfile)) {
    my $uri = "/static-$sendfile/big.bin";
    my $name = "static, $sendfile";

    # a plain herd: whether or not they overlap, all get the whole file
    my $res = $t->herd(n => 30, path => $uri);
    is(ok_responses($res), 30, "$name: herd: 30 complete 200 responses");
    is(scalar(grep { $_->{body} eq $FILE } @$res), 30,
       "$name: herd: every body is the file, byte for byte");
    my $sf = count_sf($res);
    is(($sf->{LEADER} // 0) + ($sf->{FOLLOWER} // 0), 30,
       "$name: herd: every request led or followed a flight");

    # a held flight: 1 leader from the file, 20 followers from memory
    my ($l, @f) = held_flight($name, "$uri?held", 20);
    ok(($l->{status} // 0) == 200 && $l->{complete} && $l->{body} eq $FILE
       && ($l->{headers}{'x-sf'} // '') eq 'LEADER',
       "$name: held: the leader got the file");
    is(ok_responses(\@f), 20, "$name: held: 20 complete 200 followers");
    is(scalar(grep { $_->{body} eq $FILE } @f), 20,
       "$name: held: every follower got the file, byte for byte");
    is(count_sf(\@f)->{FOLLOWER} // 0, 20, "$name: held: all 20 were followers");
    my %lh = map { $_ => $l->{headers}{$_} // 'none' } qw(etag last-modified content-type);
    is(scalar(grep { my $h = $_->{headers};
                     !grep({ ($h->{$_} // '') ne $lh{$_} } keys %lh)
                     && ($h->{'content-length'} // '') eq length $FILE } @f),
       20, "$name: held: followers have the leader's ETag, Last-Modified, "
           . "Content-Type, length");

    # the static handler allows ranges: the flight records it, and
    # nginx's range filter advertises them to the followers too
    is(scalar(grep { ($_->{headers}{'accept-ranges'} // '') eq
                     ($l->{headers}{'accept-ranges'} // 'none') } @f),
       20, "$name: held: followers advertise Accept-Ranges like the leader");
}

# directio: the file is opened with O_DIRECT, and nginx reads it into
# aligned buffers; the capture must read it too.
SKIP: {
    my $o_direct = eval { Fcntl::O_DIRECT() };
    my $fh;
    skip 'O_DIRECT is not supported here', 5
        unless $o_direct && sysopen($fh, $t->path('html/big.bin'), O_RDONLY | $o_direct);
    close $fh;

    my $name = 'static, directio';
    my $off = $t->log_offset;
    my ($l, @f) = held_flight($name, '/static-directio/big.bin', 20);
    ok(($l->{status} // 0) == 200 && $l->{complete} && $l->{body} eq $FILE,
       "$name: held: the leader got the file");
    # the capture reads the O_DIRECT file into unaligned zone memory with
    # directio taken off the descriptor for the read, as the copy filter does
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $FILE
                     && ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @f),
       20, "$name: held: 20 followers got the file from the flight");
    unlike($t->error_log_since($off), qr/could not read the response|pread\(\) .* failed/,
           "$name: the capture could read the file");
}

# ------------------------------------------------------------ grpc_pass

SKIP: {
    if (!$h2_why) {
        my $r = $t->get('/grpc-plain/big.bin');
        $h2_why = "grpc_pass cannot talk to nghttpd: status "
            . ($r->{status} // 'none') . ", " . ($r->{error} // length($r->{body}) . ' bytes')
            unless ($r->{status} // 0) == 200 && $r->{complete} && $r->{body} eq $FILE;
    }
    skip $h2_why, 9 if $h2_why;

    my $uri = '/grpc/big.bin';
    my $res = $t->herd(n => 20, path => $uri);
    is(ok_responses($res), 20, 'grpc: herd: 20 complete 200 responses');
    is(scalar(grep { $_->{body} eq $FILE } @$res), 20,
       'grpc: herd: every body is the file, byte for byte');
    my $sf = count_sf($res);
    is(($sf->{LEADER} // 0) + ($sf->{FOLLOWER} // 0), 20,
       'grpc: herd: every request led or followed a flight');

    my ($l, @f) = held_flight('grpc', "$uri?held", 20);
    ok(($l->{status} // 0) == 200 && $l->{complete} && $l->{body} eq $FILE
       && ($l->{headers}{'x-sf'} // '') eq 'LEADER',
       'grpc: held: the leader got the file');
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $FILE } @f),
       20, 'grpc: held: every follower got the file, byte for byte');
    is(count_sf(\@f)->{FOLLOWER} // 0, 20, 'grpc: held: all 20 were followers');
    my $lm = $l->{headers}{'last-modified'} // 'none';
    is(scalar(grep { ($_->{headers}{'last-modified'} // '') eq $lm } @f), 20,
       "grpc: held: followers have the leader's Last-Modified");
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
