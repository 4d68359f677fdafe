#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_hedge: a flight's fetch with no header after the hedge time
# gets a second fetch of the same request, once for the whole flight; the
# location's balancing sends it to the next server.  The first header
# wins, the other fetch is stopped (the origin sees its connection
# closed), and every reader reads the winner.
#
# Two origins behind one upstream (round robin, one worker: the first
# fetch goes to the first server, the next to the second), the first one
# slow (slow=PORT:MS makes only that origin wait).

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use SFTest;

my $t = SFTest->new(log_level => 'info');
$t->skip_without_module;
$t->start_origin;     # 0: the slow one
$t->start_origin;     # 1: the fast one

my $log = "    log_format hg '\$uri \$singleflight_hedged';\n"
        . "    access_log %%TESTDIR%%/hg.log hg;\n"
        # every request through a fetch, a lone one too: what this file tests
        . "    singleflight_lone fetch;\n";

my $conf = <<'EOT';
    singleflight_zone zone=sf:4m;

    upstream %%NAME%% {
        server %%ORIGIN%%;
        server %%ORIGIN_1%%;
    }
EOT
my $ups = join '', map { $conf =~ s/singleflight_zone.*\n//r =~ s/%%NAME%%/$_/r }
    qw(h off fast auto post);

# failures do not take the servers out (max_fails=0), nor move a fetch on
$ups .= $conf =~ s/singleflight_zone.*\n//r =~ s/%%NAME%%/fails/r
              =~ s/(%%ORIGIN(?:_1)?%%);/$1 max_fails=0;/gr;

$t->write_config($t->config_template(<<"EOT", workers => 1));
    singleflight_zone zone=sf:4m;
$log
$ups
    server {
        listen 127.0.0.1:%%PORT%%;
        add_header X-SF \$singleflight_status always;

        location /h/     { singleflight sf; singleflight_hedge 100ms; proxy_pass http://h; }
        location /off/   { singleflight sf; proxy_pass http://off; }
        location /fast/  { singleflight sf; singleflight_hedge 100ms; proxy_pass http://fast; }
        location /fails/ { singleflight sf; singleflight_hedge 100ms;
                           proxy_next_upstream off; proxy_pass http://fails; }
        location /auto/  { singleflight sf; singleflight_hedge auto min=100ms;
                           proxy_pass http://auto; }
        location /post/  { singleflight sf; singleflight_methods GET HEAD POST;
                           singleflight_hedge 100ms; proxy_pass http://post; }

        location = /stats { singleflight_stats; }
    }
EOT
$t->start;

my $SLOW = 'slow=' . $t->origin_port(0) . ':2000';

sub counter { $t->stats('/stats')->{zones}{sf}{ $_[0] } // 0 }

sub hits { my ($uri, $o) = @_; $t->origin_uri_hits($uri, $o) // 0 }

# a herd; its responses and the time the last one took
sub herd {
    my ($uri, $n, %o) = @_;
    my $t0 = time;
    my $res = $t->herd(n => $n, path => $uri, timeout => 10, %o);
    return ($res, time - $t0);
}

sub all_ok {
    my ($res, $uri, $size) = @_;
    my %bodies = map { $_->{body} // '' => 1 } @$res;
    return (grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res) == @$res
        && keys %bodies == 1;
}

# ------------------------------------------------------------ auto

{
    # first, while the zone knows fast header times only (the slow ones
    # below would raise its p95 past the slow server's 2 s): the zone
    # learns them, then a slow server is hedged at their p95, here the
    # 100 ms floor
    # (an even number: round robin's next pick is the slow server again)
    for my $i (1 .. 26) {
        $t->get("/auto/learn-$i?size=10");
    }
    my $uri = "/auto/x?$SLOW&size=1000";
    my $hedges = counter('hedges');
    my ($res, $took) = herd($uri, 20);
    ok(all_ok($res), 'auto: 20 OK');
    cmp_ok($took, '<', 1.2, sprintf('auto: answered by the hedge (%.2f s)', $took));
    is(counter('hedges'), $hedges + 1, 'auto: one hedge');
}

# ------------------------------------------------------------ hedged

{
    my $uri = "/h/x?$SLOW&size=1000";
    my ($hedges, $wins) = (counter('hedges'), counter('hedge_wins'));
    my $o0 = $t->zone_stats->{origin_requests_total};
    my $aborted = $t->origin_hits(0)->{aborted};
    my $off = $t->log_offset;

    my ($res, $took) = herd($uri, 200);

    ok(all_ok($res), 'hedge: 200 clients, 200 OK, one body');
    cmp_ok($took, '<', 1.2, sprintf('hedge: all answered long before the slow server (%.2f s)', $took));
    is(hits($uri, 0) + hits($uri, 1), 2, 'hedge: 2 origin fetches for the flight');
    is(hits($uri, 1), 1, 'hedge: the second went to the other server');
    is(counter('hedges'), $hedges + 1, 'hedge: counted in hedges');
    is(counter('hedge_wins'), $wins + 1, 'hedge: counted in hedge_wins');
    $t->origin_requests_ok($o0, { first => 1, hedge => 1 },
                           'hedge: origin_requests_total, the first fetch and the hedge');
    ok($t->wait_for(sub { $t->origin_hits(0)->{aborted} > $aborted },
                    what => 'the slow origin to see its connection closed'),
       'hedge: the losing fetch was closed at the origin');
    is($t->log_count(qr/has no header after \d+ ms, fetching it once more \(hedge\)/, $off), 1,
       'hedge: logged');
    is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'LEADER' } @$res), 1,
       'hedge: one leader');
    ok($t->wait_for(sub { (() = ($t->read_file('hg.log') // '') =~ m{^/h/x 1$}mg) == 200 },
                    what => 'access log lines'),
       'hedge: $singleflight_hedged 1 for all 200');
}

# ------------------------------------------------------------ not hedged

{
    my $uri = "/off/x?$SLOW&size=1000";
    my $hedges = counter('hedges');
    my ($res, $took) = herd($uri, 20);
    ok(all_ok($res), 'off: 20 OK, one body');
    cmp_ok($took, '>=', 1.9, sprintf('off: all waited for the slow server (%.2f s)', $took));
    is(hits($uri, 0) + hits($uri, 1), 1, 'off: 1 origin fetch');
    is(counter('hedges'), $hedges, 'off: no hedge');
}

{
    # a header before the hedge time: no second fetch
    my $uri = '/fast/x?delay=20&size=1000';
    my $hedges = counter('hedges');
    my ($res) = herd($uri, 20);
    ok(all_ok($res), 'fast: 20 OK');
    is(hits($uri, 0) + hits($uri, 1), 1, 'fast: 1 origin fetch');
    is(counter('hedges'), $hedges, 'fast: no hedge');
}

{
    # a method with a body is never hedged
    my $uri = "/post/x?$SLOW";
    my $hedges = counter('hedges');
    my $t0 = time;
    my $r = $t->http('POST', $uri, body => 'a', timeout => 10);
    is($r->{status}, 200, 'POST: answered');
    cmp_ok(time - $t0, '>=', 1.9, 'POST: by the slow server');
    is(counter('hedges'), $hedges, 'POST: no hedge');
}

# ------------------------------------------------------------ both fail

{
    # each server resets its first request: the slow one after 500 ms, the
    # fast one at once.  The hedge fails first and the first fetch goes
    # on; when it fails too, the flight is fetched again
    # (singleflight_promote error), and answered by either server
    my $uri = '/fails/x?slow=' . $t->origin_port(0) . ':500&fail=reset&fail_first=1&size=1000';
    my ($hedges, $retries) = (counter('hedges'), counter('retries'));
    my $o0 = $t->zone_stats->{origin_requests_total};
    my ($res) = herd($uri, 20);
    ok(all_ok($res), 'both fail: 20 OK from the fetch made again');
    is(hits($uri, 0) + hits($uri, 1), 3, 'both fail: 3 origin requests');
    $t->origin_requests_ok($o0, { first => 1, hedge => 1, retry => 1 },
                           'both fail: origin_requests_total, by reason');
    is(counter('hedges'), $hedges + 1, 'both fail: one hedge');
    is(counter('retries'), $retries + 1, 'both fail: then one retry');
}

# ------------------------------------------------------------ a far range

{
    # a far Range has a flight of its own, whose fetch sends the Range:
    # so does its hedge, and every reader gets the fast server's 206
    my $uri = "/h/range?$SLOW&fixed=1&ranges=1&size=1000";
    my $hedges = counter('hedges');
    my ($res, $took) = herd($uri, 20, headers => [ Range => 'bytes=500-599' ]);
    my $whole = $t->get($uri, port => $t->origin_port(1))->{body} // '';
    is(length $whole, 1000, 'far range: the whole body, from the origin');
    is(scalar(grep { ($_->{status} // 0) == 206
                     && ($_->{headers}{'content-range'} // '') eq 'bytes 500-599/1000'
                     && ($_->{body} // '') eq substr($whole, 500, 100) } @$res), 20,
       'far range: 20 x 206 with bytes 500-599');
    cmp_ok($took, '<', 1.2, sprintf('far range: answered by the hedge (%.2f s)', $took));
    is(hits($uri, 0) + hits($uri, 1), 2 + 1, 'far range: 2 origin fetches (and the check\'s)');
    is(counter('hedges'), $hedges + 1, 'far range: one hedge');
}

# ------------------------------------------------------------ the zone

my $z;
ok($t->wait_for(sub {
    $z = $t->stats('/stats?diagnostics=1')->{zones}{sf};
    $z->{in_flight} == 0 && $z->{readers} == 0
        && $z->{pages_used} == $z->{pages_baseline};
}, what => 'baseline'), 'zone back to baseline');

done_testing;
