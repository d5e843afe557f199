package storm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFaultRedisFailover fails the Redis master over in the middle of a
// storm of 200 requests (mock latency 500 ms, every fourth request through
// the compat endpoint) on a Sentinel setup — master, one replica, three
// sentinels — with redis.min_replicas_acked 1: the API answers 202 only
// once the replica holds the request. Every request must complete with
// its own answer, none called again once answered:
//
//   - coordinated: SENTINEL FAILOVER promotes the replica as it is; the
//     old master keeps running as a master until the sentinels turn it
//     into the new master's replica (about ten seconds), and whatever was
//     written to it after the promotion is lost then. Submissions meanwhile
//     get 503 (no replica confirms) and are sent again.
//   - killed: SIGKILL of the master, promotion after down-after (1 s), the
//     old master started again, empty, as the new master's replica.
//
// Recovery: from the promotion to the first request that ended after it.
func TestFaultRedisFailover(t *testing.T) {
	t.Parallel()
	t.Run("coordinated", func(t *testing.T) { t.Parallel(); testRedisFailover(t, false) })
	t.Run("killed", func(t *testing.T) { t.Parallel(); testRedisFailover(t, true) })
}

func testRedisFailover(t *testing.T, kill bool) {
	name := "F-redis-failover"
	if kill {
		name = "F-redis-master-killed"
	}
	sc := faultScenario(name, 200, 500*time.Millisecond, 100*time.Millisecond)
	f := setupFault(t, sc, options{Workers: 2, Sentinel: true}, 4)
	ctx := t.Context()

	// Half the requests at once; the other half one every 150 ms from the
	// failover on, so that submissions meet it. Room for asynq to give
	// back a task whose end was lost with the old master: lease (30 s) +
	// 30 s + its recoverer's minute.
	f.begin(ctx, 240*time.Second)
	for i := range len(f.reqs) / 2 {
		f.launch(i, f.one)
	}
	if err := f.awaitEnded(ctx, 30); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	type outcome struct {
		old, nm           string
		promoted, settled time.Time
		err               error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		if kill {
			if o.old, o.nm, o.err = f.sys.ha.killMaster(ctx); o.err == nil {
				o.promoted = time.Now()
				if o.err = f.sys.ha.restart(ctx, f.sys, o.old, o.nm); o.err == nil {
					o.settled = time.Now()
				}
			}
		} else {
			o.old, o.nm, o.promoted, o.settled, o.err = f.sys.ha.failover(ctx)
		}
		done <- o
	}()
	for i := len(f.reqs) / 2; i < len(f.reqs); i++ {
		f.launch(i, f.one)
		if !sleep(ctx, 150*time.Millisecond) {
			break
		}
	}
	f.launched()
	o := <-done
	if o.err != nil {
		t.Fatalf("failover: %v", o.err)
	}
	t.Logf("master %s → %s: promoted after %.1fs, replica back after %.1fs", o.old, o.nm,
		o.promoted.Sub(began).Seconds(), o.settled.Sub(began).Seconds())
	cut := f.wait(ctx)
	// A completion written to the old master after the promotion is lost
	// with it (its client saw it end): the record is running again until
	// asynq gives the task back and a worker ends it once more.
	redone := f.awaitTerminal(context.WithoutCancel(ctx), 180*time.Second)
	f.verify(verifyCtx(t))

	res, problems := f.result(t.Name(), nil)
	// Calls again of prompts answered in the failover's window are those
	// redone completions; any other is a problem still.
	again := 0
	for _, rp := range repeats(undelivered(f.calls.snapshot(), nil)) {
		if rp.Answered.End.After(began.Add(-time.Second)) && rp.Answered.End.Before(o.settled) {
			again++
		}
	}
	if again == res.Duplicates {
		problems = slices.DeleteFunc(problems, func(p string) bool { return strings.HasPrefix(p, "(c)") })
	}
	var first time.Time
	open, retried := 0, 0
	for i := range f.reqs {
		r := &f.reqs[i]
		if !r.endAt.IsZero() && r.endAt.After(o.promoted) && (first.IsZero() || r.endAt.Before(first)) {
			first = r.endAt
		}
		if r.id != "" && r.accepted.Before(began) && (r.endAt.IsZero() || r.endAt.After(began)) {
			open++
		}
		if r.submits > 1 {
			retried++
		}
	}
	res.RecoveryWhat = "promotion→first request ended"
	if !first.IsZero() {
		res.Recovery = []time.Duration{first.Sub(o.promoted)}
	}
	res.Notes = fmt.Sprintf("failover_at=+%.1fs promoted_after=%.1fs replica_back_after=%.1fs accepted_open_at_failover=%d "+
		"resubmitted_before_accepted=%d records_not_ended_after_load=%d calls_again_in_failover=%d",
		began.Sub(f.began).Seconds(), o.promoted.Sub(began).Seconds(), o.settled.Sub(began).Seconds(), open, retried, redone, again)
	if cut != nil {
		problems = append(problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	finish(t, f, res, problems)
}

// awaitTerminal reads every accepted request until it has ended, for at
// most within, and returns how many had not ended at the first read.
func (f *faultRun) awaitTerminal(ctx context.Context, within time.Duration) int {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	ended := func(id string) bool {
		var v requestView
		code, _, raw, err := f.d.send(ctx, http.MethodGet, "/v1/requests/"+id, nil, nil)
		return err == nil && code == http.StatusOK && json.Unmarshal(raw, &v) == nil && v.Status.Terminal()
	}
	var open []string
	for i := range f.reqs {
		if id := f.reqs[i].id; id != "" && !ended(id) {
			open = append(open, id)
		}
	}
	for _, id := range open {
		for !ended(id) {
			if !sleep(ctx, 500*time.Millisecond) {
				return len(open)
			}
		}
	}
	return len(open)
}
