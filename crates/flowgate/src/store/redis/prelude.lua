-- Flowgate: shared start of every algorithm script.
--
-- Lua numbers are doubles, exact only for integers below 2^53, while a time stamp in
-- nanoseconds since the Unix epoch is about 2^61. So every instant and duration travels as a
-- pair (u, r): u whole microseconds and r < 1000 nanoseconds. u stays below 2^53 until the
-- year 2255, and sums, differences and comparisons of pairs are exact. Instants are stored as
-- decimal nanoseconds ("1712345678901234567"), split into a pair when read.
--
-- ARGV[1], ARGV[2]: now as (u, r), or ARGV[1] == '' to use the server's TIME.
-- ARGV[3]: '0' to acquire, '1' to refund. Then a fixed number of arguments per request.
-- Reply: { now_u, now_r, then a fixed number of integers per request }; a request's first
-- integer is its status: 1 granted (or refunded), 0 denied, -1 the key holds a value that
-- Flowgate did not write (the request is left alone).

local function add(au, ar, bu, br)
  local u, r = au + bu, ar + br
  if r >= 1000 then return u + 1, r - 1000 end
  return u, r
end

local function sub(au, ar, bu, br)
  local u, r = au - bu, ar - br
  if r < 0 then return u - 1, r + 1000 end
  return u, r
end

local function less(au, ar, bu, br)
  return au < bu or (au == bu and ar < br)
end

-- a − b, or zero when b is later.
local function since(au, ar, bu, br)
  if less(au, ar, bu, br) then return 0, 0 end
  return sub(au, ar, bu, br)
end

-- Milliseconds to keep a key whose state goes idle u microseconds from now: rounded up (and
-- one more, so that rounding of u / 1000 can never shorten it), at least 1.
local function ttl(u)
  if u < 0 then return 1 end
  return math.floor(u / 1000) + 1
end

-- floor(u / p) for whole numbers below 2^53: the quotient of doubles, corrected where it was
-- rounded up to the next integer.
local function div(u, p)
  local q = math.floor(u / p)
  if q * p > u then return q - 1 end
  if (q + 1) * p <= u then return q + 1 end
  return q
end

local now_u, now_r
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_u, now_r = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
else
  now_u, now_r = tonumber(ARGV[1]), tonumber(ARGV[2])
end
local refund = ARGV[3] == '1'
local out = { now_u, now_r }
local n = 2
