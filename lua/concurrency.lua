-- Concurrency: at most the limit of requests in flight. Same semantics as
-- decide() in src/limit/algorithms/concurrency.rs.
--
-- KEYS[1]  the slots held (sorted set): score = when the take was admitted,
--          in microseconds; member = "<seq>" for one slot or "<seq>:<n>"
--          for a take of n
-- KEYS[2]  its metadata (hash): s = slots held, q = last sequence number
--          handed out, o = releases owed to takes that hold no slot, u =
--          when what is owed lapses. Same hash tag as KEYS[1].
-- ARGV[1]  limit (slots, > 0)
-- ARGV[2]  unused (the window)
-- ARGV[3]  hits (slots this call takes or releases; 0 checks)
-- ARGV[4]  0 to take, 1 to release; 2 to take back what a receipt says a
--          call took (its member of sequence ARGV[7] and score ARGV[8]):
--          the slot is freed and its release owed; 5 for a reset: every
--          slot held becomes owed
-- ARGV[5]  max_duration in microseconds: a slot frees itself that long
--          after its take
-- ARGV[6]  2 to answer each take with a receipt
-- ARGV[7], ARGV[8], ...  optional further (hits, negative) pairs, decided
--          after this one in order, in this same atomic step
--
-- Returns {admitted (0/1), remaining, reset_micros} per hit, with receipts
-- each followed by {slots taken, the member's sequence, its score}; undo
-- and reset return {1}.
-- A take refused owes its release: a release pays what is owed first,
-- then frees the oldest slot held, and frees nothing beyond. A take of more
-- than the limit owes nothing, and a release of more frees nothing. What is owed
-- lapses max_duration after the last take that owed it. Both keys expire
-- when nothing held or owed is left. The clock is the server's (TIME).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = ARGV[1] + 0
local d = ARGV[5] + 0
if d < 1 then d = 1 end
local receipts = ARGV[6] == '2'
local set, meta = KEYS[1], KEYS[2]

local function int(x)
  return string.format('%d', x)
end
local function cost_of(m)
  local sep = string.find(m, ':', 1, true)
  if sep then return tonumber(string.sub(m, sep + 1)) end
  return 1
end
local function seq_of(m)
  local sep = string.find(m, ':', 1, true)
  if sep then return tonumber(string.sub(m, 1, sep - 1)) end
  return tonumber(m)
end
local function member(seq, n)
  if n == 1 then return int(seq) end
  return int(seq) .. ':' .. int(n)
end

local m = redis.call('HMGET', meta, 's', 'q', 'o', 'u')
local held, seq = tonumber(m[1]), tonumber(m[2])
local owed, owed_until = tonumber(m[3]) or 0, tonumber(m[4]) or 0
local dirty = false
if held == nil or seq == nil then
  -- First use, or the metadata was lost: the set is the truth.
  held = 0
  seq = seq or 0
  local all = redis.call('ZRANGE', set, 0, -1)
  for i = 1, #all do
    held = held + cost_of(all[i])
    seq = math.max(seq, seq_of(all[i]) or 0)
  end
end

-- Slots whose release never came free themselves; what is owed lapses.
local cutoff = int(now - d)
local gone = redis.call('ZRANGEBYSCORE', set, '-inf', cutoff)
if #gone > 0 then
  for i = 1, #gone do held = held - cost_of(gone[i]) end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', cutoff)
  dirty = true
end
-- The set lost while its metadata stayed (evicted, deleted): nothing is
-- held, whatever the metadata says.
if held ~= 0 and #redis.call('ZRANGE', set, 0, 0) == 0 then
  held = 0
  dirty = true
end
if owed > 0 and owed_until <= now then
  owed = 0
  dirty = true
end

local function oldest_reset()
  local oldest = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2]
  if oldest == nil then return 0 end
  return tonumber(oldest) + d - now
end
local function remaining()
  if held < limit then return limit - held end
  return 0
end
local function owe(n, until_)
  owed = math.min(owed + n, 9007199254740992)
  if until_ > owed_until then owed_until = until_ end
  dirty = true
end

-- Refused: the first moment enough of the oldest slots free themselves.
local function wait_for(n)
  local freed, from = 0, 0
  while true do
    local page = redis.call('ZRANGE', set, from, from + 127, 'WITHSCORES')
    if #page == 0 then return d end
    for i = 1, #page, 2 do
      freed = freed + cost_of(page[i])
      if held - freed + n <= limit then
        return tonumber(page[i + 1]) + d - now
      end
    end
    from = from + 128
  end
end

local function release(n)
  local pay = math.min(n, owed)
  owed = owed - pay
  local back = n - pay
  while back > 0 do
    local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    if #first == 0 then break end
    local cost = cost_of(first[1])
    local take = math.min(back, cost)
    redis.call('ZREM', set, first[1])
    if take < cost then
      redis.call('ZADD', set, first[2], member(seq_of(first[1]), cost - take))
    end
    held = held - take
    back = back - take
  end
  if n > 0 then dirty = true end
  return {1, remaining(), oldest_reset()}
end

local function decide(n, negative)
  if n > limit then
    -- More than the limit at once: a take that can never pass owes
    -- nothing, and a release that large frees nothing (its take was such a
    -- take: Envoy gives both one cost).
    if negative then return {1, remaining(), oldest_reset()} end
    return {0, remaining(), d}
  end
  if negative then return release(n) end
  if held + n <= limit then
    if n > 0 then
      seq = seq + 1
      redis.call('ZADD', set, int(now), member(seq, n))
      held = held + n
      dirty = true
    end
    return {1, limit - held, oldest_reset(), n, seq, now}
  end
  -- Its release is still to come, and frees nothing another take holds.
  owe(n, now + d)
  return {0, remaining(), wait_for(n)}
end

local function save()
  local newest = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2]
  local last = 0
  if newest ~= nil then last = tonumber(newest) + d end
  if owed > 0 and owed_until > last then last = owed_until end
  if last <= now then
    redis.call('DEL', set, meta)
    return
  end
  local ttl = int(math.ceil((last - now) / 1000))
  redis.call('HSET', meta, 's', int(held), 'q', int(seq), 'o', int(owed), 'u', int(owed_until))
  redis.call('PEXPIRE', set, ttl)
  redis.call('PEXPIRE', meta, ttl)
end

local out = {}
local i = 3
if ARGV[4] == '2' then
  -- The member is named by its sequence and size, and its score tells a
  -- name handed out again (after the metadata was lost) from this one.
  local n = tonumber(ARGV[3])
  local at = tonumber(ARGV[8])
  local name = member(tonumber(ARGV[7]), n)
  local score = redis.call('ZSCORE', set, name)
  if score and tonumber(score) == at then
    redis.call('ZREM', set, name)
    held = held - n
  end
  owe(n, at + d)
  out[1] = 1
  i = nil
elseif ARGV[4] == '5' then
  local newest = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2]
  if newest ~= nil then
    owe(held, tonumber(newest) + d)
    redis.call('DEL', set)
    held = 0
  end
  out[1] = 1
  i = nil
end
while i and ARGV[i] do
  local r = decide(ARGV[i] + 0, ARGV[i + 1] == '1')
  out[#out + 1] = r[1]
  out[#out + 1] = r[2]
  out[#out + 1] = r[3]
  if receipts then
    out[#out + 1] = r[4] or 0
    out[#out + 1] = r[5] or 0
    out[#out + 1] = r[6] or 0
  end
  if i == 3 then i = 7 else i = i + 2 end
end
if dirty then save() end
return out
