-- grant.lua: the grant that acquire.lua and handover.lua end with. Scripts
-- cannot call one another, so both are sent with this text in front.
--
-- grant(lease, fence, holder, ttl, label) gives the free lease `lease` to
-- `holder` (32 lowercase hex digits) for `ttl` milliseconds, with its public
-- `label`, and advances its fencing counter `fence`. It returns the fencing
-- token (a decimal string), or nil and an error reply when the counter is
-- not a number (then nothing is written).
--
-- Numbers go to redis.call only through string.format('%.0f', n): Redis may
-- render a large Lua number in exponent form.

local function grant(lease, fence, holder, ttl, label)
  -- 1. A floor from the server clock, in microseconds (< 2^53, so exact),
  --    so tokens keep rising even if a restart lost the counter.
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])

  -- 2. The token is one past the counter, lifted to the floor, and the counter
  --    keeps it. Tokens follow the clock, so the floor is nearly always the
  --    higher: store it and read the old counter in one step (SET ... GET; a
  --    counter of another type fails it with WRONGTYPE and nothing is
  --    written), and only when the counter was ahead (a clock that stepped
  --    back, or two grants within one microsecond) store one past the counter.
  local n = floor
  local before = redis.call('SET', fence, string.format('%.0f', floor), 'GET')
  if before then
    local c = tonumber(before)
    if not c then
      -- Not a number: put it back untouched and refuse, as INCR would.
      redis.call('SET', fence, before)
      return nil, redis.error_reply('ERR the fencing counter is not an integer')
    end
    if c >= floor then
      n = c + 1
      redis.call('SET', fence, string.format('%.0f', n))
    end
  end
  local token = string.format('%.0f', n)

  -- 3. Store the lease with its expiry.
  redis.call('SET', lease, holder .. ':' .. token .. ':' .. label, 'PX', ttl)
  return token
end

