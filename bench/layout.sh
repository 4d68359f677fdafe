#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/layout.sh - does the way the module is compiled change what a lone
# request costs?  bench/lone.pl's callgrind tables (instructions, and first-
# level instruction cache misses with valgrind's cache model) for the same
# source built five ways, each from a copy of this tree:
#
#   as built      tools/build-module.sh plain: Debian's nginx flags (-O2,
#                 --with-debug), what `make` and the tests use;
#   no debug log  without --with-debug (tools/build-module.sh nodebug): no
#                 ngx_log_debug() tests on the way;
#   -Os           optimized for size;
#   no alignment  -O2 with functions, loops and jumps not aligned
#                 (-falign-*=1): no padding between code;
#   profile       -O2 with GCC's profile-guided optimization, the profile
#                 taken from lone.pl's own requests (a build with
#                 -fprofile-generate, 300 requests per size): rare paths
#                 moved out of the way, inlining where the requests go.
#                 What layout can do at best, not a way to ship: a profile
#                 belongs to one source, one compiler and one workload.
#
#   bench/layout.sh [lone.pl options, default: --sizes 1024,10000,65536
#                    --requests 1000]
#
# Results: bench/results/YYYY-MM-DD-HOST-layout.md (or LAYOUT_OUT=file;
# BENCH_KEEP=1 keeps the working directory); about three minutes.

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$repo/bench/lib.sh"
bench_init layout "$@"
sizes=$(printf '%s\n' "${args[@]}" | sed -n '/^--sizes$/{n;p}')
sizes=${sizes:-1024,10000,65536}

out=${LAYOUT_OUT:-$(result_file layout)}

# a copy of the tree, configured as tools/build-module.sh does it
tree=$work/src
copy_tree "$tree"
"$tree/tools/build-module.sh" plain >/dev/null
"$tree/tools/build-module.sh" nodebug >/dev/null
objs=$tree/build/nginx-plain/objs
cflags=$(sed -n 's/^CFLAGS = *//p' "$objs/Makefile")

# build VARIANT EXTRA-CFLAGS [LINK-FLAGS]: the module with nginx's CFLAGS
# and these
build() {
    rm -f "$objs"/addon/*/*.o "$objs"/addon/*.o "$objs"/ngx_http_singleflight_module*.o
    make -s -f "$objs/Makefile" -C "$tree/build/nginx-plain" modules \
        CFLAGS="$cflags $2" LINK="cc ${3:-}" >/dev/null
    mkdir -p "$work/$1"
    cp "$objs/ngx_http_singleflight_module.so" "$work/$1/"
}

mkdir -p "$work/built" "$work/nodebug"
cp "$tree/build/ngx_http_singleflight_module.so" "$work/built/"
cp "$tree/build/nodebug/ngx_http_singleflight_module.so" "$work/nodebug/"
build os "-Os"
build noalign "-falign-functions=1 -falign-jumps=1 -falign-loops=1 -falign-labels=1"
build gen "-fprofile-generate=$work/profile -fprofile-update=atomic" \
    "-fprofile-generate=$work/profile"
SF_MODULE=$work/gen/ngx_http_singleflight_module.so perl -I "$repo/t/lib" \
    "$repo/bench/lone.pl" --no-wrk --sizes "$sizes" --requests 300 \
    --out "$work/gen.md" >"$work/gen.log" 2>&1
compgen -G "$work/profile/*.gcda" >/dev/null || { echo "no profile written" >&2; exit 1; }
build profile "-fprofile-use=$work/profile -fprofile-partial-training"

variants=(built nodebug os noalign profile)
declare -A label=([built]='as built' [nodebug]='no debug log' [os]='-Os'
                  [noalign]='no alignment' [profile]='profile')

{
    echo "# How the module is compiled and what a lone request costs, $(date -u '+%F %H:%M UTC')"
    echo
    echo "Machine: $(hostname -s), $(nproc) cores, $(uname -r); $(gcc --version | head -1);"
    run_facts
    echo "Command: \`bench/layout.sh ${args[*]}\` (each row: \`bench/lone.pl --no-wrk --cache-sim\`)."
    echo "nginx's CFLAGS: \`$cflags\`."
    echo
} > "$out"

for v in "${variants[@]}"; do
    SF_MODULE=$work/$v/ngx_http_singleflight_module.so perl -I "$repo/t/lib" \
        "$repo/bench/lone.pl" --no-wrk --cache-sim "${args[@]}" \
        --out "$work/$v.md" >/dev/null 2>&1
done

# per variant and size: instructions over bare, misses over bare, of them
# in the module's code; the module's code size
{
    echo "| build | code (bytes) | body | instructions module / bare | I1 misses module - bare | in the module's code |"
    echo "|---|--:|--:|--:|--:|--:|"
    for v in "${variants[@]}"; do
        text=$(size "$work/$v/ngx_http_singleflight_module.so" | awk 'NR == 2 { print $1 }')
        perl -e '
            my ($file, $label, $text) = @ARGV;
            open my $f, "<", $file or die "$file: $!";
            my (%ratio, %miss, @sizes);
            while (<$f>) {
                if (/^\| (\d+) (KiB|MiB|B) \| \d+ \| \d+ \| [\d.]+ \| \d+ \| ([\d.]+) \|/) {
                    my $s = $1 * ($2 eq "KiB" ? 1024 : $2 eq "MiB" ? 1048576 : 1);
                    push @sizes, $s;
                    $ratio{$s} = $3;
                } elsif (/^\| (\d+) \| \d+ \| \d+ \| \d+ \| ([+-]\d+) \| (\d+) \|/) {
                    $miss{$1} = [$2, $3];
                }
            }
            for my $s (@sizes) {
                printf "| %s | %s | %d | %s | %s | %s |\n", $label, $text, $s,
                    $ratio{$s}, @{ $miss{$s} // ["-", "-"] };
            }
        ' "$work/$v.md" "${label[$v]}" "$text"
    done
    echo
} >> "$out"

cat "$out"
echo "# results: $out"
