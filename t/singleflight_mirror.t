#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# mirror: every client request is mirrored once, as without the module.
# nginx's mirror module makes its subrequests in the precontent phase,
# after this module's handler, which holds a request it collapses: until
# 2026-11-26 a collapsed request, leader or follower, was never mirrored.
# Now the module makes a collapsed request's mirrors when it joins its
# flight, before it waits; a request that goes on through the phases on
# its own after all (a private response's followers, a key marked
# private) passes the mirror module with its mirrors hidden: mirrored
# once, not twice.  A response that the fetch made after an internal
# redirect (error_page) mirrors as the redirected request would have:
# the first location's mirrors, then the second's.  Counted in each
# mirror location's log, against plain nginx's (a server without the
# module, same locations).  Over HTTP/1.1 and HTTP/2, and for collapsed
# POSTs, whose mirrors carry the body with mirror_request_body on.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

sub locations {
    my ($p) = @_;
    return <<"EOT";
        location /m/ {
            mirror /mirror1;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mb/ {
            mirror /mirror1;
            mirror_request_body off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /r/ {
            mirror /mirror1;
            proxy_pass http://%%ORIGIN%%;
            proxy_intercept_errors on;
            error_page 404 = /r2/fallback?k=\$arg_k;
        }

        location /r2/ {
            mirror /mirror2;
            proxy_pass http://%%ORIGIN%%;
        }

        location /ix$p/ {
            alias %%TESTDIR%%/ix/;
            mirror /mirror1;
        }

        location /p/ {
            singleflight_methods POST;
            singleflight_key \$scheme\$host\$singleflight_body_hash;
            mirror /mirror3;
            proxy_pass http://%%ORIGIN%%;
        }

        location /pb/ {
            singleflight_methods POST;
            singleflight_key \$scheme\$host\$singleflight_body_hash;
            mirror /mirror3;
            mirror_request_body off;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mg$p/ {
            mirror /mirror_slow;
            proxy_pass http://%%ORIGIN%%;
        }

        location /mgf$p/ {
            singleflight_lone fetch;
            mirror /mirror_slow;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /mirror_slow {
            internal;
            set \$args "delay=1500";
            proxy_pass http://%%ORIGIN%%;
        }

        location /mirror3 {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/mirror3$p.log mirrorbody;
            return 204;
        }

        location /mirror1 {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/mirror1$p.log mirror;
            return 204;
        }

        location /mirror2 {
            internal;
            log_subrequest on;
            access_log %%TESTDIR%%/mirror2$p.log mirror;
            return 204;
        }
EOT
}

my ($sf, $plain) = (locations(''), locations('-plain'));

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    log_format mirror '\$uri \$args';
    log_format mirrorbody '\$uri \$args \$request_method [\$request_body]';

    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_2%% http2;
        singleflight sf;
$sf
        location = /stats {
            singleflight_stats;
        }
    }

    # plain nginx, for the counts
    server {
        listen 127.0.0.1:%%PORT_1%%;
        listen 127.0.0.1:%%PORT_3%% http2;
$plain
    }
EOT

mkdir $t->path('ix') or die "ix: $!";
$t->write_file('ix/index.html', "the index\n");

$t->start;

my $port1 = $t->port(1);

# The lines of a mirror log whose arguments name key $k, once there are
# at least $n (and a moment for more to come: mirrors are in the
# background, each logged when it ends); %opt: wait_for's (timeout).
sub mirrored {
    my ($log, $k, $n, %opt) = @_;
    my @l;
    my $count = sub {
        @l = grep { /\bk=\Q$k\E\b/ } split /\n/, ($t->read_file($log) // '');
        scalar @l;
    };
    $t->wait_for(sub { $count->() >= $n }, what => "$n mirrors of $k in $log", quiet => 1, %opt);
    # extra mirrors would be logged by now: the plain requests after them
    # have been answered and logged
    return $count->();
}

# The lines of a mirror log for key $k, sorted, once there are $n.
sub mirror_lines {
    my ($log, $k, $n) = @_;
    mirrored($log, $k, $n);
    return sort { $a cmp $b } grep { /\bk=\Q$k\E\b/ } split /\n/, ($t->read_file($log) // '');
}

# $n requests for $path, plain nginx's, one after the other
sub plain_requests {
    my ($path, $n) = @_;
    $t->get($path, port => $port1) for 1 .. $n;
}

# ------------------------------------------------------------ a herd

{
    my $uri = '/m/herd?k=herd&size=3000&delay=300';
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri ], followers => [ map { [ 'GET', $uri ] } 1 .. 4 ]);
    is(join(' ', map { $_->{status} // 'none' } @$res), '200 200 200 200 200', 'a herd: answered');
    is($t->origin_uri_hits($uri), 1, 'a herd: one origin request');
    plain_requests('/m/herd?k=herdp&size=3000', 5);
    is(mirrored('mirror1-plain.log', 'herdp', 5), 5, 'plain nginx: 5 requests, 5 mirrors');
    is(mirrored('mirror1.log', 'herd', 5), 5, 'a herd of 5: 5 mirrors, leader and followers');
    is_deeply([ sort { $a cmp $b } statuses_of('/m/herd?k=herd&size=3000&delay=300', 5) ],
              [ 'FOLLOWER', 'FOLLOWER', 'FOLLOWER', 'FOLLOWER', 'LEADER' ], 'a herd: collapsed');
}

# ------------------------------------------------------------ on their own

# A private response: the followers go upstream on their own, through the
# mirror module's handler; mirrored once each all the same, with
# mirror_request_body on and off.
for my $where ('m', 'mb') {
    my $uri = "/$where/priv?k=priv$where&size=2000&delay=300&hdr=Set-Cookie:a%3Db";
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri ], followers => [ map { [ 'GET', $uri ] } 1 .. 3 ]);
    is(join(' ', map { $_->{status} // 'none' } @$res), '200 200 200 200', "/$where/ private: answered");
    is($t->origin_uri_hits($uri), 4, "/$where/ private: each its own origin request");
    plain_requests("/$where/priv?k=priv${where}p&size=2000&hdr=Set-Cookie:a%3Db", 4);
    is(mirrored('mirror1-plain.log', "priv${where}p", 4), 4, "plain nginx, /$where/: 4 mirrors");
    is(mirrored('mirror1.log', "priv$where", 4), 4, "/$where/ private: 4 mirrors, none twice");

    # the key is marked private now: a request for it goes on its own at
    # once (its join declines), past the mirrors it made
    $t->get($uri) for 1 .. 2;
    is(mirrored('mirror1.log', "priv$where", 6), 6, "/$where/ private, marked: 2 more requests, 2 mirrors");
}

# ------------------------------------------------------------ before the wait

# The mirrors are made when a request joins its flight, before it waits,
# as the mirror module makes them before the location's content handler
# runs: all four are there while the origin still holds the response,
# and a client that goes away while it waits was mirrored all the same.
{
    my $uri = '/m/early?k=early&size=3000&delay=3000';
    $t->origin_reset;
    my $lh = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the origin to get the fetch');
    my @fh = map { $t->start_request('GET', $uri) } 1 .. 3;
    $t->wait_waiters(3);
    is(mirrored('mirror1.log', 'early', 4, timeout => 1.5), 4,
       'before the wait: 4 mirrors while the origin holds the response');
    ok(!$t->poll_request($lh), 'before the wait: the leader not answered yet');
    $t->abort_request($fh[0]);
    my @res = map { $t->finish_request($_) } $lh, @fh[1, 2];
    is(join(' ', map { $_->{status} // 'none' } @res), '200 200 200', 'before the wait: the others answered');
    $t->get('/m/early?k=early&size=10');
    is(mirrored('mirror1.log', 'early', 5), 5,
       'before the wait: the client gone mirrored once, none twice (and one more request)');
}

# ------------------------------------------------------------ a redirect

# The origin's 404, an error_page to another location with a mirror of
# its own: without the module each request is mirrored in both.
{
    my $uri = '/r/gone?k=redir&delay=300&status=404';
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri ], followers => [ map { [ 'GET', $uri ] } 1 .. 2 ]);
    plain_requests('/r/gone?k=redirp&status=404', 3);
    is(mirrored('mirror1-plain.log', 'redirp', 3) . ' ' . mirrored('mirror2-plain.log', 'redirp', 3),
       '3 3', 'plain nginx, a redirect: each request mirrored in both locations');
    is(join(' ', map { $_->{status} // 'none' } @$res), '200 200 200', 'a redirect: answered');
    is(mirrored('mirror1.log', 'redir', 3) . ' ' . mirrored('mirror2.log', 'redir', 3), '3 3',
       'a redirect: each request mirrored in both locations');
}

# index: the fetch's internal redirect, which the readers take without
# going through the phases again (they take its URI); without the module
# a request passes the mirror module twice, in the same location.
{
    my @h = map { $t->start_request('GET', '/ix/?k=index') } 1 .. 3;
    my @res = map { $t->finish_request($_) } @h;
    is(join(' ', map { ($_->{status} // 'none') . ':' . ($_->{body} // '') } @res),
       join(' ', ("200:the index\n") x 3), 'index: answered');
    plain_requests('/ix-plain/?k=indexp', 3);
    is(mirrored('mirror1-plain.log', 'indexp', 6), 6, 'plain nginx, index: two mirrors a request');
    is(mirrored('mirror1.log', 'index', 6), 6, 'index: two mirrors a request');
}

# ------------------------------------------------------------ HTTP/2

# Streams of HTTP/2 connections (curl) collapse as HTTP/1.1 requests do;
# each is mirrored once, as by plain nginx over HTTP/2.
{
    my $uri = '/m/h2?k=h2&size=3000&delay=1000';   # curls start slowly on a busy machine
    my @h2 = (h2 => 1, port => $t->port(2));
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri, @h2 ], followers => [ map { [ 'GET', $uri, @h2 ] } 1 .. 3 ]);
    is(join(' ', map { ($_->{protocol} // 'none') . ':' . ($_->{status} // 'none') } @$res),
       join(' ', ('HTTP/2:200') x 4), 'HTTP/2: answered');
    is($t->origin_uri_hits($uri), 1, 'HTTP/2: one origin request');
    $t->finish_request($t->start_request('GET', '/m/h2?k=h2p&size=3000', h2 => 1, port => $t->port(3)))
        for 1 .. 4;
    is(mirrored('mirror1-plain.log', 'h2p', 4), 4, 'plain nginx, HTTP/2: 4 mirrors');
    is(mirrored('mirror1.log', 'h2', 4), 4, 'HTTP/2: 4 streams, 4 mirrors');
}

# The first client goes away mid-body; its mirror ends 1.5 s later,
# while its response is read on for the others (its own upstream request,
# or its fetch with singleflight_lone fetch).  The end of that mirror is
# not the end of the response they read (it was: nginx ends a request
# whose connection failed once any subrequest of it ends).
for my $case ([ 'mg', 'h2' ], [ 'mgf', 'h2' ], [ 'mg', 'http1' ], [ 'mgf', 'http1' ]) {
    my ($where, $proto) = @$case;
    my $size = 400_000;
    my $uri = "/$where/gone-$proto?size=$size&delay=300&pace=100000:800";
    my @via = $proto eq 'h2' ? (h2 => 1, port => $t->port(2)) : ();
    my $off = $t->log_offset;
    my $headers = sub { $t->stats('/stats')->{zones}{sf}{flight_header_seconds}{count} };
    my $h0 = $headers->();
    $t->origin_reset;
    my $leader = $t->start_request('GET', $uri, @via);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the first request at the origin');
    my @f = map { $t->start_request('GET', $uri, @via, timeout => 20) } 1 .. 3;
    $t->wait_waiters(3);
    $t->wait_for(sub { $headers->() > $h0 }, what => 'the response header');
    $t->abort_request($leader);
    $t->wait_for(sub { $t->error_log_since($off) =~ /read on for the others|client prematurely closed|client canceled stream/ },
                 what => 'the first client gone');
    my @res = map { $t->finish_request($_) } @f;
    is(scalar(grep { ($_->{status} // 0) == 200 && length($_->{body} // '') == $size } @res),
       3, "$where $proto, first client gone: the others get the whole body past its mirror's end")
        or diag(join ' ', map { ($_->{status} // 'none') . ':' . length($_->{body} // '') } @res);
    is($t->origin_uri_hits($uri), 1, "$where $proto, first client gone: one origin request");
    is($t->origin_uri_hits('/mirror_slow?delay=1500'), 4, "$where $proto, first client gone: each request mirrored");
}

# ------------------------------------------------------------ a request body

# Collapsed POSTs (the key is the body's hash): with mirror_request_body
# on each mirror carries its request's body, as plain nginx's do; off,
# none does.  Over HTTP/1.1 and HTTP/2.
for my $case ([ 'p', '' ], [ 'pb', '' ], [ 'p', 'h2' ]) {
    my ($where, $h2) = @$case;
    my $k = "post$where$h2";
    my $uri = "/$where/post?k=$k&size=2000&delay=300";
    my @o = (body => "the body of $k\n", $h2 ? (h2 => 1, port => $t->port(2)) : ());
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'POST', $uri, @o ], followers => [ map { [ 'POST', $uri, @o ] } 1 .. 3 ]);
    is(join(' ', map { $_->{status} // 'none' } @$res), '200 200 200 200', "$k: answered");
    is($t->origin_uri_hits($uri), 1, "$k: one origin request");
    my @p = (body => "the body of $k\n", $h2 ? (h2 => 1, port => $t->port(3)) : (port => $port1));
    $t->finish_request($t->start_request('POST', "/$where/post?k=${k}p&size=2000", @p)) for 1 .. 4;
    my @plain = mirror_lines('mirror3-plain.log', "${k}p", 4);
    s/\bk=${k}p\b/k=$k/ for @plain;
    like($plain[0], $where eq 'p' ? qr/^\S+ \S+ POST \[the body of \Q$k\E\\x0A\]$/ : qr/ POST \[-\]$/,
         "plain nginx, $k: the mirror's body") or diag(explain(\@plain));
    is_deeply([ mirror_lines('mirror3.log', $k, 4) ], [ map { s/size=2000/size=2000&delay=300/r } @plain ],
              "$k: 4 mirrors, each as plain nginx's");
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing();

# the $singleflight_status values of the first $n access log lines of $uri
sub statuses_of { my ($uri, $n) = @_; return ($t->sf_statuses($uri, $n))[0 .. $n - 1] }
