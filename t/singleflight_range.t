#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_max_range_offset: a Range far into a response is not
# collapsed into the response's flight.  That flight's fetch asks the
# origin for the whole response, and a client's range is cut from it; a
# range that starts late (a video seek into a large file) would wait for
# everything before it, where without the module the origin sends that
# range alone.  By default only open-ended ranges from the first byte
# join the whole response's flight (a herd of players asking "bytes=0-");
# a later start or a suffix ("bytes=-N") has a flight of that Range, which
# the fetch sends: requests with the same Range share the origin's answer
# to it (players of one file asking for the same index at its end),
# others are not held back.  So does a bounded range from anywhere
# ("bytes=0-99", t/singleflight_range_probe.t).  With If-Range or another
# conditional, a HEAD, or a cache in the location, such a range goes
# upstream on its own (BYPASS).  An offset moves the limit, off collapses
# every range into the whole response's flight; the location's own cache
# limit (proxy_cache_max_range_offset) is kept too: what nginx's cache
# passes on to the origin with its Range is not collapsed.
#
# Each answer is compared with plain nginx's (a server without the
# module, same upstream); what reached the origin is seen in a hop
# server's log ($http_range).

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $locations = <<'EOT';
        location / {
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        location /k/ {
            singleflight_max_range_offset 10k;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        location /off/ {
            singleflight_max_range_offset off;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        location /m0/ {
            max_ranges 0;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        location /c0/ {
            singleflight_max_range_offset off;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_cache_max_range_offset 0;
        }

        location /c2k/ {
            singleflight_max_range_offset off;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            proxy_cache one;
            proxy_cache_valid 200 1m;
            proxy_cache_max_range_offset 2000;
        }
EOT

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    proxy_cache_path %%TESTDIR%%/cache keys_zone=one:1m;
    log_format hop '\$request_uri range=[\$http_range]';

    # the hop: what the origin was sent
    server {
        listen 127.0.0.1:%%PORT_1%%;
        access_log %%TESTDIR%%/hop.log hop;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
$locations
        location = /stats {
            singleflight_stats;
        }
    }

    # plain nginx, for the answers; its lines not among the module's, which
    # a lone flight's leader may log after plain's answer came
    server {
        listen 127.0.0.1:%%PORT_2%%;
        access_log %%TESTDIR%%/plain.log;
$locations
    }
EOT

$t->start;

my $SIZE = 100000;
my $port2 = $t->port(2);

# The origin's path for a test: the same bytes on every hit, ranges taken.
sub uri {
    my ($prefix, $name, $delay) = @_;
    return "/$prefix/$name?fixed=1&ranges=1&size=$SIZE&delay=" . ($delay // 300);
}

# The $singleflight_status of the first $n requests for $uri (plain
# nginx's, later, log "-").
sub statuses {
    my ($uri, $n) = @_;
    return join(',', ($t->sf_statuses($uri, $n))[0 .. $n - 1]);
}

# What reached the origin for $uri, through the hop: its Range values
# ('' for none), once there are $n.
sub sent {
    my ($uri, $n) = @_;
    my @r;
    $t->wait_for(sub {
        @r = map { /range=\[(.*)\]$/ ? ($1 eq '-' ? '' : $1) : '?' }
            grep { /^\Q$uri\E range=/ } split /\n/, $t->read_file('hop.log');
        @r >= $n;
    }, what => "$n origin requests for $uri");
    return @r;
}

# status, Content-Range and body, to compare with plain nginx's
sub answer {
    my ($r) = @_;
    return join(' ', $r->{status} // 'none', $r->{headers}{'content-range'} // '-',
                $r->{complete} ? 'complete' : 'incomplete', length($r->{body} // ''),
                $r->{body} // '');
}

# A request alone, with plain nginx's answer to the same.
sub alone {
    my ($uri, $range) = @_;
    my $sf = $t->get($uri, headers => [ Range => $range ]);
    my $plain = $t->get($uri, headers => [ Range => $range ], port => $port2);
    return ($sf, $plain);
}

# ------------------------------------------------------------ the default

# A late range and a suffix, alone: a flight of their own, upstream with
# their Range, plain nginx's answer.  Several ranges: the origin ignores
# them (a 200 with Accept-Ranges), and nginx does not cut it either.
for my $c ([ 'late', 'bytes=1000-1999', 206 ], [ 'suffix', 'bytes=-100', 206 ],
           [ 'several', 'bytes=0-9,5000-5009', undef ]) {
    my ($name, $range, $status) = @$c;
    my $uri = uri('d', $name, 0);
    my ($sf, $plain) = alone($uri, $range);
    is(answer($sf), answer($plain), "$name range alone: plain nginx's answer");
    is($sf->{status}, $status, "$name range alone: $status") if $status;
    is_deeply([ sent($uri, 2) ], [ $range, $range ],
              "$name range alone: the origin was sent its Range, as plain nginx sends it");
    is(statuses($uri, 1), 'LEADER', "$name range alone: a flight of that range");
}

# Far ranges, a herd: one flight per Range, each sends its Range, every
# answer plain nginx's (a 206, a 416 past the end, the whole 200 for
# several ranges); requests of the same Range share one origin request.
{
    my $uri = uri('d', 'farherd');
    my @ranges = (('bytes=90000-') x 3, ('bytes=-100') x 2, 'bytes=50000-50099',
                  ('bytes=200000-') x 2, ('bytes=10-19,30000-30009') x 2);
    $t->origin_reset;
    my @h = map { $t->start_request('GET', $uri, headers => [ Range => $_ ]) } @ranges;
    my @res = map { $t->finish_request($_) } @h;
    my %plain = map { $_ => answer($t->get($uri, headers => [ Range => $_ ], port => $port2)) }
        @ranges;
    is(scalar(grep { answer($res[$_]) eq $plain{ $ranges[$_] } } 0 .. $#ranges), scalar @ranges,
       "far ranges, a herd: plain nginx's answer, each of " . @ranges);
    is(join(' ', map { $_->{status} // 'none' } @res), '206 206 206 206 206 206 416 416 200 200',
       'far ranges, a herd: 206, 416 past the end, 200 for several');
    my %distinct = map { $_ => 1 } @ranges;
    is($t->origin_uri_hits($uri), keys(%distinct) + @ranges,
       'far ranges, a herd: one origin request per Range (and plain\'s, each)');
    my $n = keys %distinct;
    is_deeply([ sort((sent($uri, 2 * $n))[0 .. $n - 1]) ], [ sort keys %distinct ],
              'far ranges, a herd: each flight sent its Range');
    my @st = split /,/, statuses($uri, scalar @ranges);
    is(scalar(grep { $_ eq 'LEADER' } @st) . ' ' . scalar(grep { $_ eq 'FOLLOWER' } @st),
       scalar(keys %distinct) . ' ' . (@ranges - keys %distinct),
       'far ranges, a herd: a leader per Range, the others follow');
}

# A far range with a conditional (If-Range, If-None-Match), or a HEAD:
# the answer depends on what each client holds; on its own (BYPASS).  So
# too with a second Range header.
for my $c ([ 'ifrange', 'GET', [ 'If-Range' => '"s1"' ] ],
           [ 'inm', 'GET', [ 'If-None-Match' => '"x"' ] ], [ 'head', 'HEAD', [] ],
           [ 'two', 'GET', [ Range => 'bytes=80000-' ] ]) {
    my ($name, $method, $h) = @$c;
    my $uri = uri('d', $name) . '&hdr=ETag:%22s1%22';
    $t->origin_reset;
    my @h = map { $t->start_request($method, $uri, headers => [ Range => 'bytes=90000-', @$h ]) }
        1 .. 3;
    my @res = map { $t->finish_request($_) } @h;
    my $plain = $t->http($method, $uri, headers => [ Range => 'bytes=90000-', @$h ],
                            port => $port2);
    is(scalar(grep { answer($_) eq answer($plain) } @res), 3,
       "far range, $name: plain nginx's answer, each of 3");
    is($t->origin_uri_hits($uri), 4, "far range, $name: each its own (and plain's)");
    my @st;
    $t->wait_for(sub {
        @st = map { /sf=(\S*)/ } grep { /"$method \Q$uri\E HTTP/ }
            split /\n/, $t->read_file('access.log');
        @st >= 3;
    }, what => "3 access log lines for $uri");
    is(join(',', @st[0 .. 2]), 'BYPASS,BYPASS,BYPASS', "far range, $name: BYPASS");
}

# A Range nginx's range filter does not cut from the whole response
# (another unit, an If-Range the response fails), or which the origin
# would not (a weak If-Range never matches): the whole response, with the
# origin's Accept-Ranges alone, as plain nginx passes it on (the range
# filter added one of its own beside it).  With max_ranges 0 nginx
# cuts none: the request goes upstream on its own (BYPASS), and gets the
# origin's 206.
for my $c ([ 'unit', 'd', [ Range => 'items=0-5' ], 200, 'LEADER' ],
           [ 'ifother', 'd', [ Range => 'bytes=0-', 'If-Range' => '"other"' ], 200, 'LEADER' ],
           [ 'ifsame', 'd', [ Range => 'bytes=0-', 'If-Range' => '"s1"' ], 206, 'LEADER' ],
           [ 'ifweak', 'd', [ Range => 'bytes=0-', 'If-Range' => 'W/"s1"' ], 200, 'LEADER',
             'W%2F%22s1%22' ],
           [ 'maxranges', 'm0', [ Range => 'bytes=0-' ], 206, 'BYPASS' ]) {
    my ($name, $prefix, $h, $status, $sf, $etag) = @$c;
    my $uri = uri($prefix, $name, 0) . '&hdr=ETag:' . ($etag // '%22s1%22');
    my $res = $t->get($uri, headers => $h);
    my $plain = $t->get($uri, headers => $h, port => $port2);
    is(answer($res), answer($plain), "$name: plain nginx's answer");
    is($res->{status}, $status, "$name: $status");
    is($res->{headers}{'accept-ranges'} // '-', $plain->{headers}{'accept-ranges'} // '-',
       "$name: Accept-Ranges as plain nginx's");
    is(statuses($uri, 1), $sf, "$name: $sf");
}

# The same as followers of a whole response's flight: each as plain nginx
{
    my $uri = uri('d', 'uncut', 600) . '&hdr=ETag:%22s1%22';
    my @f = ([ Range => 'items=0-5' ], [ Range => 'bytes=0-', 'If-Range' => '"other"' ],
             [ Range => 'bytes=0-', 'If-Range' => '"s1"' ]);
    my $res = $t->flight(leader => [ 'GET', $uri ],
                         followers => [ map { [ 'GET', $uri, headers => $_ ] } @f ]);
    my @plain = map { $t->get($uri, headers => $_, port => $port2) } @f;
    is(join(' ', map { answer($res->[$_ + 1]) eq answer($plain[$_]) ? 'same' : 'other' } 0 .. 2),
       'same same same', 'uncut ranges, followers: plain nginx\'s answers');
    is(join(' ', map { $_->{headers}{'accept-ranges'} // '-' } @$res[1 .. 3]),
       join(' ', map { $_->{headers}{'accept-ranges'} // '-' } @plain),
       'uncut ranges, followers: Accept-Ranges as plain nginx\'s');
    is(join(',', sort(split /,/, statuses($uri, 4))), 'FOLLOWER,FOLLOWER,FOLLOWER,LEADER',
       'uncut ranges: a leader and followers');
}

# A herd from the first byte: those to the end ("bytes=0-") share one
# origin request, for the whole response, each its own range; a bounded
# one ("bytes=0-0", "bytes=0-99") has a flight of its Range.
{
    my $uri = uri('d', 'herd');
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri, headers => [ Range => 'bytes=0-' ] ],
                         followers => [ map { [ 'GET', $uri, headers => [ Range => $_ ] ] }
                                        'bytes=0-', 'bytes=0-0', 'bytes=0-99', 'bytes=0-99' ],
                         waiters => 2);
    my $body = $t->origin_body(0, $uri, $SIZE);
    is(join(' ', map { ($_->{status} // 'none') . ':' . length($_->{body} // '') } @$res),
       "206:$SIZE 206:$SIZE 206:1 206:100 206:100", 'ranges from the first byte, a herd: each its range');
    is(scalar(grep { $_->{body} eq substr($body, 0, length $_->{body}) } @$res), 5,
       'ranges from the first byte: the bytes of the response');
    is($t->origin_uri_hits($uri), 3,
       'ranges from the first byte: one origin request to the end, one per bounded Range');
    is_deeply([ sort(sent($uri, 3)) ], [ '', 'bytes=0-0', 'bytes=0-99' ],
              'ranges from the first byte: the fetch to the end sent no Range, the others theirs');
}

# A late range while a flight of the whole response runs: on its own.
{
    my $uri = uri('d', 'during', 600);
    $t->origin_reset;
    my $lead = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => 'the flight');
    my $late = $t->get($uri, headers => [ Range => 'bytes=90000-' ]);
    my $full = $t->finish_request($lead);
    my $body = $t->origin_body(0, $uri, $SIZE);
    is(($late->{status} // 'none') . ' ' . ($late->{body} eq substr($body, 90000) ? 'right' : 'wrong'),
       '206 right', 'a late range beside a flight: its bytes');
    ok($full->{complete} && $full->{body} eq $body, 'the flight: the whole response');
    is($t->origin_uri_hits($uri), 2, 'a late range beside a flight: an origin request of its own');
}

# ------------------------------------------------------------ an offset, off

# singleflight_max_range_offset 10k: a range from 5000 to the end is
# collapsed into the whole response's flight, one from 5000 to 5099 (a
# bounded one) or from 20000 has a flight of its Range; off: every range
# is in the whole response's.
for my $c ([ 'k', 'bytes=5000-', 1 ], [ 'k', 'bytes=5000-5099', 0 ],
           [ 'k', 'bytes=20000-20099', 0 ],
           [ 'off', 'bytes=50000-50099', 1 ], [ 'off', 'bytes=-100', 1 ]) {
    my ($where, $range, $collapsed) = @$c;
    (my $name = $range) =~ s/\W/_/g;
    my $uri = uri($where, $name);
    $t->origin_reset;
    my @h = map { $t->start_request('GET', $uri, headers => [ Range => $range ]) } 1 .. 3;
    my @res = map { $t->finish_request($_) } @h;
    my $plain = $t->get($uri, headers => [ Range => $range ], port => $port2);
    is(scalar(grep { answer($_) eq answer($plain) } @res), 3,
       "/$where/ $range: plain nginx's answer, each of 3");
    is($t->origin_uri_hits($uri), 2, "/$where/ $range: collapsed, one origin request (and plain's)");
    is_deeply([ (sent($uri, 2))[0] ], [ $collapsed ? '' : $range ],
              "/$where/ $range: " . ($collapsed ? 'the whole response fetched' : 'its Range sent'));
}

# ------------------------------------------------------------ the cache's limit

# proxy_cache_max_range_offset 0: nginx's cache passes every Range on;
# 2000: those from 2000 on.  Those are not collapsed (singleflight_max_
# range_offset off there), the others are, and the cache fetches them
# whole.
for my $c ([ 'c0', 'bytes=0-0', 1 ], [ 'c2k', 'bytes=2000-2099', 1 ],
           [ 'c2k', 'bytes=1999-2099', 0 ]) {
    my ($where, $range, $passed) = @$c;
    (my $name = $range) =~ s/\W/_/g;
    my $uri = uri($where, $name, 0);
    my $sf = $t->get($uri, headers => [ Range => $range ]);
    my $body = $t->origin_body(0, $uri, $SIZE);
    my ($from, $to) = $range =~ /(\d+)-(\d+)/;
    is(($sf->{status} // 'none') . ' ' . ($sf->{body} eq substr($body, $from, $to - $from + 1)
                                          ? 'right' : 'wrong'),
       '206 right', "/$where/ $range: its range");
    is_deeply([ sent($uri, 1) ], [ $passed ? $range : '' ],
              "/$where/ $range: " . ($passed ? 'the cache passed its Range on' : 'fetched whole'));
    is(statuses($uri, 1), $passed ? 'BYPASS' : 'LEADER',
       "/$where/ $range: " . ($passed ? 'BYPASS' : 'collapsed'));
}

$t->zone_baseline_ok('the zone back to its baseline');

# The stats page, in a server with singleflight on: never a flight of
# its own (it would count itself in flight, and hold the zone off its
# baseline while it is answered).
{
    my $before = $t->zone_stats->{flights};
    $t->zone_stats for 1 .. 3;
    is($t->zone_stats->{flights}, $before, 'the stats page is no flight');
}

done_testing();
