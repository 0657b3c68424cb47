-- release_many.lua: release.lua for a batch of leases in flight together, all in
-- one slot, in one call: each is released (and its notice published) as
-- release.lua does it, in order, for leases acquired without a minimum hold. (A
-- lone release, and every release of a lease with a minimum hold, goes by
-- release.lua itself.)
--
-- A batch of n leases (releases in flight together, all in one slot):
-- KEYS[i]                  lease i
-- ARGV[4i-3] .. ARGV[4i]   lease i's holder, channel, publish and own (see release.lua)
-- ARGV[4n+1]               '1' when the connection tracks: the leases are then
--                          read with GETEX (see acquire_many.lua: a GET per lease
--                          would track the whole batch once per lease on Redis 7.0)
--
-- Returns an array of n replies, in KEYS order, each as release.lua answers for one
-- lease (0, 1 or 2), except that an error (another type) is the entry {-1, message}.

local n = #KEYS
local read = 'GET'
if ARGV[4 * n + 1] == '1' then
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

  -- 3. Ours. No minimum hold's mark is read here: a lease acquired with a
  --    minimum is released alone, by release.lua (see holds.rs).

  -- 4. Delete it. The fencing counter (P:fence) stays, so tokens keep rising.
  redis.call('DEL', lease)

  -- 5. Tell waiters at once, so they need not poll, and say whether one
  --    elsewhere heard (the releasing process then lets it go first).
  if channel and channel ~= '' then
    local heard = redis.call(publish or 'PUBLISH', channel, '1')
    if heard > (tonumber(own) or 0) then
      return 2
    end
  end

  return 1
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
