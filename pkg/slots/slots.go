package slots

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/priority"
)

var (
	// ErrNoSlot is returned by TryAcquire when the rule refuses a slot now.
	// The waiter stays registered for Config.WaiterTTL.
	ErrNoSlot = errors.New("slots: no slot for this priority now")
	// ErrLost is returned by Slot.Renew when the lease has already expired
	// or been released: the call it guards no longer counts against Total.
	ErrLost = errors.New("slots: lease lost")
)

// Waiter identifies who asks for a slot; it decides the order among
// waiters of one priority (see "FIFO by Since" in the package doc).
type Waiter struct {
	// ID is the request id. Two asks with the same ID and priority share
	// one place in line.
	ID string
	// Since is when the request was created. Older waiters go first; ties
	// go to the smaller ID. Must not be zero.
	Since time.Time
}

func (w Waiter) check() error {
	if w.ID == "" {
		return errors.New("slots: Waiter.ID is empty")
	}
	if w.Since.IsZero() {
		return fmt.Errorf("slots: Waiter.Since of %q is zero", w.ID)
	}
	return nil
}

// Limiter hands out slots. All its state is in Redis, so any number of
// processes may build one over the same prefix and they act as one. It is
// safe for concurrent use.
type Limiter struct {
	rdb      redis.Scripter
	cfg      Config
	keys     []string // KEYS of acquireScript
	reserves []any    // ARGV[2..5] of acquireScript
}

// New returns a limiter; it touches no Redis key until used.
func New(rdb redis.Scripter, cfg Config) (*Limiter, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{rdb: rdb, cfg: cfg}
	l.keys = append([]string{leasesKey(cfg.Prefix), ownersKey(cfg.Prefix)}, waitKeys(cfg.Prefix)...)
	l.keys = append(l.keys, acquiredKey(cfg.Prefix), promotedKey(cfg.Prefix), promotedExpiryKey(cfg.Prefix))
	for _, p := range priority.All {
		l.reserves = append(l.reserves, cfg.Reserved[p])
	}
	return l, nil
}

// Total returns the global limit.
func (l *Limiter) Total() int { return l.cfg.Total }

// Slot is a held slot. Renew it while the call runs; Release it once.
// Its methods are safe for concurrent use.
type Slot struct {
	l *Limiter
	// ID is the lease id, unique per grant.
	ID string
	// Priority is the priority the slot was granted to.
	Priority priority.Priority
	// Granted is when the slot was granted, by Redis's clock: the moment
	// the request's turn came, whatever delays the process that asked
	// before it goes on.
	Granted time.Time
}

// TryAcquire makes one attempt: it registers w as a waiter for p and takes
// a slot if the rule allows, or returns ErrNoSlot. A refused w keeps its
// place in line for Config.WaiterTTL: call TryAcquire again within it, or
// Leave.
func (l *Limiter) TryAcquire(ctx context.Context, p priority.Priority, w Waiter) (*Slot, error) {
	if err := checkAsk(p, w); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("slots: acquire a %s slot: %w", p, err)
	}
	s, _, err := l.try(ctx, p, w)
	return s, err
}

// Acquire waits for a slot for p until it is granted or ctx ends, asking
// again with jittered backoff (5 ms doubling to 50 ms, longer for a
// waiter many grants from its turn: 10 ms per grant, at most 40% of
// WaiterTTL); each ask refreshes w's place in line. When ctx ends it removes w's registration (best
// effort: otherwise it lapses after Config.WaiterTTL) and returns an error
// wrapping ctx.Err().
func (l *Limiter) Acquire(ctx context.Context, p priority.Priority, w Waiter) (*Slot, error) {
	if err := checkAsk(p, w); err != nil {
		return nil, err
	}
	for backoff := pollMin; ; backoff = min(2*backoff, pollMax) {
		if ctx.Err() != nil {
			return nil, l.giveUp(ctx, p, w)
		}
		s, behind, err := l.try(ctx, p, w)
		if !errors.Is(err, ErrNoSlot) {
			return s, err
		}
		wait := max(backoff, l.deepPoll(behind))
		if sleep(ctx, wait/2+rand.N(wait/2+1)) != nil {
			return nil, l.giveUp(ctx, p, w)
		}
	}
}

// deepPoll is the poll interval of a waiter behind others more than
// grants away: pollStep per grant to go, at most 40% of WaiterTTL, so
// its place stays alive. Waiters near their turn poll every 5-50 ms; the
// hundreds of requests a full queue holds do not all poll that often.
func (l *Limiter) deepPoll(behind int) time.Duration {
	return min(time.Duration(behind)*pollStep, l.cfg.WaiterTTL*2/5)
}

// try runs one decision. The script runs detached from ctx's cancellation
// (bounded by RedisTimeout) so that a cancel arriving while the reply is
// on its way cannot lose a grant: that lease would hold a slot for
// LeaseTTL with nobody to release it.
// A refusal also says how many grants are still to go before w's turn.
func (l *Limiter) try(ctx context.Context, p priority.Priority, w Waiter) (*Slot, int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.RedisTimeout)
	defer cancel()
	lease := newID()
	args := append([]any{l.cfg.Total}, l.reserves...)
	args = append(args, int(p), w.ID, w.Since.UnixMilli(), lease,
		l.cfg.LeaseTTL.Milliseconds(), l.cfg.WaiterTTL.Milliseconds())
	n, err := acquireScript.Run(ctx, l.rdb, l.keys, args...).Int64()
	switch {
	case err != nil:
		return nil, 0, fmt.Errorf("slots: acquire a %s slot: %w", p, err)
	case n <= 0:
		return nil, max(1, int(-n)), ErrNoSlot
	}
	return &Slot{l: l, ID: lease, Priority: p, Granted: time.UnixMilli(n)}, 0, nil
}

// giveUp leaves the line after ctx ended. A failure to leave is dropped:
// the registration lapses after WaiterTTL anyway, and joining it would let
// a Redis timeout read as the caller's own deadline.
func (l *Limiter) giveUp(ctx context.Context, p priority.Priority, w Waiter) error {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.RedisTimeout)
	defer cancel()
	_ = l.Leave(lctx, p, w.ID)
	return fmt.Errorf("slots: wait for a %s slot: %w", p, ctx.Err())
}

// Leave removes waiter id's registration for p, for a TryAcquire caller
// that stops asking. Leaving when not registered is a no-op.
func (l *Limiter) Leave(ctx context.Context, p priority.Priority, id string) error {
	if !p.Valid() {
		return fmt.Errorf("slots: invalid priority %d", p)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	keys := []string{waitKey(l.cfg.Prefix, p), waitExpiryKey(l.cfg.Prefix, p)}
	if _, err := leaveScript.Run(ctx, l.rdb, keys, id).Int64(); err != nil {
		return fmt.Errorf("slots: leave the %s line: %w", p, err)
	}
	return nil
}

// Promote makes request id, waiting for a slot or about to, wait and take
// its slot as p when p is more urgent than what it asked for: others with
// priority p now wait on its answer (coalesced requests). The promotion
// lapses after ttl if the request never asks.
func (l *Limiter) Promote(ctx context.Context, id string, p priority.Priority, ttl time.Duration) error {
	if !p.Valid() || id == "" {
		return fmt.Errorf("slots: promote %q to priority %d: invalid", id, p)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	keys := []string{promotedKey(l.cfg.Prefix), promotedExpiryKey(l.cfg.Prefix)}
	if err := promoteScript.Run(ctx, l.rdb, keys, id, int(p), ttl.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("slots: promote %s to %s: %w", id, p, err)
	}
	return nil
}

// Renew pushes the lease's expiry to now + Config.LeaseTTL. It returns
// ErrLost when the lease has already expired or been released; the call it
// guards then runs uncounted, and the holder decides whether to finish it.
func (s *Slot) Renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.l.cfg.RedisTimeout)
	defer cancel()
	n, err := renewScript.Run(ctx, s.l.rdb, s.l.leaseKeys(), s.ID, s.l.cfg.LeaseTTL.Milliseconds()).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("slots: renew a %s slot: %w", s.Priority, err)
	case n == 0:
		return ErrLost
	case n != 1:
		return fmt.Errorf("slots: renew a %s slot: unexpected reply %d", s.Priority, n)
	}
	return nil
}

// Release frees the slot. Releasing again, or after the lease expired, is
// a no-op; a nil Slot is a no-op too.
func (s *Slot) Release(ctx context.Context) error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.l.cfg.RedisTimeout)
	defer cancel()
	if _, err := releaseScript.Run(ctx, s.l.rdb, s.l.leaseKeys(), s.ID).Int64(); err != nil {
		return fmt.Errorf("slots: release a %s slot: %w", s.Priority, err)
	}
	return nil
}

// InUse returns the live slots per priority (metrics, admin).
func (l *Limiter) InUse(ctx context.Context) (map[priority.Priority]int, error) {
	o, err := l.occupancy(ctx)
	if err != nil {
		return nil, err
	}
	return o.used, nil
}

// occupancy is one reading of the slots in use.
type occupancy struct {
	used map[priority.Priority]int
	ages []time.Duration // of the leases that have a grant time, any order
}

func (l *Limiter) occupancy(ctx context.Context) (occupancy, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	vals, err := inUseScript.Run(ctx, l.rdb, l.leaseKeys()).Int64Slice()
	if err != nil {
		return occupancy{}, fmt.Errorf("slots: in use: %w", err)
	}
	if len(vals) < len(priority.All) {
		return occupancy{}, fmt.Errorf("slots: in use: unexpected reply %v", vals)
	}
	o := occupancy{used: make(map[priority.Priority]int, len(priority.All))}
	for i, p := range priority.All {
		o.used[p] = int(vals[i])
	}
	for _, ms := range vals[len(priority.All):] {
		o.ages = append(o.ages, time.Duration(ms)*time.Millisecond)
	}
	return o, nil
}

// Waiting returns the live waiter ids of each priority in the order they
// will be granted (Since, then ID): a request's queue position among its
// own priority.
func (l *Limiter) Waiting(ctx context.Context) (map[priority.Priority][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	reply, err := waitingScript.Run(ctx, l.rdb, waitKeys(l.cfg.Prefix)).Slice()
	if err != nil {
		return nil, fmt.Errorf("slots: waiting: %w", err)
	}
	if len(reply) != len(priority.All) {
		return nil, fmt.Errorf("slots: waiting: unexpected reply %v", reply)
	}
	out := make(map[priority.Priority][]string, len(priority.All))
	for i, p := range priority.All {
		ids, err := stringSlice(reply[i])
		if err != nil {
			return nil, fmt.Errorf("slots: waiting: %s: %w", p, err)
		}
		out[p] = ids
	}
	return out, nil
}

func (l *Limiter) leaseKeys() []string {
	return []string{leasesKey(l.cfg.Prefix), ownersKey(l.cfg.Prefix), acquiredKey(l.cfg.Prefix)}
}

func checkAsk(p priority.Priority, w Waiter) error {
	if !p.Valid() {
		return fmt.Errorf("slots: invalid priority %d", p)
	}
	return w.check()
}

func stringSlice(v any) ([]string, error) {
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply %T", v)
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		s, ok := it.(string)
		if !ok {
			return nil, fmt.Errorf("unexpected id %T", it)
		}
		out = append(out, s)
	}
	return out, nil
}

// sleep waits d or until ctx ends, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newID returns a lease id unique across processes.
func newID() string {
	b := make([]byte, 8)
	_, _ = crand.Read(b)
	return strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + hex.EncodeToString(b)
}

// Occupancy is one reading of the slots, for queue estimates.
type Occupancy struct {
	// Free is how many slots each priority could take now if it asked:
	// the free slots, less CRITICAL's unused reserve for every other
	// priority (waiters already counted elsewhere are not subtracted).
	Free map[priority.Priority]int
	// Ages are how long each slot in use has been held (Redis time),
	// oldest first.
	Ages []time.Duration
}

// Occupancy reads the slots in one round trip. It is an estimate for queue
// ETAs; Acquire alone decides.
func (l *Limiter) Occupancy(ctx context.Context) (Occupancy, error) {
	o, err := l.occupancy(ctx)
	if err != nil {
		return Occupancy{}, err
	}
	slices.SortFunc(o.ages, func(a, b time.Duration) int { return cmp.Compare(b, a) })
	return Occupancy{Free: freeOf(l.cfg, o.used), Ages: o.ages}, nil
}

// freeOf is Free's arithmetic on one reading of the slots in use.
func freeOf(cfg Config, used map[priority.Priority]int) map[priority.Priority]int {
	free := cfg.Total
	for _, n := range used {
		free -= n
	}
	owed := max(0, cfg.Reserved[priority.Critical]-used[priority.Critical])
	out := make(map[priority.Priority]int, len(priority.All))
	for _, p := range priority.All {
		out[p] = max(0, free)
		if p != priority.Critical {
			out[p] = max(0, free-owed)
		}
	}
	return out
}
