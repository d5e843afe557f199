package keypool

import "github.com/redis/go-redis/v9"

// All times inside the scripts are Redis TIME in microseconds, so every
// worker process on every machine meters against one clock. Numbers written
// to Redis go through fmt17 because Lua's tostring keeps only 14 significant
// digits, which would round a µs timestamp (16 digits).

// luaCommon is prepended to every script.
const luaCommon = `
local function nowus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt17(x) return string.format('%.17g', x) end
-- refill returns level grown by the elapsed time at cap per minute,
-- clamped to cap. A level may be negative (a debt from a settle charge or a
-- header correction); it then refills from below zero.
local function refill(level, cap, ts, now)
  local dt = now - ts
  if dt < 0 then dt = 0 end
  local l = level + dt * cap / 60000000
  if l > cap then l = cap end
  return l
end
`

// registerLua writes the limits of the configured keys, creating the bucket
// state (both buckets full) of a key seen for the first time. An existing
// key keeps its levels, so a restarting worker never refills a bucket; its
// levels are only clamped to a lowered capacity.
//
// KEYS[i]            state hash of key i
// ARGV[5i-4 .. 5i]   provider, tier, rpm, tpm, max in-flight of key i
// Reply: array of the 1-based indexes of keys whose stored limits changed.
const registerLua = luaCommon + `
local now = nowus()
local changed = {}
for i = 1, #KEYS do
  local b = 5 * (i - 1)
  local provider, tier = ARGV[b + 1], ARGV[b + 2]
  local rpm, tpm, mif = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local v = redis.call('HMGET', KEYS[i], 'rpm', 'tpm', 'mif', 'rl', 'tl', 'provider', 'tier')
  if not v[1] then
    redis.call('HSET', KEYS[i], 'provider', provider, 'tier', tier, 'rpm', rpm, 'tpm', tpm, 'mif', mif,
      'rl', rpm, 'tl', tpm, 'ts', fmt17(now))
  else
    if tonumber(v[1]) ~= rpm or tonumber(v[2]) ~= tpm or tonumber(v[3]) ~= mif or v[6] ~= provider or v[7] ~= tier then
      changed[#changed + 1] = i
    end
    local rl, tl = tonumber(v[4]) or rpm, tonumber(v[5]) or tpm
    if rl > rpm then rl = rpm end
    if tl > tpm then tl = tpm end
    redis.call('HSET', KEYS[i], 'provider', provider, 'tier', tier, 'rpm', rpm, 'tpm', tpm, 'mif', mif,
      'rl', fmt17(rl), 'tl', fmt17(tl))
  end
end
return changed
`

// acquireLua picks the key with the most headroom among the route's keys
// and reserves one request and est tokens on it, in one atomic step.
//
// KEYS[2i-1], KEYS[2i]  state hash and lease set of candidate key i
// ARGV[1]  estimated tokens to reserve (>= 0)
// ARGV[2]  lease TTL in µs
// ARGV[3]  lease id
// Reply:
//
//	{1, i, now, expiry}        granted on key i; lease expires at expiry (µs)
//	{0, wait, reason, now}     no room; the earliest key has room in wait µs
//	                           (-1: every fitting key is disabled); reason is
//	                           requests|tokens|cooling|in_flight|disabled
//	{-1, now}                  est exceeds the TPM of every key: never fits
//	{-2, i}                    key i is not registered (Redis lost its state)
const acquireLua = luaCommon + `
local est, ttl, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local now = nowus()
local best, bestHead, bestRL, bestTL = 0, 0, 0, 0
local minWait, minReason = -1, 'disabled'
local fits = 0
for i = 1, #KEYS / 2 do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  local v = redis.call('HMGET', h, 'rpm', 'tpm', 'mif', 'rl', 'tl', 'ts', 'cu', 'off')
  local rpm, tpm = tonumber(v[1]), tonumber(v[2])
  if not rpm or not tpm then return {-2, i} end
  if est <= tpm then
    fits = fits + 1
    if not v[8] then
      local mif = tonumber(v[3]) or 0
      local ts = tonumber(v[6]) or now
      local rl = refill(tonumber(v[4]) or rpm, rpm, ts, now)
      local tl = refill(tonumber(v[5]) or tpm, tpm, ts, now)
      local wait, reason = 0, ''
      local cu = tonumber(v[7]) or 0
      if cu > now then wait, reason = cu - now, 'cooling' end
      local inflight = 0
      if mif > 0 then
        -- Drop expired leases before counting: a killed worker's slot
        -- comes back here. (Without a MaxInFlight the count matters to no
        -- decision; that set is pruned when the key is granted on.)
        redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
        inflight = redis.call('ZCARD', z)
        if inflight >= mif then
          local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
          local w = tonumber(first[2]) - now
          if w > wait then wait, reason = w, 'in_flight' end
        end
      end
      if rl < 1 then
        local w = (1 - rl) * 60000000 / rpm
        if w > wait then wait, reason = w, 'requests' end
      end
      if tl < est then
        local w = (est - tl) * 60000000 / tpm
        if w > wait then wait, reason = w, 'tokens' end
      end
      if wait <= 0 then
        -- Headroom: the smallest fraction of any limit left after this
        -- reservation. Ties keep the earlier key (configuration order).
        local head = (rl - 1) / rpm
        local th = (tl - est) / tpm
        if th < head then head = th end
        if mif > 0 then
          local ih = (mif - inflight - 1) / mif
          if ih < head then head = ih end
        end
        if best == 0 or head > bestHead then
          best, bestHead, bestRL, bestTL = i, head, rl, tl
        end
      elseif minWait < 0 or wait < minWait then
        minWait, minReason = wait, reason
      end
    end
  end
end
if fits == 0 then return {-1, now} end
if best == 0 then
  if minWait >= 0 then
    minWait = math.ceil(minWait)
    if minWait < 1 then minWait = 1 end
  end
  return {0, minWait, minReason, now}
end
local h, z = KEYS[2 * best - 1], KEYS[2 * best]
redis.call('HSET', h, 'rl', fmt17(bestRL - 1), 'tl', fmt17(bestTL - est), 'ts', fmt17(now))
redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
redis.call('ZADD', z, now + ttl, lease)
-- The set outlives its last lease by a second at most, so an idle key
-- leaves nothing behind.
redis.call('PEXPIRE', z, math.ceil(ttl / 1000) + 1000)
return {1, best, now, now + ttl}
`

// settleLua ends a lease: it removes the lease, returns or charges tokens,
// applies the provider's remaining counts (only ever lowering a bucket) and
// updates the 429 state according to op.
//
// KEYS[1]  state hash of the key
// KEYS[2]  lease set of the key
// ARGV[1]  lease id
// ARGV[2]  tokens to give back to the token bucket (negative: charge more)
// ARGV[3]  requests remaining per the provider (-1: unknown)
// ARGV[4]  tokens remaining per the provider (-1: unknown)
// ARGV[5]  op: ok (reset the 429 count) | cool (a 429) | off (disable) | none
// ARGV[6]  lease grant time (µs)
// ARGV[7]  cooldown base (µs)
// ARGV[8]  cooldown max (µs)
// ARGV[9]  provider Retry-After (µs, 0 when absent)
// ARGV[10] disable reason (op off)
// Reply: {lease was live (0|1), consecutive 429s, cooling until (µs), now,
// bucket lowered by the provider's headers (0|1), registered (0|1)}
const settleLua = luaCommon + `
local now = nowus()
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'rpm', 'tpm', 'rl', 'tl', 'ts', 'n', 'cu', 'cs')
local rpm, tpm = tonumber(v[1]), tonumber(v[2])
if not rpm or not tpm then return {removed, 0, 0, now, 0, 0} end
local ts = tonumber(v[5]) or now
local rl = refill(tonumber(v[3]) or rpm, rpm, ts, now)
local tl = refill(tonumber(v[4]) or tpm, tpm, ts, now) + tonumber(ARGV[2])
if tl > tpm then tl = tpm end
local lowered = 0
local remR, remT = tonumber(ARGV[3]), tonumber(ARGV[4])
if remR >= 0 and remR < rl then rl = remR; lowered = 1 end
if remT >= 0 and remT < tl then tl = remT; lowered = 1 end
local n, cu, cs = tonumber(v[6]) or 0, tonumber(v[7]) or 0, tonumber(v[8]) or 0
local op = ARGV[5]
if op == 'ok' then
  n = 0
elseif op == 'cool' then
  local d = 0
  -- Only a lease granted after the last escalation is new evidence: the
  -- other calls in flight when the key was first cooled would otherwise
  -- each double the cooldown for one and the same overload.
  if tonumber(ARGV[6]) >= cs then
    n = n + 1
    cs = now
    d = tonumber(ARGV[7]) * 2 ^ n
    if d > tonumber(ARGV[8]) then d = tonumber(ARGV[8]) end
  end
  local ra = tonumber(ARGV[9])
  if ra > d then d = ra end
  if now + d > cu then cu = now + d end
elseif op == 'off' then
  redis.call('HSET', KEYS[1], 'off', ARGV[10], 'off_at', fmt17(now))
end
redis.call('HSET', KEYS[1], 'rl', fmt17(rl), 'tl', fmt17(tl), 'ts', fmt17(now),
  'n', n, 'cu', fmt17(cu), 'cs', fmt17(cs))
return {removed, n, cu, now, lowered, 1}
`

// switchLua disables or enables one key.
//
// KEYS[1]  state hash of the key
// ARGV[1]  disable reason; empty enables the key
// Reply: 1 when the key is registered, 0 when its state is missing (the
// flag is written anyway and kept by the next registration).
const switchLua = luaCommon + `
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[1], 'off', 'off_at')
else
  redis.call('HSET', KEYS[1], 'off', ARGV[1], 'off_at', fmt17(nowus()))
end
return redis.call('HEXISTS', KEYS[1], 'rpm')
`

// snapshotLua reads every configured key's state at one instant. It writes
// nothing.
//
// KEYS[2i-1], KEYS[2i]  state hash and lease set of key i
// Reply: {now, {rpm, tpm, mif, rl, tl, ts, n, cu, off, live leases}, ...}
// with missing fields as nil.
const snapshotLua = luaCommon + `
local now = nowus()
local out = {now}
for i = 1, #KEYS / 2 do
  local v = redis.call('HMGET', KEYS[2 * i - 1], 'rpm', 'tpm', 'mif', 'rl', 'tl', 'ts', 'n', 'cu', 'off')
  v[10] = redis.call('ZCOUNT', KEYS[2 * i], '(' .. fmt17(now), '+inf')
  out[#out + 1] = v
end
return out
`

// scripts holds the pool's Lua scripts; each Pool owns its own set so the
// package keeps no mutable globals (redis.Script caches its SHA).
type scripts struct {
	register, acquire, settle, toggle, snapshot *redis.Script
}

func newScripts() *scripts {
	return &scripts{
		register: redis.NewScript(registerLua),
		acquire:  redis.NewScript(acquireLua),
		settle:   redis.NewScript(settleLua),
		toggle:   redis.NewScript(switchLua),
		snapshot: redis.NewScript(snapshotLua),
	}
}
