-- write.lua: take the exclusive (write) hold on a read-write lease, or refresh the one this
-- holder has; when refused, leave this writer's intent so that new readers wait behind it.
--
-- KEYS[1]  P:write          the writer's key: "<holder hex>:<fencing token>:<label>",
--                           with a PX expiry
-- KEYS[2]  P:write-wanted   the intent of a writer waiting for the lease:
--                           "<holder hex>:<label>", with a PX expiry of the writer's ttl
-- KEYS[3]  P:readers        the index of readers: a set of holder ids (hex), kept as long as
--                           its longest-lived reader (read.lua, renew.lua);
--                           reader i holds the key P:read:<id>
-- KEYS[4]  P:fence          the lease's fencing counter, shared by readers and writers
-- ARGV[1]  holder           the holder id, 32 lowercase hex digits
-- ARGV[2]  ttl              the hold's time to live, in milliseconds; also the intent's
-- ARGV[3]  label            a public label shown to others (may be empty)
-- ARGV[4]  readers          P:read: — the reader keys are this followed by a member of
--                           P:readers
-- ARGV[5]  retention        how long the counter lives after a grant, in milliseconds
--                           (see grant.lua)
--
-- All keys share the hash tag of P, so they sit in one cluster slot. The reader
-- keys are not in KEYS (they are not known before the index is read); they
-- carry the same hash tag, so they are in the slot of KEYS[1], which Redis
-- Cluster requires of every key a script touches.
--
-- Returns {1, token}        when the hold is ours (token: the fencing token, a decimal string)
--      or {0, value, pttl}  when a writer or a reader holds the lease: the writer's stored
--                           value and PTTL, or those of the live reader that frees first
--
-- Numbers go to redis.call only as strings (see grant.lua).

local holder, ttl, label, readers = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local mine = holder .. ':'

-- want(): leave or refresh our intent, unless another waiting writer's is
-- there (it asked first; new readers wait for either). It lives for our ttl,
-- so a writer that dies while waiting holds readers back no longer.
local function want()
  local wanted = redis.call('GET', KEYS[2])
  if not wanted or string.sub(wanted, 1, 33) == mine then
    redis.call('SET', KEYS[2], mine .. label, 'PX', ttl)
  end
end

-- 1. The writer's key. Ours already (idempotent re-acquire): keep the token,
--    take the new label and ttl (acquire.lua, 2a). Another writer's: refused.
--    A key of another type gives its WRONGTYPE error back.
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' and current.err then
  return redis.error_reply(current.err)
end
if current then
  if string.sub(current, 1, 33) == mine then
    local rest = string.sub(current, 34)
    local colon = string.find(rest, ':', 1, true)
    local token = colon and string.sub(rest, 1, colon - 1) or rest
    redis.call('SET', KEYS[1], mine .. token .. ':' .. label, 'PX', ttl)
    redis.pcall('PTTL', KEYS[1])
    return {1, token}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  want()
  return {0, current, pttl}
end

-- 2. The readers: prune the index of those whose key has expired (no sweeper:
--    a crashed reader is gone at its ttl), and find the live one that frees
--    first. A reader key with no expiry (not written by this library) never
--    frees, so it is reported only if no other is live.
local members = redis.pcall('SMEMBERS', KEYS[3])
if type(members) == 'table' and members.err then
  return redis.error_reply(members.err)
end
local soonest_value, soonest_pttl = nil, nil
for _, member in ipairs(members) do
  local key = readers .. member
  local pttl = redis.call('PTTL', key)
  if pttl == -2 then
    redis.call('SREM', KEYS[3], member)
  elseif soonest_pttl == nil or (pttl >= 0 and (soonest_pttl < 0 or pttl < soonest_pttl)) then
    soonest_value, soonest_pttl = redis.call('GET', key), pttl
  end
end
if soonest_pttl ~= nil then
  want()
  return {0, soonest_value, soonest_pttl}
end

-- 3. Free: grant it (grant.lua, sent in front of this script), with the
--    lease's counter, and clear our intent (another writer's stays: it still
--    waits, and new readers keep waiting for it).
local token, refused = grant(KEYS[1], KEYS[4], holder, ttl, label)
if not token then
  return refused
end
local wanted = redis.call('GET', KEYS[2])
if wanted and string.sub(wanted, 1, 33) == mine then
  redis.call('DEL', KEYS[2])
end
return {1, token}
