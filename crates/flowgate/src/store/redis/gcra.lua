-- GCRA (see algorithm/gcra.rs). State: the theoretical arrival time `tat`.
-- Quota block (5): T (u, r), τ (u, r), W. Per request: quota index, cost (units for a refund).
-- Reply per request: status, the tat read (u, r); (0, 0) for a key never seen.
-- Expiry bucket width: W, a power of two ≥ τ (µs), so tat / W is exact. The key must live
-- until tat.
local F = blocks(5)
local Tu, Tr, Tau_u, Tau_r, W = F[1], F[2], F[3], F[4], F[5]
-- cost·T, exact: cost ≤ burst ≤ 2^43 keeps cost·r below 2^53.
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
  local status, su, sr = 0, 0, 0
  local ok, v = get(key)
  if not ok then
    status = -1
  elseif v then
    su, sr = pair(v)
    if not su or not sr then status, su, sr = -1, 0, 0 end
  end
  if status == 0 then
    local nu, nr
    if refund then
      status = 1
      -- tat = max(tat − units·T, now), only when tat is ahead of now.
      if now_u < su or (now_u == su and now_r < sr) then
        nu, nr = su - cu, sr - cr
        if nr < 0 then nu, nr = nu - 1, nr + 1000 end
        if nu < now_u or (nu == now_u and nr < now_r) then nu, nr = now_u, now_r end
      end
    else
      -- Granted if max(tat, now) + cost·T ≤ now + τ; the new tat is the left side.
      if su < now_u or (su == now_u and sr < now_r) then nu, nr = now_u, now_r else nu, nr = su, sr end
      nu, nr = nu + cu, nr + cr
      if nr >= 1000 then nu, nr = nu + 1, nr - 1000 end
      local lu, lr = now_u + tu, now_r + tr
      if lr >= 1000 then lu, lr = lu + 1, lr - 1000 end
      if nu < lu or (nu == lu and nr <= lr) then
        status = 1
        if cost == 0 then nu = nil end
      else
        nu = nil
      end
    end
    if nu then
      local b = floor(nu / w)
      if v and not refund and b == floor(su / w) then
        rcall('SET', key, fmt(nu, nr), 'KEEPTTL')
      else
        rcall('SET', key, fmt(nu, nr), 'PX', ttl_until((b + 2) * w))
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = status, su, sr
  n = n + 3
end
return out
