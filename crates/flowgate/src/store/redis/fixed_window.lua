-- Fixed window (see algorithm/fixed_window.rs). State: a hash with one field, the window (hex;
-- the window index, start divided by the period), whose value is the count (decimal, as
-- HINCRBY keeps it). Periods are whole microseconds (checked by the client), so the window
-- index is exact.
-- Calendar quotas (see calendar.rs): period 0, and the window is the start of the calendar
-- period containing now, in seconds. Time zones cannot be computed here, so the client passes
-- the starts of the previous, current and next periods around its own clock and the next
-- one's end (B1 < B2 < B3 < B4, seconds); the script uses the one containing the server's
-- time. A server clock outside [B1, B4) — more than a whole period from the client's — is
-- status -2: nothing is counted and the client reports the skew.
-- Quota block (6): limit, period in µs (0 for a calendar), B1..B4 (0 unless a calendar).
-- Per request: quota index, cost (units for a refund).
-- Reply per request: status, window, count as read; zeros for a new key.
--
-- One command per request: a lone check of a key in a call (the common case with many keys)
-- is one HINCRBY of the current window's field, undone when it goes past the limit. That is
-- exact because the hash never holds a field but the newest window's: a field that exists is
-- the state's window, and a field HINCRBY creates is a new window (the key's first, set to
-- expire at the window's end) unless the hash holds others — an older window, which the
-- general path below replaces, or a newer one (a clock behind the state's window), which it
-- counts in, as the reference does. Charges, refunds, checks of 0 and runs of one key read
-- the hash once (HGETALL), decide every request in memory and write once.
--
-- Values of earlier builds: a string "window count" (hex) at the same key. A hash command on
-- it fails (WRONGTYPE); the general path then rewrites it as a hash, keeping its expiry, so an
-- upgrade neither loses nor doubles a window's count. (An earlier build meeting the hash
-- reports a value it did not write: upgrade every instance sharing a Redis together.)
-- Expiry: the end of the window, set when a write starts a window.
local F = blocks(6)
local Limit, P = F[1], F[2]
-- A field's window; nil when malformed.
local function window_of(field) return tonumber(field, 16) end
local function field_of(w) return string.format('%x', w) end
-- The current window of each quota, its field, and its end (µs); nil for a calendar period
-- the client did not pass.
local Now, Field, End = {}, {}, {}
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
  if Now[j] then Field[j] = field_of(Now[j]) end
end

-- An earlier build's "window count" (hex) string at `key`, rewritten as this script's hash
-- with the same expiry. False if `key` holds anything else.
local function migrate(key)
  local ok, v = get(key)
  if not (ok and v) then return false end
  local sp = string.find(v, ' ', 1, true)
  if not sp then return false end
  local w, c = tonumber(string.sub(v, 1, sp - 1), 16), tonumber(string.sub(v, sp + 1), 16)
  if not (w and c) then return false end
  local ttl = rcall('PTTL', key)
  rcall('DEL', key)
  rcall('HSET', key, field_of(w), c)
  if ttl > 0 then rcall('PEXPIRE', key, ttl) end
  return true
end

-- The state at `key`: (true, window, count, fields) with `fields` the hash as HGETALL returned
-- it (the newest window wins; several fields are cleaned up by the next write); (true) for a
-- missing key; (false) for a value Flowgate did not write.
local function load(key)
  local ok, v = pcall(rcall, 'HGETALL', key)
  if not ok then
    if not migrate(key) then return false end
    v = rcall('HGETALL', key)
  end
  if #v == 0 then return true end
  local sw, sc
  for k = 1, #v, 2 do
    local w, c = window_of(v[k]), tonumber(v[k + 1])
    if not (w and c) then return false end
    if not sw or w > sw then sw, sc = w, c end
  end
  return true, sw, sc, v
end

-- Writes the state (window `w`, count `c`) over the hash read as `fields`, dropping every other
-- window; sets the expiry `ttl` (ms) when given, else keeps the key's.
local function store(key, fields, w, c, ttl)
  local f = field_of(w)
  if fields then
    for k = 1, #fields, 2 do
      if fields[k] ~= f then rcall('HDEL', key, fields[k]) end
    end
  end
  rcall('HSET', key, f, c)
  if ttl then rcall('PEXPIRE', key, ttl) end
end

-- Whether a request alone in its run may take the one-command path (checks only).
local lone = not refund and not charge

-- The run's key and its state: `ours` unless it holds a value Flowgate did not write; `live`
-- when it has a value (read or to be written); `fields` the hash as read; `dirty` when the
-- state must be written, with a new expiry `ttl` or, when nil, the one it has.
local cur, ours, live, sw, sc, fields, dirty, ttl
for i = 1, #KEYS do
  local key = KEYS[i]
  local j, cost = request(i, 6)
  local status, rw, rc
  if lone and cost > 0 and Field[j] and KEYS[i - 1] ~= key and KEYS[i + 1] ~= key then
    -- A lone check: one HINCRBY (redis.pcall answers an error, e.g. WRONGTYPE, as a table
    -- instead of raising it; the general path then reads the key).
    local f = Field[j]
    local c = redis.pcall('HINCRBY', key, f, cost)
    if type(c) == 'number' then
      if c > cost then
        -- The field existed: it is the state's window.
        status, rw, rc = 1, Now[j], c - cost
        if c > Limit[j] then
          rcall('HINCRBY', key, f, -cost)
          status = 0
        end
      elseif rcall('HLEN', key) == 1 then
        -- A new window (or one refunded to 0, which decides alike): cost ≤ limit, granted.
        rcall('PEXPIRE', key, ttl_until(End[j]))
        status, rw, rc = 1, 0, 0
      else
        -- Other windows are there (so the field is new: the hash holds only its newest).
        rcall('HDEL', key, f)
      end
    end
  end
  if status then
    -- Decided in one command; a key met again later is read again.
    if dirty then store(cur, fields, sw, sc, ttl) end
    cur, dirty = nil, false
  else
    if key ~= cur then
      if dirty then store(cur, fields, sw, sc, ttl) end
      cur, ttl = key, nil
      ours, sw, sc, fields = load(key)
      live = sw ~= nil
      if not live then sw, sc = 0, 0 end
      -- Older windows left beside the newest are dropped by the run's write.
      dirty = fields ~= nil and #fields > 2
    end
    status, rw, rc = 0, sw, sc
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
  end
  out[n + 1], out[n + 2], out[n + 3] = status, rw, rc
  n = n + 3
end
if dirty then store(cur, fields, sw, sc, ttl) end
return out
