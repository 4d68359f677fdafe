#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/resume.pl - an origin that breaks off every full response halfway:
# N clients at once ask for one large body (bench/origin.c, fixed=1: one
# representation with a strong ETag, answering "Range: bytes=N-" with a
# 206; cut=HALF: a request without Range is cut after half the body).
# For each server, in one run: how many clients got the whole body, how
# many origin requests and body bytes it cost, and the clients' times.
# The origin answers each request after 1 s (delay=1000), so that every
# client has arrived before a response begins: the N curl processes take
# a few hundred ms to start on a small machine, a 64 MiB body crosses
# loopback in less, and a client that comes after a flight is over starts
# a flight of its own (nothing is cached).
#
#   singleflight         the module, singleflight_resume on (the default)
#   singleflight, off    the module, singleflight_resume off
#   plain proxy_pass     nginx without the module
#   Varnish              varnishd with a default VCL, if installed
#
#   perl -I t/lib bench/resume.pl [--size 64m] [--clients 20] [--out FILE]
#
# Writes bench/results/YYYY-MM-DD-HOST-resume.md (or --out), also printed.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use Getopt::Long;
use IO::Socket::INET;
use POSIX qw(strftime);
use Time::HiRes qw(time);

use SFTest;

# not a test: no TAP plan, and our exit status is our own
Test::More->builder->no_ending(1);

my $REPO = abs_path(dirname(abs_path($0)) . '/..');

my %opt = (size => '64m', clients => 20);
my @GIVEN = @ARGV;
GetOptions('size=s' => \$opt{size}, 'clients=i' => \$opt{clients}, 'out=s' => \$opt{out},
           'quick' => \$opt{quick})
    or die "usage: see the head of bench/resume.pl\n";
$opt{quick} = 1 if ($ENV{SF_BENCH_ARGS} // '') =~ /(?:^|\s)--quick\b/;
$opt{size} = '16m' if $opt{quick} && !grep { /^--size/ } @GIVEN;

my $SIZE = $opt{size} =~ /^(\d+)([km]?)$/i
    ? $1 * { '' => 1, k => 1024, m => 1048576 }->{ lc $2 } : die "bad --size\n";
my $HALF = int($SIZE / 2);

my $MODULE = $ENV{SF_MODULE} // "$REPO/build/ngx_http_singleflight_module.so";
-f $MODULE or die "no module at $MODULE: run make build\n";
-x '/usr/bin/curl' or die "curl is needed\n";

my $t = SFTest->new(module => $MODULE);
my $origin = $t->start_origin(program => SFTest::c_origin());
my $ORIGIN = $origin->addr;

$t->write_config($t->config_template(<<'EOT', workers => 2));
    upstream origin { server %%ORIGIN%%; keepalive 16; }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_read_timeout 30s;

    singleflight_zone zone=sf:16m;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /sf/ {
            singleflight sf;
            proxy_pass http://origin;
        }

        location /sfoff/ {
            singleflight sf;
            singleflight_resume off;
            proxy_pass http://origin;
        }

        location /plain/ {
            proxy_pass http://origin;
        }
    }
EOT
$t->start;
my $PORT = $t->port(0);

# ---------------------------------------------------------- Varnish

my ($varnish_pid, $varnish_port);
if (-x '/usr/sbin/varnishd') {
    my $vdir = $t->path('varnish');
    make_path($vdir);
    $varnish_port = 20000 + int rand 20000;
    my ($oh, $op) = split /:/, $ORIGIN;
    $t->write_file('default.vcl', <<"EOT");
vcl 4.1;
backend origin { .host = "$oh"; .port = "$op"; .first_byte_timeout = 30s; .between_bytes_timeout = 30s; }
EOT
    $varnish_pid = fork // die;
    if (!$varnish_pid) {
        open(STDOUT, '>', $t->path('varnish.out'));
        open(STDERR, '>&', \*STDOUT);
        exec('/usr/sbin/varnishd', '-F', '-n', $vdir, '-a', "127.0.0.1:$varnish_port",
             '-f', $t->path('default.vcl'), '-s', 'malloc,' . int(3 * $SIZE / 1048576 + 64) . 'm');
        exit 127;
    }
    $t->wait_for(sub { IO::Socket::INET->new("127.0.0.1:$varnish_port") }, timeout => 20,
                 what => 'varnishd') or undef $varnish_port;
}
END { if ($varnish_pid) { kill 'TERM', $varnish_pid; waitpid($varnish_pid, 0) } }

# ---------------------------------------------------------- a row

sub hits { $origin->hits }

# N curl clients at once; each prints "exit code, bytes, seconds"
sub row {
    my ($name, $port, $path) = @_;
    my $uri = "$path?size=$SIZE&fixed=1&cut=$HALF&delay=1000";
    my $before = hits();
    my $t0 = time;
    my @pids;
    for my $i (1 .. $opt{clients}) {
        my $out = $t->path("client-$name-$i" =~ s/[^\w.-]/_/gr);
        my $pid = fork // die;
        if (!$pid) {
            open(STDOUT, '>', $out);
            exec('/usr/bin/curl', '-s', '-o', '/dev/null', '--max-time', '120',
                 '-w', '%{size_download} %{time_total}\n', "http://127.0.0.1:$port$uri");
            exit 127;
        }
        push @pids, [ $pid, $out ];
    }
    my (@times, $whole);
    for (@pids) {
        my ($pid, $out) = @$_;
        waitpid($pid, 0);
        my $rc = $? >> 8;
        my ($bytes, $secs) = split ' ', $t->read_file($out =~ s{.*/}{}r) // '';
        push @times, $secs // 0;
        $whole++ if $rc == 0 && ($bytes // 0) == $SIZE;
    }
    my $after = hits();
    @times = sort { $a <=> $b } @times;
    return {
        name => $name, whole => $whole // 0,
        requests => $after->{total} - $before->{total},
        bytes => ($after->{body_bytes} // 0) - ($before->{body_bytes} // 0),
        ranges => ($after->{ranges} // 0) - ($before->{ranges} // 0),
        p50 => $times[ int(0.5 * $#times + 0.5) ], max => $times[-1],
    };
}

my @rows = (
    row('singleflight, singleflight_resume on', $PORT, "/sf/r-$$"),
    row('singleflight, singleflight_resume off', $PORT, "/sfoff/r-$$"),
    row('plain proxy_pass', $PORT, "/plain/r-$$"),
    $varnish_port ? row('Varnish (default VCL)', $varnish_port, "/v/r-$$") : (),
);

# ---------------------------------------------------------- report

sub cmd_output { my $o = `$_[0] 2>&1` // ''; chomp $o; $o }

my $nginx = $t->nginx_binary;
my $facts = SFTest::machine_facts($nginx);
my ($host, $nginx_v, $git) = @$facts{qw(host nginx_v git)};
my $varnish_v = -x '/usr/sbin/varnishd' ? (cmd_output('/usr/sbin/varnishd -V') =~ /(varnish-\S+)/)[0] : 'not installed';

my @out = (
    '# Resuming a broken origin stream, ' . strftime('%Y-%m-%d', localtime) . ", $host", '',
    '* date: ' . strftime('%Y-%m-%d %H:%M:%S %Z', localtime),
    "* machine: $facts->{machine}",
    "* nginx: $nginx_v ($nginx), 2 workers; module at git $git; $varnish_v",
    "* origin: bench/origin.c, one body of $SIZE bytes (fixed=1: strong ETag, Range answered "
        . "with 206), every request without Range cut after $HALF bytes (cut=)",
    "* clients: $opt{clients} curl processes at once per row (HTTP/1.1), one row after another",
    '* command: `perl -I t/lib bench/resume.pl' . (@GIVEN ? " @GIVEN" : '') . '`'
        . ($ENV{MAKELEVEL} ? ' (from `make bench`)' : ''),
    '',
    '| server | clients with the whole body | origin requests | of them Range (206) | origin body bytes sent | client time p50 s | max s |',
    '|---|--:|--:|--:|--:|--:|--:|',
    (map { sprintf('| %s | %d of %d | %d | %d | %d | %.2f | %.2f |', $_->{name}, $_->{whole},
        $opt{clients}, $_->{requests}, $_->{ranges}, $_->{bytes}, $_->{p50} // 0, $_->{max} // 0) } @rows),
    '',
    $varnish_port ? () : ('Varnish: not installed (`apt-get install varnish`), no row.', ''),
);

my $text = join("\n", @out) . "\n";
print $text;
my $file = $opt{out} // SFTest::results_file(strftime('%Y-%m-%d', localtime) . "-$host-resume");
if (open(my $fh, '>', $file)) {
    print $fh $text;
    close($fh);
    print STDERR "# results: $file\n";
}
