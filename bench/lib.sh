# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
#
# bench/lib.sh - what bench/floor.sh and bench/layout.sh share; sourced,
# with $repo set to the repository's top.

# result_file KIND: bench/results/DATE-HOST-KIND.md, or -2.md, -3.md ...
# when a run of the day is there already
result_file() {
    local base out n=2
    base=$repo/bench/results/$(date +%F)-$(hostname -s)-$1
    out=$base.md
    while [ -e "$out" ]; do out=$base-$n.md; n=$((n + 1)); done
    echo "$out"
}

# copy_tree DIR: the repository's tracked files, as they are now, in DIR
copy_tree() {
    mkdir -p "$1"
    git -C "$repo" ls-files -z | (cd "$repo" && xargs -0 tar -cf -) \
        | tar -xf - -C "$1"
}

# run_facts: the nginx and the commit a result was measured with
run_facts() {
    echo "nginx $(/usr/sbin/nginx -v 2>&1 | sed 's/.*nginx\///');"
    echo "commit $(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet || echo ' (modified)')."
}

# bench_init KIND ARGS...: $work, a directory removed at exit (kept with
# BENCH_KEEP=1), and $args, the lone.pl options given or the default ones
bench_init() {
    local kind=$1
    shift
    work=$(mktemp -d "/tmp/sf-$kind.XXXXXX")
    # shellcheck disable=SC2064
    trap "[ -n \"\${BENCH_KEEP:-}\" ] || rm -rf '$work'" EXIT
    args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(--sizes 1024,10000,65536 --requests 1000)
}
