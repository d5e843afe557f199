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
