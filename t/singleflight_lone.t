#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_lone direct, the default: a request with nobody in progress for its key
# goes upstream itself, as without the module (DIRECT, counted in
# "direct", no flight); a request that arrives while one is in progress
# makes a flight that waits for the first one's header, and the first one
# then feeds it (singleflight_lone_adopt.t), so a herd makes one origin
# request.  Every request counts until it ends,
# whatever became of it: after a herd, after a client's abort, and after
# its worker process was killed, the key's next lone request is DIRECT
# again.  singleflight_lone fetch also makes one origin request of a
# herd.

use strict;
use warnings;

use List::Util ();
use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# zone "r" gets its first "direct" location by a reload (%%R_LONE%%)
my $conf = $t->config_template(<<'EOT', workers => 1, log_singleflight => 1);
    singleflight_zone zone=sf:1m;
    singleflight_zone zone=w:1m scope=worker;
    singleflight_zone zone=r:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_lone direct;
            add_header X-Key $singleflight_key always;
            proxy_pass http://%%ORIGIN%%;
        }

        location /fetch/ {
            singleflight sf;
            singleflight_lone fetch;
            add_header X-Key $singleflight_key always;
            proxy_pass http://%%ORIGIN%%;
        }

        location /w/ {
            singleflight w;
            singleflight_lone direct;
            proxy_pass http://%%ORIGIN%%;
        }

        location /r/ {
            singleflight r;
            %%R_LONE%%
            proxy_pass http://%%ORIGIN%%;
        }

        location /plain/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

(my $first = $conf) =~ s/%%R_LONE%%/singleflight_lone fetch;/;
$t->write_config($first);
$t->start;


my $stats0 = $t->zone_stats;

# ------------------------------------------------------------ alone

# One at a time: each request is alone, goes upstream itself and gets
# what the same request gets from a location without the module.

my $uri = '/one?x=1';
for my $i (1 .. 3) {
    my $r = $t->get($uri);
    is($r->{status}, 200, "alone $i: 200");
    is($r->{body}, SFTest::origin_body($i, $uri), "alone $i: its own origin response");
}
is_deeply($t->sf_outcomes($uri, 3), { 'DIRECT:200' => 3 }, 'alone: 3 x DIRECT');

my $p = $t->get('/plain/same');
my $d = $t->get('/same');
is(join(',', grep { $_ ne 'X-Key' } map { $_->[0] } @{ $d->{header_list} }),
   join(',', map { $_->[0] } @{ $p->{header_list} }),
   'alone: the same header lines as without the module');

# $singleflight_key: a DIRECT request made no key, and shows its value all
# the same

my $f = $t->get('/fetch/same');
ok(length($f->{headers}{'x-key'} // ''), 'a flight\'s $singleflight_key is not empty');
is($d->{headers}{'x-key'}, $f->{headers}{'x-key'}, 'alone: the same $singleflight_key');

# ------------------------------------------------------------ a herd

# Ten at once on a slow response: the first is alone; the nine others
# find it in progress and share its response.

$t->origin_reset;
$uri = '/herd?delay=500';
my $res = $t->herd(n => 10, path => $uri);
is($t->origin_hits->{total}, 1, 'herd: 1 origin request, the lone one\'s');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 10,
   'herd: 10 complete 200s');
is(SFTest::with_hit($res, $uri, 1), 10, 'herd: each the lone request\'s response');
is_deeply($t->sf_outcomes($uri, 10), { 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
          'herd: the lone one LEADER, 9 FOLLOWER');

# after the herd, nobody counts there any more

my $r = $t->get($uri);
is($r->{status}, 200, 'after the herd: 200');
is_deeply($t->sf_outcomes($uri, 11), { 'DIRECT:200' => 1, 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
          'after the herd: the next request is DIRECT');

# the same in a zone of scope=worker, whose slots are the worker's own

$t->origin_reset;
$uri = '/w/herd?delay=500';
$res = $t->herd(n => 10, path => $uri);
is($t->origin_hits->{total}, 1, 'scope=worker herd: 1 origin request');
is(SFTest::with_hit($res, $uri, 1), 10, 'scope=worker herd: 10 times the lone request\'s response');
is_deeply($t->sf_outcomes($uri, 10), { 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
          'scope=worker herd: the lone one LEADER, 9 FOLLOWER');

# the default: one flight for all ten

$t->origin_reset;
$res = $t->herd(n => 10, path => '/fetch/herd?delay=500');
is($t->origin_hits->{total}, 1, 'singleflight_lone fetch: 1 origin request for 10');

# ------------------------------------------------------------ an abort

# The lone request's client goes away mid-response: its count goes with
# its request, and the next one is alone again.

$uri = '/abort?delay=300&body_delay=600';
my $h = $t->start_request('GET', $uri);
$t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the lone request at the origin');
$t->abort_request($h);
$t->sf_outcomes($uri, 1);

$r = $t->get($uri);
is($r->{status}, 200, 'after an abort: 200');
my $o = $t->sf_outcomes($uri, 2);
is(List::Util::sum(map { /^DIRECT:/ ? $o->{$_} : 0 } keys %$o), 2,
   'after an abort: the next request is DIRECT, as the aborted one was')
    or diag(explain($o));
ok(($o->{'DIRECT:200'} // 0) >= 1, 'after an abort: a 200');

# ------------------------------------------------------------ stats

my $stats = $t->zone_stats;
is($stats->{direct} - ($stats0->{direct} // 0), 3 + 1 + 1 + 2,
   'stats: the DIRECT requests counted in "direct"')
    or diag(explain($stats));
is($stats->{flights} - $stats0->{flights}, 3, 'stats: flights of the herds and /fetch/ only');

# ------------------------------------------------------------ a conditional GET

# A conditional GET alone goes upstream as it is (DIRECT), as without the
# module: the origin answers it itself (its 304), as $upstream_status
# shows, where a flight would have fetched the whole 200 for it.  (A
# Range leads a flight: a herd of Ranges is one origin request.)

# the status, $upstream_status and $singleflight_status of "METHOD PATH"
sub logged {
    my ($method, $path) = @_;
    my $line;
    $t->wait_for(sub {
        ($line) = grep { /"\Q$method $path\E HTTP/ } split /\n/, $t->read_file('access.log');
        defined $line;
    }, what => "the log line of $method $path");
    my ($code) = $line =~ /^\S+ "[^"]*" (\d+) /;
    my ($us) = $line =~ / us=(\S+)/;
    my ($sf) = $line =~ / sf=(\S*)/;
    return "$code us=$us sf=" . ($sf // '');
}

my $cv = '?echo=1&size=3000&hdr=ETag:%22c1%22&hdr=Last-Modified:Mon,%2001%20Jan%202024%2000:00:00%20GMT';
my $method = 'GET';
for my $c ([ 'inm', [ 'If-None-Match' => '"c1"' ], 304 ],
           [ 'ims', [ 'If-Modified-Since' => 'Mon, 01 Jan 2024 00:00:00 GMT' ], 304 ])
{
    my ($name, $hdrs, $code) = @$c;
    $t->origin_reset;
    my $x = $t->http($method, "/$name$cv", headers => $hdrs);
    my $y = $t->http($method, "/plain/$name$cv", headers => $hdrs);
    is($x->{status}, $code, "alone, $name: $code");
    is(length($x->{body} // q{}), length($y->{body} // q{}), "alone, $name: as long as without the module");
    is($t->origin_hits->{total}, 2, "alone, $name: one origin request each");
    is(logged($method, "/$name$cv"), "$code us=$code sf=DIRECT",
       "alone, $name: DIRECT, the origin's own $code");
    like(logged($method, "/plain/$name$cv"), qr/^$code us=$code /,
         "alone, $name: so without the module");
}

# A herd of conditionals: the first goes its own way, the second leads
# the flight the others follow (its fetch asks for the whole response,
# answered 304 by nginx): two origin requests.

$t->origin_reset;
$uri = "/cherd$cv&delay=500";
$res = $t->herd(n => 10, path => $uri, headers => [ 'If-None-Match' => '"c1"' ]);
is(scalar(grep { ($_->{status} // 0) == 304 } @$res), 10, 'conditional herd: 10 x 304');
is($t->origin_hits->{total}, 2, 'conditional herd: 2 origin requests');
is_deeply($t->sf_outcomes($uri, 10), { 'DIRECT:304' => 1, 'LEADER:304' => 1, 'FOLLOWER:304' => 8 },
          'conditional herd: the first DIRECT, then a flight');

# ------------------------------------------------------------ many at once

# More lone requests at once in the one worker than it keeps contexts for
# when they end (64): the contexts past that are freed while their pools
# are destroyed, whose walk reads each context's own cleanup after it ran
# (under ASan, a context freed too early is a use after free there).
# Twice, the second time from the contexts kept.

for my $round (1, 2) {
    $t->origin_reset;
    my @uris = map { "/many$round-$_?delay=300" } 1 .. 100;
    my $many = $t->herd(paths => \@uris);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$many), 100,
       "many at once, round $round: 100 complete 200s");
    is($t->origin_hits->{total}, 100, "many at once, round $round: 100 origin requests");
    # a few may share a slot of the zone with one of the others, and
    # lead a flight
    my $o = $t->sf_outcomes(qr{/many$round-\d+\?delay=300}, 100);
    is(($o->{'DIRECT:200'} // 0) + ($o->{'LEADER:200'} // 0), 100,
       "many at once, round $round: each DIRECT or, its slot shared, LEADER")
        or diag(explain($o));
    cmp_ok($o->{'DIRECT:200'} // 0, '>=', 90, "many at once, round $round: most DIRECT");
}

# ------------------------------------------------------------ a dead worker

# The worker of a lone request in progress is killed: the surviving
# process (the master's new worker) notices, and the key's next lone
# request is DIRECT, not the leader of a flight for ever.

$uri = '/dead?fail=hang&fail_first=1';
my ($pid) = $t->worker_pids;
$h = $t->start_request('GET', $uri);
$t->wait_for(sub { ($t->origin_uri_hits($uri) // 0) >= 1 }, what => 'the lone request at the origin');
$t->allow_log(qr/worker process $pid exited on signal 9/);
$t->kill_worker($pid);
$t->finish_request($h, timeout => 2);
$t->wait_for(sub { my @w = $t->worker_pids; @w && $w[0] != $pid }, what => 'a new worker');

my ($n, $direct) = (0, 0);
$t->wait_for(sub {
    my $x = $t->get($uri);
    return 0 unless ($x->{status} // 0) == 200;
    $direct = $t->sf_outcomes($uri, ++$n)->{'DIRECT:200'} // 0;
}, timeout => 20, interval => 0.5, what => 'a DIRECT request after the dead worker');
is($direct, 1, 'after a dead worker: the key is alone again');

$t->zone_baseline_ok('the zone is back to its baseline');

# ------------------------------------------------------------ a reload

# Zone "r" was made without slots; a reload gives it its first "direct"
# location: the live zone gets them, and its idle baseline their pages.

$r = $t->get('/r/x');
is_deeply($t->sf_outcomes('/r/x', 1), { 'LEADER:200' => 1 }, 'before the reload: a flight');
(my $second = $conf) =~ s/%%R_LONE%%//;
$t->write_config($second);
ok($t->reload, 'reloaded with the default, direct, in zone "r"');
$r = $t->get('/r/x');
is($r->{status}, 200, 'after the reload: 200');
is_deeply($t->sf_outcomes('/r/x', 2), { 'LEADER:200' => 1, 'DIRECT:200' => 1 },
          'after the reload: DIRECT');
$t->zone_baseline_ok('zone "r" is back to its baseline', zone => 'r');

done_testing;
