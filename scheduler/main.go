// Command scheduler enqueues Bulwark's periodic jobs (cache expiry, alert
// evaluation, the daily report); the workers run them.
package main

import (
	"bulwark/pkg/service"
)

func main() {
	ctx, stop, b, err := service.Setup("scheduler")
	if err != nil {
		service.Fatal("scheduler", err)
	}
	defer stop()
	defer b.Close()

	s, err := b.Scheduler()
	if err != nil {
		service.Fatal("scheduler", err)
	}
	if err := s.Start(); err != nil {
		service.Fatal("scheduler", err)
	}
	<-ctx.Done()
	s.Shutdown()
}
