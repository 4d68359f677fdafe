#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_methods: which request methods are collapsed, and how
# methods mix.  By default GET and HEAD are; a POST passes through untouched
# unless configured, and then POSTs share flights among themselves only.  A
# HEAD may follow a GET flight (headers only, the GET's Content-Length); a
# GET never follows a HEAD flight.

use strict;
use warnings;

use IO::Socket::INET ();
use Socket ();
use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfm '$pid $request_method $singleflight_status $request_uri';
    access_log %%TESTDIR%%/sf.log sfm;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /p/ {
            singleflight sf;
            singleflight_methods GET HEAD POST;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# "METHOD STATUS" => count over the access log lines of one URI, once n
# are there
sub wait_logged {
    my ($uri, $n) = @_;
    return SFTest::tally(map { "$_->{method} $_->{sf}" }
        $t->wait_log_records('sf.log', [qw(pid method sf uri)], $n, uri => $uri));
}

# the requests the origin got for a target, in order: ([hit, METHOD], ...)
sub origin_requests {
    my ($target) = @_;
    return map { my (undef, $hit, $m, $u) = split / /; $u eq $target ? [ $hit, $m ] : () }
        split /\n/, $t->read_file($t->origin->log_file);
}

# the methods the origin saw for a target, in order
sub origin_methods {
    return join ' ', map { $_->[1] } origin_requests(@_);
}

# number of responses that are complete 200s with exactly $body
sub count_body {
    my ($res, $body) = @_;
    return scalar grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $body }
        @$res;
}

# Sends a HEAD request but reads the answer as if it were a GET, until the
# connection closes: a HEAD response that carries body bytes shows them in
# {body}.  A correct one ends with the headers (then {error} says the
# connection closed before the Content-Length bytes came, as expected).
sub raw_head {
    my ($uri) = @_;
    return (method => 'GET',
            raw => "HEAD $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

# ------------------------------------------------------------ POST, default

my $uri = '/post?delay=500';
my $res = $t->herd(n => 10, method => 'POST', path => $uri, body => 'payload');

is($t->origin_hits->{total}, 10, 'POST by default: 10 requests, 10 origin requests');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 10,
   'POST by default: 10 complete 200 responses');
my %hits = map { ($_->{headers}{'x-hit'} // 0) => 1 } @$res;
is(scalar keys %hits, 10, 'POST by default: each got its own origin response');
is(origin_methods($uri), join(' ', ('POST') x 10), 'POST by default: origin saw 10 POSTs');
is_deeply(wait_logged($uri, 10), { 'POST -' => 10 },
          'POST by default: untouched, no $singleflight_status');

# ------------------------------------------------------------ POST, configured

$t->origin_reset;
$uri = '/p/post?delay=500';
$res = $t->herd(n => 10, method => 'POST', path => $uri, body => 'payload');

is($t->origin_hits->{total}, 1, 'POST configured: 10 requests, 1 origin request');
is(count_body($res, SFTest::origin_body(1, $uri)), 10,
   'POST configured: every client got that response');
is_deeply(wait_logged($uri, 10), { 'POST LEADER' => 1, 'POST FOLLOWER' => 9 },
          'POST configured: 1 leader, 9 followers');

# POST and GET herds on the same URI at once: two flights, never mixed

$t->origin_reset;
$uri = '/p/mixed?delay=500';

my @post = map { $t->start_request('POST', $uri, body => "payload $_") } 1 .. 10;
my $get = $t->herd(n => 10, path => $uri);
$res = [ map { $t->finish_request($_) } @post ];

is($t->origin_hits->{total}, 2, 'POST + GET: 2 origin requests');
my %hit = map { $_->[1] => $_->[0] } origin_requests($uri);
is(join(' ', sort keys %hit), 'GET POST', 'POST + GET: one POST, one GET at the origin');
is(count_body($res, SFTest::origin_body($hit{POST} // 0, $uri)), 10,
   'POST + GET: every POST got the POST response');
is(count_body($get, SFTest::origin_body($hit{GET} // 0, $uri)), 10,
   'POST + GET: every GET got the GET response');
is_deeply(wait_logged($uri, 20),
          { 'POST LEADER' => 1, 'POST FOLLOWER' => 9, 'GET LEADER' => 1, 'GET FOLLOWER' => 9 },
          'POST + GET: a leader each');

# ------------------------------------------------------------ HEAD follows GET

$t->origin_reset;
$uri = '/hg?delay=500&size=1000';

my $leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_hits->{total} == 1 }, what => 'GET at the origin');

my $heads = $t->herd(n => 10, path => $uri, raw_head($uri));
my $r = $t->finish_request($leader);

is($t->origin_hits->{total}, 1, 'HEAD after GET: 1 origin request');
is(origin_methods($uri), 'GET', 'HEAD after GET: the origin saw the GET only');
is($r->{status}, 200, 'HEAD after GET: the GET got 200');
is($r->{body}, SFTest::origin_body(1, $uri, 1000), 'HEAD after GET: the GET got its body');
is(scalar(grep { ($_->{status} // 0) == 200 } @$heads), 10, 'HEAD after GET: 10 x 200');
is(scalar(grep { ($_->{headers}{'content-length'} // '') eq '1000' } @$heads), 10,
   'HEAD after GET: Content-Length of the GET body');
is(scalar(grep { ($_->{headers}{'x-hit'} // '') eq '1' } @$heads), 10,
   'HEAD after GET: headers of the GET response');
is(scalar(grep { defined $_->{status} && $_->{body} eq '' } @$heads), 10,
   'HEAD after GET: no body bytes');
is_deeply(wait_logged($uri, 11), { 'GET LEADER' => 1, 'HEAD FOLLOWER' => 10 },
          'HEAD after GET: the HEADs followed the GET');

# ------------------------------------------------------------ HEAD flight

# HEADs alone share a HEAD flight

$t->origin_reset;
$uri = '/hh?delay=500&size=1000';
$heads = $t->herd(n => 10, path => $uri, raw_head($uri));

is($t->origin_hits->{total}, 1, 'HEAD herd: 1 origin request');
is(origin_methods($uri), 'HEAD', 'HEAD herd: a HEAD at the origin');
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{body} eq ''
                 && ($_->{headers}{'content-length'} // '') eq '1000' } @$heads), 10,
   'HEAD herd: 10 x 200, Content-Length 1000, no body');

# GETs arriving while a HEAD flight runs start a GET flight of their own

$t->origin_reset;
$uri = '/hx?delay=500&size=1000';

$leader = $t->start_request('HEAD', $uri);
$t->wait_for(sub { $t->origin_hits->{total} == 1 }, what => 'HEAD at the origin');

$get = $t->herd(n => 10, path => $uri);
$r = $t->finish_request($leader);

is($t->origin_hits->{total}, 2, 'GET during HEAD: 2 origin requests');
is(origin_methods($uri), 'HEAD GET', 'GET during HEAD: a HEAD, then one GET');
is($r->{status}, 200, 'GET during HEAD: the HEAD got 200');
is(count_body($get, SFTest::origin_body(2, $uri, 1000)), 10,
   'GET during HEAD: every GET got the full body of the GET');
is_deeply(wait_logged($uri, 11), { 'HEAD LEADER' => 1, 'GET LEADER' => 1, 'GET FOLLOWER' => 9 },
          'GET during HEAD: the GETs did not follow the HEAD');

# ------------------------------------------------------------ HEAD never leads GETs

# The GET leader's upstream fails (reset after 300 ms, only the first
# time), so a follower takes the flight over.  HEADs follow the GET flight
# and were queued first, but a HEAD must not become the one fetching for
# GET followers: they need the body.

$t->origin_reset;
$uri = '/hp?delay=300&size=1000&fail=reset&fail_first=1';

$leader = $t->start_request('GET', $uri);
$t->wait_for(sub { $t->origin_hits->{total} == 1 }, what => 'GET at the origin');

my @heads = map { $t->start_request('HEAD', $uri) } 1 .. 5;
my @gets = map { $t->start_request('GET', $uri) } 1 .. 3;
$t->finish_request($leader);
$heads = [ map { $t->finish_request($_) } @heads ];
$get = [ map { $t->finish_request($_) } @gets ];

my %method = map { $_->[0] => $_->[1] } origin_requests($uri);
is(scalar(grep { my $hit = $_->{headers}{'x-hit'} // 0;
                 ($_->{status} // 0) == 200 && $_->{complete}
                 && $_->{body} eq SFTest::origin_body($hit, $uri, 1000)
                 && ($method{$hit} // '') eq 'GET' } @$get), 3,
   'failed GET leader: the GET followers got the full body of a GET')
    or diag(explain([ map { { status => $_->{status}, error => $_->{error},
                              'x-hit' => $_->{headers}{'x-hit'},
                              body_bytes => length $_->{body} } } @$get ]),
            explain(\%method));
is(scalar(grep { ($_->{status} // 0) == 200
                 && ($_->{headers}{'content-length'} // '') eq '1000' } @$heads), 5,
   'failed GET leader: the HEADs got 200 and the GET\'s Content-Length');

# A client that closes with its request: without the module nginx's
# upstream sees it and sends the origin nothing (499); a fetch sent it,
# a POST as well (logged 200).

for my $c ([ 'POST', '/p/gone?echo=1&delay=300', 'x=1' ], [ 'GET', '/gone?echo=1&delay=300', '' ],
           [ 'HEAD', '/gone-head?echo=1&delay=300', '' ]) {
    my ($m, $u, $body) = @$c;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port, Proto => 'tcp')
        or die "connect: $!";
    # corked: the close's FIN goes in the request's own segment, so that
    # nginx sees both at once (without the module too)
    setsockopt($s, Socket::IPPROTO_TCP(), 3, 1) or die "TCP_CORK: $!";    # Linux's TCP_CORK
    syswrite($s, "$m $u HTTP/1.1\r\nHost: localhost\r\n"
                 . (length $body ? 'Content-Length: ' . length($body) . "\r\n" : '') . "\r\n$body");
    shutdown($s, 1);
    close($s);
    wait_logged($u, 1);
    is($t->origin_uri_hits($u) // 0, 0, "$m, its client closed with it: nothing sent to the origin");
}

done_testing;
