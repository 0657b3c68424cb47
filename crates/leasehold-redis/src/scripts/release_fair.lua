-- release_fair.lua: compare-and-delete, then hand the lease to the head of its fair queue
-- in the same script, when that waiter asked for it (fair.lua's ARGV[6]).
--
-- KEYS[1]  P              the lease: "<holder hex>:<fencing token>:<label>", with a PX expiry
-- KEYS[2]  P:fence        the lease's fencing counter
-- and, named here from P as fair.lua names them (not passed in KEYS, see fair.lua):
--          P:fair         the queue, by arrival
--          P:fair-places  the places, by expiry
--          P:fair-asks    the handovers asked for: holder id ->
--                         "<call ms>:<handover ms>:<process>:<label>"
-- ARGV[1]  holder         the releasing holder id expected in the lease, 32 lowercase hex digits
-- ARGV[2]  channel        P:released; empty where no one can listen (then nothing is
--                         handed over: the head could not be told)
-- ARGV[3]  publish        the publish command: PUBLISH, or SPUBLISH on a cluster
-- ARGV[4]  retention      how long the counter lives after a grant, in milliseconds (see grant.lua)
--
-- Returns 0 when the lease was not ours (nothing changed), 1 when it was ours and is now
-- free, announced on the channel with '1', and 2 when it was ours and now belongs to the
-- queue's head, announced with "<head's holder hex>:<token>" on "<channel>:<process>",
-- the channel of the head's process alone (on the channel itself if it named none): a
-- handover is news to no other process, and each message to a subscriber costs the
-- server a write.
--
-- Why the handed-over lease is safe to use: fair.lua stored, with the head's place, the
-- server time of the head's latest call. The head's process sent that call earlier, and
-- counts its validity from when it sent it; the lease is kept until that server time plus
-- the handover ms, so it outlives the head's validity however late the release came. A
-- head that died is not kept waiting for: the lease runs out at that same time.

local queue = KEYS[1] .. ':fair'
local places, asks = queue .. '-places', queue .. '-asks'

-- 1. Read the lease; a key of another type gives its WRONGTYPE error back.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end

-- 2. Not ours (gone, or another holder's): leave it alone.
if not v or string.sub(v, 1, 33) ~= ARGV[1] .. ':' then
  return 0
end

-- 3. Ours. With no channel to announce a handover on, delete it: the fencing counter
--    (P:fence) stays, so tokens keep rising. Otherwise it is deleted below, unless the
--    grant to the head overwrites it.
if not ARGV[2] or ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end

-- 3b. No queue (no one waits): free the lease and announce it, as release.lua does,
--     without reading the queue's other keys, which live and expire with it.
if redis.call('EXISTS', queue) == 0 then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[3], ARGV[2], '1')
  return 1
end

-- 4. Drop the places that expired (as fair.lua does), then look at the head.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = string.format('%.0f', now_ms)
local expired = redis.call('ZRANGEBYSCORE', places, '-inf', now)
for i = 1, #expired do
  redis.call('ZREM', queue, expired[i])
  redis.call('HDEL', asks, expired[i])
end
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', places, '-inf', now)
end
local head = redis.call('ZRANGE', queue, 0, 0)[1]
local ask = head and redis.call('HGET', asks, head)

-- 5. A head that asked for a handover, whose lease would still outlive this moment: grant
--    it (grant.lua, sent in front of this script) for what is left of its handover time;
--    the grant's SET replaces our lease. The grant is not read back (track false): the
--    head's own renewal tracks it.
if ask then
  local first = string.find(ask, ':', 1, true)
  local second = first and string.find(ask, ':', first + 1, true)
  local third = second and string.find(ask, ':', second + 1, true)
  if third then
    local called = tonumber(string.sub(ask, 1, first - 1))
    local hold = tonumber(string.sub(ask, first + 1, second - 1))
    local process = string.sub(ask, second + 1, third - 1)
    local label = string.sub(ask, third + 1)
    local left = called and hold and (called + hold - now_ms)
    if left and left >= 1 then
      local token = grant(KEYS[1], KEYS[2], head, string.format('%.0f', left), label, false)
      if token then
        redis.call('ZREM', queue, head)
        redis.call('ZREM', places, head)
        redis.call('HDEL', asks, head)
        local channel = ARGV[2]
        if process ~= '' then
          channel = channel .. ':' .. process
        end
        redis.call(ARGV[3], channel, head .. ':' .. token)
        return 2
      end
      -- A counter that is not a number: nothing was written; the lease is freed and
      -- announced below, and the head asks for it and is told of the counter.
    end
  end
end

-- 6. No handover: free the lease and announce it, as release.lua does.
redis.call('DEL', KEYS[1])
redis.call(ARGV[3], ARGV[2], '1')
return 1
