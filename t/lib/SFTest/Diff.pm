# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
package SFTest::Diff;

# SFTest::Diff - differential tests: a client of nginx with the
# singleflight module on gets exactly what it gets without the module.
#
# Two nginx instances run side by side, each an SFTest object with its own
# test dir, ports and echo origin (t/origin.pl, echo=1: the body is the
# request the origin got, see echo_body() there):
#   on    the module loaded, "singleflight_zone zone=sf:4m; singleflight sf
#         content=any;" (static files and the like collapsed too)
#         at http level, so every location of the fragment collapses;
#   off   the reference: no module at all, and the fragment's
#         singleflight_* directives removed.
# A scenario is an http{} fragment (the same for both) and a set of
# requests.  Both instances get the same requests at the same moments, and
# each response with the module must equal the same request's response
# without it: the status, the body, and the headers that matter
# (@MATTER, and any X-Diff-* a fragment adds).  The origin's hit numbers
# are in X-Hit, never in a body, so bodies compare; what the echo leaves
# out (hop-by-hop and framing headers, the module's CDN-Loop, conditionals
# and ranges, which it answers instead) is %NOT_ECHOED in t/origin.pl.
# Both sides send the origin "Host: o" (upstream o).  Where collapsing is
# safe, the module must also cost fewer origin requests.  On a mismatch
# the test prints a reproduction: the scenario, its configuration, every
# request as sent, and both responses of the requests that differ.
#
# Synopsis:
#   my $d = SFTest::Diff->new;             # two SFTests, two echo origins
#   $d->skip_without_module;
#   $d->run({
#       name     => 'plain',
#       config   => <<'EOT',               # placeholders below
#           server {
#               listen 127.0.0.1:%%PORT%%;
#               location / { proxy_pass http://o; }
#           }
#       EOT
#       requests => [ { path => '/a?echo=1&delay=300', n => 5, status => 200 } ],
#       fetches  => 'fewer',
#   });
#   done_testing;
#
# A scenario (a hash):
#   name      a word; DIFF_ONLY=name,name runs only those
#   config    the http{} fragment.  The origin is "upstream o" (write
#             proxy_pass http://o...: the Host it gets is then the same
#             for both; %%ORIGIN%% is each instance's own address).
#             Placeholders: SFTest's (%%PORT%%, %%PORT_n%%, %%TESTDIR%%:
#             each instance's own), and %%DOCROOT%%: one directory both
#             instances share, so static files have the same ETag and
#             Last-Modified in both.
#             Every singleflight_* directive on a line of its own (the
#             reference drops those lines); no $singleflight_* variable
#             (the reference has no module; the harness logs
#             $singleflight_status itself).
#   files     { "relative/path" => content } written under %%DOCROOT%%
#   requests  a list of hashes:
#               method (GET), path, headers ([Name => value, ...]),
#               body, http10 (sent as HTTP/1.0), h2 (sent by curl over
#               HTTP/2: the port must listen with http2),
#               port (index: 0 is %%PORT%%, n is %%PORT_n%%),
#               n (copies, 1), at (seconds after the start, 0),
#               after_hits (start only once the instance's origin has
#               counted this many requests: a leader is on its way),
#               status (what the reference must answer: a check of the
#               scenario itself), like (a qr// the reference body must
#               match), timeout (10 s);
#             and for origins that break off (see "Broken responses"):
#               pipeline (HTTP/1.x: sent with "Connection: keep-alive" and
#               "GET /sf-next", which the fragment must answer with
#               exactly "next\n", right behind it on the same connection;
#               the client reads until nginx closes it), alt (other
#               requests, [{ path, headers }, ...], headers and the rest
#               as this one's unless given: the reference's answers to
#               them are right answers to this one too; loose => 1 in
#               one: only its status and Content-Range must be the
#               same), whole (with the module it must be answered
#               complete), error (a status the module may answer it with
#               itself, singleflight_error_status, where its
#               $singleflight_status is ERROR: a follower whose flight
#               broke off before it had a byte, and the flight it then
#               looked for too)
#   fetches   'fewer' (origin requests with the module < without),
#             'same', 'not_more', or undef (no check)
#   latency   seconds: no response with the module may complete later
#             than the same request's without it plus this
#   workers   of the instance with the module (2)
#
# Broken responses.  Where the origin breaks off a response, changes it or
# answers a Range wrongly, the module may rightly answer otherwise than
# nginx does without it: it resumes a break that nginx passes on, it
# shares one representation where the origin gave later requests another,
# it breaks all of a flight's readers off where the origin broke one.  A
# request with "alt" names what is right then: the same request to an
# origin that sends one representation whole and does not break off
# (built by the scenario, e.g. t/lib/SFTest/Diff/Blocks.pm's resume
# block), whose answers the reference gives after the scenario's
# requests.  A response with the module is accepted (accepted()) if
#   it equals the reference's answer to the same request (differences()),
#   or the reference's answer to one of its alternatives: all of one
#     representation's body, byte for byte, with its status and headers
#     (a loose one: its status and Content-Range, for a 416 that nginx's
#     range filter makes itself where the module cuts ranges from a whole
#     response, with nginx's error page as its body);
#   or it is the module's own error (error, complete, its
#     $singleflight_status ERROR: README, Failures, "The origin breaks off
#     mid-body");
#   or it is a truncation of one of those answers: the same status and
#     headers, a body that is a prefix of that answer's body (not longer,
#     nothing in it from another representation or from another place),
#     and the connection closed by nginx: "connection closed before the
#     response was complete" over HTTP/1.x, curl's "transfer closed" (18),
#     "failure receiving" (56) or stream error (92) over HTTP/2.  Not a
#     timeout: a body shorter than its length on a connection kept open.
#     Over HTTP/2 a stream reset may come with no header at all (nginx
#     drops the frames it had not sent yet, with the module or without):
#     nothing is a truncation of every answer there.  A body that ends
#     with the connection (no length, not chunked: HTTP/1.0) cannot tell
#     its end from a break: a prefix is a truncation there too.
# A pipelined request checks the connection after the response too: the
# bytes after the body, up to nginx's close, must be the next request's
# answer (or nothing, after a truncation): never bytes past the body's
# length, never a short body on a connection kept alive (the next
# answer's bytes then land inside the body, which is no prefix then).
# Every response is split there: res->{next} is "ok" (the next answer
# came after it), "none" (the connection was closed after it), "n/a" (not
# pipelined, chunked, or no body), or "bad: ..." (other bytes).
#
# DIFF_SELFCHECK=1 (or new(selfcheck => 1)) runs the reference on both
# sides: a difference is then the harness's own noise (a race in a
# scenario, an origin that is not deterministic), not the module's.
#
# Methods:
#   new(%opt)                    workers_off (1), selfcheck
#   skip_without_module
#   run($scenario)               a subtest named after the scenario;
#                                returns { ok, on, off, hits_on, hits_off,
#                                diffs => [[index, @differences], ...],
#                                report } (report: the reproduction text)
#   tally                        how the requests with alternatives were
#                                right: { same (as without the module),
#                                whole (another right answer), cut (a
#                                truncation), loose, error => count }
#   selected($name)              DIFF_ONLY allows it
#   on, off                      the two SFTest objects
# Functions:
#   differences($on, $off, $method)  what differs between two responses
#                                    (results of SFTest's client), a list
#   accepted($on, \@right, $method)  is $on one of those answers, or a
#                                    truncation of one (see Broken
#                                    responses): (1, how) or (0, @why)
#   truncation($x, $a, $method)      is $x a truncation of $a: the
#                                    differences, a list
#   split_next($res)                 a pipelined response's own body, and
#                                    its {next}
#   show_response($res)              a response as text, for a report
#   reference_config($fragment)      the fragment as the reference runs it
#   enc($text)                       URL-encoded, for a query parameter

use strict;
use warnings;

use Exporter qw(import);
use File::Path qw(make_path);
use IO::Uncompress::Gunzip ();
use Test::More ();
use Time::HiRes qw(time sleep);

use SFTest ();

our @EXPORT_OK = qw(enc differences accepted truncation split_next show_response reference_config);

# The response headers that matter to a client and must be equal; others
# (Date, Server, Connection, Keep-Alive, Transfer-Encoding, X-Hit,
# X-Uri-Hit, Accept-Ranges) may differ.  Content-Length: a body sent
# chunked on one side equals one sent with a Content-Length of its length
# on the other.  Bodies with Content-Encoding: gzip are compared
# uncompressed (but the Content-Length must still match).  X-Upstream is
# where a scenario shows $upstream_* variables (add_header); X-Fz-Outer
# and X-Fz-Inner show which location's add_header a response went
# through (the one it came in by, or the one a redirect sent it to).
our @MATTER = qw(content-type content-length content-range content-encoding etag
    last-modified location vary set-cookie cache-control expires www-authenticate
    content-disposition content-language x-upstream x-fz-outer x-fz-inner);

my $BODY_SHOWN = 1500;    # bytes of a body in a report

# What the pipelined request behind a request (pipeline => 1) asks, and
# what the fragment answers it with.
our $NEXT_PATH = '/sf-next';
our $NEXT_BODY = "next\n";

# How a response cut by nginx ends for its client: HTTP/1.x, then curl's
# exit codes (18: transfer closed with bytes left, 56: failure receiving,
# 92: HTTP/2 stream error).
my $CLOSED = qr/^(?:connection closed before the response was complete|curl exit (?:18|56|92):)/;

# ------------------------------------------------------------ setup

sub new {
    my ($class, %opt) = @_;
    my $self = bless { opt => \%opt, n => 0, selfcheck => $opt{selfcheck} // $ENV{DIFF_SELFCHECK} },
        $class;
    Test::More::diag('DIFF_SELFCHECK: both sides without the module') if $self->{selfcheck};
    $self->{on} = SFTest->new;
    $self->{off} = SFTest->new;
    $self->{on}->start_origin;
    $self->{off}->start_origin;
    return $self;
}

sub on { $_[0]{on} }
sub off { $_[0]{off} }
sub tally { $_[0]{tally} // {} }

sub skip_without_module { $_[0]{on}->skip_without_module unless $_[0]{selfcheck} }

sub selected {
    my ($self, $name) = @_;
    my $only = $ENV{DIFF_ONLY} // '';
    return 1 unless length $only;
    return scalar grep { $_ eq $name } split /[\s,]+/, $only;
}

# A query parameter's value, URL-encoded.
sub enc {
    my ($s) = @_;
    $s =~ s/([^A-Za-z0-9\-._~\/:])/sprintf '%%%02X', ord $1/ge;
    return $s;
}

# ------------------------------------------------------------ configuration

# The http{} body each instance runs: the harness's lines, then the
# fragment (singleflight_* lines dropped for the reference).
sub _http_body {
    my ($self, $sc, $side, $docroot) = @_;
    my $frag = $sc->{config} =~ s/%%DOCROOT%%/$docroot/gr;
    $side = 'off' if $self->{selfcheck};
    my $common = <<"EOT";
    upstream o {
        server %%ORIGIN%%;
    }

EOT
    if ($side eq 'on') {
        return $common . <<"EOT" . $frag;
    singleflight_zone zone=sf:4m;
    singleflight sf content=any;
    log_format sfdiff '\$remote_port \$status \$singleflight_status';
    access_log %%TESTDIR%%/diff.log sfdiff;

EOT
    }
    $frag = eval { reference_config($frag) } // die "scenario $sc->{name}: $@";
    return $common . <<"EOT" . $frag;
    log_format sfdiff '\$remote_port \$status -';
    access_log %%TESTDIR%%/diff.log sfdiff;

EOT
}

# The reference's fragment: without the lines of singleflight directives.
# Dies if one is not on a line of its own, or a $singleflight_ variable is
# used.
sub reference_config {
    my ($frag) = @_;
    $frag =~ s/^[ \t]*singleflight(?:_\w+)?\s[^;]*;[ \t]*(?:#.*)?\n//mg;
    die "a singleflight directive not on a line of its own\n" if $frag =~ /\bsingleflight(?:_\w+)?\s/;
    die "\$singleflight_* variables cannot be in the reference\n" if $frag =~ /\$\{?singleflight_/;
    return $frag;
}

# Writes both configurations; nginx -t on each.  Returns ($ok, $why).
sub _configure {
    my ($self, $sc, $docroot) = @_;
    for my $side (qw(on off)) {
        my $t = $self->{$side};
        my $conf = $t->config_template($self->_http_body($sc, $side, $docroot),
            module => $side eq 'on' && !$self->{selfcheck},
            workers => $side eq 'on' ? $sc->{workers} // 2 : $self->{opt}{workers_off} // 1);
        $t->write_config($conf);
        my ($ok, $out) = $t->test_config;
        return (0, "nginx -t " . ($side eq 'on' ? 'with the module' : 'of the reference')
            . " fails:\n$out") unless $ok;
        $self->{warnings}{$side} = join "\n", grep { /\[warn\]/ } split /\n/, $out;
    }
    return (1);
}

# ------------------------------------------------------------ running

# Runs a scenario on both instances; a subtest.  See the top of the file.
sub run {
    my ($self, $sc) = @_;
    return undef unless $self->selected($sc->{name});
    my $result;
    Test::More::subtest($sc->{name} => sub { $result = $self->_run($sc) });
    return $result;
}

sub _run {
    my ($self, $sc) = @_;
    my ($on, $off) = @$self{qw(on off)};
    my $docroot = $on->path('docroot-' . ++$self->{n});
    make_path($docroot);
    chmod 0755, $docroot;
    for my $f (sort keys %{ $sc->{files} // {} }) {
        my $file = "$docroot/$f";
        (my $dir = $file) =~ s{/[^/]*$}{};
        make_path($dir);
        open(my $fh, '>', $file) or die "cannot write $file: $!";
        print $fh $sc->{files}{$f};
        close($fh);
    }

    my ($ok, $why) = $self->_configure($sc, $docroot);
    if (!$ok) {
        Test::More::fail('both configurations pass nginx -t');
        Test::More::diag("scenario $sc->{name}: $why");
        return { ok => 0, report => $why };
    }
    for my $t ($on, $off) {
        next if $t->start(may_fail => 1);
        Test::More::fail('nginx starts');
        Test::More::diag("scenario $sc->{name}: nginx does not start:\n"
            . $t->error_log_since(0));
        $_->stop(timeout => 3) for $on, $off;
        return { ok => 0 };
    }
    $_->origin_reset for $on, $off;

    my $reqs = _expand($sc->{requests});
    my $log_from = $on->log_offset('diff.log');
    my $res = $self->_send_all($reqs);
    my %hits = (on => $on->origin_hits->{total}, off => $off->origin_hits->{total});
    my $sf = $self->_sf_statuses($res->{on}, $log_from);
    $res->{alt} = $self->_send_alternatives($reqs);
    $_->stop(timeout => 3) for $on, $off;

    my $r = $self->_judge($sc, $reqs, $res, $sf, \%hits);

    # an [alert] or a sanitizer's report (make fuzz-asan) fails the
    # scenario it came in, not only the test file at its end
    my @new;
    for my $side (qw(on off)) {
        my @bad = $self->{$side}->bad_log_lines;
        push @new, @bad[ ($self->{bad_seen}{$side} // 0) .. $#bad ];
        $self->{bad_seen}{$side} = @bad;
    }
    $r->{ok} &= Test::More::ok(!@new, 'no alert or sanitizer report in the logs')
        || Test::More::diag(join "\n", @new[ 0 .. ($#new < 29 ? $#new : 29) ]);
    return $r;
}

# The requests, each copy on its own: [{ %request, idx }, ...] in start order.
sub _expand {
    my ($list) = @_;
    my @all;
    for my $r (@$list) {
        push @all, { method => 'GET', at => 0, port => 0, %$r } for 1 .. $r->{n} // 1;
    }
    my $i = 0;
    $_->{idx} = $i++ for @all;
    return \@all;
}

# Sends every request to both instances, each at its time (and once its
# instance's origin has counted after_hits requests, or 3 s later at the
# latest), and drives them all until done.  { on => [result...], off => ...}
sub _send_all {
    my ($self, $reqs) = @_;
    my (%handles, %next, %hits_at, %hits);
    my $t0 = time;
    my $deadline = $t0;
    for (@$reqs) {
        my $end = $_->{at} + ($_->{after_hits} ? 3 : 0) + ($_->{timeout} // 10) + 1;
        $deadline = $t0 + $end if $t0 + $end > $deadline;
    }
    %next = (on => 0, off => 0);
    while (time < $deadline) {
        my $now = time;
        for my $side (qw(on off)) {
            my $t = $self->{$side};
            while ($next{$side} < @$reqs) {
                my $r = $reqs->[ $next{$side} ];
                last if $now - $t0 < $r->{at};
                if ($r->{after_hits} && $now - $t0 < $r->{at} + 3) {
                    if (($hits_at{$side} // 0) < $now - 0.01) {
                        $hits{$side} = $t->origin_hits->{total};
                        $hits_at{$side} = time;
                    }
                    last if $hits{$side} < $r->{after_hits};
                }
                my $h = $t->start_request($r->{method}, $r->{path},
                    port => $t->port($r->{port}), headers => $r->{headers} // [],
                    (defined $r->{body} ? (body => $r->{body}) : ()),
                    ($r->{http10} ? (http10 => 1) : ()), ($r->{h2} ? (h2 => 1) : ()),
                    ($r->{pipeline} && !$r->{h2} ? (raw => _request_text($r), until_close => 1) : ()),
                    timeout => $r->{timeout} // 10);
                $h->{started} = time - $t0;
                $handles{$side}[ $r->{idx} ] = $h;
                $next{$side}++;
            }
        }
        my $left = 0;
        for my $side (qw(on off)) {
            $left += @$reqs - $next{$side};
            for my $h (grep { defined } @{ $handles{$side} // [] }) {
                $left++ unless $self->{$side}->poll_request($h);
            }
        }
        last unless $left;
        sleep(0.003);
    }
    my %res;
    for my $side (qw(on off)) {
        for my $i (0 .. $#$reqs) {
            my $h = $handles{$side}[$i];
            $self->{$side}->abort_request($h) if $h && $h->{state} ne 'done';
            $res{$side}[$i] = $h ? { %{ $h->{res} }, started => $h->{started},
                local_port => $h->{local_port} } : { error => 'never started' };
            split_next($res{$side}[$i]) if $reqs->[$i]{pipeline} && !$reqs->[$i]{h2};
        }
    }
    return \%res;
}

# The bytes a request is sent as: with pipeline, "Connection:
# keep-alive" and the next request right behind it.
sub _request_text {
    my ($r) = @_;
    my %o = (headers => $r->{headers} // [], (defined $r->{body} ? (body => $r->{body}) : ()),
        ($r->{http10} ? (http10 => 1) : ()), ($r->{h2} ? (h2 => 1) : ()));
    return SFTest::request_text($r->{method}, $r->{path}, %o) unless $r->{pipeline} && !$r->{h2};
    return SFTest::request_text($r->{method}, $r->{path}, %o,
            headers => [ @{ $o{headers} }, Connection => 'keep-alive' ])
        . SFTest::request_text('GET', $NEXT_PATH, $r->{http10} ? (http10 => 1) : ());
}

# A pipelined response read until nginx closed the connection: its body
# (up to its Content-Length) and what came after it, in {next}: "ok" for
# the next request's answer, "none" for nothing, "bad: ..." for other
# bytes; "n/a" where that cannot be told (no length: the client stopped
# at the body's end; incomplete: whatever came is in the body).
sub split_next {
    my ($r) = @_;
    my $cl = $r->{headers}{'content-length'};
    if (!$r->{complete} || $r->{chunked} || !defined $cl || $cl !~ /^\d+$/
        || length($r->{body} // '') < $cl)
    {
        $r->{next} = 'n/a';
        return $r;
    }
    my $rest = substr($r->{body}, $cl);
    $r->{body} = substr($r->{body}, 0, $cl);
    $r->{next} = !length $rest ? 'none'
        : $rest =~ m{^HTTP/1\.[01] 200 [^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n\Q$NEXT_BODY\E\z} ? 'ok'
        : 'bad: ' . length($rest) . ' bytes after the body: "' . _escape(substr($rest, 0, 80)) . '"';
    return $r;
}

# The reference's answers to each request's alternatives (alt), sent
# once the scenario's requests are answered, all at once: [[res, ...], ...]
sub _send_alternatives {
    my ($self, $reqs) = @_;
    my $t = $self->{off};
    my (@h, @where);
    for my $r (grep { $_->{alt} } @$reqs) {
        for my $k (0 .. $#{ $r->{alt} }) {
            my $a = { %$r, %{ $r->{alt}[$k] } };
            push @h, $t->start_request($a->{method}, $a->{path}, port => $t->port($a->{port}),
                headers => $a->{headers} // [], ($a->{http10} ? (http10 => 1) : ()),
                ($a->{h2} ? (h2 => 1) : ()), timeout => $a->{timeout} // 10);
            push @where, [ $r->{idx}, $k ];
        }
    }
    my $res = $t->finish_all(\@h);
    my @alt;
    for (0 .. $#where) {
        my ($i, $k) = @{ $where[$_] };
        $alt[$i][$k] = { %{ $res->[$_] }, $reqs->[$i]{alt}[$k]{loose} ? (loose => 1) : () };
    }
    return \@alt;
}

# $singleflight_status of each request with the module, from its access
# log line (by the client's port), once they are all there (2 s at most).
sub _sf_statuses {
    my ($self, $res, $offset) = @_;
    my $t = $self->{on};
    my %by_port;
    $t->wait_for(sub {
        # a pipelined request's line first, its next one's after
        %by_port = ();
        for (split /\n/, $t->read_file('diff.log', $offset)) {
            my ($p, undef, $sf) = split ' ';
            $by_port{ $p // '' } //= $sf;
        }
        !grep { defined $_->{local_port} && !exists $by_port{ $_->{local_port} } } @$res;
    }, timeout => 2, quiet => 1);
    return [ map { $by_port{ $_->{local_port} // '' } // '?' } @$res ];
}

# ------------------------------------------------------------ judging

sub _judge {
    my ($self, $sc, $reqs, $res, $sf, $hits) = @_;
    my ($on, $off) = @$res{qw(on off)};
    my $ok = 1;

    # The reference itself: every response complete, as the scenario says
    # (one with alternatives may be broken off, theirs may not).
    my @bad_ref;
    for my $i (0 .. $#$reqs) {
        my ($r, $o) = ($reqs->[$i], $off->[$i]);
        my @why;
        push @why, 'incomplete: ' . ($o->{error} // '?') unless $o->{complete} || $r->{alt};
        push @why, map { "alternative $_ incomplete: " . ($res->{alt}[$i][$_]{error} // '?') }
            grep { !$res->{alt}[$i][$_]{complete} } 0 .. $#{ $r->{alt} // [] };
        push @why, "status $o->{status}, expected $r->{status}"
            if defined $r->{status} && ($o->{status} // 0) != $r->{status};
        push @why, "body does not match $r->{like}" if $r->{like} && $o->{body} !~ $r->{like};
        push @bad_ref, [ $i, @why ] if @why;
    }
    $ok &= Test::More::ok(!@bad_ref, 'the reference (no module) answers as the scenario expects')
        || Test::More::diag(join "\n", map {
            my ($i, @w) = @$_;
            "request #$i: " . join('; ', @w) . "\n" . _indent(show_response($off->[$i]))
        } @bad_ref);

    # The module's responses: the reference's, or (alt) one of the right
    # answers or a truncation of one.
    my @diffs;
    for my $i (0 .. $#$reqs) {
        my ($r, $x) = ($reqs->[$i], $on->[$i]);
        my @d = differences($x, $off->[$i], $r->{method});
        my $how = 'same';
        if (@d && $r->{alt}) {
            my ($ok, @why) = accepted($x, [ $off->[$i], @{ $res->{alt}[$i] // [] } ], $r->{method});
            ($how, @d) = $ok ? ($why[0]) : ('', @why);
        }
        ($how, @d) = ('error') if @d && defined $r->{error} && $x->{complete}
            && $sf->[$i] eq 'ERROR' && ($x->{status} // 0) == $r->{error};
        $self->{tally}{$how}++ if $r->{alt} && !@d;
        if ($r->{pipeline} && !$r->{h2}) {
            my ($n, $m) = ($x->{next} // 'n/a', $off->[$i]{next} // 'n/a');
            push @d, "after the response: $n" if $n =~ /^bad/;
            push @d, 'the connection closed after a complete response, the next request on it'
                . " unanswered (without the module: $m)" if $n eq 'none' && $m eq 'ok';
        }
        push @d, "not answered whole: $x->{error}" . ($x->{complete} ? '' : ', '
            . length($x->{body} // '') . ' bytes') if $r->{whole} && !$x->{complete};
        push @diffs, [ $i, @d ] if @d;
    }
    my $report = @diffs ? $self->_report($sc, $reqs, $res, $sf, \@diffs, $hits) : '';
    $ok &= Test::More::ok(!@diffs, 'every response with the module equals the one without'
        . (@diffs ? ' (' . scalar(@diffs) . ' of ' . scalar(@$reqs) . ' differ)' : ''))
        || Test::More::diag($report);

    # What it cost.
    my $f = $self->{selfcheck} ? 'not_more' : $sc->{fetches} // '';
    my $cost = "origin requests with the module $hits->{on}, without $hits->{off}";
    if ($f eq 'fewer') {
        $ok &= Test::More::ok($hits->{on} < $hits->{off}, "fewer origin requests ($cost)");
    }
    elsif ($f eq 'same') {
        $ok &= Test::More::ok($hits->{on} == $hits->{off}, "as many origin requests ($cost)");
    }
    elsif ($f eq 'not_more') {
        $ok &= Test::More::ok($hits->{on} <= $hits->{off}, "no more origin requests ($cost)");
    }

    # How long it took.
    if (defined $sc->{latency}) {
        my @slow = grep {
            my ($x, $y) = ($on->[$_], $off->[$_]);
            ($x->{started} // 0) + ($x->{time} // 1e9)
                > ($y->{started} // 0) + ($y->{time} // 0) + $sc->{latency}
        } 0 .. $#$reqs;
        $ok &= Test::More::ok(!@slow, "no response more than $sc->{latency} s later than without"
            . " the module") || Test::More::diag(join "\n", map {
                sprintf('request #%d (%s): %.3f s with the module (%s), %.3f s without', $_,
                    "$reqs->[$_]{method} $reqs->[$_]{path}", $on->[$_]{time} // -1, $sf->[$_],
                    $off->[$_]{time} // -1)
            } @slow);
    }
    return { ok => $ok, on => $on, off => $off, sf => $sf, hits_on => $hits->{on},
        hits_off => $hits->{off}, diffs => \@diffs, report => $report };
}

# What differs between two responses to the same request: a list of
# descriptions, empty if they are equal.
sub differences {
    my ($x, $y, $method) = @_;
    my @d;
    my ($cx, $cy) = ($x->{complete} ? 1 : 0, $y->{complete} ? 1 : 0);
    if ($cx != $cy) {
        push @d, 'with the module ' . ($cx ? 'complete' : 'incomplete (' . ($x->{error} // '?') . ')')
            . ', without ' . ($cy ? 'complete' : 'incomplete (' . ($y->{error} // '?') . ')');
    }
    my ($sx, $sy) = ($x->{status} // 'none', $y->{status} // 'none');
    push @d, "status $sx, without the module $sy" if $sx ne $sy;
    if (($method // 'GET') ne 'HEAD' && $x->{body} ne $y->{body}) {
        my ($bx, $by) = map { _decoded($_) } $x, $y;
        push @d, 'body: ' . _body_difference($bx, $by) if $bx ne $by;
    }
    my %names = map { $_ => 1 } @MATTER,
        grep { /^x-diff-/ } keys %{ $x->{headers} }, keys %{ $y->{headers} };
    for my $n (sort keys %names) {
        my ($va, $vb) = ($x->{headers}{$n}, $y->{headers}{$n});
        next if defined $va && defined $vb && $va eq $vb;
        next if !defined $va && !defined $vb;
        next if $n eq 'content-length' && _same_length($x, $y, $method);
        push @d, "$n: " . (defined $va ? "\"$va\"" : 'none') . ', without the module '
            . (defined $vb ? "\"$vb\"" : 'none');
    }
    return @d;
}

# Is $x a right answer: equal to one of the complete answers in @$right
# (differences()), or a truncation of one of them (truncation())?  (1,
# how: "whole", "cut" or "loose"), or (0, @why): why not, against each.
sub accepted {
    my ($x, $right, $method) = @_;
    my @why;
    for my $k (0 .. $#$right) {
        my $a = $right->[$k];
        next unless $a && $a->{complete};
        my @d = $a->{loose} ? _loose_differences($x, $a)
            : $x->{complete} ? differences($x, $a, $method) : truncation($x, $a, $method);
        my $kind = $a->{loose} ? 'loose' : $x->{complete} ? 'whole' : 'cut';
        ($kind, @d) = ('cut', truncation($x, $a, $method))
            if @d && !$a->{loose} && _close_delimited($x, $method);
        return (1, $kind) unless @d;
        push @why, ($k ? "against alternative $k" : 'against the reference') . ' ('
            . ($a->{status} // 'none') . ', ' . length($a->{body} // '') . ' bytes): ' . join('; ', @d);
    }
    return (0, @why ? @why : 'no complete answer to compare with');
}

# A loose alternative's: the status and Content-Range only, complete.
sub _loose_differences {
    my ($x, $a) = @_;
    my @d;
    push @d, 'incomplete (' . ($x->{error} // '?') . ')' unless $x->{complete};
    for my $f ([ 'status', $x->{status}, $a->{status} ],
        [ 'content-range', $x->{headers}{'content-range'}, $a->{headers}{'content-range'} ]) {
        my ($n, $vx, $va) = @$f;
        push @d, "$n " . ($vx // 'none') . ", the answer's " . ($va // 'none')
            if ($vx // 'none') ne ($va // 'none');
    }
    return @d;
}

# A body that ends where the connection does (HTTP/1.0, no length).
sub _close_delimited {
    my ($x, $method) = @_;
    return $x->{complete} && defined $x->{status} && !$x->{chunked} && ($method // 'GET') ne 'HEAD'
        && !defined $x->{headers}{'content-length'} && ($x->{protocol} // '') =~ m{^HTTP/1}
        && $x->{status} !~ /^(?:1\d\d|204|304)$/;
}

# What keeps $x from being a truncation of the complete answer $a: its
# connection closed by nginx ($CLOSED) before its end, the same status
# and headers that matter (a Content-Length on one side only must be the
# length of $a's body), and a body that is a prefix of $a's body.
sub truncation {
    my ($x, $a, $method) = @_;
    return () if !$x->{complete} && !defined $x->{status} && !length($x->{body} // '')
        && ($x->{error} // '') =~ /^curl exit (?:18|56|92):/;
    my @d;
    push @d, 'complete' if $x->{complete} && !_close_delimited($x, $method);
    push @d, 'ended by ' . ($x->{error} // '?') . ', not a closed connection'
        if !$x->{complete} && ($x->{error} // '') !~ $CLOSED;
    my ($sx, $sa) = ($x->{status} // 'none', $a->{status} // 'none');
    push @d, "status $sx, the answer's $sa" if $sx ne $sa;
    my %names = map { $_ => 1 } @MATTER,
        grep { /^x-diff-/ } keys %{ $x->{headers} }, keys %{ $a->{headers} };
    for my $n (sort keys %names) {
        my ($vx, $va) = ($x->{headers}{$n}, $a->{headers}{$n});
        next if defined $vx && defined $va && $vx eq $va || !defined $vx && !defined $va;
        next if $n eq 'content-length' && (!defined $vx || !defined $va)
            && ($vx // $va) eq length($a->{body} // '');
        push @d, "$n: " . (defined $vx ? "\"$vx\"" : 'none') . ', the answer\'s '
            . (defined $va ? "\"$va\"" : 'none');
    }
    return @d if ($method // 'GET') eq 'HEAD';
    my ($bx, $ba) = ($x->{body} // '', $a->{body} // '');
    if (length $bx > length $ba) {
        push @d, 'body: ' . length($bx) . ' bytes, longer than the answer\'s ' . length $ba;
    }
    elsif ($bx ne substr($ba, 0, length $bx)) {
        push @d, 'body: not a prefix of the answer\'s: ' . _body_difference($bx, $ba);
    }
    return @d;
}

# The body, gunzipped if it is gzip encoded: gzip's output depends on how
# its input came in buffers, the same content may compress differently.
sub _decoded {
    my ($r) = @_;
    return $r->{body} unless ($r->{headers}{'content-encoding'} // '') eq 'gzip';
    my $out;
    IO::Uncompress::Gunzip::gunzip(\$r->{body}, \$out) or return $r->{body};
    return $out;
}

# A Content-Length on one side only, the other side chunked, same body.
sub _same_length {
    my ($x, $y, $method) = @_;
    return 0 if ($method // 'GET') eq 'HEAD';
    my ($with, $without) = defined $x->{headers}{'content-length'} ? ($x, $y) : ($y, $x);
    return $without->{chunked} && $with->{headers}{'content-length'} eq length $with->{body}
        && $x->{body} eq $y->{body};
}

# Where two bodies part: the line with the first differing byte.
sub _body_difference {
    my ($x, $y) = @_;
    my $i = 0;
    $i++ while $i < length $x && $i < length $y && substr($x, $i, 1) eq substr($y, $i, 1);
    my $line = () = substr($x, 0, $i) =~ /\n/g;
    my $from = rindex($x, "\n", $i - 1) + 1;
    my ($lx) = substr($x, $from) =~ /^([^\n]*)/;
    my ($ly) = substr($y, $from) =~ /^([^\n]*)/;
    return sprintf('%d bytes, without the module %d; first difference at byte %d (line %d): '
        . '"%s" vs "%s"', length $x, length $y, $i, $line + 1,
        _escape(substr($lx // '', 0, 120)), _escape(substr($ly // '', 0, 120)));
}

sub _escape {
    my ($s) = @_;
    $s =~ s/([^\x20-\x7e\n])/sprintf '\\x%02x', ord $1/ge;
    return $s;
}

sub _indent { join '', map { "    $_\n" } split /\n/, $_[0] }

# A response as text: status line, headers, body (escaped, cut).
sub show_response {
    my ($r) = @_;
    my $s = defined $r->{status} ? "$r->{protocol} $r->{status} $r->{reason}\n" : "(no status line)\n";
    $s .= "$_->[0]: $_->[1]\n" for @{ $r->{header_list} // [] };
    $s .= "[" . ($r->{complete} ? 'complete' : 'incomplete: ' . ($r->{error} // '?'))
        . sprintf(', %.3f s', $r->{time} // -1) . (defined $r->{next} ? ", next: $r->{next}" : '')
        . ', ' . length($r->{body} // '') . " body bytes]\n";
    my $body = $r->{body} // '';
    $s .= "\n" . _escape(substr($body, 0, $BODY_SHOWN))
        . (length $body > $BODY_SHOWN ? "\n[... " . (length($body) - $BODY_SHOWN) . " more bytes]"
            : '') . "\n" if length $body;
    return $s;
}

# The reproduction of a scenario's differences.
sub _report {
    my ($self, $sc, $reqs, $res, $sf, $diffs, $hits) = @_;
    my $on = $self->{on};
    my $s = "==== scenario '$sc->{name}': " . scalar(@$diffs) . ' of ' . scalar(@$reqs)
        . " responses differ with the module\n";
    $s .= "---- http{} configuration (the reference: same, without the singleflight lines;"
        . " ports with the module: " . join(', ', map { "%%PORT" . ($_ ? "_$_" : '') . "%%="
        . $on->port($_) } sort { $a <=> $b } keys %{ $on->{ports} }) . ")\n";
    $s .= $sc->{config} =~ s/^\n+//r;
    $s .= "---- files: " . join(', ', sort keys %{ $sc->{files} }) . "\n" if $sc->{files};
    $s .= "---- requests (at: seconds after the start; port index; the module's"
        . " \$singleflight_status)\n";
    for my $r (@$reqs) {
        my $text = _request_text($r);
        $s .= sprintf("#%d at %.3f%s port %d, %s:\n", $r->{idx}, $res->{on}[ $r->{idx} ]{started} // -1,
            $r->{after_hits} ? " (after $r->{after_hits} origin requests)" : '', $r->{port},
            $sf->[ $r->{idx} ]) . _indent(_escape($text =~ s/\r\n/\n/gr));
    }
    $s .= "---- origin requests: with the module $hits->{on}, without $hits->{off}\n";
    my $shown = 0;
    for my $d (@$diffs) {
        my ($i, @what) = @$d;
        if (++$shown > 3) {
            $s .= "---- (" . (@$diffs - 3) . " more requests differ)\n";
            last;
        }
        $s .= "---- request #$i ($sf->[$i] with the module) differs:\n" . _indent(join "\n", @what)
            . "  with the module:\n" . _indent(show_response($res->{on}[$i]))
            . "  without:\n" . _indent(show_response($res->{off}[$i]));
        my $alts = $reqs->[$i]{alt} // [];
        for my $k (0 .. $#$alts) {
            $s .= "  alternative $k, $alts->[$k]{path}" . ($alts->[$k]{headers} ? ' (headers: '
                . join(' ', @{ $alts->[$k]{headers} }) . ')' : '') . ", without the module:\n"
                . _indent(show_response($res->{alt}[$i][$k] // {}));
        }
    }
    $s .= "---- replay: DIFF_ONLY=$sc->{name} TEST_NGINX_LEAVE=1 prove -v -I t/lib $0\n"
        if $0 =~ /\.t$/;
    return $s;
}

1;
