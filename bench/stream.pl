#!/usr/bin/perl
#
# bench/stream.pl - the streaming table (issue 12) and the burst of
# wake-ups (issue 11), each measured against its baseline in the same run.
#
#   perl -I t/lib bench/stream.pl [--sizes 16,256] [--clients 50]
#                                 [--no-varnish] [--out FILE]
#
# Streaming: 50 clients ask for one object whose body the origin sends
# over 3 s (bench/origin.c pace=3000), the second to the last 0.3 s after
# the first, against plain proxy_pass, this module with its defaults, and
# Varnish (the response cacheable for it, its own request coalescing and
# streaming).  Clients are curl, one process each, reading as fast as they
# can.  Reported: origin fetches, follower first byte (from its own
# request) p50/p99, follower last byte p99 and the first client's last
# byte (from the first request), and the peak over the run of the
# servers' resident memory plus the disk their temporary files used.  Then
# the same with a first client that reads nothing (a socket with a 64k
# receive buffer) until the others are done.
#
# Burst: 300 flights with 4 clients each, in random order over 4 workers,
# whose responses the origin writes in one loop (hold=1, /_release).  From
# the access log ($pid, $msec): each follower's answer time minus its
# leader's, p99 for followers in the leader's worker and in the others.
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

my %opt = (burst => 1, sizes => '16,256', clients => 50, varnish => 1, pace => 3000, gap => 0.3);
GetOptions(\%opt, 'burst!', 'sizes=s', 'clients=i', 'varnish!', 'out=s', 'pace=i', 'gap=f')
    or die "usage: $0 [--sizes 16,256] [--clients 50] [--no-varnish] [--out FILE]\n";

my $REPO = abs_path(dirname(abs_path($0)) . '/..');
my $BIN = "$REPO/build/bench";
make_path($BIN);
for my $tool (qw(origin)) {
    my ($src, $bin) = ("$REPO/bench/$tool.c", "$BIN/$tool");
    next if -x $bin && -M $bin <= -M $src;
    system('cc', '-O2', '-Wall', '-o', $bin, $src) == 0 or die "cannot build $bin\n";
}
system('cp', $ENV{SF_MODULE} // "$REPO/build/ngx_http_singleflight_module.so", "$BIN/sf-stream.so") == 0
    or die "no module: make build\n";

my @report;
sub say { print "$_[0]\n"; push @report, $_[0] }

my $t = SFTest->new(module => "$BIN/sf-stream.so");
my $origin = $t->start_origin(program => "$BIN/origin");
my $ORIGIN = $origin->addr;

$t->write_config($t->config_template(<<'EOT', workers => 2, log_singleflight => 1));
    upstream origin { server %%ORIGIN%%; keepalive 16; }

    singleflight_zone zone=sf:16m;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;

    server {
        listen 127.0.0.1:%%PORT%%;
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
        location / {
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://origin;
        }
    }
EOT
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
    $t->wait_for(sub { IO::Socket::INET->new("127.0.0.1:$varnish_port") }, timeout => 20,
                 what => 'varnishd');
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

sub curl {
    my ($port, $uri, $out) = @_;
    my $pid = fork // die;
    return $pid if $pid;
    open(STDOUT, '>', $out); open(STDERR, '>', '/dev/null');
    exec('curl', '-s', '-o', '/dev/null', '--max-time', '120',
         '-w', '%{http_code} %{size_download} %{time_starttransfer} %{time_total}\n',
         "http://127.0.0.1:$port$uri");
    exit 127;
}

my $run = 0;

# one row: returns a hash of results
sub stream_row {
    my ($which, $port, $size, %o) = @_;
    $run++;
    my $bytes = $size * 1024 * 1024;
    my $uri = "/o$run-$which?size=$bytes&pace=$opt{pace}&hdr=Cache-Control:%20max-age%3D600";
    my $dir = $t->path("run$run");
    make_path($dir);
    my $base = rss(server_pids($which));
    my $sp = sampler($which, "$dir/peak");
    my $hits0 = $origin->hits->{total};

    my $t0 = time;
    my ($stalled, @kids, @start);
    if ($o{stall}) {
        $stalled = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die;
        setsockopt($stalled, SOL_SOCKET, SO_RCVBUF, 65536);
        # the Host curl sends, so that the default key is the same
        print $stalled "GET $uri HTTP/1.1\r\nHost: 127.0.0.1:$port\r\nConnection: close\r\n\r\n";
        push @start, $t0;
    } else {
        push @kids, curl($port, $uri, "$dir/0");
        push @start, $t0;
    }
    sleep $opt{gap};
    for my $i (1 .. $opt{clients} - 1) {
        push @start, time;
        push @kids, curl($port, $uri, "$dir/$i");
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

    my (@first, @last, $leader_last, $bad);
    for my $i (0 .. $opt{clients} - 1) {
        next if $o{stall} && $i == 0;
        open(my $fh, '<', "$dir/$i") or do { $bad++; next };
        my ($code, $len, $tfb, $total) = split ' ', (<$fh> // '');
        $bad++ unless ($code // 0) == 200 && ($len // 0) == $bytes;
        my $s = $start[ $o{stall} ? $i : $i ];
        if ($i == 0) { $leader_last = $s + $total - $t0; next }
        push @first, $tfb;
        push @last, $s + $total - $t0;
    }
    $bad++ if $o{stall} && $stalled_bytes < $bytes;    # headers + body
    return {
        fetches => $origin->hits->{total} - $hits0,
        first50 => pct(50, @first) * 1000, first99 => pct(99, @first) * 1000,
        last99  => pct(99, @last), leader => $leader_last,
        peak    => $peak - $base, disk => $peak_disk, bad => $bad // 0, took => $end - $t0,
    };
}

my %port = (plain => $t->port(1), singleflight => $t->port(0),
            ($varnish_port ? (varnish => $varnish_port) : ()));
my @rows = grep { $port{$_} } qw(plain singleflight varnish);

my $host = `hostname`; chomp $host;
my $cpu = `grep -m1 'model name' /proc/cpuinfo`; $cpu =~ s/.*:\s*//; chomp $cpu;
my $cores = `nproc`; chomp $cores;
my $commit = `git -C $REPO describe --always --dirty 2>/dev/null`; chomp $commit;
my $nv = `/usr/sbin/nginx -v 2>&1`; chomp $nv;
my $vv = $varnish_port ? `/usr/sbin/varnishd -V 2>&1 | head -1` : 'none'; chomp $vv;

say("# Streaming and burst benchmarks, " . strftime('%Y-%m-%d %H:%M UTC', gmtime));
say('');
say("Machine: $host, $cores cores, $cpu.  $nv, $vv, module $commit.");
say("Command: `perl -I t/lib bench/stream.pl --sizes $opt{sizes} --clients $opt{clients}`"
    . ($opt{varnish} ? '' : ' --no-varnish'));
say('');
say("## Streaming: $opt{clients} clients, body paced over $opt{pace} ms, the others $opt{gap} s after the first");
say('');
say('| size | server | first client | origin fetches | follower first byte p50 / p99 (ms) | follower last byte p99 (s) | first client last byte (s) | peak memory growth (MiB) | peak disk (MiB) | failed |');
say('|---|---|---|--:|--:|--:|--:|--:|--:|--:|');

my %res;
for my $size (split /,/, $opt{sizes}) {
    for my $stall (0, 1) {
        for my $which (@rows) {
            next if $stall && $which eq 'varnish';
            my $r = stream_row($which, $port{$which}, $size, stall => $stall);
            $res{$size}{$which}{$stall} = $r;
            say(sprintf('| %d MiB | %s | %s | %d | %.0f / %.0f | %.2f | %s | %.0f | %.0f | %d |',
                $size, $which, $stall ? 'reads nothing' : 'reads',
                $r->{fetches}, $r->{first50}, $r->{first99}, $r->{last99},
                defined $r->{leader} ? sprintf('%.2f', $r->{leader}) : '-',
                $r->{peak} / 1048576, $r->{disk} / 1048576, $r->{bad}));
        }
    }
}

# ---------------------------------------------------------- burst

say('');
say('## Burst: 300 flights, 4 clients each in random order, 4 workers, all completing at once');
say('');
my $b = SFTest->new(module => "$BIN/sf-stream.so");
$b->write_config($b->config_template(<<"EOT", workers => 4));
    log_format burst '\$pid \$msec \$singleflight_status \$request_uri';
    singleflight_zone zone=sf:16m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            singleflight sf;
            access_log %%TESTDIR%%/burst.log burst;
            proxy_pass http://$ORIGIN;
        }
        location = /stats { singleflight_stats; }
    }
EOT
$b->start;
$b->wait_for(sub { $b->worker_pids == 4 }, what => '4 workers');
my @paths = map { my $k = $_; map { "/burst$k?size=2000&hold=1" } 1 .. 4 } 1 .. 300;
for my $i (reverse 1 .. $#paths) { my $j = int rand($i + 1); @paths[$i, $j] = @paths[$j, $i] }
my $before = $b->zone_stats("sf");
my $hits_burst0 = $origin->hits->{total};
my @h = map { $b->start_request('GET', $_, timeout => 60) } @paths;
$b->wait_zone(sub { ($_[0]{waiters} // 0) >= 900 }, timeout => 30, what => '900 followers');
$b->wait_for(sub { ($origin->hits->{held} // 0) >= 300 }, timeout => 30, what => '300 held');
{
    my $s = IO::Socket::INET->new($ORIGIN) or die "origin: $!";
    print $s "GET /_release HTTP/1.0\r\n\r\n";
    local $/;
    my $answer = <$s>;
    $answer =~ /"released":\s*(\d+)/ or die "no release: $answer";
}
$b->poll_all(\@h, timeout => 60);
my $after = $b->zone_stats('sf');
my @recs = $b->wait_log_records('burst.log', [qw(pid msec status uri)], 1200);
my %st = %{ SFTest::tally(map { $_->{status} } @recs) };
say('statuses: ' . join(' ', map { "$_=$st{$_}" } sort keys %st));
my (%leader, @same, @other);
$leader{ $_->{uri} } = $_ for grep { $_->{status} eq 'LEADER' } @recs;
for (grep { $_->{status} eq 'FOLLOWER' } @recs) {
    my $l = $leader{ $_->{uri} } or next;
    my $lag = ($_->{msec} - $l->{msec}) * 1000;
    push @{ $_->{pid} == $l->{pid} ? \@same : \@other }, $lag;
}
my $ok = grep { ($_->{res}{status} // 0) == 200 && $_->{res}{complete} } @h;
say('| followers | count | answered after their leader, p50 / p99 / max (ms) |');
say('|---|--:|--:|');
say(sprintf('| in the leader\'s worker | %d | %.1f / %.1f / %.1f |', scalar @same,
            pct(50, @same) // 0, pct(99, @same) // 0, pct(100, @same) // 0));
say(sprintf('| in other workers | %d | %.1f / %.1f / %.1f |', scalar @other,
            pct(50, @other) // 0, pct(99, @other) // 0, pct(100, @other) // 0));
say('');
say(sprintf('%d of 1200 complete; wake-ups sent %d, failed %d; origin requests %d.',
            $ok, $after->{wakeups} - $before->{wakeups},
            $after->{notify_failed} - $before->{notify_failed},
            $origin->hits->{total} - $hits_burst0));

# ---------------------------------------------------------- targets

say('');
say('## Targets (ratios within this run)');
say('');
say('| target | measured | met |');
say('|---|---|---|');
for my $size (split /,/, $opt{sizes}) {
    my $sf = $res{$size}{singleflight}{0};
    my $st = $res{$size}{singleflight}{1};
    my $v = $res{$size}{varnish}{0};
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
    my $s = $st->{last99} / $sf->{last99};
    say(sprintf('| %d MiB: a first client that reads nothing delays followers < 5%% | %.3f | %s |',
                $size, $s, $s < 1.05 ? 'yes' : 'no'));
    my $m = $sf->{peak} / ($size * 1048576);
    say(sprintf('| %d MiB: peak memory (RSS, shared memory included) growth < 10%% of one body | %.1f%% | %s |',
                $size, 100 * $m, $m < 0.10 ? 'yes' : 'no'));
}
my $gap = (pct(99, @other) // 0) - (pct(99, @same) // 0);
say(sprintf('| burst: other workers\' p99 within 2 ms of the leader\'s worker\'s | %+.1f ms | %s |',
            $gap, $gap <= 2 ? 'yes' : 'no'));

my $out = $opt{out} // strftime("$REPO/bench/results/%Y-%m-%d-$host-stream.md", gmtime);
open(my $fh, '>', $out) or die "$out: $!";
print $fh join("\n", @report), "\n";
close $fh;
print "written to $out\n";

SFTest::_finalize_all();
if ($varnish_pid) { kill 'TERM', $varnish_pid; waitpid($varnish_pid, 0); $varnish_pid = 0 }
exit 0;
