package breaker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// AllName is the breaker the worker trips when every provider is exhausted.
const AllName = "all"

// Defaults for Config fields left zero. The numbers come from the design
// document: open after 3 consecutive failures, stay open 60 s, let 1 probe
// through, close after 2 successes.
const (
	FailureThresholdDefault = 3
	OpenTimeoutDefault      = 60 * time.Second
	HalfOpenProbesDefault   = 1
	SuccessThresholdDefault = 2
	ProbeTimeoutDefault     = 2 * time.Minute
	PrefixDefault           = "bulwark:{breaker}:"
	RedisTimeoutDefault     = 2 * time.Second
)

// maxReasonLen bounds a caller-supplied reason stored in Redis.
const maxReasonLen = 256

// Config configures a Set. Zero fields take the documented default; negative
// values are rejected by New.
type Config struct {
	// FailureThreshold is how many consecutive Failure outcomes open a closed
	// breaker. A Success resets the count; an Ignore leaves it. Default 3.
	FailureThreshold int
	// OpenTimeout is how long a breaker stays open before it lets probes
	// through (half-open). Millisecond resolution. Default 60 s.
	OpenTimeout time.Duration
	// HalfOpenProbes is how many probe permits may be held at once across
	// all processes while half-open. Default 1.
	HalfOpenProbes int
	// SuccessThreshold is how many successful probes close a half-open
	// breaker. With HalfOpenProbes 1 they run one after another. Default 2.
	SuccessThreshold int
	// ProbeTimeout is the lease of a probe permit: a probe not reported
	// within it is void and its slot goes to the next caller, so a worker
	// dying mid-probe cannot wedge the breaker. Must exceed the longest
	// provider call, or slow probes will never count. Default 2 min.
	ProbeTimeout time.Duration
	// Prefix starts every Redis key, so tests and tenants can share a
	// server. Default "bulwark:{breaker}:".
	Prefix string
	// RedisTimeout bounds each Redis round trip. Default 2 s.
	RedisTimeout time.Duration
	// OnTransition, if set, is called after each transition that a call
	// through this Set caused (including the lazy open→half_open one done
	// by Allow). It runs synchronously on the caller's goroutine, so it must
	// not block; it is never called for transitions other processes caused.
	// Use Status and List, not this hook, as the source of truth.
	OnTransition func(name string, from, to State, reason string)
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.FailureThreshold == 0 {
		c.FailureThreshold = FailureThresholdDefault
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = OpenTimeoutDefault
	}
	if c.HalfOpenProbes == 0 {
		c.HalfOpenProbes = HalfOpenProbesDefault
	}
	if c.SuccessThreshold == 0 {
		c.SuccessThreshold = SuccessThresholdDefault
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = ProbeTimeoutDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = RedisTimeoutDefault
	}
	return c
}

// Validate reports the first field of c (defaults applied) out of range.
func (c Config) Validate() error {
	switch {
	case c.FailureThreshold < 1:
		return fmt.Errorf("breaker: Config.FailureThreshold must be at least 1, got %d", c.FailureThreshold)
	case c.OpenTimeout < time.Millisecond:
		return fmt.Errorf("breaker: Config.OpenTimeout must be at least 1ms, got %s", c.OpenTimeout)
	case c.HalfOpenProbes < 1:
		return fmt.Errorf("breaker: Config.HalfOpenProbes must be at least 1, got %d", c.HalfOpenProbes)
	case c.SuccessThreshold < 1:
		return fmt.Errorf("breaker: Config.SuccessThreshold must be at least 1, got %d", c.SuccessThreshold)
	case c.ProbeTimeout < time.Millisecond:
		return fmt.Errorf("breaker: Config.ProbeTimeout must be at least 1ms, got %s", c.ProbeTimeout)
	case c.RedisTimeout <= 0:
		return fmt.Errorf("breaker: Config.RedisTimeout must be positive, got %s", c.RedisTimeout)
	}
	return nil
}

// State is a breaker's state.
type State string

// The three states. See the package doc for the transitions.
const (
	StateClosed   State = "closed"
	StateOpen     State = "open"
	StateHalfOpen State = "half_open"
)

func parseState(s string) (State, error) {
	switch st := State(s); st {
	case StateClosed, StateOpen, StateHalfOpen:
		return st, nil
	}
	return "", fmt.Errorf("unknown breaker state %q", s)
}

// Outcome is what a permitted call reports through Permit.Done.
type Outcome int

const (
	// Success: the route answered. Resets the failure count when closed;
	// counts towards SuccessThreshold when it is a probe.
	Success Outcome = iota + 1
	// Failure: the route failed in a way the breaker guards against (e.g. a
	// rate limit). Counts towards FailureThreshold when closed; re-opens the
	// breaker when it is a probe.
	Failure
	// Ignore: the call says nothing about the route (the caller's fault,
	// cancelled, a key-specific problem). Counts neither way, but gives a
	// probe's slot back at once.
	Ignore
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Ignore:
		return "ignore"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ErrOpen matches (errors.Is) every *OpenError.
var ErrOpen = errors.New("breaker: open")

// ErrInvalidName is wrapped by the error of a call given a name no breaker
// can have (empty, or over 200 bytes).
var ErrInvalidName = errors.New("invalid breaker name")

// OpenError is returned by Allow when the breaker does not admit the call:
// it is open, or half-open with every probe slot taken.
type OpenError struct {
	// Name is the breaker's name.
	Name string
	// State is StateOpen or StateHalfOpen.
	State State
	// RetryAfter is, when open, the time until the breaker turns half-open;
	// when half-open, the time until the earliest probe lease expires: the
	// latest moment a slot frees (the probe usually reports much sooner, so
	// callers re-queueing work may want to clamp it). At least 1 ms.
	RetryAfter time.Duration
}

func (e *OpenError) Error() string {
	return fmt.Sprintf("breaker %s is %s: retry in %s", e.Name, e.State, e.RetryAfter)
}

// Is makes errors.Is(err, ErrOpen) true.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// Status is a breaker's observable state. Times are Redis server times.
type Status struct {
	// Name is the breaker's name.
	Name string `json:"name"`
	// State is the effective state: an open breaker whose OpenTimeout has
	// passed is reported half_open even before anyone has called Allow.
	State State `json:"state"`
	// ConsecutiveFailures is the failure count while closed.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// HalfOpenSuccesses is the number of successful probes so far in the
	// current half-open period.
	HalfOpenSuccesses int `json:"half_open_successes"`
	// ProbesInFlight is the number of unexpired probe leases (half-open only).
	ProbesInFlight int `json:"probes_in_flight"`
	// OpenedAt is when the breaker last opened; kept after it closes, for
	// the record. Zero if it never opened.
	OpenedAt time.Time `json:"opened_at,omitzero"`
	// RetryAt is when an open breaker turns half-open; zero unless open.
	RetryAt time.Time `json:"retry_at,omitzero"`
	// DegradedSince is when the breaker last left closed; zero while closed.
	// "Breaker open > 3 min" alerts measure from here, so a breaker that
	// flaps open→half_open→open still counts as one long outage.
	DegradedSince time.Time `json:"degraded_since,omitzero"`
	// Reason is why the breaker last opened: the Trip reason, or the failure
	// that opened it. Kept after it closes.
	Reason string `json:"reason,omitempty"`
	// LastTransition is when the last transition happened; zero if none.
	LastTransition time.Time `json:"last_transition,omitzero"`
}

// Set is the collection of breakers sharing one Config and one Redis. It is
// safe for concurrent use, and any number of Sets in any number of processes
// may share the same breakers.
type Set struct {
	rdb    redis.UniversalClient
	cfg    Config
	logger *slog.Logger
	views  views // healthy breakers, while Watch runs (view.go)

	// clockOffset is a test hook: milliseconds added to Redis TIME by every
	// script. Always zero outside this package's tests.
	clockOffset atomic.Int64
}

// New returns a Set over rdb. A nil logger discards. The caller owns rdb and
// closes it.
func New(rdb redis.UniversalClient, cfg Config, logger *slog.Logger) (*Set, error) {
	if rdb == nil {
		return nil, errors.New("breaker: nil Redis client")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Set{rdb: rdb, cfg: cfg, logger: logger, views: views{byName: map[string]view{}}}, nil
}

// Allow asks whether a call through breaker name may proceed. On admission
// it returns a Permit whose outcome the caller must report with Done. When
// the breaker is open, or half-open with every probe slot taken, it returns
// an *OpenError (errors.Is(err, ErrOpen)). On a Redis error it returns that
// error; whether to fail open is the caller's choice.
func (s *Set) Allow(ctx context.Context, name string) (*Permit, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("breaker: allow: %w", err)
	}
	if v, ok := s.views.healthy(name); ok {
		return &Permit{set: s, name: name, gen: v.gen}, nil
	}
	token, err := newToken()
	if err != nil {
		return nil, fmt.Errorf("breaker: allow %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	v, err := allowScript.Run(ctx, s.rdb, breakerKeys(s.cfg.Prefix, name),
		s.clockOffset.Load(), name, token, s.cfg.HalfOpenProbes, s.cfg.ProbeTimeout.Milliseconds()).Result()
	if err != nil {
		return nil, fmt.Errorf("breaker: allow %s: %w", name, err)
	}
	r, err := newReply("allow "+name, v, 6)
	if err != nil {
		return nil, err
	}
	verdict, stateStr, gen, waitMS, from, failures := r.str(0), r.str(1), r.int(2), r.int(3), r.str(4), r.int(5)
	if r.err != nil {
		return nil, r.err
	}
	s.views.learn(name, gen, verdict == "allow" && failures == 0)
	state, err := parseState(stateStr)
	if err != nil {
		return nil, fmt.Errorf("breaker: allow %s: %w", name, err)
	}
	if from != "" {
		s.transitioned(name, State(from), StateHalfOpen, "open timeout elapsed")
	}
	switch verdict {
	case "allow":
		return &Permit{set: s, name: name, gen: gen}, nil
	case "probe":
		return &Permit{set: s, name: name, gen: gen, token: token}, nil
	case "reject":
		return nil, &OpenError{Name: name, State: state, RetryAfter: max(time.Duration(waitMS)*time.Millisecond, time.Millisecond)}
	}
	return nil, fmt.Errorf("breaker: allow %s: unknown verdict %q", name, verdict)
}

// Trip opens breaker name at once, with reason (e.g. "all providers
// exhausted") recorded in its Status. Tripping an open breaker changes
// nothing and does not extend its OpenTimeout; tripping a half-open one
// re-opens it and voids its probes.
func (s *Set) Trip(ctx context.Context, name, reason string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("breaker: trip: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	reason = truncate(reason)
	v, err := tripScript.Run(ctx, s.rdb, breakerKeys(s.cfg.Prefix, name),
		s.clockOffset.Load(), name, reason, s.cfg.OpenTimeout.Milliseconds()).Result()
	if err != nil {
		return fmt.Errorf("breaker: trip %s: %w", name, err)
	}
	return s.transitionReply("trip "+name, name, v, reason)
}

// Reset closes breaker name at once (admin) and voids its probes. Resetting
// a closed breaker clears its failure count; resetting a breaker that never
// had state does nothing.
func (s *Set) Reset(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("breaker: reset: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	v, err := resetScript.Run(ctx, s.rdb, breakerKeys(s.cfg.Prefix, name), s.clockOffset.Load(), name).Result()
	if err != nil {
		return fmt.Errorf("breaker: reset %s: %w", name, err)
	}
	return s.transitionReply("reset "+name, name, v, "reset")
}

// transitionReply parses a {from, to} reply and reports the transition.
func (s *Set) transitionReply(op, name string, v any, reason string) error {
	r, err := newReply(op, v, 2)
	if err != nil {
		return err
	}
	from, to := r.str(0), r.str(1)
	if r.err != nil {
		return r.err
	}
	if from != "" {
		s.transitioned(name, State(from), State(to), reason)
	}
	return nil
}

// Status returns breaker name's state. A breaker that never had state is
// closed with every count zero.
func (s *Set) Status(ctx context.Context, name string) (Status, error) {
	if err := checkName(name); err != nil {
		return Status{}, fmt.Errorf("breaker: status: %w", err)
	}
	sts, err := s.statuses(ctx, []string{name})
	if err != nil {
		return Status{}, err
	}
	return sts[0], nil
}

// List returns the status of every breaker that ever had state (under this
// Set's prefix), sorted by name.
func (s *Set) List(ctx context.Context) ([]Status, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	names, err := namesScript.Run(ctx, s.rdb, []string{namesKey(s.cfg.Prefix)}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("breaker: list: %w", err)
	}
	if len(names) == 0 {
		return []Status{}, nil
	}
	slices.Sort(names)
	return s.statuses(ctx, names)
}

func (s *Set) statuses(ctx context.Context, names []string) ([]Status, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	keys := make([]string, 0, 2*len(names))
	for _, n := range names {
		keys = append(keys, stateKey(s.cfg.Prefix, n), probesKey(s.cfg.Prefix, n))
	}
	v, err := statusScript.Run(ctx, s.rdb, keys, s.clockOffset.Load()).Result()
	if err != nil {
		return nil, fmt.Errorf("breaker: status: %w", err)
	}
	rows, err := newReply("status", v, len(names))
	if err != nil {
		return nil, err
	}
	out := make([]Status, len(names))
	for i, name := range names {
		op := "status " + name
		r, err := newReply(op, rows.vals[i], 10)
		if err != nil {
			return nil, err
		}
		exists, stateStr := r.int(0), r.str(1)
		st := Status{
			Name:                name,
			ConsecutiveFailures: int(r.int(2)),
			HalfOpenSuccesses:   int(r.int(3)),
			ProbesInFlight:      int(r.int(4)),
			OpenedAt:            msTime(r.int(5)),
			RetryAt:             msTime(r.int(6)),
			DegradedSince:       msTime(r.int(7)),
			Reason:              r.str(8),
			LastTransition:      msTime(r.int(9)),
		}
		if r.err != nil {
			return nil, r.err
		}
		if st.State, err = parseState(stateStr); err != nil {
			return nil, fmt.Errorf("breaker: %s: %w", op, err)
		}
		if exists == 0 {
			st = Status{Name: name, State: StateClosed}
		}
		out[i] = st
	}
	return out, nil
}

// transitioned logs a transition this process caused and calls the hook.
func (s *Set) transitioned(name string, from, to State, reason string) {
	level := slog.LevelInfo
	if to == StateOpen {
		level = slog.LevelWarn
	}
	s.logger.Log(context.Background(), level, "breaker transition",
		"breaker", name, "from", string(from), "to", string(to), "reason", reason)
	s.announce(name)
	if s.cfg.OnTransition != nil {
		s.cfg.OnTransition(name, from, to, reason)
	}
}

// Permit is one admitted call. Report its outcome exactly once with Done
// (or DoneReason); a closed-state permit that is never reported only loses
// its count, but an unreported probe holds its half-open slot until
// ProbeTimeout. Safe for concurrent use.
type Permit struct {
	set   *Set
	name  string
	gen   int64
	token string // probe lease token; "" for a closed-state permit

	mu   sync.Mutex
	done bool // guarded by mu
}

// Name returns the breaker's name.
func (p *Permit) Name() string { return p.name }

// Probe reports whether the permit is a half-open probe.
func (p *Permit) Probe() bool { return p.token != "" }

// Done reports the call's outcome. See DoneReason.
func (p *Permit) Done(ctx context.Context, o Outcome) error {
	return p.DoneReason(ctx, o, "")
}

// DoneReason reports the call's outcome with a short reason for a Failure
// (e.g. "rate_limited"), which is recorded as the breaker's Reason if this
// failure opens it. It does not inherit ctx's cancellation, so the outcome
// of a call cancelled by its own deadline is still recorded (and a probe's
// slot still freed); each attempt is bounded by Config.RedisTimeout. After
// one successful report later calls do nothing; after a Redis error the
// caller may report again. An outcome that arrives after the breaker has
// moved on (a newer generation, or a probe whose lease expired) counts
// neither way and is not an error.
func (p *Permit) DoneReason(ctx context.Context, o Outcome, reason string) error {
	if o != Success && o != Failure && o != Ignore {
		return fmt.Errorf("breaker: done %s: invalid outcome %s", p.name, o)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil
	}
	if p.token == "" && o == Ignore {
		p.done = true // nothing to record and no slot to free
		return nil
	}
	if v, ok := p.set.views.healthy(p.name); ok && p.token == "" && o == Success && v.gen == p.gen {
		p.done = true // the failure count is zero: a reset would change nothing
		return nil
	}
	s := p.set
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
	defer cancel()
	v, err := doneScript.Run(ctx, s.rdb, breakerKeys(s.cfg.Prefix, p.name),
		s.clockOffset.Load(), p.name, p.gen, p.token, o.String(), truncate(reason),
		s.cfg.FailureThreshold, s.cfg.SuccessThreshold, s.cfg.OpenTimeout.Milliseconds()).Result()
	if err != nil {
		return fmt.Errorf("breaker: done %s: %w", p.name, err)
	}
	r, err := newReply("done "+p.name, v, 4)
	if err != nil {
		return err
	}
	result, from, to, why := r.str(0), r.str(1), r.str(2), r.str(3)
	if r.err != nil {
		return r.err
	}
	p.done = true
	switch {
	case result == "counted" && o == Failure && from == "":
		s.announce(p.name) // a failure counted: others' successes must reset it
	case result == "counted" && o == Success && p.token == "":
		s.views.learn(p.name, p.gen, true) // closed, the count reset
	}
	if result == "stale" {
		s.logger.Debug("breaker outcome arrived after the breaker moved on",
			"breaker", p.name, "outcome", o.String(), "probe", p.Probe())
	}
	if from != "" {
		s.transitioned(p.name, State(from), State(to), why)
	}
	return nil
}

func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if len(name) > 200 {
		return fmt.Errorf("%w: longer than 200 bytes: %.40q", ErrInvalidName, name)
	}
	return nil
}

// truncate bounds a caller-supplied reason, dropping a rune cut in half.
func truncate(s string) string {
	if len(s) > maxReasonLen {
		return strings.ToValidUTF8(s[:maxReasonLen], "")
	}
	return s
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("probe token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
