package cache

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"bulwark/pkg/groupcommit"
)

// The answer writer takes cache inserts off the workers' path. An insert
// updates the HNSW index; measured under 32 concurrent workers it took
// 10-12 ms of execution (1.7 ms alone: the rest is the index's page locks
// contended by every worker) and was the largest single cost of a queued
// request. One writer goroutine inserts what gathered while its previous
// batch ran, in one transaction of one round trip with
// synchronous_commit off (a cache entry lost to a PostgreSQL crash is
// asked for again, nothing more), so inserts never contend with each
// other. When PostgreSQL falls behind, the queue fills and answers are
// not stored (counted in Stats.StoresShed): under overload the cache
// sheds its own writes rather than slowing every request.

// pendingAnswer is one queued insert and what runs after it.
type pendingAnswer struct {
	args []any
	then func()
}

// Writer sizes: answerQueue answers may wait; a batch holds at most
// answerBatch.
const (
	answerQueue = 1024
	answerBatch = 64
)

// queueAnswer hands p to the writer: false when it does not run (the
// caller writes p itself). A full queue sheds p (counted; then runs) and
// reports true.
func (c *Cache) queueAnswer(p pendingAnswer) bool {
	switch err := c.answers.Load().Offer(p); {
	case err == nil:
	case errors.Is(err, groupcommit.ErrFull):
		c.storesShed.Add(1)
		p.then()
	default:
		return false
	}
	return true
}

// startAnswers starts the writer (Start calls it, under c.run.mu).
func (c *Cache) startAnswers() {
	c.answers.Store(groupcommit.Start(answerQueue, answerBatch, c.writeBatch))
}

// stopAnswers writes what is queued and stops the writer (Stop calls it).
func (c *Cache) stopAnswers() {
	if w := c.answers.Swap(nil); w != nil {
		w.Close()
	}
}

// writeBatch inserts a batch in one transaction, then runs each entry's
// then. A failed batch is written entry by entry, so one bad entry costs
// only itself.
func (c *Cache) writeBatch(batch []pendingAnswer) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.QueryTimeout)
	defer cancel()
	defer func() {
		for _, p := range batch {
			p.then()
		}
	}()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit TO OFF")
	for _, p := range batch {
		b.Queue(c.sqlStore, p.args...)
	}
	b.Queue("COMMIT")
	err := c.pool.SendBatch(ctx, b).Close()
	if err == nil {
		c.stores.Add(int64(len(batch)))
		return
	}
	for _, p := range batch {
		_ = c.insert(ctx, p.args) // one refused entry costs only itself; insert counts and logs it
	}
}
