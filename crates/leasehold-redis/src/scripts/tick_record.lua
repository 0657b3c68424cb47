-- tick_record.lua: read a scheduled job's record and its run lease at one
-- instant, without changing them.
--
-- KEYS[1]  R  the job's record, a hash (job:{J}:record; fields: see tick.lua)
-- KEYS[2]  P  the job's run lease "<holder hex>:<token>:<label>" (job:{J}:run)
-- (no ARGV)
--
-- Returns {now, lease, pttl, field, value, field, value, ...}: the server's
-- clock (UNIX ms), the run lease's stored value (nil when it is gone, and
-- pttl then -2) and the record's fields (none when there is no record), or a
-- WRONGTYPE error for a key of another type.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local h = redis.pcall('HGETALL', KEYS[1])
if h.err then
  return redis.error_reply(h.err)
end
local v = redis.pcall('GET', KEYS[2])
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end

local out = {now, v or false, v and redis.call('PTTL', KEYS[2]) or -2}
for i = 1, #h do
  out[#out + 1] = h[i]
end
return out
