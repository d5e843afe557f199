package finish

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
)

// fakeJobs records the changes applied and ends a request once, as the
// store's Lua script does.
type fakeJobs struct {
	ended   map[string]bool
	changes []job.Change
	err     error
}

func (f *fakeJobs) Apply(_ context.Context, id string, c job.Change) (string, error) {
	if f.err != nil {
		return "", f.err
	}
	if f.ended[id] {
		return "", job.ErrTerminal
	}
	f.changes = append(f.changes, c)
	if c.Status.Terminal() {
		f.ended[id] = true
	}
	return "1-0", nil
}

type fakeHistory struct{ rows []job.Record }

func (f *fakeHistory) Finished(_ context.Context, rec *job.Record, _ float64) {
	f.rows = append(f.rows, *rec)
}

type fakeClaims struct{ released []string }

func (f *fakeClaims) Release(_ context.Context, key, id string) error {
	f.released = append(f.released, key+"/"+id)
	return nil
}

type bundle struct {
	jobs    *fakeJobs
	history *fakeHistory
	claims  *fakeClaims
	metrics *metrics.Metrics
	f       *Finisher
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{jobs: &fakeJobs{ended: map[string]bool{}}, history: &fakeHistory{}, claims: &fakeClaims{},
		metrics: metrics.New(prometheus.NewRegistry())}
	b.f = New(Deps{Jobs: b.jobs, History: b.history, Claims: b.claims, Metrics: b.metrics})
	return b
}

func record(id string) *job.Record {
	return &job.Record{Job: job.Job{ID: id, Priority: priority.High, CacheKey: "k-" + id}, Status: job.StatusRunning}
}

// One ending writes everything once: the terminal change with its typed
// code and event, the history row, the metric, the claim.
func TestFinishWritesEverythingOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := record("r1")
	if err := b.f.Finish(context.Background(), rec, Failed(job.State{Attempts: 2}, job.CodeDeadline, "too late")); err != nil {
		t.Fatal(err)
	}
	c := b.jobs.changes[0]
	if c.Status != job.StatusFailed || c.Code != job.CodeDeadline || c.Event.Type != job.EventFailed || c.Event.Code != job.CodeDeadline ||
		c.State.FinishedAt.IsZero() {
		t.Fatalf("terminal change %+v", c)
	}
	if rec.Status != job.StatusFailed || rec.Code != job.CodeDeadline || len(b.history.rows) != 1 || len(b.claims.released) != 1 {
		t.Fatalf("record %+v, history %d, claims %v", rec, len(b.history.rows), b.claims.released)
	}
	if got := counter(b.metrics.Requests.WithLabelValues("high", "failed")); got != 1 {
		t.Fatalf("requests{failed} = %v", got)
	}

	// A second ending, by anyone, changes and counts nothing.
	err := b.f.Finish(context.Background(), record("r1"), Cancelled(job.State{}, "cancelled"))
	if !errors.Is(err, ErrEnded) || len(b.history.rows) != 1 ||
		counter(b.metrics.Requests.WithLabelValues("high", "cancelled")) != 0 {
		t.Fatalf("second ending: %v, history %d", err, len(b.history.rows))
	}
}

// A failed terminal write ends nothing: the caller's error says to retry.
func TestFinishWriteFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobs.err = errors.New("redis down")
	err := b.f.Finish(context.Background(), record("r2"), Completed(job.State{}))
	if err == nil || errors.Is(err, ErrEnded) || len(b.history.rows) != 0 || len(b.claims.released) != 0 {
		t.Fatalf("Finish = %v, history %d, claims %v", err, len(b.history.rows), b.claims.released)
	}
}

// A provider's answer costs money; a cached one does not.
func TestCompletedCountsCost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.f = New(Deps{Jobs: b.jobs, Metrics: b.metrics, Price: func(llm.Route) metrics.Price { return metrics.Price{InputPerMTok: 1e6} }})
	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	st := job.State{Cached: "none", ServedRoute: &route, Result: &llm.Response{Usage: llm.Usage{InputTokens: 2}}}
	if err := b.f.Finish(context.Background(), record("r3"), Completed(st)); err != nil {
		t.Fatal(err)
	}
	ev := b.jobs.changes[0].Event
	if ev.Type != job.EventCompleted || ev.Provider != llm.ProviderClaude || ev.Result == nil {
		t.Fatalf("completed event %+v", ev)
	}
	if err := New(Deps{Jobs: b.jobs}).Finish(context.Background(), record("r4"), Ending{Status: job.StatusRunning}); err == nil {
		t.Fatal("a non-terminal ending was accepted")
	}
}

// counter reads a counter's value.
func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
