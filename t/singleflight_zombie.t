#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A leader's worker that died but is not reaped yet (the master is busy,
# here: stopped) is a zombie, which kill(pid, 0) still finds.  Followers in
# the surviving worker must still find it dead within the dead-leader
# bound: one of them takes the flight over (singleflight_promote dead, the
# default) and they all get the response of its fetch.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use SFTest;

my $t = SFTest->new(log_level => 'debug');
$t->skip_without_module;
$t->start_origin;

$t->allow_log(qr/exited on signal 9/);

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }
    }
EOT

$t->start;

# the origin never answers the leader's request, the first for it
my $uri = '/z?fail=hang&fail_first=1';
my $off = $t->log_offset;

my $leader = $t->start_request('GET', $uri, timeout => 10);

my ($lpid, %followers);
$t->wait_for(sub {
    ($lpid) = $t->error_log_since($off) =~ /(\d+)#\d+: \*\d+ singleflight leader of flight/;
    $lpid;
}, what => 'the leader in the debug log');

my @h = map { $t->start_request('GET', $uri, timeout => 10) } 1 .. 40;

$t->wait_for(sub {
    %followers = ();
    $followers{$_}++
        for $t->error_log_since($off) =~ /(\d+)#\d+: \*\d+ singleflight follower of flight/g;
    ($followers{$lpid} // 0) + grep({ $_ ne $lpid } keys %followers) > 0
        && eval { my $n = 0; $n += $_ for values %followers; $n >= 40 };
}, what => '40 followers');

my @other = grep { $_ ne $lpid } keys %followers;

SKIP: {
    skip "no follower landed in the other worker", 3 unless @other;

    my $master = $t->master_pid;

    # the master cannot reap: the killed worker stays a zombie
    kill 'STOP', $master;
    $t->kill_worker($lpid);
    my $killed = time;

    my @res = map { $t->finish_request($_) } @h;
    my $took = time - $killed;

    kill 'CONT', $master;

    my @answered = grep { defined $_->{status} } @res;
    ok(@answered >= $followers{ $other[0] },
       'the followers in the surviving worker were answered');
    my $body = SFTest::origin_body(2, $uri);
    is(scalar(grep { $_->{status} != 200 || $_->{body} ne $body } @answered), 0,
       'with the response of a second fetch');
    ok($took < 1.5, sprintf('within 1.5 s of the kill (%.2f s)', $took));
}

$t->finish_request($leader);

done_testing;
