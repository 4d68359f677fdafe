#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_lone own: a flight's leader goes upstream with its own
# request, as without the module, and its response is copied into the
# flight as the origin sends it, for the followers that joined before its
# header.  Each case compares what clients get with the same requests in a
# location without the module, and counts origin requests:
#
#   a herd: one origin request, every body the origin's, the leader logged
#   LEADER, the others FOLLOWER;
#   a lone request: one origin request, not stored (unstored);
#   a herd in a location with mirror: the followers restore the flight's
#   location, not the leader's copy of it;
#   the leader's client gone mid-body: its upstream response is read on
#   for the followers, whole bodies from one origin request;
#   the leader's client gone before the header: a follower takes the
#   flight over;
#   the leader's upstream reset (nginx's 502): the followers fetch once
#   more;
#   a private response: each follower goes upstream itself;
#   a leader with a cookie and a response without freshness: its own;
#   proxy_buffering off: a follower takes the flight over (the pipe does
#   not buffer such a body, so it cannot pace the followers);
#   the leader's response made by its error_page: a follower takes the
#   flight over;
#   a leader with a Range: fetched by a subrequest, as before;
#   a proxy_cache hit: not a flight;
#   and the zone back to its baseline.

use strict;
use warnings;

use Test::More;

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $ETAG = 'hdr=ETag:%22v1%22';

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:4m memory=64k;
    proxy_cache_path %%TESTDIR%%/cache levels=1:2 keys_zone=pc:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /o/ {
            singleflight sf;
            singleflight_lone own;
            proxy_pass http://%%ORIGIN%%;
        }

        location /unbuffered/ {
            singleflight sf;
            singleflight_lone own;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /cached/ {
            singleflight sf;
            singleflight_lone own;
            proxy_cache pc;
            proxy_cache_valid 200 1h;
            proxy_pass http://%%ORIGIN%%;
        }

        location /intercept/ {
            singleflight sf;
            singleflight_lone own;
            proxy_intercept_errors on;
            error_page 404 /err.html;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /err.html {
            root %%TESTDIR%%;
        }

        location /mirrored/ {
            singleflight sf;
            singleflight_lone own;
            mirror /sink;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /sink {
            internal;
            return 204;
        }

        location /plain/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->write_file('err.html', "not here\n");
$t->start;

# the body a client without the module gets for $q (fixed=1&stamp=s: every hit's)
sub plain {
    my ($q) = @_;
    my $r = $t->get("/plain/x?$q");
    return $r->{body};
}

# n requests for $uri at once; their results
sub herd {
    my ($uri, $n, %opt) = @_;
    my @h = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. $n;
    return [ map { $t->finish_request($_) } @h ];
}

sub count { my ($re, @l) = @_; scalar grep { $_ =~ $re } @l }

# ------------------------------------------------------------ a herd

{
    my $q = 'size=300000&fixed=1&stamp=s&delay=400';
    my $uri = "/o/herd?$q";
    my $want = plain($q);

    my $res = herd($uri, 10);

    is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 10,
       'herd: 10 answers of 200');
    is(scalar(grep { ($_->{body} // '') eq $want } @$res), 10,
       'herd: every body as without the module');
    is($t->origin_uri_hits($uri), 1, 'herd: 1 origin request');
    is_deeply($t->sf_outcomes($uri, 10),
              { 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
              'herd: logged LEADER once, FOLLOWER 9 times');
}

# ------------------------------------------------------------ mirrored

# the leader hides its mirrors from the mirror module with a copy of its
# location's configuration in its pool: the followers, which restore the
# flight's location after the leader is gone, never see that copy
{
    my $q = 'size=20000&fixed=1&stamp=s&delay=400';
    my $uri = "/mirrored/m?$q";
    my $want = plain($q);

    my $res = herd($uri, 6);

    is(scalar(grep { ($_->{body} // '') eq $want } @$res), 6,
       'mirror: every body as without the module');
    is($t->origin_uri_hits($uri), 1, 'mirror: 1 origin request');
    is_deeply($t->sf_outcomes($uri, 6),
              { 'LEADER:200' => 1, 'FOLLOWER:200' => 5 },
              'mirror: one leader, 5 followers');
}

# ------------------------------------------------------------ a lone request

{
    my $q = 'size=5000&fixed=1&stamp=s';
    my $uri = "/o/lone?$q";
    my $before = $t->zone_stats->{unstored} // 0;
    my $timed = $t->zone_stats->{flight_seconds}{count} // 0;
    my $r = $t->get($uri);

    is($r->{status}, 200, 'lone: 200');
    is($r->{body}, plain($q), 'lone: the body as without the module');
    is($t->origin_uri_hits($uri), 1, 'lone: 1 origin request');
    ok($t->wait_zone(sub { ($_[0]{unstored} // 0) == $before + 1 },
                     what => 'unstored counted'),
       'lone: not stored');
    is_deeply([ $t->sf_statuses($uri, 1) ], ['LEADER'], 'lone: LEADER');
    ok($t->wait_zone(sub { ($_[0]{flight_seconds}{count} // 0) == $timed + 1 },
                     what => 'flight_seconds counted'),
       'lone: its time in flight_seconds, as a fetch\'s');
}

# ------------------------------------------------------------ leader gone

# mid-body: its upstream request is read on to its end for the
# followers, who get all of it from the one origin request
{
    my $q = "size=400000&fixed=1&stamp=s&ranges=1&$ETAG&delay=300&pace=20000:30";
    my $uri = "/o/gone?$q";
    my $want = plain($q);
    $t->origin_reset;

    my $leader = $t->start_request('GET', $uri, timeout => 20);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 },
                 what => 'the leader upstream');
    my @f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 5;
    $t->wait_waiters(5);

    # the leader has some of the body: its client goes
    $t->wait_for(sub { $t->poll_request($leader);
                       length($leader->{buf} // '') > 60000
                       || length($leader->{res}{body} // '') > 60000 },
                 what => 'the leader reading its body');
    $t->abort_request($leader);

    my @res = map { $t->finish_request($_) } @f;

    is(scalar(grep { ($_->{body} // '') eq $want } @res), 5,
       'leader gone mid-body: 5 followers got the whole body');
    is($t->origin_uri_hits($uri), 1,
       'leader gone mid-body: 1 origin request, read on for the followers');
}

# before its header: a follower takes the flight over
{
    my $q = 'size=20000&fixed=1&stamp=s&delay=800';
    my $uri = "/o/early?$q";
    my $want = plain($q);
    $t->origin_reset;

    my $leader = $t->start_request('GET', $uri, timeout => 20);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 },
                 what => 'the leader upstream');
    my @f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 4;
    $t->wait_waiters(4);
    $t->abort_request($leader);

    my @res = map { $t->finish_request($_) } @f;

    is(scalar(grep { ($_->{body} // '') eq $want } @res), 4,
       'leader gone before its header: 4 followers got the body');
    is($t->origin_uri_hits($uri), 2,
       'leader gone before its header: 2 origin requests');
    is($t->sf_outcomes($uri, 5)->{'PROMOTED:200'}, 1,
       'leader gone before its header: one follower PROMOTED');
}

# ------------------------------------------------------------ a 502 (reset)

{
    my $q = 'size=2000&fixed=1&stamp=s&delay=400&fail=reset&fail_first=1';
    my $uri = "/o/e502?$q";
    $t->origin_reset;

    my $res = herd($uri, 5);

    is(scalar(grep { ($_->{status} // 0) == 502 } @$res), 1,
       '502: the leader got nginx\'s 502');
    is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 4,
       '502: the followers fetched once more');
    is($t->origin_uri_hits($uri), 2, '502: 2 origin requests');
}

# ------------------------------------------------------------ private

{
    my $q = 'size=3000&delay=300&hdr=Cache-Control:private';
    my $uri = "/o/private?$q";
    $t->origin_reset;

    my $res = herd($uri, 4);

    is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 4,
       'private: 4 answers');
    is($t->origin_uri_hits($uri), 4,
       'private: each request went upstream itself');
    my %hits = map { ($_->{headers}{'x-hit'} // '') => 1 } @$res;
    is(scalar(keys %hits), 4, 'private: each got its own response');
}

# a leader with a cookie, a response no shared cache would give to anybody
# else (no freshness): its own; the followers without one go upstream
{
    my $q = 'size=3000&fixed=1&stamp=s&delay=400';
    my $uri = "/o/cookie?$q";
    $t->origin_reset;

    my $leader = $t->start_request('GET', $uri, timeout => 20,
                                   headers => [ Cookie => 'session=1' ]);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 },
                 what => 'the leader upstream');
    my @f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 3;
    $t->wait_waiters(3);
    my @res = map { $t->finish_request($_) } $leader, @f;

    is(scalar(grep { ($_->{status} // 0) == 200 } @res), 4,
       'cookie leader: 4 answers');
    is($t->origin_uri_hits($uri), 4,
       'cookie leader: its response its own, the others went upstream');
    is_deeply($t->sf_outcomes($uri, 4),
              { 'LEADER:200' => 1, 'NOT_SHARED:200' => 3 },
              'cookie leader: the followers NOT_SHARED');
}

# ------------------------------------------------------------ unbuffered

{
    my $q = 'size=100000&fixed=1&stamp=s&delay=400';
    my $uri = "/unbuffered/u?$q";
    my $want = plain($q);
    $t->origin_reset;

    my $res = herd($uri, 6);

    is(scalar(grep { ($_->{body} // '') eq $want } @$res), 6,
       'proxy_buffering off: every body as without the module');
    is($t->origin_uri_hits($uri), 2,
       'proxy_buffering off: 2 origin requests (a follower took over)');
}

# ------------------------------------------------------------ an error page

# the leader's response is its error_page's, not the upstream's: nothing
# to copy, a follower fetches, and each client gets its own error page
{
    my $q = 'size=300&delay=400&status=404';
    my $uri = "/intercept/i?$q";
    $t->origin_reset;

    my $res = herd($uri, 4);

    is(scalar(grep { ($_->{status} // 0) == 404
                     && ($_->{body} // '') eq "not here\n" } @$res), 4,
       'error page: every client got the error page, 404');
    is($t->origin_uri_hits($uri), 2,
       'error page: 2 origin requests (a follower took over)');
}

# ------------------------------------------------------------ a Range leader

{
    my $q = "size=50000&fixed=1&stamp=s&ranges=1&$ETAG&delay=400";
    my $uri = "/o/range?$q";
    my $want = plain($q);
    $t->origin_reset;

    my $leader = $t->start_request('GET', $uri, timeout => 20,
                                   headers => { Range => 'bytes=0-99' });
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 },
                 what => 'the Range leader upstream');
    my @f = map { $t->start_request('GET', $uri, timeout => 20) } 1 .. 3;
    my $lr = $t->finish_request($leader);
    my @res = map { $t->finish_request($_) } @f;

    is($lr->{status}, 206, 'Range leader: 206');
    is($lr->{body}, substr($want, 0, 100), 'Range leader: its 100 bytes');
    is(scalar(grep { ($_->{body} // '') eq $want } @res), 3,
       'Range leader: the others got the whole body');
}

# ------------------------------------------------------------ a cache hit

{
    my $q = 'size=4000&fixed=1&stamp=s';
    my $uri = "/cached/c?$q";
    my $first = $t->get($uri);

    # the cache has the file once the upstream request is over, which may
    # be after its client had the last byte
    $t->wait_for(sub { my @f = glob($t->path('cache') . '/*/*/*'); @f },
                 what => 'the response in the cache');
    # nginx renames the file into place, then marks its cache node as
    # there: the first request's log line, written once its upstream
    # request is over, comes after both
    $t->sf_statuses($uri, 1);

    my $hit = $t->get($uri);

    is($hit->{body}, $first->{body}, 'cache hit: the cached body');
    is($t->origin_uri_hits($uri), 1, 'cache hit: the origin asked once');
    is_deeply([ $t->sf_statuses($uri, 2) ], [ 'LEADER', '-' ],
              'cache hit: not a flight ($singleflight_status empty)');
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing;
