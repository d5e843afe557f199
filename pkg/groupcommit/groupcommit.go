// Package groupcommit batches writes the way databases group commits:
// Run hands the writer whatever has gathered on a channel while its
// previous batch was being written. A lone item is written at once (no
// timer adds latency when traffic is light) and under load batches grow
// to the limit, so one round trip carries many writes. The history writer
// and the cache's answer writer use it.
package groupcommit

import (
	"errors"
	"sync"
)

// Run calls write with batches of at most max items read from in, until in
// is closed and drained. write may keep nothing of its argument: the slice
// is reused for the next batch.
func Run[T any](in <-chan T, max int, write func([]T)) {
	batch := make([]T, 0, max)
	for item := range in {
		batch = append(batch[:0], item)
	more:
		for len(batch) < max {
			select {
			case item, ok := <-in:
				if !ok {
					break more
				}
				batch = append(batch, item)
			default:
				break more
			}
		}
		write(batch)
	}
}

// ErrFull and ErrStopped say why Writer.Offer did not queue an item.
var (
	ErrFull    = errors.New("groupcommit: queue full")
	ErrStopped = errors.New("groupcommit: writer stopped")
)

// Writer runs Run in a goroutine of its own over a bounded queue. It is
// safe for concurrent use.
type Writer[T any] struct {
	items chan T
	done  chan struct{}
	// mu guards closed: Offer holds it shared, Close exclusively, so no
	// item is sent on a closed channel.
	mu     sync.RWMutex
	closed bool
}

// Start returns a running writer: up to queue items may wait, and write
// gets batches of at most max.
func Start[T any](queue, max int, write func([]T)) *Writer[T] {
	w := &Writer[T]{items: make(chan T, queue), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		Run(w.items, max, write)
	}()
	return w
}

// Offer queues item without waiting: ErrFull when the queue is full,
// ErrStopped when w is nil or closed (the caller then writes, or drops,
// the item itself).
func (w *Writer[T]) Offer(item T) error {
	if w == nil {
		return ErrStopped
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return ErrStopped
	}
	select {
	case w.items <- item:
		return nil
	default:
		return ErrFull
	}
}

// Close writes what is queued and stops the writer; later Offers return
// ErrStopped. Calling it twice, or on nil, is fine.
func (w *Writer[T]) Close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.items)
	}
	w.mu.Unlock()
	<-w.done
}
