-- Fixed window: one epoch-aligned counter per window. Same semantics as
-- decide() in src/limit/algorithms/fixed_window.rs.
--
-- KEYS[1]  limiter state (hash): w = window index, c = count in that window
-- ARGV[1]  limit (requests per window, > 0)
-- ARGV[2]  window length in microseconds; 0 for a calendar window, whose
--          boundaries ARGV[7..10] hold
-- ARGV[3]  hits (cost of this call; 0 checks without counting)
-- ARGV[4]  1 to give hits back (never below zero), 0 to take them; 2 to
--          take back what a receipt says a call recorded (undo): ARGV[3]
--          hits in the window ARGV[7] (calendar: ARGV[11]), only while
--          that window is current or one of the seven after it, and not
--          where the hits may have been recorded before the limiter's
--          last reset (`x`): in the window the reset fell in, or for a
--          reservation in one of the seven before that window, or in the
--          ARGV[9] (calendar: ARGV[13]) before it that its receipt says
--          its lease was taken in
-- ARGV[5]  unused (the counter's bucket count)
-- ARGV[6]  1 to record every positive cost, also one that takes the
--          limiter over or is above the limit (usage reported after the
--          response); 2 to answer each hit with a receipt; 3 as 2, and
--          an admitted hit also reserves ARGV[8] hits in each of the next
--          ARGV[7] windows (at most 7; not with a calendar window nor
--          further hits), window after window while each has room; 0 or
--          absent: see below
-- ARGV[7..10]  a calendar window's boundaries around the caller's clock,
--          in microseconds, ascending: the start of the previous window,
--          the start and end of the current one, the end of the next. The
--          window holding the server's `now` counts, its index its first
--          second; before the first boundary, the first window; past the
--          last, the last (clocks a whole window apart). Absent otherwise.
-- ARGV[7], ARGV[8], ...  (calendar: ARGV[11], ...) optional further
--          (hits, negative) pairs: hits queued behind this one, decided
--          after it in order, in this same atomic step (undo: the first is
--          the receipt's window)
--
-- Returns {admitted (0/1), remaining, reset_micros} as integers, one triple
-- per hit in order (a refusal where shares hold part of the window: reset
-- at most a second); with receipts, each followed by {hits recorded, window
-- index, windows reserved after it}; reserving ahead (ARGV[6] 3), then by
-- the windows reserved again (as the counter's script answers). Undo
-- returns {1}.
-- After a reset (src/storage/redis/reset.rs) the hash holds `x`: when
-- it was reset (microseconds), kept until the eighth window after the
-- reset's ends, so that a give-back recorded before it takes nothing off
-- the fresh count.
-- The hash also holds, where a lease reserved hits ahead, `r<index>`: hits
-- reserved in the window of that index (one of the seven after w), which
-- are that window's count when it comes, and `r`: the last such index;
-- and where quota streams' shares spend the same limit
-- (lua/rlqs_lease.lua), `q<index>`: the hits they hold of that window (a
-- double), and `q`: the last such index. A hit is admitted only while the
-- window's count plus what the shares hold of it stays within the limit,
-- and the hash is kept until the last window the shares hold ends.
-- Every counted hit stays counted in its window, admitted or not, except a
-- cost above the limit, which can never pass and is not recorded unless
-- ARGV[6] is 1.
-- The clock is the server's (TIME), never the caller's.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- `s + 0` converts a string once, tonumber(s) twice (Lua 5.1): the
-- arguments always present are converted so.
local limit = ARGV[1] + 0
local w = ARGV[2] + 0
local reports = ARGV[6] == '1'
local receipts = ARGV[6] == '2'

local idx, reset
local tail = 7
if w > 0 then
  -- Integer division on doubles (exact below 2^53), corrected for rounding.
  idx = math.floor(now / w)
  if idx * w > now then idx = idx - 1 end
  if (idx + 1) * w <= now then idx = idx + 1 end
  reset = (idx + 1) * w - now
else
  local j = 7
  if now >= ARGV[8] + 0 then j = 8 end
  if now >= ARGV[9] + 0 then j = 9 end
  local start = ARGV[j] + 0
  idx = math.floor(start / 1000000)
  reset = ARGV[j + 1] - now
  -- Only past the last boundary: a millisecond at a time.
  if reset < 1000 then reset = 1000 end
  tail = 11
end

local ahead, ahead_hits = 0, 0
if ARGV[6] == '3' and w > 0 then
  receipts = true
  ahead = ARGV[7] + 0
  ahead_hits = ARGV[8] + 0
  tail = 9
end

local st = redis.call('HMGET', KEYS[1], 'w', 'c', 'r', 'q', 'x')
local sw = tonumber(st[1])
-- A window written after now: the server's clock stepped back (a failover
-- to a replica whose clock is behind, an NTP correction). Count on in
-- that window until the clock passes its end, never afresh.
if w > 0 and sw and sw > idx and (tonumber(st[2]) or 0) > 0 then
  reset = reset + (sw - idx) * w
  idx = sw
end
local current = sw == idx
local count = 0
-- The last window holding hits reserved ahead (field `r`), if any: its
-- reservations are in fields `r<index>`, read only where needed.
local last = w > 0 and tonumber(st[3])
if current then
  count = tonumber(st[2]) or 0
elseif last and sw and idx > sw and idx <= last then
  -- A window some of whose hits were reserved in an earlier one.
  count = tonumber(redis.call('HGET', KEYS[1], 'r' .. string.format('%d', idx))) or 0
end
local before = count
-- What quota streams' shares hold of this window, rounded up (the
-- tolerance absorbs the doubles' rounding, never a whole hit).
local ql = w > 0 and tonumber(st[4])
local shared = 0
if ql and ql >= idx then
  shared = tonumber(redis.call('HGET', KEYS[1], 'q' .. string.format('%d', idx))) or 0
  shared = math.max(math.ceil(shared - 1e-6), 0)
end
-- Reservations changed by this call: window index -> hits.
local moved = nil
-- The last reset, and the last window whose give-backs it refuses (the
-- hash is kept until that window ends).
local reset_at = tonumber(st[5])
local reset_keep = nil
if reset_at then
  if w > 0 then
    reset_keep = math.floor(reset_at / w) + 7
    if reset_keep < idx then reset_keep = nil end
  elseif reset_at >= idx * 1000000 then
    reset_keep = idx
  end
end

-- Straight-line code, no closures: this runs once per decision, and the
-- interpreter's work here is a measurable share of Redis's CPU.
local out = {}
local n = 0
local i = 3
if ARGV[4] == '2' then
  local at = tonumber(ARGV[tail])
  local hits = tonumber(ARGV[3])
  if reset_at then
    -- The first window whose calls may have recorded it: its own, or for
    -- a reservation the earliest that could have reserved it.
    local first = at - (tonumber(ARGV[tail + 2]) or 0)
    if at > idx and at - 7 < first then first = at - 7 end
    local start
    if w > 0 then start = first * w else start = first * 1000000 end
    if reset_at >= start then hits = 0 end
  end
  if hits == 0 then
    -- Nothing to take back.
  elseif at == idx then
    count = count - hits
    if count < 0 then count = 0 end
  elseif last and at > idx and at <= last then
    local f = 'r' .. string.format('%d', at)
    local v = tonumber(redis.call('HGET', KEYS[1], f)) or 0
    if v > 0 then
      moved = {}
      moved[at] = math.max(v - hits, 0)
    end
  end
  out[1] = 1
  i = nil
end
while i and ARGV[i] do
  local hits = ARGV[i] + 0
  local was = count
  local admitted = 1
  if ARGV[i + 1] == '1' then
    count = count - hits
    if count < 0 then count = 0 end
  elseif hits > limit and not reports then
    admitted = 0
  else
    -- Recorded usage saturates at 2^53 (doubles stay exact below it).
    count = count + hits
    if count > 9007199254740992 then count = 9007199254740992 end
    if count + shared > limit then admitted = 0 end
  end
  local left = 0
  if count + shared < limit then left = limit - count - shared end
  out[n + 1] = admitted
  out[n + 2] = left
  out[n + 3] = reset
  -- A refusal the shares take part in holds at most a second: a share
  -- may shrink at its stream's next report.
  if admitted == 0 and shared > 0 and reset > 1000000 then out[n + 3] = 1000000 end
  n = n + 3
  if receipts then
    local recorded = count - was
    if recorded < 0 then recorded = 0 end
    out[n + 1] = recorded
    out[n + 2] = idx
    out[n + 3] = 0
    n = n + 3
  end
  if i == 3 then i = tail else i = i + 2 end
end

-- Reservations in the next windows, for an admitted lease.
local granted = 0
if ahead > 0 and out[1] == 1 then
  if ahead_hits > 0 then
    local names = {}
    for j = 1, ahead do
      names[j] = 'r' .. string.format('%d', idx + j)
      names[ahead + j] = 'q' .. string.format('%d', idx + j)
    end
    local have = redis.call('HMGET', KEYS[1], unpack(names))
    moved = {}
    for j = 1, ahead do
      local v = (tonumber(have[j]) or 0) + ahead_hits
      local held = math.max(math.ceil((tonumber(have[ahead + j]) or 0) - 1e-6), 0)
      if v + held > limit then break end
      moved[idx + j] = v
      granted = j
    end
    if granted == 0 then moved = nil end
  end
  out[6] = granted
  out[7] = granted
end

if count ~= before or moved then
  -- Reservations still to come after this call.
  local until_ = last
  if until_ and until_ <= idx then until_ = nil end
  if granted > 0 and (not until_ or idx + granted > until_) then until_ = idx + granted end
  -- The last window the hash must outlive: reserved ahead, or held by
  -- shares.
  local keep = until_
  if ql and ql >= idx and (not keep or ql > keep) then keep = ql end
  if reset_keep and (not keep or reset_keep > keep) then keep = reset_keep end
  if not current and last and sw then
    -- Windows gone by since the stored one: their reservations (the
    -- current window's now in its count) are dropped.
    local gone = {}
    for x = sw + 1, math.min(idx, last) do gone[#gone + 1] = 'r' .. string.format('%d', x) end
    if not until_ then gone[#gone + 1] = 'r' end
    if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
  end
  if count == 0 and not keep then
    redis.call('DEL', KEYS[1])
  elseif current then
    -- The window's first write set the expiry at its end (or at the end
    -- of the last reserved window); HSET keeps it.
    redis.call('HSET', KEYS[1], 'c', string.format('%d', count))
  else
    redis.call('HSET', KEYS[1], 'w', string.format('%d', idx), 'c', string.format('%d', count))
    if not keep or keep == idx then
      redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(reset / 1000)))
    end
  end
  if moved then
    local set = {}
    for x, v in pairs(moved) do
      set[#set + 1] = 'r' .. string.format('%d', x)
      set[#set + 1] = string.format('%d', v)
    end
    if granted > 0 then
      set[#set + 1] = 'r'
      set[#set + 1] = string.format('%d', until_)
    end
    redis.call('HSET', KEYS[1], unpack(set))
    if granted > 0 then
      -- Kept until the last reserved window ends.
      redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((reset + (keep - idx) * w) / 1000)))
    end
  end
end

return out
