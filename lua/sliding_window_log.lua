-- Sliding window log: every admitted hit with its time and cost; exact.
-- Same semantics as decide() in src/limit/algorithms/sliding_log.rs.
--
-- KEYS[1]  the log (sorted set): score = hit time in microseconds, member =
--          "<seq>" for a cost of 1 or "<seq>:<cost>", so a weighted hit is
--          one member
-- KEYS[2]  the log's metadata (hash): s = sum of the costs in the log,
--          q = last sequence number handed out. Same hash tag as KEYS[1].
--          Only a cache of what KEYS[1] holds: rebuilt from it when lost.
-- ARGV[1]  limit (requests per window, > 0)
-- ARGV[2]  window length in microseconds
-- ARGV[3]  hits (cost of this call; 0 checks without counting)
-- ARGV[4]  1 to give hits back (never below zero), 0 to take them; 2 to
--          take back what a receipt says a call recorded (undo): ARGV[3]
--          hits (at most all) of the member of sequence ARGV[7], if it is
--          still in the log at the score ARGV[8]; 3 to take them as a
--          lease: recorded at the end of its life (a tenth of the window,
--          within 1 ms and 10 s: lease_life in sliding_log.rs), the latest
--          time one of them can be admitted
-- ARGV[5]  unused (the counter's bucket count)
-- ARGV[6]  1 to record every positive cost, also one that takes the
--          limiter over or is above the limit (usage reported after the
--          response); 2 to answer each hit with a receipt; 0 or absent:
--          see below
-- ARGV[7], ARGV[8], ...  optional further (hits, negative) pairs: hits
--          queued behind this one, decided after it in order, in this
--          same atomic step (undo: the receipt's sequence and score)
--
-- Returns {admitted (0/1), remaining, reset_micros} as integers, one triple
-- per hit in order; with receipts, each followed by {hits recorded, the
-- member's sequence, its score}. Undo returns {1}.
-- Only admitted hits are recorded, unless ARGV[6] is 1: then every positive
-- cost is; while the log is already at or past its limit such a cost is
-- added to the newest member, which takes the report's time, so a log never
-- holds more members than its limit. A hit at time ts counts while
-- ts > now - window. Both keys expire when the newest hit stops counting.
-- The clock is the server's (TIME), never the caller's.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- `s + 0` converts a string once, tonumber(s) twice (Lua 5.1).
local limit = ARGV[1] + 0
local w = ARGV[2] + 0
local reports = ARGV[6] == '1'
local receipts = ARGV[6] == '2'
local log, meta = KEYS[1], KEYS[2]
-- A lease's hits are stamped at its end: ahead of now, so they count
-- until that end plus a window.
local stamp = now
if ARGV[4] == '3' then stamp = now + math.min(math.max(math.floor(w / 10), 1000), 10000000) end

-- Scores and counts go out as integer strings: the default number to string
-- conversion would write a timestamp as 1.7e+15.
local function int(x)
  return string.format('%d', x)
end
local function cost_of(member)
  local sep = string.find(member, ':', 1, true)
  if sep then return tonumber(string.sub(member, sep + 1)) end
  return 1
end
local function member(seq, cost)
  if cost == 1 then return int(seq) end
  return int(seq) .. ':' .. int(cost)
end

local function seq_of(member)
  local sep = string.find(member, ':', 1, true)
  if sep then return tonumber(string.sub(member, 1, sep - 1)) end
  return tonumber(member)
end

local m = redis.call('HMGET', meta, 's', 'q')
local sum = tonumber(m[1])
local seq = tonumber(m[2])
local dirty = false
if sum == nil or seq == nil then
  -- First use, or the metadata was lost (evicted, deleted): the log is the
  -- truth. Rebuild the sum from it, and continue the sequence past every
  -- live member, or a new hit would reuse a member name and overwrite a hit
  -- that still counts. (A lost log is found below: empty, it sums to 0.)
  sum = 0
  seq = seq or 0
  local all = redis.call('ZRANGE', log, 0, -1)
  for i = 1, #all do
    sum = sum + cost_of(all[i])
    seq = math.max(seq, seq_of(all[i]) or 0)
  end
end

-- Prune the hits that stopped counting.
local cutoff = int(now - w)
local gone = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
if #gone > 0 then
  for i = 1, #gone do
    sum = sum - cost_of(gone[i])
  end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  dirty = true
end

-- The oldest live hit's score (nil: the log is empty, so nothing counts,
-- whatever the metadata says). Hits added below are newer; only giving
-- back can change it, and then it is read again.
local oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')[2]
if oldest == nil and sum ~= 0 then
  sum = 0
  dirty = true
end
-- The newest live hit's score, once a hit was added at `now`.
local newest = nil

local function oldest_reset()
  if oldest == nil then return 0 end
  return tonumber(oldest) + w - now
end
local function remaining()
  if sum < limit then return limit - sum end
  return 0
end
local function save()
  -- Read, not assumed: a lease's hits may be stamped after a later hit's.
  newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  if newest == nil then
    redis.call('DEL', log, meta)
    return
  end
  local ttl = int(math.ceil((tonumber(newest) + w - now) / 1000))
  redis.call('HSET', meta, 's', int(sum), 'q', int(seq))
  redis.call('PEXPIRE', log, ttl)
  redis.call('PEXPIRE', meta, ttl)
end

-- Refused: the first moment enough of the oldest hits have left for a hit
-- of `cost`.
local function wait_for(cost)
  local freed = 0
  local batch = 128
  local from = 0
  while true do
    local page = redis.call('ZRANGE', log, from, from + batch - 1, 'WITHSCORES')
    if #page == 0 then return w end
    for i = 1, #page, 2 do
      freed = freed + cost_of(page[i])
      if sum - freed + cost <= limit then
        return tonumber(page[i + 1]) + w - now
      end
    end
    from = from + batch
  end
end

local function decide(hits, negative)
  if negative then
    -- Give back from the newest hits, not a lease's (stamped ahead of
    -- now): a lease's hits go back only through its own receipt.
    local back = hits
    while back > 0 do
      local last = redis.call('ZREVRANGEBYSCORE', log, int(now), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if #last == 0 then break end
      local cost = cost_of(last[1])
      local take = math.min(back, cost)
      redis.call('ZREM', log, last[1])
      if take < cost then
        local sep = string.find(last[1], ':', 1, true)
        local id = tonumber(string.sub(last[1], 1, sep - 1))
        redis.call('ZADD', log, last[2], member(id, cost - take))
      end
      sum = sum - take
      back = back - take
      dirty = true
    end
    oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')[2]
    newest = nil
    return {1, remaining(), oldest_reset()}
  end

  if hits > limit and not reports then
    return {0, remaining(), w}
  end

  if sum + hits <= limit then
    if hits > 0 then
      seq = seq + 1
      redis.call('ZADD', log, int(stamp), member(seq, hits))
      sum = sum + hits
      dirty = true
      -- A hit at now may come before a lease's hits stamped ahead.
      if oldest == nil or tonumber(oldest) > stamp then oldest = stamp end
    end
    return {1, limit - sum, oldest_reset(), hits, seq, stamp}
  end

  if reports and hits > 0 then
    -- The sum saturates at 2^53, where doubles stay exact.
    local add = math.min(hits, 9007199254740992 - sum)
    local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    if sum >= limit and #last > 0 then
      -- Never earlier than it was (a lease's member is stamped ahead).
      redis.call('ZREM', log, last[1])
      redis.call('ZADD', log, int(math.max(now, tonumber(last[2]))), member(seq_of(last[1]), cost_of(last[1]) + add))
      -- That hit may have been the oldest.
      oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')[2]
    elseif add > 0 then
      seq = seq + 1
      redis.call('ZADD', log, int(now), member(seq, add))
    end
    sum = sum + add
    dirty = true
    oldest = oldest or now
    newest = now
    return {0, 0, wait_for(0)}
  end
  return {0, remaining(), wait_for(hits)}
end

local out = {}
local i = 3
if ARGV[4] == '2' then
  -- A member is named by its sequence and cost, and the score tells a
  -- name handed out again (after the metadata was lost) from this one.
  -- A lease gives back part of its member: the rest stays at its score.
  local want, at = tonumber(ARGV[7]), ARGV[8]
  local named = redis.call('ZRANGEBYSCORE', log, at, at)
  for k = 1, #named do
    if seq_of(named[k]) == want then
      local cost = cost_of(named[k])
      local back = math.min(tonumber(ARGV[3]), cost)
      redis.call('ZREM', log, named[k])
      if back < cost then redis.call('ZADD', log, at, member(want, cost - back)) end
      sum = sum - back
      dirty = true
      break
    end
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
if dirty then save() end
return out
