-- fence_read.lua: read a fenced resource without changing it: its value, its
-- fence and its time to live, at one instant.
--
-- KEYS[1]  F  the resource, a hash {lease, token[, value]} (see fenced_write.lua)
-- (no ARGV)
--
-- Returns {lease, token, value, pttl} when the resource exists (value false,
--   a nil reply, for a resource sealed but never written; pttl -1 for no
--   expiry), or {} when it does not, or a WRONGTYPE error for a key of another
--   type.

-- 1. Read the hash. A key of another type gives WRONGTYPE, passed on as the
--    reply's own error (see fenced_write.lua).
local f = redis.pcall('HMGET', KEYS[1], 'lease', 'token', 'value')
if f.err then
  return redis.error_reply(f.err)
end

-- 2. No fence: nothing was ever written here, or it expired or was deleted.
if not f[2] then
  return {}
end

-- 3. The fence, the value and the time left.
return {f[1] or '', f[2], f[3], redis.call('PTTL', KEYS[1])}
