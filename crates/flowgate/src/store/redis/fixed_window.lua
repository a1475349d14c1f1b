-- Fixed window (see algorithm/fixed_window.rs). State: "window count" (hex), window = start
-- divided by the period. Periods are whole microseconds (checked by the client), so the
-- window index is exact.
-- Calendar quotas (see calendar.rs): period 0, and the window is the start of the calendar
-- period containing now, in seconds. Time zones cannot be computed here, so the client passes
-- the starts of the previous, current and next periods around its own clock and the next
-- one's end (B1 < B2 < B3 < B4, seconds); the script uses the one containing the server's
-- time. A server clock outside [B1, B4) — more than a whole period from the client's — is
-- status -2: nothing is counted and the client reports the skew.
-- Quota block (6): limit, period in µs (0 for a calendar), B1..B4 (0 unless a calendar).
-- Per request: quota index, cost (units for a refund).
-- Reply per request: status, window, count as read; zeros for a new key.
-- Runs of one key read and write its state once (see the prelude).
-- Expiry: the end of the window, set when a write starts a window.
local F = blocks(6)
local Limit, P = F[1], F[2]
-- "window count" as two numbers; nil when malformed.
local function parse(v)
  local sp = string.find(v, ' ', 1, true)
  if not sp then return nil end
  return tonumber(string.sub(v, 1, sp - 1), 16), tonumber(string.sub(v, sp + 1), 16)
end
local function store(key, w, c, ttl) store2(key, string.format('%x %x', w, c), ttl) end
-- The current window of each quota and its end (µs); nil for a calendar period the client
-- did not pass.
local Now, End = {}, {}
for j = 1, quotas do
  if P[j] > 0 then
    Now[j] = div(now_u, P[j])
    End[j] = (Now[j] + 1) * P[j]
  else
    for k = 3, 5 do
      local s, e = F[k][j], F[k + 1][j]
      if s * 1000000 <= now_u and now_u < e * 1000000 then Now[j], End[j] = s, e * 1000000 end
    end
  end
end

-- The run's key and its state: `ours` unless it holds a value Flowgate did not write; `live`
-- when it has a value (read or to be written); `dirty` when the state must be written, with a
-- new expiry `ttl` or, when nil, the one it has.
local cur, ours, live, sw, sc, dirty, ttl
for i = 1, #KEYS do
  local key = KEYS[i]
  local j, cost = request(i, 6)
  if key ~= cur then
    if dirty then store(cur, sw, sc, ttl) end
    cur, dirty, ttl = key, false, nil
    ours, sw, sc = load2(key, parse)
    live = sw ~= nil
    if not live then sw, sc = 0, 0 end
  end
  local status, rw, rc = 0, sw, sc
  local w = Now[j]
  if not ours then
    status = -1
  elseif not w then
    status = -2
  else
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
          -- (A new window is always the current one, whose end is End[j].)
          if not (live and w == sw) then ttl = ttl_until(End[j]) end
          live, sw, sc, dirty = true, w, c, true
        end
      elseif count + cost <= Limit[j] then
        status = 1
        if cost > 0 then
          if not (live and w == sw) then ttl = ttl_until(End[j]) end
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
