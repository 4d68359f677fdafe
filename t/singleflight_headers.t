#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_headers: the response header a follower gets.
#
# Followers get the origin's headers as the leader's content handler
# produced them, through their own header filters: hop-by-hop headers as
# nginx's upstream passes them on (Connection, Keep-Alive and
# Transfer-Encoding never; TE, Trailer and Proxy-Connection as they came;
# an Upgrade on a 200 to HTTP/1.x clients); Date is the follower's own, made
# when its response is sent, unless the origin's is passed on
# (proxy_pass_header Date), as it would be without the module; add_header (with its $singleflight_status),
# charset and expires apply per follower; proxy_hide_header hides from
# followers too; repeated headers, Location, Content-Type, and a large
# header set (60 headers, one of 6000 bytes) reach every follower intact.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);
use Time::Local qw(timegm);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m;

    # a one-byte recoding table that is not its own inverse
    charset_map x-sf-src x-sf-dst {
        E0 E1;
        E1 E2;
        E2 E3;
    }

    server {
        listen 127.0.0.1:%%PORT%% reuseport;

        large_client_header_buffers 4 32k;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            proxy_hide_header X-Secret;
            add_header X-A $singleflight_status always;
            add_header X-B added;
        }

        location /plain/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /date/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            proxy_pass_header Date;
            add_header X-A $singleflight_status always;
        }

        location /ps/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            proxy_pass_header Server;
        }

        location /big/ {
            singleflight sf;
            proxy_buffer_size 16k;
            proxy_buffers 8 16k;
            proxy_busy_buffers_size 32k;
            proxy_pass http://%%ORIGIN%%;
            add_header X-A $singleflight_status always;
        }

        location /cs/ {
            singleflight sf;
            charset utf-8;
            proxy_pass http://%%ORIGIN%%;
            add_header X-A $singleflight_status always;
        }

        location /recode/ {
            singleflight sf;
            source_charset x-sf-src;
            charset x-sf-dst;
            proxy_pass http://%%ORIGIN%%;
            add_header X-A $singleflight_status always;
        }

        location /exp/ {
            singleflight sf;
            expires 1h;
            proxy_pass http://%%ORIGIN%%;
            add_header X-A $singleflight_status always;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# $t->flight() of a GET leader and $n GET followers for $uri (started $gap
# seconds after the leader, option gap); returns every result, the
# leader's first.
sub flight {
    my ($uri, $n, %opt) = @_;
    return $t->flight(leader => [ 'GET', $uri ], followers => [ map { [ 'GET', $uri ] } 1 .. $n ],
        gap => $opt{gap});
}

# the values of a header, in order, from a response's header list
sub values_of {
    my ($r, $name) = @_;
    return map { $_->[1] } grep { lc $_->[0] eq lc $name } @{ $r->{header_list} };
}

my %MON = (Jan => 0, Feb => 1, Mar => 2, Apr => 3, May => 4, Jun => 5, Jul => 6, Aug => 7,
    Sep => 8, Oct => 9, Nov => 10, Dec => 11);

# an IMF-fixdate as seconds, undef if it is not one
sub http_time {
    my ($s) = @_;
    my ($d, $m, $y, $H, $M, $S) = ($s // '') =~
        /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d) (\w{3}) (\d{4}) (\d\d):(\d\d):(\d\d) GMT$/
        or return undef;
    return undef unless exists $MON{$m};
    return timegm($S, $M, $H, $d, $MON{$m}, $y);
}

sub followers { grep { ($_->{headers}{'x-a'} // '') eq 'FOLLOWER' } @{ $_[0] } }

sub show {
    my ($r) = @_;
    return { status => $r->{status}, error => $r->{error}, raw_headers => $r->{raw_headers} };
}

# ------------------------------------------------------------ hop-by-hop

my @hop = ('Keep-Alive:timeout=77', 'TE:trailers', 'Trailer:X-Tr', 'Upgrade:hop-proto',
    'Proxy-Connection:hop-pc', 'Connection:X-Hop-Token');
my $uri = '/hop?delay=500&' . join('&', map { "hdr=$_" } @hop, 'X-Kept:kept');

# the origin does send them
my $direct = $t->get($uri, port => $t->origin_port);
is(scalar(grep { my ($n) = split /:/; defined $direct->{headers}{ lc $n } } @hop), scalar @hop,
   'hop-by-hop: the origin sends them all');
$t->origin_reset;

my $res = flight($uri, 5);
my @f = followers($res);
is(scalar(@f), 5, 'hop-by-hop: 5 followers');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri) } @f), 5, 'hop-by-hop: followers got the body');
# what nginx passes on without the module: TE, Trailer, Proxy-Connection,
# not Keep-Alive
my $plain = $t->get("/plain$uri");
for my $name (qw(Keep-Alive TE Trailer Proxy-Connection)) {
    my $want = $plain->{headers}{ lc $name } // 'none';
    is(scalar(grep { ($_->{headers}{ lc $name } // 'none') eq $want } @f), 5,
       "hop-by-hop: $name on followers as without the module ($want)")
        or diag(explain([ map { show($_) } @f ]));
}
is(scalar(grep { join(',', values_of($_, 'Connection')) eq 'close' } @f), 5,
   'hop-by-hop: followers\' Connection is nginx\'s own "close" only');
is(scalar(grep { ($_->{raw_headers} // '') !~ /timeout=77|X-Hop-Token/ } @f), 5,
   'hop-by-hop: no trace of those nginx drops');

# Upgrade on a 200: nginx passes it to HTTP/1.x clients (1.22 as any
# header, 1.29 and later on purpose); followers get it as their leader
is(scalar(grep { ($_->{headers}{upgrade} // '') eq 'hop-proto' } @f), 5,
   'Upgrade on a 200: followers get it as nginx gives it')
    or diag(explain([ map { show($_) } @f ]));
is(scalar(grep { ($_->{headers}{'x-kept'} // '') eq 'kept' } @f), 5, 'hop-by-hop: end-to-end header kept');
is($t->origin_uri_hits($uri), 1, 'hop-by-hop: one origin request');

# ------------------------------------------------------------ Date

# The followers join at once, the origin answers 2.2 s later: a follower's
# Date is the time its response was sent, not when it arrived, nor the
# leader's.

$t->origin_reset;
$uri = '/d?delay=2200';
my $t0 = time;
$res = flight($uri, 3);
my $t1 = time;
my ($lead, @fol) = @$res;
is(scalar(grep { scalar(values_of($_, 'Date')) == 1 } @$res), 4, 'Date: exactly one Date header each');
is(scalar(grep { defined http_time($_->{headers}{date}) } @$res), 4, 'Date: valid dates');
is(scalar(grep { (http_time($_->{headers}{date}) // 0) >= int($t0 + 2.1) } @fol), 3,
   'Date: the followers\' Date is from when their response was sent')
    or diag(sprintf("started %.2f, leader's Date %s, followers': %s", $t0, $lead->{headers}{date},
        join(', ', map { $_->{headers}{date} // '-' } @fol)));
is(scalar(grep { (http_time($_->{headers}{date}) // 0 ) >= (http_time($lead->{headers}{date}) // 9e9)
                 && (http_time($_->{headers}{date}) // 9e9) <= $t1 + 1 } @fol), 3,
   'Date: not before the leader\'s, not in the future');

# a follower arriving 1.2 s into the flight

$t->origin_reset;
$uri = '/d2?delay=1500';
$t0 = time;
$res = flight($uri, 1, gap => 1.2);
$t1 = time;
($lead, @fol) = @$res;
is($fol[0]{headers}{'x-a'}, 'FOLLOWER', 'Date, late follower: a follower');
my ($ld, $fd) = map { http_time($_->{headers}{date}) } $lead, $fol[0];
ok(defined $fd && defined $ld && $fd >= $ld && $fd >= int($t0 + 1.4) && $fd <= $t1 + 1,
   'Date, late follower: its own Date, at its response time')
    or diag("leader $lead->{headers}{date}, follower " . ($fol[0]{headers}{date} // '-'));

# proxy_pass_header Date: the origin's Date is passed on, to the followers
# too.  Without the module each follower's own request would have reached
# the origin with the leader's, 2.2 s before the response, and each would
# have got the origin's Date of then: the followers get that Date, byte for
# byte the leader's, not one nginx made when their response was sent.

$t->origin_reset;
$uri = '/date/x?delay=2200';
$t0 = time;
$res = flight($uri, 3);
$t1 = time;
($lead, @fol) = @$res;
my $origin_date = http_time($lead->{headers}{date});
ok(defined $origin_date && $origin_date >= int($t0) && $origin_date <= $t0 + 1,
   'proxy_pass_header Date: the leader has the origin\'s Date, from when it got the request')
    or diag(sprintf("started %.2f, leader's Date %s", $t0, $lead->{headers}{date} // '-'));
ok($t1 - $t0 >= 2.2, 'proxy_pass_header Date: the responses came 2.2 s after the request');
is(scalar(grep { scalar(values_of($_, 'Date')) == 1 } @fol), 3,
   'proxy_pass_header Date: exactly one Date header on followers')
    or diag(explain([ map { show($_) } @fol ]));
is(scalar(grep { ($_->{headers}{date} // '') eq ($lead->{headers}{date} // '-')
                 && (http_time($_->{headers}{date}) // 9e9) < int($t0 + 2.2) } @fol), 3,
   'proxy_pass_header Date: the followers have the origin\'s Date, not one from when they were sent')
    or diag("leader $lead->{headers}{date}, followers "
        . join(', ', map { $_->{headers}{date} // '-' } @fol));

# The same with a Date the origin could not have made now: only the
# origin's own value passed on can give it.

$t->origin_reset;
my $fixed = 'Tue, 01 Jan 2030 00:00:00 GMT';
$uri = '/date/fixed?delay=500&hdr=Date:' . ($fixed =~ s/([ ,:])/sprintf('%%%02X', ord $1)/ger);
$res = flight($uri, 3);
is(join('|', map { join(',', values_of($_, 'Date')) } @$res), join('|', ($fixed) x 4),
   'proxy_pass_header Date: the origin\'s Date, once, on the leader and every follower');
is(join(' ', map { $_->{headers}{'x-a'} // '-' } @$res), 'LEADER FOLLOWER FOLLOWER FOLLOWER',
   'proxy_pass_header Date: one leader, three followers');

# ------------------------------------------------------------ add_header

$t->origin_reset;
$uri = '/add?delay=500';
$res = flight($uri, 4);
is(join(' ', map { $_->{headers}{'x-a'} // '-' } @$res), 'LEADER FOLLOWER FOLLOWER FOLLOWER FOLLOWER',
   'add_header: $singleflight_status on every response');
is(scalar(grep { ($_->{headers}{'x-b'} // '') eq 'added' } @$res), 5, 'add_header: on every 200');
is(scalar(grep { scalar(values_of($_, 'X-A')) == 1 && scalar(values_of($_, 'X-B')) == 1 } @$res), 5,
   'add_header: once each');

# an origin 404 is shared; "always" headers only

$t->origin_reset;
$uri = '/nf?delay=500&status=404';
$res = flight($uri, 4);
is(scalar(grep { ($_->{status} // 0) == 404 && $_->{body} eq SFTest::origin_body(1, $uri) } @$res), 5,
   'add_header on 404: the origin\'s 404 shared');
is(join(' ', map { $_->{headers}{'x-a'} // '-' } @$res), 'LEADER FOLLOWER FOLLOWER FOLLOWER FOLLOWER',
   'add_header on 404: "always" header on every response');
is(scalar(grep { !defined $_->{headers}{'x-b'} } @$res), 5, 'add_header on 404: no plain add_header');

# ------------------------------------------------------------ proxy_hide_header

$t->origin_reset;
$uri = '/hide?delay=500&hdr=X-Secret:s3cr3t&hdr=X-Public:pub';
$res = flight($uri, 4);
is(scalar(followers($res)), 4, 'proxy_hide_header: 4 followers');
is(scalar(grep { !defined $_->{headers}{'x-secret'} && ($_->{raw_headers} // '') !~ /s3cr3t/ } @$res), 5,
   'proxy_hide_header: hidden from the leader and the followers');
is(scalar(grep { ($_->{headers}{'x-public'} // '') eq 'pub' } @$res), 5, 'proxy_hide_header: others pass');

# ------------------------------------------------------------ repeated and special headers

$t->origin_reset;
$uri = '/multi?delay=500&hdr=X-Multi:one&hdr=Link:%3C/a%3E;%20rel=preload&hdr=X-Multi:two'
    . '&hdr=Link:%3C/b%3E;%20rel=preload&hdr=Content-Type:application/json;%20charset=koi8-r'
    . '&hdr=ETag:%22e1%22&hdr=Last-Modified:Mon,%2001%20Jan%202024%2000:00:00%20GMT'
    . '&hdr=Cache-Control:public&hdr=Cache-Control:max-age=30&hdr=Expires:Thu,%2001%20Jan%202099%2000:00:00%20GMT'
    . '&hdr=WWW-Authenticate:Basic%20realm=%22x%22&hdr=Accept-Ranges:bytes&hdr=X-Empty:';
$res = flight($uri, 4);
my @want = (
    [ 'X-Multi', 'one, two' ],
    [ 'Link', '</a>; rel=preload, </b>; rel=preload' ],
    [ 'Content-Type', 'application/json; charset=koi8-r' ],
    [ 'ETag', '"e1"' ],
    [ 'Last-Modified', 'Mon, 01 Jan 2024 00:00:00 GMT' ],
    [ 'Cache-Control', 'public, max-age=30' ],
    [ 'Expires', 'Thu, 01 Jan 2099 00:00:00 GMT' ],
    [ 'WWW-Authenticate', 'Basic realm="x"' ],
    [ 'Accept-Ranges', 'bytes' ],
);
for my $w (@want) {
    my ($name, $value) = @$w;
    is(scalar(grep { join(', ', values_of($_, $name)) eq $value } @$res), 5,
       "headers: $name: $value, on the leader and every follower")
        or diag(explain([ map { show($_) } @$res ]));
}
is(scalar(grep { scalar(values_of($_, 'X-Empty')) == scalar(values_of($res->[0], 'X-Empty')) } @$res), 5,
   'headers: an empty header passes as it does for the leader');
is(join(' ', map { $_->{headers}{'x-a'} // '-' } @$res), 'LEADER FOLLOWER FOLLOWER FOLLOWER FOLLOWER',
   'headers: one flight');

# a redirect's Location, made absolute the same way for everyone

$t->origin_reset;
$uri = '/redir?delay=500&status=302&hdr=Location:/elsewhere';
$res = flight($uri, 3);
is(scalar(grep { ($_->{status} // 0) == 302 } @$res), 4, 'Location: 302 for all');
is(scalar(grep { ($_->{headers}{location} // '') eq ($res->[0]{headers}{location} // '-')
                 && ($_->{headers}{location} // '') =~ m{/elsewhere$} } @$res), 4,
   'Location: the followers\' Location is the leader\'s')
    or diag(explain([ map { show($_) } @$res ]));

# ------------------------------------------------------------ charset, expires

$t->origin_reset;
$uri = '/cs/a?delay=500';
$res = flight($uri, 3);
is(scalar(grep { join('|', values_of($_, 'Content-Type')) eq 'text/plain; charset=utf-8' } @$res), 4,
   'charset: one "text/plain; charset=utf-8" on the leader and every follower')
    or diag(explain([ map { show($_) } @$res ]));

# recoding: the charset filter recodes one-byte charsets in place; each
# follower must recode a copy of its own, never the shared one (a second
# recoding would turn E0 into E2)

$t->origin_reset;
my $raw_uri = "/recode/\xe0\xe0?delay=500";
my $raw = "GET $raw_uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
my $before = $t->origin_hits->{total};
my $lh = $t->start_request('GET', '/', raw => $raw);
$t->wait_for(sub { $t->origin_hits->{total} > $before }, what => 'origin to get the recode request');
my @fh = map { $t->start_request('GET', '/', raw => $raw) } 1 .. 5;
$t->wait_for(sub { ($t->zone_stats->{waiters} // 0) >= 5 }, what => '5 followers waiting');
$res = [ map { $t->finish_request($_) } $lh, @fh ];
(my $recoded = SFTest::origin_body(1, $raw_uri)) =~ tr/\xe0/\xe1/;
is(join(' ', map { $_->{headers}{'x-a'} // '-' } @$res), 'LEADER FOLLOWER FOLLOWER FOLLOWER FOLLOWER FOLLOWER',
   'recoding: one flight');
is(scalar(grep { $_->{body} eq $recoded } @$res), 6, 'recoding: everyone got the body recoded once')
    or diag(explain([ map { unpack('H*', $_->{body}) } @$res ]));
is(scalar(grep { ($_->{headers}{'content-type'} // '') eq 'text/plain; charset=x-sf-dst' } @$res), 6,
   'recoding: Content-Type names the charset once');

$t->origin_reset;
$uri = '/exp/a?delay=500&hdr=Cache-Control:max-age=5';
$t0 = time;
$res = flight($uri, 3);
is(scalar(grep { join('|', values_of($_, 'Cache-Control')) eq 'max-age=3600' } @$res), 4,
   'expires: one "Cache-Control: max-age=3600" on the leader and every follower')
    or diag(explain([ map { show($_) } @$res ]));
is(scalar(grep { my @e = values_of($_, 'Expires');
                 @e == 1 && abs((http_time($e[0]) // 0) - ($t0 + 3600)) < 10 } @$res), 4,
   'expires: one Expires, an hour ahead, on every response');

# ------------------------------------------------------------ a large header set

# 60 headers and one of 6000 bytes (proxy_buffer_size 16k): every follower
# gets every one, in order, byte for byte

$t->origin_reset;
my @big = map { [ sprintf('X-H-%02d', $_), sprintf('value-%02d-', $_) . ('abcdefghij' x 4) ] } 1 .. 60;
my $long = join '', map { chr(ord('a') + $_ % 26) } 0 .. 5999;
$uri = '/big/a?delay=600&size=100&' . join('&', map { "hdr=$_->[0]:$_->[1]" } @big) . "&hdr=X-Long:$long";
$res = flight($uri, 5);
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body(1, $uri, 100) } @$res), 6,
   'large header set: 6 complete 200 responses')
    or diag(explain([ map { { status => $_->{status}, error => $_->{error} } } @$res ]));
my $want = join("\n", map { "$_->[0]: $_->[1]" } @big);
is(scalar(grep { join("\n", map { "$_->[0]: $_->[1]" } grep { $_->[0] =~ /^X-H-/ } @{ $_->{header_list} })
                 eq $want } @$res), 6, 'large header set: the 60 headers, in order, everywhere');
is(scalar(grep { ($_->{headers}{'x-long'} // '') eq $long } @$res), 6,
   'large header set: the 6000-byte header, everywhere');
is(scalar(followers($res)), 5, 'large header set: 5 followers');
is($t->origin_uri_hits($uri), 1, 'large header set: one origin request');

# proxy_pass_header Server, and the origin sends none: nginx sends none
# of its own either (its upstream leaves an empty Server that headers_out
# points at).  So for every reader of a stored response.
{
    my $uri = '/ps/x?delay=300&size=10000';
    my $res = $t->flight(leader => [ 'GET', $uri ], followers => [ map { [ 'GET', $uri ] } 1 .. 3 ]);
    is(join(' ', map { ($_->{status} // 'none') . ' ' . ($_->{headers}{server} // 'no-server') } @$res),
       join(' ', ('200 no-server') x 4), 'proxy_pass_header Server, none from the origin: none, for all');
}

done_testing;
