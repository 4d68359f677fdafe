#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# tools/deps.sh never replaces an operator's nginx: where Debian's
# nginx-core is to be installed and /usr/sbin/nginx is another package's
# (nginx.org's "nginx", "NGINX Packaging") or no package's (built and
# installed by hand), it stops before apt-get, says so, and says what to
# do instead (NGINX_SRC=).  Where the nginx there is Debian's, it goes on.
#
# dpkg-query and apt-get are stand-ins on PATH here: nothing is installed.

use strict;
use warnings;

use Test::More;
use File::Temp qw(tempdir);

use lib 't/lib';
use SFTest;

my $dir = tempdir(CLEANUP => 1);

# $owner: the package /usr/sbin/nginx belongs to (undef: none), $from:
# its maintainer.  nginx-core itself is not installed.
sub stubs {
    my ($owner, $from) = @_;
    my $search = defined $owner ? "echo '$owner: \$2'; exit 0" : 'exit 1';
    write_exec('dpkg-query', <<"EOT");
#!/bin/sh
case "\$1" in
    -S) $search ;;
    -W)
        case "\$2" in
            -f='\${Maintainer}'|-f=\\\${Maintainer}) echo '$from'; exit 0 ;;
        esac
        # \${Status}: nothing is installed
        exit 1 ;;
esac
exit 1
EOT
    write_exec('apt-get', "#!/bin/sh\necho \"\$@\" >> $dir/apt-get.called\nexit 0\n");
    write_exec('tee', "#!/bin/sh\ncat > /dev/null\n");
    write_exec('chmod', "#!/bin/sh\nexit 0\n");
    unlink "$dir/apt-get.called";
}

sub write_exec {
    my ($name, $text) = @_;
    open(my $fh, '>', "$dir/$name") or die "$dir/$name: $!";
    print $fh $text;
    close $fh;
    chmod 0755, "$dir/$name";
}

sub deps {
    my ($what) = @_;
    my $nginx = "$dir/nginx";
    write_exec('nginx', "#!/bin/sh\n");
    my $out = `PATH=$dir:\$PATH SF_SYSTEM_NGINX=$nginx SF_REPLACE_NGINX= $SFTest::REPO/tools/deps.sh $what 2>&1`;
    return ($? >> 8, $out, -e "$dir/apt-get.called");
}

# nginx.org's package
stubs('nginx', 'NGINX Packaging <nginx-packaging@f5.com>');
my ($rc, $out, $apt) = deps('build');
isnt($rc, 0, "nginx.org's nginx: deps.sh stops");
ok(!$apt, "nginx.org's nginx: apt-get is not run");
like($out, qr/is the package nginx \(NGINX Packaging.*not Debian's nginx; installing.*nginx-core.*would replace it/,
     "nginx.org's nginx: it says whose nginx it would replace");
like($out, qr/make test NGINX_SRC=/, "nginx.org's nginx: it says what to do instead");

# an nginx no package owns
stubs(undef, '');
($rc, $out, $apt) = deps('build');
isnt($rc, 0, 'an nginx installed by hand: deps.sh stops');
ok(!$apt, 'an nginx installed by hand: apt-get is not run');
like($out, qr/is not from any package/, 'an nginx installed by hand: it says so');

# tests against an nginx built from source need no Debian nginx at all
($rc, $out, $apt) = deps('test-src');
is($rc, 0, 'test-src: goes on beside any nginx') or diag($out);
unlike(($apt ? `cat $dir/apt-get.called` : ''), qr/nginx-core/,
       'test-src: nginx-core is not installed');

# Debian's own nginx: installed as before
stubs('nginx-core', 'Debian Nginx Maintainers <pkg-nginx-maintainers@alioth-lists.debian.net>');
($rc, $out, $apt) = deps('build');
is($rc, 0, "Debian's nginx: deps.sh goes on") or diag($out);
ok($apt, "Debian's nginx: apt-get installs what is missing");

done_testing;
