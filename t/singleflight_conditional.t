#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_conditional: HEAD, conditional and Range requests.
#
# A HEAD request may follow a GET flight and gets its headers only, with
# the GET's Content-Length if the origin gave one (a chunked GET: none, as
# a HEAD of its own would have got); a GET never follows a HEAD flight.  A
# flight's fetch never sends its leader's conditional headers
# (If-None-Match, If-Modified-Since, If-Match, If-Unmodified-Since,
# If-Range) or Range upstream: the full 200 is stored, and every client,
# the leader included, keeps its own, answered by nginx's not_modified and
# range filters from the stored 200 (304, 412, or the full 200; 206 or 416
# only where the response says Accept-Ranges: bytes, else the full 200, as
# an origin that takes no ranges answers).
#
# The module's upstream is a second server of the same nginx ("echo"),
# which proxies to the origin and reports in X-Seen which conditional
# headers it was sent, so the tests can see what reached the origin.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfc '$pid $request_method $singleflight_status $status $request_uri';
    access_log %%TESTDIR%%/sf.log sfc;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    # echo: what the origin is sent, in X-Seen
    server {
        listen 127.0.0.1:%%PORT_1%%;

        location / {
            proxy_pass http://%%ORIGIN%%;
            add_header X-Seen "inm=[$http_if_none_match] ims=[$http_if_modified_since] im=[$http_if_match] ius=[$http_if_unmodified_since] ir=[$http_if_range] range=[$http_range]" always;
            add_header X-Taken $http_x_taken always;
        }
    }

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        # every range collapses, wherever it starts: the range filter's
        # answers from the stored 200 (t/singleflight_range.t: the default)
        singleflight_max_range_offset off;

        location / {
            singleflight sf;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        # straight to the origin, chunked (no Content-Length)
        location /direct/ {
            singleflight sf;
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        # a lone GET goes its own way here (the default)
        location /condd/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        location /off/ {
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        # /direct/ without the module
        location /direct-off/ {
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        # the location's own filters: a hidden validator, a filter that
        # changes the body (and so drops its length)
        location /hidden/ {
            singleflight sf;
            proxy_hide_header Last-Modified;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /hidden-off/ {
            proxy_hide_header Last-Modified;
            proxy_pass http://%%ORIGIN%%;
        }

        location /subf/ {
            singleflight sf;
            sub_filter hit= HIT=;
            sub_filter_types *;
            proxy_pass http://%%ORIGIN%%;
            add_header X-SF $singleflight_status always;
        }

        location /subf-off/ {
            sub_filter hit= HIT=;
            sub_filter_types *;
            proxy_pass http://%%ORIGIN%%;
        }

        # a conditional header's variable, taken before the module's
        # phase (by "set"), then sent by proxy_set_header
        location /taken/ {
            set $taken $http_if_none_match;
            singleflight sf;
            proxy_set_header X-Taken "$http_if_none_match $http_range";
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            add_header X-SF $singleflight_status always;
        }

        location /taken-off/ {
            set $taken $http_if_none_match;
            proxy_set_header X-Taken "$http_if_none_match $http_range";
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

my $NOTHING = 'inm=[] ims=[] im=[] ius=[] ir=[] range=[]';
my $LM = 'Mon, 01 Jan 2024 00:00:00 GMT';
my $OLD = 'Sat, 01 Jan 2000 00:00:00 GMT';
my $LM_Q = 'Mon,%2001%20Jan%202024%2000:00:00%20GMT';

# A HEAD request read as if it were a GET, so that body bytes after the
# header would show in {body} (see t/singleflight_methods.t).
sub raw_head {
    my ($uri, @hdr) = @_;
    my $extra = join '', map { "$_\r\n" } @hdr;
    return ('GET', $uri, raw => "HEAD $uri HTTP/1.1\r\nHost: localhost\r\n$extra"
        . "Connection: close\r\n\r\n");
}

sub show {
    my ($r) = @_;
    return { status => $r->{status}, error => $r->{error}, headers => $r->{headers},
        body => length($r->{body}) > 80 ? substr($r->{body}, 0, 80) . '...' : $r->{body} };
}

# ------------------------------------------------------------ the echo works

# without singleflight, conditional headers reach the origin (and the
# origin ignores them): X-Seen shows them
my $r = $t->get('/off/echo?hdr=ETag:%22v1%22',
    headers => [ 'If-None-Match' => '"v1"', Range => 'bytes=0-9' ]);
is($r->{status}, 200, 'echo: proxied conditional request gets 200');
like($r->{headers}{'x-seen'} // '', qr/inm=\["v1"\].*range=\[bytes=0-9\]/,
     'echo: X-Seen shows the conditional headers the origin was sent');

# ------------------------------------------------------------ HEAD follows GET

$t->origin_reset;
my $uri = '/head/g?delay=1000&size=5000';
my $res = $t->flight(
    leader    => [ 'GET', $uri ],
    followers => [ (map { [ raw_head($uri) ] } 1 .. 3), [ 'GET', $uri ], [ 'GET', $uri ] ],
);
my ($lead, @f) = @$res;
my @heads = @f[ 0 .. 2 ];
my @gets = @f[ 3, 4 ];

is($lead->{status}, 200, 'HEAD follows GET: the GET leader gets 200');
is($lead->{body}, SFTest::origin_body(1, $uri, 5000), 'HEAD follows GET: the leader\'s body');
is(scalar(grep { ($_->{status} // 0) == 200
                 && ($_->{headers}{'content-length'} // '') eq '5000'
                 && ($_->{headers}{'x-hit'} // '') eq '1'
                 && ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @heads), 3,
   'HEAD follows GET: 3 HEAD followers, 200 with the GET\'s Content-Length')
    or diag(explain([ map { show($_) } @heads ]));
is(scalar(grep { defined $_->{status} && $_->{body} eq '' } @heads), 3,
   'HEAD follows GET: no body bytes after the HEAD responses');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 5000)
                 && ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @gets), 2,
   'HEAD follows GET: the GET followers get the full body');
is($t->origin_uri_hits($uri), 1, 'HEAD follows GET: one origin request');
like($t->read_file($t->origin->log_file), qr/ GET \Q$uri\E\n/,
     'HEAD follows GET: the origin request is the GET');

# a chunked GET response: the origin gave no length, so the HEAD
# followers get none, as a HEAD without the module does

$t->origin_reset;
$uri = '/direct/g?delay=1000&size=70000&chunked=1';
(my $uri_off = $uri) =~ s{^/direct/}{/direct-off/};
my $plain = $t->finish_request($t->start_request(raw_head($uri_off)));
is(($plain->{status} // 0) . ' ' . ($plain->{headers}{'content-length'} // '-') . ' '
   . ($plain->{headers}{'transfer-encoding'} // '-') . ' [' . $plain->{body} . ']', '200 - - []',
   'HEAD without the module, chunked GET: 200, no Content-Length, no Transfer-Encoding, no body')
    or diag(explain(show($plain)));
$t->origin_reset;
$res = $t->flight(
    leader    => [ 'GET', $uri ],
    followers => [ map { [ raw_head($uri) ] } 1 .. 3 ],
);
($lead, @heads) = @$res;
ok($lead->{chunked} && $lead->{body} eq SFTest::origin_body(1, $uri, 70000),
   'HEAD follows chunked GET: the leader got it chunked');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && ($_->{headers}{'content-length'} // '-') eq ($plain->{headers}{'content-length'} // '-')
                 && ($_->{headers}{'transfer-encoding'} // '-')
                    eq ($plain->{headers}{'transfer-encoding'} // '-')
                 && $_->{body} eq ''
                 && ($_->{headers}{'x-sf'} // '') eq 'FOLLOWER' } @heads), 3,
   'HEAD follows chunked GET: framing headers as without the module, no body bytes')
    or diag(explain([ map { show($_) } @heads ]));
is($t->origin_uri_hits($uri), 1, 'HEAD follows chunked GET: one origin request');

# ------------------------------------------------------------ GET never follows HEAD

$t->origin_reset;
$uri = '/head/h?delay=1000&size=5000';
$res = $t->flight(
    leader    => [ 'HEAD', $uri ],
    followers => [ map { [ 'GET', $uri ] } 1 .. 4 ],
    waiters   => 3,            # one GET leads a GET flight, 3 follow it
);
($lead, @gets) = @$res;

is($lead->{status}, 200, 'GET during HEAD flight: the HEAD gets 200');
is($lead->{headers}{'content-length'}, 5000, 'GET during HEAD flight: HEAD Content-Length');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(2, $uri, 5000) } @gets), 4,
   'GET during HEAD flight: every GET gets the full body of one GET')
    or diag(explain([ map { show($_) } @gets ]));
is(join(' ', sort map { $_->{headers}{'x-sf'} // '-' } @gets),
   'FOLLOWER FOLLOWER FOLLOWER LEADER', 'GET during HEAD flight: the GETs made a flight of their own');
is($t->origin_uri_hits($uri), 2, 'GET during HEAD flight: two origin requests (HEAD, GET)');
is(join(' ', map { (split / /)[2] } grep { / \Q$uri\E$/ }
        split /\n/, $t->read_file($t->origin->log_file)),
   'HEAD GET', 'GET during HEAD flight: the origin got a HEAD and a GET');

# ------------------------------------------------------------ conditional leader

# The leader asks conditionally (everything would match) and with a
# Range; the followers ask whatever they like.  One origin request, sent
# none of the leader's conditions; the leader answered for itself (a 304)
# and each follower for itself from the stored 200.  The origin takes
# ranges (Accept-Ranges: bytes), so nginx answers the ranges.

$t->origin_reset;
$uri = "/cond/a?delay=1000&size=3000&hdr=ETag:%22v1%22&hdr=Last-Modified:$LM_Q"
    . '&hdr=Accept-Ranges:bytes';
my $body = SFTest::origin_body(1, $uri, 3000);

my @cases = (
    # name, request headers, expected status, expected body
    [ 'plain',                  [],                                            200, $body ],
    [ 'If-None-Match match',    [ 'If-None-Match' => '"v1"' ],                 304, '' ],
    [ 'If-None-Match list',     [ 'If-None-Match' => '"x", "v1"' ],            304, '' ],
    [ 'If-None-Match *',        [ 'If-None-Match' => '*' ],                    304, '' ],
    [ 'If-None-Match other',    [ 'If-None-Match' => '"v2"' ],                 200, $body ],
    [ 'If-Modified-Since same', [ 'If-Modified-Since' => $LM ],                304, '' ],
    [ 'If-Modified-Since old',  [ 'If-Modified-Since' => $OLD ],               200, $body ],
    [ 'If-Match other',         [ 'If-Match' => '"v2"' ],                      412, undef ],
    [ 'If-Match match',         [ 'If-Match' => '"v1"' ],                      200, $body ],
    [ 'If-Unmodified-Since old',[ 'If-Unmodified-Since' => $OLD ],             412, undef ],
    [ 'Range 0-9',              [ Range => 'bytes=0-9' ],                      206, substr($body, 0, 10) ],
    [ 'Range suffix',           [ Range => 'bytes=-5' ],                       206, substr($body, -5) ],
    [ 'Range open',             [ Range => 'bytes=2990-' ],                    206, substr($body, 2990) ],
    [ 'Range unsatisfiable',    [ Range => 'bytes=5000-6000' ],                416, undef ],
    [ 'If-Range match',         [ Range => 'bytes=0-9', 'If-Range' => '"v1"' ], 206, substr($body, 0, 10) ],
    [ 'If-Range other',         [ Range => 'bytes=0-9', 'If-Range' => '"v0"' ], 200, $body ],
    [ 'If-Range date',          [ Range => 'bytes=10-19', 'If-Range' => $LM ],  206, substr($body, 10, 10) ],
);

$res = $t->flight(
    leader    => [ 'GET', $uri, headers => [ 'If-None-Match' => '"v1"', 'If-Modified-Since' => $LM,
                                             Range => 'bytes=0-9', 'If-Range' => '"v1"',
                                             'If-Match' => '"v1"',
                                             'If-Unmodified-Since' => $LM ] ],
    followers => [ (map { [ 'GET', $uri, headers => $_->[1] ] } @cases),
                   [ 'GET', $uri, headers => [ Range => 'bytes=0-1,5-6' ] ],
                   [ raw_head($uri, 'If-None-Match: "v1"') ],
                   [ raw_head($uri, 'Range: bytes=0-9') ] ],
);
($lead, @f) = @$res;
my ($multi, $head304, $head_range) = splice(@f, -3);

is($lead->{status}, 304, 'conditional leader: its own If-None-Match answered, 304');
ok($lead->{complete} && $lead->{body} eq '', 'conditional leader: no body');
is($lead->{headers}{etag}, '"v1"', 'conditional leader: the ETag on its 304');
is($lead->{headers}{'x-seen'}, $NOTHING,
   'conditional leader: the origin was sent no conditional or Range header');
is($lead->{headers}{'x-sf'}, 'LEADER', 'conditional leader: led the flight');

for my $i (0 .. $#cases) {
    my ($name, undef, $status, $want) = @{ $cases[$i] };
    my $r = $f[$i];
    subtest "conditional leader, follower $name: $status" => sub {
        is($r->{status}, $status, 'status');
        # a 416 is refused by the range filter after add_header ran, and
        # nginx sends the error page without dropping that header: plain
        # nginx repeats an "always" header on a 416 the same way
        my @sf = split /, /, $r->{headers}{'x-sf'} // '';
        ok(@sf && !grep({ $_ ne 'FOLLOWER' } @sf), 'a follower')
            or diag("X-SF: " . join(', ', @sf));
        is($r->{body}, $want, 'body') if defined $want;
        ok($r->{complete}, 'complete');
        is($r->{headers}{'x-hit'}, 1, 'from the one origin response') if $status != 412 && $status != 416;
        is($r->{headers}{'content-length'}, length $want, 'Content-Length')
            if defined $want && $status != 304;
        is($r->{headers}{etag}, '"v1"', 'ETag') if $status == 200 || $status == 304;
    } or diag(explain(show($r)));
}

my $r206 = $f[10];
is($r206->{headers}{'content-range'}, 'bytes 0-9/3000', 'Range follower: Content-Range');
is($f[13]{headers}{'content-range'}, 'bytes */3000', 'unsatisfiable Range follower: Content-Range');

# several ranges: nginx's range filter cuts one only from a response that
# arrives in pieces (as from its cache while it fills), so the whole 200,
# as this origin answers several ranges itself (t/singleflight_range_probe.t)
is($multi->{status}, 200, 'several ranges follower: 200');
is($multi->{body}, $body, 'several ranges follower: the whole body');
is(scalar(() = ($multi->{raw_headers} // '') =~ /^Accept-Ranges:/mig), 1,
   'several ranges follower: one Accept-Ranges');

is($head304->{status}, 304, 'conditional HEAD follower: 304');
is($head304->{body}, '', 'conditional HEAD follower: no body bytes');
is($head_range->{status}, 206, 'Range HEAD follower: 206');
is($head_range->{headers}{'content-length'}, 10, 'Range HEAD follower: Content-Length 10');
is($head_range->{body}, '', 'Range HEAD follower: no body bytes');

is($t->origin_uri_hits($uri), 1, 'conditional leader: one origin request for the whole burst');

# The same requests each alone: nobody waits, the response goes to its
# leader unstored (singleflight_lazy), and its own filters answer its
# conditions and its Range as a reader's do.

# where each case's body is in the whole one
my %part = ('Range 0-9' => [ 0, 10 ], 'Range suffix' => [ -5 ], 'Range open' => [ 2990 ],
            'If-Range match' => [ 0, 10 ], 'If-Range date' => [ 10, 10 ]);

for my $c (@cases) {
    my ($name, $headers, $status, $want) = @$c;
    my $r = $t->get($uri, headers => $headers, timeout => 5);
    subtest "alone, $name: $status" => sub {
        is($r->{status}, $status, 'status');
        like($r->{headers}{'x-sf'} // '', qr/^LEADER\b/, 'its own flight');
        ok($r->{complete}, 'complete');
        # each is an origin request of its own, with its own hit stamp
        my $whole = SFTest::origin_body($r->{headers}{'x-hit'} // 0, $uri, 3000);
        my $exp = !defined $want ? undef
                : $want eq '' ? ''
                : $part{$name} ? substr($whole, $part{$name}[0], $part{$name}[1] // 3000)
                : $whole;
        is($r->{body}, $exp, 'body') if defined $exp;
    } or diag(explain(show($r)));
}
my $stats = $t->stats('/stats');
ok(($stats->{zones}{sf}{unstored} // 0) >= @cases, 'alone: the responses went unstored');

# ------------------------------------------------------------ no Accept-Ranges

# The origin sends no Accept-Ranges: without the module a Range request
# would have reached it and got its full 200, and so does every Range
# reader of a flight, the leader included; conditions are still answered.

$t->origin_reset;
$uri = "/cond/n?delay=1000&size=2000&hdr=ETag:%22v1%22";
$body = SFTest::origin_body(1, $uri, 2000);
my $off = $t->get("/off$uri", headers => [ Range => 'bytes=0-9' ]);
is(($off->{status} // 0) . ' ' . length($off->{body}), '200 2000',
   'no Accept-Ranges, without the module: a Range request gets the full 200');
$t->origin_reset;
$res = $t->flight(
    leader    => [ 'GET', $uri, headers => [ Range => 'bytes=0-9' ] ],
    followers => [ [ 'GET', $uri, headers => [ Range => 'bytes=0-9' ] ],
                   [ 'GET', $uri, headers => [ Range => 'bytes=0-1,5-6' ] ],
                   [ 'GET', $uri, headers => [ Range => 'bytes=0-9', 'If-Range' => '"v1"' ] ],
                   [ 'GET', $uri, headers => [ 'If-None-Match' => '"v1"' ] ] ],
);
my $n304 = pop @$res;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body
                 && !defined $_->{headers}{'content-range'} } @$res), 4,
   'no Accept-Ranges: the Range leader and Range followers get the full 200')
    or diag(explain([ map { show($_) } @$res ]));
is(join(' ', map { $_->{headers}{'x-sf'} // '-' } @$res), 'LEADER FOLLOWER FOLLOWER FOLLOWER',
   'no Accept-Ranges: one flight');
is($n304->{status}, 304, 'no Accept-Ranges: an If-None-Match follower still gets 304');
is($t->origin_uri_hits($uri), 1, 'no Accept-Ranges: one origin request');

# ------------------------------------------------------------ plain leader

# A plain leader; the followers' conditions never reach the origin either
# (they are answered from the stored 200), and a Range leader's followers
# are not cut to its range.

$t->origin_reset;
$uri = "/cond/b?delay=1000&size=2000&hdr=ETag:%22v1%22&hdr=Last-Modified:$LM_Q"
    . '&hdr=Accept-Ranges:bytes';
$body = SFTest::origin_body(1, $uri, 2000);
$res = $t->flight(
    leader    => [ 'GET', $uri ],
    followers => [ [ 'GET', $uri, headers => [ 'If-None-Match' => '"v1"' ] ],
                   [ 'GET', $uri, headers => [ Range => 'bytes=0-9' ] ],
                   [ 'GET', $uri ] ],
);
is($res->[0]{status}, 200, 'plain leader: 200');
is($res->[0]{body}, $body, 'plain leader: full body');
is($res->[1]{status}, 304, 'plain leader: If-None-Match follower gets 304');
is($res->[2]{status}, 206, 'plain leader: Range follower gets 206');
is($res->[2]{body}, substr($body, 0, 10), 'plain leader: Range follower gets 10 bytes');
is($res->[3]{body}, $body, 'plain leader: plain follower gets the full body');
is(scalar(grep { ($_->{headers}{'x-seen'} // '') eq $NOTHING } @$res), 4,
   'plain leader: the origin was sent no conditional header');
is($t->origin_uri_hits($uri), 1, 'plain leader: one origin request');

$t->origin_reset;
$uri = "/cond/c?delay=1000&size=2000&hdr=ETag:%22v1%22&hdr=Accept-Ranges:bytes";
$body = SFTest::origin_body(1, $uri, 2000);
$res = $t->flight(
    leader    => [ 'GET', $uri, headers => [ Range => 'bytes=0-9' ] ],
    followers => [ map { [ 'GET', $uri ] } 1 .. 3 ],
);
($lead, @f) = @$res;
is(($lead->{status} // 0) . ' ' . ($lead->{headers}{'content-range'} // '-') . ' ' . $lead->{body},
   '206 bytes 0-9/2000 ' . substr($body, 0, 10), 'Range leader: its own 206');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{body} eq $body } @f), 3,
   'Range leader: every plain follower gets the full 200')
    or diag(explain([ map { show($_) } @f ]));
is($lead->{headers}{'x-seen'}, $NOTHING, 'Range leader: the origin was sent no Range');
is($t->origin_uri_hits($uri), 1, 'Range leader: one origin request');

# ------------------------------------------------------------ no length

# The origin's 200 is chunked (no Content-Length) and says Accept-Ranges:
# bytes.  nginx's range filter needs the length, so no flight can answer
# a Range as the origin does (206): a Range follower, and a Range leader
# alone, go upstream on their own (NOT_SHARED; the not_shared counter
# counts followers), each with its Range.  The lone leader's fetch is then
# nobody's and stops (its body comes a second after its header).

$t->origin_reset;
$uri = '/direct/nl?echo=1&ranges=1&chunked=1&size=3000&delay=500';
my $before = $t->zone_stats;
$res = $t->flight(
    leader    => [ 'GET', $uri ],
    followers => [ [ 'GET', $uri ], [ 'GET', $uri, headers => [ Range => 'bytes=10-19' ] ] ],
);
is(join(' ', map { ($_->{status} // 0) . ' ' . ($_->{headers}{'x-sf'} // '-') } @$res),
   '200 LEADER 200 FOLLOWER 206 NOT_SHARED',
   'no length: the Range follower goes upstream on its own, 206')
    or diag(explain([ map { show($_) } @$res ]));
ok(!defined $res->[0]{headers}{'content-length'} && !defined $res->[1]{headers}{'content-length'},
   'no length: the shared 200 has none');
is($res->[2]{headers}{'content-range'}, 'bytes 10-19/3000', 'no length: the origin\'s Content-Range');
is($t->origin_uri_hits($uri), 2, 'no length: two origin requests, the flight\'s and the Range\'s');

$t->origin_reset;
$uri = '/direct/nl1?echo=1&ranges=1&chunked=1&size=3000&delay=300&body_delay=1000';
my $lone = $t->get($uri, headers => [ Range => 'bytes=-5' ]);
is(($lone->{status} // 0) . ' ' . ($lone->{headers}{'x-sf'} // '-') . ' '
   . ($lone->{headers}{'content-range'} // '-'), '206 NOT_SHARED bytes 2995-2999/3000',
   'no length, a Range leader alone: upstream on its own, 206');
my ($idle, $after) = $t->wait_zone_idle;
ok($idle, 'no length: the zone is idle again');
is(($after->{not_shared} // 0) - ($before->{not_shared} // 0), 1,
   'no length: the follower counted as not shared');
is(($after->{abandoned} // 0) - ($before->{abandoned} // 0), 1,
   'no length: the lone leader\'s fetch, nobody\'s, stopped');

# ------------------------------------------------------------ the location's filters

# nginx answers a collapsed request's conditionals and ranges from the
# response as the location's own filters leave it (docs/design.md, "What
# is shared").  Two places where that differs from the origin answering them,
# pinned here as the docs state them, each against the same location
# without the module:
# - proxy_hide_header Last-Modified: the origin, which still has its
#   Last-Modified, answers If-Modified-Since with a 304; nginx has no
#   validator left to compare and sends the full 200, without it;
# - sub_filter: the origin answers a Range with a 206 and sub_filter
#   rewrites the part; the module never sends the Range, and nginx cannot
#   cut a response whose length sub_filter dropped: the full 200,
#   rewritten.

$uri = "/c?fixed=1&size=2000&ranges=1&hdr=Last-Modified:$LM_Q";
my $hidden_off = $t->get("/hidden-off$uri", headers => [ 'If-Modified-Since' => $LM ]);
is($hidden_off->{status}, 304, 'hidden Last-Modified, without the module: the origin answers 304');
my $hidden = $t->get("/hidden$uri", headers => [ 'If-Modified-Since' => $LM ]);
is(($hidden->{status} // 0) . ' ' . ($hidden->{headers}{'x-sf'} // '-'), '200 LEADER',
   'hidden Last-Modified: nginx has no validator to compare, the full 200');
is($hidden->{body}, SFTest::origin_body(0, "/hidden$uri", 2000),
   'hidden Last-Modified: the whole body');
ok(!defined $hidden->{headers}{'last-modified'}, 'hidden Last-Modified: still hidden');

my $whole = SFTest::origin_body(0, "/subf$uri", 2000) =~ s/hit=/HIT=/gr;
isnt($whole, SFTest::origin_body(0, "/subf$uri", 2000), 'sub_filter: the body has something to rewrite');
my $subf_off = $t->get("/subf-off$uri", headers => [ Range => 'bytes=0-9' ]);
is(($subf_off->{status} // 0) . ' ' . ($subf_off->{headers}{'content-range'} // '-'), '206 bytes 0-9/2000',
   'sub_filter, without the module: the origin answers the Range, 206');
my $subf = $t->get("/subf$uri", headers => [ Range => 'bytes=0-9' ]);
is(($subf->{status} // 0) . ' ' . ($subf->{headers}{'x-sf'} // '-') . ' '
   . ($subf->{headers}{'content-range'} // '-'), '200 LEADER -',
   'sub_filter: a Range gets the full 200');
is($subf->{body}, $whole, 'sub_filter: the whole body, rewritten');

# ------------------------------------------------------------ variables

# A variable of a conditional header taken before the fetch (a "set", a
# map in the key) is taken again in the fetch, where the header is not:
# what the fetch sends with it agrees with the headers it sends.  Plain
# nginx sends the client's value with the client's header.

my $taken_off = $t->get('/taken-off/echo?v=1',
    headers => [ 'If-None-Match' => '"zzz"', Range => 'bytes=0-9' ]);
is($taken_off->{headers}{'x-taken'} // '-', '"zzz" bytes=0-9',
   'taken variable, without the module: the client\'s values go upstream');
my $taken = $t->get('/taken/echo?v=1',
    headers => [ 'If-None-Match' => '"zzz"', Range => 'bytes=0-9' ]);
is(($taken->{status} // 0) . ' ' . ($taken->{headers}{'x-sf'} // '-') . ' '
   . ($taken->{headers}{'x-seen'} // '-'), "200 LEADER $NOTHING",
   'taken variable: the fetch sends no conditional header');
is($taken->{headers}{'x-taken'} // '-', '-',
   'taken variable: nor, taken again in the fetch, their values');

# ------------------------------------------------------------ own way

# Where a lone GET goes upstream on its own way, so does a lone GET with
# If-Match or If-Unmodified-Since: in a herd of them the first goes its
# own way with its conditional (DIRECT) and gets what nginx without the
# module gives (the origin's answer: the origin ignores these headers,
# and nginx answers no conditional of an uncached upstream response:
# 200).  It cannot feed the others: the second leads a flight through a
# fetch of the whole response, which the other three follow, answered
# from its validators (412).  Two origin requests for five.

for my $case ([ 'If-Match other', 'If-Match' => '"v2"' ],
              [ 'If-Unmodified-Since old', 'If-Unmodified-Since' => $OLD ]) {
    my ($name, @h) = @$case;
    my $q = "x-" . lc($h[0]) . "?delay=500&size=300&hdr=ETag:%22v1%22"
          . "&hdr=Last-Modified:$LM_Q";
    my $off = $t->get("/off/$q", headers => \@h);
    is($off->{status}, 200, "own way, $name, without the module: 200");
    $t->origin_reset;
    my $u = "/condd/$q";
    my $res = $t->herd(n => 5, path => $u, headers => \@h);
    is($t->origin_uri_hits($u), 2, "own way, $name: 2 origin requests");
    is(join(',', sort map { ($_->{headers}{'x-sf'} // '') . ':' . ($_->{status} // 0) } @$res),
       'DIRECT:200,FOLLOWER:412,FOLLOWER:412,FOLLOWER:412,LEADER:412',
       "own way, $name: the first DIRECT as without the module, then a LEADER and 3 FOLLOWERs");
}

done_testing;
