package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/breaker"
	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/slots"
	"bulwark/pkg/testkit/testenv"
)

// harness is a dispatcher wired to the fakes.
type harness struct {
	t        *testing.T
	trail    *trail
	jobs     *fakeJobs
	starts   *fakeStarts
	slots    *countingSlots
	pool     *fakePool
	breakers *fakeBreakers
	fin      *fakeFinisher
	alerts   *fakeAlerter
	claude   *fakeClient
	openai   *fakeClient
	d        *Dispatcher
	n        int
}

// newHarness wires a dispatcher; sonnet falls back to gpt4o, gpt4o to
// nothing. tune adjusts the config.
func newHarness(t *testing.T, tune func(*Config)) *harness {
	t.Helper()
	rdb := testenv.Redis(t)
	lim, err := slots.New(rdb, slots.Config{Total: 4})
	if err != nil {
		t.Fatal(err)
	}
	set, err := breaker.New(rdb, breaker.Config{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tr := &trail{}
	h := &harness{t: t, trail: tr,
		jobs:     &fakeJobs{recs: map[string]*job.Record{}, changes: map[string][]job.Change{}},
		starts:   &fakeStarts{},
		slots:    &countingSlots{lim: lim},
		pool:     &fakePool{script: map[llm.Route][]error{}, next: map[llm.Route]int{}},
		breakers: &fakeBreakers{set: set, open: map[string]*breaker.OpenError{}},
		alerts:   &fakeAlerter{},
		claude:   &fakeClient{provider: llm.ProviderClaude, called: make(chan string, 16)},
		openai:   &fakeClient{provider: llm.ProviderOpenAI, called: make(chan string, 16)},
	}
	h.fin = &fakeFinisher{jobs: h.jobs, trail: tr}
	cfg := Config{
		Clients: map[llm.Provider]llm.Client{llm.ProviderClaude: h.claude, llm.ProviderOpenAI: h.openai},
		RouteOrder: func(r llm.Route, _ string) []llm.Route {
			if r == sonnet {
				return []llm.Route{sonnet, gpt4o}
			}
			return []llm.Route{r}
		},
		ModelName: func(r llm.Route) string { return "model-" + r.Tier },
	}
	if tune != nil {
		tune(&cfg)
	}
	h.d = New(cfg, Deps{Jobs: h.jobs, Starts: h.starts, Slots: h.slots, Pool: h.pool, Breakers: h.breakers,
		Finisher: h.fin, Alerter: h.alerts, Logger: slog.New(slog.DiscardHandler)})
	return h
}

// submit stores a queued request for sonnet, due in a minute, changed by
// mod.
func (h *harness) submit(mod func(*job.Record)) *job.Record {
	h.n++
	now := time.Now()
	rec := &job.Record{Status: job.StatusQueued, Job: job.Job{
		ID: fmt.Sprintf("req-%d", h.n), Tenant: "demo", Priority: priority.Normal, Route: sonnet,
		Request: llm.Request{MaxTokens: 100, Messages: []llm.Message{{Role: llm.RoleUser,
			Content: []llm.Block{{Type: llm.BlockText, Text: "why is the sky blue?"}}}}},
		CreatedAt: now, Deadline: now.Add(time.Minute)}}
	if mod != nil {
		mod(rec)
	}
	h.jobs.put(rec)
	return rec
}

// process runs the task of request id, as asynq would.
func (h *harness) process(ctx context.Context, id string) error {
	b, err := json.Marshal(queue.Payload{ID: id})
	if err != nil {
		h.t.Fatal(err)
	}
	return h.d.ProcessTask(ctx, asynq.NewTask(queue.TaskType, b))
}

// only returns the single ending, failing the test otherwise.
func (h *harness) only() finish.Ending {
	h.t.Helper()
	ends := h.fin.endings()
	if len(ends) != 1 {
		h.t.Fatalf("%d endings %+v, want exactly one", len(ends), ends)
	}
	return ends[0]
}

// noSlotHeld fails the test if a slot is still held.
func (h *harness) noSlotHeld() {
	h.t.Helper()
	if n := h.slots.inUse(h.t); n != 0 {
		h.t.Fatalf("%d slots still held after the task ended", n)
	}
}
