#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# README.md's examples run as pasted.  Every ```nginx block of the README
# (and of docs/directives.md) is checked with `nginx -t` against the
# module as built:
#
#   - a complete configuration (it has "events") is written out as it is,
#     but for its load_module line (the module under test), its listen
#     ports (free ones), the quick start's upstream 127.0.0.1:9000 (a
#     started origin) and absolute paths (moved into the test directory);
#     the quick start is also started and sent a herd of 5, which must
#     cost the origin one request;
#   - a fragment is put into a minimal configuration in its context: an
#     http{} block under "events {}", http-level directives into http{},
#     location blocks into a server, bare directives into a location;
#     zones and upstreams it names but does not declare are declared.
#
# Neither may draw an [emerg] or a [warn].  Then what the README promises
# about itself: at most 400 lines, starting with `make demo` and `make
# test`; and the documentation's relative links (README.md, docs/,
# CONTRIBUTING.md, bench/README.md) lead to files and headings that exist,
# with no commit hashes or issue numbers in their prose.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

my $readme = SFTest::_slurp("$SFTest::REPO/README.md");
my @blocks = nginx_blocks($readme);
cmp_ok(scalar @blocks, '>=', 5, 'README has nginx blocks') or diag(scalar @blocks);

# docs/directives.md's examples are held to the same (all fragments)
my @directives = nginx_blocks(SFTest::_slurp("$SFTest::REPO/docs/directives.md"));
cmp_ok(scalar @directives, '>=', 15, 'docs/directives.md has nginx blocks');

sub nginx_blocks { $_[0] =~ /^```nginx\n(.*?)^```\s*$/msg }

# ------------------------------------------------------------ rewriting

# the block's listen ports, the quick start's origin, absolute paths
sub localize {
    my ($text) = @_;
    my %port;
    $text =~ s{^(\s*listen\s+)(?:[\w.\[\]:]*:)?(\d+)\b}{
        my $n = keys %port;
        $port{$2} //= $n;
        $1 . '%%ADDR%%:' . ($port{$2} ? "%%PORT_$port{$2}%%" : '%%PORT%%')
    }gme;
    $text =~ s{\b127\.0\.0\.1:9000\b}{%%ORIGIN%%}g;
    $text =~ s{^(\s*(?:pid|error_log|access_log|\w+_cache_path|\w+_temp_path)\s+)/(\S+?)(?=[\s;])}
              {$1 . '%%TESTDIR%%/' . flat($2)}gme;
    $text =~ s{\btemp_path=/(\S+?)(?=[\s;])}{'temp_path=%%TESTDIR%%/' . flat($1)}ge;
    return $text;
}

sub flat { my ($p) = @_; $p =~ tr{/}{_}; return $p }

# declarations a fragment relies on: its zones and its named upstreams
sub missing {
    my ($text) = @_;
    my ($decl, %seen) = ('');
    my %zones = map { $_ => 1 } $text =~ /\bzone=([^:\s]+):/g;
    for my $z ($text =~ /^\s*singleflight(?:_forget)?\s+([^\s;]+)/mg) {
        next if $z =~ /^(?:on|off)$/ || $zones{$z} || $seen{"z$z"}++;
        $decl .= "    singleflight_zone zone=$z:1m;\n";
    }
    my %ups = map { $_ => 1 } $text =~ /^\s*upstream\s+(\S+)\s*\{/mg;
    for my $u ($text =~ m{\b\w+_pass\s+\w+://([A-Za-z_][\w.-]*)\s*;}g) {
        next if $ups{$u} || $seen{"u$u"}++;
        $decl .= "    upstream $u {\n        server %%ORIGIN%%;\n    }\n";
    }
    return $decl;
}

# the context of a fragment: main (an http block), http, server, location
sub context {
    my ($text) = @_;
    return 'main' if $text =~ /^http\s*\{/m;
    return 'http' if $text =~ /^(?:server\s*\{|upstream\b|map\b|log_format\b
        |singleflight_zone\b|singleflight_loop_name\b|\w+_cache_path\b)/mx;
    return 'server' if $text =~ /^location\b/m;
    return 'location';
}

sub wrap {
    my ($text) = @_;
    my $ctx = context($text);
    my $decl = missing($text);
    if ($ctx eq 'main') {
        # the default access log is the build's (logs/ under a source
        # build's prefix, the test directory here): in the test directory
        $decl .= "    access_log %%TESTDIR%%/access.log;\n"
            unless $text =~ /^\s*access_log\b/m;
        $text =~ s/^(http\s*\{\n)/$1$decl/m;
        my $temp = $> == 0 ? '' : join '', map { "    ${_}_temp_path %%TESTDIR%%/$_;\n" }
            qw(client_body proxy fastcgi uwsgi scgi);
        $text =~ s/^(http\s*\{\n)/$1$temp/m;
        return "%%MODULE%%\npid nginx.pid;\n%%ERROR_LOG%%\nevents {}\n\n$text";
    }
    my $http = $ctx eq 'http' ? $text
        : $ctx eq 'server' ? "server {\n    listen %%ADDR%%:%%PORT%%;\n$text\n}\n"
        : "server {\n    listen %%ADDR%%:%%PORT%%;\n    location / {\n$text\n"
          . ($text =~ /\b\w+_pass\b/ ? '' : "        proxy_pass http://%%ORIGIN%%;\n")
          . "    }\n}\n";
    $decl = missing($http) . ($ctx eq 'location' && $text !~ /^\s*singleflight\s/m
        ? "    singleflight on;\n" : '');
    return $t->config_template("$decl\n$http");
}

sub first_line { my ($b) = @_; my ($l) = grep { /\S/ && !/^\s*#/ } split /\n/, $b; $l }

# ------------------------------------------------------------ nginx -t

my $quick;
my @all = ((map { ['README', $_] } @blocks), (map { ['docs/directives.md', $_] } @directives));

for my $i (0 .. $#all) {
    my ($file, $block) = @{ $all[$i] };
    my $complete = $block =~ /^\s*events\b/m;
    my $n = $file eq 'README' ? $i + 1 : $i - @blocks + 1;
    my $name = sprintf '%s block %d (%s)', $file, $n, first_line($block);

    my $text = localize($block);
    if ($complete) {
        like($text, qr/^\s*load_module\b/m, "$name: a complete configuration loads the module");
        $text =~ s/^\s*load_module\s+[^;]+;/%%MODULE%%/m;
    } else {
        $text = wrap($text);
    }

    $t->write_config($text);
    my ($ok, $out) = $t->test_config;
    ok($ok, "$name: nginx -t") or diag("configuration:\n" . $t->config . "\nnginx -t:\n$out");
    unlike($out, qr/\[(?:emerg|warn)\]/, "$name: no [emerg] or [warn]") or diag($out);

    $quick //= $i if $file eq 'README' && $complete && $block =~ /\b127\.0\.0\.1:9000\b/;
}

# ------------------------------------------------------------ the quick start

ok(defined $quick, 'README has a complete configuration for the quick start');

SKIP: {
    skip 'no quick start', 6 unless defined $quick;

    my $text = localize($blocks[$quick]);
    $text =~ s/^\s*load_module\s+[^;]+;/%%MODULE%%/m;
    $t->write_config($text);
    $t->start;

    # the README's own commands: five clients at once, the origin 1 s
    my ($path) = $readme =~ m{curl -s '?http://127\.0\.0\.1:8080(/\S+?)'?\s*&};
    ok($path, "the quick start's herd URL") or $path = '/hello?delay=1000';
    my $res = $t->herd(n => 5, path => $path, timeout => 10);

    is(scalar(grep { ($_->{status} // 0) == 200 && $_->{complete} } @$res), 5,
        'quick start: 5 of 5 answered 200');
    diag(explain([ map { $_->{error} } @$res ])) if grep { $_->{error} } @$res;
    my %bodies = map { $_->{body} => 1 } @$res;
    is(scalar keys %bodies, 1, 'quick start: one body for all');
    like((keys %bodies)[0], qr/^hit=1 /, "quick start: the origin's first response");
    is($t->origin_hits->{total}, 1, 'quick start: a herd of 5 costs the origin 1 request');

    my @sf;
    $t->wait_for(sub {
        @sf = $t->read_file('access.log') =~ /sf=(\w+)/g;
        @sf >= 5;
    }, timeout => 5, what => 'five access log lines');
    is(join(' ', sort @sf), 'FOLLOWER FOLLOWER FOLLOWER FOLLOWER LEADER',
        'quick start: one LEADER, four FOLLOWER in the access log');

    $t->stop;
}

# ------------------------------------------------------------ the README itself

my @lines = split /\n/, $readme;
cmp_ok(scalar @lines, '<=', 400, 'README has at most 400 lines');
my ($first) = $readme =~ /^```sh\n(.*?)^```/ms;
like($first // '', qr/^make demo\b.*^make test\b/ms, 'README starts with make demo and make test');

# ------------------------------------------------------------ links and prose

my @docs = ('README.md', 'CONTRIBUTING.md', 'bench/README.md',
    map { s{^\Q$SFTest::REPO\E/}{}r } glob("$SFTest::REPO/docs/*.md"));

my %anchors;
sub anchors {
    my ($file) = @_;
    return $anchors{$file} //= do {
        my %a;
        my $text = SFTest::_slurp("$SFTest::REPO/$file");
        $text =~ s/^```.*?^```//msg;
        for my $h ($text =~ /^#+\s+(.+?)\s*$/mg) {
            (my $slug = lc $h) =~ s/[^\w\- ]//g;
            $slug =~ tr/ /-/;
            $a{$slug} = 1;
        }
        \%a;
    };
}

for my $doc (@docs) {
    my $text = SFTest::_slurp("$SFTest::REPO/$doc");
    ok(length $text, "$doc exists") or next;
    (my $dir = $doc) =~ s{[^/]*$}{};
    (my $prose = $text) =~ s/^```.*?^```//msg;

    my @bad;
    for my $link ($prose =~ /\]\(([^)\s]+)\)/g) {
        next if $link =~ m{^(?:https?|mailto):};
        my ($file, $anchor) = $link =~ /^([^#]*)(?:#(.*))?$/;
        my $target = length $file ? $dir . $file : $doc;
        1 while $target =~ s{[^/]+/\.\./}{};
        if (!-e "$SFTest::REPO/$target") {
            push @bad, "$link: no file $target";
        } elsif (defined $anchor && $target =~ /\.md$/ && !anchors($target)->{$anchor}) {
            push @bad, "$link: no heading #$anchor in $target";
        }
    }
    is(join("\n", @bad), '', "$doc: relative links lead somewhere");

    (my $words = $prose) =~ s{\(results/[^)]*\)|`results/[^`]*`|results/\S+}{}g;
    my @hashes = grep { /[a-f]/ && /\d/ } $words =~ /\b([0-9a-f]{7,40})\b/g;
    my @issues = $words =~ /\b(issues? \d+)/gi;
    is(join(' ', @hashes, @issues), '', "$doc: no commit hashes or issue numbers");
}

done_testing;
