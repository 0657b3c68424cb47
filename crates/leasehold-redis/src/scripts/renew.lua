-- renew.lua: compare-and-pexpire for a batch of leases.
--
-- KEYS[i]       P_i       the lease keys, one per renewal (n of them)
-- ARGV[1]       ttl       the new time to live of every lease, in milliseconds;
--                         empty when the batch's leases differ (then see ARGV[1+n+i])
-- ARGV[1+i]     holder_i  the holder id expected in lease i, 32 lowercase hex digits
-- ARGV[1+n+i]   ttl_i     lease i's new time to live, only when ARGV[1] is empty
-- ARGV[last]    track     after the holders (and ttls): '0' when the connection
--                         does not track, so the batch is not read again (step 3);
--                         anything else, or left out, reads it
--
-- Returns the positions (from 1, ascending) of the leases lost; every other
-- lease was renewed. A batch nearly always shares one ttl and loses nothing,
-- so the ttl is sent once and the reply is usually empty: per lease, that
-- spares the server an argument and a reply entry, and the client as much.
--
-- Client tracking: a read-only command in a script makes Redis 7.0 track
-- every key the call names, for the calling connection; Redis 7.2 and
-- Valkey track only the keys that command names. Each renewal's PEXPIRE
-- drops the lease's tracking, so the batch must be read again once written.
-- The leases are read with GETEX (a write command: no tracking), then one
-- EXISTS names every key of the batch: on either rule it tracks the whole
-- batch, once, where a GET per lease would track it once per lease on
-- Redis 7.0 (quadratic in the batch size) and a single PTTL would track
-- one lease of the batch on Valkey. Without tracking on the connection it
-- would cost one lookup per lease, so the caller says so and it is skipped.

local n = #KEYS
local shared = ARGV[1]
local track = ARGV[(shared ~= '' and 2 + n) or 2 + 2 * n] ~= '0'
local lost = {}
for i = 1, n do
  local holder = ARGV[1 + i]
  -- 1. Read the lease; pcall turns WRONGTYPE into an error table, which
  --    counts as lost. A server without GETEX (before 6.2), or an ACL
  --    without it, gets a plain GET.
  local v = redis.pcall('GETEX', KEYS[i])
  if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
    v = redis.pcall('GET', KEYS[i])
  end
  -- 2. Still ours (the 32-digit holder id, then ':' at byte 33)? Extend it.
  --    Anything else (gone, another holder, another type) is lost. A plain
  --    find and a byte test build no Lua string per lease, unlike a
  --    concatenation and string.sub would.
  if type(v) == 'string' and #holder == 32 and string.byte(v, 33) == 58
      and string.find(v, holder, 1, true) == 1 then
    local ttl = shared
    if ttl == '' then
      ttl = ARGV[1 + n + i]
    end
    redis.call('PEXPIRE', KEYS[i], ttl)
    -- 2a. A reader of a read-write lease (its key P:read:<32 hex digits>)
    --     keeps the lease's reader index P:readers at least as long as
    --     itself, so that a writer finds it: the index lives as long as its
    --     longest-lived reader and no longer. One byte test spares every
    --     other lease the substring. GT (Redis 7.0) only ever lengthens the
    --     index's life; before 7.0 the PTTL is compared here instead.
    local key = KEYS[i]
    if string.byte(key, -33) == 58 and string.sub(key, -38, -33) == ':read:' then
      local index = string.sub(key, 1, #key - 38) .. ':readers'
      local kept = redis.pcall('PEXPIRE', index, ttl, 'GT')
      if type(kept) == 'table' and kept.err then
        local left = redis.call('PTTL', index)
        if left == -1 or (left >= 0 and left < tonumber(ttl)) then
          redis.call('PEXPIRE', index, ttl)
        end
      end
    end
  else
    lost[#lost + 1] = i
  end
end
-- 3. Track the batch (see above); an error here changes no outcome. A
--    batch holds at most 1000 leases, well within what unpack can pass.
if track and n > 0 then
  redis.pcall('EXISTS', unpack(KEYS))
end
return lost
