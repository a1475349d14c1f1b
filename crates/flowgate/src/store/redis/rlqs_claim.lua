-- Flowgate RLQS ledger: grant a joining member a first share from the tick's join budget and
-- take its cost from this tick's budget and the next tick's (the member holds it until its
-- instance ticks). The grant is Claim::grant in src/rlqs/ledger.rs, operation for operation.
--
-- KEYS[1]: claims hash (tick -> budget spent)
-- ARGV[1]: now in microseconds, or '' for the server's TIME   ARGV[2]: tick length (us)
-- ARGV[3]: the tick claimed in   ARGV[4]: ask (tokens)   ARGV[5]: fraction of what is left
-- ARGV[6]: burst   ARGV[7]: budget   ARGV[8]: expiry (ms)
-- Reply: tokens granted (>= 1), 0 budget exhausted, -1 the tick has passed

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

local ask = tonumber(ARGV[4])
local fraction = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local spent = tonumber(redis.call('HGET', KEYS[1], ARGV[3]) or '0')
local left = tonumber(ARGV[7]) - spent
if left < 0 then left = 0 end
local most = math.floor(left * fraction / (1 + burst))
local tokens
if most >= ask then tokens = ask else tokens = most end
if tokens < 1 then tokens = 1 end
local bucket = math.ceil(tokens * burst)
if bucket < 1 then bucket = 1 end
local cost = tokens + bucket
if cost > left then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[3], cost)
redis.call('HINCRBY', KEYS[1], string.format('%d', k + 1), cost)
redis.call('HDEL', KEYS[1], string.format('%d', k - 2))
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return tokens
