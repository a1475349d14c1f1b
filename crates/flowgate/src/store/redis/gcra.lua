-- GCRA (see algorithm/gcra.rs). State: the theoretical arrival time `tat`.
-- Quota block (5): T (u, r), τ (u, r), W. Per request: quota index, cost (units for a refund).
-- Reply per request: status, the tat read (u, r); (0, 0) for a key never seen.
-- Runs of one key read and write its state once (see the prelude).
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

-- The run's key and its state: `ours` unless it holds a value Flowgate did not write; `live`
-- when it has a value (read or to be written); `dirty` when the state must be written, with a
-- new expiry `ttl` or, when nil, the one it has.
local cur, ours, live, su, sr, dirty, ttl
for i = 1, #KEYS do
  local key = KEYS[i]
  if not uniform then
    j, cost = request(i, 5)
    cu, cr = times_t(j, cost)
  end
  if key ~= cur then
    if dirty then store2(cur, fmt(su, sr), ttl) end
    cur, dirty, ttl = key, false, nil
    ours, su, sr = load2(key, pair)
    live = su ~= nil
    if not live then su, sr = 0, 0 end
  end
  local tu, tr, w = Tau_u[j], Tau_r[j], W[j]
  local status, ru, rr = 0, su, sr
  if not ours then
    status = -1
  else
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
      local bu, br = su, sr
      if su < now_u or (su == now_u and sr < now_r) then bu, br = now_u, now_r end
      nu, nr = bu + cu, br + cr
      if nr >= 1000 then nu, nr = nu + 1, nr - 1000 end
      local lu, lr = now_u + tu, now_r + tr
      if lr >= 1000 then lu, lr = lu + 1, lr - 1000 end
      if charge then
        -- Always taken; the tat stops at now + τ + MAX_DEBT, and never moves back.
        status = 1
        local xu = lu + MAX_DEBT_U
        if nu > xu or (nu == xu and nr > lr) then
          if bu > xu or (bu == xu and br > lr) then nu, nr = bu, br else nu, nr = xu, lr end
        end
        if cost == 0 then nu = nil end
      elseif nu < lu or (nu == lu and nr <= lr) then
        status = 1
        if cost == 0 then nu = nil end
      else
        nu = nil
      end
    end
    if nu then
      local b = floor(nu / w)
      if not (live and not refund and b == floor(su / w)) then ttl = ttl_until((b + 2) * w) end
      live, su, sr, dirty = true, nu, nr, true
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = status, ru, rr
  n = n + 3
end
if dirty then store2(cur, fmt(su, sr), ttl) end
return out
