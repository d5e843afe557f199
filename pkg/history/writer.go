package history

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"bulwark/pkg/groupcommit"
	"bulwark/pkg/job"
)

// The writer takes history writes off the request path: Submitted and
// Finished hand their row to it and return, and it writes whatever has
// gathered in one round trip (a pgx batch) while the previous batch was
// being written — group commit (pkg/groupcommit): no added wait when traffic is light,
// batches as large as needed when it is heavy. A profile of the queued
// path showed the two synchronous inserts per request (one on the API's
// submission path, one after the answer) among its largest waits.
//
// Nothing is dropped: a full queue makes the caller write its row itself
// (back pressure instead of loss), a failed batch is written row by row
// (so one refused row costs only itself), a failed outcome goes to the
// Redis outbox as before, and Close writes what is queued. Close is
// bounded as a whole (FlushTimeout), not per batch: a slow PostgreSQL
// cannot keep a stopping process past its supervisor's kill grace. Once
// the bound has passed, the batch being written is cancelled and every
// outcome still queued goes to the outbox in one Redis round trip per
// batch, for a replay to write (queued submissions are counted as failed
// writes and dropped: the outcome's upsert writes the whole row). A
// process killed with rows still queued loses them, as a kill between the
// terminal record and the synchronous insert did before (at most one
// batch: the rows of a few milliseconds).

// row is one queued write: a submission (sub) or an outcome (rec).
type row struct {
	sub  []any
	rec  *job.Record
	cost float64
}

// Writer sizes: writerQueue rows may wait (beyond it callers write
// themselves); one batch holds at most writerBatch rows.
const (
	writerQueue = 4096
	writerBatch = 256
	// batchTimeout bounds one batch's round trip.
	batchTimeout = 5 * time.Second
)

// FlushTimeoutDefault bounds Close: how long the queued rows may take to
// reach PostgreSQL at shutdown before the rest goes to the outbox. Below
// the 5 s left, in the deploy examples, between a process's own drain
// (server.shutdown_timeout 10 s of a 15 s grace, worker.shutdown_timeout
// 25 s of a 30 s grace) and its kill.
const FlushTimeoutDefault = 3 * time.Second

// Start runs the batching writer until Close. Without it every write is
// synchronous (tools, tests that read a row right after writing it).
// Call it before the store is used.
func (s *Store) Start() {
	s.expired = make(chan struct{})
	s.writer.Store(groupcommit.Start(writerQueue, writerBatch, s.writeBatch))
}

// Close writes the queued rows and stops the writer, within FlushTimeout
// (0: FlushTimeoutDefault) plus the outbox pushes of what was not written
// by then. Calls after the first do nothing; writes after Close are
// synchronous again.
func (s *Store) Close() {
	w := s.writer.Load()
	if w == nil {
		return
	}
	bound := s.FlushTimeout
	if bound <= 0 {
		bound = FlushTimeoutDefault
	}
	t := time.AfterFunc(bound, func() { s.expire.Do(func() { close(s.expired) }) })
	defer t.Stop()
	w.Close()
}

// flushExpired reports whether Close's bound has passed.
func (s *Store) flushExpired() bool {
	select {
	case <-s.expired:
		return true
	default:
		return false
	}
}

// enqueue hands r to the writer; false when the caller must write it
// itself (no writer, stopped, or its queue is full).
func (s *Store) enqueue(r row) bool { return s.writer.Load().Offer(r) == nil }

// writeBatch writes rows in one round trip; when the batch fails (one
// refused row aborts the rest), each row is written on its own, with the
// synchronous path's outbox and accounting.
func (s *Store) writeBatch(rows []row) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if s.flushExpired() {
		s.keepRows(ctx, rows, context.DeadlineExceeded)
		return
	}
	written := make(chan struct{})
	defer close(written)
	go func() { // Close's bound cancels the batch in flight
		select {
		case <-s.expired:
			cancel()
		case <-written:
		}
	}()
	b := &pgx.Batch{}
	for _, r := range rows {
		if r.rec != nil {
			b.Queue(finishSQL, outcome(r.rec, r.cost)...)
		} else {
			b.Queue(submitSQL, r.sub...)
		}
	}
	err := s.pool.SendBatch(ctx, b).Close()
	if err == nil {
		return
	}
	if ctx.Err() != nil {
		// PostgreSQL too slow (or Close's bound passed): writing row by
		// row would only fail again, one Redis round trip per row.
		s.keepRows(ctx, rows, err)
		return
	}
	for _, r := range rows {
		if r.rec != nil {
			s.finishedOrKeep(ctx, r.rec, r.cost)
			continue
		}
		if _, err := s.pool.Exec(ctx, submitSQL, r.sub...); err != nil {
			s.failed("insert", err)
		}
	}
}

// keepRows puts the outcomes of rows in the outbox in one round trip and
// counts the rest (submissions) as failed writes.
func (s *Store) keepRows(ctx context.Context, rows []row, err error) {
	ks := make([]kept, 0, len(rows))
	for _, r := range rows {
		s.failed("batch", err)
		if r.rec != nil {
			ks = append(ks, kept{Record: r.rec, CostUSD: r.cost})
		}
	}
	s.keepAll(ctx, ks)
}
