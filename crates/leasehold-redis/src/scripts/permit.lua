-- permit.lua: take one of the N permits of a semaphore, or refresh the one this holder has.
--
-- KEYS[1]    S:permits       the semaphore's permit limit, a decimal number, kept for the
--                            counter's retention after each grant (see step 5)
-- KEYS[2]    S:fence         the semaphore's fencing counter, shared by all its permits
-- KEYS[2+i]  S:permit:<i-1>  permit i-1, a lease: "<holder hex>:<fencing token>:<label>",
--                            with a PX expiry; at least N of them, more when the client
--                            was told to check a larger limit (step 1)
-- ARGV[1]    holder          the holder id, 32 lowercase hex digits
-- ARGV[2]    ttl             the permit's time to live, in milliseconds
-- ARGV[3]    label           a public label shown to others (may be empty)
-- ARGV[4]    limit           N, in decimal without leading zeros
-- ARGV[5]    retention       how long the counter and the limit live after a grant, in
--                            milliseconds (see grant.lua)
--
-- All keys share the semaphore's hash tag, so they sit in one cluster slot.
--
-- Returns {1, token, index}  when permit `index` (from 0) is ours (token: the fencing token)
--      or {0, value, pttl}   when all N permits are held: the stored value and PTTL of
--                            the one that frees first
--      or {-1, held}         when permits are held under another limit `held`: nothing changed
--      or {-2, held}         when the limit stored is `held`, larger than the permit keys sent,
--                            and none of those is held: call again with `held` permit keys
--
-- Numbers go to redis.call only as strings (see grant.lua).

local holder, ttl, label, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local mine = holder .. ':'
local n = tonumber(limit)
local sent = #KEYS - 2

-- 1. The limit every holder must agree on. It may change only while no
--    permit is held under the stored one: a crashed holder's permit still
--    counts until its ttl runs out. A key of another type gives WRONGTYPE,
--    passed on as the reply's own error.
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'table' and stored.err then
  return redis.error_reply(stored.err)
end
if stored and stored ~= limit then
  local held = tonumber(stored)
  if not held or held < 1 or held ~= math.floor(held) then
    return redis.error_reply('ERR the semaphore permit limit is not a positive integer')
  end
  for i = 1, math.min(held, sent) do
    if redis.call('EXISTS', KEYS[2 + i]) == 1 then
      return {-1, stored}
    end
  end
  if held > sent then
    return {-2, stored}
  end
end

-- 2. One pass over the N permits: ours already (idempotent re-acquire), the
--    first free one, and the held one that frees first. A permit of another
--    type gives its WRONGTYPE error back, as acquire.lua does.
local free, soonest_value, soonest_pttl = nil, nil, nil
for i = 1, n do
  local key = KEYS[2 + i]
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    return redis.error_reply(v.err)
  end
  if v then
    if string.sub(v, 1, 33) == mine then
      -- 2a. Ours: keep the token, take the new label and ttl (acquire.lua, 2a).
      local rest = string.sub(v, 34)
      local colon = string.find(rest, ':', 1, true)
      local token = colon and string.sub(rest, 1, colon - 1) or rest
      redis.call('SET', key, mine .. token .. ':' .. label, 'PX', ttl)
      redis.pcall('PTTL', key)
      -- Written after the read, so that the limit (which outlives the
      -- permit) is not tracked (see grant.lua).
      redis.call('SET', KEYS[1], limit, 'PX', retention)
      return {1, token, i - 1}
    end
    -- 2b. Someone else's. A PTTL of -1 (no expiry: not written by
    --     leasehold) never frees, so it is reported only if all are.
    local pttl = redis.call('PTTL', key)
    if soonest_pttl == nil or (pttl >= 0 and (soonest_pttl < 0 or pttl < soonest_pttl)) then
      soonest_value, soonest_pttl = v, pttl
    end
  elseif not free then
    free = i
  end
end

-- 3. All held: report the one that frees first.
if not free then
  return {0, soonest_value, soonest_pttl}
end

-- 4. Grant the first free permit (grant.lua, sent in front of this script),
--    with the semaphore's counter, so tokens rise across all its permits.
local token, refused = grant(KEYS[2 + free], KEYS[2], holder, ttl, label)
if not token then
  return refused
end
-- 5. Store the limit, written last so that it is not tracked (see grant.lua),
--    for as long as the counter: it is checked only against permits granted
--    under it, and a permit renewed for longer than the retention with no
--    grant in between outlives it (a holder asking with another limit is
--    then let in; the permits stay exclusive per slot).
redis.call('SET', KEYS[1], limit, 'PX', retention)
return {1, token, free - 1}
