package service_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/maintenance"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/testkit/mockprovider"
)

// stopAfter wraps the worker's handler: after n provider-call tasks it
// pauses the queue before returning, so with one goroutine exactly n run.
type stopAfter struct {
	next  asynq.Handler
	n     int64
	done  atomic.Int64
	pause func()
}

func (s *stopAfter) ProcessTask(ctx context.Context, t *asynq.Task) error {
	err := s.next.ProcessTask(ctx, t)
	if s.done.Add(1) == s.n {
		s.pause()
	}
	return err
}

// 50 requests queue up with the workers paused; their positions are 1…50;
// 10 complete; every open stream is told it moved down by 10.
func TestQueuePositionsMoveDown(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{Latency: 20 * time.Millisecond}})
	api := s.startAPI()
	insp := s.inspector()
	normal := queue.Name(priority.Normal)
	if err := insp.PauseQueue(normal); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 50)
	for i := range ids {
		code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask(fmt.Sprintf("position test %d", i)), "Accept-Language", "en")
		if code != http.StatusAccepted {
			t.Fatalf("submit %d: %d %v", i, code, out)
		}
		if got := int(out["queue_position"].(float64)); got != i+1 {
			t.Fatalf("request %d: queue_position %d, want %d", i, got, i+1)
		}
		if out["estimated_wait_seconds"] == nil || out["message"] == "" {
			t.Fatalf("no ETA/message: %v", out)
		}
		ids[i] = out["id"].(string)
	}
	streams := make([]<-chan sseEvent, 50)
	for i, id := range ids {
		streams[i], _ = stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
		ev := next(t, streams[i], 5*time.Second, "queued")
		for ev.Data["queue_position"] == nil { // the stored event carries no position; the live one follows
			ev = next(t, streams[i], 5*time.Second, "queued")
		}
		if got := int(ev.Data["queue_position"].(float64)); got != i+1 {
			t.Fatalf("stream %d: position %d, want %d", i, got, i+1)
		}
	}

	// One worker goroutine; the wrapper pauses the queue inside the 10th task.
	s.cfg.Worker.Concurrency = 1
	b := s.open()
	srv, mux := b.Worker(b.Clients())
	h := &stopAfter{next: mux, n: 10, pause: func() { _ = insp.PauseQueue(normal) }}
	m2 := asynq.NewServeMux()
	m2.Handle(queue.TaskType, h)
	if err := srv.Start(m2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); b.Close() })
	if err := insp.UnpauseQueue(normal); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		next(t, streams[i], 20*time.Second, "completed")
	}
	for i := 10; i < 50; i++ {
		want := i + 1 - 10
		for {
			ev := next(t, streams[i], 15*time.Second, "queued", "started")
			if ev.Type == "started" {
				t.Fatalf("stream %d started, but only 10 may run", i)
			}
			if p, ok := ev.Data["queue_position"].(float64); ok && int(p) == want {
				if msg, _ := ev.Data["message"].(string); msg == "" || ev.Data["estimated_wait_seconds"] == nil {
					t.Fatalf("stream %d: no message/ETA: %v", i, ev.Data)
				}
				break
			}
		}
	}
	// The 10th task counts itself just after its stream saw it complete.
	waitFor(t, 5*time.Second, "the 10th task to return", func() bool { return h.done.Load() >= 10 })
	if got := h.done.Load(); got != 10 {
		t.Fatalf("%d tasks ran, want 10", got)
	}
}

// A flood of LOW requests saturates the workers; a CRITICAL request still
// starts within about one provider call.
func TestCriticalOvertakesLowFlood(t *testing.T) {
	t.Parallel()
	const call = 400 * time.Millisecond
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}\nqueue: {queue_max_depth: 1000}",
		mock: mockprovider.Config{Latency: call}})
	api := s.startAPI()
	s.startWorker()
	api.submitMany(t, 80, "low-flood", map[string]any{"priority": "low"})
	// Let the flood occupy the workers.
	waitFor(t, 10*time.Second, "the LOW flood to start", func() bool { return s.mock.Stats().Total().OK >= 1 })

	for round := range 3 {
		start := time.Now()
		id := api.submit(t, map[string]any{"provider": "claude", "model_tier": "sonnet", "priority": "critical",
			"messages": []map[string]any{{"role": "user", "content": "car broke down on the highway " + strconv.Itoa(round)}}})
		ch, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
		next(t, ch, 10*time.Second, "started")
		waited := time.Since(start)
		t.Logf("round %d: CRITICAL started after %s (one provider call is %s)", round, waited, call)
		if waited > 2*call+300*time.Millisecond {
			t.Fatalf("CRITICAL waited %s behind the LOW flood; the bound is about one provider call (%s)", waited, call)
		}
		next(t, ch, 10*time.Second, "completed")
	}
}

func TestAdmissionControl(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}\nqueue: {queue_max_depth: 5}"})
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.Normal))
	api.submitMany(t, 5, "admit", nil)
	code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("one too many"))
	if code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %v", code, out)
	}
	e, _ := out["error"].(map[string]any)
	ra, err := strconv.Atoi(hdr.Get("Retry-After"))
	if e["type"] != "queue_full" || err != nil || ra < 1 {
		t.Fatalf("queue_full body %v, Retry-After %q", out, hdr.Get("Retry-After"))
	}
	info, err := insp.GetQueueInfo(queue.Name(priority.Normal))
	if err != nil || info.Size != 5 {
		t.Fatalf("queue size after refusal: %v %v", info, err)
	}
}

func TestDeadlineFailsWithReason(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}\nqueue: {queue_max_wait: 1s}"})
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.Normal))
	s.startWorker()
	id := api.submit(t, ask("too late"))
	ch, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	next(t, ch, 5*time.Second, "queued")
	time.Sleep(1200 * time.Millisecond) // let the deadline pass: the condition under test
	_ = insp.UnpauseQueue(queue.Name(priority.Normal))
	ev := next(t, ch, 10*time.Second, "failed", "completed")
	if ev.Type != "failed" || !containsStr(ev.Data["error"], "deadline_exceeded") {
		t.Fatalf("expired request ended %s: %v", ev.Type, ev.Data)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.Normal))
	_, a, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("idem"), "Idempotency-Key", "k-1")
	_, b, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("idem"), "Idempotency-Key", "k-1")
	if a["id"] == nil || a["id"] != b["id"] {
		t.Fatalf("ids %v and %v", a["id"], b["id"])
	}
	if info, _ := insp.GetQueueInfo(queue.Name(priority.Normal)); info.Size != 1 {
		t.Fatalf("queue size %d, want 1", info.Size)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{Latency: 5 * time.Second}})
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.High))

	// Queued: removed from the queue, its stream ends with cancelled.
	queued := api.submit(t, map[string]any{"provider": "claude", "model_tier": "sonnet", "priority": "high",
		"messages": []map[string]any{{"role": "user", "content": "cancel me while queued"}}})
	ch, _ := stream(t, api.ts.URL+"/v1/requests/"+queued+"/events", devToken, "")
	next(t, ch, 5*time.Second, "queued")
	if code, out, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+queued, devToken, nil); code != 200 || out["status"] != "cancelled" {
		t.Fatalf("cancel queued: %d %v", code, out)
	}
	next(t, ch, 5*time.Second, "cancelled")
	if info, _ := insp.GetQueueInfo(queue.Name(priority.High)); info.Size != 0 {
		t.Fatalf("cancelled task still queued (%d)", info.Size)
	}

	// In flight: the provider call is abandoned.
	s.startWorker()
	running := api.submit(t, ask("cancel me while running"))
	ch2, _ := stream(t, api.ts.URL+"/v1/requests/"+running+"/events", devToken, "")
	next(t, ch2, 10*time.Second, "started")
	if code, _, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+running, devToken, nil); code != 200 {
		t.Fatalf("cancel running: %d", code)
	}
	next(t, ch2, 5*time.Second, "cancelled")
	waitFor(t, 5*time.Second, "the provider call to be abandoned", func() bool {
		for _, p := range priority.All {
			if info, err := insp.GetQueueInfo(queue.Name(p)); err == nil && info.Active > 0 {
				return false
			}
		}
		return true
	})
	out := api.waitStatus(t, running, time.Second, "cancelled")
	if out["result"] != nil {
		t.Fatalf("cancelled request has a result: %v", out)
	}
	// A second cancel is a conflict, not a success.
	if code, _, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+running, devToken, nil); code != http.StatusConflict {
		t.Fatalf("second cancel: %d", code)
	}
}

func containsStr(v any, sub string) bool {
	s, _ := v.(string)
	return len(sub) == 0 || (len(s) >= len(sub) && stringsContains(s, sub))
}

// With every worker stopped, the periodic expiry job still ends overdue
// queued requests with a reason and removes their tasks.
func TestExpiryJobFailsOverdueQueuedRequests(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	s.cfg.Queue.MaxWait = 300 * time.Millisecond
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.Normal))
	id := api.submit(t, ask("nobody will take me"))
	time.Sleep(400 * time.Millisecond) // let the deadline pass: the condition under test

	b := s.open()
	defer b.Close()
	_, mux := b.Worker(b.Clients()) // the handlers only; no server runs
	if err := mux.ProcessTask(context.Background(), asynq.NewTask(maintenance.TaskExpire, nil)); err != nil {
		t.Fatal(err)
	}
	out := api.waitStatus(t, id, time.Second, "failed")
	if !containsStr(out["error"], "deadline_exceeded") {
		t.Fatalf("reason: %v", out["error"])
	}
	if info, _ := insp.GetQueueInfo(queue.Name(priority.Normal)); info.Size != 0 {
		t.Fatalf("expired task still queued (%d)", info.Size)
	}
}

// With strict_priority, a CRITICAL request submitted after a backlog of LOW
// ones runs first whatever the weights, and its queue position says so.
func TestStrictPriority(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	s.cfg.Queue.StrictPriority = true
	s.cfg.Worker.Concurrency = 1
	// Weights that favour LOW 100 to 1: only strict priority puts CRITICAL
	// first (weighted, it would go first once in 101 picks).
	s.cfg.Queue.Weights[priority.Low], s.cfg.Queue.Weights[priority.Critical] = 100, 1
	api := s.startAPI()
	lows := api.submitMany(t, 5, "strict-low", map[string]any{"priority": "low"})
	code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, map[string]any{"provider": "claude", "model_tier": "sonnet",
		"priority": "critical", "messages": []map[string]any{{"role": "user", "content": "breakdown on the road"}}})
	if code != http.StatusAccepted || out["queue_position"].(float64) != 1 {
		t.Fatalf("critical behind a LOW backlog: %d %v", code, out)
	}
	crit := out["id"].(string)
	s.startWorker()
	startedAt := func(id string) time.Time {
		api.waitStatus(t, id, 20*time.Second, "completed")
		ch, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
		ev := next(t, ch, 5*time.Second, "started")
		at, err := time.Parse(time.RFC3339Nano, ev.Data["at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	critAt := startedAt(crit)
	for _, id := range lows {
		if at := startedAt(id); !at.After(critAt) {
			t.Fatalf("LOW %s started at %s, before CRITICAL at %s", id, at, critAt)
		}
	}
}
