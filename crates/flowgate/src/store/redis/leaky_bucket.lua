-- Leaky bucket (see algorithm/leaky_bucket.rs). State: "level updated", both decimal ns.
-- Per request, ARGV: cost, cost·T (u, r), τ (u, r). For a refund, cost·T is units·T.
-- Reply per request: status, level (u, r), updated (u, r) as read; zeros for a new key.
local a = 4
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost = tonumber(ARGV[a])
  local cu, cr = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local tu, tr = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  a = a + 5
  local status, lu, lr, uu, ur = 0, 0, 0, 0, 0
  local v = redis.pcall('GET', key)
  if v then
    local s1, s2, s3, s4
    if type(v) == 'string' then
      s1, s2, s3, s4 = string.match(v, '^(%d+)(%d%d%d) (%d+)(%d%d%d)$')
    end
    if s1 then
      lu, lr, uu, ur = tonumber(s1), tonumber(s2), tonumber(s3), tonumber(s4)
    else
      status = -1
    end
  end
  if status == 0 then
    -- The level drained until now, and the new update time max(updated, now).
    local eu, er = since(now_u, now_r, uu, ur)
    local du, dr = since(lu, lr, eu, er)
    local mu, mr = uu, ur
    if less(mu, mr, now_u, now_r) then mu, mr = now_u, now_r end
    local fu, fr
    if refund then
      status = 1
      fu, fr = since(du, dr, cu, cr)
    else
      fu, fr = add(du, dr, cu, cr)
      if less(tu, tr, fu, fr) then
        fu = nil -- over capacity: denied, nothing changes
      else
        status = 1
        if cost == 0 then fu = nil end
      end
    end
    if fu then
      local iu = add(mu, mr, fu, fr)
      redis.call('SET', key, string.format('%d%03d %d%03d', fu, fr, mu, mr), 'PX', ttl(iu - now_u))
    end
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = status, lu, lr, uu, ur
  n = n + 5
end
return out
