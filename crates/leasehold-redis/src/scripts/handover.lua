-- handover.lua: compare-and-delete, then grant the lease to a waiter of the
-- releasing process in the same script, unless a waiter elsewhere listens.
--
-- KEYS[1]  P        the lease: "<holder hex>:<fencing token>:<label>", with a PX expiry
-- KEYS[2]  P:fence  the lease's fencing counter (same hash tag, so same cluster slot)
-- ARGV[1]  holder   the releasing holder id expected in the lease, 32 lowercase hex digits
-- ARGV[2]  channel  P:released, where waiters listen for the release
-- ARGV[3]  own      how many of the channel's subscribers are the releasing
--                   process's own waiter (0 or 1)
-- ARGV[4]  count    the subscriber count command: NUMSUB, or SHARDNUMSUB on a cluster
-- ARGV[5]  publish  the publish command: PUBLISH, or SPUBLISH on a cluster
-- ARGV[6]  next     the waiter's holder id, 32 lowercase hex digits
-- ARGV[7]  ttl      the waiter's time to live, in milliseconds
-- ARGV[8]  label    the waiter's public label (may be empty)
-- ARGV[9]  minimum  the waiter's minimum hold in milliseconds, left out for
--                   none: its grant is then marked as acquire.lua (4) does
--
-- Returns 0           when the lease was not ours (nothing changed),
--         1           when it was ours and is now free, announced on the channel,
--                     or kept for its minimum hold (neither handed over nor announced),
--      or {2, token}  when it was ours and now belongs to the waiter (token: its
--                     fencing token, a decimal string).

-- 1. Read the lease; a key of another type gives its WRONGTYPE error back.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end

-- 2. Not ours (gone, or another holder's): leave it alone.
if not v or string.sub(v, 1, 33) ~= ARGV[1] .. ':' then
  return 0
end

-- 3. Under its minimum hold the lease goes to no one, here or elsewhere: it
--    is kept until the hold's end, as release.lua (3) keeps it, and the
--    waiter asks again then.
local mark = KEYS[1] .. ':held-until'
local m = redis.pcall('GETEX', mark)
if type(m) == 'table' and m.err and not string.find(m.err, 'WRONGTYPE', 1, true) then
  m = redis.pcall('GET', mark)
end
if type(m) == 'string' and string.sub(m, 1, 33) == ARGV[1] .. ':' then
  local t = redis.call('TIME')
  local left = (tonumber(string.sub(m, 34)) or 0)
    - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if left > 0 then
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', left))
    return 1
  end
end

-- 4. Does anyone else listen? A user without the right to ask (ACL) cannot
--    tell: then someone may, and the lease is only released.
local others = true
local count = redis.pcall('PUBSUB', ARGV[4], ARGV[2])
if type(count) == 'table' and not count.err and count[2] then
  others = tonumber(count[2]) > tonumber(ARGV[3])
end

-- 5. Someone else waits: release and announce, as release.lua does.
if others then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[5], ARGV[2], '1')
  return 1
end

-- 6. Only our waiter: grant it the lease (grant.lua, sent in front of this
--    script), with its own minimum hold if it asked for one. A counter that
--    is not a number is refused before the lease is touched, so the
--    releasing holder still holds it.
local token, refused = grant(KEYS[1], KEYS[2], ARGV[6], ARGV[7], ARGV[8])
if not token then
  return refused
end
if ARGV[9] then
  local t = redis.call('TIME')
  local ends = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[9])
  redis.call('SET', KEYS[1] .. ':held-until', ARGV[6] .. ':' .. string.format('%.0f', ends), 'PX', ARGV[9])
end
return {2, token}
