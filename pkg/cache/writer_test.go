package cache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/job"
)

// With the answer writer running, answers queued from many goroutines are
// all stored by Stop, each one's then runs once after its insert, and
// after Stop entries are written by the caller again.
func TestAnswerWriterStoresEverythingByStop(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.cache
	ctx := context.Background()
	require.NoError(t, c.Start(ctx))
	const n = 200
	var ran atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			args, err := c.storeArgs(ctx, key(fmt.Sprintf("car %d reports DTC P0300 after OTA", i)), nil, answer)
			if err != nil {
				t.Error(err)
				return
			}
			if !c.queueAnswer(pendingAnswer{args: args, then: func() { ran.Add(1) }}) {
				t.Error("the running writer refused an answer")
			}
		})
	}
	wg.Wait()
	c.Stop()
	st := c.Stats()
	require.Equal(t, int32(n), ran.Load(), "then ran for every answer")
	require.Equal(t, int64(n)-st.StoresShed, st.Stores, "stored or shed, nothing else")
	for i := range n {
		hit, err := c.Lookup(ctx, key(fmt.Sprintf("car %d reports DTC P0300 after OTA", i)), nil)
		require.NoError(t, err)
		if hit.Kind != job.CachedExact && st.StoresShed == 0 {
			t.Fatalf("answer %d not stored by Stop", i)
		}
	}
	args, err := c.storeArgs(ctx, key("after stop"), nil, answer)
	require.NoError(t, err)
	require.False(t, c.queueAnswer(pendingAnswer{args: args, then: func() {}}), "a stopped writer took an answer")
}
