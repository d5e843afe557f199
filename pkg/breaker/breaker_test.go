package breaker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"bulwark/pkg/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// transition is one OnTransition call.
type transition struct {
	Name     string
	From, To State
	Reason   string
}

// recorder collects OnTransition calls from every Set of a bundle.
type recorder struct {
	mu  sync.Mutex
	got []transition
}

func (r *recorder) hook(name string, from, to State, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, transition{name, from, to, reason})
}

func (r *recorder) take() []transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

// bundle is n Sets, each on its own Redis client (as n worker processes
// would be), sharing one test database and one transition recorder.
type bundle struct {
	cfg  Config
	sets []*Set
	rec  *recorder
	opts *redis.Options
}

func setup(t *testing.T, cfg Config, n int) *bundle {
	t.Helper()
	b := &bundle{rec: &recorder{}, opts: testenv.RedisOptions(t)}
	cfg.OnTransition = b.rec.hook
	for range n {
		c := redis.NewClient(b.opts)
		t.Cleanup(func() { c.Close() })
		s, err := New(c, cfg, nil)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		b.sets = append(b.sets, s)
	}
	b.cfg = b.sets[0].cfg
	return b
}

// advance moves every Set's view of Redis time forward by d.
func (b *bundle) advance(d time.Duration) {
	for _, s := range b.sets {
		s.clockOffset.Add(d.Milliseconds())
	}
}

func (b *bundle) status(t *testing.T, name string) Status {
	t.Helper()
	st, err := b.sets[0].Status(context.Background(), name)
	if err != nil {
		t.Fatalf("Status(%s): %v", name, err)
	}
	return st
}

func mustAllow(t *testing.T, s *Set, name string, probe bool) *Permit {
	t.Helper()
	p, err := s.Allow(context.Background(), name)
	if err != nil {
		t.Fatalf("Allow(%s): %v", name, err)
	}
	if p.Probe() != probe {
		t.Fatalf("Allow(%s): Probe() = %v, want %v", name, p.Probe(), probe)
	}
	return p
}

func mustReject(t *testing.T, s *Set, name string, state State) *OpenError {
	t.Helper()
	p, err := s.Allow(context.Background(), name)
	var oe *OpenError
	if !errors.As(err, &oe) || !errors.Is(err, ErrOpen) {
		t.Fatalf("Allow(%s) = %v, %v; want an *OpenError", name, p, err)
	}
	if oe.State != state || oe.Name != name {
		t.Fatalf("Allow(%s): OpenError %+v, want State %s", name, oe, state)
	}
	return oe
}

func mustDone(t *testing.T, p *Permit, o Outcome) {
	t.Helper()
	if err := p.Done(context.Background(), o); err != nil {
		t.Fatalf("Done(%s): %v", o, err)
	}
}

// waitFor polls cond until it holds or 5 s pass: for what another Set
// learns through Redis (the real-time test, the watched views); the
// others move the clock with advance.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()

	got := Config{}.WithDefaults()
	want := Config{
		FailureThreshold: 3, OpenTimeout: time.Minute, HalfOpenProbes: 1, SuccessThreshold: 2,
		ProbeTimeout: 2 * time.Minute, Prefix: "bulwark:{breaker}:", RedisTimeout: 2 * time.Second,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b func(string, State, State, string)) bool { return true })); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{FailureThreshold: -1}, "FailureThreshold"},
		{Config{OpenTimeout: -time.Second}, "OpenTimeout"},
		{Config{OpenTimeout: time.Microsecond}, "OpenTimeout"},
		{Config{HalfOpenProbes: -1}, "HalfOpenProbes"},
		{Config{SuccessThreshold: -2}, "SuccessThreshold"},
		{Config{ProbeTimeout: -time.Minute}, "ProbeTimeout"},
		{Config{RedisTimeout: -time.Second}, "RedisTimeout"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	if _, err := New(nil, Config{}, nil); err == nil {
		t.Error("New(nil client) succeeded")
	}
}

// TestStateMachine drives one breaker through scripted steps with the
// default thresholds (3 failures, 1 probe, 2 successes) and checks the state
// after each step and every transition reported.
func TestStateMachine(t *testing.T) {
	t.Parallel()

	type step struct {
		do        string
		state     State
		failures  int // ConsecutiveFailures after the step
		successes int // HalfOpenSuccesses after the step
	}
	const (
		closed   = StateClosed
		open     = StateOpen
		halfOpen = StateHalfOpen
	)
	opened := transition{"r", closed, open, "3 consecutive failures, last: x"}
	halfOpened := transition{"r", open, halfOpen, "open timeout elapsed"}
	reclosed := transition{"r", halfOpen, closed, "2 successful probes"}

	for _, tc := range []struct {
		name        string
		steps       []step
		transitions []transition
	}{
		{
			name: "three consecutive failures open",
			steps: []step{
				{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"fail", open, 0, 0}, {"rejected", open, 0, 0},
			},
			transitions: []transition{opened},
		},
		{
			name: "success resets the count",
			steps: []step{
				{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"ok", closed, 0, 0},
				{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"fail", open, 0, 0},
			},
			transitions: []transition{opened},
		},
		{
			name: "ignore counts neither way when closed",
			steps: []step{
				{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"ignore", closed, 2, 0}, {"fail", open, 0, 0},
			},
			transitions: []transition{opened},
		},
		{
			name: "open until the timeout, then two probes one after another close it",
			steps: []step{
				{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"fail", open, 0, 0},
				{"almost", open, 0, 0}, {"rejected", open, 0, 0},
				{"rest", halfOpen, 0, 0}, // Status sees half_open before anyone calls Allow
				{"probe-ok", halfOpen, 0, 1}, {"probe-ok", closed, 0, 0}, {"ok", closed, 0, 0},
			},
			transitions: []transition{opened, halfOpened, reclosed},
		},
		{
			name: "a failed probe re-opens for another timeout",
			steps: []step{
				{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"fail", open, 0, 0}, {"wait", halfOpen, 0, 0},
				{"probe-ok", halfOpen, 0, 1}, {"probe-fail", open, 0, 0}, {"rejected", open, 0, 0},
				{"wait", halfOpen, 0, 0}, {"probe-ok", halfOpen, 0, 1}, {"probe-ok", closed, 0, 0},
			},
			transitions: []transition{
				opened, halfOpened, {"r", halfOpen, open, "probe failed: x"}, halfOpened, reclosed,
			},
		},
		{
			name: "an ignored probe frees its slot and counts nothing",
			steps: []step{
				{"trip", open, 0, 0}, {"wait", halfOpen, 0, 0},
				{"probe-ignore", halfOpen, 0, 0}, {"probe-ok", halfOpen, 0, 1},
				{"probe-ignore", halfOpen, 0, 1}, {"probe-ok", closed, 0, 0},
			},
			transitions: []transition{{"r", closed, open, "tripped"}, halfOpened, reclosed},
		},
		{
			name: "trip from closed, and again while open changes nothing",
			steps: []step{
				{"fail", closed, 1, 0}, {"trip", open, 0, 0}, {"trip", open, 0, 0}, {"rejected", open, 0, 0},
			},
			transitions: []transition{{"r", closed, open, "tripped"}},
		},
		{
			name: "trip re-opens a half-open breaker",
			steps: []step{
				{"trip", open, 0, 0}, {"wait", halfOpen, 0, 0}, {"probe-ok", halfOpen, 0, 1},
				{"trip", open, 0, 0}, {"rejected", open, 0, 0},
			},
			transitions: []transition{
				{"r", closed, open, "tripped"}, halfOpened, {"r", halfOpen, open, "tripped"},
			},
		},
		{
			name: "trip re-opens a breaker half-open only by the clock",
			steps: []step{
				{"trip", open, 0, 0}, {"wait", halfOpen, 0, 0}, {"trip", open, 0, 0}, {"rejected", open, 0, 0},
			},
			transitions: []transition{{"r", closed, open, "tripped"}, {"r", halfOpen, open, "tripped"}},
		},
		{
			name: "reset closes an open breaker",
			steps: []step{
				{"trip", open, 0, 0}, {"reset", closed, 0, 0}, {"ok", closed, 0, 0},
			},
			transitions: []transition{{"r", closed, open, "tripped"}, {"r", open, closed, "reset"}},
		},
		{
			name: "reset closes a half-open breaker",
			steps: []step{
				{"trip", open, 0, 0}, {"wait", halfOpen, 0, 0}, {"probe-ok", halfOpen, 0, 1},
				{"reset", closed, 0, 0}, {"fail", closed, 1, 0},
			},
			transitions: []transition{{"r", closed, open, "tripped"}, halfOpened, {"r", halfOpen, closed, "reset"}},
		},
		{
			name:  "reset of a closed breaker clears its failures",
			steps: []step{{"fail", closed, 1, 0}, {"fail", closed, 2, 0}, {"reset", closed, 0, 0}, {"fail", closed, 1, 0}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{OpenTimeout: time.Minute}, 1)
			s, ctx := b.sets[0], context.Background()
			for i, st := range tc.steps {
				switch st.do {
				case "ok", "fail", "ignore":
					p := mustAllow(t, s, "r", false)
					o := map[string]Outcome{"ok": Success, "fail": Failure, "ignore": Ignore}[st.do]
					if err := p.DoneReason(ctx, o, "x"); err != nil {
						t.Fatalf("step %d: Done: %v", i, err)
					}
				case "probe-ok", "probe-fail", "probe-ignore":
					p := mustAllow(t, s, "r", true)
					// Only one probe at a time: a second caller is turned away.
					mustReject(t, s, "r", StateHalfOpen)
					o := map[string]Outcome{"probe-ok": Success, "probe-fail": Failure, "probe-ignore": Ignore}[st.do]
					if err := p.DoneReason(ctx, o, "x"); err != nil {
						t.Fatalf("step %d: Done: %v", i, err)
					}
				case "rejected":
					mustReject(t, s, "r", StateOpen)
				case "almost":
					b.advance(b.cfg.OpenTimeout - time.Second)
				case "rest":
					b.advance(time.Second)
				case "wait":
					b.advance(b.cfg.OpenTimeout)
				case "trip":
					if err := s.Trip(ctx, "r", "tripped"); err != nil {
						t.Fatalf("step %d: Trip: %v", i, err)
					}
				case "reset":
					if err := s.Reset(ctx, "r"); err != nil {
						t.Fatalf("step %d: Reset: %v", i, err)
					}
				default:
					t.Fatalf("step %d: unknown step %q", i, st.do)
				}
				got := b.status(t, "r")
				if got.State != st.state || got.ConsecutiveFailures != st.failures || got.HalfOpenSuccesses != st.successes {
					t.Fatalf("after step %d (%s): state %s failures %d successes %d; want %s %d %d",
						i, st.do, got.State, got.ConsecutiveFailures, got.HalfOpenSuccesses, st.state, st.failures, st.successes)
				}
				if got.ProbesInFlight != 0 {
					t.Fatalf("after step %d (%s): %d probes in flight, want 0", i, st.do, got.ProbesInFlight)
				}
			}
			if diff := cmp.Diff(tc.transitions, b.rec.take()); diff != "" {
				t.Errorf("transitions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStatusFields(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{OpenTimeout: 10 * time.Second}, 1)
	s, ctx := b.sets[0], context.Background()

	if got := b.status(t, "r"); !cmp.Equal(got, Status{Name: "r", State: StateClosed}) {
		t.Fatalf("status of an unknown breaker = %+v", got)
	}
	if err := s.Trip(ctx, "r", "all providers exhausted"); err != nil {
		t.Fatal(err)
	}
	st := b.status(t, "r")
	if st.OpenedAt.IsZero() || time.Since(st.OpenedAt).Abs() > time.Minute {
		t.Fatalf("OpenedAt = %v, want about now", st.OpenedAt)
	}
	want := Status{
		Name: "r", State: StateOpen, OpenedAt: st.OpenedAt, RetryAt: st.OpenedAt.Add(10 * time.Second),
		DegradedSince: st.OpenedAt, Reason: "all providers exhausted", LastTransition: st.OpenedAt,
	}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Fatalf("open (-want +got):\n%s", diff)
	}
	oe := mustReject(t, s, "r", StateOpen)
	if oe.RetryAfter <= 0 || oe.RetryAfter > 10*time.Second {
		t.Fatalf("RetryAfter = %s, want in (0, 10s]", oe.RetryAfter)
	}
	b.advance(4 * time.Second)
	if oe := mustReject(t, s, "r", StateOpen); oe.RetryAfter > 6*time.Second {
		t.Fatalf("RetryAfter 4s later = %s, want at most 6s", oe.RetryAfter)
	}

	b.advance(6 * time.Second)
	halfOpen := Status{
		Name: "r", State: StateHalfOpen, OpenedAt: want.OpenedAt, DegradedSince: want.OpenedAt,
		Reason: want.Reason, LastTransition: want.RetryAt,
	}
	if diff := cmp.Diff(halfOpen, b.status(t, "r")); diff != "" {
		t.Fatalf("half-open by the clock (-want +got):\n%s", diff)
	}
	p := mustAllow(t, s, "r", true)
	halfOpen.ProbesInFlight = 1
	if diff := cmp.Diff(halfOpen, b.status(t, "r")); diff != "" {
		t.Fatalf("half-open after the lazy write, with a probe (-want +got):\n%s", diff)
	}
	oe = mustReject(t, s, "r", StateHalfOpen)
	if oe.RetryAfter <= 0 || oe.RetryAfter > b.cfg.ProbeTimeout {
		t.Fatalf("half-open RetryAfter = %s, want in (0, ProbeTimeout]", oe.RetryAfter)
	}

	// A failed probe re-opens: new OpenedAt and reason, same DegradedSince.
	b.advance(time.Second)
	if err := p.DoneReason(ctx, Failure, "rate_limited"); err != nil {
		t.Fatal(err)
	}
	st = b.status(t, "r")
	if !st.OpenedAt.After(want.OpenedAt) || st.Reason != "probe failed: rate_limited" ||
		!st.DegradedSince.Equal(want.OpenedAt) || !st.RetryAt.Equal(st.OpenedAt.Add(10*time.Second)) {
		t.Fatalf("re-opened status = %+v", st)
	}

	// Closing keeps the record of the last opening, clears the rest.
	reopened := st.OpenedAt
	b.advance(10 * time.Second)
	mustDone(t, mustAllow(t, s, "r", true), Success)
	mustDone(t, mustAllow(t, s, "r", true), Success)
	st = b.status(t, "r")
	want = Status{Name: "r", State: StateClosed, OpenedAt: reopened, Reason: "probe failed: rate_limited", LastTransition: st.LastTransition}
	if diff := cmp.Diff(want, st); diff != "" || !st.LastTransition.After(reopened) {
		t.Fatalf("closed (-want +got):\n%s", diff)
	}
}

// TestExactlyOneProbe races Allow from separate clients in half-open, many
// rounds, and checks the probe limit holds across them and that the lazy
// open→half_open transition is reported exactly once per round.
func TestExactlyOneProbe(t *testing.T) {
	t.Parallel()
	for _, probes := range []int{1, 3} {
		t.Run(fmt.Sprintf("probes=%d", probes), func(t *testing.T) {
			t.Parallel()
			const workers, rounds = 8, 30
			b := setup(t, Config{HalfOpenProbes: probes, SuccessThreshold: 1000}, workers)
			ctx := context.Background()
			if err := b.sets[0].Trip(ctx, "r", "test"); err != nil {
				t.Fatal(err)
			}
			b.rec.take()
			for round := range rounds {
				b.advance(b.cfg.OpenTimeout)
				start := make(chan struct{})
				permits := make([]*Permit, workers)
				errs := make([]error, workers)
				var wg sync.WaitGroup
				for i, s := range b.sets {
					wg.Go(func() {
						<-start
						permits[i], errs[i] = s.Allow(ctx, "r")
					})
				}
				close(start)
				wg.Wait()

				var admitted []*Permit
				for i, p := range permits {
					var oe *OpenError
					switch {
					case errs[i] == nil:
						admitted = append(admitted, p)
					case !errors.As(errs[i], &oe) || oe.State != StateHalfOpen:
						t.Fatalf("round %d: Allow: %v", round, errs[i])
					}
				}
				if len(admitted) != probes {
					t.Fatalf("round %d: %d probes admitted, want %d", round, len(admitted), probes)
				}
				want := []transition{{"r", StateOpen, StateHalfOpen, "open timeout elapsed"}}
				if diff := cmp.Diff(want, b.rec.take()); diff != "" {
					t.Fatalf("round %d: transitions (-want +got):\n%s", round, diff)
				}
				// Successes free slots without closing (threshold 1000): a
				// second race must again admit only the freed slots.
				mustDone(t, admitted[0], Success)
				var again []*Permit
				for _, s := range b.sets {
					if p, err := s.Allow(ctx, "r"); err == nil {
						again = append(again, p)
					}
				}
				if len(again) != 1 {
					t.Fatalf("round %d: %d probes admitted after one finished, want 1", round, len(again))
				}
				mustDone(t, again[0], Failure) // re-open for the next round
				if got := b.status(t, "r").State; got != StateOpen {
					t.Fatalf("round %d: state after a failed probe = %s", round, got)
				}
				b.rec.take()
			}
		})
	}
}

// TestConcurrentFailuresOpenOnce reports failures from many processes at
// once: the breaker opens once, and only the process that opened it hears.
func TestConcurrentFailuresOpenOnce(t *testing.T) {
	t.Parallel()
	const workers = 8
	b := setup(t, Config{}, workers)
	ctx := context.Background()
	for round := range 10 {
		permits := make([]*Permit, workers)
		for i, s := range b.sets {
			permits[i] = mustAllow(t, s, "r", false)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, p := range permits {
			wg.Go(func() {
				<-start
				if err := p.Done(ctx, Failure); err != nil {
					t.Errorf("Done: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		want := []transition{{"r", StateClosed, StateOpen, "3 consecutive failures"}}
		if diff := cmp.Diff(want, b.rec.take()); diff != "" {
			t.Fatalf("round %d: transitions (-want +got):\n%s", round, diff)
		}
		// The five late failures were stale: they do not carry over.
		if err := b.sets[0].Reset(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		if st := b.status(t, "r"); st.State != StateClosed || st.ConsecutiveFailures != 0 {
			t.Fatalf("round %d: after reset %+v", round, st)
		}
		b.rec.take()
	}
}

func TestProbeLeaseExpires(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ProbeTimeout: 30 * time.Second}, 2)
	ctx := context.Background()
	if err := b.sets[0].Trip(ctx, "r", "test"); err != nil {
		t.Fatal(err)
	}
	b.advance(b.cfg.OpenTimeout)

	dead := mustAllow(t, b.sets[0], "r", true) // its worker "dies": never reports
	mustReject(t, b.sets[1], "r", StateHalfOpen)
	b.advance(b.cfg.ProbeTimeout - time.Second)
	mustReject(t, b.sets[1], "r", StateHalfOpen)
	if n := b.status(t, "r").ProbesInFlight; n != 1 {
		t.Fatalf("ProbesInFlight before expiry = %d, want 1", n)
	}
	b.advance(time.Second)
	if n := b.status(t, "r").ProbesInFlight; n != 0 {
		t.Fatalf("ProbesInFlight after expiry = %d, want 0", n)
	}
	live := mustAllow(t, b.sets[1], "r", true)

	// The dead probe's late report is void, success or failure.
	mustDone(t, dead, Failure)
	if st := b.status(t, "r"); st.State != StateHalfOpen || st.ProbesInFlight != 1 {
		t.Fatalf("after a late failure from an expired probe: %+v", st)
	}
	mustDone(t, live, Success)
	if st := b.status(t, "r"); st.HalfOpenSuccesses != 1 {
		t.Fatalf("HalfOpenSuccesses = %d, want 1", st.HalfOpenSuccesses)
	}
}

// TestRealTime runs without the clock offset, on Redis TIME alone, with
// tiny timeouts.
func TestRealTime(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{OpenTimeout: 50 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond}, 2)
	ctx := context.Background()
	if err := b.sets[0].Trip(ctx, "r", "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "half-open", func() bool { return b.status(t, "r").State == StateHalfOpen })
	mustAllow(t, b.sets[0], "r", true) // never reported
	mustReject(t, b.sets[1], "r", StateHalfOpen)
	waitFor(t, "the probe lease to expire", func() bool { return b.status(t, "r").ProbesInFlight == 0 })
	p := mustAllow(t, b.sets[1], "r", true)
	mustDone(t, p, Failure)
	mustReject(t, b.sets[1], "r", StateOpen)
	waitFor(t, "half-open again", func() bool { return b.status(t, "r").State == StateHalfOpen })
	mustDone(t, mustAllow(t, b.sets[0], "r", true), Success)
	mustDone(t, mustAllow(t, b.sets[1], "r", true), Success)
	if got := b.status(t, "r").State; got != StateClosed {
		t.Fatalf("state = %s, want closed", got)
	}
}

func TestDone(t *testing.T) {
	t.Parallel()

	t.Run("second report is a no-op", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{}, 1)
		s := b.sets[0]
		p := mustAllow(t, s, "r", false)
		mustDone(t, p, Failure)
		mustDone(t, p, Failure)
		if n := b.status(t, "r").ConsecutiveFailures; n != 1 {
			t.Fatalf("failures = %d, want 1", n)
		}
		if err := s.Trip(context.Background(), "r", "t"); err != nil {
			t.Fatal(err)
		}
		b.advance(b.cfg.OpenTimeout)
		p = mustAllow(t, s, "r", true)
		mustDone(t, p, Success)
		mustDone(t, p, Success)
		if n := b.status(t, "r").HalfOpenSuccesses; n != 1 {
			t.Fatalf("successes = %d, want 1", n)
		}
	})

	t.Run("recorded even when the caller's context is cancelled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{}, 1)
		p := mustAllow(t, b.sets[0], "r", false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := p.Done(ctx, Failure); err != nil {
			t.Fatal(err)
		}
		if n := b.status(t, "r").ConsecutiveFailures; n != 1 {
			t.Fatalf("failures = %d, want 1", n)
		}
	})

	t.Run("outcomes of an older generation are stale", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{}, 1)
		s, ctx := b.sets[0], context.Background()
		var ps []*Permit
		for range 5 {
			ps = append(ps, mustAllow(t, s, "r", false))
		}
		for _, p := range ps[:3] {
			mustDone(t, p, Failure)
		}
		mustDone(t, ps[3], Success) // the breaker is open: a late success does not close it
		if st := b.status(t, "r"); st.State != StateOpen {
			t.Fatalf("state = %s, want open", st.State)
		}
		if err := s.Reset(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		mustDone(t, ps[4], Failure) // issued before the reset
		if st := b.status(t, "r"); st.ConsecutiveFailures != 0 {
			t.Fatalf("failures after a stale report = %d, want 0", st.ConsecutiveFailures)
		}
	})

	t.Run("invalid outcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{}, 1)
		p := mustAllow(t, b.sets[0], "r", false)
		if err := p.Done(context.Background(), Outcome(0)); err == nil {
			t.Fatal("Done(0) succeeded")
		}
	})
}

func TestListAndPrefix(t *testing.T) {
	t.Parallel()
	opts := testenv.RedisOptions(t)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	a, err := New(c, Config{Prefix: "a:"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(c, Config{Prefix: "b:"}, nil)
	if err != nil {
		t.Fatal(err)
	}

	if got, err := a.List(ctx); err != nil || len(got) != 0 {
		t.Fatalf("List on an empty database = %v, %v", got, err)
	}
	mustAllow(t, a, "openai/gpt4o", false)
	if err := a.Trip(ctx, AllName, "all providers exhausted"); err != nil {
		t.Fatal(err)
	}
	mustDone(t, mustAllow(t, a, "claude/sonnet", false), Failure)
	if _, err := a.Status(ctx, "never/used"); err != nil {
		t.Fatal(err)
	}
	if err := a.Reset(ctx, "never/reset"); err != nil {
		t.Fatal(err)
	}

	got, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name     string
		State    State
		Failures int
	}
	var rows []row
	for _, st := range got {
		rows = append(rows, row{st.Name, st.State, st.ConsecutiveFailures})
	}
	want := []row{{"all", StateOpen, 0}, {"claude/sonnet", StateClosed, 1}, {"openai/gpt4o", StateClosed, 0}}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Fatalf("List (-want +got):\n%s", diff)
	}

	if got, err := other.List(ctx); err != nil || len(got) != 0 {
		t.Fatalf("List under another prefix = %v, %v", got, err)
	}
	mustAllow(t, other, AllName, false) // same name, other prefix: not tripped
}

func TestErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redis.NewClient(testenv.RedisOptions(t))
	s, err := New(c, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allow(ctx, ""); err == nil {
		t.Error("Allow with an empty name succeeded")
	}
	if err := s.Trip(ctx, strings.Repeat("x", 201), "r"); err == nil {
		t.Error("Trip with a 201-byte name succeeded")
	}

	// A Redis failure is an error of its own, never ErrOpen.
	c.Close()
	_, err = s.Allow(ctx, "r")
	if err == nil || errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), "allow r") {
		t.Errorf("Allow on a closed client = %v, want a Redis error naming the operation", err)
	}
	if _, err := s.List(ctx); err == nil {
		t.Error("List on a closed client succeeded")
	}
}

func TestReplyParsing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		v    any
		n    int
		want string // substring of the error
	}{
		{"not an array", "x", 2, "want array"},
		{"wrong length", []any{"a"}, 2, "1 elements, want 2"},
		{"wrong type", []any{int64(1), int64(2)}, 2, "element 0 is int64, want string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := newReply("op", tc.v, tc.n)
			if err == nil {
				r.str(0)
				r.int(1)
				err = r.err
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	r, err := newReply("op", []any{"s", int64(7)}, 2)
	if err != nil || r.str(0) != "s" || r.int(1) != 7 || r.err != nil {
		t.Fatalf("good reply: %v %v", err, r.err)
	}
}

// BenchmarkAllowDone measures one closed-state call: Allow plus a Success.
func BenchmarkAllowDone(b *testing.B) {
	s, err := New(testenv.Redis(b), Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := s.Allow(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Done(ctx, Success); err != nil {
				b.Fatal(err)
			}
		}
	})
}
