#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_resume_length: what a fetch stores or sends ends exactly
# at the length its header announced.  A body that goes on past its
# Content-Length, or ends before it, is broken, as one an upstream sent
# too much or too little of: the flight breaks off there, nobody gets
# more than that length, nobody's response is taken for complete, and
# every reader's connection is closed after what it had, never kept alive
# (where its client would read the extra bytes as the next response, or
# wait for the missing ones).
#
# Covered: a content handler that says one length and sends another
# (embedded perl, where Debian's nginx has it), its response stored, and
# unstored (singleflight_lazy).

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $MODULES = $ENV{TEST_NGINX_MODULES} // '/usr/lib/nginx/modules';

my $t = SFTest->new(log_level => 'info');
$t->skip_without_module;

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

my $perl_locations = $perl ? <<"EOT" : '';
        location /perl/ {
            singleflight sf;
            singleflight_lazy off;
$PERL
        }

        location /perl_lazy/ {
            singleflight sf;
            singleflight_lazy 1m;
$PERL
        }
EOT

$t->write_config($t->config_template(<<"EOT",
    singleflight_zone zone=sf:4m;

    server {
        listen 127.0.0.1:%%PORT%%;

$perl_locations
        location = /stats {
            singleflight_stats;
        }
    }
EOT
    main => $perl ? "load_module $MODULES/ngx_http_perl_module.so;" : ''));
$t->start;

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

my $z;
ok($t->wait_for(sub {
    $z = $t->stats('/stats')->{zones}{sf};
    $z->{in_flight} == 0 && $z->{readers} == 0
        && $z->{pages_used} == $z->{pages_baseline};
}, what => 'baseline'), 'zone back to baseline');

done_testing;
