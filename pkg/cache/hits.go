package cache

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// maxPendingHits bounds the distinct rows whose hits wait to be written;
// hits beyond it are counted in Stats.HitCountsLost.
const maxPendingHits = 100_000

// hitLog gathers hits in memory between flushes. Recording a hit is a map
// update under a mutex; the database sees one UPDATE per flush for all the
// rows hit, not one per hit. A synchronous UPDATE per hit would make every
// hit a write (a WAL flush at commit) and, since rows are ~1.7 kB and a full
// page leaves no room for a HOT update, a new tuple in every index including
// HNSW; concurrent hits on one hot row (dozens of engineers asking the same
// question) would also queue on its row lock. Counts of the last interval
// are lost if the process dies: they are statistics.
type hitLog struct {
	mu      sync.Mutex
	pending map[int64]pendingHit // guarded by mu
}

type pendingHit struct {
	n    int64
	last time.Time
}

func (c *Cache) recordHit(id int64) {
	now := time.Now()
	c.hits.mu.Lock()
	defer c.hits.mu.Unlock()
	if c.hits.pending == nil {
		c.hits.pending = make(map[int64]pendingHit)
	}
	p, ok := c.hits.pending[id]
	if !ok && len(c.hits.pending) >= maxPendingHits {
		c.hitsLost.Add(1)
		return
	}
	p.n++
	p.last = now
	c.hits.pending[id] = p
}

// FlushHits writes the hit counts gathered since the last flush: hit_count
// grows by the number of hits and last_hit_at becomes the latest hit's time
// (this process's clock). Rows deleted meanwhile are skipped. On error the
// batch is dropped (counted in Stats.HitCountsLost) and the error wraps
// ErrUnavailable. The flusher started by Start calls it periodically.
func (c *Cache) FlushHits(ctx context.Context) error {
	c.hits.mu.Lock()
	batch := c.hits.pending
	c.hits.pending = nil
	c.hits.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	ids := make([]int64, 0, len(batch))
	ns := make([]int64, 0, len(batch))
	lasts := make([]time.Time, 0, len(batch))
	var total int64
	for id, p := range batch {
		ids, ns, lasts = append(ids, id), append(ns, p.n), append(lasts, p.last)
		total += p.n
	}
	qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	_, err := c.pool.Exec(qctx, `UPDATE semantic_cache s
SET hit_count = s.hit_count + h.n,
    last_hit_at = GREATEST(s.last_hit_at, h.last)
FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[]) AS h(id, n, last)
WHERE s.id = h.id`, ids, ns, lasts)
	if err != nil {
		c.hitsLost.Add(total)
		err = fmt.Errorf("cache: flush hit counts: %w: %w", ErrUnavailable, err)
		c.fail(ctx, err)
		return err
	}
	c.hitWrites.Add(1)
	return nil
}

// runner owns the flusher goroutine.
type runner struct {
	mu     sync.Mutex
	cancel context.CancelFunc // guarded by mu; nil when stopped
	done   chan struct{}      // guarded by mu; closed when the goroutine ends
}

// Start starts the background writers: of hit counts, which flushes every
// HitFlushInterval until ctx ends or Stop is called (without it hit counts
// are written only by FlushHits), and of answers (writer.go; without it
// StoreAnswer inserts at once). Calling Start on a started Cache does
// nothing.
func (c *Cache) Start(ctx context.Context) error {
	c.run.mu.Lock()
	defer c.run.mu.Unlock()
	if c.run.cancel != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	c.run.cancel, c.run.done = cancel, done
	go c.flushLoop(ctx, done)
	c.startAnswers()
	return nil
}

// Stop stops the background writers and writes the hits gathered and the
// answers queued so far (bounded by QueryTimeout). It is safe to call
// twice, and before Start.
func (c *Cache) Stop() {
	c.stopAnswers()
	c.run.mu.Lock()
	cancel, done := c.run.cancel, c.run.done
	c.run.cancel, c.run.done = nil, nil
	c.run.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (c *Cache) flushLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(c.cfg.HitFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Last flush on a fresh context: ours is already cancelled.
			_ = c.FlushHits(context.WithoutCancel(ctx)) // errors are counted and logged inside
			return
		case <-t.C:
			_ = c.FlushHits(ctx) // errors are counted and logged inside
		}
	}
}
