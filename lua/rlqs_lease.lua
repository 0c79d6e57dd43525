-- Lease ledger of a limit shared among quota streams (RLQS): one stream's
-- report grants it a share. Same arithmetic as Ledger::report in
-- src/quota/mod.rs; the units (tokens per fill) are explained there.
--
-- KEYS[1]  the ledger (hash): holder -> "granted:expires_micros:demand";
--          one per limit (the key names the limit's algorithm and window,
--          so the limits of a `rate_limits:` list never share one)
-- KEYS[2]  optional: the limiter's state, when requests decided one at a
--          time count the limit there too, so that shares and those
--          requests keep one count. A fixed window's (lua/fixed_window.lua;
--          the arithmetic of src/quota/window.rs, in hits as doubles):
--          fields `q<index>` hold what the shares reserve of window
--          `index`, `q` the last such index. Or a token bucket's
--          (lua/token_bucket.lua, run here as the function `bucket`; the
--          arithmetic of src/quota/bucket.rs): each share is charged to it
--          when granted, and what it will not take given back at the
--          holder's next report
-- ARGV[1]  holder (one stream of one replica)
-- ARGV[2]  requests reported (allowed + denied), at most 2^53
-- ARGV[3]  seconds they were seen over (at least 1 is used)
-- ARGV[4]  capacity: tokens per fill of the whole limit
-- ARGV[5]  fill interval in seconds
-- ARGV[6]  how long the share holds, in microseconds
-- ARGV[7]  with KEYS[2]: `w` for a fixed window, `b` for a token bucket
-- ARGV[8]  with KEYS[2]: the limit, requests per window
-- ARGV[9]  with KEYS[2]: the window's length in microseconds
-- ARGV[10] with KEYS[2]: the margin over which the old share stays
--          reserved (charged) beside the new one, in microseconds
-- ARGV[11] with a token bucket: its burst
--
-- Returns {tokens granted, holders in force, tokens in force}.
-- The shares in force after the call add up to at most the capacity: the
-- holder gets its max-min fair share of the demands, and never more than
-- the capacity less the other shares in force.
-- The clock is the server's (TIME), never the caller's.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local holder = ARGV[1]
local requests = tonumber(ARGV[2])
local elapsed = math.max(tonumber(ARGV[3]), 1)
local capacity = tonumber(ARGV[4])
local fill = tonumber(ARGV[5])
local hold = tonumber(ARGV[6])

-- Live shares of the others, and the holder's own demand estimate;
-- expired shares are dropped.
local raw = redis.call('HGETALL', KEYS[1])
local shares = {}
local names = {}
local previous = nil
local old, old_expires = 0, 0
local latest = now + hold
for i = 1, #raw, 2 do
  local granted, expires, demand = string.match(raw[i + 1], '^(%d+):(%d+):(%d+)$')
  expires = tonumber(expires)
  if granted == nil or expires <= now then
    redis.call('HDEL', KEYS[1], raw[i])
  elseif raw[i] == holder then
    previous = tonumber(demand)
    old, old_expires = tonumber(granted), expires
  else
    shares[raw[i]] = {tonumber(granted), expires, tonumber(demand)}
    names[#names + 1] = raw[i]
    if expires > latest then latest = expires end
  end
end

-- Demand: the report scaled to the fill, rounded up, capped at the
-- capacity; then the mean with the previous estimate, rounded up.
local measured = math.min(math.ceil(requests * fill / elapsed), capacity)
local demand = measured
if previous then
  demand = math.ceil((previous + measured) / 2)
end

-- One count with requests decided one at a time: the old share's
-- reservation taken back past the margin, their demand, and the room the
-- windows leave the new share.
local counted = KEYS[2] ~= nil and ARGV[7] == 'w'
local q, gone, cap, beside = {}, {}, nil, nil
local W, L, F, idx, margin_end, to
-- Window index of a time, and the end of the window holding `t` (the
-- windows' boundaries are exact: integers far below 2^53).
local function window_of(t)
  local x = math.floor(t / W)
  if x * W > t then x = x - 1 end
  if (x + 1) * W <= t then x = x + 1 end
  return x
end
local function ending(t)
  local x = window_of(t)
  if x * W == t then return t end
  return (x + 1) * W
end
-- Adds `tokens` per fill over [from, till) to the windows' reservations.
local function reserve(tokens, from, till, sign)
  if tokens == 0 then return end
  while from < till do
    local x = window_of(from)
    local e = math.min(till, (x + 1) * W)
    if x >= idx then q[x] = math.max((q[x] or 0) + sign * tokens * (e - from) / F, 0) end
    from = e
  end
end
if counted then
  L = tonumber(ARGV[8])
  W = tonumber(ARGV[9])
  F = fill * 1000000
  idx = window_of(now)
  local st = redis.call('HGETALL', KEYS[2])
  local s = {}
  for i = 1, #st, 2 do
    local x = string.match(st[i], '^q(%d+)$')
    if x then
      x = tonumber(x)
      if x < idx then gone[#gone + 1] = st[i] else q[x] = tonumber(st[i + 1]) end
    else
      s[st[i]] = st[i + 1]
    end
  end
  local sw, c, rl = tonumber(s.w), tonumber(s.c) or 0, tonumber(s.r)
  -- A window's count as the fixed window's state holds it, unmoved.
  local function count_of(x)
    if sw == x then return c end
    if rl and sw and x > sw and x <= rl then
      return tonumber(s['r' .. string.format('%d', x)]) or 0
    end
    return 0
  end
  margin_end = now
  if old_expires > now then
    local e = ending(old_expires)
    margin_end = math.min(now + tonumber(ARGV[10]), e)
    reserve(old, margin_end, e, -1)
  else
    old = 0
  end
  to = ending(now + hold)
  -- Room after the margin; and over the whole share, the old share's part
  -- of the margin counted for it (the larger of the two is reserved there).
  local after, over = nil, nil
  local from = now
  while from < to do
    local x = window_of(from)
    local e = math.min(to, (x + 1) * W)
    local left = math.max(L - count_of(x) - (q[x] or 0), 0)
    local credit = old * math.max(math.min(e, margin_end) - from, 0) / F
    local o = math.floor((left + credit) * F / (e - from))
    if not over or o < over then over = o end
    local a0 = math.max(from, margin_end)
    if a0 < e then
      local a = math.floor(left * F / (e - a0))
      if not after or a < after then after = a end
    end
    from = e
  end
  after = after or capacity
  over = over or capacity
  if over > old then cap = over else cap = math.min(after, old) end
  -- Their demand: the window's count over the time it has run, at least a
  -- quarter of the window.
  local elapsed = math.max(now - idx * W, W / 4, 1)
  beside = math.min(math.ceil(count_of(idx) * F / elapsed), capacity)
end

-- Water-filling in order of demand, ties by name; requests decided one at
-- a time last.
names[#names + 1] = holder
table.sort(names)
local order = {}
local others = 0
for i, name in ipairs(names) do
  local d
  if name == holder then
    d = demand
  else
    d = shares[name][3]
    others = others + shares[name][1]
  end
  order[i] = {d, i, name}
end
if beside then order[#order + 1] = {beside, #order + 1, nil} end
table.sort(order, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local n = #order
local left = capacity
local mine = 0
for k, entry in ipairs(order) do
  local equal = math.floor(left / (n - k + 1))
  local take = math.min(entry[1], equal)
  left = left - take
  if entry[3] == holder then mine = take end
end
local target = mine + math.floor(left / n)
-- A token bucket's share is charged whether it is spent or not: no part
-- of what nobody asked for.
if KEYS[2] ~= nil and ARGV[7] == 'b' and target > demand then target = demand end
local room = math.max(capacity - others, 0)
local tokens = math.min(target, room)
if cap and cap < tokens then tokens = cap end

if counted then
  reserve(tokens, margin_end, to, 1)
  if tokens > old then reserve(tokens - old, now, margin_end, 1) end
  local set, last = {}, nil
  for x, v in pairs(q) do
    local f = 'q' .. string.format('%d', x)
    if v > 1e-6 then
      set[#set + 1] = f
      set[#set + 1] = string.format('%.17g', v)
      if not last or x > last then last = x end
    else
      gone[#gone + 1] = f
    end
  end
  if last then
    set[#set + 1] = 'q'
    set[#set + 1] = string.format('%d', last)
  else
    gone[#gone + 1] = 'q'
  end
  if #gone > 0 then redis.call('HDEL', KEYS[2], unpack(gone)) end
  if #set > 0 then
    redis.call('HSET', KEYS[2], unpack(set))
    -- Kept at least to the end of the last window reserved.
    local need = math.ceil(((last + 1) * W - now) / 1000)
    if redis.call('PTTL', KEYS[2]) < need then
      redis.call('PEXPIRE', KEYS[2], string.format('%d', need))
    end
  end
end

-- A token bucket: what the old share will not take after the margin comes
-- back (rounded down), the new share is charged to its end (rounded up;
-- over the margin, its excess over the old one), even into debt.
if KEYS[2] ~= nil and ARGV[7] == 'b' then
  local F = fill * 1000000
  local m_end, back = now, 0
  if old_expires > now then
    m_end = math.min(now + tonumber(ARGV[10]), old_expires)
    back = math.floor(old * (old_expires - m_end) / F)
  else
    old = 0
  end
  local charge = math.ceil((tokens * (now + hold - m_end) + math.max(tokens - old, 0) * (m_end - now)) / F)
  local function run(hits, give, record)
    bucket({KEYS[2]}, {ARGV[8], ARGV[9], string.format('%d', hits), give, ARGV[11], record})
  end
  if back > 0 then run(back, '1', '0') end
  if charge > 0 then run(charge, '0', '1') end
end

-- %d: Lua 5.1 writes large numbers in exponent form when concatenated.
redis.call('HSET', KEYS[1], holder, string.format('%d:%d:%d', tokens, now + hold, demand))
redis.call('PEXPIRE', KEYS[1], math.ceil((latest - now) / 1000) + 1000)
return {tokens, n, others + tokens}
