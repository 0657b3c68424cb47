-- read.lua: take a shared (read) hold on a read-write lease, or refresh the one this holder has.
--
-- KEYS[1]  P:read:<holder>  this holder's reader key: "<holder hex>:<fencing token>:<label>",
--                           with a PX expiry
-- KEYS[2]  P:write          the writer's key, a lease like the reader keys
-- KEYS[3]  P:write-wanted   the intent of a writer waiting for the lease:
--                           "<holder hex>:<label>", with a PX expiry (see write.lua)
-- KEYS[4]  P:readers        the index of readers: a set of holder ids (hex), kept as long as
--                           its longest-lived reader (here and in renew.lua)
-- KEYS[5]  P:fence          the lease's fencing counter, shared by readers and writers
-- ARGV[1]  holder           the holder id, 32 lowercase hex digits
-- ARGV[2]  ttl              the hold's time to live, in milliseconds
-- ARGV[3]  label            a public label shown to others (may be empty)
-- ARGV[4]  retention        how long the counter lives after a grant, in milliseconds
--                           (see grant.lua)
--
-- All keys share the hash tag of P, so they sit in one cluster slot; so do the
-- other readers' keys P:read:<member>, read in step 5 (see write.lua).
--
-- Returns {1, token}        when the hold is ours (token: the fencing token, a decimal string)
--      or {0, value, pttl}  when a writer holds the lease (its stored value and PTTL)
--      or {2, label, pttl}  when another writer waits for it (its label and the PTTL of its
--                           intent): writer preference, new readers queue behind it
--
-- Numbers go to redis.call only as strings (see grant.lua).

local holder, ttl, label = ARGV[1], ARGV[2], ARGV[3]
local mine = holder .. ':'

-- keep_index(ms): the index lives at least `ms` more, as long as the reader
-- just granted or refreshed, so that a writer finds every live reader, and
-- not for ever (renew.lua lengthens it at each renewal). NX gives a new
-- index its expiry; GT only ever lengthens an existing one, for readers
-- whose ttls differ. Before Redis 7.0 (no NX or GT) the PTTL is compared.
local function keep_index(ms)
  local set = redis.pcall('PEXPIRE', KEYS[4], ms, 'NX')
  if type(set) == 'table' and set.err then
    local left = redis.call('PTTL', KEYS[4])
    if left == -1 or (left >= 0 and left < tonumber(ms)) then
      redis.call('PEXPIRE', KEYS[4], ms)
    end
  elseif set == 0 then
    redis.call('PEXPIRE', KEYS[4], ms, 'GT')
  end
end

-- 1. Ours already (idempotent re-acquire): keep the token, take the new label
--    and ttl (acquire.lua, 2a). A reader holds on even while a writer waits:
--    the writer waits for the readers that held before it. A key of another
--    type gives its WRONGTYPE error back, as acquire.lua does.
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
    keep_index(ttl)
    return {1, token}
  end
  -- Written by something other than this library: report it as held.
  return {0, current, redis.call('PTTL', KEYS[1])}
end

-- 2. A writer holds the lease: refused.
local writer = redis.pcall('GET', KEYS[2])
if type(writer) == 'table' and writer.err then
  return redis.error_reply(writer.err)
end
if writer then
  return {0, writer, redis.call('PTTL', KEYS[2])}
end

-- 3. Another writer waits: refused, so that it waits at most for the readers
--    that held when it asked (writer preference). Its intent expires by
--    itself if it dies.
local wanted = redis.pcall('GET', KEYS[3])
if type(wanted) == 'table' and wanted.err then
  return redis.error_reply(wanted.err)
end
if wanted and string.sub(wanted, 1, 33) ~= mine then
  return {2, string.sub(wanted, 34), redis.call('PTTL', KEYS[3])}
end

-- 4. Grant our reader key (grant.lua, sent in front of this script), with
--    the lease's counter, so tokens rise across readers and writers.
local token, refused = grant(KEYS[1], KEYS[5], holder, ttl, label)
if not token then
  return refused
end

-- 5. List the reader, so a writer finds it, for as long as the reader lives;
--    written last, so that the index is not tracked (see grant.lua). Members whose key is
--    gone are pruned by write.lua, and here from a sample of 3, so that a
--    lease read for ever without a writer keeps a bounded index.
local added = redis.pcall('SADD', KEYS[4], holder)
if type(added) == 'table' and added.err then
  return redis.error_reply(added.err)
end
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - 32)
for _, member in ipairs(redis.call('SRANDMEMBER', KEYS[4], 3)) do
  if member ~= holder and redis.call('EXISTS', prefix .. member) == 0 then
    redis.call('SREM', KEYS[4], member)
  end
end
keep_index(ttl)
return {1, token}
