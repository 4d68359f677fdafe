#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Builds the module against Debian's nginx-dev tree, the way Debian's own
# /usr/sbin/nginx was configured, so the .so loads into it.
#
#   tools/build-module.sh [plain|asan|nonuma|nodebug]
#
# plain: build/ngx_http_singleflight_module.so
# asan:  build/asan/ngx_http_singleflight_module.so, compiled and linked
#        with AddressSanitizer and UBSan (load it with the runtimes
#        preloaded: see CONTRIBUTING.md or the Makefile's test-asan target).
# nonuma: build/nonuma/ngx_http_singleflight_module.so, built as on a system
#        without the NUMA interfaces (config's feature test overridden):
#        scope=numa has one instance, as on FreeBSD (make test-nonuma).
# nodebug: build/nodebug/ngx_http_singleflight_module.so, configured
#        without --with-debug (as nginx.org's and most builds are): no
#        debug log, and code used only by it must not warn (-Werror).

set -euo pipefail

variant=${1:-plain}
repo=$(cd "$(dirname "$0")/.." && pwd)
src=${NGINX_DEV_SRC:-/usr/share/nginx/src}
tree=$repo/build/nginx-$variant

case "$variant" in
    plain)
        ccopt="-g -O2"
        ldopt=""
        out=$repo/build
        ;;
    asan)
        ccopt="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize=alignment"
        ldopt="-fsanitize=address,undefined"
        out=$repo/build/asan
        ;;
    nonuma)
        ccopt="-g -O2 -DNGX_HTTP_SINGLEFLIGHT_HAVE_NUMA=0"
        ldopt=""
        out=$repo/build/nonuma
        ;;
    nodebug)
        ccopt="-g -O2"
        ldopt=""
        out=$repo/build/nodebug
        ;;
    *) echo "usage: $0 [plain|asan|nonuma|nodebug]" >&2; exit 2 ;;
esac

[ -f "$src/conf_flags" ] || { echo "no $src/conf_flags: install nginx-dev" >&2; exit 1; }

# configure again only when the addon script, the flags or the repository
# changed: a configured tree holds the repository's absolute path, and one
# copied from another checkout would build that checkout's sources
stamp="$repo|$ccopt|$ldopt|$(cksum < "$repo/config")|$(cksum < "$src/conf_flags")"
if [ ! -f "$tree/objs/Makefile" ] || [ "$(cat "$tree/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$tree"
    mkdir -p "$repo/build"
    cp -a "$src" "$tree"
    (
        cd "$tree"
        # shellcheck disable=SC1091
        . ./conf_flags
        flags=()
        for f in "${NGX_CONF_FLAGS[@]}"; do
            [ "$variant" = nodebug ] && [ "$f" = --with-debug ] && continue
            flags+=("$f")
        done
        ./configure "${flags[@]}" \
            --with-cc-opt="$ccopt" ${ldopt:+--with-ld-opt="$ldopt"} \
            --add-dynamic-module="$repo" > configure.log 2>&1 \
            || { cat configure.log; exit 1; }
    )
    echo "$stamp" > "$tree/.stamp"
fi

make -s -f "$tree/objs/Makefile" -C "$tree" modules
mkdir -p "$out"
# a new inode: nginx processes still running the old .so keep their mapping
cp "$tree/objs/ngx_http_singleflight_module.so" "$out/.module.so.tmp"
mv -f "$out/.module.so.tmp" "$out/ngx_http_singleflight_module.so"
echo "built $out/ngx_http_singleflight_module.so"
