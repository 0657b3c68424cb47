#!/usr/bin/env bash
# What each turn-taking mechanism of the default mode buys: runs the
# contended, processes and permits benchmarks once with every mechanism on,
# then once with each switched off (LEASEHOLD_ABLATE, the `ablation`
# feature), and prints each scenario's medians, one JSON line per
# mechanism and scenario. Needs an idle machine: about 25 minutes.
#
#   scripts/ablation.sh                  # every mechanism
#   scripts/ablation.sh none yield defer # some ("none": all on)
set -euo pipefail
cd "$(dirname "$0")/.."
mechanisms=("$@")
if [ ${#mechanisms[@]} -eq 0 ]; then
    mechanisms=(none baton offer yield defer window linger own-notice afresh
        baton,offer,yield,defer,window,linger,own-notice,afresh)
fi
cargo bench --features ablation --no-run --bench contended --bench processes --bench permits 2>/dev/null
out=$(mktemp -d)
for off in "${mechanisms[@]}"; do
    ablate=$off
    [ "$off" = none ] && ablate=
    export LEASEHOLD_ABLATE=$ablate
    # Pinned, busy hold: as docs/performance.md's contended table.
    LEASEHOLD_BENCH_REPEATS=3 LEASEHOLD_BENCH_HOLD=spin \
        LEASEHOLD_BENCH_SCENARIOS=leasehold/1-manager/notices,leasehold/16-managers/notices,processes/16/default \
        taskset -c 0 cargo bench --quiet --features ablation --bench contended 2>/dev/null >"$out/contended" || {
        echo "contended failed with $off off" >&2
        exit 1
    }
    LEASEHOLD_BENCH_SECS=5 LEASEHOLD_BENCH_REPEATS=3 LEASEHOLD_BENCH_SCENARIOS=leasehold/default \
        cargo bench --quiet --features ablation --bench processes 2>/dev/null >"$out/processes" || {
        echo "processes failed with $off off" >&2
        exit 1
    }
    LEASEHOLD_BENCH_REPEATS=3 LEASEHOLD_BENCH_SCENARIOS=leasehold/16-managers \
        taskset -c 0 cargo bench --quiet --features ablation --bench permits 2>/dev/null >"$out/permits" || {
        echo "permits failed with $off off" >&2
        exit 1
    }
    for bench in contended processes permits; do
        grep '"round":"median"' "$out/$bench" | sed "s/^{/{\"off\":\"$off\",\"bench\":\"$bench\",/"
    done
done
rm -rf "$out"
