#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# $upstream_status, $upstream_addr and $upstream_response_length across
# an error_page.  Without the module, a request whose upstream's error
# nginx intercepts (proxy_intercept_errors) and sends to another proxied
# location logs both upstreams, with nginx's " : " between those of two
# locations ("404 : 200"), and ", " between the tries of one
# (proxy_next_upstream).  With the module, a request that fetched its
# flight there, then went on to the error page's location, logs the same
# chain; a follower logs none of the upstreams it did not go to.  So
# every origin request a herd made is in exactly one client's line.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;
$t->start_origin;    # for a hedge

my $slow = $t->origin_port(0);

my $locations = <<'EOT';
        location /f/ {
            singleflight_lone fetch;
            proxy_intercept_errors on;
            error_page 404 = /errpage/;
            proxy_pass http://%%ORIGIN%%/;
        }

        location /d/ {
            proxy_intercept_errors on;
            error_page 404 = /errpage/;
            proxy_pass http://%%ORIGIN%%/;
        }

        location /errpage/ {
            proxy_pass http://%%ORIGIN%%/errpage?size=33;
        }

        location /r/ {
            proxy_intercept_errors on;
            recursive_error_pages on;
            error_page 404 = @second;
            proxy_pass http://%%ORIGIN%%/;
        }

        location @second {
            proxy_intercept_errors on;
            error_page 502 = @third;
            rewrite ^ /second?status=502&size=10&delay=200? break;
            proxy_pass http://%%ORIGIN%%;
        }

        location @third {
            rewrite ^ /third?size=44&delay=200? break;
            proxy_pass http://%%ORIGIN%%;
        }

        location /e/ {
            singleflight_lone fetch;
            proxy_intercept_errors on;
            error_page 404 = /hedged/;
            proxy_pass http://%%ORIGIN%%/;
        }

        location /hedged/ {
            singleflight_lone fetch;
            singleflight_hedge 100ms;
            proxy_pass http://two/hedged?size=33&slow=%%SLOW%%:400;
        }
EOT
$locations =~ s/%%SLOW%%/$slow/g;

$t->write_config($t->config_template(<<"EOT"));
    singleflight_zone zone=sf:1m;

    upstream two {
        server %%ORIGIN%%;
        server %%ORIGIN_1%%;
    }

    log_format chain '\$server_port \$request_uri \$status '
                     'sf=\$singleflight_status us=[\$upstream_status] '
                     'ua=[\$upstream_addr] '
                     'url=[\$upstream_response_length]';

    server {
        listen 127.0.0.1:%%PORT%%;
        singleflight sf;
        access_log %%TESTDIR%%/chain.log chain;
$locations
    }

    # plain nginx, for the answers
    server {
        listen 127.0.0.1:%%PORT_1%%;
        access_log %%TESTDIR%%/chain.log chain;
$locations
    }
EOT

$t->start;

my $origin = $t->origin->addr;

# the log lines of one URI on one server, the port and origin address out
sub lines {
    my ($port, $uri, $n) = @_;
    my @l;
    $t->wait_for(sub {
        @l = grep { index($_, "$port $uri ") == 0 }
             split /\n/, $t->read_file('chain.log');
        @l >= $n;
    }, what => "$n log lines of $uri on $port");
    return map { my $l = $_; $l =~ s/^\d+ //; $l =~ s/\Q$origin\E/o/g; $l } @l;
}

sub shape {
    my ($l) = @_;
    $l =~ s/ sf=\S+//;
    return $l;
}

# the upstream requests a line tells of
sub logged {
    my ($l) = @_;
    my ($us) = $l =~ /us=\[([^\]]*)\]/;
    return 0 if !defined $us || $us eq '-';
    return scalar(() = $us =~ /\d{3}/g);
}

# one request, or a herd of n, 30 ms apart, on one server: the origin
# requests they made
sub run {
    my ($port, $uri, $n) = @_;
    my $before = $t->origin_hits->{total};
    my @h;
    for (1 .. $n) {
        push @h, $t->start_request('GET', $uri, port => $port);
        select(undef, undef, undef, 0.03);
    }
    my $res = $t->finish_all(\@h);
    is(scalar(grep { ($_->{status} // 0) == 200 } @$res), $n,
       "$uri on $port: every client answered 200");
    return $t->origin_hits->{total} - $before;
}

my ($on, $off) = ($t->port(0), $t->port(1));

# a lone request, singleflight_lone fetch: its fetch's 404, then the page's

{
    my $uri = '/f/a?status=404&size=10&delay=100';
    run($on, $uri, 1);
    run($off, $uri, 1);
    my ($l_on) = lines($on, $uri, 1);
    my ($l_off) = lines($off, $uri, 1);
    is(shape($l_on), shape($l_off),
       'lone fetch then error_page: the chain as without the module');
    like($l_off, qr/us=\[404 : 200\]/, 'plain nginx logs "404 : 200"');
}

# a herd: the first request on its own way, then a follower leads a fetch

{
    my $uri = '/d/b?status=404&size=10&delay=400';
    my $made = run($on, $uri, 5);
    run($off, $uri, 5);
    my @on = lines($on, $uri, 5);
    my ($l_off) = lines($off, $uri, 1);
    my @leader = grep { /sf=LEADER/ } @on;
    is(scalar @leader, 1, 'herd: one LEADER') or diag(join "\n", @on);
    is(shape($leader[0] // ''), shape($l_off),
       'herd: the leader logs the chain as without the module');
    my $logged = 0;
    $logged += logged($_) for @on;
    is($logged, $made, "herd: each of the $made origin requests logged once")
        or diag(join "\n", @on);
}

# a herd through two error pages; the second one's origin answers 502,
# which nginx intercepts: the origin's own, not fetched again (http_502
# is not in singleflight_promote's default)

{
    my $uri = '/r/c?status=404&size=10&delay=400';
    my $made = run($on, $uri, 5);
    my @on = lines($on, $uri, 5);
    my $logged = 0;
    $logged += logged($_) for @on;
    is($logged, $made,
       "two error pages: each of the $made origin requests logged once")
        or diag(join "\n", @on);
    my @leader = grep { /sf=LEADER/ } @on;
    like($leader[0] // '', qr/us=\[404 : 502 : 200\]/,
       'the fetch of the first error page, not made again: "404 : 502 : 200"')
        or diag(join "\n", @on);
}

# after the error_page, a fetch and its hedge (the first origin slow):
# the hedge's upstream follows the first location's too

{
    my $uri = '/e/h?status=404&size=10';
    my $r = $t->get($uri);
    is($r->{status}, 200, 'hedged fetch after an error_page: 200');
    my ($l) = lines($on, $uri, 1);
    diag($l) if $ENV{TEST_VERBOSE};
    like($l, qr/us=\[404 : (?:\d{3}, )?200\]/,
         'hedged fetch after an error_page: the first location\'s 404 first')
        or diag($l);
}

done_testing;
