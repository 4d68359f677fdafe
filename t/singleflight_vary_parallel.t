#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_vary_parallel: followers whose request does not match the
# Vary of their flight's response start their own flight at once, one per
# distinct variant, all in parallel; a later request for a variant already
# being fetched joins that variant's flight.  Nobody queues behind another
# variant's flight.
#
# The origin echoes the request (echo=1), so each client can check that
# its response was made for its own User-Agent.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sfv '$remote_port $singleflight_status $request_uri';
    access_log %%TESTDIR%%/sf.log sfv;

    singleflight_zone zone=sf:1m;
    # every request through a fetch, a lone one too: what this file tests
    singleflight_lone fetch;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_timeout 3s;
            proxy_pass http://%%ORIGIN%%;
        }

        # stored even with nobody waiting at the header, for late joiners
        location /join {
            singleflight sf;
            singleflight_timeout 3s;
            singleflight_lazy off;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT

$t->start;

# ------------------------------------------------------------ helpers

# Starts a GET of $uri per User-Agent; returns the handles.
sub start_all {
    my ($uri, @ua) = @_;
    return map { $t->start_request('GET', $uri, headers => [ 'User-Agent' => $_ ], timeout => 10) } @ua;
}

# The clients (handles with their User-Agent) whose response is not a
# complete 200 echoing their own User-Agent.
sub wrong {
    my ($ua, $handles) = @_;
    return grep {
        my $r = $handles->[$_]{res};
        !(($r->{status} // 0) == 200 && $r->{complete} && $r->{body} =~ /\nuser-agent: \Q$ua->[$_]\E\n/)
    } 0 .. $#$handles;
}

# The latest completion of the handles, in seconds after $t0.
sub last_done {
    my ($t0, @h) = @_;
    my $last = 0;
    for (@h) {
        my $end = $_->{t0} + ($_->{res}{time} // 1e9) - $t0;
        $last = $end if $end > $last;
    }
    return $last;
}

# $singleflight_status of each handle, from the access log (by port).
sub sf_of {
    my @h = @_;
    my %by;
    $t->wait_for(sub {
        %by = map { (split ' ')[0, 1] } split /\n/, $t->read_file('sf.log');
        !grep { !exists $by{ $_->{local_port} } } @h;
    }, what => 'access log lines');
    return map { $by{ $_->{local_port} } // '?' } @h;
}

my $N = 20;

# ------------------------------------------------------------ at once

# The origin sends its header at once and the body a second later: the
# Vary is known right away, and the 20 variants are fetched in parallel.

my $uri = '/early?echo=1&body_delay=1000&hdr=Vary:User-Agent';
my @ua = map { "agent-$_" } 1 .. $N;
my $t0 = time;
my @h = start_all($uri, @ua);
$t->poll_all(\@h, timeout => 12);

my @bad = wrong(\@ua, \@h);
is(scalar @bad, 0, "at once: $N complete responses, each made for its own User-Agent")
    or diag(explain([ map { { ua => $ua[$_], status => $h[$_]{res}{status},
        error => $h[$_]{res}{error}, body => substr($h[$_]{res}{body}, 0, 200) } } @bad ]));
my $last = last_done($t0, @h);
cmp_ok($last, '<', 1.5, sprintf('at once: all %d answered within 1.5 origin delays (%.2f s)', $N, $last));
is($t->origin_uri_hits($uri), $N, "at once: $N origin requests, one per variant");

# ------------------------------------------------------------ cold

# The whole response after half a second: the Vary is learnt from the
# first response, then the other variants are fetched, in parallel.

$uri = '/cold?echo=1&delay=500&hdr=Vary:User-Agent';
@ua = map { "cold-$_" } 1 .. $N;
$t0 = time;
@h = start_all($uri, @ua);
$t->poll_all(\@h, timeout => 12);

@bad = wrong(\@ua, \@h);
is(scalar @bad, 0, "cold: $N complete responses, each made for its own User-Agent");
$last = last_done($t0, @h);
cmp_ok($last, '<', 1.5,
    sprintf('cold: all answered within 3 origin delays, not one after another (%.2f s)', $last));
is($t->origin_uri_hits($uri), $N, "cold: $N origin requests");

# ------------------------------------------------------------ joining a variant

# 10 variants in flight; then 10 more requests, one per variant: each joins
# the flight of its variant (stored: singleflight_lazy off; with it on, a
# response nobody else waited for at its header is its leader's alone).

$uri = '/join?echo=1&body_delay=1000&hdr=Vary:User-Agent';
my @first = map { "join-$_" } 1 .. 10;
$t0 = time;
my @h1 = start_all($uri, @first);
$t->wait_for(sub { $t->origin_uri_hits($uri) >= 10 }, timeout => 3,
    what => 'the 10 variants at the origin');
my @second = reverse @first;
my @h2 = start_all($uri, @second);
$t->poll_all([ @h1, @h2 ], timeout => 12);

@bad = (wrong(\@first, \@h1), map { $_ + 10 } wrong(\@second, \@h2));
is(scalar @bad, 0, 'join: 20 complete responses, each made for its own User-Agent');
is($t->origin_uri_hits($uri), 10, 'join: 10 origin requests, the later requests joined');
my %hit_of = map { $first[$_] => $h1[$_]{res}{headers}{'x-hit'} // 'none' } 0 .. 9;
is(scalar(grep { ($h2[$_]{res}{headers}{'x-hit'} // '') eq $hit_of{ $second[$_] } } 0 .. 9), 10,
    "join: each later request got its variant's response");
$last = last_done($t0, @h1, @h2);
cmp_ok($last, '<', 1.5, sprintf('join: all answered within 1.5 origin delays (%.2f s)', $last));
is(join(' ', sf_of(@h2)), join(' ', ('FOLLOWER') x 10), 'join: the later requests are FOLLOWERs');

done_testing;
