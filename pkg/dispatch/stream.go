package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
)

// A streamed request (job.Job.Stream) is called with the adapter's
// llm.Streamer when it has one, and each delta the provider sends goes to
// the request's event stream as it arrives (job.EventDelta), where the API
// process holding the caller's connection, and any event stream on the
// request, reads it. An adapter without streaming would reach a
// streaming caller whole, at the end (every adapter streams today).
//
// The worker never waits for a reader: it writes the deltas to Redis and
// keeps reading the provider, whoever is slow. Writes are one at a time
// per request and at most every job.DeltaEvery; deltas that arrive while
// one is under way go out together in the next.
//
// Once the first delta is written the caller holds part of an answer, and
// the request is never called again: a failure from then on (an error
// event, a cut connection, a worker that dies) ends it as
// job.CodeInterrupted rather than write a second, different answer.

// deltaWriter writes one call's deltas to its request's events.
type deltaWriter struct {
	ctx   context.Context
	jobs  Jobs
	id    string
	owner string    // its tenant, charged for the events
	state job.State // the record's state, marked Streamed with the first write
	log   *slog.Logger

	mu      sync.Mutex
	pending []llm.Delta
	closing bool
	wake    chan struct{}
	done    chan struct{}
	// written counts the delta events sent, marked says the record is
	// marked Streamed (both owned by run).
	written int
	marked  bool
}

// streamTo starts a writer of rec's deltas.
func (d *Dispatcher) streamTo(ctx context.Context, rec *job.Record, log *slog.Logger) *deltaWriter {
	w := &deltaWriter{ctx: context.WithoutCancel(ctx), jobs: d.jobs, id: rec.Job.ID, owner: rec.Job.Tenant, state: rec.State, log: log,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// emit queues a delta; it never blocks on Redis (llm.Streamer's emit).
func (w *deltaWriter) emit(dl llm.Delta) {
	w.mu.Lock()
	if n := len(w.pending); n > 0 && dl.Type == "" && w.pending[n-1].Index == dl.Index {
		w.pending[n-1].Text += dl.Text // the same block goes on: one piece
	} else {
		w.pending = append(w.pending, dl)
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// close writes what is pending and stops the writer. It reports whether
// any delta was written: the caller then holds part of the answer.
func (w *deltaWriter) close() bool {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.done
	return w.written > 0
}

func (w *deltaWriter) run() {
	defer close(w.done)
	var last time.Time
	for {
		<-w.wake
		if wait := job.DeltaEvery - time.Since(last); wait > 0 && !last.IsZero() {
			time.Sleep(wait) // the pace of the writes, not a synchronisation
		}
		w.mu.Lock()
		batch, closing := w.pending, w.closing
		w.pending = nil
		w.mu.Unlock()
		if len(batch) > 0 {
			last = time.Now()
			if !w.write(batch) {
				w.drain()
				return
			}
		}
		if closing {
			return
		}
	}
}

// write appends one delta event; false when the request has ended (the
// caller cancelled it) or the record is gone: nothing more is written.
func (w *deltaWriter) write(batch []llm.Delta) bool {
	c := job.Change{Event: &job.Event{Type: job.EventDelta, Status: job.StatusRunning, Delta: batch}, Tenant: w.owner}
	if !w.marked {
		st := w.state
		st.Streamed = true
		c.State = &st
	}
	_, err := w.jobs.Apply(w.ctx, w.id, c)
	switch {
	case errors.Is(err, job.ErrTerminal), errors.Is(err, job.ErrNotFound):
		return false
	case err == nil:
		w.marked = true
	default:
		// A lost write leaves a gap the caller cannot fill; the answer
		// still ends whole (the API completes a stream from the record's
		// answer), so go on.
		w.log.Warn("dispatch: write deltas", "err", err)
	}
	w.written++
	return true
}

// drain discards what is emitted after the writer stopped, until close.
func (w *deltaWriter) drain() {
	for {
		w.mu.Lock()
		w.pending = nil
		closing := w.closing
		w.mu.Unlock()
		if closing {
			return
		}
		<-w.wake
	}
}
