#!/usr/bin/env bash
# Load-independent profile of one acquire + release cycle, per client
# (benches/cycle_profile.rs): server commands per cycle, one cycle under
# MONITOR, server and client instructions per cycle under callgrind, and
# heap per held lease under DHAT; and, for many leases held, the server's
# instructions per renewal and the client's heap per lease by allocation
# site.
#
#   scripts/profile_cycle.sh commands|monitor|server|client|hold [CLIENT...]
#   scripts/profile_cycle.sh renewals|held [HOLDER...]
#
# CLIENT: leasehold_manager leasehold_backend raw_redis
# raw_redis_leasehold_scripts (default: all four). HOLDER: leasehold_manager
# leasehold_manager_untracked raw_renew raw_pexpire (default: all four);
# LEASES (default 10000; for held, two counts, default "10000 20000"),
# ROUNDS and TTL (renewals: 3 rounds, 30s; held: 3 rounds, 3s, as
# hold_many's 10k scenarios) as the tests `renewals` and `held` in
# benches/cycle_profile.rs say. CYCLES (default 10000)
# measured cycles; OUT (default target/profile) where outputs go; BIN a
# cycle_profile binary built earlier (to compare with an older build), in
# place of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?commands|monitor|server|client|hold|renewals|held}
shift
clients=("$@")
if [ ${#clients[@]} -eq 0 ]; then
    case $what in
    renewals | held) clients=(leasehold_manager leasehold_manager_untracked raw_renew raw_pexpire) ;;
    *) clients=(leasehold_manager leasehold_backend raw_redis raw_redis_leasehold_scripts) ;;
    esac
fi
cycles=${CYCLES:-10000}
out=${OUT:-target/profile}
mkdir -p "$out"
if [ -n "${BIN:-}" ]; then
    bin=$BIN
else
    # held names allocation sites by file and line: line tables, which
    # change no code.
    [ "$what" != held ] || export CARGO_PROFILE_BENCH_DEBUG=line-tables-only
    cargo bench --bench cycle_profile --no-run 2>/dev/null
    bin=$(ls -t target/release/deps/cycle_profile-* | grep -v '\.d$' | head -1)
fi
run() { "$bin" --ignored --exact "$1" --nocapture --test-threads=1; }

# A redis-server of our own on a free port, optionally under a tool: "$@".
start_server() {
    port=$(( 20000 + RANDOM % 20000 ))
    "$@" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --protected-mode no >"$out/server.$port.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "server did not start" >&2
    return 1
}
stop_server() {
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$server_pid" 2>/dev/null || true
}

case $what in
commands)
    for c in "${clients[@]}"; do
        LEASEHOLD_PROFILE_CLIENT=$c LEASEHOLD_PROFILE_CYCLES=$cycles run cycles | grep -v '^$\|^running\|^test \|^successes'
    done
    ;;
monitor)
    start_server
    redis-cli -p "$port" monitor >"$out/monitor.txt" &
    monitor=$!
    sleep 0.5
    for c in "${clients[@]}"; do
        LEASEHOLD_PROFILE_URL=redis://127.0.0.1:$port LEASEHOLD_PROFILE_CLIENT=$c \
            LEASEHOLD_PROFILE_CYCLES=1 run cycles >/dev/null
    done
    sleep 0.5
    kill "$monitor"
    stop_server
    # One measured cycle per client, between its markers (the RESETSTAT
    # and INFO of the side connection shown too).
    awk '/"ECHO" "begin/{on=1} on{sub(/^[0-9.]+ /,""); print} /"ECHO" "end/{on=0; print ""}' "$out/monitor.txt"
    ;;
server)
    for c in "${clients[@]}"; do
        rm -f "$out"/callgrind.server."$c".*
        start_server valgrind --tool=callgrind --dump-instr=no \
            --callgrind-out-file="$out/callgrind.server.$c.%p"
        LEASEHOLD_PROFILE_URL=redis://127.0.0.1:$port LEASEHOLD_PROFILE_CLIENT=$c \
            LEASEHOLD_PROFILE_CYCLES=$cycles LEASEHOLD_PROFILE_SERVER_PID=$server_pid run cycles >/dev/null
        stop_server
        dump=$(ls "$out"/callgrind.server."$c".*.1)
        total=$(grep '^summary:\|^totals:' "$dump" | head -1 | awk '{print $2}')
        echo "$c: server instructions per cycle $((total / cycles)) ($dump)"
    done
    ;;
client)
    for c in "${clients[@]}"; do
        f="$out/callgrind.client.$c"
        LEASEHOLD_PROFILE_CLIENT=$c LEASEHOLD_PROFILE_CYCLES=$cycles valgrind --tool=callgrind \
            --dump-instr=no --collect-atstart=no --toggle-collect='*measured_cycles*' \
            --callgrind-out-file="$f" "$bin" --ignored --exact cycles --nocapture --test-threads=1 \
            >/dev/null 2>"$f.log"
        total=$(grep '^summary:\|^totals:' "$f" | head -1 | awk '{print $2}')
        echo "$c: client instructions per cycle $((total / cycles)) ($f)"
    done
    ;;
hold)
    for c in "${clients[@]}"; do
        for n in ${LEASES:-1000 2000}; do
            LEASEHOLD_PROFILE_CLIENT=$c LEASEHOLD_PROFILE_LEASES=$n valgrind --tool=dhat \
                --dhat-out-file="$out/dhat.$c.$n.json" "$bin" --ignored --exact hold --nocapture \
                --test-threads=1 >"$out/hold.$c.$n.txt" 2>&1
            grep -h 'size_of_val' "$out/hold.$c.$n.txt" | sort -u
            echo "$c $n leases: $(grep -o 'At t-gmax: *[0-9,]* bytes' "$out/hold.$c.$n.txt")"
        done
    done
    ;;
renewals)
    # The server's valgrind runs uninstrumented until the test switches
    # callgrind on, after the acquisitions and a first round of renewals.
    for c in "${clients[@]}"; do
        rm -f "$out"/callgrind.renewals."$c".*
        start_server valgrind --tool=callgrind --dump-instr=no --instr-atstart=no \
            --callgrind-out-file="$out/callgrind.renewals.$c.%p"
        LEASEHOLD_PROFILE_URL=redis://127.0.0.1:$port LEASEHOLD_PROFILE_CLIENT=$c \
            LEASEHOLD_PROFILE_LEASES=${LEASES:-10000} LEASEHOLD_PROFILE_ROUNDS=${ROUNDS:-3} \
            LEASEHOLD_PROFILE_TTL=${TTL:-30s} LEASEHOLD_PROFILE_SERVER_PID=$server_pid \
            run renewals >"$out/renewals.$c.txt"
        stop_server
        dump=$(ls "$out"/callgrind.renewals."$c".*.1)
        total=$(grep '^summary:\|^totals:' "$dump" | head -1 | awk '{print $2}')
        renewals=$(grep -o 'renewals [0-9]*,' "$out/renewals.$c.txt" | tr -dc 0-9)
        echo "$c: server instructions per renewal $((total / renewals)) ($dump)"
        grep -v '^$\|^running\|^test result\|^ok' "$out/renewals.$c.txt"
    done
    ;;
held)
    # The heap at two counts, at the peak (DHAT's t-gmax) and held (at the
    # end, every lease still held); per lease, by allocation site, the
    # difference over the difference of the counts.
    counts=(${LEASES:-10000 20000})
    for c in "${clients[@]}"; do
        for n in "${counts[@]}"; do
            LEASEHOLD_PROFILE_CLIENT=$c LEASEHOLD_PROFILE_LEASES=$n \
                LEASEHOLD_PROFILE_ROUNDS=${ROUNDS:-3} LEASEHOLD_PROFILE_TTL=${TTL:-3s} \
                valgrind --tool=dhat --dhat-out-file="$out/dhat.held.$c.$n.json" "$bin" \
                --ignored --exact held --nocapture --test-threads=1 >"$out/held.$c.$n.txt" 2>&1
        done
        python3 - "$c" "${counts[0]}" "${counts[1]}" "$out/dhat.held.$c.${counts[0]}.json" \
            "$out/dhat.held.$c.${counts[1]}.json" <<'PY'
import json, os, subprocess, sys
from collections import defaultdict

client, small, large, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
# Frames name their file without its directory: this repository's own
# files, told apart from the standard library's and the dependencies'.
ours = {os.path.basename(p) for p in subprocess.run(
    ["git", "ls-files", "*.rs"], capture_output=True, text=True).stdout.split()} - {"mod.rs", "lib.rs"}


def site(frames, names):
    # The first frame of this repository's code that asked for the
    # allocation, and the library function it called (which names the type).
    below = ""
    for f in frames:
        func, _, where = names[f].split(": ", 1)[-1].rpartition(" (")
        where = where.rstrip(")")
        file = where.split(":")[0]
        if "/" not in file and file in ours:
            return f"{func.split('<')[0]} ({where}) <- {below}"
        if not func.startswith("UnknownInlinedFun"):
            below = func
    return "elsewhere <- " + below


def heap(path, field):
    d = json.load(open(path))
    names, by = d["ftbl"], defaultdict(int)
    for pp in d["pps"]:
        by[site(pp["fs"], names)] += pp[field]
    return sum(by.values()), by


per = large - small
for field, when in (("gb", "at the peak"), ("eb", "held (at the end)")):
    ta, sa = heap(a, field)
    tb, sb = heap(b, field)
    print(f"{client}: heap {when}: {ta} B ({small} leases), {tb} B ({large}): {(tb - ta) / per:.1f} B per lease")
    if field == "gb":
        continue
    rows = sorted(((sb[k] - sa.get(k, 0)) / per, k) for k in set(sa) | set(sb))
    for d, k in sorted(rows, reverse=True):
        if abs(d) >= 1:
            print(f"  {d:8.1f}  {k[:200]}")
PY
    done
    ;;
*)
    echo "unknown: $what" >&2
    exit 2
    ;;
esac
