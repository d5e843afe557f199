package service_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/maintenance"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/service"
	"bulwark/pkg/testkit/mockprovider"
)

// An API that dies between storing a request and enqueueing it (the
// failpoint) leaves a record with no task. The orphan sweep every worker
// runs finds it and enqueues it: the request completes, and the caller's
// Idempotency-Key retry gets the same request, not a zombie.
func TestOrphanedRequestIsRun(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	crashing := s.startAPIWith(func(b *service.Base) {
		b.AfterStore = func(string) error { return errors.New("failpoint: the API dies here") }
	})
	api := s.startAPI()
	s.startWorker()

	code, out, _ := call(t, "POST", crashing.ts.URL+"/v1/requests", devToken, ask("orphaned by a crash"), "Idempotency-Key", "orphan-1")
	if code < 500 {
		t.Fatalf("the crashing API answered %d %v", code, out)
	}
	code, out, _ = call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("orphaned by a crash"), "Idempotency-Key", "orphan-1")
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("the retry: %d %v", code, out)
	}
	id := out["id"].(string)
	// The sweep looks at requests older than 10 s, every 5 s.
	done := api.waitStatus(t, id, 40*time.Second, "completed", "failed")
	res, _ := done["result"].(map[string]any)
	if done["status"] != "completed" || res["content"] != mockprovider.Reply("orphaned by a crash") {
		t.Fatalf("orphaned request: %v", done)
	}
}

// A request coalesced into another keeps a life of its own: when the
// request it joined is cancelled by its caller, the follower is not
// cancelled with it; it gets a call of its own and completes.
func TestFollowerOutlivesCancelledLeader(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{mock: mockprovider.Config{Latency: 2 * time.Second}})
	api := s.startAPI()
	s.startWorker()

	leader := api.submit(t, ask("one question, two callers"))
	code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("one question, two callers"))
	if code != http.StatusAccepted || out["coalesced"] != true {
		t.Fatalf("the second identical request was not coalesced: %d %v", code, out)
	}
	follower := out["id"].(string)
	ch, _ := stream(t, api.ts.URL+"/v1/requests/"+follower+"/events", devToken, "")

	if code, out, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+leader, devToken, nil); code != http.StatusOK {
		t.Fatalf("cancel the leader: %d %v", code, out)
	}
	if got := api.waitStatus(t, leader, 5*time.Second, "cancelled"); got["status"] != "cancelled" {
		t.Fatalf("leader: %v", got)
	}
	// The follower's stream does not end with the leader's cancellation.
	ev := next(t, ch, 45*time.Second, "completed", "failed", "cancelled")
	if ev.Type != "completed" {
		t.Fatalf("follower stream ended %s %v", ev.Type, ev.Data)
	}
	done := api.waitStatus(t, follower, 10*time.Second, "completed", "failed", "cancelled")
	res, _ := done["result"].(map[string]any)
	if done["status"] != "completed" || res["content"] != mockprovider.Reply("one question, two callers") {
		t.Fatalf("follower: %v", done)
	}
}

// Requests that differ in a parameter that changes the answer are never
// coalesced nor answered from each other's cache entry.
func TestCoalescingKeyCoversParameters(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{mock: mockprovider.Config{Latency: time.Second}})
	api := s.startAPI()
	s.startWorker()

	base := ask("same words, other limits")
	short := ask("same words, other limits")
	short["max_tokens"] = 3
	api.submit(t, base)
	code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, short)
	if code != http.StatusAccepted || out["coalesced"] == true {
		t.Fatalf("a request with another max_tokens was coalesced: %d %v", code, out)
	}
	done := api.waitStatus(t, out["id"].(string), 30*time.Second, "completed", "failed")
	res, _ := done["result"].(map[string]any)
	if done["status"] != "completed" || res["stop_reason"] != "max_tokens" {
		t.Fatalf("the short request got %v, want its own answer cut at max_tokens", done)
	}
}

// A CRITICAL request that joins a queued LOW one with the same question
// does not wait at LOW: the shared call moves to the CRITICAL queue (and
// its slot wait with it), and both callers get the answer.
func TestSharedCallRunsAtTheMostUrgentPriority(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI() // no worker yet: the LOW request stays queued
	low := ask("a question asked twice")
	low["priority"] = "low"
	leader := api.submit(t, low)
	urgent := ask("a question asked twice")
	urgent["priority"] = "critical"
	code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, urgent)
	if code != http.StatusAccepted || out["coalesced"] != true {
		t.Fatalf("the CRITICAL request was not coalesced: %d %v", code, out)
	}
	follower := out["id"].(string)
	insp := s.inspector()
	if info, err := insp.GetTaskInfo(queue.Name(priority.Critical), leader); err != nil || info.State != asynq.TaskStatePending {
		t.Fatalf("the shared call is not pending in the CRITICAL queue: %v %v", info, err)
	}
	if _, err := insp.GetTaskInfo(queue.Name(priority.Low), leader); !errors.Is(err, asynq.ErrTaskNotFound) {
		t.Fatalf("the shared call is still in the LOW queue: %v", err)
	}
	s.startWorker()
	for _, id := range []string{leader, follower} {
		done := api.waitStatus(t, id, 30*time.Second, "completed", "failed", "cancelled")
		res, _ := done["result"].(map[string]any)
		if done["status"] != "completed" || res["content"] != mockprovider.Reply("a question asked twice") {
			t.Fatalf("%s: %v", id, done)
		}
	}
}

// A coalesced request has a deadline of its own: when it passes while the
// shared call has not started, the sweep fails the follower with
// deadline_exceeded, and the leader, whose own deadline is not the
// follower's, is left alone.
func TestFollowerDeadlineIsItsOwn(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	s.cfg.Queue.MaxWait = time.Second
	api := s.startAPI() // no worker: the shared call never starts
	leader := api.submit(t, ask("nobody will answer in time"))
	code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("nobody will answer in time"))
	if code != http.StatusAccepted || out["coalesced"] != true {
		t.Fatalf("not coalesced: %d %v", code, out)
	}
	follower := out["id"].(string)
	sw := maintenance.NewSweeper(maintenance.SweeperDeps{Jobs: api.base.Jobs, Queue: api.base.Queue, Finisher: api.base.Finisher,
		Redis: api.base.Redis, Prefix: s.cfg.Redis.Prefix + t.Name() + ":", Logger: s.logger(), Age: time.Millisecond})
	waitFor(t, 10*time.Second, "the follower to fail on its own deadline", func() bool {
		if err := sw.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
		f, err := api.base.Jobs.Get(t.Context(), follower)
		return err == nil && f.Status == "failed" && f.Code == "deadline_exceeded"
	})
	// The leader's own deadline is the expiry job's business (not run
	// here): the follower's ending did not end it.
	if l, err := api.base.Jobs.Get(t.Context(), leader); err != nil || l.Status != "queued" {
		t.Fatalf("the leader ended with the follower: %v %v", l, err)
	}
}

// The same through a compat endpoint: a call that joined an identical
// request in flight is answered with a call of its own when that request's
// caller cancels it, not with the other caller's 409 cancelled.
func TestCompatFollowerOutlivesCancelledLeader(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{mock: mockprovider.Config{Latency: 2 * time.Second}})
	api := s.startAPI()
	s.startWorker()
	prompt := "one question, an async caller and an SDK"
	leader := api.submit(t, ask(prompt))

	type answer struct {
		resp *http.Response
		raw  []byte
	}
	done := make(chan answer, 1)
	go func() {
		body := `{"model":"claude-sonnet","messages":[{"role":"user","content":"` + prompt + `"}]}`
		resp, raw := send(t, "POST", api.ts.URL+"/v1/chat/completions", body, "Authorization", "Bearer "+devToken)
		done <- answer{resp, raw}
	}()
	rdb := redis.NewClient(s.redis)
	defer rdb.Close()
	waitFor(t, 10*time.Second, "the compat call to join the request in flight", func() bool {
		n, err := rdb.ZCard(context.Background(), "bulwark:{job}:live").Result()
		return err == nil && n == 2
	})
	if code, out, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+leader, devToken, nil); code != http.StatusOK {
		t.Fatalf("cancel the leader: %d %v", code, out)
	}
	a := <-done
	if a.resp.StatusCode != http.StatusOK || !strings.Contains(string(a.raw), mockprovider.Reply(prompt)) ||
		a.resp.Header.Get("X-Bulwark-Cache") != "none" {
		t.Fatalf("the compat caller got %d %v\n%s", a.resp.StatusCode, a.resp.Header, a.raw)
	}
}
