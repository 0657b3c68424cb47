#!/usr/bin/env bash
# This checkout against earlier commits, side by side in one run: the
# acquire/release cycle (one task pinned to one core; 64 tasks on a
# current-thread and on a multi-thread runtime), the contended handoff
# across 16 processes, and the notice of a server restart that lost the
# lease (benches/compare.rs; docs/performance.md, "Against earlier builds").
#
#   scripts/compare.sh 8ba86a8                 # this checkout and one commit
#   scripts/compare.sh 8ba86a8 a8dfeda         # and more
#   COMPARE_REPEATS=5 COMPARE_MODES=restart scripts/compare.sh 8ba86a8
#   scripts/compare.sh --last                  # the last run's table again
#
# Each commit is checked out (git worktree) into target/compare/<commit>,
# benches/compare.rs is copied in (it uses only the API every build it is
# meant for has) and built there with a target dir of its own. The runs
# alternate between the builds, each mode COMPARE_REPEATS times (default
# 5; a restart run is LEASEHOLD_COMPARE_ROUNDS restarts, default 3). The
# table gives each build's median over the repeats and the current build
# over each earlier one as the median of the ratios within a repeat. The
# raw lines are kept in target/compare/last-run.jsonl. The driver's other
# settings (LEASEHOLD_COMPARE_SECS, LEASEHOLD_COMPARE_PROCESSES) pass
# through.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=target/compare/last-run.jsonl
command -v jq >/dev/null || {
    echo "compare.sh needs jq" >&2
    exit 2
}

# Prints the table of the runs in $1: per mode and figure, each build's
# median over the repeats (a repeat's figure is the median of its
# rounds), then the current build over each earlier one as the median of
# the ratios within a repeat; for the restart, each figure's worst round
# as well. The builds of one repeat run back to back,
# so a machine that speeds up or slows down between repeats (other work
# beside it) moves both sides of a ratio alike.
summarize() {
    local labels
    mapfile -t labels < <(jq -rs '["current"] + ([.[].build] | unique - ["current"]) | .[]' "$1")
    jq -rs --argjson labels "$(printf '%s\n' "${labels[@]}" | jq -R . | jq -s .)" '
      def median: sort | if length == 0 then null else .[(length / 2 | floor)] end;
      def fmt: if . == null then "-" elif . >= 100 then (. | round | tostring)
               else ((. * 100 | round) / 100 | tostring) end;
      group_by(.mode)[] as $runs
      | ($runs[0] | to_entries | map(select(.value | type == "number") | .key)
         | map(select(. != "round" and . != "processes" and . != "repeat"))) as $keys
      | $keys[] as $k
      | [$runs | group_by(.repeat)[] as $rep
         | [$labels[] as $l | [$rep[] | select(.build == $l) | .[$k]] | median]] as $per
      | [range(0; $labels | length) as $i | [$per[] | .[$i] | select(. != null)] | median] as $m
      | [range(1; $labels | length) as $i
         | [$per[] | select(.[0] != null and .[$i] != null and .[$i] != 0) | .[0] / .[$i]]
         | median] as $ratios
      | ([$runs[0].mode, $k] + ($m | map(fmt)) + ($ratios | map(fmt))),
        # A restart is a safety figure: its worst round counts too.
        (select($runs[0].mode == "restart")
         | [$runs[0].mode, "\($k), worst"]
           + [$labels[] as $l | [$runs[] | select(.build == $l) | .[$k]] | max | fmt]
           + [range(1; $labels | length) | "-"])
      | @tsv' "$1" |
        {
            printf 'mode\tfigure'
            printf '\t%s' "${labels[@]}"
            printf '\tcurrent / %s' "${labels[@]:1}"
            printf '\n'
            cat
        } | column -t -s $'\t'
}

if [ "${1:-}" = --last ]; then
    summarize "$out"
    exit
fi
if [ $# -eq 0 ]; then
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
repeats=${COMPARE_REPEATS:-5}
modes=${COMPARE_MODES:-cycle-sequential,cycle-64-current,cycle-64-multi,processes,restart}
mkdir -p target/compare

# Builds benches/compare.rs in $1 with target dir $2; prints the binary.
build() {
    local log=$2/compare-build.log
    mkdir -p "$2"
    if ! (cd "$1" && CARGO_TARGET_DIR=$2 cargo build --release --bench compare \
        --message-format=json 2>"$log") >"$2/compare-build.json"; then
        echo "the build in $1 failed; see $log" >&2
        exit 1
    fi
    jq -r 'select(.executable != null and .target.name == "compare") | .executable' \
        "$2/compare-build.json" | tail -n 1
}

labels=(current)
bins=("$(build "$root" "${CARGO_TARGET_DIR:-$root/target}")")
for commit in "$@"; do
    short=$(git rev-parse --short=7 "$commit^{commit}")
    tree=target/compare/$short
    if [ ! -e "$tree/.git" ]; then
        git worktree add --detach "$tree" "$short" >/dev/null
    fi
    # The copy and the bench entry are the only changes made there.
    git -C "$tree" checkout --quiet -- Cargo.toml
    cp benches/compare.rs "$tree/benches/compare.rs"
    # A commit from before the bench needs its entry; one after has it.
    grep -q '^name = "compare"$' "$tree/Cargo.toml" ||
        printf '\n[[bench]]\nname = "compare"\nharness = false\n' >>"$tree/Cargo.toml"
    labels+=("$short")
    bins+=("$(build "$root/$tree" "$root/$tree/target")")
done

: >"$out"
echo "# $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(redis-server --version | cut -d' ' -f3), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
changes=
git diff --quiet HEAD -- crates src benches Cargo.toml || changes=" with local changes"
echo "# current = $(git rev-parse --short=7 HEAD)$changes; ${repeats} repeats"
IFS=, read -r -a mode_list <<<"$modes"
for ((r = 0; r < repeats; r++)); do
    for mode in "${mode_list[@]}"; do
        pin=()
        [ "$mode" = cycle-sequential ] && pin=(taskset -c 0)
        # Every other repeat in the reverse order, so that neither build
        # always runs first.
        order=$(seq 0 $((${#bins[@]} - 1)))
        ((r % 2)) && order=$(echo "$order" | tac)
        for i in $order; do
            if ! "${pin[@]}" "${bins[$i]}" --bench "$mode" 2>target/compare/last-error |
                jq -c --arg build "${labels[$i]}" --argjson repeat "$r" \
                    '. + {build: $build, repeat: $repeat}' >>"$out"; then
                echo "${labels[$i]} failed in $mode:" >&2
                cat target/compare/last-error >&2
                exit 1
            fi
        done
    done
done
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
summarize "$out"
