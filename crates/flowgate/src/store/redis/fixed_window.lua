-- Fixed window (see algorithm/fixed_window.rs). State: "window count" (hex), window = start
-- divided by the period. Periods are whole microseconds (checked by the client), so the
-- window index is exact.
-- Quota block (2): limit, period in µs. Per request: quota index, cost (units for a refund).
-- Reply per request: status, window, count as read; zeros for a new key.
-- Expiry: the end of the window, set when a write starts a window.
local F = blocks(2)
local Limit, P = F[1], F[2]
for i = 1, #KEYS do
  local key = KEYS[i]
  local j, cost = request(i, 2)
  local limit, p = Limit[j], P[j]
  local status, sw, sc = 0, 0, 0
  local ok, v = get(key)
  if not ok then
    status = -1
  elseif v then
    local sp = string.find(v, ' ', 1, true)
    sw = nil
    if sp then
      sw, sc = tonumber(string.sub(v, 1, sp - 1), 16), tonumber(string.sub(v, sp + 1), 16)
    end
    if not (sw and sc) then status, sw, sc = -1, 0, 0 end
  end
  if status == 0 then
    local w = div(now_u, p)
    if refund then
      status = 1
      if sw >= w and sc > 0 then
        local c = sc - cost
        if c < 0 then c = 0 end
        rcall('SET', key, string.format('%x %x', sw, c), 'KEEPTTL')
      end
    else
      -- A lagging `now` stays in the state's window.
      if sw > w then w = sw end
      local count = 0
      if w == sw then count = sc end
      if count + cost <= limit then
        status = 1
        if cost > 0 then
          local value = string.format('%x %x', w, count + cost)
          if v and w == sw then
            rcall('SET', key, value, 'KEEPTTL')
          else
            rcall('SET', key, value, 'PX', ttl_until((w + 1) * p))
          end
        end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = status, sw, sc
  n = n + 3
end
return out
