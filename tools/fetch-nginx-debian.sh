#!/usr/bin/env bash
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
# the last line.  A tree already there is reused.

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
# gone, take the newest of the same upstream version, and say so
got=$version
versions=$(apt-cache "${apt_opts[@]}" showsrc nginx 2>/dev/null)
if ! grep -Fqx "Version: $version" <<< "$versions"; then
    got=$(awk -v u="$upstream-" 'index($2, u) == 1 && $1 == "Version:" \
                                   { print $2 }' <<< "$versions" \
          | sort -V | tail -1)
    [ -n "$got" ] || { echo "nginx $version: not in $suite" >&2; exit 1; }
    echo "nginx $version is gone from $suite, taking $got" >&2
fi

(
    cd "$dir"
    apt-get "${apt_opts[@]}" source --download-only -q "nginx=$got" \
        >/dev/null
    rm -rf "$tree"
    dpkg-source --no-check -x "nginx_${got#*:}.dsc" "$tree" >/dev/null
)
echo "$version" > "$tree/.fetched"
echo "$tree"
