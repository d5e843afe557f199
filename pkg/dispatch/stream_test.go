package dispatch

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
)

// streamClient is a fakeClient that can stream: each Stream call runs the
// next script entry with the emit it was given.
type streamClient struct {
	*fakeClient
	mu      sync.Mutex
	streams []func(emit func(llm.Delta)) (*llm.Result, error)
	n       int // Stream calls
}

func (c *streamClient) Stream(_ context.Context, _ llm.Credential, _ *llm.Request, emit func(llm.Delta)) (*llm.Result, error) {
	c.mu.Lock()
	c.n++
	var f func(func(llm.Delta)) (*llm.Result, error)
	if len(c.streams) > 0 {
		f, c.streams = c.streams[0], c.streams[1:]
	}
	c.mu.Unlock()
	if f == nil {
		return answer("ok"), nil
	}
	return f(emit)
}

func (c *streamClient) calls() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// pieces emits text in the given pieces as block 0 and answers with it.
func pieces(ps ...string) func(func(llm.Delta)) (*llm.Result, error) {
	return func(emit func(llm.Delta)) (*llm.Result, error) {
		for i, p := range ps {
			d := llm.Delta{Index: 0, Text: p}
			if i == 0 {
				d.Type = llm.BlockText
			}
			emit(d)
		}
		return answer(strings.Join(ps, "")), nil
	}
}

func newStreamHarness(t *testing.T) (*harness, *streamClient, *streamClient) {
	var claude, openai *streamClient
	h := newHarness(t, func(c *Config) {
		claude = &streamClient{fakeClient: c.Clients[llm.ProviderClaude].(*fakeClient)}
		openai = &streamClient{fakeClient: c.Clients[llm.ProviderOpenAI].(*fakeClient)}
		c.Clients = map[llm.Provider]llm.Client{llm.ProviderClaude: claude, llm.ProviderOpenAI: openai}
	})
	return h, claude, openai
}

// streamedText joins the text of rec's delta events, checking that the
// first marks the record streamed.
func streamedText(t *testing.T, h *harness, id string) string {
	t.Helper()
	var b strings.Builder
	first := true
	h.jobs.mu.Lock()
	defer h.jobs.mu.Unlock()
	for _, c := range h.jobs.changes[id] {
		if c.Event == nil || c.Event.Type != job.EventDelta {
			continue
		}
		if first && (c.State == nil || !c.State.Streamed) {
			t.Fatalf("the first delta event does not mark the record streamed: %+v", c)
		}
		first = false
		for _, d := range c.Event.Delta {
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

// A streamed request's deltas reach its events in order, and it ends with
// the assembled answer; a request that does not ask is not streamed.
func TestStreamedDeltasReachTheEvents(t *testing.T) {
	t.Parallel()
	h, claude, _ := newStreamHarness(t)
	claude.streams = append(claude.streams, pieces("The sky ", "is blue ", "because of Rayleigh scattering."))
	rec := h.submit(func(r *job.Record) { r.Job.Stream = true })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	end := h.only()
	want := "The sky is blue because of Rayleigh scattering."
	if end.Status != job.StatusCompleted || end.State.Result.Text() != want || !end.State.Streamed {
		t.Fatalf("ending %+v, want completed with the whole answer, marked streamed", end)
	}
	if got := streamedText(t, h, rec.Job.ID); got != want {
		t.Fatalf("deltas carry %q, want %q", got, want)
	}

	plain := h.submit(nil)
	if err := h.process(t.Context(), plain.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	if claude.calls() != 1 || len(h.jobs.eventsOf(plain.Job.ID, job.EventDelta)) != 0 {
		t.Fatalf("a request without stream was streamed (%d Stream calls)", claude.calls())
	}
}

// Before the first delta a failure is like any other: here overload sends
// the request to the fallback route, which streams the answer.
func TestStreamFailureBeforeTheFirstDeltaFallsBack(t *testing.T) {
	t.Parallel()
	h, claude, openai := newStreamHarness(t)
	claude.streams = append(claude.streams, func(func(llm.Delta)) (*llm.Result, error) {
		return nil, &llm.Error{Class: llm.ClassOverloaded, Status: 529, Message: "overloaded"}
	})
	openai.streams = append(openai.streams, pieces("from ", "the fallback"))
	rec := h.submit(func(r *job.Record) { r.Job.Stream = true })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	end := h.only()
	if end.Status != job.StatusCompleted || *end.State.ServedRoute != gpt4o || streamedText(t, h, rec.Job.ID) != "from the fallback" {
		t.Fatalf("ending %+v, want completed by the fallback, streamed", end)
	}
}

// After the first delta the caller holds part of an answer: a failure
// ends the request as interrupted, with no other key, route or retry.
func TestStreamBrokenAfterTheFirstDeltaIsNotRetried(t *testing.T) {
	t.Parallel()
	h, claude, openai := newStreamHarness(t)
	claude.streams = append(claude.streams, func(emit func(llm.Delta)) (*llm.Result, error) {
		emit(llm.Delta{Type: llm.BlockText, Text: "The sky "})
		return nil, &llm.Error{Class: llm.ClassOverloaded, Status: 529, Message: "overloaded"}
	})
	rec := h.submit(func(r *job.Record) { r.Job.Stream = true })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	end := h.only()
	if end.Status != job.StatusFailed || end.Code != job.CodeInterrupted {
		t.Fatalf("ending %+v, want failed %s", end, job.CodeInterrupted)
	}
	if claude.calls() != 1 || openai.calls() != 0 {
		t.Fatalf("%d calls on the route, %d on its fallback; want exactly the one that broke", claude.calls(), openai.calls())
	}
	if got := streamedText(t, h, rec.Job.ID); got != "The sky " {
		t.Fatalf("deltas carry %q", got)
	}
	if got := h.pool.settled(); !slices.Equal(got, []string{"refund sonnet-1"}) {
		t.Fatalf("key settlements %v: want the table's action for overload", got)
	}
}

// A task run again after its worker died mid-stream (the record says
// streamed) ends the request as interrupted without calling anyone.
func TestStreamedRequestRunAgainIsInterrupted(t *testing.T) {
	t.Parallel()
	h, claude, openai := newStreamHarness(t)
	rec := h.submit(func(r *job.Record) {
		r.Job.Stream = true
		r.Status = job.StatusRunning
		r.State.Streamed = true
	})
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	if end := h.only(); end.Status != job.StatusFailed || end.Code != job.CodeInterrupted {
		t.Fatalf("ending %+v, want failed %s", end, job.CodeInterrupted)
	}
	if claude.calls()+openai.calls() != 0 || h.slots.asks() != 0 {
		t.Fatalf("%d calls, %d slot asks; want none", claude.calls()+openai.calls(), h.slots.asks())
	}
}

// Deltas that arrive while a write is under way go out together, and in
// order: one writer per request, never more than the deltas emitted.
func TestDeltaWriterBatchesInOrder(t *testing.T) {
	t.Parallel()
	h, claude, _ := newStreamHarness(t)
	const n = 200
	var want strings.Builder
	claude.streams = append(claude.streams, func(emit func(llm.Delta)) (*llm.Result, error) {
		emit(llm.Delta{Type: llm.BlockText})
		for i := range n {
			p := string(rune('a' + i%26))
			want.WriteString(p)
			emit(llm.Delta{Text: p})
		}
		emit(llm.Delta{Index: 1, Type: llm.BlockToolUse, ToolUseID: "t1", ToolName: "f", Text: "{}"})
		return answer(want.String()), nil
	})
	rec := h.submit(func(r *job.Record) { r.Job.Stream = true })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	evs := h.jobs.eventsOf(rec.Job.ID, job.EventDelta)
	var text strings.Builder
	var last llm.Delta
	for _, ev := range evs {
		for _, d := range ev.Delta {
			if d.Index == 0 {
				text.WriteString(d.Text)
			}
			last = d
		}
	}
	if text.String() != want.String() || last.Index != 1 || last.ToolUseID != "t1" {
		t.Fatalf("deltas out of order: text %q, last %+v", text.String(), last)
	}
	if len(evs) >= n {
		t.Fatalf("%d delta events for %d deltas emitted at once: no batching", len(evs), n)
	}
}
