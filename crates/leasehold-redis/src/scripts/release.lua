-- release.lua: compare-and-delete.
--
-- One lease (the usual call):
-- KEYS[1]  P        the lease
-- ARGV[1]  holder   the holder id expected in it, 32 lowercase hex digits
-- ARGV[2]  channel  P:released, where waiters listen for the release;
--                   empty where no one can listen (no notice is sent)
-- ARGV[3]  publish  the publish command: PUBLISH, or SPUBLISH on a cluster
--                   (the channel carries the lease's hash tag, so it is in its
--                   slot); PUBLISH when left out, as callers of the two-argument
--                   form expect
-- ARGV[4]  own      how many of the channel's subscribers are the releasing
--                   process's own connection (0 or 1; 0 when left out)
--
-- A batch of n leases (releases in flight together, all in one slot):
-- KEYS[i]                  lease i
-- ARGV[4i-3] .. ARGV[4i]   lease i's holder, channel, publish and own, as above
-- ARGV[4n+1]               '1' when the connection tracks: the leases are then
--                          read with GETEX (see acquire.lua: a GET per lease
--                          would track the whole batch once per lease on Redis 7.0)
--
-- Returns, per lease, 0 when the lease was not ours, 1 when it was ours and
-- is now deleted, and 2 when, besides, the notice reached a subscriber other
-- than the releasing process's own: a waiter elsewhere heard it; or an error
-- when the key has another type. One lease gets its reply bare (an error as
-- the call's own error reply); a batch gets an array of n replies, in KEYS
-- order, an error as {-1, message}.

local n = #KEYS
local read = 'GET'
if n > 1 and ARGV[4 * n + 1] == '1' then
  read = 'GETEX'
  local probe = redis.pcall('GETEX', KEYS[1])
  if type(probe) == 'table' and probe.err and not string.find(probe.err, 'WRONGTYPE', 1, true) then
    read = 'GET'
  end
end

local function release(lease, holder, channel, publish, own)
  -- 1. Read the lease. A key of another type gives WRONGTYPE, passed on as the reply's
  --    own error (not wrapped as a script error, as Redis 6 would), so the client sees its code.
  local v = redis.pcall(read, lease)
  if type(v) == 'table' and v.err then
    return redis.error_reply(v.err)
  end

  -- 2. Not ours (gone, or another holder's): leave it alone.
  if not v or string.sub(v, 1, 33) ~= holder .. ':' then
    return 0
  end

  -- 3. Ours: delete it. The fencing counter (P:fence) stays, so tokens keep rising.
  redis.call('DEL', lease)

  -- 4. Tell waiters at once, so they need not poll, and say whether one
  --    elsewhere heard (the releasing process then lets it go first).
  if channel and channel ~= '' then
    local heard = redis.call(publish or 'PUBLISH', channel, '1')
    if heard > (tonumber(own) or 0) then
      return 2
    end
  end

  return 1
end

if n == 1 then
  return release(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
end
local replies = {}
for i = 1, n do
  local reply = release(KEYS[i], ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i])
  if type(reply) == 'table' and reply.err then
    -- An error inside an array would fail the whole reply in clients that
    -- check nested errors: sent as {-1, message} instead.
    reply = {-1, reply.err}
  end
  replies[i] = reply
end
return replies
