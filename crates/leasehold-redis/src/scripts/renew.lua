-- renew.lua: compare-and-pexpire for a batch of leases.
--
-- KEYS[i]       P_i       the lease keys, one per renewal (n of them)
-- ARGV[1]       ttl       the new time to live of every lease, in milliseconds;
--                         empty when the batch's leases differ (then see ARGV[1+n+i])
-- ARGV[1+i]     holder_i  the holder id expected in lease i, 32 lowercase hex
--                         digits, followed by ':' (as the lease's value starts)
-- ARGV[1+n+i]   ttl_i     lease i's new time to live, only when ARGV[1] is empty
-- ARGV[last-1]  readers   '1' when a key of the batch may be a reader's (ends
--                         with ':read:' and 32 more bytes, see 2a.), else '0':
--                         no key is looked at for it
-- ARGV[last]    track     '0' when the connection does not track, so the batch
--                         is not read again (step 3); anything else reads it
--
-- Returns the positions (from 1, ascending) of the leases lost; every other
-- lease was renewed. A batch nearly always shares one ttl and loses nothing,
-- so the ttl is sent once and the reply is usually empty: per lease, that
-- spares the server an argument and a reply entry, and the client as much.
--
-- The cost is per lease: each redis.call is a command dispatch (its
-- arguments made Redis objects, the ACL and the command table looked up,
-- the reply written and parsed back into Lua), and each call of a Lua
-- library function pushes and interns what it returns (type() its answer's
-- name). So the batch is read with one MGET, the holder is recognised by
-- one string.find, the library functions are read once into locals, and
-- every lease gets a PEXPIREAT to an instant worked out once from the
-- server's clock: the server rewrites each PEXPIRE into a PEXPIREAT (what
-- replicas and the AOF are sent), at a cost per lease.
--
-- Client tracking: a read-only command in a script makes Redis 7.0 track
-- every key the call names, for the calling connection; Redis 7.2 and
-- Valkey track only the keys that command names. Each renewal's PEXPIREAT
-- drops the lease's tracking, so the batch must be read again once written.
-- The MGET names every key of the batch, so it tracks the batch once under
-- either rule (before the writes drop it); one EXISTS naming every key then
-- tracks the batch again (step 3), where a GET per lease would track it
-- once per lease on Redis 7.0 (quadratic in the batch size) and a single
-- PTTL would track one lease of the batch on Valkey. Without tracking on
-- the connection it would cost one lookup per lease, so the caller says so
-- and it is skipped.

local n = #KEYS
if n == 0 then
  return {}
end
local shared = ARGV[1]
local last = #ARGV
local readers = ARGV[last - 1] == '1'
local track = ARGV[last] ~= '0'
local call, try, find, byte, sub = redis.call, redis.pcall, string.find, string.byte, string.sub

-- 1. Read every lease at once. An ACL without MGET gets a read per lease:
--    GETEX (a write command: it tracks nothing), or GET on a server without
--    GETEX (before 6.2) or an ACL without it. A key of another type reads as
--    nothing either way (MGET answers nil, GETEX and GET WRONGTYPE), and is
--    lost.
local values = try('MGET', unpack(KEYS))
local each = values.err ~= nil
local read = 'GETEX'

-- The new expiry, in milliseconds since the epoch on the server's clock: one
-- TIME for the batch. That is what each PEXPIRE would set where the server
-- freezes a script's clock at its start (Redis 7.2 on), and earlier by the
-- milliseconds the script has run so far where it does not (Redis 7.0); the
-- holder's own validity counts from before the call was sent, so it still
-- ends first. Built as text (a large Lua number may be written in exponent
-- form). An ACL without PEXPIREAT gets PEXPIRE (see 2.).
local t = call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local at = shared ~= '' and string.format('%.0f', now + shared)
local absolute = true

local lost = {}
for i = 1, n do
  local key = KEYS[i]
  local holder = ARGV[1 + i]
  local v
  if each then
    v = try(read, key)
    if read == 'GETEX' and type(v) == 'table' and v.err and not find(v.err, 'WRONGTYPE', 1, true) then
      read = 'GET'
      v = try(read, key)
    end
    if type(v) ~= 'string' then
      v = false
    end
  else
    v = values[i]
  end
  -- 2. Still ours (the value starts with the holder id and its ':')? Extend
  --    it. Anything else (gone, another holder, another type) is lost. The
  --    length test keeps a malformed holder from matching every lease.
  if v and #holder == 33 and find(v, holder, 1, true) == 1 then
    local ttl = shared
    if ttl == '' then
      ttl = ARGV[1 + n + i]
    end
    if not absolute then
      call('PEXPIRE', key, ttl)
    elseif try('PEXPIREAT', key, at or string.format('%.0f', now + ttl)) ~= 1 then
      -- Refused (an ACL without PEXPIREAT; the key was just read, so it is
      -- there): PEXPIRE, for this lease and the rest of the batch.
      absolute = false
      call('PEXPIRE', key, ttl)
    end
    -- 2a. A reader of a read-write lease (its key P:read:<32 hex digits>)
    --     keeps the lease's reader index P:readers at least as long as
    --     itself, so that a writer finds it: the index lives as long as its
    --     longest-lived reader and no longer. The caller says whether the
    --     batch may hold one, so that no other batch tests its keys. GT
    --     (Redis 7.0) only ever lengthens the index's life; before 7.0 the
    --     PTTL is compared here instead.
    if readers and byte(key, -33) == 58 and sub(key, -38, -33) == ':read:' then
      local index = sub(key, 1, #key - 38) .. ':readers'
      local kept = try('PEXPIRE', index, ttl, 'GT')
      if type(kept) == 'table' and kept.err then
        local left = call('PTTL', index)
        if left == -1 or (left >= 0 and left < tonumber(ttl)) then
          call('PEXPIRE', index, ttl)
        end
      end
    end
  else
    lost[#lost + 1] = i
  end
end
-- 3. Track the batch (see above); an error here changes no outcome. A
--    batch holds at most 1000 leases, well within what unpack can pass.
if track then
  try('EXISTS', unpack(KEYS))
end
return lost
