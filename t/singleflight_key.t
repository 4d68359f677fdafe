#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_key: which requests share a flight.  The module always
# tells apart the requests its content handler would send differently
# (location, server, port, the URI with its arguments); singleflight_key
# adds to that, it cannot merge different URIs.  Requests are collapsed
# exactly when all of it is byte-for-byte equal: distinct keys never share,
# not even when the hashes of their singleflight_key values collide (the
# zone orders flights by that hash alone, so that every URI of a host has
# the same one with the default key), and keys of any length and any bytes
# work.  $singleflight_key shows the evaluated singleflight_key value.  The
# default, $scheme$host, made without nginx's script engine, is what those
# variables say: Host lowercased, an absolute request line's host, the
# server's name without either, "https" over TLS.

use strict;
use warnings;

use Test::More;
use JSON::PP;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# a TLS server with the default key, where openssl and curl are there
my $tls = -x '/usr/bin/curl' && $t->tls_certificate;
my $tls_server = !$tls ? '' : <<'EOT';
    server {
        listen 127.0.0.1:%%PORT_1%% ssl;
        ssl_certificate %%TESTDIR%%/cert.pem;
        ssl_certificate_key %%TESTDIR%%/key.pem;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->write_config($t->config_template(<<"EOT"));
    log_format sfkey escape=json
        '{"pid":"\$pid","status":"\$singleflight_status",'
        '"uri":"\$request_uri","xk":"\$http_x_k","key":"\$singleflight_key"}';
    access_log %%TESTDIR%%/sf.log sfkey;

    large_client_header_buffers 4 16k;

    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /k {
            singleflight sf;
            singleflight_key \$uri;
            proxy_pass http://%%ORIGIN%%;
        }

        location /coll {
            singleflight sf;
            singleflight_key \$http_x_k;
            proxy_pass http://%%ORIGIN%%;
        }

        location /raw/ {
            singleflight sf;
            singleflight_key \$uri;
            proxy_pass http://%%ORIGIN%%;
        }
    }

$tls_server
EOT

$t->start;

# ------------------------------------------------------------ helpers

# The access log entries, decoded: [{pid, status, uri, key}, ...].  Without
# ->utf8, JSON::PP maps each byte nginx wrote raw to the same code point,
# so keys compare byte for byte.
sub log_entries {
    my $json = JSON::PP->new;
    return map { $json->decode($_) } split /\n/, $t->read_file('sf.log');
}

sub wait_logged {
    my ($n) = @_;
    $t->wait_for(sub { log_entries() >= $n }, what => "$n access log lines");
    return log_entries();
}

# Checks that @$res are $count complete 200 responses all carrying one and
# the same origin response (hit H of $uri); returns H.
sub one_response {
    my ($name, $res, $uri, $count) = @_;
    my %hits = map { ($_->{headers}{'x-hit'} // 'none') => 1 } @$res;
    my ($hit) = keys %hits;

    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res),
       $count, "$name: $count complete 200 responses");
    is(join(',', sort keys %hits), $hit // 'none', "$name: one origin response");
    is(scalar(grep { $_->{body} eq SFTest::origin_body($hit // 0, $uri) } @$res),
       $count, "$name: every body is that response");

    return $hit // 0;
}

# Runs one herd of @paths at once; returns the responses grouped by the
# path each client asked for: { path => [ responses ] }.
sub herd_by_path {
    my (@paths) = @_;
    my $res = $t->herd(paths => \@paths);
    my %by;
    push @{ $by{ $paths[$_] } }, $res->[$_] for 0 .. $#paths;
    return \%by;
}

# Runs, all at once, $n requests of $uri for each value of the X-K
# header in @values, interleaved; returns the responses grouped by value:
# { value => [ responses ] }.
sub herd_by_header {
    my ($uri, $n, @values) = @_;
    my @req = map { my $v = $_; map { [ $v, $t->start_request('GET', $uri,
        headers => { 'X-K' => $v }) ] } 1 .. $n } @values;
    @req = map { my $i = $_; map { $req[ $i + $_ * $n ] } 0 .. $#values } 0 .. $n - 1;
    $t->poll_all([ map { $_->[1] } @req ]);
    my %by;
    push @{ $by{ $_->[0] } }, $_->[1]{res} for @req;
    return \%by;
}

my $n = 0;          # requests sent so far, to wait for their log lines
my $flights = 0;    # flights started so far: one LEADER each

# ------------------------------------------------------------ distinct URIs

# two herds at once, interleaved: one flight per URI

my ($ua, $ub) = ('/a?delay=500', '/b?delay=500');
my $by = herd_by_path(map { ($ua, $ub) } 1 .. 20);
$n += 40;

my $hits = $t->origin_hits;
is($hits->{total}, 2, 'distinct URIs: 2 origin requests');
is($hits->{uris}{$ua}, 1, 'distinct URIs: one for /a');
is($hits->{uris}{$ub}, 1, 'distinct URIs: one for /b');

my $ha = one_response('/a herd', $by->{$ua}, $ua, 20);
my $hb = one_response('/b herd', $by->{$ub}, $ub, 20);
is(join(',', sort($ha, $hb)), '1,2', 'distinct URIs: each herd got its own response');
$flights += 2;

# ------------------------------------------------------------ hash collision

# Two singleflight_key values (X-K, one URI) with the same 32-bit
# MurmurHash2, the hash the module orders flights by: still two flights.

sub murmur2 {
    my ($data) = @_;
    my $m = 0x5bd1e995;
    my $len = length $data;
    my $h = $len & 0xffffffff;
    my $i = 0;

    for (; $len - $i >= 4; $i += 4) {
        my $k = unpack('V', substr($data, $i, 4));
        $k = ($k * $m) & 0xffffffff;
        $k ^= $k >> 24;
        $k = ($k * $m) & 0xffffffff;
        $h = ($h * $m) & 0xffffffff;
        $h ^= $k;
    }

    my @tail = unpack('C*', substr($data, $i));
    if (@tail) {
        $h ^= $tail[2] << 16 if @tail > 2;
        $h ^= $tail[1] << 8 if @tail > 1;
        $h ^= $tail[0];
        $h = ($h * $m) & 0xffffffff;
    }

    $h ^= $h >> 13;
    $h = ($h * $m) & 0xffffffff;
    $h ^= $h >> 15;

    return $h;
}

my $uc = '/coll?delay=600';
my ($vc1, $vc2) = ('v-0007f1a4', 'v-00112c80');
is(murmur2($vc1), murmur2($vc2), 'collision: the two values have the same hash');

$t->origin_reset;
$by = herd_by_header($uc, 10, $vc1, $vc2);
$n += 20;
$flights += 2;

is($t->origin_uri_hits($uc), 2, 'collision: 2 origin requests');
my $hc1 = one_response('collision, first', $by->{$vc1}, $uc, 10);
my $hc2 = one_response('collision, second', $by->{$vc2}, $uc, 10);
is(join(',', sort($hc1, $hc2)), '1,2', 'collision: each value got its own response');

# ------------------------------------------------------------ custom key

# singleflight_key $uri leaves the arguments out of the key, but they are
# part of the upstream request: /k?x=1 and /k?x=2 are still two flights,
# each collapsed on its own

$t->origin_reset;
my ($uk1, $uk2) = ('/k?delay=500&x=1', '/k?delay=500&x=2');
$by = herd_by_path(map { ($uk1, $uk2) } 1 .. 10);
$n += 20;
$flights += 2;

$hits = $t->origin_hits;
is($hits->{total}, 2, 'key $uri: /k?x=1 and /k?x=2 are 2 origin requests');
is(($hits->{uris}{$uk1} // 0) . '+' . ($hits->{uris}{$uk2} // 0), '1+1', 'key $uri: one each');
my $hk1 = one_response('key $uri, x=1', $by->{$uk1}, $uk1, 10);
my $hk2 = one_response('key $uri, x=2', $by->{$uk2}, $uk2, 10);
is(join(',', sort($hk1, $hk2)), '1,2', 'key $uri: each URI got its own response');

# the same URIs with the default key: two flights

$t->origin_reset;
my ($ud1, $ud2) = ('/d?delay=500&x=1', '/d?delay=500&x=2');
my $res = $t->herd(paths => [ map { ($ud1, $ud2) } 1 .. 10 ]);
$n += 20;

$hits = $t->origin_hits;
is($hits->{total}, 2, 'default key: /d?x=1 and /d?x=2 are 2 origin requests');
is($hits->{uris}{$ud1} . '+' . $hits->{uris}{$ud2}, '1+1', 'default key: one each');
$flights += 2;

# ------------------------------------------------------------ long key

# 6000 bytes of query; the two URIs differ in their last bytes only: the
# whole URI is compared

my $pad = join('', map { sprintf '%05d.', $_ } 1 .. 1000);
my $ul1 = "/long?delay=500&pad=$pad&nnn=000b9806";
my $ul2 = "/long?delay=500&pad=$pad&nnn=000e7d00";

$t->origin_reset;
$res = $t->herd(paths => [ ($ul1) x 20 ]);
$n += 20;
$flights += 1;

is($t->origin_hits->{total}, 1, 'long key: 20 requests, 1 origin request');
one_response('long key', $res, $ul1, 20);

$t->origin_reset;
$by = herd_by_path(map { ($ul1, $ul2) } 1 .. 10);
$n += 20;
$flights += 2;

$hits = $t->origin_hits;
is($hits->{total}, 2, 'long keys differing at the end: 2 origin requests');
one_response('long key 1', $by->{$ul1}, $ul1, 10);
one_response('long key 2', $by->{$ul2}, $ul2, 10);

# two 6000-byte singleflight_key values (X-K, one URI) that differ in
# their last bytes only and have the same hash: the whole value is compared

my ($vl1, $vl2) = ("$pad-00003dcf", "$pad-0002cd08");
is(murmur2($vl1), murmur2($vl2), 'long values: the two values have the same hash');

$t->origin_reset;
$by = herd_by_header($uc, 10, $vl1, $vl2);
$n += 20;
$flights += 2;

is($t->origin_uri_hits($uc), 2, 'long values differing at the end: 2 origin requests');
my $hv1 = one_response('long value 1', $by->{$vl1}, $uc, 10);
my $hv2 = one_response('long value 2', $by->{$vl2}, $uc, 10);
is(join(',', sort($hv1, $hv2)), '1,2', 'long values: each value got its own response');

# ------------------------------------------------------------ any bytes

# every byte percent-encoded in the query: the key holds the escapes

my $all = join('', map { sprintf '%%%02X', $_ } 0 .. 255);
my $ubytes = "/bytes?delay=500&q=$all";

$t->origin_reset;
$res = $t->herd(paths => [ ($ubytes) x 20 ]);
$n += 20;

is($t->origin_hits->{total}, 1, 'percent-encoded bytes: 1 origin request');
$flights += 1;
one_response('percent-encoded bytes', $res, $ubytes, 20);

# singleflight_key $uri of a path with %01-%FF: the key holds the decoded
# bytes themselves (nginx refuses %00 in a path); keys that differ in one
# byte only are not collapsed

my $raw = join('', map { sprintf '%%%02X', $_ } 1 .. 255);
my $ur1 = "/raw/$raw?delay=500";
my $ur2 = "/raw/$raw%FF?delay=500";
my $ur3 = "/raw/$raw%FE?delay=500";

$t->origin_reset;
$by = herd_by_path(map { ($ur1, $ur2, $ur3) } 1 .. 10);
$n += 30;

$flights += 3;

$hits = $t->origin_hits;
is($hits->{total}, 3, 'raw bytes: 3 keys, 3 origin requests');
is(join('+', map { $hits->{uris}{$_} // 0 } $ur1, $ur2, $ur3), '1+1+1',
   'raw bytes: one request per key');
one_response('raw bytes, key 1', $by->{$ur1}, $ur1, 10);
one_response('raw bytes, key 2', $by->{$ur2}, $ur2, 10);
one_response('raw bytes, key 3', $by->{$ur3}, $ur3, 10);

# ------------------------------------------------------------ $singleflight_key

my @log = wait_logged($n);
is(scalar @log, $n, "log: $n lines");

# the singleflight_key value alone: $scheme$host by default, whatever the
# URI; the X-K header in /coll

my %want;      # request URI => expected key
$want{$_} = 'httplocalhost' for $ua, $ub, $ud1, $ud2, $ul1, $ul2, $ubytes;
$want{$_} = '/k' for $uk1, $uk2;
$want{$ur1} = '/raw/' . join('', map { chr } 1 .. 255);
$want{$ur2} = $want{$ur1} . "\xff";
$want{$ur3} = $want{$ur1} . "\xfe";

my @wrong = grep { $_->{key} ne ($_->{uri} eq $uc ? $_->{xk} : $want{ $_->{uri} } // "\0") } @log;
is(scalar @wrong, 0, '$singleflight_key is the evaluated key on every line')
    or diag(explain([ map { [ substr($_->{uri}, 0, 60), substr($_->{key}, 0, 60) ] }
                      @wrong[0 .. ($#wrong < 4 ? $#wrong : 4)] ]));

my %st;
$st{ $_->{status} }++ for @log;
is($st{LEADER}, $flights, "log: one LEADER per flight, $flights");
is($st{FOLLOWER}, $n - $st{LEADER}, 'log: every other request a FOLLOWER');

# ------------------------------------------------------------ the default key's host

# The default key, $scheme$host, is made without nginx's script engine
# (src/ngx_http_singleflight_key.c); it must be what those variables say:
# the Host header as nginx keeps it (lowercased), the host of an absolute
# request line before it, or the server's name when there is neither.  A
# herd on one URI under three hosts: one flight per host.

my $uh = '/host?delay=400';
my @hreq = (
    (map { [ 'GET', $uh, headers => { Host => 'A.Example' } ] } 1 .. 3),
    (map { [ 'GET', $uh, headers => { Host => 'a.example' } ] } 1 .. 3),
    (map { [ 'GET', $uh, headers => { Host => 'b.example' } ] } 1 .. 3),
    (map { [ 'GET', "http://c.example$uh", headers => { Host => 'a.example' } ] } 1 .. 3),
);
my @hh = map { $t->start_request(@$_) } @hreq;
my @hres = map { $t->finish_request($_) } @hh;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @hres), 12,
   'default key, three hosts: 12 answers');
is($t->origin_uri_hits($uh), 3, 'default key, three hosts: 3 origin requests');
my %hx;
$hx{ $_->{headers}{'x-hit'} // '' }++ for @hres[0 .. 5];
is(scalar(keys %hx), 1, 'default key: Host A.Example and a.example share a flight');

# HTTP/1.0 without Host: the server's name ("" here), the key "http"
my $u10 = '/host10?x=1';
my $r10 = $t->get($u10, raw => "GET $u10 HTTP/1.0\r\n\r\n");
is($r10->{status}, 200, 'default key, no Host: 200');
my @keys;
$t->wait_for(sub {
    @keys = map { $_->{key} } grep { $_->{uri} =~ m{^(?:http://c\.example)?/host} } log_entries();
    @keys >= 13 }, what => 'the host requests logged');
my %kc;
$kc{$_}++ for @keys;
is(join(',', map { "$_=$kc{$_}" } sort keys %kc),
   'http=1,httpa.example=6,httpb.example=3,httpc.example=3',
   '$singleflight_key: the host as nginx\'s $host, per request');

# over TLS: "https"
SKIP: {
    skip 'no openssl or curl: TLS not tested', 2 unless $tls;
    my $port = $t->port(1);
    my $code = `curl -sk --resolve localhost:$port:127.0.0.1 -o /dev/null -w '%{http_code}' https://localhost:$port/hosttls`;
    is($code, '200', 'default key over TLS: 200');
    my @k;
    $t->wait_for(sub { @k = map { $_->{key} } grep { $_->{uri} eq '/hosttls' } log_entries(); @k },
                 what => 'the TLS request logged');
    is($k[0] // '', 'httpslocalhost', '$singleflight_key over TLS: https and the host');
}

done_testing;
