package keypool

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/llm"
)

// Tests of the pacing model (doc.go, "Bucket model"): burst windows, the
// pace margin, reservations ahead (Within), token debt, the provider's
// headers and the 429 back-off factor. Nothing sleeps: a time the model
// promises is checked exactly against Redis TIME read around the call
// (see next), and a bucket that must be full again is refilled by editing
// the stored state (fill, endCooldown).

// slack absorbs the µs rounding of the scripts (a reservation's time is
// rounded up to the next µs) and float error on µs timestamps.
const slack = 3 * time.Microsecond

// seconds converts a float number of seconds to a Duration.
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// next asks for one request of est tokens, reserving up to ahead
// (Within), from a route whose key has room at Redis time slot per the
// model, and checks the answer exactly: a grant for max(slot, grant time)
// when slot is at most ahead away, else a refusal for reason with
// RetryAfter = slot - now - ahead (when the caller may reserve it), at
// least 1 µs. now is bracketed by Redis TIME read before and
// after the call, so the check holds however slowly the test runs: a run
// too slow to see the refusal the model predicts still checks the grant it
// gets. It returns the lease, nil when refused.
func (b *bundle) next(t *testing.T, r llm.Route, est int, ahead time.Duration, slot time.Time, reason string) *Lease {
	t.Helper()
	t1 := b.now(t)
	l, err := b.pool.Acquire(context.Background(), r, est, Within(ahead))
	t2 := b.now(t)
	if err == nil {
		require.False(t, l.GrantedAt.Before(t1) || l.GrantedAt.After(t2), "grant time outside the call")
		require.LessOrEqual(t, slot.Sub(l.GrantedAt), ahead+slack, "granted although room comes only at %s", slot)
		want := slot
		if l.GrantedAt.After(want) {
			want = l.GrantedAt
		}
		require.InDelta(t, 0, l.NotBefore.Sub(want).Seconds(), slack.Seconds(), "NotBefore %s, want %s", l.NotBefore, want)
		require.Equal(t, l.NotBefore.Sub(l.GrantedAt), l.Delay())
		require.Equal(t, l.NotBefore.Add(b.cfg.LeaseTTL), l.ExpiresAt, "the lease lives LeaseTTL from its call")
		return l
	}
	ee := exhausted(t, err)
	require.Equal(t, reason, ee.Reason)
	require.Greater(t, slot.Sub(t1), ahead-slack, "refused although room comes at %s", slot)
	require.GreaterOrEqual(t, ee.RetryAfter, max(slot.Sub(t2)-ahead, time.Microsecond)-slack, "RetryAfter")
	require.LessOrEqual(t, ee.RetryAfter, max(slot.Sub(t1)-ahead, time.Microsecond)+slack, "RetryAfter")
	return nil
}

// fill refills a key's buckets, as if it had idled: the next read clamps
// the levels to the capacities.
func (b *bundle) fill(t *testing.T, id string) {
	t.Helper()
	require.NoError(t, b.rdb.HSet(context.Background(), stateKey(b.cfg.Prefix, id), "rl", 1e12, "tl", 1e12).Err())
}

// storedTS is the Redis time (µs) at which a key's levels were last
// written, e.g. the moment a drain emptied them.
func (b *bundle) storedTS(t *testing.T, id string) time.Time {
	t.Helper()
	us, err := b.rdb.HGet(context.Background(), stateKey(b.cfg.Prefix, id), "ts").Float64()
	require.NoError(t, err)
	return time.UnixMicro(int64(us))
}

// TestBurstWindow: a key's request bucket holds a window's share of its
// RPM times the pace, and refills at RPM × pace per minute.
func TestBurstWindow(t *testing.T) {
	t.Parallel()

	// The defaults (1 s window, pace 0.98, jitter 50 ms) give a 120-RPM
	// key a bucket of 1.96 requests refilling 1.96 per second, of which a
	// grant leaves 50 ms of refill (0.098) as headroom: one call at once,
	// the second (0.04 + 0.098)/1.96 s = 70.4 ms later, the third 1/1.96 s
	// after that.
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		b := build(t, Config{Keys: []Key{key("a", haiku, 120, 60000)}})
		s := b.state(t, "a")
		require.InDelta(t, 1.96, s.RequestsCapacity, 1e-9)
		require.InDelta(t, 117.6, s.EffectiveRPM, 1e-9)
		require.InDelta(t, 980, s.TokensCapacity, 1e-9)
		require.InDelta(t, 58800, s.EffectiveTPM, 1e-9)

		l1 := b.acquire(t, haiku, 0)
		require.Zero(t, l1.Delay())
		second := l1.GrantedAt.Add(seconds((0.04 + 0.05*1.96) / 1.96))
		b.next(t, haiku, 0, 0, second, ReasonRequests)
		l2 := b.next(t, haiku, 0, time.Second, second, ReasonRequests)
		require.NotNil(t, l2)
		b.next(t, haiku, 0, 0, second.Add(seconds(1/1.96)), ReasonRequests)
	})

	// With Pace 1 the bucket holds the provider's whole window: 2 at
	// once, then one every 500 ms.
	t.Run("pace 1", func(t *testing.T) {
		t.Parallel()
		b := build(t, Config{Keys: []Key{key("a", haiku, 120, 60000)}, Pace: 1, Jitter: NoJitter})
		s := b.state(t, "a")
		require.InDelta(t, 2, s.RequestsCapacity, 1e-9)
		require.InDelta(t, 120, s.EffectiveRPM, 1e-9)
		require.InDelta(t, 1000, s.TokensCapacity, 1e-9)

		l1 := b.acquire(t, haiku, 0)
		require.Zero(t, b.acquire(t, haiku, 0).Delay())
		b.next(t, haiku, 0, 0, l1.GrantedAt.Add(500*time.Millisecond), ReasonRequests)
		require.NotNil(t, b.next(t, haiku, 0, time.Second, l1.GrantedAt.Add(500*time.Millisecond), ReasonRequests))
		b.next(t, haiku, 0, 0, l1.GrantedAt.Add(time.Second), ReasonRequests)
	})

	// A one-minute window is the whole-minute bucket: 120 at once.
	t.Run("window of a minute", func(t *testing.T) {
		t.Parallel()
		b := build(t, Config{Keys: []Key{key("a", haiku, 120, 60000)}, Window: time.Minute, Pace: 1, Jitter: NoJitter})
		require.InDelta(t, 120, b.state(t, "a").RequestsCapacity, 1e-9)
		l1 := b.acquire(t, haiku, 0)
		for range 119 {
			require.Zero(t, b.acquire(t, haiku, 0).Delay())
		}
		b.next(t, haiku, 0, 0, l1.GrantedAt.Add(500*time.Millisecond), ReasonRequests)
	})

	// A key's own Window overrides the pool's; a key under 60 RPM still
	// holds one request.
	t.Run("per-key window and the one-request floor", func(t *testing.T) {
		t.Parallel()
		long := key("long", sonnet, 120, 60000)
		long.Window = 10 * time.Second
		b := build(t, Config{Keys: []Key{key("slow", haiku, 30, 30), long}, Pace: 1})
		ss := snap(t, b.pool)
		require.InDelta(t, 1, ss[0].RequestsCapacity, 1e-9, "30 RPM × 1 s is half a request: floored to one")
		require.InDelta(t, 0.5, ss[0].TokensCapacity, 1e-9, "tokens have no floor")
		require.InDelta(t, 20, ss[1].RequestsCapacity, 1e-9)
		// A provider bucket under two requests builds no reserve, so grants
		// are spaced the arrival jitter (50 ms) more than one refill.
		require.InDelta(t, 60/2.05, ss[0].EffectiveRPM, 1e-6)
		l := b.acquire(t, haiku, 0)
		b.next(t, haiku, 0, 0, l.GrantedAt.Add(2050*time.Millisecond), ReasonRequests)
	})
}

// TestWithinReservesInOrder: callers that may wait are given the key's
// next free moments in the order they ask, at exactly the key's pace, and
// a returned reservation's moment goes to the next caller.
func TestWithinReservesInOrder(t *testing.T) {
	t.Parallel()
	b := build(t, Config{Keys: []Key{key("a", haiku, 120, 1_000_000)}, Pace: 1, Jitter: NoJitter}) // 2 requests, 2 per second
	ctx := context.Background()
	l1 := b.acquire(t, haiku, 0)
	b.acquire(t, haiku, 0) // the bucket is empty now

	// The k-th reservation is for the moment the k-th request refills:
	// 0.5 s, 1.0 s, 1.5 s, 2.0 s after the bucket was full.
	var ls []*Lease
	for k := 1; k <= 4; k++ {
		slot := l1.GrantedAt.Add(time.Duration(k) * 500 * time.Millisecond)
		l := b.next(t, haiku, 0, 2*time.Second, slot, ReasonRequests)
		require.NotNil(t, l, "reservation %d", k)
		t.Logf("reservation %d: Delay %s", k, l.Delay())
		ls = append(ls, l)
	}
	require.Equal(t, 6, b.state(t, "a").InFlight, "reserved leases hold their slots")

	// The fifth would be 2.5 s away: beyond the horizon.
	if l := b.next(t, haiku, 0, 2*time.Second, l1.GrantedAt.Add(2500*time.Millisecond), ReasonRequests); l != nil {
		ls = append(ls, l) // a run too slow to see the refusal
	}

	// The last caller gives up: its moment goes to the next one.
	last := ls[len(ls)-1]
	require.NoError(t, b.pool.Return(ctx, last))
	l := b.next(t, haiku, 0, 2*time.Second, last.NotBefore, ReasonRequests)
	require.NotNil(t, l)
	require.NoError(t, b.pool.Return(ctx, last), "a second Return is a no-op")
	require.Equal(t, 2+len(ls), b.state(t, "a").InFlight)
}

// TestWithinNeverSkipsACooldownOrTheInFlightCap: a reservation ahead waits
// for refill only; a cooling key or one at MaxInFlight is never reserved.
// Among keys with room within the horizon, the earliest wins.
func TestWithinNeverSkipsACooldownOrTheInFlightCap(t *testing.T) {
	t.Parallel()
	capped := key("capped", sonnet, 120, 100000)
	capped.MaxInFlight = 1
	b := build(t, Config{Pace: 1, Jitter: NoJitter, Keys: []Key{
		key("cooling", haiku, 120, 100000), capped,
		key("c60", mini, 60, 100000), key("c120", mini, 120, 100000),
	}})
	ctx := context.Background()

	require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 0), Cool, rateLimited(0)))
	_, err := b.pool.Acquire(ctx, haiku, 0, Within(10*time.Minute))
	ee := exhausted(t, err)
	require.Equal(t, ReasonCooling, ee.Reason)
	require.InDelta(t, 2, ee.RetryAfter.Seconds(), 0.25)

	b.acquire(t, sonnet, 0)
	_, err = b.pool.Acquire(ctx, sonnet, 0, Within(10*time.Minute))
	require.Equal(t, ReasonInFlight, exhausted(t, err).Reason)

	// Both mini keys empty: c60 refills a request in 1 s, c120 in 0.5 s.
	drain(t, b.pool, mini, true, false)
	l := b.next(t, mini, 0, 2*time.Second, b.storedTS(t, "c120").Add(500*time.Millisecond), ReasonRequests)
	require.NotNil(t, l)
	require.Equal(t, "c120", l.KeyID)
}

// TestTokenDebt: a request larger than a window's tokens goes from a full
// bucket and leaves a debt that later requests wait out, as the providers
// meter it.
func TestTokenDebt(t *testing.T) {
	t.Parallel()
	// 60,000 TPM: 1,000 tokens per 1 s window, 1,000 per second.
	b := build(t, Config{Keys: []Key{key("a", haiku, 6000, 60000)}, Pace: 1, Jitter: NoJitter})
	ctx := context.Background()
	require.InDelta(t, 1000, b.state(t, "a").TokensCapacity, 1e-9)

	_, err := b.pool.Acquire(ctx, haiku, 60001)
	require.ErrorIs(t, err, ErrTooLarge, "above the per-minute limit nothing helps")

	l1 := b.acquire(t, haiku, 5000)
	require.Zero(t, l1.Delay())
	level := b.state(t, "a").TokensAvailable
	elapsed := b.now(t).Sub(l1.GrantedAt)
	require.GreaterOrEqual(t, level, -4000.0)
	require.LessOrEqual(t, level, -4000+1000*elapsed.Seconds()+1e-6)

	// 10 tokens wait for the debt and themselves: 4.01 s.
	slot := l1.GrantedAt.Add(4010 * time.Millisecond)
	b.next(t, haiku, 10, 0, slot, ReasonTokens)
	require.NotNil(t, b.next(t, haiku, 10, 5*time.Second, slot, ReasonTokens))
	// Another large request waits for a full bucket: 1 s more.
	b.next(t, haiku, 5000, 0, slot.Add(time.Second), ReasonTokens)
}

// TestHeadersCorrectTheKey: the provider's rate-limit headers lower the
// effective limit and the bucket levels, never raising them above our
// model.
func TestHeadersCorrectTheKey(t *testing.T) {
	t.Parallel()
	short := key("short", mini, 120, 120000)
	short.Window = time.Second
	b := build(t, Config{Window: time.Minute, Pace: 1, Keys: []Key{
		key("limit", haiku, 120, 120000), key("reset", sonnet, 120, 120000), short,
	}})
	ctx := context.Background()
	settle := func(r llm.Route, rl llm.RateLimit) KeyState {
		t.Helper()
		l := b.acquire(t, r, 0)
		rl.Known = true
		require.NoError(t, b.pool.Success(ctx, l, llm.Usage{}, rl))
		return b.state(t, l.KeyID)
	}

	// A reported limit below ours becomes the key's limit, and the
	// capacity follows.
	s := settle(haiku, llm.RateLimit{RequestsLimit: 60, RequestsRemaining: 100, TokensLimit: 60000, TokensRemaining: 59000})
	require.InDelta(t, 60, s.EffectiveRPM, 1e-9)
	require.InDelta(t, 60, s.RequestsCapacity, 1e-9)
	require.InDelta(t, 60, s.RequestsAvailable, 1e-9, "the level is clamped to the smaller bucket")
	require.InDelta(t, 60000, s.EffectiveTPM, 1e-9)
	require.InDelta(t, 59000, s.TokensAvailable, 100)
	require.Equal(t, 120, s.RPM, "the configured limit stays")

	// A report of our own limit ends the correction; the level is not
	// raised.
	s = settle(haiku, llm.RateLimit{RequestsLimit: 120, RequestsRemaining: 119, TokensLimit: 120000, TokensRemaining: 119000})
	require.InDelta(t, 120, s.EffectiveRPM, 1e-9)
	require.InDelta(t, 120, s.RequestsCapacity, 1e-9)
	require.InDelta(t, 120000, s.EffectiveTPM, 1e-9)
	require.InDelta(t, 59, s.RequestsAvailable, 0.5)

	// A higher report never lifts the key above its configuration.
	s = settle(haiku, llm.RateLimit{RequestsLimit: 240, RequestsRemaining: 200})
	require.InDelta(t, 120, s.EffectiveRPM, 1e-9)
	require.InDelta(t, 58, s.RequestsAvailable, 0.5)

	// Remaining 0 empties the bucket.
	s = settle(haiku, llm.RateLimit{RequestsLimit: 120})
	require.InDelta(t, 0, s.RequestsAvailable, 0.5)
	require.GreaterOrEqual(t, s.RequestsAvailable, 0.0)

	// A reset 30 s away on a limit of 120 per minute means the provider's
	// bucket holds 60: ours (119 left) is lowered to that.
	in := func(d time.Duration) time.Time { return time.Now().Add(d) }
	s = settle(sonnet, llm.RateLimit{RequestsLimit: 120, RequestsRemaining: 100, RequestsReset: in(30 * time.Second)})
	require.InDelta(t, 60, s.RequestsAvailable, 0.5)
	// A reset over a minute fits no per-minute bucket and is ignored;
	// remaining still counts.
	s = settle(sonnet, llm.RateLimit{RequestsLimit: 120, RequestsRemaining: 5, RequestsReset: in(2 * time.Minute)})
	require.InDelta(t, 5, s.RequestsAvailable, 0.5)

	// On a 1 s window the same report changes nothing: the bucket (2, 1
	// after this call) is already below 60.
	s = settle(mini, llm.RateLimit{RequestsLimit: 120, RequestsRemaining: 100, RequestsReset: in(30 * time.Second)})
	require.InDelta(t, 2, s.RequestsCapacity, 1e-9)
	require.GreaterOrEqual(t, s.RequestsAvailable, 1.0)
	// There a reported limit of 60 halves the window too: one request,
	// and a bucket that small spaces its grants by the 50 ms jitter too.
	// (Refilled first: the jitter headroom holds the bucket's second
	// request back 50 ms.)
	b.fill(t, "short")
	s = settle(mini, llm.RateLimit{RequestsLimit: 60, RequestsRemaining: 59})
	require.InDelta(t, 60/1.05, s.EffectiveRPM, 1e-6)
	require.InDelta(t, 1, s.RequestsCapacity, 1e-9)
	b.fill(t, "short")
	s = settle(mini, llm.RateLimit{RequestsLimit: 120, RequestsRemaining: 119})
	require.InDelta(t, 120, s.EffectiveRPM, 1e-9)
	require.InDelta(t, 2, s.RequestsCapacity, 1e-9)
}

// TestBackOff: a 429 on a paced key slows it 10% (to half at most); each
// success gives back 1% of the paced rate, never more than the paced rate.
func TestBackOff(t *testing.T) {
	t.Parallel()
	ahead := key("ahead", sonnet, 120, 120000)
	ahead.Window = time.Second
	b := build(t, Config{Keys: []Key{key("a", haiku, 120, 120000), ahead}, Window: time.Minute, Pace: 0.98})
	ctx := context.Background()
	const paced = 120 * 0.98
	s := b.state(t, "a")
	require.InDelta(t, paced, s.EffectiveRPM, 1e-9)

	l1, l2 := b.acquire(t, haiku, 0), b.acquire(t, haiku, 0)
	require.NoError(t, b.pool.Failure(ctx, l1, Cool, rateLimited(0)))
	s = b.state(t, "a")
	require.InDelta(t, paced*0.9, s.EffectiveRPM, 1e-9)
	require.InDelta(t, paced*0.9, s.RequestsCapacity, 1e-9)
	require.InDelta(t, 120000*0.98*0.9, s.EffectiveTPM, 1e-9)
	require.InDelta(t, 0, s.RequestsAvailable, 0.5, "a 429 empties the request bucket")
	// A 429 on a call already in flight is the same overload: no second
	// slow-down.
	require.NoError(t, b.pool.Failure(ctx, l2, Cool, rateLimited(0)))
	require.InDelta(t, paced*0.9, b.state(t, "a").EffectiveRPM, 1e-9)

	b.endCooldown(t, "a")
	for i := 1; i <= 10; i++ {
		require.NoError(t, b.pool.Success(ctx, b.acquire(t, haiku, 0), llm.Usage{}, llm.RateLimit{}))
		require.InDelta(t, paced*(0.9+0.01*float64(i)), b.state(t, "a").EffectiveRPM, 1e-9, "success %d", i)
	}
	require.NoError(t, b.pool.Success(ctx, b.acquire(t, haiku, 0), llm.Usage{}, llm.RateLimit{}))
	require.InDelta(t, paced, b.state(t, "a").EffectiveRPM, 1e-9, "never above the paced rate")

	for range 8 { // 0.9^7 < 0.5
		require.NoError(t, b.pool.Failure(ctx, b.acquire(t, haiku, 0), Cool, rateLimited(0)))
		b.endCooldown(t, "a")
	}
	require.InDelta(t, paced/2, b.state(t, "a").EffectiveRPM, 1e-9, "slowed to half at most")

	// A 429 empties the request bucket, but never forgives a debt: the
	// calls reserved ahead still count.
	l0 := b.acquire(t, sonnet, 0)
	for range 3 {
		_, err := b.pool.Acquire(ctx, sonnet, 0, Within(2*time.Second))
		require.NoError(t, err)
	}
	require.Less(t, b.state(t, "ahead").RequestsAvailable, -2.0)
	require.NoError(t, b.pool.Failure(ctx, l0, Cool, rateLimited(0)))
	require.Less(t, b.state(t, "ahead").RequestsAvailable, -1.5)
}

// TestReturnAndRelease: Return gives back the request and the tokens of a
// call never made; Release gives back only the tokens of a call abandoned
// mid-way (the provider may have counted it).
func TestReturnAndRelease(t *testing.T) {
	t.Parallel()
	// 6 RPM, 600 TPM on minute buckets: 0.1 request and 10 tokens refill
	// per second, well inside the tolerances below.
	b := setup(t, Config{Keys: []Key{key("a", haiku, 6, 600)}})
	ctx := context.Background()
	check := func(requests, tokens float64, msg string) {
		t.Helper()
		s := b.state(t, "a")
		require.InDelta(t, requests, s.RequestsAvailable, 0.05, "requests: "+msg)
		require.InDelta(t, tokens, s.TokensAvailable, 5, "tokens: "+msg)
		require.Zero(t, s.InFlight, msg)
	}

	require.NoError(t, b.pool.Release(ctx, b.acquire(t, haiku, 100)))
	check(5, 600, "release keeps the request")

	l := b.acquire(t, haiku, 100)
	require.NoError(t, b.pool.Return(ctx, l))
	check(5, 600, "return gives back both")
	require.NoError(t, b.pool.Return(ctx, l))
	check(5, 600, "a second return is a no-op")
	require.ErrorIs(t, b.pool.Success(ctx, l, llm.Usage{}, llm.RateLimit{}), ErrSettled)

	l = b.acquire(t, haiku, 100)
	require.NoError(t, b.pool.Success(ctx, l, llm.Usage{InputTokens: 100}, llm.RateLimit{}))
	require.NoError(t, b.pool.Return(ctx, l))
	check(4, 500, "return after a settlement is a no-op")
}
