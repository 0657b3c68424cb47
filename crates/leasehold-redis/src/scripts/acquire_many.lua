-- acquire_many.lua: acquire.lua for a batch of leases in flight together, all in
-- one slot, in one call: each is taken, refreshed or refused as acquire.lua
-- does it, in order. (A lone acquisition goes by acquire.lua itself, which
-- defines nothing: a function per call would cost it a few thousand server
-- instructions.)
--
-- A batch of n leases (acquisitions in flight together, all in one slot):
-- KEYS[2i-1], KEYS[2i]            lease i and its counter (see acquire.lua)
-- ARGV[3i-2], ARGV[3i-1], ARGV[3i] lease i's holder, ttl and label
-- ARGV[3n+1]                      track, for the whole batch
-- ARGV[3n+2]                      retention, the counters' (see grant.lua)
--
-- Returns an array of n replies, in KEYS order, each as acquire.lua answers for one
-- lease (the token, or {0, value, pttl}), except that an error (another type, a counter
-- that is not a number) is the entry {-1, message}, so that one bad key fails only its
-- own acquisition: an error inside an array would fail the whole reply in clients that
-- check nested errors.
--
-- The leases are taken in order: the same key twice in a batch (two holders of one
-- process) goes to the first, and the second sees it held, as two calls would.

local n = #KEYS / 2
local track = ARGV[3 * n + 1] ~= '0'

-- Client tracking in a batch: Redis 7.0 tracks every key a script call names
-- on every read-only command the script runs (Redis 7.2 and Valkey: the keys
-- that command names), so a GET or PTTL per lease would cost a batch of n
-- leases n tracking entries per lease. A batch over a tracking connection
-- therefore reads the leases and counters with GETEX (a write command, which
-- tracks nothing; GET where the server has no GETEX), skips the read after
-- each grant, reads every lease once at the end with one EXISTS (which
-- tracks the batch), and writes the granted counters only after it, which
-- leaves the counters untracked on Redis 7.0 (see grant.lua). A refused
-- acquisition's PTTL still tracks the whole call's keys, as a lone one's
-- tracks its two.
local quiet = track
local read = 'GET'
if quiet then
  read = 'GETEX'
  local probe = redis.pcall('GETEX', KEYS[1])
  if type(probe) == 'table' and probe.err and not string.find(probe.err, 'WRONGTYPE', 1, true) then
    read = 'GET'
  end
end
local granted = {}
-- The clock floor (grant.lua), read once, at the batch's first grant: one
-- TIME for the batch instead of one per lease. Each lease's token is still
-- above its own counter, so tokens keep rising per key.
local floor

local function acquire(lease, fence, holder, ttl, label)
  local mine = holder .. ':'

  -- 1. Read the lease. A key of another type gives WRONGTYPE, passed on as the reply's
  --    own error (not wrapped as a script error, as Redis 6 would), so the client sees its code.
  local current = redis.pcall(read, lease)
  if type(current) == 'table' and current.err then
    return redis.error_reply(current.err)
  end

  if current then
    if string.sub(current, 1, 33) == mine then
      -- 2a. Ours already (idempotent re-acquire): keep the token, take the new label and ttl.
      local rest = string.sub(current, 34)
      local colon = string.find(rest, ':', 1, true)
      local token = colon and string.sub(rest, 1, colon - 1) or rest
      redis.call('SET', lease, mine .. token .. ':' .. label, 'PX', ttl)
      -- The SET dropped the lease's client tracking; read it to track it again
      -- (see grant.lua).
      if track and not quiet then
        redis.pcall('PTTL', lease)
      end
      return token
    end
    -- 2b. Someone else's: report their public value and how long it still lives.
    --     (On a tracking connection this tracks their lease too: the holder's
    --     next write reports it, and the backend, holding no lease there, has
    --     nothing to do.)
    return {0, current, redis.call('PTTL', lease)}
  end

  -- 3. Free: grant it (grant.lua, sent in front of this script).
  -- On a tracking connection the counter is written once, at the end
  -- (below), not also here: a key is granted at most once per batch (the
  -- same key twice goes to the first), so no later grant in the batch
  -- reads a counter this one should have written.
  if not floor then
    local t = redis.call('TIME')
    floor = t[1] .. string.sub('00000' .. t[2], -6)
  end
  local token, refused = grant(lease, fence, holder, ttl, label, track and not quiet, read, floor, quiet)
  if not token then
    return refused
  end
  if quiet then
    granted[#granted + 1] = fence
    granted[#granted + 1] = token
  end
  return token
end

local replies = {}
for i = 1, n do
  local reply = acquire(KEYS[2 * i - 1], KEYS[2 * i], ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i])
  if type(reply) == 'table' and reply.err then
    -- An error inside an array would fail the whole reply in clients that
    -- check nested errors: sent as {-1, message} instead.
    reply = {-1, reply.err}
  end
  replies[i] = reply
end
if quiet then
  -- Track the batch's leases with one read, then write the counters.
  local leases = {}
  for i = 1, n do
    leases[i] = KEYS[2 * i - 1]
  end
  redis.pcall('EXISTS', unpack(leases))
  for i = 1, #granted, 2 do
    redis.call('SET', granted[i], granted[i + 1], 'PX', retention)
  end
end
return replies
