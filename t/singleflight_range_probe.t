#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A bounded Range ("bytes=0-99", "bytes=0-0": every range with its last
# byte) is a flight of that Range, as a far one is: the fetch sends it,
# the origin sends those bytes, and requests with the same Range at once
# share that answer.  Video players and download managers send such
# probes to large files.  In the whole response's flight a probe was
# answered early, but the fetch, a background subrequest of the probe's
# request, asked the origin for everything and ran to its end although
# nobody read past the probe's bytes, holding the probe's keep-alive
# connection all that time.
#
# Where the location has a cache, which itself asks the origin for the
# whole response and holds the request until it is in, a bounded Range
# still joins the whole response's flight, as with
# singleflight_max_range_offset off.  Open-ended ranges ("bytes=0-")
# within the offset join it everywhere.  A reader of one range cut from
# the whole response's flight is done at its last byte, which nginx's
# range filter sends as the response's last: its connection goes on at
# once, and a fetch nobody reads any more stops.  Not the leader where
# the response is being cached (nginx goes on with such an upstream
# request whoever reads it): it reads it to the end, so that the flight
# stays there for those who come.
#
# Each answer is compared with plain nginx's (a server without the module,
# same locations); what reached the origin, and what it sent, is seen in a
# hop server's log ($http_range, $body_bytes_sent), each line marked with
# the server it came from.

use strict;
use warnings;

use Test::More;
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# the same locations in both servers; $cache: the cache zone of /c/
sub locations {
    my ($cache) = @_;
    return <<"EOT";
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

        location /c/ {
            proxy_pass http://127.0.0.1:%%PORT_1%%;
            proxy_cache $cache;
            proxy_cache_valid 200 1m;
        }

        location /uoff/ {
            singleflight_max_range_offset off;
            proxy_buffering off;
            proxy_pass http://127.0.0.1:%%PORT_1%%;
        }
EOT
}

my ($sf_locations, $plain_locations) = (locations('one'), locations('two'));

$t->write_config($t->config_template(<<"EOT", log_singleflight => 1));
    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    proxy_cache_path %%TESTDIR%%/cache1 keys_zone=one:1m;
    proxy_cache_path %%TESTDIR%%/cache2 keys_zone=two:1m;
    log_format hop '\$http_x_who \$request_uri range=[\$http_range] '
                   '\$status \$body_bytes_sent';

    # the hop: what the origin was asked, and what it sent
    server {
        listen 127.0.0.1:%%PORT_1%%;
        access_log %%TESTDIR%%/hop.log hop;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }
    }

    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_3%% http2;
        singleflight sf;
        proxy_set_header X-Who sf;
$sf_locations
        location = /stats {
            singleflight_stats;
        }
    }

    # plain nginx, for the answers
    server {
        listen 127.0.0.1:%%PORT_2%%;
        access_log %%TESTDIR%%/plain.log;
        proxy_set_header X-Who plain;
$plain_locations
    }
EOT

$t->start;

my $port2 = $t->port(2);

# A large response the origin takes a while to send: 4 MiB, 512 KiB at a
# time, the first with the header, the next ones 400 ms apart (2.8 s).
my $BIG = 4 * 1024 * 1024;
my $SLOW = "fixed=1&ranges=1&size=$BIG&pace=524288:400&hdr=ETag:%22b1%22";
my $DOWNLOAD = 2.8;

# A smaller one whose header takes 300 ms: requests started together
# gather in one flight.
my $SIZE = 100000;
my $HERD = "fixed=1&ranges=1&size=$SIZE&delay=300&hdr=ETag:%22s1%22";

# Within this a request on a keep-alive connection whose previous one was
# answered is "at once" (without the module it takes milliseconds).
my $PROMPT = 1.5;

# ------------------------------------------------------------ helpers

# A keep-alive connection to $port.
sub ka_open {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
        Proto => 'tcp', Timeout => 5) or die "connect: $!";
    binmode $s;
    return { sock => $s, buf => '' };
}

# A request on it ($close: the last one), with headers (Name => value, ...).
sub ka_send {
    my ($c, $close, $uri, @h) = @_;
    my $text = "GET $uri HTTP/1.1\r\nHost: localhost\r\n"
        . join('', map { "$h[2 * $_]: $h[2 * $_ + 1]\r\n" } 0 .. @h / 2 - 1)
        . ($close ? "Connection: close\r\n" : '') . "\r\n";
    $c->{t0} = time;
    syswrite($c->{sock}, $text) == length $text or die "write: $!";
}

# Its answer: {status, headers, body, time (from its request to its last
# byte)} or {error}.
sub ka_read {
    my ($c) = @_;
    my $r = conn_read($c, 10);
    $r->{time} = time - $c->{t0};
    return $r;
}

# Requests ([uri, headers...]) on one keep-alive connection to $port,
# each sent once the answer to the one before is in; their answers.
sub keepalive {
    my ($port, @requests) = @_;
    my $c = ka_open($port);
    my @res;
    for my $i (0 .. $#requests) {
        ka_send($c, $i == $#requests, @{ $requests[$i] });
        push @res, ka_read($c);
        last if $res[-1]{error};
    }
    close $c->{sock};
    return @res;
}

# One response off a connection, with a Content-Length (all of these
# have one).
sub conn_read {
    my ($c, $timeout) = @_;
    my $deadline = time + $timeout;
    my $sel = IO::Select->new($c->{sock});
    while (1) {
        my $end = index($c->{buf}, "\r\n\r\n");
        if ($end >= 0) {
            my ($line, @lines) = split /\r\n/, substr($c->{buf}, 0, $end);
            my ($status) = $line =~ m{^HTTP/1\.1 (\d{3})};
            my %h = map { /^([^:]+):\s*(.*)$/ ? (lc $1 => $2) : () } @lines;
            my $len = $h{'content-length'} // 0;
            if (length($c->{buf}) >= $end + 4 + $len) {
                my $body = substr($c->{buf}, $end + 4, $len);
                substr($c->{buf}, 0, $end + 4 + $len, '');
                return { status => $status, headers => \%h, body => $body };
            }
        }
        my $left = $deadline - time;
        return { error => 'timeout' } if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($c->{sock}, $c->{buf}, 65536, length $c->{buf});
        return { error => 'closed' } unless $n;
    }
}

# What a client is told, to compare with plain nginx's answer (an answer of
# keepalive() or of the harness's client).
sub answer {
    my ($r) = @_;
    return $r->{error} if $r->{error};
    my $h = $r->{headers};
    return join(' ', $r->{status} // 'none',
                map({ "$_=" . ($h->{$_} // '-') }
                    qw(content-range content-length etag accept-ranges content-type)),
                length($r->{body} // ''), $r->{body} // '');
}

# The hop's log lines of $uri from $who (sf or plain), once there are $n:
# "range status bytes" each, the Range the origin was asked ("" for none).
sub hop {
    my ($who, $uri, $n) = @_;
    my @l;
    $t->wait_for(sub {
        @l = map { /^\S+ \S+ range=\[(.*)\] (\d+) (\d+)$/ ? ($1 eq '-' ? '' : $1) . " $2 $3" : '?' }
            grep { /^\Q$who $uri\E range=/ } split /\n/, $t->read_file('hop.log');
        @l >= $n;
    }, what => "$n hop lines for $who $uri");
    return @l;
}

# The $singleflight_status of the first $n requests for $uri, tallied.
sub statuses {
    my ($uri, $n) = @_;
    my %c = %{ SFTest::tally(($t->sf_statuses($uri, $n))[0 .. $n - 1]) };
    return join(' ', map { "$_:$c{$_}" } sort keys %c);
}

# $n requests for $uri with these Range values, started together, and
# each as plain nginx answers it.
sub herd {
    my ($uri, @ranges) = @_;
    my @h = map { $t->start_request('GET', $uri, headers => [ Range => $_ ]) } @ranges;
    my @res = map { $t->finish_request($_) } @h;
    my %plain;
    for my $range (@ranges) {
        $plain{$range} //= $t->get($uri, headers => [ Range => $range ], port => $port2);
    }
    my @same = grep { answer($res[$_]) eq answer($plain{ $ranges[$_] }) } 0 .. $#ranges;
    return (\@res, scalar @same);
}

# ------------------------------------------------------------ a probe

# A probe and then another request on one keep-alive connection: the
# origin is asked for the probe's bytes and sends them alone, and the
# next request is answered at once, as without the module.
{
    my $uri = "/ka/big?$SLOW";
    my @sf = keepalive($t->port(0), [ $uri, Range => 'bytes=0-99' ], [ '/ka/small?size=10' ]);
    my @plain = keepalive($port2, [ $uri, Range => 'bytes=0-99' ], [ '/ka/small?size=10' ]);
    is(answer($sf[0]), answer($plain[0]), "a probe: plain nginx's answer");
    is(($sf[0]{status} // 'none') . ' ' . ($sf[0]{headers}{'content-range'} // '-'),
       "206 bytes 0-99/$BIG", 'a probe: its 100 bytes');
    ok(defined $sf[1]{status} && $sf[1]{time} < $PROMPT,
       sprintf('a probe: the next request on its connection answered at once (%.2f s, '
               . 'plain nginx %.2f s)', $sf[1]{time} // -1, $plain[1]{time} // -1));
    is_deeply([ hop('sf', $uri, 1) ], [ 'bytes=0-99 206 100' ],
              'a probe: the origin was asked for its Range and sent 100 bytes');
    is_deeply([ hop('plain', $uri, 1) ], [ 'bytes=0-99 206 100' ], 'a probe: as plain nginx asks');
    is(statuses($uri, 1), 'LEADER:1', 'a probe: a flight of its Range');
}

# ------------------------------------------------------------ herds

# The same probe from many clients at once: one origin request for its
# bytes, every client plain nginx's answer.
{
    my $uri = "/d/same?$HERD";
    $t->origin_reset;
    my ($res, $same) = herd($uri, ('bytes=0-99') x 10);
    is($same, 10, "identical probes: plain nginx's answer, each of 10");
    is(join(' ', map { $_->{status} // 'none' } @$res), join(' ', ('206') x 10),
       'identical probes: 206 each');
    is($t->origin_uri_hits($uri), 2, "identical probes: one origin request (and plain's)");
    is_deeply([ hop('sf', $uri, 1) ], [ 'bytes=0-99 206 100' ],
              'identical probes: the origin was asked for their Range');
    is(statuses($uri, 10), 'FOLLOWER:9 LEADER:1', 'identical probes: a leader, 9 followers');
}

# Different probes at once: a flight each, one origin request per
# Range, each client its own bytes.  With an offset, a bounded range
# within it too, one range or several.
for my $c ([ 'd', 'bytes=0-99', 'bytes=0-99', 'bytes=0-0', 'bytes=0-0', 'bytes=0-1',
             'bytes=0-9999', 'bytes=0-999999' ],
           [ 'k', 'bytes=5000-5099', 'bytes=5000-5099', 'bytes=0-9,20-29', 'bytes=0-9,20-29',
             'bytes=10 - 19' ]) {
    my ($where, @ranges) = @$c;
    my $uri = "/$where/different?$HERD";
    $t->origin_reset;
    my ($res, $same) = herd($uri, @ranges);
    my %distinct = map { $_ => 1 } @ranges;
    my $n = keys %distinct;
    is($same, scalar @ranges, "/$where/ different probes: plain nginx's answer, each of "
       . @ranges);
    is($t->origin_uri_hits($uri), $n + $n,
       "/$where/ different probes: one origin request per Range (and plain's)");
    is_deeply([ sort map { (split / \d+ \d+$/)[0] } hop('sf', $uri, $n) ], [ sort keys %distinct ],
              "/$where/ different probes: each flight asked for its Range");
}

# Several ranges, one of them open-ended, of a response that arrives in
# pieces: within the offset the origin's to answer, as without the module;
# in the whole response's flight (a cache's, or with "off") nginx's answer
# to several ranges of a response still coming in: all of it, as nginx's
# cache gives while it fills.  Never nginx's "range in overlapped buffers"
# alert and an empty answer.
for my $c ([ 'k', 'bytes=0-9,20-' ], [ 'c', 'bytes=0-9,20-29' ], [ 'off', 'bytes=0-9,20-' ]) {
    my ($where, $range) = @$c;
    my $uri = "/$where/multi?fixed=1&ranges=1&size=300000&pace=65536:100";
    my ($res, $same) = herd($uri, ($range) x 3);
    is($same, 3, "/$where/ $range, in pieces: plain nginx's answer, each of 3")
        or diag(substr(answer($res->[0]), 0, 300));
    is(scalar(grep { $_->{complete} } @$res), 3, "/$where/ $range, in pieces: complete");
}

# "bytes=0-": the whole response from the first byte, one flight of it.
{
    my $uri = "/d/open?$HERD";
    $t->origin_reset;
    my ($res, $same) = herd($uri, ('bytes=0-') x 5);
    is($same, 5, "bytes=0-: plain nginx's answer, each of 5");
    is($t->origin_uri_hits($uri), 1 + 1, "bytes=0-: one origin request (and plain's)");
    is_deeply([ hop('sf', $uri, 1) ], [ " 200 $SIZE" ], 'bytes=0-: the whole response fetched');
    is(statuses($uri, 5), 'FOLLOWER:4 LEADER:1', 'bytes=0-: a leader, 4 followers');
}

# singleflight_max_range_offset off: every range in the whole response's
# flight, as before.
{
    my $uri = "/off/herd?$HERD";
    $t->origin_reset;
    my ($res, $same) = herd($uri, ('bytes=0-99') x 3, 'bytes=0-0');
    is($same, 4, "off: plain nginx's answer, each of 4");
    is($t->origin_uri_hits($uri), 1 + 2, 'off: one origin request (and plain\'s, one per Range)');
    is_deeply([ hop('sf', $uri, 1) ], [ " 200 $SIZE" ], 'off: the whole response fetched');
}

# A cache in the location: it asks the origin for the whole response, with
# the module or without (its own Range is never sent); one flight of it.
{
    my $uri = "/c/herd?$HERD";
    $t->origin_reset;
    my ($res, $same) = herd($uri, ('bytes=0-99') x 4, 'bytes=0-0');
    is($same, 5, "cache: plain nginx's answer, each of 5");
    is_deeply([ hop('sf', $uri, 1) ], [ " 200 $SIZE" ],
              'cache: one origin request, for the whole response');
    is((hop('plain', $uri, 1))[0], " 200 $SIZE", 'cache: as plain nginx fetches it');
    is(statuses($uri, 5), 'FOLLOWER:4 LEADER:1', 'cache: a leader, 4 followers');
}

# A bounded Range with If-Range, in a HEAD, or with a second Range header:
# the answer depends on what each client holds, or the key and the fetch
# would have only the first Range: upstream on its own (BYPASS), as a far
# one.
for my $c ([ 'ifrange', 'GET', [ 'If-Range' => '"s1"' ] ], [ 'head', 'HEAD', [] ],
           [ 'two', 'GET', [ Range => 'bytes=0-9' ] ]) {
    my ($name, $method, $h) = @$c;
    my $uri = "/d/$name?$HERD";
    $t->origin_reset;
    my @h = map { $t->start_request($method, $uri, headers => [ Range => 'bytes=0-99', @$h ]) }
        1 .. 3;
    my @res = map { $t->finish_request($_) } @h;
    my $plain = $t->http($method, $uri, headers => [ Range => 'bytes=0-99', @$h ],
                         port => $port2);
    is(scalar(grep { answer($_) eq answer($plain) } @res), 3,
       "bounded range, $name: plain nginx's answer, each of 3");
    is($t->origin_uri_hits($uri), 4, "bounded range, $name: each its own (and plain's)");
    my @st;
    $t->wait_for(sub {
        @st = map { /sf=(\S*)/ } grep { /"$method \Q$uri\E HTTP/ }
            split /\n/, $t->read_file('access.log');
        @st >= 3;
    }, what => "3 access log lines for $uri");
    is(join(',', @st[0 .. 2]), 'BYPASS,BYPASS,BYPASS', "bounded range, $name: BYPASS");
}

# ------------------------------------------------------------ done early

# singleflight_max_range_offset off: a probe in the whole response's
# flight.  Its answer is complete at its last byte: its request stops
# reading the flight, and the fetch, which nobody reads any more, stops
# (as when the client goes): the next request on the connection is
# answered at once.
{
    my $uri = "/off/ka?$SLOW";
    my $abandoned = $t->zone_stats->{abandoned} // 0;
    my @sf = keepalive($t->port(0), [ $uri, Range => 'bytes=0-99' ], [ '/off/small?size=10' ]);
    my @plain = keepalive($port2, [ $uri, Range => 'bytes=0-99' ], [ '/off/small?size=10' ]);
    is(answer($sf[0]), answer($plain[0]), "off, a probe: plain nginx's answer");
    ok(defined $sf[1]{status} && $sf[1]{time} < $PROMPT,
       sprintf('off, a probe: the next request on its connection answered at once (%.2f s)',
               $sf[1]{time} // -1));
    my ($line) = hop('sf', $uri, 1);
    my ($range, $status, $sent) = split / /, $line;
    is("$range $status", ' 200', 'off, a probe: the whole response asked for');
    ok($sent < $BIG, "off, a probe: not all of it sent ($sent bytes): the fetch stopped");
    ok($t->wait_zone(sub { ($_[0]{abandoned} // 0) > $abandoned }, timeout => 5),
       'off, a probe: counted in abandoned');
}

# proxy_buffering off, offset off: a lone probe's response (unstored, a
# lone leader's) goes to it in the upstream's buffers as they come, and
# nginx's range filter marks the range's last byte as the response's last
# on the buffer itself, which the upstream then reuses for the next bytes.
# That mark, read as the body's end short of its length, broke the fetch
# off ("the body ends at byte 3914, before its Content-Length of 30000
# bytes") and closed the connection of a client whose answer was
# complete: its next request went unanswered.  Now the probe's answer
# ends there and the rest is read for nobody; the next request is
# answered, as without the module.
{
    my $uri = '/uoff/lone?fixed=1&ranges=1&size=30000&pace=4096:30&hdr=ETag:%22u1%22';
    my $off = $t->log_offset;
    my @sf = keepalive($t->port(0), [ $uri, Range => 'bytes=0-99' ], [ '/uoff/small?size=10' ]);
    my @plain = keepalive($port2, [ $uri, Range => 'bytes=0-99' ], [ '/uoff/small?size=10' ]);
    is(answer($sf[0]), answer($plain[0]), "proxy_buffering off, a lone probe: plain nginx's answer");
    is($sf[1]{status} // $sf[1]{error}, 200,
       'proxy_buffering off, a lone probe: the next request on its connection answered');
    is($t->log_count(qr/\[error\]/, $off), 0, 'proxy_buffering off, a lone probe: no error');
    is(statuses($uri, 1), 'LEADER:1', 'proxy_buffering off, a lone probe: its leader');
}

# A probe following a whole response's flight: done at its last byte,
# its connection goes on at once; the fetch goes on for the leader.
{
    my $uri = "/off/follow?$SLOW";
    $t->origin_reset;
    my $lead = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => 'the flight');
    my @sf = keepalive($t->port(0), [ $uri, Range => 'bytes=0-99' ], [ '/off/small?size=10' ]);
    my $full = $t->finish_request($lead);
    is(($sf[0]{status} // 'none') . ' ' . length($sf[0]{body} // ''), '206 100',
       'a probe following: its 100 bytes');
    is($sf[0]{body}, substr(SFTest::origin_body(0, $uri, $BIG), 0, 100),
       'a probe following: the bytes of the response');
    ok(defined $sf[1]{status} && $sf[1]{time} < $PROMPT,
       sprintf('a probe following: the next request on its connection answered at once '
               . '(%.2f s)', $sf[1]{time} // -1));
    ok($full->{complete} && $full->{body} eq SFTest::origin_body(0, $uri, $BIG),
       'a probe following: the leader has the whole response');
    is($t->origin_uri_hits($uri), 1, 'a probe following: one origin request');
    is(statuses($uri, 2), 'FOLLOWER:1 LEADER:1', 'a probe following: it followed');
}

# The same over HTTP/2: the stream ends at the probe's last byte.
SKIP: {
    skip 'no curl', 3 unless grep { -x "$_/curl" } split /:/, $ENV{PATH} // '';
    my $uri = "/off/follow2?$SLOW";
    $t->origin_reset;
    my $lead = $t->start_request('GET', $uri, h2 => 1, port => $t->port(3));
    $t->wait_for(sub { $t->origin_uri_hits($uri) >= 1 }, what => 'the flight');
    my $probe = $t->get($uri, headers => [ Range => 'bytes=0-99' ], h2 => 1, port => $t->port(3));
    my $full = $t->finish_request($lead);
    is(($probe->{status} // 'none') . ' ' . ($probe->{body} // ''),
       '206 ' . substr(SFTest::origin_body(0, $uri, $BIG), 0, 100),
       'HTTP/2, a probe following: its 100 bytes');
    ok($full->{complete} && $full->{body} eq SFTest::origin_body(0, $uri, $BIG),
       'HTTP/2, a probe following: the leader has the whole response');
    is($t->origin_uri_hits($uri), 1, 'HTTP/2, a probe following: one origin request');
}

# A cache in the location: the response is being cached, and nginx goes
# on with that upstream request, its client's answer complete or not:
# the probe's connection waits for it, with the module or without; and
# its flight stays there, shared by a probe that comes during it.
{
    my $uri = "/c/ka?$SLOW";
    my %next;
    for my $port ($t->port(0), $port2) {
        $t->origin_reset;
        my $c = ka_open($port);
        ka_send($c, 0, $uri, Range => 'bytes=0-99');
        my $probe = ka_read($c);
        ka_send($c, 1, '/c/small?size=10');
        sleep 0.5;
        my $late = $t->get($uri, headers => [ Range => 'bytes=0-0' ], port => $port);
        $next{$port} = ka_read($c);
        close $c->{sock};
        my $who = $port == $port2 ? 'plain' : 'sf';
        is(($probe->{status} // 'none') . ' ' . ($probe->{headers}{'content-range'} // '-'),
           "206 bytes 0-99/$BIG", "cache, $who: the probe's 100 bytes");
        is(($late->{status} // 'none') . ' ' . ($late->{body} // ''),
           '206 ' . substr(SFTest::origin_body(0, $uri, $BIG), 0, 1),
           "cache, $who: a probe during the download, its byte");
        ok(defined $next{$port}{status} && $next{$port}{time} > $DOWNLOAD - 1.3,
           sprintf("cache, $who: the next request waits for the download (%.2f s)",
                   $next{$port}{time} // -1));
        is_deeply([ hop($who, $uri, 1) ], [ " 200 $BIG" ],
                  "cache, $who: the whole response fetched, once");
    }
    is(statuses($uri, 2), 'FOLLOWER:1 LEADER:1', 'cache: the probe during the download followed');
}

$t->zone_baseline_ok('the zone back to its baseline');

done_testing();
