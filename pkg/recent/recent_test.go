package recent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Concurrent readers share one load; a value within MaxAge is not loaded
// again; a failed load is not kept.
func TestValueSharesOneLoad(t *testing.T) {
	t.Parallel()
	var loads atomic.Int32
	release := make(chan struct{})
	r := &Value[int]{MaxAge: time.Hour, Load: func(context.Context) (int, error) {
		<-release
		return int(loads.Add(1)), nil
	}}
	var wg sync.WaitGroup
	got := make([]int, 50)
	for i := range got {
		wg.Go(func() { got[i], _, _ = r.Get(context.Background()) })
	}
	close(release) // readers that come after the load take its value too
	wg.Wait()
	for i, v := range got {
		if v != 1 {
			t.Fatalf("reader %d got %d, want the one load's 1", i, v)
		}
	}
	if v, fresh, err := r.Get(context.Background()); v != 1 || fresh || err != nil || loads.Load() != 1 {
		t.Fatalf("within MaxAge: %d fresh=%v %v after %d loads", v, fresh, err, loads.Load())
	}

	failing := &Value[int]{MaxAge: time.Hour, Load: func(context.Context) (int, error) {
		return 0, errors.New("down")
	}}
	if _, _, err := failing.Get(context.Background()); err == nil {
		t.Fatal("a failed load returned no error")
	}
	failing.Load = func(context.Context) (int, error) { return 7, nil }
	if v, fresh, err := failing.Get(context.Background()); v != 7 || !fresh || err != nil {
		t.Fatalf("after a failed load: %d fresh=%v %v, want a new load", v, fresh, err)
	}
}
