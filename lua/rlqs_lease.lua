-- Lease ledger of a limit shared among quota streams (RLQS): one stream's
-- report grants it a share. Same arithmetic as Ledger::report in
-- src/quota/mod.rs; the units (tokens per fill) are explained there.
--
-- KEYS[1]  the ledger (hash): holder -> "granted:expires_micros:demand"
-- ARGV[1]  holder (one stream of one replica)
-- ARGV[2]  requests reported (allowed + denied), at most 2^53
-- ARGV[3]  seconds they were seen over (at least 1 is used)
-- ARGV[4]  capacity: tokens per fill of the whole limit
-- ARGV[5]  fill interval in seconds
-- ARGV[6]  how long the share holds, in microseconds
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
local latest = now + hold
for i = 1, #raw, 2 do
  local granted, expires, demand = string.match(raw[i + 1], '^(%d+):(%d+):(%d+)$')
  expires = tonumber(expires)
  if granted == nil or expires <= now then
    redis.call('HDEL', KEYS[1], raw[i])
  elseif raw[i] == holder then
    previous = tonumber(demand)
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

-- Water-filling in order of demand, ties by name.
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
local room = math.max(capacity - others, 0)
local tokens = math.min(target, room)

-- %d: Lua 5.1 writes large numbers in exponent form when concatenated.
redis.call('HSET', KEYS[1], holder, string.format('%d:%d:%d', tokens, now + hold, demand))
redis.call('PEXPIRE', KEYS[1], math.ceil((latest - now) / 1000) + 1000)
return {tokens, n, others + tokens}
