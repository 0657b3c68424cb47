-- withdraw.lua: withdraw the intent a waiting writer left on a read-write lease (see
-- write.lua), if it is still this writer's: compare-and-delete.
--
-- KEYS[1]  P:write-wanted   the intent of a writer waiting for the lease:
--                           "<holder hex>:<label>", with a PX expiry
-- ARGV[1]  holder           the writer's holder id, 32 lowercase hex digits
--
-- Also used for a minimum hold's mark, P:held-until ("<holder hex>:<end>", see
-- acquire.lua, 4): a grant given back (its replicas did not acknowledge it)
-- drops its mark before its release, which then frees the key at once.
--
-- Returns 1 when this writer's intent was there and is gone, 0 when there was none or it is
-- another writer's (which stays: that writer still waits, and new readers keep waiting for it).
--
-- Readers refused by the intent learn that it is gone at their next attempt (no later than
-- the intent's PTTL they were told, or their backoff): no notice is published, since a notice
-- on P:released announces a holder's release, and an intent holds nothing.

-- 1. Read the intent. A key of another type gives WRONGTYPE, passed on as the reply's own
--    error (inspect.lua, 1).
local wanted = redis.pcall('GET', KEYS[1])
if type(wanted) == 'table' and wanted.err then
  return redis.error_reply(wanted.err)
end

-- 2. Ours: delete it. Anyone else's, or none: leave it.
if wanted and string.sub(wanted, 1, 33) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
