#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A follower whose client goes away after its flight changed, but before
# its turn in the worker's ready queue came: it leaves the queue, the
# others are served, and once every follower of a flight went that way
# the flight's group leaves the queue with the last of them.
#
# The worker is stopped (SIGSTOP) while the origin sends the response and
# while some followers' clients close their connections; when it goes on,
# one look at its events finds the upstream's response first and the
# clients' FINs after it: the response wakes the flight's group (into the
# ready queue, served by a posted event after the look), then the FINs
# finalize their requests out of the queue.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', workers => 1, log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /wk/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

my ($WORKER) = $t->worker_pids;

woken('/wk/some?delay=2000&size=3000', 20, 10, 'ten of twenty gone');
woken('/wk/all?delay=2000&size=3000', 12, 12, 'every client gone', leader_gone => 1);

is_deeply([$t->worker_pids], [$WORKER], 'the worker is the one it was');

done_testing;

# ------------------------------------------------------------ helpers

# How many of the client connections from local ports @ports nginx has
# the FIN of (CLOSE_WAIT on its side).
sub fins_waiting {
    my (@ports) = @_;
    my $port = $t->port(0);
    my %from = map { $_ => 1 } @ports;
    return scalar grep { $_->[0] == $port && $from{ $_->[1] } && $_->[2] == 8 }
                       SFTest::tcp_sockets();
}

sub woken {
    my ($uri, $n, $gone, $what, %opt) = @_;

    $t->origin_reset;

    my $leader = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'leader at the origin');
    my @f = map { $t->start_request('GET', $uri) } 1 .. $n;
    my ($ok, $zone) = $t->wait_waiters($n);
    ok($ok, "$what: $n followers wait") or diag(explain($zone));

    if ($opt{leader_gone}) {
        # the fetch goes on for the followers, its host waits for nothing
        my $closed = $t->log_count(qr/client prematurely closed connection/);
        $t->abort_request($leader);
        ok($t->wait_for(sub { $t->log_count(qr/client prematurely closed connection/) > $closed },
                        timeout => 5, what => 'the leader gone'),
           "$what: the leader's client went first");
    }

    kill 'STOP', $WORKER;

    ok($t->wait_for(sub { $t->origin_unread == 1 }, timeout => 5, what => 'the response in nginx\'s socket'),
       "$what: the response came while the worker was stopped");

    my @ports = map { $_->{sock}->sockport } @f[0 .. $gone - 1];
    $t->abort_request($_) for @f[0 .. $gone - 1];

    ok($t->wait_for(sub { fins_waiting(@ports) == $gone }, timeout => 5, what => 'the FINs'),
       "$what: $gone FINs came after it");

    kill 'CONT', $WORKER;

    my $body = SFTest::origin_body(1, $uri, 3000);
    my @left = (($opt{leader_gone} ? () : $leader), @f[$gone .. $n - 1]);
    my @res = map { $t->finish_request($_) } @left;

    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res),
       scalar(@left), "$what: every client left got the response");
    is($t->origin_uri_hits($uri), 1, "$what: 1 origin request");
    is_deeply($t->sf_outcomes($uri, $n + 1),
              { ($opt{leader_gone} ? 'LEADER:499' : 'LEADER:200') => 1, 'FOLLOWER:499' => $gone,
                ($n > $gone ? ('FOLLOWER:200' => $n - $gone) : ()) },
              "$what: logged");
    ($ok, $zone) = $t->wait_waiters(0);
    ok($ok, "$what: nobody waits") or diag(explain($zone));
    $t->zone_baseline_ok("$what: zone back to baseline");
}
