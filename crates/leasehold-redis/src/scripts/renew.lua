-- renew.lua: compare-and-pexpire for a batch of leases.
--
-- KEYS[i]      P_i      the lease keys, one per renewal
-- ARGV[2i-1]   holder_i the holder id expected in lease i, 32 lowercase hex digits
-- ARGV[2i]     ttl_i    the new time to live of lease i, in milliseconds
--
-- Returns an array with one entry per key: 1 renewed, 0 lost.
--
-- Client tracking: a read-only command in a script makes Redis 7.0 track
-- every key the call names, for the calling connection. So the leases are
-- read with GETEX (a write command: no tracking) and the batch is tracked
-- by one PTTL at the end; a GET per lease would track the whole batch once
-- per lease. Without tracking on the connection the PTTL costs one lookup.

local out = {}
for i = 1, #KEYS do
  local holder = ARGV[2 * i - 1]
  -- 1. Read the lease; pcall turns WRONGTYPE into an error table, which
  --    counts as lost. A server without GETEX (before 6.2), or an ACL
  --    without it, gets a plain GET.
  local v = redis.pcall('GETEX', KEYS[i])
  if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
    v = redis.pcall('GET', KEYS[i])
  end
  -- 2. Still ours (the 32-digit holder id, then ':' at byte 33)? Extend it.
  --    Anything else (gone, another holder, another type) is lost. A plain
  --    find and a byte test build no Lua string per lease, unlike a
  --    concatenation and string.sub would.
  if type(v) == 'string' and #holder == 32 and string.byte(v, 33) == 58
      and string.find(v, holder, 1, true) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
-- 3. Track the batch (see above); an error here changes no outcome.
if #KEYS > 0 then
  redis.pcall('PTTL', KEYS[1])
end
return out
