#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# A bounded randomized differential run: rounds of random scenarios made of
# the building blocks of t/lib/SFTest/Diff/Blocks.pm (configurations and
# requests), each run with the module on and without it
# (t/lib/SFTest/Diff.pm).  It stops at the first round where a response
# with the module differs from the one without it (for the resume block's
# requests, whose origin breaks off: is none of the answers right there,
# SFTest::Diff's "Broken responses"), or costs more origin requests, or
# comes much later, or leaves an [alert] or a sanitizer's report in the
# logs (make fuzz-asan), and prints a self-contained reproduction:
# the configuration, every request and both responses, the scenario as a
# Perl hash for t/singleflight_differential.t, and the seeds to replay it.
#
#   FUZZ_SECONDS=120 FUZZ_SEED=42 prove -v -I t/lib t/fuzz/differential.t
#   FUZZ_SEED=42 FUZZ_ROUND=7 ...     replays round 7 of seed 42 alone
#   FUZZ_BLOCKS=ssi,gzip ...          draws only from these blocks
#
# `make fuzz` runs it, `make fuzz-asan` with the module under ASan and
# UBSan; it is not part of `make test`.  At the end it says how the resume
# block's requests were right (as without the module, another whole
# answer, a truncation, the module's 502) and what the module did with
# the breaks (its error log).

use strict;
use warnings;

use Data::Dumper ();
use Test::More;
use Time::HiRes qw(time);

use lib 't/lib';
use SFTest::Diff;
use SFTest::Diff::Blocks;

my $seconds = $ENV{FUZZ_SECONDS} || 120;
my $seed = length($ENV{FUZZ_SEED} // '') ? $ENV{FUZZ_SEED} : int(time) % 1000000;
my $only = length($ENV{FUZZ_ROUND} // '') ? $ENV{FUZZ_ROUND} : undef;
my @blocks = split /[\s,]+/, $ENV{FUZZ_BLOCKS} // '';
die "FUZZ_SEED and FUZZ_ROUND must be numbers\n" unless "$seed" =~ /^\d+$/ && ($only // 1) =~ /^\d+$/;

my $d = SFTest::Diff->new;
$d->skip_without_module;
diag("fuzz: $seconds s, seed $seed (FUZZ_SEED=$seed to replay)");

# The scenario seed of round $k of seed $seed.
sub round_seed { ($_[0] * 7919 + $_[1] * 104729) % 2147483647 }

my $start = time;
my ($rounds, $failed, %seen) = (0, 0);
for (my $k = $only // 1; ; $k++) {
    last if defined $only ? $k > $only : time - $start >= $seconds;
    my $sc = SFTest::Diff::Blocks::scenario(round_seed($seed, $k), @blocks);
    $sc->{name} = "round-$k-$sc->{name}";
    $rounds++;
    $seen{$_}++ for split /-/, $sc->{name} =~ s/^round-\d+-fuzz-//r;
    my $r = $d->run($sc);
    next if $r->{ok};
    $failed = 1;
    local $Data::Dumper::Sortkeys = 1;
    local $Data::Dumper::Indent = 1;
    local $Data::Dumper::Terse = 1;
    my $b = @blocks ? ' FUZZ_BLOCKS=' . join(',', @blocks) : '';
    diag("fuzz: round $k differs; replay it alone with\n"
        . "    FUZZ_SEED=$seed FUZZ_ROUND=$k$b make fuzz\n"
        . "the scenario, for t/singleflight_differential.t:\n"
        . Data::Dumper::Dumper({ %$sc, name => "fuzz_${seed}_$k" }));
    last;
}

diag(sprintf('fuzz: %d rounds in %.0f s, seed %d%s; blocks: %s', $rounds, time - $start, $seed,
    $failed ? ', stopped at the first difference' : ', no difference',
    join(' ', map { "$_=$seen{$_}" } sort keys %seen)));

# The resume block's requests (those with alternatives): how they were
# right, and what the module did with the breaks (its error log, info).
if (my %t = %{ $d->tally }) {
    my $log = $d->on->read_file('error.log') // '';
    my %n = map { my $re = $_->[1]; ($_->[0] => scalar(() = $log =~ /$re/g)) }
        [ 'asked for the rest', qr/asking for the rest/ ],
        [ 'resumed by a Range', qr/flight \d+ resumed at byte \d+(?![\d:])/ ],
        [ 'asked for all again', qr/asking for all of it again/ ],
        [ 'resumed whole', qr/flight \d+ resumed at byte \d+: the response asked for again/ ],
        [ 'not resumed', qr/flight \d+ not resumed at byte/ ];
    diag('fuzz: answers with alternatives: ' . join(', ', map { "$_ $t{$_}" } sort keys %t)
        . '; the module ' . join(', ', map { "$_ $n{$_}" } sort keys %n));
}
done_testing;
