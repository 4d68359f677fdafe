#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# The module's file replaced under a running nginx (a package upgrade):
# a reload keeps running the module the master loaded, as nginx does with
# every dynamic module, and the module says so in the error log, naming
# the file; so too when the file was removed.  A reload with the file
# unchanged says nothing.

use strict;
use warnings;

use Test::More;
use File::Copy qw(copy);

use lib 't/lib';
use SFTest;

my $t = SFTest->new;
$t->skip_without_module;
plan skip_all => 'reads /proc/PID/maps (Linux)' unless -r '/proc/self/maps';
$t->start_origin;

# a copy of its own, which the test may replace
my $so = $t->path('ngx_http_singleflight_module.so');
copy($t->module_path, $so) or die "copy: $!";

$t->write_config($t->config_template(<<'EOT',
    singleflight_zone zone=sf:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location / {
            singleflight sf;
            proxy_pass http://%%ORIGIN%%;
        }
    }
EOT
    module => 0,
    main => "load_module $so;\nenv LD_PRELOAD;\nenv ASAN_OPTIONS;"));

$t->start;

my $warning = qr/\[warn\].*singleflight: "\Q$so\E" changed since nginx loaded it/;

is($t->get('/a?size=100')->{status}, 200, 'collapsed location answers');

# the file as it was loaded: a reload says nothing
my $off = $t->log_offset;
ok($t->reload, 'reload with the file unchanged');
is($t->log_count($warning, $off), 0, 'no warning while the file is the loaded one');

# a package upgrade: a new file renamed over the old one
my $ino = (stat $so)[1];
copy($so, "$so.new") or die "copy: $!";
rename("$so.new", $so) or die "rename: $!";
isnt((stat $so)[1], $ino, 'the file was replaced by another one');

$off = $t->log_offset;
ok($t->reload, 'reload with the file replaced');
ok($t->wait_for(sub { $t->log_count($warning, $off) >= 1 }),
   'the reload warns that the loaded module keeps running');

# what it warns of: the new workers still map the old, deleted, file
my ($worker) = $t->worker_pids;
my $maps = do { local (@ARGV, $/) = ("/proc/$worker/maps"); <> } // '';
like($maps, qr/\Q$so\E \(deleted\)/, 'a new worker runs the module loaded first');

is($t->get('/b?size=100')->{status}, 200, 'and answers as before');

# the next reload says it again: the module loaded is still the old one
$off = $t->log_offset;
ok($t->reload, 'another reload');
ok($t->wait_for(sub { $t->log_count($warning, $off) >= 1 }),
   'it warns again');

# the file removed (a package purged, the configuration kept): a HUP to
# the master still reloads, with the module in memory, and says so
unlink($so) or die "unlink: $!";
$off = $t->log_offset;
ok($t->reload, 'reload with the file gone');
ok($t->wait_for(sub {
    $t->log_count(qr/\[warn\].*singleflight: "\Q$so\E" is gone since nginx loaded it/,
                  $off) >= 1 }),
   'the reload warns that the file is gone');
is($t->get('/c?size=100')->{status}, 200, 'and answers as before');

done_testing();
