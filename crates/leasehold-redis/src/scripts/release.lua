-- release.lua: compare-and-delete.
--
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
-- ARGV[5]  hold     '1' when the lease was acquired with a minimum hold: its
--                   mark is read (step 3); left out (the usual release), no
--                   mark is read
--
-- Returns 0 when the lease was not ours, 1 when it was ours and is now
-- deleted (or kept for its minimum hold, step 3), and 2 when, besides, the notice reached a subscriber other
-- than the releasing process's own: a waiter elsewhere heard it.

-- 1. Read the lease. A key of another type gives WRONGTYPE, passed on as the reply's
--    own error (not wrapped as a script error, as Redis 6 would), so the client sees its code.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  return redis.error_reply(v.err)
end

-- 2. Not ours (gone, or another holder's): leave it alone.
if not v or string.sub(v, 1, 33) ~= ARGV[1] .. ':' then
  return 0
end

-- 3. Ours. Under its minimum hold, keep it, still ours, until the hold's end,
--    and announce nothing: it is not free yet (a waiter asks again when the
--    time left it was told runs out). The hold is the mark acquire.lua (4)
--    left, P:held-until = "<holder>:<end>", end in the server's milliseconds:
--    only the server's clock counts. Its name is built from P's (see
--    acquire.lua, 4) and read with GETEX, a write command, which no server
--    version tracks, so that the usual release, of a lease without a mark,
--    leaves no tracking entry for it. (Before 6.2 there is no GETEX, nor the
--    tracking rule: GET.) A mark of another holder, of another type, or whose
--    end has passed, is no hold: the lease is freed as without one. The
--    backend knows which leases it acquired with a minimum (holds.rs) and
--    tells the others' releases to skip the read, a command in every
--    release that only the rare lease with a minimum needs.
if ARGV[5] == '1' then
  local mark = KEYS[1] .. ':held-until'
  local m = redis.pcall('GETEX', mark)
  if type(m) == 'table' and m.err and not string.find(m.err, 'WRONGTYPE', 1, true) then
    m = redis.pcall('GET', mark)
  end
  if type(m) == 'string' and string.sub(m, 1, 33) == ARGV[1] .. ':' then
    local t = redis.call('TIME')
    local left = (tonumber(string.sub(m, 34)) or 0)
      - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    if left > 0 then
      redis.call('PEXPIRE', KEYS[1], string.format('%.0f', left))
      return 1
    end
  end
end

-- 4. Delete it. The fencing counter (P:fence) stays, so tokens keep rising.
redis.call('DEL', KEYS[1])

-- 5. Tell waiters at once, so they need not poll, and say whether one
--    elsewhere heard (the releasing process then lets it go first).
if ARGV[2] and ARGV[2] ~= '' then
  local heard = redis.call(ARGV[3] or 'PUBLISH', ARGV[2], '1')
  if heard > (tonumber(ARGV[4]) or 0) then
    return 2
  end
end

return 1
