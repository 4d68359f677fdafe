#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# singleflight_key rules:
#   * a request whose key evaluates to the empty string is not collapsed
#     ($singleflight_status BYPASS);
#   * nginx -t warns about a key with no variable part, naming the
#     directive;
#   * with a method that has a body in singleflight_methods, a key that
#     uses $request_body or $singleflight_body_hash (a hex digest of the
#     body, in memory or in a temp file) is computed once the body is
#     read: requests with different bodies never share a flight, requests
#     with the same body do;
#   * a key that refers to the body in a way that cannot work is rejected
#     by nginx -t, naming the directive.

use strict;
use warnings;

use Test::More;

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
$t->start_origin;

# A config with the module in location / (with loc => text), more
# server-level text (more =>) and http-level text (http =>).
sub config {
    my (%a) = @_;
    my $http = $a{http} // '';
    my $loc = $a{loc} // '';
    my $more = $a{more} // '';
    return $t->config_template(<<"EOT");
    log_format sfk '\$remote_port \$singleflight_status \$request_uri';
    access_log %%TESTDIR%%/sf.log sfk;

    singleflight_zone zone=sf:1m;
$http
    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
$loc
            proxy_pass http://%%ORIGIN%%;
        }
$more
    }
EOT
}

# nginx -t of a config: ($ok, its [warn] lines, its [emerg] lines, output).
sub check {
    $t->write_config(config(@_));
    my ($ok, $out) = $t->test_config;
    my @lines = split /\n/, $out;
    return ($ok, join("\n", grep { /\[warn\]/ } @lines), join("\n", grep { /\[emerg\]/ } @lines), $out);
}

# ------------------------------------------------------------ nginx -t

for my $case (
    [ 'the default key', '' ],
    [ 'a key with variables', 'singleflight_key $host$uri;' ],
    [ 'a key with a variable and text', 'singleflight_key "v2:$uri";' ],
) {
    my ($name, $loc) = @$case;
    my ($ok, $warn, undef, $out) = check(loc => $loc);
    ok($ok && $warn !~ /singleflight_key/, "nginx -t: $name, no warning") or diag($out);
}

for my $case (
    [ 'a constant key', 'singleflight_key static;' ],
    [ 'a quoted constant key', 'singleflight_key "one key for all";' ],
) {
    my ($name, $loc) = @$case;
    my ($ok, $warn, undef, $out) = check(loc => $loc);
    ok($ok, "nginx -t: $name is accepted") or diag($out);
    like($warn, qr/singleflight_key/, "nginx -t: $name, a [warn] naming singleflight_key")
        or diag($out);
}

for my $case (
    [ 'a POST key with $singleflight_body_hash',
      "singleflight_methods GET HEAD POST;\n            singleflight_key \$uri\$singleflight_body_hash;" ],
    [ 'a POST key with $request_body',
      "singleflight_methods GET HEAD POST;\n            singleflight_key \$uri\$request_body;" ],
) {
    my ($name, $loc) = @$case;
    my ($ok, $warn, undef, $out) = check(loc => $loc);
    ok($ok && $warn !~ /singleflight/, "nginx -t: $name is accepted without a warning") or diag($out);
}

# The body is never where $request_body can see it: always in a file.
my ($ok, undef, $emerg, $out) = check(loc => "client_body_in_file_only on;\n"
    . "            singleflight_methods GET HEAD POST;\n"
    . "            singleflight_key \$uri\$request_body;");
ok(!$ok && $emerg =~ /singleflight_key/,
    'nginx -t: $request_body in the key with client_body_in_file_only on is rejected, naming singleflight_key')
    or diag($out);

# The name of a temp file is new for every request: it cannot be a key.
($ok, undef, $emerg, $out) = check(loc => "singleflight_methods GET HEAD POST;\n"
    . "            singleflight_key \$uri\$request_body_file;");
ok(!$ok && $emerg =~ /singleflight_key/,
    'nginx -t: $request_body_file in the key is rejected, naming singleflight_key') or diag($out);

# ------------------------------------------------------------ requests

# n concurrent requests ([method, uri, body]): (responses, $singleflight_status)
sub burst {
    my @h = map { $t->start_request($_->[0], $_->[1], (defined $_->[2] ? (body => $_->[2]) : ())) } @_;
    $t->poll_all(\@h);
    my %by;
    $t->wait_for(sub {
        %by = map { (split ' ')[0, 1] } split /\n/, $t->read_file('sf.log');
        !grep { !exists $by{ $_->{local_port} } } @h;
    }, what => 'access log lines');
    return ([ map { $_->{res} } @h ], [ map { $by{ $_->{local_port} } // '?' } @h ]);
}

sub complete { scalar grep { ($_->{status} // 0) == 200 && $_->{complete} } @{ $_[0] } }

# an empty key: not collapsed, BYPASS

$t->write_config(config(loc => 'singleflight_key $arg_k;'));
$t->start;

my @uris = map { "/e$_?echo=1&delay=300" } 1 .. 3;
my ($res, $sf) = burst(map { [ GET => $_ ] } @uris, ($uris[0]) x 2);
is(complete($res), 5, 'empty key: 5 complete responses');
is(scalar(grep { $res->[$_]{body} =~ /^GET \Q$uris[$_ > 2 ? 0 : $_]\E\n/ } 0 .. 4), 5,
    'empty key: each got the response to its own URI');
is(join(' ', map { $t->origin_uri_hits($_) } @uris), '3 1 1', 'empty key: nothing collapsed');
is(join(' ', @$sf), 'BYPASS BYPASS BYPASS BYPASS BYPASS', 'empty key: BYPASS');

my $u = '/e?echo=1&delay=300&k=1';
($res, $sf) = burst(([ GET => $u ]) x 3);
is($t->origin_uri_hits($u), 1, 'a key that is not empty: collapsed');
is(join(' ', sort @$sf), 'FOLLOWER FOLLOWER LEADER', 'a key that is not empty: a LEADER, FOLLOWERs');
$t->stop;

# bodies in the key

my $loc = <<'EOT';
            singleflight_methods GET HEAD POST;
            singleflight_key $request_uri$request_body;
            client_body_buffer_size 64k;
EOT
$t->write_config(config(loc => $loc));
$t->start;

$u = '/form?echo=1&delay=300';
my @bodies = map { ("a=$_") x 3 } 1 .. 3;
($res, $sf) = burst(map { [ POST => $u, $_ ] } @bodies);
is(complete($res), 9, '$request_body: 9 complete responses');
is(scalar(grep { $res->[$_]{body} =~ /\n\n\Q$bodies[$_]\E\z/ } 0 .. 8), 9,
    '$request_body: each got the response to its own body');
is($t->origin_uri_hits($u), 3, '$request_body: one origin request per body');
is(join(' ', sort @$sf), join(' ', (('FOLLOWER') x 6, ('LEADER') x 3)),
    '$request_body: a LEADER per body, FOLLOWERs');
$t->stop;

# $singleflight_body_hash: bodies in temp files (location /) and in memory
# (/m/), logged in hash.log
my $http = <<'EOT';
    log_format sfh '$remote_port $singleflight_body_hash';
EOT
$loc = <<'EOT';
            singleflight_methods GET HEAD POST;
            singleflight_key $request_uri$singleflight_body_hash;
            client_body_buffer_size 8k;
            access_log %%TESTDIR%%/hash.log sfh;
            access_log %%TESTDIR%%/sf.log sfk;
EOT
my $more = <<'EOT';
        location /m/ {
            singleflight sf;
            singleflight_methods GET HEAD POST;
            singleflight_key $request_uri$singleflight_body_hash;
            client_body_buffer_size 1m;
            access_log %%TESTDIR%%/hash.log sfh;
            proxy_pass http://%%ORIGIN%%;
        }
EOT
$t->write_config(config(loc => $loc, http => $http, more => $more));
($ok, $out) = $t->test_config;
ok($ok, 'nginx -t: $singleflight_body_hash') or diag($out);

SKIP: {
    skip 'no $singleflight_body_hash', 7 unless $ok;
    $t->start;

    $u = '/f/up?echo=1&delay=300';
    # (a named copy: a list repetition of "$_" x N inside map gives undefs)
    @bodies = map { my $b = "$_" x 20000; ($b) x 3 } 1 .. 2;
    my @h = map { $t->start_request(POST => $u, body => $_) } @bodies;
    $t->poll_all(\@h);
    $res = [ map { $_->{res} } @h ];
    is(complete($res), 6, '$singleflight_body_hash, temp files: 6 complete responses');
    is(scalar(grep { $res->[$_]{body} =~ /\nbody: 20000 bytes\n\n\Q$bodies[$_]\E\z/ } 0 .. 5), 6,
        '$singleflight_body_hash, temp files: each got the response to its own body');
    is($t->origin_uri_hits($u), 2, '$singleflight_body_hash, temp files: one origin request per body');

    my $hm = $t->start_request(POST => '/m/up?echo=1', body => $bodies[0]);
    $t->poll_all([$hm]);
    my %hash;
    $t->wait_for(sub {
        %hash = map { (split ' ')[0, 1] } split /\n/, $t->read_file('hash.log');
        !grep { !exists $hash{ $_->{local_port} } } @h, $hm;
    }, what => 'hash log lines');
    my @hex = map { $hash{ $_->{local_port} } // '' } @h, $hm;
    is(scalar(grep { /^[0-9a-f]{16,}$/ } @hex), 7, '$singleflight_body_hash: a hex digest')
        or diag(explain(\@hex));
    ok($hex[0] eq $hex[1] && $hex[1] eq $hex[2] && $hex[3] eq $hex[4] && $hex[4] eq $hex[5],
        '$singleflight_body_hash: the same for the same body');
    isnt($hex[0], $hex[3], '$singleflight_body_hash: different for different bodies');
    is($hex[6], $hex[0], '$singleflight_body_hash: the same for a body in memory and in a temp file');
}

done_testing;
