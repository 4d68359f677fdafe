#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_content: "singleflight" turned on for a whole http block,
# as an operator enabling it broadly would.  Only requests whose location
# goes to an origin through an upstream module (proxy_pass here, and
# try_files to a named location that has one) are collapsed; stub_status,
# static files and "return" answer exactly as without the module, with an
# empty $singleflight_status and no flight counted.  nginx -t says, at
# notice level, which locations it will not collapse and what would.
#
# And "singleflight on;" where no zone is declared: a zone of its own,
# "singleflight", in the statistics too.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $servers = '';
for my $i (0, 1) {
    my $sf = $i == 0 ? 'on' : 'off';
    $servers .= <<"EOT";
    server {
        listen 127.0.0.1:%%PORT_$i%%;
        singleflight $sf;
        add_header X-SF "[\$singleflight_status]" always;
        root %%TESTDIR%%/html;

        location = /status {
            stub_status;
        }

        location /static/ {
        }

        location /returned/ {
            return 200 "returned \$request_uri\\n";
        }

        location /app/ {
            proxy_pass http://%%ORIGIN%%;
        }

        location /tried/ {
            try_files \$uri \@backend;
        }

        location \@backend {
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
}

$t->write_config($t->config_template($servers));

mkdir $t->path('html');
mkdir $t->path('html/static');
mkdir $t->path('html/tried');
$t->write_file('html/static/page.html', "static page\n" x 100);
$t->write_file('html/tried/here.html', "tried here\n");

# nginx -t: a notice for each location that is not collapsed
my ($ok, $out) = $t->test_config;
ok($ok, 'nginx -t passes') or diag($out);
$out .= $t->read_file('nginx-t.err');    # its log, with -e
for my $loc ('= /status', '/static/', '/tried/') {
    (my $name = $loc) =~ s/^= //;
    like($out, qr/\[notice\] \S+ location "\Q$name\E" has no proxy_pass.*"singleflight" \(inherited\) does not collapse.*"singleflight singleflight content=any;" would/,
         "nginx -t: a notice for location $loc");
}
unlike($out, qr/\[notice\].*location "(?:\/app\/|\@backend)"/,
       'nginx -t: no notice for the locations with proxy_pass');

$t->start;

sub stats { $t->zone_stats('singleflight') }

# a herd on port 0 (module on) and one on port 1 (off), at once
sub both {
    my ($path, $n) = @_;
    my @h = map { $t->start_request('GET', $path, port => $t->port($_ < $n ? 0 : 1)) }
        0 .. 2 * $n - 1;
    my $res = $t->finish_all(\@h);
    return ([ @$res[0 .. $n - 1] ], [ @$res[$n .. 2 * $n - 1] ]);
}

sub untouched {
    my ($what, $path, $n, %opt) = @_;
    my $before = stats()->{flights} // 0;
    my ($on, $off) = both($path, $n);
    my $norm = $opt{norm} // sub { $_[0] // '' };
    my @bad = grep {
        ($on->[$_]{status} // 0) != ($off->[0]{status} // -1)
        || !$on->[$_]{complete}
        || $norm->($on->[$_]{body}) ne $norm->($off->[0]{body})
    } 0 .. $n - 1;
    is(scalar(@bad), 0, "$what: $n of $n answered as without the module "
                        . "($off->[0]{status})")
        or diag(explain($on->[ $bad[0] ]));
    is(scalar(grep { ($_->{headers}{'x-sf'} // '') ne '[]' } @$on), 0,
       "$what: \$singleflight_status empty for all");
    is((stats()->{flights} // 0) - $before, 0, "$what: no flight counted");
}

untouched('static file', '/static/page.html', 20);
untouched('return', '/returned/x', 20);
# stub_status counts what it counts: compared for its shape only
untouched('stub_status', '/status', 20,
          norm => sub { (my $b = $_[0] // '') =~ s/\d+/N/g; $b });

# try_files finding the file: static, not collapsed
untouched('try_files, the file', '/tried/here.html', 10);

# proxy_pass: a herd collapses, one origin request
{
    $t->origin_reset;
    my $path = '/app/x?delay=300';
    my $res = $t->herd(n => 20, path => $path);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 20,
       'proxy_pass: 20 complete 200 responses');
    is($t->origin_uri_hits($path), 1, 'proxy_pass: one origin request');
    my %by = SFTest::tally(map { $_->{headers}{'x-sf'} // '' } @$res)->%*;
    is($by{'[LEADER]'} // 0, 1, 'proxy_pass: one leader');
}

# try_files to a named location with proxy_pass: collapsed there
{
    $t->origin_reset;
    my $path = '/tried/missing?delay=300';
    my $res = $t->herd(n => 20, path => $path);
    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 20,
       'try_files to @backend: 20 complete 200 responses');
    is($t->origin_uri_hits($path), 1, 'try_files to @backend: one origin request');
}

my $z = stats();
ok(%$z, 'singleflight on: the zone "singleflight" is in the statistics');

$t->zone_baseline_ok('zone back to its baseline', zone => 'singleflight');

done_testing;
