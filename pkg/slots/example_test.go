package slots_test

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/priority"
	"bulwark/pkg/slots"
)

// Example shows a worker holding a global slot for one provider call,
// renewing its lease while the call runs. (It needs a Redis server, so it
// is compiled but not run.)
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	limiter, err := slots.New(rdb, slots.Config{Reserved: map[priority.Priority]int{
		priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1,
	}})
	if err != nil {
		panic(err)
	}

	deadline, cancel := context.WithTimeout(ctx, time.Minute) // the request's deadline
	defer cancel()
	slot, err := limiter.Acquire(deadline, priority.Normal, slots.Waiter{ID: "req-42", Since: time.Now()})
	if errors.Is(err, context.DeadlineExceeded) {
		return // fail the request: no slot before its deadline
	}
	if err != nil {
		return
	}
	defer slot.Release(context.WithoutCancel(ctx))

	callCtx, stopCall := context.WithCancel(ctx)
	defer stopCall()
	done := make(chan struct{})
	go func() {
		defer close(done)
		callProvider(callCtx)
	}()
	tick := time.NewTicker(slots.LeaseTTLDefault / 3)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			if errors.Is(slot.Renew(ctx), slots.ErrLost) {
				// The call would run uncounted: this worker chooses to stop it.
				stopCall()
			}
		}
	}
}

func callProvider(context.Context) {}
