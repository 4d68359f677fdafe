#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_zone scope=: process (all workers share), numa (workers
# share within their node), worker (each worker alone).  This machine has
# one NUMA node, so the numa cases simulate two with SINGLEFLIGHT_NUMA_CPUS
# and pin the workers with worker_cpu_affinity.

use strict;
use warnings;

use Test::More;
use File::Find ();

use SFTest;

# a herd on one key, repeated until every listed worker served some of it;
# returns (origin hits, {pid => [statuses]}) of the last round
sub herd_round {
    my ($t, $uri, $want_pids) = @_;
    my ($hits, %by_pid);

    for my $round (1 .. 8) {
        my $u = "$uri&round=$round";
        $t->origin_reset;
        my $off = $t->log_offset('sf.log');

        my $res = $t->herd(n => 150, path => $u);
        die "herd failed" if grep { !$_->{status} || $_->{status} != 200 } @$res;

        %by_pid = ();
        for ($t->wait_log_records('sf.log', [qw(pid sf uri)], 150, offset => $off, uri => $u)) {
            push @{ $by_pid{ $_->{pid} } }, $_->{sf};
        }

        $hits = $t->origin_hits->{total};
        last if keys %by_pid >= $want_pids;
    }

    return ($hits, \%by_pid);
}

sub config {
    my ($t, $zone, %opt) = @_;
    return $t->config_template(<<"EOT", workers => $opt{workers} // 2,
    log_format sf '\$pid \$singleflight_status \$request_uri';
    access_log %%TESTDIR%%/sf.log sf;

    singleflight_zone zone=sf:1m $zone;
@{[ $opt{http} // '' ]}
    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }

        location /spill/ {
            singleflight sf;
            singleflight_memory 64k;
            proxy_pass http://%%ORIGIN%%;
        }

        location = /stats {
            singleflight_stats;
        }
    }
EOT
        main => ($opt{main} // '') . "\nenv SINGLEFLIGHT_NUMA_CPUS;");
}

# the node each worker reported it uses: {pid => node}
sub worker_nodes {
    my ($t) = @_;
    my %node;
    my @pairs = $t->read_file('error.log')
        =~ /(\d+)#\d+: singleflight worker on cpu -?\d+ uses NUMA node (\d+)/g;
    while (my ($pid, $node) = splice(@pairs, 0, 2)) {
        $node{$pid} = $node;
    }
    return \%node;
}

# A test: the zone and each of its instances are back to their baseline.
sub baseline_ok {
    my ($t, $what) = @_;
    $t->zone_baseline_ok("$what: zone memory back to baseline", instances => 1,
        what => "$what: zone back to baseline");
}

# A new SFTest with an origin and nginx running config($t, $zone, %opt);
# numa_cpus => CPUS simulates NUMA nodes (SINGLEFLIGHT_NUMA_CPUS=CPUS).
sub start_nginx {
    my ($zone, %opt) = @_;
    local $ENV{SF_NGINX_ENV} = ($ENV{SF_NGINX_ENV} // '')
                               . " SINGLEFLIGHT_NUMA_CPUS=$opt{numa_cpus}"
        if defined $opt{numa_cpus};
    my $t = SFTest->new;
    $t->skip_without_module;
    $t->start_origin;
    $t->write_config(config($t, $zone, %opt));
    $t->start;
    return $t;
}

# ------------------------------------------------------------ process

{
    my $t = start_nginx('scope=process');

    my ($hits, $by) = herd_round($t, '/p?delay=300', 2);

    SKIP: {
        skip 'the herd landed in one worker only', 1 if keys %$by < 2;
        is($hits, 1, 'process: both workers share one flight');
    }

    my $z = $t->zone_stats;
    is($z->{scope}, 'process', 'process: scope in stats');
    is(scalar @{ $z->{instances} }, 1, 'process: one instance');
    baseline_ok($t, 'process');
}

# ------------------------------------------------------------ numa, 2 nodes

{
    my $t = start_nginx('scope=numa', numa_cpus => '0;1', main => 'worker_cpu_affinity 01 10;');

    my $nodes;
    $t->wait_for(sub { $nodes = worker_nodes($t); keys %$nodes >= 2 },
                 what => 'workers report their node');
    is_deeply([ sort values %$nodes ], [0, 1],
              'numa: the two pinned workers use nodes 0 and 1');

    my ($hits, $by) = herd_round($t, '/n?delay=300', 2);

    SKIP: {
        skip 'the herd landed in one worker only', 2 if keys %$by < 2;
        is($hits, 2, 'numa: workers on different nodes do not collapse '
                     . 'with each other');

        my %leaders = map { $_ => scalar grep { $_ eq 'LEADER' } @{ $by->{$_} } }
                      keys %$by;
        is_deeply([ sort values %leaders ], [1, 1],
                  'numa: one leader per node');
    }

    my $z = $t->zone_stats;
    is($z->{scope}, 'numa', 'numa: scope in stats');
    is_deeply([ map { $_->{node} } @{ $z->{instances} } ], [0, 1],
              'numa: one instance per node');

    # every worker attaches to every node's instance; each counts once,
    # at the node it uses
    is($z->{workers}, 2, 'numa: workers, each counted once');
    is_deeply([ map { $_->{workers} } @{ $z->{instances} } ], [1, 1],
              'numa: workers per node');
    my $m = $t->get('/stats?format=prometheus')->{body};
    my %w = $m =~ /^nginx_singleflight_workers\{zone="sf",node="(\d+)"\} (\d+)$/mg;
    is_deeply(\%w, { 0 => 1, 1 => 1 }, 'numa: workers per node, Prometheus');
    baseline_ok($t, 'numa');

    # the topology outlives the configuration it was read with: after
    # reloads to other configurations the new workers find their nodes as
    # before (it once lay in the first configuration's memory, which a
    # reload frees and the next configuration's allocations reuse)
    for my $i (1 .. 3) {
        $t->write_config(config($t, 'scope=numa', main => 'worker_cpu_affinity 01 10;',
            http => join(' ', map { "singleflight_zone zone=x${i}_$_:1m;" } 1 .. $i)));
        my $before = worker_nodes($t);
        ok($t->reload(wait_old => 1), "numa: reload $i");
        my %new;
        $t->wait_for(sub {
            my $n = worker_nodes($t);
            %new = map { $_ => $n->{$_} } grep { !exists $before->{$_} } keys %$n;
            keys %new >= 2;
        }, what => 'the new workers report their node');
        is_deeply([ sort values %new ], [0, 1],
                  "numa: reload $i: the new workers use nodes 0 and 1");
    }
}

# ------------------------------------------------------------ numa, same node

{
    my $t = start_nginx('scope=numa', numa_cpus => '0;1', workers => 4,
                        main => 'worker_cpu_affinity 01 01 10 10;');

    my $nodes;
    $t->wait_for(sub { $nodes = worker_nodes($t); keys %$nodes >= 4 },
                 what => 'workers report their node');
    is_deeply([ sort values %$nodes ], [0, 0, 1, 1],
              'numa: the four pinned workers use nodes 0, 0, 1, 1');

    my $z = $t->zone_stats;
    is($z->{workers}, 4, 'numa: four workers, each counted once');
    is_deeply([ map { $_->{workers} } @{ $z->{instances} } ], [2, 2],
              'numa: two workers per node');

    my ($hits, $by) = herd_round($t, '/s?delay=300', 4);

    # per node: the workers that served, and the leaders among them
    my (%workers, %leaders);
    for my $pid (keys %$by) {
        my $node = $nodes->{$pid} // 'unknown';
        $workers{$node}++;
        $leaders{$node} += grep { $_ eq 'LEADER' } @{ $by->{$pid} };
    }

    SKIP: {
        skip 'no node had two workers serving', 2
            unless grep { $_ >= 2 } values %workers;

        my ($node) = grep { $workers{$_} >= 2 } sort keys %workers;
        is($leaders{$node}, 1,
           "numa: two workers of node $node share one flight");
        ok($hits <= 2, "numa: at most one origin request per node ($hits)");
    }
}

# ------------------------------------------------------------ numa, 1 node

{
    my $t = start_nginx('scope=numa', numa_cpus => '0-1', main => 'worker_cpu_affinity 01 10;');

    my ($hits, $by) = herd_round($t, '/o?delay=300', 2);

    SKIP: {
        skip 'the herd landed in one worker only', 1 if keys %$by < 2;
        is($hits, 1, 'numa: workers of one node collapse together');
    }
}

# ------------------------------------------------------------ worker

{
    my $t = start_nginx('scope=worker');

    my ($hits, $by) = herd_round($t, '/w?delay=300', 2);

    is($hits, scalar(keys %$by),
       'worker: one origin request per worker that served the herd');

    for my $pid (keys %$by) {
        is(scalar(grep { $_ eq 'LEADER' } @{ $by->{$pid} }), 1,
           "worker: worker $pid led its own flight");
    }

    my (undef, $z) = $t->wait_zone(sub { grep({ $_->{pid} } @{ $_[0]{instances} }) >= 2 },
                                   what => 'both workers in stats');

    is($z->{scope}, 'worker', 'worker: scope in stats');
    is_deeply([ sort map { $_->{pid} } grep { $_->{pid} } @{ $z->{instances} } ],
              [ sort $t->worker_pids ], 'worker: one instance per worker');

    my $flights = 0;
    $flights += $_->{flights} for @{ $z->{instances} };
    is($z->{flights}, $flights, 'worker: the total adds up the workers');
    ok($z->{flights} >= $hits, 'worker: flights counted in every worker');

    # past singleflight_memory, its readers stream from its file
    my $spill = '/spill/w?size=1000000&fail=slowbody&pieces=4&delay=100';
    my @h = map { $t->start_request('GET', $spill, timeout => 20) } 1 .. 4;
    my @res = map { $t->finish_request($_) } @h;
    is(scalar(grep { length($_->{body} // '') == 1000000 } @res), 4,
       'worker: a spilled flight reaches all its readers');
    ok($t->origin_uri_hits($spill) <= 2 && $t->origin_uri_hits($spill) >= 1,
       'worker: collapsed within each worker');

    # broken off past its memory: its file has no name in this scope, and
    # the follower that takes the flight over goes on in it with the
    # flight's descriptor; every whole response is cut (as the leaders'
    # are), the asks for the rest are not
    my $cut = '/spill/r?delay=300&size=300000&fixed=1&ranges=1&hdr=ETag:%22abc%22'
            . '&fail=cut&cut=200000';
    my $off = $t->log_offset('sf.log');
    my $herd = $t->herd(n => 6, path => $cut, timeout => 20);
    my @sf = map { $_->{sf} } $t->wait_log_records('sf.log', [qw(pid sf uri)], 6,
                                                   offset => $off, uri => $cut);
    my $followers = grep { $_ eq 'FOLLOWER' } @sf;
    ok($followers >= 1, 'worker, resumed past its memory: followers in the herd');
    is(scalar(grep { length($_->{body} // '') == 300000 && $_->{complete} } @$herd),
       $followers, 'worker, resumed past its memory: every follower gets the whole body');

    # a worker killed mid-flight leaves no temporary file behind
    my $kill = '/spill/k?size=4000000&fail=slowbody&pieces=8&delay=500';
    my $k = $t->start_request('GET', $kill, timeout => 20);
    my $files = sub {
        my @f;
        File::Find::find(sub { push @f, $File::Find::name if -f $_ },
                         $t->path('singleflight_temp'));
        return @f;
    };
    ok($t->wait_for(sub { $t->poll_request($k);
                          length($k->{res}{body}) > 200000 },
                    what => 'the flight past its memory'),
       'worker: a flight spilled');
    my @before = $t->worker_pids;
    $t->kill_worker(@before);
    $t->finish_request($k);
    ok(!grep({ !$t->worker_respawned($_) } @before), 'worker: killed workers replaced');
    is(scalar($files->()), 0, 'worker: no temporary file left by a killed worker')
        or diag(join ' ', $files->());
    $t->allow_log(qr/exited on signal 9/);

    baseline_ok($t, 'worker');
}

# An old worker after a reload, still serving, is killed: nobody replaces
# it and it never exits cleanly.  Its instance went with it: the stats
# show the live workers only, in the gauge and the instances.
{
    my $t = start_nginx('scope=worker');
    my @old = $t->worker_pids;
    my @slow = map { $t->start_request('GET', "/old$_?delay=8000&size=10", timeout => 20) } 1 .. 4;
    $t->wait_for(sub { $t->origin_hits->{total} >= 4 }, what => 'the slow requests upstream');
    ok($t->reload, 'worker, old worker killed: reloaded');
    my @left = grep { kill 0, $_ } @old;
    ok(scalar(@left), 'worker, old worker killed: an old worker still serving');
    kill 'KILL', @left;
    $t->wait_for(sub { !grep { kill 0, $_ } @left }, what => 'the old workers gone');
    my @live = sort $t->worker_pids;
    my (undef, $z) = $t->wait_zone(sub { 1 }, what => 'the stats');
    is($z->{workers}, scalar(@live), 'worker, old worker killed: the workers gauge counts the live ones');
    is_deeply([ sort map { $_->{pid} } grep { $_->{pid} } @{ $z->{instances} } ], \@live,
              'worker, old worker killed: the instances shown are the live workers');
    $t->abort_request($_) for @slow;
    $t->allow_log(qr/exited on signal 9/);
}

# ------------------------------------------------------------ config

{
    my $t = SFTest->new;
    $t->write_config($t->config_template(<<'EOT'));
    singleflight_zone zone=sf:1m scope=galaxy;
EOT
    my ($ok, $out) = $t->test_config;
    ok(!$ok, 'a bad scope is rejected');
    like($out, qr/\[emerg\].*invalid scope "scope=galaxy" in "singleflight_zone"/,
         'the message names the directive');
}

done_testing;
