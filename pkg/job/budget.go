package job

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A tenant's Redis budget. Everything the store keeps for a request is
// charged to its tenant while Redis holds it: the record (the request as
// stored, its state, why it ended, the prompt's embedding) until the record
// expires, and its event stream until the stream does. The charges live
// next to the records, in the store's hash slot, so that a create checks
// the budget and a change charges what it writes in the same script,
// without a round trip of their own:
//
//	p bytes-of:{tenant}   hash: charge ref → bytes; field "=" the total
//	p expiry-of:{tenant}  sorted set: charge ref → when it expires (Unix ms)
//
// A charge ref is the request id (its record) or id + ":ev" (its stream).
// Expired charges are released by the tenant's next create, a bounded
// batch at a time (budgetLua's release): no timer, no scan of other
// tenants. What is counted is the bytes written, a quarter more (the
// allocator rounds a large value up to its size class, up to 25 % with
// jemalloc's four classes per doubling), plus a fixed overhead per key and
// per event (RecordOverhead, StreamOverhead, EventOverhead), measured
// against Redis's MEMORY USAGE (TestBudgetCountsWhatRedisHolds): a
// tenant's total is an upper bound of what its requests hold, at most
// about a third above it.

// RecordOverhead is what Redis spends on a record beyond the bytes of its
// values: the key, the hash and its fields' names.
const RecordOverhead = 512

// StreamOverhead is what an event stream costs before its first event:
// Redis allocates a stream's entries 4 KB at a time
// (stream-node-max-bytes).
const StreamOverhead = 4608

// EventOverhead is what one stream entry costs beyond its JSON.
const EventOverhead = 40

// ErrOverBudget is returned by Create and CreateEnded when storing the
// request would take its tenant past its Redis budget.
var ErrOverBudget = errors.New("job: the tenant's Redis budget is spent")

// BudgetError says how far a tenant is into its budget and when its
// earliest charge is released.
type BudgetError struct {
	Used, Need, Budget int64
	// FreedAt is when the earliest of its charges expires (zero: none is
	// held, the request alone is larger than the budget).
	FreedAt time.Time
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%v: %d of %d bytes held, this request needs %d", ErrOverBudget, e.Used, e.Budget, e.Need)
}

func (e *BudgetError) Unwrap() error { return ErrOverBudget }

func (s *Store) bytesKey(tenant string) string  { return s.prefix + "bytes-of:" + tenant }
func (s *Store) expiryKey(tenant string) string { return s.prefix + "expiry-of:" + tenant }

// budgetLua defines the budget's Lua functions, shared by the scripts that
// write records. Times are Redis's own (TIME), so that every process
// agrees on what has expired.
const budgetLua = `
-- cost is what n bytes of values take in Redis (budget.go).
local function cost(n) return n + math.ceil(n / 4) end
local function nowms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- release frees up to n expired charges of a tenant; returns how many.
local function release(bk, ek, now, n)
  local gone = redis.call("ZRANGEBYSCORE", ek, "-inf", now, "LIMIT", 0, n)
  if #gone == 0 then return 0 end
  local freed = 0
  for _, s in ipairs(redis.call("HMGET", bk, unpack(gone))) do
    if s then freed = freed + tonumber(s) end
  end
  redis.call("HDEL", bk, unpack(gone))
  redis.call("ZREM", ek, unpack(gone))
  local left = redis.call("HINCRBY", bk, "=", -freed)
  if left < 0 then redis.call("HSET", bk, "=", 0) end
  return #gone
end
-- charge adds n bytes to a tenant's charge ref, held until expiry (Unix
-- ms; nil keeps the charge's own). keep (s) bounds the tenant's keys' life.
local function charge(bk, ek, ref, n, expiry, keep)
  if n ~= 0 then
    redis.call("HINCRBY", bk, ref, n)
    redis.call("HINCRBY", bk, "=", n)
  end
  if expiry then redis.call("ZADD", ek, expiry, ref) end
  if keep and redis.call("TTL", bk) < keep then
    redis.call("EXPIRE", bk, keep)
    redis.call("EXPIRE", ek, keep)
  end
end
-- expire moves an existing charge's release to expiry (Unix ms).
local function expire(ek, ref, expiry)
  redis.call("ZADD", ek, "XX", expiry, ref)
end
`

// overBudget decodes createScript's "used,need,freed at" reply.
func overBudget(reply string, budget int64) error {
	e := &BudgetError{Budget: budget}
	f := strings.Split(reply, ",")
	if len(f) != 3 {
		return fmt.Errorf("job: unexpected budget reply %q: %w", reply, ErrOverBudget)
	}
	e.Used, _ = strconv.ParseInt(f[0], 10, 64)
	e.Need, _ = strconv.ParseInt(f[1], 10, 64)
	if ms, _ := strconv.ParseFloat(f[2], 64); ms > 0 {
		e.FreedAt = time.UnixMilli(int64(ms))
	}
	return e
}
