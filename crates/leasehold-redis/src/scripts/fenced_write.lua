-- fenced_write.lua: write a value under a fenced resource, or seal the
-- resource (raise its fence and write nothing else), only when the writer's
-- fencing token is at least the highest the resource has seen.
--
-- KEYS[1]  F        the resource, a hash {lease, token[, value]}
--                   (N{T}:fenced:<resource>, in the slot of the lease key's P)
-- ARGV[1]  lease    the lease key whose tokens the fence compares (the key
--                   its fencing counter is kept for: a permit's semaphore)
-- ARGV[2]  token    the writer's fencing token, in decimal without leading zeros
-- ARGV[3]  mode     'write' (store ARGV[4] as the value) or 'seal' (the fence alone)
-- ARGV[4]  value    the value; empty for a seal, and not read
-- ARGV[5]  expiry   milliseconds the resource lives after this call, or ''
--                   for none. A write sets the resource's life: with an
--                   expiry, PEXPIRE; without, PERSIST (as SET does). A seal
--                   leaves an existing resource's expiry as it is, and gives
--                   a resource it creates this one.
--
-- Returns {1, token}   done: the fence is at `token` (and, for a write, the value is stored)
--      or {0, newer}   refused: the resource has seen `newer`, above `token`; nothing written
--      or {-1, lease}  refused: the fence compares another lease key's tokens
--                      (that key); nothing written
--   or a WRONGTYPE error for a key of another type, or an error when the
--   stored fence is not a token.
--
-- The fence lives in the resource's own hash, so it lives exactly as long as
-- the value it guards: leasehold keeps nothing of its own here. A resource
-- that expired (or that the user deleted) has forgotten its fence too.

local resource = KEYS[1]
local lease, token, mode, value, expiry = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

-- 1. Read the fence. A key of another type gives WRONGTYPE, passed on as the
--    reply's own error (not wrapped as a script error, as Redis 6 would), so
--    the client sees its code.
local f = redis.pcall('HMGET', resource, 'token', 'lease')
if f.err then
  return redis.error_reply(f.err)
end
local seen, owner = f[1], f[2]

-- 2. Tokens compare within one lease key: a fence that another lease key's
--    tokens raised says nothing about this one's.
if owner and owner ~= lease then
  return {-1, owner}
end

-- 3. Refused when the resource has seen a newer token. Both are plain
--    digits without leading zeros (as this script writes them), so fewer
--    digits, or as many and smaller in text order, is smaller: no number is
--    read, and tokens up to 2^64 compare exactly (a Lua number would not
--    above 2^53). An equal token passes: its holder writes again.
if seen then
  if not (seen == '0' or string.find(seen, '^[1-9]%d*$')) then
    return redis.error_reply('ERR the fence of this resource is not a fencing token; delete the key or name another resource')
  end
  if #seen > #token or (#seen == #token and seen > token) then
    return {0, seen}
  end
end

-- 4. Raise the fence, and for a write store the value: one HSET, so the
--    value and the fence that let it in are never apart.
if mode == 'write' then
  redis.call('HSET', resource, 'token', token, 'lease', lease, 'value', value)
  if expiry ~= '' then
    redis.call('PEXPIRE', resource, expiry)
  else
    redis.call('PERSIST', resource)
  end
else
  local created = redis.call('EXISTS', resource) == 0
  redis.call('HSET', resource, 'token', token, 'lease', lease)
  if created and expiry ~= '' then
    redis.call('PEXPIRE', resource, expiry)
  end
end
return {1, token}
