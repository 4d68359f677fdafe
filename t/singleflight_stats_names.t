#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A zone's name in the statistics, whatever it is made of: in JSON as a
# JSON string, in Prometheus's text format as a label value escapes it
# (a backslash, a double quote and a line feed escaped, nothing else: a
# tab stays a tab, where the JSON way would write "\t", which a scraper
# reads as an error).

use strict;
use warnings;

use Test::More;
use JSON::PP qw(decode_json);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# q"u\o<TAB>te, written as nginx's configuration escapes it
$t->write_config($t->config_template(<<'EOT'));
    singleflight_zone "zone=q\"u\\o\tte:1m";

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight "q\"u\\o\tte";
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }

        location = /metrics {
            singleflight_stats prometheus;
        }
    }
EOT

$t->start;

my $name = "q\"u\\o\tte";

my $r = $t->get('/a?size=10');
is($r->{status}, 200, 'a request through the zone');

$r = $t->get('/stats');
my $json = eval { decode_json($r->{body}) };
ok($json, 'JSON: it parses') or diag($@);
ok($json && $json->{zones}{$name}, 'JSON: the zone under its name');

$r = $t->get('/metrics');
my $label = 'zone="q\\"u\\\\o' . "\t" . 'te"';
my @lines = grep { /^nginx_singleflight_in_flight\{/ } split /\n/, $r->{body};
is_deeply(\@lines, [ "nginx_singleflight_in_flight{$label} 0" ],
          'Prometheus: the label escaped as the text format says')
    or diag(explain(\@lines));
ok($r->{body} !~ /\\t|\\u00/, 'Prometheus: no JSON escape');

done_testing;
