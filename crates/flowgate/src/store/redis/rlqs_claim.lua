-- Flowgate RLQS ledger: take a joining member's first share from the tick's join budget, all
-- or nothing, and from the next tick's too (the member holds it until its instance ticks).
--
-- KEYS[1]: claims hash (tick -> budget spent)
-- ARGV[1]: now in microseconds, or '' for the server's TIME   ARGV[2]: tick length (us)
-- ARGV[3]: the tick claimed in   ARGV[4]: cost   ARGV[5]: budget   ARGV[6]: expiry (ms)
-- Reply: 1 granted, 0 budget exhausted, -1 the tick has passed

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local tick_us = tonumber(ARGV[2])
local k = math.floor(now / tick_us)
if k * tick_us > now then k = k - 1 end
if (k + 1) * tick_us <= now then k = k + 1 end
if string.format('%d', k) ~= ARGV[3] then return -1 end
local cost = tonumber(ARGV[4])
local spent = tonumber(redis.call('HGET', KEYS[1], ARGV[3]) or '0')
if spent + cost > tonumber(ARGV[5]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[3], cost)
redis.call('HINCRBY', KEYS[1], string.format('%d', k + 1), cost)
redis.call('HDEL', KEYS[1], string.format('%d', k - 1))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
