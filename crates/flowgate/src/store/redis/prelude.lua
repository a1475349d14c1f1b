-- Flowgate: shared start of every algorithm script.
--
-- Lua numbers are doubles, exact only for integers below 2^53, while a time stamp in
-- nanoseconds since the Unix epoch is about 2^61. So every instant and duration travels as a
-- pair (u, r): u whole microseconds and r < 1000 nanoseconds. u stays below 2^53 until the
-- year 2255, and sums, differences and comparisons of pairs are exact. Stored values are
-- hexadecimal (parsed with strtoul, three times faster than decimal); an instant or duration
-- is stored as hex(u) followed by r in exactly three hex digits.
--
-- ARGV[1], ARGV[2]: now as (u, r), or ARGV[1] == '' to use the server's TIME.
-- ARGV[3]: '0' to check (take units if granted), '1' to refund, '2' to charge (costs up to
-- MAX_CHARGE, by the client). ARGV[4]: q, the number of quotas. ARGV[5]: the cost of every
-- request when all share one quota and one cost, else ''. Then q quota blocks of a fixed size
-- per script; then, unless ARGV[5] is set, per request: its quota's index (1-based) and cost.
-- Reply: { now_u, now_r, then a fixed number of integers per request }; a request's first
-- integer is its status: 1 granted (or refunded), 0 denied, -1 the key holds a value that
-- Flowgate did not write (the request is left alone).
--
-- Expiry: a key must live until its state is idle (indistinguishable from a fresh key).
-- Setting an expiry costs Redis twice as much as the write itself, so a write sets one (PX)
-- only when the idle time moves into a new bucket of width W (per script), and then to the end
-- of the bucket after it; other writes keep the expiry (KEEPTTL, Redis ≥ 6). A key thus lives
-- at most 2·W beyond its idle time.

local floor = math.floor
local rcall = redis.call

-- floor(u / p) for whole numbers below 2^53: the quotient of doubles, corrected where it was
-- rounded up to the next integer.
local function div(u, p)
  local q = floor(u / p)
  if q * p > u then return q - 1 end
  if (q + 1) * p <= u then return q + 1 end
  return q
end

-- A stored pair: hex(u) .. three hex digits of r. nil when malformed.
local function pair(s)
  return tonumber(string.sub(s, 1, -4), 16), tonumber(string.sub(s, -3), 16)
end

local function fmt(u, r)
  return string.format('%x%03x', u, r)
end

-- Milliseconds from now until `deadline_u` (µs), at least MIN_TTL_MS. Redis counts an
-- expiry in its own time while `now` may be the caller's (an injected clock): a floor of one
-- second keeps a key of a sub-millisecond period from vanishing between two calls that are
-- close in the caller's time but not in Redis's. Holding an idle key longer changes no
-- decision (an idle key and a missing one answer alike); it costs its memory for that second.
local MIN_TTL_MS = 1000
local now_u, now_r
local function ttl_until(deadline_u)
  local ms = floor((deadline_u - now_u) / 1000) + 1
  if ms < MIN_TTL_MS then return MIN_TTL_MS end
  return ms
end

if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_u, now_r = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
else
  now_u, now_r = tonumber(ARGV[1]), tonumber(ARGV[2])
end
local refund = ARGV[3] == '1'
-- A charge (see State::charge in algorithm/mod.rs) always takes its units, into debt past the
-- limit: a bucket's debt stops at MAX_DEBT_U µs beyond τ, a fixed window's count at the limit +
-- MAX_CHARGE, a sliding window's at 2^32 − 1.
local charge = ARGV[3] == '2'
local MAX_DEBT_U = 1125899906842624
local MAX_CHARGE = 8796093022208
local quotas = tonumber(ARGV[4])
local uniform = tonumber(ARGV[5])
local out = { now_u, now_r }
local n = 2

-- Quota block j's fields, parsed once: field(k)[j] is the k-th number of block j.
local function blocks(size)
  local fields = {}
  for k = 1, size do
    local f = {}
    for j = 1, quotas do f[j] = tonumber(ARGV[5 + (j - 1) * size + k]) end
    fields[k] = f
  end
  return fields
end

-- Request i's quota index and cost.
local function request(i, size)
  if uniform then return 1, uniform end
  local at = 5 + quotas * size + 2 * i
  return tonumber(ARGV[at - 1]), tonumber(ARGV[at])
end

-- The value at `key`, or (false, nil) if it is not a string (a key Flowgate did not write).
local function get(key)
  local ok, v = pcall(rcall, 'GET', key)
  if ok then return true, v end
  return false, nil
end

-- Runs: the client sorts a batch by key (keeping the order of a key's requests), so requests
-- for one key are adjacent. A script reads a run's state once (`load2`), carries it from
-- request to request exactly as a GET would have returned it, and writes it once at the end
-- of the run (`store2`): N decisions on a hot key cost one GET and at most one SET. The final
-- write sets the expiry of the run's last write that set one (`ttl`, ms), else keeps it.
-- (Correct in any order: a key met again after its run was written is read again.)

-- The state at `key`, two numbers parsed from its text by `parse` (nil when malformed):
-- (true, a, b); (true) for a missing key; (false) for a value Flowgate did not write (not a
-- string, or text `parse` rejects).
local function load2(key, parse)
  local ok, v = get(key)
  if not ok then return false end
  if not v then return true end
  local a, b = parse(v)
  if a and b then return true, a, b end
  return false
end

-- Writes `value` (text) at `key`, with an expiry `ttl` (ms) or, when nil, the one it has.
local function store2(key, value, ttl)
  if ttl then
    rcall('SET', key, value, 'PX', ttl)
  else
    rcall('SET', key, value, 'KEEPTTL')
  end
end
