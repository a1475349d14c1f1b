-- Fixed window (see algorithm/fixed_window.rs). State: "window count", window = start / period.
-- Periods are whole microseconds (checked by the client), so the window index is exact.
-- Per request, ARGV: cost (units for a refund), limit, period in µs.
-- Reply per request: status, window, count as read; zeros for a new key.
local a = 4
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, limit, p = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local status, sw, sc = 0, 0, 0
  local v = redis.pcall('GET', key)
  if v then
    local s1, s2
    if type(v) == 'string' then s1, s2 = string.match(v, '^(%d+) (%d+)$') end
    if s1 then sw, sc = tonumber(s1), tonumber(s2) else status = -1 end
  end
  if status == 0 then
    local w = div(now_u, p)
    if refund then
      status = 1
      if sw >= w and sc > 0 then
        local c = sc - cost
        if c < 0 then c = 0 end
        redis.call('SET', key, string.format('%d %d', sw, c), 'PX', ttl((sw + 1) * p - now_u))
      end
    else
      -- A lagging `now` stays in the state's window.
      if sw > w then w = sw end
      local count = 0
      if w == sw then count = sc end
      if count + cost <= limit then
        status = 1
        if cost > 0 then
          redis.call('SET', key, string.format('%d %d', w, count + cost), 'PX', ttl((w + 1) * p - now_u))
        end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = status, sw, sc
  n = n + 3
end
return out
