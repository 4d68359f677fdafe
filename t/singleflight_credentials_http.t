#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_credentials http, the default: requests with credentials
# are collapsed, and given what a shared cache could give them (RFC 9111
# sections 3 and 3.5), as nginx's proxy_cache would.
#
#   A Cookie: a response with a freshness of its own (max-age, s-maxage,
#   Expires) or "public", and no private, no-store, Set-Cookie or
#   "Vary: Cookie", is shared with them.  Browsers send some cookie with
#   most requests: a herd of 100 with "Cookie: _ga=GA1.2.3" is one origin
#   request, where without the module it is 100.  Any other response is
#   not theirs: a leader with a cookie keeps it (its key marked for a
#   while, as a private response's is), followers with a cookie go
#   upstream on their own (NOT_SHARED) and the key is marked for them, so
#   that the next ones do not wait for it.
#
#   An Authorization: only a response that says public, s-maxage or
#   must-revalidate, and is fresh.  Freshness as a shared cache takes it:
#   s-maxage, else max-age, else Expires; never with no-cache; before
#   them all X-Accel-Expires, as proxy_cache takes it.
#
# Each herd is compared with the same requests through a server without
# the module, at the same moment: status and body (the origin's body here
# is the same for every request: fixed=1).  All of it twice: with
# singleflight_lone fetch (every request, a lone one too, through a fetch)
# and with the default, where the first request goes its own way and the
# herd's flight takes its response (the rules are applied at its header).

use strict;
use warnings;

use Test::More;
use POSIX qw(strftime);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'sf' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF "[\$singleflight_status]" always;

        location / {
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight off;
            singleflight_stats;
        }
    }
EOT
}

# cookies as a browser sends them
my @COOKIES = ('_ga=GA1.2.3', '_ga=GA1.2.3; _gid=GA1.2.99; theme=dark',
               'session=abc', '_ga=GA1.2.4');

my $n = 0;

# $n clients on port 0 and $n on port 1 at once; headers from $hdr->($i).
sub both {
    my ($path, $count, $hdr) = @_;
    my @h;
    for my $port ($t->port(0), $t->port(1)) {
        push @h, map { $t->start_request('GET', $path, port => $port,
                                         headers => $hdr->($_), timeout => 20) }
            0 .. $count - 1;
    }
    my $res = $t->finish_all(\@h);
    return ([ @$res[0 .. $count - 1] ], [ @$res[$count .. 2 * $count - 1] ]);
}

# a query parameter's value, URL-encoded
sub enc { (my $v = $_[0]) =~ s/([^A-Za-z0-9_.~-])/sprintf('%%%02X', ord $1)/ge; $v }

sub norm { (my $b = $_[0] // '') =~ s/\bhit=\d+/hit=N/; $b }

sub same_as_off {
    my ($what, $on, $off) = @_;
    my @bad = grep { ($on->[$_]{status} // 0) != ($off->[$_]{status} // -1)
                     || !$on->[$_]{complete}
                     || norm($on->[$_]{body}) ne norm($off->[$_]{body}) } 0 .. $#$on;
    is(scalar(@bad), 0, "$what: every client what it gets without the module")
        or diag(explain($on->[ $bad[0] ]));
}

sub statuses {
    my ($res) = @_;
    my %by = SFTest::tally(map { $_->{headers}{'x-sf'} // '' } @$res)->%*;
    return join ' ', map { "$_$by{$_}" } sort keys %by;
}


for my $lone (qw(fetch direct)) {
    $t->stop;
    $t->write_config($t->config_template(<<"EOT" . $servers, log_singleflight => 1));
    singleflight_zone zone=sf:4m;
    singleflight_lone $lone;
EOT
    $t->start;

    subtest "singleflight_lone $lone" => sub {
        # A herd of 100 with a browser's cookie on a response fresh for a minute.
        # The origin answers 1.5 s after the first request: 200 clients
        # starting at once took more than 300 ms against nginx under ASan,
        # and one that came after the flight had ended led its own.
        {
            my $path = '/cached/a?delay=1500&fixed=1&size=5000&hdr=Cache-Control:max-age%3D60';
            $t->origin_reset;
            my ($on, $off) = both($path, 100, sub { [ Cookie => $COOKIES[ $_[0] % @COOKIES ] ] });
            same_as_off('cookies, max-age=60', $on, $off);
            is($t->origin_uri_hits($path), 1 + 100,
               'cookies, max-age=60: one origin request with the module, 100 without');
            is(statuses($on), '[FOLLOWER]99 [LEADER]1', 'cookies, max-age=60: a leader, 99 followers');
        }

        # The same with public, with s-maxage, with an Expires to come,
        # with nginx's own X-Accel-Expires (hidden from clients)
        for my $c ([ 'public', 'hdr=Cache-Control:public' ],
                   [ 's-maxage=30', 'hdr=Cache-Control:s-maxage%3D30' ],
                   [ 'X-Accel-Expires: 60', 'hdr=X-Accel-Expires:60' ],
                   [ 'Expires', 'hdr=Expires:' . enc(strftime('%a, %d %b %Y %H:%M:%S GMT',
                                                               gmtime(time + 3600))) ]) {
            my ($what, $q) = @$c;
            my $path = "/fresh/" . ++$n . "?delay=300&fixed=1&$q";
            $t->origin_reset;
            my ($on, $off) = both($path, 10, sub { [ Cookie => $COOKIES[ $_[0] % @COOKIES ] ] });
            same_as_off("cookies, $what", $on, $off);
            is($t->origin_uri_hits($path), 1 + 10, "cookies, $what: one origin request");
        }

        # Responses no shared cache gives to requests with a cookie: no freshness,
        # max-age=0, no-store; stale for a shared cache (s-maxage=0 before
        # max-age, max-age=0 before an Expires to come), no-cache (not
        # without asking the origin), a directive after a tab.  A herd
        # whose leader has no cookie and whose followers all have one: the
        # leader's own, the followers upstream on their own, as without
        # the module.
        my $later = 'hdr=Expires:' . enc(strftime('%a, %d %b %Y %H:%M:%S GMT', gmtime(time + 3600)));
        for my $c ([ 'no freshness', '' ],
                   [ 'max-age=0', '&hdr=Cache-Control:max-age%3D0' ],
                   [ 'no-store', '&hdr=Cache-Control:no-store,max-age%3D60' ],
                   [ 's-maxage=0', '&hdr=Cache-Control:max-age%3D60,s-maxage%3D0' ],
                   [ 'max-age=0, Expires', "&hdr=Cache-Control:max-age%3D0&$later" ],
                   [ 'no-cache', '&hdr=Cache-Control:public,no-cache' ],
                   [ 'a tab, no-store', '&hdr=Cache-Control:max-age%3D60,%09no-store' ],
                   [ 'X-Accel-Expires: 0', '&hdr=Cache-Control:max-age%3D60&hdr=X-Accel-Expires:0' ]) {
            my ($what, $q) = @$c;
            my $path = "/notfresh/" . ++$n . "?delay=300&fixed=1$q";
            $t->origin_reset;
            my $res = $t->flight(leader => [ 'GET', $path ],
                                 followers => [ map { [ 'GET', $path, headers => [ Cookie => $_ ] ] }
                                                @COOKIES ]);
            my ($lead, @f) = @$res;
            is($lead->{headers}{'x-sf'}, '[LEADER]', "$what: the leader without a cookie leads");
            is(scalar(grep { ($_->{headers}{'x-sf'} // '') eq '[NOT_SHARED]' && $_->{complete} } @f),
               scalar @COOKIES, "$what: each follower with a cookie went upstream on its own");
            is($t->origin_uri_hits($path), 1 + @COOKIES, "$what: an origin request each");

            # the key is marked for requests with credentials: the next
            # ones go upstream at once, not after waiting for a flight's
            # header (with the default, the first of them goes its own
            # way, as any lone request)
            my ($m) = both($path, 2, sub { [ Cookie => 'session=late' ] });
            is(statuses($m), $lone eq 'fetch' ? '[PRIVATE]2' : '[DIRECT]1 [PRIVATE]1',
               "$what: later requests with a cookie go at once");
        }

        # "Vary: Cookie": each cookie its own variant, and none shared with
        # requests with a cookie: an origin request per client, as without the
        # module
        {
            my $path = '/varycookie/a?delay=300&fixed=1&hdr=Cache-Control:max-age%3D60&hdr=Vary:Cookie';
            $t->origin_reset;
            my ($on, $off) = both($path, 8, sub { [ Cookie => $COOKIES[ $_[0] % @COOKIES ] ] });
            same_as_off('Vary: Cookie', $on, $off);
            is($t->origin_uri_hits($path), 8 + 8, 'Vary: Cookie: an origin request each');
        }

        # A leader with a cookie, a response no shared cache would give to anyone
        # with a cookie: the leader's own; the followers, without one, upstream.
        {
            my $path = '/lead/a?delay=300&fixed=1';
            $t->origin_reset;
            my $res = $t->flight(leader => [ 'GET', $path, headers => [ Cookie => 'session=1' ] ],
                                 followers => [ ([ 'GET', $path ]) x 3 ]);
            is(statuses($res), '[LEADER]1 [NOT_SHARED]3',
               "a cookie's leader, no freshness: its own response, the others upstream");
            is($t->origin_uri_hits($path), 4, "a cookie's leader, no freshness: 4 origin requests");
        }

        # Authorization: only public, s-maxage or must-revalidate, and
        # fresh (a stale must-revalidate, or public with max-age=0, is
        # checked with the origin, with one's own credentials)
        for my $c ([ 'max-age=60', 'hdr=Cache-Control:max-age%3D60', 5 ],
                   [ 'public', 'hdr=Cache-Control:public', 1 ],
                   [ 'must-revalidate', 'hdr=Cache-Control:max-age%3D60,must-revalidate', 1 ],
                   [ 's-maxage=30', 'hdr=Cache-Control:s-maxage%3D30', 1 ],
                   [ 'must-revalidate, stale', 'hdr=Cache-Control:no-cache,must-revalidate,max-age%3D0', 5 ],
                   [ 'public, max-age=0', 'hdr=Cache-Control:public,max-age%3D0', 5 ]) {
            my ($what, $q, $want) = @$c;
            my $path = "/auth/" . ++$n . "?delay=300&fixed=1&$q";
            $t->origin_reset;
            my ($on, $off) = both($path, 5, sub { [ Authorization => "Bearer t$_[0]" ] });
            same_as_off("Authorization, $what", $on, $off);
            is($t->origin_uri_hits($path) - 5, $want,
               "Authorization, $what: $want origin request" . ($want > 1 ? 's' : ''));
        }

        # A follower with an Authorization refused a response that may go
        # to a Cookie: the key is marked for Authorizations only; requests
        # with a cookie right after still collapse
        {
            my $path = '/kinds/' . ++$n . '?delay=300&fixed=1&hdr=Cache-Control:max-age%3D60';
            $t->origin_reset;
            my $res = $t->flight(leader => [ 'GET', $path ],
                                 followers => [ [ 'GET', $path, headers => [ Authorization => 'Bearer x' ] ] ]);
            is($res->[1]{headers}{'x-sf'}, '[NOT_SHARED]', 'kinds: the Authorization went on its own');
            $t->origin_reset;
            my ($m) = both($path, 2, sub { [ Cookie => $COOKIES[0] ] });
            unlike(statuses($m), qr/PRIVATE/, 'kinds: requests with a cookie after it are not kept out');
            is($t->origin_uri_hits($path), 1 + 2, 'kinds: they share one origin request');
            my ($a) = both($path, 2, sub { [ Authorization => 'Bearer y' ] });
            like(statuses($a), qr/PRIVATE/, 'kinds: requests with an Authorization are');
        }

        # Set-Cookie in the response: never shared (singleflight_private)
        {
            my $path = '/setcookie/a?delay=300&fixed=1&hdr=Cache-Control:max-age%3D60&hdr=Set-Cookie:id%3D1';
            $t->origin_reset;
            my ($on, $off) = both($path, 5, sub { [ Cookie => 'session=1' ] });
            is($t->origin_uri_hits($path), 10, 'Set-Cookie: an origin request each');
        }

        $t->zone_baseline_ok('zone back to its baseline');
    };
}

done_testing;
