#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_private: privacy by default.
#
# A response that carries Set-Cookie or "Cache-Control: private" is one
# user's: it is not shared.  Its followers go upstream alone (NOT_SHARED),
# and if it had followers its key is remembered as not collapsible for
# singleflight_private_ttl (5s by default): requests for it in that window
# go straight upstream ($singleflight_status PRIVATE, stats "private")
# instead of queueing; after that the key collapses again.  A private
# response nobody followed marks nothing.  singleflight_private lists the
# conditions (set-cookie private no-store no-cache, or off; default
# "set-cookie private"): no-store and no-cache do not stop sharing unless
# listed.  With "singleflight_credentials off", requests with an
# Authorization or a Cookie header are not collapsed (PRIVATE); with "on"
# they are (the default, "http", is t/singleflight_credentials_http.t).

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfp '$pid $singleflight_status $request_uri';
    access_log %%TESTDIR%%/sf.log sfp;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        singleflight sf;
        add_header X-SF $singleflight_status always;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }

        # One flight key, whose upstream request is given by the request
        # header X-Target, which the key leaves out: the same key gets a
        # private response once and a public one later, as a URL that sets
        # a cookie on some requests only does.
        location /ttl/ {
            singleflight_private_ttl 1500ms;
            proxy_pass http://%%ORIGIN%%$http_x_target;
        }

        # the default window, the same way
        location /dflt/ {
            proxy_pass http://%%ORIGIN%%$http_x_target;
        }

        location /zero/ {
            singleflight_private_ttl 0;
            proxy_pass http://%%ORIGIN%%;
        }

        location /nostore/ {
            singleflight_private no-store;
            proxy_pass http://%%ORIGIN%%;
        }

        location /nocache/ {
            singleflight_private private no-cache;
            proxy_pass http://%%ORIGIN%%;
        }

        location /poff/ {
            singleflight_private off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /cred/ {
            singleflight_credentials on;
            proxy_pass http://%%ORIGIN%%;
        }

        location /c/ {
            singleflight_credentials off;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight off;
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# $t->flight() of GET requests given as [path, headers]: leader => [...],
# followers => [[...], ...], waiters => n (default all).
# The leader is at the origin once the origin has its X-Target, if it has
# one, else its path.
sub flight {
    my (%a) = @_;
    my $get = sub { [ 'GET', $_[0][0], headers => $_[0][1] // [] ] };
    my %lh = @{ $a{leader}[1] // [] };
    return $t->flight(leader => $get->($a{leader}), target => $lh{'X-Target'},
        followers => [ map { $get->($_) } @{ $a{followers} } ], waiters => $a{waiters});
}

# n concurrent requests for one path (with headers)
sub burst {
    my ($n, $path, @hdr) = @_;
    return $t->herd(n => $n, path => $path, headers => [@hdr]);
}

sub statuses { join ' ', map { $_->{headers}{'x-sf'} // '-' } @{ $_[0] } }
sub sorted_statuses { join ' ', sort map { $_->{headers}{'x-sf'} // '-' } @{ $_[0] } }
sub hits { join ' ', sort { $a <=> $b } map { $_->{headers}{'x-hit'} // 0 } @{ $_[0] } }

# every response a complete 200 with the body of its own X-Hit
sub all_good {
    my ($res, $uri) = @_;
    return scalar(@$res) == grep {
        ($_->{status} // 0) == 200 && $_->{complete}
            && $_->{body} eq SFTest::origin_body($_->{headers}{'x-hit'} // 0, $uri)
    } @$res;
}

# The default window is checked along the way: /dflt/k is marked private
# at the start, and each check_flight() probes it with a public request.
my ($dflt_before, $dflt_after, $dflt_last_private, $dflt_free);

sub probe_default {
    return if !defined $dflt_after || defined $dflt_free;
    my $start = time;    # the mark is looked at when the request arrives
    my $p = $t->get('/dflt/k', headers => [ 'X-Target' => '/dflt/k?probe' ]);
    if (($p->{headers}{'x-sf'} // '') eq 'PRIVATE') { $dflt_last_private = $start }
    else { $dflt_free = $start }
}

# One flight of a leader and 3 followers for $uri; returns the results.
# A private response: the followers each went upstream (NOT_SHARED).
# A shared one: they followed and got the leader's response.
sub check_flight {
    my ($uri, $private, $name) = @_;
    probe_default();
    $t->origin_reset;
    my $res = flight(leader => [$uri], followers => [ ([$uri]) x 3 ]);
    ok(all_good($res, $uri), "$name: 4 complete responses with their bodies");
    if ($private) {
        is(statuses($res), 'LEADER NOT_SHARED NOT_SHARED NOT_SHARED',
           "$name: not shared, the followers went upstream alone");
        is(hits($res), '1 2 3 4', "$name: 4 origin responses");
    }
    else {
        is(statuses($res), 'LEADER FOLLOWER FOLLOWER FOLLOWER', "$name: shared");
        is(hits($res), '1 1 1 1', "$name: 1 origin response for all");
    }
    return $res;
}

# ------------------------------------------------------------ Set-Cookie

my $uri = '/sc?delay=500&hdr=Set-Cookie:id%3D1';
my $s0 = $t->zone_stats;
my $res = check_flight($uri, 1, 'Set-Cookie');
is(scalar(grep { ($_->{headers}{'set-cookie'} // '') eq 'id=1' } @$res), 4,
   'Set-Cookie: each client got the cookie of its own origin response');
is($t->zone_stats->{not_shared} - $s0->{not_shared}, 3, 'Set-Cookie: not_shared counts 3');

# the same in /dflt/: the default window is checked at the end
my $dflt_target = [ 'X-Target' => '/dflt/k?delay=300&hdr=Set-Cookie:id%3D9' ];
$dflt_before = time;
$res = flight(leader => [ '/dflt/k', $dflt_target ], followers => [ ([ '/dflt/k', $dflt_target ]) x 2 ]);
$dflt_after = time;
is(statuses($res), 'LEADER NOT_SHARED NOT_SHARED',
   'default window: a private response for /dflt/k, with followers');
is($res->[0]{headers}{'set-cookie'}, 'id=9', 'default window: with its Set-Cookie');

# the key is remembered: a burst goes straight upstream, not queued

$t->origin_reset;
my $p0 = $t->zone_stats->{private};
my $t0 = time;
$res = burst(5, $uri);
my $took = time - $t0;
ok(all_good($res, $uri), 'Set-Cookie, then: 5 complete responses');
is(statuses($res), 'PRIVATE PRIVATE PRIVATE PRIVATE PRIVATE', 'Set-Cookie, then: all PRIVATE');
is(hits($res), '1 2 3 4 5', 'Set-Cookie, then: each went upstream');
# counted as each request ends, which may be after its client has it all
my (undef, $pz) = $t->wait_zone(sub { $_[0]{private} - $p0 >= 5 }, timeout => 3,
                                what => 'the burst counted');
is($pz->{private} - $p0, 5, 'Set-Cookie, then: stats "private" counts them');
ok($took < 1.4, sprintf('Set-Cookie, then: side by side, not one after another (%.2fs)', $took));

# ------------------------------------------------------------ Cache-Control

check_flight('/cc?delay=300&hdr=Cache-Control:private', 1, 'Cache-Control: private');
check_flight('/cc?delay=300&hdr=Cache-Control:max-age=0,%20Private', 1,
    'Cache-Control: max-age=0, Private');
check_flight('/cc?delay=300&hdr=Cache-Control:private=%22X-Foo%22', 1,
    'Cache-Control: private="X-Foo"');
check_flight('/cc?delay=300&hdr=Cache-Control:max-age=60&hdr=Cache-Control:private', 1,
    'Cache-Control: private in a second line');

check_flight('/cc?delay=300&hdr=Cache-Control:public,%20max-age=60', 0, 'Cache-Control: public');
check_flight('/cc?delay=300&hdr=Cache-Control:no-store', 0, 'Cache-Control: no-store (default)');
check_flight('/cc?delay=300&hdr=Cache-Control:no-cache', 0, 'Cache-Control: no-cache (default)');
check_flight('/cc?delay=300&hdr=Cache-Control:no-transform,%20x-private,%20privateer', 0,
    'Cache-Control: words that contain "private"');

# ------------------------------------------------------------ singleflight_private

check_flight('/nostore/a?delay=300&hdr=Cache-Control:no-store', 1,
    'singleflight_private no-store: no-store');
check_flight('/nostore/b?delay=300&hdr=Set-Cookie:id%3D2', 0,
    'singleflight_private no-store: Set-Cookie no longer listed');
check_flight('/nocache/a?delay=300&hdr=Cache-Control:no-cache', 1,
    'singleflight_private private no-cache: no-cache');
check_flight('/nocache/b?delay=300&hdr=Cache-Control:private', 1,
    'singleflight_private private no-cache: private');
$res = check_flight('/poff/a?delay=300&hdr=Set-Cookie:id%3D3&hdr=Cache-Control:private', 0,
    'singleflight_private off');
is(scalar(grep { ($_->{headers}{'set-cookie'} // '') eq 'id=3' } @$res), 4,
   'singleflight_private off: the followers got the Set-Cookie too');

# live streams: each client its own, as without the module (a late
# arrival would get the stream's past), whatever the conditions; with off,
# shared as anything else
check_flight('/ev?delay=300&chunked=1&hdr=Content-Type:text/event-stream', 1,
    'server-sent events');
$res = burst(3, '/ev?delay=300&chunked=1&hdr=Content-Type:text/event-stream');
is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq 'PRIVATE' } @$res), 0,
   'server-sent events: the key is not marked, its other answers may be shared');
check_flight('/nostore/ev?delay=300&chunked=1&hdr=Content-Type:text%2Fevent-stream%3B%20charset%3Dutf-8', 1,
    'server-sent events, a charset, other conditions');
check_flight('/mjpeg?delay=300&chunked=1&hdr=Content-Type:multipart/x-mixed-replace%3B%20boundary%3Df', 1,
    'a multipart/x-mixed-replace stream');
check_flight('/plainchunked?delay=300&chunked=1&hdr=Content-Type:text/plain', 0,
    'a chunked text/plain response: shared');
check_flight('/streamer?delay=300&chunked=1&hdr=Content-Type:text/event-streamer', 0,
    'another type that begins alike: shared');
$t->origin_reset;
$res = $t->flight(leader => [ 'HEAD', '/hev?delay=300&hdr=Content-Type:text/event-stream' ],
                  followers => [ ([ 'HEAD', '/hev?delay=300&hdr=Content-Type:text/event-stream' ]) x 3 ]);
is(statuses($res), 'LEADER FOLLOWER FOLLOWER FOLLOWER',
   'server-sent events, HEAD: no body, nothing live: shared');
check_flight('/poff/ev?delay=300&chunked=1&hdr=Content-Type:text/event-stream', 0,
    'server-sent events, singleflight_private off: shared');

# ttl 0: not shared, but not remembered either

$uri = '/zero/a?delay=500&hdr=Set-Cookie:id%3D4';
check_flight($uri, 1, 'singleflight_private_ttl 0');
$t->origin_reset;
$res = flight(leader => [$uri], followers => [ ([$uri]) x 3 ]);
is(statuses($res), 'LEADER NOT_SHARED NOT_SHARED NOT_SHARED',
   'singleflight_private_ttl 0: the key collapses again at once');

# ------------------------------------------------------------ the window

# A private response for /ttl/k that had followers marks the key, so that
# public responses for it go upstream alone, until the mark expires
# (1500 ms); then they collapse again.

sub ttl { [ '/ttl/k', [ 'X-Target' => $_[0] ] ] }

$t->origin_reset;
$t0 = time;
$res = flight(leader => ttl('/ttl/k?delay=300&hdr=Set-Cookie:id%3D5'),
    followers => [ (ttl('/ttl/k?delay=300&hdr=Set-Cookie:id%3D5')) x 2 ]);
my $mark = $t0 + $res->[0]{time};    # the leader's response: the mark is set then
is(statuses($res), 'LEADER NOT_SHARED NOT_SHARED', 'window: a private response with followers');

$res = $t->herd(n => 4, path => '/ttl/k', headers => [ 'X-Target' => '/ttl/k?public1&delay=300' ]);
is(statuses($res), 'PRIVATE PRIVATE PRIVATE PRIVATE',
   'window: a public burst for the marked key goes upstream alone');
is($t->origin_uri_hits('/ttl/k?public1&delay=300'), 4, 'window: 4 origin requests');

my $free;
$t->wait_for(sub {
    my $start = time;
    my $p = $t->get('/ttl/k', headers => [ 'X-Target' => '/ttl/k?probe' ]);
    return 0 if ($p->{headers}{'x-sf'} // '') eq 'PRIVATE';
    $free = $start;
    return 1;
}, timeout => 5, interval => 0.05, what => 'the mark to expire');
ok($free && $free - $mark >= 1.3 && $free - $mark < 2.5,
   sprintf('window: the key is free again after singleflight_private_ttl (%.2fs)',
       ($free // 0) - $mark));

$t->origin_reset;
$res = flight(leader => ttl('/ttl/k?public2&delay=500'), followers => [ (ttl('/ttl/k?public2&delay=500')) x 4 ]);
is(statuses($res), 'LEADER FOLLOWER FOLLOWER FOLLOWER FOLLOWER', 'window: then the key collapses again');
is(hits($res), '1 1 1 1 1', 'window: one origin request');

# A private response that nobody followed marks nothing: the next flight
# of the key collapses at once.

$t->origin_reset;
my $r = $t->get('/ttl/k', headers => [ 'X-Target' => '/ttl/k?alone&hdr=Set-Cookie:id%3D6' ]);
is(($r->{headers}{'x-sf'} // '-') . ' ' . ($r->{headers}{'set-cookie'} // '-'), 'LEADER id=6',
   'no followers: a private response for the key, nobody following');
$res = flight(leader => ttl('/ttl/k?public3&delay=300'), followers => [ (ttl('/ttl/k?public3&delay=300')) x 3 ]);
is(statuses($res), 'LEADER FOLLOWER FOLLOWER FOLLOWER', 'no followers: the key is not marked');
is(hits($res), '2 2 2 2', 'no followers: one origin request for the flight');

# ------------------------------------------------------------ credentials

for my $cred ([ Authorization => 'Basic dTpw' ], [ Cookie => 'session=1' ]) {
    my $name = $cred->[0];
    $uri = "/c/$name?delay=300";
    $t->origin_reset;
    $p0 = $t->zone_stats->{private};
    $res = burst(5, $uri, @$cred);
    ok(all_good($res, $uri), "$name: 5 complete responses");
    is(statuses($res), 'PRIVATE PRIVATE PRIVATE PRIVATE PRIVATE', "$name: not collapsed (PRIVATE)");
    is(hits($res), '1 2 3 4 5', "$name: 5 origin requests");
    my (undef, $cz) = $t->wait_zone(sub { $_[0]{private} - $p0 >= 5 }, timeout => 3,
                                    what => "$name: the burst counted");
    is($cz->{private} - $p0, 5, "$name: stats \"private\" counts them");

    # a request with credentials does not follow a running flight ...
    $t->origin_reset;
    $uri = "/c/$name/f?delay=300";
    $res = flight(leader => [$uri], followers => [ [$uri], [$uri], [ $uri, $cred ] ], waiters => 2);
    is(statuses($res), 'LEADER FOLLOWER FOLLOWER PRIVATE', "$name: does not follow a flight");
    is(hits($res), '1 1 1 2', "$name: and fetches its own response");

    # ... nor leads one
    $t->origin_reset;
    $uri = "/c/$name/l?delay=300";
    $res = flight(leader => [ $uri, $cred ], followers => [ ([$uri]) x 3 ], waiters => 2);
    is(sorted_statuses($res), 'FOLLOWER FOLLOWER LEADER PRIVATE', "$name: does not lead a flight");
    is($res->[0]{headers}{'x-sf'}, 'PRIVATE', "$name: the request with credentials is PRIVATE");
    is(hits($res), '1 2 2 2', "$name: the others share a response of their own");

    # singleflight_credentials on
    $t->origin_reset;
    $uri = "/cred/$name?delay=300";
    $res = flight(leader => [ $uri, $cred ], followers => [ [ $uri, $cred ], [ $uri, $cred ], [$uri] ]);
    is(statuses($res), 'LEADER FOLLOWER FOLLOWER FOLLOWER', "$name, singleflight_credentials on: collapsed");
    is(hits($res), '1 1 1 1', "$name, singleflight_credentials on: one origin request");
}

# ------------------------------------------------------------ the default window: 5s

# /dflt/k was marked between $dflt_before and $dflt_after; the probes
# found it PRIVATE until $dflt_last_private, free at $dflt_free

$t->wait_for(sub { probe_default(); defined $dflt_free }, timeout => 8, interval => 0.05,
    what => 'the default mark to expire');
ok(defined $dflt_last_private && $dflt_last_private - $dflt_before >= 3.0,
   sprintf('default window: still PRIVATE %.2fs after the private response',
       ($dflt_last_private // $dflt_before) - $dflt_before));
ok(defined $dflt_free && $dflt_free - $dflt_before >= 4.9,
   sprintf('default window: not free before 5s (free after %.2fs)',
       ($dflt_free // $dflt_before) - $dflt_before));
ok(defined $dflt_free && $dflt_free - $dflt_after < 6.5 && ($dflt_last_private // 0) - $dflt_after < 5.1,
   'default window: free again soon after 5s');

# ------------------------------------------------------------ zone is clean

my (undef, $zone) = $t->wait_zone(sub {
    $_[0]{waiters} == 0 && $_[0]{pages_used} == $_[0]{pages_baseline};
}, timeout => 8, what => 'zone back to baseline');
is($zone->{waiters}, 0, 'zone: nobody waiting');
is($zone->{pages_used}, $zone->{pages_baseline}, 'zone: memory back to baseline once marks expire');

done_testing;
