package breaker

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Key builders: every Redis key this package touches comes from here.

// stateKey is the hash holding one breaker's state.
func stateKey(prefix, name string) string { return prefix + "state:" + name }

// probesKey is the sorted set of one breaker's probe leases (token → expiry ms).
func probesKey(prefix, name string) string { return prefix + "probes:" + name }

// namesKey is the set of every breaker name that ever had state.
func namesKey(prefix string) string { return prefix + "names" }

// breakerKeys returns KEYS[1..3] of the per-breaker scripts.
func breakerKeys(prefix, name string) []string {
	return []string{stateKey(prefix, name), probesKey(prefix, name), namesKey(prefix)}
}

// luaPrelude is shared by every script. Times are Unix milliseconds read from
// Redis TIME plus ARGV[1], a clock offset that is zero outside tests.
//
// State hash fields (all optional; a missing hash is a closed breaker of
// generation 0):
//
//	state       closed | open | half_open (as stored; see effective)
//	gen         generation, bumped by every transition
//	failures    consecutive failures while closed
//	successes   successful probes in the current half-open period
//	opened_at   when the breaker last opened
//	retry_at    when an open breaker turns half-open
//	since       when the breaker last left closed; 0 while closed
//	reason      why the breaker last opened
//	changed_at  when the last transition happened
const luaPrelude = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
end

local function load(key)
  local v = redis.call('HMGET', key, 'state', 'gen', 'failures', 'successes',
    'opened_at', 'retry_at', 'since', 'reason', 'changed_at')
  return {
    state = v[1] or 'closed',
    gen = tonumber(v[2]) or 0,
    failures = tonumber(v[3]) or 0,
    successes = tonumber(v[4]) or 0,
    opened_at = tonumber(v[5]) or 0,
    retry_at = tonumber(v[6]) or 0,
    since = tonumber(v[7]) or 0,
    reason = v[8] or '',
    changed_at = tonumber(v[9]) or 0,
  }
end

-- effective is the state as callers see it: an open breaker whose
-- OpenTimeout has passed is half-open even before anyone wrote that down.
local function effective(b, now)
  if b.state == 'open' and now >= b.retry_at then return 'half_open' end
  return b.state
end

local function to_open(hkey, zkey, b, now, open_ms, reason)
  local since = b.since
  if b.state == 'closed' then since = now end
  b.gen = b.gen + 1
  redis.call('HSET', hkey, 'state', 'open', 'gen', b.gen, 'failures', 0, 'successes', 0,
    'opened_at', now, 'retry_at', now + open_ms, 'since', since, 'reason', reason, 'changed_at', now)
  redis.call('DEL', zkey)
end

local function to_closed(hkey, zkey, b, now)
  b.gen = b.gen + 1
  redis.call('HSET', hkey, 'state', 'closed', 'gen', b.gen, 'failures', 0, 'successes', 0,
    'since', 0, 'changed_at', now)
  redis.call('DEL', zkey)
end

-- to_half_open dates the transition at retry_at, the moment it logically
-- happened, so Status reads the same before and after the lazy write.
local function to_half_open(hkey, zkey, b)
  b.gen = b.gen + 1
  redis.call('HSET', hkey, 'state', 'half_open', 'gen', b.gen, 'successes', 0,
    'changed_at', b.retry_at)
  redis.call('DEL', zkey)
end
`

// allowScript admits or rejects one call.
//
// KEYS[1] state hash, KEYS[2] probe lease zset, KEYS[3] names set.
// ARGV[1] clock offset ms, ARGV[2] breaker name, ARGV[3] probe lease token,
// ARGV[4] HalfOpenProbes, ARGV[5] ProbeTimeout ms.
//
// Reply: {verdict, state, gen, wait_ms, from, failures}
//
//	verdict  "allow" (closed), "probe" (half-open; the token now holds a
//	         lease), "reject"
//	state    the breaker's state after this call
//	gen      generation the permit belongs to
//	wait_ms  on reject: until the breaker turns half-open (open), or until
//	         the earliest probe lease expires (half_open); else 0
//	from     "open" when this call moved the breaker open→half_open, else ""
//	failures consecutive failures counted while closed (0 otherwise)
var allowScript = redis.NewScript(luaPrelude + `
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', 0)
  redis.call('SADD', KEYS[3], ARGV[2])
end
local b = load(KEYS[1])
if b.state == 'closed' then
  return {'allow', 'closed', b.gen, 0, '', b.failures}
end
local from = ''
if b.state == 'open' then
  if now < b.retry_at then
    return {'reject', 'open', b.gen, b.retry_at - now, '', 0}
  end
  to_half_open(KEYS[1], KEYS[2], b)
  from = 'open'
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {'reject', 'half_open', b.gen, tonumber(first[2]) - now, from, 0}
end
local ttl = tonumber(ARGV[5])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[3])
-- The zset only needs to outlive its newest lease.
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {'probe', 'half_open', b.gen, 0, from, 0}
`)

// doneScript records the outcome of a permitted call.
//
// KEYS[1] state hash, KEYS[2] probe lease zset, KEYS[3] names set.
// ARGV[1] clock offset ms, ARGV[2] breaker name, ARGV[3] permit generation,
// ARGV[4] probe lease token ("" for a closed-state permit),
// ARGV[5] outcome "success" | "failure" | "ignore", ARGV[6] failure reason
// (may be ""), ARGV[7] FailureThreshold, ARGV[8] SuccessThreshold,
// ARGV[9] OpenTimeout ms.
//
// Reply: {result, from, to, reason}
//
//	result  "counted", or "stale" when the permit's generation has passed or
//	        its probe lease expired (the outcome then counts neither way)
//	from,to the transition this outcome caused, both "" when none
//	reason  why the transition happened
var doneScript = redis.NewScript(luaPrelude + `
local now = now_ms()
local b = load(KEYS[1])
local token, outcome, why = ARGV[4], ARGV[5], ARGV[6]
if b.gen ~= tonumber(ARGV[3]) then
  return {'stale', '', '', ''}
end
if token == '' then
  if b.state ~= 'closed' then return {'stale', '', '', ''} end
  if outcome == 'success' then
    if b.failures > 0 then redis.call('HSET', KEYS[1], 'failures', 0) end
  elseif outcome == 'failure' then
    local f = b.failures + 1
    redis.call('SADD', KEYS[3], ARGV[2])
    if f >= tonumber(ARGV[7]) then
      local reason = string.format('%d consecutive failures', f)
      if why ~= '' then reason = reason .. ', last: ' .. why end
      to_open(KEYS[1], KEYS[2], b, now, tonumber(ARGV[9]), reason)
      return {'counted', 'closed', 'open', reason}
    end
    redis.call('HSET', KEYS[1], 'failures', f)
  end
  return {'counted', '', '', ''}
end
if b.state ~= 'half_open' then return {'stale', '', '', ''} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZREM', KEYS[2], token) == 0 then
  return {'stale', '', '', ''}
end
if outcome == 'failure' then
  local reason = 'probe failed'
  if why ~= '' then reason = reason .. ': ' .. why end
  to_open(KEYS[1], KEYS[2], b, now, tonumber(ARGV[9]), reason)
  return {'counted', 'half_open', 'open', reason}
elseif outcome == 'success' then
  local s = b.successes + 1
  if s >= tonumber(ARGV[8]) then
    to_closed(KEYS[1], KEYS[2], b, now)
    return {'counted', 'half_open', 'closed', string.format('%d successful probes', s)}
  end
  redis.call('HSET', KEYS[1], 'successes', s)
end
return {'counted', '', '', ''}
`)

// tripScript opens a breaker at once. Tripping a breaker that is already
// open changes nothing: in particular it does not push RetryAt back, so
// workers that all observe the same exhaustion cannot keep it open forever
// between probes.
//
// KEYS[1] state hash, KEYS[2] probe lease zset, KEYS[3] names set.
// ARGV[1] clock offset ms, ARGV[2] breaker name, ARGV[3] reason,
// ARGV[4] OpenTimeout ms.
//
// Reply: {from, to}: the transition, both "" when it was already open.
var tripScript = redis.NewScript(luaPrelude + `
local now = now_ms()
local b = load(KEYS[1])
local from = effective(b, now)
if from == 'open' then return {'', ''} end
to_open(KEYS[1], KEYS[2], b, now, tonumber(ARGV[4]), ARGV[3])
redis.call('SADD', KEYS[3], ARGV[2])
return {from, 'open'}
`)

// resetScript closes a breaker at once (admin). On a closed breaker it only
// clears the failure count; on a breaker that never had state it does nothing.
//
// KEYS[1] state hash, KEYS[2] probe lease zset, KEYS[3] names set.
// ARGV[1] clock offset ms, ARGV[2] breaker name.
//
// Reply: {from, to}: the transition, both "" when it was already closed.
var resetScript = redis.NewScript(luaPrelude + `
if redis.call('EXISTS', KEYS[1]) == 0 then return {'', ''} end
local now = now_ms()
local b = load(KEYS[1])
if b.state == 'closed' then
  if b.failures > 0 then redis.call('HSET', KEYS[1], 'failures', 0) end
  return {'', ''}
end
local from = effective(b, now)
to_closed(KEYS[1], KEYS[2], b, now)
return {from, 'closed'}
`)

// statusScript reads breakers without changing them.
//
// KEYS: pairs (state hash, probe lease zset), one pair per breaker.
// ARGV[1] clock offset ms.
//
// Reply: one array per pair: {exists, state, failures, successes, probes,
// opened_at, retry_at, since, reason, changed_at}, with state the effective
// state, probes the number of unexpired probe leases, and retry_at 0 unless
// the breaker is open.
var statusScript = redis.NewScript(luaPrelude + `
local now = now_ms()
local out = {}
for i = 1, #KEYS, 2 do
  local exists = redis.call('EXISTS', KEYS[i])
  local b = load(KEYS[i])
  local st = effective(b, now)
  local successes, changed, retry_at, probes = b.successes, b.changed_at, b.retry_at, 0
  if st == 'half_open' then
    if b.state == 'open' then
      successes, changed = 0, b.retry_at
    else
      probes = redis.call('ZCOUNT', KEYS[i + 1], '(' .. string.format('%d', now), '+inf')
    end
  end
  if st ~= 'open' then retry_at = 0 end
  out[#out + 1] = {exists, st, b.failures, successes, probes, b.opened_at, retry_at,
    b.since, b.reason, changed}
end
return out
`)

// namesScript lists every breaker that ever had state.
//
// KEYS[1] names set. No ARGV. Reply: array of names.
var namesScript = redis.NewScript(`return redis.call('SMEMBERS', KEYS[1])`)

// reply is a script reply array with typed accessors; the first malformed
// element is remembered in err so a parse reads straight through.
type reply struct {
	op   string
	vals []any
	err  error
}

func newReply(op string, v any, n int) (*reply, error) {
	vals, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("breaker: %s: script reply is %T, want array", op, v)
	}
	if len(vals) != n {
		return nil, fmt.Errorf("breaker: %s: script reply has %d elements, want %d", op, len(vals), n)
	}
	return &reply{op: op, vals: vals}, nil
}

func (r *reply) str(i int) string {
	s, ok := r.vals[i].(string)
	if !ok && r.err == nil {
		r.err = fmt.Errorf("breaker: %s: script reply element %d is %T, want string", r.op, i, r.vals[i])
	}
	return s
}

func (r *reply) int(i int) int64 {
	n, ok := r.vals[i].(int64)
	if !ok && r.err == nil {
		r.err = fmt.Errorf("breaker: %s: script reply element %d is %T, want integer", r.op, i, r.vals[i])
	}
	return n
}
