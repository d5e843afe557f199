package cache

import (
	"context"
	"fmt"
	"sync"

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
type answerWriter struct {
	rows chan pendingAnswer
	done chan struct{}
	// mu guards closed: senders hold it shared, stop exclusively, so
	// nothing is sent on a closed channel.
	mu     sync.RWMutex
	closed bool
}

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
	w := &c.answers
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.rows == nil || w.closed {
		return false
	}
	select {
	case w.rows <- p:
	default:
		c.storesShed.Add(1)
		p.then()
	}
	return true
}

// startAnswers starts the writer (Start calls it).
func (c *Cache) startAnswers() {
	w := &c.answers
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rows != nil && !w.closed {
		return
	}
	w.rows, w.done, w.closed = make(chan pendingAnswer, answerQueue), make(chan struct{}), false
	rows, done := w.rows, w.done
	go func() {
		defer close(done)
		groupcommit.Run(rows, answerBatch, c.writeBatch)
	}()
}

// stopAnswers writes what is queued and stops the writer (Stop calls it).
func (c *Cache) stopAnswers() {
	w := &c.answers
	w.mu.Lock()
	if w.rows == nil || w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.rows)
	done := w.done
	w.mu.Unlock()
	<-done
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
		if _, err := c.pool.Exec(ctx, c.sqlStore, p.args...); err != nil {
			c.fail(ctx, fmt.Errorf("cache: store: %w: %w", ErrUnavailable, err))
			continue
		}
		c.stores.Add(1)
	}
}
