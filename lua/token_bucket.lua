-- Token bucket (the generic cell rate algorithm): a bucket of `burst`
-- tokens, refilled at `limit` tokens per window. Same semantics as
-- decide() in src/limit/algorithms/token_bucket.rs.
--
-- Time is counted in units of 1/k microsecond, with g = gcd(limit, window),
-- k = limit / g and step = window / g: one token refills in exactly `step`
-- units, so nothing is rounded. The state is the bucket's debt: the units
-- of time until it is full again (the stored "theoretical arrival time"
-- less the time it was stored).
--
-- KEYS[1]  limiter state (hash): t = when the debt was stored (microseconds),
--          d = the debt then (units of 1/k microsecond), k = the k it was
--          counted in (a changed limit converts it, rounded up), b = when
--          the state began (a lease or charge from before it, a reset
--          ago, is not this bucket's); with leases out: p = the lease
--          period of h, h = tokens leased in period p, o = tokens leased
--          in period p - 1
-- ARGV[1]  limit (tokens refilled per window, > 0)
-- ARGV[2]  window length in microseconds
-- ARGV[3]  hits (cost of this call; 0 checks without counting)
-- ARGV[4]  1 to give tokens back (never above the burst), 0 to take them;
--          2 to take back what a receipt says a call took (undo): of the
--          ARGV[3] tokens taken at ARGV[7] (microseconds), leaving the
--          debt ARGV[8], the part still ahead of now on the bucket's
--          timeline (the part already past stays spent);
--          3 to take leases: each hit is a lease of that many tokens,
--          answered with its life as the reset and the receipt {tokens,
--          when it was taken (microseconds), tokens}; 4 to end a lease:
--          of the ARGV[8] tokens leased at ARGV[7], ARGV[3] unused go
--          back, only while the lease lives and the bucket is the one it
--          was taken from (begun before it): a give-back that lands after
--          the lease's life (the bucket has refilled over its tokens
--          since) or after a reset returns nothing
--          Leases: tokens a replica took to spend on its own until the
--          lease's life ends (the end of the period after the one it was
--          taken in; a period is the window, within 1 to 10 s). While a
--          lease lives, its tokens count as still in the bucket for the
--          bucket's size: the bucket refills only up to the burst less
--          the tokens leased out, so what the leases spend later and
--          what the bucket gives meanwhile never pass what one bucket
--          would.
-- ARGV[5]  burst: the bucket's size in tokens, 1 to 2^53 / step (the store
--          holds it there, so burst x step stays exact)
-- ARGV[6]  1 to record every positive cost, also one the bucket cannot
--          pay (usage reported after the response): the bucket goes into
--          debt, and calls are refused until it is paid back at the rate;
--          2 to answer each hit with a receipt
-- ARGV[7], ARGV[8], ...  optional further (hits, negative) pairs: hits
--          queued behind this one, decided after it in order, in this
--          same atomic step (undo: the receipt's time and debt)
--
-- Returns {admitted (0/1), remaining, reset_micros} as integers, one triple
-- per hit in order: remaining = whole tokens left; reset = admitted: until
-- the bucket is full again, refused: until a call of this cost would pass.
-- With receipts, each is followed by {tokens taken, the time they were
-- taken (t), the debt right after}. Undo returns {1}.
-- A refused call takes nothing, and a cost above the burst is refused and
-- not recorded unless ARGV[6] is 1. The key expires when the bucket is full.
-- The clock is the server's (TIME), never the caller's.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- `s + 0` converts a string once, tonumber(s) twice (Lua 5.1).
local limit = ARGV[1] + 0
local w = ARGV[2] + 0
local burst = tonumber(ARGV[5])
local reports = ARGV[6] == '1'
local receipts = ARGV[6] == '2'
local max = 9007199254740992

-- fmod is exact on integers below 2^53; `%` is not.
local g, b = w, limit
while b > 0 do g, b = b, math.fmod(g, b) end
local step = w / g
local k = limit / g
local full = burst * step

-- Integer division on doubles (exact below 2^53), corrected for rounding.
local function div_floor(a, n)
  local q = math.floor(a / n)
  if q * n > a then q = q - 1 end
  if (q + 1) * n <= a then q = q + 1 end
  return q
end
local function div_ceil(a, n)
  local q = div_floor(a, n)
  if q * n < a then q = q + 1 end
  return q
end

local st = redis.call('HMGET', KEYS[1], 't', 'd', 'k', 'p', 'h', 'o', 'b')
local stamp = tonumber(st[1]) or now
-- A state written before `b` was kept began at some time unknown: 0.
local born = tonumber(st[7]) or (st[1] and 0) or now
local debt = tonumber(st[2]) or 0
local was = tonumber(st[3]) or k
local same_units = was == k
if was ~= k then
  -- The limit changed: the same time owed, in the new units, rounded up.
  local x = debt * k
  if x < max then debt = div_ceil(x, was)
  else debt = math.min(math.ceil(debt / was * k), max) end
end
-- Leases out: tokens leased in period p (h) and p - 1 (o); a lease lives
-- until the end of the period after its own.
local period = math.min(math.max(w, 1000000), 10000000)
local p = tonumber(st[4])
local h = tonumber(st[5]) or 0
local o = tonumber(st[6]) or 0
-- Tokens leased out during period q.
local function held_in(q)
  if not p then return 0 end
  local n = 0
  if q == p or q == p + 1 then n = n + h end
  if q == p or q == p - 1 then n = n + o end
  return n
end
local dirty = false
if now > stamp then
  -- Rounding is monotone and debt is exact: the comparison is exact too.
  -- With leases out, the debt drains no lower than the tokens leased
  -- (their time), period by period as leases end.
  local from = stamp
  while from < now do
    local q = math.floor(from / period)
    local to = now
    local floor = held_in(q) * step
    if floor > 0 and (q + 1) * period < now then to = (q + 1) * period end
    local drained = (to - from) * k
    if debt > floor then
      if drained >= debt - floor then debt = floor else debt = debt - drained end
    end
    from = to
  end
  stamp = now
end
-- The leases of the current period and the one before.
local current = math.floor(now / period)
if p and p ~= current then
  if p == current - 1 then o = h else o = 0 end
  h = 0
  p = current
end
local function floor_now() return (h + o) * step end
local leasing = ARGV[4] == '3'

local function remaining()
  if debt >= full then return 0 end
  return div_floor(full - debt, step)
end

local function decide(hits, negative)
  if negative then
    local back = hits * step
    if back >= debt then debt = 0 else debt = debt - back end
    debt = math.max(debt, floor_now())
    dirty = true
    return {1, remaining(), div_ceil(debt, k)}
  end
  if hits > burst and not reports then
    return {0, remaining(), div_ceil(full, k)}
  end
  local after = math.min(debt + hits * step, max)
  if after <= full then
    if hits > 0 then dirty = true end
    debt = after
    if leasing and hits > 0 then
      if not p then p = current end
      h = h + hits
      return {1, remaining(), (current + 2) * period - now, hits, now, hits}
    end
    return {1, remaining(), div_ceil(debt, k), hits, stamp, debt}
  end
  if reports and hits > 0 then
    dirty = true
    debt = after
    return {0, 0, div_ceil(debt - full, k)}
  end
  return {0, remaining(), div_ceil(after - full, k)}
end

local out = {}
local i = 3
if ARGV[4] == '2' then
  -- The charge took [tat - cost, tat] of the bucket's time; what of it is
  -- already past cannot be told from time the bucket would have refilled
  -- anyway, so only the part after now is given back.
  local at = tonumber(ARGV[7])
  local ahead = tonumber(ARGV[8])
  if now > at then ahead = ahead - (now - at) * k end
  local back = math.min(math.max(ahead, 0), tonumber(ARGV[3]) * step)
  -- A charge from before the state began (a reset since) is not here.
  if born > at then back = 0 end
  if same_units and back > 0 and debt > 0 then
    debt = math.max(debt - back, floor_now())
    dirty = true
  end
  out[1] = 1
  i = nil
elseif ARGV[4] == '4' then
  -- A lease ends: it no longer holds the bucket's size, and its unused
  -- tokens go back, while it lives (its period is this one or the one
  -- before) in the bucket it was taken from. Once its life is over the
  -- bucket has refilled over its tokens (others may have spent them),
  -- and a reset since gave the whole bucket back: it returns nothing.
  local at = tonumber(ARGV[7])
  local q = div_floor(at, period)
  local leased = tonumber(ARGV[8])
  if p and born <= at and (q == p or q == p - 1) then
    if q == p then h = math.max(h - leased, 0) else o = math.max(o - leased, 0) end
    if same_units then
      local back = tonumber(ARGV[3]) * step
      if back >= debt then debt = 0 else debt = debt - back end
    end
    debt = math.max(debt, floor_now())
    dirty = true
  end
  out[1] = 1
  i = nil
end
while i and ARGV[i] do
  local d = decide(ARGV[i] + 0, ARGV[i + 1] == '1')
  out[#out + 1] = d[1]
  out[#out + 1] = d[2]
  out[#out + 1] = d[3]
  if receipts then
    out[#out + 1] = d[4] or 0
    out[#out + 1] = d[5] or 0
    out[#out + 1] = d[6] or 0
  end
  if i == 3 then i = 7 else i = i + 2 end
end

if dirty and debt == 0 and h + o == 0 then
  redis.call('DEL', KEYS[1])
elseif dirty then
  redis.call('HSET', KEYS[1], 't', string.format('%d', stamp),
    'd', string.format('%d', debt), 'k', string.format('%d', k),
    'b', string.format('%d', born))
  if h + o > 0 then
    redis.call('HSET', KEYS[1], 'p', string.format('%d', p),
      'h', string.format('%d', h), 'o', string.format('%d', o))
  elseif st[4] then
    redis.call('HDEL', KEYS[1], 'p', 'h', 'o')
  end
  -- Full at stamp + debt: after the server's clock stepped back the stamp
  -- is ahead of now, and the key must outlive the debt counted from it
  -- (and the leases out).
  local ahead = stamp - now
  if ahead < 0 then ahead = 0 end
  local life = ahead + div_ceil(debt, k)
  if h + o > 0 then life = math.max(life, (p + 2) * period - now) end
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(life / 1000)))
end

return out
