-- inspect.lua: read a lease without changing it.
--
-- KEYS[1]  P  the lease
-- (no ARGV)
--
-- Returns {value, pttl} when the key exists (value: the stored string),
--      or {false, -2}   when it does not (false arrives as a nil reply).

-- 1. Read the lease. A key of another type gives WRONGTYPE, passed on as the reply's
--    own error (not wrapped as a script error, as Redis 6 would), so the client sees its code.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end

-- 2. Free: nothing more to read.
if not v then
  return {false, -2}
end

-- 3. Held: add its remaining time to live (-1 means no expiry: not written by leasehold).
return {v, redis.call('PTTL', KEYS[1])}
