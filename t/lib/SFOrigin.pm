# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
package SFOrigin;

# SFOrigin - what the test origins t/origin.pl (HTTP) and t/fcgi_origin.pl
# (FastCGI, uwsgi, SCGI) share: the body a hit is answered with, query
# decoding, the port file, and a single-process select loop over
# non-blocking connections.  Perl core modules only.
#
# Functions:
#   SFOrigin::body($hit, $uri, $size)     "hit=H uri=U\n", cut or padded
#                                         with $PATTERN to $size bytes
#                                         (undef: the stamp line alone);
#                                         SFTest::origin_body() is this
#   SFOrigin::numbered_body($hit, $uri, $size)  the stamp line, then lines
#                                         that each name their own offset
#                                         (fixed=1&numbered=1)
#   SFOrigin::url_decode($s)
#   SFOrigin::parse_query($q)             ([name, value], ...), decoded
#   SFOrigin::write_file_atomic($file, $text)
#
# The loop (an object):
#   my $loop = SFOrigin->new(ppid => $pid);   # run() returns once $pid is
#                                             # no longer our parent
#   $loop->listen($host, $port, backlog => N, tag => T, name => 'origin')
#   $loop->run(%callbacks);   # until SIGTERM/SIGINT; then closes all
#   $loop->read($c)           # sysread into $c->{rbuf}
#   $loop->flush($c)          # syswrite $c->{wbuf}
#   $loop->drain($c)          # half-close, close on the peer's EOF
#   $loop->close_conn($c), $loop->conns
#
# A connection is a hash: fh, tag (of its listener), rbuf, wbuf, draining
# (the time it is closed at, once drained), dead (closed), and whatever
# the new_conn callback adds.

use strict;
use warnings;

use Errno qw(EAGAIN EWOULDBLOCK EINTR);
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time);

# Padding pattern after the stamp line (SFTest::origin_body rebuilds bodies).
our $PATTERN = join('', 'a' .. 'z', 0 .. 9) . "\n";

my $DRAIN_TIME = 2;    # seconds to wait for the peer's EOF after shutdown()

# ------------------------------------------------------------ functions

# The body of hit $hit of $uri: the stamp line, then the repeating pattern,
# exactly $size bytes (the stamp alone if $size is undef).
sub body {
    my ($hit, $uri, $size) = @_;
    my $stamp = "hit=$hit uri=$uri\n";
    return $stamp unless defined $size;
    return substr($stamp, 0, $size) if $size <= length $stamp;
    my $pad = $size - length $stamp;
    return $stamp . substr($PATTERN x (int($pad / length $PATTERN) + 1), 0, $pad);
}

# The same stamp line, then 32-byte lines "<offset> abcdefghijklmnopqrst\n"
# whose offset (10 digits) is where the line starts in the body, to
# exactly $size bytes: no two pieces of it alike, so bytes put in the
# wrong place show (body()'s pattern repeats every 37 bytes), and its
# upper case (t/origin.pl's change=K) differs from it on every line.
sub numbered_body {
    my ($hit, $uri, $size) = @_;
    my $stamp = "hit=$hit uri=$uri\n";
    return substr($stamp, 0, $size) if $size <= length $stamp;
    my $from = length($stamp) - length($stamp) % 32;
    my $lines = join '', map { sprintf "%010d abcdefghijklmnopqrst\n", $_ * 32 }
        $from / 32 .. int(($size - 1) / 32);
    return $stamp . substr($lines, length($stamp) - $from, $size - length $stamp);
}

sub url_decode {
    my ($s) = @_;
    $s =~ tr/+/ /;
    $s =~ s/%([0-9a-fA-F]{2})/chr hex $1/ge;
    return $s;
}

# Split "a=1&b=2&a=3" into a list of decoded [name, value] pairs.
sub parse_query {
    my ($q) = @_;
    return map { my ($k, $v) = split /=/, $_, 2; [ url_decode($k), url_decode($v // '') ] }
        grep { length } split /&/, $q // '';
}

# Writes $file through a temporary file and a rename, so that a reader
# never sees it half written.
sub write_file_atomic {
    my ($file, $text) = @_;
    my $tmp = "$file.tmp.$$";
    open(my $fh, '>', $tmp) or die "cannot write $tmp: $!\n";
    print $fh $text;
    close($fh) or die "cannot write $tmp: $!\n";
    rename($tmp, $file) or die "cannot rename $tmp: $!\n";
}

# ------------------------------------------------------------ the loop

sub new {
    my ($class, %opt) = @_;
    return bless {
        ppid      => $opt{ppid},
        rsel      => IO::Select->new,
        wsel      => IO::Select->new,
        listeners => {},    # "$fh" => [socket, tag]
        conns     => {},    # "$fh" => connection
    }, $class;
}

# A non-blocking listening socket; connections accepted on it get
# {tag} => $opt{tag}.  Dies with "$opt{name}: cannot listen on HOST:PORT".
sub listen {
    my ($self, $host, $port, %opt) = @_;
    my $l = IO::Socket::INET->new(LocalAddr => $host, LocalPort => $port,
        Proto => 'tcp', Listen => $opt{backlog} // 1024, ReuseAddr => 1)
        or die(($opt{name} // 'origin') . ": cannot listen on $host:$port: $@\n");
    $l->blocking(0);
    $self->{listeners}{"$l"} = [ $l, $opt{tag} ];
    $self->{rsel}->add($l);
    return $l;
}

sub conns { values %{ $_[0]{conns} } }

# Runs until SIGTERM or SIGINT (or the ppid given to new() is no longer our
# parent), then closes every connection.  Callbacks, each given a
# connection:
#   new_conn  => sub { (key => value, ...) }   added to a new connection
#   readable  => sub { }     data or EOF to read (not for draining ones)
#   writable  => sub { }     room to write (not for closed ones)
#   wake_at   => sub { }     when it next has something to do, or undef
#   on_time   => sub { }     once a turn (not for closed or draining ones)
# A draining connection is closed when the peer's EOF arrives or its time
# is up.
sub run {
    my ($self, %cb) = @_;
    my $stop = 0;
    local $SIG{TERM} = sub { $stop = 1 };
    local $SIG{INT} = sub { $stop = 1 };
    local $SIG{PIPE} = 'IGNORE';
    my $conns = $self->{conns};
    my $last_ppid_check = 0;
    while (!$stop) {
        my $now = time;

        # Leave if the process that started us is gone (no orphans after a crash).
        if ($self->{ppid} && $now - $last_ppid_check > 0.5) {
            $last_ppid_check = $now;
            last if getppid() != $self->{ppid};
        }

        my ($r, $w) = IO::Select->select($self->{rsel}, $self->{wsel}, undef,
            $self->_next_timeout($now, $cb{wake_at}));
        for my $fh (@{ $r || [] }) {
            if (my $l = $self->{listeners}{"$fh"}) { $self->_accept(@$l, $cb{new_conn}) }
            elsif (my $c = $conns->{"$fh"}) { $self->_on_readable($c, $cb{readable}) }
        }
        for my $fh (@{ $w || [] }) {
            my $c = $conns->{"$fh"} // next;
            $cb{writable}->($c) unless $c->{dead};
        }
        $now = time;
        for my $c (values %$conns) {
            next if $c->{dead};
            if ($c->{draining}) {
                $self->close_conn($c) if $now >= $c->{draining};
                next;
            }
            $cb{on_time}->($c, $now);
        }
    }
    $self->close_conn($_) for values %$conns;
}

# Seconds until the earliest wake-up (capped so ppid checks still run).
sub _next_timeout {
    my ($self, $now, $wake_at) = @_;
    my $t = 0.5;
    for my $c (values %{ $self->{conns} }) {
        my $at = $c->{draining} // $wake_at->($c);
        next unless defined $at;
        my $d = $at - $now;
        $t = $d if $d < $t;
    }
    return $t < 0 ? 0 : $t;
}

sub _accept {
    my ($self, $l, $tag, $new_conn) = @_;
    for (1 .. 256) {
        my $fh = $l->accept or last;
        $fh->blocking(0);
        $self->{conns}{"$fh"} = { fh => $fh, tag => $tag, rbuf => '', wbuf => '',
            $new_conn ? $new_conn->() : () };
        $self->{rsel}->add($fh);
    }
}

# Input on a draining connection is read and dropped, until its EOF.
sub _on_readable {
    my ($self, $c, $readable) = @_;
    return $readable->($c) unless $c->{draining};
    my $got = $self->read($c) // return;
    $got ? ($c->{rbuf} = '') : $self->close_conn($c);
}

# Appends what there is to read to $c->{rbuf}: 1 if something came, 0 on
# EOF or a read error (the peer is gone), undef if nothing is there yet.
sub read {
    my ($self, $c) = @_;
    my $n = sysread($c->{fh}, $c->{rbuf}, 65536, length $c->{rbuf});
    if (!defined $n) {
        return undef if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
        return 0;
    }
    return $n ? 1 : 0;
}

# Writes as much of $c->{wbuf} as the socket takes, and watches for room
# to write the rest.  False if the peer is gone (the caller closes).
sub flush {
    my ($self, $c) = @_;
    while (length $c->{wbuf}) {
        my $n = syswrite($c->{fh}, $c->{wbuf});
        if (!defined $n) {
            last if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
            return 0;
        }
        substr($c->{wbuf}, 0, $n, '');
    }
    if (length $c->{wbuf}) { $self->{wsel}->add($c->{fh}) }
    else { $self->{wsel}->remove($c->{fh}) }
    return 1;
}

# Half-close, then wait briefly for the peer's EOF: closing with unread
# input would make the kernel send RST and lose data.
sub drain {
    my ($self, $c) = @_;
    shutdown($c->{fh}, 1);
    $c->{draining} = time + $DRAIN_TIME;
}

sub close_conn {
    my ($self, $c) = @_;
    return if $c->{dead};
    $c->{dead} = 1;
    $self->{rsel}->remove($c->{fh});
    $self->{wsel}->remove($c->{fh});
    delete $self->{conns}{"$c->{fh}"};
    close($c->{fh});
}

1;
