# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
package SFTest;

# SFTest - test harness for ngx_http_singleflight_module.
#
# Runs a throw-away nginx (daemon, master + workers) from a private test
# directory, one or more scriptable origins (t/origin.pl), and provides a
# small non-blocking HTTP client able to fire hundreds of concurrent
# requests.  Everything is torn down when the test finishes, and the logs
# are scanned for alerts and sanitizer reports.  See t/harness.t for usage.
#
# Synopsis:
#   my $t = SFTest->new;                  # test dir, env, hooks (addr =>
#                                         # '127.0.0.2': nginx, origins and
#                                         # client on another loopback address)
#   $t->skip_without_module;              # plan skip_all if .so missing
#   my $o = $t->start_origin;             # SFTest::Origin (port, hits, reset)
#   $t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
#       server {
#           listen 127.0.0.1:%%PORT%%;
#           location / { proxy_pass http://%%ORIGIN%%; }
#       }
#   EOT
#   $t->start;
#   my $r = $t->get('/x?delay=200');      # {status, headers, body, ...}
#   my $all = $t->herd(n => 100, path => '/x?delay=300');
#   is($t->origin_hits->{total}, 1);
#   done_testing;                         # stops everything, scans logs
#
# API summary (the details are above each sub):
#   files     testdir, path, write_file, read_file($name, $offset),
#             tls_certificate: cert.pem and key.pem for CN=localhost
#   nginx     skip_without_module, config_template, write_config,
#             test_config, start, reload, stop, signal, master_pid,
#             worker_pids, child_pids, port($n), addr (%%ADDR%%),
#             worker_of(@handles): the workers holding started requests
#   origins   start_origin (program => PATH: another origin program,
#             c_origin(): bench/origin.c built; c_tool($name)),
#             origin($i), origin_port, origin_hits, origin_reset,
#             origin_unread($i): nginx's connections to it with unread bytes,
#             origin_uri_hits($uri, $i): requests for one URI (0 if none),
#             origin_body($hit, $uri, $size) (a function too)
#   client    http, get, stats($path) (decoded JSON), herd, start_request,
#             finish_request, finish_all(\@handles), poll_request,
#             abort_request,
#             poll_all(\@handles, timeout => S): drive them all until done,
#             request_text($method, $path, %opt): the bytes it would send;
#             request options: headers, body, port, http10, raw, timeout,
#             h2 (sent by curl over HTTP/2 with prior knowledge: the port
#             must listen with http2; not with http10, raw or rcvbuf),
#             rcvbuf (a small SO_RCVBUF: a client that stalls for real;
#             64k or more: below loopback's MSS, TCP's zero-window probes
#             back off and a client reading at last crawls, module or not)
#             (a handle's local_port is the $remote_port nginx logs)
#   logs      log_offset, error_log_since, allow_log, wait_for,
#             bad_log_lines: what fails the test at its end so far (an
#               [alert], [emerg], a sanitizer's report), "file: line" each,
#             log_count($re, $offset, $name): matches in a log (error.log),
#             log_records($name, \@fields, sep =>, offset =>, uri =>): the
#               lines of a log split into named fields, filtered by uri,
#             wait_log_records($name, \@fields, $n, ...): once n are there
#   functions SFTest::tally(@values): { value => count },
#             SFTest::pct(\@values, $p): the p-th percentile (undef if none),
#             SFTest::delta($before, $after, @fields): counter differences
# The module's zone, flights and log lines (t/lib/SFTest/Flight.pm):
#   zone_stats($zone, $path): a zone's stats ("sf" at /stats, diagnostics
#     and all), {} if none
#   wait_zone(sub { $_[0]{...} }, %opt), wait_waiters($n), wait_zone_idle:
#     ($ok, $zone) once the zone's stats are so, or at the timeout
#   zone_baseline_ok($name, %opt): a test, the zone back to its baseline
#   origin_requests_ok($before, {reason => n}, $name): a test, the zone's
#     origin_requests_total rose by that from $before
#   flight(leader => [...], followers => [[...], ...], waiters =>, gap =>):
#     the leader, its followers once the origin has it, every result once
#     they all wait
#   sf_statuses($uri, $n): the $singleflight_status values in access.log
#   wait_leader($offset), wait_followers($id, $n, $offset): the leader's
#     pid and flight id, and its readers (followers and late readers) per
#     pid, from the debug log
# Differential tests, the module on against no module (t/lib/SFTest/Diff.pm,
# and its random scenarios t/lib/SFTest/Diff/Blocks.pm).
#
# Environment: SF_NGINX (the nginx binary; TEST_NGINX_BINARY is its older
# name; default /usr/sbin/nginx), SF_MODULE (the module's .so; default
# build/ngx_http_singleflight_module.so), SF_NGINX_ENV ("VAR=value ...",
# %%TESTDIR%% expanded), TEST_NGINX_LOG_LEVEL (info), TEST_NGINX_LEAVE,
# SF_TEST_PORTS (LOW-HIGH: the ports tests listen on; default 10000 up to
# the kernel's ephemeral range),
# TEST_NGINX_VERBOSE / CI (dump error.log tail on failure).

use strict;
use warnings;

use Cwd qw(abs_path);
use Errno qw(EAGAIN EWOULDBLOCK EINTR);
use File::Basename qw(dirname);
use File::Path qw(make_path remove_tree);
use File::Temp qw(tempdir);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Scalar::Util qw(looks_like_number weaken);
use Socket qw(SOL_SOCKET SO_LINGER SO_RCVBUF);
use Test::More ();
use Time::HiRes qw(time sleep);

use SFOrigin ();
use SFTest::Flight ();

our @ISA = ('SFTest::Flight');    # its methods are SFTest's

our $REPO = abs_path(dirname(abs_path(__FILE__)) . '/../..');

# Log lines that make a test fail unless whitelisted with allow_log().
my $BAD_LINE = qr/\[alert\]|\[emerg\]|AddressSanitizer|LeakSanitizer
                 |runtime\ error:|UndefinedBehaviorSanitizer/x;
my $SANITIZER_LINE = qr/AddressSanitizer|LeakSanitizer|runtime\ error:
                       |UndefinedBehaviorSanitizer/x;

my @LIVE;              # weak references to objects not yet reported
my @PENDING;           # reports of objects destroyed before the end
my $HOOKED;            # global hooks installed?

# ------------------------------------------------------------ construction

sub new {
    my ($class, %opt) = @_;
    my $dir = tempdir('sftest-XXXXXX', TMPDIR => 1, CLEANUP => 0);
    chmod 0755, $dir;
    my $self = bless {
        dir       => $dir,
        nginx     => $opt{nginx} // $ENV{SF_NGINX} // $ENV{TEST_NGINX_BINARY}
            // '/usr/sbin/nginx',
        module    => $opt{module} // $ENV{SF_MODULE}
            // "$REPO/build/ngx_http_singleflight_module.so",
        log_level => $opt{log_level} // $ENV{TEST_NGINX_LOG_LEVEL} // 'info',
        addr      => $opt{addr} // '127.0.0.1',
        ports     => {},
        origins   => [],
        allow     => [],
        owner     => $$,
    }, $class;
    $self->{env} = [ map { [ split /=/, $_, 2 ] } grep { /=/ }
        split ' ', ($ENV{SF_NGINX_ENV} // '') =~ s/%%TESTDIR%%/$dir/gr ];
    Test::More::diag("test dir: $dir") if $ENV{TEST_NGINX_LEAVE};

    _install_hooks();
    push @LIVE, $self;
    weaken($LIVE[-1]);
    return $self;
}

# Teardown runs at done_testing() (before the plan is emitted, so a
# log-scan failure is still counted), else at END; Ctrl-C/TERM/HUP exit
# through END too.
sub _install_hooks {
    return if $HOOKED++;
    if (eval { require Test2::API; Test2::API->can('test2_add_callback_testing_done') }) {
        Test2::API::test2_add_callback_testing_done(sub { _finalize_all() });
    }
    for my $sig (qw(INT TERM HUP)) {
        next if $SIG{$sig} && $SIG{$sig} ne 'DEFAULT';
        $SIG{$sig} = sub { Test::More::diag("caught SIG$sig, cleaning up"); exit 1 };
    }
    $SIG{PIPE} = 'IGNORE' unless $SIG{PIPE} && $SIG{PIPE} ne 'DEFAULT';

    # Become a child subreaper (prctl PR_SET_CHILD_SUBREAPER) so the
    # daemonized nginx master is re-parented to us and can be reaped
    # instead of lingering as a zombie.  Best effort.
    eval {
        package SFTest::Sys;    # syscall.ph defines its subs in this package
        require 'syscall.ph';
        syscall(SFTest::Sys::SYS_prctl(), 36, 1, 0, 0, 0);
    };
}

# Shuts down live objects and reports on them and on destroyed ones.
sub _finalize_all {
    my (%a) = @_;
    for my $self (grep { defined && $$ == $_->{owner} } @LIVE) {
        push @PENDING, $self->_shutdown;
    }
    @LIVE = ();
    _report($_, %a) for splice @PENDING;
}

END {
    my $status = $?;
    local $?;
    _finalize_all(status => $status);
}

# An object going away early (scope end, or a die unwinding the test
# file) stops its processes at once; the log scan and the decision to keep
# the test dir wait for done_testing()/END, when the outcome is known.
sub DESTROY {
    my ($self) = @_;
    return if $self->{reported} || $$ != $self->{owner};
    local ($@, $!, $?);
    push @PENDING, $self->_shutdown;
}

# ------------------------------------------------------------ accessors

sub testdir { $_[0]{dir} }

# A self-signed certificate for CN=localhost in the test directory,
# cert.pem and key.pem (openssl's output in openssl.out): true if openssl
# is there and made it.
sub tls_certificate {
    my ($self) = @_;
    my ($openssl) = grep { -x } map { "$_/openssl" } split /:/, $ENV{PATH} // '/usr/bin:/bin';
    return 0 unless $openssl;
    my $d = $self->{dir};
    system("$openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost"
        . " -keyout $d/key.pem -out $d/cert.pem >$d/openssl.out 2>&1");
    return $? == 0 && -s "$d/cert.pem" ? 1 : 0;
}
sub addr { $_[0]{addr} }
sub path { "$_[0]{dir}/$_[1]" }
sub module_path { $_[0]{module} }
sub has_module { -f $_[0]{module} }
sub nginx_binary { $_[0]{nginx} }

# plan skip_all unless the module has been built.
sub skip_without_module {
    my ($self) = @_;
    Test::More::plan(skip_all => "module not built: $self->{module}") unless $self->has_module;
}

sub write_file {
    my ($self, $name, $content) = @_;
    my $file = $self->path($name);
    open(my $fh, '>', $file) or die "cannot write $file: $!";
    print $fh $content;
    close($fh) or die "cannot write $file: $!";
    return $file;
}

sub read_file {
    my ($self, $name, $offset) = @_;
    return _slurp($name =~ m{^/} ? $name : $self->path($name), $offset);
}

sub _slurp {
    my ($file, $offset) = @_;
    open(my $fh, '<', $file) or return '';
    seek($fh, $offset, 0) if $offset;
    local $/;
    return scalar(<$fh>) // '';
}

# ------------------------------------------------------------ ports

# A free TCP port on the object's address, stable per index.  Chosen below the
# ephemeral range so outgoing connections cannot grab it before nginx binds,
# and distinct from the ports of every other SFTest object of the process
# (two nginx instances side by side: SFTest::Diff).
sub port {
    my ($self, $n) = @_;
    $n //= 0;
    return $self->{ports}{$n} //= $self->_free_port;
}

# A free port, at random below the kernel's ephemeral range (from 10000),
# or in SF_TEST_PORTS=LOW-HIGH when set: a range kept for the tests on a
# host where other servers listen.
sub _free_port {
    my ($self) = @_;
    my %taken = map { $_ => 1 } grep { defined }
        map { values %{ $_->{ports} } } $self, grep { defined } @LIVE;
    my ($from, $to) = _port_range($self);
    for (1 .. 500) {
        my $port = $from + int(rand($to - $from + 1));
        next if $taken{$port};
        my $s = IO::Socket::INET->new(LocalAddr => $self->{addr}, LocalPort => $port,
            Proto => 'tcp', Listen => 1, ReuseAddr => 1) or next;
        close($s);
        return $port;
    }
    die "no free port found in $from-$to";
}

sub _port_range {
    my ($self) = @_;
    if (defined $ENV{SF_TEST_PORTS}) {
        my ($from, $to) = $ENV{SF_TEST_PORTS} =~ /^\s*(\d+)\s*-\s*(\d+)\s*$/
            or die "SF_TEST_PORTS=$ENV{SF_TEST_PORTS}: it must be LOW-HIGH, as 20000-20999\n";
        die "SF_TEST_PORTS=$ENV{SF_TEST_PORTS}: not a range of ports\n"
            unless $from >= 1 && $to <= 65535 && $from < $to;
        return ($from, $to);
    }
    my ($low) = split ' ', $self->read_file('/proc/sys/net/ipv4/ip_local_port_range');
    $low = 32768 unless $low && $low > 11000;
    return (10000, $low - 1);
}

# ------------------------------------------------------------ origins

# Starts t/origin.pl on a free port; returns an SFTest::Origin object.
# Origins are numbered in start order: 0 is %%ORIGIN%%, n is %%ORIGIN_n%%.
# Options: port (default: any free one), program (instead of t/origin.pl,
# e.g. bench/origin.c built: the same command line).
sub start_origin {
    my ($self, %opt) = @_;
    my $idx = @{ $self->{origins} };
    my $o = SFTest::Origin->_start($self, $idx, %opt);
    push @{ $self->{origins} }, $o;
    return $o;
}

sub origin {
    my ($self, $idx) = @_;
    return $self->{origins}[ $idx // 0 ] // die "origin " . ($idx // 0) . " not started";
}
sub origins { @{ $_[0]{origins} } }
sub origin_port  { $_[0]->origin($_[1])->port }
sub origin_hits  { $_[0]->origin($_[1])->hits }
sub origin_reset { $_[0]->origin($_[1])->reset }
sub origin_uri_hits { $_[0]->origin($_[2])->uri_hits($_[1]) }

# bench/NAME.c built into build/bench/NAME when missing or older than its
# source; returns the binary's path.  For the benchmarks, and for a test
# that needs what only the C origin has (hold=1 and /_release: held
# responses written in one loop): c_origin().
sub c_tool {
    my ($name) = @_;
    my $bin = "$REPO/build/bench/$name";
    my $src = "$REPO/bench/$name.c";
    return $bin if -x $bin && -M $bin <= -M $src;
    make_path("$REPO/build/bench");
    # built aside and renamed: another test file may be building it too
    system('cc', '-O2', '-Wall', '-o', "$bin.$$", $src) == 0 && rename("$bin.$$", $bin)
        or die "cannot build $bin from $src with cc\n";
    return $bin;
}

sub c_origin { c_tool('origin') }

# The body the origin sends for hit H of URI U with size=N (undef: default).
# Callable as a function or as a method.
sub origin_body {
    shift if ref $_[0] || ($_[0] // '') eq __PACKAGE__;
    return SFOrigin::body(@_);
}

# How many of the results @$res are complete 200s of origin hit $hit of
# $uri (its X-Hit and its body, default size).
sub with_hit {
    my ($res, $uri, $hit) = @_;
    return scalar grep {
        ($_->{status} // 0) == 200 && $_->{complete}
            && ($_->{headers}{'x-hit'} // 0) == $hit
            && $_->{body} eq origin_body($hit, $uri)
    } @$res;
}

# ------------------------------------------------------------ utilities

# This host's IPv4 TCP sockets (/proc/net/tcp), each [local port, remote
# port, state (1 ESTABLISHED, 8 CLOSE_WAIT, ...), bytes not yet read]: to
# tell, for a worker stopped on purpose, what has reached its sockets.
sub tcp_sockets {
    my @s;
    open(my $fh, '<', '/proc/net/tcp') or return ();
    <$fh>;
    while (<$fh>) {
        my @f = split ' ';
        my ($lport) = ($f[1] // '') =~ /:([0-9A-F]+)$/ or next;
        my ($rport) = ($f[2] // '') =~ /:([0-9A-F]+)$/ or next;
        my ($rx) = ($f[4] // '') =~ /:([0-9A-F]+)$/ or next;
        push @s, [hex $lport, hex $rport, hex $f[3], hex $rx];
    }
    return @s;
}

# How many of nginx's connections to origin $idx have a response waiting
# unread (the origin may have closed its side after it: CLOSE_WAIT).
sub origin_unread {
    my ($self, $idx) = @_;
    my $port = $self->origin_port($idx);
    return scalar grep { $_->[1] == $port && ($_->[2] == 1 || $_->[2] == 8) && $_->[3] > 0 }
                       tcp_sockets();
}

# { value => how many times it is in @values }
sub tally {
    my %count;
    $count{$_}++ for @_;
    return \%count;
}

# For a benchmark's report: this host's short name, a "machine" line
# (name, cores, CPU, kernel), the version of the nginx binary $nginx and
# the module's git description.
sub machine_facts {
    my ($nginx) = @_;
    my $run = sub { my $o = `$_[0] 2>&1` // ''; chomp $o; $o };
    my $host = $run->('hostname -s') || 'host';
    my ($cpu) = $run->('grep -m1 "model name" /proc/cpuinfo') =~ /:\s*(.*)/;
    my $cores = () = $run->('grep "^processor" /proc/cpuinfo') =~ /processor/g;
    return {
        host    => $host,
        machine => "$host, $cores cores, " . ($cpu // '?') . ', Linux ' . $run->('uname -r'),
        nginx_v => ($run->("$nginx -v") =~ m{nginx/(\S+)})[0] // '?',
        git     => $run->("git -C $REPO describe --always --dirty 2>/dev/null") || '?',
    };
}

# A benchmark's results file, bench/results/NAME.md, or NAME-2.md, -3...
# if that one is there already: a second run of the day keeps the first.
sub results_file {
    my ($name) = @_;
    my $base = "$REPO/bench/results/$name";
    my $file = "$base.md";
    for (my $i = 2; -e $file; $i++) {
        $file = "$base-$i.md";
    }
    return $file;
}

# The p-th percentile (nearest rank) of a list of numbers, undef if empty.
sub pct {
    my ($list, $p) = @_;
    return undef unless $list && @$list;
    my @s = sort { $a <=> $b } @$list;
    my $i = int($p / 100 * @s + 0.5) - 1;
    $i = 0 if $i < 0;
    $i = $#s if $i > $#s;
    return $s[$i];
}

# { field => $after->{field} - $before->{field} } for @fields (default:
# those of $after's that are numbers), e.g. counters between two
# zone_stats() snapshots.
sub delta {
    my ($before, $after, @fields) = @_;
    @fields = grep { !ref $after->{$_} && looks_like_number($after->{$_}) } keys %$after
        unless @fields;
    return { map { $_ => $after->{$_} - $before->{$_} } @fields };
}

# ------------------------------------------------------------ configuration

sub _hard_nofile {
    my $n = `sh -c 'ulimit -Hn' 2>/dev/null` // '';
    chomp $n;
    return $n =~ /^\d+$/ ? $n : 65536;
}

# A complete nginx.conf (with placeholders) around the given http{} body.
# Options: module (1), workers (2), log_singleflight (0), main (''), events ('').
sub config_template {
    my ($self, $http, %opt) = @_;
    my $module = $opt{module} // 1;
    my $workers = $opt{workers} // 2;
    my $nofile = _hard_nofile();
    $nofile = 65536 if $nofile > 65536;
    my $user = $> == 0 ? "user root;\n" : '';    # workers can write the test dir
    my $sf = $opt{log_singleflight} ? ' sf=$singleflight_status' : '';
    my $main = $opt{main} // '';
    my $events = $opt{events} // '';
    return ($module ? "%%MODULE%%\n" : '') . <<"EOT";
${user}daemon on;
master_process on;
worker_processes $workers;
worker_rlimit_nofile $nofile;
pid %%TESTDIR%%/nginx.pid;
%%ERROR_LOG%%
$main
events {
    worker_connections 4096;
    $events
}

http {
    log_format sftest '\$remote_addr "\$request" \$status \$body_bytes_sent '
                      'rt=\$request_time ut=\$upstream_response_time '
                      'us=\$upstream_status ua=\$upstream_addr$sf';
    access_log %%TESTDIR%%/access.log sftest;

    client_body_temp_path %%TESTDIR%%/client_body_temp;
    proxy_temp_path       %%TESTDIR%%/proxy_temp;
    fastcgi_temp_path     %%TESTDIR%%/fastcgi_temp;
    uwsgi_temp_path       %%TESTDIR%%/uwsgi_temp;
    scgi_temp_path        %%TESTDIR%%/scgi_temp;

$http
}
EOT
}

sub _placeholder {
    my ($self, $name) = @_;
    return $self->{dir} if $name eq 'TESTDIR';
    return $self->{addr} if $name eq 'ADDR';
    return $self->port(0) if $name eq 'PORT';
    return $self->port($1) if $name =~ /^PORT_(\d+)$/;
    return $self->origin($1 // 0)->addr if $name =~ /^ORIGIN(?:_(\d+))?$/;
    return "load_module $self->{module};" if $name eq 'MODULE';
    return "error_log %%TESTDIR%%/error.log $self->{log_level};" if $name eq 'ERROR_LOG';
    die "unknown placeholder %%$name%% in nginx config";
}

# Expands placeholders, writes TESTDIR/nginx.conf, returns the final text.
sub write_config {
    my ($self, $text) = @_;
    for (1 .. 2) {                       # 2 passes: ERROR_LOG contains TESTDIR
        $text =~ s/%%([A-Z][A-Z0-9_]*)%%/$self->_placeholder($1)/ge;
    }
    $self->write_file('nginx.conf', $text);
    return $self->{config} = $text;
}

sub config { $_[0]{config} }

# ------------------------------------------------------------ nginx control

# Runs the nginx binary with @args and SF_NGINX_ENV; returns (exit code,
# output).  Output is also appended to TESTDIR/nginx-cmd.out.
sub _run_nginx {
    my ($self, @args) = @_;
    my $out = $self->path('nginx-cmd.out');
    my $offset = -s $out // 0;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>>', $out) or POSIX::_exit(126);
        open(STDERR, '>&', \*STDOUT);
        $SIG{$_} = 'DEFAULT' for qw(PIPE INT TERM HUP);
        $ENV{ $_->[0] } = $_->[1] for @{ $self->{env} };
        exec($self->{nginx}, @args) or POSIX::_exit(127);
    }
    my $done = $self->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, timeout => 30,
        what => "nginx @args to exit", quiet => 1);
    my $rc = $done ? $? >> 8 : do { kill 'KILL', $pid; waitpid($pid, 0); -1 };
    return ($rc, $self->read_file($out, $offset));
}

sub _nginx_args {
    my ($self, $errlog) = @_;
    my $d = $self->{dir};
    return ('-p', "$d/", '-c', "$d/nginx.conf", '-e', "$d/" . ($errlog // 'error.log'));
}

# nginx -t on the current config: ($ok, $output).  Uses a separate startup
# log so deliberate config errors do not trip the log scan.
sub test_config {
    my ($self) = @_;
    my ($rc, $out) = $self->_run_nginx('-t', $self->_nginx_args('nginx-t.err'));
    return ($rc == 0, $out);
}

# Starts nginx (daemon).  Returns true; on failure emits a failing test and
# dies, unless may_fail => 1 (then returns false without a test).
sub start {
    my ($self, %opt) = @_;
    die "write_config() first" unless defined $self->{config};
    unlink $self->path('nginx.pid');
    my $off = $self->log_offset;
    my ($rc, $out) = $self->_run_nginx($self->_nginx_args);
    my $ok = $rc == 0;
    my $port = $self->{ports}{0};
    my $single = $self->{config} =~ /^\s*master_process\s+off/m;
    $ok &&= $self->wait_for(sub {
        my $pid = $self->_read_pid or return 0;
        return 0 unless _alive($pid) && ($single || $self->worker_pids);
        return 1 unless defined $port && $self->{config} =~ /\b$port\b/;
        return _can_connect($port, $self->{addr});
    }, timeout => $opt{timeout} // 10, what => 'nginx to start', quiet => $opt{may_fail});
    if ($ok) {
        $self->{master} = $self->_read_pid;
        # and every worker forked and named, for those who count them
        # (RSS sums, page faults); one that never comes is the test's to see
        my ($n) = $single ? (1) : $self->{config} =~ /^\s*worker_processes\s+(\d+)\s*;/m;
        $self->wait_for(sub { $self->worker_pids >= $n }, timeout => 5, quiet => 1)
            if $n && $n > 1;
        return 1;
    }
    return 0 if $opt{may_fail};
    Test::More::fail('nginx starts');
    Test::More::diag("nginx exit code $rc, output:\n$out\nerror.log:\n"
        . $self->error_log_since($off));
    die "nginx failed to start\n";
}

sub _read_pid {
    my ($self) = @_;
    my ($pid) = $self->read_file('nginx.pid') =~ /(\d+)/;
    return $pid;
}

sub master_pid {
    my ($self) = @_;
    return $self->_read_pid // $self->{master};
}

sub signal {
    my ($self, $sig) = @_;
    my $pid = $self->master_pid or return 0;
    return kill($sig, $pid);
}

# The parent pid of $pid, or undef.
sub _parent {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/stat") or return undef;
    my $stat = <$fh> // return undef;
    return ($stat =~ /^\d+ \(.*\) \S (\d+) /s)[0];
}

# Is $pid a child of nginx's $master, or of this test (a worker whose
# master died, re-parented to us as its subreaper)?
sub _ours {
    my ($pid, $master) = @_;
    my $parent = _parent($pid) // return 0;
    return $parent == $$ || ($master && $parent == $master);
}

# True if $pid exists and is not a zombie (our PID 1 may not reap).
sub _alive {
    my ($pid) = @_;
    return 0 unless $pid && kill(0, $pid);
    open(my $fh, '<', "/proc/$pid/stat") or return 0;
    my $stat = <$fh> // '';
    return $stat !~ /^\d+ \(.*\) [ZX] /s;
}

sub _can_connect {
    my ($port, $addr) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => $addr // '127.0.0.1', PeerPort => $port,
        Proto => 'tcp', Timeout => 1) or return 0;
    close($s);
    return 1;
}

# Live children of $ppid: list of { pid, title }.
sub _children {
    my ($ppid) = @_;
    return () unless $ppid;
    my @kids;
    for my $stat (glob '/proc/[0-9]*/stat') {
        open(my $fh, '<', $stat) or next;
        my $line = <$fh> // next;
        my ($pid, $state, $parent) = $line =~ /^(\d+) \(.*\) (\S) (\d+) /s or next;
        next if $parent != $ppid || $state eq 'Z' || $state eq 'X';
        open(my $cf, '<', "/proc/$pid/cmdline") or next;
        my $title = do { local $/; <$cf> } // '';
        $title =~ tr/\0/ /;
        push @kids, { pid => $pid, title => $title };
    }
    return sort { $a->{pid} <=> $b->{pid} } @kids;
}

# Pids of all live children of the master (workers, cache processes, ...).
sub child_pids { map { $_->{pid} } _children($_[0]->master_pid) }

# Pids of active workers (not the ones shutting down after a reload).
sub worker_pids {
    map { $_->{pid} } grep { $_->{title} =~ /worker process/ && $_->{title} !~ /shutting down/ }
        _children($_[0]->master_pid);
}

# kill -9 of workers, each outside the zones' locks.  A worker killed
# while it holds a zone's mutex makes the master force it open ("[alert]
# shared memory zone ... was locked by"), and what the worker was changing
# under it is lost (a slab allocation not yet linked): a case of its own
# (README, Limitations), not what a test of a dead worker is about.  With
# the debug log on, each worker's last "shmtx lock" or "shmtx unlock" line
# says where it is: it is stopped, and killed if its last word is an
# unlock with more lines after it (nginx logs the unlock before it lets
# go) or it logged none, else let go on a moment and tried again.
# Returns how many were killed, as kill() does.
sub kill_worker {
    my ($self, @pids) = @_;
    my $n = 0;
    my $master = $self->master_pid;
    for my $pid (@pids) {
        # a pid not found (a wait that timed out): kill() of 0 or undef
        # would signal the test's own process group, prove and all
        next unless ($pid // '') =~ /^[1-9]\d*$/;
        # and a pid that is no longer one of our workers (given to a
        # process of another test since) is left alone
        if (!$master || (_parent($pid) // 0) != $master) {
            Test::More::diag("kill_worker: $pid is not a worker of master "
                             . ($master // '?') . ', not killed');
            next;
        }
        for my $try (1 .. 200) {
            kill 'STOP', $pid or last;
            if ($try == 200 || !$self->_in_lock($pid)) {
                $self->{killed}{$pid} = $self->log_offset;
                $n += kill 'KILL', $pid;
                kill 'CONT', $pid;
                last;
            }
            kill 'CONT', $pid;
            sleep 0.005;
        }
    }
    return $n;
}

# Has the master reaped worker $pid (killed by kill_worker) and are $n
# workers (default 2) running again?  The kernel may give the new worker
# the dead one's pid (seen in CI), so the sign of the reaping is the
# master's "exited" line written after the kill, not a pid
# missing from the list.
sub worker_respawned {
    my ($self, $pid, $n) = @_;
    my $re = qr/worker process $pid exited (?:on signal|with code) \d+/;
    return $self->wait_for(sub {
        $self->log_count($re, $self->{killed}{$pid} // 0) >= 1
            && $self->worker_pids == ($n // 2)
    }, what => "worker $pid respawned");
}

# Signal $sig to worker $pid as it is, wherever it is (kill_worker waits
# for it to be outside the zones' locks), for worker_respawned().
sub signal_worker {
    my ($self, $sig, $pid) = @_;
    $self->{killed}{$pid} = $self->log_offset;
    return kill $sig, $pid;
}

# The pids of the workers that hold the server side of the connections
# of started requests (HTTP/1.x handles), in their order (the first alone
# in scalar context); undef for one no worker holds (not accepted yet,
# closed).  Read from /proc: each connection's socket in /proc/net/tcp,
# then the workers' descriptors.  For a request that leaves no line of
# its own in the debug log (one on its own way, singleflight_lone direct).
sub worker_of {
    my ($self, @handles) = @_;
    my (%inode, %pid);
    if (open(my $fh, '<', '/proc/net/tcp')) {
        <$fh>;
        while (<$fh>) {
            my @f = split ' ';
            my ($l) = ($f[1] // '') =~ /:([0-9A-F]+)$/ or next;
            my ($r) = ($f[2] // '') =~ /:([0-9A-F]+)$/ or next;
            $inode{ hex($l) . ':' . hex($r) } = $f[9] if $f[9];
        }
    }
    for my $pid ($self->worker_pids) {
        for my $fd (glob "/proc/$pid/fd/*") {
            my $link = readlink($fd) // next;
            $pid{$1} = $pid if $link =~ /^socket:\[(\d+)\]$/;
        }
    }
    my @pids = map {
        my $i = defined $_->{local_port} && $inode{"$_->{port}:$_->{local_port}"};
        $i ? $pid{$i} : undef
    } @handles;
    return wantarray ? @pids : $pids[0];
}

# Is the (stopped) worker between a "shmtx lock" and its "shmtx unlock" in
# the last 256 KiB of error.log?
sub _in_lock {
    my ($self, $pid) = @_;
    my $file = $self->path('error.log');
    my $size = -s $file or return 0;
    open(my $fh, '<', $file) or return 0;
    seek($fh, $size > 262144 ? $size - 262144 : 0, 0);
    local $/;
    my $tail = <$fh> // '';
    # nginx logs "shmtx unlock" before it lets go: an unlock that is the
    # worker's last line may not have happened yet
    my ($last, $after) = ('', 0);
    while ($tail =~ /\[\w+\] $pid#\d+: (.*)$/mg) {
        if ($1 =~ /^shmtx (lock|unlock)$/) {
            ($last, $after) = ($1, 0);
        } else {
            $after++;
        }
    }
    return $last eq 'lock' || ($last eq 'unlock' && !$after);
}

# HUP and wait until all active workers are new ones (and, with
# wait_old => 1, until the old ones have exited).  Returns true on success,
# false on timeout or if the master logged [emerg] (config rejected).
sub reload {
    my ($self, %opt) = @_;
    my $master = $self->master_pid or return 0;
    my %old = map { $_ => 1 } $self->child_pids;
    my $off = $self->log_offset;
    kill 'HUP', $master or return 0;
    my $rejected = 0;
    my $ok = $self->wait_for(sub {
        if ($self->error_log_since($off) =~ /\[emerg\]/) { $rejected = 1; return 1 }
        my @w = $self->worker_pids;
        return 0 if !@w || grep { $old{$_} } @w;
        return 1 unless $opt{wait_old};
        return !grep { _alive($_) } keys %old;
    }, timeout => $opt{timeout} // 10, what => 'nginx reload');
    return $ok && !$rejected;
}

# Graceful stop: QUIT, wait (timeout, default 10 s), then TERM, then KILL.
# Also makes sure no child of the master survives.  Returns true if the
# graceful stop worked.
sub stop {
    my ($self, %opt) = @_;
    my $master = $self->master_pid;
    if (!$master || !_alive($master)) {
        waitpid($master, WNOHANG) if $master;
        _kill_orphans();
        return 1;
    }
    my @kids = $self->child_pids;
    kill 'QUIT', $master;
    my $graceful = $self->wait_for(sub { !_alive($master) },
        timeout => $opt{timeout} // 10, what => 'nginx to quit');
    if (!$graceful) {
        kill 'TERM', $master;
        $self->wait_for(sub { !_alive($master) }, timeout => 3, quiet => 1)
            or kill 'KILL', $master;
    }
    # only ours: a pid freed since may be another test's process now
    my @left = grep { _alive($_) && _ours($_, $master) } @kids, $self->child_pids;
    kill 'KILL', @left if @left && !$self->wait_for(sub { !grep { _alive($_) } @left },
        timeout => 3, quiet => 1);
    waitpid($_, WNOHANG) for $master, @kids;    # reap (we are their subreaper)
    _kill_orphans();
    delete $self->{master};
    return $graceful;
}

# Workers whose master died were re-parented to us (subreaper): kill them.
sub _kill_orphans {
    my @orphans = map { $_->{pid} } grep { $_->{title} =~ /^nginx: (?!master)/ } _children($$);
    return unless @orphans;
    kill 'KILL', @orphans;
    waitpid($_, 0) for @orphans;
}

# ------------------------------------------------------------ logs

sub log_offset {
    my ($self, $name) = @_;
    return -s $self->path($name // 'error.log') // 0;
}

sub error_log_since {
    my ($self, $offset, $name) = @_;
    return $self->read_file($name // 'error.log', $offset // 0);
}

sub allow_log {
    my ($self, @re) = @_;
    push @{ $self->{allow} }, @re;
}

# The lines of the test dir's logs that will fail the test at its end
# (alerts, sanitizer reports, not allowed by allow_log()), as they are
# now: a test that runs rounds can tell which round they came in.
sub bad_log_lines {
    my ($self) = @_;
    return _scan_logs($self->{dir}, $self->{allow});
}

# How many times $re matches in a log of the test dir (error.log) after
# $offset bytes.
sub log_count {
    my ($self, $re, $offset, $name) = @_;
    my $n = () = $self->error_log_since($offset, $name) =~ /$re/g;
    return $n;
}

# The lines of a log in the test dir as records: each line split on sep
# (default ' ') into the named @$fields, the last one taking the rest of
# the line.  Options: sep, offset (bytes to skip), uri (keep only the
# records whose field "uri" is this string, or matches this qr//).
sub log_records {
    my ($self, $name, $fields, %opt) = @_;
    my $sep = $opt{sep} // ' ';
    my $split = qr/\Q$sep\E/;
    my $uri = $opt{uri};
    my @records;
    for my $line (split /\n/, $self->read_file($name, $opt{offset})) {
        my %r;
        @r{@$fields} = split $split, $line, scalar @$fields;
        next if defined $uri
            && !(defined $r{uri} && (ref $uri ? $r{uri} =~ $uri : $r{uri} eq $uri));
        push @records, \%r;
    }
    return @records;
}

# log_records() once there are at least $n of them (or at the timeout,
# option timeout, 10 s).
sub wait_log_records {
    my ($self, $name, $fields, $n, %opt) = @_;
    my @records;
    $self->wait_for(sub {
        @records = $self->log_records($name, $fields, %opt);
        @records >= $n;
    }, timeout => $opt{timeout} // 10,
       what => "$n log lines" . (defined $opt{uri} ? " of $opt{uri}" : ''));
    return @records;
}

# Polls $cond every 20 ms until it returns true or the deadline passes.
sub wait_for {
    my ($self, $cond, %opt) = @_;
    my $deadline = time + ($opt{timeout} // 10);
    while (1) {
        return 1 if $cond->();
        last if time >= $deadline;
        sleep($opt{interval} // 0.02);
    }
    Test::More::diag("timed out waiting for " . ($opt{what} // 'condition'))
        unless $opt{quiet};
    return 0;
}

# Lines of the test dir's logs that look like trouble and are not allowed.
sub _scan_logs {
    my ($dir, $allow) = @_;
    my @bad;
    opendir(my $dh, $dir) or return ();
    for my $name (sort readdir $dh) {
        my $re;
        if ($name =~ /^(?:asan|ubsan|lsan)/) { $re = $BAD_LINE }
        elsif ($name eq 'nginx-cmd.out') { $re = $SANITIZER_LINE }
        elsif ($name =~ /\.log$/ && $name !~ /^origin-/) { $re = $BAD_LINE }
        else { next }
        open(my $fh, '<', "$dir/$name") or next;
        while (my $line = <$fh>) {
            next unless $line =~ $re;
            next if grep { $line =~ $_ } @$allow;
            chomp $line;
            push @bad, "$name: $line";
        }
    }
    return @bad;
}

# Stops nginx and the origins; returns what _report() needs.
sub _shutdown {
    my ($self) = @_;
    $self->{reported} = 1;
    eval { $self->stop(timeout => 5) };
    my @died;
    for my $o (@{ $self->{origins} }) {
        push @died, [ $o->{idx}, $o->{died}, _slurp($o->{err}) ]
            if !eval { $o->stop } && $o->{died};
    }
    return { dir => $self->{dir}, allow => [ @{ $self->{allow} } ], died => \@died };
}

# Emits failing tests for dead origins and bad log lines, prints the error
# log on failure if asked to, then removes or keeps the test dir.
sub _report {
    my ($rep, %a) = @_;
    my $dir = $rep->{dir};
    for (@{ $rep->{died} }) {
        my ($idx, $status, $err) = @$_;
        Test::More::fail("origin $idx did not die unexpectedly");
        Test::More::diag("origin $idx exited with status $status:\n$err");
    }
    for my $err (glob "$dir/origin-*.err") {
        my $text = _slurp($err);
        Test::More::diag("origin stderr ($err):\n$text") if length $text;
    }
    my @bad = _scan_logs($dir, $rep->{allow});
    if (@bad) {
        Test::More::fail('no alerts or sanitizer reports in logs');
        my $more = @bad > 50 ? "\n... and " . (@bad - 50) . " more" : '';
        Test::More::diag(join("\n", @bad[ 0 .. ($#bad < 49 ? $#bad : 49) ]) . $more);
    }

    my $failed = !Test::More->builder->is_passing || $a{status};
    if ($failed && ($ENV{TEST_NGINX_VERBOSE} || $ENV{CI}) && -s "$dir/error.log") {
        my @lines = split /\n/, _slurp("$dir/error.log");
        splice(@lines, 0, @lines - 200) if @lines > 200;
        Test::More::diag("error.log (last 200 lines):\n" . join("\n", @lines));
    }
    if ($failed || $ENV{TEST_NGINX_LEAVE}) {
        Test::More::diag("test dir kept: $dir");
    }
    else {
        remove_tree($dir);
    }
}

# ------------------------------------------------------------ HTTP client

# One blocking request; returns the result hashref (see _new_request).
sub http {
    my ($self, $method, $path, %opt) = @_;
    my $h = $self->start_request($method, $path, %opt);
    return $self->finish_request($h);
}

sub get { my ($self, $path, %opt) = @_; $self->http('GET', $path, %opt) }

# GET a path and decode its JSON body (undef on failure).
sub stats {
    my ($self, $path, %opt) = @_;
    my $r = $self->get($path, %opt);
    return undef unless ($r->{status} // 0) == 200;
    return eval { JSON::PP->new->decode($r->{body}) };
}

# Connects and sends a request now; read the answer later with
# finish_request() (blocking) or poll_request() (non-blocking).  Options
# (also for http/get): port, headers ({Name => v | [v, ...]} or
# [Name => v, ...]), body, timeout (10 s), http10, raw (bytes sent as-is).
# Host and "Connection: close" are added unless given.
sub start_request {
    my ($self, $method, $path, %opt) = @_;
    my $h = $opt{h2} ? $self->_new_h2($method, $path, %opt)
                     : $self->_new_request($method, $path, %opt);
    $self->_send($h) unless $h->{state} eq 'done' || $h->{pid};
    return $h;
}

# Waits for a started request (timeout: remaining of the original one, or
# timeout => S from now) and returns its result hashref.
sub finish_request {
    my ($self, $h, %opt) = @_;
    $h->{deadline} = time + $opt{timeout} if $opt{timeout};
    $self->_drive([$h]);
    return $h->{res};
}

# Processes whatever has arrived without blocking; true once complete.
sub poll_request {
    my ($self, $h) = @_;
    $self->_drive([$h], once => 1);
    return $h->{state} eq 'done';
}

# Drives started requests until all are complete or closed, or the
# timeout (10 s) passes; those left stay open.  True if all are done.  A
# handle's completion time is then $h->{t0} + $h->{res}{time}.
sub poll_all {
    my ($self, $handles, %opt) = @_;
    return $self->wait_for(sub {
        my $left = 0;
        for (@$handles) { $left++ unless $self->poll_request($_) }
        !$left;
    }, timeout => $opt{timeout} // 10, interval => 0.01, what => $opt{what} // 'all responses');
}

# Drives started requests (of any object) until each is complete, closed
# or past its own timeout; returns their results in order.
sub finish_all {
    my ($self, $handles) = @_;
    $self->_drive($handles);
    return [ map { $_->{res} } @$handles ];
}

# Closes the client side mid-flight (rst => 1: send RST instead of FIN).
sub abort_request {
    my ($self, $h, %opt) = @_;
    return if $h->{state} eq 'done';
    setsockopt($h->{sock}, SOL_SOCKET, SO_LINGER, pack('ii', 1, 0)) if $opt{rst} && $h->{sock};
    $self->_done($h, 'aborted by client');
}

# N concurrent requests: connect all, send all, read all (non-blocking).
# Options: n, path | paths => [...], method, headers, body, timeout, port,
# http10, raw.  Returns an arrayref of result hashrefs in client order.
sub herd {
    my ($self, %opt) = @_;
    my @paths = $opt{paths} ? @{ $opt{paths} } : (($opt{path} // '/') x ($opt{n} // 1));
    my $timeout = $opt{timeout} // 10;
    my %common = map { $_ => $opt{$_} } grep { exists $opt{$_} } qw(headers body port http10 raw);
    my @h = map { $self->_new_request($opt{method} // 'GET', $_, %common,
        timeout => $timeout) } @paths;
    my $deadline = time + $timeout;
    for (@h) {
        $_->{deadline} = $deadline;
        $self->_send($_) unless $_->{state} eq 'done';
    }
    $self->_drive(\@h);
    return [ map { $_->{res} } @h ];
}

# Builds a request handle and connects it.  The result hashref ($h->{res}):
#   status (undef unless a status line arrived), reason, protocol,
#   headers ({lowercased name => value, repeats joined by ", "}),
#   header_list ([[Name, value], ...]), raw_headers (text), body,
#   complete (1 if the whole response arrived), error (set otherwise),
#   chunked (1 if chunked), trailers (their lines, as sent), time
#   (start->end s), latency (send->end s).
sub _new_request {
    my ($self, $method, $path, %opt) = @_;
    my $port = $opt{port} // $self->port(0);
    my $h = {
        method   => $method,
        state    => 'connect',
        rbuf     => '',
        t0       => time,
        deadline => time + ($opt{timeout} // 10),
        res      => { status => undef, headers => {}, header_list => [], body => '' },
        # until_close => 1: done when nginx closes the connection, not at
        # the body's last byte (nginx may still run the request's
        # subrequests then, which a client closing first would cut short);
        # bytes past the body's Content-Length are added to its body
        until_close => $opt{until_close},
    };
    $h->{wbuf} = $opt{raw} // _build_request($method, $path, %opt);
    $h->{sock} = IO::Socket::INET->new(PeerAddr => $self->{addr}, PeerPort => $port,
        Proto => 'tcp', Timeout => $opt{timeout} // 10);
    if (!$h->{sock}) {
        $self->_done($h, "connect to port $port failed: " . ($@ || $!));
        return $h;
    }
    $h->{sock}->blocking(0);
    # rcvbuf => N: a small receive buffer, so that a client that reads
    # nothing stalls nginx's writes after a few kilobytes
    setsockopt($h->{sock}, SOL_SOCKET, SO_RCVBUF, $opt{rcvbuf}) if $opt{rcvbuf};
    $h->{local_port} = $h->{sock}->sockport;    # $remote_port in nginx's log
    $h->{port} = $port;
    $h->{state} = 'head';
    return $h;
}

# The bytes start_request() sends for ($method, $path, %opt): a request to
# show in a reproduction.
sub request_text {
    shift if ref $_[0] || ($_[0] // '') eq __PACKAGE__;
    my ($method, $path, %opt) = @_;
    return $opt{raw} // _build_request($method, $path, %opt);
}

sub _build_request {
    my ($method, $path, %opt) = @_;
    my $hdr = $opt{headers} // [];
    my @pairs = ref $hdr eq 'HASH'
        ? map { my $k = $_; map { [ $k, $_ ] } ref $hdr->{$k} ? @{ $hdr->{$k} } : $hdr->{$k} }
            sort keys %$hdr
        : map { [ $hdr->[ 2 * $_ ], $hdr->[ 2 * $_ + 1 ] ] } 0 .. @$hdr / 2 - 1;
    my %has = map { lc $_->[0] => 1 } @pairs;
    unshift @pairs, [ Host => 'localhost' ] unless $has{host};
    push @pairs, [ Connection => 'close' ] unless $has{connection};
    push @pairs, [ 'Content-Length' => length $opt{body} ]
        if defined $opt{body} && !$has{'content-length'} && !$has{'transfer-encoding'};
    my $proto = $opt{http10} ? 'HTTP/1.0' : 'HTTP/1.1';
    if ($opt{h2}) {
        # what curl sends on its stream, as an HTTP/1.1 text
        @pairs = grep { lc $_->[0] !~ /^(?:connection|keep-alive|transfer-encoding|upgrade|te)$/ }
            @pairs;
        $proto = 'HTTP/2 (curl --http2-prior-knowledge)';
    }
    return "$method $path $proto\r\n" . join('', map { "$_->[0]: $_->[1]\r\n" } @pairs)
        . "\r\n" . ($opt{body} // '');
}

# ------------------------------------------------------------ HTTP/2 (curl)

# An HTTP/2 request: a curl process (prior knowledge, cleartext) that
# writes the response's headers and body to files; _drive() reaps it and
# _h2_result() reads them.  The request's headers are _build_request()'s
# but the connection's own, and none of curl's (Accept, User-Agent,
# Content-Type).
sub _new_h2 {
    my ($self, $method, $path, %opt) = @_;
    my $n = ++$self->{h2_n};
    my $base = $self->path("h2-$n");
    my $h = {
        method   => $method,
        h2       => 1,
        state    => 'h2',
        wbuf     => '',
        base     => $base,
        t0       => time,
        deadline => time + ($opt{timeout} // 10),
        res      => { status => undef, headers => {}, header_list => [], body => '' },
    };
    my (undef, @lines) = split /\r\n/, _build_request($method, $path, %opt, body => undef, h2 => 1);
    @lines = grep { !/^host:/i } @lines;
    my @args = ('curl', '-sS', '--http2-prior-knowledge', '--globoff', '--path-as-is',
        '-D', "$base.head", '-o', "$base.body", '-w', '%{local_port}',
        '--max-time', $opt{timeout} // 10);
    push @args, $method eq 'HEAD' ? '--head' : ('-X', $method);
    push @args, map { my ($k, $v) = /^([^:]+): ?(.*)$/; ('-H', length $v ? "$k: $v" : "$k;") } @lines;
    # none of curl's own: the same headers as over HTTP/1.x
    my %has = map { lc((split /:/)[0]) => 1 } @lines;
    push @args, map { ('-H', "$_:") } grep { !$has{ lc $_ } } qw(Accept User-Agent Content-Type);
    if (defined $opt{body}) {
        $self->write_file("h2-$n.req", $opt{body});
        push @args, '--data-binary', "\@$base.req";
    }
    # ":authority: localhost", as the HTTP/1.1 requests' "Host: localhost"
    my $port = $opt{port} // $self->port(0);
    push @args, '--connect-to', "localhost:80:$self->{addr}:$port", "http://localhost$path";
    my $pid = fork;
    if (!defined $pid) {
        $self->_done($h, "fork: $!");
        return $h;
    }
    if (!$pid) {
        open(STDOUT, '>', "$base.out");
        open(STDERR, '>', "$base.err");
        exec(@args) or POSIX::_exit(127);
    }
    $h->{pid} = $pid;
    $h->{t_sent} = time;
    return $h;
}

# The curl of an HTTP/2 handle has exited with $status: its response.
sub _h2_result {
    my ($self, $h, $status) = @_;
    delete $h->{pid};
    my $r = $h->{res};
    my $head = $self->read_file("$h->{base}.head") // '';
    # the last response block: interim 1xx ones come first
    my @blocks = grep { /^HTTP\// } split /\r\n\r\n/, $head;
    @blocks = grep { !m{^HTTP/\S+ 1\d\d} } @blocks;
    if (my $block = $blocks[-1]) {
        my ($line, @lines) = split /\r\n/, $block;
        my ($proto, $code) = $line =~ m{^(HTTP/\S+) (\d{3})};
        @$r{qw(protocol status reason raw_headers)} = ($proto, $code, '', "$block\r\n\r\n");
        _add_headers($r, @lines);
    }
    # (curl --head writes the headers where the body would go)
    $r->{body} = $h->{method} eq 'HEAD' ? '' : $self->read_file("$h->{base}.body") // '';
    $h->{local_port} = ($self->read_file("$h->{base}.out") // '') =~ /^(\d+)/ ? $1 : undef;
    my $err = $status == 0 ? undef
        : 'curl exit ' . ($status >> 8) . ': ' . (($self->read_file("$h->{base}.err") // '') =~ s/\s+$//r);
    $self->_done($h, $err);
}

# Marks a handle finished (error undef = success) and closes its socket.
sub _done {
    my ($self, $h, $error) = @_;
    my $r = $h->{res};
    my $now = time;
    $r->{time} = $now - $h->{t0};
    $r->{latency} = $now - ($h->{t_sent} // $h->{t0});
    if (defined $error) { $r->{error} = $error }
    else { $r->{complete} = 1 }
    close($h->{sock}) if $h->{sock};
    delete $h->{sock};
    if (my $pid = delete $h->{pid}) {
        # an HTTP/2 request given up (a timeout, an abort): its curl too
        kill 'KILL', $pid;
        waitpid($pid, 0);
    }
    $h->{state} = 'done';
}

sub _send {
    my ($self, $h) = @_;
    while (length $h->{wbuf}) {
        my $n = syswrite($h->{sock}, $h->{wbuf});
        if (!defined $n) {
            return if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
            # The server may have answered and closed early: read what is there.
            $h->{wbuf} = '';
            return;
        }
        $h->{t_sent} //= time;
        substr($h->{wbuf}, 0, $n, '');
    }
}

sub _recv {
    my ($self, $h) = @_;
    my $n = sysread($h->{sock}, $h->{rbuf}, 65536, length $h->{rbuf});
    if (!defined $n) {
        return if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
        return $self->_eof($h, "read error: $!");
    }
    $self->_parse($h);
    $self->_eof($h) if $n == 0 && $h->{state} ne 'done';
}

sub _eof {
    my ($self, $h, $err) = @_;
    $self->_parse($h);
    return if $h->{state} eq 'done';
    if ($h->{state} eq 'body' && $h->{mode} eq 'close' && !defined $err) {
        return $self->_done($h);
    }
    $err //= defined $h->{res}{status} ? 'connection closed before the response was complete'
        : 'connection closed without a response';
    $self->_done($h, $err);
}

# A response head's header lines into $r: header_list in order, and
# headers by lowercase name, repeated ones joined with ", ".
sub _add_headers {
    my ($r, @lines) = @_;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*?)\s*$/ or next;
        push @{ $r->{header_list} }, [ $k, $v ];
        my $lc = lc $k;
        $r->{headers}{$lc} = exists $r->{headers}{$lc} ? "$r->{headers}{$lc}, $v" : $v;
    }
}

# Incremental response parser: head, then Content-Length, chunked or
# close-delimited body.  Interim 1xx responses are skipped.
sub _parse {
    my ($self, $h) = @_;
    my $r = $h->{res};
    while ($h->{state} eq 'head') {
        my $end = index($h->{rbuf}, "\r\n\r\n");
        return if $end < 0;
        my $head = substr($h->{rbuf}, 0, $end + 4, '');
        my ($line, @lines) = split /\r\n/, $head;
        my ($proto, $status, $reason) = $line =~ m{^(HTTP/\d\.\d) (\d{3})(?: (.*))?$}
            or return $self->_done($h, "bad status line: $line");
        next if $status =~ /^1/ && $status != 101;
        @$r{qw(protocol status reason raw_headers)} = ($proto, $status, $reason // '', $head);
        _add_headers($r, @lines);
        my $te = $r->{headers}{'transfer-encoding'} // '';
        my $cl = $r->{headers}{'content-length'};
        $h->{state} = 'body';
        if ($h->{method} eq 'HEAD' || $status =~ /^1/ || $status == 204 || $status == 304) {
            return $self->_done($h);
        }
        elsif ($te =~ /chunked/i) { @$h{qw(mode cstate)} = ('chunked', 'size'); $r->{chunked} = 1 }
        elsif (defined $cl && $cl =~ /^\d+$/) { @$h{qw(mode left)} = ('length', $cl) }
        else { $h->{mode} = 'close' }
    }
    return unless $h->{state} eq 'body';

    if ($h->{mode} eq 'close') {
        $r->{body} .= $h->{rbuf};
        $h->{rbuf} = '';
        return;
    }
    if ($h->{mode} eq 'length') {
        my $take = substr($h->{rbuf}, 0, $h->{left}, '');
        $r->{body} .= $take;
        $h->{left} -= length $take;
        return unless $h->{left} == 0;
        return $self->_done($h) unless $h->{until_close};
        # bytes past the length are the body's too, those of this read
        # with them
        $h->{mode} = 'close';
        $r->{body} .= $h->{rbuf};
        $h->{rbuf} = '';
        return;
    }
    while (1) {                                          # chunked
        my $cs = $h->{cstate};
        if ($cs eq 'data') {
            my $take = substr($h->{rbuf}, 0, $h->{cleft}, '');
            $r->{body} .= $take;
            $h->{cleft} -= length $take;
            return if $h->{cleft};
            $h->{cstate} = 'crlf';
            next;
        }
        my $eol = index($h->{rbuf}, "\r\n");
        return if $eol < 0;
        my $line = substr($h->{rbuf}, 0, $eol + 2, '');
        if ($cs eq 'crlf') {
            return $self->_done($h, 'bad chunk terminator') if $line ne "\r\n";
            $h->{cstate} = 'size';
        }
        elsif ($cs eq 'size') {
            my ($hex) = $line =~ /^([0-9a-fA-F]+)/ or return $self->_done($h, 'bad chunk size');
            $r->{chunks}++;
            if (hex($hex) == 0) { $h->{cstate} = 'trailer' }
            else { @$h{qw(cstate cleft)} = ('data', hex $hex) }
        }
        elsif ($line eq "\r\n") { return $self->_done($h) }   # end of trailer
        else { $r->{trailers} .= $line }                       # a trailer
    }
}

# Event loop for a set of handles until all are done or past their
# deadlines (once => 1: a single non-blocking pass).
sub _drive {
    my ($self, $handles, %opt) = @_;
    while (1) {
        my $now = time;
        my @live = grep { $_->{state} ne 'done' } @$handles;
        # a curl that has exited is read before any deadline: a wait
        # elsewhere may have outlasted it
        for (grep { $_->{pid} } @live) {
            my $pid = waitpid($_->{pid}, WNOHANG);
            $self->_h2_result($_, $?) if $pid == $_->{pid};
        }
        @live = grep { $_->{state} ne 'done' } @live;
        if (!$opt{once}) {
            $self->_done($_, 'timeout') for grep { $now >= $_->{deadline} } @live;
            @live = grep { $_->{state} ne 'done' } @live;
        }
        last unless @live;
        my ($rs, $ws, %by_fd) = (IO::Select->new, IO::Select->new);
        my $wait = 0.5;
        $wait = 0.005 if grep { $_->{pid} } @live;
        for (grep { $_->{sock} } @live) {
            $by_fd{ fileno $_->{sock} } = $_;
            $rs->add($_->{sock});
            $ws->add($_->{sock}) if length $_->{wbuf};
            my $left = $_->{deadline} - $now;
            $wait = $left if $left < $wait;
        }
        $wait = 0 if $opt{once} || $wait < 0;
        my ($r, $w);
        if ($rs->count) { ($r, $w) = IO::Select->select($rs, $ws, undef, $wait) }
        else { select(undef, undef, undef, $wait) }    # curls only
        for (@{ $w || [] }) {
            my $h = $by_fd{ fileno $_ };
            $self->_send($h) if $h->{state} ne 'done';
        }
        for (@{ $r || [] }) {
            my $h = $by_fd{ fileno $_ };
            $self->_recv($h) if $h->{state} ne 'done' && $h->{sock};
        }
        last if $opt{once};
    }
    return !grep { $_->{state} ne 'done' } @$handles;
}

# =================================================================== origin

package SFTest::Origin;

# One t/origin.pl process (or, with program => PATH, another program that
# takes the same command line).  Methods: port, addr, pid, hits, uri_hits,
# reset, stop, log_file.

use strict;
use warnings;
use POSIX qw(WNOHANG);
use Scalar::Util qw(weaken);

sub _start {
    my ($class, $t, $idx, %opt) = @_;
    my $self = bless {
        idx       => $idx,
        port_file => $t->path("origin-$idx.port"),
        log       => $t->path("origin-$idx.log"),
        err       => $t->path("origin-$idx.err"),
        t         => $t,
        host      => $t->{addr},
    }, $class;
    weaken($self->{t});
    # a port of SF_TEST_PORTS' range when it is set, else the kernel's
    my $port = $opt{port} // (defined $ENV{SF_TEST_PORTS} ? $t->_free_port : 0);
    my @cmd = ($opt{program} // ($^X, "$SFTest::REPO/t/origin.pl"),
        '--listen', "$self->{host}:$port",
        '--port-file', $self->{port_file}, '--log', $self->{log}, '--ppid', $$);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>>', $self->{err}) or POSIX::_exit(126);
        open(STDERR, '>&', \*STDOUT);
        $SIG{$_} = 'DEFAULT' for qw(PIPE INT TERM HUP);
        # Raise the fd limit to the hard limit for ~1000 connections.
        exec('sh', '-c', 'ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@"', 'sh', @cmd)
            or POSIX::_exit(127);
    }
    $self->{pid} = $pid;
    my $ready = $t->wait_for(sub {
        if (waitpid($pid, WNOHANG) == $pid) { $self->{died} = $? || 'exit 0'; return 1 }
        my ($port) = $t->read_file($self->{port_file}) =~ /^(\d+)\n/ or return 0;
        $self->{port} = $port;
        return SFTest::_can_connect($port, $self->{host});
    }, timeout => 10, what => 'origin to start');
    if (!$ready || $self->{died}) {
        my $err = $t->read_file($self->{err});
        $self->stop;
        die "origin $idx failed to start:\n$err";
    }
    return $self;
}

sub port { $_[0]{port} }
sub addr { "$_[0]{host}:$_[0]{port}" }
sub pid { $_[0]{pid} }
sub log_file { $_[0]{log} }

# Decoded /_hits: { total, uris => { "/path?query" => n }, workers =>
# { "/path?query" => its last X-SF-Worker }, aborted, connections }
# (connections includes the one asking).
sub hits {
    my ($self) = @_;
    return $self->{t}->stats('/_hits', port => $self->{port})
        // die "origin $self->{idx}: /_hits failed";
}

# Requests so far for one "/path?query" (0 if none).
sub uri_hits {
    my ($self, $uri) = @_;
    return $self->hits->{uris}{$uri} // 0;
}

sub reset {
    my ($self) = @_;
    my $r = $self->{t}->get('/_reset', port => $self->{port});
    die "origin $self->{idx}: /_reset failed" unless ($r->{status} // 0) == 200;
    return 1;
}

# bench/origin.c only: writes every held response (hold=1) now, in one
# loop; returns how many.
sub release {
    my ($self) = @_;
    my $r = $self->{t}->stats('/_release', port => $self->{port})
        // die "origin $self->{idx}: /_release failed";
    return $r->{released};
}

# TERM, wait, KILL.  Returns false (and sets {died}) if it had already
# exited on its own.
sub stop {
    my ($self) = @_;
    my $pid = delete $self->{pid} or return 1;
    if (waitpid($pid, WNOHANG) == $pid) {
        $self->{died} //= $? || 'exit 0';
        return 0;
    }
    kill 'TERM', $pid;
    for (1 .. 250) {
        return 1 if waitpid($pid, WNOHANG) == $pid;
        Time::HiRes::sleep(0.02);
    }
    kill 'KILL', $pid;
    waitpid($pid, 0);
    return 1;
}

1;
