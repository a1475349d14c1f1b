-- Fixed window (see algorithm/fixed_window.rs). State: "window count" (hex), window = start
-- divided by the period. Periods are whole microseconds (checked by the client), so the
-- window index is exact.
-- Quota block (2): limit, period in µs. Per request: quota index, cost (units for a refund).
-- Reply per request: status, window, count as read; zeros for a new key.
-- Runs of one key read and write its state once (see the prelude).
-- Expiry: the end of the window, set when a write starts a window.
local F = blocks(2)
local Limit, P = F[1], F[2]
-- "window count" as two numbers; nil when malformed.
local function parse(v)
  local sp = string.find(v, ' ', 1, true)
  if not sp then return nil end
  return tonumber(string.sub(v, 1, sp - 1), 16), tonumber(string.sub(v, sp + 1), 16)
end
local function store(key, w, c, ttl) store2(key, string.format('%x %x', w, c), ttl) end
-- The current window of each quota.
local Now = {}
for j = 1, quotas do Now[j] = div(now_u, P[j]) end

-- The run's key and its state: `ours` unless it holds a value Flowgate did not write; `live`
-- when it has a value (read or to be written); `dirty` when the state must be written, with a
-- new expiry `ttl` or, when nil, the one it has.
local cur, ours, live, sw, sc, dirty, ttl
for i = 1, #KEYS do
  local key = KEYS[i]
  local j, cost = request(i, 2)
  if key ~= cur then
    if dirty then store(cur, sw, sc, ttl) end
    cur, dirty, ttl = key, false, nil
    ours, sw, sc = load2(key, parse)
    live = sw ~= nil
    if not live then sw, sc = 0, 0 end
  end
  local status, rw, rc = 0, sw, sc
  if not ours then
    status = -1
  else
    local w = Now[j]
    if refund then
      status = 1
      if sw >= w and sc > 0 then
        local c = sc - cost
        if c < 0 then c = 0 end
        sc, dirty = c, true
      end
    else
      -- A lagging `now` stays in the state's window.
      if sw > w then w = sw end
      local count = 0
      if w == sw then count = sc end
      if charge then
        -- Always taken; the count stops at limit + MAX_CHARGE, and never moves back.
        status = 1
        if cost > 0 then
          local c, cap = count + cost, Limit[j] + MAX_CHARGE
          if cap < count then cap = count end
          if c > cap then c = cap end
          if not (live and w == sw) then ttl = ttl_until((w + 1) * P[j]) end
          live, sw, sc, dirty = true, w, c, true
        end
      elseif count + cost <= Limit[j] then
        status = 1
        if cost > 0 then
          if not (live and w == sw) then ttl = ttl_until((w + 1) * P[j]) end
          live, sw, sc, dirty = true, w, count + cost, true
        end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = status, rw, rc
  n = n + 3
end
if dirty then store(cur, sw, sc, ttl) end
return out
