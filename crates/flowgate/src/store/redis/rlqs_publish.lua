-- Flowgate RLQS ledger: store a tick's division unless one is stored; answer the stored one.
--
-- KEYS[1]: divisions hash (tick -> division text)
-- ARGV[1]: tick   ARGV[2]: the division   ARGV[3]: the hash's expiry (ms)

if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  local k = tonumber(ARGV[1])
  if redis.call('HLEN', KEYS[1]) > 2 then
    for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
      if tonumber(field) < k - 1 then redis.call('HDEL', KEYS[1], field) end
    end
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return ARGV[2]
end
return redis.call('HGET', KEYS[1], ARGV[1])
