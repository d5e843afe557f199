// Package groupcommit batches writes the way databases group commits:
// Run hands the writer whatever has gathered on a channel while its
// previous batch was being written. A lone item is written at once (no
// timer adds latency when traffic is light) and under load batches grow
// to the limit, so one round trip carries many writes. The history writer
// and the cache's answer writer use it.
package groupcommit

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
