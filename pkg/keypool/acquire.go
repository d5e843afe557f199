package keypool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// AcquireOption is a per-call knob of Acquire.
type AcquireOption func(*acquireOpts)

type acquireOpts struct {
	ahead time.Duration
	line  *Waiter
	split *llm.Estimate
}

// Waiter is who waits in a route's line (see doc.go, "The line").
type Waiter struct {
	// ID is the request id; asks with the same ID share one place.
	ID string
	// Priority comes first: a more urgent waiter goes before every less
	// urgent one.
	Priority priority.Priority
	// Since is the request's acceptance time: within a priority the older
	// waiter goes first (ties: the smaller ID). Must not be zero.
	Since time.Time
}

// place is the waiter's score in the line: priority, then acceptance time
// in ms. 4·10^13 + 2·10^12 stays well within a double's exact integers.
func (w Waiter) place() string {
	return strconv.FormatInt(int64(w.Priority)*1e13+w.Since.UnixMilli(), 10)
}

// InLine makes Acquire wait in route's line as w: the grant goes to the
// waiters most urgent first, then oldest first, whoever asks first. A
// refused waiter keeps its place for Config.LineTTL; ask again within it
// (the ExhaustedError's RetryAfter says when its turn is likely), or Leave.
// A granted waiter leaves the line.
func InLine(w Waiter) AcquireOption {
	return func(o *acquireOpts) { o.line = &w }
}

// Within lets Acquire reserve a key whose buckets refill within d: the
// lease's NotBefore is then up to d ahead, and the caller waits until it
// before calling. Reservations are granted in the order they are asked
// for, so callers waiting on a busy route are served first come, first
// served at exactly the pace the keys allow, instead of polling. Cooling
// keys and keys at their in-flight cap are never reserved ahead.
func Within(d time.Duration) AcquireOption {
	return func(o *acquireOpts) { o.ahead = max(d, 0) }
}

// Split tells Acquire how its estTokens divide into the prompt's input
// tokens and the output reserved for the answer (max_tokens), which must
// sum to estTokens: a key with an ITPM or OTPM (Anthropic) charges each
// part to its own bucket, as Anthropic does at admission. Without Split
// such a key charges the whole estimate to each of them, the safe reading
// when the parts are unknown. Keys without ITPM and OTPM ignore it.
func Split(input, output int) AcquireOption {
	return func(o *acquireOpts) { o.split = &llm.Estimate{Input: input, Output: output} }
}

// Acquire reserves one request and estTokens tokens on the key of route
// with the most headroom, in one atomic Redis step, and returns the lease.
// estTokens should be the prompt's tokens plus max_tokens; Success settles
// it to the real usage. With Within, the lease may be for a moment ahead
// (Lease.NotBefore).
//
// Errors: an *ExhaustedError (errors.Is ErrExhausted) when no key has room
// now (or within the Within horizon), saying when one will;
// ErrUnknownRoute when route has no keys; ErrTooLarge when estTokens
// exceeds every key's TPM (or its input or output part the key's ITPM or
// OTPM); otherwise a Redis failure.
func (p *Pool) Acquire(ctx context.Context, route llm.Route, estTokens int, opts ...AcquireOption) (*Lease, error) {
	var o acquireOpts
	for _, opt := range opts {
		opt(&o)
	}
	idx, ok := p.routes[route]
	if !ok {
		return nil, fmt.Errorf("keypool: acquire %s: %w", route, ErrUnknownRoute)
	}
	if estTokens < 0 {
		return nil, fmt.Errorf("keypool: acquire %s: estTokens must be >= 0, got %d", route, estTokens)
	}
	in, out, err := o.parts(estTokens)
	if err != nil {
		return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
	}
	leaseID, err := newLeaseID()
	if err != nil {
		return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
	}
	ttl := p.cfg.LeaseTTL.Microseconds()
	// A CRITICAL waiter is not spaced (doc.go, "The line").
	who, place, unspaced := "", "0", "0"
	if w := o.line; w != nil {
		if w.ID == "" || w.Since.IsZero() || !w.Priority.Valid() {
			return nil, fmt.Errorf("keypool: acquire %s: invalid waiter %q (priority %d, since %s)", route, w.ID, w.Priority, w.Since)
		}
		who, place = w.ID, w.place()
		if w.Priority == priority.Critical {
			unspaced = "1"
		}
	}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
		// The rotation breaks ties in headroom differently on each call,
		// so keys with equal room share the load instead of the first one
		// in the file taking it all.
		rot := p.rotate(len(idx))
		res, err := p.sc.acquire.Run(rctx, p.rdb, p.routeKeys[route], estTokens, ttl, leaseID, o.ahead.Microseconds(),
			p.routePrefs[route], rot, who, place, p.cfg.LineTTL.Microseconds(), in, out, unspaced).Slice()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
		}
		status, err := replyInt(res, 0)
		if err != nil {
			return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
		}
		switch status {
		case 1: // {1, i, now, expiry, at}
			i, err1 := replyInt(res, 1)
			now, err2 := replyInt(res, 2)
			exp, err3 := replyInt(res, 3)
			at, err4 := replyInt(res, 4)
			if err := firstErr(err1, err2, err3, err4); err != nil {
				return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
			}
			if i < 1 || int(i) > len(idx) {
				return nil, fmt.Errorf("keypool: acquire %s: key index %d out of range", route, i)
			}
			k := p.cfg.Keys[idx[i-1]]
			return &Lease{
				ID:        leaseID,
				KeyID:     k.ID,
				Route:     route,
				Cred:      k.Cred,
				EstTokens: estTokens,
				EstInput:  in,
				EstOutput: out,
				GrantedAt: timeFromUS(now),
				NotBefore: timeFromUS(at),
				ExpiresAt: timeFromUS(exp),
				grantedUS: now,
			}, nil
		case 0: // {0, wait, reason, now}
			wait, err1 := replyInt(res, 1)
			reason, err2 := replyString(res, 2)
			if err := firstErr(err1, err2); err != nil {
				return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
			}
			d := time.Duration(wait) * time.Microsecond
			if wait < 0 { // every key disabled: nothing frees up by itself
				d = p.cfg.CooldownMax
			}
			return nil, &ExhaustedError{Route: route, RetryAfter: max(d, time.Microsecond), Reason: reason}
		case -1:
			return nil, fmt.Errorf("keypool: acquire %s (%d tokens): %w", route, estTokens, ErrTooLarge)
		case -2:
			// Redis lost the pool's state (flush, restart without AOF):
			// register again, once, and retry with full buckets.
			if attempt > 0 {
				return nil, fmt.Errorf("keypool: acquire %s: key state missing after re-registration", route)
			}
			p.logger.Warn("keypool: key state missing in Redis; registering the configured keys again", "route", route.String())
			if err := p.register(ctx); err != nil {
				return nil, fmt.Errorf("keypool: acquire %s: %w", route, err)
			}
		default:
			return nil, fmt.Errorf("keypool: acquire %s: unexpected status %d", route, status)
		}
	}
}

// parts returns what an acquire of est tokens charges to a key's input
// and output buckets: the Split, or the whole estimate to each.
func (o acquireOpts) parts(est int) (in, out int, err error) {
	if o.split == nil {
		return est, est, nil
	}
	s := *o.split
	if s.Input < 0 || s.Output < 0 || s.Total() != est {
		return 0, 0, fmt.Errorf("Split(%d, %d) must be >= 0 and sum to estTokens %d", s.Input, s.Output, est)
	}
	return s.Input, s.Output, nil
}

func newLeaseID() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("lease id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// replyInt returns element i of a script reply as an integer.
func replyInt(res []any, i int) (int64, error) {
	if i >= len(res) {
		return 0, fmt.Errorf("script reply has %d elements, want more than %d", len(res), i)
	}
	v, ok := res[i].(int64)
	if !ok {
		return 0, fmt.Errorf("script reply element %d is %T, want integer", i, res[i])
	}
	return v, nil
}

// replyString returns element i of a script reply as a string.
func replyString(res []any, i int) (string, error) {
	if i >= len(res) {
		return "", fmt.Errorf("script reply has %d elements, want more than %d", len(res), i)
	}
	v, ok := res[i].(string)
	if !ok {
		return "", fmt.Errorf("script reply element %d is %T, want string", i, res[i])
	}
	return v, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Leave takes waiter id out of route's line, for a waiter that stops
// asking (it goes to another route, or waits elsewhere): until then its
// place would hold back the waiters behind it for up to Config.LineTTL.
// Leaving when not in line is a no-op.
func (p *Pool) Leave(ctx context.Context, route llm.Route, id string) error {
	if _, ok := p.routes[route]; !ok {
		return fmt.Errorf("keypool: leave %s: %w", route, ErrUnknownRoute)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	defer cancel()
	keys := []string{lineKey(p.cfg.Prefix, route), lineExpiryKey(p.cfg.Prefix, route)}
	if err := p.sc.leave.Run(ctx, p.rdb, keys, id).Err(); err != nil {
		return fmt.Errorf("keypool: leave %s: %w", route, err)
	}
	return nil
}

// Line returns the live waiters of route's line, first first (admin,
// tests). It writes nothing.
func (p *Pool) Line(ctx context.Context, route llm.Route) ([]string, error) {
	if _, ok := p.routes[route]; !ok {
		return nil, fmt.Errorf("keypool: line of %s: %w", route, ErrUnknownRoute)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	defer cancel()
	keys := []string{lineKey(p.cfg.Prefix, route), lineExpiryKey(p.cfg.Prefix, route)}
	ids, err := p.sc.line.Run(ctx, p.rdb, keys).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("keypool: line of %s: %w", route, err)
	}
	return ids, nil
}
