#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Reloads while old workers linger: each generation keeps a worker busy
# with a long request, so the master gives the new workers ever higher
# process slots.  Every new worker must still have its wake-up pipe (no
# "no wake-up pipe" warning), and a herd across the last generation's
# workers is answered as soon as its response is there, not at the poll.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
$t->start;

my @long;
my $reloads = 12;

for my $i (1 .. $reloads) {
    # a request that keeps one worker of this generation alive
    my $uri = "/long$i?delay=60000";
    push @long, $t->start_request('GET', $uri, timeout => 90);
    $t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => "long request $i");

    ok($t->reload, "reload $i") or last;
}

ok(scalar($t->child_pids) >= $reloads + 2, 'old workers linger')
    or diag(scalar($t->child_pids) . ' processes');

is($t->log_count(qr/no wake-up pipe for process slot/), 0,
   'every worker has its wake-up pipe');

# a herd on the newest workers: everybody within 300 ms of the origin's
# answer (the poll would take 500 ms)
my $uri = '/herd?delay=300';
my $res = $t->herd(n => 40, path => $uri);
my $slowest = 0;
for (@$res) {
    $slowest = $_->{time} if ($_->{time} // 0) > $slowest;
}
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 40, 'the herd: 40 answers');
is($t->origin_uri_hits($uri), 1, 'the herd: one origin request');
cmp_ok($slowest, '<', 0.3 + 0.3, 'the herd: nobody waited for the poll');

$t->abort_request($_) for @long;

done_testing;
