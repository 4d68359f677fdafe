#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/bench.pl - the benchmarks behind `make bench`.
#
# One bounded run, on loopback, against one origin (bench/origin.c: a fixed
# delay, a fixed body size), of several server configurations side by
# side: plain proxy_pass, proxy_cache + proxy_cache_lock (a cacheable 1 s
# response and an uncacheable one), this module (each zone scope= that
# `nginx -t` accepts), and Varnish.  Measured for each:
#
#   herd     waves of N simultaneous identical requests, a fresh key each
#            wave (bench/herd.c, epoll, up to 10,000 connections): origin
#            requests per flight and per client request, client latency,
#            follower added latency (completion minus the leader's);
#   wrk      a hot key under steady load (200 connections, origin 10 ms)
#            and unique keys (bench/unique.lua): requests/s, latency;
#   memory   workers' peak RSS, the zone's pages; 1,000 waiting followers
#            against 1,000 requests waiting on plain proxy_pass; 1,000
#            followers of a 1 MiB response;
#   callgrind instructions per call of the module's hot paths, and per
#            request with nothing to collapse;
#   perf     where the workers' time goes while they fan out.
#
# The results, with the machine, versions and command, go to
# bench/results/YYYY-MM-DD-HOST.md as Markdown tables, also printed.
# See bench/README.md for what each number means.
#
#   perl -I t/lib bench/bench.pl [--quick] [--only sf,plain] [--no-callgrind]
#       [--no-varnish] [--no-memory] [--no-perf] [--herd 100x10,1000x3,10000x1]
#       [--duration 3] [--rounds 3] [--out FILE] [--time-limit 900]
#
#   SF_BENCH_ARGS="--quick" make bench      (make passes no arguments)

use strict;
use warnings;

# ---------------------------------------------------------- descriptors
#
# 10,000 connections need more than the usual 1024 descriptors, in the
# herd client, nginx's workers and the origin.  Raise our own limit (the
# children inherit it) by re-running ourselves under "ulimit -n" once.

use constant WANT_NOFILE => 65536;

BEGIN {
    my $soft = `sh -c 'ulimit -n' 2>/dev/null` // '';
    chomp $soft;
    # not under perl -c ($^C), which would then run the whole benchmark
    if (!$^C && !$ENV{SF_BENCH_ULIMIT} && $soft =~ /^\d+$/ && $soft < WANT_NOFILE) {
        $ENV{SF_BENCH_ULIMIT} = 1;
        require Cwd;
        require File::Basename;
        my $lib = File::Basename::dirname(Cwd::abs_path($0)) . '/../t/lib';
        exec('sh', '-c', 'ulimit -n ' . WANT_NOFILE . ' 2>/dev/null'
            . ' || ulimit -n "$(ulimit -Hn)"; exec "$@"', 'sh', $^X, "-I$lib", $0, @ARGV)
            or warn "cannot re-exec under ulimit: $!\n";
    }
}

use Digest::MD5;
use File::Basename qw(dirname);
use File::Path qw(make_path remove_tree);
use File::Spec;
use File::Temp qw(tempdir);
use Getopt::Long;
use JSON::PP;
use POSIX qw(WNOHANG strftime);
use Time::HiRes qw(time sleep);

use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my $REPO = $SFTest::REPO;
my $T0 = time;

# ---------------------------------------------------------- options

my %opt = (
    herd       => '100x10,1000x3,10000x1',
    duration   => 3,          # seconds per wrk run
    rounds     => 3,          # wrk runs per configuration, interleaved
    size       => 10000,      # body bytes, every benchmark
    hot_delay  => 10,         # origin delay (ms) under the hot key
    hot_conns  => 200,
    uniq_delay => 0,          # origin delay (ms) for unique keys
    time_limit => 900,        # hard limit for the whole run, seconds
    callgrind  => 1,
    varnish    => 1,
    memory     => 1,
    perf       => 1,
    origin     => 'c',
    workers    => 2,
);

# `make bench` takes no arguments: SF_BENCH_ARGS="--quick" make bench
my @GIVEN = @ARGV;
unshift @ARGV, split ' ', $ENV{SF_BENCH_ARGS} // '';

GetOptions(
    'quick'          => \$opt{quick},
    'only=s'         => \$opt{only},
    'herd=s'         => \$opt{herd},
    'duration=f'     => \$opt{duration},
    'rounds=i'       => \$opt{rounds},
    'size=i'         => \$opt{size},
    'workers=i'      => \$opt{workers},
    'origin=s'       => \$opt{origin},
    'out=s'          => \$opt{out},
    'time-limit=i'   => \$opt{time_limit},
    'callgrind!'     => \$opt{callgrind},
    'varnish!'       => \$opt{varnish},
    'memory!'        => \$opt{memory},
    'perf!'          => \$opt{perf},
    'help'           => \$opt{help},
) or usage();
usage() if $opt{help};

if ($opt{quick}) {
    $opt{herd} = '100x3,1000x1' if $opt{herd} eq '100x10,1000x3,10000x1';
    $opt{duration} = 2;
    $opt{rounds} = 1;
}

sub usage {
    print STDERR <<'EOT';
usage: perl -I t/lib bench/bench.pl [options]
  --quick            a short run (herds 100x3,1000x1; wrk 2 s, 1 round)
  --only a,b         only these configurations (see bench/README.md)
  --herd NxW,...     herd sizes and waves (default 100x10,1000x3,10000x1)
  --duration S       seconds per wrk run (default 3)
  --rounds R         wrk runs per configuration, interleaved (default 3)
  --size BYTES       response body size (default 10000)
  --workers N        nginx worker processes (default 2)
  --origin c|perl    bench/origin.c (default) or t/origin.pl (<= ~1000 conns)
  --no-callgrind, --no-varnish, --no-memory, --no-perf   skip those parts
  --out FILE         results file (default bench/results/DATE-HOST.md)
  --time-limit S     stop everything after S seconds (default 900)
EOT
    exit 2;
}

my @HERD = map { /^(\d+)x(\d+)$/ ? [ $1, $2 ] : usage() } split /,/, $opt{herd};

# The whole run is bounded: on the deadline, die, and the END blocks (ours
# and SFTest's) stop every process we started.
$SIG{ALRM} = sub { die "bench: time limit of $opt{time_limit} s reached\n" };
alarm($opt{time_limit});

sub note {
    printf STDERR "[%4.0fs] %s\n", time - $T0, join('', @_);
}

# ---------------------------------------------------------- scratch

# Our test directories live in a private directory (other things may
# sweep /tmp/sftest-*); those of earlier runs whose process is gone are
# removed first.  SFTest removes its own at exit unless something failed.
for my $old (glob File::Spec->tmpdir . '/sf-bench-*') {
    my ($pid) = $old =~ /sf-bench-(\d+)-/ or next;
    remove_tree($old) unless kill 0, $pid;
}
my $SCRATCH = tempdir("sf-bench-$$-XXXX", TMPDIR => 1, CLEANUP => 0);
chmod 0755, $SCRATCH;                 # varnishd's users need to get in
$ENV{TMPDIR} = $SCRATCH;

# ---------------------------------------------------------- tools

my $BIN = "$REPO/build/bench";
make_path($BIN);

# bench/herd.c and bench/origin.c, built here (no binaries in git)
SFTest::c_tool($_) for qw(herd origin);

# The module as it is now: a copy, so that a rebuild during the run does
# not change what is measured halfway.
my $MODULE_SRC = $ENV{SF_MODULE} // "$REPO/build/ngx_http_singleflight_module.so";
-f $MODULE_SRC or die "no module at $MODULE_SRC: run make build\n";
my $MODULE = "$BIN/ngx_http_singleflight_module.so";
system('cp', $MODULE_SRC, "$MODULE.tmp") == 0 && rename("$MODULE.tmp", $MODULE)
    or die "cannot copy the module to $MODULE\n";

my $NGINX = $ENV{SF_NGINX} // $ENV{TEST_NGINX_BINARY} // '/usr/sbin/nginx';
my $HAVE_WRK = have('wrk');
my $HAVE_VARNISH = $opt{varnish} && -x '/usr/sbin/varnishd';
my $HAVE_VALGRIND = have('valgrind') && have('callgrind_annotate');

sub have { system("command -v $_[0] >/dev/null 2>&1") == 0 }

# ---------------------------------------------------------- the origin

# One origin for everything, owned by this SFTest object: its teardown
# stops the origin and every nginx started through it.
my $main = SFTest->new(module => $MODULE);
my $origin;
if ($opt{origin} eq 'perl') {
    $origin = $main->start_origin;
}
else {
    $origin = $main->start_origin(program => "$BIN/origin");    # t/origin.pl's command line
}
my $ORIGIN = $origin->addr;
note("origin ($opt{origin}) on $ORIGIN");

sub origin_total { $origin->hits->{total} }

# ---------------------------------------------------------- configurations
#
# Each configuration is one server instance of its own (its own nginx,
# or varnishd), so that its peak RSS is its own.  Fields:
#
#   name, label   short name (--only), and what the tables say
#   server        'nginx' or 'varnish'
#   module        1: load the module, with a zone of "scope"
#   scope         value for singleflight_zone scope=; a variant whose
#                 scope= nginx -t rejects is skipped with a line saying so
#   location      body of "location /"
#   http          extra http{} directives
#   query         what the origin is asked to add (Cache-Control)
#   collapses     1: origin requests per flight should be exactly 1
#   slow          proxy_cache_lock on an uncacheable response: a wave
#                 lasts proxy_cache_lock_timeout (5 s), so fewer waves
#   runs          which benchmarks: herd, hot, unique
#
# To add one (say a new scope=), add an entry; nothing else changes.

my $CACHEABLE = 'hdr=Cache-Control:%20max-age%3D1';
my $UNCACHEABLE = 'hdr=Cache-Control:%20no-cache';

my $SF_LOCATION = <<'EOT';
            singleflight          sf;
            singleflight_max_size 2m;
            singleflight_timeout  60s;
            proxy_pass            http://origin;
EOT

my $CACHE_HTTP = 'proxy_cache_path %%TESTDIR%%/cache levels=1:2 keys_zone=pc:32m '
    . 'max_size=2g inactive=60s use_temp_path=off;';
my $CACHE_LOCATION = <<'EOT';
            proxy_cache       pc;
            proxy_cache_lock  on;
            proxy_cache_valid 200 1s;
            proxy_pass        http://origin;
EOT

my @CONFIGS = (
    { name => 'plain', label => 'plain proxy_pass', server => 'nginx',
      location => "proxy_pass http://origin;\n", query => $CACHEABLE,
      runs => [qw(herd hot unique)] },
    { name => 'cache', label => 'proxy_cache_lock, cacheable 1 s', server => 'nginx',
      http => $CACHE_HTTP, location => $CACHE_LOCATION, query => $CACHEABLE,
      collapses => 1, runs => [qw(herd hot unique)] },
    { name => 'cache-nc', label => 'proxy_cache_lock, uncacheable', server => 'nginx',
      http => $CACHE_HTTP, location => $CACHE_LOCATION, query => $UNCACHEABLE,
      slow => 1, runs => [qw(herd hot)] },
    { name => 'sf', label => 'singleflight scope=process', server => 'nginx',
      module => 1, scope => 'process', default_scope => 1, location => $SF_LOCATION,
      query => $CACHEABLE, collapses => 1, memory_baseline => 1,
      runs => [qw(herd hot unique)] },
    { name => 'sf-nc', label => 'singleflight scope=process, uncacheable',
      server => 'nginx', module => 1, scope => 'process', default_scope => 1,
      location => $SF_LOCATION, query => $UNCACHEABLE, collapses => 1,
      runs => [qw(herd)] },
    { name => 'sf-own', label => 'singleflight scope=process, singleflight_lone own',
      server => 'nginx', module => 1, scope => 'process', default_scope => 1,
      location => "            singleflight_lone     own;\n$SF_LOCATION",
      query => $CACHEABLE, collapses => 1, runs => [qw(herd hot unique)] },
    { name => 'sf-fetch', label => 'singleflight scope=process, singleflight_lone fetch',
      server => 'nginx', module => 1, scope => 'process', default_scope => 1,
      location => "            singleflight_lone     fetch;\n$SF_LOCATION",
      query => $CACHEABLE, collapses => 1, runs => [qw(herd hot unique)] },
    { name => 'sf-numa', label => 'singleflight scope=numa', server => 'nginx',
      module => 1, scope => 'numa', location => $SF_LOCATION, query => $CACHEABLE,
      collapses => 1, runs => [qw(herd hot unique)] },
    { name => 'sf-worker', label => 'singleflight scope=worker', server => 'nginx',
      module => 1, scope => 'worker', location => $SF_LOCATION, query => $CACHEABLE,
      collapses => 'worker', runs => [qw(herd hot unique)] },
    { name => 'varnish', label => 'Varnish, cacheable 1 s', server => 'varnish',
      query => $CACHEABLE, collapses => 1, runs => [qw(herd hot unique)] },
    { name => 'varnish-nc', label => 'Varnish, uncacheable', server => 'varnish',
      query => $UNCACHEABLE, runs => [qw(herd hot)] },
);

# "return 200" from memory, on the same nginx as "sf": the hot-key ceiling
my %MEMORY = (name => 'memory', label => 'return 200 from memory (sf\'s nginx)',
              path => '/memory');

my @SKIPPED;        # [name, why]

if ($opt{only}) {
    my %want = map { $_ => 1 } split /,/, $opt{only};
    @CONFIGS = grep { $want{ $_->{name} } } @CONFIGS;
}

# ---------------------------------------------------------- nginx configs

my $NOFILE = do { my $n = `sh -c 'ulimit -n'`; chomp $n; $n =~ /^\d+$/ ? $n : 20000 };
# Enough for the biggest herd in one worker, clients and upstream
# connections both: nginx touches every connection slot at start-up
# (~430 bytes each), so more would only inflate the RSS figures.
my $MAX_N = (sort { $b <=> $a } 1000, map { $_->[0] } @HERD)[0];
my $WORKER_CONNECTIONS = 2 * $MAX_N + 2048;
$WORKER_CONNECTIONS = int($NOFILE * 0.9) if $WORKER_CONNECTIONS > $NOFILE * 0.9;

# The memory location's body: the size of the origin's, from the same
# pattern.  An nginx string is at most 4 KiB, so the body is cut into
# pieces held by constant map{} values (no copy when read) and joined by
# "return 200".
my $MEMORY_BODY = SFTest::origin_body(1, '/memory', $opt{size});
my @MEMORY_PIECES = map { (my $p = $_) =~ s/\n/\\n/g; $p } unpack('(a3000)*', $MEMORY_BODY);
my $MEMORY_MAPS = join("\n    ", map {
    "map \$host \$sf_bench_body$_ { default \"$MEMORY_PIECES[$_]\"; }" } 0 .. $#MEMORY_PIECES);
my $MEMORY_RETURN = join('', map { "\$sf_bench_body$_" } 0 .. $#MEMORY_PIECES);

# nginx.conf for a configuration.  Options: single => 1 (one process in
# the foreground, for callgrind), worker_connections, extra (more text in
# the server block).
sub nginx_conf {
    my ($c, %o) = @_;
    my $workers = $o{workers} // $opt{workers};
    my $wc = $o{worker_connections} // $WORKER_CONNECTIONS;
    my $extra = $o{extra} // '';
    my $user = $> == 0 ? 'user root;' : '';
    my $main_ctx = $o{single}
        ? "daemon off;\nmaster_process off;\nworker_processes 1;"
        : "daemon on;\nmaster_process on;\nworker_processes $workers;";
    my ($load, $zone, $stats, $memory) = ('') x 4;
    # Every nginx sends an X-SF header (herd.c tells the module's leader
    # by it), so that wrk's runs compare servers that send as much.
    my $xsf = 'add_header X-SF - always;';
    if ($c->{module}) {
        $load = "load_module $MODULE;";
        $zone = 'singleflight_zone zone=sf:32m' . ($c->{zone_param} // '') . ';';
        $stats = 'location = /singleflight_stats { singleflight_stats; }';
        $xsf = 'add_header X-SF $singleflight_status always;';
    }
    my $http = $c->{http} // '';
    if ($c->{memory_baseline}) {
        $memory = "location = $MEMORY{path} {\n"
            . "            default_type text/plain;\n"
            . "            return 200 \"$MEMORY_RETURN\";\n        }";
        $http .= "\n    $MEMORY_MAPS";
    }
    my $location = $c->{location} =~ s/^\s*/            /mgr;
    return <<"EOT";
$load
$user
$main_ctx
worker_rlimit_nofile $NOFILE;
pid %%TESTDIR%%/nginx.pid;
error_log %%TESTDIR%%/error.log warn;

events {
    worker_connections $wc;
}

http {
    access_log off;
    client_body_temp_path %%TESTDIR%%/client_body_temp;
    proxy_temp_path       %%TESTDIR%%/proxy_temp;
    fastcgi_temp_path     %%TESTDIR%%/fastcgi_temp;
    uwsgi_temp_path       %%TESTDIR%%/uwsgi_temp;
    scgi_temp_path        %%TESTDIR%%/scgi_temp;

    upstream origin {
        server $ORIGIN;
        keepalive 256;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";

    $zone
    $http

    server {
        listen 127.0.0.1:%%PORT%% reuseport backlog=4096;
        add_header X-Worker \$pid always;
        $xsf

        location / {
$location
        }
        $stats
        $memory
        $extra
    }
}
EOT
}

# Decides the scope= parameter of each module configuration: the scope
# is used only if nginx -t accepts it.  The default scope (process) falls
# back to no parameter at all, which is the same thing.
sub probe_scopes {
    my @keep;
    for my $c (@CONFIGS) {
        if (!$c->{module}) { push @keep, $c; next }
        my $t = SFTest->new(module => $MODULE);
        my $ok;
        for my $param (" scope=$c->{scope}", $c->{default_scope} ? ('') : ()) {
            $c->{zone_param} = $param;
            $t->write_config(nginx_conf($c));
            my ($good, $out) = $t->test_config;
            if ($good) { $ok = 1; last }
            $c->{probe_error} //= (grep { /\[emerg\]/ } split /\n/, $out)[0] // $out;
        }
        $t->stop;
        if ($ok) {
            $c->{label} .= ' (default, no scope=)' if $c->{zone_param} eq '';
            push @keep, $c;
        }
        else {
            my $why = "nginx -t rejects scope=$c->{scope}: "
                . ($c->{probe_error} =~ s/^.*?\[emerg\]\s*//r =~ s/\s+$//r);
            push @SKIPPED, [ $c->{name}, $why ];
            note("skip $c->{name}: $why");
        }
    }
    @CONFIGS = @keep;
}

# ---------------------------------------------------------- instances

# Starts the server of a configuration; returns false (with a line in
# @SKIPPED) when it cannot.
sub start_instance {
    my ($c) = @_;
    if ($c->{server} eq 'varnish') {
        return start_varnish($c);
    }
    my $t = SFTest->new(module => $MODULE);
    $t->write_config(nginx_conf($c));
    if (!$t->start(may_fail => 1)) {
        my $err = $t->error_log_since(0) || $t->read_file('nginx-cmd.out');
        push @SKIPPED, [ $c->{name}, "nginx did not start: " . (split /\n/, $err)[-1] ];
        note("skip $c->{name}: nginx did not start\n$err");
        $t->stop;
        return 0;
    }
    $c->{t} = $t;
    $c->{port} = $t->port(0);
    return 1;
}

sub stop_instance {
    my ($c) = @_;
    if ($c->{server} eq 'varnish') {
        stop_varnish($c);
    }
    elsif ($c->{t}) {
        $c->{t}->stop;
    }
}

# Pids whose peak RSS counts for an instance: nginx's workers, or
# varnishd's child (the cache process).
sub server_pids {
    my ($c) = @_;
    return $c->{t}->worker_pids if $c->{server} eq 'nginx' && $c->{t};
    if ($c->{server} eq 'varnish' && $c->{vpid}) {
        return map { $_->{pid} } SFTest::_children($c->{vpid});
    }
    return ();
}

my %VARNISH_PIDS;    # pid => 1, for the END block

sub start_varnish {
    my ($c) = @_;
    if (!$HAVE_VARNISH) {
        push @SKIPPED, [ $c->{name}, $opt{varnish} ? 'varnishd not found (apt-get install varnish)'
                                                   : '--no-varnish' ];
        return 0;
    }
    my $t = SFTest->new(module => $MODULE);    # for a directory and a port
    my ($host, $oport) = split /:/, $ORIGIN;
    $t->write_file('default.vcl', <<"EOT");
vcl 4.1;
# default coalescing: the builtin VCL, only the backend is ours
backend origin {
    .host = "$host";
    .port = "$oport";
    .connect_timeout = 5s;
    .first_byte_timeout = 60s;
}
EOT
    my $port = $t->port(0);
    my @cmd = ('/usr/sbin/varnishd', '-F', '-n', $t->path('varnish'),
        '-a', "127.0.0.1:$port", '-f', $t->path('default.vcl'), '-s', 'malloc,64m',
        # requests beyond the idle threads queue instead of being dropped
        '-p', 'thread_queue_limit=20000', '-p', 'listen_depth=4096');
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $t->path('varnishd.log'));
        open(STDERR, '>&', \*STDOUT);
        exec(@cmd) or POSIX::_exit(127);
    }
    $VARNISH_PIDS{$pid} = 1;
    my $up = $t->wait_for(sub {
        return 1 if waitpid($pid, WNOHANG) == $pid;
        return SFTest::_can_connect($port);
    }, timeout => 30, what => 'varnishd', quiet => 1);
    if (!$up || !SFTest::_alive($pid)) {
        my $log = $t->read_file('varnishd.log');
        push @SKIPPED, [ $c->{name}, 'varnishd did not start: ' . ((split /\n/, $log)[-1] // '') ];
        note("skip $c->{name}: varnishd did not start:\n$log");
        kill 'KILL', $pid;
        waitpid($pid, 0);
        delete $VARNISH_PIDS{$pid};
        return 0;
    }
    @$c{qw(t port vpid)} = ($t, $port, $pid);
    return 1;
}

sub stop_varnish {
    my ($c) = @_;
    my $pid = delete $c->{vpid} or return;
    kill_varnishd($pid);
}

# TERM (the manager stops its child), 5 s, then KILL
sub kill_varnishd {
    my ($pid) = @_;
    kill 'TERM', $pid;
    for (1 .. 250) {
        last if waitpid($pid, WNOHANG) == $pid;
        sleep 0.02;
    }
    if (SFTest::_alive($pid)) { kill 'KILL', $pid; waitpid($pid, 0) }
    delete $VARNISH_PIDS{$pid};
}

END {
    local $?;
    kill_varnishd($_) for keys %VARNISH_PIDS;
}

# ---------------------------------------------------------- /proc

sub proc_status {
    my ($pid, $field) = @_;
    open(my $fh, '<', "/proc/$pid/status") or return 0;
    while (<$fh>) {
        return $1 if /^$field:\s+(\d+)\s+kB/;
    }
    return 0;
}

# sum over pids of VmRSS or VmHWM, in KiB
sub rss_kib {
    my ($field, @pids) = @_;
    my $sum = 0;
    $sum += proc_status($_, $field) for @pids;
    return $sum;
}

# ---------------------------------------------------------- zone stats

# The singleflight_stats JSON, summed over every object in it that has
# pages_used (one zone, or one instance per NUMA node or worker).
sub zone_stats {
    my ($c) = @_;
    return undef unless $c->{module} && $c->{t};
    my $json = $c->{t}->stats('/singleflight_stats?diagnostics=1', port => $c->{port}, timeout => 5)
        or return undef;
    my %sum;
    my @todo = ($json);
    while (my $node = shift @todo) {
        if (ref $node eq 'HASH') {
            if (exists $node->{pages_used}) {
                for my $k (qw(pages_used pages_baseline pages_free waiters in_flight
                              flights followers served no_memory not_shared timeouts)) {
                    $sum{$k} += $node->{$k} // 0;
                }
                $sum{instances}++;
                next;
            }
            push @todo, values %$node;
        }
        elsif (ref $node eq 'ARRAY') {
            push @todo, @$node;
        }
    }
    return $sum{instances} ? \%sum : undef;
}

sub track_pages {
    my ($c) = @_;
    my $s = zone_stats($c) or return;
    $c->{pages_peak} = $s->{pages_used}
        if !defined $c->{pages_peak} || $s->{pages_used} > $c->{pages_peak};
    return $s;
}

# ---------------------------------------------------------- herd

# Runs bench/herd.c in the background and waits for it, calling $poll
# every poll_interval (50 ms) meanwhile.  Returns the parsed results.
sub run_herd {
    my (%a) = @_;
    my $out = $main->path('herd.out');
    my @cmd = ("$BIN/herd", '-p', $a{port}, '-u', $a{path}, '-n', $a{n},
        '-t', $a{timeout_ms} // 60000, '-c', 'X-SF', '-c', 'X-Worker');
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDOUT, '>', $out) or POSIX::_exit(126);
        exec(@cmd) or POSIX::_exit(127);
    }
    my $deadline = time + ($a{timeout_ms} // 60000) / 1000 + 60;
    my $last_poll = 0;
    while (waitpid($pid, WNOHANG) != $pid) {
        if (time > $deadline) {
            kill 'KILL', $pid;
            waitpid($pid, 0);
            die "herd did not finish\n";
        }
        if ($a{poll} && time - $last_poll >= ($a{poll_interval} // 0.05)) {
            $a{poll}->();
            $last_poll = time;
        }
        sleep 0.01;
    }
    my @res;
    my %summary;
    open(my $fh, '<', $out) or die "no herd output: $!";
    while (<$fh>) {
        if (/^c (\d+) (\d+) (\d+) (\S+) (-?\d+) (-?\d+) (\S+) (\S+) (\S+)/) {
            push @res, { status => $2, len => $3, hash => $4, sent => $5 / 1000,
                done => $6 / 1000, err => $7 eq '-' ? undef : $7,
                sf => $8, worker => $9 };
        }
        elsif (/^summary (.*)/) {
            %summary = map { split /=/, $_, 2 } split ' ', $1;
        }
    }
    return { res => \@res, summary => \%summary };
}

# One wave: N requests on a fresh key.  Adds the wave's numbers to $acc.
sub herd_wave {
    my ($c, $n, $wave, $delay, $acc) = @_;
    my $path = "/herd/$$-$c->{name}-$n-$wave?delay=$delay&size=$opt{size}&$c->{query}";
    my $before = origin_total();
    my $h = run_herd(port => $c->{port}, path => $path, n => $n,
        timeout_ms => ($c->{slow} ? 30000 : 20000) + $delay,
        poll => $c->{module} ? sub { track_pages($c) } : undef);
    my $hits = origin_total() - $before;

    my @ok = grep { !$_->{err} && $_->{status} == 200 && $_->{len} == $opt{size} } @{ $h->{res} };
    my %hashes = map { $_->{hash} => 1 } @ok;
    $acc->{requests} += $n;
    $acc->{ok} += @ok;
    $acc->{errors} += $n - @ok;
    $acc->{waves}++;
    $acc->{origin} += $hits;
    push @{ $acc->{per_wave} }, $hits;
    push @{ $acc->{latency} }, map { $_->{done} - $_->{sent} } @ok;
    $acc->{distinct} += keys %hashes;

    # the leader: the module says who it is; elsewhere the first response
    my ($leader) = grep { $_->{sf} eq 'LEADER' } @ok;
    ($leader) = sort { $a->{done} <=> $b->{done} } @ok unless $leader;
    if ($leader) {
        for my $r (@ok) {
            next if $r == $leader;
            my $added = $r->{done} - $leader->{done};
            push @{ $acc->{added} }, $added;
            next if $r->{worker} eq '-';
            push @{ $acc->{ $r->{worker} eq $leader->{worker} ? 'added_same' : 'added_other' } },
                $added;
        }
    }
    my %errs;
    $errs{ $_->{err} // "status $_->{status}" }++ for grep { !($_->{status} == 200 && !$_->{err}) } @{ $h->{res} };
    $acc->{error_kinds}{$_} += $errs{$_} for keys %errs;
    note(sprintf('herd %-10s N=%-5d wave %d: origin %d, ok %d, p99 %s ms, connect %s ms, send %s ms',
        $c->{name}, $n, $wave, $hits, scalar @ok,
        fmt(pct([ map { $_->{done} - $_->{sent} } @ok ], 99)),
        $h->{summary}{connect_ms} // '?', $h->{summary}{send_ms} // '?'));
}

sub herd_delay { $_[0] >= 5000 ? 1000 : 200 }

sub run_herds {
    my ($c) = @_;
    for my $plan (@HERD) {
        my ($n, $waves) = @$plan;
        if ($opt{origin} eq 'perl' && $n > 900 && !$c->{collapses}) {
            push @SKIPPED, [ "$c->{name} N=$n", "the Perl origin cannot take $n connections" ];
            next;
        }
        $waves = 1 if $c->{slow} && $n >= 1000;
        $waves = 2 if $c->{slow} && $waves > 2;
        my $acc = $c->{herd}{$n} //= { n => $n };
        for my $w (1 .. $waves) {
            herd_wave($c, $n, $w, herd_delay($n), $acc);
        }
    }
}

# ---------------------------------------------------------- wrk

sub run_wrk {
    my (%a) = @_;
    my @cmd = ('wrk', '-t', 2, '-c', $a{conns}, '-d', "$opt{duration}s", '--timeout', '10s',
        '-s', $a{script}, $a{url}, '--', @{ $a{args} // [] });
    my $before = origin_total();
    open(my $fh, '-|', @cmd) or die "wrk: $!";
    my $out = do { local $/; <$fh> };
    close($fh);
    my $hits = origin_total() - $before;
    my ($json) = $out =~ /^WRKJSON (\{.*\})$/m or die "no WRKJSON from wrk:\n$out";
    my $w = decode_json($json);
    $w->{rps} = $w->{requests} / ($w->{duration_us} / 1e6);
    $w->{origin} = $hits;
    $w->{errors} = $w->{connect} + $w->{read} + $w->{write} + $w->{status} + $w->{timeout};
    return $w;
}

sub wrk_job {
    my ($c, $kind, $round) = @_;
    my $base = "http://127.0.0.1:$c->{port}";
    my $w;
    if ($kind eq 'hot') {
        my $path = $c->{path}
            // "/hot/$$-$c->{name}-$round?delay=$opt{hot_delay}&size=$opt{size}&$c->{query}";
        $w = run_wrk(url => "$base$path", conns => $opt{hot_conns},
            script => "$REPO/bench/hot.lua");
    }
    else {
        $w = run_wrk(url => "$base/", conns => $opt{hot_conns},
            script => "$REPO/bench/unique.lua",
            args => [ "/u/$$-$c->{name}-$round", "delay=$opt{uniq_delay}&size=$opt{size}&$c->{query}" ]);
    }
    push @{ $c->{wrk}{$kind} }, $w;
    note(sprintf('wrk  %-10s %-6s round %d: %8.0f req/s, p99 %.1f ms, origin/request %.4f, errors %d',
        $c->{name}, $kind, $round, $w->{rps}, $w->{p99_us} / 1000,
        $w->{requests} ? $w->{origin} / $w->{requests} : 0, $w->{errors}));
}

# ---------------------------------------------------------- numbers

sub pct { SFTest::pct(@_) }

sub fmt {
    my ($v, $f) = @_;
    return '—' unless defined $v;
    return sprintf($f // '%.1f', $v);
}

# the median wrk run (by requests/s) of a configuration
sub wrk_median {
    my ($c, $kind) = @_;
    my @runs = sort { $a->{rps} <=> $b->{rps} } @{ $c->{wrk}{$kind} // [] } or return undef;
    return $runs[ $#runs / 2 ];
}

# ---------------------------------------------------------- memory tests

# 1,000 waiting followers against 1,000 requests waiting on plain
# proxy_pass: RSS of fresh workers before, and while all of them wait.
sub memory_waiters {
    my ($sf_conf, $plain_conf, $n) = @_;
    my %r;
    for my $c ($plain_conf, $sf_conf) {
        my $m = { %$c, name => "$c->{name}-mem", t => undef, pages_peak => undef };
        start_instance($m) or next;
        my @pids = server_pids($m);
        sleep 0.2;
        my $before = rss_kib('VmRSS', @pids);
        my $base_stats = zone_stats($m);
        my $origin_before = origin_total();
        my $delay = 2500;
        my ($during, $seen, $stats);
        run_herd(port => $m->{port}, n => $n, timeout_ms => 30000,
            path => "/wait/$$-$m->{name}?delay=$delay&size=$opt{size}&$c->{query}",
            poll => sub {
                return if $seen;
                # everybody is in: followers registered, or plain
                # requests all at the origin
                my $hits = $origin->hits;
                my $in = $m->{module} ? ((zone_stats($m) // {})->{waiters} // 0) + 1
                                      : $hits->{inflight} // $hits->{connections} - 1;
                return if $in < $n;
                sleep 0.2;
                $during = rss_kib('VmRSS', @pids);
                $stats = zone_stats($m);
                $seen = 1;
            });
        my $key = $m->{module} ? 'sf' : 'plain';
        $r{$key} = {
            before => $before, during => $during, n => $n,
            per_conn => defined $during ? ($during - $before) / $n : undef,
            pages => $stats ? $stats->{pages_used} - ($base_stats // $stats)->{pages_used} : undef,
            origin => origin_total() - $origin_before,
        };
        stop_instance($m);
    }
    return \%r;
}

# 1,000 followers of a 1 MiB response: the workers' RSS must not grow by
# anything like 1,000 copies.
sub memory_big {
    my ($sf_conf, $n) = @_;
    my $size = 1 << 20;
    my $m = { %$sf_conf, name => 'sf-1mib', t => undef, pages_peak => undef };
    start_instance($m) or return undef;
    my @pids = server_pids($m);
    sleep 0.2;
    my $before = rss_kib('VmRSS', @pids);
    my $shmem_before = rss_kib('RssShmem', @pids);
    my $peak = $before;
    my $origin_before = origin_total();
    my $h = run_herd(port => $m->{port}, n => $n, timeout_ms => 60000,
        path => "/big/$$?delay=500&size=$size&$sf_conf->{query}", poll_interval => 0.01,
        poll => sub {
            my $now = rss_kib('VmRSS', @pids);
            $peak = $now if $now > $peak;
        });
    my $hwm = rss_kib('VmHWM', @pids);
    # the zone's pages stay resident in a worker once it touched them
    my $shmem = rss_kib('RssShmem', @pids) - $shmem_before;
    my @ok = grep { !$_->{err} && $_->{status} == 200 && $_->{len} == $size } @{ $h->{res} };
    my %hashes = map { $_->{hash} => 1 } @ok;
    my $r = {
        n => $n, size => $size, before => $before, peak => ($hwm > $peak ? $hwm : $peak),
        ok => scalar @ok, distinct => scalar keys %hashes,
        origin => origin_total() - $origin_before, shmem => $shmem,
    };
    stop_instance($m);
    return $r;
}

# ---------------------------------------------------------- callgrind

my @CG_FUNCTIONS = (
    [ 'ngx_http_singleflight_handler', 'precontent handler, every request' ],
    [ 'ngx_http_singleflight_key', 'evaluate and hash the key' ],
    [ 'ngx_http_singleflight_join', 'join or start a flight (locks the zone)' ],
    [ 'ngx_http_singleflight_lookup_locked', 'key lookup in the rbtree' ],
    [ 'ngx_http_singleflight_join_locked', 'register a follower in the node' ],
    [ 'ngx_http_singleflight_create_locked', 'insert a new flight' ],
    [ 'ngx_http_singleflight_wait', 'register a follower in its worker group' ],
    [ 'ngx_http_singleflight_header_filter', 'leader: capture the header' ],
    [ 'ngx_http_singleflight_body_filter', 'leader: capture the body' ],
    [ 'ngx_http_singleflight_finish', 'leader: end the flight, wake' ],
    [ 'ngx_http_singleflight_group_wake', 'post the waiters of a worker' ],
    [ 'ngx_http_singleflight_notify', 'datagrams to other workers' ],
    [ 'ngx_http_singleflight_wait_handler', 'a woken follower' ],
    [ 'ngx_http_singleflight_resume', 'follower: take the outcome' ],
    [ 'ngx_http_singleflight_send', 'fan-out to one follower (header + body)' ],
    [ 'ngx_http_singleflight_cleanup', 'request end: release' ],
);

# nginx in one process under callgrind.  Three workloads, each dumped as
# a profile part of its own (callgrind_control --dump, on our pid only):
#   herd          waves of N identical requests on fresh keys: the
#                 follower paths (join, wait, fan-out);
#   unique-sf     requests on unique keys through singleflight: every
#                 request leads a flight of its own;
#   unique-plain  the same through a plain proxy_pass location of the same
#                 nginx: the difference is the module's cost per request.
sub callgrind {
    my ($sf_conf, $waves, $n, $unique) = @_;
    my $t = SFTest->new(module => $MODULE);
    my $c = { %$sf_conf, name => 'sf-callgrind' };
    $t->write_config(nginx_conf($c, single => 1, worker_connections => 1024,
        extra => "location /plain/ { proxy_pass http://origin; }"));
    my $port = $t->port(0);
    my $out = $t->path('callgrind.out');
    my @cmd = ('valgrind', '--tool=callgrind', '--trace-children=yes',
        "--callgrind-out-file=$out.%p", $NGINX, '-p', $t->testdir . '/',
        '-c', $t->path('nginx.conf'), '-e', $t->path('error.log'));
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $t->path('valgrind.log'));
        open(STDERR, '>&', \*STDOUT);
        exec(@cmd) or POSIX::_exit(127);
    }
    my $up = $t->wait_for(sub { SFTest::_can_connect($port) || waitpid($pid, WNOHANG) == $pid },
        timeout => 90, what => 'nginx under callgrind', quiet => 1);
    my %r = (waves => $waves, n => $n, unique => $unique,
        cmd => 'valgrind --tool=callgrind --trace-children=yes nginx '
             . '(master_process off, worker_processes 1)');
    my $q = "size=$opt{size}&$sf_conf->{query}";
    my $control = sub {
        system("callgrind_control --dump=$_[0] $pid >/dev/null 2>&1") == 0
            or $r{error} //= "callgrind_control --dump=$_[0] failed";
    };
    if ($up && SFTest::_alive($pid)) {
        # warm-up (first-request allocations), then counters to zero
        $t->herd(port => $port, timeout => 60, paths => [
            map { ("/warm/$$-$_?$q", "/plain/warm-$$-$_?$q") } 1 .. 5 ]);
        system("callgrind_control --zero $pid >/dev/null 2>&1");

        my $before = origin_total();
        for my $w (1 .. $waves) {
            my $h = run_herd(port => $port, n => $n, timeout_ms => 60000,
                path => "/cg/$$-$w?delay=300&$q");
            $r{ok} += grep { !$_->{err} && $_->{status} == 200 } @{ $h->{res} };
        }
        $r{origin} = origin_total() - $before;
        $control->('herd');
        # URIs of one length: nginx parses and matches them at one cost
        for my $kind ([ 'unique-sf', '/share/u' ], [ 'unique-plain', '/plain/u' ]) {
            my $res = $t->herd(port => $port, timeout => 120,
                paths => [ map { "$kind->[1]-$$-$_?$q" } 1 .. $unique ]);
            $r{"$kind->[0]_ok"} = grep { ($_->{status} // 0) == 200 } @$res;
            $control->($kind->[0]);
        }
    }
    else {
        $r{error} = 'nginx did not start under valgrind';
    }
    kill 'QUIT', $pid;
    $t->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, timeout => 60, quiet => 1)
        or do { kill 'KILL', $pid; waitpid($pid, 0) };

    # the parts, in the order dumped (the last one, at exit, is ignored)
    my @parts = sort { (-M $b) <=> (-M $a) || $a cmp $b } grep { /\.\d+\.\d+$/ } glob "$out.*";
    my %files;
    for my $f (@parts) {
        my $text = do { open(my $fh, '<', $f); local $/; <$fh> };
        my ($trigger) = $text =~ /^desc: Trigger: (.*)$/m;
        for my $name (qw(herd unique-sf unique-plain)) {
            $files{$name} = $f if ($trigger // '') =~ /\b\Q$name\E\b/;
        }
    }
    if (!$files{herd}) {
        $r{error} //= 'no callgrind dumps: ' . ((split /\n/, $t->read_file('valgrind.log'))[-1] // '');
        return \%r;
    }
    for my $name (sort keys %files) {
        $r{parts}{$name} = callgrind_part($files{$name});
    }
    return \%r;
}

# One profile part: per function, calls (from the calls= lines),
# inclusive Ir (callgrind_annotate --inclusive=yes, cross-checked with
# the calls= costs) and self Ir (callgrind_annotate); and the total.
sub callgrind_part {
    my ($file) = @_;
    my %p = (file => $file);
    my %calls = callgrind_calls($file);
    for my $mode ('incl', 'self') {
        # (callgrind_annotate warns about the profile's missing line numbers)
        open(my $saved, '>&', \*STDERR) or die "dup: $!";
        open(STDERR, '>', '/dev/null');
        my $ok = open(my $fh, '-|', 'callgrind_annotate', ($mode eq 'incl' ? '--inclusive=yes' : ()),
            '--threshold=100', '--auto=no', $file);
        open(STDERR, '>&', $saved);
        $ok or die "callgrind_annotate: $!";
        while (my $line = <$fh>) {
            $p{total} //= $1 =~ tr/,//dr if $line =~ /^\s*([\d,]+)\s.*PROGRAM TOTALS/;
            # "Ir (pct)  file:function [object]"; a function may also show
            # up as "???:function" for its inlined parts, a subset: the
            # first (largest) line is the function's
            next unless $line =~ /^\s*([\d,]+)\s+(?:\([\s\d.]+%\)\s+)?(\S*?):(\w+)(?:\s|$)/;
            my ($ir, $file_part, $fn) = ($1 =~ tr/,//dr, $2, $3);
            push @{ $p{excerpt} }, $line =~ s/\s+\[[^\]]*\]\s*$//r =~ s/\s+$//r
                if $mode eq 'incl' && $fn =~ /singleflight/ && !exists $p{$mode}{$fn};
            $p{$mode}{$fn} //= $ir;
        }
        close($fh);
    }
    $p{calls} = { map { $_ => $calls{$_}{calls} } keys %calls };
    $p{calls_incl} = { map { $_ => $calls{$_}{incl} } keys %calls };
    return \%p;
}

# Sums "calls=" lines per called function in a callgrind profile; the
# line after each holds the call's inclusive cost.
sub callgrind_calls {
    my ($file) = @_;
    my (%names, %calls, $cfn, $pending);
    open(my $fh, '<', $file) or return ();
    while (my $line = <$fh>) {
        if ($pending) {
            my (undef, $ir) = split ' ', $line;
            $calls{$cfn}{incl} += $ir // 0;
            $pending = 0;
            next;
        }
        if ($line =~ /^c?fn=\((\d+)\)(?: (.*))?$/) {
            my ($id, $name) = ($1, $2);
            $names{$id} = $name if defined $name;
            $cfn = $names{$id} if $line =~ /^cfn/;
        }
        elsif ($line =~ /^cfn=(.*)$/) {
            $cfn = $1;
        }
        elsif ($line =~ /^calls=(\d+)/ && defined $cfn) {
            $calls{$cfn}{calls} += $1;
            $pending = 1;
        }
    }
    return %calls;
}

# ---------------------------------------------------------- perf

# Where the workers' CPU time goes while they fan out: perf record on the
# workers of a fresh singleflight nginx during a few herds, then the share
# of samples by object and by symbol, and the system calls (with their
# kernel callees).
sub perf_herd {
    my ($sf_conf, $waves, $n) = @_;
    my $m = { %$sf_conf, name => 'sf-perf', t => undef, pages_peak => undef };
    start_instance($m) or return undef;
    my @pids = server_pids($m);
    my $data = $m->{t}->path('perf.data');
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $m->{t}->path('perf.log'));
        open(STDERR, '>&', \*STDOUT);
        exec('perf', 'record', '-g', '-o', $data, '-p', join(',', @pids)) or POSIX::_exit(127);
    }
    sleep 0.5;
    for my $w (1 .. $waves) {
        run_herd(port => $m->{port}, n => $n, timeout_ms => 30000,
            path => "/perf/$$-$w?delay=200&size=$opt{size}&$sf_conf->{query}");
    }
    kill 'INT', $pid;
    $m->{t}->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, timeout => 30, quiet => 1)
        or do { kill 'KILL', $pid; waitpid($pid, 0) };
    my %r = (waves => $waves, n => $n);
    my $report = sub {
        my $cmd = join(' ', 'perf report -i', $data, '--stdio', @_, '2>/dev/null');
        return grep { /\S/ && !/^#/ } split /\n/, `$cmd`;
    };
    $r{dso} = [ $report->('--no-children --sort dso -g none') ];
    $r{sym} = [ ($report->('--no-children --sort dso,sym -g none'))[ 0 .. 14 ] ];
    $r{sys} = [ grep { /\[k\] (?:__x64_sys_\w+|tcp_sendmsg|tcp_close)\s*$/ }
                $report->('--children --sort sym -g none') ];
    splice(@{ $r{sys} }, 10) if @{ $r{sys} } > 10;
    ($r{samples}) = $m->{t}->read_file('perf.log') =~ /\((\d+) samples\)/;
    stop_instance($m);
    return $r{dso} && @{ $r{dso} } ? \%r : undef;
}

# ---------------------------------------------------------- the run

probe_scopes();
note('configurations: ', join(', ', map { $_->{name} } @CONFIGS));

my @RUNNING;
for my $c (@CONFIGS) {
    push @RUNNING, $c if start_instance($c);
}

# herds, one configuration at a time
for my $c (@RUNNING) {
    next unless grep { $_ eq 'herd' } @{ $c->{runs} };
    run_herds($c);
}

# wrk: every (configuration, kind) once per round, interleaved, so that
# a noisy minute does not land on one configuration only
my @JOBS;
if ($HAVE_WRK) {
    for my $c (@RUNNING) {
        for my $kind (qw(hot unique)) {
            push @JOBS, [ $c, $kind ] if grep { $_ eq $kind } @{ $c->{runs} };
        }
        if ($c->{memory_baseline}) {
            $MEMORY{port} = $c->{port};
            $MEMORY{runs} = ['hot'];
            push @JOBS, [ \%MEMORY, 'hot' ];
        }
    }
}
else {
    push @SKIPPED, [ 'wrk', 'wrk not found (apt-get install wrk): no hot-key or unique-key runs' ];
}
for my $round (1 .. $opt{rounds}) {
    wrk_job(@$_, $round) for @JOBS;
}

# the end state of each instance: peak RSS, zone pages
for my $c (@RUNNING) {
    $c->{rss_peak} = rss_kib('VmHWM', server_pids($c));
    $c->{zone_end} = zone_stats($c);
    stop_instance($c);
}

my ($SF) = grep { $_->{name} eq 'sf' } @RUNNING;
my ($PLAIN) = grep { $_->{name} eq 'plain' } @CONFIGS;
$PLAIN //= { name => 'plain', server => 'nginx', location => "proxy_pass http://origin;\n",
             query => $CACHEABLE };

my ($MEM_WAIT, $MEM_BIG);
if ($opt{memory} && $SF) {
    note('memory: 1000 waiting followers vs 1000 waiting proxy_pass requests');
    $MEM_WAIT = memory_waiters($SF, $PLAIN, 1000);
    note('memory: 1000 followers of a 1 MiB response');
    $MEM_BIG = memory_big($SF, 1000);
}

my $CG;
if ($opt{callgrind} && $SF) {
    if ($HAVE_VALGRIND) {
        my ($waves, $n, $unique) = $opt{quick} ? (3, 50, 100) : (10, 50, 300);
        note("callgrind: $waves waves of $n, $unique unique keys twice");
        $CG = callgrind($SF, $waves, $n, $unique);
    }
    else {
        push @SKIPPED, [ 'callgrind', 'valgrind not found (apt-get install valgrind)' ];
    }
}

my $PERF;
if ($opt{perf} && $SF) {
    if (have('perf')) {
        note('perf: where the workers spend a herd');
        $PERF = perf_herd($SF, 8, 1000);
    }
    else {
        push @SKIPPED, [ 'perf', 'perf not found (apt-get install linux-perf): no CPU profile' ];
    }
}

alarm(0);
my $ELAPSED = time - $T0;

# ---------------------------------------------------------- report

my @OUT;
sub out { push @OUT, @_ }

sub cmd_output {
    my ($cmd) = @_;
    my $o = `$cmd 2>&1` // '';
    chomp $o;
    return $o;
}

my $host = cmd_output('hostname -s') || 'host';
my $date = strftime('%Y-%m-%d', localtime);
my ($cpu) = cmd_output('grep -m1 "model name" /proc/cpuinfo') =~ /:\s*(.*)/;
my $cores = () = cmd_output('grep "^processor" /proc/cpuinfo') =~ /processor/g;
my ($memtotal) = cmd_output('grep MemTotal /proc/meminfo') =~ /(\d+)/;
my $nginx_v = (cmd_output("$NGINX -v") =~ m{nginx/(\S+)})[0] // '?';
my $varnish_v = $HAVE_VARNISH ? (cmd_output('/usr/sbin/varnishd -V') =~ /(varnish-\S+)/)[0] : 'not installed';
my $wrk_v = $HAVE_WRK ? (cmd_output('wrk -v') =~ /wrk (\S+)/)[0] : 'not installed';
my $git = cmd_output("git -C $REPO describe --always --dirty 2>/dev/null") || '?';
my $md5 = do { open(my $fh, '<', $MODULE); binmode $fh; Digest::MD5->new->addfile($fh)->hexdigest };
my $command = ($ENV{SF_BENCH_ARGS} ? "SF_BENCH_ARGS=\"$ENV{SF_BENCH_ARGS}\" " : '')
    . ($ENV{MAKELEVEL} ? 'make bench`, which runs `' : '') . 'perl -I t/lib bench/bench.pl'
    . (@GIVEN ? ' ' . join(' ', @GIVEN) : '');
my $herd_plan = join(', ', map { "$_->[0] x $_->[1] waves (origin " . herd_delay($_->[0]) . ' ms)' } @HERD);

out("# ngx_http_singleflight_module benchmarks, $date, $host", '');
out("* date: " . strftime('%Y-%m-%d %H:%M:%S %Z', localtime));
out("* machine: $host, $cores cores, $cpu, " . sprintf('%.1f GiB RAM', ($memtotal // 0) / 1048576)
    . ', Linux ' . cmd_output('uname -r'));
out("* nginx: $nginx_v ($NGINX), $opt{workers} workers, reuseport; module "
    . "build/ngx_http_singleflight_module.so at git $git (md5 $md5)");
out("* others: $varnish_v, wrk $wrk_v, " . ($HAVE_VALGRIND ? cmd_output('valgrind --version') : 'no valgrind'));
out("* origin: " . ($opt{origin} eq 'perl' ? 't/origin.pl (Perl)' : 'bench/origin.c (C, epoll)')
    . ", body $opt{size} bytes; upstream keepalive 256");
out("* herds: $herd_plan; proxy_cache_lock on an uncacheable response: at most 2 waves");
out("* wrk: 2 threads, $opt{hot_conns} connections, $opt{duration} s, $opt{rounds} round(s) "
    . "interleaved, median shown; hot key: origin $opt{hot_delay} ms; unique keys: origin $opt{uniq_delay} ms");
out("* command: `$command`");
out(sprintf("* run time: %dm%02ds", $ELAPSED / 60, $ELAPSED % 60), '');

for (@SKIPPED) {
    out("* skipped **$_->[0]**: $_->[1]");
}
out('') if @SKIPPED;

# --- herd
out('## Herd: N simultaneous identical requests, a fresh key each wave', '');
out('Latencies in ms.  *added*: a response\'s completion minus the leader\'s '
    . '(the module\'s LEADER; elsewhere the first response); *same*/*other*: '
    . 'followers in the leader\'s worker or in the other one.  *flight*: origin '
    . 'requests per wave.', '');
out('| configuration | N | waves | origin req / flight | origin req / client req '
    . '| p50 | p99 | max | added p50 | added p99 | added p99 same | added p99 other '
    . '| bodies | errors |');
out('|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
for my $c (@RUNNING) {
    for my $plan (@HERD) {
        my $s = $c->{herd}{ $plan->[0] } or next;
        my @pw = sort { $a <=> $b } @{ $s->{per_wave} };
        my ($min, $max) = @pw[ 0, -1 ];
        my $flight = $s->{origin} / $s->{waves};
        $flight = $min == $max ? sprintf('%d', $flight)
                               : sprintf('%.1f (%d–%d)', $flight, $min, $max);
        my $errs = join(', ', map { "$_ $s->{error_kinds}{$_}" }
                              sort keys %{ $s->{error_kinds} // {} }) || '0';
        out(sprintf('| %s | %d | %d | %s | %.4f | %s | %s | %s | %s | %s | %s | %s | %d | %s |',
            $c->{label}, $s->{n}, $s->{waves}, $flight, $s->{origin} / $s->{requests},
            fmt(pct($s->{latency}, 50)), fmt(pct($s->{latency}, 99)), fmt(pct($s->{latency}, 100)),
            fmt(pct($s->{added}, 50), '%.2f'), fmt(pct($s->{added}, 99), '%.2f'),
            fmt(pct($s->{added_same}, 99), '%.2f'), fmt(pct($s->{added_other}, 99), '%.2f'),
            $s->{distinct}, $errs));
    }
}
out('', '*bodies*: distinct response bodies seen, summed over waves (the origin stamps '
    . 'each response with its hit number, so 1 per wave means every client got the '
    . 'leader\'s copy).', '');
if (grep({ $_->{name} =~ /^cache/ } @RUNNING) && grep({ $_->[0] > 1024 } @HERD)) {
    out('proxy_cache_lock past 1,023 waiters on one key: one request in 1,024 goes to the '
        . 'origin, because the cache node\'s use counter (`uses:10` in '
        . '`ngx_http_file_cache_node_t`) wraps to 0 and a node with fewer uses than '
        . '`proxy_cache_min_uses` is not locked.', '');
}

# --- wrk
if (@JOBS) {
    out('## wrk: hot key and unique keys', '');
    out("Hot key: every request for one URI, origin $opt{hot_delay} ms.  Unique keys: "
        . "bench/unique.lua, a new URI each request, origin $opt{uniq_delay} ms.  "
        . 'Latencies in ms.', '');
    out('| configuration | hot req/s | p50 | p99 | max | origin/req | errors '
        . '| unique req/s | p50 | p99 | max | origin/req | errors |');
    out('|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
    for my $c (@RUNNING, \%MEMORY) {
        next unless $c->{wrk};
        my @cells;
        for my $kind (qw(hot unique)) {
            my $w = wrk_median($c, $kind);
            if (!$w) { push @cells, ('—') x 6; next }
            push @cells, sprintf('%.0f', $w->{rps}), fmt($w->{p50_us} / 1000),
                fmt($w->{p99_us} / 1000), fmt($w->{max_us} / 1000),
                $w->{requests} ? sprintf('%.4f', $w->{origin} / $w->{requests}) : '—',
                $w->{errors};
        }
        out('| ' . join(' | ', $c->{label}, @cells) . ' |');
    }
    out('', sprintf('With %d connections and an origin answering in %d ms, a key that goes to '
        . 'the origin (collapsed or not) cannot be served faster than %d connections / %d ms '
        . '= %.0f req/s: the latency ceiling of the hot-key runs.', $opt{hot_conns},
        $opt{hot_delay}, $opt{hot_conns}, $opt{hot_delay}, hot_ceiling()), '');
}

# --- resources
out('## Resources', '');
out('*peak RSS*: the sum of VmHWM over the server\'s processes (nginx workers, '
    . 'varnishd\'s child) after all its runs.  Zone pages from singleflight_stats.', '');
out('| configuration | peak RSS MiB | zone pages used at end / baseline | zone pages peak |');
out('|---|--:|--:|--:|');
for my $c (@RUNNING) {
    my $z = $c->{zone_end};
    out(sprintf('| %s | %.1f | %s | %s |', $c->{label}, ($c->{rss_peak} // 0) / 1024,
        $z ? "$z->{pages_used} / $z->{pages_baseline}" : '—', $c->{pages_peak} // '—'));
}
out('');

if ($MEM_WAIT && $MEM_WAIT->{sf} && $MEM_WAIT->{plain}) {
    my ($s, $p) = @$MEM_WAIT{qw(sf plain)};
    out('## Memory of waiting requests', '');
    out("$s->{n} clients wait on one key (origin 2.5 s), fresh nginx each; workers' "
        . 'VmRSS summed, before and while all wait.', '');
    out('| | RSS before MiB | RSS waiting MiB | per waiting request KiB | zone pages added | origin requests |');
    out('|---|--:|--:|--:|--:|--:|');
    for ([ 'plain proxy_pass', $p ], [ 'singleflight followers', $s ]) {
        my ($l, $m) = @$_;
        out(sprintf('| %s | %.1f | %s | %s | %s | %d |', $l, $m->{before} / 1024,
            fmt(defined $m->{during} ? $m->{during} / 1024 : undef),
            fmt($m->{per_conn}, '%.2f'), $m->{pages} // '—', $m->{origin}));
    }
    out('');
}
if ($MEM_BIG) {
    my $b = $MEM_BIG;
    out("## $b->{n} followers of a 1 MiB response", '');
    out(sprintf('Workers\' RSS %.1f MiB before, peak %.1f MiB: +%.1f MiB for %d responses '
        . '(%d copies would be %d MiB).  %d complete, %d distinct bodies, %d origin requests.  '
        . 'Shared memory the workers touched (RssShmem, summed): +%.1f MiB, the one copy '
        . 'in the zone, mapped by each worker.',
        $b->{before} / 1024, $b->{peak} / 1024, ($b->{peak} - $b->{before}) / 1024, $b->{n},
        $b->{n}, $b->{n} * $b->{size} / 1048576, $b->{ok}, $b->{distinct}, $b->{origin},
        $b->{shmem} / 1024), '');
}

# --- callgrind
if ($CG) {
    out('## callgrind: instructions per call', '');
    if ($CG->{error} || !$CG->{parts}{herd}) {
        out('callgrind failed: ' . ($CG->{error} // 'no profile'), '');
    }
    else {
        my $h = $CG->{parts}{herd};
        out("$CG->{cmd}, profiled in parts (callgrind_control --dump).  *herd*: "
            . "$CG->{waves} waves of $CG->{n} identical requests on fresh keys "
            . "($CG->{ok} responses, $CG->{origin} origin requests).  Inclusive Ir: "
            . 'callgrind_annotate --inclusive=yes; self Ir: callgrind_annotate; calls: '
            . 'the profile\'s calls= lines.  User-space instructions only: the system '
            . 'calls (writev, close, the wake-up datagrams) are not counted.  Inclusive '
            . 'costs of handlers and filters include the nginx code they call (the rest '
            . 'of the filter chain, the upstream).', '');
        out('| function | hot path | calls | inclusive Ir / call | self Ir / call |');
        out('|---|---|--:|--:|--:|');
        for my $f (@CG_FUNCTIONS) {
            my ($name, $what) = @$f;
            my $calls = $h->{calls}{$name};
            my $incl = $h->{incl}{$name} // $h->{calls_incl}{$name};
            my $self = $h->{self}{$name};
            out(sprintf('| %s | %s | %s | %s | %s |', $name =~ s/^ngx_http_singleflight_/…_/r,
                $what, $calls // 'inlined',
                $calls && defined $incl ? sprintf('%.0f', $incl / $calls) : '—',
                $calls && defined $self ? sprintf('%.0f', $self / $calls) : '—'));
        }
        out('');
        my ($us, $up) = @{ $CG->{parts} }{qw(unique-sf unique-plain)};
        if ($us && $up && $CG->{'unique-sf_ok'} && $CG->{'unique-plain_ok'}) {
            my $ps = $us->{total} / $CG->{'unique-sf_ok'};
            my $pp = $up->{total} / $CG->{'unique-plain_ok'};
            out("Unique keys, $CG->{unique} requests each, the same nginx: whole-process "
                . 'instructions per request.', '');
            out('| location | requests | Ir / request | module functions, self Ir / request |');
            out('|---|--:|--:|--:|');
            for ([ 'singleflight', $us, $CG->{'unique-sf_ok'} ],
                 [ 'plain proxy_pass (module loaded, off)', $up, $CG->{'unique-plain_ok'} ]) {
                my ($l, $part, $n) = @$_;
                my $mod = 0;
                $mod += $part->{self}{$_} for grep { /singleflight/ } keys %{ $part->{self} };
                out(sprintf('| %s | %d | %.0f | %.0f |', $l, $n, $part->{total} / $n, $mod / $n));
            }
            out('', sprintf('The module adds %.0f instructions (%.1f%%) to a request that has '
                . 'nothing to collapse.', $ps - $pp, 100 * ($ps - $pp) / $pp), '');
            # where the extra instructions go: self Ir per request, sf - plain
            my %diff;
            for my $fn (keys %{ $us->{self} }, keys %{ $up->{self} }) {
                $diff{$fn} = ($us->{self}{$fn} // 0) / $CG->{'unique-sf_ok'}
                    - ($up->{self}{$fn} // 0) / $CG->{'unique-plain_ok'};
            }
            # (functions still on the stack at a dump, main and below, show
            # the whole part as their own cost: left out)
            my @top = grep { $diff{$_} >= 50 && !/^0x/
                             && ($us->{self}{$_} // 0) < $us->{total} / 2 }
                      sort { $diff{$b} <=> $diff{$a} } keys %diff;
            splice(@top, 12) if @top > 12;
            out('Where they go: self Ir per request, singleflight minus plain, largest first:', '');
            out('| function | self Ir / request, difference |');
            out('|---|--:|');
            out(sprintf('| %s | %+.0f |', $_, $diff{$_})) for @top;
            out('');
            out('Per call, unique keys through singleflight (each request leads its own flight):', '');
            out('| function | calls | inclusive Ir / call | self Ir / call |');
            out('|---|--:|--:|--:|');
            for my $name (sort { ($us->{self}{$b} // 0) <=> ($us->{self}{$a} // 0) }
                          grep { /singleflight/ && $us->{calls}{$_} } keys %{ $us->{calls} }) {
                my $calls = $us->{calls}{$name};
                next unless ($us->{self}{$name} // 0) / $calls >= 20;
                out(sprintf('| %s | %d | %.0f | %.0f |', $name =~ s/^ngx_http_singleflight_/…_/r,
                    $calls, ($us->{incl}{$name} // $us->{calls_incl}{$name} // 0) / $calls,
                    ($us->{self}{$name} // 0) / $calls));
            }
            out('');
        }
        my @ex = @{ $h->{excerpt} // [] };
        splice(@ex, 14) if @ex > 14;
        out('callgrind_annotate --inclusive=yes excerpt, *herd* part, module functions:', '',
            '```', @ex, '```', '');
    }
}

# --- perf
if ($PERF) {
    out('## perf: the workers during herds', '');
    out("perf record -g on the 2 workers of a fresh singleflight nginx, $PERF->{waves} herds "
        . "of $PERF->{n}" . ($PERF->{samples} ? " ($PERF->{samples} samples)" : '')
        . '.  By object; then the top symbols; then the system calls and the kernel\'s '
        . 'TCP send and close, with their callees.', '');
    out('```', map({ s/\s+$//r } @{ $PERF->{dso} }), '', map({ s/\s+$//r } grep { defined } @{ $PERF->{sym} }),
        '', map({ s/\s+$//r } @{ $PERF->{sys} }), '```', '');
}

# --- targets
out('## Targets', '');
out('| target | measured | ratio to target | |');
out('|---|--:|--:|---|');

sub hot_ceiling { $opt{hot_conns} * 1000 / $opt{hot_delay} }

sub verdict { $_[0] ? 'met' : "missed$_[1]" }

for my $c (@RUNNING) {
    next unless $c->{collapses};
    for my $n (1000, 10000) {
        my $s = $c->{herd}{$n} or next;
        my $f = $s->{origin} / $s->{waves};
        my $want = $c->{collapses} eq 'worker' ? $opt{workers} : 1;
        my ($max) = sort { $b <=> $a } @{ $s->{per_wave} };
        out(sprintf('| origin requests per flight = %d, %s, N=%d | %.2f | %.2f | %s |', $want,
            $c->{label}, $n, $f, $f / $want,
            verdict($max <= $want && $f >= 1, sprintf(' by %.0f%%', 100 * ($f / $want - 1)))));
    }
}
for my $c (grep { $_->{module} } @RUNNING) {
    for my $plan (@HERD) {
        my $s = $c->{herd}{ $plan->[0] } or next;
        for ([ 'added_other', 2, 'across workers' ], [ 'added_same', 0.5, 'within a worker' ]) {
            my ($k, $lim, $what) = @$_;
            my $v = pct($s->{$k}, 99);
            next unless defined $v;
            out(sprintf('| follower added latency p99 ≤ %s ms %s, %s, N=%d | %.2f ms | %.2f | %s |',
                $lim, $what, $c->{label}, $s->{n}, $v, $v / $lim,
                verdict($v <= $lim, sprintf(': %.1f× the target', $v / $lim))));
        }
    }
}
if (my $p = $PLAIN->{wrk} && wrk_median($PLAIN, 'unique')) {
    for my $c (grep { $_->{module} } @RUNNING) {
        my $w = wrk_median($c, 'unique') or next;
        my $r = $w->{rps} / $p->{rps};
        out(sprintf('| unique keys req/s ≥ 97%% of plain proxy_pass, %s | %.0f vs %.0f | %.3f | %s |',
            $c->{label}, $w->{rps}, $p->{rps}, $r / 0.97,
            verdict($r >= 0.97, sprintf(': %.1f%% of plain, short by %.1f points', 100 * $r, 97 - 100 * $r))));
    }
}
if (my $mem = wrk_median(\%MEMORY, 'hot')) {
    my $p = $PLAIN->{wrk} ? wrk_median($PLAIN, 'hot') : undef;
    for my $c (grep { $_->{module} } @RUNNING) {
        my $w = wrk_median($c, 'hot') or next;
        my $r = $w->{rps} / $mem->{rps};
        out(sprintf('| hot key req/s ≥ 80%% of return 200 from memory, %s | %.0f vs %.0f | %.3f | %s |',
            $c->{label}, $w->{rps}, $mem->{rps}, $r / 0.8,
            verdict($r >= 0.8, sprintf(': %.1f%% of memory, short by %.1f points; %.0f%% of the '
                . '%.0f req/s latency ceiling', 100 * $r, 80 - 100 * $r,
                100 * $w->{rps} / hot_ceiling(), hot_ceiling()))));
        out(sprintf('| hot key req/s far above plain proxy_pass, %s | %.0f vs %.0f | %.2f× plain | %s |',
            $c->{label}, $w->{rps}, $p->{rps}, $w->{rps} / $p->{rps},
            $w->{rps} >= 2 * $p->{rps} ? 'met (≥ 2×)' : 'missed (< 2×)')) if $p;
    }
}
if ($MEM_WAIT && $MEM_WAIT->{sf} && $MEM_WAIT->{plain}
    && defined $MEM_WAIT->{sf}{per_conn} && defined $MEM_WAIT->{plain}{per_conn})
{
    my $extra = $MEM_WAIT->{sf}{per_conn} - $MEM_WAIT->{plain}{per_conn};
    out(sprintf('| a waiting follower costs ≤ 2 KiB beyond a waiting proxy_pass request '
        . '| %+.2f KiB (%.2f vs %.2f) | %.2f | %s |', $extra, $MEM_WAIT->{sf}{per_conn},
        $MEM_WAIT->{plain}{per_conn}, $extra / 2,
        verdict($extra <= 2, sprintf(': %.1f× the target', $extra / 2))));
}
if ($MEM_BIG) {
    my $d = ($MEM_BIG->{peak} - $MEM_BIG->{before}) / 1024;
    my $copies = $MEM_BIG->{n} * $MEM_BIG->{size} / 1048576;
    out(sprintf('| %d followers of 1 MiB: RSS delta far below %d MiB (≤ 10%%) | %.1f MiB | %.3f | %s |',
        $MEM_BIG->{n}, $copies, $d, $d / ($copies / 10),
        verdict($d <= $copies / 10 && $MEM_BIG->{ok} == $MEM_BIG->{n}, '')));
}
out('');

my $report = join("\n", @OUT) . "\n";
print "\n", $report;

my $file = $opt{out} // SFTest::results_file("$date-$host" . ($opt{quick} ? '-quick' : ''));
make_path(dirname($file));
open(my $fh, '>', $file) or die "cannot write $file: $!";
print $fh $report;
close($fh);
note("results written to $file");

# stop everything now (SFTest would at exit), then our scratch directory
# goes if nothing was kept in it
SFTest::_finalize_all();
rmdir $SCRATCH;

exit 0;
