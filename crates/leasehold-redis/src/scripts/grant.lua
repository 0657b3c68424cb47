-- grant.lua: the grant that acquire.lua and handover.lua end with. Scripts
-- cannot call one another, so both are sent with this text in front.
--
-- grant(lease, fence, holder, ttl, label, track) gives the free lease
-- `lease` to `holder` (32 lowercase hex digits) for `ttl` milliseconds, with
-- its public `label`, and advances its fencing counter `fence`. `track` false
-- says the connection does not track (the read below is then skipped); left
-- out, the lease is read as on a tracking connection. It returns the fencing
-- token (a decimal string), or nil and an error reply when the counter is
-- not a number (then nothing is written).
--
-- Client tracking: on a connection that tracks (CLIENT TRACKING ON NOLOOP,
-- see renew.lua), the grant leaves the new lease tracked and its counter
-- not. A read-only command in a script makes Redis 7.0 track every key the
-- script call names (Redis 7.2 and Valkey: the keys the command names),
-- and any write to a key drops its tracking, for every client and NOLOOP
-- or not. So the lease is read (PTTL) after it is written, which tracks the
-- lease (and on Redis 7.0 the counter), and the counter is written last,
-- which drops the counter's: a counter never expires, and
-- tracked it would keep an entry in the server's tracking table after the
-- lease is gone. On a connection that does not track, the read would only
-- cost the server a lookup, so the caller can skip it.
--
-- Numbers go to redis.call only through string.format('%.0f', n): Redis may
-- render a large Lua number in exponent form.

local function grant(lease, fence, holder, ttl, label, track)
  -- 1. A floor from the server clock, in microseconds (< 2^53, so exact),
  --    so tokens keep rising even if a restart lost the counter.
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])

  -- 2. The token is one past the counter, lifted to the floor. A counter of
  --    another type fails the GET with WRONGTYPE; one that is not a number
  --    is refused, as INCR would: nothing is written either way.
  local n = floor
  local before = redis.call('GET', fence)
  if before then
    local c = tonumber(before)
    if not c then
      return nil, redis.error_reply('ERR the fencing counter is not an integer')
    end
    if c >= floor then
      -- The counter is ahead: a clock that stepped back, or two grants
      -- within one microsecond.
      n = c + 1
    end
  end
  local token = string.format('%.0f', n)

  -- 3. Store the lease with its expiry, and track it (see above).
  redis.call('SET', lease, holder .. ':' .. token .. ':' .. label, 'PX', ttl)
  if track ~= false then
    redis.pcall('PTTL', lease)
  end

  -- 4. The counter keeps the token; written last, so that it is not tracked.
  redis.call('SET', fence, token)
  return token
end
