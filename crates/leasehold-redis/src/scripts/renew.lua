-- renew.lua: compare-and-pexpire for a batch of leases.
--
-- KEYS[i]      P_i      the lease keys, one per renewal
-- ARGV[2i-1]   holder_i the holder id expected in lease i, 32 lowercase hex digits
-- ARGV[2i]     ttl_i    the new time to live of lease i, in milliseconds
--
-- Returns an array with one entry per key: 1 renewed, 0 lost.

local out = {}
for i = 1, #KEYS do
  local mine = ARGV[2 * i - 1] .. ':'
  -- 1. Read the lease; pcall turns WRONGTYPE into an error table, which counts as lost.
  local v = redis.pcall('GET', KEYS[i])
  -- 2. Still ours? Extend it. Anything else (gone, another holder, another type) is lost.
  if type(v) == 'string' and string.sub(v, 1, 33) == mine then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
