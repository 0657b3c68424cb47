-- tick.lua: decide one tick of a scheduled job on the server's clock, and
-- start its run (the grant of grant.lua, sent in front of this script) when
-- it is due, on time, and nobody runs the job.
--
-- KEYS[1]  P        the job's run lease "<holder hex>:<token>:<label>" (job:{J}:run)
-- KEYS[2]  P:fence  the run lease's fencing counter
-- KEYS[3]  R        the job's record, a hash (job:{J}:record; same hash tag,
--                   so the same cluster slot)
-- ARGV[1]  fingerprint  the schedule's fingerprint (text and time zone)
-- ARGV[2]  tick     the tick asked for, UNIX ms (decimal)
-- ARGV[3]  next     the schedule's next tick after it, UNIX ms (above tick)
-- ARGV[4]  deadline how long after the tick it may still start, ms
-- ARGV[5]  catch-up 'latest' or 'none'
-- ARGV[6]  keep     how long the record lives after a write, ms (at least 1)
-- ARGV[7]  holder   the run's holder id, 32 lowercase hex digits
-- ARGV[8]  ttl      the run lease's expiry, ms
-- ARGV[9]  label    the run's public label (may be empty)
-- ARGV[10] track    '0' when the connection does not track (see grant.lua)
-- ARGV[11] retention how long the counter lives after a grant, ms (grant.lua
--                   reads it as the last argument)
--
-- The record's fields (every one a string; numbers in decimal, times in
-- UNIX ms on the server's clock):
--   fingerprint       the schedule's fingerprint
--   record_ttl        the record's expiry as last asked for (ms), which
--                     tick_complete.lua sets again on its write
--   last_seen         the server's clock at the last write
--   decided           the highest tick decided
--   decided_state     started, completed, missed, skipped or abandoned
--   decided_reason    on-time, catch-up, rerun, late, overlap, lease-ended or done
--   decided_run_tick, decided_token, decided_label
--                     the run the decision concerns (the run started for it,
--                     or for a skipped tick the run that held); absent for none
--   run_tick, run_token, run_holder, run_label
--                     the last run: its tick, fencing token, holder id, label
--   run_state         running, completed or abandoned
--   run_reason        why it started: on-time, catch-up or rerun
--   run_started, run_ended
--                     when it started, and ended (absent while running)
--   started, completed, missed, skipped, abandoned, reruns
--                     the counts, over the record's life
--
-- Returns, the server's clock (ms) first:
--   {now, 'due', wait}          the tick is ahead by wait ms, at most one period
--   {now, 'ahead', ahead}       ahead by more than one period: nothing written
--   {now, 'conflict', fingerprint}   another schedule's record: nothing written
--   {now, 'decided', tick, state, reason, run tick, run token, run label}
--                               the highest decision (run fields '' for none)
--   {now, 'missed'}             recorded as missed
--   {now, 'overlap', run tick, run token, run label}
--                               the run lease is held: recorded as skipped
--                               (run tick '0' when the holder is no run the
--                               record knows)
--   {now, 'granted', token, reason}  the run's lease is granted and recorded
--   or the error of a record or lease key of another type (WRONGTYPE), or of
--   a fencing counter that is not a number (then only step 3 was written).
--
-- Numbers go to redis.call only as strings (see grant.lua).

local lease, fence, record = KEYS[1], KEYS[2], KEYS[3]
local fingerprint, tick_s = ARGV[1], ARGV[2]
local tick, nxt, deadline = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local latest, keep = ARGV[5] == 'latest', ARGV[6]
local holder, ttl, label, track = ARGV[7], ARGV[8], ARGV[9], ARGV[10] ~= '0'

-- The server's clock, in ms: the only clock that decides.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%.0f', now)

-- 1. Read the record. A key of another type gives WRONGTYPE, passed on as the
--    reply's own error (see acquire.lua).
local r = redis.pcall('HMGET', record, 'fingerprint', 'decided', 'decided_state',
  'decided_reason', 'decided_run_tick', 'decided_token', 'decided_label',
  'run_tick', 'run_token', 'run_label', 'run_state')
if r.err then
  return redis.error_reply(r.err)
end
local exists = r[2] ~= false
if exists and r[1] ~= fingerprint then
  return {now, 'conflict', r[1] or ''}
end

-- 2. Still ahead of the server's clock: due in, or a clock ahead by more
--    than one period. Nothing written.
if tick > now then
  local wait = tick - now
  if wait > nxt - tick then
    return {now, 'ahead', wait}
  end
  return {now, 'due', wait}
end

-- Every write ends here: the schedule's fingerprint, the time, the expiry.
local function written()
  redis.call('HSET', record, 'fingerprint', fingerprint, 'last_seen', now_s, 'record_ttl', keep)
  redis.call('PEXPIRE', record, keep)
end

-- The run lease, and whose it is: the token of "<holder>:<token>:<label>".
local v = redis.pcall('GET', lease)
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end
local v_token, v_label = '', ''
if v then
  local rest = string.sub(v, 34)
  local colon = string.find(rest, ':', 1, true)
  v_token = colon and string.sub(rest, 1, colon - 1) or rest
  v_label = colon and string.sub(rest, colon + 1) or ''
end

-- 3. A run recorded as running whose lease is gone (expired, or the key now
--    holds another token) is abandoned, and so is its tick's decision when
--    that is the highest.
local wrote = false
if exists and r[11] == 'running' and (not v or v_token ~= r[9]) then
  redis.call('HSET', record, 'run_state', 'abandoned', 'run_ended', now_s)
  redis.call('HINCRBY', record, 'abandoned', '1')
  r[11] = 'abandoned'
  if r[6] == r[9] and tonumber(r[2]) == tonumber(r[8]) then
    redis.call('HSET', record, 'decided_state', 'abandoned', 'decided_reason', 'lease-ended')
    r[3], r[4] = 'abandoned', 'lease-ended'
  end
  wrote = true
end

-- 4. At or below the highest decided tick: that decision.
if exists and tick <= tonumber(r[2]) then
  if wrote then
    written()
  end
  return {now, 'decided', r[2], r[3] or '', r[4] or '', r[5] or '', r[6] or '', r[7] or ''}
end

-- 5. Late (at or after the earlier of the next tick and tick + deadline):
--    missed, unless it is still the newest tick under catch-up 'latest'.
local reason = 'on-time'
if now >= math.min(nxt, tick + deadline) then
  if latest and now < nxt then
    reason = 'catch-up'
  else
    redis.call('HSET', record, 'decided', tick_s, 'decided_state', 'missed', 'decided_reason', 'late')
    redis.call('HDEL', record, 'decided_run_tick', 'decided_token', 'decided_label')
    redis.call('HINCRBY', record, 'missed', '1')
    written()
    return {now, 'missed'}
  end
end

-- 6. The run lease held, by anyone: the tick is skipped for overlap. The
--    run that holds is the record's when the token is its run's.
if v then
  local run_tick = '0'
  if exists and v_token == r[9] and r[8] then
    run_tick = r[8]
  end
  if not string.find(v_token, '^%d+$') then
    v_token = '0'
  end
  redis.call('HSET', record, 'decided', tick_s, 'decided_state', 'skipped',
    'decided_reason', 'overlap', 'decided_run_tick', run_tick,
    'decided_token', v_token, 'decided_label', v_label)
  redis.call('HINCRBY', record, 'skipped', '1')
  written()
  return {now, 'overlap', run_tick, v_token, v_label}
end

-- 7. Start it: grant the run's lease as acquire.lua does (grant.lua), then
--    record the start; the record is written after the lease, so that on a
--    tracking connection the record is not left tracked.
local token, refused = grant(lease, fence, holder, ttl, label, track)
if not token then
  if wrote then
    written()
  end
  return refused
end
redis.call('HSET', record, 'decided', tick_s, 'decided_state', 'started',
  'decided_reason', reason, 'decided_run_tick', tick_s, 'decided_token', token,
  'decided_label', label, 'run_tick', tick_s, 'run_token', token,
  'run_holder', holder, 'run_label', label, 'run_state', 'running',
  'run_reason', reason, 'run_started', now_s)
redis.call('HDEL', record, 'run_ended', 'run_claimed')
redis.call('HINCRBY', record, 'started', '1')
written()
return {now, 'granted', token, reason}
