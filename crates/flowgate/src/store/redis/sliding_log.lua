-- Sliding log (see algorithm/sliding_log.rs). State: a list of grant time stamps in decimal ns,
-- oldest first, one element per unit granted (a grant of cost c is c equal elements), so the
-- list never holds more than `limit` elements and the units held are its length.
-- Per request, ARGV: cost (units for a refund), limit, period (u, r).
-- Reply per request: status, units held after the call, the newest stamp (u, r) or (-1, 0)
-- when the log is empty, and when denied the stamp whose expiry makes room (u, r).
local a = 4
local chunk = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, limit = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local pu, pr = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  local status, held, lu, lr, ru, rr = 0, 0, -1, 0, 0, 0
  local len = redis.pcall('LLEN', key)
  if type(len) ~= 'number' then
    status = -1
  elseif refund then
    status = 1
    if len > 0 then
      redis.call('LTRIM', key, 0, -cost - 1)
      held = len - cost
      if held < 0 then held = 0 end
    end
  else
    held = len
    -- A lagging `now` counts as the newest grant's time: nothing expires early.
    local su, sr = now_u, now_r
    if len > 0 then
      local s1, s2 = string.match(redis.call('LINDEX', key, -1), '^(%d+)(%d%d%d)$')
      if not s1 then status = -1 else
        lu, lr = tonumber(s1), tonumber(s2)
        if less(su, sr, lu, lr) then su, sr = lu, lr end
      end
    end
    -- Forget grants that left the window: t + period ≤ stamp.
    while status == 0 and held > 0 do
      local s1, s2 = string.match(redis.call('LINDEX', key, 0), '^(%d+)(%d%d%d)$')
      if not s1 then status = -1 break end
      local eu, er = add(tonumber(s1), tonumber(s2), pu, pr)
      if less(su, sr, eu, er) then break end
      redis.call('LPOP', key)
      held = held - 1
    end
    if held == 0 then lu, lr = -1, 0 end
    if status == 0 then
      if held + cost <= limit then
        status = 1
        if cost > 0 then
          local stamp = string.format('%d%03d', su, sr)
          local left = cost
          while left > 0 do
            local k = math.min(left, 1000)
            for j = 1, k do chunk[j] = stamp end
            for j = k + 1, #chunk do chunk[j] = nil end
            redis.call('RPUSH', key, unpack(chunk))
            left = left - k
          end
          held = held + cost
          lu, lr = su, sr
          redis.call('PEXPIRE', key, ttl(add(lu, lr, pu, pr) - now_u))
        end
      else
        -- The grant whose expiry frees enough: the (held + cost − limit)-th oldest unit.
        local s1, s2 = string.match(redis.call('LINDEX', key, held + cost - limit - 1), '^(%d+)(%d%d%d)$')
        if s1 then ru, rr = tonumber(s1), tonumber(s2) else status = -1 end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = status, held, lu, lr, ru, rr
  n = n + 6
end
return out
