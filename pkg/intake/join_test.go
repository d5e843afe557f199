package intake_test

import (
	"context"
	"testing"

	"bulwark/pkg/finish"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
)

// A compat call resent while the one it repeats has not ended (an SDK's
// retry: same tenant, same request, no Idempotency-Key) joins it, whatever
// the cache settings and even when the queue is full or the tenant's rate
// limit would refuse a new request: the first request's id back, nothing
// stored, queued or called — and, once it has ended, its answer, until
// that was delivered. After that the same call is a request of its own; a
// call that differs in anything is never joined.
func TestSubmitResendJoins(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cache bool
		edit  func(*intake.Submission)
	}{
		{"cache on", true, func(*intake.Submission) {}},
		{"cache bypassed", true, func(s *intake.Submission) { s.NoCacheRead, s.NoCacheWrite = true, true }},
		{"cache off", false, func(*intake.Submission) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(func(c *intake.Config) { c.CacheEnabled = tc.cache })
			tn := demo
			tn.RateLimitRPM = 1
			s := ask("why did OTA batch 42 fail?")
			s.Waited = true
			tc.edit(&s)
			first := r.submit(t, tn, s)
			if first.Existing || first.ID == "" || first.JoinKey == "" {
				t.Fatalf("first %+v", first)
			}
			// The resend comes when a new request would be refused twice over.
			r.limiter.mu.Lock()
			r.limiter.deny = true
			r.limiter.mu.Unlock()
			r.queue.mu.Lock()
			r.queue.admitErr = &queue.FullError{Depth: 200}
			r.queue.mu.Unlock()
			again := r.submit(t, tn, s)
			if again.ID != first.ID || !again.Existing || again.Status != job.StatusQueued || again.JoinKey != first.JoinKey {
				t.Fatalf("resend %+v, want request %s existing", again, first.ID)
			}
			if enq, _ := r.queue.tasks(); len(enq) != 1 || r.jobs.count() != 1 {
				t.Fatalf("enqueued %v, stored %d: the resend became a request", enq, r.jobs.count())
			}
			if calls := r.limiter.calls(); len(calls) != 1 {
				t.Fatalf("rate limiter asked %v, want once, for the first", calls)
			}

			// The same call from another tenant, at another priority or
			// with other cache settings is not a resend.
			r.limiter.mu.Lock()
			r.limiter.deny = false
			r.limiter.mu.Unlock()
			r.queue.mu.Lock()
			r.queue.admitErr = nil
			r.queue.mu.Unlock()
			other := tn
			other.Name = "other"
			urgent := s
			urgent.Priority = priority.Critical
			fresh := s
			fresh.NoCacheRead = !s.NoCacheRead
			for name, c := range map[string]struct {
				tn intake.Tenant
				s  intake.Submission
			}{"another tenant": {other, s}, "another priority": {tn, urgent}, "other cache settings": {tn, fresh}} {
				if a := r.submit(t, c.tn, c.s); a.ID == first.ID || a.Existing {
					t.Fatalf("%s joined %s: %+v", name, first.ID, a)
				}
			}

			// Ended with nobody to take the answer (the caller had given
			// up): a resend gets it.
			rec := r.jobs.record(t, first.ID)
			if err := r.finisher.Finish(context.Background(), &rec, finish.Completed(job.State{Result: answer("a")})); err != nil {
				t.Fatal(err)
			}
			ended := r.submit(t, tn, s)
			if ended.ID != first.ID || ended.Status != job.StatusCompleted || ended.Result == nil || ended.JoinKey != first.JoinKey {
				t.Fatalf("after the end: %+v, want %s's answer", ended, first.ID)
			}
			// Once the answer was delivered (the compat endpoint unjoins),
			// the same call is new.
			if err := r.jobs.Unjoin(context.Background(), first.JoinKey, first.ID); err != nil {
				t.Fatal(err)
			}
			if later := r.submit(t, tn, s); later.ID == first.ID || later.Existing {
				t.Fatalf("after the answer was delivered: %+v joined %s", later, first.ID)
			}
		})
	}
}

// Only a compat call without a key has a join key: an async request, and a
// call with an Idempotency-Key (found by its key, kept longer), have none.
func TestJoinKeyOnlyForKeylessCompatCalls(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	for _, tc := range []struct {
		waited bool
		key    string
		want   bool
	}{{true, "", true}, {false, "", false}, {true, "k", false}} {
		s := ask("q " + tc.key)
		s.Waited, s.IdempotencyKey = tc.waited, tc.key
		a := r.submit(t, demo, s)
		if got := r.jobs.record(t, a.ID).Job.JoinKey != ""; got != tc.want {
			t.Fatalf("waited %v, key %q: join key %v, want %v", tc.waited, tc.key, got, tc.want)
		}
	}
	// A resend of an async request is a new request.
	a, b := r.submit(t, demo, ask("async")), r.submit(t, demo, ask("async"))
	if a.ID == b.ID {
		t.Fatalf("two async submissions share %s", a.ID)
	}
}

// A join key whose record is gone (lost in a failover) holds nothing: the
// resend is taken as a new request, and the key now names that one.
func TestSubmitJoinKeyOfALostRecord(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	s := ask("lost")
	s.Waited = true
	first := r.submit(t, demo, s)
	r.jobs.mu.Lock()
	delete(r.jobs.recs, first.ID)
	r.jobs.mu.Unlock()
	again := r.submit(t, demo, s)
	if again.ID == first.ID || again.Existing {
		t.Fatalf("resend %+v joined the lost %s", again, first.ID)
	}
	if id, _ := r.jobs.Joinable(context.Background(), again.JoinKey); id != again.ID {
		t.Fatalf("join key names %q, want %s", id, again.ID)
	}
}
