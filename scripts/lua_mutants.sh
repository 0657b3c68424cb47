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

# half EXPR: the Lua text of EXPR (milliseconds, a number or a decimal
# string) cut by half, as the decimal string redis.call wants: the mutants
# that change a duration or an expiry cut it by half, so that a test that
# only checks that something expires (or only an upper bound) lets it pass.
half() { printf "string.format('%%.0f', math.floor(tonumber(%s) / 2))" "$1"; }

# name | file | perl substitution | what it breaks | test targets
# The test targets are cargo test arguments; several groups, one cargo
# test each, are separated by ';' (the root package `leasehold` and
# leasehold-redis have test targets of the same names). The substitutions
# use '!' as their delimiter (Lua has no '!') and no '|' or '$'.
mutants=(
  "renew-holder|renew.lua|s/ and find\(v, holder, 1, true\) == 1 then/ then/|a renewal extends a lease whoever holds it|-p leasehold-redis --test operations"
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
  # Durations and expiries, each cut by half.
  "grant-px-half|grant.lua|s!label, 'PX', ttl\)!label, 'PX', $(half ttl))!|a grant keeps the lease for half its ttl (and lock-delay, which the ttl sent includes)|-p leasehold-redis --test operations;--test lock_delay"
  "grant-retention-half|grant.lua|s!fence, token, 'PX', retention\)!fence, token, 'PX', $(half retention))!|a fencing counter is kept for half its retention|--test footprint;-p leasehold-redis --test operations"
  "acquire-refresh-px-half|acquire.lua|s!label, 'PX', ttl\)!label, 'PX', $(half ttl))!|a holder's re-acquisition keeps the lease for half its ttl|-p leasehold-redis --test operations"
  "acquire-mark-half|acquire.lua|s!\+ tonumber\(ARGV\[5\]\)!+ math.floor(tonumber(ARGV[5]) / 2)!;s!'PX', ARGV\[5\]\)!'PX', $(half 'ARGV[5]'))!|a grant's minimum-hold mark (held-until) ends at half the minimum|--test hold_at_least"
  "renew-pexpireat-half|renew.lua|s!string.format\('%.0f', now \+ shared\)!string.format('%.0f', now + math.floor(shared / 2))!|a renewal extends each lease of a batch sharing one ttl to half that ttl from the server's clock|-p leasehold-redis --test operations"
  "renew-each-ttl-half|renew.lua|s!string.format\('%.0f', now \+ ttl\)\)!string.format('%.0f', now + math.floor(ttl / 2)))!|a renewal extends each lease of a batch with several ttls to half its ttl from the server's clock|-p leasehold-redis --test operations;-p leasehold-redis --test batches"
  "renew-fallback-half|renew.lua|s!      call\('PEXPIRE', key, ttl\)!      call('PEXPIRE', key, $(half ttl))!g|a renewal refused PEXPIREAT (an ACL without it) extends the lease by half its ttl|--test security"
  "renew-index-half|renew.lua|s!'PEXPIRE', index, ttl, 'GT'\)!'PEXPIRE', index, $(half ttl), 'GT')!|a reader's renewal keeps the reader index for half the reader's ttl|--test footprint;-p leasehold-redis --test rw_leases"
  "release-hold-half|release.lua|s!string\.format\('%\.0f', left\)!string.format('%.0f', math.floor(left / 2))!|a release under the minimum hold keeps the lease for half the time left|--test hold_at_least"
  "release-hold-flag-ignored|release.lua|s!^if ARGV\[5\] == '1' then!if true then!m|every release reads a minimum hold's mark, a lease without one too|-p leasehold-redis --test batches"
  "release-hold-flag-dropped|release.lua|s!^if ARGV\[5\] == '1' then!if false then!m|no release reads a minimum hold's mark, a lease with one neither|--test hold_at_least;-p leasehold-redis --test batches"
  "acquire-many-refresh-px-half|acquire_many.lua|s!label, 'PX', ttl\)!label, 'PX', $(half ttl))!|a batched re-acquisition keeps the lease for half its ttl|-p leasehold-redis --test batches"
  "acquire-many-retention-half|acquire_many.lua|s!granted\[i \+ 1\], 'PX', retention\)!granted[i + 1], 'PX', $(half retention))!|a batch on a tracking connection keeps its counters for half the retention|-p leasehold-redis --test batches"
  "handover-ttl-half|handover.lua|s!ARGV\[6\], ARGV\[7\], ARGV\[8\]\)!ARGV[6], $(half 'ARGV[7]'), ARGV[8])!|a lease handed to the process's own waiter is kept for half its ttl|--test waiting;-p leasehold-redis --test operations"
  "handover-mark-half|handover.lua|s!\+ tonumber\(ARGV\[9\]\)!+ math.floor(tonumber(ARGV[9]) / 2)!;s!'PX', ARGV\[9\]\)!'PX', $(half 'ARGV[9]'))!|a handed-over grant's minimum-hold mark ends at half the minimum|--test hold_at_least;-p leasehold-redis --test operations"
  "handover-hold-half|handover.lua|s!string\.format\('%\.0f', left\)!string.format('%.0f', math.floor(left / 2))!|a handover under the minimum hold keeps the lease for half the time left|--test hold_at_least"
  "fair-place-half|fair.lua|s!now_ms \+ place_ttl\)!now_ms + math.floor(place_ttl / 2))!|a fair waiter's place expires at half its place ttl|-p leasehold-redis --test fair_queue;--test fair_queue"
  "fair-queue-keys-half|fair.lua|s!math\.max\(1, tonumber\(last\[2\]\) - now_ms\)!math.max(1, math.floor((tonumber(last[2]) - now_ms) / 2))!|the fair queue's keys expire at half the life of the longest-lived place|-p leasehold-redis --test fair_queue;--test fair_queue"
  "fair-refresh-px-half|fair.lua|s!label, 'PX', ttl\)!label, 'PX', $(half ttl))!|a fair holder's re-acquisition keeps the lease for half its ttl|-p leasehold-redis --test fair_queue"
  "release-fair-handover-half|release_fair.lua|s!string\.format\('%\.0f', left\), label!string.format('%.0f', math.floor(left / 2)), label!|a fair handover keeps the lease for half the head's handover time|-p leasehold-redis --test fair_queue;--test fair_queue"
  "permit-refresh-px-half|permit.lua|s!label, 'PX', ttl\)!label, 'PX', $(half ttl))!|a permit's re-acquisition keeps it for half its ttl|-p leasehold-redis --test permits"
  "permit-limit-half|permit.lua|s!KEYS\[1\], limit, 'PX', retention\)!KEYS[1], limit, 'PX', $(half retention))!g|a semaphore's limit is kept for half the retention|-p leasehold-redis --test permits"
  "read-index-half|read.lua|s!keep_index\(ttl\)!keep_index($(half ttl))!g|a reader's grant keeps the reader index for half the reader's ttl|-p leasehold-redis --test rw_leases;--test rw_leases"
  "read-refresh-px-half|read.lua|s!label, 'PX', ttl\)!label, 'PX', $(half ttl))!|a reader's re-acquisition keeps its share for half its ttl|-p leasehold-redis --test rw_leases"
  "write-intent-half|write.lua|s!mine \.\. label, 'PX', ttl\)!mine .. label, 'PX', $(half ttl))!|a refused writer's intent lives for half its ttl|-p leasehold-redis --test rw_leases;--test rw_leases"
  "write-refresh-px-half|write.lua|s!token \.\. ':' \.\. label, 'PX', ttl\)!token .. ':' .. label, 'PX', $(half ttl))!|a writer's re-acquisition keeps its hold for half its ttl|-p leasehold-redis --test rw_leases"
  "fenced-write-expiry-half|fenced_write.lua|s!'PEXPIRE', resource, expiry\)!'PEXPIRE', resource, $(half expiry))!g|a fenced resource lives for half the expiry asked for|-p leasehold-redis --test fenced_writes"
  "tick-deadline-half|tick.lua|s!math\.min\(nxt, tick \+ deadline\)!math.min(nxt, tick + math.floor(deadline / 2))!|a tick may start only within half its start deadline|-p leasehold-redis --test ticks"
  "tick-keep-half|tick.lua|s!'PEXPIRE', record, keep\)!'PEXPIRE', record, $(half keep))!|a job's record lives for half its keep after a decision|-p leasehold-redis --test ticks"
  "tick-complete-keep-half|tick_complete.lua|s!'PEXPIRE', record, r\[7\]\)!'PEXPIRE', record, $(half 'r[7]'))!|a job's record lives for half its keep after a completion|-p leasehold-redis --test ticks"
  "tick-rerun-keep-half|tick_rerun.lua|s!'PEXPIRE', record, keep\)!'PEXPIRE', record, $(half keep))!|a job's record lives for half its keep after a rerun or an abandon|-p leasehold-redis --test ticks"
  # Guards of the scripts the mutants above and before leave unguarded.
  "acquire-many-held|acquire_many.lua|s!    return \{0, current, redis\.call\('PTTL', lease\)\}\n!    -- mutant: no refusal\n!|a batched acquisition takes a lease another holds|-p leasehold-redis --test batches"
  "handover-owner|handover.lua|s!if not v or string\.sub\(v, 1, 33\) ~= ARGV\[1\] \.\. ':' then!if not v then!|a handover gives away a lease whoever holds it|--test waiting;-p leasehold-redis --test operations"
  "handover-others|handover.lua|s!others = tonumber\(count\[2\]\) > tonumber\(ARGV\[3\]\)!others = false!|a handover goes to the process's own waiter while a waiter elsewhere listens|--test waiting"
  "fair-leave-queue|fair_leave.lua|s!redis\.call\('ZREM', KEYS\[1\], ARGV\[1\]\)\n!-- mutant: the place stays in the queue\n!|a waiter that leaves keeps its place in the queue (the next one waits for it)|-p leasehold-redis --test fair_queue;--test fair_queue"
  "withdraw-owner|withdraw.lua|s!if wanted and string\.sub\(wanted, 1, 33\) == ARGV\[1\] \.\. ':' then!if wanted then!|a writer's withdrawal removes another writer's intent|-p leasehold-redis --test rw_leases;--test rw_leases"
  "fenced-write-lower|fenced_write.lua|s!if #seen > #token or \(#seen == #token and seen > token\) then!if false then!|a fenced write is accepted with a token below the fence|-p leasehold-redis --test fenced_writes"
  "fenced-write-lease|fenced_write.lua|s!if owner and owner ~= lease then!if false then!|a fenced write compares the tokens of another lease key|-p leasehold-redis --test fenced_writes"
  "fence-read-ttl-half|fence_read.lua|s!redis\.call\('PTTL', KEYS\[1\]\)\}!math.floor(redis.call('PTTL', KEYS[1]) / 2)}!|a fenced read reports half the resource's time left|-p leasehold-redis --test fenced_writes"
  "inspect-ttl-half|inspect.lua|s!\{v, redis\.call\('PTTL', KEYS\[1\]\)\}!{v, math.floor(redis.call('PTTL', KEYS[1]) / 2)}!|an inspection reports half the lease's time left|-p leasehold-redis --test operations"
  "inspect-rw-reader-ttl-half|inspect_rw.lua|s!out\[#out \+ 1\] = redis\.call\('PTTL', key\)!out[#out + 1] = math.floor(redis.call('PTTL', key) / 2)!|an inspection of a read-write lease reports half each reader's time left|-p leasehold-redis --test rw_leases;--test rw_leases"
  "tick-decided|tick.lua|s!if exists and tick <= tonumber\(r\[2\]\) then!if false then!|a tick already decided is decided again (started again when no run holds)|-p leasehold-redis --test ticks"
  "tick-complete-token|tick_complete.lua|s!local accepted = r\[1\] == token and r\[2\] == 'running' and held!local accepted = r[2] == 'running' and mine!|a completion is accepted from the holder with an older run's token|-p leasehold-redis --test ticks"
  "tick-record-ttl-half|tick_record.lua|s!v and redis\.call\('PTTL', KEYS\[2\]\) or -2!v and math.floor(redis.call('PTTL', KEYS[2]) / 2) or -2!|a job's record is read with half its run lease's time left|-p leasehold-redis --test ticks"
  "tick-rerun-held|tick_rerun.lua|s!if v then\n  return \{now, 'held'!if false then\n  return {now, 'held'!|a run is started again while its lease is still held|-p leasehold-redis --test ticks;--test tick_rerun"
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

# The test groups of the mutants selected, each once.
groups=()
for entry in "${mutants[@]}"; do
  IFS='|' read -r name _ _ _ targets <<<"$entry"
  wanted "$name" || continue
  IFS=';' read -ra parts <<<"$targets"
  for group in "${parts[@]}"; do
    known=0
    for g in "${groups[@]}"; do [ "$g" = "$group" ] && known=1; done
    [ $known -eq 1 ] || groups+=("$group")
  done
done

# The tests must pass on the scripts as they are, or a red run says
# nothing about a mutant.
echo "== baseline: the unmutated scripts"
: >target/lua-mutant-baseline.log
for group in "${groups[@]}"; do
  # shellcheck disable=SC2086 # a group is several words on purpose
  if ! cargo test $group >>target/lua-mutant-baseline.log 2>&1; then
    echo "the tests fail without a mutant: cargo test $group (see target/lua-mutant-baseline.log)" >&2
    exit 2
  fi
done

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
  # A pattern that also matches a comment edits the first match only:
  # the code must be what changed.
  if git diff -U0 -- "$scripts/$file" | grep -v '^--- a/' | grep -qE '^-[[:space:]]*--'; then
    echo "mutant $name edited a comment of $file: make its pattern match the code" >&2
    exit 2
  fi
  echo "== $name ($file): $what; running cargo test $targets"
  log="target/lua-mutant-$name.log"
  : >"$log"
  result=MISSED
  IFS=';' read -ra parts <<<"$targets"
  for group in "${parts[@]}"; do
    # shellcheck disable=SC2086 # a group is several words on purpose
    if ! cargo test $group >>"$log" 2>&1; then
      result=caught
    fi
  done
  if [ $result = caught ]; then
    if grep -q "^error\(\[E[0-9]*\]\)\?: could not compile" "$log"; then
      echo "mutant $name: the tests did not build (see $log)" >&2
      exit 2
    fi
    if grep -q "Error compiling script" "$log"; then
      echo "mutant $name: the mutated script is not valid Lua (see $log)" >&2
      exit 2
    fi
  else
    missed=1
  fi
  failing=$(grep -oE "^test [^ ]+ \.\.\. FAILED" "$log" | awk '{print $2}' | sort -u | head -5 | tr '\n' ' ' || true)
  echo "$name|$file|$what|$result|$failing" | tee -a "$out"
done
restore
exit $missed
