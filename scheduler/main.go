// Command scheduler enqueues Bulwark's periodic jobs (cache expiry, alert
// evaluation, the daily report); the workers run them.
package main

import (
	"bulwark/pkg/service"
)

func main() {
	if err := run(); err != nil {
		service.Fatal("scheduler", err)
	}
}

// run schedules until SIGINT or SIGTERM; everything it opens is closed when
// it returns, error or not.
func run() error {
	ctx, stop, b, err := service.Setup("scheduler")
	if err != nil {
		return err
	}
	defer stop()
	defer b.Close()

	s, err := b.Scheduler()
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	s.Shutdown()
	return nil
}
