package keypool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"bulwark/pkg/llm"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	haiku  = llm.Route{Provider: llm.ProviderClaude, Tier: "haiku"}
	sonnet = llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	mini   = llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o-mini"}
)

// secretOf is the credential of test key id; tests search for it in every
// output the pool produces.
func secretOf(id string) string { return "sk-test-" + id + "-TOPSECRETVALUE" }

// key is a test key. Claude keys settle to usage and OpenAI keys keep
// their admission charge, as pkg/config sets them for those providers'
// kinds.
func key(id string, r llm.Route, rpm, tpm int) Key {
	m := MeterAdmission
	if r.Provider == llm.ProviderClaude {
		m = MeterUsage
	}
	return Key{ID: id, Provider: r.Provider, Tier: r.Tier, Cred: llm.Credential{APIKey: secret.New(secretOf(id))}, RPM: rpm, TPM: tpm,
		Metering: m}
}

type bundle struct {
	pool *Pool
	rdb  *redis.Client
	cfg  Config
}

// minuteBuckets gives cfg whole-minute buckets spent to the full limit
// (Window 1m, Pace 1, NoJitter) unless the test set them itself: a key of
// N RPM then takes N calls at once and refills N per minute. Tests about
// something other than pacing (cooldowns, disabling, leases, headroom,
// secrecy) use it so their numbers stay the simple ones; the pacing tests
// (pace_test.go) set both.
func minuteBuckets(cfg Config) Config {
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	if cfg.Pace == 0 {
		cfg.Pace = 1
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = NoJitter
	}
	return cfg
}

// setup builds a pool with minuteBuckets(cfg) on the test's own Redis
// database.
func setup(t *testing.T, cfg Config) *bundle {
	t.Helper()
	return build(t, minuteBuckets(cfg))
}

// build builds a pool with cfg as given (zero Window and Pace take the
// package defaults) on the test's own Redis database.
func build(t *testing.T, cfg Config) *bundle {
	t.Helper()
	rdb := testenv.Redis(t)
	if cfg.Prefix == "" {
		cfg.Prefix = "test:keypool:"
	}
	p, err := New(context.Background(), rdb, cfg, nil)
	require.NoError(t, err)
	p.rotate = func(int) int { return 0 } // ties in configuration order, for exact expectations
	return &bundle{pool: p, rdb: rdb, cfg: p.cfg}
}

func (b *bundle) state(t *testing.T, id string) KeyState {
	t.Helper()
	ss, err := b.pool.Snapshot(context.Background())
	require.NoError(t, err)
	for _, s := range ss {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("key %s not in snapshot", id)
	return KeyState{}
}

func (b *bundle) now(t *testing.T) time.Time {
	t.Helper()
	now, err := b.rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	return now
}

// endCooldown ends a key's cooldown early and refills its request bucket
// (a 429 empties it), as waiting the cooldown out would, so a test can
// walk the cooldown sequence without waiting. The 429 count and the
// back-off factor are untouched.
func (b *bundle) endCooldown(t *testing.T, id string) {
	t.Helper()
	endCooldown(t, b.rdb, b.pool, id)
}

func endCooldown(t *testing.T, rdb *redis.Client, p *Pool, id string) {
	t.Helper()
	// The next read clamps the level to the bucket's capacity.
	require.NoError(t, rdb.HSet(context.Background(), stateKey(p.cfg.Prefix, id), "cu", 0, "rl", 1e12).Err())
}

func (b *bundle) acquire(t *testing.T, r llm.Route, est int) *Lease {
	t.Helper()
	l, err := b.pool.Acquire(context.Background(), r, est)
	require.NoError(t, err)
	return l
}

func exhausted(t *testing.T, err error) *ExhaustedError {
	t.Helper()
	require.ErrorIs(t, err, ErrExhausted)
	var ee *ExhaustedError
	require.ErrorAs(t, err, &ee)
	require.Positive(t, ee.RetryAfter)
	return ee
}

func rateLimited(retryAfter time.Duration) error {
	return &llm.Error{Class: llm.ClassRateLimited, Provider: llm.ProviderClaude, Status: 429, Code: "rate_limit_error", RetryAfter: retryAfter}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := key("a", haiku, 10, 1000)
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"no keys", func(c *Config) { c.Keys = nil }, "Config.Keys is empty"},
		{"empty id", func(c *Config) { c.Keys[0].ID = "" }, "Keys[0].ID"},
		{"id with space", func(c *Config) { c.Keys[0].ID = "a b" }, "Keys[0].ID"},
		{"duplicate id", func(c *Config) { c.Keys = append(c.Keys, good) }, "Keys[1].ID \"a\" is a duplicate"},
		{"bad provider", func(c *Config) { c.Keys[0].Provider = "Not A Name" }, "Keys[0] (a).Provider"},
		{"no tier", func(c *Config) { c.Keys[0].Tier = "" }, "Keys[0] (a).Tier"},
		{"zero rpm", func(c *Config) { c.Keys[0].RPM = 0 }, "Keys[0] (a).RPM must be > 0"},
		{"zero tpm", func(c *Config) { c.Keys[0].TPM = 0 }, "Keys[0] (a).TPM must be > 0"},
		{"negative in-flight", func(c *Config) { c.Keys[0].MaxInFlight = -1 }, "MaxInFlight must be >= 0"},
		{"negative itpm", func(c *Config) { c.Keys[0].ITPM = -1 }, "Keys[0] (a).ITPM must be >= 0 (0: none), got -1"},
		{"negative otpm", func(c *Config) { c.Keys[0].OTPM = -5 }, "Keys[0] (a).OTPM must be >= 0 (0: none), got -5"},
		{"tiny lease ttl", func(c *Config) { c.LeaseTTL = time.Microsecond }, "Config.LeaseTTL"},
		{"max below base", func(c *Config) { c.CooldownBase = 10 * time.Second; c.CooldownMax = time.Second }, "Config.CooldownMax"},
		{"negative op timeout", func(c *Config) { c.OpTimeout = -time.Second }, "Config.OpTimeout"},
		{"negative pace", func(c *Config) { c.Pace = -0.5 }, "Config.Pace must be in (0, 1], got -0.5"},
		{"pace above 1", func(c *Config) { c.Pace = 1.02 }, "Config.Pace must be in (0, 1], got 1.02"},
		{"jitter over a second", func(c *Config) { c.Jitter = 2 * time.Second }, "Config.Jitter must be in [0, 1s] or NoJitter, got 2s"},
		{"negative jitter", func(c *Config) { c.Jitter = -time.Millisecond }, "Config.Jitter must be in [0, 1s] or NoJitter, got -1ms"},
		{"window above a minute", func(c *Config) { c.Window = 2 * time.Minute }, "Config.Window must be in [1ms, 1m], got 2m0s"},
		{"negative window", func(c *Config) { c.Window = -time.Second }, "Config.Window must be in [1ms, 1m], got -1s"},
		{"key window above a minute", func(c *Config) { c.Keys[0].Window = 61 * time.Second }, "Keys[0] (a).Window must be in [1ms, 1m], got 1m1s"},
		{"tiny key window", func(c *Config) { c.Keys[0].Window = time.Microsecond }, "Keys[0] (a).Window must be in [1ms, 1m]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{Keys: []Key{good}}
			tt.mutate(&cfg)
			// Validation fails before any Redis call, so no client is needed.
			_, err := New(context.Background(), nil, cfg, nil)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}

	cfg := Config{Keys: []Key{good}}.WithDefaults()
	require.NoError(t, cfg.Validate())
	require.Equal(t, PrefixDefault, cfg.Prefix)
	require.Equal(t, LeaseTTLDefault, cfg.LeaseTTL)
	require.Equal(t, CooldownBaseDefault, cfg.CooldownBase)
	require.Equal(t, CooldownMaxDefault, cfg.CooldownMax)
	require.Equal(t, OpTimeoutDefault, cfg.OpTimeout)
	require.Equal(t, WindowDefault, cfg.Window)
	require.Equal(t, PaceDefault, cfg.Pace)
	require.Equal(t, WindowDefault, cfg.Keys[0].Window, "a key without a window takes Config.Window")

	own := key("b", haiku, 10, 1000)
	own.Window = time.Minute
	cfg = Config{Keys: []Key{good, own}, Window: 2 * time.Second}.WithDefaults()
	require.NoError(t, cfg.Validate())
	require.Equal(t, []time.Duration{2 * time.Second, time.Minute}, []time.Duration{cfg.Keys[0].Window, cfg.Keys[1].Window})
}

func TestHeaderArgs(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	absent := []int64{-1, -1, -1}
	tests := []struct {
		name         string
		rl           llm.RateLimit
		wantRequests []int64 // limit, remaining, reset µs
		wantTokens   []int64
	}{
		{"unknown", llm.RateLimit{RequestsLimit: 60, RequestsRemaining: 5, TokensRemaining: 7}, absent, absent},
		{"remaining without limit", llm.RateLimit{Known: true, RequestsRemaining: 5, TokensRemaining: 7},
			[]int64{-1, 5, -1}, []int64{-1, 7, -1}},
		{"zero without limit is absent", llm.RateLimit{Known: true, TokensRemaining: 7},
			absent, []int64{-1, 7, -1}},
		{"zero with limit is zero", llm.RateLimit{Known: true, RequestsLimit: 60, TokensLimit: 1000},
			[]int64{60, 0, -1}, []int64{1000, 0, -1}},
		{"negative is ignored", llm.RateLimit{Known: true, RequestsLimit: -1, RequestsRemaining: -1, TokensLimit: 1000, TokensRemaining: -1},
			absent, []int64{1000, -1, -1}},
		{"resets in µs from now", llm.RateLimit{Known: true,
			RequestsLimit: 120, RequestsRemaining: 100, RequestsReset: now.Add(30 * time.Second),
			TokensLimit: 60000, TokensRemaining: 59000, TokensReset: now.Add(1500 * time.Microsecond)},
			[]int64{120, 100, 30_000_000}, []int64{60000, 59000, 1500}},
		{"a reset of now is zero", llm.RateLimit{Known: true, RequestsLimit: 120, RequestsRemaining: 120, RequestsReset: now},
			[]int64{120, 120, 0}, absent},
		{"a reset in the past is absent", llm.RateLimit{Known: true, RequestsLimit: 120, RequestsRemaining: 7, RequestsReset: now.Add(-time.Second)},
			[]int64{120, 7, -1}, absent},
		{"a reset without limit is absent", llm.RateLimit{Known: true, RequestsRemaining: 7, RequestsReset: now.Add(time.Second)},
			[]int64{-1, 7, -1}, absent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := headerArgs(tt.rl, now)
			require.Len(t, args, 6)
			got := make([]int64, len(args))
			for i, a := range args {
				switch v := a.(type) {
				case int:
					got[i] = int64(v)
				case int64:
					got[i] = v
				default:
					t.Fatalf("argument %d is %T, want an integer", i, a)
				}
			}
			require.Equal(t, tt.wantRequests, got[:3], "requests")
			require.Equal(t, tt.wantTokens, got[3:], "tokens")
		})
	}
}

func TestAcquirePicksMostHeadroom(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		keys    []Key
		prepare func(t *testing.T, p *Pool)
		est     int
		want    []string // key ids of successive grants
	}{
		{
			name: "fresher request bucket wins",
			keys: []Key{key("a", haiku, 10, 1000), key("b", haiku, 100, 1000)},
			want: []string{"b"},
		},
		{
			name: "token headroom counts too",
			// a: min(9/10, 500/1000) = 0.5; b: min(99/100, 100/600) = 0.17.
			keys: []Key{key("a", haiku, 10, 1000), key("b", haiku, 100, 600)},
			est:  500,
			want: []string{"a"},
		},
		{
			name: "equal keys alternate",
			keys: []Key{key("a", haiku, 60, 1000), key("b", haiku, 60, 1000), key("c", haiku, 60, 1000)},
			want: []string{"a", "b", "c", "a", "b", "c"},
		},
		{
			name: "in-flight headroom counts with MaxInFlight",
			keys: func() []Key {
				a, b := key("a", haiku, 100, 1000), key("b", haiku, 100, 1000)
				a.MaxInFlight, b.MaxInFlight = 2, 4
				return []Key{a, b}
			}(),
			// a: min(99/100, 1/2) = 0.5; b: min(.99, 3/4) = .75 → b; then
			// b: 2/4 = .5 ties a → a (earlier); then b (.5 > a's 0).
			want: []string{"b", "a", "b", "b"},
		},
		{
			name: "cooling and disabled keys are skipped",
			keys: []Key{key("a", haiku, 10, 1000), key("b", haiku, 100, 1000), key("c", haiku, 100, 1000)},
			prepare: func(t *testing.T, p *Pool) {
				l, err := p.Acquire(ctx, haiku, 0)
				require.NoError(t, err)
				require.Equal(t, "b", l.KeyID)
				require.NoError(t, p.Failure(ctx, l, Cool, rateLimited(0)))
				require.NoError(t, p.Disable(ctx, "c", "test"))
			},
			want: []string{"a", "a"},
		},
		{
			name: "other routes are never chosen",
			keys: []Key{key("a", haiku, 10, 1000), key("s", sonnet, 1000, 100000), key("m", mini, 1000, 100000)},
			want: []string{"a", "a", "a"},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := New(ctx, rdb, minuteBuckets(Config{Keys: tt.keys, Prefix: fmt.Sprintf("test:headroom:%d:", i)}), nil)
			require.NoError(t, err)
			p.rotate = func(int) int { return 0 } // ties in configuration order
			if tt.prepare != nil {
				tt.prepare(t, p)
			}
			var got []string
			for range tt.want {
				l, err := p.Acquire(ctx, haiku, tt.est)
				require.NoError(t, err)
				got = append(got, l.KeyID)
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestUnknownRouteAndTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 10, 1000), key("b", haiku, 10, 2000)}})
	ctx := context.Background()

	_, err := b.pool.Acquire(ctx, sonnet, 10)
	require.ErrorIs(t, err, ErrUnknownRoute)
	require.NotErrorIs(t, err, ErrExhausted)

	_, err = b.pool.Acquire(ctx, haiku, 2001)
	require.ErrorIs(t, err, ErrTooLarge)
	require.NotErrorIs(t, err, ErrExhausted)

	// Fits only b: b is chosen although a has equal request headroom.
	require.Equal(t, "b", b.acquire(t, haiku, 1500).KeyID)

	_, err = b.pool.Acquire(ctx, haiku, -1)
	require.ErrorContains(t, err, "estTokens must be >= 0")
}

// TestCooldownSequence walks the design's cooldown min(2^n, 120) s with the
// default configuration, ending each cooldown early rather than waiting it
// out, and checks the provider's Retry-After is a floor.
func TestCooldownSequence(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 1000, 100000)}})
	ctx := context.Background()
	steps := []struct {
		retryAfter time.Duration
		want       time.Duration
	}{
		{0, 2 * time.Second},
		{0, 4 * time.Second},
		{0, 8 * time.Second},
		{10 * time.Second, 16 * time.Second}, // Retry-After below the rule
		{40 * time.Second, 40 * time.Second}, // Retry-After above the rule (32 s)
		{0, 64 * time.Second},
		{0, 120 * time.Second},
		{0, 120 * time.Second},
		{300 * time.Second, 300 * time.Second},
		{0, 120 * time.Second},
	}
	const tolerance = 250 * time.Millisecond
	for i, st := range steps {
		n := i + 1
		l := b.acquire(t, haiku, 10)
		require.NoError(t, b.pool.Failure(ctx, l, Cool, rateLimited(st.retryAfter)))

		s := b.state(t, "a")
		require.Equal(t, n, s.Consecutive429s, "step %d", n)
		got := s.CoolingUntil.Sub(b.now(t))
		require.InDelta(t, st.want.Seconds(), got.Seconds(), tolerance.Seconds(), "step %d: cooldown", n)

		_, err := b.pool.Acquire(ctx, haiku, 10)
		ee := exhausted(t, err)
		require.Equal(t, ReasonCooling, ee.Reason)
		require.InDelta(t, st.want.Seconds(), ee.RetryAfter.Seconds(), tolerance.Seconds(), "step %d: RetryAfter", n)

		b.endCooldown(t, "a")
	}
}

// TestCooldownExpires lets a short cooldown run out for real. The key
// refills a request every 67 µs (1,000,000 RPM slowed 10% by the 429), so
// the request bucket the 429 emptied never outlasts the cooldown.
func TestCooldownExpires(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 1_000_000, 100_000_000)}, CooldownBase: 10 * time.Millisecond, CooldownMax: 40 * time.Millisecond})
	ctx := context.Background()
	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 1), Cool, rateLimited(0)))

	_, err := b.pool.Acquire(ctx, haiku, 1)
	ee := exhausted(t, err)
	require.Equal(t, ReasonCooling, ee.Reason)
	require.LessOrEqual(t, ee.RetryAfter, 20*time.Millisecond)

	time.Sleep(ee.RetryAfter) // the cooldown's own end is the event awaited
	l := b.acquire(t, haiku, 1)
	require.Equal(t, "a", l.KeyID)
	require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 1}, llm.RateLimit{}))
	require.Zero(t, b.state(t, "a").Consecutive429s)
}

// TestConcurrent429sEscalateOnce: calls in flight when a key is first cooled
// report the same overload; they must not double the cooldown each.
func TestConcurrent429sEscalateOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 1000, 100000)}})
	ctx := context.Background()
	var ls []*Lease
	for range 4 {
		ls = append(ls, b.acquire(t, haiku, 10))
	}
	for _, l := range ls[:3] {
		require.NoError(t, b.pool.Failure(ctx, l, Cool, rateLimited(0)))
	}
	s := b.state(t, "a")
	require.Equal(t, 1, s.Consecutive429s)
	require.InDelta(t, 2, s.CoolingUntil.Sub(b.now(t)).Seconds(), 0.25)

	// An echo still honours a longer Retry-After.
	require.NoError(t, b.pool.Failure(ctx, ls[3], Cool, rateLimited(7*time.Second)))
	s = b.state(t, "a")
	require.Equal(t, 1, s.Consecutive429s)
	require.InDelta(t, 7, s.CoolingUntil.Sub(b.now(t)).Seconds(), 0.25)

	// A lease granted after the escalation is new evidence.
	b.endCooldown(t, "a")
	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 10), Cool, rateLimited(0)))
	require.Equal(t, 2, b.state(t, "a").Consecutive429s)
}

func TestSuccessResetsCount(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 1000, 100000)}})
	ctx := context.Background()
	for range 3 {
		require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 10), Cool, rateLimited(0)))
		b.endCooldown(t, "a")
	}
	require.Equal(t, 3, b.state(t, "a").Consecutive429s)

	require.NoError(t, b.pool.Success(ctx, b.acquire(t, haiku, 10), llm.Usage{InputTokens: 5, OutputTokens: 5}, llm.RateLimit{}))
	require.Zero(t, b.state(t, "a").Consecutive429s)

	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 10), Cool, rateLimited(0)))
	s := b.state(t, "a")
	require.Equal(t, 1, s.Consecutive429s)
	require.InDelta(t, 2, s.CoolingUntil.Sub(b.now(t)).Seconds(), 0.25)
}

func TestQuotaAndAuthDisable(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	for i, tc := range []struct {
		class      llm.Class
		code       string
		wantReason string
	}{
		{llm.ClassQuota, "insufficient_quota", "quota (insufficient_quota)"},
		{llm.ClassAuth, "", "auth"},
	} {
		t.Run(string(tc.class), func(t *testing.T) {
			t.Parallel()
			p, err := New(ctx, rdb, minuteBuckets(Config{
				Keys:   []Key{key("a", mini, 100, 10000), key("b", mini, 10, 10000)},
				Prefix: fmt.Sprintf("test:disable:%d:", i),
			}), nil)
			require.NoError(t, err)
			l, err := p.Acquire(ctx, mini, 0)
			require.NoError(t, err)
			require.Equal(t, "a", l.KeyID)
			require.NoError(t, p.Failure(ctx, l, Disable, &llm.Error{Class: tc.class, Provider: llm.ProviderOpenAI, Status: 429, Code: tc.code}))

			ss, err := p.Snapshot(ctx)
			require.NoError(t, err)
			require.True(t, ss[0].Disabled)
			require.Equal(t, tc.wantReason, ss[0].DisabledReason)
			require.True(t, ss[0].CoolingUntil.IsZero(), "disabled, not cooled")
			require.Zero(t, ss[0].Consecutive429s)

			// a is out although it has the most headroom.
			for range 3 {
				l, err := p.Acquire(ctx, mini, 0)
				require.NoError(t, err)
				require.Equal(t, "b", l.KeyID)
			}
			av, err := p.Available(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, av[mini])

			require.NoError(t, p.Disable(ctx, "b", ""))
			_, err = p.Acquire(ctx, mini, 0)
			ee := exhausted(t, err)
			require.Equal(t, ReasonDisabled, ee.Reason)
			require.Equal(t, CooldownMaxDefault, ee.RetryAfter)

			require.NoError(t, p.Enable(ctx, "a"))
			l, err = p.Acquire(ctx, mini, 0)
			require.NoError(t, err)
			require.Equal(t, "a", l.KeyID)
			require.False(t, snap(t, p)[0].Disabled)
		})
	}
}

func snap(t *testing.T, p *Pool) []KeyState {
	t.Helper()
	ss, err := p.Snapshot(context.Background())
	require.NoError(t, err)
	return ss
}

func TestDisableUnknownKey(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 10, 1000)}})
	require.ErrorIs(t, b.pool.Disable(context.Background(), "nope", "x"), ErrUnknownKey)
	require.ErrorIs(t, b.pool.Enable(context.Background(), "nope"), ErrUnknownKey)
	require.NoError(t, b.pool.Disable(context.Background(), "a", ""))
	require.Equal(t, "disabled by operator", b.state(t, "a").DisabledReason)
}

// TestFailuresThatDoNotCool: a Refund (what the dispatcher does on
// overloaded, transient, permanent and non-provider errors) refunds the
// tokens, keeps the request counted, and leaves the cooldown, the 429 count
// and the back-off factor alone.
func TestFailuresThatDoNotCool(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	for i, callErr := range []error{
		&llm.Error{Class: llm.ClassOverloaded, Provider: llm.ProviderClaude, Status: 529, Code: "overloaded_error"},
		&llm.Error{Class: llm.ClassTransient, Provider: llm.ProviderClaude, Status: 502},
		&llm.Error{Class: llm.ClassPermanent, Provider: llm.ProviderClaude, Status: 400, Code: "invalid_request_error"},
		fmt.Errorf("call: %w", context.Canceled),
	} {
		t.Run(callErr.Error(), func(t *testing.T) {
			t.Parallel()
			// 60 RPM and 6000 TPM refill 1 request and 100 tokens per
			// second: a few ms of test time move them by well under the
			// tolerances below.
			p, err := New(ctx, rdb, minuteBuckets(Config{Keys: []Key{key("a", haiku, 60, 6000)}, Prefix: fmt.Sprintf("test:nocool:%d:", i)}), nil)
			require.NoError(t, err)
			// One earlier 429, its cooldown ended: the count must survive.
			require.NoError(t, p.Failure(ctx, mustAcquire(t, p, haiku, 100), Cool, rateLimited(0)))
			endCooldown(t, rdb, p, "a")

			before := snap(t, p)[0]
			require.NoError(t, p.Failure(ctx, mustAcquire(t, p, haiku, 3000), Refund, callErr))
			s := snap(t, p)[0]
			require.True(t, s.CoolingUntil.IsZero(), "cooling after %v", callErr)
			require.Equal(t, 1, s.Consecutive429s)
			require.InDelta(t, before.EffectiveRPM, s.EffectiveRPM, 1e-9, "no further back-off")
			require.False(t, s.Disabled)
			require.Zero(t, s.InFlight)
			require.InDelta(t, before.TokensAvailable, s.TokensAvailable, 5, "tokens refunded")
			require.InDelta(t, before.RequestsAvailable-1, s.RequestsAvailable, 0.05, "request kept")
		})
	}
}

func mustAcquire(t *testing.T, p *Pool, r llm.Route, est int) *Lease {
	t.Helper()
	l, err := p.Acquire(context.Background(), r, est)
	require.NoError(t, err)
	return l
}

func TestSettle(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	const tpm = 6000 // refills 0.1 token per ms
	tests := []struct {
		name     string
		est      int
		settle   func(p *Pool, l *Lease) error
		wantUsed float64
	}{
		{"refund", 1000, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 150, OutputTokens: 50}, llm.RateLimit{})
		}, 200},
		{"charge", 1000, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 1000, OutputTokens: 500}, llm.RateLimit{})
		}, 1500},
		{"no usage reported keeps the estimate", 1000, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{}, llm.RateLimit{})
		}, 1000},
		{"release refunds all", 1000, func(p *Pool, l *Lease) error { return p.Release(ctx, l) }, 0},
		{"429 keeps the reservation", 1000, func(p *Pool, l *Lease) error { return p.Failure(ctx, l, Cool, rateLimited(0)) }, 1000},
		{"refund refunds all", 1000, func(p *Pool, l *Lease) error { return p.Failure(ctx, l, Refund, errors.New("boom")) }, 0},
		{"return refunds all", 1000, func(p *Pool, l *Lease) error { return p.Return(ctx, l) }, 0},
		{"charge into debt", 5000, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 8000}, llm.RateLimit{})
		}, 8000},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := New(ctx, rdb, minuteBuckets(Config{Keys: []Key{key("a", haiku, 600, tpm)}, Prefix: fmt.Sprintf("test:settle:%d:", i)}), nil)
			require.NoError(t, err)
			l := mustAcquire(t, p, haiku, tt.est)
			require.InDelta(t, tpm-tt.est, snap(t, p)[0].TokensAvailable, 5, "reserved at acquire")
			require.NoError(t, tt.settle(p, l))
			s := snap(t, p)[0]
			require.InDelta(t, tpm-tt.wantUsed, s.TokensAvailable, 5)
			require.Zero(t, s.InFlight)
			require.ErrorIs(t, p.Success(ctx, l, llm.Usage{InputTokens: 1}, llm.RateLimit{}), ErrSettled)
			require.NoError(t, p.Release(ctx, l), "Release after a settlement is a no-op")
			require.InDelta(t, s.TokensAvailable, snap(t, p)[0].TokensAvailable, 5, "no second refund")
		})
	}

	// A Bedrock key of a Claude 4-series model settles its output tokens
	// five times over (Bedrock's token burndown rate): 150 in + 5 × 50 out.
	t.Run("output burndown", func(t *testing.T) {
		t.Parallel()
		k := key("b", haiku, 600, tpm)
		k.OutputBurndown = 5
		p, err := New(ctx, rdb, minuteBuckets(Config{Keys: []Key{k}, Prefix: "test:settle:burndown:"}), nil)
		require.NoError(t, err)
		l := mustAcquire(t, p, haiku, 1000)
		require.NoError(t, p.Success(ctx, l, llm.Usage{InputTokens: 150, OutputTokens: 50}, llm.RateLimit{}))
		require.InDelta(t, tpm-400, snap(t, p)[0].TokensAvailable, 5, "output counted five times")
	})

	// An OpenAI key keeps what it was charged at admission: OpenAI counts
	// max_tokens against TPM and refunds nothing. Were the pool to refund
	// the unused max_tokens here, the "no refund" cases would find about
	// 800 tokens more than the provider has.
	admission := []struct {
		name     string
		settle   func(p *Pool, l *Lease) error
		wantUsed float64
	}{
		{"no refund", func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 150, OutputTokens: 50}, llm.RateLimit{})
		}, 1000},
		{"charge above the estimate", func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 1000, OutputTokens: 500}, llm.RateLimit{})
		}, 1500},
		{"abandoned call keeps the charge", func(p *Pool, l *Lease) error { return p.Release(ctx, l) }, 1000},
		{"call never made gives it back", func(p *Pool, l *Lease) error { return p.Return(ctx, l) }, 0},
		{"refused call gives it back", func(p *Pool, l *Lease) error { return p.Failure(ctx, l, Refund, errors.New("boom")) }, 0},
		{"headers lower the level below the charge", func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 150, OutputTokens: 50},
				llm.RateLimit{Known: true, TokensLimit: tpm, TokensRemaining: 3000})
		}, tpm - 3000},
	}
	for i, tt := range admission {
		t.Run("admission/"+tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := New(ctx, rdb, minuteBuckets(Config{Keys: []Key{key("o", mini, 600, tpm)}, Prefix: fmt.Sprintf("test:settle:adm:%d:", i)}), nil)
			require.NoError(t, err)
			require.Equal(t, MeterAdmission, p.cfg.Keys[0].Metering)
			l := mustAcquire(t, p, mini, 1000)
			require.NoError(t, tt.settle(p, l))
			s := snap(t, p)[0]
			require.InDelta(t, tpm-tt.wantUsed, s.TokensAvailable, 5)
			require.Zero(t, s.InFlight)
		})
	}

	t.Run("debt delays the next grant", func(t *testing.T) {
		t.Parallel()
		p, err := New(ctx, rdb, minuteBuckets(Config{Keys: []Key{key("a", haiku, 600, tpm)}, Prefix: "test:settle:debt:"}), nil)
		require.NoError(t, err)
		require.NoError(t, p.Success(ctx, mustAcquire(t, p, haiku, 5000), llm.Usage{InputTokens: 8000}, llm.RateLimit{}))
		// Level ≈ -2000; 100 more tokens need 2100 at 100/s.
		_, err = p.Acquire(ctx, haiku, 100)
		ee := exhausted(t, err)
		require.Equal(t, ReasonTokens, ee.Reason)
		require.InDelta(t, 21, ee.RetryAfter.Seconds(), 0.1)
	})
}

func TestReleaseWithCancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 600, 6000)}})
	l := b.acquire(t, haiku, 3000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, b.pool.Release(ctx, l))
	s := b.state(t, "a")
	require.Zero(t, s.InFlight)
	require.InDelta(t, 6000, s.TokensAvailable, 5)
}

func TestHeaderCorrection(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 100, 10000)}})
	ctx := context.Background()

	// Headers not marked Known are ignored.
	require.NoError(t, b.pool.Success(ctx, b.acquire(t, haiku, 100), llm.Usage{InputTokens: 100},
		llm.RateLimit{RequestsLimit: 100, RequestsRemaining: 1, TokensLimit: 10000, TokensRemaining: 1}))
	s := b.state(t, "a")
	require.Greater(t, s.RequestsAvailable, 98.0)
	require.Greater(t, s.TokensAvailable, 9890.0)

	// Lower: the buckets follow the provider down.
	require.NoError(t, b.pool.Success(ctx, b.acquire(t, haiku, 100), llm.Usage{InputTokens: 100},
		llm.RateLimit{Known: true, RequestsLimit: 100, RequestsRemaining: 10, TokensLimit: 10000, TokensRemaining: 500}))
	s = b.state(t, "a")
	require.InDelta(t, 10, s.RequestsAvailable, 0.1)
	require.InDelta(t, 500, s.TokensAvailable, 5)

	// Higher: never raised above our own model.
	require.NoError(t, b.pool.Success(ctx, b.acquire(t, haiku, 100), llm.Usage{InputTokens: 100},
		llm.RateLimit{Known: true, RequestsLimit: 100, RequestsRemaining: 90, TokensLimit: 10000, TokensRemaining: 9000}))
	s = b.state(t, "a")
	require.InDelta(t, 9, s.RequestsAvailable, 0.1)
	require.InDelta(t, 400, s.TokensAvailable, 5)

	// A failure's headers lower too: remaining 0 empties the request
	// bucket, although a Refund itself leaves the key alone.
	overloaded := &llm.Error{Class: llm.ClassOverloaded, Provider: llm.ProviderClaude, Status: 529,
		RateLimit: llm.RateLimit{Known: true, RequestsLimit: 100}}
	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 100), Refund, overloaded))
	s = b.state(t, "a")
	require.InDelta(t, 0, s.RequestsAvailable, 0.1)
	require.True(t, s.CoolingUntil.IsZero())
}

func TestLeaseExpiryFreesInFlightSlot(t *testing.T) {
	t.Parallel()
	k := key("a", haiku, 1000, 100000)
	k.MaxInFlight = 1
	b := setup(t, Config{Keys: []Key{k}, LeaseTTL: 300 * time.Millisecond})
	ctx := context.Background()

	dead := b.acquire(t, haiku, 10) // its worker "dies": never settled
	require.Equal(t, 1, b.state(t, "a").InFlight)
	_, err := b.pool.Acquire(ctx, haiku, 10)
	ee := exhausted(t, err)
	require.Equal(t, ReasonInFlight, ee.Reason)
	require.LessOrEqual(t, ee.RetryAfter, 300*time.Millisecond)
	require.Greater(t, ee.RetryAfter, 200*time.Millisecond)

	time.Sleep(ee.RetryAfter) // the lease's expiry is the event awaited
	l := b.acquire(t, haiku, 10)
	require.Equal(t, 1, b.state(t, "a").InFlight)
	members, err := b.rdb.ZRange(ctx, leasesKey(b.cfg.Prefix, "a"), 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{l.ID}, members, "the expired lease was dropped")

	// The late settlement of the expired lease frees nothing of l's.
	require.NoError(t, b.pool.Success(ctx, dead, llm.Usage{InputTokens: 10}, llm.RateLimit{}))
	require.Equal(t, 1, b.state(t, "a").InFlight)
	require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 10}, llm.RateLimit{}))
	require.Zero(t, b.state(t, "a").InFlight)
}

// TestLeaseSetOutlivesReservations: a key's lease set expires only after
// its last lease, also when a grant for now follows a lease reserved
// further ahead (whose expiry is later).
func TestLeaseSetOutlivesReservations(t *testing.T) {
	t.Parallel()
	b := build(t, Config{Keys: []Key{key("a", haiku, 120, 1_000_000)}, Pace: 1, Jitter: NoJitter, LeaseTTL: time.Second})
	ctx := context.Background()
	given := []*Lease{b.acquire(t, haiku, 0), b.acquire(t, haiku, 0)}
	var ahead *Lease
	for range 3 { // 0.5, 1.0 and 1.5 s ahead
		l, err := b.pool.Acquire(ctx, haiku, 0, Within(2*time.Second))
		require.NoError(t, err)
		given, ahead = append(given, l), l
	}
	for _, l := range given[:4] {
		require.NoError(t, b.pool.Return(ctx, l))
	}
	// The returns may not fill the bucket past the reservation still
	// ahead (its debt would be forgotten), so the next grant is ahead too,
	// but sooner than that one.
	l, err := b.pool.Acquire(ctx, haiku, 0, Within(2*time.Second))
	require.NoError(t, err)
	require.Positive(t, l.Delay(), "returns refilled the bucket over a reservation's debt")
	require.True(t, l.ExpiresAt.Before(ahead.ExpiresAt))

	pttl, err := b.rdb.PTTL(ctx, leasesKey(b.cfg.Prefix, "a")).Result()
	require.NoError(t, err)
	require.False(t, b.now(t).Add(pttl).Before(ahead.ExpiresAt), "the set expires before the lease reserved ahead")
}

// drain empties the request or token bucket (or both) of every key of the
// route through the header correction (the provider reporting its own limit
// and nothing remaining), so a test starts from a known, empty state.
func drain(t *testing.T, p *Pool, r llm.Route, requests, tokens bool) {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	for len(seen) < len(p.routes[r]) {
		l := mustAcquire(t, p, r, 0)
		k := p.cfg.Keys[p.byID[l.KeyID]]
		rl := llm.RateLimit{Known: true}
		if requests {
			rl.RequestsLimit = k.RPM
		}
		if tokens {
			rl.TokensLimit = k.TPM
		}
		seen[l.KeyID] = true
		require.NoError(t, p.Success(ctx, l, llm.Usage{}, rl))
	}
}

func TestExhaustedRetryAfterIsAccurate(t *testing.T) {
	t.Parallel()
	// 600 RPM: one request per 100 ms. b is cooling for 2 s.
	b := setup(t, Config{Keys: []Key{key("a", haiku, 600, 1000000), key("b", haiku, 600, 1000000)}})
	ctx := context.Background()
	la, lb := b.acquire(t, haiku, 0), b.acquire(t, haiku, 0)
	require.Equal(t, []string{"a", "b"}, []string{la.KeyID, lb.KeyID})
	require.NoError(t, b.pool.Failure(ctx, lb, Cool, rateLimited(0)))
	require.NoError(t, b.pool.Success(ctx, la, llm.Usage{}, llm.RateLimit{Known: true, RequestsLimit: 600}))
	require.False(t, b.state(t, "b").CoolingUntil.IsZero())

	_, err := b.pool.Acquire(ctx, haiku, 0)
	ee := exhausted(t, err)
	require.Equal(t, ReasonRequests, ee.Reason, "a's refill (100 ms) comes before b's cooldown (2 s)")
	require.LessOrEqual(t, ee.RetryAfter, 100*time.Millisecond)
	require.Greater(t, ee.RetryAfter, 80*time.Millisecond)

	// Half way there is still no room, and the new estimate shrank.
	time.Sleep(ee.RetryAfter / 2)
	_, err = b.pool.Acquire(ctx, haiku, 0)
	ee2 := exhausted(t, err)
	require.Less(t, ee2.RetryAfter, ee.RetryAfter*6/10)

	// Exactly RetryAfter later there is.
	time.Sleep(ee2.RetryAfter)
	require.Equal(t, "a", b.acquire(t, haiku, 0).KeyID)
}

func TestSnapshotAndLogsNeverContainTheKey(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rdb := testenv.Redis(t)
	ctx := context.Background()
	cfg := minuteBuckets(Config{Keys: []Key{key("a", haiku, 100, 10000), key("b", haiku, 100, 10000)}, Prefix: "test:secret:"})
	p, err := New(ctx, rdb, cfg, logger)
	require.NoError(t, err)

	var outputs []string
	l := mustAcquire(t, p, haiku, 100)
	require.Equal(t, secretOf(l.KeyID), l.Cred.APIKey.Reveal(), "the lease carries the real credential")
	outputs = append(outputs, fmt.Sprintf("%v %+v %#v", l, l, l))
	require.NoError(t, p.Success(ctx, l, llm.Usage{InputTokens: 10}, llm.RateLimit{Known: true, RequestsLimit: 100, RequestsRemaining: 3}))
	require.NoError(t, p.Failure(ctx, mustAcquire(t, p, haiku, 100), Cool, rateLimited(time.Second)))
	require.NoError(t, p.Failure(ctx, mustAcquire(t, p, haiku, 100), Disable, &llm.Error{Class: llm.ClassAuth, Provider: llm.ProviderClaude, Status: 401}))
	_, err = p.Acquire(ctx, haiku, 100)
	outputs = append(outputs, err.Error())
	require.NoError(t, p.Enable(ctx, "a"))
	require.NoError(t, p.Disable(ctx, "b", "manual"))

	ss, err := p.Snapshot(ctx)
	require.NoError(t, err)
	js, err := json.Marshal(ss)
	require.NoError(t, err)
	outputs = append(outputs, string(js), fmt.Sprintf("%v %+v %#v", ss, ss, ss), logs.String())

	// Everything the pool wrote to Redis.
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	for _, k := range keys {
		outputs = append(outputs, k)
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "hash":
			outputs = append(outputs, fmt.Sprint(rdb.HGetAll(ctx, k).Val()))
		case "zset":
			outputs = append(outputs, fmt.Sprint(rdb.ZRangeWithScores(ctx, k, 0, -1).Val()))
		default:
			t.Errorf("unexpected Redis key %s of type %s", k, typ)
		}
	}
	for _, out := range outputs {
		for _, id := range []string{"a", "b"} {
			require.NotContains(t, out, secretOf(id))
			require.NotContains(t, out, "TOPSECRET")
		}
	}
	require.Contains(t, logs.String(), "cooling", "the logs were captured")
}

// TestRegistrationKeepsState: a second process starting (New) does not
// refill the buckets; changed limits are taken by every process and clamp
// the levels.
func TestRegistrationKeepsState(t *testing.T) {
	t.Parallel()
	opts := testenv.RedisOptions(t)
	ctx := context.Background()
	newProc := func(rpm int) *Pool {
		c := redis.NewClient(opts)
		t.Cleanup(func() { c.Close() })
		p, err := New(ctx, c, minuteBuckets(Config{Keys: []Key{key("a", haiku, rpm, 100000)}, Prefix: "test:reg:"}), nil)
		require.NoError(t, err)
		return p
	}
	p1 := newProc(60)
	for range 20 {
		mustAcquire(t, p1, haiku, 0)
	}
	p2 := newProc(60)
	require.InDelta(t, 40, snap(t, p2)[0].RequestsAvailable, 0.2)

	p3 := newProc(30)
	s := snap(t, p1)[0]
	require.Equal(t, 30, s.RPM, "p1 sees the limit p3 registered")
	require.InDelta(t, 30, s.RequestsAvailable, 0.01)
	_ = p3
}

func TestReRegistersAfterRedisLosesState(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 60, 1000), key("b", sonnet, 60, 1000)}})
	ctx := context.Background()
	mustAcquire(t, b.pool, haiku, 0)
	require.NoError(t, b.rdb.FlushDB(ctx).Err())
	require.False(t, b.state(t, "a").Registered)

	l := b.acquire(t, haiku, 0)
	require.Equal(t, "a", l.KeyID)
	s := b.state(t, "a")
	require.True(t, s.Registered)
	require.InDelta(t, 59, s.RequestsAvailable, 0.1)
	require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 1}, llm.RateLimit{}))
}

func TestAvailable(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{
		key("h1", haiku, 100, 10000), key("h2", haiku, 100, 10000), key("h3", haiku, 100, 10000),
		key("s1", sonnet, 100, 10000),
	}})
	ctx := context.Background()
	av, err := b.pool.Available(ctx)
	require.NoError(t, err)
	require.Equal(t, map[llm.Route]int{haiku: 3, sonnet: 1}, av)

	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 0), Cool, rateLimited(0)))
	require.NoError(t, b.pool.Disable(ctx, "h3", "test"))
	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, sonnet, 0), Cool, rateLimited(0)))
	av, err = b.pool.Available(ctx)
	require.NoError(t, err)
	require.Equal(t, map[llm.Route]int{haiku: 1, sonnet: 0}, av)
	require.Equal(t, map[llm.Route]int{haiku: 3, sonnet: 1}, b.pool.Routes())
}

func TestSettleForeignLease(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("a", haiku, 100, 10000)}})
	ctx := context.Background()
	err := b.pool.Success(ctx, &Lease{KeyID: "zzz"}, llm.Usage{}, llm.RateLimit{})
	require.ErrorIs(t, err, ErrUnknownKey)
	require.Error(t, b.pool.Release(ctx, nil))
	require.True(t, errors.Is(b.pool.Failure(ctx, &Lease{KeyID: "zzz"}, Refund, nil), ErrUnknownKey))
	require.ErrorIs(t, b.pool.Return(ctx, &Lease{KeyID: "zzz"}), ErrUnknownKey)
	require.Error(t, b.pool.Return(ctx, nil))
}

// Keys with equal headroom share the calls (the tie goes to a random
// rotation, not the first key of the file), and a preferred key (an Azure
// PTU deployment) is taken whenever it has room, whatever the headroom of
// the others.
func TestAcquireSpreadsTiesAndPrefers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Limits so large that every key is always full: every acquire is a tie.
	b := build(t, Config{Keys: []Key{key("a", haiku, 1_000_000, 1_000_000_000), key("b", haiku, 1_000_000, 1_000_000_000),
		key("c", haiku, 1_000_000, 1_000_000_000), key("d", haiku, 1_000_000, 1_000_000_000)}, Prefix: "test:spread:"})
	b.pool.rotate = mrand.N[int]
	count := map[string]int{}
	for range 400 {
		l, err := b.pool.Acquire(ctx, haiku, 10)
		require.NoError(t, err)
		count[l.KeyID]++
		require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 10}, llm.RateLimit{}))
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		// 100 each expected; 50 is over 5 standard deviations below.
		require.Greater(t, count[id], 50, "key %s got %d of 400 calls: %v", id, count[id], count)
	}

	pref := key("p", haiku, 3, 1_000_000) // two requests in its bucket (3 × pace 0.98)
	pref.Preferred = true
	b = build(t, Config{Keys: []Key{key("a", haiku, 600, 1_000_000), pref}, Prefix: "test:prefer:", Window: time.Minute})
	var got []string
	for range 4 {
		l, err := b.pool.Acquire(ctx, haiku, 10)
		require.NoError(t, err)
		got = append(got, l.KeyID)
	}
	require.Equal(t, []string{"p", "p", "a", "a"}, got, "the preferred key first while it has room, then the others")
}

// A provisioned deployment's 429 (Full) is its capacity in use, not an
// overrun: the key waits exactly the Retry-After each time, however many
// come in a row, and its count, pace and request bucket stay as they were;
// without a Retry-After it waits CooldownBase.
func TestFullWaitsTheRetryAfterWithoutEscalating(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{key("ptu", haiku, 600, 300000)}})
	ctx := context.Background()
	before := b.state(t, "ptu")
	const tolerance = 0.1
	for i := range 5 {
		l := b.acquire(t, haiku, 10)
		require.NoError(t, b.pool.Failure(ctx, l, Full, capacityFull(300*time.Millisecond)))
		s := b.state(t, "ptu")
		require.Zero(t, s.Consecutive429s, "429 #%d", i+1)
		require.InDelta(t, 0.3, s.CoolingUntil.Sub(b.now(t)).Seconds(), tolerance, "429 #%d: cooldown", i+1)
		require.Equal(t, before.EffectiveRPM, s.EffectiveRPM, "429 #%d: pace", i+1)
		require.InDelta(t, before.TokensAvailable, s.TokensAvailable, 1, "429 #%d: tokens refunded", i+1)
		require.Greater(t, s.RequestsAvailable, 1.0, "429 #%d: request bucket not emptied", i+1)
		_, err := b.pool.Acquire(ctx, haiku, 10)
		require.Equal(t, ReasonCooling, exhausted(t, err).Reason)
		b.endCooldown(t, "ptu")
	}
	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 10), Full, capacityFull(0)))
	require.InDelta(t, 1, b.state(t, "ptu").CoolingUntil.Sub(b.now(t)).Seconds(), tolerance, "no Retry-After: CooldownBase (1s)")
}

func capacityFull(retryAfter time.Duration) error {
	return &llm.Error{Class: llm.ClassRateLimited, Provider: "azure", Status: 429, Code: llm.CodeCapacityFull, RetryAfter: retryAfter}
}
