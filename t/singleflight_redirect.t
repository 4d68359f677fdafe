#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A fetch that leaves its location (try_files to a named location, index
# to another location): without the module the request follows it, and
# its response goes through the filters of the location that made it
# (add_header there, not in the location the request came in by).  With
# the module every reader, leader and followers, lone or in a herd, gets
# the headers plain nginx gives, and the herd costs one origin request.
# So too for a status the fetch ends with there, without a response
# (return 404 in a named location): it is made where the fetch was.
# The URI and arguments the redirect changed (index, set $args) are the
# readers' too: $uri and $args in add_header and in the access log.

use strict;
use warnings;

use Test::More;
use File::Path qw(make_path);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;
make_path($t->path('html/i'));
$t->write_file('html/i/inner', "inner\n");
make_path($t->path('html/u'), $t->path('html/v'));
$t->write_file('html/u/inner', "inner\n");
$t->write_file('html/v/gone', "gone\n");
$t->write_file('html/refused.html', "refused\n");
make_path($t->path('html/d/sub'));

my $locations = <<'EOT';
        root %%TESTDIR%%/html;

        location /p/ {
            try_files /nonexistent @backend;
            add_header X-Outer p always;
        }

        location @backend {
            add_header X-Inner backend always;
            proxy_pass http://%%ORIGIN%%;
        }

        location /i/ {
            index inner;
            add_header X-Outer i always;
        }

        location = /i/inner {
            add_header X-Inner inner always;
        }

        location /e/ {
            try_files /nonexistent @gone;
            add_header X-Outer e always;
        }

        location @gone {
            add_header X-Inner gone always;
            return 404;
        }

        location /u/ {
            index inner;
            add_header X-Outer u always;
        }

        location = /u/inner {
            set $args "$args&moved=1";
            add_header X-Inner "$uri?$args" always;
            access_log %%TESTDIR%%/moved-$server_port.log moved;
            proxy_pass http://%%ORIGIN%%;
        }

        location /v/ {
            index gone;
            add_header X-Outer v always;
        }

        location = /v/gone {
            add_header X-Inner "$uri?$args" always;
            access_log %%TESTDIR%%/moved-$server_port.log moved;
            return 404;
        }

        location /f/ {
            # a fetch: nginx answers an If-Match from its stored response
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
            error_page 412 = /after412;
        }

        location = /after412 {
            proxy_pass http://%%ORIGIN%%/after412;
        }

        location /s/ {
            # a fetch: nginx answers an If-Match from its stored response
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
            error_page 412 /refused.html;
        }

        location /c/ {
            # a fetch: nginx answers an If-Match from its stored response
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
            error_page 412 @close;
        }

        location @close {
            return 444;
        }

        location /d/ {
        }

        location /r/ {
            error_page 302 /d/sub;
            return 302 "first";
        }

        location /pa/ {
            post_action /pa-after;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /pa-after {
            proxy_pass http://%%ORIGIN%%;
        }
EOT

$t->write_config($t->config_template(<<"EOT"));
    singleflight_zone zone=sf:1m;
    log_format moved '\$request_uri \$uri?\$args \$status';

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
$locations
        location = /stats {
            singleflight_stats;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_1%%;
$locations
    }
EOT

$t->start;

sub headers_of {
    my ($r) = @_;
    return join(' ', $r->{status} // 'none', map { "$_=" . ($r->{headers}{$_} // '-') }
        qw(x-outer x-inner));
}

# one request, nobody to share with: the leader's own response
for my $path ('/p/lone?size=100', '/i/', '/e/x', '/u/?size=100', '/v/?a=1') {
    my $plain = $t->get($path, port => $t->port(1));
    my $sf = $t->get($path);
    is(headers_of($sf), headers_of($plain), "$path alone: as plain nginx");
    like(headers_of($sf), qr/x-outer=- x-inner=\S+/, "$path alone: the inner location's headers");
}

# a herd: one fetch, and the followers' stored response too
my $path = '/p/herd?size=3000&delay=300';
my $plain = $t->get('/p/plain?size=3000', port => $t->port(1));
$t->origin_reset;
my $herd = $t->herd(path => $path, n => 5);
is(scalar(grep { headers_of($_) eq headers_of($plain) } @$herd), 5,
   'herd: 5 of 5 with plain nginx\'s headers')
    or diag(explain([ map { headers_of($_) } @$herd ]));
is($t->origin_uri_hits($path), 1, 'herd: one origin request');

# the URI and arguments the fetch's location changed, as plain nginx
# has them after the same redirect: in its headers and in its log
for my $c ([ '/u/?size=3000&delay=300', 'u' ], [ '/v/?delay=1', 'v' ]) {
    my ($path, $name) = @$c;
    my $plain = $t->get($path, port => $t->port(1));
    like(headers_of($plain), qr{x-inner=/$name/\w+\?}, "$name: plain's \$uri");
    $t->origin_reset;
    my $herd = $t->herd(path => $path, n => 5);
    is(scalar(grep { headers_of($_) eq headers_of($plain) } @$herd), 5,
       "$name herd: 5 of 5 with plain nginx's \$uri and \$args")
        or diag(explain([ headers_of($plain), map { headers_of($_) } @$herd ]));
    next if $name ne 'u';
    is($t->origin_uri_hits('/u/inner?size=3000&delay=300&moved=1'), 1,
       'u herd: one origin request');
}
my $port = $t->port;
my $port1 = $t->port(1);
ok($t->wait_for(sub { -e $t->path("moved-$port.log")
                      && (() = $t->read_file("moved-$port.log") =~ /\n/g) >= 12 }),
   'the readers\' requests are logged');
my %plain_log = map { $_ => 1 } split /\n/, $t->read_file("moved-$port1.log");
my @lines = split /\n/, $t->read_file("moved-$port.log");
is(scalar(grep { !$plain_log{$_} } @lines), 0,
   'each log line, $uri and $args, is one plain nginx wrote')
    or diag(explain([ $t->read_file("moved-$port1.log"), @lines ]));

# The leader's own filters send it elsewhere while its fetch still runs
# (nginx answers its If-Match with a 412, error_page makes that a proxied
# location): the leader gets that location's answer from an upstream of
# its own, and the fetch, ending later, leaves that upstream alone
# (nginx used to see the request's count reach zero, then crash).
my $r = $t->get('/f/x?size=20000&fail=slowbody&pieces=4&delay=100',
                headers => [ 'If-Match' => '"nope"' ]);
is($r->{status}, 200, 'a leader redirected by its filters: answered');
like($r->{body}, qr{uri=/after412}, 'by the location error_page named');
# the leader's request ends (and is logged) once its fetch is over
ok($t->wait_for(sub { $t->read_file('access.log') =~ m{"GET /f/x} }),
   'the leader\'s request ended');
is($t->log_count(qr/count is zero|exited on signal/), 0, 'no worker died');

# So too with followers: the leader's answer in the location error_page
# named is over while the fetch still sends their body.  nginx ends a
# request a filter finalized by terminating it, which would take every
# upstream of its subrequests with it; the fetch goes on, and the
# followers get the whole body (as each would without the module).
# A leader whose If-Match nginx refuses, and 4 followers: they get the
# whole body of one origin request; the leader's response is returned.
sub refused_herd {
    my ($uri) = @_;
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri, headers => [ 'If-Match' => '"nope"' ] ],
                         followers => [ map { [ 'GET', $uri ] } 1 .. 4 ]);
    my ($leader, @followers) = @$res;
    my $want = $t->origin_body(1, $uri, 40000);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} && $_->{body} eq $want }
              @followers), 4, "$uri: its 4 followers, the whole body")
        or diag(explain([ map { [ $_->{status}, $_->{complete}, length($_->{body} // '') ] }
                         @followers ]));
    is($t->origin_uri_hits($uri), 1, "$uri: one origin request for them all");
    return $leader;
}

like(refused_herd('/f/herd?size=40000&fail=slowbody&pieces=4&delay=150')->{body} // '',
     qr{uri=/after412}, 'a leader redirected by its filters, with followers: answered');

# A status its fetch ended with, nginx's own, goes with the headers its
# handler set: a directory's URI without its slash gets the 301 and the
# Location with the slash, as plain nginx sends it, on its own and after
# an error_page whose own Location it replaces.
for my $path ('/d/sub', '/r/x') {
    my ($sf, $plain) = ($t->get($path), $t->get($path, port => $port1));
    my $loc = $plain->{headers}{location} // '';
    $loc =~ s/:$port1/:$port/;
    is(join(' ', $sf->{status} // 'none', $sf->{headers}{location} // '-'),
       "301 $loc", "$path: the directory's 301 and its Location, as plain nginx's");
    like($loc, qr{^http://[^/]+/d/sub/$}, "$path: plain nginx's Location");
    is(scalar(() = ($sf->{raw_headers} // '') =~ /^Location:/mig), 1,
       "$path: one Location, not the error_page's own too");
}

# So too when the page error_page names is a file: nginx sends it and
# ends the request within the leader's own send of its header, before
# the module hears of it.  Ending a request a filter finalized, nginx
# terminates it, and its fetch with it; the followers got nothing until
# they gave up.  The leader gets the page, the followers the whole body.
{
    my $leader = refused_herd('/s/herd?size=40000&fail=slowbody&pieces=4&delay=150');
    is(($leader->{status} // 'none') . ' ' . ($leader->{body} // ''), "412 refused\n",
       'a leader refused, its error_page a file: the file');
    ok($t->wait_for(sub { $t->read_file('access.log') =~ m{"GET /s/herd[^"]*" 412 } }),
       'the leader\'s request ended, logged with its 412');
}

# The error page closes the leader's connection (return 444): nginx
# terminates its request, and the fetch that request hosted ends with
# it.  The followers are not left waiting: one that had not yet taken
# the response's header fetches again, once for all; one that had (its
# wake-up came before the leader's end: the order is the event loop's)
# is cut, as a response whose fetch broke off.
{
    my $uri = '/c/herd?size=40000&fail=slowbody&pieces=4&delay=150';
    $t->origin_reset;
    my $res = $t->flight(leader => [ 'GET', $uri, headers => [ 'If-Match' => '"nope"' ] ],
                         followers => [ map { [ 'GET', $uri ] } 1 .. 4 ]);
    my ($leader, @followers) = @$res;
    is($leader->{status}, undef, 'a leader refused, its error_page closes: closed');
    is(scalar(grep { defined $_->{status} } @followers), 4, 'its 4 followers: each answered');
    my @whole = grep { ($_->{status} // 0) == 200 && $_->{complete} } @followers;
    my @cut = grep { ($_->{status} // 0) == 200 && !$_->{complete} } @followers;
    is(@whole + @cut, 4, 'each follower: the whole response, or a cut one')
        or diag(explain([ map { [ $_->{status}, $_->{complete}, length($_->{body} // '') ] }
                         @followers ]));
    is(scalar(grep { length($_->{body}) == 40000 && $_->{body} =~ m{^hit=2 uri=/c/herd} } @whole),
       scalar @whole, 'each complete response: the whole body of the second fetch');
    is($t->origin_uri_hits($uri), @whole ? 2 : 1,
       'origin requests: the one ended, and one more if a follower fetched again');
}

# A reader whose If-Match nginx answers with a 412 from the stored
# response (see docs/design.md, Conditionals), and whose
# error_page sends it to a proxied location: it gets that location's
# answer, a follower as the leader (once its fetch is over, or while it
# still runs), not a connection closed with nothing (nginx terminates a
# request a filter finalized as soon as the filter's error reaches it).
for my $c ([ 'followers', [], [ 'If-Match' => '"nope"' ] ],
           [ 'the leader', [ 'If-Match' => '"nope"' ], [] ]) {
    my ($who, $lh, $fh) = @$c;
    my $uri = "/f/im-$who?size=100&delay=300";
    $uri =~ s/ /-/g;
    my $res = $t->flight(leader => [ 'GET', $uri, headers => $lh ],
                         followers => [ map { [ 'GET', $uri, headers => $fh ] } 1 .. 2 ]);
    my @im = @$lh ? ($res->[0]) : @$res[1, 2];
    is(scalar(grep { ($_->{status} // 0) == 200 && ($_->{body} // '') =~ m{uri=/after412} } @im),
       scalar @im, "If-Match refused, $who: the error_page location's answer");
}

# The file as the answer to a refused reader, whatever else it is: a lone
# leader whose response goes straight through (100 bytes) or is stored
# (20,000, still coming), a follower refused from the stored response.
for my $c ([ 'a lone leader, direct', 100, 0 ], [ 'a lone leader, stored', 20000, 0 ],
           [ 'followers', 20000, 2 ]) {
    my ($who, $size, $n) = @$c;
    my $uri = "/s/im-$size-$n?size=$size&fail=slowbody&pieces=2&delay=100";
    my $im = [ 'If-Match' => '"nope"' ];
    my $res = $t->flight(leader => [ 'GET', $uri, headers => $n ? [] : $im ],
                         followers => [ map { [ 'GET', $uri, headers => $im ] } 1 .. $n ]);
    my @im = $n ? @$res[1 .. $n] : ($res->[0]);
    is(join(' ', map { ($_->{status} // 'none') . ' ' . ($_->{body} // '') } @im),
       join(' ', ("412 refused\n") x @im), "If-Match refused, $who: the file error_page names");
    ok($t->wait_for(sub { (() = $t->read_file('access.log') =~ m{"GET \Q$uri\E[^"]*" 412 }g)
                          == @im }), "$who: logged with the 412");
}

# A response read from a flight, then post_action: the request comes back
# into a collapsed location and looks for another flight there.  What the
# first flight held goes back when the request goes: the zone returns to
# its baseline.
{
    my $uri = '/pa/x?size=100000&delay=300';
    my $res = $t->herd(n => 5, path => $uri);
    is(join(' ', map { ($_->{status} // 'none') . ':' . length($_->{body} // '') } @$res),
       join(' ', ('200:100000') x 5), 'post_action: answered');
    is($t->origin_uri_hits($uri), 1, 'post_action: one origin request');
    $t->zone_baseline_ok('post_action: the zone back to its baseline');
}

done_testing();
