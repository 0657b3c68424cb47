-- hold.lua: the minimum hold (ShedLock's lockAtLeastFor), sent in front of
-- the scripts that grant or release an exclusive lease (acquire.lua,
-- handover.lua, release.lua, release_many.lua). Scripts cannot call one
-- another, so each is sent with this text in front.
--
-- A lease granted with a minimum hold has a mark beside it, `P:held-until`
-- = "<holder hex>:<end>", where <end> is the server's clock (TIME) at the
-- grant plus the minimum, in milliseconds, and the mark itself expires then
-- (PX minimum): nothing is left to clean up. A release by the holder before
-- <end> sets the lease's expiry to <end> instead of deleting it, so the key
-- stays taken, still the holder's, until the minimum has run out by the
-- server's clock; no client clock is read. Nothing is announced then: the
-- key is not free, and waiters were told its time left when refused.
--
-- The mark's name is built here from the lease's, not passed in KEYS: it
-- has the lease's hash tag, so it is in the lease's slot (a script may
-- touch any key of its own slot), and a key the call does not name is not
-- tracked by Redis 7.0's rule that a read-only command in a script tracks
-- every key the call names (see grant.lua). It is read with GETEX, a write
-- command, which no version tracks either: a release of a lease without a
-- minimum, the usual one, leaves no entry for a missing mark in the
-- server's tracking table.
--
-- Numbers go to redis.call as strings built here (string.format('%.0f')):
-- milliseconds since 1970 are near 2^41, exact in a Lua number.

-- The server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Marks `lease`, just granted to `holder`, as held for at least `minimum`
-- milliseconds (a decimal string) from now.
local function hold(lease, holder, minimum)
  local ends = string.format('%.0f', now_ms() + tonumber(minimum))
  redis.call('SET', lease .. ':held-until', holder .. ':' .. ends, 'PX', minimum)
end

-- Called by a release once `lease` is known to be `holder`'s: when its mark
-- is `holder`'s and has not run out, sets the lease's expiry to the mark's
-- end and returns true (the caller neither deletes nor announces). Else
-- false: the caller frees the lease as without a minimum.
local function kept(lease, holder)
  local mark = lease .. ':held-until'
  local m = redis.pcall('GETEX', mark)
  if type(m) == 'table' and m.err then
    -- Another type at the mark's name is no mark. A server older than 6.2
    -- has no GETEX (nor the tracking rule it avoids): read it with GET.
    if string.find(m.err, 'WRONGTYPE', 1, true) then
      return false
    end
    m = redis.pcall('GET', mark)
    if type(m) ~= 'string' then
      return false
    end
  end
  if not m or string.sub(m, 1, 33) ~= holder .. ':' then
    return false
  end
  local ends = tonumber(string.sub(m, 34))
  if not ends then
    return false
  end
  local left = ends - now_ms()
  if left <= 0 then
    return false
  end
  redis.call('PEXPIRE', lease, string.format('%.0f', left))
  return true
end
