-- Leaky bucket (see algorithm/leaky_bucket.rs). State: level and last update, both pairs.
-- Quota block (5): T (u, r), τ (u, r), W. Per request: quota index, cost (units for a refund).
-- Reply per request: status, level (u, r), updated (u, r) as read; zeros for a new key.
-- Expiry bucket width: W, a power of two ≥ τ (µs). The key must live until updated + level.
local F = blocks(5)
local Tu, Tr, Tau_u, Tau_r, W = F[1], F[2], F[3], F[4], F[5]
local function times_t(j, cost)
  local ci = cost * Tr[j]
  local carry = div(ci, 1000)
  return cost * Tu[j] + carry, ci - 1000 * carry
end
local j, cost, cu, cr = 1, uniform, 0, 0
if uniform then cu, cr = times_t(1, uniform) end
for i = 1, #KEYS do
  local key = KEYS[i]
  if not uniform then
    j, cost = request(i, 5)
    cu, cr = times_t(j, cost)
  end
  local tu, tr, w = Tau_u[j], Tau_r[j], W[j]
  local status, lu, lr, uu, ur = 0, 0, 0, 0, 0
  local ok, v = get(key)
  if not ok then
    status = -1
  elseif v then
    local sp = string.find(v, ' ', 1, true)
    lu = nil
    if sp then
      lu, lr = pair(string.sub(v, 1, sp - 1))
      uu, ur = pair(string.sub(v, sp + 1))
    end
    if not (lu and lr and uu and ur) then status, lu, lr, uu, ur = -1, 0, 0, 0, 0 end
  end
  if status == 0 then
    -- Drained level: level − (now − updated), neither below zero.
    local eu, er = 0, 0
    if uu < now_u or (uu == now_u and ur < now_r) then
      eu, er = now_u - uu, now_r - ur
      if er < 0 then eu, er = eu - 1, er + 1000 end
    end
    local du, dr = lu - eu, lr - er
    if dr < 0 then du, dr = du - 1, dr + 1000 end
    if du < 0 then du, dr = 0, 0 end
    -- The new update time: max(updated, now).
    local mu, mr = uu, ur
    if mu < now_u or (mu == now_u and mr < now_r) then mu, mr = now_u, now_r end
    local fu, fr
    if refund then
      -- Like the memory store, a refund leaves a key it does not know alone.
      status = 1
      if not v then cost = 0 end
      fu, fr = du - cu, dr - cr
      if fr < 0 then fu, fr = fu - 1, fr + 1000 end
      if fu < 0 then fu, fr = 0, 0 end
      if not v then fu = nil end
    else
      fu, fr = du + cu, dr + cr
      if fr >= 1000 then fu, fr = fu + 1, fr - 1000 end
      if charge then
        -- Always taken; the level stops at τ + MAX_DEBT, and never moves back.
        status = 1
        local xu = tu + MAX_DEBT_U
        if fu > xu or (fu == xu and fr > tr) then
          if du > xu or (du == xu and dr > tr) then fu, fr = du, dr else fu, fr = xu, tr end
        end
        if cost == 0 then fu = nil end
      elseif fu < tu or (fu == tu and fr <= tr) then
        status = 1
        if cost == 0 then fu = nil end
      else
        fu = nil
      end
    end
    if fu then
      local value = fmt(fu, fr) .. ' ' .. fmt(mu, mr)
      local ir = mr + fr
      local b = floor((mu + fu + floor(ir / 1000)) / w)
      if v and not refund and b == floor((uu + lu + floor((ur + lr) / 1000)) / w) then
        rcall('SET', key, value, 'KEEPTTL')
      else
        rcall('SET', key, value, 'PX', ttl_until((b + 2) * w))
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = status, lu, lr, uu, ur
  n = n + 5
end
return out
