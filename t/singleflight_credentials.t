#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_credentials off | on | NAME ...: with "off", requests that
# carry credentials are not collapsed ($singleflight_status PRIVATE):
# those with Authorization, Proxy-Authorization or Cookie; NAME ... adds
# more header names to that list (and means "off"); "on" collapses them
# all the same.  The default, "http", is t/singleflight_credentials_http.t.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# ------------------------------------------------------------ helpers

my $n = 0;    # a case number in each URI

# A server with the module in location / and these more locations.
sub config {
    my ($more) = @_;
    return $t->config_template(<<"EOT");
    log_format sfc '\$remote_port \$singleflight_status \$request_uri';
    access_log %%TESTDIR%%/sf.log sfc;

    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_credentials off;
            proxy_pass http://%%ORIGIN%%;
        }
$more
    }
EOT
}

# n concurrent GETs of $uri with @hdr: (responses, their $singleflight_status)
sub burst {
    my ($n, $uri, @hdr) = @_;
    my @h = map { $t->start_request('GET', $uri, headers => [@hdr]) } 1 .. $n;
    $t->poll_all(\@h);
    my %by;
    $t->wait_for(sub {
        %by = map { (split ' ')[0, 1] } split /\n/, $t->read_file('sf.log');
        !grep { !exists $by{ $_->{local_port} } } @h;
    }, what => 'access log lines');
    return ([ map { $_->{res} } @h ], [ map { $by{ $_->{local_port} } // '?' } @h ]);
}

sub complete { scalar grep { ($_->{status} // 0) == 200 && $_->{complete} } @{ $_[0] } }

# Each case: [name, location prefix, request headers...]; 4 requests at once.
sub not_collapsed {
    for my $case (@_) {
        my ($name, $prefix, @hdr) = @$case;
        my $uri = "${prefix}c?delay=300&case=" . ++$n;
        my ($res, $sf) = burst(4, $uri, @hdr);
        is(complete($res), 4, "$name: 4 complete responses");
        is($t->origin_uri_hits($uri), 4, "$name: not collapsed, 4 origin requests");
        is(join(' ', @$sf), 'PRIVATE PRIVATE PRIVATE PRIVATE', "$name: PRIVATE");
    }
}

sub collapsed {
    for my $case (@_) {
        my ($name, $prefix, @hdr) = @$case;
        my $uri = "${prefix}p?delay=300&case=" . ++$n;
        my ($res, $sf) = burst(4, $uri, @hdr);
        is(complete($res), 4, "$name: 4 complete responses");
        is($t->origin_uri_hits($uri), 1, "$name: collapsed, 1 origin request");
        is(join(' ', sort @$sf), 'FOLLOWER FOLLOWER FOLLOWER LEADER', "$name: a LEADER, FOLLOWERs");
    }
}

# ------------------------------------------------------------ off, on

$t->write_config(config(<<'EOT'));
        location /on/ {
            singleflight sf;
            singleflight_credentials on;
            proxy_pass http://%%ORIGIN%%;
        }

        # the keywords in any case, as nginx's flags: not a header name
        location /ON/ {
            singleflight sf;
            singleflight_credentials ON;
            proxy_pass http://%%ORIGIN%%;
        }
EOT
$t->start;

not_collapsed(
    [ 'Proxy-Authorization', '/', 'Proxy-Authorization' => 'Basic dTpw' ],
    [ 'Authorization', '/', Authorization => 'Bearer abc' ],
    [ 'Cookie', '/', Cookie => 'session=1' ],
    # header names are case-insensitive, their first letter too
    [ 'cookie', '/', cookie => 'session=1' ],
    [ 'AUTHORIZATION', '/', AUTHORIZATION => 'Bearer abc' ],
    [ 'proxy-AUTHORIZATION', '/', 'proxy-AUTHORIZATION' => 'Basic dTpw' ],
    # after headers of the same lengths that are not credentials
    [ 'Cookie after Coffee and Accept', '/', Coffee => 'x', Accept => '*/*', Cookie => 'session=1' ],
);
collapsed(
    [ 'no credentials', '/', 'X-Api-Key' => 'k1' ],
    [ 'Coffee, as long as Cookie', '/', Coffee => 'x' ],
    [ 'Authorisation, as long as Authorization', '/', Authorisation => 'x' ],
    [ 'Proxy-Authorization, credentials on', '/on/', 'Proxy-Authorization' => 'Basic dTpw' ],
    [ 'Cookie, credentials on', '/on/', Cookie => 'session=1' ],
    [ 'Cookie, credentials ON', '/ON/', Cookie => 'session=1' ],
);
$t->stop;

# ------------------------------------------------------------ NAME ...

# a name longer than 63 characters, and one of a length (5) that no name
# of the default list has: the names are looked for by their lengths
my $LONG = 'X-' . ('Credential-' x 6) . 'Name';

for my $bad ('on X-Api-Key', 'off X-Api-Key', 'X-Api-Key OFF', '"X Api"', 'X-Api:') {
    $t->write_config(config(<<"EOT"));
        location /bad/ {
            singleflight sf;
            singleflight_credentials $bad;
            proxy_pass http://%%ORIGIN%%;
        }
EOT
    my ($ok, $out) = $t->test_config;
    ok(!$ok && $out =~ /\[emerg\].*"singleflight_credentials"/,
        "nginx -t: singleflight_credentials $bad is rejected, naming the directive") or diag($out);
}

$t->write_config(config(<<"EOT"));
        location /names/ {
            singleflight sf;
            singleflight_credentials X-Api-Key x-session $LONG X-Tok;
            proxy_pass http://%%ORIGIN%%;
        }
EOT
my ($ok, $out) = $t->test_config;
ok($ok, 'nginx -t: singleflight_credentials takes header names') or diag($out);

SKIP: {
    skip 'singleflight_credentials NAME ... is not accepted', 30 unless $ok;
    $t->start;
    not_collapsed(
        [ 'X-Api-Key, listed', '/names/', 'X-Api-Key' => 'k1' ],
        [ 'X-Session, listed in another case', '/names/', 'X-Session' => 's1' ],
        [ 'a listed name of 72 characters', '/names/', $LONG => 'l1' ],
        [ 'X-Tok, listed, 5 characters', '/names/', 'x-tok' => 't1' ],
        [ 'Authorization, with names listed', '/names/', Authorization => 'Bearer abc' ],
        [ 'Proxy-Authorization, with names listed', '/names/', 'Proxy-Authorization' => 'Basic dTpw' ],
    );
    collapsed(
        [ 'an unlisted header, with names listed', '/names/', 'X-Other' => 'x' ],
        [ 'X-Api-Key, listed elsewhere only', '/', 'X-Api-Key' => 'k1' ],
        [ 'a longer name than one listed', '/names/', "${LONG}s" => 'l1' ],
        [ 'X-Toe, as long as X-Tok', '/names/', 'X-Toe' => 't1' ],
    );
}

done_testing;
