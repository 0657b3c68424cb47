-- inspect_rw.lua: read a read-write lease without changing it: its writer, its live readers
-- and the intent of a writer waiting for it, all as of one instant.
--
-- KEYS[1]  P:write          the writer's key (see write.lua)
-- KEYS[2]  P:write-wanted   the intent of a waiting writer: "<holder hex>:<label>"
-- KEYS[3]  P:readers        the index of readers: a set of holder ids (hex)
-- ARGV[1]  readers          P:read: — a reader's key is this followed by a member of P:readers
--
-- The reader keys are not in KEYS (they are not known before the index is read); they carry
-- the hash tag of P, so they are in the slot of KEYS[1] (see write.lua).
--
-- Returns {writer, pttl, intent label, pttl, reader, pttl, reader, pttl, ...}: the writer's
-- stored value, the intent's label (its holder id stays here) and each live reader's stored
-- value, each followed by its PTTL; a writer or intent that is not there is false (a nil
-- reply) with -2. Members of the index whose key is gone are left out, not pruned: this
-- script writes nothing (read.lua and write.lua prune).

-- get(): a key's value, or the WRONGTYPE error of a key of another type passed on as the
-- reply's own error (inspect.lua, 1).
local function get(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    return nil, redis.error_reply(v.err)
  end
  return v
end

-- 1. The writer.
local out = {}
local writer, err = get(KEYS[1])
if err then
  return err
end
out[1], out[2] = writer or false, writer and redis.call('PTTL', KEYS[1]) or -2

-- 2. A waiting writer's intent, shown by its label.
local wanted
wanted, err = get(KEYS[2])
if err then
  return err
end
out[3], out[4] = wanted and string.sub(wanted, 34) or false, wanted and redis.call('PTTL', KEYS[2]) or -2

-- 3. The live readers.
local members = redis.pcall('SMEMBERS', KEYS[3])
if type(members) == 'table' and members.err then
  return redis.error_reply(members.err)
end
for _, member in ipairs(members) do
  local key = ARGV[1] .. member
  local reader
  reader, err = get(key)
  if err then
    return err
  end
  if reader then
    out[#out + 1] = reader
    out[#out + 1] = redis.call('PTTL', key)
  end
end
return out
