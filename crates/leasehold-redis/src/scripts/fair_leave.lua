-- fair_leave.lua: leave a place in a lease's fair queue (see fair.lua).
--
-- KEYS[1]  P:fair         the queue, by arrival
-- KEYS[2]  P:fair-places  the places, by expiry
-- KEYS[3]  P:fair-asks    the handovers asked for (see release_fair.lua)
-- ARGV[1]  holder         the holder id, 32 lowercase hex digits
--
-- Returns the number of places left (a sorted set left empty is deleted by the server).

redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return redis.call('ZCARD', KEYS[1])
