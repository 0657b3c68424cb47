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
-- which drops the counter's: a counter outlives its lease (see below), and
-- tracked it would keep an entry in the server's tracking table after the
-- lease is gone. On a connection that does not track, the read would only
-- cost the server a lookup, so the caller can skip it.
--
-- The counter's retention: every script that sends this text in front of
-- it passes, as its LAST argument, how long a fencing counter lives after
-- the latest grant that wrote it, in milliseconds (`retention` below), so
-- that a service that locks per entity does not leave one counter per key
-- ever used in the server for good. Tokens keep rising when a counter has
-- expired: the token is never below the server clock's floor (1. below),
-- and a counter expires only once the server clock has passed its write by
-- the retention, so the floor is then above every token the counter gave
-- unless the clock has since stepped back by more than the retention.
--
-- `read`, when given, is the command that reads the counter in place of GET:
-- a batch on a tracking connection passes a write command (GETEX), since on
-- Redis 7.0 every read-only command in a script tracks every key of the
-- call, which for a batch of n leases costs n entries per read.
--
-- `floor`, when given, is the clock floor (see 1. below) already read by the
-- caller: a batch reads the clock once for all its grants. `deferred` true
-- leaves the counter unwritten: the caller writes it, with the same
-- retention (a batch on a tracking connection writes its counters once, at
-- its end).
--
-- Numbers go to redis.call only as strings built here (string.format('%.0f',
-- n) where arithmetic is needed): Redis may render a large Lua number in
-- exponent form.

local retention = ARGV[#ARGV]

local function grant(lease, fence, holder, ttl, label, track, read, floor, deferred)
  -- 1. A floor from the server clock, in microseconds, so tokens keep
  --    rising even if a restart lost the counter: TIME's seconds, then its
  --    microseconds padded to six digits. Built as a string, it costs no
  --    parse of TIME's reply and no formatting of a 16-digit number.
  --    (No helper function for this: a lone acquisition's script defines
  --    every function of this file on each call, at a cost.)
  if not floor then
    local t = redis.call('TIME')
    floor = t[1] .. string.sub('00000' .. t[2], -6)
  end

  -- 2. The token is one past the counter, lifted to the floor. A counter of
  --    another type fails the GET with WRONGTYPE; one that is not a number
  --    is refused, as INCR would: nothing is written either way.
  local token = floor
  local before = redis.call(read or 'GET', fence)
  -- A counter of plain digits (no sign, no leading zero: as this script
  --   writes it) and fewer of them, or as many and smaller in text order, is
  --   below the floor: the floor is the token, no number read. Anything
  --   else is read as a number and compared (< 2^53, so exact).
  if before and not (string.find(before, '^[1-9]%d*$')
      and (#before < #floor or (#before == #floor and before < floor))) then
    local c = tonumber(before)
    if not c then
      return nil, redis.error_reply('ERR the fencing counter is not an integer')
    end
    if c >= tonumber(floor) then
      -- The counter is ahead: a clock that stepped back, or two grants
      -- within one microsecond.
      token = string.format('%.0f', c + 1)
    end
  end

  -- 3. Store the lease with its expiry, and track it (see above).
  redis.call('SET', lease, holder .. ':' .. token .. ':' .. label, 'PX', ttl)
  if track ~= false then
    redis.pcall('PTTL', lease)
  end

  -- 4. The counter keeps the token for the retention; written last, so
  --    that it is not tracked.
  if not deferred then
    redis.call('SET', fence, token, 'PX', retention)
  end
  return token
end
