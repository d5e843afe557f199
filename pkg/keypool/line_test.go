package keypool

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/priority"
)

// lineBundle is a pool of one key of rpm requests per minute in
// whole-minute buckets, so nothing refills noticeably during a test: each
// grant the tests see comes from a fill they made.
func lineBundle(t *testing.T, rpm int) *bundle {
	t.Helper()
	return setup(t, Config{Keys: []Key{key("k1", haiku, rpm, 1_000_000)}})
}

// ask asks for one request as w, reserving nothing ahead, and reports
// whether it was granted; a refusal must be a soft one (the line or the
// bucket), never an error.
func (b *bundle) ask(t *testing.T, w Waiter, ahead time.Duration) (*Lease, *ExhaustedError) {
	t.Helper()
	l, err := b.pool.Acquire(context.Background(), haiku, 10, Within(ahead), InLine(w))
	if err == nil {
		return l, nil
	}
	return nil, exhausted(t, err)
}

func (b *bundle) drain(t *testing.T) {
	t.Helper()
	for {
		l, err := b.pool.Acquire(context.Background(), haiku, 10)
		if err != nil {
			exhausted(t, err)
			return
		}
		require.NoError(t, b.pool.Release(context.Background(), l))
	}
}

// normal is NORMAL waiter i of a test: accepted i ms after the others' start.
func normal(i int) Waiter {
	return Waiter{ID: fmt.Sprintf("w%d", i), Priority: priority.Normal,
		Since: time.UnixMilli(1_700_000_000_000).Add(time.Duration(i) * time.Millisecond)}
}

// TestLineServesMostUrgentThenOldest: whoever asks first, a freed request
// goes to the most urgent waiter, then to the oldest of a priority. This
// is what keeps a CRITICAL request from waiting for a key behind a LOW
// flood, and a LOW request from being overtaken by younger ones.
func TestLineServesMostUrgentThenOldest(t *testing.T) {
	b := lineBundle(t, 1)
	b.drain(t)
	t0 := time.UnixMilli(1_700_000_000_000)
	oldLow := Waiter{ID: "low-old", Priority: priority.Low, Since: t0}
	newLow := Waiter{ID: "low-new", Priority: priority.Low, Since: t0.Add(time.Second)}
	crit := Waiter{ID: "crit", Priority: priority.Critical, Since: t0.Add(2 * time.Second)}
	for _, w := range []Waiter{newLow, oldLow, crit} {
		l, ee := b.ask(t, w, 0)
		require.Nil(t, l, "%s granted from an empty bucket", w.ID)
		require.Equal(t, ReasonRequests, ee.Reason)
	}
	line, err := b.pool.Line(context.Background(), haiku)
	require.NoError(t, err)
	require.Equal(t, []string{"crit", "low-old", "low-new"}, line)

	// One request frees: the LOW waiters ask first and are refused.
	b.fill(t, "k1")
	for _, w := range []Waiter{newLow, oldLow} {
		l, ee := b.ask(t, w, 0)
		require.Nil(t, l, "%s took the request the CRITICAL waiter is owed", w.ID)
		require.Equal(t, ReasonRequests, ee.Reason)
	}
	l, _ := b.ask(t, crit, 0)
	require.NotNil(t, l, "the CRITICAL waiter was refused its turn")

	b.fill(t, "k1")
	l, _ = b.ask(t, newLow, 0)
	require.Nil(t, l, "the younger LOW waiter overtook the older one")
	l, _ = b.ask(t, oldLow, 0)
	require.NotNil(t, l)
	b.fill(t, "k1")
	l, _ = b.ask(t, newLow, 0)
	require.NotNil(t, l)
	line, err = b.pool.Line(context.Background(), haiku)
	require.NoError(t, err)
	require.Empty(t, line, "granted waiters leave the line")
}

// TestLineGrantsWithinTheHorizon: as many waiters are granted as the key
// can serve within the reservation horizon, in line order; the one after
// is told to come back when its turn is near, later the further back it
// stands.
func TestLineGrantsWithinTheHorizon(t *testing.T) {
	b := lineBundle(t, 2)
	b.drain(t)
	ws := make([]Waiter, 5)
	for i := range ws {
		ws[i] = normal(i)
		l, _ := b.ask(t, ws[i], 0)
		require.Nil(t, l, "granted from an empty bucket")
	}
	b.fill(t, "k1") // 2 requests now, 2 more per minute
	// The last ones ask first.
	for i := len(ws) - 1; i >= 3; i-- {
		l, ee := b.ask(t, ws[i], 30*time.Second)
		require.Nil(t, l, "waiter %d of 5 granted: the horizon holds 3 requests", i+1)
		require.Equal(t, ReasonRequests, ee.Reason)
	}
	for i := range 3 {
		l, _ := b.ask(t, ws[i], 30*time.Second)
		require.NotNil(t, l, "waiter %d refused within the horizon", i+1)
	}
	// The 4th waits one refill (30 s) from the 3rd's moment, less the
	// horizon; the 5th one refill more.
	_, e4 := b.ask(t, ws[3], 30*time.Second)
	_, e5 := b.ask(t, ws[4], 30*time.Second)
	require.NotNil(t, e4)
	require.NotNil(t, e5)
	require.InDelta(t, 30, e4.RetryAfter.Seconds(), 1, "4th waiter's RetryAfter")
	require.InDelta(t, 30, (e5.RetryAfter - e4.RetryAfter).Seconds(), 1, "one more place is one more refill")
}

// TestLineLeave: a waiter that leaves, or stops asking for LineTTL, no
// longer holds back the waiters behind it.
func TestLineLeave(t *testing.T) {
	b := setup(t, Config{Keys: []Key{key("k1", haiku, 1, 1_000_000)}, LineTTL: 200 * time.Millisecond})
	b.drain(t)
	t0 := time.UnixMilli(1_700_000_000_000)
	first := Waiter{ID: "first", Priority: priority.High, Since: t0}
	second := Waiter{ID: "second", Priority: priority.High, Since: t0.Add(time.Second)}
	third := Waiter{ID: "third", Priority: priority.High, Since: t0.Add(2 * time.Second)}
	for _, w := range []Waiter{first, second, third} {
		l, _ := b.ask(t, w, 0)
		require.Nil(t, l)
	}
	b.fill(t, "k1")
	l, _ := b.ask(t, second, 0)
	require.Nil(t, l, "second overtook first")
	require.NoError(t, b.pool.Leave(context.Background(), haiku, first.ID))
	l, _ = b.ask(t, second, 0)
	require.NotNil(t, l, "first left the line, yet second was refused")

	// third stops asking: its place lapses after LineTTL.
	require.Eventually(t, func() bool {
		line, err := b.pool.Line(context.Background(), haiku)
		require.NoError(t, err)
		return len(line) == 0
	}, 5*time.Second, 20*time.Millisecond)
	b.fill(t, "k1")
	late := Waiter{ID: "late", Priority: priority.Low, Since: t0.Add(time.Hour)}
	l, _ = b.ask(t, late, 0)
	require.NotNil(t, l, "a lapsed registration still held its place")
}

// TestLineIgnoredWithoutWaiter: an ask without InLine is served as before
// the line existed (tools, tests), and an invalid waiter is an error.
func TestLineIgnoredWithoutWaiter(t *testing.T) {
	b := lineBundle(t, 1)
	b.drain(t)
	l, _ := b.ask(t, Waiter{ID: "w", Priority: priority.Critical, Since: time.UnixMilli(1)}, 0)
	require.Nil(t, l)
	b.fill(t, "k1")
	lease, err := b.pool.Acquire(context.Background(), haiku, 10)
	require.NoError(t, err, "an ask outside the line")
	require.NotNil(t, lease)
	_, err = b.pool.Acquire(context.Background(), haiku, 10, InLine(Waiter{ID: "x"}))
	require.ErrorContains(t, err, "invalid waiter")
}

// TestLineSpacesTheRoute: keys that refill together (here two of 120 RPM
// drained at once) do not serve a saturated line in bursts: the grants
// are spread one route interval apart (1/4 s for 4 requests/s), so a
// request arriving between two bursts does not wait a whole key interval.
// A key with burst room, or a line the keys keep up with, is not held
// back.
func TestLineSpacesTheRoute(t *testing.T) {
	b := build(t, Config{Pace: 1, Jitter: NoJitter, Keys: []Key{key("k1", haiku, 120, 1_000_000), key("k2", haiku, 120, 1_000_000)}})
	// Full buckets (2 requests each) serve a short line at once while
	// they hold more than one request per key.
	for i := range 3 {
		l, ee := b.ask(t, normal(i), 0)
		require.NotNil(t, l, "waiter %d refused (%v) from full buckets", i, ee)
		require.Zero(t, l.Delay())
	}
	// The last one is spaced, although each ask finds the line short: a
	// burst granted at once would leave both keys empty, to refill
	// together half a second later.
	l, ee := b.ask(t, normal(3), 0)
	require.Nil(t, l, "the burst's last request granted at once: the keys are drained together")
	require.InDelta(t, 0.25, ee.RetryAfter.Seconds(), 0.03, "its turn is one route interval after the last grant")
	// Reserved ahead, the grants come one route interval (0.25 s) apart
	// rather than together.
	l3, ee := b.ask(t, normal(3), time.Second)
	require.NotNil(t, l3, "%v", ee)
	l4, ee := b.ask(t, normal(4), time.Second)
	require.NotNil(t, l4, "%v", ee)
	gap := l4.NotBefore.Sub(l3.NotBefore)
	require.InDelta(t, 0.25, gap.Seconds(), 0.02, "the keys' grants are spaced by the route interval")
}

// TestLineSpacedWaiterComesBackOnTime: a waiter refused only because the
// route's next grant is spaced is told to come back for that grant (one
// route interval), not for its key's refill after it (a key interval): a
// CRITICAL request used to sleep the longest recheck (200 ms) instead.
func TestLineSpacedWaiterComesBackOnTime(t *testing.T) {
	keys := make([]Key, 4)
	for i := range keys {
		keys[i] = key(fmt.Sprintf("k%d", i+1), haiku, 120, 1_000_000) // 2 a second each: 8 in all, 125 ms apart
	}
	b := build(t, Config{Pace: 1, Jitter: NoJitter, Keys: keys})
	// The keys' burst room goes at once, up to the first spaced grant;
	// five more wait in line.
	first := 0
	for ; ; first++ {
		if l, _ := b.ask(t, normal(first), 0); l == nil {
			break
		}
	}
	require.Positive(t, first, "full keys granted nothing")
	for i := first + 1; i < first+6; i++ {
		l, _ := b.ask(t, normal(i), 0)
		require.Nil(t, l)
	}
	// Every key holds one request again, but the route's grants are
	// spaced from the last one, just now.
	for i := range keys {
		require.NoError(t, b.rdb.HSet(context.Background(), stateKey(b.cfg.Prefix, keys[i].ID), "rl", 1).Err())
	}
	l, ee := b.ask(t, normal(first), 0)
	require.Nil(t, l, "granted although the last grant was just now")
	require.Less(t, ee.RetryAfter, 200*time.Millisecond,
		"told to wait %s: the next grant is one route interval (125 ms) away, not a key interval (500 ms)", ee.RetryAfter)
}

// TestLineCriticalIsNotSpaced: on a spaced route a CRITICAL waiter takes
// a request a key holds ready at once, where a NORMAL one waits for the
// next spaced moment: two CRITICAL requests arriving together would
// otherwise wait two route intervals.
func TestLineCriticalIsNotSpaced(t *testing.T) {
	keys := make([]Key, 4)
	for i := range keys {
		keys[i] = key(fmt.Sprintf("k%d", i+1), haiku, 120, 1_000_000)
	}
	b := build(t, Config{Pace: 1, Jitter: NoJitter, Keys: keys})
	first := 0
	for ; ; first++ {
		if l, _ := b.ask(t, normal(first), 0); l == nil {
			break
		}
	}
	for i := range keys {
		require.NoError(t, b.rdb.HSet(context.Background(), stateKey(b.cfg.Prefix, keys[i].ID), "rl", 1).Err())
	}
	l, _ := b.ask(t, normal(first), 0)
	require.Nil(t, l, "a NORMAL waiter granted although the last grant was just now")
	for i := range 2 {
		crit := Waiter{ID: fmt.Sprintf("c%d", i), Priority: priority.Critical, Since: time.UnixMilli(1_700_000_000_000)}
		l, ee := b.ask(t, crit, 0)
		require.NotNil(t, l, "CRITICAL waiter %d spaced (%v) with every key holding a request", i, ee)
		require.Zero(t, l.Delay())
	}
}
