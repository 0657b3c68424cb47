-- tick_rerun.lua: settle a scheduled job's run seen abandoned (its lease
-- ended without a completion): record it as abandoned and, to re-run, start
-- the newest decided tick again with a new lease (the grant of grant.lua,
-- sent in front of this script).
--
-- KEYS[1]  P        the job's run lease "<holder hex>:<token>:<label>" (job:{J}:run)
-- KEYS[2]  P:fence  the run lease's fencing counter
-- KEYS[3]  R        the job's record, a hash (job:{J}:record; fields: see tick.lua)
-- ARGV[1]  abandoned the fencing token of the run seen abandoned (decimal)
-- ARGV[2]  policy   'skip' (record it only) or 'rerun'
-- ARGV[3]  keep     how long the record lives after a write, ms (at least 1)
-- ARGV[4]  holder   the new run's holder id, 32 lowercase hex digits
-- ARGV[5]  ttl      the new run lease's expiry, ms
-- ARGV[6]  label    the new run's public label (may be empty)
-- ARGV[7]  track    '0' when the connection does not track (see grant.lua)
-- ARGV[8]  retention how long the counter lives after a grant, ms (grant.lua
--                   reads it as the last argument)
--
-- Returns, the server's clock (ms) first:
--   {now, 'settled'}              no record, the abandoned token is not the
--                                 current run, or the run completed
--   {now, 'held', pttl}           the run lease is still there (held by anyone)
--   {now, 'abandoned', tick}      recorded abandoned (counted once), not re-run
--   {now, 'granted', tick, token} the newest decided tick started again
--   or a WRONGTYPE error for a key of another type, or the error of a fencing
--   counter that is not a number (then nothing is written).
--
-- Numbers go to redis.call only as strings (see grant.lua).

local lease, fence, record = KEYS[1], KEYS[2], KEYS[3]
local abandoned, keep = ARGV[1], ARGV[3]
local rerun = ARGV[2] == 'rerun'
local holder, ttl, label, track = ARGV[4], ARGV[5], ARGV[6], ARGV[7] ~= '0'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%.0f', now)

-- 1. The record's current run must still be the abandoned one, not
--    completed, and not claimed already under 'skip' (run_claimed: the
--    first claim settles it for every watcher, which then count it once).
local r = redis.pcall('HMGET', record, 'run_token', 'run_state', 'run_tick',
  'decided', 'decided_token', 'run_claimed')
if r.err then
  return redis.error_reply(r.err)
end
if r[1] ~= abandoned or r[2] == 'completed' or not r[4] or r[6] then
  return {now, 'settled'}
end

-- 2. Its lease must be gone: a key still there (anyone's) is waited for.
local v = redis.pcall('GET', lease)
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end
if v then
  return {now, 'held', redis.call('PTTL', lease)}
end

-- 3. To re-run, grant first: a counter that is not a number then leaves
--    the record as it was.
local token
if rerun then
  local refused
  token, refused = grant(lease, fence, holder, ttl, label, track)
  if not token then
    return refused
  end
end

-- 4. Abandoned, counted once: only a run still recorded as running (tick.lua
--    may have settled it already); its tick's decision too, when that is the
--    highest.
if r[2] == 'running' then
  redis.call('HSET', record, 'run_state', 'abandoned', 'run_ended', now_s)
  redis.call('HINCRBY', record, 'abandoned', '1')
  if r[5] == r[1] and tonumber(r[4]) == tonumber(r[3]) then
    redis.call('HSET', record, 'decided_state', 'abandoned', 'decided_reason', 'lease-ended')
  end
end

local function written()
  redis.call('HSET', record, 'last_seen', now_s, 'record_ttl', keep)
  redis.call('PEXPIRE', record, keep)
end

if not rerun then
  redis.call('HSET', record, 'run_claimed', '1')
  written()
  return {now, 'abandoned', r[3] or '0'}
end

-- 5. The newest decided tick (above the dead run's own when a later tick was
--    skipped while it held) runs again under the new lease.
local newest = r[4]
redis.call('HSET', record, 'decided_state', 'started', 'decided_reason', 'rerun',
  'decided_run_tick', newest, 'decided_token', token, 'decided_label', label,
  'run_tick', newest, 'run_token', token, 'run_holder', holder,
  'run_label', label, 'run_state', 'running', 'run_reason', 'rerun',
  'run_started', now_s)
redis.call('HDEL', record, 'run_ended', 'run_claimed')
redis.call('HINCRBY', record, 'reruns', '1')
written()
return {now, 'granted', newest, token}
