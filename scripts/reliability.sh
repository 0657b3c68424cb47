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
        cargo test --release --test loss_detection -- --nocapture --test-threads 1 2>/dev/null)
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
      cargo test --release --test tracking -- --nocapture --test-threads 1 2>/dev/null \
        | grep -oE '\| [a-z]+ \| (Overwrite|Delete) \|.*\|$' || true
      ;;
    campaign)
      echo "### Fault campaign"
      echo
      cargo test --release --test campaign -- --nocapture --test-threads 1 2>/dev/null | tables
      ;;
    failover)
      echo "### Failover campaign"
      echo
      cargo test --release --test campaign_failover -- --nocapture 2>/dev/null | tables
      ;;
    cli)
      echo "### leasehold run"
      echo
      echo "| ending | figure | measured |"
      echo "|---|---|---|"
      # A row follows its test's name on the same line.
      cargo test -p leasehold-cli --release --test cli -- --nocapture --test-threads 1 2>/dev/null \
        | grep -oE '\| [a-z].*\|$' || true
      ;;
    *)
      echo "unknown part: $part (loss, tracking, campaign, failover, cli)" >&2
      exit 64
      ;;
  esac
  echo
done
