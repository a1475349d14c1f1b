-- Sliding log (see algorithm/sliding_log.rs). State: a list of grant time stamps (pairs),
-- oldest first, one element per unit granted (a grant of cost c is c equal elements), so the
-- list never holds more than `limit` elements and the units held are its length.
-- Quota block (4): limit, period (u, r), W. Per request: quota index, cost (units for a
-- refund).
-- Reply per request: status, units held after the call, the newest stamp (u, r) or (-1, 0)
-- when the log is empty, and when denied the stamp whose expiry makes room (u, r).
-- Expiry bucket width: W, a power of two above the period (µs). The key must live until the
-- newest stamp + period.
local F = blocks(4)
local Limit, Pu, Pr, W = F[1], F[2], F[3], F[4]
local chunk = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local j, cost = request(i, 4)
  local limit, pu, pr, w = Limit[j], Pu[j], Pr[j], W[j]
  local status, held, lu, lr, ru, rr = 0, 0, -1, 0, 0, 0
  local ok, len = pcall(rcall, 'LLEN', key)
  if not ok then
    status = -1
  elseif refund then
    status = 1
    if len > 0 then
      rcall('LTRIM', key, 0, -cost - 1)
      held = len - cost
      if held < 0 then held = 0 end
    end
  else
    held = len
    -- A lagging `now` counts as the newest grant's time: nothing expires early.
    local su, sr = now_u, now_r
    if len > 0 then
      lu, lr = pair(rcall('LINDEX', key, -1))
      if not (lu and lr) then
        status, lu, lr = -1, -1, 0
      elseif su < lu or (su == lu and sr < lr) then
        su, sr = lu, lr
      end
    end
    local last = lu
    -- Forget grants that left the window: t + period ≤ stamp.
    while status == 0 and held > 0 do
      local tu, tr = pair(rcall('LINDEX', key, 0))
      if not (tu and tr) then status = -1 break end
      tu, tr = tu + pu, tr + pr
      if tr >= 1000 then tu, tr = tu + 1, tr - 1000 end
      if su < tu or (su == tu and sr < tr) then break end
      rcall('LPOP', key)
      held = held - 1
    end
    if held == 0 then lu, lr = -1, 0 end
    if status == 0 then
      if charge or held + cost <= limit then
        status = 1
        -- A charge logs at most `limit` units and the log keeps its newest `limit` units
        -- (see algorithm/mod.rs).
        if cost > limit then cost = limit end
        if cost > 0 then
          local before = held
          local stamp = fmt(su, sr)
          local left = cost
          while left > 0 do
            local k = math.min(left, 1000)
            for j = 1, k do chunk[j] = stamp end
            for j = k + 1, #chunk do chunk[j] = nil end
            rcall('RPUSH', key, unpack(chunk))
            left = left - k
          end
          held = held + cost
          if held > limit then
            rcall('LTRIM', key, -limit, -1)
            held = limit
          end
          lu, lr = su, sr
          local b = floor(su / w)
          if before == 0 or last < 0 or b ~= floor(last / w) then
            rcall('PEXPIRE', key, ttl_until((b + 2) * w))
          end
        end
      else
        -- The grant whose expiry frees enough: the (held + cost − limit)-th oldest unit.
        ru, rr = pair(rcall('LINDEX', key, held + cost - limit - 1))
        if not (ru and rr) then status, ru, rr = -1, 0, 0 end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = status, held, lu, lr, ru, rr
  n = n + 6
end
return out
