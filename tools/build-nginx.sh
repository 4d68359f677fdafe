#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Builds an nginx from a source tree, and the module against it, into
# build/nginx-<version>/, so the suite can run against that binary
# (`make test NGINX_SRC=...`).
#
#   tools/build-nginx.sh NGINX_SRC [plain|asan|asan-full|nodebug]
#
# NGINX_SRC: a release tree (./configure), a git-archive tree
# (./auto/configure) or a Debian source package tree.  nginx is configured
# like Debian's nginx-core (--with-compat, --with-debug, the usual http
# modules; --with-http_v3_module where the tree has it), with its prefix in
# build/.
#
# NGINX_EXTRA_CONFIGURE: more configure arguments, split on blanks, after
# ours: e.g. the modules a distribution such as OpenResty compiles in
#   NGINX_EXTRA_CONFIGURE="--add-module=/path/ndk --add-module=/path/lua"
# (their own environment, LUAJIT_LIB and LUAJIT_INC, passes through).
#
# plain: build/nginx-<version>/sbin/nginx and
#        build/nginx-<version>/ngx_http_singleflight_module.so
# asan:  build/nginx-<version>/asan/ngx_http_singleflight_module.so, the
#        module only, with AddressSanitizer and UBSan (the plain nginx loads
#        it with the runtimes preloaded, as `make test-asan` does).
# asan-full: build/nginx-<version>/asan-full/sbin/nginx and
#        build/nginx-<version>/asan-full/ngx_http_singleflight_module.so:
#        nginx itself and the module, both with AddressSanitizer and UBSan
#        (`make test-asan-full`).  Only there does a use after free in
#        nginx's own code show, on memory the module let go too early.
# nodebug: build/nginx-<version>/nodebug/ngx_http_singleflight_module.so,
#        the module only, configured without --with-debug (as nginx.org's
#        binaries are), warnings as errors: a build check.
#
# The last line printed is build/nginx-<version>.  A tree already
# configured with the same flags is only rebuilt (make is incremental).

set -euo pipefail

usage="usage: $0 NGINX_SRC [plain|asan|asan-full|nodebug]"
src=$(cd "${1:?$usage}" && pwd)
variant=${2:-plain}
repo=$(cd "$(dirname "$0")/.." && pwd)

version=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' \
          "$src/src/core/nginx.h")
[ -n "$version" ] || { echo "$src: no src/core/nginx.h" >&2; exit 1; }

# Angie keeps nginx's version beside its own: build/angie-<version>/
angie=$(sed -n 's/^#define ANGIE_VERSION *"\(.*\)"/\1/p' \
        "$src/src/core/angie.h" 2>/dev/null || true)

if [ -n "$angie" ]; then
    out=$repo/build/angie-$angie
else
    out=$repo/build/nginx-$version
fi
tree=$out/tree-$variant

case "$variant" in
    plain)
        ccopt="-g -O2 -Werror"
        ldopt=""
        ;;
    asan)
        ccopt="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize=alignment"
        ldopt="-fsanitize=address,undefined"
        ;;
    asan-full)
        # nginx's own code passes NULL with a length of 0 to memcpy() and
        # shifts a signed value into its sign bit (murmurhash): those two
        # UBSan checks are off here, and on for the module in the asan
        # variant
        ccopt="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize=alignment,nonnull-attribute,shift-base"
        ldopt="-fsanitize=address,undefined"
        ;;
    nodebug)
        ccopt="-g -O2 -Werror"
        ldopt=""
        ;;
    *) echo "$usage" >&2; exit 2 ;;
esac

flags=(
    --prefix="$out"
    --sbin-path="$out/sbin/nginx"
    --modules-path="$out/modules"
    --conf-path="$out/conf/nginx.conf"
    --error-log-path=stderr
    --pid-path="$out/logs/nginx.pid"
    --with-compat --with-pcre-jit --with-threads
    --with-http_ssl_module --with-http_stub_status_module
    --with-http_realip_module --with-http_auth_request_module
    --with-http_v2_module --with-http_dav_module --with-http_slice_module
    --with-http_addition_module --with-http_gunzip_module
    --with-http_gzip_static_module --with-http_sub_module
    --with-http_secure_link_module
)
[ "$variant" = nodebug ] || flags+=(--with-debug)
# HTTP/3 (nginx 1.25.0 and later)
if grep -q -- '--with-http_v3_module' "$src/auto/options"; then
    flags+=(--with-http_v3_module)
fi
# shellcheck disable=SC2206 # split on blanks, as documented above
extra=(${NGINX_EXTRA_CONFIGURE:-})
flags+=("${extra[@]}")

configure=./configure
[ -x "$src/configure" ] || configure=./auto/configure

# the repository too: a configured tree holds its absolute path (a tree
# copied from another checkout would build that checkout's sources)
stamp="$repo|$version|$ccopt|$ldopt|${flags[*]}|$(cksum < "$repo/config")"
if [ ! -f "$tree/objs/Makefile" ] \
   || [ "$(cat "$tree/.stamp" 2>/dev/null)" != "$stamp" ]
then
    rm -rf "$tree"
    mkdir -p "$out"
    cp -a "$src" "$tree"
    rm -rf "$tree/objs" "$tree/Makefile"
    (
        cd "$tree"
        $configure "${flags[@]}" \
            --with-cc-opt="$ccopt" ${ldopt:+--with-ld-opt="$ldopt"} \
            --add-dynamic-module="$repo" > configure.log 2>&1 \
            || { tail -30 configure.log; exit 1; }
    )
    echo "$stamp" > "$tree/.stamp"
fi

jobs=$(nproc 2>/dev/null || echo 2)

dest=$out
[ "$variant" = plain ] || dest=$out/$variant

if [ "$variant" = plain ] || [ "$variant" = asan-full ]; then
    make -s -j"$jobs" -f "$tree/objs/Makefile" -C "$tree" binary modules
    mkdir -p "$dest/sbin"
    binary=$tree/objs/nginx
    [ -f "$binary" ] || binary=$tree/objs/angie
    cp "$binary" "$dest/sbin/.nginx.tmp"
    mv -f "$dest/sbin/.nginx.tmp" "$dest/sbin/nginx"
else
    make -s -j"$jobs" -f "$tree/objs/Makefile" -C "$tree" modules
fi

mkdir -p "$dest"
# a new inode: nginx processes still running the old .so keep their mapping
cp "$tree/objs/ngx_http_singleflight_module.so" "$dest/.module.so.tmp"
mv -f "$dest/.module.so.tmp" "$dest/ngx_http_singleflight_module.so"
echo "built $dest/ngx_http_singleflight_module.so" >&2
echo "$out"
