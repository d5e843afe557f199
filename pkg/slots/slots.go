// Package slots bounds the provider calls in flight across every worker
// process, with slots reserved per priority.
//
// # The rule
//
// There are Total slots. Priority p (1 = critical … 4 = low) may take a free
// slot only while, after taking it, enough free slots remain for the unused
// reserves of every more urgent priority:
//
//	free − Σ_{q more urgent than p} max(0, reserve_q − used_q) ≥ 1
//
// With the defaults (20 slots; reserves critical 5, high 10, normal 4, low 1)
// and nothing running, low may use 1 slot, normal 5, high 15 and critical
// all 20; a flood of low never takes the slots critical, high or normal are
// owed, and critical never waits for a slot while its reserve is unused.
// Reserves above Total are rejected by configuration.
//
// # Leases
//
// A slot is a lease in Redis (sorted set scored by expiry, Redis TIME) that
// expires after LeaseTTL, so a worker killed with SIGKILL frees its slots
// without anyone's help. Acquire is one Lua script: drop expired leases,
// count use per priority, apply the rule, take the slot.
package slots

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/priority"
)

// Defaults.
const (
	TotalDefault    = 20
	LeaseTTLDefault = 3 * time.Minute
	PrefixDefault   = "bulwark:slots:"
)

// ErrNoSlot is returned by TryAcquire when the rule forbids a slot now.
var ErrNoSlot = errors.New("slots: no slot free for this priority")

// Config configures the limiter.
type Config struct {
	// Total provider calls in flight across all workers. Default 20.
	Total int
	// Reserved slots per priority; missing priorities reserve 0.
	Reserved map[priority.Priority]int
	// LeaseTTL after which a holder's slot is freed. Default 3m; keep it
	// above the provider call timeout.
	LeaseTTL time.Duration
	// Prefix of the Redis keys. Default "bulwark:slots:".
	Prefix string
}

func (c *Config) setDefaults() {
	if c.Total == 0 {
		c.Total = TotalDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
}

func (c *Config) validate() error {
	sum := 0
	for p, n := range c.Reserved {
		if !p.Valid() {
			return fmt.Errorf("slots: Reserved: unknown priority %d", p)
		}
		if n < 0 {
			return fmt.Errorf("slots: Reserved[%s] must be >= 0", p)
		}
		sum += n
	}
	if c.Total <= 0 {
		return fmt.Errorf("slots: Total must be > 0")
	}
	if sum > c.Total {
		return fmt.Errorf("slots: Reserved sums to %d, more than Total %d", sum, c.Total)
	}
	return nil
}

// Limiter hands out slots. It is safe for concurrent use.
type Limiter struct {
	rdb redis.Scripter
	cfg Config
}

// New returns a limiter.
func New(rdb redis.Scripter, cfg Config) (*Limiter, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Limiter{rdb: rdb, cfg: cfg}, nil
}

func (l *Limiter) leasesKey() string { return l.cfg.Prefix + "leases" }
func (l *Limiter) ownersKey() string { return l.cfg.Prefix + "owners" }

// Slot is a held slot. Release it exactly once.
type Slot struct {
	l        *Limiter
	ID       string
	Priority priority.Priority
}

// acquireScript applies the reservation rule.
//
// KEYS[1] leases zset (member lease id, score expiry ms), KEYS[2] owners hash (lease id → priority)
// ARGV[1] total, ARGV[2..5] reserves of priorities 1..4, ARGV[6] priority,
// ARGV[7] lease id, ARGV[8] ttl ms
// Reply: 1 taken, 0 refused.
var acquireScript = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now)
for _, id in ipairs(expired) do redis.call("HDEL", KEYS[2], id) end
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local used = {0, 0, 0, 0}
local owners = redis.call("HVALS", KEYS[2])
for _, p in ipairs(owners) do
  local i = tonumber(p)
  used[i] = used[i] + 1
end
local total = tonumber(ARGV[1])
local free = total - #owners
local p = tonumber(ARGV[6])
local owed = 0
for q = 1, p - 1 do
  local r = tonumber(ARGV[1 + q]) - used[q]
  if r > 0 then owed = owed + r end
end
if free - owed < 1 then return 0 end
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[8]), ARGV[7])
redis.call("HSET", KEYS[2], ARGV[7], p)
return 1
`)

// TryAcquire takes a slot for p or returns ErrNoSlot.
func (l *Limiter) TryAcquire(ctx context.Context, p priority.Priority) (*Slot, error) {
	if !p.Valid() {
		return nil, fmt.Errorf("slots: invalid priority %d", p)
	}
	id := newID()
	args := []any{l.cfg.Total}
	for _, q := range priority.All {
		args = append(args, l.cfg.Reserved[q])
	}
	args = append(args, int(p), id, l.cfg.LeaseTTL.Milliseconds())
	n, err := acquireScript.Run(ctx, l.rdb, []string{l.leasesKey(), l.ownersKey()}, args...).Int64()
	if err != nil {
		return nil, fmt.Errorf("slots: acquire: %w", err)
	}
	if n != 1 {
		return nil, ErrNoSlot
	}
	return &Slot{l: l, ID: id, Priority: p}, nil
}

// Acquire waits for a slot for p until ctx ends, polling with jittered
// backoff (5 ms doubling to 100 ms): a slot frees when some provider call
// ends, and the poll bound keeps the wait close to that moment without a
// notification channel per waiter.
func (l *Limiter) Acquire(ctx context.Context, p priority.Priority) (*Slot, error) {
	backoff := 5 * time.Millisecond
	for {
		s, err := l.TryAcquire(ctx, p)
		if !errors.Is(err, ErrNoSlot) {
			return s, err
		}
		d := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("slots: wait for a %s slot: %w", p, ctx.Err())
		case <-t.C:
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// releaseScript frees a lease. KEYS[1] leases, KEYS[2] owners; ARGV[1] id.
var releaseScript = redis.NewScript(`
redis.call("ZREM", KEYS[1], ARGV[1])
return redis.call("HDEL", KEYS[2], ARGV[1])
`)

// Release frees the slot. A second call is a no-op.
func (s *Slot) Release(ctx context.Context) error {
	if s == nil {
		return nil
	}
	if err := releaseScript.Run(ctx, s.l.rdb, []string{s.l.leasesKey(), s.l.ownersKey()}, s.ID).Err(); err != nil {
		return fmt.Errorf("slots: release: %w", err)
	}
	return nil
}

// inUseScript counts live leases per priority.
// KEYS[1] leases, KEYS[2] owners. Reply: {used1, used2, used3, used4}.
var inUseScript = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local used = {0, 0, 0, 0}
local live = redis.call("ZRANGEBYSCORE", KEYS[1], "(" .. now, "+inf")
for _, id in ipairs(live) do
  local p = redis.call("HGET", KEYS[2], id)
  if p then used[tonumber(p)] = used[tonumber(p)] + 1 end
end
return used
`)

// InUse returns the live slots per priority (metrics, admin).
func (l *Limiter) InUse(ctx context.Context) (map[priority.Priority]int, error) {
	vals, err := inUseScript.Run(ctx, l.rdb, []string{l.leasesKey(), l.ownersKey()}).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("slots: in use: %w", err)
	}
	if len(vals) != 4 {
		return nil, fmt.Errorf("slots: in use: unexpected reply %v", vals)
	}
	out := make(map[priority.Priority]int, 4)
	for i, v := range vals {
		out[priority.Priority(i+1)] = int(v)
	}
	return out, nil
}

// Total returns the global limit.
func (l *Limiter) Total() int { return l.cfg.Total }

func newID() string {
	b := make([]byte, 8)
	_, _ = crand.Read(b)
	return strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + hex.EncodeToString(b)
}
