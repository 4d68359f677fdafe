#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)

# A module built as on a system without the NUMA interfaces (FreeBSD, or a
# Linux whose libc lacks sched_getcpu()): config's feature test overridden
# with -DNGX_HTTP_SINGLEFLIGHT_HAVE_NUMA=0 (tools/build-module.sh nonuma).
# It builds under nginx's -Werror, and nginx -t with scope=numa says the
# zone has one instance, as with scope=process.
#
# Not part of `make test`: run by `make test-nonuma` and .ci/run, with
# SF_MODULE set to build/nonuma/ngx_http_singleflight_module.so.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
plan skip_all => 'SF_MODULE is not the nonuma build'
    unless $t->{module} =~ m{/nonuma/};

$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m scope=numa;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://127.0.0.1:1;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT

my ($ok, $out) = $t->test_config;
ok($ok, 'nginx -t: scope=numa is accepted') or diag($out);
my $err = $t->read_file('nginx-t.err') // '';
my $said = 'scope=numa: this system has no NUMA interfaces, the zone has one'
    . ' instance as with scope=process';
like($out . $err, qr/\Q$said\E/,
    'nginx -t says scope=numa is reduced to one instance, as scope=process');

$t->start;
my $zone = $t->zone_stats('sf', '/stats');
ok(%$zone, 'the zone is there') or diag(explain($t->stats('/stats')));

my $r = $t->get('/x');
ok(defined $r->{status}, 'a request through the zone is answered');

done_testing;
