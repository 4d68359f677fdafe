#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_resume_length: what a resume appends ends exactly at the
# length the first response announced.  The origin sends a 200 with
# "Content-Length: 600000" and a strong ETag, and closes after 300,000
# bytes; asked for the rest ("Range: bytes=300000-", If-Range), it answers
# a 206 whose Content-Range ("bytes 300000-599999/600000") and ETag are
# right but whose framing is not: chunked, without a Content-Length, and
# 5,000 bytes too long, or half the rest, or even exactly the rest; or a
# Content-Length 5,000 bytes too long.  None of it is appended: the flight
# breaks off at byte 300,000 as without singleflight_resume, counted in
# resume_failures and logged ("not resumed at byte 300000").  Every reader
# gets its 200 with "Content-Length: 600000", the 300,000 bytes, and its
# connection closed: never kept alive after a body longer or shorter than
# its Content-Length, where the client would read the extra bytes as its
# next response, or wait for the missing ones.  The same request through
# a location without the module gets the same.
#
# Covered: a herd (stored), a lone leader whose response is stored, a
# lone leader whose response goes to it unstored (singleflight_lazy), and
# the location without the module.
#
# And the guard under the resume, for any response: a body that goes on
# past its header's Content-Length, or ends before it, is never stored or
# sent past that length nor taken for complete; the flight breaks off
# there.  A content handler that says one length and sends another
# (embedded perl, where Debian's nginx has it), stored and unstored.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $MODULES = $ENV{TEST_NGINX_MODULES} // '/usr/lib/nginx/modules';

my $t = SFTest->new(log_level => 'info');
$t->skip_without_module;
$t->start_origin;

# Debian's perl module loads into Debian's nginx only
my $perl = ($t->nginx_binary eq '/usr/sbin/nginx' || $ENV{TEST_NGINX_MODULES})
           && -f "$MODULES/ngx_http_perl_module.so";

# a content handler that says Content-Length: cl= and sends len= bytes,
# in pieces of 400
my $PERL = <<'EOT';
            perl 'sub {
                my $r = shift;
                my %a = map { split /=/, $_, 2 } split /&/, $r->args // "";
                $r->header_out("Content-Length", $a{cl});
                $r->send_http_header("text/plain");
                my $body = "x" x $a{len};
                $r->print(substr($body, $_ * 400, 400))
                    for 0 .. int(($a{len} - 1) / 400);
                return OK;
            }';
EOT

# another module's content: collapsed only with content=any
my $perl_locations = $perl ? <<"EOT" : '';
        location /perl/ {
            singleflight sf content=any;
            singleflight_lazy off;
$PERL
        }

        location /perl_lazy/ {
            singleflight sf content=any;
            singleflight_lazy 1m;
$PERL
        }
EOT

$t->write_config($t->config_template(<<"EOT",
    singleflight_zone zone=sf:4m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;
    singleflight_memory 64k;

    # the origin's chunked 206 needs HTTP/1.1
    proxy_http_version 1.1;

    server {
        listen 127.0.0.1:%%PORT%%;

        # the response is larger than singleflight_memory: stored, lone
        # leader or not
        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        # a lone leader's response is not stored: it goes to it straight
        location /lazy/ {
            singleflight sf;
            singleflight_lazy 1m;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same origin without the module
        location /plain/ {
            proxy_pass http://%%ORIGIN%%;
        }

$perl_locations
        location = /stats {
            singleflight_stats;
        }
    }
EOT
    main => $perl ? "load_module $MODULES/ngx_http_perl_module.so;" : ''));
$t->start;

# a quoted strong ETag, URL-encoded for hdr=
my $ETAG = 'hdr=ETag:%22v1%22';

sub counter { $t->stats('/stats')->{zones}{sf}{ $_[0] } // 0 }

# n clients at once (1: alone), each on a keep-alive connection read until
# nginx closes it, or for 6 s: what each got, and whether it was closed
sub clients {
    my ($uri, $n) = @_;
    my @h = map {
        $t->start_request('GET', $uri, headers => [ Connection => 'keep-alive' ],
                          until_close => 1, timeout => 6)
    } 1 .. $n;
    return [ map { {
        status => $_->{status} // 0,
        length => $_->{headers}{'content-length'} // 'none',
        body   => $_->{body} // '',
        closed => ($_->{error} // '') ne 'timeout',
    } } @{ $t->finish_all(\@h) } ];
}

sub lengths { join ', ', map { length $_->{body} } @{ $_[0] } }

# ------------------------------------------------------------ the 206

my $SIZE = 600_000;
my $CUT = 300_000;

for my $kind (
    # name, what the origin's 206 is
    [ 'a chunked 206 5,000 bytes too long', 'range_chunked=1&range_len=305000' ],
    [ 'a chunked 206 half the rest', 'range_chunked=1&range_len=150000' ],
    [ 'a chunked 206 of exactly the rest', 'range_chunked=1' ],
    [ 'a 206 with a Content-Length 5,000 bytes too long', 'range_len=305000' ],
) {
    my ($kname, $q) = @$kind;

    for my $where (
        # name, location, clients, with the module
        [ 'herd (stored)', '/h', 10, 1 ],
        [ 'lone leader (stored)', '/l', 1, 1 ],
        [ 'lone leader (unstored)', '/lazy/l', 1, 1 ],
        [ 'without the module', '/plain/p', 1, 0 ],
    ) {
        my ($wname, $path, $n, $module) = @$where;
        my $what = "$kname, $wname";
        my $delay = $n > 1 ? 'delay=300&' : '';
        my $uri = "$path?${delay}size=$SIZE&fixed=1&ranges=1&$ETAG&$q"
                . "&fail=cut&cut=$CUT&fail_first=1";
        my ($resumes, $failures) = (counter('resumes'), counter('resume_failures'));
        my $off = $t->log_offset;

        my $res = clients($uri, $n);
        my $first = substr(SFTest::origin_body(0, $uri, $SIZE), 0, $CUT);

        is(scalar(grep { $_->{status} == 200 && $_->{length} eq $SIZE } @$res), $n,
           "$what: 200, Content-Length: $SIZE");
        is(scalar(grep { $_->{body} eq $first } @$res), $n,
           "$what: the first $CUT bytes, no more, no less")
            or diag("bytes received: " . lengths($res));
        is(scalar(grep { $_->{closed} } @$res), $n,
           "$what: the connection closed, not kept alive");

        if (!$module) {
            is($t->origin_uri_hits($uri), $n, "$what: $n origin request(s)");
            next;
        }

        is($t->origin_uri_hits($uri), 2, "$what: 2 origin requests (the break, the rest)");
        is(counter('resume_failures'), $failures + 1, "$what: counted in resume_failures");
        is(counter('resumes'), $resumes, "$what: not counted in resumes");
        is($t->log_count(qr/\[info\].*singleflight flight \d+ not resumed at byte $CUT\b/, $off),
           1, "$what: \"not resumed at byte $CUT\" logged");
    }
}

# ------------------------------------------------------------ any body

# A content handler whose body is longer (1,200 bytes) or shorter (600)
# than its Content-Length (1,000): the flight breaks off there, at most
# the 1,000 bytes sent, and the connection closed.  (Without the module,
# nginx sends what the handler sends: 1,200 bytes, or 600 and a
# connection that waits for the rest.)

SKIP: {
    skip "Debian's perl module not installed ($MODULES/ngx_http_perl_module.so) "
         . "or not for " . $t->nginx_binary, 16 unless $perl;

    for my $case (
        # name, location, len=, the body bytes a client gets
        [ 'longer, stored', '/perl/long', 1200, 800 ],
        [ 'shorter, stored', '/perl/short', 600, 600 ],
        [ 'longer, unstored', '/perl_lazy/long', 1200, 800 ],
        [ 'shorter, unstored', '/perl_lazy/short', 600, 600 ],
    ) {
        my ($name, $path, $len, $got) = @$case;
        my $what = "a body $name than its Content-Length";
        my $off = $t->log_offset;
        my ($r) = @{ clients("$path?cl=1000&len=$len", 1) };

        is("$r->{status} $r->{length}", '200 1000', "$what: 200, Content-Length: 1000");
        is(length $r->{body}, $got, "$what: $got bytes");
        ok($r->{closed}, "$what: the connection closed, not kept alive");
        is($t->log_count(qr/\[error\].*singleflight flight \d+: the body/, $off), 1,
           "$what: logged");
    }
}

# ------------------------------------------------------------ the zone

$t->zone_baseline_ok('zone back to baseline');

done_testing;
