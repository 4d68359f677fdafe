#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Installs the Debian packages a make target needs, and only those missing.
#
#   tools/deps.sh build|nginx-src|fetch|test|asan|demo|bench|deb|nginx-tests
#
# nginx-src: building an nginx from source (tools/build-nginx.sh);
# fetch: Debian's nginx source package (tools/fetch-nginx-debian.sh);
# deb: the Debian package (make deb); nginx-tests: Debian's dynamic
# modules nginx's own tests load, and the Perl modules and daemons of
# their FastCGI, SCGI, uwsgi and memcached origins (make nginx-tests).
#
# Runs apt-get as root, or through sudo when it is there.

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
    test) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl curl openssl nghttp2-client nghttp2-server ngtcp2-client $compat" ;;
    asan) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl curl openssl nghttp2-client nghttp2-server ngtcp2-client libasan8 libubsan1 $compat" ;;
    bench) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl curl wrk valgrind varnish procps linux-perf" ;;
    nginx-tests) want="gcc make libc6-dev nginx-core nginx-dev libpcre2-dev libssl-dev zlib1g-dev perl libfcgi-perl libscgi-perl libcache-memcached-perl memcached uwsgi-core uwsgi-plugin-python3 libnginx-mod-http-perl libnginx-mod-http-image-filter libnginx-mod-http-xslt-filter libnginx-mod-http-geoip libnginx-mod-mail libnginx-mod-stream libnginx-mod-stream-geoip" ;;
    *) echo "usage: $0 build|nginx-src|fetch|test|asan|demo|bench|deb|nginx-tests" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

[ -z "$missing" ] && exit 0

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
