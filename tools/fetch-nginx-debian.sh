#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Fetches Debian's nginx source package into build/ and unpacks it (Debian's
# patches applied), without touching the system's apt configuration: a
# private sources list and state directory under build/debian-src/apt are
# passed to apt-get with -o Dir::...; the mirrors are the ones this system's
# apt already uses.
#
#   tools/fetch-nginx-debian.sh [VERSION [SUITE]]
#
# Defaults: nginx 1.26.3-3+deb13u7 from trixie (Debian 13).  Prints the
# path of the unpacked tree (build/debian-src/nginx-<upstream version>) on
# the last line.  A tree already there is reused.  When the revision asked
# for is gone, the newest one of the same upstream version that downloads
# is taken; when Debian's own files of none can be downloaded (a mirror
# that has the upstream tarball only), the upstream tarball that apt
# fetched and checked, without Debian's patches.  Each says so on stderr.

set -euo pipefail

version=${1:-1.26.3-3+deb13u7}
suite=${2:-trixie}
upstream=${version%%-*}
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$repo/build/debian-src
tree=$dir/nginx-$upstream
state=$dir/apt

if [ -f "$tree/.fetched" ] && [ "$(cat "$tree/.fetched")" = "$version" ]; then
    echo "$tree"
    exit 0
fi

command -v dpkg-source >/dev/null || "$repo/tools/deps.sh" fetch

# the mirrors of this system's Debian archive and security archive
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
policy=$(apt-cache policy)
archive=$(awk -v s="$codename/main" '$3 == s { print $2; exit }' <<< "$policy")
security=$(awk -v s="$codename-security/main" '$3 == s { print $2; exit }' \
           <<< "$policy")
if [ -z "$archive" ]; then
    # no package lists yet: read them once, then ask again
    apt-get update -q >/dev/null
    policy=$(apt-cache policy)
    archive=$(awk -v s="$codename/main" '$3 == s { print $2; exit }' \
              <<< "$policy")
    security=$(awk -v s="$codename-security/main" '$3 == s { print $2; exit }' \
               <<< "$policy")
fi
[ -n "$archive" ] || { echo "no Debian archive in apt's sources" >&2; exit 1; }

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
{
    echo "deb-src [signed-by=$keyring] $archive $suite main"
    echo "deb-src [signed-by=$keyring] $archive $suite-updates main"
    if [ -n "$security" ]; then
        echo "deb-src [signed-by=$keyring] $security $suite-security main"
    fi
} > "$state/sources.list"

apt_opts=(
    -o "Dir::Etc::SourceList=$state/sources.list"
    -o "Dir::Etc::SourceParts=-"
    -o "Dir::State::Lists=$state/lists"
    -o "Dir::Cache=$state/cache"
    -o "Dir::Cache::pkgcache="
    -o "Dir::Cache::srcpkgcache="
    -o "APT::Sandbox::User=root"
)

apt-get "${apt_opts[@]}" update -q >/dev/null

# the archive keeps only the newest revision: when the one asked for has
# gone, take the newest of the same upstream version that can be
# downloaded (a mirror may list a security update whose files it does not
# have yet), and say so
versions=$(apt-cache "${apt_opts[@]}" showsrc nginx 2>/dev/null)
if grep -Fqx "Version: $version" <<< "$versions"; then
    candidates=$version
else
    candidates=$(awk -v u="$upstream-" 'index($2, u) == 1 && $1 == "Version:" \
                                          { print $2 }' <<< "$versions" \
                 | sort -V -r -u)
    [ -n "$candidates" ] || { echo "nginx $version: not in $suite" >&2; exit 1; }
fi

got=
for candidate in $candidates; do
    if (cd "$dir" && apt-get "${apt_opts[@]}" source --download-only -q \
                         "nginx=$candidate" >/dev/null 2>&1)
    then
        got=$candidate
        break
    fi
    echo "nginx $candidate: its files cannot be downloaded" >&2
done

orig=$dir/nginx_$upstream.orig.tar.gz
if [ -n "$got" ]; then
    [ "$got" = "$version" ] || echo "nginx $version is gone from $suite, taking $got" >&2
    (
        cd "$dir"
        rm -rf "$tree"
        dpkg-source --no-check -x "nginx_${got#*:}.dsc" "$tree" >/dev/null
    )
elif [ -s "$orig" ] && tar tzf "$orig" >/dev/null 2>&1; then
    # apt fetched (and checked) the upstream tarball, but not Debian's
    # files of any revision: the upstream tree, without Debian's patches
    echo "nginx $version: Debian's files cannot be downloaded;" \
         "using the upstream tarball $orig without Debian's patches" >&2
    rm -rf "$tree" "$dir/unpack"
    mkdir -p "$dir/unpack"
    tar xzf "$orig" -C "$dir/unpack"
    mv "$dir/unpack/nginx-$upstream" "$tree"
    rmdir "$dir/unpack"
else
    echo "nginx $version: no revision could be downloaded" >&2
    exit 1
fi
echo "$version" > "$tree/.fetched"
echo "$tree"
