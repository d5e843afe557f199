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
// Redis outbox as before, and Close writes what is queued. A process
// killed with rows still queued loses them, as a kill between the
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

// Start runs the batching writer until Close. Without it every write is
// synchronous (tools, tests that read a row right after writing it).
// Call it before the store is used.
func (s *Store) Start() {
	s.writer.Store(groupcommit.Start(writerQueue, writerBatch, s.writeBatch))
}

// Close writes the queued rows and stops the writer. Calls after the
// first do nothing; writes after Close are synchronous again.
func (s *Store) Close() { s.writer.Load().Close() }

// enqueue hands r to the writer; false when the caller must write it
// itself (no writer, stopped, or its queue is full).
func (s *Store) enqueue(r row) bool { return s.writer.Load().Offer(r) == nil }

// writeBatch writes rows in one round trip; when the batch fails (one
// refused row aborts the rest), each row is written on its own, with the
// synchronous path's outbox and accounting.
func (s *Store) writeBatch(rows []row) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	b := &pgx.Batch{}
	for _, r := range rows {
		if r.rec != nil {
			b.Queue(finishSQL, outcome(r.rec, r.cost)...)
		} else {
			b.Queue(submitSQL, r.sub...)
		}
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err == nil {
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
