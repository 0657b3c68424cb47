#!/usr/bin/env bash
# Prints the measured tables of docs/reliability.md: each table there is a
# part of this script's output, from real redis-server processes.
#
#   scripts/reliability.sh              # everything (about 6 minutes on 2 cores)
#   scripts/reliability.sh loss         # one part: loss, tracking, campaign, failover, cli
#
# LEASEHOLD_LOSS_RUNS (default 3) repeats each loss-detection round;
# LEASEHOLD_CAMPAIGN_SEEDS (a comma list) replaces the campaign's seeds.
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(loss tracking campaign failover cli)

# Runs `cargo test ARGS -- --nocapture ...` and prints the tests' output.
# A run that fails (a test, or the build) stops the script with cargo's
# output on stderr: an empty table must never pass for a measured one.
run_tests() {
  local args=() out err
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  err=$(mktemp)
  if ! out=$(cargo test "${args[@]}" -- --nocapture "$@" 2>"$err"); then
    printf '%s\n' "$out" >&2
    cat "$err" >&2
    rm -f "$err"
    echo "reliability.sh: cargo test ${args[*]} failed; no table printed" >&2
    exit 1
  fi
  rm -f "$err"
  printf '%s\n' "$out"
}

# The tests' own output, less cargo's lines: tables, seeds and verdicts.
tables() {
  grep -E "^(\\||campaign|seed)" || true
}

for part in "${parts[@]}"; do
  case "$part" in
    loss)
      echo "### Loss detection (LEASEHOLD_LOSS_RUNS=${LEASEHOLD_LOSS_RUNS:-3})"
      echo
      echo "| fault | figure | samples | median | worst |"
      echo "|---|---|---|---|---|"
      out=$(LEASEHOLD_LOSS_RUNS=${LEASEHOLD_LOSS_RUNS:-3} \
        run_tests --release --test loss_detection -- --test-threads 1)
      grep -E '^\|' <<<"$out" || true
      echo
      # The count follows its test's name on the same line.
      grep -oE 'F3: [0-9]+ of .*' <<<"$out" || true
      ;;
    tracking)
      echo "### Thefts in the first renew interval"
      echo
      echo "| topology | theft | samples | median | worst |"
      echo "|---|---|---|---|---|"
      # A row may follow its test's name on the same line.
      out=$(run_tests --release --test tracking -- --test-threads 1)
      grep -oE '\| [a-z]+ \| (Overwrite|Delete) \|.*\|$' <<<"$out" || true
      ;;
    campaign)
      echo "### Fault campaign"
      echo
      out=$(run_tests --release --test campaign -- --test-threads 1)
      tables <<<"$out"
      ;;
    failover)
      echo "### Failover campaign"
      echo
      out=$(run_tests --release --test campaign_failover --)
      # The tables, and what each kill after a lag did to the leases its
      # master granted in the lag.
      grep -E "^(\\||campaign|seed|  (kills|.*granted in its lag))" <<<"$out" || true
      ;;
    cli)
      echo "### leasehold run"
      echo
      echo "| ending | figure | measured |"
      echo "|---|---|---|"
      # A row follows its test's name on the same line.
      out=$(run_tests -p leasehold-cli --release --test cli -- --test-threads 1)
      grep -oE '\| [a-z].*\|$' <<<"$out" || true
      ;;
    *)
      echo "unknown part: $part (loss, tracking, campaign, failover, cli)" >&2
      exit 64
      ;;
  esac
  echo
done
