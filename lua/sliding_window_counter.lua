-- Sliding window counter: N buckets of window / (N - 1) each, epoch-aligned
-- or starting ARGV[7] after that;
-- the current one and N - 2 full ones count whole, the oldest weighs what is
-- left of it in the trailing window. N = 2 is the classic previous-and-current
-- pair. Same semantics, and the same floating-point steps, as
-- decide() in src/limit/algorithms/sliding_counter.rs.
--
-- Time is counted in units of 1 / (N - 1) microsecond ("scaled"), so a bucket
-- is exactly w scaled units long and no boundary is rounded; real durations
-- are scaled ones divided by N - 1, rounded up.
--
-- KEYS[1]  limiter state (hash): w = current bucket index, c = current
--          bucket's count, p = the one before, b2 .. b<N-1> older ones
-- ARGV[1]  limit (requests per window, > 0)
-- ARGV[2]  window length in microseconds
-- ARGV[3]  hits (cost of this call; 0 checks without counting)
-- ARGV[4]  1 to give hits back (never below zero), 0 to take them; 2 to
--          take back what a receipt says a call recorded (undo): ARGV[3]
--          hits from the bucket ARGV[8], while it is in the trailing window,
--          and not where the hits may have been recorded before the
--          limiter's last reset (`x`): in the bucket the reset fell in or
--          an earlier one, or for hits a lease reserved ahead, in one
--          after the lease's (ARGV[10]: how many buckets before ARGV[8]
--          that was)
-- ARGV[5]  N, the number of buckets (2..60; absent means 2)
-- ARGV[6]  1 to record every positive cost, also one that takes the
--          limiter over or is above the limit (usage reported after the
--          response); 2 to answer each hit with a receipt; 3 as 2, and
--          an admitted hit also reserves ARGV[9] hits in each of the next
--          ARGV[8] buckets (at most 7; not with further hits), bucket
--          after bucket while each keeps every trailing window within the
--          limit; 0 or absent: see below
-- ARGV[7]  where the buckets start, in scaled units (below w): 0 for
--          epoch-aligned ones, else the descriptor's phase
--          (sliding_counter::phase), so that limiters do not all turn
--          their buckets at once
-- ARGV[8], ARGV[9], ...  optional further (hits, negative) pairs: hits
--          queued behind this one, decided after it in order, in this
--          same atomic step (undo: ARGV[8] is the receipt's bucket)
--
-- Returns {admitted (0/1), remaining, reset_micros} as integers, one triple
-- per hit in order; with receipts, each followed by {hits recorded, bucket
-- index, microseconds until that bucket ends} (a lease is spent only while
-- its bucket is current); reserving ahead, then by the buckets reserved.
-- Undo returns {1}.
-- The hash also holds, where a lease reserved hits ahead, `r<index>`: hits
-- reserved in the bucket of that index (one of the seven after w), which
-- are that bucket's count when it comes, and `r`: the last such index.
-- They count from now in every estimate that bucket will weigh in: a hit
-- is admitted only while the estimate now and the count of each trailing
-- window that starts at a reserved bucket's start (where it weighs most)
-- stay within the limit.
-- After a reset (src/storage/redis/reset.rs) the hash holds `x`: when it
-- was reset (microseconds), kept while a bucket it fell in still counts,
-- so that a give-back recorded before it takes nothing off the fresh count.
-- Only admitted hits are recorded, unless ARGV[6] is 1: then every positive
-- cost is, and the answer is refused while the estimate is over the limit.
-- The clock is the server's (TIME).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- `s + 0` converts a string once, tonumber(s) twice (Lua 5.1).
local limit = ARGV[1] + 0
local w = ARGV[2] + 0
local reports = ARGV[6] == '1'
local receipts = ARGV[6] == '2'
local n = tonumber(ARGV[5]) or 2
if n < 2 then n = 2 end
if n > 60 then n = 60 end
local spans = n - 1
local phase = tonumber(ARGV[7]) or 0
local ahead, ahead_hits = 0, 0
if ARGV[6] == '3' then
  receipts = true
  ahead = math.min(ARGV[8] + 0, 7)
  ahead_hits = ARGV[9] + 0
end

-- Integer division on doubles (exact below 2^53), corrected for rounding.
local function div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end
-- now x spans can pass 2^53, so split it: now = q x w + r, and only
-- r x spans (below 60 x w) is scaled; the phase (below w) is added there.
local q = div(now, w)
local rs = (now - q * w) * spans + phase
local j = div(rs, w)
local idx = q * spans + j
local elapsed = rs - j * w
local function real(scaled)
  return math.ceil(scaled / spans)
end

-- Field of the bucket of a given age (0 = current).
local function field(age)
  if age == 0 then return 'c' end
  if age == 1 then return 'p' end
  return 'b' .. age
end
local names = {'w'}
for age = 0, n - 1 do names[#names + 1] = field(age) end
names[#names + 1] = 'x'
names[#names + 1] = 'r'
local st = redis.call('HMGET', KEYS[1], unpack(names))
local window = tonumber(st[1])
local reset_at = tonumber(st[n + 2])
-- The last bucket holding hits reserved ahead, if any is after the
-- stored one.
local last = tonumber(st[n + 3])
if last and not (window and last > window) then last = nil end
-- A bucket written after now: the server's clock stepped back (a failover
-- to a replica whose clock is behind, an NTP correction). Count on in
-- that bucket, from its start (the oldest bucket weighs whole), so the
-- hits it holds still count until the clock passes them; never afresh.
local held = false
for age = 0, n - 1 do
  if (tonumber(st[age + 2]) or 0) > 0 then held = true end
end
if last then held = true end
-- The real now's bucket, for the expiry.
local now_idx, now_elapsed = idx, elapsed
if held and window > idx then
  idx = window
  elapsed = 0
end
-- Hits reserved ahead, by bucket index: the buckets after the stored
-- one that are still in the trailing window or to come.
local rv = {}
if last then
  local lo = math.max(window + 1, idx - n + 1)
  if last >= lo then
    local rn = {}
    for x = lo, last do rn[#rn + 1] = 'r' .. string.format('%d', x) end
    local have = redis.call('HMGET', KEYS[1], unpack(rn))
    for k = 1, #rn do rv[lo + k - 1] = tonumber(have[k]) or 0 end
  end
end
-- counts[age + 1], as Lua counts from 1: a bucket after the stored one
-- counts what was reserved in it.
local counts = {}
local shift = n
if window ~= nil and window <= idx and idx - window < n then shift = idx - window end
for age = 0, n - 1 do
  local from = age - shift
  if from >= 0 then
    counts[age + 1] = tonumber(st[from + 2]) or 0
  else
    counts[age + 1] = rv[idx - age] or 0
  end
end
-- Buckets after the current one that hold reservations (0: none).
local later = 0
if last and last > idx then later = last - idx end
-- Buckets this call reserves in.
local granted = 0

local function sum_full(upto)
  -- Ages 0 .. upto - 1.
  local s = 0
  for age = 0, upto - 1 do s = s + counts[age + 1] end
  return s
end
-- Multiplying before dividing keeps the estimate exact while oldest * w
-- stays below 2^53.
local left = w - elapsed
-- The count of the trailing window that starts where bucket idx + y
-- starts (y >= 1): buckets idx + y - n + 1 .. idx + y, each whole.
local function span(y)
  local s = 0
  for x = idx + y - n + 1, idx + y do
    if x <= idx then
      s = s + counts[idx - x + 1]
    else
      s = s + (rv[x] or 0)
    end
  end
  return s
end
-- The estimate now, or where buckets ahead hold reservations, the count
-- of the fullest trailing window a hit now would weigh in.
local function estimate()
  local e = counts[n] * left / w + sum_full(n - 1)
  for y = 1, math.min(later, n - 1) do
    local s = span(y)
    if s > e then e = s end
  end
  return e
end
local function remaining(est)
  local r = math.floor(limit - est)
  if r > 0 then return r end
  return 0
end
-- Until the oldest bucket holding hits has left the trailing window.
local function ok_reset()
  for age = n - 1, 0, -1 do
    if counts[age + 1] > 0 then return real((n - age) * w - elapsed) end
  end
  return 0
end
local function save()
  local args = {'w', string.format('%d', idx)}
  local any = false
  for age = 0, n - 1 do
    if counts[age + 1] > 0 then any = true end
    args[#args + 1] = field(age)
    args[#args + 1] = string.format('%d', counts[age + 1])
  end
  if not any and reset_at == nil and later == 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  if granted > 0 then
    for j = 1, granted do
      args[#args + 1] = 'r' .. string.format('%d', idx + j)
      args[#args + 1] = string.format('%d', rv[idx + j])
    end
    args[#args + 1] = 'r'
    args[#args + 1] = string.format('%d', idx + later)
  end
  redis.call('HSET', KEYS[1], unpack(args))
  if last then
    -- Reservations that are now a bucket's count, or gone by.
    local gone = {}
    for x = window + 1, math.min(idx, last) do gone[#gone + 1] = 'r' .. string.format('%d', x) end
    if later == 0 then gone[#gone + 1] = 'r' end
    if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
  end
  -- The expiry is the last reserved bucket's end (the current one's) plus
  -- n - 1 buckets, from the real now (after a step back, the bucket
  -- written is still ahead of it): a write in the bucket the key was
  -- last written in, reserving nothing new, already set it (HSET keeps
  -- it).
  if window ~= idx or granted > 0 then
    local span = (n + later + idx - now_idx) * w - now_elapsed
    redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(real(span) / 1000)))
  end
end

local dirty = false

-- Refused: the first bucket (k buckets on) where the full ones, and what
-- is reserved up to it, fit a hit of `cost`, and so does each window to
-- come that it weighs in (where buckets after it hold reservations), then
-- the moment in it when the oldest has lost enough weight:
-- oldest * (w - e) / w <= room  holds from  e = w - floor(w * room / oldest).
local function wait_for(cost)
  local need = limit - cost
  for k = 0, n - 1 do
    local full = sum_full(n - 1 - k)
    for x = idx + 1, idx + k do full = full + (rv[x] or 0) end
    local fits = full <= need
    for y = k + 1, math.min(k + n - 1, later) do
      if span(y) + cost > limit then fits = false end
    end
    if fits then
      local oldest = counts[n - k]
      local at = 0
      if oldest > 0 then at = w - math.min(math.floor(w * (need - full) / oldest), w) end
      if k == 0 then
        local wait = at - elapsed
        if wait < 0 then wait = 0 end
        wait = real(wait)
        if wait < 1 then wait = 1 end
        return wait
      end
      return real(k * w + at - elapsed)
    end
  end
  return w
end

local function decide(hits, negative)
  if negative then
    local back = hits
    for age = 0, n - 1 do
      local take = math.min(back, counts[age + 1])
      counts[age + 1] = counts[age + 1] - take
      back = back - take
    end
    dirty = true
    return {1, remaining(estimate()), ok_reset()}
  end

  local est = estimate()
  if hits > limit and not reports then
    return {0, remaining(est), w}
  end
  if est + hits <= limit then
    if hits > 0 then
      counts[1] = counts[1] + hits
      dirty = true
    end
    return {1, remaining(estimate()), ok_reset(), hits}
  end
  if reports and hits > 0 then
    -- Recorded all the same (saturating at 2^53, where doubles stay
    -- exact); refused until a check would pass.
    counts[1] = math.min(counts[1] + hits, 9007199254740992)
    dirty = true
    return {0, remaining(estimate()), wait_for(0)}
  end
  return {0, remaining(est), wait_for(hits)}
end

local out = {}
local i = 3
if ARGV[4] == '2' then
  local at = tonumber(ARGV[8])
  local age = idx - at
  local before_reset = false
  if reset_at ~= nil then
    local rq = div(reset_at, w)
    local rj = div((reset_at - rq * w) * spans + phase, w)
    before_reset = rq * spans + rj >= at - (tonumber(ARGV[10]) or 0)
  end
  if age >= 0 and age < n and not before_reset then
    counts[age + 1] = math.max(counts[age + 1] - tonumber(ARGV[3]), 0)
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
    out[#out + 1] = idx
    out[#out + 1] = real(w - elapsed)
  end
  if ahead > 0 then
    i = nil
  elseif i == 3 then
    i = 8
  else
    i = i + 2
  end
end

-- Reservations in the next buckets, for an admitted lease: bucket after
-- bucket, while every trailing window it weighs in (those starting at its
-- start and at the next n - 1 buckets' starts) holds at most the limit.
if ahead > 0 then
  if out[1] == 1 and ahead_hits > 0 then
    for j = 1, ahead do
      local x = idx + j
      rv[x] = (rv[x] or 0) + ahead_hits
      local fits = true
      for y = j, j + n - 1 do
        if span(y) > limit then fits = false end
      end
      if not fits then
        rv[x] = rv[x] - ahead_hits
        break
      end
      granted = j
    end
    if granted > later then later = granted end
    if granted > 0 then dirty = true end
  end
  out[7] = granted
end
if dirty then save() end
return out
