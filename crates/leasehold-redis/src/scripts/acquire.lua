-- acquire.lua: take a free lease, or refresh one this holder already has.
--
-- KEYS[1]  P        the lease: "<holder hex>:<fencing token>:<label>", with a PX expiry
-- KEYS[2]  P:fence  the lease's fencing counter (same hash tag, so same cluster slot)
-- ARGV[1]  holder   the holder id, 32 lowercase hex digits
-- ARGV[2]  ttl      the lease's time to live, in milliseconds
-- ARGV[3]  label    a public label shown to others (may be empty)
-- ARGV[4]  track    '0' when the connection does not track: the lease is
--                   then not read again once written (see grant.lua);
--                   anything else, or left out, reads it
-- ARGV[5]  minimum  the minimum hold in milliseconds, left out for none: a
--                   grant then marks the lease (step 4); a refresh (2a)
--                   leaves the mark of the grant that took the key alone
--
-- Returns token            when the lease is ours (the fencing token, a decimal string:
--                          a bare string, which costs the server and the client less
--                          to convert than a table would)
--      or {0, value, pttl}  when someone else holds it (their stored value and PTTL).

local holder, ttl, label = ARGV[1], ARGV[2], ARGV[3]
local track = ARGV[4] ~= '0'
local mine = holder .. ':'

-- 1. Read the lease. A key of another type gives WRONGTYPE, passed on as the reply's
--    own error (not wrapped as a script error, as Redis 6 would), so the client sees its code.
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' and current.err then
  return redis.error_reply(current.err)
end

if current then
  if string.sub(current, 1, 33) == mine then
    -- 2a. Ours already (idempotent re-acquire): keep the token, take the new label and ttl.
    local rest = string.sub(current, 34)
    local colon = string.find(rest, ':', 1, true)
    local token = colon and string.sub(rest, 1, colon - 1) or rest
    redis.call('SET', KEYS[1], mine .. token .. ':' .. label, 'PX', ttl)
    -- The SET dropped the lease's client tracking; read it to track it again
    -- (see grant.lua).
    if track then
      redis.pcall('PTTL', KEYS[1])
    end
    return token
  end
  -- 2b. Someone else's: report their public value and how long it still lives.
  --     (On a tracking connection this tracks their lease too: the holder's
  --     next write reports it, and the backend, holding no lease there, has
  --     nothing to do.)
  return {0, current, redis.call('PTTL', KEYS[1])}
end

-- 3. Free: grant it (grant.lua, sent in front of this script).
local token, refused = grant(KEYS[1], KEYS[2], holder, ttl, label, track)
if not token then
  return refused
end

-- 4. A minimum hold: mark the grant with P:held-until = "<holder>:<end>", end
--    = the server's clock (ms) + the minimum, the mark expiring by itself then.
--    A release before the end keeps the lease until it (release.lua, 3). The
--    mark's name is built here, not passed in KEYS: it has the lease's hash
--    tag, so it is in the lease's slot, and Redis 7.0 tracks every key a
--    call names on each read-only command (grant.lua): a release naming it
--    would leave a tracking entry per missing mark. Inline, not a function:
--    a function defined per call costs every lone acquisition.
if ARGV[5] then
  local t = redis.call('TIME')
  local ends = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[5])
  redis.call('SET', KEYS[1] .. ':held-until', holder .. ':' .. string.format('%.0f', ends), 'PX', ARGV[5])
end
return token
