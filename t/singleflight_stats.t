#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_stats: the JSON is parsed, the Prometheus text exposition is
# parsed line by line (and checked by promtool where it is installed), and
# the counters match exactly what the test did and what the access log
# says of each request.  The names are Prometheus's, the same in JSON; the
# names of the release before are still there, the diagnostics only with
# ?diagnostics=1.  Also the embedded variables in an access log.

use strict;
use warnings;

use Test::More;
use JSON::PP;
use FindBin;
use POSIX ();

use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

$t->write_config($t->config_template(<<'EOT'));
    log_format sf '$singleflight_status|$singleflight_key|$singleflight_wait_time|$request_uri';
    access_log %%TESTDIR%%/sf.log sf;

    singleflight_zone zone=sf:1m;
    singleflight_zone zone=other:64k scope=worker;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            singleflight_key $uri;
            singleflight_bypass $arg_nocollapse;
            proxy_pass http://%%ORIGIN%%;
        }

        # followers answered 504, which error_page sends to another flight
        location /noshare/ {
            singleflight sf;
            singleflight_share_errors off;
            singleflight_error_status 504;
            error_page 504 = /fb/x?delay=100;
            proxy_pass http://%%ORIGIN%%;
        }

        location /fb/ {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        # a lone request through a fetch, counted in origin_requests_total
        location /long {
            singleflight sf;
            singleflight_lone fetch;
            proxy_pass http://%%ORIGIN%%;
        }

        # a lone request leads a flight with its own upstream request
        location /own/ {
            singleflight sf;
            singleflight_lone own;
            proxy_pass http://%%ORIGIN%%;
        }

        location /other/ {
            singleflight other;
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

my $page = POSIX::sysconf(POSIX::_SC_PAGESIZE());

my @statuses = qw(LEADER FOLLOWER PROMOTED BYPASS TIMEOUT ERROR NOT_SHARED
                  NO_MEMORY OVERFLOW PRIVATE LOOP DIRECT);

# what README documents as deprecated: the JSON fields and Prometheus
# names of the release before, and those only shown with diagnostics
my @old_json = qw(flights followers served unstored resumes resume_failures
                  hedges hedge_wins retries promotions timeouts errors cut
                  dead_leaders abandoned not_shared oversized bypassed direct
                  loops overflows private vary_mismatches forgotten no_memory
                  bytes_shared pages_used pages_free wait_ms flight_header_ms
                  flight_ms);
my @old_json_diag = qw(late_joins spilled nospill wakeups notify_failed marks
                       pages_baseline);
my @old_prom = map { "nginx_singleflight_$_" }
               qw(flights_total followers_total followers_served_total
                  hedges_total retries_total promotions_total timeouts_total
                  errors_total not_shared_total bypassed_total direct_total
                  loops_total overflows_total private_total zone_pages_used
                  zone_pages_free);
my @old_prom_diag = ('nginx_singleflight_zone_pages_baseline');
my @diag = qw(late_joins_total spilled_total nospill_total wakeups_total
              wakeup_failures_total private_marks zone_baseline_bytes);

sub json_stats {
    my ($path) = @_;
    my $raw = $t->get($path);
    return eval { decode_json($raw->{body}) } // {};
}

# the access log's lines of the URIs that match $re: [status, key, wait, uri]
sub log_lines {
    my ($re) = @_;
    return map { [ split /\|/ ] } grep { (split /\|/)[3] =~ $re }
           split /\n/, $t->read_file('sf.log');
}

# zone sf's requests_total once their sum is $n (they are counted as the
# requests end, the access log line just before)
sub requests_at {
    my ($n) = @_;
    my $r;
    $t->wait_for(sub {
        $r = json_stats('/stats')->{zones}{sf}{requests_total} // {};
        my $sum = 0;
        $sum += $_ for values %$r;
        $sum >= $n;
    }, what => "$n requests counted");
    return $r;
}

sub rose {
    my ($before, $after) = @_;
    my %d = map { $_ => $after->{$_} - ($before->{$_} // 0) } keys %$after;
    delete @d{ grep { !$d{$_} } keys %d };
    return \%d;
}

# ------------------------------------------------------------ traffic

my $res = $t->herd(n => 10, path => '/a?delay=300&size=1000');
is(scalar(grep { $_->{status} == 200 } @$res), 10, 'herd answered');

$t->get('/b?nocollapse=1');
$t->get('/other/c');

# ------------------------------------------------------------ JSON

my $raw = $t->get('/stats');
is($raw->{headers}{'content-type'}, 'application/json', 'JSON: content type');

my $requests = requests_at(11);

my $json = eval { decode_json($t->get('/stats')->{body}) };
ok($json, 'JSON: parses') or diag($raw->{body});

# the module's version is the package's
my ($changelog) = $t->read_file("$FindBin::Bin/../debian/changelog") =~ /^\S+ \(([^)]+)\)/;
# (Angie's -v names Angie's version, not the nginx one it is built on)
my ($nginx_v) = `${\ $t->nginx_binary} -v 2>&1` =~ m{nginx/(\S+)};
$nginx_v //= ($json->{build_info}{nginx} // '') =~ /^\d+\.\d+\.\d+$/
             ? $json->{build_info}{nginx} : 'an nginx version';
is_deeply($json->{build_info}, { version => $changelog, nginx => $nginx_v },
          'JSON: build_info, the version debian/changelog has and nginx\'s');

my $sf = $json->{zones}{sf};
is($sf->{scope}, 'process', 'JSON: scope');

is_deeply([ sort keys %{ $sf->{requests_total} } ], [ sort @statuses ],
          'JSON: requests_total has every $singleflight_status word');
is_deeply(rose({}, $sf->{requests_total}), { LEADER => 1, FOLLOWER => 9, BYPASS => 1 },
          'JSON: requests_total: a herd of 10 is 1 LEADER and 9 FOLLOWER, and a BYPASS');
my %logged = %{ SFTest::tally(map { $_->[0] } log_lines(qr{^/[ab]\?})) };
is_deeply(rose({}, $sf->{requests_total}), \%logged,
          'JSON: requests_total is what the access log says of each');
is_deeply($sf->{origin_requests_total}, { first => 1, retry => 0, hedge => 0, resume => 0 },
          'JSON: origin_requests_total: the flight\'s one fetch');
is($sf->{origin_requests_total}{first}, $t->origin_uri_hits('/a?delay=300&size=1000'),
   'JSON: origin_requests_total, as the origin saw them');
is($sf->{shared_bytes_total}, 9 * 1000, 'JSON: shared_bytes_total');
is($sf->{in_flight}, 0, 'JSON: nothing in flight');
is($sf->{workers}, scalar($t->worker_pids), 'JSON: workers');
ok($sf->{zone_bytes}{used} > 0 && $sf->{zone_bytes}{free} > 0, 'JSON: zone_bytes');
is(scalar @{ $sf->{instances} }, 1, 'JSON: one instance');
is($json->{zones}{other}{scope}, 'worker', 'JSON: second zone');
is($json->{zones}{other}{requests_total}{LEADER}, 1, 'JSON: second zone counted');

# the histograms: the origin takes 300 ms, so the flight's header and end
# come no sooner; every follower's wait is counted once
for my $h (qw(wait_seconds flight_header_seconds flight_seconds)) {
    my $hg = $sf->{$h};
    ok($hg && ref $hg->{buckets} eq 'ARRAY', "JSON: histogram $h")
        or next;
    is(scalar @{ $hg->{buckets} }, @{ $hg->{le} } + 1,
       "JSON: $h has a bucket per bound and +Inf");
    is($hg->{buckets}[-1], $hg->{count}, "JSON: $h +Inf is the count");
    ok(!grep({ $hg->{buckets}[$_] > $hg->{buckets}[$_ + 1] }
             0 .. $#{ $hg->{buckets} } - 1),
       "JSON: $h cumulative");
    is($hg->{le}[0], 0.001, "JSON: $h in seconds");
}
is($sf->{wait_seconds}{count}, 9, 'JSON: nine followers\' waits');
is($sf->{flight_header_seconds}{count}, 1, 'JSON: one flight header');
is($sf->{flight_seconds}{count}, 1, 'JSON: one flight ended');
for my $h (qw(flight_header_seconds flight_seconds)) {
    my ($i) = grep { $sf->{$h}{le}[$_] == 0.25 } 0 .. $#{ $sf->{$h}{le} };
    is($sf->{$h}{buckets}[$i], 0, "JSON: $h: none within 250 ms");
    ok($sf->{$h}{sum} >= 0.3, "JSON: $h: sum at least the origin's 0.3 s");
}

# the names of the release before, for one release, the same values
ok(!grep({ !exists $sf->{$_} } @old_json), 'JSON: the old fields are there')
    or diag(explain([ grep { !exists $sf->{$_} } @old_json ]));
is($sf->{flights}, 1, 'JSON: old flights');
is($sf->{followers}, 9, 'JSON: old followers');
is($sf->{served}, 9, 'JSON: old served');
is($sf->{bypassed}, 1, 'JSON: old bypassed');
# five of them are requests_total's own values
for (['bypassed', 'BYPASS'], ['direct', 'DIRECT'], ['loops', 'LOOP'],
     ['overflows', 'OVERFLOW'], ['private', 'PRIVATE'])
{
    is($sf->{$_->[0]}, $sf->{requests_total}{$_->[1]},
       "JSON: old $_->[0], requests_total{status=\"$_->[1]\"}");
}
is($sf->{bytes_shared}, $sf->{shared_bytes_total}, 'JSON: old bytes_shared');
is($sf->{pages_used} * $page, $sf->{zone_bytes}{used}, 'JSON: zone_bytes used, pages in bytes');
is($sf->{pages_free} * $page, $sf->{zone_bytes}{free}, 'JSON: zone_bytes free, pages in bytes');
is($sf->{wait_ms}{count}, $sf->{wait_seconds}{count}, 'JSON: old wait_ms count');
is($sf->{wait_ms}{sum}, sprintf('%.0f', $sf->{wait_seconds}{sum} * 1000),
   'JSON: old wait_ms sum, in ms');

# diagnostics: asked for
my @all_diag = (@diag, @old_json_diag);
ok(!grep({ exists $sf->{$_} } @all_diag), 'JSON: no diagnostics by default')
    or diag(explain([ grep { exists $sf->{$_} } @all_diag ]));
my $sfd = json_stats('/stats?diagnostics=1')->{zones}{sf};
ok(!grep({ !exists $sfd->{$_} } @all_diag), 'JSON: ?diagnostics=1: diagnostics')
    or diag(explain([ grep { !exists $sfd->{$_} } @all_diag ]));
is($sfd->{zone_baseline_bytes}, $sfd->{pages_baseline} * $page,
   'JSON: zone_baseline_bytes, pages in bytes');
is($sfd->{wakeup_failures_total}, $sfd->{notify_failed}, 'JSON: wakeup_failures_total');
is($sfd->{private_marks}, $sfd->{marks}, 'JSON: private_marks');

# ------------------------------------------------------------ Prometheus

my $name = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
my $label = qr/[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"/;

# {type, help, sample, bad}: each family's TYPE and HELP, each sample
sub prometheus {
    my ($body) = @_;
    my (%type, %help, %sample, @bad);
    for my $line (split /\n/, $body) {
        if ($line =~ /^# HELP ($name) (\S.*)$/) {
            push @bad, "second HELP: $line" if exists $help{$1};
            $help{$1} = $2;
        } elsif ($line =~ /^# TYPE ($name) (counter|gauge|histogram)$/) {
            push @bad, "second TYPE: $line" if exists $type{$1};
            $type{$1} = $2;
        } elsif ($line =~ /^($name)\{($label(?:,$label)*)\} (\d+(?:\.\d+)?)$/) {
            my ($m, $labels, $v) = ($1, $2, $3);
            (my $family = $m) =~ s/_(?:bucket|sum|count)$//;
            $family = $m unless ($type{$family} // '') eq 'histogram';
            push @bad, "sample before its TYPE: $line" unless $type{$family};
            push @bad, "second sample: $line" if exists $sample{"$m\{$labels\}"};
            $sample{"$m\{$labels\}"} = $v;
        } else {
            push @bad, $line;
        }
    }
    return { type => \%type, help => \%help, sample => \%sample, bad => \@bad };
}

# promtool's own check, where Debian's prometheus package put it
sub promtool_ok {
    my ($body, $what) = @_;
    SKIP: {
        skip 'no promtool (Debian package prometheus)', 1
            unless grep { -x "$_/promtool" } split /:/, $ENV{PATH};
        $t->write_file('metrics.txt', $body);
        my $out = `promtool check metrics < ${\ $t->path('metrics.txt')} 2>&1`;
        is($? >> 8, 0, "Prometheus: promtool check metrics, $what") or diag($out);
    }
}

my $prom = $t->get('/metrics');
like($prom->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4},
     'Prometheus: content type');
is($t->get('/stats?format=prometheus')->{body} =~ /^# TYPE/m ? 1 : 0, 1,
   'Prometheus: ?format=prometheus');

my $p = prometheus($prom->{body});
my (%type, %sample);
%type = %{ $p->{type} };
%sample = %{ $p->{sample} };

is_deeply($p->{bad}, [], 'Prometheus: every line parses, once');
is_deeply([ sort keys %{ $p->{help} } ], [ sort keys %type ], 'Prometheus: HELP for each');
ok(!grep({ $type{$_} eq 'counter' && !/_total$/ } keys %type),
   'Prometheus: counters end in _total');
ok(!grep({ !/^nginx_singleflight_/ } keys %type),
   'Prometheus: names start nginx_singleflight_');
promtool_ok($prom->{body}, 'the default');

is($sample{qq{nginx_singleflight_build_info{version="$changelog",nginx="$nginx_v"}}}, 1,
   'Prometheus: build_info');
is($sample{qq{nginx_singleflight_requests_total{zone="sf",status="$_"}}},
   $sf->{requests_total}{$_}, "Prometheus: requests_total $_")
    for @statuses;
is($sample{'nginx_singleflight_origin_requests_total{zone="sf",reason="first"}'}, 1,
   'Prometheus: origin_requests_total');
is($sample{'nginx_singleflight_shared_bytes_total{zone="sf"}'}, 9000,
   'Prometheus: shared bytes');
is($sample{'nginx_singleflight_in_flight{zone="sf"}'}, 0,
   'Prometheus: in flight');
is($sample{'nginx_singleflight_zone_bytes{zone="sf",state="used"}'}, $sf->{zone_bytes}{used},
   'Prometheus: zone_bytes');

is($type{nginx_singleflight_wait_seconds}, 'histogram',
   'Prometheus: wait_seconds is a histogram');
is($sample{'nginx_singleflight_wait_seconds_count{zone="sf"}'}, 9,
   'Prometheus: wait count');
is($sample{'nginx_singleflight_wait_seconds_bucket{zone="sf",le="+Inf"}'}, 9,
   'Prometheus: wait +Inf bucket');
cmp_ok($sample{'nginx_singleflight_wait_seconds_sum{zone="sf"}'}, '==',
       $sf->{wait_seconds}{sum}, 'Prometheus: wait sum, as in JSON');
is($sample{'nginx_singleflight_flight_header_seconds_bucket{zone="sf",le="0.25"}'},
   0, 'Prometheus: no header within 0.25 s');
ok($sample{'nginx_singleflight_flight_seconds_sum{zone="sf"}'} >= 0.3,
   'Prometheus: flight time sum in seconds');
is(scalar(grep { /^# TYPE nginx_singleflight_wait_seconds / } split /\n/,
                 $prom->{body}), 1,
   'Prometheus: one TYPE per family with two zones');

my @other = grep { /^nginx_singleflight_requests_total\{zone="other",worker="\d+",status="LEADER"\}$/ }
            keys %sample;
ok(@other >= 1, 'Prometheus: per-worker samples of a scope=worker zone');

# the names: JSON's are Prometheus's less the prefix; the old ones are
# marked deprecated in their HELP
my @deprecated = sort grep { $p->{help}{$_} =~ /^Deprecated/ } keys %type;
is_deeply(\@deprecated, [ sort @old_prom ], 'Prometheus: the old names, deprecated');
my %old_json = map { $_ => 1 } @old_json;
is_deeply([ sort grep { !$old_json{$_} && $_ ne 'scope' && $_ ne 'instances' } keys %$sf ],
          [ sort map { s/^nginx_singleflight_//r }
                 grep { $p->{help}{$_} !~ /^Deprecated/ && $_ ne 'nginx_singleflight_build_info' }
                 keys %type ],
          'JSON and Prometheus: the same names');

ok(!grep({ exists $type{"nginx_singleflight_$_"} } @diag, @old_prom_diag),
   'Prometheus: no diagnostics by default');
my $promd = $t->get('/metrics?diagnostics=1')->{body};
my $pd = prometheus($promd);
is_deeply($pd->{bad}, [], 'Prometheus: ?diagnostics=1: every line parses, once');
ok(!grep({ !exists $pd->{type}{"nginx_singleflight_$_"} } @diag),
   'Prometheus: ?diagnostics=1: diagnostics');
is_deeply([ sort grep { $pd->{help}{$_} =~ /^Deprecated/ } keys %{ $pd->{type} } ],
          [ sort @old_prom, @old_prom_diag ],
          'Prometheus: ?diagnostics=1: the old names too');
promtool_ok($promd, 'with diagnostics');

# ------------------------------------------------------------ variables

$t->wait_for(sub { log_lines(qr{^/a\?}) >= 10 }, what => 'herd logged');

my @lines = log_lines(qr{^/a\?});
is(scalar(grep { $_->[0] eq 'LEADER' } @lines), 1, '$singleflight_status LEADER');
is(scalar(grep { $_->[0] eq 'FOLLOWER' } @lines), 9, '$singleflight_status FOLLOWER');
is(scalar(grep { $_->[1] eq '/a' } @lines), 10, '$singleflight_key');
ok(!grep({ $_->[0] eq 'FOLLOWER' && ($_->[2] !~ /^\d+$/ || $_->[2] > 1000) } @lines),
   '$singleflight_wait_time of followers in ms');
is((grep { $_->[0] eq 'LEADER' } @lines)[0][2], '-',
   '$singleflight_wait_time empty for the leader');

my ($b) = log_lines(qr{^/b\?});
is($b->[0], 'BYPASS', '$singleflight_status BYPASS');

# ------------------------------------------------------------ every wait

# A private response: its followers waited for its header, then went
# upstream themselves (NOT_SHARED).  Their waits are theirs all the same:
# in $singleflight_wait_time, and in the wait histogram, each once.

my $s0 = json_stats('/stats')->{zones}{sf};
$res = $t->herd(n => 20, path => '/p?delay=300&hdr=Cache-Control:private');
is(scalar(grep { $_->{status} == 200 } @$res), 20, 'private herd answered');

my @p;
$t->wait_for(sub { (@p = log_lines(qr{^/p\?})) >= 20 }, what => 'private herd logged');
my @ns = grep { $_->[0] eq 'NOT_SHARED' } @p;
ok(@ns >= 10, 'private herd: followers refused (' . scalar(@ns) . ')')
    or diag(explain(\@p));
ok(!grep({ $_->[2] !~ /^\d+$/ || $_->[2] <= 0 || $_->[2] > 1300 } @ns),
   'private herd: each refused follower logs its wait, about the origin\'s 300 ms')
    or diag(explain([ map { $_->[2] } @ns ]));

my $r1 = requests_at(11 + 20);
my $s1 = json_stats('/stats')->{zones}{sf};
is($s1->{wait_seconds}{count} - $s0->{wait_seconds}{count}, scalar @ns,
   'private herd: the wait histogram counts each refused follower');
my $logged = 0;
$logged += $_->[2] for @ns;
is($s1->{wait_ms}{sum} - $s0->{wait_ms}{sum}, $logged,
   'private herd: the histogram\'s sum is the waits logged');
is_deeply(rose($s0->{requests_total}, $r1), SFTest::tally(map { $_->[0] } @p),
          'private herd: requests_total is what the access log says of each');

# ------------------------------------------------------------ once each

# share_errors off: the leader gets the origin's 503, its followers 504,
# which error_page sends through another collapsing location, to another
# flight.  Each request is counted once, by the status it ended with.

my $r2 = requests_at(31);
my $e0 = json_stats('/stats')->{zones}{sf}{errors};
$res = $t->herd(n => 10, path => '/noshare/e?status=503&delay=300');
is(scalar(grep { ($_->{status} // 0) == 503 } @$res), 1, 'error_page: the leader got the 503');
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 9,
   'error_page: the followers got the other location\'s 200');

my @e;
$t->wait_for(sub { (@e = log_lines(qr{^/noshare/})) >= 10 }, what => 'error_page herd logged');
my $r3 = requests_at(31 + 10);
my $d = rose($r2, $r3);
my $n = 0;
$n += $_ for values %$d;
is($n, 10, 'error_page: 10 requests, counted once each');
is_deeply($d, SFTest::tally(map { $_->[0] } @e),
          'error_page: requests_total is what the access log says of each')
    or diag(explain(\@e));
is(json_stats('/stats')->{zones}{sf}{errors} - $e0, 9,
   'error_page: the followers were answered ERROR on the way (old errors)');

# ------------------------------------------------------------ while it runs

# An origin request is counted once its response header is in, not at
# its end: a download that stalls after 5,000 bytes is in the count
# while it runs, and not counted again when it is given up.

my $o0 = json_stats('/stats')->{zones}{sf}{origin_requests_total}{first};
my $long = $t->start_request('GET', '/long?size=100000&fail=stall&cut=5000', timeout => 10);
ok($t->wait_for(sub { $t->poll_request($long); defined $long->{res}{status} },
                what => 'the header'), 'running: the header arrived');
is(json_stats('/stats')->{zones}{sf}{origin_requests_total}{first} - $o0, 1,
   'running: its origin request is counted while it runs');
$t->abort_request($long);
ok($t->wait_zone(sub { ($_[0]{in_flight} // 1) == 0 }, what => 'the flight given up'),
   'running: the flight is given up with its client');
is(json_stats('/stats')->{zones}{sf}{origin_requests_total}{first} - $o0, 1,
   'running: ... and counted once');

# ------------------------------------------------------------ a wait given up

# A follower whose client leaves while it waits for the header: its wait
# is in the histogram, as every other wait.

{
    my $w0 = json_stats('/stats')->{zones}{sf}{wait_seconds}{count};
    my $uri = '/gaveup?size=100&delay=1500';
    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the first request upstream');
    my $second = $t->start_request('GET', $uri);
    $t->wait_waiters(1);
    $t->abort_request($second);
    ok($t->wait_zone(sub { $_[0]{wait_seconds}{count} > $w0 }, what => 'the wait recorded'),
       'a wait given up: in the histogram');
    is($t->finish_request($first)->{status}, 200, 'a wait given up: the first request answered');
    is(json_stats('/stats')->{zones}{sf}{wait_seconds}{count} - $w0, 1,
       'a wait given up: one wait');
}

# ------------------------------------------------------------ gone before its header

# A flight's first request goes upstream itself (singleflight_lone own);
# its client leaves before that request has a header, and the follower
# takes the flight over with a fetch.  Both reached the origin: both are
# counted, as a fetch that got no header is.

{
    my $o0 = json_stats('/stats')->{zones}{sf}{origin_requests_total};
    my $uri = '/own/leftearly?size=100&delay=1000';
    my $first = $t->start_request('GET', $uri);
    $t->wait_for(sub { $t->origin_uri_hits($uri) == 1 }, what => 'the first request upstream');
    my $second = $t->start_request('GET', $uri);
    $t->wait_waiters(1);
    $t->abort_request($first);
    is($t->finish_request($second)->{status}, 200, 'gone before its header: the follower answered');
    is($t->origin_uri_hits($uri), 2, 'gone before its header: two origin requests');
    $t->origin_requests_ok($o0, { first => 1, retry => 1 },
                           'gone before its header: both counted');
}

done_testing;
