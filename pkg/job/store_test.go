package job_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

func newJob(id string) *job.Job {
	return &job.Job{ID: id, Tenant: "t", Priority: priority.Normal, Route: llm.Route{Provider: "claude", Tier: "sonnet"},
		CreatedAt: time.Now(), Deadline: time.Now().Add(time.Minute)}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := job.NewStore(testenv.Redis(t), "b:", time.Hour)

	id, created, err := s.Create(ctx, newJob("r1"), job.Event{Type: job.EventQueued, QueuePosition: 3}, "idem-1", 0)
	if err != nil || !created || id != "r1" {
		t.Fatalf("create: %v %v %v", id, created, err)
	}
	// Same idempotency key: nothing new, the first id.
	id, created, err = s.Create(ctx, newJob("r2"), job.Event{Type: job.EventQueued}, "idem-1", 0)
	if err != nil || created || id != "r1" {
		t.Fatalf("idempotent create: %v %v %v", id, created, err)
	}
	if _, err := s.Get(ctx, "r2"); !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("r2 must not exist: %v", err)
	}

	st := job.State{Attempts: 1}
	if _, err := s.Apply(ctx, "r1", job.Change{Tenant: "t", Status: job.StatusRunning, State: &st, Event: &job.Event{Type: job.EventStarted}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, "r1", job.Change{Tenant: "t", Status: job.StatusCancelled, Reason: "by caller", Event: &job.Event{Type: job.EventCancelled}}); err != nil {
		t.Fatal(err)
	}
	// A late completion must not overwrite the cancellation.
	_, err = s.Apply(ctx, "r1", job.Change{Tenant: "t", Status: job.StatusCompleted, Event: &job.Event{Type: job.EventCompleted}})
	if !errors.Is(err, job.ErrTerminal) {
		t.Fatalf("completion after cancel: %v", err)
	}
	rec, err := s.Get(ctx, "r1")
	if err != nil || rec.Status != job.StatusCancelled || rec.Reason != "by caller" || rec.State.Attempts != 1 {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if st, err := s.StatusOf(ctx, "r1"); err != nil || st != job.StatusCancelled {
		t.Fatalf("StatusOf: %q %v", st, err)
	}
	if _, err := s.StatusOf(ctx, "r2"); !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("StatusOf of no record: %v", err)
	}
	evs, err := s.Events(ctx, "r1", "")
	if err != nil || len(evs) != 3 {
		t.Fatalf("events: %v %v", evs, err)
	}
	if evs[0].Type != job.EventQueued || evs[0].QueuePosition != 3 || evs[2].Type != job.EventCancelled {
		t.Fatalf("events: %+v", evs)
	}
	after, err := s.Events(ctx, "r1", evs[0].ID)
	if err != nil || len(after) != 2 || after[0].ID != evs[1].ID {
		t.Fatalf("events after %s: %+v %v", evs[0].ID, after, err)
	}
	if job.CompareIDs(evs[0].ID, evs[1].ID) >= 0 {
		t.Fatal("stream ids must increase")
	}
	if _, err := s.Apply(ctx, "nope", job.Change{Tenant: "t", Status: job.StatusRunning}); !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

// What an ended request keeps: its record without the prompt's embedding
// (the call's cache write had it) for the result TTL, its event stream for
// job.EndedEventsTTL (never longer than the record).
func TestEndedRequestKeepsLess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	for _, ttl := range []time.Duration{time.Hour, 2 * time.Minute} {
		prefix := fmt.Sprintf("k%d:", ttl/time.Second)
		s := job.NewStore(rdb, prefix, ttl)
		j := newJob("e1")
		j.Embedding = []float32{0.5, -0.5}
		if _, _, err := s.Create(ctx, j, job.Event{Type: job.EventQueued}, "", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Apply(ctx, "e1", job.Change{Tenant: "t", Status: job.StatusRunning, Event: &job.Event{Type: job.EventStarted}}); err != nil {
			t.Fatal(err)
		}
		if rec, err := s.GetWithEmbedding(ctx, "e1"); err != nil || len(rec.Job.Embedding) != 2 {
			t.Fatalf("running: embedding %v %v", rec.Job.Embedding, err)
		}
		if _, err := s.Apply(ctx, "e1", job.Change{Tenant: "t", Status: job.StatusCompleted, State: &job.State{},
			Event: &job.Event{Type: job.EventCompleted}}); err != nil {
			t.Fatal(err)
		}
		if rec, err := s.GetWithEmbedding(ctx, "e1"); err != nil || rec.Status != job.StatusCompleted || rec.Job.Embedding != nil {
			t.Fatalf("ended: %+v %v, want no embedding", rec, err)
		}
		streamTTL := min(job.EndedEventsTTL, ttl)
		for key, want := range map[string]time.Duration{prefix + "job:e1": ttl, prefix + "ev:e1": streamTTL} {
			if got := rdb.TTL(ctx, key).Val(); got <= want-time.Minute || got > want {
				t.Fatalf("%s kept for %s, want %s", key, got, want)
			}
		}
		// An ending that says how long to keep the record (a caller that
		// took its answer: finish) is kept that long, its events no longer.
		if _, _, err := s.Create(ctx, newJob("e2"), job.Event{Type: job.EventQueued}, "", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Apply(ctx, "e2", job.Change{Tenant: "t", Status: job.StatusCompleted, State: &job.State{}, Keep: 90 * time.Second,
			Event: &job.Event{Type: job.EventCompleted}}); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{prefix + "job:e2", prefix + "ev:e2"} {
			if got := rdb.TTL(ctx, key).Val(); got <= 30*time.Second || got > 90*time.Second {
				t.Fatalf("%s kept for %s, want 90s", key, got)
			}
		}
	}
}

// The prompt's embedding is read only by GetWithEmbedding: Get, on every
// wait and poll, decodes no vector. A record written before the embedding
// had its own field (inside the job JSON) still gives it back.
func TestEmbeddingReadOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := job.NewStore(rdb, "b:", time.Hour)
	j := newJob("e1")
	j.Embedding = []float32{0.25, -1, 0, 3.5e-7, float32(math.Pi)}
	if _, _, err := s.Create(ctx, j, job.Event{Type: job.EventQueued}, "", 0); err != nil {
		t.Fatal(err)
	}
	raw, err := rdb.HGet(ctx, "b:job:e1", "job").Result()
	if err != nil || strings.Contains(raw, "embedding") {
		t.Fatalf("the job JSON carries the embedding: %s %v", raw, err)
	}
	rec, err := s.Get(ctx, "e1")
	if err != nil || rec.Job.Embedding != nil || rec.Job.ID != "e1" {
		t.Fatalf("Get: %+v %v", rec, err)
	}
	rec, err = s.GetWithEmbedding(ctx, "e1")
	if err != nil || !slices.Equal(rec.Job.Embedding, j.Embedding) {
		t.Fatalf("GetWithEmbedding: %v %v", rec.Job.Embedding, err)
	}

	legacy := newJob("e2")
	legacy.Embedding = []float32{1, 2}
	body, _ := json.Marshal(legacy)
	if err := rdb.HSet(ctx, "b:job:e2", "job", string(body), "status", string(job.StatusQueued), "state", "{}").Err(); err != nil {
		t.Fatal(err)
	}
	rec, err = s.GetWithEmbedding(ctx, "e2")
	if err != nil || !slices.Equal(rec.Job.Embedding, legacy.Embedding) {
		t.Fatalf("legacy record: %v %v", rec.Job.Embedding, err)
	}
	if _, err := s.GetWithEmbedding(ctx, "none"); !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("no record: %v", err)
	}
}

// A request that ends as it is stored (a cache hit) is one script: the
// record ended, its queued and terminal events in order, never live, kept
// for the result TTL, and its idempotency key answers a retry.
func TestCreateEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := job.NewStore(rdb, "ce:", time.Hour)
	j := newJob("h1")
	j.Embedding = []float32{1, 0}
	st := job.State{Cached: job.CachedExact, Similarity: 1, Result: &llm.Response{StopReason: llm.StopEndTurn}}
	end := job.Change{Status: job.StatusCompleted, State: &st, Event: &job.Event{Type: job.EventCompleted}}
	sub := rdb.Subscribe(ctx, s.Channel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	id, created, err := s.CreateEnded(ctx, j, job.Event{Type: job.EventQueued}, "idem-h", end)
	if err != nil || !created || id != "h1" {
		t.Fatalf("CreateEnded: %v %v %v", id, created, err)
	}
	// Its events are not published (nobody can follow it yet): the first
	// message heard is one sent after it.
	if err := rdb.Publish(ctx, s.Channel(), "after").Err(); err != nil {
		t.Fatal(err)
	}
	if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != "after" {
		t.Fatalf("first message on the channel: %+v %v, want the one sent after CreateEnded", msg, err)
	}
	// Ended as stored, it keeps no embedding: no call will write the cache.
	rec, err := s.GetWithEmbedding(ctx, "h1")
	if err != nil || rec.Status != job.StatusCompleted || rec.State.Cached != job.CachedExact || rec.State.Result == nil ||
		rec.Job.Embedding != nil {
		t.Fatalf("record: %+v %v", rec, err)
	}
	evs, err := s.Events(ctx, "h1", "")
	if err != nil || len(evs) != 2 || evs[0].Type != job.EventQueued || evs[1].Type != job.EventCompleted ||
		evs[1].Status != job.StatusCompleted {
		t.Fatalf("events: %+v %v", evs, err)
	}
	if live, err := s.Live(ctx, time.Now().Add(time.Hour), 10); err != nil || len(live) != 0 {
		t.Fatalf("an ended request is live: %v %v", live, err)
	}
	// The record for the result TTL, its events for job.EndedEventsTTL.
	for key, want := range map[string]time.Duration{"ce:job:h1": time.Hour, "ce:ev:h1": job.EndedEventsTTL} {
		if ttl := rdb.TTL(ctx, key).Val(); ttl <= want-time.Minute || ttl > want {
			t.Fatalf("%s kept for %s, want %s", key, ttl, want)
		}
	}
	// A late ending is refused as for any ended request.
	if _, err := s.Apply(ctx, "h1", job.Change{Tenant: "t", Status: job.StatusFailed}); !errors.Is(err, job.ErrTerminal) {
		t.Fatalf("second ending: %v", err)
	}
	id, created, err = s.CreateEnded(ctx, newJob("h2"), job.Event{Type: job.EventQueued}, "idem-h", end)
	if err != nil || created || id != "h1" {
		t.Fatalf("retry with the idempotency key: %v %v %v", id, created, err)
	}
	// A failed ending keeps its reason and code.
	failed := job.Change{Status: job.StatusFailed, State: &job.State{}, Reason: "no_route: none", Code: job.CodeNoRoute,
		Event: &job.Event{Type: job.EventFailed}}
	if _, _, err := s.CreateEnded(ctx, newJob("h4"), job.Event{Type: job.EventQueued}, "", failed); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "h4"); err != nil || rec.Status != job.StatusFailed || rec.Reason != "no_route: none" || rec.Code != job.CodeNoRoute {
		t.Fatalf("failed as stored: %+v %v", rec, err)
	}
	if _, _, err := s.CreateEnded(ctx, newJob("h3"), job.Event{}, "", job.Change{Status: job.StatusRunning, State: &st, Event: &job.Event{}}); err == nil {
		t.Fatal("a request cannot be stored ended as running")
	}
}

// A join key names its request from its creation until Unjoin: a create
// with it meanwhile stores nothing and returns that request, ended or not.
// An ending keeps the key only as long as the record; Unjoin drops it (only
// for the request it names), and the same call is then new.
func TestJoinKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := job.NewStore(rdb, "b:", time.Hour)
	withKey := func(id string) *job.Job {
		j := newJob(id)
		j.JoinKey, j.KeepEnded = "k1", job.EndedEventsTTL
		return j
	}
	if id, err := s.Joinable(ctx, "k1"); err != nil || id != "" {
		t.Fatalf("joinable before: %q %v", id, err)
	}
	if _, created, err := s.Create(ctx, withKey("r1"), job.Event{Type: job.EventQueued}, "", 0); err != nil || !created {
		t.Fatalf("create r1: %v %v", created, err)
	}
	if id, err := s.Joinable(ctx, "k1"); err != nil || id != "r1" {
		t.Fatalf("joinable: %q %v, want r1", id, err)
	}
	id, created, err := s.Create(ctx, withKey("r2"), job.Event{Type: job.EventQueued}, "", 0)
	if err != nil || created || id != "r1" {
		t.Fatalf("create r2: %q %v %v, want r1 not created", id, created, err)
	}
	if _, err := s.Get(ctx, "r2"); !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("r2 stored: %v", err)
	}
	if _, err := s.Apply(ctx, "r1", job.Change{Tenant: "t", Status: job.StatusCompleted, Join: "k1", Keep: job.EndedEventsTTL}); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Joinable(ctx, "k1"); id != "r1" {
		t.Fatalf("ended, not delivered: joinable %q, want r1", id)
	}
	if ttl := rdb.TTL(ctx, "b:join:k1").Val(); ttl <= 0 || ttl > job.EndedEventsTTL {
		t.Fatalf("join key TTL after the end %s, want the record's %s", ttl, job.EndedEventsTTL)
	}
	if err := s.Unjoin(ctx, "k1", "r0"); err != nil { // another request's: a no-op
		t.Fatal(err)
	}
	if id, _ := s.Joinable(ctx, "k1"); id != "r1" {
		t.Fatalf("after another's unjoin: joinable %q, want r1", id)
	}
	if err := s.Unjoin(ctx, "k1", "r1"); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Joinable(ctx, "k1"); id != "" {
		t.Fatalf("delivered: joinable %q", id)
	}
	if _, created, err := s.Create(ctx, withKey("r3"), job.Event{Type: job.EventQueued}, "", 0); err != nil || !created {
		t.Fatalf("create r3 after the answer was delivered: %v %v", created, err)
	}
	// r1's late second ending (refused) and unjoin leave r3's key alone.
	if err := s.Unjoin(ctx, "k1", "r1"); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Joinable(ctx, "k1"); id != "r3" {
		t.Fatalf("joinable %q, want r3", id)
	}
}

// An idempotency key names its request as long as the record lives and no
// longer: ending the request gives the key the record's TTL (it had the
// queued record's, up to queue_max_wait longer), so a retry with the key
// never finds an id whose record is gone. So does a request ended as it
// is stored.
func TestIdempotencyKeyGoesWithTheRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := job.NewStore(rdb, "b:", time.Hour)
	j := newJob("r1")
	j.Deadline = time.Now().Add(5 * time.Minute)
	if _, created, err := s.Create(ctx, j, job.Event{Type: job.EventQueued}, "idem-1", 0); err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	keep := 10 * time.Minute
	if _, err := s.Apply(ctx, "r1", job.Change{Status: job.StatusCompleted, Event: &job.Event{Type: job.EventCompleted},
		Keep: keep, Tenant: "t", Idem: "idem-1"}); err != nil {
		t.Fatal(err)
	}
	rec, key := rdb.TTL(ctx, "b:job:r1").Val(), rdb.TTL(ctx, "b:idem:t:idem-1").Val()
	if rec <= 0 || key <= 0 || key > rec {
		t.Fatalf("after the end: record TTL %s, idempotency key TTL %s; want the key gone no later than the record", rec, key)
	}

	st := job.State{Result: &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: "hit"}}}}
	if _, created, err := s.CreateEnded(ctx, newJob("r2"), job.Event{Type: job.EventQueued}, "idem-2",
		job.Change{Status: job.StatusCompleted, State: &st, Event: &job.Event{Type: job.EventCompleted}, Keep: keep}); err != nil || !created {
		t.Fatalf("create ended: %v %v", created, err)
	}
	rec, key = rdb.TTL(ctx, "b:job:r2").Val(), rdb.TTL(ctx, "b:idem:t:idem-2").Val()
	if rec <= 0 || key <= 0 || key > rec {
		t.Fatalf("ended as stored: record TTL %s, idempotency key TTL %s", rec, key)
	}
}
