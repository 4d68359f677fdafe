#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_resume: a fetch whose response breaks off mid-body (the
# origin closes the connection after N of its Content-Length bytes), and
# whose response has a strong validator, asks the origin for the rest
# ("Range: bytes=N-", "If-Range: <validator>").  A 206 with exactly those
# bytes of the same representation is appended: the leader and every
# follower get the whole body, byte for byte, as if nothing happened.
# Anything else (a 200 to the Range request, another ETag, the tries used
# up, singleflight_resume off) ends the flight as a break does: every
# reader's connection is closed before its body is complete, none gets a
# body spliced from two responses.  A stored response with a weak
# validator or no length is asked for again whole, and goes on only if
# the first bytes of that answer are those the readers had; a lone
# leader's unstored response without them is not resumed (nothing of it
# is kept to compare with), nor one with no validator at all.
#
# Covered: a lone leader (its response sent unstored, straight from the
# fetch), a herd (stored), a body past singleflight_memory (its rest in a
# temporary file), proxy_buffering off, a cut at byte 0, two cuts, a
# strong Last-Modified (60 seconds or more before the origin's Date) and
# one that is not (newer: no Range; a file changed meanwhile, within the
# second it names, is not spliced in), a Content-Encoding, an HTTP/2
# client (curl), a fetch that index sent to another location whose set
# $args changed its arguments (the rest is asked for there, with them), a
# leader that its own error_page sent elsewhere before the break (the
# rest is asked for where the first bytes came from, not where the
# leader went).

use strict;
use warnings;

use Test::More;
use File::Path ();
use POSIX ();

use SFTest;

my $t = SFTest->new(log_level => 'info');
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT', log_singleflight => 1));
    log_format rs '$uri $singleflight_resumes $singleflight_hedged';
    access_log %%TESTDIR%%/rs.log rs;
    log_format us '$uri|$upstream_status';
    access_log %%TESTDIR%%/us.log us;

    singleflight_zone zone=sf:4m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;
    singleflight_temp_path %%TESTDIR%%/sf_temp 1 2;
    singleflight_memory 64k;

    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_1%% http2;

        add_header X-SF $singleflight_status always;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /u/ {
            singleflight sf;
            proxy_buffering off;
            proxy_pass http://%%ORIGIN%%;
        }

        # a lone leader's response up to 1m goes to it unstored
        location /lz/ {
            singleflight sf;
            singleflight_lazy 1m;
            proxy_pass http://%%ORIGIN%%;
        }

        location /rt/ {
            singleflight sf;
            proxy_read_timeout 1s;
            proxy_pass http://%%ORIGIN%%;
        }

        location /c11/ {
            singleflight sf;
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        location /off/ {
            singleflight sf;
            singleflight_resume off;
            proxy_pass http://%%ORIGIN%%;
        }

        # a herd's first request going upstream on its own way (the
        # default), the flight fed by that request; resumed, and not
        location /ond/ {
            singleflight sf;
            singleflight_lone direct;
            proxy_pass http://%%ORIGIN%%;
        }

        location /offd/ {
            singleflight sf;
            singleflight_lone direct;
            singleflight_resume off;
            proxy_pass http://%%ORIGIN%%;
        }

        # the same origin without the module: each client its own request
        location /plain/ {
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        location /c11off/ {
            singleflight sf;
            singleflight_resume off;
            proxy_http_version 1.1;
            proxy_pass http://%%ORIGIN%%;
        }

        location /once/ {
            singleflight sf;
            singleflight_resume on tries=1;
            proxy_pass http://%%ORIGIN%%;
        }

        # the fetch leaves by index, and set $args there: a resume asks
        # for the rest of the same URI and arguments
        location /ix/ {
            singleflight sf;
            root %%TESTDIR%%/html;
            index inner;
        }

        location = /ix/inner {
            singleflight sf;
            set $args "$args&x=1";
            proxy_pass http://%%ORIGIN%%;
        }

        # a leader its own filters send elsewhere (If-Match: 412, then
        # error_page) while its fetch still runs for the followers
        location /lf/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
            error_page 412 = /lf412;
        }

        location = /lf412 {
            proxy_pass http://%%ORIGIN%%/lf412;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

File::Path::make_path($t->path('html/ix'));
$t->write_file('html/ix/inner', "inner\n");

$t->start;

# a quoted strong ETag, URL-encoded for hdr=
my $ETAG = 'hdr=ETag:%22abc%22';

sub counter { $t->stats('/stats')->{zones}{sf}{ $_[0] } // 0 }

# the whole body the origin makes for $uri (fixed=1: the same every hit)
sub whole { SFTest::origin_body(0, $_[0], $_[1]) }

# n requests at once (1: a lone leader); how many got the whole body
sub run {
    my ($uri, $size, $n) = @_;
    my $res = $n > 1 ? $t->herd(n => $n, path => $uri, timeout => 20)
                     : [ $t->get($uri, timeout => 20) ];
    my $want = whole($uri, $size);
    my $whole = grep { ($_->{status} // 0) == 200 && $_->{complete}
                       && $_->{body} eq $want } @$res;
    my $cut = grep { !$_->{complete} && length($_->{body} // '') < $size }
              @$res;
    return ($whole, $cut, $res);
}

# ------------------------------------------------------------ resumed

for my $case (
    # name, path, size, cut at, clients
    [ 'lone leader (unstored)',  '/a',   100_000,  30_000, 1 ],
    [ 'herd (stored)',           '/h',   100_000,  50_000, 20 ],
    [ 'past singleflight_memory', '/f',  300_000, 200_000, 5 ],
    [ 'proxy_buffering off, lone', '/u/a', 100_000, 30_000, 1 ],
    [ 'proxy_buffering off, herd', '/u/h', 100_000, 30_000, 10 ],
    [ 'cut at byte 0',           '/z',    50_000,       0, 1 ],
    [ 'cut at byte 0, herd',     '/zh',   50_000,       0, 10 ],
    [ 'in the last bytes',       '/l',    50_000,  49_999, 5 ],
) {
    my ($name, $path, $size, $at, $n) = @$case;
    my $delay = $n > 1 ? 'delay=300&' : '';
    my $uri = "$path?${delay}size=$size&fixed=1&ranges=1&$ETAG"
            . "&fail=cut&cut=$at&fail_first=1";
    my $before = counter('resumes');
    my $o0 = $t->zone_stats->{origin_requests_total};
    my $off = $t->log_offset;

    my ($whole, $cut) = run($uri, $size, $n);

    is($whole, $n, "$name: $n whole bodies of the one representation");
    is($t->origin_uri_hits($uri), 2, "$name: 2 origin requests (the break, the rest)");
    $t->origin_requests_ok($o0, { first => 1, resume => 1 },
                           "$name: origin_requests_total, the first and the resume");
    is(counter('resumes'), $before + 1, "$name: counted in resumes");
    is($t->log_count(qr/singleflight flight \d+ broke off at byte $at of $size/, $off), 1,
       "$name: the break logged with its byte");
    is($t->log_count(qr/singleflight flight \d+ resumed at byte $at\b/, $off), 1,
       "$name: the resume logged");
    ok($t->wait_for(sub { resumed_lines($path) == $n }, what => 'access log lines'),
       "$name: \$singleflight_resumes 1 for all $n");
}

# the access log lines of $path whose $singleflight_resumes is 1
sub resumed_lines {
    my ($path) = @_;
    my $log = $t->read_file('rs.log') // '';
    return scalar(() = $log =~ /^\Q$path\E 1 0$/mg);
}

# proxy_read_timeout mid-body (the origin sends nothing more, its
# connection open): resumed as a close is, for the lone leader and a herd
for my $n (1, 10) {
    my $delay = $n > 1 ? 'delay=300&' : '';
    my $uri = "/rt/x$n?${delay}size=80000&fixed=1&ranges=1&$ETAG"
            . '&fail=stall&cut=30000&fail_first=1';
    my $before = counter('resumes');
    my ($whole) = run($uri, 80_000, $n);
    is($whole, $n, "proxy_read_timeout, $n client(s): whole bodies");
    is($t->origin_uri_hits($uri), 2, "proxy_read_timeout, $n client(s): 2 origin requests");
    is(counter('resumes'), $before + 1, "proxy_read_timeout, $n client(s): one resume");
}

# a fetch that index sent to another location, where set $args changed
# its arguments: the rest comes from where the first bytes came from
for my $n (1, 5) {
    my $delay = $n > 1 ? 'delay=300&' : '';
    my $q = "${delay}size=80000&fixed=1&ranges=1&$ETAG&fail=cut&cut=30000"
          . "&fail_first=1&n=$n";
    my $origin_uri = "/ix/inner?$q&x=1";
    my $res = $n > 1 ? $t->herd(n => $n, path => "/ix/?$q", timeout => 20)
                     : [ $t->get("/ix/?$q", timeout => 20) ];
    my $want = whole($origin_uri, 80_000);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                     && $_->{body} eq $want } @$res), $n,
       "index and set \$args, $n client(s): whole bodies of the one URI");
    is($t->origin_uri_hits($origin_uri), 2,
       "index and set \$args, $n client(s): 2 origin requests for it");
}

# a leader that its own filters send elsewhere (If-Match: 412, then
# error_page) while its fetch runs for the followers: the fetch goes on
# when the leader's answer there is over (nginx terminates such a
# request), and when it breaks off, before or after the leader left, the
# rest is asked for where the first bytes came from
for my $case ([ 'before', 'fail=cut&cut=30000' ],
              [ 'after', 'fail=midbody&body_delay=300' ]) {
    my ($when, $fail) = @$case;
    my $uri = "/lf/$when?delay=300&size=80000&fixed=1&ranges=1&$ETAG"
            . "&$fail&fail_first=1";
    my $res = $t->flight(leader => [ 'GET', $uri, timeout => 20,
                                     headers => [ 'If-Match' => '"nope"' ] ],
                         followers => [ map { [ 'GET', $uri, timeout => 20 ] } 1 .. 4 ]);
    my ($leader, @followers) = @$res;
    like($leader->{body} // '', qr{^hit=\d+ uri=/lf412}, "a leader sent elsewhere, break $when: answered there");
    my $want = whole($uri, 80_000);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                     && $_->{body} eq $want } @followers), 4,
       "a leader sent elsewhere, break $when: 4 followers with the whole body") or diag(explain([map { [$_->{status}, $_->{complete}, length($_->{body}//''), substr($_->{body}//'',0,80)] } @followers]));
    is($t->origin_uri_hits($uri), 2, "a leader sent elsewhere, break $when: 2 origin requests for it");
}

# two breaks: the default 2 tries resume both; tries=1 only the first
{
    my $q = "size=100000&fixed=1&ranges=1&$ETAG&fail=cut&cut=20000&fail_first=2";
    my ($whole) = run("/twice?$q", 100_000, 1);
    is($whole, 1, 'two breaks, 2 tries: whole body');
    is($t->origin_uri_hits("/twice?$q"), 3, 'two breaks, 2 tries: 3 origin requests');

    my $failures = counter('resume_failures');
    my ($w, $cut) = run("/once/x?$q", 100_000, 1);
    is($w, 0, 'two breaks, tries=1: not whole');
    is($cut, 1, 'two breaks, tries=1: cut, the connection closed');
    is($t->origin_uri_hits("/once/x?$q"), 2, 'two breaks, tries=1: 2 origin requests');
}

# a strong Last-Modified (a day before the origin's Date) as validator
{
    my $uri = '/lm?size=60000&fixed=1&ranges=1'
            . '&hdr=Last-Modified:Mon,%2001%20Jan%202024%2000:00:00%20GMT'
            . '&fail=cut&cut=10000&fail_first=1';
    my ($whole) = run($uri, 60_000, 1);
    is($whole, 1, 'Last-Modified: whole body');
    is($t->origin_uri_hits($uri), 2, 'Last-Modified: 2 origin requests');
}

# A Last-Modified is a strong validator, one to resume by with If-Range,
# only at least 60 seconds before the origin's Date (RFC 9110 8.8.2.2 and
# 13.1.5): a file changed twice within the second of its date keeps that
# date, and an origin that compares dates exactly answers the Range from
# the new file, whose bytes would follow the old one's.  Here the origin
# changes the body after its first answer (change=1), its Last-Modified
# and Date the same (hdr=).  Not strong: no Range.  A lone leader's
# unstored response then breaks off as without the module (its first
# bytes, its connection closed); a stored one is asked for again whole,
# and goes on only if the answer's first bytes are those the readers had.
{
    my $date = sub {
        POSIX::strftime('%a, %d %b %Y %H:%M:%S GMT', gmtime $_[0])
            =~ s/([^A-Za-z0-9])/sprintf '%%%02X', ord $1/ger;
    };
    my $now = time;

    # n clients at once; with "kept", on keep-alive connections read until
    # nginx closes them (or for 6 s)
    my $clients = sub {
        my ($uri, $n, $kept) = @_;
        my @h = map {
            $t->start_request('GET', $uri, timeout => $kept ? 6 : 10,
                              $kept ? (headers => [ Connection => 'keep-alive' ],
                                       until_close => 1) : ())
        } 1 .. $n;
        return $t->finish_all(\@h);
    };

    for my $case (
        # name, seconds before Date, path, clients, changed, how it ends
        [ '2 s, lone leader (unstored)', 2, '/lz/lm2', 1, 1, 'cut' ],
        [ '59 s, lone leader (unstored)', 59, '/lz/lm59', 1, 1, 'cut' ],
        [ '2 s, herd (stored), the file changed', 2, '/lm2h', 10, 1, 'cut' ],
        [ '2 s, herd (stored), the same file', 2, '/lm2s', 10, 0, 'whole' ],
        [ '2 s, without the module', 2, '/plain/lm2', 1, 1, 'cut' ],
        [ '60 s, lone leader (unstored)', 60, '/lz/lm60', 1, 0, 'range' ],
        [ '120 s, lone leader (unstored)', 120, '/lz/lm120', 1, 0, 'range' ],
        [ '120 s, herd (stored)', 120, '/lm120h', 10, 0, 'range' ],
    ) {
        my ($name, $age, $path, $n, $changed, $how) = @$case;
        my $what = "Last-Modified $name";
        my $delay = $n > 1 ? 'delay=300&' : '';
        my $uri = "$path?${delay}size=500000&fixed=1&ranges=1"
                . '&hdr=Last-Modified:' . $date->($now - $age)
                . '&hdr=Date:' . $date->($now) . ($changed ? '&change=1' : '')
                . '&fail=cut&cut=250000&fail_first=1';
        my $off = $t->log_offset;

        my $res = $clients->($uri, $n, $how eq 'cut');
        my $want = whole($uri, 500_000);

        if ($how eq 'cut') {
            is(scalar(grep { ($_->{status} // 0) == 200
                             && $_->{body} eq substr($want, 0, 250_000) } @$res), $n,
               "$what: the first 250000 bytes, none of the new file's")
                or diag('bytes received: ' . join ', ', map { length $_->{body} } @$res);
            is(scalar(grep { ($_->{error} // '') =~ /^connection closed/ } @$res), $n,
               "$what: the connection closed");
        }
        else {
            is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete}
                             && $_->{body} eq $want } @$res), $n,
               "$what: " . ($n > 1 ? "$n whole bodies" : 'the whole body')
               . ' of the one file');
        }

        is($t->log_count(qr/broke off at byte 250000 of 500000, asking for the rest/, $off),
           $how eq 'range' ? 1 : 0,
           "$what: " . ($how eq 'range' ? '' : 'not ') . 'resumed by a Range');

        next if $path =~ m{^/plain/};

        is($t->log_count(qr/broke off at byte 250000, asking for all of it again/, $off),
           $n > 1 && $how ne 'range' ? 1 : 0,
           "$what: " . ($n > 1 && $how ne 'range' ? '' : 'not ') . 'asked for again whole');
        is($t->origin_uri_hits($uri), $n == 1 && $how eq 'cut' ? 1 : 2,
           "$what: origin requests");

        next unless $n > 1 && $how eq 'cut';

        is($t->log_count(qr/singleflight flight \d+ not resumed at byte 250000: the response asked for again has other bytes/,
                         $off), 1, "$what: not used, its bytes are the new file's");
    }
}

# an encoded body: the range is of the stored representation
{
    my $uri = "/gz?delay=300&size=60000&fixed=1&ranges=1&$ETAG"
            . '&hdr=Content-Encoding:gzip&fail=cut&cut=10000&fail_first=1';
    my ($whole, undef, $res) = run($uri, 60_000, 5);
    is($whole, 5, 'Content-Encoding: 5 whole bodies');
    is(scalar(grep { ($_->{headers}{'content-encoding'} // '') eq 'gzip' } @$res), 5,
       'Content-Encoding: kept');
}

# ------------------------------------------------------------ not resumed

for my $case (
    # name, uri, clients, origin requests, a failure counted
    [ 'no validator', '/nv?size=60000&fixed=1&ranges=1', 1, 1, 0 ],
    [ 'a weak ETag', '/weak?size=60000&fixed=1&ranges=1&hdr=ETag:W/%22w%22', 1, 1, 0 ],
    [ 'a 200 to the Range request', "/r200?size=60000&fixed=1&$ETAG", 1, 2, 1 ],
    [ 'a 200 to the Range request, herd', "/r200h?delay=300&size=60000&fixed=1&$ETAG", 10, 2, 1 ],
    [ 'another ETag', '/etag?size=60000&fixed=1&ranges=1&etag_hit=1', 1, 2, 1 ],
    [ 'singleflight_resume off', "/off/x?size=60000&fixed=1&ranges=1&$ETAG", 1, 1, 0 ],
) {
    my ($name, $base, $n, $hits, $failed) = @$case;
    my $uri = "$base&fail=cut&cut=20000&fail_first=1";
    my ($resumes, $failures) = (counter('resumes'), counter('resume_failures'));

    my ($whole, $cut, $res) = run($uri, 60_000, $n);

    is($whole, 0, "$name: no body given as whole");
    is($cut, $n, "$name: every connection closed before the end");
    is(scalar(grep { length($_->{body} // '') > 20_000 } @$res), 0,
       "$name: nobody got more than the first response's bytes");
    is($t->origin_uri_hits($uri), $hits, "$name: $hits origin request(s)");
    is(counter('resumes'), $resumes, "$name: not counted in resumes");
    is(counter('resume_failures'), $failures + $failed,
       "$name: " . ($failed ? '' : 'not ') . 'counted in resume_failures');
}

# A herd whose first request went upstream on its own way: its own
# response breaks off as without the module, and the flight it fed is
# resumed for the others, the break and the resume logged as a fetch's.
{
    my $uri = "/ond/x?delay=300&size=60000&fixed=1&ranges=1&$ETAG"
            . '&fail=cut&cut=20000&fail_first=1';
    my $off = $t->log_offset;

    my ($whole, $cut, $res) = run($uri, 60_000, 10);

    is($whole, 9, 'own way: 9 whole bodies');
    is(scalar(grep { !$_->{complete} && ($_->{headers}{'x-sf'} // '') eq 'LEADER' } @$res),
       1, 'own way: the leader cut, as without the module');
    is($t->origin_uri_hits($uri), 2, 'own way: 2 origin requests (the break, the rest)');
    is($t->log_count(qr/singleflight flight \d+ broke off at byte 20000 of 60000, asking for the rest/, $off),
       1, 'own way: the break logged with its byte');
    is($t->log_count(qr/singleflight flight \d+ resumed at byte 20000\b/, $off), 1,
       'own way: the resume logged');
}

# singleflight_resume off where the leader goes upstream on its own way
# and its response feeds the flight: the break is not resumed either.  The
# leader is cut; a reader that had part of the body is cut with it; one
# that had none yet looks for a flight again (one more origin request,
# which this origin answers whole).  No Range goes to the origin.
{
    my $uri = "/offd/x?delay=300&size=60000&fixed=1&ranges=1&$ETAG"
            . '&fail=cut&cut=20000&fail_first=1';
    my $off = $t->log_offset;
    my ($resumes, $hits) = (counter('resumes'), $t->origin_uri_hits($uri));

    my ($whole, $cut, $res) = run($uri, 60_000, 10);

    is($whole + $cut, 10, 'resume off, own way: every client whole or cut');
    is(scalar(grep { !$_->{complete} && length($_->{body} // '') > 20_000 } @$res), 0,
       'resume off, own way: no cut client got past the break');
    is(scalar(grep { !$_->{complete} && ($_->{headers}{'x-sf'} // '') eq 'LEADER' } @$res),
       1, 'resume off, own way: the leader cut');
    is(counter('resumes'), $resumes, 'resume off, own way: not resumed');
    is($t->log_count(qr/asking for the rest/, $off), 0,
       'resume off, own way: no Range asked for');
    cmp_ok($t->origin_uri_hits($uri) - $hits, '<=', 2,
           'resume off, own way: at most one origin request after the break');
}

# ------------------------------------------------------------ asked for again

# A stored response with no Range to resume by (a weak validator, no
# length) is asked for again whole; its first bytes compared with what
# the readers had, it goes on: every reader gets the whole body.  Where
# the second response differs (its bytes: the origin's stamp of each hit
# without fixed=1; its ETag; its length: it ends before the break), the
# flight is cut as before, and so is a response with no validator at all
# (taken for one made anew each time).

my $WEAK = 'hdr=ETag:W/%22w%22';
my $OLD = 'hdr=Last-Modified:Mon,%2001%20Jan%202024%2000:00:00%20GMT';

for my $case (
    # name, path, query, size, cut at, clients, whole?
    [ 'a weak ETag, herd',       '/wweak',    $WEAK,                 60_000,  20_000, 10, 1 ],
    [ 'no length, lone (stored)', '/c11/wch', "chunked=1&$ETAG",     60_000,  20_000,  1, 1 ],
    [ 'no length, weak ETag, herd', '/c11/wchh', "chunked=1&$WEAK",  60_000,  20_000, 10, 1 ],
    [ 'no length, Last-Modified', '/c11/wlm', "chunked=1&$OLD",      60_000,  20_000,  5, 1 ],
    [ 'past singleflight_memory', '/wf',      $WEAK,                300_000, 200_000,  5, 1 ],
    [ 'other bytes',             '/wob',      "nofix$WEAK",          60_000,  20_000, 10, 0 ],
    [ 'shorter, no length',      '/c11/wsh',  "chunked=1&$WEAK&size_after=10000", 60_000, 20_000, 10, 0 ],
    [ 'another ETag, no length', '/c11/wet',  'chunked=1&etag_hit=1', 60_000, 20_000, 10, 0 ],
    [ 'no validator, no length', '/c11/wnv',  'chunked=1',           60_000,  20_000,  1, 0 ],
    [ 'singleflight_resume off', '/c11off/wx', "chunked=1&$WEAK",    60_000,  20_000,  1, 0 ],
) {
    my ($name, $path, $q, $size, $at, $n, $ok) = @$case;
    my $what = "asked for again, $name";
    my $fixed = $q =~ s/^nofix// ? '' : 'fixed=1&';
    my $delay = $n > 1 ? 'delay=300&' : '';
    my $uri = "$path?${delay}size=$size&$fixed" . ($q ne '' ? "$q&" : '')
            . "fail=cut&cut=$at&fail_first=1";
    my ($resumes, $failures) = (counter('resumes'), counter('resume_failures'));
    my $off = $t->log_offset;

    my ($whole, $cut, $res) = run($uri, $size, $n);

    if ($ok) {
        is($whole, $n, "$what: $n whole bodies");
        is($t->origin_uri_hits($uri), 2, "$what: 2 origin requests (the break, all again)");
        is(counter('resumes'), $resumes + 1, "$what: counted in resumes");
        is($t->log_count(qr/singleflight flight \d+ broke off at byte $at, asking for all of it again/, $off),
           1, "$what: the break logged with its byte");
        is($t->log_count(qr/singleflight flight \d+ resumed at byte $at: the response asked for again has the same first bytes/, $off),
           1, "$what: the resume logged");
        next;
    }

    my $hits = $name =~ /^(?:singleflight_resume off|no validator)/ ? 1 : 2;
    is($cut, $n, "$what: every connection closed before the end");
    is(scalar(grep { length($_->{body} // '') > $at } @$res), 0,
       "$what: nobody got more than the first response's bytes");
    is($t->origin_uri_hits($uri), $hits, "$what: $hits origin request(s)");
    is(counter('resumes'), $resumes, "$what: not counted in resumes");
    is(counter('resume_failures'), $failures + ($hits - 1),
       "$what: " . ($hits > 1 ? '' : 'not ') . 'counted in resume_failures');

    # why, in the error log
    my ($why) = grep { $name =~ /^\Q$_->[0]\E/ } [ 'other bytes', 'has other bytes' ],
        [ 'shorter', 'is shorter' ], [ 'another ETag', 'has another header' ];
    next unless $why;
    is($t->log_count(qr/singleflight flight \d+ not resumed at byte $at: the response asked for again $why->[1]/,
                     $off), 1, "$what: logged, \"$why->[1]\"");
}

# The lone leader's $upstream_status lists both of its flight's requests,
# as with proxy_next_upstream: the Range's 206, or the second 200
for my $c ([ '/a', '200, 206', 'resumed by a Range' ],
           [ '/c11/wch', '200, 200', 'asked for again whole' ]) {
    my ($path, $want, $how) = @$c;
    my $line;
    $t->wait_for(sub {
        ($line) = ($t->read_file('us.log') // '') =~ /^\Q$path\E\|(.*)$/m;
        defined $line;
    }, what => "$path in us.log");
    is($line, $want, "\$upstream_status of a lone leader $how: $want");
}

# The same herd without the module: only the request the origin broke off
# (the first) is cut, the others are whole, each its own origin request.
# With the module (above) all 10 were whole, with 2 origin requests.
{
    my $what = 'asked for again, module off';
    my $uri = "/plain/wweak?delay=300&size=60000&fixed=1&$WEAK&fail=cut&cut=20000&fail_first=1";
    my ($whole, $cut) = run($uri, 60_000, 10);
    is($whole, 9, "$what: 9 whole bodies");
    is($cut, 1, "$what: the one the origin broke off cut");
    is($t->origin_uri_hits($uri), 10, "$what: 10 origin requests (the module: 2)");
}

# ------------------------------------------------------------ HTTP/2

SKIP: {
    my ($curl) = grep { -x } map { "$_/curl" } split /:/, $ENV{PATH};
    skip 'curl not found', 2 unless $curl;

    my $uri = "/h2?size=80000&fixed=1&ranges=1&$ETAG&fail=cut&cut=25000&fail_first=1";
    my $port = $t->port(1);
    my $body = `$curl -s --http2-prior-knowledge "http://127.0.0.1:$port$uri"`;
    is(length $body, 80_000, 'HTTP/2: all 80000 bytes');
    ok($body eq whole($uri, 80_000), 'HTTP/2: the one representation');
}

# ------------------------------------------------------------ the zone

my $z;
ok($t->wait_for(sub {
    $z = $t->stats('/stats?diagnostics=1')->{zones}{sf};
    $z->{in_flight} == 0 && $z->{readers} == 0
        && $z->{pages_used} == $z->{pages_baseline};
}, what => 'baseline'), 'zone back to baseline');

done_testing;
