-- Sliding window counter: two epoch-aligned buckets; the previous one weighs
-- what is left of it in the trailing window. Same semantics, and the same
-- floating-point steps, as sliding_counter() in src/storage/memory.rs.
--
-- KEYS[1]  limiter state (hash): w = current bucket index,
--          p = previous bucket's count, c = current bucket's count
-- ARGV[1]  limit (requests per window, > 0)
-- ARGV[2]  window length in microseconds
-- ARGV[3]  hits (cost of this call; 0 checks without counting)
-- ARGV[4]  1 to give hits back (never below zero), 0 to take them
--
-- Returns {admitted (0/1), remaining, reset_micros} as integers.
-- Only admitted hits are recorded. The clock is the server's (TIME).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local hits = tonumber(ARGV[3])
local negative = ARGV[4] == '1'

-- Integer division on doubles (exact below 2^53), corrected for rounding.
local idx = math.floor(now / w)
if idx * w > now then idx = idx - 1 end
if (idx + 1) * w <= now then idx = idx + 1 end
local start = idx * w
local elapsed = now - start

local st = redis.call('HMGET', KEYS[1], 'w', 'p', 'c')
local window = tonumber(st[1])
local prev = tonumber(st[2]) or 0
local cur = tonumber(st[3]) or 0
if window == idx - 1 then
  prev = cur
  cur = 0
elseif window ~= idx then
  prev = 0
  cur = 0
end

-- Multiplying before dividing keeps the estimate exact while prev * w stays
-- below 2^53.
local left = w - elapsed
local function estimate()
  return prev * left / w + cur
end
local function remaining(est)
  local r = math.floor(limit - est)
  if r > 0 then return r end
  return 0
end
local function ok_reset()
  if prev > 0 then return start + w - now end
  if cur > 0 then return start + 2 * w - now end
  return 0
end
local function save()
  if prev == 0 and cur == 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  redis.call('HSET', KEYS[1], 'w', string.format('%d', idx),
    'p', string.format('%d', prev), 'c', string.format('%d', cur))
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((start + 2 * w - now) / 1000)))
end

if negative then
  local back = math.min(hits, cur)
  cur = cur - back
  prev = prev - (hits - back)
  if prev < 0 then prev = 0 end
  save()
  return {1, remaining(estimate()), ok_reset()}
end

local est = estimate()
if hits > limit then
  return {0, remaining(est), w}
end
if est + hits <= limit then
  if hits > 0 then
    cur = cur + hits
    save()
  end
  return {1, remaining(estimate()), ok_reset()}
end

-- Refused: when does prev * weight(t) + cur + hits fit under the limit?
local need = limit - hits
local wait
-- prev * (w - e) / w <= room  holds from  e = w - floor(w * room / prev).
if cur <= need then
  -- Later in this bucket, as the previous bucket's weight falls.
  local at = w - math.min(math.floor(w * (need - cur) / prev), w)
  wait = at - elapsed
  if wait < 1 then wait = 1 end
else
  -- In the next bucket, where this bucket becomes the previous one.
  local at = w - math.min(math.floor(w * need / cur), w)
  wait = start + w - now + at
end
return {0, remaining(est), wait}
