#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A burst of completions in one worker is served flight by flight: a
# leader waits for its header without being parked (its own fetch wakes
# it), yet it is woken in its flight's turn with its followers, not ahead
# of every follower of the burst.  Before, with 300 flights completing at
# once, the followers in the leader's worker came p50 20 ms after their
# leader (bench/stream.pl's burst), since every leader was served first.
#
# One worker, 60 flights of 3 clients whose responses leave the origin at
# the same moment; the access log shows the order the requests ended in.

use strict;
use warnings;

use Test::More;
use Time::HiRes ();

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', workers => 1));
    log_format order '$singleflight_status $request_uri';
    access_log %%TESTDIR%%/order.log order;

    singleflight_zone zone=sf:8m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
$t->start;

my $FLIGHTS = 60;
my $PER = 3;

for my $round (1 .. 3) {
    burst($round);
}

done_testing;

sub burst {
    my ($round) = @_;

    my $at = int((Time::HiRes::time() + 2) * 1000);
    my @paths = map { my $k = $_; map { "/o$round-$_?size=500&at=$at" } 1 .. $FLIGHTS } 1 .. $PER;

    $t->origin_reset;
    my $res = $t->herd(paths => \@paths, timeout => 20);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res),
       $FLIGHTS * $PER, "burst $round: every client got its response");
    is($t->origin_hits->{total}, $FLIGHTS, "burst $round: one origin request per flight");

    my @recs = $t->wait_log_records('order.log', [qw(status uri)],
                                    $FLIGHTS * $PER, uri => qr{^/o$round-});

    # where each request ended, in the order of the log
    my (%leader, %last);
    for my $i (0 .. $#recs) {
        my ($status, $uri) = @{ $recs[$i] }{qw(status uri)};
        if ($status eq 'LEADER') {
            $leader{$uri} = $i;
        } elsif ($status eq 'FOLLOWER') {
            $last{$uri} = $i;
        }
    }
    is(scalar(keys %leader), $FLIGHTS, "burst $round: one leader per flight");

    # how many requests of other flights ended between a leader and the
    # last of its followers: a few when served flight by flight (a turn of
    # the ready queue is 8 requests), most of the burst when every leader
    # goes first
    my @gap = sort { $a <=> $b }
              map { $last{$_} - $leader{$_} - ($PER - 1) }
              grep { exists $last{$_} } keys %leader;
    my $median = $gap[ int(@gap / 2) ];
    cmp_ok($median, '<=', 16,
           "burst $round: a leader and its followers end together"
           . " (median $median requests of other flights between them)");
}
