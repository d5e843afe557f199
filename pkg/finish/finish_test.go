package finish

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
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

func (f *fakeJobs) CreateEnded(_ context.Context, j *job.Job, _ job.Event, idemKey string, end job.Change) (string, bool, error) {
	if f.err != nil {
		return "", false, f.err
	}
	if idemKey == "used" {
		return "earlier", false, nil
	}
	f.changes = append(f.changes, end)
	f.ended[j.ID] = true
	return j.ID, true, nil
}

type fakeHistory struct{ rows []job.Record }

func (f *fakeHistory) Finished(_ context.Context, rec *job.Record, _ float64) {
	f.rows = append(f.rows, *rec)
}

// trail is the order of the finisher's writes after the terminal one.
type trail struct{ steps []string }

type fakeClaims struct {
	released []string
	trail    *trail
}

func (f *fakeClaims) Release(_ context.Context, key, id string) error {
	f.released = append(f.released, key+"/"+id)
	f.trail.steps = append(f.trail.steps, "release "+id)
	return nil
}

type fakeAnswers struct {
	jobs  *fakeJobs
	trail *trail
}

func (f *fakeAnswers) StoreAnswer(_ context.Context, rec *job.Record, then func()) error {
	defer then()
	if !f.jobs.ended[rec.Job.ID] {
		return errors.New("stored before the request ended")
	}
	f.trail.steps = append(f.trail.steps, "store "+rec.Job.ID)
	return nil
}

type bundle struct {
	jobs    *fakeJobs
	history *fakeHistory
	claims  *fakeClaims
	trail   *trail
	metrics *metrics.Metrics
	f       *Finisher
}

func setup(t *testing.T) *bundle {
	t.Helper()
	tr := &trail{}
	b := &bundle{jobs: &fakeJobs{ended: map[string]bool{}}, history: &fakeHistory{}, claims: &fakeClaims{trail: tr},
		trail: tr, metrics: metrics.New(prometheus.NewRegistry())}
	b.f = New(Deps{Jobs: b.jobs, History: b.history, Answers: &fakeAnswers{jobs: b.jobs, trail: tr}, Claims: b.claims, Metrics: b.metrics})
	return b
}

// A provider's answer is cached after the request ended (the caller is
// answered from the terminal record, not after an index insert) and
// before the coalescing claim is released (an identical request arriving
// in between joins this one and takes its answer). Answers from the cache
// or from a shared call, and failures, are not stored again; an answer
// from the cache held no claim, so none is released for it.
func TestFinishStoresAnswerBeforeRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	answered := job.State{Result: &llm.Response{}, ServedRoute: &route}
	if err := b.f.Finish(context.Background(), record("a"), Completed(answered)); err != nil {
		t.Fatal(err)
	}
	hit := answered
	hit.Cached = job.CachedExact
	if err := b.f.Finish(context.Background(), record("b"), Completed(hit)); err != nil {
		t.Fatal(err)
	}
	if err := b.f.Finish(context.Background(), record("c"), Failed(job.State{}, job.CodeProviderError, "x")); err != nil {
		t.Fatal(err)
	}
	want := []string{"store a", "release a", "release c"}
	if !slices.Equal(b.trail.steps, want) {
		t.Fatalf("steps %v, want %v", b.trail.steps, want)
	}
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

// A failure's tenant text is the fixed text of its code with the request
// id, whatever the caller passed; the caller's text reaches only the
// record's Detail and the log line, redacted.
func TestFailureTextIsFixedAndDetailRedacted(t *testing.T) {
	t.Parallel()
	const secretText = "claude: permanent (HTTP 400 invalid_request_error): organization org-SECRET123, " +
		"key ab12cd34ef56ab12cd34ef56, redis at 10.0.0.7:6379"
	var logs bytes.Buffer
	b := setup(t)
	b.f = New(Deps{Jobs: b.jobs, History: b.history, Metrics: b.metrics,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	rec := record("req_fail1")
	if err := b.f.Finish(context.Background(), rec, Failed(job.State{}, job.CodeProviderError, "provider_error: "+secretText)); err != nil {
		t.Fatal(err)
	}
	c := b.jobs.changes[0]
	want := TenantReason(rec.Job, job.CodeProviderError, "")
	if c.Reason != want || c.Event.Error != want || rec.Reason != want || b.history.rows[0].Reason != want {
		t.Fatalf("tenant text: change %q, event %q, record %q, history %q; want %q", c.Reason, c.Event.Error, rec.Reason,
			b.history.rows[0].Reason, want)
	}
	if !strings.Contains(want, "req_fail1") {
		t.Fatalf("tenant text %q does not name the request", want)
	}
	if c.Detail != rec.Detail || !strings.Contains(c.Detail, "invalid_request_error") {
		t.Fatalf("detail %q (record %q), want the redacted provider text", c.Detail, rec.Detail)
	}
	for _, leak := range []string{"org-SECRET123", "ab12cd34ef56ab12cd34ef56", "10.0.0.7", "6379"} {
		for what, text := range map[string]string{"tenant text": want, "detail": c.Detail, "log": logs.String()} {
			if strings.Contains(text, leak) {
				t.Errorf("%s carries %q: %s", what, leak, text)
			}
		}
	}
	if n := strings.Count(logs.String(), `"msg":"finish: request failed"`); n != 1 ||
		!strings.Contains(logs.String(), `"request_id":"req_fail1"`) || !strings.Contains(logs.String(), "invalid_request_error") {
		t.Fatalf("want one failure line with the request id and the detail, got %d: %s", n, logs.String())
	}
}

func TestTenantReason(t *testing.T) {
	t.Parallel()
	j := job.Job{ID: "req_x1", Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}}
	const leak = "dial tcp 10.0.0.7:6379: org-SECRET123"
	tests := []struct {
		code   job.Code
		reason string
		want   string // substring
	}{
		{job.CodeDeadline, "deadline_exceeded: waited 30s (queue_max_wait 30s) before it could start",
			"deadline_exceeded: waited 30s (queue_max_wait 30s) before it could start (request req_x1)"},
		{job.CodeDeadline, "", "deadline_exceeded (request req_x1)"},
		{job.CodeCancelled, "cancelled by the caller", "cancelled by the caller (request req_x1)"},
		{job.CodeProviderError, leak, "provider_error: the provider refused this request (request req_x1)"},
		{job.CodeProviderUnavailable, leak, "provider_unavailable: "},
		{job.CodeNoRoute, leak, "no_route: no provider key is configured for claude/sonnet or its fallback (request req_x1)"},
		{job.CodeLost, leak, "lost: "},
		{"", leak, "the request failed (request req_x1)"},
	}
	for _, tt := range tests {
		got := TenantReason(j, tt.code, tt.reason)
		if !strings.Contains(got, tt.want) || !strings.Contains(got, "req_x1") || strings.Contains(got, "10.0.0.7") ||
			strings.Contains(got, "SECRET") {
			t.Errorf("TenantReason(%q, %q) = %q, want it to contain %q and the id, and nothing of the reason", tt.code, tt.reason, got, tt.want)
		}
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

// A request stored already ended (a cache hit) is accounted as any other
// ending, once; a retry whose idempotency key names an earlier request
// stores and accounts nothing.
func TestFinishNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	hit := job.State{Result: &llm.Response{}, ServedRoute: &route, Cached: job.CachedSemantic}
	j := &record("n1").Job
	rec, other, created, err := b.f.FinishNew(context.Background(), j, "", Completed(hit))
	if err != nil || !created || other != "" || rec.Status != job.StatusCompleted || rec.State.FinishedAt.IsZero() {
		t.Fatalf("FinishNew: %+v %q %v %v", rec, other, created, err)
	}
	if len(b.jobs.changes) != 1 || b.jobs.changes[0].Event.Type != job.EventCompleted || len(b.history.rows) != 1 {
		t.Fatalf("changes %+v, history %d", b.jobs.changes, len(b.history.rows))
	}
	rec, other, created, err = b.f.FinishNew(context.Background(), &record("n2").Job, "used", Completed(hit))
	if err != nil || created || other != "earlier" || rec != nil || len(b.history.rows) != 1 {
		t.Fatalf("retry: %+v %q %v %v, history %d", rec, other, created, err, len(b.history.rows))
	}
	b.jobs.err = errors.New("redis down")
	if _, _, _, err := b.f.FinishNew(context.Background(), &record("n3").Job, "", Completed(hit)); err == nil || len(b.history.rows) != 1 {
		t.Fatalf("a failed write: %v, history %d", err, len(b.history.rows))
	}
}

// A compat call's cache hit ends with no record: its history row and its
// metrics as any ending, once, and nothing written to the live store
// (which fails here: the ending does not depend on it).
func TestEndUnstored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobs.err = errors.New("redis down")
	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	hit := job.State{Result: &llm.Response{}, ServedRoute: &route, Cached: job.CachedExact}
	rec, err := b.f.EndUnstored(context.Background(), &record("u1").Job, Completed(hit))
	if err != nil || rec.Status != job.StatusCompleted || rec.Job.ID != "u1" || rec.State.FinishedAt.IsZero() {
		t.Fatalf("EndUnstored: %+v %v", rec, err)
	}
	if len(b.jobs.changes) != 0 || len(b.history.rows) != 1 || b.history.rows[0].Job.ID != "u1" {
		t.Fatalf("changes %+v, history %d rows", b.jobs.changes, len(b.history.rows))
	}
	if got := counter(b.metrics.Requests.WithLabelValues("high", "completed")); got != 1 {
		t.Fatalf("requests{completed} = %v, want 1", got)
	}
	if len(b.claims.released) != 0 {
		t.Fatalf("claims released %v: a hit never holds one", b.claims.released)
	}
}

// A request whose caller took the answer in its response, with no key to
// ask again (job.Job.KeepEnded set by intake), keeps its ended record only
// job.EndedEventsTTL; any other keeps it the store's result TTL. Its
// ending names its join key, which then goes with the record.
func TestEndingKeepsAnAnsweredRecordBriefly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answered, other := record("a1"), record("a2")
	answered.Job.KeepEnded, answered.Job.JoinKey = job.EndedEventsTTL, "k1"
	for _, rec := range []*job.Record{answered, other} {
		if err := b.f.Finish(context.Background(), rec, Failed(rec.State, job.CodeNoRoute, "none")); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.jobs.changes) != 2 || b.jobs.changes[0].Keep != job.EndedEventsTTL || b.jobs.changes[1].Keep != 0 {
		t.Fatalf("changes %+v, want Keep %s then 0", b.jobs.changes, job.EndedEventsTTL)
	}
	if b.jobs.changes[0].Join != "k1" || b.jobs.changes[1].Join != "" {
		t.Fatalf("changes %+v, want Join k1 then none", b.jobs.changes)
	}
}
