package keypool

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/testenv"
)

// Tests of Anthropic's separate input and output token limits (Key.ITPM,
// Key.OTPM; doc.go, "Token metering"). They use whole-minute buckets
// (setup), so a bucket holds its whole limit and refills by 1/60 of it
// per second: nothing refills noticeably while a test runs.

// splitKey is a Claude test key (MeterUsage) with an ITPM and an OTPM and
// request and token limits far above them, so that only the input and
// output buckets can refuse.
func splitKey(id string, itpm, otpm int) Key {
	k := key(id, haiku, 6000, 1_000_000)
	k.ITPM, k.OTPM = itpm, otpm
	return k
}

// acquireSplit asks for one request of in input and out output tokens.
func (b *bundle) acquireSplit(in, out int, opts ...AcquireOption) (*Lease, error) {
	return b.pool.Acquire(context.Background(), haiku, in+out, append([]AcquireOption{Split(in, out)}, opts...)...)
}

// TestOutputBucketRefuses: an OTPM-bound key refuses, or reserves for
// later, a request whose max_tokens the output bucket does not hold,
// although its request and token buckets have plenty of room; the wait is
// the output bucket's refill.
func TestOutputBucketRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{splitKey("a", 1_000_000, 6000)}})
	l, err := b.acquireSplit(100, 5000)
	require.NoError(t, err)
	require.Equal(t, 100, l.EstInput)
	require.Equal(t, 5000, l.EstOutput)
	s := b.state(t, "a")
	// The million-token buckets refill 17 tokens a millisecond.
	require.InDelta(t, 1000, s.OutputTokensAvailable, 1)
	require.InDelta(t, 1_000_000-100, s.InputTokensAvailable, 100)
	require.InDelta(t, 1_000_000-5100, s.TokensAvailable, 100)

	// 4,000 output tokens short at 100 per second: 40 s.
	_, err = b.acquireSplit(100, 5000)
	ee := exhausted(t, err)
	require.Equal(t, ReasonOutputTokens, ee.Reason)
	require.InDelta(t, 40, ee.RetryAfter.Seconds(), 0.5)

	// Within the wait it is reserved for then instead.
	l, err = b.acquireSplit(100, 5000, Within(45*time.Second))
	require.NoError(t, err)
	require.InDelta(t, 40, l.Delay().Seconds(), 0.5)

	// A small answer still fits now, with a small max_tokens.
	require.NoError(t, b.pool.Return(context.Background(), l))
	_, err = b.acquireSplit(100, 900)
	require.NoError(t, err)
}

// TestInputBucketRefuses: likewise for a long prompt on an ITPM-bound key.
func TestInputBucketRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{splitKey("a", 6000, 1_000_000)}})
	_, err := b.acquireSplit(5000, 100)
	require.NoError(t, err)
	_, err = b.acquireSplit(5000, 100)
	ee := exhausted(t, err)
	require.Equal(t, ReasonInputTokens, ee.Reason)
	require.InDelta(t, 40, ee.RetryAfter.Seconds(), 0.5)
}

// TestSplitTooLargeAndUnsplit: an input part above ITPM (or output part
// above OTPM) never fits; an Acquire without Split charges the whole
// estimate to both buckets; a Split that does not add up is refused.
func TestSplitTooLargeAndUnsplit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{splitKey("a", 6000, 2000)}})
	ctx := context.Background()
	_, err := b.acquireSplit(6001, 0)
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = b.acquireSplit(0, 2001)
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = b.pool.Acquire(ctx, haiku, 100, Split(10, 10))
	require.ErrorContains(t, err, "sum to estTokens")

	l, err := b.pool.Acquire(ctx, haiku, 500)
	require.NoError(t, err)
	require.Equal(t, []int{500, 500}, []int{l.EstInput, l.EstOutput})
	s := b.state(t, "a")
	require.InDelta(t, 5500, s.InputTokensAvailable, 1)
	require.InDelta(t, 1500, s.OutputTokensAvailable, 1)
}

// TestSplitSettle: each bucket settles its own side, the way Anthropic
// does: the output estimate (max_tokens) is adjusted to the output
// produced, the input to the input counted. An abandoned call keeps its
// input charge (the provider counted it at admission) and gets its
// output back; a 429 keeps both; a call never made gives both back.
func TestSplitSettle(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	const itpm, otpm = 60000, 12000
	tests := []struct {
		name            string
		admission       bool
		settle          func(p *Pool, l *Lease) error
		wantIn, wantOut float64 // used after the settlement
	}{
		{"success refunds unused output", false, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 900, OutputTokens: 300}, llm.RateLimit{})
		}, 900, 300},
		{"success charges usage above the estimate", false, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 1200, OutputTokens: 4000}, llm.RateLimit{})
		}, 1200, 4000},
		{"no usage reported keeps the estimate", false, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{}, llm.RateLimit{})
		}, 1000, 4000},
		{"release keeps the input", false, func(p *Pool, l *Lease) error { return p.Release(ctx, l) }, 1000, 0},
		{"429 keeps both", false, func(p *Pool, l *Lease) error { return p.Failure(ctx, l, Cool, rateLimited(0)) }, 1000, 4000},
		{"refund gives both back", false, func(p *Pool, l *Lease) error {
			return p.Failure(ctx, l, Refund, errors.New("boom"))
		}, 0, 0},
		{"return gives both back", false, func(p *Pool, l *Lease) error { return p.Return(ctx, l) }, 0, 0},
		{"admission metering keeps the charge", true, func(p *Pool, l *Lease) error {
			return p.Success(ctx, l, llm.Usage{InputTokens: 900, OutputTokens: 300}, llm.RateLimit{})
		}, 1000, 4000},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k := splitKey("a", itpm, otpm)
			if tt.admission {
				k.Metering = MeterAdmission
			}
			p, err := New(ctx, rdb, minuteBuckets(Config{Keys: []Key{k}, Prefix: fmt.Sprintf("test:split:%d:", i)}), nil)
			require.NoError(t, err)
			l, err := p.Acquire(ctx, haiku, 5000, Split(1000, 4000))
			require.NoError(t, err)
			require.NoError(t, tt.settle(p, l))
			s := snap(t, p)[0]
			// A 429 also slows the key 10% (its back-off factor), which
			// shrinks every bucket: a level above the new capacity is cut
			// to it.
			require.InDelta(t, min(s.InputTokensCapacity, itpm-tt.wantIn), s.InputTokensAvailable, 20, "input") // refills 1 a ms
			require.InDelta(t, min(s.OutputTokensCapacity, otpm-tt.wantOut), s.OutputTokensAvailable, 20, "output")
		})
	}
}

// TestSplitHeaderCorrection: anthropic-ratelimit-{input,output}-tokens-*
// lower the key's input and output buckets, never raise them, and a
// smaller reported limit becomes the bucket's limit. On a key with both
// limits the combined tokens-* (Anthropic's most restrictive limit) does
// not lower the combined bucket: each of its parts is metered apart.
func TestSplitHeaderCorrection(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{splitKey("a", 60000, 12000)}})
	ctx := context.Background()
	success := func(rl llm.RateLimit) {
		t.Helper()
		l, err := b.acquireSplit(100, 100)
		require.NoError(t, err)
		require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 100, OutputTokens: 100}, rl))
	}

	success(llm.RateLimit{Known: true, InputTokensLimit: 60000, InputTokensRemaining: 2000,
		OutputTokensLimit: 12000, OutputTokensRemaining: 500, TokensLimit: 12000, TokensRemaining: 500})
	s := b.state(t, "a")
	require.InDelta(t, 2000, s.InputTokensAvailable, 20)
	// The output bucket refills 200 tokens/s: 20 is 100 ms of a loaded
	// machine between the call and the read.
	require.InDelta(t, 500, s.OutputTokensAvailable, 20)
	require.InDelta(t, 1_000_000-200, s.TokensAvailable, 100, "tokens-* lowered the combined bucket")
	require.InDelta(t, 1_000_000, s.EffectiveTPM, 1)

	// Higher remaining counts raise nothing.
	success(llm.RateLimit{Known: true, InputTokensLimit: 60000, InputTokensRemaining: 50000,
		OutputTokensLimit: 12000, OutputTokensRemaining: 11000})
	s = b.state(t, "a")
	require.InDelta(t, 1900, s.InputTokensAvailable, 20)
	require.InDelta(t, 400, s.OutputTokensAvailable, 20)

	// A smaller reported output limit becomes the bucket's: its capacity
	// follows (whole-minute buckets hold the whole limit).
	success(llm.RateLimit{Known: true, OutputTokensLimit: 8000})
	s = b.state(t, "a")
	require.InDelta(t, 8000, s.OutputTokensCapacity, 1)
	require.InDelta(t, 60000, s.InputTokensCapacity, 1)
	require.InDelta(t, 0, s.OutputTokensAvailable, 20, "a remaining of 0 with its limit empties the bucket")
}

// TestCombinedHeadersWithOneSplitLimit: a key with only an OTPM still
// takes tokens-* for its combined bucket, since nothing else meters the
// input side; its output bucket follows output-tokens-*.
func TestCombinedHeadersWithOneSplitLimit(t *testing.T) {
	t.Parallel()
	k := splitKey("a", 0, 12000)
	b := setup(t, Config{Keys: []Key{k}})
	ctx := context.Background()
	l, err := b.acquireSplit(100, 100)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 100, OutputTokens: 100},
		llm.RateLimit{Known: true, TokensLimit: 1_000_000, TokensRemaining: 3000, OutputTokensLimit: 12000, OutputTokensRemaining: 700}))
	s := b.state(t, "a")
	// Set to 3000, then refilled at 1,000,000 a minute (17 a millisecond)
	// for as long as the write and the read took, however loaded the
	// machine: bounded by the time measured around them.
	refilled := 1_000_000 / 60_000.0 * float64(time.Since(start).Milliseconds()+1)
	require.GreaterOrEqual(t, s.TokensAvailable, 2999.0)
	require.LessOrEqual(t, s.TokensAvailable, 3000+refilled)
	require.InDelta(t, 700, s.OutputTokensAvailable, 2)
	require.Zero(t, s.InputTokensCapacity)
}

// TestLineCountsOutputBucket: the line grants only what every bucket of
// its keys can serve. Here the requests bucket holds thousands but the
// output bucket one request's max_tokens, so the second waiter in line
// waits for the first although it asks first.
func TestLineCountsOutputBucket(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: []Key{splitKey("k1", 1_000_000, 600)}})
	ctx := context.Background()
	// Empty the output bucket, so both waiters register refused.
	_, err := b.acquireSplit(0, 600)
	require.NoError(t, err)
	first, second := normal(1), normal(2)
	for _, w := range []Waiter{first, second} {
		_, err := b.acquireSplit(10, 400, InLine(w))
		require.Equal(t, ReasonOutputTokens, exhausted(t, err).Reason, w.ID)
	}
	// Room for one request's output comes back.
	require.NoError(t, b.rdb.HSet(ctx, stateKey(b.cfg.Prefix, "k1"), "ol", 600).Err())
	_, err = b.acquireSplit(10, 400, InLine(second))
	exhausted(t, err)
	l, err := b.acquireSplit(10, 400, InLine(first))
	require.NoError(t, err, "the first waiter was refused its turn")
	require.Equal(t, "k1", l.KeyID)
}

// TestRegisterSplitLimits: a key registered before it had an OTPM starts
// its output bucket full when the limit is configured, and loses it when
// the limit is taken out again.
func TestRegisterSplitLimits(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	cfg := minuteBuckets(Config{Keys: []Key{key("a", haiku, 600, 100000)}, Prefix: "test:split:reg:"})
	p, err := New(ctx, rdb, cfg, nil)
	require.NoError(t, err)
	mustAcquire(t, p, haiku, 1000)

	cfg.Keys[0].OTPM = 8000
	p, err = New(ctx, rdb, cfg, nil)
	require.NoError(t, err)
	s := snap(t, p)[0]
	require.Equal(t, 8000, s.OTPM)
	require.InDelta(t, 8000, s.OutputTokensAvailable, 1)
	require.InDelta(t, 99000, s.TokensAvailable, 200, "registration kept the token level")

	cfg.Keys[0].OTPM = 0
	p, err = New(ctx, rdb, cfg, nil)
	require.NoError(t, err)
	s = snap(t, p)[0]
	require.Zero(t, s.OTPM)
	require.Zero(t, s.OutputTokensCapacity)
	// Without the limit a large max_tokens fits again.
	_, err = p.Acquire(ctx, haiku, 20000, Split(1000, 19000))
	require.NoError(t, err)
}
