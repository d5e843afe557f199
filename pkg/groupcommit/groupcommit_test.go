package groupcommit

import (
	"slices"
	"testing"
)

// Items that gathered while a batch was written form the next batch, up
// to max; a lone item is written alone; nothing is lost or reordered, and
// Run returns once the channel is closed and drained.
func TestRunBatchesWhatGathered(t *testing.T) {
	in := make(chan int, 10)
	for i := range 7 {
		in <- i
	}
	var got []int
	var sizes []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(in, 3, func(b []int) {
			sizes = append(sizes, len(b))
			got = append(got, b...)
		})
	}()
	close(in)
	<-done
	if !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6}) || !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Fatalf("items %v in batches %v, want 0..6 in 3, 3, 1", got, sizes)
	}
}

// A Writer queues what fits (ErrFull beyond), writes all of it by Close,
// and refuses after Close (ErrStopped), as a nil Writer does.
func TestWriterQueueFullAndStopped(t *testing.T) {
	var nilW *Writer[int]
	if err := nilW.Offer(1); err != ErrStopped {
		t.Fatalf("nil writer: %v", err)
	}
	nilW.Close()
	release, writing := make(chan struct{}), make(chan struct{}, 1)
	var got []int
	w := Start(1, 10, func(b []int) {
		select {
		case writing <- struct{}{}:
		default:
		}
		<-release
		got = append(got, b...)
	})
	if err := w.Offer(1); err != nil {
		t.Fatal(err)
	}
	<-writing // item 1 is being written: the queue is empty again
	if err := w.Offer(2); err != nil {
		t.Fatal(err)
	}
	if err := w.Offer(3); err != ErrFull {
		t.Fatalf("third offer into a queue of 1 behind a blocked write: %v, want ErrFull", err)
	}
	close(release)
	w.Close()
	if !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("written %v, want [1 2]", got)
	}
	if err := w.Offer(4); err != ErrStopped {
		t.Fatalf("after Close: %v", err)
	}
	w.Close()
}
