#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/stream.pl - the streaming table and the burst of
# wake-ups, each measured against its baseline in the same run.
#
#   perl -I t/lib bench/stream.pl [--sizes 16,256] [--clients 50]
#       [--servers plain,singleflight,varnish,static] [--no-varnish]
#       [--no-burst] [--burst-workers CORES] [--burst-flights 30,300]
#       [--burst-clients 10] [--pace 3000] [--gap 0.3]
#       [--repeat 3] [--http-conf 'DIRECTIVES'] [--out FILE]
#
# SF_BENCH_ARGS="--quick" in the environment (make bench's quick mode):
# --sizes 16 --repeat 1 --burst-flights 30 unless given otherwise.
# --sizes '' runs the burst alone; --servers picks the streaming rows;
# --http-conf adds directives to the streaming nginx's servers.
#
# Streaming: 50 clients ask for one object whose body the origin sends
# over 3 s (bench/origin.c pace=3000), the second to the last 0.3 s after
# the first, against plain proxy_pass, this module with its defaults, and
# Varnish (the response cacheable for it, its own request coalescing and
# streaming); nginx with "sendfile on; tcp_nopush on;" as Debian's
# nginx.conf has it.  Clients are processes forked and connected before
# the run, each writing its HTTP/1.0 request at its moment and reading as
# fast as it can.  Reported: origin fetches, flights led (the module's
# $singleflight_status), when the last follower could send its request,
# follower first byte (from its own request) p50/p99, follower last byte
# p99 and the first client's last byte (from the first request), and the
# peak over the run of the servers' resident memory plus the disk their
# temporary files used.  Then the same with a first client that reads
# nothing (a socket with a 64k receive buffer) until the others are done.
# A row of the same clients reading a file nginx serves itself shows how
# fast this machine delivers the copies at all.
#
# Burst: 30, then 300 flights with 4 clients each, in random order over 4
# workers, whose responses the origin writes in one loop (hold=1,
# /_release), the clients bench/herd (one epoll loop, its own clock).
# Each follower's answer time minus its leader's, p99 for followers in the
# leader's worker and in the others (X-SF and X-Pid response headers); the
# same from the access log's $msec, which is the time a worker's event
# loop woke; and each group's answers from the burst's first one.
#
# Results go to stdout and, as Markdown, to --out (default
# bench/results/DATE-HOST-stream.md).

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use Getopt::Long qw(GetOptions);
use IO::Socket::INET;
use POSIX qw(strftime WNOHANG);
use Socket qw(SOL_SOCKET SO_RCVBUF);
use Time::HiRes qw(time sleep);

use SFTest;

Test::More->builder->no_ending(1);    # a benchmark: no plan, no verdict

# the burst runs as many workers as the machine has cores
sub cores {
    open(my $fh, '<', '/proc/cpuinfo') or return 2;
    my $n = grep { /^processor\s*:/ } <$fh>;
    return $n || 2;
}

my %opt = (sizes => '16,256', clients => 50, pace => 3000, gap => 0.3, repeat => 3,
           servers => 'plain,singleflight,varnish,static', varnish => 1, 'http-conf' => '',
           burst => 1, 'burst-workers' => cores(), 'burst-flights' => '30,300',
           'burst-clients' => 10);
# make bench passes no arguments: SF_BENCH_ARGS="--quick" (bench.pl's) makes
# this a minute's run too, at 16 MiB once and a burst of 30 flights
my $quick = ($ENV{SF_BENCH_ARGS} // '') =~ /--quick\b/;
@opt{qw(sizes repeat burst-flights)} = ('16', 1, '30') if $quick;
GetOptions(\%opt, 'sizes=s', 'clients=i', 'pace=i', 'gap=f', 'repeat=i', 'servers=s',
           'varnish!', 'http-conf=s', 'burst!', 'burst-workers=i', 'burst-flights=s',
           'burst-clients=i', 'out=s')
    or die "usage: $0 [--sizes 16,256] [--clients 50] [--pace MS] [--gap S] [--repeat N]\n"
         . "    [--servers LIST] [--no-varnish] [--http-conf DIRECTIVES] [--no-burst]\n"
         . "    [--burst-workers N] [--burst-flights N,...] [--burst-clients N] [--out FILE]\n";

my $REPO = abs_path(dirname(abs_path($0)) . '/..');
my $BIN = "$REPO/build/bench";
make_path($BIN);
SFTest::c_tool($_) for qw(origin herd);
system('cp', $ENV{SF_MODULE} // "$REPO/build/ngx_http_singleflight_module.so", "$BIN/sf-stream.so") == 0
    or die "no module: make build\n";

my @report;
sub say { print "$_[0]\n"; push @report, $_[0] }

my $t = SFTest->new(module => "$BIN/sf-stream.so");
my $origin = $t->start_origin(program => "$BIN/origin");
my $ORIGIN = $origin->addr;

(my $stream_conf = <<'EOT') =~ s/%%HTTP_CONF%%/$opt{'http-conf'}/g;
    upstream origin { server %%ORIGIN%%; keepalive 16; }

    # as Debian's nginx.conf has it
    sendfile on;
    tcp_nopush on;

    singleflight_zone zone=sf:16m;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;

    server {
        listen 127.0.0.1:%%PORT%%;
        %%HTTP_CONF%%
        location / {
            singleflight sf;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://origin;
        }
        location = /stats { singleflight_stats; }
    }

    server {
        listen 127.0.0.1:%%PORT_1%%;
        %%HTTP_CONF%%
        location /static/ { root %%TESTDIR%%; }
        location / {
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://origin;
        }
    }
EOT
$t->write_config($t->config_template($stream_conf, workers => 2, log_singleflight => 1));
$t->start;

# ---------------------------------------------------------- Varnish

my ($varnish_pid, $varnish_port, $vdir);
if ($opt{varnish} && -x '/usr/sbin/varnishd') {
    $vdir = $t->path('varnish');
    make_path($vdir);
    $varnish_port = 20000 + int rand 20000;
    my ($oh, $op) = split /:/, $ORIGIN;
    $t->write_file('default.vcl', <<"EOT");
vcl 4.1;
backend origin { .host = "$oh"; .port = "$op"; .first_byte_timeout = 30s; .between_bytes_timeout = 30s; }
EOT
    $varnish_pid = fork // die;
    if (!$varnish_pid) {
        open(STDOUT, '>', $t->path('varnish.out')); open(STDERR, '>&', \*STDOUT);
        exec('/usr/sbin/varnishd', '-F', '-n', $vdir, '-a', "127.0.0.1:$varnish_port",
             '-f', $t->path('default.vcl'), '-s', 'malloc,1200m', '-p', 'thread_pool_min=60');
        exit 127;
    }
    if (!$t->wait_for(sub { IO::Socket::INET->new("127.0.0.1:$varnish_port") }, timeout => 20,
                      what => 'varnishd')) {
        # no peer rather than a peer of zeros: its rows and target left out
        my $out = $t->read_file('varnish.out') // '';
        print STDERR "# varnishd did not start, no Varnish rows: $out\n";
        kill 'TERM', $varnish_pid;
        waitpid($varnish_pid, 0);
        ($varnish_pid, $varnish_port) = (0, undef);
    }
}
END { if ($varnish_pid) { kill 'TERM', $varnish_pid; waitpid($varnish_pid, 0) } }

# ---------------------------------------------------------- measuring

sub pct {
    my ($p, @v) = @_;
    return undef unless @v;
    @v = sort { $a <=> $b } @v;
    return $v[ int(($p / 100) * $#v + 0.5) ];
}

# resident memory of the processes behind a port, in bytes
sub server_pids {
    my ($which) = @_;
    return ($t->worker_pids) if $which ne 'varnish';
    my @p = grep { /^\d+$/ } map { (split)[0] } `ps -o pid= --ppid $varnish_pid 2>/dev/null`;
    return ($varnish_pid, @p);
}

sub rss {
    my $sum = 0;
    for my $pid (@_) {
        open(my $fh, '<', "/proc/$pid/status") or next;
        while (<$fh>) { $sum += $1 * 1024 if /^VmRSS:\s+(\d+)/ }
    }
    return $sum;
}

sub disk {
    my $d = $t->testdir;
    my $kb = `du -sk $d/sf_temp $d/proxy_temp 2>/dev/null | awk '{s+=\$1} END {print s+0}'`;
    return ($kb // 0) * 1024;
}

# a sampler in a child: peak rss + disk over the run, written at the end
sub sampler {
    my ($which, $file) = @_;
    my $pid = fork // die;
    return $pid if $pid;
    my @pids = server_pids($which);
    my ($mem, $dsk) = (0, 0);
    local $SIG{TERM} = sub {
        open(my $fh, '>', $file); print $fh "$mem $dsk\n"; close $fh; POSIX::_exit(0);
    };
    while (1) {
        my ($m, $d) = (rss(@pids), disk());
        $mem = $m if $m > $mem;
        $dsk = $d if $d > $dsk;
        sleep 0.02;
    }
}

# A client: a process forked before the run starts, idle until its
# moment, then one HTTP/1.0 request read to its end as fast as it can.
# (Clients forked or exec'd as the run goes arrive late: with the machine
# busy sending the first bodies, curl processes started 0.3 s after the
# first request came in up to 3 s later, after the origin was done, and
# rightly led a flight of their own.)  Writes "status body_bytes sent
# first_byte last_byte", the times absolute.
sub client {
    my ($port, $uri, $at, $out) = @_;
    my $pid = fork // die;
    return $pid if $pid;
    # connected beforehand: at its moment it only writes its request
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or POSIX::_exit(1);
    my $w = $at - time;
    sleep $w if $w > 0;
    my $sent = time;
    # the Host curl would send: the default key is the same for everyone
    syswrite($s, "GET $uri HTTP/1.0\r\nHost: 127.0.0.1:$port\r\n\r\n");
    my ($buf, $head, $first, $n, $status) = (q(), q(), undef, 0, undef);
    while (1) {
        my $got = sysread($s, $buf, 1 << 20);
        last unless $got;
        $first //= time;
        if (!defined $status) {
            $head .= $buf;
            my $e = index($head, "\r\n\r\n");
            next if $e < 0;
            ($status) = $head =~ m{^HTTP/\d\.\d (\d+)};
            $status //= 0;
            $n = length($head) - $e - 4;
            $head = '';
            next;
        }
        $n += $got;
    }
    my $last = time;
    open(my $fh, '>', $out) or POSIX::_exit(1);
    printf $fh "%d %d %.6f %.6f %.6f\n", $status // 0, $n, $sent, $first // $last, $last;
    close $fh;
    POSIX::_exit(0);
}

my $run = 0;

# one row: returns a hash of results
sub stream_row {
    my ($which, $port, $size, %o) = @_;
    $run++;
    my $bytes = $size * 1024 * 1024;
    my $uri = "/o$run-$which?size=$bytes&pace=$opt{pace}&hdr=Cache-Control:%20max-age%3D600";
    if ($which eq 'static') {
        # a file nginx sends itself: how fast this machine serves the copies
        make_path($t->path('static'));
        $uri = "/static/$size.bin";
        if (!-e $t->path("static/$size.bin")) {
            open(my $fh, '>', $t->path("static/$size.bin")) or die;
            my $block = join('', map { chr(32 + $_ % 90) } 0 .. 65535);
            print $fh $block for 1 .. $bytes / 65536;
            close $fh;
        }
    }
    my $dir = $t->path("run$run");
    make_path($dir);
    my $base = rss(server_pids($which));
    my $sp = sampler($which, "$dir/peak");
    my $hits0 = $origin->hits->{total};

    # every client is forked first and fires at its moment
    my $t0 = time + 1;
    my ($stalled, @kids);
    push @kids, client($port, $uri, $t0, "$dir/0") unless $o{stall};
    push @kids, client($port, $uri, $t0 + $opt{gap}, "$dir/$_") for 1 .. $opt{clients} - 1;
    my $w = $t0 - time;
    sleep $w if $w > 0;
    if ($o{stall}) {
        $stalled = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die;
        setsockopt($stalled, SOL_SOCKET, SO_RCVBUF, 65536);
        print $stalled "GET $uri HTTP/1.0\r\nHost: 127.0.0.1:$port\r\n\r\n";
    }
    waitpid($_, 0) for @kids;
    my $end = time;
    my $stalled_bytes = 0;
    if ($stalled) {
        # now it reads, to the end
        $stalled->blocking(1);
        while (sysread($stalled, my $buf, 1 << 20)) { $stalled_bytes += length $buf }
        close $stalled;
    }
    kill 'TERM', $sp;
    waitpid($sp, 0);
    my ($peak, $peak_disk) = split ' ', (do { open(my $fh, '<', "$dir/peak"); <$fh> } // '0 0');

    my (@first, @last, $leader_last, $bad, $late);
    for my $i (0 .. $opt{clients} - 1) {
        next if $o{stall} && $i == 0;
        open(my $fh, '<', "$dir/$i") or do { $bad++; next };
        my ($code, $len, $sent, $fb, $lb) = split ' ', (<$fh> // '');
        $bad++ unless ($code // 0) == 200 && ($len // 0) == $bytes;
        next unless defined $lb;
        if ($i == 0) { $leader_last = $lb - $t0; next }
        push @first, $fb - $sent;
        push @last, $lb - $t0;
        # sent later than asked: the machine was too busy to start it
        $late = $sent - $t0 if !defined $late || $sent - $t0 > $late;
    }
    $bad++ if $o{stall} && $stalled_bytes < $bytes;    # headers + body
    # flights led, from the access log ($singleflight_status)
    my $flights = 0;
    if (open(my $lf, '<', $t->path('access.log'))) {
        while (<$lf>) { $flights++ if index($_, $uri) >= 0 && /sf=LEADER/ }
    }
    return {
        fetches => $origin->hits->{total} - $hits0,
        first50 => pct(50, @first) * 1000, first99 => pct(99, @first) * 1000,
        last99  => pct(99, @last), leader => $leader_last,
        peak    => $peak - $base, disk => $peak_disk, bad => $bad // 0, took => $end - $t0,
        flights => $flights, latest => $late // 0,
    };
}

my %port = (plain => $t->port(1), singleflight => $t->port(0), static => $t->port(1),
            ($varnish_port ? (varnish => $varnish_port) : ()));
my %want = map { $_ => 1 } split /,/, $opt{servers};
my @rows = grep { $port{$_} && $want{$_} } qw(plain singleflight varnish static);

my $host = `hostname`; chomp $host;
my $cpu = `grep -m1 'model name' /proc/cpuinfo`; $cpu =~ s/.*:\s*//; chomp $cpu;
my $cores = `nproc`; chomp $cores;
my $commit = `git -C $REPO describe --always --dirty 2>/dev/null`; chomp $commit;
my $nv = `/usr/sbin/nginx -v 2>&1`; chomp $nv;
my $vv = $varnish_port ? `/usr/sbin/varnishd -V 2>&1 | head -1` : 'none'; chomp $vv;

say("# Streaming and burst benchmarks, " . strftime('%Y-%m-%d %H:%M UTC', gmtime));
say('');
say("Machine: $host, $cores cores, $cpu.  $nv, $vv, module $commit.");
say("Command: `perl -I t/lib bench/stream.pl --sizes '$opt{sizes}' --clients $opt{clients}"
    . " --servers $opt{servers} --pace $opt{pace} --gap $opt{gap} --repeat $opt{repeat}"
    . ($opt{varnish} ? '' : ' --no-varnish')
    . ($opt{burst} ? " --burst-workers $opt{'burst-workers'} --burst-flights $opt{'burst-flights'}"
                     . " --burst-clients $opt{'burst-clients'}" : ' --no-burst')
    . ($opt{'http-conf'} ne '' ? " --http-conf '$opt{'http-conf'}'" : '') . '`');
say('');
say("## Streaming: $opt{clients} clients, body paced over $opt{pace} ms, the others $opt{gap} s after the first");
say('');
say('| size | server | first client | origin fetches | flights | last follower sent (s) | follower first byte p50 / p99 (ms) | follower last byte p99 (s) | first client last byte (s) | peak memory growth (MiB) | peak disk (MiB) | failed |');
say('|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|');

# --repeat N: every row N times, interleaved; the targets take the median
my %res;
for my $size (split /,/, $opt{sizes}) {
    for my $rep (1 .. $opt{repeat}) {
        for my $stall (0, 1) {
            for my $which (@rows) {
                next if $stall && ($which eq 'varnish' || $which eq 'static');
                my $r = stream_row($which, $port{$which}, $size, stall => $stall);
                push @{ $res{$size}{$which}{$stall} }, $r;
                say(sprintf('| %d MiB | %s | %s | %d | %s | %.2f | %.0f / %.0f | %.2f | %s | %.1f | %.0f | %d |',
                    $size, $which eq 'static' ? 'static file' : $which,
                    $stall ? 'reads nothing' : 'reads',
                    $r->{fetches}, $which eq 'singleflight' ? $r->{flights} : '-', $r->{latest},
                    $r->{first50}, $r->{first99}, $r->{last99},
                    defined $r->{leader} ? sprintf('%.2f', $r->{leader}) : '-',
                    $r->{peak} / 1048576, $r->{disk} / 1048576, $r->{bad}));
            }
        }
    }
}

# the runs of a row as one: the median of each number (the most fetches)
sub merged {
    my ($runs) = @_;
    return undef unless $runs && @$runs;
    my %m;
    for my $k (keys %{ $runs->[0] }) {
        my @v = grep { defined } map { $_->{$k} } @$runs;
        $m{$k} = !@v ? undef : $k eq 'fetches' ? (sort { $b <=> $a } @v)[0] : pct(50, @v);
    }
    return \%m;
}

# ---------------------------------------------------------- burst

sub burst {
    my ($nf) = @_;
    my (@same, @other, @same_abs, @other_abs);
    say('');
    my $nw = $opt{'burst-workers'};
    my $nc = $opt{'burst-clients'};
    my $all = $nf * $nc;
    say("## Burst: $nf flights, $nc clients each in random order, $nw workers, all completing at once");
    say('');
    my $bt = SFTest->new(module => "$BIN/sf-stream.so");
    $bt->write_config($bt->config_template(<<~"EOT", workers => $nw));
        log_format burst '\$pid \$msec \$singleflight_status \$request_uri';
        singleflight_zone zone=sf:16m;
        server {
            listen 127.0.0.1:%%PORT%%;
            location / {
                singleflight sf;
                access_log %%TESTDIR%%/burst.log burst;
                add_header X-SF \$singleflight_status always;
                add_header X-Pid \$pid always;
                proxy_pass http://$ORIGIN;
            }
            location = /stats { singleflight_stats; }
        }
    EOT
    $bt->start;
    $bt->wait_for(sub { $bt->worker_pids == $nw }, what => "$nw workers");
    my @paths = map { my $k = $_; map { "/burst$k?size=2000&hold=1" } 1 .. $nc } 1 .. $nf;
    for my $i (reverse 1 .. $#paths) { my $j = int rand($i + 1); @paths[$i, $j] = @paths[$j, $i] }
    $bt->write_file('burst.paths', join("\n", @paths) . "\n");
    my $before = $bt->zone_stats("sf");
    my $hits_burst0 = $origin->hits->{total};

    # the clients: bench/herd, one epoll loop, times from its own clock
    my $herd = fork // die;
    if (!$herd) {
        open(STDOUT, '>', $bt->path('herd.out'));
        { exec("$BIN/herd", '-p', $bt->port(0), '-f', $bt->path('burst.paths'), '-t', 60000,
               '-c', 'X-SF', '-c', 'X-Pid') }
        POSIX::_exit(127);
    }
    $bt->wait_zone(sub { ($_[0]{waiters} // 0) >= $all - $nf }, timeout => 30,
                   what => ($all - $nf) . ' followers');
    $bt->wait_for(sub { ($origin->hits->{held} // 0) >= $nf }, timeout => 30, what => "$nf held");
    {
        my $s = IO::Socket::INET->new($ORIGIN) or die "origin: $!";
        print $s "GET /_release HTTP/1.0\r\n\r\n";
        local $/;
        my $answer = <$s>;
        $answer =~ /"released":\s*(\d+)/ or die "no release: $answer";
    }
    waitpid($herd, 0);
    my $after = $bt->zone_stats('sf');

    # c IDX STATUS BODYLEN HASH SENT_US DONE_US ERR X-SF X-PID
    my (@c, $ok);
    for (split /\n/, $bt->read_file('herd.out')) {
        my @f = split ' ';
        next unless $f[0] eq 'c';
        my %r = (path => $paths[ $f[1] ], status => $f[2], done => $f[6] / 1000,
                 sf => $f[8], pid => $f[9]);
        $ok++ if $r{status} == 200 && $f[7] eq '-';
        push @c, \%r;
    }
    my %st = %{ SFTest::tally(map { $_->{sf} } @c) };
    say('statuses: ' . join(' ', map { "$_=$st{$_}" } sort keys %st));
    my %leader;
    $leader{ $_->{path} } = $_ for grep { $_->{sf} eq 'LEADER' } @c;
    for (grep { $_->{sf} eq 'FOLLOWER' } @c) {
        my $l = $leader{ $_->{path} } or next;
        push @{ $_->{pid} == $l->{pid} ? \@same : \@other }, $_->{done} - $l->{done};
    }

    # the same from nginx's log: $msec is the time its event loop woke up
    my @recs = $bt->wait_log_records('burst.log', [qw(pid msec status uri)], $all);
    # and each group's answers from the burst's first one: is either late?
    my $t_first = (sort { $a <=> $b } map { $_->{done} } @c)[0] // 0;
    @same_abs = map { $_->{done} - $t_first } grep { $_->{sf} eq 'FOLLOWER' && $leader{ $_->{path} } && $_->{pid} == $leader{ $_->{path} }{pid} } @c;
    @other_abs = map { $_->{done} - $t_first } grep { $_->{sf} eq 'FOLLOWER' && $leader{ $_->{path} } && $_->{pid} != $leader{ $_->{path} }{pid} } @c;
    my (%lrec, @lsame, @lother);
    $lrec{ $_->{uri} } = $_ for grep { $_->{status} eq 'LEADER' } @recs;
    for (grep { $_->{status} eq 'FOLLOWER' } @recs) {
        my $l = $lrec{ $_->{uri} } or next;
        push @{ $_->{pid} == $l->{pid} ? \@lsame : \@lother }, ($_->{msec} - $l->{msec}) * 1000;
    }

    say('| followers | count | answered after their leader (client), p50 / p99 / max (ms) | the same from $msec in the log |');
    say('|---|--:|--:|--:|');
    for (['in the leader\'s worker', \@same, \@lsame], ['in other workers', \@other, \@lother]) {
        my ($what, $v, $lv) = @$_;
        say(sprintf('| %s | %d | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f |', $what, scalar @$v,
                    pct(50, @$v) // 0, pct(99, @$v) // 0, pct(100, @$v) // 0,
                    pct(50, @$lv) // 0, pct(99, @$lv) // 0, pct(100, @$lv) // 0));
    }
    say('');
    say(sprintf('Answered after the burst\'s first response, p50 / p99 / max (ms): followers in their leader\'s worker %.1f / %.1f / %.1f, in other workers %.1f / %.1f / %.1f.',
                pct(50, @same_abs) // 0, pct(99, @same_abs) // 0, pct(100, @same_abs) // 0,
                pct(50, @other_abs) // 0, pct(99, @other_abs) // 0, pct(100, @other_abs) // 0));
    say('');
    say(sprintf('%d of %d complete; wake-ups sent %d, failed %d; origin requests %d.',
                $ok // 0, $all, $after->{wakeups} - $before->{wakeups},
                $after->{notify_failed} - $before->{notify_failed},
                $origin->hits->{total} - $hits_burst0));
    say('Client times are bench/herd\'s clock when a response was complete; nginx\'s $msec is');
    say('the time its worker\'s event loop last woke, the same for everything one round serves.');
    return { flights => $nf, same => \@same, other => \@other,
             same_abs => \@same_abs, other_abs => \@other_abs };
}

my @bursts = $opt{burst} ? map { burst($_) } split /,/, $opt{'burst-flights'} : ();

# ---------------------------------------------------------- targets

say('');
say('## Targets (ratios within this run' . ($opt{repeat} > 1 ? ", of the medians of $opt{repeat} runs per row" : '') . ')');
say('');
say('| target | measured | met |');
say('|---|---|---|');
for my $size (split /,/, $opt{sizes}) {
    my $sf = merged($res{$size}{singleflight}{0}) or next;
    my $st = merged($res{$size}{singleflight}{1});
    my $v = merged($res{$size}{varnish}{0});
    say(sprintf('| %d MiB: 1 origin fetch per flight | %d | %s |', $size, $sf->{fetches},
                $sf->{fetches} == 1 ? 'yes' : 'no'));
    if ($v) {
        my $d = $sf->{first99} - $v->{first99};
        say(sprintf('| %d MiB: follower first byte p99 within 20 ms of Varnish\'s | %+.0f ms | %s |',
                    $size, $d, $d <= 20 ? 'yes' : 'no'));
    }
    my $r = $sf->{last99} / $sf->{leader};
    say(sprintf('| %d MiB: follower last byte p99 within 5%% of the first client\'s | %.3f | %s |',
                $size, $r, $r <= 1.05 ? 'yes' : 'no'));
    if (my $sr = merged($res{$size}{static}{0})) {
        # not a target: the fastest the machine sends these copies at all
        my $floor = $sr->{last99} > $sf->{leader} ? $sr->{last99} : $sf->{leader};
        say(sprintf('| %d MiB: (this machine\'s floor) follower last byte p99 / the later of the first client\'s and a static file\'s | %.3f | - |',
                    $size, $sf->{last99} / $floor));
    }
    my $s = $st->{last99} / $sf->{last99};
    say(sprintf('| %d MiB: a first client that reads nothing delays followers < 5%% | %.3f | %s |',
                $size, $s, $s < 1.05 ? 'yes' : 'no'));
    my $m = $sf->{peak} / ($size * 1048576);
    say(sprintf('| %d MiB: peak memory (RSS, shared memory included) growth < 10%% of one body | %.1f%% | %s |',
                $size, 100 * $m, $m < 0.10 ? 'yes' : 'no'));
}
for my $b (@bursts) {
    my ($same, $other) = @$b{qw(same other)};
    my $worst = pct(99, @$other) // 0;
    $worst = pct(99, @$same) // 0 if (pct(99, @$same) // 0) > $worst;
    say(sprintf('| burst of %d flights: every follower within 20 ms (p99) of its leader, whichever worker | %.1f ms | %s |',
                $b->{flights}, $worst, $worst <= 20 ? 'yes' : 'no'));
    my $gap = (pct(99, @$other) // 0) - (pct(99, @$same) // 0);
    say(sprintf('| burst of %d flights: other workers\' p99 within 2 ms of the leader\'s worker\'s (after their leader) | %+.1f ms | %s |',
                $b->{flights}, $gap, $gap <= 2 ? 'yes' : 'no'));
    ($same, $other) = @$b{qw(same_abs other_abs)};
    my $agap = (pct(99, @$other) // 0) - (pct(99, @$same) // 0);
    say(sprintf('| burst of %d flights: the same, answered after the burst\'s first response | %+.1f ms | %s |',
                $b->{flights}, $agap, $agap <= 2 ? 'yes' : 'no'));
}

my $out = $opt{out}
    // SFTest::results_file(strftime("%Y-%m-%d-$host-stream", gmtime) . ($quick ? '-quick' : ''));
open(my $fh, '>', $out) or die "$out: $!";
print $fh join("\n", @report), "\n";
close $fh;
print "written to $out\n";

SFTest::_finalize_all();
if ($varnish_pid) { kill 'TERM', $varnish_pid; waitpid($varnish_pid, 0); $varnish_pid = 0 }
exit 0;
