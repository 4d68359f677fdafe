#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A leader's worker that died but is not reaped yet (the master is busy,
# here: stopped) is a zombie, which kill(pid, 0) still finds.  Followers in
# the surviving worker must still find it dead within the dead-leader
# bound: one of them takes the flight over (singleflight_promote dead, the
# default) and they all get the response of its fetch.  So too where the
# first request went upstream on its own way and the others wait for its
# header.

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

        # a lone request goes its own way, the others wait for its header
        location /d/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }
    }
EOT

$t->start;

# worker $pid killed while the master cannot reap it (it stays a zombie);
# how long the requests @h then took, and what they got
sub zombie {
    my ($pid, @h) = @_;
    my $master = $t->master_pid;
    kill 'STOP', $master;
    $t->kill_worker($pid);
    my $killed = time;
    my @res = map { $t->finish_request($_) } @h;
    my $took = time - $killed;
    kill 'CONT', $master;
    return ($took, @res);
}

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

    my ($took, @res) = zombie($lpid, @h);

    my @answered = grep { defined $_->{status} } @res;
    ok(@answered >= $followers{ $other[0] },
       'the followers in the surviving worker were answered');
    my $body = SFTest::origin_body(2, $uri);
    is(scalar(grep { $_->{status} != 200 || $_->{body} ne $body } @answered), 0,
       'with the response of a second fetch');
    ok($took < 1.5, sprintf('within 1.5 s of the kill (%.2f s)', $took));
}

$t->finish_request($leader);

# The same where the first request went its own way: nothing in the zone
# says which worker it is in, so a worker waiting on such a flight looks
# for silent workers at every beat, and the followers in the surviving
# worker are answered about as soon (not at the 5 s sweep).

$uri = '/d/z?fail=hang&fail_first=1';
$off = $t->log_offset;
$leader = $t->start_request('GET', $uri, timeout => 10);

$t->wait_for(sub {
    ($lpid) = $t->error_log_since($off) =~ /(\d+)#\d+: \*\d+ http request line: "GET \/d\/z\?/;
    $lpid && $t->origin_uri_hits($uri) == 1;
}, what => 'the first request at the origin');

@h = map { $t->start_request('GET', $uri, timeout => 10) } 1 .. 40;

$t->wait_for(sub {
    %followers = ();
    $followers{$_}++
        for $t->error_log_since($off) =~ /(\d+)#\d+: \*\d+ singleflight (?:leader|follower) of flight/g;
    my $n = 0;
    $n += $_ for values %followers;
    $n >= 40;
}, what => '40 waiting');

@other = grep { $_ ne $lpid } keys %followers;

SKIP: {
    skip "no request waited in the other worker", 2 unless @other;

    my ($took, @res) = zombie($lpid, @h);

    my @answered = grep { ($_->{status} // 0) == 200 } @res;
    ok(@answered >= $followers{ $other[0] },
       'own way: the requests in the surviving worker were answered');
    ok($took < 2.5, sprintf('own way: within 2.5 s of the kill (%.2f s)', $took));
}

$t->finish_request($leader);

done_testing;
