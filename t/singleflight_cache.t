#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# proxy_cache hits through a fetch.  A collapsed request's fetch looks in
# the cache as the request itself would, and a hit goes to its leader
# alone.  An empty cached body, with a Content-Length or without one (a
# chunked origin response): nginx 1.22 answers a subrequest's, which a
# fetch is, with the header alone, no end of body, and the leader's
# response must end all the same (nginx-tests' scgi_cache.t 8), straight
# or stored, to HTTP/1.1 and HTTP/1.0 clients.
#
# A cache hit is not a flight: its request's $singleflight_status is
# empty, it is not counted in requests_total, and its time is not one of
# the origin's header times (nor does it feed singleflight_hedge auto,
# which hedged the next miss at the 50 ms floor after 40 hits: 2 origin
# requests).

use strict;
use warnings;

use Digest::MD5 ();
use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    # proxy_cache through a fetch: what this file tests
    singleflight_lone fetch;
    proxy_cache_path %%TESTDIR%%/cache keys_zone=one:1m;
    map $arg_c $cz {
        default off;
        on one;
    }

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
        add_header X-Cache $upstream_cache_status always;
        add_header X-SF "[$singleflight_status]" always;

        location / {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_http_version 1.1;
        }

        location /stored/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_http_version 1.1;
            singleflight_lazy off;
        }

        location /hedged/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            singleflight_hedge auto;
        }

        # the default: a lone request goes its own way, and a herd's
        # first request feeds the flight (and the cache) from its own
        # upstream response
        location /direct/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            singleflight_lone direct;
        }

        # the cache read in a thread: a hit's header comes in a later
        # round of events, while others of its herd arrive
        location /direct-aio/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            singleflight_lone direct;
            aio threads;
        }

        # a stale entry that the cache gives others while one request
        # updates it (proxy_cache_use_stale updating): the first request
        # going its own way (direct), or leading its flight (own)
        location /upd/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale updating;
            singleflight_lone direct;
        }

        location /upd-own/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale updating;
            singleflight_lone own;
        }

        location /byp/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_cache_bypass $http_x_bypass;
            singleflight_lone direct;
        }

        # one entry for a URI whatever its arguments: requests that
        # skip the cache ask an origin that fails, the others hit
        location /bypx/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1m;
            proxy_cache_bypass $http_x_bypass;
            singleflight_lone direct;
        }

        # a cache only for some requests: the others' upstream sends
        # the origin their Range and conditionals; so does one before
        # proxy_cache_min_uses
        location /varc/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache $cz;
            proxy_cache_valid 200 1m;
            singleflight_lone direct;
        }

        location /scarce/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_cache_min_uses 100;
            singleflight_lone direct;
        }

        # skipping it by a header that a fetch drops
        location /bypc/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1m;
            proxy_cache_bypass $http_if_none_match;
        }

        location /bypx-fetch/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1m;
            proxy_cache_bypass $http_x_bypass;
        }

        # an "if" block, with no content handler of its own, and the
        # cache's background update
        location /bg/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
            singleflight_lone direct;
            if ($arg_x) {
                set $x 1;
            }
        }

        # a cache's answers after asking the origin: revalidated, and
        # stale after an error (one entry for every query: $uri)
        location /reval/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_valid 200 1s;
            proxy_cache_revalidate on;
            singleflight_lone direct;
        }

        location /stale/ {
            proxy_pass http://%%ORIGIN%%;
            proxy_cache one;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1s;
            proxy_cache_use_stale error timeout http_500;
            singleflight_lone direct;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

for my $c ([ '/e?size=0', 'empty, a length' ], [ '/e?size=0&chunked=1', 'empty, chunked' ],
           [ '/stored/e?size=0&chunked=1', 'empty, chunked, stored' ],
           [ '/f?size=100&chunked=1', 'not empty, chunked' ]) {
    # (the origin chunks only for HTTP/1.1: proxy_http_version 1.1)
    my ($uri, $name) = @$c;
    my $size = $uri =~ /size=(\d+)/ ? $1 : 0;
    my $o0 = $t->zone_stats->{origin_requests_total};
    my @got = map { $t->get($uri, http10 => $_ eq '1.0', timeout => 3) } '1.1', '1.1', '1.0';
    my $body = $got[0]{body} // '';
    is(length $body, $size, "$name: the body's length");
    is(join(' ', map { join(':', $_->{status} // 'none', $_->{headers}{'x-cache'} // '-',
                            $_->{complete} ? 'complete' : 'incomplete',
                            ($_->{body} // '') eq $body ? 'body' : 'other') } @got),
       join(' ', map { "200:$_:complete:body" } 'MISS', 'HIT', 'HIT'),
       "$name: a miss, then hits, each whole");
    is($t->origin_uri_hits($uri), 1, "$name: one origin request");
    $t->origin_requests_ok($o0, { first => 1 },
                           "$name: origin_requests_total, the miss's fetch alone");
}

# hits: no status, not counted, no header time
{
    # the miss, cached; counted as it ends, which may come after its
    # client has the last byte
    my $l0 = $t->zone_stats->{requests_total}{LEADER} // 0;
    $t->get('/hit?size=10');
    my (undef, $z0) = $t->wait_zone(sub { ($_[0]{requests_total}{LEADER} // 0) > $l0 },
                                    what => 'the miss counted');
    my @hits = map { $t->get('/hit?size=10') } 1 .. 40;
    is(scalar(grep { ($_->{headers}{'x-cache'} // '') eq 'HIT'
                     && ($_->{headers}{'x-sf'} // '') eq '[]' } @hits), 40,
       'cache hits: HIT, $singleflight_status empty');
    my $z1 = $t->zone_stats;
    is(($z1->{requests_total}{LEADER} // 0) - ($z0->{requests_total}{LEADER} // 0), 0,
       'cache hits: no LEADER counted');
    is(($z1->{flight_header_seconds}{count} // 0) - ($z0->{flight_header_seconds}{count} // 0), 0,
       'cache hits: no header time');
    is(($z1->{flight_seconds}{count} // 0) - ($z0->{flight_seconds}{count} // 0), 0,
       'cache hits: no flight time');

    # singleflight_hedge auto after them: a slow miss is not hedged
    $t->get('/hedged/h?size=10') for 1 .. 41;
    my $uri = '/hedged/slow?delay=300&size=10';
    my $r = $t->get($uri);
    is($r->{status}, 200, 'a slow miss after hits: 200');
    is($t->origin_uri_hits($uri), 1, 'a slow miss after hits: one origin request, not hedged');
}

# ------------------------------------------------------------ the default

# singleflight_lone direct with proxy_cache, as the README has it: a herd
# on a miss.  The first request goes upstream itself (a cache MISS), the
# others wait for its header, and its response feeds them and the cache:
# one origin request.  Then the entry is a HIT, and a hit is not a flight:
# $singleflight_status empty, nothing counted in requests_total.  In a
# herd of hits, a request that came while another held its slot waits
# for that one's header, a hit: it then goes its own way to a hit of its
# own, as a request the module never saw (no status, not counted, its
# wait not in the histogram).  No origin request.

{
    $t->origin_reset;
    my $uri = '/direct/herd?delay=300&size=20000';
    my $sum = sub { my $n = 0; $n += $_ for values %{ $_[0]{requests_total} // {} }; $n };
    my $n0 = $sum->($t->zone_stats);

    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the first request at the origin');
    my @rest = map { $t->start_request('GET', $uri) } 1 .. 9;
    $t->wait_waiters(9);
    my @res = map { $t->finish_request($_) } $first, @rest;
    my $body = SFTest::origin_body(1, $uri, 20000);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body } @res), 10,
       'default, a herd on a miss: 10 complete 200s of the one response');
    is($t->origin_uri_hits($uri), 1, 'default, a herd on a miss: 1 origin request');
    is($res[0]{headers}{'x-cache'}, 'MISS', 'default, a herd on a miss: the first request a MISS');
    is_deeply($t->sf_outcomes($uri, 10), { 'LEADER:200' => 1, 'FOLLOWER:200' => 9 },
              'default, a herd on a miss: the first request LEADER, 9 FOLLOWER');

    # the herd counted (as each request ends), the entry in the cache
    my (undef, $z0) = $t->wait_zone(sub { $sum->($_[0]) == $n0 + 10 }, what => 'the herd counted');
    # its file: proxy_cache_key's default, $scheme$proxy_host$request_uri
    my $file = $t->path('cache') . '/' . Digest::MD5::md5_hex('http://' . $t->origin->addr . $uri);
    ok($t->wait_for(sub { -f $file }, what => 'the response in the cache'),
       'default: the response is in the cache');

    my $hit = sub { my ($r, @sf) = @_;
        ($r->{status} // 0) == 200 && $r->{complete} && $r->{body} eq $body
        && ($r->{headers}{'x-cache'} // '') eq 'HIT' && grep { ($r->{headers}{'x-sf'} // '') eq $_ } @sf };
    my @one = map { $t->get($uri) } 1 .. 3;
    is(scalar(grep { $hit->($_, '[]') } @one), 3,
       'default, hits: 3 HITs of the body, $singleflight_status empty');
    is($sum->($t->zone_stats), $sum->($z0), 'default, hits: not counted in requests_total');

    # the same response through /direct-aio/, in the cache first
    (my $aio = $uri) =~ s{^/direct/}{/direct-aio/};
    my $miss = $t->get($aio);
    is($miss->{headers}{'x-cache'}, 'MISS', 'default, aio threads: a miss first');
    $body = $miss->{body};
    # the miss is counted as it ends, which may be after its client has it
    my (undef, $za) = $t->wait_zone(sub { $sum->($_[0]) == $sum->($z0) + 1 },
                                    what => 'the miss counted');
    my @herd = map { @{ $t->herd(n => 10, path => $aio) } } 1 .. 3;
    is(scalar(grep { $hit->($_, '[]') } @herd), 30,
       'default, herds of hits: 30 HITs of the body, $singleflight_status empty')
        or diag(explain([ map { join ' ', $_->{status} // 'none', $_->{headers}{'x-cache'} // '-',
                                $_->{headers}{'x-sf'} // '-' } @herd ]));
    my $z1 = $t->zone_stats;
    is($sum->($z1), $sum->($za), 'default, herds of hits: not counted in requests_total');
    is($z1->{wait_seconds}{count} // -1, $za->{wait_seconds}{count} // -2,
       'default, herds of hits: no wait in the histogram');
    is($t->origin_uri_hits($uri) + $t->origin_uri_hits($aio), 2,
       'default, hits: no origin request');
}

# ------------------------------------------------------------ stale, bypassed

my $sum = sub { my $n = 0; $n += $_ for values %{ $_[0]{requests_total} // {} }; $n };

# A request that updates a stale entry (proxy_cache_use_stale updating)
# or skips the cache (proxy_cache_bypass) is not waited for: the cache
# answers the others at once, as without the module, with the stale
# entry (UPDATING) or the cached one (HIT), while that request is still
# at the origin.

for my $c ([ 'upd', 'stale, direct', 'UPDATING' ], [ 'upd-own', 'stale, own', 'UPDATING' ],
           [ 'byp', 'bypassed', 'HIT' ]) {
    my ($loc, $name, $cache) = @$c;
    my $uri = "/$loc/e?delay=2000";
    my $n0 = $sum->($t->zone_stats);
    my $fill = $t->get($uri);
    is($fill->{headers}{'x-cache'}, 'MISS', "$name: the entry cached");
    # its slot given back (it is counted after): the first request next
    # is alone, on its own way
    $t->wait_zone(sub { $sum->($_[0]) > $n0 }, what => "$name: the fill counted");
    # stale once its second has passed (proxy_cache_valid 200 1s)
    select(undef, undef, undef, 2.1) if $cache eq 'UPDATING';
    my $first = $t->start_request('GET', $uri,
                                  $cache eq 'HIT' ? (headers => { 'X-Bypass' => '1' }) : ());
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 2 }, what => "$name: the first request at the origin");
    my @rest = map { $t->finish_request($_) } map { $t->start_request('GET', $uri) } 1 .. 4;
    ok(!$t->poll_request($first), "$name: 4 answered while the first is at the origin");
    my $same = sub { ($_[0]{status} // 0) == 200 && $_[0]{complete} && $_[0]{body} eq $fill->{body}
                     && $_[0]{headers}{'x-hit'} eq $fill->{headers}{'x-hit'} };
    is(scalar(grep { $same->($_) } @rest), 4, "$name: 4 get the cached response")
        or diag(explain([ map { join ' ', $_->{status} // 'none', $_->{headers}{'x-cache'} // '-',
                                $_->{headers}{'x-hit'} // '-', $_->{headers}{'x-sf'} // '-' } @rest ]));
    is(join(' ', map { $_->{headers}{'x-cache'} // '-' } @rest), join(' ', ($cache) x 4),
       "$name: $cache, as without the module");
    my $r = $t->finish_request($first);
    ok(($r->{status} // 0) == 200 && $r->{complete} && !$same->($r),
       "$name: the first gets the origin's new response");
    is($t->origin_uri_hits($uri), 2, "$name: no other origin request");
}

# A herd that skips the cache, every request: one origin request, as a
# herd that does not skip it.

{
    my $uri = '/byp/all?delay=1000';
    my $first = $t->start_request('GET', $uri, headers => { 'X-Bypass' => '1' });
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'bypassing herd: the first at the origin');
    my @res = map { $t->finish_request($_) }
              $first, map { $t->start_request('GET', $uri, headers => { 'X-Bypass' => '1' }) } 1 .. 5;
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                     && ($_->{headers}{'x-cache'} // '') eq 'BYPASS' } @res), 6,
       'bypassing herd: 6 complete, BYPASS');
    is($t->origin_uri_hits($uri), 1, 'bypassing herd: 1 origin request');
}

# Requests that skip the cache (a browser's reload: Pragma: no-cache)
# while the origin fails, and others of their URI that do not: without
# the module those are hits at once; they never wait for the ones that
# skip it, nor get their error (they got the 503 after 1 s, BYPASS).

for my $c ([ 'bypx', 'direct', 2 ], [ 'bypx-fetch', 'fetch', 1 ]) {
    my ($loc, $name, $n) = @$c;
    my $fill = $t->get("/$loc/e");
    is($fill->{headers}{'x-cache'}, 'MISS', "skipping, $name: the entry cached");
    my $uri = "/$loc/e?status=503&delay=1500";
    my @skip = map { $t->start_request('GET', $uri, headers => { 'X-Bypass' => '1' }) } 1 .. $n;
    $t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => "skipping, $name: at the origin");
    my @rest = map { $t->finish_request($_) } map { $t->start_request('GET', $uri) } 1 .. 4;
    ok(!grep({ $t->poll_request($_) } @skip), "skipping, $name: 4 answered while the origin fails");
    is(join(' ', map { ($_->{status} // 'none') . ':' . ($_->{headers}{'x-cache'} // '-') } @rest),
       join(' ', ('200:HIT') x 4), "skipping, $name: 4 hits, as without the module");
    is(scalar(grep { ($_->{body} // '') eq $fill->{body} } @rest), 4, "skipping, $name: the cached body");
    is(join(' ', map { ($_->{status} // 'none') . ':' . ($_->{headers}{'x-cache'} // '-') }
                 map { $t->finish_request($_) } @skip),
       join(' ', ('503:BYPASS') x $n), "skipping, $name: the origin's 503 for those that skip the cache");
}

# Conditional requests that skip the cache by their If-None-Match: they
# go their own way, as a fetch, without it, would have been a hit (they
# got the cached 200 where the origin said 503).

{
    my $fill = $t->get('/bypc/e');
    is($fill->{headers}{'x-cache'}, 'MISS', 'skipping, conditional: the entry cached');
    my $uri = '/bypc/e?status=503&delay=500';
    my @h;
    for my $i (1 .. 3) {
        push @h, $t->start_request('GET', $uri, headers => { 'If-None-Match' => '"zzz"' });
        $t->wait_for(sub { $t->origin_uri_hits($uri) >= $i }, what => "skipping, conditional: $i at the origin");
    }
    is(join(' ', map { ($_->{status} // 'none') . ':' . ($_->{headers}{'x-cache'} // '-') . ':'
                       . ($_->{headers}{'x-sf'} // '-') } map { $t->finish_request($_) } @h),
       join(' ', ('503:BYPASS:[BYPASS]') x 3), "skipping, conditional: each the origin's 503, on its own");
}

# With a cache, nginx sends the origin no conditionals and no Range, and
# answers them itself only from a response it may cache: a response it
# may not (no-cache) goes whole to each, followers and lone requests
# alike, where the module answered 304, 412 and 206 from it.

for my $c ([ 'no-cache', '200:3000 200:3000 200:3000', '200:3000' ],
           [ 'max-age%3D60', '304:0 304:0 412:-', '206:11' ]) {
    my ($cc, $want, $range) = @$c;
    my $name = "$cc from the origin";
    my $q = "fixed=1&size=3000&ranges=1&hdr=ETag:%22e1%22&hdr=Cache-Control:$cc";
    my $uri = "/direct/cond-$cc?$q&delay=500";
    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => "$name: the first at the origin");
    my @h = ((map { $t->start_request('GET', $uri, headers => { 'If-None-Match' => '"e1"' }) } 1 .. 2),
             $t->start_request('GET', $uri, headers => { 'If-Match' => '"zz"' }));
    my $r = $t->finish_request($first);
    is(($r->{status} // 'none') . ':' . length($r->{body} // ''), '200:3000', "$name: the first, 200");
    is(join(' ', map { my $x = $t->finish_request($_);
                       ($x->{status} // 'none') . ':' . ($x->{status} == 412 ? '-' : length($x->{body} // '')) } @h),
       $want, "$name: conditionals answered as without the module");
    my $lone = $t->get("/direct/range-$cc?$q", headers => { 'Range' => 'bytes=0-10' });
    is(($lone->{status} // 'none') . ':' . length($lone->{body} // ''), $range,
       "$name: a lone Range answered as without the module");
}

# Where the request's upstream did not use the cache (proxy_cache $var
# "off", before proxy_cache_min_uses), the origin would have answered its
# Range and conditionals: the followers get them answered (they got the
# whole 200 there).

for my $loc ('varc', 'scarce') {
    my $q = "fixed=1&size=3000&ranges=1&hdr=ETag:%22e1%22";
    my $uri = "/$loc/cond?$q&delay=500";
    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => "$loc: the first at the origin");
    my @h = ($t->start_request('GET', $uri, headers => { 'If-None-Match' => '"e1"' }),
             $t->start_request('GET', $uri, headers => { 'Range' => 'bytes=0-10' }));
    $t->finish_request($first);
    is(join(' ', map { my $x = $t->finish_request($_); ($x->{status} // 'none') . ':' . length($x->{body} // '') } @h),
       '304:0 206:11', "$loc, no cache for the request: its conditional and Range answered as the origin would");
}

# The cache's background update is a subrequest that takes its request's
# content handler; in an "if" block, which has none of its own, it took
# the module's wrapper, and its worker crashed.

{
    my $uri = '/bg/x?x=1&delay=300';
    my $fill = $t->get($uri);
    is($fill->{headers}{'x-cache'}, 'MISS', 'background update in an "if": the entry cached');
    select(undef, undef, undef, 2.1);
    my $r = $t->get($uri);
    is(($r->{headers}{'x-cache'} // '-') . ' ' . ($r->{body} eq $fill->{body} ? 'the entry' : 'another'),
       'STALE the entry', 'background update in an "if": the stale entry at once');
    ok($t->wait_for(sub { my $h = $t->get($uri);
                          ($h->{headers}{'x-cache'} // '') eq 'HIT'
                          && $h->{headers}{'x-hit'} ne $fill->{headers}{'x-hit'} },
                    what => 'the entry updated'),
       'background update in an "if": the entry updated');
    is($t->origin_uri_hits($uri), 2, 'background update in an "if": 2 origin requests');
}

# Answers of the cache after asking the origin are not hits: a herd's
# first request is its LEADER, its followers waited for its header (the
# wait in the histogram) and, not given a response sent from the cache's
# file, went their own way (NOT_SHARED).  Revalidated (proxy_cache_revalidate):
# the origin's 304 refreshed the entry, which answers them.  Stale after
# an error (proxy_cache_use_stale http_500): each asks the origin itself.

for my $c ([ 'reval', 'revalidated', '', 1 ], [ 'stale', 'stale after an error', '&status=500', 5 ]) {
    my ($loc, $name, $query, $hits) = @$c;
    my $fill = $t->get("/$loc/x?fixed=1&hdr=ETag:%22v1%22&delay=500");
    is($fill->{headers}{'x-cache'}, 'MISS', "$name: the entry cached");
    select(undef, undef, undef, 2.1);
    my $uri = "/$loc/x?fixed=1&hdr=ETag:%22v1%22&delay=500$query";
    my $z0 = $t->zone_stats;
    my $h0 = $t->origin_uri_hits($uri);
    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == $h0 + 1 }, what => "$name: the first request at the origin");
    my @rest = map { $t->start_request('GET', $uri) } 1 .. 4;
    $t->wait_waiters(4);
    my @res = map { $t->finish_request($_) } $first, @rest;
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $fill->{body} } @res), 5,
       "$name: 5 get the cached response");
    # (the fill of the revalidated entry is a request for $uri too)
    is_deeply($t->sf_outcomes($uri, $query ? 5 : 6),
              { 'LEADER:200' => 1, 'NOT_SHARED:200' => 4, $query ? () : ('DIRECT:200' => 1) },
              "$name: the first LEADER, 4 NOT_SHARED");
    my (undef, $z1) = $t->wait_zone(sub { ($_[0]{requests_total}{NOT_SHARED} // 0)
                                          >= ($z0->{requests_total}{NOT_SHARED} // 0) + 4 },
                                    what => "$name: counted");
    is(($z1->{wait_seconds}{count} // 0) - ($z0->{wait_seconds}{count} // 0), 4,
       "$name: 4 waits in the histogram");
    is($t->origin_uri_hits($uri) - $h0, $hits, "$name: $hits origin request" . ($hits > 1 ? 's' : ''));
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing();
