#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/lone.pl - the cost of a lone request: requests with nobody to share
# with (unique keys) through `singleflight` against the same requests
# through plain proxy_pass, in one nginx, in one run.
#
#   callgrind  instructions per request (user space, the whole nginx
#              process: master_process off, 1 worker), between
#              `callgrind_control --zero` and `--dump` around N sequential
#              keep-alive requests (one curl, one connection), at each body
#              size; the module's location and a plain one of the same
#              nginx, one after the other; then the plain one again in an
#              nginx without the module loaded ("bare");
#   wrk        requests/s and latency with unique keys (bench/unique.lua),
#              2 workers, plain, module and bare (a second nginx, without
#              the module) runs in rounds, each first in turn, for every
#              zone scope, and once with 1 worker alone on a CPU of its
#              own ("pinned"); the medians of the rounds' ratios, and the
#              workers' CPU time per request; and the wrk targets
#              against a confidence interval of those medians.
#
# Both go to bench/results/YYYY-MM-DD-HOST-lone.md (or --out), also printed.
#
#   perl -I t/lib bench/lone.pl [--quick] [--sizes 1024,10000,65536,1048576]
#       [--requests 500] [--wrk-sizes 10000,65536] [--pairs 5 (rounds)]
#       [--duration 5] [--conns 50] [--out FILE] [--no-callgrind] [--no-wrk]
#       [--scopes process,numa,worker,trim,pinned (rows of the wrk table)]
#       [--cache-sim (callgrind also counts instruction cache misses)]
#       [--perf (a second pinned row, perf record on its worker's CPU: where
#        its time goes)]
#       [--browser (one more callgrind row, at 10,000 B, whose requests carry
#        a browser's 14 headers instead of curl's 3: the module looks at each)]
#       [--lone direct|fetch (singleflight_lone in the module's location)]
#       [--cache-hit (two more callgrind rows, at 1 KiB and 10,000 B: both
#        locations with proxy_cache, every request the same URI, a hit in
#        the cache; what the module costs a request the cache answers)]
#       [--cookie (one more callgrind row, at 1 KiB, whose requests carry a
#        Cookie: credentials, collapsed by HTTP's rules (singleflight_credentials
#        http, the default; PRIVATE with "off"), as a browser's
#        request to a site with a session is; what the module costs a
#        request it lets through)]
#       [--conditional (one more callgrind row, at 1 KiB, whose requests carry
#        If-None-Match, as a browser's revalidation does; the origin answers
#        200, its validator changed)]

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(basename dirname);
use Getopt::Long;
use JSON::PP qw(decode_json);
use POSIX qw(strftime WNOHANG);
use Time::HiRes qw(time sleep);

use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my $REPO = abs_path(dirname(abs_path($0)) . '/..');

my %opt = (
    sizes     => '1024,10000,65536,1048576',
    requests  => 500,
    wrk_sizes => '10000,65536',
    pairs     => 5,
    duration  => 5,
    conns     => 50,
    callgrind => 1,
    wrk       => 1,
);

my @GIVEN = @ARGV;

GetOptions(
    'quick'       => \$opt{quick},
    'sizes=s'     => \$opt{sizes},
    'requests=i'  => \$opt{requests},
    'wrk-sizes=s' => \$opt{wrk_sizes},
    'pairs=i'     => \$opt{pairs},
    'duration=f'  => \$opt{duration},
    'conns=i'     => \$opt{conns},
    'out=s'       => \$opt{out},
    'callgrind!'  => \$opt{callgrind},
    'wrk!'        => \$opt{wrk},
    'scopes=s'    => \$opt{scopes},
    'cache-sim'   => \$opt{cache_sim},
    'perf'        => \$opt{perf},
    'browser'     => \$opt{browser},
    'cookie'      => \$opt{cookie},
    'conditional' => \$opt{conditional},
    'cache-hit'   => \$opt{cache_hit},
    'lone=s'      => \$opt{lone},
) or die "usage: see the head of bench/lone.pl\n";

# `SF_BENCH_ARGS="--quick" make bench` makes this run quick too
$opt{quick} = 1 if ($ENV{SF_BENCH_ARGS} // '') =~ /(?:^|\s)--quick\b/;

if ($opt{quick}) {
    $opt{requests} = 200;
    $opt{pairs} = 3;
    $opt{duration} = 2;
}

my @SIZES = split /,/, $opt{sizes};
# --browser: the size of its row
my $BROWSER_SIZE = 10000;
# --cookie: the size of its row
my $COOKIE_SIZE = 1024;
# --conditional: the size of its row
my $CONDITIONAL_SIZE = 1024;
# --cache-hit: the sizes of its rows
my @HIT_SIZES = (1024, 10000);
my @WRK_SIZES = split /,/, $opt{wrk_sizes};
# every scope, and scope=process once more with glibc's malloc told to keep
# up to 8 MiB of freed heap (the default gives pages back past 128 KiB:
# brk() and page faults under load, which a request's extra 4 KiB of pool
# for the fetch's subrequest makes more frequent)
my $TRIM = 'GLIBC_TUNABLES=glibc.malloc.trim_threshold=8388608';
# and scope=process with one worker on the second CPU, wrk and the origin
# on the first: nothing of nginx's shares its CPU, the least noisy row
my @SCOPES = ('process', 'numa', 'worker', "process $TRIM", 'process pinned');
my $PINNED = 'pinned';
# --perf: a pinned row of its own, sampled (see below)
my $PINNED_PERF = 'pinned-perf';
my $CPUS = (`nproc 2>/dev/null` =~ /(\d+)/)[0] || 1;
@SCOPES = grep { !/ \Q$PINNED\E$/ } @SCOPES
    if $CPUS < 2 || system('command -v taskset >/dev/null 2>&1') != 0;
# --scopes numa,pinned: those rows only (process, numa, worker, trim, pinned)
if (defined $opt{scopes}) {
    my %want = map { $_ => 1 } split /,/, $opt{scopes};
    my %name = ("process $TRIM" => 'trim', "process $PINNED" => $PINNED);
    @SCOPES = grep { $want{ $name{$_} // $_ } } @SCOPES;
}

my $NGINX = $ENV{SF_NGINX} // $ENV{TEST_NGINX_BINARY} // '/usr/sbin/nginx';
my $MODULE = $ENV{SF_MODULE} // "$REPO/build/ngx_http_singleflight_module.so";
-f $MODULE or die "no module at $MODULE: run make build\n";

sub have { system("command -v $_[0] >/dev/null 2>&1") == 0 }

my @SKIPPED;
my $HAVE_CG = have('valgrind') && have('callgrind_control') && have('curl');
my $HAVE_WRK = have('wrk');
push @SKIPPED, 'callgrind: valgrind or curl not installed' if $opt{callgrind} && !$HAVE_CG;
push @SKIPPED, 'wrk: not installed (apt-get install wrk)' if $opt{wrk} && !$HAVE_WRK;
# --perf: perf's software clock samples the pinned worker's CPU during
# each run of the second pinned row (no hardware counters needed: this
# VM has none)
my $PERF_HZ = 4999;
# and a control in that row: plain proxying with about as much
# user-space work added as the module adds at 10,000 B (this many regular
# expressions that fail, in the rewrite phase), to tell what a slower
# worker alone costs in the kernel from what the module's requests do
my $BURN = 12;
# and a second one: plain proxying with about 6 KB of new memory written
# per request (this many 1,000-byte strings made in the rewrite phase),
# about as much as the module's subrequest, fetch and copies use (theirs
# mostly memory used again, which costs the kernel nothing more)
my $FOOTPRINT = 6;
# the kinds of run: the location each asks for, and its name in the tables
my %KIND = (plain => ['/pl/u', 'plain'], sf => ['/sf/u', 'module'], bare => ['/pl/u', 'bare'],
            burn => ['/pb/u', 'control'], touch => ['/pf/u', 'footprint']);
my $HAVE_PERF = $opt{perf} && have('perf')
    && system('perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1') == 0;
push @SKIPPED, 'perf: not installed or not allowed (apt-get install linux-perf; root)'
    if $opt{perf} && !$HAVE_PERF;
# perf sampling the pinned worker's CPU saturates it for every kind: its
# requests/s then follow its CPU time per request, where without perf
# plain proxying's worker has some idle time that absorbs part of the
# module's cost.  So perf samples a second pinned row, after the first,
# which stays the one the wrk targets are read from.
@SCOPES = map { / \Q$PINNED\E$/ ? ($_, "process $PINNED_PERF") : $_ } @SCOPES
    if $HAVE_PERF;
# the row perf samples
sub sampled_row { $_[0] =~ / \Q$PINNED_PERF\E$/ }

# bench/origin.c
my $ORIGIN_BIN = SFTest::c_origin();

my $main = SFTest->new(module => $MODULE);
my $origin = $main->start_origin(program => $ORIGIN_BIN);
my $ORIGIN = $origin->addr;

sub note { print STDERR "# @_\n" }

# ---------------------------------------------------------- the config

# One nginx: location /sf/ with singleflight (zone scope $scope), location
# /pl/ without; everything else the same, the URIs of both of one length
# (nginx parses and matches them at the same cost).
sub conf {
    my (%a) = @_;
    my $main_ctx = $a{single}
        ? "daemon off;\nmaster_process off;\nworker_processes 1;"
        : $a{pinned}
        ? "daemon on;\nmaster_process on;\nworker_processes 1;\nworker_cpu_affinity 10;"
        : "daemon on;\nmaster_process on;\nworker_processes 2;";
    my $user = $> == 0 ? 'user root;' : '';
    my $scope = $a{scope} && $a{scope} ne 'process' ? " scope=$a{scope}" : '';
    my $extra = $a{extra} // '';
    my $lone = $opt{lone} ? "singleflight_lone $opt{lone};" : '';
    my $load = $a{nomod} ? '' : "load_module $MODULE;";
    # --perf's control: plain proxying with user-space work added and
    # nothing else (regular expressions that fail, in the rewrite phase)
    my $controls = $a{controls} ? controls_conf() : '';
    # --cache-hit: a cache in both locations, which keeps what it got
    my ($cache_path, $cache) = $a{cache}
        ? ("proxy_cache_path %%TESTDIR%%/cache levels=1:2 keys_zone=pc:8m;",
           "proxy_cache pc;\n            proxy_cache_valid 200 1h;")
        : ('', '');
    my $text = <<"EOT";
$load
$user
$main_ctx
worker_rlimit_nofile 8192;
pid %%TESTDIR%%/nginx.pid;
error_log %%TESTDIR%%/error.log warn;

events {
    worker_connections 4096;
}

http {
    access_log off;
    client_body_temp_path %%TESTDIR%%/client_body_temp;
    proxy_temp_path       %%TESTDIR%%/proxy_temp;

    upstream origin {
        server $ORIGIN;
        keepalive 256;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";

    singleflight_zone zone=sf:32m$scope;
    $cache_path

    server {
        listen 127.0.0.1:%%PORT%% reuseport backlog=4096;

        location /sf/ {
            singleflight sf;
            $lone
            $extra
            $cache
            proxy_pass http://origin;
        }

        location /pl/ {
            $cache
            proxy_pass http://origin;
        }
$controls
    }
}
EOT
    # nginx without the module: the same, less the module's lines
    $text =~ s/^\s*singleflight(?:_zone|_lone)? [^\n]*;\n//mg if $a{nomod};
    $text =~ s/^\s*\Q$extra\E\n//m if $a{nomod} && $extra ne '';
    return $text;
}

# --perf's controls, two locations of plain proxying: one with user-space
# work added and nothing else (regular expressions that fail, in the
# rewrite phase), one with new memory written (strings made there)
sub controls_conf {
    my $burn = join("\n", map { "            if (\$request_uri ~* \"^/pb/(q$_|w+e+r+t+y+)+[a-z]*zz\$\") { return 404; }" }
                          1 .. $BURN);
    my $touch = join("\n", map { "            set \$fp$_ \"" . ('x' x 1000) . "\$uri\";" }
                           1 .. $FOOTPRINT);
    return "\n        location /pb/ {\n$burn\n            proxy_pass http://origin;\n        }\n"
         . "\n        location /pf/ {\n$touch\n            proxy_pass http://origin;\n        }\n";
}

# ---------------------------------------------------------- callgrind

# instructions per request of the module's location and the plain one
sub callgrind_size {
    my ($size, $extra, $nomod, $headers, $hit) = @_;
    my $t = SFTest->new(module => $MODULE);
    $t->write_config(conf(single => 1, extra => $extra, nomod => $nomod, cache => $hit));
    my $port = $t->port(0);
    my $out = $t->path('cg.out');
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $t->path('valgrind.log'));
        open(STDERR, '>&', \*STDOUT);
        exec('valgrind', '--tool=callgrind', "--callgrind-out-file=$out.%p",
             ($opt{cache_sim} ? '--cache-sim=yes' : ()),
             $NGINX, '-p', $t->testdir . '/', '-c', $t->path('nginx.conf'))
            or POSIX::_exit(127);
    }
    my %r;
    my $up = $t->wait_for(sub { SFTest::_can_connect($port) || waitpid($pid, WNOHANG) == $pid },
        timeout => 90, what => 'nginx under callgrind', quiet => 1);
    if ($up && SFTest::_alive($pid)) {
        my $q = "size=$size";
        # warm-up: first-request allocations, upstream connections
        curl_all($t, 'warm', $headers, map { ("/sf/w$_-$$?$q", "/pl/w$_-$$?$q") } 1 .. 3);
        # --cache-hit: the one URI of each location, in its cache
        curl_all($t, 'warm-hit', $headers, map { ("/sf/hit-$$?$q", "/pl/hit-$$?$q") } 1 .. 3)
            if $hit;
        for my $kind ($nomod ? ('plain') : ('sf', 'plain')) {
            my $p = $kind eq 'sf' ? '/sf/' : '/pl/';
            system("callgrind_control --zero $pid >/dev/null 2>&1");
            $r{"${kind}_ok"} = curl_all($t, $kind, $headers,
                map { $hit ? "${p}hit-$$?$q" : "${p}u$_-$$-$size?$q" } 1 .. $opt{requests});
            system("callgrind_control --dump=$kind $pid >/dev/null 2>&1");
        }
    }
    kill 'QUIT', $pid;
    $t->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, timeout => 60, quiet => 1)
        or do { kill 'KILL', $pid; waitpid($pid, 0) };
    for my $f (glob "$out.*.*") {
        my $text = do { open(my $fh, '<', $f); local $/; <$fh> };
        my ($trigger) = $text =~ /^desc: Trigger: (.*)$/m;
        # each event's sum: Ir, and with --cache-sim I1mr (first-level
        # instruction cache misses) among others
        my @events = split ' ', ($text =~ /^events: (.*)$/m)[0] // '';
        my @sums = split ' ', ($text =~ /^(?:summary|totals): (.*)$/m)[0] // '';
        my %sum = map { ($events[$_] => $sums[$_]) } 0 .. $#events;
        my ($total, $i1) = @sum{qw(Ir I1mr)};
        for my $kind ('sf', 'plain') {
            next unless ($trigger // '') =~ /\b$kind\b/ && $total;
            $r{$kind} = $total / $opt{requests};
            next unless defined $i1;
            $r{"${kind}_i1"} = $i1 / $opt{requests};
            $r{"${kind}_i1_module"} = object_misses($text, \@events, basename($MODULE)) / $opt{requests};
        }
    }
    return \%r;
}

# the first-level instruction cache misses in one object's code (its
# "ob=" lines) of a callgrind dump: self costs, not those of the lines
# that follow a "calls=" line (a call's inclusive cost)
sub object_misses {
    my ($text, $events, $object) = @_;
    my ($col) = grep { $events->[$_] eq 'I1mr' } 0 .. $#$events;
    my (%name, $ob, $call);
    my $n = 0;
    for (split /\n/, $text) {
        if (/^(c?)ob=(?:\((\d+)\))? ?(.*)$/) {
            my $o = $3 ne '' ? $3 : $name{$2 // ''};
            $name{$2} = $3 if defined $2 && $3 ne '';
            $ob = $o unless $1;
            next;
        }
        if (/^calls=/) { $call = 1; next }
        next unless /^[0-9+*-]/;
        if ($call) { $call = 0; next }
        next unless defined $ob && $ob =~ m{(?:^|/)\Q$object\E$};
        $n += (split ' ')[$col + 1] // 0;
    }
    return $n;
}

# the headers of Firefox 128's request for a page but Host, which curl
# adds (curl alone sends Host, User-Agent and Accept): 13 here and Host,
# 14 in all, as browsers send 12-20
my @BROWSER = (
    'User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0',
    'Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8',
    'Accept-Language: en-US,en;q=0.5', 'Accept-Encoding: gzip, deflate, br, zstd',
    'Referer: http://example.com/index.html', 'Connection: keep-alive',
    'Upgrade-Insecure-Requests: 1', 'Sec-Fetch-Dest: document', 'Sec-Fetch-Mode: navigate',
    'Sec-Fetch-Site: same-origin', 'Sec-Fetch-User: ?1', 'Priority: u=0, i', 'DNT: 1',
);

# a session's cookie: credentials (with singleflight_credentials http, the
# default, collapsed as any request)
my @COOKIE = ('Cookie: sid=4f2a9c1e7b3d8a6f0e5c2b9d1a7f3e8c; lang=en');

# a browser's revalidation of a page whose validator changed: the origin
# (bench/origin.c sends no ETag) answers 200
my @CONDITIONAL = ('If-None-Match: "bench-0"');

my %HEADERS = (browser => \@BROWSER, cookie => \@COOKIE, conditional => \@CONDITIONAL);

# sequential requests on one keep-alive connection (with $headers,
# 'browser' or 'cookie', those request headers too); returns how many 200
sub curl_all {
    my ($t, $name, $headers, @paths) = @_;
    my $port = $t->port(0);
    my $cfg = $t->path("curl-$name.cfg");
    open(my $fh, '>', $cfg) or die "$cfg: $!";
    # in double quotes, as curl reads its config: \" and \\ escaped
    print $fh qq{header = "$_"\n} for map { s/(["\\])/\\$1/gr } $headers ? @{$HEADERS{$headers}} : ();
    print $fh qq{url = "http://127.0.0.1:$port$_"\noutput = /dev/null\nwrite-out = "%{http_code}\\n"\n}
        for @paths;
    close($fh);
    my @codes = `curl -s -K $cfg`;
    return scalar grep { /^200/ } @codes;
}

# ---------------------------------------------------------- wrk

sub wrk_run {
    my ($port, $prefix, $size, $pinned, $perf) = @_;
    my @cmd = (($perf ? ('perf', 'record', '-q', '-g', '-e', 'cpu-clock', '-F', $PERF_HZ, '-C', '1', '-o', $perf, '--') : ()),
        ($pinned ? ('taskset', '-c', '0') : ()), 'wrk', '-t', 1, '-c', $opt{conns}, '-d', "$opt{duration}s", '--timeout', '10s',
        '-s', "$REPO/bench/unique.lua", "http://127.0.0.1:$port/", '--', $prefix, "size=$size");
    open(my $fh, '-|', @cmd) or die "wrk: $!";
    my $out = do { local $/; <$fh> };
    close($fh);
    my ($json) = $out =~ /^WRKJSON (\{.*\})$/m or return undef;
    my $w = decode_json($json);
    $w->{rps} = $w->{requests} / ($w->{duration_us} / 1e6);
    $w->{errors} = $w->{connect} + $w->{read} + $w->{write} + $w->{status} + $w->{timeout};
    return $w;
}

sub median {
    my @v = sort { $a <=> $b } grep { defined } @_ or return undef;
    return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

# a distribution-free confidence interval for the median of @v: the k-th
# smallest and the k-th largest value, with k - 1 the largest j for which
# P(Binomial(n, 1/2) <= j) <= 2.5%; returns (low, high, coverage).  Under
# 6 values there is no such j: the whole range, covering 1 - 2^(1-n) (94%
# for 5).  Nothing for fewer than 2 values.
sub median_ci {
    my @v = sort { $a <=> $b } grep { defined } @_;
    my $n = @v;
    return () if $n < 2;
    my $p = 0.5 ** $n;          # P(X = j)
    my $cum = $p;               # P(X <= j)
    my $k = 1;
    my $covered = $cum;         # P(X <= k - 1)
    for (my $j = 0; $cum <= 0.025 && $j < $n / 2; ) {
        $k = $j + 1;
        $covered = $cum;
        $p = $p * ($n - $j) / ($j + 1);
        $j++;
        $cum += $p;
    }
    return ($v[$k - 1], $v[$n - $k], 1 - 2 * $covered);
}

# the sum over the workers of fields of /proc/PID/stat, counted from the
# one after the command's ")" (its state, 0): minor faults 7, user time 11,
# system time 12 (clock ticks)
sub workers_stat {
    my ($t, @fields) = @_;
    my $n = 0;
    for my $pid ($t->worker_pids) {
        my $stat = do { open(my $fh, '<', "/proc/$pid/stat") or next; local $/; <$fh> };
        $stat =~ s/^.*\) //s;
        my @f = split ' ', $stat;
        $n += $f[$_] // 0 for @fields;
    }
    return $n;
}

# the workers' minor page faults so far: heap pages glibc gave back and
# touched again count here
sub minflt { workers_stat($_[0], 7) }

# the workers' CPU time so far, user and system, in seconds
my $TICKS = (`getconf CLK_TCK 2>/dev/null` =~ /(\d+)/)[0] || 100;
sub cputime { workers_stat($_[0], 11, 12) / $TICKS }

# --perf: the system calls the kernel's samples are put under
my @SYSCALLS = qw(sys_write sys_read sys_epoll sys_other);

# --perf: where the pinned worker's CPU time went during a run, in µs per
# request: the kernel, nginx, libc, the module, the rest (samples of the
# worker's CPU whose command is nginx; 1 / $PERF_HZ s each), and the
# kernel's part by the system call it ran under (its call chain)
sub perf_split {
    my ($file, $requests) = @_;
    my %n = map { $_ => 0 } qw(kernel nginx libc module other peer), @SYSCALLS;
    open(my $fh, '-|', 'perf', 'script', '-i', $file, '-F', 'comm,ip,sym,dso') or return undef;
    local $/ = '';              # one sample, its call chain under it
    while (my $sample = <$fh>) {
        my ($head, @frames) = split /\n/, $sample;
        next unless $head =~ /^\s*nginx\s/;
        @frames = grep { /\S/ } @frames;
        unshift @frames, $head unless @frames;     # no call chain
        my ($dso) = $frames[0] =~ /\(([^()]*)\)\s*$/ or next;
        my $k = $dso =~ /kernel/ ? 'kernel' : $dso =~ m{/nginx$} ? 'nginx'
              : $dso =~ /libc\.so/ ? 'libc' : $dso =~ /singleflight/ ? 'module' : 'other';
        $n{$k}++;
        next unless $k eq 'kernel';
        my $call = syscall_of(@frames);
        $n{$call}++;
        # over loopback, the receiving socket's side of TCP (its
        # softirq) runs on the writer's CPU, inside its writev()
        $n{peer}++ if $call eq 'sys_write' && grep { /\snet_rx_action\b/ } @frames;
    }
    close($fh);
    unlink($file);
    return undef unless $requests;
    $n{$_} = $n{$_} / $PERF_HZ / $requests * 1e6 for keys %n;
    $n{user} = $n{nginx} + $n{libc} + $n{module} + $n{other};
    $n{total} = $n{user} + $n{kernel};
    return \%n;
}

# a kernel sample's system call, from the outermost frame in: writes
# (writev, sendfile), reads (recvfrom, readv), epoll, or another
sub syscall_of {
    for my $frame (reverse @_) {
        my ($sym) = $frame =~ /^\s*[0-9a-f]+\s+(\S+)/ or next;
        return 'sys_write' if $sym =~ /writev|sendfile|sys_write\b|ksys_write/;
        return 'sys_read' if $sym =~ /recvfrom|readv|recvmsg|sys_read\b|ksys_read/;
        return 'sys_epoll' if $sym =~ /epoll/;
    }
    return 'sys_other';
}

# the rounds' perf splits: each kind's medians, and the medians (with
# their intervals) of the rounds' ratios module / plain and module / bare
sub perf_summary {
    my ($rounds) = @_;
    return undef unless $rounds && @$rounds;
    my %sum;
    for my $kind (grep { $rounds->[0]{$_} } qw(sf plain bare burn touch)) {
        for my $c (qw(total user kernel nginx libc module other peer), @SYSCALLS) {
            $sum{$kind}{$c} = median(map { $_->{$kind}{$c} } @$rounds);
        }
    }
    for my $c (qw(total user kernel)) {
        for my $base (qw(plain bare)) {
            my @r = map { $_->{$base}{$c} ? $_->{sf}{$c} / $_->{$base}{$c} : undef } @$rounds;
            $sum{"$c/$base"} = [median(@r), median_ci(@r)];
        }
    }
    return \%sum;
}

# the origin on the first CPU (wrk runs there too), or back on all of them
sub pin_origin {
    my ($on) = @_;
    system('taskset', '-a', '-p', '-c', $on ? '0' : '0-' . ($CPUS - 1), $origin->pid,
        ) == 0 or note('taskset failed: the pinned row shares CPUs');
}

# rounds of runs of plain, module and bare, each first in turn
sub wrk_scope {
    my ($row) = @_;
    my ($scope, $env) = split ' ', $row, 2;
    my $sampled = sampled_row($row);
    my $pinned = ($env // '') eq $PINNED || $sampled;
    $env = '' if $pinned;
    local $ENV{SF_NGINX_ENV} = $env // '';
    my $t = SFTest->new(module => $MODULE);
    $t->write_config(conf(scope => $scope, pinned => $pinned, controls => $sampled));
    $t->start;
    # and an nginx without the module, the same otherwise ("bare")
    my $b = SFTest->new(module => $MODULE);
    $b->write_config(conf(nomod => 1, pinned => $pinned));
    $b->start;
    pin_origin(1) if $pinned;
    my %server = (sf => $t, plain => $t, bare => $b, burn => $t, touch => $t);
    my @kinds = ('plain', 'sf', 'bare', ($sampled ? ('burn', 'touch') : ()));
    my %r;
    for my $size (@WRK_SIZES) {
        my (@ratio, @bratio, @cratio, @pcratio, @p99ratio, @bp99ratio, @sf, @plain, @bare, %perf);
        for my $i (1 .. $opt{pairs}) {
            # each kind first in turn
            my @order = map { $kinds[($_ + $i) % @kinds] } 0 .. $#kinds;
            my %w;
            for my $kind (@order) {
                my $s = $server{$kind};
                my $prefix = "$KIND{$kind}[0]-$$-$scope-$size-$i";
                my $f0 = minflt($s);
                my $c0 = cputime($s);
                my $perf = $sampled ? $s->path("perf-$kind.data") : undef;
                $w{$kind} = wrk_run($s->port(0), $prefix, $size, $pinned, $perf);
                if ($w{$kind} && $perf) {
                    $w{$kind}{perf} = perf_split($perf, $w{$kind}{requests});
                }
                if ($w{$kind}) {
                    my $n = $w{$kind}{requests} || 1;
                    $w{$kind}{faults} = (minflt($s) - $f0) / $n;
                    $w{$kind}{cpu} = (cputime($s) - $c0) / $n * 1e6;
                }
            }
            next unless $w{sf} && $w{plain} && $w{plain}{rps} && $w{bare} && $w{bare}{rps};
            push @ratio, $w{sf}{rps} / $w{plain}{rps};
            push @cratio, $w{sf}{cpu} / $w{bare}{cpu} if $w{bare}{cpu};
            push @pcratio, $w{sf}{cpu} / $w{plain}{cpu} if $w{plain}{cpu};
            push @bratio, $w{sf}{rps} / $w{bare}{rps};
            push @p99ratio, $w{sf}{p99_us} / $w{plain}{p99_us} if $w{plain}{p99_us};
            push @bp99ratio, $w{sf}{p99_us} / $w{bare}{p99_us} if $w{bare}{p99_us};
            if ($w{sf}{perf} && $w{plain}{perf} && $w{bare}{perf}) {
                push @{$perf{rounds}}, { map { ($_ => $w{$_}{perf}) } grep { $w{$_} } qw(sf plain bare burn touch) };
            }
            push @sf, $w{sf};
            push @plain, $w{plain};
            push @bare, $w{bare};
            note(sprintf('wrk %-7s %6d B round %d: plain %.0f req/s p99 %.2f ms, '
                . 'module %.0f req/s p99 %.2f ms, bare %.0f req/s p99 %.2f ms',
                $scope, $size, $i, $w{plain}{rps}, $w{plain}{p99_us} / 1000,
                $w{sf}{rps}, $w{sf}{p99_us} / 1000, $w{bare}{rps}, $w{bare}{p99_us} / 1000));
        }
        $r{$size} = {
            ratio => median(@ratio),
            ratio_ci => [median_ci(@ratio)],
            bratio_ci => [median_ci(@bratio)],
            p99ratio => median(@p99ratio),
            p99ratio_ci => [median_ci(@p99ratio)],
            bp99ratio => median(@bp99ratio),
            bp99ratio_ci => [median_ci(@bp99ratio)],
            cratio_ci => [median_ci(@cratio)],
            sf_rps => median(map { $_->{rps} } @sf),
            plain_rps => median(map { $_->{rps} } @plain),
            sf_p50 => median(map { $_->{p50_us} } @sf),
            plain_p50 => median(map { $_->{p50_us} } @plain),
            sf_p99 => median(map { $_->{p99_us} } @sf),
            plain_p99 => median(map { $_->{p99_us} } @plain),
            sf_faults => median(map { $_->{faults} } @sf),
            plain_faults => median(map { $_->{faults} } @plain),
            bratio => median(@bratio),
            bare_rps => median(map { $_->{rps} } @bare),
            bare_p99 => median(map { $_->{p99_us} } @bare),
            sf_cpu => median(map { $_->{cpu} } @sf),
            bare_cpu => median(map { $_->{cpu} } @bare),
            plain_cpu => median(map { $_->{cpu} } @plain),
            cratio => median(@cratio),
            pcratio => median(@pcratio),
            perf => perf_summary($perf{rounds}),
            errors => eval { my $e = 0; $e += $_->{errors} for @sf, @plain, @bare; $e },
            pairs => scalar @ratio,
        };
    }
    pin_origin(0) if $pinned;
    $t->stop;
    $b->stop;
    return \%r;
}

# ---------------------------------------------------------- run

my $t0 = time;
my (%cg, %wrk);

if ($opt{callgrind} && $HAVE_CG) {
    # each size, and with --browser, --cookie and --cache-hit their rows:
    # [key in %cg, size, request headers, a cache hit]
    for my $row ((map { [$_, $_, undef] } @SIZES),
                 ($opt{browser} ? (["$BROWSER_SIZE-browser", $BROWSER_SIZE, 'browser']) : ()),
                 ($opt{cookie} ? (["$COOKIE_SIZE-cookie", $COOKIE_SIZE, 'cookie']) : ()),
                 ($opt{conditional} ? (["$CONDITIONAL_SIZE-conditional", $CONDITIONAL_SIZE, 'conditional']) : ()),
                 ($opt{cache_hit} ? (map { ["$_-hit", $_, undef, 1] } @HIT_SIZES) : ())) {
        my ($key, $size, $headers, $hit) = @$row;
        $cg{$key} = callgrind_size($size, '', 0, $headers, $hit);
        # the same plain location in an nginx that has no module loaded
        my $bare = callgrind_size($size, '', 1, $headers, $hit);
        $cg{$key}{bare} = $bare->{plain};
        $cg{$key}{bare_i1} = $bare->{plain_i1};
        note(sprintf('callgrind %7d B%s%s: module %.0f, plain %.0f, plain without the module %.0f instructions/request',
            $size, $headers ? ", a $headers request's headers" : '', $hit ? ', a cache hit' : '',
            $cg{$key}{sf} // 0, $cg{$key}{plain} // 0, $cg{$key}{bare} // 0));
    }
    # past singleflight_memory (256k): unstored only when the operator says so
    my @big = grep { $_ > 256 * 1024 } @SIZES;
    for my $size (@big) {
        $cg{"$size-lazy"} = callgrind_size($size, 'singleflight_lazy 4m;');
        note(sprintf('callgrind %7d B, singleflight_lazy 4m: module %.0f, plain %.0f',
            $size, $cg{"$size-lazy"}{sf} // 0, $cg{"$size-lazy"}{plain} // 0));
    }
}

if ($opt{wrk} && $HAVE_WRK) {
    $wrk{$_} = wrk_scope($_) for @SCOPES;
}

# ---------------------------------------------------------- report

my @OUT;
sub out { push @OUT, @_ }

my $facts = SFTest::machine_facts($NGINX);
my ($host, $nginx_v, $git) = @$facts{qw(host nginx_v git)};

out("# The cost of a lone request, " . strftime('%Y-%m-%d', localtime) . ", $host", '');
out('* date: ' . strftime('%Y-%m-%d %H:%M:%S %Z', localtime));
out("* machine: $facts->{machine}");
out("* nginx: $nginx_v ($NGINX); module at git $git");
out('* origin: bench/origin.c, delay 0, upstream keepalive 256; every request a URI never asked before');
out("* the module's location: `singleflight_lone $opt{lone};`") if $opt{lone};
out('* command: `perl -I t/lib bench/lone.pl' . (@GIVEN ? " @GIVEN" : '') . '`'
    . ($ENV{MAKELEVEL} ? ' (from `make bench`)' : ''));
out(sprintf('* run time: %ds', time - $t0));
out("* skipped: $_") for @SKIPPED;
out('');

if (%cg) {
    out('## Instructions per request (callgrind)', '',
        "valgrind --tool=callgrind, nginx with master_process off and 1 worker; $opt{requests} sequential "
        . 'keep-alive requests (one curl) per location, between `callgrind_control --zero` and `--dump`. '
        . 'User-space instructions of the whole process per request.  *plain*: the plain location of the '
        . 'same nginx, run after the module\'s; *bare*: the same location in an nginx without the module '
        . 'loaded, a run of its own: what a process ran before changes what its requests cost (the state '
        . 'of its heap), and *bare* is what an operator without the module has.'
        . ($opt{browser} ? "  The row with a browser's headers: each request with the 14 headers of Firefox 128's "
            . 'request for a page instead of curl\'s 3 (Host, User-Agent, Accept); the module looks at each '
            . 'header of a request (for credentials and its own CDN-Loop name).' : '')
        . ($opt{cookie} ? '  The row with a cookie: each request carries a `Cookie` header, credentials, '
            . 'which the default `singleflight_credentials http` collapses by HTTP\'s rules as any request.' : '')
        . ($opt{conditional} ? '  The row with `If-None-Match`: a browser\'s revalidation of a page whose '
            . 'validator changed, answered 200 by the origin.' : '')
        . ($opt{cache_hit} ? '  The rows of a cache hit: both locations (and *bare*\'s) with `proxy_cache` and '
            . '`proxy_cache_valid 200 1h`, every request the same URI, answered from the cache.' : ''), '',
        '| body | plain proxy_pass | singleflight | module / plain | bare proxy_pass | module / bare |',
        '|---|--:|--:|--:|--:|--:|');
    for my $key (@SIZES, "$BROWSER_SIZE-browser", "$COOKIE_SIZE-cookie", "$CONDITIONAL_SIZE-conditional",
                 (map { "$_-hit" } @HIT_SIZES),
                 (map { "$_-lazy" } grep { $_ > 256 * 1024 } @SIZES)) {
        my $r = $cg{$key} or next;
        my ($size, $lazy, $browser, $cookie, $cond, $hit)
            = $key =~ /^(\d+)(-lazy)?(-browser)?(-cookie)?(-conditional)?(-hit)?$/;
        my $label = $size % 1024 == 0 ? ($size >= 1048576 ? ($size / 1048576) . ' MiB' : ($size / 1024) . ' KiB')
                                      : "$size B";
        $label .= ', `singleflight_lazy 4m`' if $lazy;
        $label .= ', a browser\'s 14 request headers' if $browser;
        $label .= ', a `Cookie`' if $cookie;
        $label .= ', `If-None-Match`' if $cond;
        $label .= ', a `proxy_cache` hit' if $hit;
        $label .= ' (stored: past singleflight_memory)' if !$lazy && $size > 256 * 1024;
        my $bare = $lazy ? $cg{$size}{bare} : $r->{bare};
        out(sprintf('| %s | %s | %s | %s | %s | %s |', $label,
            $r->{plain} ? sprintf('%.0f', $r->{plain}) : '—',
            $r->{sf} ? sprintf('%.0f', $r->{sf}) : '—',
            $r->{sf} && $r->{plain} ? sprintf('%.3f', $r->{sf} / $r->{plain}) : '—',
            $bare ? sprintf('%.0f', $bare) : '—',
            $r->{sf} && $bare ? sprintf('%.3f', $r->{sf} / $bare) : '—'));
    }
    out('');
    cache_table() if $opt{cache_sim};
}

# --cache-sim: what the instructions above cost in the first-level
# instruction cache (valgrind's model of this CPU's caches; the kernel's
# code, which runs between a request's steps, is not in it)
sub cache_table {
    out('## Instruction cache misses per request (callgrind --cache-sim=yes)', '',
        'The same runs with valgrind\'s cache model: misses of the first-level instruction cache (I1) per '
        . 'request, about how many 64-byte lines of code a request runs through that were not in that cache.  '
        . 'Each costs the time of a fetch from the next level; the kernel\'s code, which runs between a '
        . 'request\'s steps and evicts nginx\'s, is not in the model, so the real count is higher.  '
        . '*in the module\'s code*: the module\'s misses that fell in its own object; the rest of '
        . '*module - bare* is nginx\'s and libc\'s code, run more or evicted by the module\'s.', '',
        '| body | plain | module | bare | module - bare | in the module\'s code | instructions module - bare |',
        '|---|--:|--:|--:|--:|--:|--:|');
    for my $size (@SIZES) {
        my $r = $cg{$size} or next;
        next unless defined $r->{sf_i1} && defined $r->{bare_i1};
        out(sprintf('| %d | %.0f | %.0f | %.0f | %+.0f | %.0f | %+.0f |', $size,
            $r->{plain_i1} // 0, $r->{sf_i1}, $r->{bare_i1}, $r->{sf_i1} - $r->{bare_i1},
            $r->{sf_i1_module} // 0, ($r->{sf} // 0) - ($r->{bare} // 0)));
    }
    out('');
}

if (%wrk) {
    out('## Throughput and latency with unique keys (wrk)', '',
        "2 workers; wrk -t1 -c$opt{conns} -d$opt{duration}s, bench/unique.lua; $opt{pairs} rounds per row "
        . 'of plain, module and bare (an nginx without the module, started alongside), each first in turn; '
        . 'medians.  Latencies in ms.  Faults: the workers\' minor page faults per request during the run.  '
        . 'CPU: the workers\' user and system time per request during the run (/proc, 10 ms ticks), in µs, '
        . 'and the medians of the rounds\' ratios; unlike requests/s it does not depend on who else had the '
        . 'CPUs, but from one run to the next it moves by 10-15% here.  *pinned*: 1 worker, '
        . '`worker_cpu_affinity 10`, wrk and the origin on the other CPU (`taskset -c 0`).  *pinned, perf*: '
        . 'the same again with `perf record` sampling the worker\'s CPU (`--perf`): the worker is then '
        . 'saturated for every kind, and requests/s follow its CPU time per request.', '',
        '| scope | body | plain req/s | module req/s | module / plain (median of rounds) | plain p50 | module p50 | plain p99 | module p99 | p99 module / plain | plain faults | module faults | bare req/s | module / bare | bare p99 | p99 module / bare | plain CPU | bare CPU | module CPU | CPU module / plain | CPU module / bare | errors |',
        '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
    wrk_rows(sub {
        my ($scope, $size, $r) = @_;
        out(sprintf('| %s | %d | %.0f | %.0f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.3f | %.2f | %.2f | %.1f | %.1f | %.1f | %.3f | %.3f | %d |',
            scope_label($scope, 'nginx started with '),
            $size, $r->{plain_rps}, $r->{sf_rps}, $r->{ratio},
            $r->{plain_p50} / 1000, $r->{sf_p50} / 1000, $r->{plain_p99} / 1000, $r->{sf_p99} / 1000,
            $r->{plain_p99} ? $r->{sf_p99} / $r->{plain_p99} : 0,
            $r->{plain_faults} // 0, $r->{sf_faults} // 0,
            $r->{bare_rps}, $r->{bratio}, $r->{bare_p99} / 1000,
            $r->{bare_p99} ? $r->{sf_p99} / $r->{bare_p99} : 0,
            $r->{plain_cpu} // 0, $r->{bare_cpu} // 0, $r->{sf_cpu} // 0,
            $r->{pcratio} // 0, $r->{cratio} // 0, $r->{errors}));
    });
    out('');
}

# each row of the wrk tables that has rounds: f(scope, body size, results)
sub wrk_rows {
    my ($f) = @_;
    for my $scope (@SCOPES) {
        for my $size (@WRK_SIZES) {
            my $r = $wrk{$scope}{$size} or next;
            $f->($scope, $size, $r) if $r->{pairs};
        }
    }
}

# a row's scope as the tables name it; "process ENV" tells how nginx was
# started, after $how
sub scope_label {
    my ($scope, $how) = @_;
    return 'process pinned, perf' if sampled_row($scope);
    return $scope if $scope =~ / \Q$PINNED\E$/;
    return $scope =~ s/ (.*)/, $how`$1`/r;
}

# a median of the rounds' ratios and its interval, and where the interval
# lies against a target: "met" when all of it is on the target's side
sub ci_cell {
    my ($median, $ci) = @_;
    return '—' unless defined $median;
    return sprintf('%.3f', $median) unless @$ci && defined $ci->[0];
    return sprintf('%.3f [%.3f, %.3f]', $median, @$ci[0, 1]);
}

# the targets are not read from the row that perf slows
sub sampled_or {
    my ($scope, $verdict) = @_;
    return sampled_row($scope) ? 'not a target row (perf)' : $verdict;
}

sub verdict {
    my ($ci, $target, $low_is_good) = @_;
    return '—' unless @$ci;
    my ($lo, $hi, $coverage) = @$ci;
    # under 5 rounds the interval is no 90% one
    return 'too few rounds' if $coverage < 0.9;
    if ($low_is_good) {
        return $hi <= $target ? 'met' : $lo > $target ? 'missed' : 'not settled';
    }
    return $lo >= $target ? 'met' : $hi < $target ? 'missed' : 'not settled';
}

if (%wrk) {
    out('## The wrk targets, round by round', '',
        'Each round gives one ratio per pair of runs next to each other in time; the table has their '
        . 'median and a distribution-free confidence interval for it (order statistics of the binomial '
        . 'distribution; its coverage in the column, 95% or a little more, less under 6 rounds). A target is '
        . '*met* when the whole interval is on its side, *missed* when the whole interval is on the other '
        . 'side, and *not settled* otherwise: more rounds narrow the interval (under 5 rounds, no verdict).  '
        . 'Targets: requests/s at least '
        . '0.97 of plain\'s, p99 at most 1.10 of plain\'s.', '',
        '| scope | body | rounds | coverage | req/s module / plain | ≥ 0.97 | p99 module / plain | ≤ 1.10 | req/s module / bare | p99 module / bare | CPU module / bare |',
        '|---|--:|--:|--:|--:|---|--:|---|--:|--:|--:|');
    wrk_rows(sub {
        my ($scope, $size, $r) = @_;
        out(sprintf('| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |',
            scope_label($scope, ''),
            $size, $r->{pairs},
            @{$r->{ratio_ci}} ? sprintf('%.1f%%', 100 * $r->{ratio_ci}[2]) : '—',
            ci_cell($r->{ratio}, $r->{ratio_ci}), sampled_or($scope, verdict($r->{ratio_ci}, 0.97, 0)),
            ci_cell($r->{p99ratio}, $r->{p99ratio_ci}), sampled_or($scope, verdict($r->{p99ratio_ci}, 1.10, 1)),
            ci_cell($r->{bratio}, $r->{bratio_ci}),
            ci_cell($r->{bp99ratio}, $r->{bp99ratio_ci}),
            ci_cell($r->{cratio}, $r->{cratio_ci})));
    });
    out('');
}

# --perf: the sampled pinned row's CPU time by where it ran
my @PERF_ROWS = grep { sampled_row($_) } @SCOPES;
# each sampled row's perf summary, body by body, kind by kind (those of
# "kinds" it has): $cb->(size, kind, summary)
sub perf_rows {
    my ($kinds, $cb) = @_;
    for my $scope (@PERF_ROWS) {
        for my $size (@WRK_SIZES) {
            my $p = $wrk{$scope}{$size} && $wrk{$scope}{$size}{perf} or next;
            $cb->($size, $_, $p) for grep { $p->{$_} } @$kinds;
        }
    }
}

if (%wrk && $HAVE_PERF && grep { $_ && $_->{perf} } map { values %{ $wrk{$_} } } @PERF_ROWS) {
    out('## Where the pinned worker\'s time goes (perf)', '',
        '`perf record -g -e cpu-clock -F ' . $PERF_HZ . ' -C 1` around each run of the *pinned, perf* row: samples of '
        . 'the worker\'s CPU taken while nginx ran, by where they fell (the kernel, nginx, libc, the module), '
        . 'in µs per request, the medians of the rounds; and the medians of the rounds\' ratios with '
        . 'their confidence intervals (as in the table above).', '',
        '| body | kind | total | kernel | nginx | libc | module | other | total / plain | user / plain | kernel / plain | total / bare | user / bare |',
        '|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
    perf_rows([qw(plain bare sf)], sub {
        my ($size, $kind, $p) = @_;
        my $k = $p->{$kind};
        out(sprintf('| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |',
            $size, $KIND{$kind}[1], @$k{qw(total kernel nginx libc module other)},
            $kind eq 'sf' ? (map { ci_cell($p->{$_}[0], [@{$p->{$_}}[1 .. 3]]) }
                             qw(total/plain user/plain kernel/plain total/bare user/bare))
                          : ('', '', '', '', '')));
    });
    out('', 'The kernel\'s part by the system call it ran under (the outermost frame of each sample\'s '
        . 'call chain: writes are writev and sendfile, reads recvfrom and readv), µs per request, the '
        . 'medians of the rounds.  Over loopback a write also runs its receiver\'s side of TCP '
        . '(wrk\'s or the origin\'s socket, in the softirq under the write): *receiver* is that part of '
        . '*writes*, work that a network card would leave to the receiving machine. '
        . "*control*: the plain location with $BURN regular expressions added that fail (user-space work "
        . 'and nothing else, about as much as the module adds at 10,000 B): what a slower worker alone '
        . "costs in the kernel.  *footprint*: the plain location with $FOOTPRINT strings of 1,000 bytes "
        . 'made per request instead (about 6 KB of new memory; the module\'s structures are mostly memory '
        . 'it uses again, and 6 KB more of that cost nothing: results/2026-11-27-vm-kernel-probes-1.md).', '',
        '| body | kind | user | kernel | writes | of it, receiver | reads | epoll | other | user - plain | kernel - plain | writes - plain | receiver - plain |',
        '|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
    perf_rows([qw(plain bare burn touch sf)], sub {
        my ($size, $kind, $p) = @_;
        my ($k, $pl) = ($p->{$kind}, $p->{plain});
        out(sprintf('| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s |',
            $size, $KIND{$kind}[1],
            @$k{'user', 'kernel', 'sys_write', 'peer', grep { $_ ne 'sys_write' } @SYSCALLS},
            $kind eq 'plain' ? ('', '', '', '')
                : map { sprintf('%+.2f', $k->{$_} - $pl->{$_}) } qw(user kernel sys_write peer)));
    });
    out('');
}

my $text = join("\n", @OUT) . "\n";
print $text;
my $file = $opt{out} // SFTest::results_file(strftime('%Y-%m-%d', localtime) . "-$host-lone");
if (open(my $fh, '>', $file)) {
    print $fh $text;
    close($fh);
    note("results: $file");
}
