-- Flowgate RLQS ledger: record members' demand and read the current and previous ticks'
-- divisions of one rule instance (and what computes the current one, if none is stored).
-- See src/rlqs/ledger.rs.
--
-- KEYS[1]: members hash (member -> "demand:seen_us", demand '-' when unknown)
-- KEYS[2]: divisions hash (tick -> division text)
-- KEYS[3]: claims hash (tick -> join budget spent)
-- ARGV[1]: now in microseconds, or '' for the server's TIME
-- ARGV[2]: tick length (us)   ARGV[3]: stale after (us)   ARGV[4]: members' expiry (ms)
-- ARGV[5]: '1' to answer the live members when the current tick has no division
-- ARGV[6..]: member, demand pairs to record
-- Reply: { now_us, tick, current or nil, previous or nil, previous tick's claims,
--          then member, demand pairs of every live member (see ARGV[5]) }

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
local stale = tonumber(ARGV[3])

if #ARGV >= 6 then
  for i = 6, #ARGV, 2 do
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ':' .. string.format('%d', now))
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end

local current = redis.call('HGET', KEYS[2], string.format('%d', k))
local previous = redis.call('HGET', KEYS[2], string.format('%d', k - 1))
local claimed = tonumber(redis.call('HGET', KEYS[3], string.format('%d', k - 1)) or '0')
local reply = { now, k, current, previous, claimed }
if not current and ARGV[5] == '1' then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local value = all[i + 1]
    local sep = string.find(value, ':', 1, true)
    local seen = sep and tonumber(string.sub(value, sep + 1))
    if not seen or now - seen > stale then
      redis.call('HDEL', KEYS[1], all[i])
    else
      reply[#reply + 1] = all[i]
      reply[#reply + 1] = string.sub(value, 1, sep - 1)
    end
  end
end
return reply
