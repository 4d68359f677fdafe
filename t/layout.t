#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# Calls run one way (CONTRIBUTING.md, "Layout of src/"): a file of src/
# includes the headers of the files it calls, so the graph of includes
# between the module's files has no cycle (a fetch calls back to its
# host's reader only through the callbacks it was given).  Every header
# includes the shared
# ngx_http_singleflight.h and nothing else of ours, and no file includes
# another's .c.

use strict;
use warnings;

use Test::More;

my (%inc, %file);
for my $path ('ngx_http_singleflight_module.c', glob 'src/*.[ch]') {
    open(my $fh, '<', $path) or die "$path: $!";
    my $text = do { local $/; <$fh> };
    my ($name, $ext) = $path =~ m{(?:^|/)ngx_http_singleflight_?(\w*)\.([ch])$} or next;
    $name = 'core' if $name eq '' || $name eq 'module';
    my @inc = map { $_ eq '' ? 'core' : $_ }
              $text =~ /^#include "ngx_http_singleflight_?(\w*)\.h"/mg;
    if ($ext eq 'h') {
        next if $name eq 'core';
        is_deeply([ @inc ], [ 'core' ], "$path includes ngx_http_singleflight.h alone");
        next;
    }
    ok($text !~ /^#include "[^"]*\.c"/m, "$path includes no .c");
    $inc{$name}{$_} = 1 for grep { $_ ne $name && $_ ne 'core' } @inc;
    $file{$name} = $path;
}

cmp_ok(scalar(keys %file), '>=', 15, 'the files of src/ are found');

# every cycle through two or more files, as the pair of files that close
# it: a depth-first walk, each back edge a cycle
my (%state, @path, %cycles);
sub walk {
    my ($v) = @_;
    $state{$v} = 1;
    push @path, $v;
    for my $w (sort keys %{ $inc{$v} || {} }) {
        next unless exists $file{$w};
        if (($state{$w} // 0) == 1) {
            my @c = @path[(grep { $path[$_] eq $w } 0 .. $#path)[0] .. $#path];
            $cycles{join ' -> ', @c, $w} = join ' ', sort $v, $w;
        } elsif (!$state{$w}) {
            walk($w);
        }
    }
    pop @path;
    $state{$v} = 2;
}
walk($_) for sort keys %inc;

my @bad = sort keys %cycles;
is(scalar(@bad), 0, 'no include cycle')
    or diag("cycle: $_") for @bad;

done_testing();
