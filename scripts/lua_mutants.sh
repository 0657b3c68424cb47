#!/usr/bin/env bash
# Hand-made mutants of the Lua scripts, each run against the Redis tests
# that should catch it. cargo-mutants mutates Rust only; the scripts are
# where the server-side guarantees live, so each mechanism a guarantee
# rests on is broken here once, by hand, and the tests must go red.
#
#   scripts/lua_mutants.sh [MUTANT...]      (default: all of them)
#
# Each mutant edits one file under crates/leasehold-redis/src/scripts
# (embedded with include_str!, so the tests rebuild), runs its tests, and
# restores the file (also on Ctrl-C). The outcome of each is appended to
# OUT (default target/lua-mutants.txt): "caught" when a test failed,
# "MISSED" when every test passed. Exits 1 if any mutant was missed.
# Needs redis-server (scripts/test.sh installs it). Not part of CI: it
# rebuilds and reruns the tests once per mutant (a few minutes each).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts=crates/leasehold-redis/src/scripts
out=${OUT:-target/lua-mutants.txt}
mkdir -p "$(dirname "$out")"

# name | file | perl substitution | what it breaks | test targets
mutants=(
  "renew-holder|renew.lua|s/and string\.find\(v, holder, 1, true\) == 1 then/then/|a renewal extends a lease whoever holds it|-p leasehold-redis --test operations"
  "release-owner|release.lua|s/if not v or string\.sub\(v, 1, 33\) ~= ARGV\[1\] \.\. ':' then/if not v then/|a release deletes a lease whoever holds it|-p leasehold-redis --test operations"
  "acquire-held|acquire.lua|s/  return \{0, current, redis\.call\('PTTL', KEYS\[1\]\)\}\n/  -- mutant: no refusal\n/|an acquisition takes a lease another holds|-p leasehold-redis --test operations"
  "grant-floor|grant.lua|s/floor = t\[1\] \.\. string\.sub\('00000' \.\. t\[2\], -6\)/floor = '1'/|tokens without the clock floor (a lost counter restarts them)|--test footprint"
  "permit-held|permit.lua|s/  if v then\n    if string\.sub\(v, 1, 33\) == mine then/  if v and false then\n    if string.sub(v, 1, 33) == mine then/|a permit held by another counts as free (no limit)|-p leasehold-redis --test permits"
  "write-readers|write.lua|s/local members = redis\.pcall\('SMEMBERS', KEYS\[3\]\)/local members = {}/|a writer does not see the live readers|-p leasehold-redis --test rw_leases"
  "read-writer|read.lua|s/if writer then\n  return \{0, writer, redis\.call\('PTTL', KEYS\[2\]\)\}/if false then\n  return {0, writer, redis.call('PTTL', KEYS[2])}/|a reader is granted while a writer holds|-p leasehold-redis --test rw_leases"
  "release-many-owner|release_many.lua|s/if not v or string\.sub\(v, 1, 33\) ~= holder \.\. ':' then/if not v then/|a batched release deletes a lease whoever holds it|-p leasehold-redis --test batches"
  "fair-head|fair.lua|s/^if ahead > 0 then/if false then/m|a fair waiter is granted while another place is first|-p leasehold-redis --test fair_queue"
  "fair-free-queue|fair.lua|s/if not current and redis\.call\('EXISTS', queue\) == 0 then/if not current then/|a newcomer takes a free lease past the places in its queue|-p leasehold-redis --test fair_queue"
  "release-fair-queue|release_fair.lua|s/^if redis\.call\('EXISTS', queue\) == 0 then/if true then/m|a fair release ignores its queue (no handover to the head)|-p leasehold-redis --test fair_queue"
)

selected=("$@")
wanted() {
  [ ${#selected[@]} -eq 0 ] && return 0
  local m
  for m in "${selected[@]}"; do [ "$m" = "$1" ] && return 0; done
  return 1
}

restore() { git checkout -q -- "$scripts"; }
trap restore EXIT INT TERM

# The tests must pass on the scripts as they are, or a red run says
# nothing about a mutant.
echo "== baseline: the unmutated scripts"
if ! cargo test -p leasehold-redis --test operations --test permits --test rw_leases \
    --test batches --test fair_queue \
    >target/lua-mutant-baseline.log 2>&1 ||
  ! cargo test --test footprint >>target/lua-mutant-baseline.log 2>&1; then
  echo "the tests fail without a mutant (see target/lua-mutant-baseline.log)" >&2
  exit 2
fi

echo "# Lua mutants at $(git rev-parse --short HEAD) ($(date -u +%Y-%m-%dT%H:%MZ))" >>"$out"
missed=0
for entry in "${mutants[@]}"; do
  IFS='|' read -r name file subst what targets <<<"$entry"
  wanted "$name" || continue
  restore
  before=$(sha1sum "$scripts/$file")
  perl -0pi -e "$subst" "$scripts/$file"
  if [ "$(sha1sum "$scripts/$file")" = "$before" ]; then
    echo "mutant $name did not apply to $file: the script changed, update its pattern" >&2
    exit 2
  fi
  echo "== $name ($file): $what; running cargo test $targets"
  log="target/lua-mutant-$name.log"
  # shellcheck disable=SC2086 # targets are several words on purpose
  if cargo test $targets >"$log" 2>&1; then
    result=MISSED
    missed=1
  else
    if grep -q "^error\(\[E[0-9]*\]\)\?: could not compile" "$log"; then
      echo "mutant $name: the tests did not build (see $log)" >&2
      exit 2
    fi
    result=caught
  fi
  failing=$(grep -oE "^test [^ ]+ \.\.\. FAILED" "$log" | awk '{print $2}' | sort -u | head -5 | tr '\n' ' ')
  echo "$name|$file|$what|$result|$failing" | tee -a "$out"
done
restore
exit $missed
