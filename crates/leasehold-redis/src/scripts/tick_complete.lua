-- tick_complete.lua: record a scheduled job's run as completed and release
-- its lease, in one step, fenced by the run's token.
--
-- KEYS[1]  P        the job's run lease "<holder hex>:<token>:<label>" (job:{J}:run)
-- KEYS[2]  R        the job's record, a hash (job:{J}:record; fields: see tick.lua)
-- ARGV[1]  holder   the completing holder id, 32 lowercase hex digits
-- ARGV[2]  token    the completing run's fencing token (decimal)
-- ARGV[3]  channel  P:released, where waiters listen for the release;
--                   empty where no one can listen (no notice is sent)
-- ARGV[4]  publish  the publish command: PUBLISH, or SPUBLISH on a cluster
--
-- The completion is accepted only when `token` is the record's current run,
-- still running, and the lease is still that run's and `holder`'s. Either way
-- the lease, if it is `holder`'s, is deleted (its fencing counter stays) and
-- the release announced as release.lua announces it.
--
-- Returns {now, 1}                      accepted: the run is completed
--      or {now, 0, tick, token, label}  refused, with the record's current run
--      or {now, 0}                      refused, and the record has no run
--   (now: the server's clock, UNIX ms), or a WRONGTYPE error for a key of
--   another type.
--
-- Numbers go to redis.call only as strings (see grant.lua).

local lease, record = KEYS[1], KEYS[2]
local holder, token = ARGV[1], ARGV[2]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%.0f', now)

-- 1. Read the lease and the record; a key of another type gives its WRONGTYPE
--    error back (see acquire.lua).
local v = redis.pcall('GET', lease)
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end
local r = redis.pcall('HMGET', record, 'run_token', 'run_state', 'run_tick',
  'run_label', 'decided', 'decided_token', 'record_ttl')
if r.err then
  return redis.error_reply(r.err)
end

-- 2. The holder's lease: its holder prefix, as release.lua compares it, and
--    the token in it.
local mine = v and string.sub(v, 1, 33) == holder .. ':'
local held = false
if mine then
  local rest = string.sub(v, 34)
  local colon = string.find(rest, ':', 1, true)
  held = (colon and string.sub(rest, 1, colon - 1) or rest) == token
end

-- 3. Accepted: the current run, running, its lease still the holder's. The
--    decision of its tick, when that is the highest, is completed too.
local accepted = r[1] == token and r[2] == 'running' and held
if accepted then
  redis.call('HSET', record, 'run_state', 'completed', 'run_ended', now_s, 'last_seen', now_s)
  redis.call('HINCRBY', record, 'completed', '1')
  if r[6] == token and tonumber(r[5]) == tonumber(r[3]) then
    redis.call('HSET', record, 'decided_state', 'completed', 'decided_reason', 'done')
  end
  if r[7] and tonumber(r[7]) and tonumber(r[7]) > 0 then
    redis.call('PEXPIRE', record, r[7])
  end
end

-- 4. The holder's lease is released, accepted or not, and announced.
if mine then
  redis.call('DEL', lease)
  if ARGV[3] ~= '' then
    redis.call(ARGV[4], ARGV[3], '1')
  end
end

if accepted then
  return {now, 1}
end
if r[1] then
  return {now, 0, r[3] or '0', r[1], r[4] or ''}
end
return {now, 0}
