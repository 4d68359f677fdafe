#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# Runs a subset of nginx's own test suite (nginx-tests) twice against one
# nginx binary: plain, and with the module loaded and singleflight on at
# http level.  Prints the tests that fail only with the module, and exits
# non-zero when one of them is not listed in the intended-differences file.
#
#   tools/nginx-tests.sh NGINX_TESTS NGINX_BINARY MODULE_SO [MODULES_DIR]
#
# NGINX_TESTS: a working tree of nginx-tests (never part of this repo).
# MODULES_DIR: where the tests' own load_module lines find nginx's dynamic
#   modules (Debian's: /usr/lib/nginx/modules; a source build: its
#   modules/ beside sbin/).
# NGINX_TESTS_FILES: the file patterns run (default below).
# NGINX_TESTS_JOBS: files run at once (default 2).
# NGINX_TESTS_HTTP: more http-level directives for the run with the module
#   (e.g. "singleflight_lone direct;").
#
# A file that fails only with the module is run once more both ways, and
# only the tests that fail only with the module both times are reported:
# a timing test failing once under load is not a difference.
#
# tools/nginx-tests.intended lists the intended differences, one a line:
# "file.t N reason" (N a test number, or "-" for the file's exit status).

set -euo pipefail

tests=$(cd "$1" && pwd)
binary=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
module=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
modules=${4:-/usr/lib/nginx/modules}
repo=$(cd "$(dirname "$0")/.." && pwd)
intended=$repo/tools/nginx-tests.intended
patterns=${NGINX_TESTS_FILES:-"proxy*.t upstream*.t gzip*.t ssi*.t not_modified*.t range*.t"}
jobs=${NGINX_TESTS_JOBS:-2}
out=$(mktemp -d "${TMPDIR:-/tmp}/sf-nginx-tests.XXXXXX")
trap 'rm -rf "$out"' EXIT

globals="load_module $module;"
globals_http="singleflight_zone zone=sf:10m; singleflight sf; ${NGINX_TESTS_HTTP:-}"

# As root, nginx runs its workers as "nobody", which cannot read the
# files in a test's private directory: every static file would be a 403,
# plain and with the module alike, and those tests would compare nothing.
# Both runs get "user root;" then (nginx only warns of it otherwise).
plain_globals=""
if [ "$(id -u)" = 0 ]; then
    plain_globals="user root;"
    globals="$plain_globals $globals"
fi

# run_one MODE FILE: TAP output into $out/MODE/FILE
run_one() {
    local mode=$1 file=$2
    mkdir -p "$out/$mode"
    (
        cd "$tests"
        export TEST_NGINX_BINARY=$binary TEST_NGINX_MODULES=$modules
        if [ "$mode" != plain ]; then
            export TEST_NGINX_GLOBALS=$globals
            export TEST_NGINX_GLOBALS_HTTP=$globals_http
        elif [ -n "$plain_globals" ]; then
            export TEST_NGINX_GLOBALS=$plain_globals
        fi
        timeout 300 perl -I lib "$file" >"$out/$mode/$file" 2>&1
        echo "# exit $?" >>"$out/$mode/$file"
    )
}
export -f run_one
export tests binary modules out globals globals_http plain_globals

# failures MODE FILE...: "file N" for each failing test, "file -" for a
# file whose exit status is not its count of failing tests (it died, or
# ran fewer tests than planned)
failures() {
    local mode=$1 file
    shift
    for file in "$@"; do
        awk -v f="$file" '
            /^not ok [0-9]+/ && !/# TODO/ { print f, $3; n++ }
            /^# exit [0-9]+$/ { if ($3 != n) print f, "-" }
        ' "$out/$mode/$file"
    done | sort -u
}

# only_module FILE...: failures with the module that plain has not
only_module() {
    comm -13 <(failures plain "$@") <(failures module "$@")
}

run_all() {
    local mode
    for mode in plain module; do
        printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c "run_one $mode {}"
    done
}

cd "$tests"
# shellcheck disable=SC2086
files=$(ls $patterns 2>/dev/null | sort -u)
[ -n "$files" ] || { echo "no test files in $tests" >&2; exit 2; }
count=$(echo "$files" | wc -l)
echo "nginx-tests: $count files, $("$binary" -v 2>&1 | sed 's/.*: //')," \
    "plain and with $(basename "$module")"

# shellcheck disable=SC2086
run_all $files
first=$(only_module $files)
again=$(echo "$first" | awk 'NF { print $1 }' | sort -u)
diffs=""
if [ -n "$again" ]; then
    echo "rerunning: $(echo $again)"
    # shellcheck disable=SC2086
    run_all $again
    # shellcheck disable=SC2086
    diffs=$(comm -12 <(echo "$first") <(only_module $again))
fi

echo "plain: $(failures plain $files | wc -l) failing (not ours)"
unexpected=0
while read -r file n; do
    [ -n "$file" ] || continue
    if grep -q "^$file $n " "$intended" 2>/dev/null; then
        echo "intended: $file $n"
    else
        echo "ONLY WITH THE MODULE: $file $n"
        unexpected=$((unexpected + 1))
    fi
done <<<"$diffs"
echo "nginx-tests: $unexpected unexpected differences"
[ "$unexpected" = 0 ]
