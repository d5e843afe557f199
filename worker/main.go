// Command worker runs provider calls from the priority queues (layers 2 to
// 5) and the periodic jobs. Run as many as you like, on any machines.
package main

import (
	"context"
	"errors"
	"net/http"

	"bulwark/pkg/service"
)

func main() {
	if err := run(); err != nil {
		service.Fatal("worker", err)
	}
}

// run works until SIGINT or SIGTERM; everything it opens is closed when it
// returns, error or not.
func run() error {
	ctx, stop, b, err := service.Setup("worker")
	if err != nil {
		return err
	}
	defer stop()
	defer b.Close()

	srv, mux := b.Worker(b.Clients())
	var metricsSrv *http.Server
	if addr := b.Cfg.Worker.MetricsListen; addr != "off" {
		metricsSrv = b.HTTPServer(addr, b.DebugHandler())
		go func() {
			if err := metricsSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.Logger.Error("metrics server", "err", err)
			}
		}()
	}
	if b.Cache != nil {
		_ = b.Cache.Start(ctx)
	}
	defer b.WatchBreakers()()
	if err := srv.Start(mux); err != nil {
		if metricsSrv != nil {
			_ = metricsSrv.Close()
		}
		return err
	}
	// The orphan sweep: every accepted request reaches a terminal state.
	sweeper := b.Sweeper()
	sweeper.Start(ctx)
	<-ctx.Done()
	// Shutdown order: stop the sweep, stop taking tasks and wait for
	// running ones (ShutdownTimeout, unfinished ones go back to the
	// queue), then stop the metrics server, then close the clients
	// (deferred Close).
	sweeper.Stop()
	srv.Shutdown()
	if metricsSrv != nil {
		_ = metricsSrv.Shutdown(context.Background())
	}
	return nil
}
