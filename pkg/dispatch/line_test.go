package dispatch

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"bulwark/pkg/breaker"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
	"bulwark/pkg/secret"
	"bulwark/pkg/slots"
	"bulwark/pkg/testkit/testenv"
)

// orderClient answers at once and records which request called, in
// order (the request's text is its id).
type orderClient struct {
	mu    sync.Mutex
	order []string
	calls chan string
}

func (c *orderClient) Provider() llm.Provider { return llm.ProviderClaude }

func (c *orderClient) Complete(_ context.Context, _ llm.Credential, req *llm.Request) (*llm.Result, error) {
	id := req.Messages[0].Content[0].Text
	c.mu.Lock()
	c.order = append(c.order, id)
	c.mu.Unlock()
	c.calls <- id
	return answer("ok"), nil
}

// TestKeyLineOrder runs the dispatcher on the real slots and key pool, one
// key of 60 RPM (a request about every second): while LOW requests wait
// for the key, a CRITICAL request that arrives after them is served next,
// and the LOW requests are served in the order they were accepted, not in
// the order they asked.
func TestKeyLineOrder(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	lim, err := slots.New(rdb, slots.Config{Total: 10})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := keypool.New(ctx, rdb, keypool.Config{Prefix: "test:line:", Pace: 1, Keys: []keypool.Key{{
		ID: "k1", Provider: sonnet.Provider, Tier: sonnet.Tier, RPM: 60, TPM: 1_000_000,
		Cred: llm.Credential{APIKey: secret.New("sk-line-test")}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := breaker.New(rdb, breaker.Config{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	client := &orderClient{calls: make(chan string, 8)}
	m := metrics.New(prometheus.NewRegistry())
	jobs := &fakeJobs{recs: map[string]*job.Record{}, changes: map[string][]job.Change{}}
	d := New(Config{Clients: map[llm.Provider]llm.Client{llm.ProviderClaude: client},
		ModelName: func(llm.Route) string { return "m" }, PaceWait: 10 * time.Second, HoldWait: 20 * time.Second},
		Deps{Jobs: jobs, Starts: &fakeStarts{}, Slots: lim, Pool: pool, Breakers: set,
			Finisher: &fakeFinisher{jobs: jobs, trail: &trail{}}, Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	h := &harness{t: t, jobs: jobs, d: d}
	t0 := time.Now()
	submit := func(id string, p priority.Priority, age time.Duration) {
		h.submit(func(r *job.Record) {
			r.Job.ID, r.Job.Priority, r.Job.CreatedAt = id, p, t0.Add(age)
			r.Job.Request.Messages = []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: id}}}}
		})
	}
	var wg sync.WaitGroup
	run := func(id string) {
		wg.Go(func() {
			if err := h.process(ctx, id); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		})
	}
	inLine := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			ids, err := pool.Line(ctx, sonnet)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("line %v, want %d waiters", ids, n)
			}
			time.Sleep(5 * time.Millisecond) // polling Redis for the line to form
		}
	}
	submit("low-1", priority.Low, 0)
	submit("low-2", priority.Low, time.Millisecond)
	submit("low-3", priority.Low, 2*time.Millisecond)
	submit("crit", priority.Critical, time.Second)
	run("low-1")
	if got := <-client.calls; got != "low-1" {
		t.Fatalf("first call %s, want low-1", got)
	}
	// The bucket is empty now: low-3 asks before low-2, then CRITICAL.
	run("low-3")
	inLine(1)
	run("low-2")
	inLine(2)
	run("crit")
	inLine(3)
	wg.Wait()
	want := []string{"low-1", "crit", "low-2", "low-3"}
	client.mu.Lock()
	defer client.mu.Unlock()
	if !slices.Equal(client.order, want) {
		t.Fatalf("calls in order %v, want %v", client.order, want)
	}
	// The CRITICAL request's wait for its key (about one refill) is in
	// bulwark_key_wait_seconds.
	var crit dto.Metric
	if err := m.KeyWait.WithLabelValues("critical", string(sonnet.Provider), sonnet.Tier).(prometheus.Histogram).Write(&crit); err != nil {
		t.Fatal(err)
	}
	if n, sum := crit.GetHistogram().GetSampleCount(), crit.GetHistogram().GetSampleSum(); n != 1 || sum < 0.3 {
		t.Errorf("key wait of the CRITICAL request: %d observations, %.3f s; want one of about a refill (1 s)", n, sum)
	}
}
