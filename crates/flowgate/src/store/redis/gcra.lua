-- GCRA (see algorithm/gcra.rs). State: the theoretical arrival time `tat`, in decimal ns.
-- Per request, ARGV: cost, cost·T (u, r), τ (u, r). For a refund, cost·T is units·T.
-- Reply per request: status, the tat read (u, r); (0, 0) for a key never seen.
local a = 4
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost = tonumber(ARGV[a])
  local cu, cr = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local tu, tr = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  a = a + 5
  local status, su, sr = 0, 0, 0
  local v = redis.pcall('GET', key)
  if v then
    local s1, s2
    if type(v) == 'string' then s1, s2 = string.match(v, '^(%d+)(%d%d%d)$') end
    if s1 then su, sr = tonumber(s1), tonumber(s2) else status = -1 end
  end
  if status == 0 then
    if refund then
      status = 1
      if less(now_u, now_r, su, sr) then
        local nu, nr = since(su, sr, cu, cr)
        if less(nu, nr, now_u, now_r) then nu, nr = now_u, now_r end
        redis.call('SET', key, string.format('%d%03d', nu, nr), 'PX', ttl(nu - now_u))
      end
    else
      local bu, br = su, sr
      if less(bu, br, now_u, now_r) then bu, br = now_u, now_r end
      local nu, nr = add(bu, br, cu, cr)
      local lu, lr = add(now_u, now_r, tu, tr)
      if not less(lu, lr, nu, nr) then
        status = 1
        if cost > 0 then
          redis.call('SET', key, string.format('%d%03d', nu, nr), 'PX', ttl(nu - now_u))
        end
      end
    end
  end
  out[n + 1], out[n + 2], out[n + 3] = status, su, sr
  n = n + 3
end
return out
