-- Sliding-window counter (see algorithm/sliding_window.rs). State: "window current previous"
-- (hex). Periods are whole microseconds (checked by the client), so the window index is exact.
-- Quota block (2): limit, period in µs. Per request: quota index, cost (units for a refund).
-- Reply per request: status, window, current, previous as read; zeros for a new key.

-- a·(u·1000 + r) as four base-2^24 limbs, most significant first. Exact for a < 2^32 (counts
-- never pass 2^32 − 1, charged ones included),
-- u < 2^51, r < 1000: every partial product stays below 2^53, and divisions by powers of two
-- are exact.
local B = 16777216
local function mul(a, u, r)
  local u2 = math.floor(u / 281474976710656)
  local rest = u - u2 * 281474976710656
  local u1 = math.floor(rest / B)
  local y0 = (rest - u1 * B) * 1000 + r
  local c = math.floor(y0 / B)
  local x0 = y0 - c * B
  local y1 = u1 * 1000 + c
  c = math.floor(y1 / B)
  local x1 = y1 - c * B
  local x2 = u2 * 1000 + c
  local a1 = math.floor(a / B)
  local a0 = a - a1 * B
  local p0, p1 = a0 * x0, a0 * x1 + a1 * x0
  local p2, p3 = a0 * x2 + a1 * x1, a1 * x2
  c = math.floor(p0 / B); p0 = p0 - c * B; p1 = p1 + c
  c = math.floor(p1 / B); p1 = p1 - c * B; p2 = p2 + c
  c = math.floor(p2 / B); p2 = p2 - c * B; p3 = p3 + c
  return p3, p2, p1, p0
end

-- a·x ≤ b·y, exactly (x = (xu, xr) and y = (yu, yr) as pairs).
local function mul_le(a, xu, xr, b, yu, yr)
  local a3, a2, a1, a0 = mul(a, xu, xr)
  local b3, b2, b1, b0 = mul(b, yu, yr)
  if a3 ~= b3 then return a3 < b3 end
  if a2 ~= b2 then return a2 < b2 end
  if a1 ~= b1 then return a1 < b1 end
  return a0 <= b0
end

local F = blocks(2)
local Limit, P = F[1], F[2]
for i = 1, #KEYS do
  local key = KEYS[i]
  local j, cost = request(i, 2)
  local limit, p = Limit[j], P[j]
  local status, sw, sc, sp = 0, 0, 0, 0
  local ok, v = get(key)
  if not ok then
    status = -1
  elseif v then
    local s1, s2, s3 = string.match(v, '^(%x+) (%x+) (%x+)$')
    if s1 then
      sw, sc, sp = tonumber(s1, 16), tonumber(s2, 16), tonumber(s3, 16)
    else
      status = -1
    end
  end
  if status == 0 then
    -- Roll the state forward to now's window; e = (eu, er) is how far into it now is.
    local nw = div(now_u, p)
    local w, cur, prev, eu, er = sw, sc, sp, 0, 0
    if nw <= sw then
      local su = sw * p
      if su < now_u then eu, er = now_u - su, now_r elseif su == now_u then er = now_r end
    else
      w, cur, prev = nw, 0, 0
      if nw == sw + 1 then prev = sc end
      eu, er = now_u - nw * p, now_r
    end
    local write = false
    if refund then
      -- Like the memory store, a refund leaves a key it does not know alone.
      status, write = 1, v and true or false
      if w == sw then
        cur = cur - cost
        if cur < 0 then cur = 0 end
      else
        prev = prev - cost
        if prev < 0 then prev = 0 end
      end
    elseif charge then
      -- Always taken; the count stops at 2^32 − 1 (the memory store's packing), and never
      -- moves back.
      status = 1
      if cost > 0 then
        local cap = 4294967295
        if cap < cur then cap = cur end
        cur = cur + cost
        if cur > cap then cur = cap end
        write = true
      end
    else
      -- Granted if prev·(p − e) + (cur + cost)·p ≤ limit·p, i.e. prev·(p − e) ≤ room·p.
      local room = limit - cur - cost
      if room >= 0 then
        local du, dr = p - eu, -er
        if dr < 0 then du, dr = du - 1, dr + 1000 end
        if prev == 0 or mul_le(prev, du, dr, room, p, 0) then
          status = 1
          cur = cur + cost
          write = cost > 0
        end
      end
    end
    if write then
      local value = string.format('%x %x %x', w, cur, prev)
      -- The key lives until (w + 2)·p while the current window has units, (w + 1)·p after.
      if v and w == sw and sc > 0 and not refund then
        rcall('SET', key, value, 'KEEPTTL')
      else
        local idle = 0
        if cur > 0 then idle = (w + 2) * p elseif prev > 0 then idle = (w + 1) * p end
        rcall('SET', key, value, 'PX', ttl_until(idle))
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = status, sw, sc, sp
  n = n + 4
end
return out
