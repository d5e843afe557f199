package progress

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// A waiter with Watch.Event gets every stored event of its request once,
// in order, from the first: those stored before it came (a late joiner),
// and those it could not take as fast as they came (its subscription
// lagged and it replays from the store); then the record at the end.
func TestWaitEndPassesEveryEventOnceFromTheFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	const id, early, late = "req-w1", 3, 3 * bufferSize
	now := time.Now()
	if _, _, err := f.store.Create(context.Background(), &job.Job{ID: id, Tenant: "demo", Priority: priority.Normal,
		CreatedAt: now, Deadline: now.Add(time.Minute)}, job.Event{Type: job.EventQueued}, "", 0); err != nil {
		t.Fatal(err)
	}
	delta := func(i int) job.Event {
		return job.Event{Type: job.EventDelta, Delta: []llm.Delta{{Text: strconv.Itoa(i) + ","}}}
	}
	var want strings.Builder
	for i := range early {
		f.publish(t, id, delta(i))
		want.WriteString(strconv.Itoa(i) + ",")
	}

	var got strings.Builder
	saw, gate := make(chan struct{}, 1), make(chan struct{})
	events := 0
	watch := Watch{Event: func(ev job.Event) error {
		if ev.Type != job.EventDelta {
			return nil
		}
		events++
		for _, d := range ev.Delta {
			got.WriteString(d.Text)
		}
		if events == early {
			saw <- struct{}{}
			<-gate // hold the waiter while many more come: it lags
		}
		return nil
	}}
	type result struct {
		rec *job.Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		rec, err := f.hub.WaitEnd(context.Background(), id, time.Minute, f.store, watch)
		done <- result{rec, err}
	}()
	select {
	case <-saw:
	case <-time.After(10 * time.Second):
		t.Fatal("the events stored before the wait were not passed on")
	}
	for i := early; i < early+late; i++ {
		f.publish(t, id, delta(i))
		want.WriteString(strconv.Itoa(i) + ",")
	}
	if _, err := f.store.Apply(context.Background(), id, job.Change{Tenant: "t", Status: job.StatusCompleted,
		Event: &job.Event{Type: job.EventCompleted}}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	select {
	case r := <-done:
		if r.err != nil || r.rec.Status != job.StatusCompleted {
			t.Fatalf("WaitEnd = %+v, %v; want the completed record", r.rec, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitEnd did not return after the request ended")
	}
	if got.String() != want.String() {
		t.Fatalf("passed on %q\nwant       %q", got.String(), want.String())
	}
}
