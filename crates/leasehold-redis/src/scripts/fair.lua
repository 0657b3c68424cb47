-- fair.lua: take a place in a lease's fair queue, and the lease when it is free and ours is first.
--
-- KEYS[1]  P              the lease: "<holder hex>:<fencing token>:<label>", with a PX expiry
-- KEYS[2]  P:fence        the lease's fencing counter
-- and, named here from P rather than passed in KEYS (see below):
--          P:fair         the queue: a sorted set of holder ids scored by arrival (server
--                         time in microseconds), so ZRANK is the number of places ahead
--          P:fair-places  the same holder ids scored by when their place expires (server
--                         time in milliseconds)
--          P:fair-asks    a hash: holder id -> "<call ms>:<handover ms>:<process>:<label>"
--                         for the places that asked for a handover (see release_fair.lua):
--                         when the server last saw the waiter's call, how long from then a
--                         lease handed to it is kept, and where its process hears of it
-- ARGV[1]  holder         the holder id, 32 lowercase hex digits
-- ARGV[2]  ttl            the lease's time to live, in milliseconds
-- ARGV[3]  label          a public label shown to others (may be empty)
-- ARGV[4]  track          '0' when the connection does not track (see acquire.lua)
-- ARGV[5]  place_ttl      how long the caller's place lives unless refreshed, in milliseconds
-- ARGV[6]  handover       how long a lease handed to this waiter by a release is kept, in
--                         milliseconds from this call (lock-delay included); '0' or left
--                         out: no handover, the waiter asks for the lease itself
-- ARGV[7]  process        the waiting process's name (hex digits): a handover is announced
--                         on "<P:released>:<process>", which only that process hears;
--                         empty, on P:released itself
-- ARGV[8]  retention      how long the counter lives after a grant, in milliseconds (see grant.lua)
--
-- All keys share the hash tag of P, so they sit in one cluster slot. The queue's keys are
-- built from P here, as acquire.lua builds its mark's: Redis 7.0 tracks every key a call
-- names on each read-only command, so naming them would put three more keys in the
-- tracking table on every grant and its reads (see grant.lua). The queue keys expire
-- with the last place in them, so a queue whose waiters all vanished leaves nothing behind.
--
-- Returns {1, token, queued}            when the lease is ours (`queued` places are left)
--      or {0, value, pttl, ahead, queued} when someone holds it: their stored value and PTTL,
--                                       and our place (`ahead` places before it)
--      or {2, ahead, queued}            when it is free but another place is first
--
-- Numbers go to redis.call only as strings (see grant.lua).

local holder, ttl, label, place_ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[5])
local track = ARGV[4] ~= '0'
local mine = holder .. ':'
local queue = KEYS[1] .. ':fair'
local places, asks = queue .. '-places', queue .. '-asks'

-- 1. Read the lease (a key of another type: its WRONGTYPE, as acquire.lua).
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' and current.err then
  return redis.error_reply(current.err)
end
if current and string.sub(current, 1, 33) == mine then
  -- 1a. Ours already (a grant whose reply was lost): refresh it, as acquire.lua 2a, and
  --     keep no place (the grant left it).
  local rest = string.sub(current, 34)
  local colon = string.find(rest, ':', 1, true)
  local token = colon and string.sub(rest, 1, colon - 1) or rest
  redis.call('SET', KEYS[1], mine .. token .. ':' .. label, 'PX', ttl)
  if track then
    redis.pcall('PTTL', KEYS[1])
  end
  redis.call('ZREM', queue, holder)
  redis.call('ZREM', places, holder)
  redis.call('HDEL', asks, holder)
  return {1, token, redis.call('ZCARD', queue)}
end

-- 1b. Free, and no queue at all (no one waits, or every place expired with the queue
--     keys): grant it at once, as acquire.lua does, without taking a place to leave
--     again. Arrival order holds: a place anyone holds keeps the queue key alive (4).
if not current and redis.call('EXISTS', queue) == 0 then
  local token, refused = grant(KEYS[1], KEYS[2], holder, ttl, label, track)
  if not token then
    return refused
  end
  return {1, token, 0}
end

-- 2. Drop the places that expired: their waiters stopped refreshing (they died, or
--    were cut off), and must not hold up the ones behind them.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', places, '-inf', string.format('%.0f', now_ms))
for i = 1, #expired do
  redis.call('ZREM', queue, expired[i])
  redis.call('HDEL', asks, expired[i])
end
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', places, '-inf', string.format('%.0f', now_ms))
end

-- 3. Take a place at the tail (arrival = server time, in microseconds: below 2^53), or
--    keep ours; either way it lives another place_ttl from now.
redis.call('ZADD', queue, 'NX', t[1] .. string.sub('00000' .. t[2], -6), holder)
local until_ms = string.format('%.0f', now_ms + place_ttl)
redis.call('ZADD', places, until_ms, holder)
if ARGV[6] and ARGV[6] ~= '0' then
  local ask = string.format('%.0f', now_ms) .. ':' .. ARGV[6] .. ':' .. (ARGV[7] or '')
  redis.call('HSET', asks, holder, ask .. ':' .. label)
else
  redis.call('HDEL', asks, holder)
end
local ahead = redis.call('ZRANK', queue, holder)
local queued = redis.call('ZCARD', queue)

-- 4. The queue keys live as long as the longest-lived place in them.
local function keep_queue()
  local last = redis.call('ZRANGE', places, -1, -1, 'WITHSCORES')
  if last[2] then
    local left = string.format('%.0f', math.max(1, tonumber(last[2]) - now_ms))
    redis.call('PEXPIRE', queue, left)
    redis.call('PEXPIRE', places, left)
    redis.call('PEXPIRE', asks, left)
  end
end

-- 5. Held, or free with another place first: keep our place and say where it is.
if current then
  keep_queue()
  return {0, current, redis.call('PTTL', KEYS[1]), ahead, queued}
end
if ahead > 0 then
  keep_queue()
  return {2, ahead, queued}
end

-- 6. Free and ours is first: leave the place, then grant the lease (grant.lua, sent in
--    front of this script), last, so that its counter is written after every read (see
--    grant.lua). A grant refused (a counter that is not a number) is the reply; the
--    place is gone then, and the caller, told of a counter it cannot fix, stops waiting.
local token, refused
redis.call('ZREM', queue, holder)
redis.call('ZREM', places, holder)
redis.call('HDEL', asks, holder)
keep_queue()
token, refused = grant(KEYS[1], KEYS[2], holder, ttl, label, track)
if not token then
  return refused
end
return {1, token, queued - 1}
