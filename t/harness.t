#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Self-test of the harness (t/lib/SFTest.pm) and the origin (t/origin.pl).
# Does not need the singleflight module: nginx runs as a plain proxy.

use strict;
use warnings;

use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(time);

use SFTest;

my $t = SFTest->new;

# ------------------------------------------------------------ ports

my ($p0, $p1) = ($t->port(0), $t->port(1));
ok($p0 && $p1 && $p0 != $p1, 'ports are distinct');
is($t->port(0), $p0, 'port(0) is stable');

# SF_TEST_PORTS: nginx's ports and origins' in that range only
{
    local $ENV{SF_TEST_PORTS} = '20100-20199';
    my $r = SFTest->new;
    my @p = map { $r->port($_) } 0 .. 4;
    my $o = $r->start_origin;
    is(scalar(grep { $_ >= 20100 && $_ <= 20199 } @p, $o->port), 6,
       'SF_TEST_PORTS: the ports and the origin\'s are in its range');
    $o->stop;
}
{
    local $ENV{SF_TEST_PORTS} = 'some';
    ok(!eval { SFTest->new->port(0); 1 } && $@ =~ /it must be LOW-HIGH/,
       'SF_TEST_PORTS not a range: says what to write');
}

# ------------------------------------------------------------ origin

my $origin = $t->start_origin;
my $op = $origin->port;
ok($op, "origin listening on $op");
is($t->origin_port, $op, 'origin_port');
my %o = (port => $op);

my $r = $t->get('/basic', %o);
is($r->{status}, 200, 'basic: 200');
is($r->{body}, "hit=1 uri=/basic\n", 'basic: stamp line body');
is($r->{headers}{'x-hit'}, 1, 'basic: X-Hit');
is($r->{headers}{'x-uri-hit'}, 1, 'basic: X-Uri-Hit');
is($r->{headers}{'content-type'}, 'text/plain', 'basic: Content-Type');
like($r->{headers}{date} // '', qr/GMT$/, 'basic: Date');
ok($r->{complete} && !$r->{error}, 'basic: complete');

$r = $t->get('/basic', %o);
is($r->{headers}{'x-uri-hit'}, 2, 'second hit of same uri: X-Uri-Hit 2');
is($r->{headers}{'x-hit'}, 2, 'second hit: X-Hit 2');

$r = $t->get('/s?size=1000', %o);
is(length $r->{body}, 1000, 'size=1000: exact length');
is($r->{body}, SFTest::origin_body(3, '/s?size=1000', 1000), 'size=1000: deterministic body');
is($r->{headers}{'content-length'}, 1000, 'size=1000: Content-Length');

$r = $t->get('/s?size=5', %o);
is($r->{body}, 'hit=4', 'size=5: truncated stamp');

$r = $t->get('/s?size=0', %o);
is($r->{body}, '', 'size=0: empty body');

$r = $t->get('/st?status=404', %o);
is($r->{status}, 404, 'status=404');

$r = $t->get('/st?status=204', %o);
ok($r->{status} == 204 && $r->{complete} && $r->{body} eq '', 'status=204: no body');

$r = $t->get('/c?chunked=1&size=20000', %o);
ok($r->{chunked}, 'chunked=1: chunked response');
ok($r->{chunks} >= 5, "chunked=1: several chunks ($r->{chunks})");
is(length $r->{body}, 20000, 'chunked=1: decoded body length');
ok(!exists $r->{headers}{'content-length'}, 'chunked=1: no Content-Length');

$r = $t->http('HEAD', '/h?size=1234', %o);
is($r->{headers}{'content-length'}, 1234, 'HEAD: Content-Length of the GET');
ok($r->{complete} && $r->{body} eq '', 'HEAD: no body');

$r = $t->http('HEAD', '/h?size=1234&chunked=1', %o);
ok($r->{complete} && $r->{body} eq '' && $r->{headers}{'transfer-encoding'}, 'HEAD chunked');

$r = $t->get('/d?delay=300', %o);
ok($r->{time} >= 0.29 && $r->{time} < 2, sprintf('delay=300 took %.3fs', $r->{time}));

$r = $t->get('/x?hdr=Set-Cookie:a%3D1&hdr=Set-Cookie:b=2&hdr=Cache-Control:%20max-age=5', %o);
is($r->{headers}{'set-cookie'}, 'a=1, b=2', 'hdr=: repeated header');
is(scalar(grep { $_->[0] eq 'Set-Cookie' } @{ $r->{header_list} }), 2, 'header_list keeps repeats');
is($r->{headers}{'cache-control'}, 'max-age=5', 'hdr=: URL-decoded value');

$r = $t->get('/k?close=1', %o);
is($r->{headers}{connection}, 'close', 'close=1: Connection: close');

$r = $t->get('/ten?chunked=1&size=100', %o, http10 => 1);
ok($r->{status} == 200 && $r->{headers}{'content-length'} == 100, 'HTTP/1.0: no chunked');

$r = $t->http('POST', '/post', %o, body => 'x' x 10000);
is($r->{status}, 200, 'POST with body');

# echo=1: the body is the request as the origin got it
$r = $t->get('/e?echo=1', %o, headers => [ 'X-B' => '2', 'X-A' => 'z', 'X-B' => '1',
    'If-None-Match' => '"q"', 'Range' => 'bytes=0-1' ]);
is($r->{body}, "GET /e?echo=1\nhost: localhost\nx-a: z\nx-b: 2\nx-b: 1\nbody: 0 bytes\n\n",
    'echo: method, target, sorted headers (repeats in order), no hop-by-hop or conditionals');
ok($r->{headers}{'x-hit'}, 'echo: the hit number is in X-Hit only');
my $echo_get = $t->get('/e2?echo=1&size=300', %o);
is(length $echo_get->{body}, 300, 'echo: size=300 pads to 300 bytes');
$r = $t->http('HEAD', '/e2?echo=1&size=300', %o);
is($r->{headers}{'content-length'}, 300, 'echo: a HEAD has the headers of the GET it stands for');
$r = $t->http('POST', '/e3?echo=1', %o, body => "a\0b" x 1000, headers => [ 'Content-Type' => 'x/y' ]);
like($r->{body}, qr/^POST \/e3\?echo=1\ncontent-type: x\/y\nhost: localhost\nbody: 3000 bytes\n\n/,
    'echo: POST with its body length');
is(substr($r->{body}, -3000), "a\0b" x 1000, 'echo: the request body, byte for byte');
$r = $t->http('POST', '/e3?echo=1', %o, raw => "POST /e3?echo=1 HTTP/1.1\r\nHost: h\r\n"
    . "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
like($r->{body}, qr/\nbody: 5 bytes\n\nabcde$/, 'echo: a chunked request body');
$r = $t->get('/e4?echo=1&prefix=%3Cp%3E', %o);
like($r->{body}, qr/^<p>GET /, 'echo: prefix= comes first');

my $etag = '/c?echo=1&hdr=ETag:%22v1%22&hdr=Last-Modified:Mon,%2001%20Jan%202024%2000:00:00%20GMT';
$r = $t->get($etag, %o, headers => [ 'If-None-Match' => 'W/"v1"' ]);
ok($r->{status} == 304 && !defined $r->{headers}{'content-type'} && $r->{headers}{etag} eq '"v1"',
    'echo: If-None-Match matching (weakly) gives 304, with ETag, no Content-Type');
is($t->get($etag, %o, headers => [ 'If-None-Match' => '"v2"' ])->{status}, 200,
    'echo: If-None-Match not matching gives 200');
is($t->get($etag, %o, headers => [ 'If-Modified-Since' => 'Tue, 02 Jan 2024 00:00:00 GMT' ])->{status},
    304, 'echo: If-Modified-Since at or after Last-Modified gives 304');
is($t->get($etag, %o, headers => [ 'If-Modified-Since' => 'Sun, 31 Dec 2023 00:00:00 GMT' ])->{status},
    200, 'echo: If-Modified-Since before Last-Modified gives 200');

my $rg = '/rg?echo=1&ranges=1&size=200&hdr=ETag:%22r%22';
my $full = $t->get($rg, %o)->{body};
$r = $t->get($rg, %o, headers => [ Range => 'bytes=10-19' ]);
ok($r->{status} == 206 && $r->{body} eq substr($full, 10, 10)
    && $r->{headers}{'content-range'} eq 'bytes 10-19/200', 'echo: ranges=1, bytes=10-19 gives 206');
is($t->get($rg, %o, headers => [ Range => 'bytes=-5' ])->{body}, substr($full, -5),
    'echo: a suffix range');
is($t->get($rg, %o, headers => [ Range => 'bytes=500-' ])->{status}, 416,
    'echo: an unsatisfiable range gives 416');
is($t->get($rg, %o, headers => [ Range => 'bytes=0-1', 'If-Range' => '"other"' ])->{status}, 200,
    'echo: If-Range naming another ETag gives the whole 200');
is($t->get($rg, %o, headers => [ Range => 'bytes=0-1,5-6' ])->{status}, 200,
    'echo: several ranges give the whole 200');
is($t->get('/rg?echo=1&size=200', %o, headers => [ Range => 'bytes=0-1' ])->{status}, 200,
    'echo: Range is ignored without ranges=1');

# failures
$r = $t->get('/ff?fail=close&fail_first=1', %o);
ok(!defined $r->{status} && $r->{error}, "fail=close: no response ($r->{error})");
$r = $t->get('/ff?fail=close&fail_first=1', %o);
is($r->{status}, 200, 'fail_first=1: second request succeeds');
is($r->{headers}{'x-uri-hit'}, 2, 'fail_first=1: second is uri hit 2');

$r = $t->get('/rst?fail=reset', %o);
ok(!defined $r->{status} && $r->{error}, "fail=reset: error ($r->{error})");

$r = $t->get('/mid?fail=midbody&size=1000', %o);
ok($r->{status} == 200 && !$r->{complete} && length $r->{body} == 500,
    'fail=midbody: half the body then close');

$r = $t->get('/slow?fail=slowbody&delay=100&size=4000', %o);
ok($r->{complete} && length $r->{body} == 4000, 'fail=slowbody: full body');
ok($r->{time} >= 0.45, sprintf('fail=slowbody: paced (%.3fs)', $r->{time}));

my $bd = $t->start_request('GET', '/bd?body_delay=400&size=50', %o);
ok($t->wait_for(sub { $t->poll_request($bd); defined $bd->{res}{status} }, timeout => 0.3,
    what => 'the header of body_delay'), 'body_delay=400: the header comes at once');
$r = $t->finish_request($bd);
ok($r->{complete} && length $r->{body} == 50 && $r->{time} >= 0.39,
    sprintf('body_delay=400: the body %.3fs later', $r->{time}));

# started now, polled, read later
my $h = $t->start_request('GET', '/later?fail=slowbody&delay=150&size=100', %o);
ok(!$t->poll_request($h), 'poll_request: not done yet');
ok($t->wait_for(sub { defined $h->{res}{status} || ($t->poll_request($h), 0) },
    timeout => 2, what => 'headers of slowbody'), 'poll_request: headers arrive first');
ok(!$h->{res}{complete}, 'slowbody: body still pending after headers');
$r = $t->finish_request($h);
ok($r->{complete} && length $r->{body} == 100, 'finish_request: complete');

my $t0 = time;
$r = $t->get('/hang?fail=hang', %o, timeout => 0.5);
ok(!defined $r->{status} && $r->{error} eq 'timeout', 'fail=hang: client timeout');
ok(time - $t0 < 1.5, 'fail=hang: timeout honoured');

# until_close: done when the server closes, not at the body's last byte
$r = $t->get('/uc', %o, until_close => 1);
ok($r->{complete} && $r->{body} =~ m{^hit=\d+ uri=/uc\n\z}, 'until_close: complete at the close');
$r = $t->get('/uc', %o, until_close => 1, timeout => 0.5,
             headers => [ Connection => 'keep-alive' ]);
ok($r->{error} && $r->{error} eq 'timeout' && $r->{body} =~ m{^hit=\d+ uri=/uc\n\z},
   'until_close: a connection kept open is waited for');
$r = $t->get('/uc', %o, timeout => 0.5, headers => [ Connection => 'keep-alive' ]);
ok($r->{complete} && !$r->{error}, 'without it: done at the last byte');
# and bytes past the length are the body's too, those that came in the
# same read as its last ones included, when the connection stays open (a
# server that sent more than its Content-Length, and keeps it alive)
{
    my $l = IO::Socket::INET->new(Listen => 1, LocalAddr => $t->addr, LocalPort => 0,
                                  ReuseAddr => 1) or die "listen: $!";
    my $port = $l->sockport;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $c = $l->accept;
        sysread($c, my $buf, 4096);
        syswrite($c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcEXTRA");
        sleep 5;
        POSIX::_exit(0);
    }
    close $l;
    $r = $t->get('/x', port => $port, until_close => 1, timeout => 0.5,
                 headers => [ Connection => 'keep-alive' ]);
    kill 'KILL', $pid;
    waitpid($pid, 0);
    ok(($r->{error} // '') eq 'timeout' && $r->{body} eq 'abcEXTRA',
       'until_close: the bytes past the length kept, the connection open');
}

# pipelining and keep-alive on one raw connection
{
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$op", Timeout => 5) or die $!;
    print $s "GET /p1?delay=200 HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        "GET /p3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    local $/;
    my $all = <$s>;
    my @uris = $all =~ /^hit=\d+ uri=(\S+)$/mg;
    is("@uris", '/p1?delay=200 /p2 /p3', 'pipelined responses in order');
    is(() = $all =~ m{^HTTP/1\.1 200}mg, 3, 'three responses on one connection');
}

# counters
my $hits = $t->origin_hits;
is($hits->{uris}{'/basic'}, 2, '/_hits: per-uri count');
is($hits->{uris}{'/ff?fail=close&fail_first=1'}, 2, '/_hits: failed requests count too');
ok(!exists $hits->{uris}{'/_hits'}, '/_hits: control endpoints not counted');
my $before = $hits->{total};
$t->get('/one-more', %o);
is($t->origin_hits->{total}, $before + 1, '/_hits: total counts one request');
ok($t->origin_reset, '/_reset');
is($t->origin_hits->{total}, 0, 'after reset: total 0');
is_deeply($t->origin_hits->{uris}, {}, 'after reset: no uris');

# concurrency of the origin itself
$t0 = time;
my $res = $t->herd(n => 50, path => '/direct?delay=300', port => $op);
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 50, 'herd on origin: 50 x 200');
ok(time - $t0 < 1.5, sprintf('herd on origin: concurrent (%.3fs)', time - $t0));
is($t->origin_hits->{total}, 50, 'herd on origin: 50 hits');

# a second origin is independent
my $o2 = $t->start_origin;
isnt($o2->port, $op, 'second origin on its own port');
$t->get('/two', port => $o2->port);
is($t->origin_hits(1)->{total}, 1, 'second origin counts its own hits');

# helpers over handles, origin counters and logs
my @hs = map { $t->start_request('GET', "/all?delay=200&n=$_", %o) } 1 .. 3;
ok($t->poll_all(\@hs, timeout => 5), 'poll_all: all done');
is(scalar(grep { $_->{res}{complete} } @hs), 3, 'poll_all: all complete');
is($t->origin_uri_hits('/all?delay=200&n=2'), 1, 'origin_uri_hits');
is($t->origin_uri_hits('/never'), 0, 'origin_uri_hits: 0 for none');
is($t->origin_uri_hits('/two', 1), 1, 'origin_uri_hits of a second origin');

$t->write_file('records.txt', "1|A|/x\n2|B|/y|z\n3|A|/x\n");
is_deeply([ $t->log_records('records.txt', [qw(n s uri)], sep => '|', uri => '/x') ],
    [ { n => 1, s => 'A', uri => '/x' }, { n => 3, s => 'A', uri => '/x' } ],
    'log_records: named fields, filtered by uri');
is(join(' ', map { $_->{uri} }
        $t->log_records('records.txt', [qw(n s uri)], sep => '|', offset => length "1|A|/x\n")),
   '/y|z /x', 'log_records: from an offset, the last field takes the rest');
is(scalar($t->wait_log_records('records.txt', [qw(n s uri)], 2, sep => '|', uri => qr{^/x$})), 2,
    'wait_log_records: uri as a qr//');
is($t->log_count(qr/\|A\|/, 0, 'records.txt'), 2, 'log_count');
is_deeply(SFTest::tally(qw(a b a)), { a => 2, b => 1 }, 'tally');
is_deeply(SFTest::delta({ a => 1, b => 5 }, { a => 3, b => 5 }), { a => 2, b => 0 }, 'delta');
is_deeply(SFTest::delta({ a => 1, b => 5 }, { a => 3, b => 7 }, 'b'), { b => 2 },
    'delta of some fields');

# ------------------------------------------------------------ differential

# SFTest::Diff's comparison: what matters differs, the rest may
{
    require SFTest::Diff;
    require SFTest::Diff::Blocks;
    require IO::Compress::Gzip;
    my $res = sub {
        my (%a) = @_;
        my %h = (date => 'Mon, 23 Nov 2026 00:00:00 GMT', 'x-hit' => 1, 'content-type' => 'text/plain',
            'content-length' => length($a{body} // 'b'), %{ $a{headers} // {} });
        delete $h{$_} for grep { !defined $h{$_} } keys %h;
        return { status => 200, complete => 1, body => 'b', %a, headers => \%h };
    };
    my $diff = sub { join '; ', SFTest::Diff::differences(@_) };
    is($diff->($res->(), $res->(headers => { date => 'x', 'x-hit' => 7, server => 'y' })), '',
        'differences: none when only Date, X-Hit, Server differ');
    like($diff->($res->(status => 502), $res->()), qr/^status 502, without the module 200$/,
        'differences: the status');
    like($diff->($res->(body => "a\nbc"), $res->(body => "a\nbd")), qr/byte 3 \(line 2\): "bc" vs "bd"/,
        'differences: the body, where it parts');
    like($diff->($res->(headers => { etag => '"a"' }), $res->()), qr/^etag: ""a"", without the module none$/,
        'differences: a header that matters');
    like($diff->($res->(headers => { 'x-diff-mine' => 1 }), $res->()), qr/^x-diff-mine/,
        'differences: X-Diff-* headers matter');
    like($diff->($res->(complete => 0, error => 'timeout'), $res->()), qr/incomplete \(timeout\)/,
        'differences: an incomplete response');
    is($diff->($res->(body => 'xyz', headers => { 'content-length' => undef }, chunked => 1),
        $res->(body => 'xyz')), '', 'differences: chunked equals a Content-Length of the same body');
    like($diff->($res->(body => 'xyz', headers => { 'content-length' => 4 }), $res->(body => 'xyz')),
        qr/^content-length/, 'differences: a Content-Length that differs');
    is($diff->($res->(body => 'x'), $res->(body => 'y'), 'HEAD'), '', 'differences: a HEAD has no body');
    my ($text, $z1, $z2) = ("same text\n" x 50);
    IO::Compress::Gzip::gzip(\$text => \$z1, Level => 1);
    IO::Compress::Gzip::gzip(\$text => \$z2, Level => 9, Minimal => 1);
    isnt($z1, $z2, 'two gzip encodings of one text differ');
    my %gz = ('content-encoding' => 'gzip', 'content-length' => undef);
    is($diff->($res->(body => $z1, headers => \%gz, chunked => 1), $res->(body => $z2, headers => \%gz,
        chunked => 1)), '', 'differences: gzip bodies compare uncompressed');
    my ($other, $z3) = ("other text\n" x 50);
    IO::Compress::Gzip::gzip(\$other => \$z3);
    like($diff->($res->(body => $z1, headers => \%gz, chunked => 1), $res->(body => $z3, headers => \%gz,
        chunked => 1)), qr/^body: 500 bytes, without the module 550/, 'differences: gzip bodies that differ');

    is(SFTest::Diff::reference_config("  a;\n    singleflight_key \$x;\n  singleflight off; # c\n b;\n"),
        "  a;\n b;\n", 'reference_config: singleflight lines dropped');
    ok(!eval { SFTest::Diff::reference_config("add_header X \$singleflight_status;\n") },
        'reference_config: a $singleflight_ variable is refused');
    ok(!eval { SFTest::Diff::reference_config("location / { singleflight sf; }\n") },
        'reference_config: a singleflight directive among others is refused');
    is(SFTest::Diff::enc('/a?b=c d'), '/a%3Fb%3Dc%20d', 'enc');

    # a response that differs from the reference: accepted if it is
    # another right answer, or a prefix of one with its connection closed
    my $whole = $res->(body => 'abcdef');
    my $cut = sub { $res->(body => $_[0], complete => 0, error => $_[1]
        // 'connection closed before the response was complete', headers => { 'content-length' => 6 }) };
    my $ok = sub { join ' ', SFTest::Diff::accepted(@_) };
    is($ok->($whole, [ $res->(body => 'xyz'), $whole ]), '1 whole', 'accepted: another right answer');
    is($ok->($cut->('abc'), [$whole]), '1 cut', 'accepted: a prefix, the connection closed');
    is($ok->($cut->(''), [$whole]), '1 cut', 'accepted: nothing of the body, the connection closed');
    like($ok->($cut->('abc', 'timeout'), [$whole]), qr/^0 .*not a closed connection/,
        'accepted: not a prefix on a connection kept open');
    like($ok->($cut->('abX'), [$whole]), qr/^0 .*not a prefix/, 'accepted: not bytes of another body');
    like($ok->($cut->('abcdefg'), [$whole]), qr/^0 .*longer/, 'accepted: not a longer body');
    like($ok->($res->(body => 'abc', headers => { 'content-length' => 3 }), [$whole]), qr/^0 /,
        'accepted: not a shorter body given as complete');
    like($ok->($cut->('abc'), [ $res->(body => 'abcdef', status => 206) ]), qr/^0 .*status/,
        'accepted: a truncation has the same status');
    is($ok->($res->(body => 'abc', headers => { 'content-length' => undef }, protocol => 'HTTP/1.1',
        status => 200), [$whole]), '1 cut', 'accepted: a prefix that ends with the connection (no length)');
    is($ok->({ complete => 0, body => '', headers => {}, error => 'curl exit 92: stream error' },
        [$whole]), '1 cut', 'accepted: an HTTP/2 stream reset before any header');
    is($ok->($res->(status => 416, body => '<html>', headers => { 'content-range' => 'bytes */9' }),
        [ $res->(status => 416, body => '', loose => 1, headers => { 'content-range' => 'bytes */9' }) ]),
        '1 loose', 'accepted: a loose answer, status and Content-Range');
    my $next = sub { SFTest::Diff::split_next($res->(body => $_[0], headers => { 'content-length' => 3 }))->{next} };
    is($next->('abc'), 'none', 'split_next: nothing after the body');
    is($next->("abcHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnext\n"), 'ok', 'split_next: the next answer');
    like($next->("abcdHTTP/1.1 200 OK\r\n\r\nnext\n"), qr/^bad: /, 'split_next: a byte past the length');

    is_deeply(SFTest::Diff::Blocks::scenario(42), SFTest::Diff::Blocks::scenario(42),
        'Blocks: one seed, one scenario');
    is_deeply(SFTest::Diff::Blocks::scenario(42, 'resume'), SFTest::Diff::Blocks::scenario(42, 'resume'),
        'Blocks: one seed, one resume scenario');
    my %names = map { SFTest::Diff::Blocks::scenario($_)->{name} => 1 } 1 .. 30;
    ok(keys %names > 5, 'Blocks: seeds make different scenarios');
}

# ------------------------------------------------------------ nginx

my $conf = $t->config_template(<<'EOT', module => 0);
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            proxy_pass http://%%ORIGIN%%;
        }
        location /two/ {
            proxy_pass http://%%ORIGIN_1%%;
        }
    }
EOT
ok(!eval { $t->write_config("%%NOPE%%\n"); 1 }, 'unknown placeholder dies');
my $text = $t->write_config($conf);
unlike($text, qr/%%/, 'placeholders expanded');
like($text, qr/proxy_temp_path\s+\Q${\ $t->testdir }\E/, 'temp paths in test dir');

my ($ok, $out) = $t->test_config;
ok($ok, 'nginx -t passes') or diag($out);

ok($t->start, 'nginx started');
ok($t->master_pid, 'master pid ' . ($t->master_pid // 'none'));
$t->wait_for(sub { $t->worker_pids == 2 }, what => 'two workers');
is(scalar(my @w = $t->worker_pids), 2, 'two workers');

$t->origin_reset;
$r = $t->get('/via-nginx?size=100');
is($r->{status}, 200, 'proxied request');
is(length $r->{body}, 100, 'proxied body');
is($t->get('/two/x')->{body}, "hit=2 uri=/two/x\n", '%%ORIGIN_1%% routes to second origin');

$t->origin_reset;
$t0 = time;
$res = $t->herd(n => 50, path => '/herd?delay=300');
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 50, 'herd via nginx: 50 x 200');
is($t->origin_hits->{total}, 50, 'herd via nginx: 50 origin hits');
ok(!grep({ !defined $_->{latency} } @$res), 'herd results carry latency');
ok(time - $t0 < 2, sprintf('herd via nginx: concurrent (%.3fs)', time - $t0));

# client abort: nginx drops the upstream connection, origin counts it
my $off = $t->log_offset;
$t->origin_reset;
$h = $t->start_request('GET', '/abort?delay=3000');
ok($t->wait_for(sub { $t->origin_hits->{total} == 1 }, what => 'request at origin'),
    'aborted request reached origin');
$t->abort_request($h);
ok($t->wait_for(sub { $t->origin_hits->{aborted} == 1 }, what => 'origin sees abort'),
    'origin saw the aborted upstream connection');
ok($t->wait_for(sub { $t->error_log_since($off) =~ /prematurely closed/ },
    what => 'abort in error.log'), 'error_log_since sees the abort');

# reload: new workers replace the old ones
my @old = $t->worker_pids;
ok($t->reload, 'reload');
# reload() returns once no old worker is listed; the second new one may
# still be starting (nginx itself under ASan)
$t->wait_for(sub { $t->worker_pids == 2 }, what => 'both new workers');
my @new = $t->worker_pids;
ok(@new == 2 && !grep({ my $n = $_; grep { $_ == $n } @old } @new), 'workers replaced');
is($t->get('/after-reload')->{status}, 200, 'serving after reload');

# a rejected config: nginx -t names the directive, reload reports failure
$t->write_config($conf =~ s/^http \{/http {\n    bogus_directive on;/mr);
($ok, $out) = $t->test_config;
ok(!$ok, 'bad config fails nginx -t');
like($out, qr/bogus_directive/, 'nginx -t names the directive');
$t->allow_log(qr/unknown directive "bogus_directive"/);
ok(!$t->reload(timeout => 5), 'reload with bad config is reported as failed');
is_deeply([ $t->worker_pids ], \@new, 'old workers keep running');
is($t->get('/still')->{status}, 200, 'still serving');

# stop leaves nothing behind
my $master = $t->master_pid;
ok($t->stop, 'graceful stop');
ok(!kill(0, $master) || !SFTest::_alive($master), 'master gone');
ok(!$t->worker_pids, 'no workers left');

done_testing;
