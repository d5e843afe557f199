package keypool

import "github.com/redis/go-redis/v9"

// All times inside the scripts are Redis TIME in microseconds, so every
// worker process on every machine meters against one clock. Numbers written
// to Redis go through fmt17 because Lua's tostring keeps only 14 significant
// digits, which would round a µs timestamp (16 digits).

// luaCommon is prepended to every script. load() is the one reading of a
// key's state: it applies the pacing model (doc.go, "Bucket model") so that
// acquire, settle and snapshot cannot disagree about it.
const luaCommon = `
local function nowus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt17(x) return string.format('%.17g', x) end
local FIELDS = {'rpm', 'tpm', 'mif', 'win', 'pace', 'rl', 'tl', 'ts', 'n', 'cu', 'cs', 'off', 'hr', 'ht', 'f', 'rv',
  'itpm', 'otpm', 'il', 'ol', 'hi', 'ho', 'jit'}
-- side returns the effective rate, capacity and level now of one of
-- Anthropic's separate input and output buckets (limit lim, a limit the
-- provider reported below it heard, the stored level): the token bucket's
-- model applied to that limit.
local function side(s, lim, heard, stored, dt)
  local e = lim
  if heard > 0 and heard < e then e = heard end
  e = e * s.pace * s.f
  local cap = e * s.win / 60000000
  return e, cap, math.min(cap, (tonumber(stored) or cap) + dt * e / 60000000)
end
-- load returns the state of key hash h with its buckets brought up to now,
-- or nil when the key is not registered. er/et are the effective
-- per-minute rates: the configured limit, lowered to a limit the provider
-- reported, times pace and the adaptive factor f. capR/capT are the bucket
-- capacities: win's share of those rates (at least one request). A level
-- may be negative: a debt (a reservation ahead of time, a settle charge, a
-- header correction) that refills from below zero.
local function load(h, now)
  local v = redis.call('HMGET', h, unpack(FIELDS))
  local rpm, tpm = tonumber(v[1]), tonumber(v[2])
  if not rpm or not tpm then return nil end
  local s = {rpm = rpm, tpm = tpm, mif = tonumber(v[3]) or 0, win = tonumber(v[4]) or 60000000,
    pace = tonumber(v[5]) or 1, n = tonumber(v[9]) or 0, cu = tonumber(v[10]) or 0, cs = tonumber(v[11]) or 0,
    off = v[12], hr = tonumber(v[13]) or 0, ht = tonumber(v[14]) or 0, f = tonumber(v[15]) or 1,
    rv = tonumber(v[16]) or 0, jit = tonumber(v[23]) or 0}
  local er, et = rpm, tpm
  if s.hr > 0 and s.hr < er then er = s.hr end
  if s.ht > 0 and s.ht < et then et = s.ht end
  -- jit (µs) is the arrival jitter the pool absorbs (Config.Jitter): the
  -- provider meters a call when it arrives, up to jit later than our
  -- grant. A provider bucket under two requests (RPM·window < 2/min·min)
  -- never builds a reserve: each grant is spaced jit more than one refill.
  local pr = er
  if er * s.win / 60000000 < 2 then pr = math.min(er, 60000000 / (60000000 / er + s.jit)) end
  s.er, s.et = math.min(pr, er * s.pace) * s.f, et * s.pace * s.f
  s.capR = s.er * s.win / 60000000
  if s.capR < 1 then s.capR = 1 end
  -- A larger one keeps jit of refill as headroom (hd, at most what it
  -- holds beyond one request) below every grant: a call that reaches the
  -- provider up to jit earlier, relative to the call before it, than its
  -- grant still finds a request there, at no cost in rate.
  s.hd = math.min(s.jit * s.er / 60000000, s.capR - 1)
  s.capT = s.et * s.win / 60000000
  local ts = tonumber(v[8]) or now
  local dt = now - ts
  if dt < 0 then dt = 0 end
  s.rl = math.min(s.capR, (tonumber(v[6]) or s.capR) + dt * s.er / 60000000)
  s.tl = math.min(s.capT, (tonumber(v[7]) or s.capT) + dt * s.et / 60000000)
  -- A key with an ITPM or OTPM (Anthropic) has an input or output bucket
  -- too (ei/eo, capI/capO, il/ol); 0 means no such limit.
  s.itpm, s.otpm = tonumber(v[17]) or 0, tonumber(v[18]) or 0
  s.hi, s.ho = tonumber(v[21]) or 0, tonumber(v[22]) or 0
  if s.itpm > 0 then s.ei, s.capI, s.il = side(s, s.itpm, s.hi, v[19], dt) end
  if s.otpm > 0 then s.eo, s.capO, s.ol = side(s, s.otpm, s.ho, v[20], dt) end
  return s
end
local function save(h, s, now)
  redis.call('HSET', h, 'rl', fmt17(s.rl), 'tl', fmt17(s.tl), 'ts', fmt17(now), 'n', s.n,
    'cu', fmt17(s.cu), 'cs', fmt17(s.cs), 'f', fmt17(s.f), 'hr', s.hr, 'ht', s.ht, 'rv', fmt17(s.rv))
  if s.itpm > 0 then redis.call('HSET', h, 'il', fmt17(s.il), 'hi', s.hi) end
  if s.otpm > 0 then redis.call('HSET', h, 'ol', fmt17(s.ol), 'ho', s.ho) end
end
-- buckets lists the token buckets a request of est tokens, ein of them
-- input and eout output, draws on: {level, capacity, rate, charge,
-- reason}. A key without ITPM and OTPM has the one token bucket.
local function buckets(s, est, ein, eout)
  local b = {{s.tl, s.capT, s.et, est, 'tokens'}}
  if s.itpm > 0 then b[#b + 1] = {s.il, s.capI, s.ei, ein, 'input_tokens'} end
  if s.otpm > 0 then b[#b + 1] = {s.ol, s.capO, s.eo, eout, 'output_tokens'} end
  return b
end
-- wait returns the µs until s has room for one request of est tokens (ein
-- input, eout output; 0: now) and which bucket holds it back. A request
-- larger than a window's tokens is admitted from a full bucket, leaving a
-- debt, as providers do.
local function wait(s, est, ein, eout)
  local w, why = 0, ''
  if s.rl < 1 + s.hd then w, why = (1 + s.hd - s.rl) * 60000000 / s.er, 'requests' end
  for _, b in ipairs(buckets(s, est, ein, eout)) do
    local need = math.min(b[4], b[2])
    if b[1] < need then
      local x = (need - b[1]) * 60000000 / b[3]
      if x > w then w, why = x, b[5] end
    end
  end
  return w, why
end
-- within returns how many requests of est tokens (ein input, eout output)
-- s can grant within ahead µs (w, why: wait(s, est, ein, eout)), and the
-- wait of the first grant beyond those with the bucket that holds it back.
-- Used by the line: a key of room r requests by the horizon grants
-- floor(r) of them, fewer when any of its token buckets (tokens, input,
-- output) or its in-flight cap run out first.
local function within(s, est, ein, eout, ahead, w, why, inflight)
  if w > ahead then return 0, w, why end
  local k = math.floor(s.rl - s.hd + ahead * s.er / 60000000 + 1e-9)
  local bs = buckets(s, est, ein, eout)
  for _, b in ipairs(bs) do
    local e = b[4]
    if e > 0 then
      local kt = 1 + math.floor((b[1] + ahead * b[3] / 60000000 - math.min(e, b[2])) / e + 1e-9)
      if kt < k then k = kt end
    end
  end
  if s.mif > 0 and s.mif - inflight < k then k = s.mif - inflight end
  if k < 1 then k = 1 end
  local after, awhy = (k + 1 + s.hd - s.rl) * 60000000 / s.er, 'requests'
  for _, b in ipairs(bs) do
    local e = b[4]
    if e > 0 then
      local x = (math.min(e, b[2]) + k * e - b[1]) * 60000000 / b[3]
      if x > after then after, awhy = x, b[5] end
    end
  end
  return k, after, awhy
end
`

// registerLua writes the limits of the configured keys, creating the bucket
// state (both buckets full) of a key seen for the first time. An existing
// key keeps its levels, so a restarting worker never refills a bucket; its
// levels are only clamped to a lowered capacity.
//
// KEYS[i]            state hash of key i
// ARGV[10i-9 .. 10i] provider, tier, rpm, tpm, max in-flight, window (µs),
// pace, itpm, otpm (0: none), jitter (µs) of key i
// Reply: array of the 1-based indexes of keys whose stored limits changed.
const registerLua = luaCommon + `
local now = nowus()
local changed = {}
for i = 1, #KEYS do
  local b = 10 * (i - 1)
  local h = KEYS[i]
  local old = redis.call('HMGET', h, 'rpm', 'tpm', 'mif', 'win', 'pace', 'itpm', 'otpm', 'jit', 'provider', 'tier')
  if old[1] then
    for j = 1, 8 do
      -- A hash written before ITPM/OTPM (or jit) existed has none: 0.
      if (tonumber(old[j]) or 0) ~= tonumber(ARGV[b + 2 + j]) then changed[#changed + 1] = i; break end
    end
    if old[9] ~= ARGV[b + 1] or old[10] ~= ARGV[b + 2] then
      if changed[#changed] ~= i then changed[#changed + 1] = i end
    end
  end
  redis.call('HSET', h, 'provider', ARGV[b + 1], 'tier', ARGV[b + 2], 'rpm', ARGV[b + 3], 'tpm', ARGV[b + 4],
    'mif', ARGV[b + 5], 'win', ARGV[b + 6], 'pace', ARGV[b + 7], 'itpm', ARGV[b + 8], 'otpm', ARGV[b + 9],
    'jit', ARGV[b + 10])
  -- A limit taken out of the configuration takes its bucket with it; one
  -- put back starts full.
  if tonumber(ARGV[b + 8]) == 0 then redis.call('HDEL', h, 'il', 'hi') end
  if tonumber(ARGV[b + 9]) == 0 then redis.call('HDEL', h, 'ol', 'ho') end
  -- load() fills a new key's buckets and clamps an old key's levels to the
  -- (possibly smaller) capacities; save() writes them back.
  save(h, load(h, now), now)
end
return changed
`

// acquireLua picks a key of the route and reserves one request and est
// tokens on it, in one atomic step. A key with room now wins by headroom;
// with ahead > 0, a key whose buckets refill within ahead µs may be
// reserved for that moment (the caller waits until then), the earliest one
// winning. Among keys with room now a preferred key wins, then headroom;
// equal headroom goes to the first key counting from a rotation the
// caller picks at random, so equal keys share the load. Cooling keys and
// keys at their in-flight cap are never reserved.
//
// With a waiter (ARGV[7]) the route's line decides who may reserve: the
// waiter is registered (or refreshed) in the line at its place (ARGV[8]:
// priority, then acceptance time) and is granted only when its rank is
// within the grants the keys can make within ahead (see doc.go, "The
// line"); the granted waiter leaves the line.
//
// KEYS[2i-1], KEYS[2i]  state hash and lease set of candidate key i
// KEYS[#KEYS-2]         the route's line: waiter → place
// KEYS[#KEYS-1]         the line's expiries: waiter → expiry (µs)
// KEYS[#KEYS]           the route's spacing (lg, sat: µs), see keys.go
// ARGV[1]  estimated tokens to reserve (>= 0)
// ARGV[2]  lease TTL in µs
// ARGV[3]  lease id
// ARGV[4]  how far ahead a reservation may be made, µs (0: only now)
// ARGV[5]  per candidate key, '1' if preferred else '0'
// ARGV[6]  rotation: ties in headroom go to the first key from index 1+ARGV[6]
// ARGV[7]  waiter id; empty: no line (the ask goes before every waiter)
// ARGV[8]  the waiter's place (smaller goes first)
// ARGV[9]  how long the registration lives without another ask, µs
// ARGV[10] the input part of ARGV[1], charged to an ITPM bucket
// ARGV[11] the output part of ARGV[1] (max_tokens), charged to an OTPM bucket
// ARGV[12] '1': the waiter is not spaced (CRITICAL, see doc.go "The line")
// Reply:
//
//	{1, i, now, expiry, at}    granted on key i for time at (>= now); the
//	                           lease expires at expiry (µs)
//	{0, wait, reason, now}     no room, or not this waiter's turn: ask again
//	                           in wait µs (-1: every fitting key is
//	                           disabled); reason is
//	                           requests|tokens|input_tokens|
//	                           output_tokens|cooling|in_flight|disabled
//	{-1, now}                  est exceeds the TPM (or its input part the
//	                           ITPM, its output part the OTPM) of every
//	                           key: never fits
//	{-2, i}                    key i is not registered (Redis lost its state)
const acquireLua = luaCommon + `
-- whole is a wait in whole µs, at least 1; a negative one (every key
-- disabled) stays as it is.
local function whole(x)
  if x < 0 then return x end
  return math.max(1, math.ceil(x))
end
local est, ttl, lease, ahead = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local prefs, rot = ARGV[5] or '', tonumber(ARGV[6] or '0')
local who, place, lttl = ARGV[7] or '', ARGV[8], tonumber(ARGV[9] or '0')
local ein, eout = tonumber(ARGV[10] or ARGV[1]), tonumber(ARGV[11] or ARGV[1])
local unspaced = ARGV[12] == '1'
local now = nowus()
local n = (#KEYS - 3) / 2
local line, lineExp, paceKey = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local minWait, minReason = -1, 'disabled'
-- The soonest end of a cooldown or an in-flight cap, when a key has one.
local minHard, hardReason = -1, ''
local fits = 0
-- First pass: each key's state and wait; rate sums the request rates of
-- the keys that may serve (not disabled, not cooling, under their cap).
local ks, rate = {}, 0
for i = 1, n do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  local s = load(h, now)
  if not s then return {-2, i} end
  if est <= s.tpm and (s.itpm == 0 or ein <= s.itpm) and (s.otpm == 0 or eout <= s.otpm) then
    fits = fits + 1
    if not s.off then
      local w, reason = wait(s, est, ein, eout)
      -- hard: a wait no reservation may skip.
      local hard, hreason = 0, ''
      if s.cu > now then hard, hreason = s.cu - now, 'cooling' end
      local inflight = 0
      if s.mif > 0 then
        -- Drop expired leases before counting: a killed worker's slot
        -- comes back here. (Without a MaxInFlight the count matters to no
        -- decision; that set is pruned when the key is granted on.)
        redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
        inflight = redis.call('ZCARD', z)
        if inflight >= s.mif then
          local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
          local x = tonumber(first[2]) - now
          if x > hard then hard, hreason = x, 'in_flight' end
        end
      end
      ks[#ks + 1] = {i = i, s = s, w = w, reason = reason, hard = hard, hreason = hreason, inflight = inflight}
      if hard == 0 then rate = rate + s.er end
    end
  end
end
if fits == 0 then return {-1, now} end
-- The line: registrations of waiters that stopped asking lapse first;
-- then the asker is registered (or refreshed) and ranked.
local rank, waiting = 0, 0
if who ~= '' then
  local dead = redis.call('ZRANGEBYSCORE', lineExp, '-inf', now)
  for _, id in ipairs(dead) do redis.call('ZREM', line, id) end
  redis.call('ZREMRANGEBYSCORE', lineExp, '-inf', now)
  redis.call('ZADD', line, place, who)
  redis.call('ZADD', lineExp, now + lttl, who)
  local keep = math.ceil(lttl / 1000) + 1000
  redis.call('PEXPIRE', line, keep)
  redis.call('PEXPIRE', lineExp, keep)
  rank = redis.call('ZRANK', line, who) + 1
  waiting = redis.call('ZCARD', line)
end
-- Spacing (lined asks only, see doc.go "The line"): on a saturated route
-- the grants are spread one route interval S apart, so that the keys'
-- moments interleave instead of coming in bursts a whole key interval
-- apart (4 keys refilled together serve 4 at once, then nothing for
-- 0.5 s: the wait of a CRITICAL request arriving in between). A key whose
-- bucket holds a request beyond this one (burst room), or would overflow
-- within S, is not held back: spacing never wastes capacity.
-- It applies to a saturated route only, now or within the last
-- SATURATED µs (a line that dips for a moment after a burst must not let
-- the keys realign): more waiters in line than keys that may serve, or
-- keys that have spent their burst room (less than one request ready per
-- key). The second catches a burst's start, whose asks each find the line
-- short: granted at once, they would drain every key within a few ms and
-- leave none for a CRITICAL request for a whole key interval. A route
-- the keys keep up with (the slots, or the calls' length, bind) grants at
-- once: there spacing would only add its interval to requests that hold a
-- slot (S1-slow: goodput 0.97 -> 0.95).
local SATURATED = 2000000
local serving, ready = 0, 0
for _, k in ipairs(ks) do
  if k.hard == 0 then serving, ready = serving + 1, ready + k.s.rl - k.s.hd end
end
local S, spaceAt, lg = 0, 0, 0
if who ~= '' and rate > 0 then
  local pv = redis.call('HMGET', paceKey, 'lg', 'sat')
  lg = tonumber(pv[1] or '0')
  local sat = tonumber(pv[2] or '0')
  if waiting > serving or ready < serving then
    redis.call('HSET', paceKey, 'sat', fmt17(now + SATURATED))
    redis.call('PEXPIRE', paceKey, 60000)
    sat = now + SATURATED
  end
  -- An unspaced waiter (CRITICAL) takes a ready request at once: held
  -- back for spacing, two CRITICAL requests arriving together waited two
  -- route intervals. Its grant still moves lg, so the spaced ones behind
  -- it go on one interval later and the keys stay interleaved.
  if sat > now and not unspaced then
    S = 60000000 / rate
    spaceAt = lg + S - now
  end
end
local best, bestWait, bestHead, bestS, bestPref, bestRank = 0, 0, 0, nil, false, 0
-- The line's arithmetic: grants the keys can make within ahead, the
-- soonest moment after those.
local grants, nextWait, nextReason, spaced = 0, -1, '', false
for _, k in ipairs(ks) do
  local s, w, hard = k.s, k.w, k.hard
  local q = w
  local free = true
  if hard == 0 and S > 0 then
    local level = s.rl + w * s.er / 60000000
    free = level >= 2 + s.hd or level + S * s.er / 60000000 > s.capR
    if not free and spaceAt > q then q = spaceAt end
  end
  if hard == 0 then
    local c, after, why = within(s, est, ein, eout, ahead, w, k.reason, k.inflight)
    if free then
      grants = grants + c
    elseif q <= ahead then
      -- One spaced grant within the horizon; the next is an interval on.
      spaced = true
      if spaceAt + S > after then after = spaceAt + S end
    else
      -- Held back by spacing alone: this key's next moment is q.
      after = q
    end
    if nextWait < 0 or after < nextWait then nextWait, nextReason = after, why end
  end
  if hard == 0 and q <= ahead then
    -- Headroom: the smallest fraction of any limit left after this
    -- reservation. The earliest key wins; among keys free now, a
    -- preferred one, then the most headroom, then the rotation.
    local head = (s.rl - 1) / s.capR
    for _, b in ipairs(buckets(s, est, ein, eout)) do
      local th = (b[1] - b[4]) / math.max(b[2], b[4])
      if th < head then head = th end
    end
    if s.mif > 0 then
      local ih = (s.mif - k.inflight - 1) / s.mif
      if ih < head then head = ih end
    end
    local pref = q == 0 and string.sub(prefs, k.i, k.i) == '1'
    local rank = (k.i - 1 - rot) % n
    local better = best == 0 or q < bestWait
    if not better and q == bestWait then
      if pref ~= bestPref then
        better = pref
      elseif head ~= bestHead then
        better = head > bestHead
      else
        better = rank < bestRank
      end
    end
    if better then
      best, bestWait, bestHead, bestS, bestPref, bestRank = k.i, q, head, s, pref, rank
    end
  else
    -- A soft wait is reported up to the horizon, not to room now: the
    -- caller that comes back then can reserve.
    local x, why = math.max(q - ahead, 1), k.reason
    if hard > x then x, why = hard, k.hreason end
    if minWait < 0 or x < minWait then minWait, minReason = x, why end
    if hard > 0 and (minHard < 0 or hard < minHard) then minHard, hardReason = hard, k.hreason end
  end
end
if spaced then grants = grants + 1 end
if who ~= '' then
  if rank > grants then
    -- Not this waiter's turn within the horizon: come back when the
    -- moments of the waiters ahead have been reserved, about (rank -
    -- grants - 1) route intervals after the soonest moment beyond the
    -- horizon, or when a cooling or full key frees, if sooner.
    local back, why = minHard, hardReason
    if rate == 0 and back < 0 then back, why = minWait, minReason end
    if rate > 0 then
      local x = math.max(nextWait - ahead, 0) + (rank - grants - 1) * 60000000 / rate
      if back < 0 or x < back then back, why = x, nextReason end
    end
    return {0, whole(back), why, now}
  end
  redis.call('ZREM', line, who)
  redis.call('ZREM', lineExp, who)
end
if best == 0 then return {0, whole(minWait), minReason, now} end
local h, z = KEYS[2 * best - 1], KEYS[2 * best]
bestS.rl = bestS.rl - 1
bestS.tl = bestS.tl - est
if bestS.itpm > 0 then bestS.il = bestS.il - ein end
if bestS.otpm > 0 then bestS.ol = bestS.ol - eout end
local at = now + math.ceil(bestWait)
if at > bestS.rv then bestS.rv = at end
save(h, bestS, now)
if who ~= '' and at > lg then
  -- The route's last grant moment, for spacing; forgotten after a minute.
  redis.call('HSET', paceKey, 'lg', fmt17(at))
  redis.call('PEXPIRE', paceKey, 60000)
end
redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
redis.call('ZADD', z, at + ttl, lease)
-- The set outlives its last lease by a second at most, so an idle key
-- leaves nothing behind. Only ever extended: a lease reserved further
-- ahead may expire after this one.
local keep = math.ceil((at - now + ttl) / 1000) + 1000
if redis.call('PTTL', z) < keep then redis.call('PEXPIRE', z, keep) end
return {1, best, now, at + ttl, at}
`

// leaveLua removes a waiter from a route's line.
//
// KEYS[1]  the route's line, KEYS[2] its expiries
// ARGV[1]  waiter id
// Reply: 1 removed, 0 it was not in line.
const leaveLua = `
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
`

// lineLua lists a route's live waiters, first first; it writes nothing.
//
// KEYS[1]  the route's line, KEYS[2] its expiries
// Reply: the waiter ids.
const lineLua = luaCommon + `
local now = nowus()
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local exp = redis.call('ZSCORE', KEYS[2], id)
  if exp and tonumber(exp) > now then out[#out + 1] = id end
end
return out
`

// settleLua ends a lease: it removes the lease, returns or charges tokens
// (and the request, when the call was never made), applies what the
// provider's rate-limit headers said (only ever lowering) and updates the
// 429 state according to op.
//
// KEYS[1]  state hash of the key
// KEYS[2]  lease set of the key
// ARGV[1]  lease id
// ARGV[2]  tokens to give back to the token bucket (negative: charge more)
// ARGV[3]  1 to give the request back too (the call was never made), else 0
// ARGV[4]  op: ok (reset the 429 count) | cool (a 429) | off (disable) | none |
// wait (capacity full: cool for exactly the Retry-After, else the base)
// ARGV[5]  lease grant time (µs)
// ARGV[6]  cooldown base (µs)
// ARGV[7]  cooldown max (µs)
// ARGV[8]  provider Retry-After (µs, 0 when absent)
// ARGV[9]  disable reason (op off)
// ARGV[10..15] provider headers, -1 when absent: requests limit,
// remaining, reset (µs from now); tokens limit, remaining, reset
// ARGV[16] input tokens to give back to the ITPM bucket (negative: charge)
// ARGV[17] output tokens to give back to the OTPM bucket (negative: charge)
// ARGV[18..23] provider headers as ARGV[10..15], for the input tokens
// and the output tokens (a key without that limit ignores them)
// Reply: {lease was live (0|1), consecutive 429s, cooling until (µs), now,
// bucket lowered by the provider's headers (0|1), registered (0|1)}
const settleLua = luaCommon + `
local now = nowus()
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
local s = load(KEYS[1], now)
if not s then return {removed, 0, 0, now, 0, 0} end
local rl0, tl0, il0, ol0 = s.rl, s.tl, s.il, s.ol
s.tl = math.min(s.capT, s.tl + tonumber(ARGV[2]))
if s.itpm > 0 then s.il = math.min(s.capI, s.il + tonumber(ARGV[16])) end
if s.otpm > 0 then s.ol = math.min(s.capO, s.ol + tonumber(ARGV[17])) end
if ARGV[3] == '1' then s.rl = math.min(s.capR, s.rl + 1) end
-- A credit must not let the buckets fill before the last reservation made
-- ahead is due: refilling clamps at capacity and would forget that
-- reservation's debt. So while one is outstanding, a credit raises a level
-- only up to capacity less the refill still to come before it.
if s.rv > now then
  local a = (s.rv - now) / 60000000
  s.rl = math.min(s.rl, math.max(rl0, s.capR - a * s.er))
  s.tl = math.min(s.tl, math.max(tl0, s.capT - a * s.et))
  if s.itpm > 0 then s.il = math.min(s.il, math.max(il0, s.capI - a * s.ei)) end
  if s.otpm > 0 then s.ol = math.min(s.ol, math.max(ol0, s.capO - a * s.eo)) end
end
-- A limit the provider reports below ours becomes the effective limit; one
-- at or above ours ends an earlier correction.
local function learn(lim, conf, cur)
  if lim <= 0 then return cur end
  if lim < conf then return lim end
  return 0
end
s.hr = learn(tonumber(ARGV[10]), s.rpm, s.hr)
s.ht = learn(tonumber(ARGV[13]), s.tpm, s.ht)
if s.itpm > 0 then s.hi = learn(tonumber(ARGV[18]), s.itpm, s.hi) end
if s.otpm > 0 then s.ho = learn(tonumber(ARGV[21]), s.otpm, s.ho) end
-- bound: the provider's per-minute bucket holds remaining, and (refilling
-- at limit per minute) reaches full after reset; our window bucket never
-- holds more than that bucket.
-- A reset over a minute (x < 0) fits no per-minute bucket (a daily limit,
-- an odd host): it is ignored, and remaining still counts.
local function bound(level, lim, rem, reset)
  local b = -1
  if rem >= 0 then b = rem end
  if reset >= 0 and lim > 0 then
    local x = lim - reset * lim / 60000000
    if x >= 0 and (b < 0 or x < b) then b = x end
  end
  if b >= 0 and b < level then return b, 1 end
  return level, 0
end
local lr, lt
s.rl, lr = bound(s.rl, tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]))
s.tl, lt = bound(s.tl, tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15]))
local li, lo = 0, 0
if s.itpm > 0 then s.il, li = bound(s.il, tonumber(ARGV[18]), tonumber(ARGV[19]), tonumber(ARGV[20])) end
if s.otpm > 0 then s.ol, lo = bound(s.ol, tonumber(ARGV[21]), tonumber(ARGV[22]), tonumber(ARGV[23])) end
local lowered = math.max(lr, lt, li, lo)
local op = ARGV[4]
if op == 'ok' then
  s.n = 0
  -- Additive increase after a multiplicative decrease (below): slow, so
  -- that a key whose calls reach the provider with more jitter than the
  -- pace absorbs settles at a rate that absorbs it.
  s.f = math.min(1, s.f + 0.01)
elseif op == 'cool' then
  -- The provider says the key is empty now, whatever our model thought.
  if s.rl > 0 then s.rl = 0; lowered = 1 end
  local d = 0
  -- Only a lease granted after the last escalation is new evidence: the
  -- other calls in flight when the key was first cooled would otherwise
  -- each double the cooldown for one and the same overload.
  if tonumber(ARGV[5]) >= s.cs then
    s.n = s.n + 1
    s.cs = now
    -- A paced key that still gets 429s meters tighter than configured:
    -- pace it 10% slower (at most down to half), until successes bring it
    -- back.
    s.f = math.max(0.5, s.f * 0.9)
    d = tonumber(ARGV[6]) * 2 ^ s.n
    if d > tonumber(ARGV[7]) then d = tonumber(ARGV[7]) end
  end
  local ra = tonumber(ARGV[8])
  if ra > d then d = ra end
  if now + d > s.cu then s.cu = now + d end
elseif op == 'wait' then
  local d = tonumber(ARGV[8])
  if d <= 0 then d = tonumber(ARGV[6]) end
  if now + d > s.cu then s.cu = now + d end
elseif op == 'off' then
  redis.call('HSET', KEYS[1], 'off', ARGV[9], 'off_at', fmt17(now))
end
save(KEYS[1], s, now)
return {removed, s.n, s.cu, now, lowered, 1}
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
// Reply: {now, row, ...}; a row is {} for an unregistered key, else
// {rpm, tpm, mif, requests level, tokens level, requests capacity,
// tokens capacity, effective rpm, effective tpm, n, cooling until, off (or
// empty), live leases, itpm, otpm, input level, output level, input
// capacity, output capacity} with numbers as strings (the last four 0 for
// a key without that limit).
const snapshotLua = luaCommon + `
local now = nowus()
local out = {now}
for i = 1, #KEYS / 2 do
  local s = load(KEYS[2 * i - 1], now)
  if not s then
    out[#out + 1] = {}
  else
    local live = redis.call('ZCOUNT', KEYS[2 * i], '(' .. fmt17(now), '+inf')
    out[#out + 1] = {fmt17(s.rpm), fmt17(s.tpm), fmt17(s.mif), fmt17(s.rl), fmt17(s.tl), fmt17(s.capR),
      fmt17(s.capT), fmt17(s.er), fmt17(s.et), fmt17(s.n), fmt17(s.cu), s.off or '', fmt17(live),
      fmt17(s.itpm), fmt17(s.otpm), fmt17(s.il or 0), fmt17(s.ol or 0), fmt17(s.capI or 0), fmt17(s.capO or 0)}
  end
end
return out
`

// scripts holds the pool's Lua scripts; each Pool owns its own set so the
// package keeps no mutable globals (redis.Script caches its SHA).
type scripts struct {
	register, acquire, settle, toggle, snapshot, leave, line *redis.Script
}

func newScripts() *scripts {
	return &scripts{
		register: redis.NewScript(registerLua),
		acquire:  redis.NewScript(acquireLua),
		settle:   redis.NewScript(settleLua),
		toggle:   redis.NewScript(switchLua),
		snapshot: redis.NewScript(snapshotLua),
		leave:    redis.NewScript(leaveLua),
		line:     redis.NewScript(lineLua),
	}
}
