#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/floor.sh - how low the cost of a lone request can go: bench/lone.pl's
# callgrind table for the module as it is and for three cut-down copies of
# it, each built from a copy of this tree with one patch from bench/floor/
# (measurement only: nobody can follow the flights of these copies):
#
#   key.patch   a request gets its context and its key, then goes on as
#               plain proxying: what any design pays that builds a key
#               (the handler's checks, the variables, the hash, the
#               context in the request's pool);
#   claim.patch also claims its key with one atomic step and gives the
#               claim back when the request ends: the lightest
#               design at best (no lock, no node, no subrequest, no store);
#   zone.patch  makes its flight in the zone instead and takes a lone
#               flight's steps there (join and the end, locked; solo at
#               the header, not), with no fetch: today's flight without
#               the subrequest.
#
# The module's row minus "zone" is what the fetch costs a lone request.
# Every row runs lone.pl with --lone fetch: the copies cut down the path
# of a request that builds its key, which with the default (direct) a
# lone request never takes, so there they would measure the module.
# The last table has every copy against lone.pl's *bare* column (the plain
# location in an nginx without the module): the same for every copy, where
# the plain location of each copy's own nginx moves with what the copy's
# requests left in the heap.

#   bench/floor.sh [lone.pl options, default: --sizes 1024,10000,65536
#                   --requests 1000; with --cache-sim a table of
#                   instruction cache misses too]
#   bench/floor.sh --check   each patch applied to a copy and the copy
#                            built, nothing measured (.ci/run: a patch that
#                            no longer applies to src/ breaks make bench)
#
# Results: bench/results/YYYY-MM-DD-HOST-floor.md (or FLOOR_OUT=file);
# about a minute.

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$repo/bench/lib.sh"
bench_init floor "$@"

check=
[ "${args[0]}" != --check ] || check=1

# the module as it is (not for --check), then each cut-down copy
[ -n "$check" ] || "$repo/tools/build-module.sh" plain >/dev/null
variants=(module)
for p in "$repo"/bench/floor/*.patch; do
    name=$(basename "$p" .patch)
    copy_tree "$work/$name"
    (cd "$work/$name" && git apply "$p")
    "$work/$name/tools/build-module.sh" plain >/dev/null
    [ -z "$check" ] || echo "bench/floor/$name.patch: applies and builds"
    variants+=("$name")
done
[ -z "$check" ] || exit 0

out=${FLOOR_OUT:-$(result_file floor)}

{
    echo "# The floor of a lone request's cost, $(date -u '+%F %H:%M UTC')"
    echo
    echo "Machine: $(hostname -s), $(nproc) cores, $(uname -r);"
    run_facts
    echo "Command: \`bench/floor.sh ${args[*]}\` (each row: \`bench/lone.pl --no-wrk --lone fetch\`)."
    echo
} > "$out"

for v in "${variants[@]}"; do
    if [ "$v" = module ]; then
        so=$repo/build/ngx_http_singleflight_module.so
    else
        so=$work/$v/build/ngx_http_singleflight_module.so
    fi
    echo "## $v" >> "$out"
    echo >> "$out"
    SF_MODULE=$so perl -I "$repo/t/lib" "$repo/bench/lone.pl" --no-wrk \
        --lone fetch "${args[@]}" --out "$work/$v.md" >/dev/null
    grep '^|' "$work/$v.md" >> "$out"
    echo >> "$out"
done

# instructions over plain, per variant and size; the fetch: module - zone
{
    echo "## Over proxy_pass in an nginx without the module (lone.pl's *bare*"
    echo "column; instructions per request)"
    echo
    perl -e '
        my (%over, %ratio, @sizes, %seen);
        for my $v (@ARGV) {
            open my $f, "<", "'"$work"'/$v.md" or die;
            while (<$f>) {
                next unless /^\| (\d[^|]*?) \| \d+ \| (\d+) \| [\d.]+ \| (\d+) \|/;
                push @sizes, $1 unless $seen{$1}++;
                $over{$v}{$1} = $2 - $3;
                $ratio{$v}{$1} = $2 / $3;
            }
        }
        my @v = qw(key claim zone module);
        print "| body | ", join(" | ", @v), " | the fetch (module - zone) |\n";
        print "|---|--:|--:|--:|--:|--:|\n";
        for my $s (@sizes) {
            printf "| %s |" . " %+d (%.3f) |" x @v . " %+d |\n", $s,
                (map { ($over{$_}{$s}, $ratio{$_}{$s}) } @v),
                $over{module}{$s} - $over{zone}{$s};
        }
    ' "${variants[@]}"
    echo
} >> "$out"

# with --cache-sim: instruction cache misses over bare, the same way
if grep -q '^## Instruction cache misses' "$work/module.md"; then
    {
        echo "## Instruction cache misses over an nginx without the module"
        echo "(first-level, per request; lone.pl --cache-sim)"
        echo
        perl -e '
            my (%over, @sizes, %seen);
            for my $v (@ARGV) {
                open my $f, "<", "'"$work"'/$v.md" or die;
                while (<$f>) {
                    next unless /^\| (\d+) \| \d+ \| \d+ \| \d+ \| ([+-]\d+) \|/;
                    push @sizes, $1 unless $seen{$1}++;
                    $over{$v}{$1} = $2;
                }
            }
            my @v = qw(key claim zone module);
            print "| body | ", join(" | ", @v), " | the fetch (module - zone) |\n";
            print "|---|--:|--:|--:|--:|--:|\n";
            for my $s (@sizes) {
                printf "| %d |" . " %+d |" x @v . " %+d |\n", $s,
                    (map { $over{$_}{$s} } @v), $over{module}{$s} - $over{zone}{$s};
            }
        ' "${variants[@]}"
        echo
    } >> "$out"
fi

cat "$out"
echo "# results: $out"
