#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)

# The Debian package (make deb, tools/build-deb.sh): builds it (or takes
# SF_DEB, a .deb already built), checks its contents, its dependencies and
# maintainer scripts, then extracts it and runs nginx -t with the
# modules-enabled snippet it ships, the module loaded from the extracted
# tree.  Installs nothing on the system.
#
# Not part of `make test` (the package build takes half a minute): run by
# `make test-deb` and .ci/run.

use strict;
use warnings;

use File::Temp qw(tempdir);
use Test::More;

use SFTest ();

my $REPO = $SFTest::REPO;

for my $tool (qw(dpkg-deb dpkg-buildpackage dh_nginx)) {
    plan skip_all => "$tool not found (make test-deb installs it)"
        unless grep { -x "$_/$tool" } split /:/, $ENV{PATH};
}
my $nginx = '/usr/sbin/nginx';
plan skip_all => "no $nginx (package nginx-core)" unless -x $nginx;

my $deb = $ENV{SF_DEB};
if (!$deb) {
    my $out = `$REPO/tools/build-deb.sh 2>&1`;
    is($?, 0, 'the package builds') or diag($out);
    ($deb) = $out =~ m{^(/\S+\.deb)$}m;
}
ok($deb && -f $deb, 'a .deb') or BAIL_OUT('no package');

chomp(my $arch = `dpkg-architecture -qDEB_HOST_ARCH`);
chomp(my $version = `cd $REPO && dpkg-parsechangelog -S Version`);
is((split m{/}, $deb)[-1], "libnginx-mod-http-singleflight_${version}_$arch.deb",
    'named libnginx-mod-http-singleflight_<version>_<arch>.deb');

sub field { my $v = `dpkg-deb -f $deb $_[0]`; chomp $v; $v }

is(field('Package'), 'libnginx-mod-http-singleflight', 'Package');
is(field('Section'), 'httpd', 'Section: httpd, as Debian\'s modules');

# the ABI of the nginx it was built against, the way dh_nginx computes it
my $abi = do {
    open(my $fh, '<', '/usr/share/nginx/src/debian/libnginx-mod.abisubstvars')
        or die "abisubstvars: $!";
    my ($v) = map { /^nginx:abi=(\S+)/ ? $1 : () } <$fh>;
    $v;
};
like($abi, qr/^nginx-abi-[\d.]+-\d+$/, "nginx-dev's ABI: $abi");
my @depends = split /,\s*/, field('Depends');
ok((grep { $_ eq $abi } @depends), "Depends on $abi")
    or diag('Depends: ' . field('Depends'));
ok((grep { /^libc6\b/ } @depends), 'Depends on libc6 (shlibs)');

my %files = map { m{\s\./?(\S*)$} ? ($1 => 1) : () } `dpkg-deb -c $deb`;
ok($files{'usr/lib/nginx/modules/ngx_http_singleflight_module.so'},
    'the module in /usr/lib/nginx/modules');
ok($files{'usr/share/nginx/modules-available/mod-http-singleflight.conf'},
    'mod-http-singleflight.conf in /usr/share/nginx/modules-available');
is_deeply([ grep { length && !m{/$} && !m{^usr/share/doc/} } sort keys %files ],
    [ 'usr/lib/nginx/modules/ngx_http_singleflight_module.so',
      'usr/share/nginx/modules-available/mod-http-singleflight.conf' ],
    'nothing else but the docs');

my $x = tempdir('sfdeb-XXXXXX', TMPDIR => 1, CLEANUP => 1);
system('dpkg-deb', '-x', $deb, "$x/root") == 0 or die 'dpkg-deb -x failed';
system('dpkg-deb', '-e', $deb, "$x/control") == 0 or die 'dpkg-deb -e failed';

my $snippet = do {
    local $/;
    open(my $fh, '<', "$x/root/usr/share/nginx/modules-available/mod-http-singleflight.conf")
        or die $!;
    <$fh>;
};
is($snippet, "load_module modules/ngx_http_singleflight_module.so;\n",
    'the snippet loads the module');

my $postinst = do { local $/; open(my $fh, '<', "$x/control/postinst") or die $!; <$fh> };
like($postinst, qr{mod-http-singleflight\.conf:50-mod-http-singleflight\.conf},
    'postinst enables it as 50-mod-http-singleflight.conf');
like($postinst, qr{ln -sf /usr/share/nginx/modules-available/\$from\s*\\?\s*/etc/nginx/modules-enabled/\$to},
    'postinst links it from /etc/nginx/modules-enabled');
ok(-e "$x/control/prerm" && -e "$x/control/postrm", 'prerm and postrm (dh_nginx)');

# nginx -t as installed: the prefix is /usr/share/nginx, whose modules is a
# link to /usr/lib/nginx/modules (nginx-common); here the extracted tree
# stands for /, and modules-enabled holds the link postinst makes
my $prefix = "$x/root/usr/share/nginx";
symlink('../../lib/nginx/modules', "$prefix/modules") or die "symlink: $!";
mkdir "$x/root/etc";
mkdir "$x/root/etc/modules-enabled";
symlink("$prefix/modules-available/mod-http-singleflight.conf",
    "$x/root/etc/modules-enabled/50-mod-http-singleflight.conf") or die $!;

open(my $fh, '>', "$x/nginx.conf") or die $!;
print $fh <<"EOT";
include $x/root/etc/modules-enabled/*.conf;
pid $x/nginx.pid;
error_log $x/error.log;
events { }
http {
    singleflight_zone zone=flights:1m;
    client_body_temp_path $x/body;
    proxy_temp_path $x/proxy;
    fastcgi_temp_path $x/fastcgi;
    uwsgi_temp_path $x/uwsgi;
    scgi_temp_path $x/scgi;
    access_log off;
    server {
        listen 127.0.0.1:1;
        location / { singleflight flights; proxy_pass http://127.0.0.1:2; }
    }
}
EOT
close $fh;

my $out = `$nginx -t -p $prefix/ -c $x/nginx.conf -e $x/error.log 2>&1`;
is($?, 0, 'nginx -t with the package\'s modules-enabled snippet') or diag($out);
like($out, qr/syntax is ok/, 'nginx -t: syntax is ok');

done_testing;
