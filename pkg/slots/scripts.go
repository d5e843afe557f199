package slots

import "github.com/redis/go-redis/v9"

// Every script reads the clock with Redis TIME, in Unix milliseconds, so all
// processes agree on expiries. Lua formats numbers written back to Redis
// with %.17g, which keeps a 13-digit millisecond time exact.

// luaNow is prepended to the scripts that need the time.
const luaNow = `
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// acquireScript makes one decision of the rule in the package doc: drop
// expired leases and registrations, register (or refresh) the asker,
// count, and grant or refuse.
//
// KEYS[1]      leases zset, KEYS[2] owners hash
// KEYS[3..6]   waiter zsets of priorities 1..4 (id → since ms)
// KEYS[7..10]  waiter expiry zsets of priorities 1..4 (id → expiry ms)
// KEYS[11]     acquired zset (lease id → granted ms)
// KEYS[12]     promoted hash (waiter id → priority), KEYS[13] its expiry zset
// ARGV[1] total, ARGV[2..5] reserves of priorities 1..4, ARGV[6] priority,
// ARGV[7] waiter id, ARGV[8] since ms, ARGV[9] lease id, ARGV[10] lease
// ttl ms, ARGV[11] waiter ttl ms
// Reply: the grant time in Unix ms (lease added, registration removed), or -n refused
// with n >= 1 grants to go before the asker's turn (registration kept
// until now + waiter ttl).
var acquireScript = redis.NewScript(luaNow + `
local gone = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now)
for _, id in ipairs(gone) do
  redis.call("HDEL", KEYS[2], id)
  redis.call("ZREM", KEYS[11], id)
end
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
-- Grant times of leases that a release of an older version left behind.
redis.call("ZREMRANGEBYSCORE", KEYS[11], "-inf", now - 86400000)
for q = 1, 4 do
  local dead = redis.call("ZRANGEBYSCORE", KEYS[6 + q], "-inf", now)
  for _, id in ipairs(dead) do redis.call("ZREM", KEYS[2 + q], id) end
  redis.call("ZREMRANGEBYSCORE", KEYS[6 + q], "-inf", now)
end

local lapsed = redis.call("ZRANGEBYSCORE", KEYS[13], "-inf", now)
for _, w in ipairs(lapsed) do redis.call("HDEL", KEYS[12], w) end
redis.call("ZREMRANGEBYSCORE", KEYS[13], "-inf", now)

local p, id = tonumber(ARGV[6]), ARGV[7]
-- A waiter promoted by Promote waits, and takes its slot, as the more
-- urgent priority.
local promoted = tonumber(redis.call("HGET", KEYS[12], id) or "5")
if promoted < p then
  redis.call("ZREM", KEYS[2 + p], id)
  redis.call("ZREM", KEYS[6 + p], id)
  p = promoted
end
redis.call("ZADD", KEYS[2 + p], ARGV[8], id)
redis.call("ZADD", KEYS[6 + p], now + tonumber(ARGV[11]), id)

local used = {0, 0, 0, 0}
local owners = redis.call("HVALS", KEYS[2])
for _, v in ipairs(owners) do
  local q = tonumber(v)
  used[q] = used[q] + 1
end
local free = tonumber(ARGV[1]) - #owners
local rank = redis.call("ZRANK", KEYS[2 + p], id) + 1

local pos, avail = rank, free
if p > 1 then
  local waiting, own = {}, {}
  for q = 1, 4 do
    waiting[q] = redis.call("ZCARD", KEYS[2 + q])
    own[q] = math.min(waiting[q], math.max(0, tonumber(ARGV[1 + q]) - used[q]))
  end
  -- Critical's unused reserve is never lent, and critical waiters beyond
  -- it come before every other priority.
  avail = free - math.max(tonumber(ARGV[2]) - used[1], waiting[1], 0)
  -- Owner parts of 2..4 first, then borrowing remainders of 2..4.
  pos = 0
  if rank <= own[p] then
    for q = 2, p - 1 do pos = pos + own[q] end
    pos = pos + rank
  else
    for q = 2, 4 do pos = pos + own[q] end
    for q = 2, p - 1 do pos = pos + waiting[q] - own[q] end
    pos = pos + rank - own[p]
  end
end
-- Refused: how many grants stand between the asker and its turn (at
-- least 1), negated, so Acquire can poll less often the further back it
-- stands.
if pos > avail then return avail - pos end

redis.call("ZREM", KEYS[2 + p], id)
redis.call("ZREM", KEYS[6 + p], id)
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[10]), ARGV[9])
redis.call("HSET", KEYS[2], ARGV[9], p)
redis.call("ZADD", KEYS[11], now, ARGV[9])
redis.call("HDEL", KEYS[12], id)
redis.call("ZREM", KEYS[13], id)
return now
`)

// promoteScript makes a waiter (or a request that will become one) wait as
// a more urgent priority; a less urgent promotion than one already made is
// ignored.
//
// KEYS[1] promoted hash, KEYS[2] its expiry zset
// ARGV[1] waiter id, ARGV[2] priority, ARGV[3] ttl ms
// Reply: 1 promoted, 0 already as urgent.
var promoteScript = redis.NewScript(luaNow + `
local cur = tonumber(redis.call("HGET", KEYS[1], ARGV[1]) or "5")
if cur <= tonumber(ARGV[2]) then return 0 end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
redis.call("ZADD", KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
return 1
`)

// leaveScript removes a waiter's registration.
//
// KEYS[1] waiter zset of its priority, KEYS[2] waiter expiry zset
// ARGV[1] waiter id
// Reply: 1 removed, 0 it was not registered.
var leaveScript = redis.NewScript(`
redis.call("ZREM", KEYS[2], ARGV[1])
return redis.call("ZREM", KEYS[1], ARGV[1])
`)

// renewScript pushes a live lease's expiry to now + ttl. A lease that has
// already expired is lost even if no script has dropped it yet: its slot
// no longer counts, so it may already have been granted to someone else.
//
// KEYS[1] leases zset, KEYS[2] owners hash, KEYS[3] acquired zset
// ARGV[1] lease id, ARGV[2] ttl ms
// Reply: 1 renewed, 0 lost (expired or released; an expired one is dropped).
var renewScript = redis.NewScript(luaNow + `
local exp = redis.call("ZSCORE", KEYS[1], ARGV[1])
if exp and tonumber(exp) > now then
  redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZREM", KEYS[3], ARGV[1])
redis.call("HDEL", KEYS[2], ARGV[1])
return 0
`)

// releaseScript frees a lease.
//
// KEYS[1] leases zset, KEYS[2] owners hash, KEYS[3] acquired zset
// ARGV[1] lease id
// Reply: 1 freed, 0 it was already gone.
var releaseScript = redis.NewScript(`
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZREM", KEYS[3], ARGV[1])
return redis.call("HDEL", KEYS[2], ARGV[1])
`)

// inUseScript counts live leases per priority and reads their ages; it
// writes nothing.
//
// KEYS[1] leases zset, KEYS[2] owners hash, KEYS[3] acquired zset
// Reply: {used1, used2, used3, used4, age ms of each live lease that has a
// grant time...}.
var inUseScript = redis.NewScript(luaNow + `
local used, ages = {0, 0, 0, 0}, {}
local live = redis.call("ZRANGEBYSCORE", KEYS[1], string.format("(%d", now), "+inf")
for _, id in ipairs(live) do
  local p = redis.call("HGET", KEYS[2], id)
  if p then
    used[tonumber(p)] = used[tonumber(p)] + 1
    local at = redis.call("ZSCORE", KEYS[3], id)
    if at then ages[#ages + 1] = math.max(0, now - tonumber(at)) end
  end
end
for _, a in ipairs(ages) do used[#used + 1] = a end
return used
`)

// waitingScript lists live waiters per priority in grant order; it writes
// nothing.
//
// KEYS[1..4] waiter zsets of priorities 1..4, KEYS[5..8] their expiry zsets
// Reply: four arrays of waiter ids, priorities 1..4.
var waitingScript = redis.NewScript(luaNow + `
local out = {}
for q = 1, 4 do
  local live = {}
  for _, id in ipairs(redis.call("ZRANGE", KEYS[q], 0, -1)) do
    local exp = redis.call("ZSCORE", KEYS[4 + q], id)
    if exp and tonumber(exp) > now then live[#live + 1] = id end
  end
  out[q] = live
end
return out
`)
