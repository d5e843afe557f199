package metrics

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestStateCollectorExposesState(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStateCollector(func(context.Context) (State, error) { return fullState(), nil }, time.Second))
	fams := gather(t, reg)

	st := fullState()
	check := func(name, label string, want map[string]float64) {
		t.Helper()
		got := map[string]float64{}
		for key := range want {
			got[key] = value(t, fams, name, map[string]string{label: key})
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
		if n := len(fams[name].GetMetric()); n != len(want) {
			t.Errorf("%s has %d series, want %d", name, n, len(want))
		}
	}
	check(NameQueueDepth, "priority", floats(st.QueueDepth))
	check(NameQueueOldestWait, "priority", st.OldestWaitSeconds)
	check(NameSlotsInUse, "priority", floats(st.SlotsInUse))
	check(NameKeysAvailable, "route", floats(st.KeysAvailable))
	check(NameKeysTotal, "route", floats(st.KeysTotal))
	check(NameBreakerState, "breaker", floats(st.BreakerState))
	if got := value(t, fams, NameStateScrapeErrors, map[string]string{}); got != 0 {
		t.Errorf("scrape errors = %v, want 0", got)
	}
}

func floats(m map[string]int) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(v)
	}
	return out
}

func TestStateCollectorReadErrorExposesNothing(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	fail := true
	reg.MustRegister(NewStateCollector(func(context.Context) (State, error) {
		if fail {
			return State{}, errors.New("redis: connection refused")
		}
		return fullState(), nil
	}, time.Second))

	for scrape := 1; scrape <= 2; scrape++ {
		fams := gather(t, reg)
		if len(fams) != 1 {
			names := make([]string, 0, len(fams))
			for n := range fams {
				names = append(names, n)
			}
			t.Fatalf("scrape %d after a read error gathered %v, want only %s", scrape, names, NameStateScrapeErrors)
		}
		if got := value(t, fams, NameStateScrapeErrors, map[string]string{}); got != float64(scrape) {
			t.Errorf("scrape %d: errors = %v, want %d", scrape, got, scrape)
		}
	}

	// The next good read exposes everything again; the error count stays.
	fail = false
	fams := gather(t, reg)
	if _, ok := fams[NameQueueDepth]; !ok {
		t.Errorf("%s missing after the read recovered", NameQueueDepth)
	}
	if got := value(t, fams, NameStateScrapeErrors, map[string]string{}); got != 2 {
		t.Errorf("errors after recovery = %v, want 2", got)
	}
}

func TestStateCollectorBoundsTheRead(t *testing.T) {
	t.Parallel()
	const timeout = 20 * time.Millisecond
	reg := prometheus.NewRegistry()
	var deadlineLeft time.Duration
	reg.MustRegister(NewStateCollector(func(ctx context.Context) (State, error) {
		dl, ok := ctx.Deadline()
		if !ok {
			return State{}, errors.New("read called without a deadline")
		}
		deadlineLeft = time.Until(dl)
		<-ctx.Done() // a Redis that never answers
		return State{}, ctx.Err()
	}, timeout))

	start := time.Now()
	fams := gather(t, reg)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("scrape took %v with a %v read timeout", elapsed, timeout)
	}
	if deadlineLeft <= 0 || deadlineLeft > timeout {
		t.Errorf("read's deadline was %v away, want within (0, %v]", deadlineLeft, timeout)
	}
	if got := value(t, fams, NameStateScrapeErrors, map[string]string{}); got != 1 {
		t.Errorf("errors = %v, want 1", got)
	}
	if _, ok := fams[NameQueueDepth]; ok {
		t.Errorf("%s exposed after a timed-out read", NameQueueDepth)
	}
}

func TestStateCollectorDefaultTimeout(t *testing.T) {
	t.Parallel()
	for _, timeout := range []time.Duration{0, -time.Second} {
		var left time.Duration
		c := NewStateCollector(func(ctx context.Context) (State, error) {
			dl, _ := ctx.Deadline()
			left = time.Until(dl)
			return State{}, nil
		}, timeout)
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		gather(t, reg)
		if left <= StateReadTimeoutDefault/2 || left > StateReadTimeoutDefault {
			t.Errorf("timeout %v: read's deadline was %v away, want about %v", timeout, left, StateReadTimeoutDefault)
		}
	}
}

func TestStateCollectorEmptyAndInvalidState(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStateCollector(func(context.Context) (State, error) { return State{}, nil }, time.Second))
	fams := gather(t, reg)
	if _, ok := fams[NameHistoryBacklog]; len(fams) != 2 || !ok {
		t.Errorf("empty state gathered %d families, want only %s and %s (always one value)", len(fams), NameStateScrapeErrors, NameHistoryBacklog)
	}

	// A label value that is not UTF-8 is reported by Gather, not a panic.
	bad := prometheus.NewRegistry()
	bad.MustRegister(NewStateCollector(func(context.Context) (State, error) {
		return State{QueueDepth: map[string]int{"\xff": 1}}, nil
	}, time.Second))
	if _, err := bad.Gather(); err == nil {
		t.Error("Gather of a non-UTF-8 label value returned no error")
	}
}

func TestStateCollectorConcurrentScrapes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	reads := 0
	reg.MustRegister(NewStateCollector(func(context.Context) (State, error) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if reads%2 == 0 {
			return State{}, errors.New("flaky")
		}
		return fullState(), nil
	}, time.Second))

	const scrapes = 20
	var wg sync.WaitGroup
	for range scrapes {
		wg.Go(func() {
			if _, err := reg.Gather(); err != nil {
				t.Errorf("Gather: %v", err)
			}
		})
	}
	wg.Wait()
	fams := gather(t, reg) // read number scrapes+1, odd: succeeds
	if got := value(t, fams, NameStateScrapeErrors, map[string]string{}); got != scrapes/2 {
		t.Errorf("errors = %v, want %d", got, scrapes/2)
	}
}

func TestBreakerStateValue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		state  string
		want   int
		wantOK bool
	}{
		{"closed", BreakerClosed, true},
		{"half_open", BreakerHalfOpen, true},
		{"open", BreakerOpen, true},
		{"OPEN", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := BreakerStateValue(tt.state)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("BreakerStateValue(%q) = %d, %v; want %d, %v", tt.state, got, ok, tt.want, tt.wantOK)
		}
	}
}
