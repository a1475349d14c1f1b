-- Flowgate leases (in-flight limits): one sorted set per key, member = lease id, score = the
-- lease's expiry in microseconds (exact in a double until the year 2255). Expired leases are
-- removed first, so they are never counted. The key expires with its last lease.
--
-- KEYS[1]: the sorted set
-- ARGV[1]: now in microseconds, or '' for the server's TIME
-- ARGV[2]: 'acquire', 'renew', 'release' or 'held'
-- ARGV[3]: lease id (acquire: the new one)   ARGV[4]: limit   ARGV[5]: lease time (us)
-- Reply: {done (1/0), leases held after, microseconds (acquire granted: the lease time;
--         acquire refused: until the earliest lease expires; otherwise 0)}

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local key = KEYS[1]
local op = ARGV[2]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

-- Keeps the key until its last lease expires (and a second more: Redis's own clock may be
-- behind an injected one by a little).
local function keep()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', key, math.floor((tonumber(last[2]) - now) / 1000) + 1000)
  end
end

if op == 'acquire' then
  local held = redis.call('ZCARD', key)
  local ttl = tonumber(ARGV[5])
  if held < tonumber(ARGV[4]) then
    redis.call('ZADD', key, now + ttl, ARGV[3])
    keep()
    return {1, held + 1, ttl}
  end
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {0, held, tonumber(first[2]) - now}
elseif op == 'renew' then
  if redis.call('ZSCORE', key, ARGV[3]) then
    redis.call('ZADD', key, 'XX', now + tonumber(ARGV[5]), ARGV[3])
    keep()
    return {1, redis.call('ZCARD', key), 0}
  end
  return {0, redis.call('ZCARD', key), 0}
elseif op == 'release' then
  local removed = redis.call('ZREM', key, ARGV[3])
  return {removed, redis.call('ZCARD', key), 0}
end
return {0, redis.call('ZCARD', key), 0}
