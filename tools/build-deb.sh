#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Builds the Debian package of the module (debian/, dh with dh_nginx) from
# a copy of the source under build/deb/, so the build leaves the work tree
# alone and dpkg-buildpackage's results land in build/deb/, not in the
# directory above the repository.
#
#   tools/build-deb.sh
#
# The last line printed is the path of
# build/deb/libnginx-mod-http-singleflight_<version>_<arch>.deb.

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=$repo/build/deb

cd "$repo"
version=$(dpkg-parsechangelog -S Version)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
pkg=libnginx-mod-http-singleflight
srcdir=$out/$pkg-$version

rm -rf "$out"
mkdir -p "$srcdir"

# the files of the source: git's list when there is one, else all but build/
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | (cd "$repo" && xargs -0 cp --parents -t "$srcdir" 2>/dev/null || true)
else
    tar -C "$repo" --exclude=./build --exclude=./.git -cf - . \
        | tar -C "$srcdir" -xf -
fi
[ -f "$srcdir/debian/rules" ] || { echo "no debian/rules copied" >&2; exit 1; }

(
    cd "$srcdir"
    dpkg-buildpackage -b -us -uc > "$out/build.log" 2>&1 \
        || { tail -40 "$out/build.log"; exit 1; }
)

deb=$out/${pkg}_${version}_${arch}.deb
[ -f "$deb" ] || { echo "no $deb" >&2; exit 1; }
echo "$deb"
