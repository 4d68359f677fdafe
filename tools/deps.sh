#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Installs the Debian packages a make target needs, and only those missing.
#
#   tools/deps.sh build|nginx-src|fetch|test|test-src|asan|demo|bench|deb|nginx-tests
#
# test-src: the tests against an nginx built from source (NGINX_SRC=),
# without Debian's nginx and its modules;
# nginx-src: building an nginx from source (tools/build-nginx.sh);
# fetch: Debian's nginx source package (tools/fetch-nginx-debian.sh);
# deb: the Debian package (make deb); nginx-tests: Debian's dynamic
# modules nginx's own tests load, and the Perl modules and daemons of
# their FastCGI, SCGI, uwsgi and memcached origins (make nginx-tests).
#
# Runs apt-get as root, or through sudo when it is there.  It never
# replaces an nginx that is not Debian's (nginx.org's package, or one
# installed by hand): it stops and says what to do instead.

set -euo pipefail

# the third-party modules t/singleflight_compat.t runs beside ours, and
# brotli, the command it decodes the brotli filter's responses with
compat="libnginx-mod-http-lua libnginx-mod-http-ndk libnginx-mod-http-js libnginx-mod-http-perl libnginx-mod-http-echo libnginx-mod-http-headers-more-filter libnginx-mod-http-fancyindex libnginx-mod-http-modsecurity libnginx-mod-http-srcache-filter libnginx-mod-http-cache-purge libnginx-mod-http-brotli-filter brotli"

case "${1:-build}" in
    build) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev" ;;
    nginx-src) want="gcc make libc6-dev libpcre2-dev libssl-dev zlib1g-dev" ;;
    fetch) want="dpkg-dev xz-utils" ;;
    deb) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev dpkg-dev debhelper" ;;
    demo) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl" ;;
    test) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl curl openssl nghttp2-client nghttp2-server ngtcp2-client gdb $compat" ;;
    test-src) want="gcc make libc6-dev libpcre2-dev libssl-dev zlib1g-dev perl curl openssl nghttp2-client nghttp2-server ngtcp2-client gdb" ;;
    asan) want="gcc make libc6-dev libpcre2-dev libssl-dev zlib1g-dev perl curl openssl libasan8 libubsan1 gdb" ;;
    bench) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl curl wrk valgrind varnish procps linux-perf" ;;
    nginx-tests) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl libfcgi-perl libscgi-perl libcache-memcached-perl memcached uwsgi-core uwsgi-plugin-python3 libnginx-mod-http-perl libnginx-mod-http-image-filter libnginx-mod-http-xslt-filter libnginx-mod-http-geoip libnginx-mod-mail libnginx-mod-stream libnginx-mod-stream-geoip" ;;
    *) echo "usage: $0 build|nginx-src|fetch|test|test-src|asan|demo|bench|deb|nginx-tests" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

[ -z "$missing" ] && exit 0

# Debian's nginx-core is installed only where it replaces no other nginx:
# a host running nginx.org's package (or an nginx built and installed by
# hand, which dpkg would overwrite) keeps it, and is told what to do.
system_nginx=${SF_SYSTEM_NGINX:-/usr/sbin/nginx}
case " $missing " in
    *" nginx-core "*|*" nginx-dev "*)
        if [ -e "$system_nginx" ] && [ -z "${SF_REPLACE_NGINX:-}" ]; then
            owner=$(dpkg-query -S "$system_nginx" 2>/dev/null | sed -n '1s/:.*//p' || true)
            from=""
            if [ -n "$owner" ]; then
                from=$(dpkg-query -W -f='${Maintainer}' "$owner" 2>/dev/null || true)
            fi
            case "$from" in
                *Debian*) ;;
                *)
                    what=${owner:+the package $owner ($from)}
                    echo "tools/deps.sh: $system_nginx is ${what:-not from any package}," \
                         "not Debian's nginx; installing$missing would replace it." >&2
                    echo "  Build and test against your own nginx's source instead:" \
                         "make test NGINX_SRC=/path/to/nginx-x.y.z (its version, from nginx.org)," >&2
                    echo "  or run the tests on another machine or container." \
                         "SF_REPLACE_NGINX=1 installs Debian's nginx anyway." >&2
                    exit 1
                    ;;
            esac
        fi
        ;;
esac

sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install:$missing" >&2; exit 1; }
    sudo=sudo
fi

echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null
# policy-rc.d keeps the nginx package from starting Debian's own server
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
# shellcheck disable=SC2086
$sudo apt-get install -y -q --no-install-recommends $missing >/dev/null
