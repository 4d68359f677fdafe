#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_vary: a response with "Vary: H" is shared only with the
# followers whose request value of H is the leader's (several lines of H
# joined with ", ", a missing H being the empty value, header names in any
# case).  The others give their flight up (counted in vary_mismatches) and
# form a flight of their own.  "Vary: *" is never shared: its followers go
# upstream alone (NOT_SHARED).
#
# The module's upstream is a second server of the same nginx ("echo"),
# which proxies to the origin and reports in X-Seen the request headers
# the origin was sent, so every client can check that its response was
# made for a request like its own.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfv '$pid $singleflight_status $request_uri';
    access_log %%TESTDIR%%/sf.log sfv;

    singleflight_zone zone=sf:1m;

    # echo: what the origin is sent, in X-Seen
    server {
        listen 127.0.0.1:%%PORT_1%%;

        location / {
            proxy_pass http://%%ORIGIN%%;
            add_header X-Seen "ae=[$http_accept_encoding] v=[$http_x_v] w=[$http_x_w]" always;
        }
    }

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        location / {
            singleflight sf;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        # the origin's Content-Encoding is not passed on
        location /hidece/ {
            singleflight sf;
            proxy_hide_header Content-Encoding;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        # every fetch offers the origin gzip (gunzip's setup)
        location /setae/ {
            singleflight sf;
            proxy_set_header Accept-Encoding gzip;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        # another upstream module's directive: proxy_pass sends the
        # client's Accept-Encoding all the same
        location /otherae/ {
            singleflight sf;
            fastcgi_param HTTP_ACCEPT_ENCODING gzip;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        # the same as /setae/, its requests in an "if" block
        location /setaeif/ {
            singleflight sf;
            proxy_set_header Accept-Encoding gzip;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;

            if ($request_method = GET) {
                add_header X-If 1;
            }
        }

        # Accept-Encoding made of a variable: the origin gets each its own
        location /varae/ {
            singleflight sf;
            proxy_set_header Accept-Encoding $http_x_ae;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# $t->flight() of GET requests given as [path, header list], the leader's
# first.
sub flight {
    my @reqs = map { [ 'GET', $_->[0], headers => $_->[1] // [] ] } @_;
    my $leader = shift @reqs;
    return $t->flight(leader => $leader, followers => \@reqs);
}

# A complete 200 whose body is the origin's response number X-Hit.
sub good {
    my ($r, $uri) = @_;
    my $hit = $r->{headers}{'x-hit'} // 0;
    return ($r->{status} // 0) == 200 && $r->{complete}
        && $r->{body} eq SFTest::origin_body($hit, $uri, 2000);
}

sub show {
    my ($r) = @_;
    return { status => $r->{status}, error => $r->{error}, 'x-hit' => $r->{headers}{'x-hit'},
        'x-sf' => $r->{headers}{'x-sf'}, 'x-seen' => $r->{headers}{'x-seen'} };
}

# ------------------------------------------------------------ the done criterion

# A concurrent burst, half of it with "Accept-Encoding: gzip", on a
# response with "Vary: Accept-Encoding": every client gets a body made for
# its own Accept-Encoding, with exactly two origin requests.

my $uri = '/ae?delay=600&size=2000&hdr=Vary:Accept-Encoding';
my $N = 40;
my $m0 = $t->zone_stats->{vary_mismatches};

my @h = map {
    $t->start_request('GET', $uri, headers => $_ % 2 ? [ 'Accept-Encoding' => 'gzip' ] : [])
} 1 .. $N;
my @res = map { $t->finish_request($_) } @h;

is(scalar(grep { good($_, $uri) } @res), $N, "burst: $N complete 200 responses with their body")
    or diag(explain([ map { show($_) } @res ]));
is(scalar(grep { $res[$_]{headers}{'x-seen'} eq ($_ % 2 ? 'ae=[] v=[] w=[]' : 'ae=[gzip] v=[] w=[]') }
          0 .. $N - 1), $N,
   'burst: every response was fetched with the client\'s own Accept-Encoding')
    or diag(explain([ map { show($_) } @res ]));
is($t->origin_uri_hits($uri), 2, 'burst: exactly two origin requests');

my %hit_of;
$hit_of{ $_->{headers}{'x-seen'} // '' }{ $_->{headers}{'x-hit'} // '' }++ for @res;
is(scalar(keys %{ $hit_of{'ae=[gzip] v=[] w=[]'} // {} }), 1, 'burst: the gzip clients share one response');
is(scalar(keys %{ $hit_of{'ae=[] v=[] w=[]'} // {} }), 1, 'burst: the others share the other one');

my %st;
$st{ $_->{headers}{'x-sf'} // '-' }++ for @res;
is_deeply(\%st, { LEADER => 2, FOLLOWER => $N - 2 }, 'burst: two leaders, the rest followers');
is($t->zone_stats->{vary_mismatches} - $m0, $N / 2,
   'burst: vary_mismatches counts the half that re-joined');

# ------------------------------------------------------------ ordered: who re-joins

# A plain leader; gzip followers re-join and make the second flight, the
# plain followers take the first response.

$t->origin_reset;
$uri = '/ord?delay=500&size=2000&hdr=Vary:Accept-Encoding';
$m0 = $t->zone_stats->{vary_mismatches};
my $res = flight([ $uri ], ([ $uri ]) x 3, ([ $uri, [ 'Accept-Encoding' => 'gzip' ] ]) x 3);

is(scalar(grep { good($_, $uri) } @$res), 7, 'ordered: 7 complete responses');
is(join(' ', map { $_->{headers}{'x-hit'} // '-' } @$res), '1 1 1 1 2 2 2',
   'ordered: plain clients get response 1, gzip clients response 2')
    or diag(explain([ map { show($_) } @$res ]));
is(join(' ', map { $_->{headers}{'x-sf'} // '-' } @$res[ 0 .. 3 ]), 'LEADER FOLLOWER FOLLOWER FOLLOWER',
   'ordered: the plain followers followed');
is(join(' ', sort map { $_->{headers}{'x-sf'} // '-' } @$res[ 4 .. 6 ]), 'FOLLOWER FOLLOWER LEADER',
   'ordered: one gzip client led the second flight, the others followed it');
is($res->[4]{headers}{'x-seen'}, 'ae=[gzip] v=[] w=[]', 'ordered: the second flight was fetched with gzip');
is($t->zone_stats->{vary_mismatches} - $m0, 3, 'ordered: 3 vary mismatches');
is($t->origin_uri_hits($uri), 2, 'ordered: two origin requests');

# ------------------------------------------------------------ Accept-Encoding unnamed

# An origin that encodes by Accept-Encoding and says nothing in Vary
# (nginx's gzip_vary off): plain proxying gives each client the origin's
# answer to its own Accept-Encoding, so a response it encoded goes to the
# same Accept-Encoding alone, and so does one made for a request that
# offered no coding.  One made for a request that offered codings and
# came unencoded is everybody's.  A Content-Encoding that
# proxy_hide_header keeps from the client still tells what the origin made.

$t->origin_reset;
for my $case (
    # name, query, leader's Accept-Encoding, followers' (count each), flights
    [ 'encoded, unnamed', 'hdr=Content-Encoding:gzip', 'gzip', [ [ '', 3 ], [ 'gzip', 3 ] ], 2 ],
    [ 'for no coding, unnamed', '', '', [ [ 'gzip', 3 ], [ '', 3 ] ], 2 ],
    [ 'not encoded for gzip', '', 'gzip', [ [ '', 3 ] ], 1 ],
    [ 'encoded, named "identity"', 'hdr=Content-Encoding:identity', 'gzip', [ [ '', 3 ] ], 1 ],
    [ 'encoded, hidden', 'hdr=Content-Encoding:gzip', 'gzip', [ [ '', 3 ] ], 2, '/hidece' ],
    # "identity" alone, or a coding refused by q=0, offers no coding
    [ 'not encoded for "identity"', '', 'identity', [ [ 'gzip', 3 ] ], 2 ],
    [ 'not encoded for "gzip;q=0"', '', 'gzip;q=0', [ [ 'gzip, br', 3 ] ], 2 ],
    [ 'not encoded for "gzip;q=0.5"', '', 'gzip;q=0.5', [ [ '', 3 ] ], 1 ],
    [ 'encoded, another module sets it', 'hdr=Content-Encoding:gzip', 'gzip', [ [ '', 3 ] ], 2, '/otherae' ],
    [ 'not encoded for "gzip;level=1;q=0"', '', 'gzip;level=1;q=0', [ [ 'gzip', 3 ] ], 2 ],
) {
    my ($name, $query, $lead, $follow, $flights, $prefix) = @$case;
    (my $path = $name) =~ s/\W+/-/g;
    my $uri = ($prefix // '') . "/$path?delay=500&size=2000" . ($query ? "&$query" : '');
    my @ae = ($lead, map { ($_->[0]) x $_->[1] } @$follow);
    my $res = flight(map { [ $uri, length $_ ? [ 'Accept-Encoding' => $_ ] : [] ] } @ae);
    is(scalar(grep { good($_, $uri) } @$res), scalar(@ae), "$name: complete responses");
    is(scalar(grep { $res->[$_]{headers}{'x-seen'} eq "ae=[$ae[$_]] v=[] w=[]" } 0 .. $#ae),
       $flights == 1 ? scalar(grep { $_ eq $lead } @ae) : scalar(@ae),
       "$name: " . ($flights == 1 ? 'one response for all' : 'each got the answer to its own Accept-Encoding'))
        or diag(explain([ map { show($_) } @$res ]));
    is($t->origin_uri_hits($uri), $flights, "$name: $flights origin request" . ($flights > 1 ? 's' : ''));
}

# Where the location sets Accept-Encoding itself, every fetch offers the
# origin the same: an encoded response without Vary is everybody's.

$uri = '/setae/x?delay=500&size=2000&hdr=Content-Encoding:gzip';
$res = flight([ $uri ], [ $uri, [ 'Accept-Encoding' => 'br' ] ], [ $uri, [ 'Accept-Encoding' => 'gzip' ] ]);
my $one = ($res->[0]{headers}{'x-hit'} // '-') . ':ae=[gzip] v=[] w=[]';
is(join(' ', map { ($_->{headers}{'x-hit'} // '-') . ':' . ($_->{headers}{'x-seen'} // '-') } @$res),
   join(' ', ($one) x 3),
   'Accept-Encoding set by the location: one response for all, fetched with gzip');
is($t->origin_uri_hits($uri), 1, 'Accept-Encoding set by the location: one origin request');

# The same with "Vary: Accept-Encoding": the origin gets what the location
# sets, never the client's header (the gunzip setup)

$uri = '/setae/v?delay=500&size=2000&hdr=Vary:Accept-Encoding';
$res = flight([ $uri ], [ $uri, [ 'Accept-Encoding' => 'br' ] ], [ $uri, [ 'Accept-Encoding' => 'gzip' ] ],
              [ $uri, [ 'Accept-Encoding' => 'gzip, deflate, br' ] ]);
$one = ($res->[0]{headers}{'x-hit'} // '-') . ':ae=[gzip] v=[] w=[]';
is(join(' ', map { ($_->{headers}{'x-hit'} // '-') . ':' . ($_->{headers}{'x-seen'} // '-') } @$res),
   join(' ', ($one) x 4),
   'Vary: Accept-Encoding set by the location: one response for all, fetched with gzip');
is($t->origin_uri_hits($uri), 1, 'Vary: Accept-Encoding set by the location: one origin request');

$uri = '/setaeif/v?delay=500&size=2000&hdr=Vary:Accept-Encoding';
$res = flight([ $uri ], [ $uri, [ 'Accept-Encoding' => 'br' ] ], [ $uri, [ 'Accept-Encoding' => 'gzip' ] ]);
$one = ($res->[0]{headers}{'x-hit'} // '-') . ':ae=[gzip] v=[] w=[]';
is(join(' ', map { ($_->{headers}{'x-hit'} // '-') . ':' . ($_->{headers}{'x-seen'} // '-') } @$res),
   join(' ', ($one) x 3), 'the same in an "if" block: one response for all, fetched with gzip');
is($t->origin_uri_hits($uri), 1, 'the same in an "if" block: one origin request');

# Accept-Encoding made of a variable by the location, an encoded response
# without Vary: each gets what the origin made for its own value

$uri = '/varae/x?delay=500&size=2000&hdr=Content-Encoding:gzip';
$res = flight([ $uri, [ 'X-AE' => 'gzip' ] ], ([ $uri ]) x 2, ([ $uri, [ 'X-AE' => 'gzip' ] ]) x 2);
is(join(' ', map { $_->{headers}{'x-seen'} // '-' } @$res),
   join(' ', 'ae=[gzip] v=[] w=[]', ('ae=[] v=[] w=[]') x 2, ('ae=[gzip] v=[] w=[]') x 2),
   'Accept-Encoding made of a variable: each gets the answer to what the origin got for it');
is($t->origin_uri_hits($uri), 2, 'Accept-Encoding made of a variable: 2 origin requests');

# ------------------------------------------------------------ values compared

# Vary on X-V (named in lower case in Vary): the leader sends "a, b".  Two
# lines "a" and "b" join to the same value, and the name's case does not
# matter; a single "a", "A, B", "a,b" and a missing header differ.  The
# four that differ re-join one after the other: each flight's leader is one
# of them, the rest mismatch again (4 + 3 + 2 + 1 re-joins).

$t->origin_reset;
$uri = '/val?delay=400&size=2000&hdr=Vary:x-v';
$m0 = $t->zone_stats->{vary_mismatches};
my @reqs = (
    [ 'X-V' => 'a, b' ],
    [ 'X-V' => 'a, b' ],
    [ 'X-V' => 'a', 'X-V' => 'b' ],
    [ 'x-v' => 'a, b' ],
    [ 'X-V' => 'a' ],
    [ 'X-V' => 'A, B' ],
    [ 'X-V' => 'a,b' ],
    [],
);
$res = flight(map { [ $uri, $_ ] } @reqs);
is(scalar(grep { good($_, $uri) } @$res), 8, 'values: 8 complete responses');
is(join(' ', map { ($_->{headers}{'x-hit'} // '') eq '1' ? 1 : 0 } @$res), '1 1 1 1 0 0 0 0',
   'values: shared with the same value, the same lines joined, any name case; not otherwise')
    or diag(explain([ map { show($_) } @$res ]));
is(join(' ', map { $_->{headers}{'x-seen'} // '' } @$res[ 4 .. 7 ]),
   'ae=[] v=[a] w=[] ae=[] v=[A, B] w=[] ae=[] v=[a,b] w=[] ae=[] v=[] w=[]',
   'values: the others got a response fetched with their own value');
is(scalar(keys %{ { map { ($_->{headers}{'x-hit'} // '') => 1 } @$res[ 4 .. 7 ] } }), 4,
   'values: one response per distinct value');
# each of the 4 other values mismatches the first response once, then
# goes to the flight of its own value, which foresees its variant
is($t->zone_stats->{vary_mismatches} - $m0, 4, 'values: 4 vary mismatches, one each');
is($t->origin_uri_hits($uri), 5, 'values: one origin request per distinct value');

# a missing header and an empty one are the same value

$t->origin_reset;
$uri = '/empty?delay=500&size=2000&hdr=Vary:X-V';
$res = flight([ $uri ], [ $uri ], [ $uri, [ 'X-V' => '' ] ], [ $uri, [ 'X-V' => 'x' ] ]);
is(join(' ', map { $_->{headers}{'x-hit'} // '-' } @$res), '1 1 1 2',
   'missing = empty: shared between missing and empty, not with "x"');
is($t->origin_uri_hits($uri), 2, 'missing = empty: two origin requests');

# ------------------------------------------------------------ several names

# "Vary: X-V, X-W" and a second "Vary: Accept-Encoding" line: all must match

$t->origin_reset;
$uri = '/multi?delay=400&size=2000&hdr=Vary:X-V,%20X-W&hdr=Vary:Accept-Encoding';
@reqs = (
    [ 'X-V' => '1', 'X-W' => '2', 'Accept-Encoding' => 'gzip' ],
    [ 'X-V' => '1', 'X-W' => '2', 'Accept-Encoding' => 'gzip' ],
    [ 'X-V' => '1', 'X-W' => '2' ],
    [ 'X-V' => '1', 'X-W' => '3', 'Accept-Encoding' => 'gzip' ],
    [ 'X-V' => '0', 'X-W' => '2', 'Accept-Encoding' => 'gzip' ],
    [ 'X-W' => '2', 'X-Other' => 'z', 'Accept-Encoding' => 'gzip', 'X-V' => '1' ],
);
$res = flight(map { [ $uri, $_ ] } @reqs);
is(scalar(grep { good($_, $uri) } @$res), 6, 'several names: 6 complete responses');
is(join(' ', map { ($_->{headers}{'x-hit'} // '') eq '1' ? 1 : 0 } @$res), '1 1 0 0 0 1',
   'several names: shared only when every named header matches')
    or diag(explain([ map { show($_) } @$res ]));
is(scalar(grep {
        my %hd = @{ $reqs[$_] };
        ($res->[$_]{headers}{'x-seen'} // '') eq
            sprintf('ae=[%s] v=[%s] w=[%s]', map { $_ // '' } @hd{qw(Accept-Encoding X-V X-W)})
    } 0 .. $#reqs), 6, 'several names: everyone got a response made for its own values')
    or diag(explain([ map { show($_) } @$res ]));
is($t->origin_uri_hits($uri), 4, 'several names: 4 origin requests');

# ------------------------------------------------------------ no Vary

$t->origin_reset;
$uri = '/novary?delay=500&size=2000';
$res = flight([ $uri, [ 'Accept-Encoding' => 'gzip' ] ], [ $uri ], [ $uri, [ 'X-V' => 'q' ] ]);
is(join(' ', map { $_->{headers}{'x-hit'} // '-' } @$res), '1 1 1',
   'no Vary: shared whatever the request headers');
is($t->origin_uri_hits($uri), 1, 'no Vary: one origin request');

# ------------------------------------------------------------ Vary: *

for my $vary ('*', 'Accept-Encoding,%20*') {
    $t->origin_reset;
    $uri = "/star?delay=500&size=2000&hdr=Vary:$vary";
    my $ns0 = $t->zone_stats->{not_shared};
    $res = flight([ $uri ], ([ $uri ]) x 4);
    is(scalar(grep { good($_, $uri) } @$res), 5, "Vary: $vary: 5 complete responses");
    is(join(' ', sort map { $_->{headers}{'x-hit'} // '-' } @$res), '1 2 3 4 5',
       "Vary: $vary: each client got a response of its own")
        or diag(explain([ map { show($_) } @$res ]));
    is(join(' ', map { $_->{headers}{'x-sf'} // '-' } @$res),
       'LEADER NOT_SHARED NOT_SHARED NOT_SHARED NOT_SHARED',
       "Vary: $vary: the followers went upstream alone (NOT_SHARED)");
    is($t->zone_stats->{not_shared} - $ns0, 4, "Vary: $vary: not_shared counts them");
    is($t->origin_uri_hits($uri), 5, "Vary: $vary: 5 origin requests");
}

# ------------------------------------------------------------ zone is clean

my (undef, $zone) = $t->wait_zone_idle;
is($zone->{in_flight}, 0, 'zone: nothing in flight');
is($zone->{pages_used}, $zone->{pages_baseline}, 'zone: memory back to baseline');

done_testing;
