package breaker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/testenv"
)

// scripts counts a client's script calls.
type scripts struct{ n atomic.Int64 }

func (s *scripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			s.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (s *scripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// watched returns n Sets on their own clients sharing a prefix of their
// own (pub/sub channels are server-wide, so parallel tests must not share
// one), each watching until the test ends, and their script counters.
func watched(t *testing.T, n int) ([]*Set, []*scripts) {
	t.Helper()
	opts := testenv.RedisOptions(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	cfg := Config{Prefix: "t" + hex.EncodeToString(b) + ":breaker:"}
	var sets []*Set
	var counts []*scripts
	for range n {
		c := redis.NewClient(opts)
		t.Cleanup(func() { c.Close() })
		cnt := &scripts{}
		c.AddHook(cnt)
		s, err := New(c, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Watch(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, "the Set to watch", func() bool {
			s.views.mu.Lock()
			defer s.views.mu.Unlock()
			return s.views.watching
		})
		sets, counts = append(sets, s), append(counts, cnt)
	}
	return sets, counts
}

func known(s *Set, name string) bool { _, ok := s.views.healthy(name); return ok }

// A watching Set admits calls through a healthy breaker, and takes their
// successes, without a script: once it learnt the breaker is closed with
// no failure counted, 100 calls cost nothing more.
func TestWatchedHealthyBreakerCostsNoRoundTrip(t *testing.T) {
	t.Parallel()
	sets, counts := watched(t, 1)
	s, ctx := sets[0], context.Background()
	p := mustAllow(t, s, "claude/sonnet", false)
	if err := p.Done(ctx, Success); err != nil {
		t.Fatal(err)
	}
	before := counts[0].n.Load()
	for range 100 {
		p := mustAllow(t, s, "claude/sonnet", false)
		if err := p.Done(ctx, Success); err != nil {
			t.Fatal(err)
		}
	}
	if n := counts[0].n.Load() - before; n != 0 {
		t.Fatalf("%d scripts for 100 calls through a healthy breaker, want 0", n)
	}
}

// A failure counted by one process reaches every other: their views drop,
// so their next success resets the count (failures stay consecutive across
// processes, as without views), and an opening is seen at once.
func TestWatchedFailureReachesOtherSets(t *testing.T) {
	t.Parallel()
	sets, _ := watched(t, 2)
	a, b, ctx := sets[0], sets[1], context.Background()
	const name = "openai/gpt4o"
	for _, s := range sets { // both learn the breaker is healthy
		if err := mustAllow(t, s, name, false).Done(ctx, Success); err != nil {
			t.Fatal(err)
		}
		if !known(s, name) {
			t.Fatal("a success through a closed breaker left no view")
		}
	}
	fail := func(s *Set) {
		t.Helper()
		if err := mustAllow(t, s, name, false).DoneReason(ctx, Failure, "rate_limited"); err != nil {
			t.Fatal(err)
		}
	}
	fail(a)
	waitFor(t, "b to hear of a's failure", func() bool { return !known(b, name) })
	if err := mustAllow(t, b, name, false).Done(ctx, Success); err != nil { // resets the count
		t.Fatal(err)
	}
	fail(a)
	fail(a)
	st, err := a.Status(ctx, name)
	if err != nil || st.State != StateClosed {
		t.Fatalf("after failure, success, failure, failure: %+v %v; b's success must have reset the count", st, err)
	}
	fail(a) // the third in a row opens it
	waitFor(t, "b to hear of the opening", func() bool { return !known(b, name) })
	if _, err := b.Allow(ctx, name); err == nil {
		t.Fatal("b admitted a call through an open breaker")
	}
}
