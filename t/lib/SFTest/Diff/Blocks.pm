# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
package SFTest::Diff::Blocks;

# SFTest::Diff::Blocks - random differential scenarios (SFTest::Diff) made
# of building blocks: the configurations of t/singleflight_differential.t
# (a rewrite by a header, two servers, an empty key, a body in the key,
# credentials, error_page, try_files, proxy_cache, X-Accel-Redirect, SSI,
# auth_request, gzip, slice, nginx proxying to itself) and more
# (proxy_buffering off, a small singleflight_memory, add_header, expires,
# proxy_hide_header and sub_filter, intercepted errors, limit_rate,
# add_before_body and add_after_body, charset, proxy_redirect,
# chunked_transfer_encoding off), each in a location of its own, and
# requests that mix methods, headers, bodies, credentials, conditionals,
# ranges, HTTP/1.0, HTTP/2 (curl, on an http2 port of the main server)
# and start times.  And the resume block: origins that break off, change
# the representation or answer a Range wrongly, with requests of its own
# (see "resume and Range" below).  t/fuzz/differential.t runs them (make
# fuzz; FUZZ_BLOCKS=resume for that block alone).
#
#   my $sc = SFTest::Diff::Blocks::scenario($seed);   # a scenario hash
#   SFTest::Diff::Blocks::scenario($seed, 'ssi', 'gzip')   # of these blocks
#   SFTest::Diff::Blocks::block_names()               # all of them
#
# The same seed gives the same scenario: it draws from Perl's rand() after
# srand($seed), and from nothing else.
#
# A request only ever differs from the others of its target in what the
# module must tell apart or never share: a header the origin's response
# varies on (Vary), credentials, a header a rewrite or an auth check
# reads, Accept-Encoding where gzip applies, conditionals, ranges, the
# method, the body.  Headers the origin echoes without varying on them
# are the same for all (else collapsing would be right and still differ).

use strict;
use warnings;

use SFTest::Diff qw(enc);

my $LM = 'Mon, 01 Jan 2024 00:00:00 GMT';
my @IMS = ($LM, 'Sun, 31 Dec 2023 00:00:00 GMT', 'Tue, 02 Jan 2024 00:00:00 GMT');
my $H2_PORT = 9;    # %%PORT_9%%: the main server's HTTP/2 (cleartext) port

# ------------------------------------------------------------ drawing

sub pick { $_[ int rand @_ ] }
sub chance { rand() < $_[0] }
sub between { $_[0] + int rand($_[1] - $_[0] + 1) }

# ------------------------------------------------------------ origin targets

# The query of an echo target: a delay, and maybe a size, chunked,
# validators, ranges, a Vary, another status.  %opt: plain (none of the
# extras), vary (allowed), status (allowed), big (sizes up to 150,000
# bytes: many buffers, a temporary file), extra (appended).
sub echo_query {
    my (%opt) = @_;
    my @q = ('echo=1', 'delay=' . between(150, 400));
    my %t = (size => 0);
    if (!$opt{plain}) {
        if (chance(0.5)) { $t{size} = between(0, $opt{big} ? 150000 : 6000); push @q, "size=$t{size}" }
        if (chance(0.4)) { $t{validators} = 1; push @q, 'hdr=ETag:%22v1%22', 'hdr=Last-Modified:' . enc($LM) }
        # ranges of a chunked response too: no length, the Range goes
        # upstream on its own
        if (chance(0.3)) { $t{ranges} = 1; push @q, 'ranges=1' }
        push @q, 'chunked=1' if chance(0.2);
        if ($opt{vary} // 1 and chance(0.25)) {
            $t{vary} = pick('User-Agent', 'X-V');
            push @q, "hdr=Vary:$t{vary}";
        }
        push @q, 'status=' . pick(404, 500, 503) if ($opt{status} // 1) && chance(0.1);
    }
    push @q, $opt{extra} if $opt{extra};
    return (join('&', @q), \%t);
}

# ------------------------------------------------------------ blocks

# Each block: sub ($prefix, $n) returning { http, server (locations of the
# server on %%PORT%%), servers (more server blocks), targets => [{ path,
# method, port, mods => [...], and what echo_query() says }], once (a
# block that may be in a scenario only once), requests (requests of its
# own, made whole, for targets request() must not ask for), broken (its
# origin breaks off: the module, which resumes, may cost more origin
# requests than without it, and take longer) }.

my %BLOCKS = (
    plain => sub {
        my ($p) = @_;
        return { server => <<"EOT", targets => [ map { target($p, "/t$_") } 1 .. between(1, 2) ] };
        location $p/ {
            if_modified_since before;
            proxy_pass http://o;
        }
EOT
    },

    # singleflight_lone direct: the first request on its own, the others
    # in a flight
    lone_direct => sub {
        my ($p) = @_;
        return { server => <<"EOT", targets => [ map { target($p, "/t$_") } 1 .. between(1, 2) ] };
        location $p/ {
            singleflight_lone direct;
            proxy_pass http://o;
        }
EOT
    },

    rewrite => sub {
        my ($p) = @_;
        return { server => <<"EOT", targets => [ target($p, '/page', mods => ['mobile']) ] };
        location $p/ {
            if (\$http_x_mobile) {
                rewrite ^$p/(.*)\$ $p/m/\$1 last;
            }
            proxy_pass http://o;
        }
        location $p/m/ {
            proxy_pass http://o;
        }
EOT
    },

    servers => sub {
        my ($p) = @_;
        my @t = (target($p, '/doc', port => 0), target($p, '/doc', port => 1));
        $t[1]{path} = $t[0]{path};    # the same request on both ports
        @{ $t[1] }{qw(validators ranges vary size)} = @{ $t[0] }{qw(validators ranges vary size)};
        return { once => 'port1', targets => \@t, server => <<"EOT", servers => <<"EOT" };
        location $p/ {
            proxy_pass http://o/public/;
        }
EOT
    server {
        listen 127.0.0.1:%%PORT_1%%;
        server_name localhost;
        location $p/ {
            proxy_pass http://o/internal/;
        }
    }
EOT
    },

    empty_key => sub {
        my ($p) = @_;
        my @t = map { target($p, "/k$_") } 1 .. 2;
        $t[1]{path} .= '&k=' . between(1, 2) if chance(0.5);
        return { targets => \@t, server => <<"EOT" };
        location $p/ {
            singleflight_key \$arg_k;
            proxy_pass http://o;
        }
EOT
    },

    post_body => sub {
        my ($p) = @_;
        my $t = target($p, '/form', method => 'POST', plain => 1, mods => ['body']);
        $t->{bodies} = [ map { "a=$_&" . ('x' x between(0, 2000)) } 1 .. 3 ];
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            singleflight_methods GET HEAD POST;
            singleflight_key \$request_uri\$request_body;
            proxy_pass http://o;
        }
EOT
    },

    body_hash => sub {
        my ($p) = @_;
        my $t = target($p, '/up', method => 'POST', plain => 1, mods => ['body']);
        $t->{bodies} = [ map { "$_" x between(1000, 30000) } 1 .. 3 ];
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            client_body_buffer_size 8k;
            singleflight_methods GET HEAD POST;
            singleflight_key \$scheme\$host\$singleflight_body_hash;
            proxy_pass http://o;
        }
EOT
    },

    credentials => sub {
        my ($p) = @_;
        return { targets => [ target($p, '/c', mods => ['cred']) ], server => <<"EOT" };
        location $p/ {
            proxy_pass http://o;
        }
EOT
    },

    credentials_names => sub {
        my ($p) = @_;
        return { targets => [ target($p, '/n', mods => ['apikey']) ], server => <<"EOT" };
        location $p/ {
            singleflight_credentials X-Api-Key;
            proxy_pass http://o;
        }
EOT
    },

    error_page => sub {
        my ($p, $n) = @_;
        my $off = chance(0.5) ? "singleflight off;\n            " : '';
        my ($q) = echo_query(plain => 1);
        return { targets => [ { path => "$p/e?n=$n", method => 'GET', port => 0, mods => [] } ],
            server => <<"EOT" };
        location $p/ {
            ${off}error_page 502 \@fb$n;
            add_header X-Fz-Outer e$n always;
            proxy_pass http://127.0.0.1:1;
        }
        location \@fb$n {
            rewrite ^ /fallback?$q? break;
            add_header X-Fz-Inner "fb$n \$uri?\$args" always;
            proxy_pass http://o;
        }
EOT
    },

    try_files => sub {
        my ($p, $n) = @_;
        my @t = (
            { path => "$p/s$n.txt", method => 'GET', port => 0, mods => ['static'], static => 1 },
            target($p, '/dyn'),
        );
        return { targets => \@t, files => { "$p/s$n.txt" =~ s{^/}{}r => "static $n\n" x between(1, 300) },
            server => <<"EOT" };
        location $p/ {
            root %%DOCROOT%%;
            if_modified_since before;
            try_files \$uri \@o$n;
            add_header X-Fz-Outer t$n always;
        }
        location \@o$n {
            set \$args "\${args}&fz=$n";
            add_header X-Fz-Inner "o$n \$uri?\$args" always;
            proxy_pass http://o;
        }
EOT
    },

    proxy_cache => sub {
        my ($p, $n) = @_;
        my $t = target($p, '/pc', mods => ['cached'], extra => 'hdr=Cache-Control:max-age=60');
        return { targets => [$t], http => <<"EOT", server => <<"EOT" };
    proxy_cache_path %%TESTDIR%%/cache$n keys_zone=pc$n:1m;
EOT
        location $p/ {
            if_modified_since before;
            proxy_cache pc$n;
            proxy_cache_valid 200 1m;
            proxy_pass http://o;
        }
EOT
    },

    x_accel => sub {
        my ($p) = @_;
        my ($q) = echo_query(plain => 1);
        my $to = "$p/prot/" . pick('a', 'b') . "?$q";
        return { targets => [ { path => "$p/dl?delay=" . between(100, 300) . '&hdr=X-Accel-Redirect:'
                    . enc($to), method => 'GET', port => 0, mods => [] } ], server => <<"EOT" };
        location $p/ {
            proxy_pass http://o;
        }
        location $p/prot/ {
            internal;
            proxy_pass http://o/files/;
        }
EOT
    },

    ssi => sub {
        my ($p) = @_;
        my $inc = enc(qq{<!--# include virtual="$p/inc/part?echo=1" -->\n});
        my $t = target($p, '/page', plain => 1, extra => "hdr=Content-Type:text/html&prefix=$inc");
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            ssi on;
            proxy_pass http://o;
        }
        location $p/inc/ {
            proxy_pass http://o;
        }
EOT
    },

    auth_request => sub {
        my ($p, $n) = @_;
        return { targets => [ target($p, '/secret', mods => ['token']) ], server => <<"EOT" };
        location $p/ {
            auth_request /auth$n;
            proxy_pass http://o;
        }
        location = /auth$n {
            internal;
            if (\$http_x_token != "good") {
                return 403;
            }
            return 204;
        }
EOT
    },

    gzip => sub {
        my ($p) = @_;
        my $t = target($p, '/gz', mods => ['gzip'], nomods => ['range']);
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            gzip on;
            gzip_types text/plain;
            gzip_min_length 1;
            proxy_set_header Accept-Encoding "";
            proxy_pass http://o;
        }
EOT
    },

    slice => sub {
        my ($p) = @_;
        my $size = between(70000, 200000);
        my $t = { path => "$p/big?echo=1&ranges=1&size=$size&delay=" . between(150, 300)
            . '&hdr=ETag:%22s1%22', method => 'GET', port => 0, mods => ['range'], ranges => 1,
            size => $size, nomods => ['head'] };
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            slice 64k;
            proxy_set_header Range \$slice_range;
            proxy_pass http://o;
        }
EOT
    },

    self_proxy => sub {
        my ($p, $n) = @_;
        return { targets => [ target($p, '/loop', plain => 1) ], http => <<"EOT", server => <<"EOT" };
    map \$http_x_hop \$next_hop$n {
        ""       127.0.0.1:%%PORT%%;
        default  o;
    }
EOT
        location $p/ {
            singleflight_timeout 2s;
            proxy_set_header Host \$host;
            proxy_set_header X-Hop 1;
            proxy_pass http://\$next_hop$n;
        }
EOT
    },

    unbuffered => sub {
        my ($p) = @_;
        return { targets => [ map { target($p, "/u$_", big => 1) } 1 .. between(1, 2) ],
            server => <<"EOT" };
        location $p/ {
            if_modified_since before;
            proxy_buffering off;
            proxy_pass http://o;
        }
EOT
    },

    spill => sub {
        my ($p) = @_;
        return { targets => [ map { target($p, "/f$_", big => 1) } 1 .. between(1, 2) ],
            server => <<"EOT" };
        location $p/ {
            singleflight_memory 8k;
            proxy_buffers 4 4k;
            proxy_pass http://o;
        }
EOT
    },

    headers => sub {
        my ($p) = @_;
        # no hidden validator, no ranges: nginx answers a collapsed
        # request's conditionals and ranges from the response as it is
        # after proxy_hide_header and sub_filter, which drops its length
        # (README: What is shared); no \$upstream_*: followers have none
        # (README: Embedded variables)
        my $hide = pick('Content-Type', 'X-None');
        my $t = target($p, '/h', big => 1, nomods => ['range']);
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            add_header X-Diff-Status "\$status \$sent_http_etag" always;
            expires max;
            proxy_hide_header $hide;
            sub_filter echo ECHO;
            sub_filter_once off;
            sub_filter_types *;
            proxy_set_header Accept-Encoding "";
            proxy_pass http://o;
        }
EOT
    },

    intercept => sub {
        my ($p, $n) = @_;
        my @t = map { target($p, "/i$_", status => 0, extra => 'status=' . pick(200, 404, 500, 503)) }
            1 .. between(1, 2);
        my ($q) = echo_query(plain => 1);
        return { targets => \@t, server => <<"EOT" };
        location $p/ {
            proxy_intercept_errors on;
            error_page 404 500 503 \@err$n;
            proxy_pass http://o;
        }
        location \@err$n {
            rewrite ^ /errpage?$q? break;
            proxy_set_header User-Agent "";
            proxy_set_header X-V "";
            proxy_pass http://o;
        }
EOT
    },

    limit_rate => sub {
        my ($p) = @_;
        return { targets => [ target($p, '/slow') ], server => <<"EOT" };
        location $p/ {
            limit_rate 40k;
            proxy_pass http://o;
        }
EOT
    },

    addition => sub {
        my ($p, $n) = @_;
        return { targets => [ target($p, '/a', nomods => ['range']) ], server => <<"EOT" };
        location $p/ {
            add_before_body /pre$n/x;
            add_after_body /post$n/x;
            addition_types *;
            proxy_pass http://o;
        }
        location /pre$n/ {
            rewrite ^ /pre?echo=1&delay=20&hdr=X-Sub:1? break;
            proxy_set_header User-Agent "";
            proxy_set_header X-V "";
            proxy_pass http://o;
        }
        location /post$n/ {
            return 200 "after $n\n";
        }
EOT
    },

    charset => sub {
        my ($p, $n) = @_;
        # a -> U+0430: the body changes, and its length, so no ranges
        my $t = target($p, '/cs', extra => 'hdr=Content-Type:text/html', nomods => ['range']);
        return { targets => [$t],
            http => <<"EOT", server => <<"EOT" };
    charset_map src$n utf-8 {
        61  D0B0;
    }
EOT
        location $p/ {
            charset utf-8;
            source_charset src$n;
            charset_types text/html text/plain;
            proxy_pass http://o;
        }
EOT
    },

    redirect => sub {
        my ($p) = @_;
        my $t = target($p, '/r', status => 0,
            extra => 'status=' . pick(301, 302, 200) . '&hdr=Location:' . enc("http://o$p/next"));
        return { targets => [$t], server => <<"EOT" };
        location $p/ {
            absolute_redirect off;
            proxy_redirect http://o/ /;
            proxy_pass http://o;
        }
EOT
    },

    unchunked => sub {
        my ($p) = @_;
        return { targets => [ target($p, '/nc', big => 1, extra => 'chunked=1') ], server => <<"EOT" };
        location $p/ {
            chunked_transfer_encoding off;
            proxy_pass http://o;
        }
EOT
    },

    resume => \&resume_block,
);

my %WEIGHT = (plain => 6, rewrite => 2, servers => 2, empty_key => 2, post_body => 2, body_hash => 1,
    credentials => 2, credentials_names => 1, error_page => 2, try_files => 2, proxy_cache => 2,
    x_accel => 1, ssi => 1, auth_request => 2, gzip => 2, slice => 1, self_proxy => 1,
    unbuffered => 2, spill => 2, headers => 2, intercept => 2, limit_rate => 1, addition => 1,
    charset => 1, redirect => 1, unchunked => 1, lone_direct => 2, resume => 4);

sub block_names { sort keys %BLOCKS }

# A target under $prefix: { path, method, port, mods, echo_query()'s }.
# Options: method, port, mods (more modifiers), nomods, and echo_query's.
sub target {
    my ($prefix, $name, %opt) = @_;
    my ($q, $t) = echo_query(%opt);
    my %nomod = map { $_ => 1 } @{ $opt{nomods} // [] };
    return { %$t, path => "$prefix$name?$q", method => $opt{method} // 'GET', port => $opt{port} // 0,
        mods => [ grep { !$nomod{$_} } 'head', 'cond', 'range', 'vary', @{ $opt{mods} // [] } ] };
}

# ------------------------------------------------------------ requests

# One request for a target: its method and headers drawn.
sub request {
    my ($t) = @_;
    my %m = map { $_ => 1 } @{ $t->{mods} };
    my %r = (method => $t->{method}, path => $t->{path}, port => $t->{port});
    my @h;
    $r{method} = 'HEAD' if $m{head} && $r{method} eq 'GET' && chance(0.2);
    if ($m{vary} && $t->{vary}) {
        push @h, $t->{vary} => 'v' . between(1, 3) if chance(0.8);
    }
    if ($m{cond} && ($t->{validators} || $t->{static}) && chance(0.35)) {
        if ($t->{static} || chance(0.5)) {
            push @h, 'If-None-Match' => $t->{static} ? pick('*', '"nope"') : pick('"v1"', '"v2"', 'W/"v1"');
        }
        else { push @h, 'If-Modified-Since' => pick(@IMS) }
    }
    if ($m{range} && ($t->{ranges} || $t->{static}) && $r{method} eq 'GET' && chance(0.3)) {
        my $len = $t->{size} || 100;
        my $from = int rand($len > 60 ? $len - 50 : 10);
        push @h, Range => pick("bytes=$from-" . ($from + between(0, 40)), "bytes=-" . between(1, 40),
            "bytes=$from-");
    }
    if ($m{cred} && chance(0.6)) {
        push @h, pick('Authorization', 'Proxy-Authorization', 'Cookie') => 'token' . between(1, 2);
    }
    push @h, 'X-Api-Key' => 'k' . between(1, 2) if $m{apikey} && chance(0.6);
    push @h, 'X-Mobile' => 1 if $m{mobile} && chance(0.5);
    push @h, 'X-Token' => chance(0.7) ? 'good' : 'bad' if $m{token};
    push @h, 'Accept-Encoding' => 'gzip' if $m{gzip} && chance(0.5);
    # HTTP/1.0, or HTTP/2 (curl) on the main server's http2 port
    if (chance(0.1)) { $r{http10} = 1 }
    elsif ($r{port} == 0 && chance(0.12)) { @r{qw(h2 port)} = (1, $H2_PORT) }
    $r{body} = pick(@{ $t->{bodies} }) if $m{body};
    $r{headers} = \@h if @h;
    return \%r;
}

# ------------------------------------------------------------ resume and Range

# The resume block: a location (singleflight_lazy on, off or 1m; a small
# singleflight_memory, past which a body goes to a temporary file;
# proxy_buffering off; singleflight_max_range_offset 0, 10k or off;
# singleflight_resume tries=1 or off; always proxy_http_version 1.1, for
# the origin's chunked responses, and proxy_read_timeout 1s, for a
# response that stalls) and one or two targets, each an origin
# URL (fixed=1: the same body on every hit; numbered=1: every line names
# its own offset, so bytes out of place show) that
#   breaks off: its first one or two requests cut at a byte (0, the
#     last, anywhere) or at half the body (midbody), or its first one
#     stalls there (proxy_read_timeout), or none;
#   names its representation by a strong ETag, a Last-Modified 120 s
#     before its Date (strong) or 2 s before (weak), a weak ETag, an ETag
#     and a Last-Modified, or nothing;
#   sends a Content-Length, or is chunked;
#   answers a Range (ranges=1), several too (multi=1), or never;
#   answers a Range (the resume's and the clients' alike) rightly, or with
#     a 206 chunked, too long, too short, of the bytes from 0, with
#     another length in its Content-Range, or with a 416 or a 200;
#   changes its representation after its first one or two requests (in
#     upper case), with other validators where they are strong, the same
#     where they are weak or none (a file changed within the second of its
#     Last-Modified);
#   takes 150 to 400 ms to answer, and may send its body in pieces.
# Its requests, its own (request() draws none of them): a herd of 2 to 6
# at once (a stored flight) or a lone one (with singleflight_lazy, a
# response its leader alone gets, unstored), and 0 to 2 more, during the
# flight or after it; each over HTTP/1.1 with the next request pipelined
# behind it on the same connection (SFTest::Diff's pipeline: a body too
# long or too short on a connection kept alive shows), HTTP/1.1 with
# Connection: close, HTTP/1.0 or HTTP/2; with no Range, bytes=0-, a
# bounded range near the start, a range far into the body (open or
# bounded), the last bytes, one past the end (416) or several ranges, and
# sometimes If-Range (the right validator or a stale one); a few HEADs.
#
# What is right for each request (SFTest::Diff, "Broken responses"): what
# the reference answers it, or what it answers the same request to the
# same origin without its faults (alt): for each representation (the
# first, and the changed one if it changes), sending it whole and
# answering ranges rightly, and, where it misanswers ranges, misanswering
# them as it does; or a truncation of one of those.  For a range past the
# end that joins the whole response's flight, a 416 that nginx's range
# filter makes, with nginx's error page.  Where several ranges
# join the whole response's flight (singleflight_max_range_offset off) the
# whole 200 as well: a reader of a shared response gets one range at most,
# as from nginx's cache while it fills (README).  A GET without Range must
# be answered whole (whole => 1) where the module can resume every break:
# a strong validator, no more breaks than singleflight_resume's tries, a
# right answer to the resume's Range (or, chunked, a response asked for
# again whole, which is not where it broke before its first byte), a
# representation that does not change.  Where it breaks twice, the 502
# of a follower that had no byte of either flight (README, Failures).

my $DATE = 'Mon, 01 Jan 2024 01:00:00 GMT';       # the origin's Date
my $LM_OLD = 'Mon, 01 Jan 2024 00:58:00 GMT';     # 120 s before: strong
my $LM_OTHER = 'Mon, 01 Jan 2024 00:58:30 GMT';   # the changed one's
my $LM_NEW = 'Mon, 01 Jan 2024 00:59:58 GMT';     # 2 s before: weak

sub resume_block {
    my ($p) = @_;
    my %c = (
        lazy => pick('', '', 'singleflight_lazy off;', 'singleflight_lazy 1m;'),
        memory => chance(0.25) ? 'singleflight_memory 16k;' : '',
        buffering => chance(0.2) ? 'proxy_buffering off;' : '',
        offset => pick('', '', 'singleflight_max_range_offset 10k;',
            'singleflight_max_range_offset off;'),
        tries => pick(2, 2, 2, 2, 1, 0),
    );
    my $resume = $c{tries} == 2 ? '' : $c{tries} == 1 ? 'singleflight_resume on tries=1;'
        : 'singleflight_resume off;';
    # resuming a break is a fetch's and its followers': a request going
    # its own way (singleflight_lone direct, the default) gets nginx's
    # own answer, which whole => 1 does not describe
    my $lines = join '', map { "            $_\n" } grep { length }
        'singleflight_lone fetch;', @c{qw(lazy memory buffering offset)}, $resume;
    my @targets = map { resume_target($p, "r$_", \%c) } 1 .. between(1, 2);
    return { targets => [], requests => [ map { resume_requests($_, \%c) } @targets ], broken => 1,
        server => <<"EOT" };
        location $p/ {
            proxy_http_version 1.1;
            proxy_read_timeout 1s;
$lines            proxy_pass http://o;
        }
EOT
}

# A target: { path, size, alt (its paths without the faults), validators,
# chunked, whole (a GET without Range is answered whole) }.
sub resume_target {
    my ($p, $name, $c) = @_;
    my $size = pick(between(1, 8000), between(20000, 120000), between(20000, 120000),
        between(150000, 500000));
    my %t = (path => "$p/$name", size => $size);
    my @base = ('fixed=1', 'numbered=1', "stamp=$p/$name", "size=$size");

    my $v = pick(qw(etag etag etag lm lm weak_lm weak_lm weak_etag both none));
    my %hdr = (Date => $DATE);
    $hdr{ETag} = '"e1"' if $v eq 'etag' || $v eq 'both';
    $hdr{ETag} = 'W/"w1"' if $v eq 'weak_etag';
    $hdr{'Last-Modified'} = $LM_OLD if $v eq 'lm' || $v eq 'both';
    $hdr{'Last-Modified'} = $LM_NEW if $v eq 'weak_lm';
    push @base, map { 'hdr=' . enc("$_:$hdr{$_}") } sort keys %hdr;
    @t{qw(etag lm)} = @hdr{ 'ETag', 'Last-Modified' };
    my $strong = $v =~ /^(?:etag|lm|both)$/;

    $t{chunked} = chance(0.15);
    push @base, 'chunked=1' if $t{chunked};
    my $ranges = chance(0.75);
    push @base, 'ranges=1' if $ranges;
    push @base, 'multi=1' if $ranges && chance(0.4);

    # the breaks
    my ($cut, $breaks, @faults) = ($size, 0);
    my $f = rand;
    if ($f < 0.7) {
        $cut = pick(0, $size - 1, between(0, $size - 1), between(0, $size - 1), between(0, 99));
        $breaks = pick(1, 1, 2);
        @faults = ('fail=cut', "cut=$cut", "fail_first=$breaks");
    }
    elsif ($f < 0.8) {
        ($cut, $breaks) = (int($size / 2), 1);
        @faults = ('fail=midbody', 'fail_first=1');
    }
    elsif ($f < 0.85) {
        # nothing more, the connection open: proxy_read_timeout
        ($cut, $breaks) = (between(0, $size - 1), 1);
        @faults = ('fail=stall', "cut=$cut", 'fail_first=1');
    }

    # ranges answered wrongly, the resume's among them
    my @mis;
    if ($ranges && chance(0.45)) {
        my ($rest, $d) = ($size - $cut, between(1, 5000));
        my $short = $rest > $d ? $rest - $d : 0;
        @mis = @{ pick(['range_chunked=1'], [ 'range_chunked=1', 'range_len=' . ($rest + $d) ],
            [ 'range_chunked=1', "range_len=$short" ], [ 'range_len=' . ($rest + $d) ],
            ["range_len=$short"], ['range_start=0'], [ 'range_total=' . ($size + $d) ],
            ['range_status=416'], ['range_status=200']) };
    }

    # another representation after the first one or two requests: more
    # often where nothing but its bytes tells (a weak validator, or none)
    my @change;
    if (chance($strong ? 0.2 : 0.45)) {
        my %new;
        $new{ETag} = '"e2"' if $v eq 'etag' || $v eq 'both';
        $new{ETag} = 'W/"w2"' if $v eq 'weak_etag' && chance(0.5);
        $new{'Last-Modified'} = $LM_OTHER if $v eq 'lm' || $v eq 'both';
        @change = ('change=' . pick(1, 1, 2), map { 'change_hdr=' . enc("$_:$new{$_}") } sort keys %new);
    }

    my @timing = ('delay=' . between(150, 400));
    push @timing, 'pace=' . (int($size / between(3, 8)) + 1000) . ':' . between(10, 40) if chance(0.2);

    $t{path} .= '?' . join('&', @base, @mis, @change, @faults, @timing);
    # the same origin without its faults: each representation whole, its
    # ranges answered rightly, and as misanswered
    for my $rep ([], @change ? [ 'change=0', grep { /^change_hdr=/ } @change ] : ()) {
        push @{ $t{alt} }, "$p/$name?" . join('&', @base, @$rep);
        push @{ $t{alt} }, "$p/$name?" . join('&', @base, @mis, @$rep) if @mis;
    }
    # a follower whose flight broke before it had a byte, and the one it
    # looked for then (singleflight_promote error, once), gets a 502
    $t{error} = $breaks >= 2;
    # chunked: asked for again whole, not where it broke before any byte
    $t{whole} = $strong && !@change && $breaks <= $c->{tries}
        && ($t{chunked} ? $cut > 0 : $ranges && !@mis);
    return \%t;
}

# The requests of a target: a herd or a lone one, then 0 to 2 more.
sub resume_requests {
    my ($t, $c) = @_;
    my @r = map { resume_request($t, $c) } 1 .. (chance(0.5) ? between(2, 6) : 1);
    for (1 .. pick(0, 0, 1, 2)) {
        my $r = resume_request($t, $c);
        if (chance(0.5)) { $r->{after_hits} = 1 }
        else { $r->{at} = sprintf('%.2f', 0.3 + rand 1.2) + 0 }
        push @r, $r;
    }
    return @r;
}

sub resume_request {
    my ($t, $c) = @_;
    my $size = $t->{size};
    my %r = (method => 'GET', path => $t->{path}, port => 0);
    my (@h, $several, $past);
    if (chance(0.55)) {
        my $far = between(int($size / 2), $size - 1);
        my $range = pick('bytes=0-', 'bytes=0-', 'bytes=0-' . between(0, 200), "bytes=$far-",
            "bytes=$far-" . ($far + between(0, 3000)), 'bytes=-' . between(1, 500),
            'bytes=0-9,' . between(20, 100) . '-' . between(101, 300), "bytes=0-9,$far-",
            'bytes=' . ($size + between(0, 50)) . '-');
        $several = $range =~ /,/;
        $past = $range =~ /^bytes=(\d+)-$/ && $1 >= $size ? $1 : undef;
        push @h, Range => $range;
        push @h, 'If-Range' => pick(grep { defined && !m{^W/} } $t->{etag}, $t->{lm}, '"e0"')
            if chance(0.25);
    }
    $r{method} = 'HEAD' if !@h && chance(0.05);
    my $how = rand;
    if ($how < 0.2) { @r{qw(h2 port)} = (1, $H2_PORT) }
    elsif ($how < 0.25 && !$t->{chunked}) { $r{http10} = 1 }
    elsif ($how >= 0.4 && $r{method} eq 'GET') { $r{pipeline} = 1 }
    $r{headers} = \@h if @h;
    $r{alt} = [ map { { path => $_ } } @{ $t->{alt} } ];
    push @{ $r{alt} }, map { { path => $_, headers => [] } } @{ $t->{alt} }
        if $several && $c->{offset} =~ /off/;
    # a range past the end cut from the whole response (within the
    # offset): nginx's range filter's 416
    push @{ $r{alt} }, map { { path => $_, loose => 1 } } @{ $t->{alt} }
        if defined $past && ($c->{offset} =~ /off/ || $c->{offset} =~ /10k/ && $past <= 10240);
    $r{whole} = 1 if $t->{whole} && !@h && $r{method} eq 'GET';
    $r{error} = 502 if $t->{error};
    return \%r;
}

# ------------------------------------------------------------ scenarios

# The scenario of a seed: 1 to 3 blocks, 6 to 16 requests.  @only: the
# names of the blocks to draw from (default: all).
sub scenario {
    my ($seed, @only) = @_;
    srand($seed);
    my %only = map { $_ => 1 } @only;
    my @bag = map { ($_) x $WEIGHT{$_} } grep { !@only || $only{$_} } sort keys %BLOCKS;
    die 'no such blocks: ' . join(' ', @only) . "\n" unless @bag;
    my (@blocks, %once, %files, $http, $server, $servers, @targets, @own, $broken);
    my $want = between(1, 3);
    my $draws = 0;
    while (@blocks < $want) {
        # FUZZ_BLOCKS=servers alone: one block, not a draw for ever
        last if @blocks && ++$draws > 100;
        my $name = pick(@bag);
        my $b = $BLOCKS{$name}->('/b' . (@blocks + 1), @blocks + 1);
        next if $b->{once} && $once{ $b->{once} }++;
        push @blocks, $name;
        $http .= $b->{http} // '';
        $server .= $b->{server};
        $servers .= $b->{servers} // '';
        %files = (%files, %{ $b->{files} // {} });
        push @targets, @{ $b->{targets} };
        push @own, @{ $b->{requests} // [] };
        $broken ||= $b->{broken};
    }
    my @reqs;
    for (!@targets ? () : @own ? 1 .. between(3, 10) : 1 .. between(6, 16)) {
        my $r = request(pick(@targets));
        my $when = rand();
        if ($when < 0.15) { $r->{at} = sprintf('%.2f', 0.05 + rand 0.45) + 0 }
        elsif ($when < 0.3) { $r->{after_hits} = 1 }
        push @reqs, $r;
    }
    push @reqs, @own;
    @reqs = sort { ($a->{at} // 0) <=> ($b->{at} // 0) } @reqs;
    delete @{ $reqs[0] }{qw(at after_hits)};    # the first starts at once
    # what a pipelined request's next one gets (SFTest::Diff)
    my $next = !grep({ $_->{pipeline} } @reqs) ? '' : <<"EOT";
        location = $SFTest::Diff::NEXT_PATH {
            return 200 "next\\n";
        }
EOT
    # A client's If-Modified-Since is answered from a shared response by
    # nginx's not_modified filter, which compares dates as the origin does
    # only with "before" (README: Conditional and range requests).
    my $config = "    if_modified_since before;\n" . ($http // '') . <<"EOT" . ($servers // '');
    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT_$H2_PORT%% http2;
        server_name localhost;
$server$next    }
EOT
    # a Range on a response without a length goes upstream on its own, a
    # leader's costing its fetch too (README: Conditional and range
    # requests): no count of origin requests then
    my $unrangeable = grep {
        my $r = $_;
        $r->{path} =~ /[?&]chunked=1\b/ && $r->{path} =~ /[?&]ranges=1\b/
            && grep({ $_ eq 'Range' } @{ $r->{headers} // [] })
    } @reqs;
    # a break the module resumes costs an origin request more than
    # without it, and the wait for its answer
    return { name => 'fuzz-' . join('-', @blocks), config => $config,
        (%files ? (files => \%files) : ()), requests => \@reqs,
        fetches => $unrangeable || $broken ? undef : 'not_more', latency => $broken ? 3 : 1.5 };
}

1;
