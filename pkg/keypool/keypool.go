package keypool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/llm"
)

// Defaults for the zero fields of Config.
const (
	// PrefixDefault is the Redis key prefix of the production pool.
	PrefixDefault = "bulwark:{keypool}:"
	// LeaseTTLDefault bounds how long a killed worker's in-flight slot stays
	// taken. It must exceed the longest provider call.
	LeaseTTLDefault = 3 * time.Minute
	// CooldownBaseDefault and CooldownMaxDefault give the design's rule
	// min(2^consecutive_429s, 120) seconds.
	CooldownBaseDefault = time.Second
	CooldownMaxDefault  = 120 * time.Second
	// OpTimeoutDefault is the deadline of one Redis round trip.
	OpTimeoutDefault = 2 * time.Second
	// WindowDefault is the burst window: a key's buckets hold this share of
	// its per-minute limits, as providers enforce them ("60 RPM may be
	// enforced as 1 request per second").
	WindowDefault = time.Second
	// PaceDefault is the share of each limit the pool spends: 2% below the
	// provider's rate absorbs the jitter between our grant and the
	// provider's arrival clock, so a paced call never finds the provider's
	// one-second bucket a hair short.
	PaceDefault = 0.98
	// JitterDefault is the arrival jitter the pool absorbs without a 429:
	// how much later than the call before it a call may reach the provider,
	// relative to our grants (scheduling, a sleep's overshoot, the network).
	// See the package doc, "Why the pace margin".
	JitterDefault = 50 * time.Millisecond
	// NoJitter as Config.Jitter models the provider's buckets exactly: a
	// grant may empty a bucket (tests of the bucket arithmetic).
	NoJitter time.Duration = -1
	// LineTTLDefault is how long a waiter keeps its place in a route's
	// line between two asks.
	LineTTLDefault = time.Second
)

// Sentinel errors callers branch on.
var (
	// ErrExhausted: no key of the route has room now. The error is an
	// *ExhaustedError saying when to try again.
	ErrExhausted = errors.New("keypool: no key has room")
	// ErrUnknownRoute: no key is configured for the route at all.
	ErrUnknownRoute = errors.New("keypool: no key configured for route")
	// ErrTooLarge: the estimated tokens exceed the TPM of every key of the
	// route, so the request could never be admitted; waiting does not help.
	ErrTooLarge = errors.New("keypool: estimated tokens exceed every key's TPM")
	// ErrUnknownKey: no key with that id is configured.
	ErrUnknownKey = errors.New("keypool: unknown key")
	// ErrSettled: the lease was already settled by Success or Failure.
	ErrSettled = errors.New("keypool: lease already settled")
)

// Reasons an ExhaustedError gives: what keeps the earliest key busy.
const (
	ReasonRequests = "requests"  // RPM bucket empty
	ReasonTokens   = "tokens"    // TPM bucket short of the estimate
	ReasonCooling  = "cooling"   // cooling after a 429
	ReasonInFlight = "in_flight" // MaxInFlight calls in flight
	ReasonDisabled = "disabled"  // every key of the route is disabled

	// ReasonInputTokens and ReasonOutputTokens: a key's ITPM or OTPM
	// bucket (Anthropic) is short of the estimate's input or output part.
	ReasonInputTokens  = "input_tokens"
	ReasonOutputTokens = "output_tokens"
)

// ExhaustedError says that no key of Route has room, and when the earliest
// one will. It matches ErrExhausted with errors.Is.
type ExhaustedError struct {
	Route llm.Route
	// RetryAfter is how long until the earliest key has room (always > 0):
	// the bucket refill time, the end of a cooldown or the expiry of the
	// oldest in-flight lease, whichever holds that key back longest. With
	// Reason in_flight it is an upper bound (a call may end sooner). When
	// every key is disabled nothing will free up on its own; RetryAfter is
	// then Config.CooldownMax, a polling hint.
	RetryAfter time.Duration
	// Reason is one of the Reason... constants.
	Reason string
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("keypool: no key of %s has room (%s); retry after %s", e.Route, e.Reason, e.RetryAfter)
}

// Is makes errors.Is(err, ErrExhausted) hold.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// Key is one provider key and its limits.
type Key struct {
	// ID names the key in Redis, logs, metrics and the admin view. Required;
	// unique; no whitespace.
	ID       string
	Provider llm.Provider
	// Tier is the model tier the key serves, e.g. "sonnet" or "gpt4o-mini".
	Tier string
	// Cred is what a call on the key is made with (its APIKey, or a
	// Bedrock region, an Azure deployment). It stays in process memory:
	// the secret is never written to Redis, logged or returned by
	// Snapshot. Which fields a key needs is its provider's business
	// (pkg/config checks them).
	Cred llm.Credential
	// RPM is the requests-per-minute limit (> 0). The request bucket holds
	// the window's share of it (at least one request) and refills at the
	// per-minute rate, both times Config.Pace (see the package doc,
	// "Bucket model").
	RPM int
	// TPM is the tokens-per-minute limit (> 0), metered the same way
	// (without the one-request floor). An estimate above TPM never fits.
	TPM int
	// ITPM and OTPM are Anthropic's separate input and output
	// tokens-per-minute limits; 0 (the default) means the key has no such
	// limit and behaves as one with TPM alone. When set, the key has an
	// input or output token bucket too, metered like the token bucket:
	// Acquire charges the estimate's input part (Split) to the first and its
	// max_tokens to the second, Success settles each to the usage, and
	// anthropic-ratelimit-{input,output}-tokens-* headers lower them (see
	// the package doc, "Token metering"). An input part above ITPM, or an
	// output part above OTPM, never fits the key.
	ITPM int
	OTPM int
	// MaxInFlight caps concurrent calls on the key; 0 means no limit.
	MaxInFlight int
	// Window overrides Config.Window for this key; 0 means Config.Window.
	Window time.Duration
	// Preferred keys are taken first whenever one has room now, whatever
	// the headroom of the others (an Azure PTU deployment: provisioned
	// capacity is paid for whether used or not).
	Preferred bool
	// Metering is how the key's provider settles a call's tokens after
	// admission (see the package doc, "Token metering"). The zero value,
	// MeterAdmission, is the harsher one: what was charged at admission
	// stays charged. pkg/config derives it from the provider's kind.
	Metering Metering
	// OutputBurndown is how many tokens of the key's TPM one output token
	// uses up when the call is settled (0 means 1). Bedrock counts each
	// output token of Claude 4-series models five times against the
	// model's tokens-per-minute quota ("token burndown rate"), after
	// reserving input + max_tokens at the start like any other model.
	OutputBurndown int
}

// Metering is how a provider settles the tokens it charged when it
// admitted a call (prompt plus max_tokens) once the call is over.
type Metering int

const (
	// MeterAdmission: the admission charge stands. OpenAI counts
	// max_tokens against TPM when it admits a call and documents no refund
	// of the unused part; Azure OpenAI likewise rate-limits on the tokens
	// estimated when the request is received (prompt, max_tokens, best_of),
	// not on the billed count. A Success only charges usage above the
	// estimate; a Release (the call may have been admitted) keeps the
	// charge. The provider's x-ratelimit-remaining-tokens still lowers the
	// bucket. The zero value.
	MeterAdmission Metering = iota
	// MeterUsage: the admission estimate is settled to the real usage,
	// refunding the unused part of max_tokens. Anthropic estimates output
	// tokens from max_tokens at the start of a request and adjusts to the
	// real output at its end; Bedrock reserves input plus max_tokens at the
	// start and adjusts to the real usage at the end. A local server meters
	// nothing, so its estimate settles to usage too.
	MeterUsage
)

func (m Metering) String() string {
	switch m {
	case MeterAdmission:
		return "admission"
	case MeterUsage:
		return "usage"
	}
	return fmt.Sprintf("Metering(%d)", int(m))
}

// Route returns the key's (provider, tier).
func (k Key) Route() llm.Route { return llm.Route{Provider: k.Provider, Tier: k.Tier} }

// Config configures a Pool. Zero fields take the documented defaults.
type Config struct {
	// Keys is the pool. Required (at least one).
	Keys []Key
	// Prefix starts every Redis key name; default PrefixDefault. Tests and
	// tenants use their own to isolate.
	Prefix string
	// LeaseTTL is how long an in-flight lease lives without being settled;
	// default LeaseTTLDefault (3m). A SIGKILLed worker's slots free up after
	// it.
	LeaseTTL time.Duration
	// CooldownBase and CooldownMax shape the 429 cooldown
	// min(CooldownBase·2^n, CooldownMax), n the consecutive 429s counting
	// this one; defaults 1s and 120s. The cooldown is never shorter than the
	// provider's Retry-After.
	CooldownBase time.Duration
	CooldownMax  time.Duration
	// OpTimeout is the deadline of each Redis round trip; default
	// OpTimeoutDefault (2s). Success, Failure and Release run under it even
	// when the caller's context is already cancelled, so an abandoned call
	// still returns its reservation.
	OpTimeout time.Duration
	// Window is the burst window of every key without its own: the request
	// bucket holds max(1, RPM·Window/1m) requests, the token bucket
	// TPM·Window/1m tokens; both refill at the per-minute rate. Default
	// WindowDefault (1s), at most one minute (the whole-minute bucket,
	// which real providers do not grant).
	Window time.Duration
	// Pace is the share of each limit the pool spends, in (0, 1]; default
	// PaceDefault (0.98).
	Pace float64
	// Jitter is the arrival jitter the pool absorbs: a grant leaves Jitter
	// of refill in a key's request bucket (at most what it holds beyond one
	// request), which costs no rate; a key whose provider bucket holds less
	// than two requests has no room for that and spaces its grants Jitter
	// more than one refill instead.
	// Default JitterDefault (50ms); NoJitter for none; at most one second.
	Jitter time.Duration
	// LineTTL is how long a waiter refused by InLine keeps its place
	// without asking again; default LineTTLDefault (1s). A waiter that
	// stops asking without Leave (its worker died) holds the waiters
	// behind it back for at most this long.
	LineTTL time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	if c.CooldownBase == 0 {
		c.CooldownBase = CooldownBaseDefault
	}
	if c.CooldownMax == 0 {
		c.CooldownMax = CooldownMaxDefault
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = OpTimeoutDefault
	}
	if c.Window == 0 {
		c.Window = WindowDefault
	}
	if c.Pace == 0 {
		c.Pace = PaceDefault
	}
	if c.LineTTL == 0 {
		c.LineTTL = LineTTLDefault
	}
	if c.Jitter == 0 {
		c.Jitter = JitterDefault
	}
	c.Keys = append([]Key(nil), c.Keys...)
	for i := range c.Keys {
		if c.Keys[i].Window == 0 {
			c.Keys[i].Window = c.Window
		}
	}
	return c
}

// Validate reports the first field of c (defaults applied) out of range.
func (c Config) Validate() error {
	if len(c.Keys) == 0 {
		return errors.New("keypool: Config.Keys is empty")
	}
	if c.LeaseTTL < time.Millisecond {
		return fmt.Errorf("keypool: Config.LeaseTTL must be >= 1ms, got %s", c.LeaseTTL)
	}
	if c.CooldownBase < 0 {
		return fmt.Errorf("keypool: Config.CooldownBase must be > 0, got %s", c.CooldownBase)
	}
	if c.CooldownMax < c.CooldownBase {
		return fmt.Errorf("keypool: Config.CooldownMax (%s) must be >= CooldownBase (%s)", c.CooldownMax, c.CooldownBase)
	}
	if c.OpTimeout < 0 {
		return fmt.Errorf("keypool: Config.OpTimeout must be > 0, got %s", c.OpTimeout)
	}
	if c.Window < time.Millisecond || c.Window > time.Minute {
		return fmt.Errorf("keypool: Config.Window must be in [1ms, 1m], got %s", c.Window)
	}
	if c.LineTTL < time.Millisecond {
		return fmt.Errorf("keypool: Config.LineTTL must be >= 1ms, got %s", c.LineTTL)
	}
	if c.Pace <= 0 || c.Pace > 1 {
		return fmt.Errorf("keypool: Config.Pace must be in (0, 1], got %g", c.Pace)
	}
	if c.Jitter != NoJitter && (c.Jitter < 0 || c.Jitter > time.Second) {
		return fmt.Errorf("keypool: Config.Jitter must be in [0, 1s] or NoJitter, got %s", c.Jitter)
	}
	seen := make(map[string]bool, len(c.Keys))
	for i, k := range c.Keys {
		switch {
		case k.ID == "" || strings.ContainsAny(k.ID, " \t\r\n"):
			return fmt.Errorf("keypool: Config.Keys[%d].ID must be non-empty without whitespace, got %q", i, k.ID)
		case seen[k.ID]:
			return fmt.Errorf("keypool: Config.Keys[%d].ID %q is a duplicate", i, k.ID)
		case !k.Provider.Valid():
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).Provider %q is not a provider name", i, k.ID, k.Provider)
		case k.Tier == "":
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).Tier is empty", i, k.ID)
		case k.RPM <= 0:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).RPM must be > 0, got %d", i, k.ID, k.RPM)
		case k.TPM <= 0:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).TPM must be > 0, got %d", i, k.ID, k.TPM)
		case k.ITPM < 0:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).ITPM must be >= 0 (0: none), got %d", i, k.ID, k.ITPM)
		case k.OTPM < 0:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).OTPM must be >= 0 (0: none), got %d", i, k.ID, k.OTPM)
		case k.OutputBurndown < 0:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).OutputBurndown must be >= 0, got %d", i, k.ID, k.OutputBurndown)
		case k.MaxInFlight < 0:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).MaxInFlight must be >= 0, got %d", i, k.ID, k.MaxInFlight)
		case k.Window < time.Millisecond || k.Window > time.Minute:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).Window must be in [1ms, 1m], got %s", i, k.ID, k.Window)
		case k.Metering != MeterAdmission && k.Metering != MeterUsage:
			return fmt.Errorf("keypool: Config.Keys[%d] (%s).Metering must be MeterAdmission or MeterUsage, got %d", i, k.ID, int(k.Metering))
		}
		seen[k.ID] = true
	}
	return nil
}

// Pool is the key pool shared through Redis by every process that builds
// one with the same Prefix. It holds no state of its own beyond its
// configuration; it is safe for concurrent use.
type Pool struct {
	rdb    redis.Scripter
	cfg    Config
	logger *slog.Logger
	sc     *scripts

	byID map[string]int // key id → index in cfg.Keys
	// routes maps a route to its keys' indexes and to the KEYS list of the
	// acquire script (state hash, lease set per key, both in config order,
	// then the route's line and its expiries).
	routes    map[llm.Route][]int
	routeKeys map[llm.Route][]string
	// routePrefs marks each key of a route preferred ('1') or not ('0'),
	// in config order: the acquire script's ARGV[5].
	routePrefs map[llm.Route]string
	allKeys    []string // state hash, lease set of every key, config order
	// rotate picks the tie-breaking rotation of an acquire among n keys
	// (math/rand/v2's N; tests fix it to see configuration order).
	rotate func(n int) int
}

// New builds a Pool on rdb and registers cfg.Keys in Redis: their limits are
// written (the last process to start wins, so all agree) and a key seen for
// the first time starts with full buckets. The caller owns rdb and closes
// it. logger may be nil.
func New(ctx context.Context, rdb redis.Scripter, cfg Config, logger *slog.Logger) (*Pool, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Pool{
		rdb:        rdb,
		cfg:        cfg,
		logger:     logger,
		sc:         newScripts(),
		byID:       make(map[string]int, len(cfg.Keys)),
		routes:     make(map[llm.Route][]int),
		routeKeys:  make(map[llm.Route][]string),
		routePrefs: make(map[llm.Route]string),
		rotate:     mrand.N[int],
	}
	for i, k := range cfg.Keys {
		r := k.Route()
		sk, lk := stateKey(cfg.Prefix, k.ID), leasesKey(cfg.Prefix, k.ID)
		p.byID[k.ID] = i
		p.routes[r] = append(p.routes[r], i)
		p.routeKeys[r] = append(p.routeKeys[r], sk, lk)
		pref := "0"
		if k.Preferred {
			pref = "1"
		}
		p.routePrefs[r] += pref
		p.allKeys = append(p.allKeys, sk, lk)
	}
	// The acquire script's last three KEYS are the route's line and its
	// spacing.
	for r := range p.routeKeys {
		p.routeKeys[r] = append(p.routeKeys[r], lineKey(cfg.Prefix, r), lineExpiryKey(cfg.Prefix, r), paceKey(cfg.Prefix, r))
	}
	if err := p.register(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// register writes every configured key's limits (registerLua).
func (p *Pool) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	defer cancel()
	keys := make([]string, len(p.cfg.Keys))
	jitter := max(p.cfg.Jitter, 0).Microseconds()
	args := make([]any, 0, 10*len(p.cfg.Keys))
	for i, k := range p.cfg.Keys {
		keys[i] = stateKey(p.cfg.Prefix, k.ID)
		args = append(args, string(k.Provider), k.Tier, k.RPM, k.TPM, k.MaxInFlight, k.Window.Microseconds(), p.cfg.Pace,
			k.ITPM, k.OTPM, jitter)
	}
	res, err := p.sc.register.Run(ctx, p.rdb, keys, args...).Result()
	if err != nil {
		return fmt.Errorf("keypool: register keys: %w", err)
	}
	changed, ok := res.([]any)
	if !ok {
		return fmt.Errorf("keypool: register keys: unexpected reply %T", res)
	}
	for _, c := range changed {
		i, ok := c.(int64)
		if !ok || i < 1 || int(i) > len(p.cfg.Keys) {
			return fmt.Errorf("keypool: register keys: unexpected reply element %v", c)
		}
		k := p.cfg.Keys[i-1]
		p.logger.Info("keypool: key limits changed by this process's configuration",
			"key", k.ID, "route", k.Route().String(), "rpm", k.RPM, "tpm", k.TPM, "itpm", k.ITPM, "otpm", k.OTPM,
			"max_in_flight", k.MaxInFlight,
			"window", k.Window, "pace", p.cfg.Pace, "jitter", max(p.cfg.Jitter, 0))
	}
	return nil
}

// Routes returns the configured routes and their key counts.
func (p *Pool) Routes() map[llm.Route]int {
	out := make(map[llm.Route]int, len(p.routes))
	for r, idx := range p.routes {
		out[r] = len(idx)
	}
	return out
}

// Lease is one reservation on one key: a request and EstTokens tokens taken
// from its buckets and an in-flight slot. End it with exactly one of
// Success, Failure or Release; Release after either is a no-op, so
// `defer pool.Release(ctx, lease)` is safe. A settlement that fails in Redis
// still counts as made: the reservation then stays spent and the slot frees
// itself at ExpiresAt.
type Lease struct {
	// ID identifies the in-flight slot in Redis.
	ID    string
	KeyID string
	Route llm.Route
	// Cred is the credential to call with; its APIKey prints redacted.
	Cred llm.Credential
	// EstTokens is the number of tokens reserved.
	EstTokens int
	// EstInput and EstOutput are the parts of EstTokens charged to the
	// key's ITPM and OTPM buckets (see Split); each is EstTokens when
	// Acquire was not told the split.
	EstInput, EstOutput int
	// GrantedAt is the Redis time of the grant.
	GrantedAt time.Time
	// NotBefore is when the call may be made: GrantedAt, or later for a
	// reservation made ahead (see Within). Calling earlier would spend a
	// request the provider's bucket does not hold yet.
	NotBefore time.Time
	// ExpiresAt is when the in-flight slot frees itself if never settled.
	ExpiresAt time.Time

	grantedUS int64
	settled   atomic.Bool
	// consecutive is the key's consecutive 429s after a Failure settled
	// this lease (owned by the goroutine that settles it).
	consecutive int64
}

// Consecutive429s is the key's count of consecutive 429s as the Failure
// that settled this lease left it (0 before): 1 is a first 429 on a key
// the pool paced (usually arrival jitter), 2 or more a key the provider
// refuses again after its cooldown.
func (l *Lease) Consecutive429s() int { return int(l.consecutive) }

// Delay is how long after the grant the call may be made: zero unless the
// lease was reserved ahead (Within). It is relative, so a caller whose
// clock differs from Redis's still waits the right time.
func (l *Lease) Delay() time.Duration { return l.NotBefore.Sub(l.GrantedAt) }

// timeFromUS converts Redis µs to time.Time.
func timeFromUS(us int64) time.Time { return time.UnixMicro(us) }
